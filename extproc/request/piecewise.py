"""Piecewise encoding: a rendered chat prompt's ids as its pieces' ids, each piece encoded once and cached.

Owns the split of a text into pieces and when that split is exact; the cache is `token_cache.py`, the
choice to use it `tokenizer.HfTokenizer`. A chat client re-sends its whole conversation every turn, and
chat templates put an added (special) token at every message boundary, so a long conversation is mostly
pieces already seen.

Why it is exact. Hugging Face `tokenizers` (`tokenizer/added_vocabulary.rs`, `extract_and_normalize`)
first cuts the raw text on the added tokens that are not `normalized` ("pass 1": an Aho-Corasick
leftmost-longest search; an `lstrip`/`rstrip` token takes the white space beside it, a `single_word` one
only matches between non-word characters), then normalises each piece on its own and cuts it again on
the `normalized` added tokens, then pre-tokenizes and runs the model on each piece, and last runs the
post-processor over the ids. Nothing after pass 1 sees past its piece, so a pass-1 piece encoded alone
gets the ids it gets inside the whole text. `inexact_reason` refuses, at load, what breaks that:
- `single_word` tokens in pass 1: whether one matches depends on the characters beside it;
- `lstrip`/`rstrip` tokens beside tokens that start or end in white space (their spans could overlap);
- a Metaspace pre-tokenizer with `prepend_scheme: first` (it prepends only to the piece at offset 0);
- BPE dropout (random), truncation or padding configured in tokenizer.json;
- a normaliser, pre-tokenizer or post-processor type not known here (a new one could look at offsets).
The post-processors known here add ids only when asked (`add_special_tokens`); a template that puts the
text in other than once is refused (it would repeat or drop each piece). `special_wrapping` probes
which ids, once, and they go around the concatenation. Last, `probe_mismatch` encodes tricky texts both
ways at load and any difference refuses the piecewise path too.

`PieceSplitter` redoes pass 1 in Python (one regular expression, about 1 ms for 500 kB of prompt): the
tokenizer has no call that only splits (a second tokenizer with a trivial model took 60-110 ms).
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import tokenizers

from extproc.request.prefix_cache import PromptPrefixes
from extproc.request.token_cache import ID_TYPE, TokenCache, piece_key

# Rust's `\s` (Unicode White_Space), what pass 1 strips for lstrip/rstrip (Python's `\s` adds U+001C-1F)
WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B)
)
# Every type tokenizers 0.23 knows; each acts on one piece at a time (Metaspace: unless prepend_scheme first).
_NORMALIZERS = frozenset(
    {"BertNormalizer", "ByteLevel", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "Nmt", "Precompiled"}
    | {"Prepend", "Replace", "Sequence", "Strip", "StripAccents"}
)
_PRE_TOKENIZERS = frozenset(
    {"BertPreTokenizer", "ByteLevel", "CharDelimiterSplit", "Digits", "FixedLength", "Metaspace"}
    | {"Punctuation", "Sequence", "Split", "UnicodeScripts", "Whitespace", "WhitespaceSplit"}
)
_POST_PROCESSORS = frozenset(
    {"BertProcessing", "ByteLevel", "RobertaProcessing", "Sequence", "TemplateProcessing"}
)
_CHILDREN = ("normalizers", "pretokenizers", "processors")

Part = str | int  # a piece of text, or the id of an added token found between pieces
SERIAL_PIECES = 4  # missed pieces up to this many are encoded one by one, not in parallel
BatchEncode = Callable[..., list[tokenizers.Encoding]]
_FAST_PROBES = (
    "",
    " ",
    "Hello, world!",
    "  two  spaces\n\n\tand tabs ",
    "héllo wörld \u3000 日本語 🙂",
    "x" * 300,
)


def batch_encoder(backend: tokenizers.Tokenizer) -> BatchEncode:
    """The backend's `encode_batch_fast` (tokenizers >= 0.20: the same ids without character offsets,
    which nothing here reads; about 25-35 % less CPU on prose) when it gives `encode_batch`'s ids on a
    few probe texts, else `encode_batch`. Both release the GIL."""
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is None:
        return backend.encode_batch
    for text in _FAST_PROBES:
        for add in (False, True):
            if (
                fast([text], add_special_tokens=add)[0].ids
                != backend.encode_batch([text], add_special_tokens=add)[0].ids
            ):
                return backend.encode_batch
    return fast


class PieceSplitter:
    """Pass 1 of `tokenizers`' added-vocabulary split: the text between non-normalized added tokens."""

    def __init__(
        self, added: Mapping[int, tokenizers.AddedToken], *, encode_special_tokens: bool = False
    ) -> None:
        tokens = {t.content: (i, t) for i, t in added.items() if not t.normalized and t.content}
        self._ids = {content: i for content, (i, _) in tokens.items()}
        self._special = frozenset(c for c, (_, t) in tokens.items() if t.special)
        self._lstrip = frozenset(c for c, (_, t) in tokens.items() if t.lstrip)
        self._rstrip = frozenset(c for c, (_, t) in tokens.items() if t.rstrip)
        self._skip_special = encode_special_tokens
        # Longest first: the first alternative matching at a position is the longest (leftmost-longest)
        alternatives = "|".join(re.escape(c) for c in sorted(tokens, key=len, reverse=True))
        self._pattern = re.compile(f"({alternatives})") if tokens else None
        self._simple = not (self._lstrip or self._rstrip or (encode_special_tokens and self._special))
        self._max_chars = max(map(len, tokens), default=0)
        self.lengths = {i: len(content) for content, (i, _) in tokens.items()}  # an added token's characters
        # a text may be cut after an added token (`closed_at`) only where each id stands for one text
        self.cuttable = self._simple and self._pattern is not None and len(self.lengths) == len(tokens)

    def split(self, text: str) -> list[Part]:
        """Pieces (non-empty strings) and added-token ids, in order; their concatenation is `text`'s split."""
        if self._pattern is None:
            return [text] if text else []
        if self._simple:
            ids = self._ids
            return [ids[s] if i % 2 else s for i, s in enumerate(self._pattern.split(text)) if s]
        return self._split_stripping(text)

    def closed_at(self, text: str, cut: int) -> bool:
        """Whether no added token matches in `text` across `cut`: then, when `text[:cut]` ends in an
        added token of `text`'s split, the split of `text` is that of `text[:cut]` followed by that of
        `text[cut:]` (leftmost-longest decisions before `cut` never read past it). Simple splits only."""
        match = self._pattern.match if self.cuttable and self._pattern is not None else None
        if match is None:
            return False
        for at in range(max(0, cut - self._max_chars + 1), cut):
            found = match(text, at)
            if found is not None and found.end() > cut:
                return False
        return True

    def _split_stripping(self, text: str) -> list[Part]:
        # added_vocabulary.rs `find_matches`, step by step
        parts: list[Part] = []
        start_offset = 0
        for match in self._pattern.finditer(text) if self._pattern else ():
            content = match.group()
            if self._skip_special and content in self._special:
                continue
            start, stop = match.span()
            if content in self._lstrip:
                while start > start_offset and text[start - 1] in WHITE_SPACE:
                    start -= 1
            if content in self._rstrip:
                while stop < len(text) and text[stop] in WHITE_SPACE:
                    stop += 1
            if start_offset < start:
                parts.append(text[start_offset:start])
            parts.append(self._ids[content])
            start_offset = stop
        if start_offset < len(text):
            parts.append(text[start_offset:])
        return parts


def inexact_reason(backend: tokenizers.Tokenizer) -> str | None:
    """Why encoding pass-1 pieces alone could differ from encoding the whole text, or None when it cannot."""
    if backend.truncation is not None:
        return "tokenizer.json configures truncation"
    if backend.padding is not None:
        return "tokenizer.json configures padding"
    dropout = getattr(backend.model, "dropout", None)
    if dropout:
        return f"its {type(backend.model).__name__} model has dropout {dropout} (random merges)"
    for kind, component, known in (
        ("normalizer", backend.normalizer, _NORMALIZERS),
        ("pre-tokenizer", backend.pre_tokenizer, _PRE_TOKENIZERS),
        ("post-processor", backend.post_processor, _POST_PROCESSORS),
    ):
        try:  # each component pickles as its own tokenizer.json entry (not the whole vocabulary: fast)
            state = json.loads(component.__getstate__()) if component is not None else None
        except Exception as e:  # a custom (Python) component cannot be serialised, so not inspected
            return f"its {kind} cannot be inspected ({e})"
        for part in _components(state):
            part_type = part.get("type")
            if part_type not in known:
                return f"its {kind} {part_type!r} is not known to act on each piece alone"
            if part_type == "Metaspace" and part.get("prepend_scheme") == "first":
                return "its Metaspace pre-tokenizer prepends to the first piece only (prepend_scheme: first)"
            if (
                part_type == "TemplateProcessing"
                and (times := sum("Sequence" in piece for piece in part.get("single") or ())) != 1
            ):
                return f"its post-processor's template puts the text in {times} times, not once"
    pass1 = [t for t in backend.get_added_tokens_decoder().values() if not t.normalized]
    if single := [t.content for t in pass1 if t.single_word]:
        return f"added token {single[0]!r} is single_word: whether it matches depends on its neighbours"
    if any(t.lstrip or t.rstrip for t in pass1) and any(
        t.content and (t.content[0] in WHITE_SPACE or t.content[-1] in WHITE_SPACE) for t in pass1
    ):
        return "lstrip/rstrip added tokens beside added tokens that start or end in white space"
    return None


def _components(node: Any) -> Iterable[Mapping[str, Any]]:
    if not isinstance(node, Mapping):
        return
    yield node
    for key in _CHILDREN:
        for child in node.get(key) or ():
            yield from _components(child)


def special_wrapping(backend: tokenizers.Tokenizer) -> tuple[list[int], list[int]] | None:
    """The ids the post-processor puts before and after one text with `add_special_tokens`, or None when
    they are not the same around every probe text (or around the empty text)."""
    found: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for probe in ("a", "Hello, world!\n\n  x", "\u00e9 12"):
        bare = backend.encode(probe, add_special_tokens=False).ids
        full = backend.encode(probe, add_special_tokens=True).ids
        at = next((k for k in range(len(full) - len(bare) + 1) if full[k : k + len(bare)] == bare), None)
        if at is None:
            return None
        found.add((tuple(full[:at]), tuple(full[at + len(bare) :])))
    if len(found) != 1:
        return None
    prefix, suffix = found.pop()
    if backend.encode("", add_special_tokens=True).ids != [*prefix, *suffix]:
        return None
    return list(prefix), list(suffix)


class PiecewiseEncoder:
    """Encodes a text as its pass-1 pieces, reusing the ids of pieces seen before (`TokenCache`)."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        cache: TokenCache,
        prefixes: PromptPrefixes | None = None,
        encode_batch: BatchEncode | None = None,
    ) -> None:
        """Raises `ValueError` naming the reason when `backend` cannot be encoded piecewise exactly.

        With `prefixes`, a text that begins with a stored prefix (an earlier turn's prompt up to its
        last added token) takes that prefix's ids as they are and splits only the rest. `encode_batch`:
        the backend's `batch_encoder`, when the caller has it already."""
        if (reason := inexact_reason(backend)) is not None:
            raise ValueError(reason)
        self._encode_batch = encode_batch or batch_encoder(backend)
        self.cache = cache
        self.splitter = PieceSplitter(
            backend.get_added_tokens_decoder(), encode_special_tokens=backend.encode_special_tokens
        )
        self._wrapping = special_wrapping(backend)
        self.prefixes = prefixes if prefixes is not None and self.splitter.cuttable else None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """`text`'s ids, as `backend.encode(text, add_special_tokens=...)` gives them.

        Raises what the tokenizer raises (a piece it cannot encode), and `ValueError` for
        `add_special_tokens` when the post-processor's ids could not be probed (`can_add_special_tokens`).
        """
        return self.encode_array(text, add_special_tokens=add_special_tokens).tolist()

    def encode_array(self, text: str, *, add_special_tokens: bool = False) -> array[int]:
        """As `encode`, as a uint32 array: the cached pieces' arrays are copied into it in C, where a
        list of 100k ids costs about 2 ms to build (an int object each). Raises as `encode`."""
        prefix, suffix = self._special_ids(add_special_tokens)
        out = array(ID_TYPE, prefix)
        start = 0
        prefixes, splitter = self.prefixes, self.splitter
        known = prefixes.longest(text) if prefixes is not None else None
        if known is not None and splitter.closed_at(text, len(known[0])):
            start = len(known[0])
            out.extend(known[1])
        parts = splitter.split(text[start:] if start else text)
        pieces = [p for p in parts if type(p) is str]
        keys = [piece_key(p) for p in pieces]
        found = self.cache.get_many(keys)
        missing: dict[Hashable, str] = {}
        for key, piece, ids in zip(keys, pieces, found, strict=True):
            if ids is None:
                missing.setdefault(key, piece)
        fresh: dict[Hashable, array[int]] = {}
        if missing:
            encoded = self._encode_pieces(list(missing.values()))
            stored = self.cache.put_many(list(zip(missing, encoded, strict=True)))
            fresh = dict(zip(missing, stored, strict=True))
        append, extend = out.append, out.extend
        at = 0
        chars, cut_chars, cut_ids = start, 0, 0  # where the text's last added token ends
        lengths = splitter.lengths
        for part in parts:
            if type(part) is int:
                append(part)
                chars += lengths.get(part, 0)
                cut_chars, cut_ids = chars, len(out)
                continue
            ids = found[at]
            extend(fresh[keys[at]] if ids is None else ids)
            chars += len(pieces[at])
            at += 1
        if prefixes is not None and cut_chars > start and splitter.closed_at(text, cut_chars):
            prefixes.store(text[:cut_chars], out[len(prefix) : cut_ids])
        extend(array(ID_TYPE, suffix))
        return out

    def encode_uncached(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """The same ids without the cache (the load-time probe uses it)."""
        prefix, suffix = self._special_ids(add_special_tokens)
        parts = self.splitter.split(text)
        encoded = iter(self._encode_pieces([p for p in parts if type(p) is str]))
        out = list(prefix)
        for part in parts:
            if type(part) is int:
                out.append(part)
            else:
                out.extend(next(encoded))
        out.extend(suffix)
        return out

    @property
    def can_add_special_tokens(self) -> bool:
        return self._wrapping is not None

    def _special_ids(self, add_special_tokens: bool) -> tuple[list[int], list[int]]:
        if not add_special_tokens:
            return [], []
        if self._wrapping is None:
            raise ValueError("the post-processor's special tokens could not be probed")
        return self._wrapping

    def _encode_pieces(self, pieces: list[str]) -> list[list[int]]:
        # encode_batch releases the GIL and spreads the pieces over the cores; a few pieces (a chat's
        # new turn) are encoded one at a time: two ~1k-token pieces in parallel took 1.5-2x the CPU
        encode = self._encode_batch
        if len(pieces) <= SERIAL_PIECES:
            return [encode([piece], add_special_tokens=False)[0].ids for piece in pieces]
        return [e.ids for e in encode(pieces, add_special_tokens=False)]


def probe_mismatch(
    encoder: PiecewiseEncoder, backend: tokenizers.Tokenizer, texts: Iterable[str]
) -> str | None:
    """The first of `texts` (plus texts built around the added tokens) whose piecewise ids differ from the
    whole text's, as a short description; None when all agree."""
    tokens = [t.content for t in backend.get_added_tokens_decoder().values() if t.content][:64]
    built = [
        f"a{tokens[i]}b {tokens[-1 - i]} c\n\n{tokens[i]}{tokens[-1 - i]}  é{tokens[i]}\t"
        for i in range(min(len(tokens), 16))
    ]
    for text in [*texts, *built, "", " ", "\n\n", "héllo wörld  \u3000 ", "x" * 300]:
        for add in (False, True) if encoder.can_add_special_tokens else (False,):
            whole = backend.encode_batch([text], add_special_tokens=add)[0].ids
            if encoder.encode_uncached(text, add_special_tokens=add) != whole:
                return f"piecewise ids differ on probe text {text[:60]!r} (add_special_tokens={add})"
    return None
