"""The simulated engine's KV block pool with prefix caching. No I/O, no clock.

Owns the truth about GPU blocks: which full blocks exist (keyed by chained sequence hash, as in
`extproc.router.hashing`), how many requests reference each, and the LRU order of released ones.
Mirrors vLLM's `BlockPool` / `FreeKVCacheBlockQueue` as Dynamo's mocker models it (REFERENCE
section 6, semantics 4-5):

- Active and cached blocks share one pool of `num_blocks` slots. A full block is identified by its
  sequence hash; a request's trailing partial block is anonymous and never matchable.
- A new block takes an empty slot, else evicts the least recently released cached block.
  Allocation is all or nothing.
- A request releases its blocks tail first, so its tail is evicted before its head; a released
  partial block goes straight back to the empty slots.

Changes are reported to an optional `KvCacheListener` (the seam a KV-event publisher plugs into).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class KvCacheListener(Protocol):
    """Receives block lifecycle changes, in order, as vLLM's KV events describe them."""

    def on_stored(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
    ) -> None:
        """Consecutive new full blocks, chained after `parent_hash` (None: they start the sequence),
        stored by a request with `cache_salt` (its blocks' hashes are seeded with it)."""
        ...

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        """Cached blocks evicted from the pool."""
        ...

    def on_cleared(self) -> None:
        """Every block was dropped."""
        ...


@dataclass(slots=True)
class BlockTable:
    """The blocks one request holds: full blocks by sequence hash, in order, plus a partial tail."""

    block_hashes: list[int] = field(default_factory=list)
    has_partial: bool = False

    @property
    def num_blocks(self) -> int:
        return len(self.block_hashes) + int(self.has_partial)


class PrefixCache:
    """A pool of `num_blocks` KV blocks of `block_size` tokens with LRU reuse of released blocks."""

    def __init__(self, num_blocks: int, block_size: int, listener: KvCacheListener | None = None) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.listener = listener
        self._ref_counts: dict[int, int] = {}  # every full block in the pool, active or cached
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref count 0, least recent first
        self._num_partial = 0  # anonymous partial blocks in use
        self.queried_tokens = 0
        self.hit_tokens = 0

    @property
    def num_active_blocks(self) -> int:
        """Blocks referenced by at least one request."""
        return len(self._ref_counts) - len(self._evictable) + self._num_partial

    @property
    def num_cached_blocks(self) -> int:
        """Released full blocks kept for reuse (evictable)."""
        return len(self._evictable)

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation may take: empty slots plus evictable cached blocks."""
        return self.num_blocks - self.num_active_blocks

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests (vLLM's kv_cache_usage_perc, 0..1)."""
        return self.num_active_blocks / self.num_blocks

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._ref_counts

    def match_prefix(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of `block_hashes` are in the pool (active or cached). No side effects."""
        n = 0
        for h in block_hashes:
            if h not in self._ref_counts:
                break
            n += 1
        return n

    def record_query(self, queried_tokens: int, hit_tokens: int) -> None:
        """Count one prefix lookup (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens)."""
        self.queried_tokens += queried_tokens
        self.hit_tokens += hit_tokens

    def blocks_needed(self, table: BlockTable, block_hashes: Sequence[int], num_tokens: int) -> int:
        """Free blocks `allocate(table, block_hashes, num_tokens)` would take (new or revived ones)."""
        full = num_tokens // self.block_size
        new_hashes = block_hashes[len(table.block_hashes) : full]
        refs = self._ref_counts
        evictable = self._evictable
        taken = sum(1 for h in new_hashes if h not in refs or h in evictable)
        return taken + int(num_tokens % self.block_size > 0) - int(table.has_partial)

    def allocate(
        self,
        table: BlockTable,
        block_hashes: Sequence[int],
        num_tokens: int,
        token_ids: Sequence[int] = (),
        *,
        cache_salt: str | None = None,
    ) -> bool:
        """Grow `table` to cover `num_tokens` tokens; False (and nothing changed) if the pool is short.

        `block_hashes` are the sequence hashes of the request's full blocks (at least
        `num_tokens // block_size` of them); `table.block_hashes` must be a prefix of them. Blocks
        already in the pool are shared; new ones evict cached blocks as needed. `token_ids` (the
        request's tokens) and its `cache_salt` are only read to describe stored blocks to the listener.
        """
        full = num_tokens // self.block_size
        want_partial = num_tokens % self.block_size > 0
        if full == len(table.block_hashes) and want_partial == table.has_partial:
            return True  # nothing new (most decode steps)
        if full > len(block_hashes):
            raise ValueError(f"{num_tokens} tokens need {full} block hashes, got {len(block_hashes)}")
        new_hashes = block_hashes[len(table.block_hashes) : full]
        fresh = [h for h in new_hashes if h not in self._ref_counts]
        revived = sum(1 for h in new_hashes if h in self._evictable)
        needed = len(fresh) + int(want_partial) - int(table.has_partial)
        if needed > self.num_free_blocks - revived:
            return False
        for h in new_hashes:
            if h in self._evictable:
                del self._evictable[h]
        self._num_partial += int(want_partial) - int(table.has_partial)
        self._evict(len(self._ref_counts) + self._num_partial + len(fresh) - self.num_blocks)
        for h in new_hashes:
            self._ref_counts[h] = self._ref_counts.get(h, 0) + 1
        if fresh and self.listener is not None:
            self._report_stored(
                block_hashes, len(table.block_hashes), full, set(fresh), token_ids, cache_salt
            )
        table.block_hashes.extend(new_hashes)
        table.has_partial = want_partial
        return True

    def release(self, table: BlockTable) -> None:
        """Drop a request's references, tail first; unreferenced full blocks become cached (evictable)."""
        if table.has_partial:
            self._num_partial -= 1
            table.has_partial = False
        for h in reversed(table.block_hashes):
            count = self._ref_counts[h] - 1
            self._ref_counts[h] = count
            if count == 0:
                self._evictable[h] = None
        table.block_hashes.clear()

    def clear_cached(self) -> None:
        """Drop every cached block (vLLM's reset_prefix_cache); active blocks stay."""
        dropped = list(self._evictable)
        for h in dropped:
            del self._ref_counts[h]
        self._evictable.clear()
        if self.listener is not None:
            if not self._ref_counts:
                self.listener.on_cleared()
            elif dropped:
                self.listener.on_removed(dropped)

    def _evict(self, count: int) -> None:
        if count <= 0:
            return
        removed = []
        for _ in range(count):
            h, _none = self._evictable.popitem(last=False)
            del self._ref_counts[h]
            removed.append(h)
        if self.listener is not None:
            self.listener.on_removed(removed)

    def _report_stored(
        self,
        block_hashes: Sequence[int],
        start: int,
        end: int,
        fresh: set[int],
        token_ids: Sequence[int],
        cache_salt: str | None,
    ) -> None:
        """One on_stored per run of consecutive new blocks, each with the hash of the block before it."""
        assert self.listener is not None
        bs = self.block_size
        i = start
        while i < end:
            if block_hashes[i] not in fresh:
                i += 1
                continue
            j = i
            while j < end and block_hashes[j] in fresh:
                j += 1
            parent = block_hashes[i - 1] if i > 0 else None
            tokens = [list(token_ids[k * bs : (k + 1) * bs]) for k in range(i, j)]
            self.listener.on_stored(parent, list(block_hashes[i:j]), tokens, cache_salt=cache_salt)
            i = j
