"""`PieceSplitter` against Hugging Face `tokenizers` itself: for added tokens of every kind (plain,
`lstrip`, `rstrip`, normalized, special with `encode_special_tokens`, one a prefix of another), the ids
of a text encoded whole equal the ids of its pieces encoded alone, with each added token's id between
them; and `closed_at` says a text may be cut only where no added token crosses the cut.

The model is character-level (every character one id), so that white space an `lstrip` token takes,
or a token cut in two, shows in the ids.
"""

from __future__ import annotations

import string

import pytest
import tokenizers
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers

from extproc.request.piecewise import PieceSplitter, PiecewiseEncoder, inexact_reason
from extproc.request.prefix_cache import PromptPrefixes
from extproc.request.token_cache import TokenCache

ALPHABET = string.ascii_letters + string.digits + " \n\t<>|/_-."


def char_tokenizer(*added: AddedToken, encode_special_tokens: bool = False) -> tokenizers.Tokenizer:
    vocab = {c: i for i, c in enumerate(ALPHABET)} | {"[UNK]": len(ALPHABET)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.add_tokens(list(added))
    tok.encode_special_tokens = encode_special_tokens
    return tok


def splitter_of(tok: tokenizers.Tokenizer) -> PieceSplitter:
    return PieceSplitter(tok.get_added_tokens_decoder(), encode_special_tokens=tok.encode_special_tokens)


def piecewise_ids(tok: tokenizers.Tokenizer, text: str) -> list[int]:
    """Each piece encoded by the model alone (a tokenizer without the added tokens, which would split
    them out of a piece again and hide a piece the splitter got wrong), each added token's id between."""
    model_only = char_tokenizer()
    parts = splitter_of(tok).split(text)
    assert all(part != "" for part in parts)  # pieces are never empty
    ids: list[int] = []
    for part in parts:
        ids += [part] if isinstance(part, int) else model_only.encode(part, add_special_tokens=False).ids
    return ids


TEXTS = [
    "",
    "plain text, no token",
    "<im>user\nhi<end>\n<im>assistant",
    "a  <im>  b",
    "<im><end>",
    "  <end>  ",
    "x<im><im>y",
    "<im_start>and<im>",
    "\t<end>\n\nz",
]

KINDS = {
    "plain": [AddedToken("<im>", normalized=False), AddedToken("<end>", normalized=False)],
    "lstrip": [AddedToken("<im>", lstrip=True, normalized=False), AddedToken("<end>", normalized=False)],
    "rstrip": [AddedToken("<im>", normalized=False), AddedToken("<end>", rstrip=True, normalized=False)],
    "prefix": [AddedToken("<im>", normalized=False), AddedToken("<im_start>", normalized=False)],
    "special": [AddedToken("<im>", normalized=False, special=True), AddedToken("<end>", normalized=False)],
    "special, lstrip": [
        AddedToken("<im>", normalized=False, special=True),
        AddedToken("<end>", lstrip=True, normalized=False),
    ],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", TEXTS)
def test_pieces_encoded_alone_give_the_ids_of_the_whole_text(kind, text):
    tok = char_tokenizer(*KINDS[kind])
    assert piecewise_ids(tok, text) == tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("kind", ["special", "special, lstrip"])
@pytest.mark.parametrize("text", TEXTS)
def test_special_tokens_encoded_as_text_are_not_split_out(kind, text):
    tok = char_tokenizer(*KINDS[kind], encode_special_tokens=True)
    assert piecewise_ids(tok, text) == tok.encode(text, add_special_tokens=False).ids


def test_without_added_tokens_a_text_is_one_piece():
    splitter = splitter_of(char_tokenizer())
    assert splitter.split("abc") == ["abc"] and splitter.split("") == []
    assert not splitter.cuttable and not splitter.closed_at("abc", 1)


def test_a_normalized_added_token_is_left_to_the_later_passes():
    tok = char_tokenizer(AddedToken("<n>", normalized=True), AddedToken("<im>", normalized=False))
    assert splitter_of(tok).split("a<n>b<im>c") == ["a<n>b", tok.token_to_id("<im>"), "c"]


def test_a_text_may_be_cut_only_where_no_added_token_crosses_the_cut():
    tok = char_tokenizer(*KINDS["prefix"])  # <im> and <im_start>: leftmost-longest decides
    splitter = splitter_of(tok)
    assert splitter.cuttable
    text = "ab<im>cd<im_start>ef"
    assert splitter.closed_at(text, 6)  # right after <im>
    assert splitter.closed_at(text, 8)  # right before <im_start>
    assert splitter.closed_at(text, 2)  # right before <im>
    for inside in (3, 4, 5):
        assert not splitter.closed_at(text, inside)  # <im> crosses it
    assert not splitter.closed_at(
        text, 12
    )  # after "<im_" : <im_start> crosses it (its prefix <im> would not)
    assert not splitter.closed_at(text, 17)  # one character before the end of <im_start>
    assert not splitter.closed_at("<im_start>x", 3)  # a token at the very start crosses a cut near it
    assert splitter.closed_at("<im_start>x", 10)


def test_a_splitter_that_strips_white_space_is_never_cut():
    splitter = splitter_of(char_tokenizer(*KINDS["lstrip"]))
    assert not splitter.cuttable and not splitter.closed_at("ab<end>cd", 7)


# --- what refuses the piecewise path at load (`inexact_reason`) ---------------------------------------


def test_a_plain_tokenizer_has_no_reason_to_refuse():
    assert inexact_reason(char_tokenizer(*KINDS["plain"])) is None  # WordLevel: no dropout attribute at all


def test_truncation_padding_and_dropout_refuse_the_piecewise_path_each_with_its_reason():
    truncating = char_tokenizer()
    truncating.enable_truncation(16)
    assert inexact_reason(truncating) == "tokenizer.json configures truncation"
    padding = char_tokenizer()
    padding.enable_padding()
    assert inexact_reason(padding) == "tokenizer.json configures padding"
    dropout = tokenizers.Tokenizer(models.BPE(dropout=0.5))
    assert inexact_reason(dropout) == "its BPE model has dropout 0.5 (random merges)"


def test_a_metaspace_that_prepends_to_the_first_piece_only_refuses_even_inside_a_sequence():
    for scheme, refused in (("always", False), ("first", True)):
        tok = char_tokenizer()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(), pre_tokenizers.Metaspace(prepend_scheme=scheme)]
        )
        expected = "its Metaspace pre-tokenizer prepends to the first piece only (prepend_scheme: first)"
        assert inexact_reason(tok) == (expected if refused else None)


class _Custom:
    """A Python component: tokenizers cannot serialise it, so it cannot be inspected."""

    def normalize(self, normalized) -> None:
        pass

    def pre_tokenize(self, pretok) -> None:
        pass


def test_a_component_that_cannot_be_inspected_is_named_by_its_kind():
    tok = char_tokenizer()
    tok.normalizer = normalizers.Normalizer.custom(_Custom())
    assert inexact_reason(tok).startswith("its normalizer cannot be inspected (")
    tok = char_tokenizer()
    tok.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(_Custom())
    assert inexact_reason(tok).startswith("its pre-tokenizer cannot be inspected (")


def test_stripping_tokens_beside_a_token_that_ends_in_white_space_refuse():
    stripping = AddedToken("<a>", lstrip=True, normalized=False)
    refused = "lstrip/rstrip added tokens beside added tokens that start or end in white space"
    for content in ("<b>\n", "\t<b>"):
        assert inexact_reason(char_tokenizer(stripping, AddedToken(content, normalized=False))) == refused
    assert inexact_reason(char_tokenizer(stripping, AddedToken("<b>x", normalized=False))) is None


# --- the encoder with stored prompt prefixes ------------------------------------------------------------


SYSTEM = "you are a helpful assistant. " * 10  # longer than a stored prefix's key (its 256 first characters)
LONGER = [
    AddedToken("<end>", normalized=False),
    AddedToken("<end>\n", normalized=False),
]  # one extends the other


@pytest.mark.parametrize("kind", ["plain", "prefix", "special", "longer"])
def test_prompts_encoded_after_others_from_stored_prefixes_get_the_whole_prompts_ids(kind):
    """A prefix is stored only up to a prompt's last added token, and only where the text may be cut:
    a prompt with no added token stores nothing, and a later prompt sharing its first characters must
    not take them as a prefix."""
    tok = char_tokenizer(*(LONGER if kind == "longer" else KINDS[kind]))
    encoder = PiecewiseEncoder(tok, TokenCache(1 << 20), PromptPrefixes(1 << 20, min_chars=0))
    prompts = [
        "hello there",  # no added token
        "help me",  # shares "hel" with it
        "<im>user\nhi<end>\n<im>assistant",
        "<im>user\nhi<end>\n<im>assistant\nhello<end>\n<im>user",  # extends it past its last token
        "<im>user\nhi<end>x",  # shares a prefix that ends inside nothing stored
        "<im_start>sys<im>u",
        "<im_start>sys<im>u<end>",
        "h",
        f"{SYSTEM}<end>",  # stored up to <end> ...
        f"{SYSTEM}<end>\nmore<end>",  # ... which <end>\n crosses here: that prefix must not be taken
        f"{SYSTEM}<end>more<end>",  # here it may
    ]
    for prompt in [*prompts, *reversed(prompts)]:
        assert encoder.encode(prompt) == tok.encode(prompt, add_special_tokens=False).ids, prompt
