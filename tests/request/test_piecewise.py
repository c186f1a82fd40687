"""Piecewise encoding on tokenizers built here: the split equals the tokenizer's own, what would make it
inexact is refused (and really would be), and `HfTokenizer` then encodes whole prompts with the same ids."""

from __future__ import annotations

import json
import logging
import random
from array import array
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

from extproc.errors import TokenizerUnavailable
from extproc.request.parse import parse_openai_body
from extproc.request.piecewise import (
    PieceSplitter,
    PiecewiseEncoder,
    batch_encoder,
    inexact_reason,
    special_wrapping,
)
from extproc.request.token_cache import TokenCache
from extproc.request.tokenizer import HfTokenizer, RequestTokenizer
from tests.tokenizer_files import (
    BOS,
    CORPUS,
    EOS,
    LLAMA_TEMPLATE,
    PARTS_TEMPLATE,
    SPECIAL_TOKENS,
    train_tokenizer,
    write_tokenizer_dir,
)

CHAT = [
    {"role": "system", "content": "you are a helpful assistant."},
    {"role": "user", "content": "hello world,  how are you today?\n\n"},
    {"role": "assistant", "content": "the quick brown fox"},
    {"role": "user", "content": "  weather in paris <|eot_id|> city"},
]


def _texts(tokens: list[str], seed: int, count: int = 300) -> list[str]:
    """Texts dense in added tokens, white space (Rust's and Python's), words and partial tokens."""
    rng = random.Random(seed)
    bits = [
        *tokens,
        " ",
        "  ",
        "\n",
        "\t",
        "\u3000",
        "\x1c",
        "\u00a0",
        "hello",
        "world",
        "é",
        "<",
        "|>",
        "_x_",
    ]
    bits += [t[: len(t) // 2] for t in tokens] + [t.upper() for t in tokens]
    return ["".join(rng.choice(bits) for _ in range(rng.randint(0, 12))) for _ in range(count)]


def _with_tokens(*tokens: AddedToken, normalizer: normalizers.Normalizer | None = None) -> Tokenizer:
    tokenizer = train_tokenizer()
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.add_tokens(list(tokens))
    return tokenizer


ADDED = {
    "overlapping": [
        AddedToken("<a>", normalized=False),
        AddedToken("<a>b", normalized=False),
        AddedToken("a>b"),
    ],
    "lstrip-rstrip": [
        AddedToken("<mask>", lstrip=True, normalized=False),
        AddedToken("<sep>", rstrip=True, normalized=False),
        AddedToken("<both>", lstrip=True, rstrip=True, normalized=False),
    ],
    "normalized": [AddedToken("HELLO", normalized=True), AddedToken("<n>", normalized=True, lstrip=True)],
}


@pytest.mark.parametrize("case", sorted(ADDED))
@pytest.mark.parametrize("lowercase", [False, True])
def test_piecewise_ids_equal_whole_ids_on_added_token_edges(case: str, lowercase: bool):
    tokenizer = _with_tokens(*ADDED[case], normalizer=normalizers.Lowercase() if lowercase else None)
    encoder = PiecewiseEncoder(tokenizer, TokenCache(1 << 20))
    contents = [t.content for t in ADDED[case]] + [BOS, EOS]
    for text in _texts(contents, seed=len(case)):
        for add in (False, True):
            assert (
                encoder.encode(text, add_special_tokens=add)
                == tokenizer.encode(text, add_special_tokens=add).ids
            )


def test_the_split_follows_encode_special_tokens():
    tokenizer = _with_tokens(AddedToken("<x>", normalized=False))
    tokenizer.encode_special_tokens = True  # special tokens are then encoded as text, added ones still split
    encoder = PiecewiseEncoder(tokenizer, TokenCache(1 << 20))
    for text in _texts([BOS, EOS, "<x>"], seed=3):
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids


def test_splitter_returns_pieces_and_token_ids_in_order():
    tokenizer = train_tokenizer()
    splitter = PieceSplitter(tokenizer.get_added_tokens_decoder())
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    assert splitter.split(f"{BOS}hi{EOS}{EOS} there") == [bos, "hi", eos, eos, " there"]
    assert splitter.split("") == []
    assert splitter.split("no tokens") == ["no tokens"]


def test_special_wrapping_is_what_the_post_processor_adds():
    tokenizer = train_tokenizer()  # TemplateProcessing: BOS $A
    assert special_wrapping(tokenizer) == ([tokenizer.token_to_id(BOS)], [])
    tokenizer.post_processor = None
    assert special_wrapping(tokenizer) == ([], [])


def _metaspace_first() -> Tokenizer:
    """A SentencePiece-like BPE whose pre-tokenizer prepends "▁" to the text's first piece only."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tokenizer


def _single_word() -> Tokenizer:
    return _with_tokens(
        AddedToken("hello", single_word=True, normalized=False), AddedToken("Xtok", normalized=False)
    )


def _dropout() -> Tokenizer:
    tokenizer = train_tokenizer()
    tokenizer.model.dropout = 0.5
    return tokenizer


def _truncating() -> Tokenizer:
    tokenizer = train_tokenizer()
    tokenizer.enable_truncation(8)
    return tokenizer


def _padding() -> Tokenizer:
    tokenizer = train_tokenizer()
    tokenizer.enable_padding(length=64)
    return tokenizer


class _Custom:
    def pre_tokenize(self, pretok: object) -> None:
        pass


def _custom() -> Tokenizer:
    tokenizer = train_tokenizer()
    tokenizer.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(_Custom())
    return tokenizer


def _stripping_beside_white_space() -> Tokenizer:
    return _with_tokens(
        AddedToken("<m>", rstrip=True, normalized=False), AddedToken(" <s>", normalized=False)
    )


INEXACT = {
    "Metaspace": _metaspace_first,
    "single_word": _single_word,
    "dropout": _dropout,
    "truncation": _truncating,
    "padding": _padding,
    "cannot be inspected": _custom,
    "white space": _stripping_beside_white_space,
}


@pytest.mark.parametrize("reason", sorted(INEXACT))
def test_inexact_configurations_are_refused_with_a_reason(reason: str):
    tokenizer = INEXACT[reason]()
    assert reason in (inexact_reason(tokenizer) or "")
    with pytest.raises(ValueError, match=reason):
        PiecewiseEncoder(tokenizer, TokenCache(1 << 20))


def _naive_piecewise(tokenizer: Tokenizer, text: str) -> list[int]:
    """What piecewise encoding would give without the check."""
    parts = PieceSplitter(tokenizer.get_added_tokens_decoder()).split(text)
    return [
        i
        for p in parts
        for i in ([p] if isinstance(p, int) else tokenizer.encode(p, add_special_tokens=False).ids)
    ]


def _write_dir(root: Path, tokenizer: Tokenizer, template: str = LLAMA_TEMPLATE) -> Path:
    write_tokenizer_dir(root, chat_template=template)
    tokenizer.save(str(root / "tokenizer.json"))
    return root


@pytest.mark.parametrize(
    "make, text",
    [
        (_metaspace_first, f"{BOS}hello world{EOS}the quick brown fox"),  # "▁the" alone, "the" inside
        (_single_word, "say helloXtok"),  # "hello" is a word alone, not beside "Xtok"
    ],
)
def test_an_inexact_tokenizer_falls_back_to_whole_prompts_with_the_same_ids(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make: object, text: str
):
    tokenizer = make()  # type: ignore[operator]
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    assert _naive_piecewise(tokenizer, text) != whole  # the check is needed: pieces alone would differ
    with caplog.at_level(logging.WARNING, logger="extproc.request.tokenizer"):
        hf = HfTokenizer(_write_dir(tmp_path, tokenizer))
    assert hf.pieces is None and hf.piece_cache_stats() is None
    assert hf.piecewise_off_reason is not None and "would not be exact" in hf.piecewise_off_reason
    assert "chat prompts encoded whole" in caplog.text
    messages = [*CHAT[:3], {"role": "user", "content": text}]
    rendered = hf.render_chat(messages)
    assert hf.encode_chat(messages) == tokenizer.encode(rendered, add_special_tokens=False).ids


def test_a_template_without_added_tokens_between_messages_encodes_whole_prompts(tmp_path: Path):
    hf = HfTokenizer(write_tokenizer_dir(tmp_path, chat_template=PARTS_TEMPLATE))
    assert hf.pieces is None
    assert hf.piecewise_off_reason == "no chat template puts an added token between messages"
    text = hf.render_chat(CHAT)
    assert hf.encode_chat(CHAT) == hf._backend.encode(text, add_special_tokens=False).ids


def test_a_cache_of_zero_bytes_encodes_whole_prompts(tmp_path: Path):
    hf = HfTokenizer(write_tokenizer_dir(tmp_path), piece_cache_bytes=0)
    assert hf.pieces is None and hf.piecewise_off_reason == "the piece cache is off (0 bytes)"
    with pytest.raises(ValueError, match="piece_cache_bytes"):
        HfTokenizer(tmp_path, piece_cache_bytes=-1)


def test_chat_ids_equal_whole_ids_and_later_turns_hit_the_cache(tmp_path: Path):
    hf = HfTokenizer(write_tokenizer_dir(tmp_path))
    whole = HfTokenizer(tmp_path, piece_cache_bytes=0)
    assert hf.pieces is not None and hf.piecewise_off_reason is None
    for turn in range(1, len(CHAT) + 1):
        for add in (None, True):  # True: the post-processor's BOS before the template's own, as vLLM does
            assert hf.encode_chat(CHAT[:turn], add_special_tokens=add) == whole.encode_chat(
                CHAT[:turn], add_special_tokens=add
            )
    stats = hf.piece_cache_stats()
    assert stats is not None and stats.hits > stats.misses > 0
    assert hf.encode_chat(CHAT, add_special_tokens=True)[:2] == [hf._backend.token_to_id(BOS)] * 2


def test_chat_ids_come_as_a_uint32_array_with_the_list_ids(tmp_path: Path):
    hf = HfTokenizer(write_tokenizer_dir(tmp_path))
    whole = HfTokenizer(tmp_path, piece_cache_bytes=0)
    for add in (None, True):
        for _ in range(2):  # a cold cache, then a warm one
            ids = hf.encode_chat_ids(CHAT, add_special_tokens=add)
            assert isinstance(ids, array) and ids.itemsize == 4
            assert ids.tolist() == whole.encode_chat(CHAT, add_special_tokens=add)
    assert isinstance(whole.encode_chat_ids(CHAT), list)  # whole prompts: the tokenizer's own list


async def test_the_request_tokenizer_routes_on_the_array_and_gives_lists(tmp_path: Path):
    tokenizer = RequestTokenizer(
        HfTokenizer(write_tokenizer_dir(tmp_path)), timeout_s=5.0, inline_max_bytes=0
    )
    body = json.dumps(
        {"model": "m", "messages": CHAT, "truncate_prompt_tokens": 5, "truncation_side": "right"}
    )
    request = parse_openai_body(body.encode(), "/v1/chat/completions", max_bytes=1 << 20)
    ids = await tokenizer.token_ids(request)  # in a worker thread (inline_max_bytes=0), cut on the right
    listed = await tokenizer.tokenize(request)
    assert isinstance(ids, array) and type(listed) is list and ids.tolist() == listed and len(listed) == 5


def test_completions_and_tools_templates_keep_their_paths(tmp_path: Path):
    template = [
        {"name": "default", "template": LLAMA_TEMPLATE},
        {"name": "tool_use", "template": PARTS_TEMPLATE},
    ]
    root = write_tokenizer_dir(tmp_path, chat_template=template)
    hf, whole = HfTokenizer(root), HfTokenizer(root, piece_cache_bytes=0)
    assert hf.pieces is not None and hf._piecewise_templates == {"default"}
    tools = [{"type": "function", "function": {"name": "f"}}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert hf.encode_chat(parts, tools=tools) == whole.encode_chat(parts, tools=tools)
    before = hf.piece_cache_stats()
    assert hf.encode_text("hello <|eot_id|> world") == whole.encode_text("hello <|eot_id|> world")
    assert hf.piece_cache_stats() == before  # neither the tool_use template nor completions used pieces


def test_a_piece_the_tokenizer_refuses_is_refused_as_a_whole_prompt_is(tmp_path: Path):
    hf = HfTokenizer(write_tokenizer_dir(tmp_path))
    whole = HfTokenizer(tmp_path, piece_cache_bytes=0)
    messages = [{"role": "user", "content": "bad \ud800 surrogate " * 10}]
    for tokenizer in (hf, whole):
        with pytest.raises(TokenizerUnavailable):
            tokenizer.encode_chat(messages)


def test_the_real_tokenizers_need_no_fallback():
    shared = Path(__file__).resolve().parents[3] / "shared" / "tokenizers"
    for family in ("qwen3", "llama3_1"):
        config = json.loads((shared / family / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert "chat_template" in config
        hf = HfTokenizer(shared / family)
        assert hf.piecewise_off_reason is None and hf.pieces is not None


def test_the_real_tokenizers_encode_without_offsets_and_give_the_same_ids():
    """`encode_batch_fast` (no character offsets, 25-35 % less CPU) is what encodes prompts when it agrees
    with `encode_batch` at load; on the real tokenizers it does, and on texts dense in edges its ids
    are `encode_batch`'s."""
    shared = Path(__file__).resolve().parents[3] / "shared" / "tokenizers"
    for family in ("qwen3", "llama3_1"):
        backend = Tokenizer.from_file(str(shared / family / "tokenizer.json"))
        assert batch_encoder(backend) == backend.encode_batch_fast
        tokens = [t.content for t in backend.get_added_tokens_decoder().values()][:40]
        texts = _texts(tokens, seed=7) + [CORPUS[i % len(CORPUS)] * 7 for i in range(20)]
        for add in (False, True):
            fast = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=add)]
            assert fast == [e.ids for e in backend.encode_batch(texts, add_special_tokens=add)]


class _Disagreeing:
    """A tokenizer whose offset-free encoding differs from its encoding (none known; the guard)."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend
        self.encode_batch = backend.encode_batch

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = True):
        encoded = self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e if not e.ids else self.backend.encode_batch(["?"])[0] for e in encoded]


def test_an_offset_free_encoding_that_disagrees_is_not_used():
    backend = train_tokenizer()
    assert batch_encoder(backend) == backend.encode_batch_fast
    disagreeing = _Disagreeing(backend)
    assert batch_encoder(disagreeing) == disagreeing.encode_batch  # type: ignore[arg-type]
