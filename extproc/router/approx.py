"""ApproxIndexer: predicted cache state for workers whose KV events are off, not yet flowing or lost.

After each routing decision the chosen worker is assumed to cache the request's blocks for
`ttl_s` seconds (refreshed when routed again). When more than `max_tree_size` (worker, block)
predictions exist, the least recently routed ones are pruned down to
`prune_target_ratio * max_tree_size`, in slices: each `record_routing` while pruning is under way
prunes at most `max(prune_slice, blocks it added)` and each `expire` at most `prune_slice`, so no
call stalls on a whole prune (the old one-go prune of a 2^20-entry tree took 0.3-0.7 s). Because a
routing prunes at least what it added, the size is back within `max_tree_size` when every call
returns (inside a call it exceeds it by that call's new blocks at most). Either way the
predictions held are the most recently routed ones, in the same order as a one-go prune's; slicing
only changes how many of the oldest are held at a time: more while a prune is under way, and up to
the blocks routed meanwhile fewer once it ends, as it goes on down to the target.

The predictions go into the same RadixTree as real events, as synthetic stored/removed events
(as Dynamo's approximate indexer does), under engine ids of their own (`predicted_engine_id`) so
they never collide with a real engine's ids for the same worker: a worker can switch between
event-fed and predicted at any time. No I/O; `now` is always passed in.

Each worker's predictions are prefix-closed: a routing refreshes a whole path, root last, and
expiry and pruning take the least recently refreshed first, so a block goes before its parent.
That lets `record_routing` find the predicted prefix by binary search and store only the new
suffix under it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from extproc.router.hashing import compute_sequence_hashes
from extproc.router.radix import RadixTree
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker

PRUNE_SLICE = 2048  # predictions pruned per call at most, beyond a routing's own new blocks
_PREDICTED_BASE = -(1 << 64)  # engines' ids are non-negative; dump_events' stand-ins are small negatives


def predicted_engine_id(seq_hash: int) -> int:
    """The engine id a prediction uses for the block with sequence hash `seq_hash`."""
    return _PREDICTED_BASE - seq_hash


def is_predicted_id(engine_hash: int | None) -> bool:
    return engine_hash is not None and engine_hash <= _PREDICTED_BASE


class ApproxIndexer:
    """TTL and size-bounded predictions of what each worker caches."""

    def __init__(
        self,
        tree: RadixTree,
        *,
        ttl_s: float = 120.0,
        max_tree_size: int = 2**20,
        prune_target_ratio: float = 0.8,
        prune_slice: int = PRUNE_SLICE,
    ) -> None:
        if prune_slice < 1:
            raise ValueError(f"prune_slice must be at least 1, got {prune_slice}")
        self.tree = tree
        self.ttl_s = ttl_s
        self.max_tree_size = max_tree_size
        self.prune_target_size = int(max_tree_size * prune_target_ratio)
        self.prune_slice = prune_slice
        self.pruning = False  # a prune is under way: size above prune_target_size, going down
        # per worker: sequence hash -> expiry time; order = least recently routed first
        self._expiry: dict[Worker, OrderedDict[int, float]] = {}
        self._size = 0
        self._next_expiry = float("inf")  # lower bound of every table's oldest expiry
        self.expired_blocks = 0
        self.pruned_blocks = 0

    def __len__(self) -> int:
        return self._size

    def num_blocks(self, worker: Worker) -> int:
        table = self._expiry.get(worker)
        return len(table) if table else 0

    def record_routing(
        self,
        worker: Worker,
        local_hashes: Sequence[int],
        now: float,
        *,
        seq_hashes: Sequence[int] | None = None,
    ) -> None:
        """Predict that `worker` now caches the blocks `local_hashes` (prefix from the root).

        `seq_hashes` (the chained hashes of `local_hashes`) may be passed to avoid recomputing.
        """
        self._expire(now)
        if not local_hashes:
            if self.pruning:
                self._prune(self.prune_slice)
            return
        if seq_hashes is None:
            seq_hashes = compute_sequence_hashes(local_hashes)
        table = self._expiry.get(worker)
        if table is None:
            table = self._expiry[worker] = OrderedDict()
        held = _held_prefix(table, seq_hashes)
        if held < len(seq_hashes):
            base = _PREDICTED_BASE
            parent = base - seq_hashes[held - 1] if held else None
            blocks = tuple(
                StoredBlock(base - s, h) for s, h in zip(seq_hashes[held:], local_hashes[held:], strict=True)
            )
            self.tree.apply_event(BlocksStored(worker, blocks, parent_hash=parent))
        expiry = now + self.ttl_s
        if not table:
            self._next_expiry = min(self._next_expiry, expiry)
        before = len(table)
        move = table.move_to_end
        for i in range(len(seq_hashes) - 1, -1, -1):
            s = seq_hashes[i]
            if i < held:
                move(s)
            table[s] = expiry
        added = len(table) - before
        self._size += added
        if self._size > self.max_tree_size:
            self.pruning = True
        if self.pruning:
            self._prune(max(self.prune_slice, added))

    def expire(self, now: float) -> None:
        """Drop every prediction whose TTL has passed; go on with a prune under way."""
        self._expire(now)
        if self.pruning:
            self._prune(self.prune_slice)

    def _prune(self, budget: int) -> None:
        """Pops up to `budget` of the oldest predictions, ending the prune at the target size."""
        count = min(budget, self._size - self.prune_target_size)
        if count > 0:
            self.pruned_blocks += self._pop_oldest(count)
        if self._size <= self.prune_target_size:
            self.pruning = False

    def _expire(self, now: float) -> None:
        if now < self._next_expiry:
            return
        next_expiry = float("inf")
        for worker, table in self._expiry.items():
            expired = []
            for seq_hash, expiry in table.items():
                if expiry > now:
                    next_expiry = min(next_expiry, expiry)
                    break
                expired.append(seq_hash)
            if expired:
                for seq_hash in expired:
                    del table[seq_hash]
                self._remove(worker, expired)
                self.expired_blocks += len(expired)
        self._next_expiry = next_expiry

    def remove_worker(self, worker: Worker) -> None:
        """Forget `worker`'s predictions without touching the tree (the caller clears it)."""
        table = self._expiry.pop(worker, None)
        if table:
            self._size -= len(table)

    def drop_worker(self, worker: Worker) -> None:
        """Withdraw `worker`'s predictions from the tree (its real events take over)."""
        table = self._expiry.pop(worker, None)
        if table:
            self._size -= len(table)
            self.tree.apply_event(BlocksRemoved(worker, tuple(_PREDICTED_BASE - s for s in reversed(table))))

    def _remove(self, worker: Worker, seq_hashes: list[int]) -> None:
        base = _PREDICTED_BASE
        self._size -= len(seq_hashes)
        self.tree.apply_event(BlocksRemoved(worker, tuple(base - s for s in seq_hashes)))

    def _pop_oldest(self, count: int) -> int:
        """Pop the `count` least recently routed predictions over all workers, oldest first.

        Order: (expiry, worker's position in `_expiry`), then a table's own order. A table's
        predictions are taken in runs, as many as come before every other table's head, so the
        heap is touched once per run rather than once per prediction.
        """
        tables = [(w, t) for w, t in self._expiry.items() if t]
        heads = [(next(iter(t.values())), i) for i, (_, t) in enumerate(tables)]
        heapq.heapify(heads)
        removed: dict[int, list[int]] = {}
        left = count
        while left and heads:
            _, i = heads[0]
            table = tables[i][1]
            # the next head among the other tables: a heap's second smallest is a child of the root
            if len(heads) > 2:
                next_expiry, next_i = min(heads[1], heads[2])
            elif len(heads) == 2:
                next_expiry, next_i = heads[1]
            else:
                next_expiry, next_i = float("inf"), -1
            run: list[int] = []
            head = None
            for seq_hash, expiry in table.items():
                if len(run) == left or expiry > next_expiry or (expiry == next_expiry and i > next_i):
                    head = expiry
                    break
                run.append(seq_hash)
            for seq_hash in run:
                del table[seq_hash]
            left -= len(run)
            removed.setdefault(i, []).extend(run)
            if head is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (head, i))
        for i, hashes in removed.items():
            self._remove(tables[i][0], hashes)
        return count - left


def _held_prefix(table: OrderedDict[int, float], seq_hashes: Sequence[int]) -> int:
    """How many leading blocks of the path `table` predicts (prefix-closed, so binary search)."""
    if not table or seq_hashes[0] not in table:
        return 0
    lo, hi = 1, len(seq_hashes)  # seq_hashes[:lo] held; answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if seq_hashes[mid - 1] in table:
            lo = mid
        else:
            hi = mid - 1
    return lo
