"""BodyPrefixes: a JSON body parsed again only past what a recent body shared with it, bounded by bytes.

A chat client re-sends its whole conversation every turn: the body of the turn that brings a chat to
100k tokens is ~400 kB, and all of it but the new messages is the previous body's bytes. `loads`
returns what `decoder.decode(text)` returns (the same values, the same errors), but takes from a
stored body the values of the top-level object's members, and the leading elements of its `messages`
array, that lie wholly in the bytes the two bodies share. That is exact because the parse of a JSON
value depends only on its own characters; a number is the one value the next character could extend,
and then that character is not the `,`, `}` or `]` the walk must find there, so the text is parsed
whole. A chat's next turn costs the parse of its new messages, not of the conversation (at 400 kB,
0.64 -> 0.17 ms for `parse_openai_body`).

A body is found by a digest (XXH3-64) of its bytes up to each checkpoint (every `CHECKPOINT_BYTES`),
longest first; the bytes the two share are then counted exactly (a digest only suggests the
candidate). A body is stored with its checkpoints, and a later body that shares them takes them over
(the previous turn of a chat, which its next turn extends, is dropped).

Parsed here is JSON's grammar for the top-level object and the `messages` array, one member or element
at a time (each value by the decoder's own scanner). Anything else, and any error, goes to
`decoder.decode(text)` whole, which answers as it always does; so does a `messages` array of more than
`MAX_ELEMENTS` elements (a scanner call each would cost more than the parse). The caller's `watch`
pattern (parse.py's unpaired-surrogate escape) is searched for only past the shared part of the text
when the stored body had none in it. Values taken from a stored body are that body's objects: callers
must not change them (the parse worker only marshals them). Not thread-safe: one per parse worker.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

DEFAULT_BODY_PREFIX_BYTES = 32 * 1024 * 1024  # about 40 bodies of 400 kB, and their values
CHECKPOINT_BYTES = 16 * 1024  # bodies under two of these (parsed in well under 0.1 ms) are parsed whole
MAX_ELEMENTS = 4096  # a `messages` array longer than this is parsed whole
WATCH_CHARS = 16  # the longest match of a `watch` pattern
_SPAN_BYTES = 120  # a stored span: its tuple and list slots
_KEY_BYTES = 64  # a checkpoint key and its index slot
_VALUE_FACTOR = 2  # the values of a body take about twice its bytes (strings, dicts)

# JSON's whitespace; the pattern matches the empty string too, so its match is never None
_skip_ws: Callable[[str, int], re.Match[str]] = re.compile(r"[ \t\n\r]*").match  # type: ignore[assignment]
_scanstring: Callable[[str, int, bool], tuple[str, int]] = getattr(json.decoder, "scanstring")  # noqa: B009
_Key = tuple[int, int]  # checkpoint, digest of the bytes up to it


class _NotSimple(Exception):
    """The text is not the shape parsed here, or not valid JSON: the decoder parses it whole."""


@dataclass(frozen=True, slots=True)
class BodyPrefixStats:
    """A snapshot of the store's counters (monotonic except `entries` and `bytes`)."""

    lookups: int  # bodies looked up (at least two checkpoints long)
    hits: int  # bodies that took values from a stored one
    reused_bytes: int  # bytes of those bodies not parsed again
    whole: int  # bodies handed to the decoder whole (another shape, an error, too many elements)
    entries: int
    bytes: int
    capacity_bytes: int


class _Stored:
    """One body: its bytes, checkpoint keys, and the spans and values a later body may take.

    `members`: (value start, end, end in bytes, value) of the top-level members;
    the `messages` array (the first, if the key repeats): where its '[' is (-1: none), and its
    elements with their ends, in characters and in bytes.
    """

    __slots__ = (
        "array_byte_start",
        "array_start",
        "body",
        "clean",
        "element_byte_ends",
        "element_ends",
        "elements",
        "keys",
        "live",
        "members",
        "size",
    )

    def __init__(self, body: bytes, keys: list[_Key]) -> None:
        self.body = body
        self.keys = keys
        self.members: list[tuple[int, int, int, Any]] = []
        self.array_start = self.array_byte_start = -1
        self.elements: list[Any] = []
        self.element_ends: list[int] = []
        self.element_byte_ends: list[int] = []
        self.clean = 0  # where the first match of `watch` begins in its text (its length: none)
        self.live = 0
        self.size = 0

    def shared_elements_bytes(self, shared: int) -> int:
        """The bytes of the `messages` elements that lie wholly in the first `shared` bytes."""
        taken = bisect_right(self.element_byte_ends, shared)
        return self.element_byte_ends[taken - 1] - self.array_byte_start if taken else 0


@dataclass(frozen=True, slots=True)
class MessagesSpans:
    """Where a body's `messages` array and its elements lie (character and byte offsets), and where
    the first match of the `watch` pattern begins in its text (its length: none)."""

    array_start: int
    array_byte_start: int
    element_ends: tuple[int, ...]
    element_byte_ends: tuple[int, ...]
    clean: int


class BodyPrefixes:
    """Parses JSON texts as `decoder.decode` does, reusing the values a recent body shares.

    `watch`: a pattern (matching at most `WATCH_CHARS` characters) whose presence in the text the
    caller needs to know; it is searched for only past the part of the text a stored body shared.
    """

    def __init__(
        self,
        decoder: json.JSONDecoder,
        watch: re.Pattern[str],
        max_bytes: int = DEFAULT_BODY_PREFIX_BYTES,
        *,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        max_elements: int = MAX_ELEMENTS,
    ) -> None:
        """`max_bytes` >= 0 (0: nothing stored, every body parsed whole) and `checkpoint_bytes` > 0,
        else `ValueError`. Bodies shorter than two checkpoints, and those whose `messages` array has
        more than `max_elements` elements, are parsed whole."""
        if max_bytes < 0 or checkpoint_bytes <= 0:
            raise ValueError(
                f"need max_bytes >= 0 and checkpoint_bytes > 0, got {max_bytes!r}, {checkpoint_bytes!r}"
            )
        self.decoder = decoder
        self.watch = watch
        self.max_bytes = max_bytes
        self.checkpoint_bytes = checkpoint_bytes
        self.max_elements = max_elements
        self.last: MessagesSpans | None = None  # where the `messages` of the last body walked lie
        self._index: dict[_Key, _Stored] = {}
        self._stored: OrderedDict[int, _Stored] = OrderedDict()  # by id(), least recent first
        self._bytes = 0
        self._lookups = self._hits = self._reused_bytes = self._whole = 0

    def loads(self, text: str, body: bytes) -> tuple[Any, bool]:
        """`decoder.decode(text)` (raising what it raises), and whether `watch` occurs in `text`;
        `body` is `text` as UTF-8 bytes."""
        loaded = self._loads(text, body, None)
        assert loaded is not None  # unbounded: parsed one way or the other
        return loaded

    def loads_shared(self, body: bytes, max_unshared: int) -> tuple[Any, bool] | None:
        """As `loads` of `body` (strict UTF-8, no byte order mark) when a stored body's `messages`
        elements leave at most `max_unshared` bytes of it to parse; otherwise None, having parsed
        nothing beyond that (not even decoded it), as where the walk fails (an error, another shape,
        not UTF-8): a bounded parse or none (the event loop's use)."""
        return self._loads(None, body, max_unshared)

    def _loads(self, text: str | None, body: bytes, max_unshared: int | None) -> tuple[Any, bool] | None:
        self.last = None
        bounded = max_unshared is not None
        if len(body) < 2 * self.checkpoint_bytes or not self.max_bytes:
            if text is None:
                return None
            return self.decoder.decode(text), self.watch.search(text) is not None
        self._lookups += 1
        keys = _checkpoint_keys(body, self.checkpoint_bytes)
        found = self._find(keys)
        shared = _common_prefix(body, found.body) if found is not None else 0
        if max_unshared is not None and (
            found is None or len(body) - found.shared_elements_bytes(shared) > max_unshared
        ):
            return None
        if text is None:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                return None
            if text.startswith("\ufeff"):  # json.loads refuses it: the whole parse says so
                return None
        walk = _Walk(self, text, found, shared, _Stored(body, keys))
        try:
            value = walk.run()
        except (_NotSimple, ValueError, IndexError, RecursionError):
            self._whole += 1
            if bounded:
                return None
            return self.decoder.decode(text), self.watch.search(text) is not None
        record = walk.record
        if walk.reused:
            self._hits += 1
            self._reused_bytes += walk.reused
        # text[:walk.reused_chars] is the stored body's text: no match begins early in it
        since = walk.reused_chars if found is not None and found.clean >= walk.reused_chars else 0
        match = self.watch.search(text, max(0, since - WATCH_CHARS))
        record.clean = match.start() if match is not None else len(text)
        self._store(record)
        if record.array_start >= 0:
            self.last = MessagesSpans(
                record.array_start,
                record.array_byte_start,
                tuple(record.element_ends),
                tuple(record.element_byte_ends),
                record.clean,
            )
        return value, match is not None

    def remember(self, body: bytes, messages: Sequence[Any], spans: MessagesSpans) -> None:
        """Store `body`, whose `messages` array another process parsed (`messages`, its elements, lie
        at `spans`, which that process's `last` gave): a later body takes them from here."""
        if (
            len(body) < 2 * self.checkpoint_bytes
            or len(messages) != len(spans.element_ends)
            or len(messages) > self.max_elements
        ):
            return
        record = _Stored(body, _checkpoint_keys(body, self.checkpoint_bytes))
        record.array_start, record.array_byte_start = spans.array_start, spans.array_byte_start
        record.elements = list(messages)
        record.element_ends, record.element_byte_ends = (
            list(spans.element_ends),
            list(spans.element_byte_ends),
        )
        record.clean = spans.clean
        self._store(record)

    def forget(self, body: bytes) -> None:
        """Drop the stored record of `body` (the same object), if any."""
        for key in reversed(_checkpoint_keys(body, self.checkpoint_bytes)):
            stored = self._index.get(key)
            if stored is not None and stored.body is body:
                self._drop(stored)
                return

    def stats(self) -> BodyPrefixStats:
        return BodyPrefixStats(
            lookups=self._lookups,
            hits=self._hits,
            reused_bytes=self._reused_bytes,
            whole=self._whole,
            entries=len(self._stored),
            bytes=self._bytes,
            capacity_bytes=self.max_bytes,
        )

    def _find(self, keys: list[_Key]) -> _Stored | None:
        for key in reversed(keys):
            stored = self._index.get(key)
            if stored is not None:
                self._stored.move_to_end(id(stored))
                return stored
        return None

    def _store(self, record: _Stored) -> None:
        spans = len(record.members) + len(record.elements)
        record.size = (
            (1 + _VALUE_FACTOR) * len(record.body) + spans * _SPAN_BYTES + _KEY_BYTES * len(record.keys)
        )
        if record.size > self.max_bytes:
            return
        for key in record.keys:
            old = self._index.get(key)
            self._index[key] = record
            record.live += 1
            if old is not None:
                old.live -= 1
                if not old.live and self._stored.pop(id(old), None) is old:
                    self._bytes -= old.size
        self._stored[id(record)] = record
        self._bytes += record.size
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._stored.values())))

    def _drop(self, record: _Stored) -> None:
        if self._stored.pop(id(record), None) is record:
            self._bytes -= record.size
        for key in record.keys:
            if self._index.get(key) is record:
                del self._index[key]


class _Walk:
    """One parse of `text`: the top-level object member by member, `messages` element by element."""

    def __init__(
        self, store: BodyPrefixes, text: str, found: _Stored | None, shared: int, record: _Stored
    ) -> None:
        self.scan: Callable[[str, int], tuple[Any, int]] = getattr(store.decoder, "scan_once")  # noqa: B009
        self.strict = store.decoder.strict
        self.max_elements = store.max_elements
        self.text = text
        self.found = found
        self.shared = shared  # leading bytes equal in this body and `found.body`
        self.record = record
        self.reused = self.reused_chars = 0  # where the last value taken from `found` ends (bytes, chars)
        self.ascii = text.isascii()  # else character offsets are counted in bytes, forward:
        self.chars_at = self.bytes_at = 0

    def run(self) -> Any:
        text, ws = self.text, _skip_ws
        i = ws(text, 0).end()
        if text[i] != "{":
            raise _NotSimple
        obj: dict[str, Any] = {}
        i = ws(text, i + 1).end()
        if text[i] == "}":
            i += 1
        else:
            while True:
                if text[i] != '"':
                    raise _NotSimple
                key, i = _scanstring(text, i + 1, self.strict)
                i = ws(text, i).end()
                if text[i] != ":":
                    raise _NotSimple
                i = ws(text, i + 1).end()
                if key == "messages" and text[i] == "[" and self.record.array_start < 0:
                    value, end = self._array(i)
                else:
                    value, end = self._member(i)
                obj[key] = value
                i = ws(text, end).end()
                if text[i] == ",":
                    i = ws(text, i + 1).end()
                    continue
                if text[i] != "}":
                    raise _NotSimple
                i += 1
                break
        if ws(text, i).end() != len(text):
            raise _NotSimple
        return obj

    def _member(self, start: int) -> tuple[Any, int]:
        """The value at `start`: the stored body's when it lies in the shared bytes, else scanned."""
        if self.found is not None:
            for member in self.found.members:
                if member[0] == start and member[2] <= self.shared:
                    self.record.members.append(member)
                    self._took(member[1], member[2])
                    return member[3], member[1]
        value, end = self._scan(start)
        self.record.members.append((start, end, self._byte_offset(end), value))
        return value, end

    def _array(self, start: int) -> tuple[list[Any], int]:
        """The `messages` array whose '[' is at `start`: the leading elements the stored body's
        array shares (it began at the same place), then the rest scanned one by one."""
        text, ws = self.text, _skip_ws
        record, found = self.record, self.found
        record.array_start, record.array_byte_start = start, self._byte_offset(start)
        elements, ends, byte_ends = record.elements, record.element_ends, record.element_byte_ends
        taken = 0
        if found is not None and found.array_start == start:
            taken = bisect_right(found.element_byte_ends, self.shared)
        if taken:
            elements += found.elements[:taken]  # type: ignore[union-attr]
            ends += found.element_ends[:taken]  # type: ignore[union-attr]
            byte_ends += found.element_byte_ends[:taken]  # type: ignore[union-attr]
            self.chars_at, self.bytes_at = ends[-1], byte_ends[-1]
            self._took(ends[-1], byte_ends[-1])
            i = ws(text, ends[-1]).end()
            if text[i] == "]":
                return elements, i + 1
            if text[i] != ",":
                raise _NotSimple
            i = ws(text, i + 1).end()
        else:
            i = ws(text, start + 1).end()
            if text[i] == "]":
                return elements, i + 1
        while True:
            if len(elements) >= self.max_elements:
                raise _NotSimple
            value, i = self._scan(i)
            elements.append(value)
            ends.append(i)
            byte_ends.append(self._byte_offset(i))
            i = ws(text, i).end()
            if text[i] == ",":
                i = ws(text, i + 1).end()
            elif text[i] == "]":
                return elements, i + 1
            else:
                raise _NotSimple

    def _took(self, chars: int, byte_end: int) -> None:
        if chars > self.reused_chars:
            self.reused_chars, self.reused = chars, byte_end

    def _scan(self, start: int) -> tuple[Any, int]:
        try:
            return self.scan(self.text, start)
        except StopIteration:  # no value there
            raise _NotSimple from None

    def _byte_offset(self, chars: int) -> int:
        """The byte offset of character offset `chars`, counted on from the last one asked or taken
        (the walk goes forward: each is at or after the one before)."""
        if self.ascii:
            return chars
        self.bytes_at += len(self.text[self.chars_at : chars].encode("utf-8", "surrogatepass"))
        self.chars_at = chars
        return self.bytes_at


def _checkpoint_keys(body: bytes, step: int) -> list[_Key]:
    digest = xxhash.xxh3_64()
    view = memoryview(body)
    keys = []
    for k in range(len(body) // step):
        digest.update(view[k * step : (k + 1) * step])
        keys.append((k + 1, digest.intdigest()))
    return keys


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` share: chunks compared in C, no copies."""
    view = memoryview(b)
    n = min(len(a), len(b))
    lo, step = 0, 4096
    while True:  # gallop: a[:lo] == b[:lo]
        hi = min(n, lo + step)
        if not a.startswith(view[lo:hi], lo):
            break
        if hi == n:
            return n
        lo, step = hi, step * 2
    while hi - lo > 1:  # a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a.startswith(view[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo
