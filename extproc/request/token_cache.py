"""TokenCache: the token ids of text pieces, least recently used first out, bounded by bytes.

Owns the cache and its counters; knows nothing of tokenizers (`piecewise.py` decides what a piece is and
fills it). Thread-safe: the picker tokenizes inline on the event loop and in worker threads at once, so
every read and write takes one short lock, never held while a tokenizer runs.

Keys: a piece of up to `SMALL_PIECE_CHARS` characters is its own key (its hash costs less than a digest,
and it is smaller than one with its object); a longer piece is keyed by its UTF-8 length and its BLAKE2b
128-bit digest, so the cache holds ids, not prompts (a collision needs 2**64 distinct pieces of one length
to be likely). Ids are stored as 32-bit arrays: 4 bytes a token instead of a list's ~36.

Size: each entry counts its ids, its key and `ENTRY_OVERHEAD_BYTES` for the dict slot and ordering node
(within a few percent of what tracemalloc sees: `benchmarks/bench_tokenize.py` reports both).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

# Per tokenizer (one per model). About 4.3 bytes a cached token (ids, keys, entries): ~30M tokens, more
# than the KV caches of 16 engines of ~1M tokens each; a conversation no engine still caches costs a
# prefill far dearer than its tokenization. benchmarks/bench_tokenize.py measures the bytes.
DEFAULT_PIECE_CACHE_BYTES = 128 * 1024 * 1024
SMALL_PIECE_CHARS = 64
ENTRY_OVERHEAD_BYTES = 96  # OrderedDict: hash-table slot (amortised) + linked node, on CPython 3.11
ID_TYPE = "I" if array("I").itemsize == 4 else "L"  # the cached ids' array type: 32-bit


@dataclass(frozen=True)
class TokenCacheStats:
    """A snapshot of the cache's counters (monotonic except `entries` and `bytes`)."""

    hits: int
    misses: int
    hit_tokens: int
    miss_tokens: int
    evictions: int
    entries: int
    bytes: int
    capacity_bytes: int

    @property
    def token_hit_ratio(self) -> float:
        """Share of tokens served from the cache (0.0 before any lookup)."""
        total = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / total if total else 0.0


def piece_key(piece: str) -> Hashable:
    """The cache key of `piece`: itself when short, else its UTF-8 length and BLAKE2b-128 digest."""
    if len(piece) <= SMALL_PIECE_CHARS:
        return piece
    data = piece.encode(
        "utf-8", "surrogatepass"
    )  # lone surrogates reach here from JSON; the tokenizer refuses them
    return hashlib.blake2b(data, digest_size=16).digest() + len(data).to_bytes(8, "little")


class TokenCache:
    """Token ids by piece key, least recently used evicted once `max_bytes` would be exceeded."""

    def __init__(self, max_bytes: int) -> None:
        """`max_bytes` > 0, else `ValueError` (no cache at all is how `HfTokenizer` disables it)."""
        if max_bytes <= 0:
            raise ValueError(f"token cache max_bytes must be > 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[array[int], int]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = self._misses = self._hit_tokens = self._miss_tokens = self._evictions = 0

    def get_many(self, keys: Sequence[Hashable]) -> list[array[int] | None]:
        """The ids stored under each key (None where absent); found entries become the most recent."""
        entries = self._entries
        out: list[array[int] | None] = []
        hits = hit_tokens = 0
        with self._lock:
            for key in keys:
                entry = entries.get(key)
                if entry is None:
                    out.append(None)
                    continue
                entries.move_to_end(key)
                out.append(entry[0])
                hits += 1
                hit_tokens += len(entry[0])
            self._hits += hits
            self._misses += len(keys) - hits
            self._hit_tokens += hit_tokens
        return out

    def put_many(self, items: Sequence[tuple[Hashable, Sequence[int]]]) -> list[array[int]]:
        """Store ids under keys (as most recent), evicting the least recent to stay within `max_bytes`.

        Returns the stored arrays in order. An entry larger than the whole bound is returned, not kept.
        Counts the tokens as missed: callers put what `get_many` did not find.
        """
        stored = [(key, array(ID_TYPE, ids)) for key, ids in items]
        sized = [(key, ids, _entry_bytes(key, ids)) for key, ids in stored]
        entries = self._entries
        with self._lock:
            for key, ids, size in sized:
                self._miss_tokens += len(ids)
                if size > self.max_bytes:
                    continue
                old = entries.pop(key, None)
                if old is not None:
                    self._bytes -= old[1]
                entries[key] = (ids, size)
                self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, size) = entries.popitem(last=False)
                self._bytes -= size
                self._evictions += 1
        return [ids for _, ids in stored]

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> TokenCacheStats:
        with self._lock:
            return TokenCacheStats(
                hits=self._hits,
                misses=self._misses,
                hit_tokens=self._hit_tokens,
                miss_tokens=self._miss_tokens,
                evictions=self._evictions,
                entries=len(self._entries),
                bytes=self._bytes,
                capacity_bytes=self.max_bytes,
            )


def _entry_bytes(key: Hashable, ids: array[int]) -> int:
    return sys.getsizeof(ids) + sys.getsizeof(key) + ENTRY_OVERHEAD_BYTES
