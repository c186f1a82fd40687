"""Block hashing compatible with NVIDIA Dynamo's KV router, and an exact prefix cache of its results.

Mirrors ai-dynamo `lib/kv-router/src/protocols.rs` (`compute_block_hash_for_seq`,
`compute_seq_hash_for_block`); the vectors that pin them are in `tests/router/test_hashing.py`.

- Local block hash: XXH3-64 of one full block of token ids as little-endian uint32 bytes,
  seed 1337. A partial tail block is not hashed.
- LoRA adapters and cache namespaces shift the seed, so equal tokens under different adapters
  never share a block.
- Sequence hash: the local hashes chained from the first block, identifying a block together
  with everything before it.

The functions are pure. The one piece of state is `BlockHashCache` (process-wide: `PREFIX_CACHE`), and
only `PromptTokens` use it: the picker hands the router a prompt's ids as `PromptTokens`, and a chat
client re-sends its whole conversation every turn, so the turn that brings a chat to 100k tokens would
hash ~6,000 blocks it hashed a turn before (about 1.4 ms of the event loop with the sequence hashes).
The cache keeps, per prompt, its ids and its hashes, found again by a digest of the ids up to each
checkpoint (every `CHECKPOINT_TOKENS`) and confirmed by comparing the bytes: a cached hash is used
only for blocks whose ids, and every id before them, are equal, so the results are the uncached ones.
Everything else (the simulator, benchmarks, events, lists of ids) hashes as before.
"""

from __future__ import annotations

import array
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

import numpy as np
import xxhash

XXH3_SEED = 1337  # Dynamo protocols.rs
_MASK64 = (1 << 64) - 1
_xxh3 = xxhash.xxh3_64_intdigest
_BIG_ENDIAN = sys.byteorder == "big"
_pack_pair = struct.Struct("<QQ").pack  # two little-endian u64: what a sequence hash hashes
_first = itemgetter(0)
assert array.array("I").itemsize == 4, "uint32 token layout needs a 4-byte C unsigned int"

TokenIds = Sequence[int] | np.ndarray

CHECKPOINT_TOKENS = 2048  # a cached prompt is found again at every multiple of this many tokens (about)
DEFAULT_PREFIX_CACHE_BYTES = 64 * 1024 * 1024  # about 65 conversations of 100k tokens (~1 MB each)
_HASH_ITEM_BYTES = 36 + 8  # a cached hash: a 64-bit int object and its list slot
_CHECKPOINT_BYTES = 120  # a checkpoint's key tuple and dict slot
_RECORD_BYTES = 300  # a record, its lists' headers and its LRU slot


class PromptTokens(array.array):  # type: ignore[type-arg]  # array.array("I"): uint32 ids
    """A prompt's token ids (uint32, `array.array("I", ...)`) whose block hashes may come from
    `PREFIX_CACHE`: what the picker routes on. Any other sequence of ids is hashed without it."""

    __slots__ = ()


class BlockHashes(list[int]):
    """Local block hashes from `PREFIX_CACHE`: `compute_sequence_hashes` continues their chain from
    the cached sequence hashes (and remembers it), as long as the list still holds what it got."""

    __slots__ = ("_cache", "_record")
    _cache: BlockHashCache
    _record: _Record


@dataclass(frozen=True, slots=True)
class BlockHashCacheStats:
    """A snapshot of the cache's counters (monotonic except `entries` and `bytes`)."""

    lookups: int  # prompts looked up (long enough to have a checkpoint)
    hits: int  # prompts whose leading blocks were found
    hit_blocks: int  # blocks whose local hashes came from the cache
    miss_blocks: int  # blocks hashed
    evictions: int  # prompts dropped to stay within the bound
    entries: int  # prompts held
    bytes: int
    capacity_bytes: int

    @property
    def block_hit_ratio(self) -> float:
        total = self.hit_blocks + self.miss_blocks
        return self.hit_blocks / total if total else 0.0


_Key = tuple[int, int, int, int]  # seed, block size, checkpoint, digest of the ids up to it


class _Record:
    """One prompt: its ids' bytes (full blocks), local hashes, the sequence hashes known so far."""

    __slots__ = ("data", "keys", "live", "local", "seq", "size")

    def __init__(self, data: bytearray, local: list[int], seq: list[int], keys: list[_Key]) -> None:
        self.data, self.local, self.seq, self.keys = data, local, seq, keys
        self.live = 0  # checkpoints that lead here (a later prompt takes over the ones it shares)
        self.size = 0


class BlockHashCache:
    """Local and sequence hashes of recent prompts, found by their leading ids; LRU, bounded by bytes.

    A prompt of at least one checkpoint is looked up by the digest (XXH3-64) of its ids up to each
    checkpoint, longest first; a candidate counts only if its stored ids begin with the prompt's ids
    up to that checkpoint. The prompt is then stored (ids, hashes) and its checkpoints lead to it: the
    previous turn of a chat, whose checkpoints all lead to the new one, is dropped. Thread-safe.
    """

    def __init__(self, max_bytes: int, *, checkpoint_tokens: int = CHECKPOINT_TOKENS) -> None:
        """`max_bytes` >= 0 (0: nothing cached), `checkpoint_tokens` > 0, else `ValueError`."""
        if max_bytes < 0 or checkpoint_tokens <= 0:
            raise ValueError(
                f"need max_bytes >= 0 and checkpoint_tokens > 0, got {max_bytes}, {checkpoint_tokens}"
            )
        self.max_bytes = max_bytes
        self.checkpoint_tokens = checkpoint_tokens
        self._index: dict[_Key, _Record] = {}
        self._records: OrderedDict[int, _Record] = OrderedDict()  # by id(record), oldest first
        self._lock = threading.Lock()
        self._bytes = 0
        self._lookups = self._hits = self._hit_blocks = self._miss_blocks = self._evictions = 0

    def block_hashes(self, buf: memoryview, block_size: int, seed: int) -> list[int]:
        """`compute_block_hashes` of the uint32 bytes `buf` (whole blocks: `len(buf)` a multiple of
        `4 * block_size`), its leading blocks' hashes from the cache when a stored prompt begins alike."""
        step = block_size * 4
        per = max(1, self.checkpoint_tokens // block_size)  # blocks between checkpoints
        interval = per * step
        checkpoints = len(buf) // interval
        if not checkpoints or not self.max_bytes:
            return _hash_blocks(buf, step, seed)
        digest = xxhash.xxh3_64()
        keys = []
        for k in range(checkpoints):
            digest.update(buf[k * interval : (k + 1) * interval])
            keys.append((seed, block_size, k + 1, digest.intdigest()))
        found: _Record | None = None
        blocks = 0
        with self._lock:
            self._lookups += 1
            for k in range(checkpoints, 0, -1):
                record = self._index.get(keys[k - 1])
                if record is not None and record.data.startswith(buf[: k * interval]):
                    found, blocks = record, k * per
                    self._records.move_to_end(id(record))
                    break
            if found is not None and len(found.data) == len(buf) and found.data.startswith(buf):
                self._hits += 1  # the same prompt again: nothing new to store
                self._hit_blocks += len(found.local)
                out = BlockHashes(found.local)
                out._cache, out._record = self, found
                return out
            if found is not None and blocks == len(found.keys) * per:
                # the prompt begins with all of `found` its checkpoints lead to (the previous turn
                # of a chat): its ids and lists are taken over, not copied, and it is dropped (a list
                # it gave out before chains from its sequence hashes only while the two are equal)
                data, local, seq = found.data, found.local, found.seq
                del data[blocks * step :], local[blocks:], seq[blocks:]
                data += buf[blocks * step :]  # grown where it lies: no copy of the ids it kept
                self._forget(found)
            else:
                data = bytearray(buf)
                local = found.local[:blocks] if found is not None else []
                seq = found.seq[:blocks] if found is not None else []
        local += _hash_blocks(buf[blocks * step :], step, seed)
        record = _Record(data, local, seq, keys)
        with self._lock:
            self._hits += found is not None
            self._hit_blocks += blocks
            self._miss_blocks += len(local) - blocks
            self._store(record)
        out = BlockHashes(local)
        out._cache, out._record = self, record
        return out

    def _remember_seq(self, record: _Record, seq: list[int]) -> None:
        """The whole sequence hash chain of `record` (computed from its local hashes)."""
        with self._lock:
            if len(seq) <= len(record.seq):
                return
            grown = (len(seq) - len(record.seq)) * _HASH_ITEM_BYTES
            record.seq = seq[:]
            if self._records.get(id(record)) is record:
                record.size += grown
                self._bytes += grown
                self._evict()

    def _store(self, record: _Record) -> None:
        record.size = (
            len(record.data)
            + (len(record.local) + len(record.seq)) * _HASH_ITEM_BYTES
            + len(record.keys) * _CHECKPOINT_BYTES
            + _RECORD_BYTES
        )
        if record.size > self.max_bytes:
            return
        index = self._index
        for key in record.keys:
            old = index.get(key)
            index[key] = record
            record.live += 1
            if old is not None:
                old.live -= 1
                if not old.live:
                    self._drop(old)
        self._records[id(record)] = record
        self._bytes += record.size
        self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._records:
            self._forget(next(iter(self._records.values())))  # the least recently used
            self._evictions += 1

    def _forget(self, record: _Record) -> None:
        """`record` out of the index and the LRU (the caller holds the lock)."""
        self._drop(record)
        for key in record.keys:
            if self._index.get(key) is record:
                del self._index[key]
        record.live = 0

    def _drop(self, record: _Record) -> None:
        if self._records.pop(id(record), None) is record:
            self._bytes -= record.size

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._index.clear()
            self._records.clear()
            self._bytes = 0

    def stats(self) -> BlockHashCacheStats:
        with self._lock:
            return BlockHashCacheStats(
                lookups=self._lookups,
                hits=self._hits,
                hit_blocks=self._hit_blocks,
                miss_blocks=self._miss_blocks,
                evictions=self._evictions,
                entries=len(self._records),
                bytes=self._bytes,
                capacity_bytes=self.max_bytes,
            )


PREFIX_CACHE = BlockHashCache(DEFAULT_PREFIX_CACHE_BYTES)  # the process's: every router shares it


def block_seed(lora_name: str | None = None, namespace: str | None = None) -> int:
    """The XXH3 seed for blocks of `lora_name` in `namespace` (empty or None = absent)."""
    seed = XXH3_SEED
    if lora_name:
        seed += _xxh3(lora_name.encode("utf-8"), seed=0)
    if namespace:
        seed += _xxh3(namespace.encode("utf-8"), seed=1)
    return seed & _MASK64


def tokens_as_u32le(tokens: TokenIds) -> memoryview:
    """Token ids as little-endian uint32 bytes (the layout the hashes are defined on).

    Lists go through `array.array` (a C loop, about 4x faster than numpy's list conversion);
    uint32 `array.array`s (on a little-endian machine) and `<u4` numpy arrays are viewed without a copy.
    Raises ValueError when a token id is not an integer in [0, 2**32).
    """
    if isinstance(tokens, np.ndarray):
        if tokens.size and (tokens.dtype.kind not in "iu" or tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):
            raise ValueError("token ids must be integers in [0, 2**32)")
        return np.ascontiguousarray(tokens, dtype="<u4").data.cast("B")
    if isinstance(tokens, array.array) and tokens.typecode == "I" and not _BIG_ENDIAN:
        return memoryview(tokens).cast("B")  # already the layout (a tokenizer's ids): no copy
    try:
        arr = array.array("I", tokens)
    except (OverflowError, TypeError) as exc:
        raise ValueError("token ids must be integers in [0, 2**32)") from exc
    if _BIG_ENDIAN:
        arr.byteswap()
    return memoryview(arr).cast("B")


def compute_block_hashes(
    tokens: TokenIds,
    block_size: int,
    *,
    lora_name: str | None = None,
    namespace: str | None = None,
) -> list[int]:
    """Local block hashes of every full `block_size`-token block of `tokens`.

    The token array is laid out once as little-endian uint32 bytes, `struct.iter_unpack` cuts it
    into blocks and `map` hashes them: no Python-level loop, per block or per token. `PromptTokens`
    take the hashes of blocks an earlier prompt began with from `PREFIX_CACHE` (the same values).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    buf = tokens_as_u32le(tokens)
    step = block_size * 4
    end = len(buf) - len(buf) % step
    if not end:
        return []
    seed = block_seed(lora_name, namespace)
    if type(tokens) is PromptTokens and not _BIG_ENDIAN:
        return PREFIX_CACHE.block_hashes(buf[:end], block_size, seed)
    return _hash_blocks(buf[:end], step, seed)


def _hash_blocks(buf: memoryview, step: int, seed: int) -> list[int]:
    blocks = map(_first, struct.iter_unpack(f"{step}s", buf))
    return list(map(_xxh3, blocks, repeat(seed)))


def compute_sequence_hashes(local_hashes: Sequence[int]) -> list[int]:
    """Chained sequence hashes: seq[0] = local[0]; seq[i] = XXH3(le64(seq[i-1]) + le64(local[i])).

    Raises OverflowError for a hash outside [0, 2**64). `BlockHashes` that still hold what the
    cache gave continue the chain from its known sequence hashes.
    """
    if not local_hashes:
        return []
    if type(local_hashes) is BlockHashes:
        record = local_hashes._record
        if local_hashes == record.local:  # unchanged since the cache gave them (mostly the same ints)
            out = _chain(record.local, record.seq[:])
            local_hashes._cache._remember_seq(record, out)
            return out
    return _chain(local_hashes, [])


def _chain(local_hashes: Sequence[int], out: list[int]) -> list[int]:
    """`out` (the sequence hashes of the first `len(out)` blocks) continued over `local_hashes`."""
    if not out:
        first = local_hashes[0]
        if not 0 <= first <= _MASK64:  # the chain checks every later one (as it packs it)
            raise OverflowError(f"block hashes must be in [0, 2**64): the first is {first}")
        out.append(first)
    prev = out[-1]
    append, pack, xxh3 = out.append, _pack_pair, _xxh3
    try:
        for h in local_hashes[len(out) :]:
            prev = xxh3(pack(prev, h), XXH3_SEED)
            append(prev)
    except struct.error as exc:  # a hash outside [0, 2**64): the error numpy's uint64 raised
        raise OverflowError(f"block hashes must be in [0, 2**64): {exc}") from None
    return out
