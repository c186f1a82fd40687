"""HfTokenizer's edges: which files it reads and how, which chat templates it encodes piecewise, what it
logs at load and which errors name the file at fault.

The ids are checked against the directory's own `tokenizers` file encoding the prompt whole (what vLLM's
fast tokenizer does); which template a request selects and what a template sees follow transformers 5 and
vLLM as `HfTokenizer`'s docstring describes them.
"""

from __future__ import annotations

import json
import locale
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import processors

from extproc.errors import TokenizerUnavailable
from extproc.request.parse import ParsedRequest, parse_openai_body
from extproc.request.tokenizer import HfTokenizer, RequestTokenizer
from tests.tokenizer_files import EOS, LLAMA_TEMPLATE, train_tokenizer, write_tokenizer_dir

LOGGER = "extproc.request.tokenizer"
H = "<|start_header_id|>"
E = "<|end_header_id|>"
CHAT = [
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "the quick brown fox"},
    {"role": "user", "content": "how are you today?"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
WHOLE_REASON = "no chat template puts an added token between messages"

# No added token anywhere: the whole conversation is one piece.
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
# The system message and the first user message share a piece (no added token after a system message).
MERGED_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m.content }}{% if m.role != 'system' %}<|eot_id|>{% endif %}"
    "{% endfor %}"
)
# Refuses system messages, as some templates do: only the two-message probe chat renders.
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}<|eot_id|>{% endfor %}"
)


def raw(root: Path) -> RawTokenizer:
    return RawTokenizer.from_file(str(root / "tokenizer.json"))


def whole_ids(root: Path, text: str, *, add_special_tokens: bool = False) -> list[int]:
    return raw(root).encode(text, add_special_tokens=add_special_tokens).ids


def parsed(body: dict[str, Any]) -> ParsedRequest:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    return parse_openai_body(json.dumps(body).encode(), path, max_bytes=1 << 20)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_dir(tmp_path_factory.mktemp("hf_edges") / "llama")


@pytest.fixture(scope="module")
def split_tools_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A "default" template with an added token between messages and a "tool_use" one without."""
    templates = [
        {"name": "default", "template": LLAMA_TEMPLATE},
        {"name": "tool_use", "template": PLAIN_TEMPLATE},
    ]
    return write_tokenizer_dir(tmp_path_factory.mktemp("hf_edges") / "split", chat_template=templates)


@pytest.fixture
def c_locale() -> Iterator[None]:
    """The process's locale encoding is ASCII (LC_CTYPE=C, as in a bare container without UTF-8 mode)."""
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)


# --- which templates are encoded piecewise ----------------------------------------------------------------


def test_a_template_refusing_system_messages_is_probed_with_the_two_message_chat(tmp_path: Path):
    root = write_tokenizer_dir(tmp_path, chat_template=NO_SYSTEM_TEMPLATE)
    tok = HfTokenizer(root)
    assert tok.piecewise_off_reason is None
    assert tok.encodes_piecewise(None, None, False)
    assert tok.encode_chat(CHAT) == whole_ids(root, tok.render_chat(CHAT))
    assert tok.piece_cache_stats().misses > 0  # the pieces went through the cache


def test_a_template_keeping_two_messages_in_one_piece_is_encoded_whole(tmp_path: Path):
    root = write_tokenizer_dir(tmp_path, chat_template=MERGED_TEMPLATE)
    tok = HfTokenizer(root)
    assert tok.piecewise_off_reason == WHOLE_REASON
    assert not tok.encodes_piecewise(None, None, False)
    assert tok.piece_cache_stats() is None
    assert tok.encode_chat(CHAT) == whole_ids(root, tok.render_chat(CHAT))


def test_only_the_templates_separating_messages_are_encoded_piecewise(split_tools_dir: Path):
    tok = HfTokenizer(split_tools_dir)
    assert tok.piecewise_off_reason is None
    assert tok.encodes_piecewise(None, None, False)
    assert not tok.encodes_piecewise(TOOLS, None, False)  # tools select "tool_use"
    assert not tok.encodes_piecewise(None, {"tools": TOOLS}, False)  # ... and so do the kwargs' tools


def test_a_chat_for_a_template_encoded_whole_leaves_the_piece_cache_alone(split_tools_dir: Path):
    tok = HfTokenizer(split_tools_dir)
    before = tok.piece_cache_stats()
    with_tools = tok.encode_chat(CHAT, tools=TOOLS)
    kwargs_tools = tok.encode_chat(CHAT, chat_template_kwargs={"tools": TOOLS})
    assert tok.piece_cache_stats() == before
    assert with_tools == whole_ids(split_tools_dir, tok.render_chat(CHAT, tools=TOOLS))
    assert kwargs_tools == whole_ids(
        split_tools_dir, "user: hello world\nassistant: the quick brown fox\nuser: how are you today?\n"
    )
    plain = tok.encode_chat(CHAT)
    assert plain == whole_ids(split_tools_dir, tok.render_chat(CHAT))
    assert tok.piece_cache_stats().misses > before.misses  # the "default" template's pieces do use it


def _unprobeable_dir(root: Path) -> Path:
    """A post-processor prepending an ordinary vocabulary token ("a"): the ids it adds around a text cannot
    be told apart from the text's own on the probe "a", so piecewise encoding cannot add them."""
    write_tokenizer_dir(root)
    tokenizer = train_tokenizer()
    a = tokenizer.token_to_id("a")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<pre> $A", pair="<pre> $A $B", special_tokens=[("<pre>", a)]
    )
    tokenizer.save(str(root / "tokenizer.json"))
    return root


def test_chats_with_special_tokens_are_encoded_whole_when_the_post_processor_cannot_be_probed(tmp_path: Path):
    root = _unprobeable_dir(tmp_path)
    tok = HfTokenizer(root)
    assert tok.piecewise_off_reason is None
    assert tok.encodes_piecewise(None, None, False)
    assert not tok.encodes_piecewise(None, None, True)
    text = tok.render_chat(CHAT)
    assert tok.encode_chat(CHAT, add_special_tokens=True) == whole_ids(root, text, add_special_tokens=True)
    assert tok.encode_chat(CHAT) == whole_ids(root, text)


# --- which template a request selects, and what reaches it -----------------------------------------------


def test_the_kwargs_tools_select_the_tool_use_template_as_vllm_does(tmp_path: Path):
    templates = [
        {"name": "default", "template": "D"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    root = write_tokenizer_dir(tmp_path, chat_template=templates)
    tok = HfTokenizer(root)
    kwargs = {"tools": [{"name": "raw"}, {"name": "other"}]}
    assert tok.render_chat(CHAT, chat_template_kwargs=kwargs) == "T2"
    assert tok.encode_chat(CHAT, chat_template_kwargs=kwargs) == whole_ids(root, "T2")
    assert tok.render_chat(CHAT, chat_template_kwargs={"tools": None}) == "D"


def test_encode_chat_passes_the_generation_prompt_and_the_kwargs_to_the_template(llama_dir: Path):
    tok = HfTokenizer(llama_dir)
    no_prompt = tok.encode_chat(CHAT, add_generation_prompt=False)
    decoded = raw(llama_dir).decode(no_prompt, skip_special_tokens=False)
    assert decoded.endswith(f"how are you today?\n{EOS}\n")
    thinking_off = tok.encode_chat(CHAT, chat_template_kwargs={"enable_thinking": False})
    decoded = raw(llama_dir).decode(thinking_off, skip_special_tokens=False)
    assert decoded.endswith(f"{H}assistant{E}\n\n\n<think></think>\n")


async def test_a_truncated_chat_is_rendered_with_its_tools_kwargs_and_generation_prompt(llama_dir: Path):
    tokenizer = RequestTokenizer(HfTokenizer(llama_dir), timeout_s=5.0)
    for fields in (
        {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
        {"add_generation_prompt": False},
    ):
        body = {"model": "m", "messages": CHAT, **fields}
        whole = await tokenizer.tokenize(parsed(body))
        assert await tokenizer.tokenize(parsed({**body, "truncate_prompt_tokens": len(whole) + 5})) == whole
        kept = len(whole) - 3
        assert await tokenizer.tokenize(parsed({**body, "truncate_prompt_tokens": kept})) == whole[3:]
    text = raw(llama_dir).decode(whole, skip_special_tokens=False)
    assert text.endswith(f"how are you today?\n{EOS}\n")  # the last body had no generation prompt


def test_template_special_tokens_include_model_specific_ones_but_not_flags(tmp_path: Path):
    root = write_tokenizer_dir(
        tmp_path,
        chat_template="{{ image_token }}|{{ add_bos_token is defined }}|{{ eos_token }}",
        config={
            "add_bos_token": True,  # a `*_token` key that holds no token
            "model_specific_special_tokens": {"image_token": "<img>"},
            "added_tokens_decoder": {},
        },
    )
    assert HfTokenizer(root).render_chat(CHAT) == f"<img>|False|{EOS}"


def test_a_processors_chat_template_json_is_the_default_template(tmp_path: Path):
    root = write_tokenizer_dir(tmp_path, chat_template=None)
    (root / "chat_template.json").write_text(json.dumps({"chat_template": "P{{ messages | length }}"}))
    tok = HfTokenizer(root)
    assert tok.render_chat(CHAT) == "P3"
    assert tok.encode_chat(CHAT) == whole_ids(root, "P3")


def test_files_are_read_as_utf8_whatever_the_locale(tmp_path: Path, c_locale: None):
    root = write_tokenizer_dir(tmp_path)
    config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["greeting_token"] = "héllo"
    (root / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    template = "«{{ messages | length }}» {{ greeting_token }}"
    (root / "chat_template.jinja").write_text(template, encoding="utf-8")
    assert HfTokenizer(root).render_chat(CHAT) == "«3» héllo"


# --- name, stats, load logs ------------------------------------------------------------------------------


def test_the_name_is_hf_and_the_directory(llama_dir: Path):
    tok = HfTokenizer(llama_dir, piece_cache_bytes=0)
    assert tok.name == f"hf:{llama_dir}"
    assert RequestTokenizer(tok, timeout_s=1.0).name == f"hf:{llama_dir}"


def test_without_a_piece_cache_there_are_no_cache_stats(llama_dir: Path):
    tok = HfTokenizer(llama_dir, piece_cache_bytes=0)
    assert tok.piece_cache_stats() is None
    assert tok.prefix_cache_stats() is None
    assert RequestTokenizer(tok, timeout_s=1.0).prefix_cache_stats() is None
    with_cache = HfTokenizer(llama_dir)
    assert with_cache.prefix_cache_stats() is not None


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_the_load_logs_that_chats_are_encoded_piecewise_and_the_cache_size(
    llama_dir: Path, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        HfTokenizer(llama_dir, piece_cache_bytes=123_456)
    [message] = _records(caplog, logging.INFO)
    assert f"hf:{llama_dir}" in message
    assert "chat prompts encoded piecewise" in message and "123456 bytes" in message
    assert not _records(caplog, logging.WARNING)


def test_the_load_logs_why_chats_are_encoded_whole_and_which_template(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    root = write_tokenizer_dir(tmp_path, chat_template=MERGED_TEMPLATE)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        HfTokenizer(root)
    [template_line] = _records(caplog, logging.INFO)
    assert f"hf:{root}" in template_line
    assert "'default'" in template_line and "no added token between messages" in template_line
    [warning] = _records(caplog, logging.WARNING)
    assert f"hf:{root}" in warning and "encoded whole" in warning and WHOLE_REASON in warning


# --- errors name the file at fault -----------------------------------------------------------------------


def test_a_missing_tokenizer_json_is_named(tmp_path: Path):
    with pytest.raises(TokenizerUnavailable) as caught:
        HfTokenizer(tmp_path / "nothing")
    assert str(tmp_path / "nothing" / "tokenizer.json") in caught.value.message


def test_a_config_that_is_not_json_is_named(tmp_path: Path):
    root = write_tokenizer_dir(tmp_path)
    (root / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerUnavailable) as caught:
        HfTokenizer(root)
    assert str(root / "tokenizer_config.json") in caught.value.message


def test_a_template_file_that_is_not_utf8_is_named(tmp_path: Path):
    root = write_tokenizer_dir(tmp_path)
    (root / "chat_template.jinja").write_bytes(b"caf\xe9 {{ messages }}")  # latin-1, not UTF-8
    with pytest.raises(TokenizerUnavailable) as caught:
        HfTokenizer(root)
    assert str(root / "chat_template.jinja") in caught.value.message


@pytest.mark.parametrize(
    "chat_template",
    [
        [{"name": "default"}],
        [{"template": "T"}],
        [{"name": 1, "template": "T"}],
        [{"name": "default", "template": 2}],
        ["T"],
        5,
        {"default": "T"},
    ],
    ids=["no-template", "no-name", "int-name", "int-template", "bare-string-item", "number", "dict"],
)
def test_a_malformed_config_chat_template_is_refused_naming_the_directory(tmp_path: Path, chat_template: Any):
    root = write_tokenizer_dir(tmp_path, config={"chat_template": chat_template})
    with pytest.raises(TokenizerUnavailable) as caught:
        HfTokenizer(root)
    assert str(root) in caught.value.message


# --- truncation of given token ids -----------------------------------------------------------------------


async def test_truncate_prompt_tokens_zero_keeps_no_token_of_a_token_prompt(llama_dir: Path):
    tokenizer = RequestTokenizer(HfTokenizer(llama_dir, piece_cache_bytes=0), timeout_s=1.0)
    body = {"model": "m", "prompt": [5, 6, 7, 8]}
    assert await tokenizer.tokenize(parsed({**body, "truncate_prompt_tokens": 0})) == []
    assert await tokenizer.tokenize(parsed({**body, "truncate_prompt_tokens": 4})) == [5, 6, 7, 8]
    assert await tokenizer.tokenize(parsed({**body, "truncate_prompt_tokens": 1})) == [8]
