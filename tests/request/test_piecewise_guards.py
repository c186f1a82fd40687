"""The guards around piecewise encoding, each on a real `tokenizers` tokenizer (or one wrapped to fail
as none known does): the offset-free batch encoder is taken only where it agrees with and without
special tokens, the post-processor's ids are put around the text (both ends) only when asked and only
when they are the same around every text, `probe_mismatch` names the first text that differs, and a
prompt-prefix cache is kept only where a text can be cut."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, processors

from extproc.request.piecewise import PiecewiseEncoder, batch_encoder, probe_mismatch, special_wrapping
from extproc.request.prefix_cache import PromptPrefixes
from extproc.request.token_cache import TokenCache

from .test_piece_splitter import KINDS, char_tokenizer

TEXT = "<im>user\nhello there<end>\n<im>assistant\n"


def wrapped(single: str = "[B] $A [E]") -> Tokenizer:
    """The character-level tokenizer with `<im>`/`<end>` and a template post-processor around the text."""
    tok = char_tokenizer(
        *KINDS["plain"],
        AddedToken("[B]", normalized=False, special=True),
        AddedToken("[E]", normalized=False, special=True),
    )
    specials = [("[B]", tok.token_to_id("[B]")), ("[E]", tok.token_to_id("[E]"))]
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
    return tok


def encoder_of(tok: Tokenizer, prefixes: PromptPrefixes | None = None) -> PiecewiseEncoder:
    return PiecewiseEncoder(tok, TokenCache(1 << 20), prefixes)


class OneSidedFast:
    """A tokenizer whose offset-free `encode_batch_fast` differs from `encode_batch` only when
    `add_special_tokens` is `differs_with` (none is known to: the guard checks both)."""

    def __init__(self, backend: Tokenizer, differs_with: bool) -> None:
        self.backend = backend
        self.encode_batch = backend.encode_batch
        self.differs_with = differs_with

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = True):
        if add_special_tokens is not self.differs_with:
            return self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        return self.backend.encode_batch([f"{t}x" for t in texts], add_special_tokens=add_special_tokens)


class WithoutFast:
    """A `tokenizers` older than 0.20: no `encode_batch_fast`."""

    def __init__(self, backend: Tokenizer) -> None:
        self.encode_batch = backend.encode_batch


class OneSidedEncode:
    """A tokenizer to compare against whose ids differ from the real one's only when
    `add_special_tokens` is `differs_with`."""

    def __init__(self, backend: Tokenizer, differs_with: bool) -> None:
        self.backend = backend
        self.differs_with = differs_with
        self.get_added_tokens_decoder = backend.get_added_tokens_decoder

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True):
        encoded = self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        if add_special_tokens is not self.differs_with:
            return encoded
        return self.backend.encode_batch([f"{t}x" for t in texts], add_special_tokens=add_special_tokens)


class RewritingPostProcessor:
    """A tokenizer (the real one, attribute for attribute) whose ids with special tokens do not contain
    the text's own ids: none known does; `special_wrapping` must not take it for a wrapping."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def encode(self, text: str, add_special_tokens: bool = True):
        return self.backend.encode(text.swapcase() if add_special_tokens else text, add_special_tokens=False)


# --- the offset-free batch encoder ----------------------------------------------------------------


@pytest.mark.parametrize("differs_with", [False, True])
def test_a_fast_encoder_that_differs_with_or_without_special_tokens_is_not_taken(differs_with):
    backend = wrapped()
    one_sided = OneSidedFast(backend, differs_with)
    assert batch_encoder(one_sided) == one_sided.encode_batch  # type: ignore[arg-type]
    assert batch_encoder(backend) == backend.encode_batch_fast  # the same tokenizer unwrapped: taken


def test_a_tokenizers_without_the_fast_encoder_gets_encode_batch():
    without = WithoutFast(wrapped())
    assert batch_encoder(without) == without.encode_batch  # type: ignore[arg-type]


# --- the post-processor's ids ---------------------------------------------------------------------


def test_special_tokens_go_around_the_text_only_when_asked_at_both_ends():
    tok = wrapped()
    encoder = encoder_of(tok)
    assert encoder.can_add_special_tokens
    bare = tok.encode(TEXT, add_special_tokens=False).ids
    whole = tok.encode(TEXT, add_special_tokens=True).ids
    assert whole == [tok.token_to_id("[B]"), *bare, tok.token_to_id("[E]")]
    assert encoder.encode(TEXT) == encoder.encode_array(TEXT).tolist() == bare  # not asked: none
    assert encoder.encode_uncached(TEXT) == bare
    for _ in range(2):  # pieces encoded, then from the cache
        assert encoder.encode(TEXT, add_special_tokens=True) == whole
        assert encoder.encode_array(TEXT, add_special_tokens=True).tolist() == whole
    assert encoder.encode_uncached(TEXT, add_special_tokens=True) == whole


@pytest.mark.parametrize(("single", "times"), [("[B] $A [E] $A", 2), ("[B]", 0)])
def test_a_template_that_puts_the_text_in_other_than_once_refuses_the_piecewise_path(single, times):
    """Even without special tokens: each piece would be repeated (or dropped), not the whole text."""
    tok = wrapped(single)
    bare = tok.encode("ab", add_special_tokens=False).ids
    assert bare == [0, 1] * times
    with pytest.raises(
        ValueError, match=rf"^its post-processor's template puts the text in {times} times, not once$"
    ):
        encoder_of(tok)


def test_ids_with_special_tokens_that_do_not_contain_the_texts_cannot_be_added_piecewise():
    tok = RewritingPostProcessor(wrapped())
    assert special_wrapping(tok) is None  # type: ignore[arg-type]
    encoder = encoder_of(tok)  # type: ignore[arg-type]
    assert not encoder.can_add_special_tokens
    assert encoder.encode(TEXT) == tok.encode(TEXT, add_special_tokens=False).ids  # without: exact
    for encode in (encoder.encode, encoder.encode_uncached):
        with pytest.raises(ValueError, match=r"^the post-processor's special tokens could not be probed$"):
            encode(TEXT, add_special_tokens=True)


# --- probe_mismatch ---------------------------------------------------------------------------------


def test_probe_mismatch_finds_nothing_on_an_exact_tokenizer():
    tok = wrapped()
    assert probe_mismatch(encoder_of(tok), tok, [TEXT, "", "x"]) is None


@pytest.mark.parametrize("differs_with", [False, True])
def test_probe_mismatch_names_the_first_text_that_differs_with_or_without_special_tokens(differs_with):
    tok = wrapped()
    other = OneSidedEncode(tok, differs_with)
    found = probe_mismatch(encoder_of(tok), other, ["first text", TEXT])  # type: ignore[arg-type]
    assert found == f"piecewise ids differ on probe text 'first text' (add_special_tokens={differs_with})"


def test_probe_mismatch_leaves_special_tokens_out_where_they_cannot_be_added():
    """Nothing to compare with special tokens: a difference only there is not the encoder's."""
    tok = RewritingPostProcessor(wrapped())
    encoder = encoder_of(tok)  # type: ignore[arg-type]
    assert probe_mismatch(encoder, OneSidedEncode(tok, True), [TEXT]) is None  # type: ignore[arg-type]
    found = probe_mismatch(encoder, OneSidedEncode(tok, False), [TEXT])  # type: ignore[arg-type]
    assert found is not None and found.endswith("(add_special_tokens=False)")


# --- the prompt-prefix cache -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lstrip", "rstrip"])
def test_no_prefix_cache_is_kept_where_a_text_cannot_be_cut(kind):
    """A splitter that strips white space is never cut (`closed_at`): a prefix cache there would only
    take memory, and `HfTokenizer.prefix_cache_stats` would report one that never serves."""
    assert encoder_of(char_tokenizer(*KINDS[kind]), PromptPrefixes()).prefixes is None
    prefixes = PromptPrefixes()
    assert encoder_of(char_tokenizer(*KINDS["plain"]), prefixes).prefixes is prefixes
    assert encoder_of(char_tokenizer(*KINDS["plain"])).prefixes is None  # none given


# --- what the load-time probes try ----------------------------------------------------------------


class DiffersOn:
    """The real tokenizer, except that the ids of one text (with or without special tokens, as asked)
    are another's: a stand-in for a tokenizer that mishandles that text, to show the probes try it."""

    def __init__(self, backend: Tokenizer, text: str, *, with_special_tokens: bool | None = None) -> None:
        self.backend = backend
        self.text = text
        self.with_special_tokens = with_special_tokens

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def _bent(self, text: str, add_special_tokens: bool) -> str:
        asked = self.with_special_tokens in (None, add_special_tokens)
        return f"{text}x" if text == self.text and asked else text

    def encode(self, text: str, add_special_tokens: bool = True):
        return self.backend.encode(
            self._bent(text, add_special_tokens), add_special_tokens=add_special_tokens
        )

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True):
        bent = [self._bent(t, add_special_tokens) for t in texts]
        return self.backend.encode_batch(bent, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("probe", ["a", "Hello, world!\n\n  x", "\u00e9 12"])
def test_the_wrapping_is_probed_around_each_of_its_texts(probe):
    assert special_wrapping(DiffersOn(wrapped(), probe, with_special_tokens=True)) is None  # type: ignore[arg-type]
    assert special_wrapping(DiffersOn(wrapped(), probe + "!", with_special_tokens=True)) is not None  # type: ignore[arg-type]


@pytest.mark.parametrize("probe", ["", " ", "\n\n", "héllo wörld  \u3000 ", "x" * 300])
def test_probe_mismatch_tries_each_of_its_fixed_texts(probe):
    tok = wrapped()
    found = probe_mismatch(encoder_of(tok), DiffersOn(tok, probe), [])  # type: ignore[arg-type]
    assert found == f"piecewise ids differ on probe text {probe[:60]!r} (add_special_tokens=False)"


def test_probe_mismatch_builds_a_text_around_each_pair_of_added_tokens_from_both_ends():
    """Token i beside token i from the end, for the first 16 of the first 64 added tokens."""
    tok = wrapped()
    t = [added.content for added in tok.get_added_tokens_decoder().values()]  # <im>, <end>, [B], [E]
    for i in range(4):
        built = f"a{t[i]}b {t[-1 - i]} c\n\n{t[i]}{t[-1 - i]}  é{t[i]}\t"
        assert probe_mismatch(encoder_of(tok), DiffersOn(tok, built), []) is not None  # type: ignore[arg-type]


def test_a_mismatch_names_the_first_sixty_characters_of_its_text():
    tok = wrapped()
    text = "y" * 59 + "z" + "w" * 40
    found = probe_mismatch(encoder_of(tok), DiffersOn(tok, text), [text])  # type: ignore[arg-type]
    assert found == f"piecewise ids differ on probe text '{'y' * 59}z' (add_special_tokens=False)"


class FutureComponent:
    """A component of a later `tokenizers`, of a type not known here."""

    def __getstate__(self) -> str:
        return '{"type": "FutureProcessing"}'


class WithFuturePostProcessor:
    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend
        self.post_processor = FutureComponent()

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


def test_a_post_processor_of_an_unknown_type_is_named_as_such():
    with pytest.raises(
        ValueError, match=r"^its post-processor 'FutureProcessing' is not known to act on each piece"
    ):
        encoder_of(WithFuturePostProcessor(wrapped()))  # type: ignore[arg-type]
