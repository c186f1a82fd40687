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

Host tier (`num_host_blocks` > 0; vLLM's CPU offloading, as far as the router sees it): a cached
block evicted from the pool is offloaded to a bounded LRU tier in host memory, reported, when the
listener is also an `OffloadListener`, as vLLM's offloading connector reports it (a store of medium
"CPU" with the block's own parent and tokens; a removal of medium "CPU" when the host tier evicts
it). The engine loads a prompt's blocks that follow its cached prefix back from the host tier
(`match_host`, `touch_host`): they re-enter the pool as new blocks, and stay in host memory too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

MEDIUM_CPU = "CPU"  # vLLM's medium for its CPU offload tier (kv_events.MEDIUM_CPU)


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


@runtime_checkable
class OffloadListener(Protocol):
    """Receives the host tier's changes, as vLLM's offloading connector reports them."""

    def on_offloaded(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
        medium: str = MEDIUM_CPU,
    ) -> None:
        """Blocks copied to `medium`, each chained after the block before it (`parent_hash`)."""
        ...

    def on_offload_removed(self, block_hashes: Sequence[int], *, medium: str = MEDIUM_CPU) -> None:
        """Blocks `medium` dropped."""
        ...


_Meta = tuple[int | None, tuple[int, ...], str | None]  # a block's parent, tokens and salt


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

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        listener: KvCacheListener | None = None,
        *,
        num_host_blocks: int = 0,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0 or num_host_blocks < 0:
            raise ValueError(
                f"num_blocks and block_size must be positive and num_host_blocks >= 0, got {num_blocks}, "
                f"{block_size}, {num_host_blocks}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.listener = listener
        self.num_host_blocks = num_host_blocks
        self._offload = listener if isinstance(listener, OffloadListener) else None
        self._meta: dict[int, _Meta] = {}  # with a host tier: what it needs to describe each pooled block
        self._host: OrderedDict[int, _Meta] = OrderedDict()  # the host tier, least recently used first
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
        if fresh and self.num_host_blocks:
            self._describe(block_hashes, len(table.block_hashes), full, set(fresh), token_ids, cache_salt)
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
            self._meta.pop(h, None)
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
        if self.num_host_blocks:
            self._offload_blocks(removed)

    # --- the host tier --------------------------------------------------------------------------

    @property
    def num_host_cached(self) -> int:
        """Blocks held in the host tier."""
        return len(self._host)

    def match_host(self, block_hashes: Sequence[int], start: int, end: int) -> int:
        """How many of `block_hashes[start:end]`, from the first on, the host tier holds. No side effects."""
        n = 0
        for h in block_hashes[start:end]:
            if h not in self._host:
                break
            n += 1
        return n

    def touch_host(self, block_hashes: Sequence[int]) -> None:
        """Blocks loaded back from the host tier: now its most recently used (those it holds)."""
        host = self._host
        for h in block_hashes:
            if h in host:
                host.move_to_end(h)

    def _describe(
        self,
        block_hashes: Sequence[int],
        start: int,
        end: int,
        fresh: set[int],
        token_ids: Sequence[int],
        cache_salt: str | None,
    ) -> None:
        """Keep the parent, tokens and salt of new blocks (an offload describes them as a store does)."""
        bs = self.block_size
        for i in range(start, min(end, len(token_ids) // bs)):
            h = block_hashes[i]
            if h in fresh:
                parent = block_hashes[i - 1] if i > 0 else None
                self._meta[h] = (parent, tuple(token_ids[i * bs : (i + 1) * bs]), cache_salt)

    def _offload_blocks(self, evicted: list[int]) -> None:
        """Copy blocks evicted from the pool to the host tier, evicting its least recently used."""
        host, stored, dropped = self._host, [], []
        for h in evicted:
            meta = self._meta.pop(h, None)
            if meta is None:
                continue  # its tokens were never known
            if h in host:
                host.move_to_end(h)
                continue
            host[h] = meta
            stored.append(h)
            if len(host) > self.num_host_blocks:
                dropped.append(host.popitem(last=False)[0])
        offload = self._offload
        if offload is None:
            return
        gone = set(dropped)
        for h in stored:
            if h not in gone:
                parent, tokens, salt = host[h]
                offload.on_offloaded(parent, [h], [list(tokens)], cache_salt=salt)
        dropped = [h for h in dropped if h not in stored]  # copied and dropped at once: never reported
        if dropped:
            offload.on_offload_removed(dropped)

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
