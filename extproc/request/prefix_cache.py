"""PromptPrefixes: the ids of recent rendered chat prompts up to their last added token, bounded by bytes.

Owns the store and its counters; `piecewise.PiecewiseEncoder` decides where a prompt may be cut and
checks that the cut is exact. A chat client re-sends its whole conversation every turn, so the next
turn's rendered prompt begins with this turn's up to its last added token (the generation prompt's
header): its ids are copied from here, and only the text after the cut is split, keyed and looked up
in the piece cache (about 1 ms of Python saved at 100k tokens).

Found by the prompt's first `KEY_CHARS` characters (a few prompts each, the most recent first) and
confirmed by comparing the text: a stored prefix is used only when the new prompt begins with all of it.
A stored prefix that a newer one of the same key extends is dropped. Thread-safe (one short lock).
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_PREFIX_CACHE_BYTES = 32 * 1024 * 1024  # per tokenizer: ~40 conversations of 100k tokens
KEY_CHARS = 256
MIN_PREFIX_CHARS = 16 * 1024  # shorter prompts cost little to split
PER_KEY = 8  # prompts kept per key (conversations sharing a long system prompt)
_ENTRY_BYTES = 200


@dataclass(frozen=True, slots=True)
class PromptPrefixStats:
    lookups: int
    hits: int
    hit_tokens: int
    evictions: int
    entries: int
    bytes: int
    capacity_bytes: int


class PromptPrefixes:
    """Rendered prompt prefixes (ending right after an added token) and their ids, LRU by key."""

    def __init__(
        self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, *, min_chars: int = MIN_PREFIX_CHARS
    ) -> None:
        """`max_bytes` >= 0 (0: nothing kept), else `ValueError`; prompts under `min_chars` are not kept."""
        if max_bytes < 0:
            raise ValueError(f"prompt prefix cache max_bytes must be >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.min_chars = min_chars
        self._keys: OrderedDict[str, list[tuple[str, array[int], int]]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._lookups = self._hits = self._hit_tokens = self._evictions = 0

    def longest(self, text: str) -> tuple[str, array[int]] | None:
        """The longest stored prefix `text` begins with, and its ids (not to be changed), or None."""
        if len(text) < self.min_chars or not self.max_bytes:
            return None
        key = text[:KEY_CHARS]
        with self._lock:
            self._lookups += 1
            entries = self._keys.get(key)
            if not entries:
                return None
            self._keys.move_to_end(key)
            best = max(
                (e for e in entries if len(e[0]) <= len(text) and text.startswith(e[0])),
                key=lambda e: len(e[0]),
                default=None,
            )
            if best is None:
                return None
            self._hits += 1
            self._hit_tokens += len(best[1])
            return best[0], best[1]

    def store(self, prefix: str, ids: array[int]) -> None:
        """Keep `prefix` (a prompt cut right after an added token) and its ids (kept as given)."""
        if len(prefix) < self.min_chars or not self.max_bytes:
            return
        size = sys.getsizeof(prefix) + ids.itemsize * len(ids) + _ENTRY_BYTES
        if size > self.max_bytes:
            return
        key = prefix[:KEY_CHARS]
        with self._lock:
            entries = self._keys.get(key) or []
            kept = []
            for entry in entries:  # the prefixes this one extends (earlier turns) go
                if prefix.startswith(entry[0]):
                    self._bytes -= entry[2]
                else:
                    kept.append(entry)
            kept.insert(0, (prefix, ids, size))
            self._bytes += size
            for entry in kept[PER_KEY:]:
                self._bytes -= entry[2]
                self._evictions += 1
            self._keys[key] = kept[:PER_KEY]
            self._keys.move_to_end(key)
            while self._bytes > self.max_bytes and self._keys:
                _, dropped = self._keys.popitem(last=False)
                for entry in dropped:
                    self._bytes -= entry[2]
                    self._evictions += 1

    def stats(self) -> PromptPrefixStats:
        with self._lock:
            return PromptPrefixStats(
                lookups=self._lookups,
                hits=self._hits,
                hit_tokens=self._hit_tokens,
                evictions=self._evictions,
                entries=sum(len(e) for e in self._keys.values()),
                bytes=self._bytes,
                capacity_bytes=self.max_bytes,
            )
