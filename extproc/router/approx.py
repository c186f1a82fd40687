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
They are kept per routing, not per block: a `_Run` is one routed path with one expiry, owning the
blocks of it that no later routing of the worker refreshed (they belong to the later one). Those
are a slice of the path, depths `lo` to `hi`: a later routing shares a prefix with it, which
takes its root end, and pruning takes its leaf end. So the blocks a worker predicts, oldest first,
are its runs in routing order, each run's slice leaf first (the order a per-block table moving a
path's blocks to its end, leaf first, would hold). A run is found by its slice's root block
(`_Table.starts`): a routing walks its path through the runs that hold its prefix, one lookup per
run, and cuts them; refreshing a 6,250-block path costs a few runs, not 6,250 entries.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from extproc.router.hashing import compute_sequence_hashes
from extproc.router.radix import RadixTree
from extproc.router.types import BlocksRemoved, Worker

PRUNE_SLICE = 2048  # predictions pruned per call at most, beyond a routing's own new blocks
_PREDICTED_BASE = -(1 << 64)  # engines' ids are non-negative; dump_events' stand-ins are small negatives


def predicted_engine_id(seq_hash: int) -> int:
    """The engine id a prediction uses for the block with sequence hash `seq_hash`."""
    return _PREDICTED_BASE - seq_hash


def is_predicted_id(engine_hash: int | None) -> bool:
    return engine_hash is not None and engine_hash <= _PREDICTED_BASE


def first_predicted(engine_ids: Sequence[int]) -> int:
    """The index of the first predicted id in `engine_ids`, or its length when there is none (one
    C-level pass in the usual case: a dump holds millions of ids, predictions are rare)."""
    if not engine_ids or min(engine_ids) > _PREDICTED_BASE:
        return len(engine_ids)
    return next(k for k, e in enumerate(engine_ids) if e <= _PREDICTED_BASE)


class _Run:
    """One routing's path and expiry, owning the blocks at depths [lo, hi) of it.

    `hashes[d - base]` is the sequence hash at depth d for every owned depth: the routed path's
    list itself (base 0) until the run owns at most half of what it keeps, then only its slice.
    """

    __slots__ = ("base", "expiry", "hashes", "hi", "lo")

    def __init__(self, hashes: Sequence[int], expiry: float) -> None:
        self.hashes = hashes
        self.base = 0
        self.lo = 0
        self.hi = len(hashes)
        self.expiry = expiry

    def owned(self) -> Sequence[int]:
        """The sequence hashes of the blocks it owns, root first."""
        return self.hashes[self.lo - self.base : self.hi - self.base]

    def compact(self) -> None:
        """Keep only the owned slice once the run owns at most half of the hashes it keeps."""
        if 2 * (self.hi - self.lo) <= len(self.hashes):
            self.hashes = self.owned()
            self.base = self.lo


class _Table:
    """A worker's predictions: its runs, least recently routed first, and each run's root block."""

    __slots__ = ("runs", "size", "starts")

    def __init__(self) -> None:
        self.runs: OrderedDict[_Run, None] = OrderedDict()
        self.starts: dict[int, _Run] = {}  # sequence hash of a run's first owned block -> the run
        self.size = 0  # blocks owned by its runs

    def drop(self, run: _Run) -> None:
        del self.runs[run]
        del self.starts[run.hashes[run.lo - run.base]]
        self.size -= run.hi - run.lo


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
        self._tables: dict[Worker, _Table] = {}
        self._size = 0
        self._next_expiry = float("inf")  # lower bound of every table's oldest expiry
        self.expired_blocks = 0
        self.pruned_blocks = 0

    def __len__(self) -> int:
        return self._size

    def num_blocks(self, worker: Worker) -> int:
        table = self._tables.get(worker)
        return table.size if table else 0

    def predictions(self) -> dict[Worker, OrderedDict[int, float]]:
        """Per worker: sequence hash -> expiry of every predicted block, least recently routed
        first (a view for tests and inspection; it costs a dict entry per block)."""
        view: dict[Worker, OrderedDict[int, float]] = {}
        for worker, table in self._tables.items():
            blocks = view[worker] = OrderedDict()
            for run in table.runs:
                for seq_hash in reversed(run.owned()):
                    blocks[seq_hash] = run.expiry
        return view

    def record_routing(
        self,
        worker: Worker,
        local_hashes: Sequence[int],
        now: float,
        *,
        seq_hashes: Sequence[int] | None = None,
    ) -> None:
        """Predict that `worker` now caches the blocks `local_hashes` (prefix from the root).

        `seq_hashes` (the chained hashes of `local_hashes`) may be passed to avoid recomputing;
        the indexer keeps it, so it must not change afterwards.
        """
        self._expire(now)
        if not local_hashes:
            if self.pruning:
                self._prune(self.prune_slice)
            return
        if seq_hashes is None:
            seq_hashes = compute_sequence_hashes(local_hashes)
        table = self._tables.get(worker)
        if table is None:
            table = self._tables[worker] = _Table()
        # the runs holding the path's predicted prefix, root first: each owned slice starts where
        # the one before left the path (a block's owner owns its parent too, if that is on the path)
        n = len(seq_hashes)
        expiry = now + self.ttl_s
        if not table.runs:
            self._next_expiry = min(self._next_expiry, expiry)
        starts = table.starts
        held = 0
        cuts = []
        while held < n:
            run = starts.get(seq_hashes[held])
            if run is None:
                break
            held = _along(run, seq_hashes, held)
            cuts.append((run, held))
        if held < n:
            base = _PREDICTED_BASE
            parent = base - seq_hashes[held - 1] if held else None
            engine_ids = [base - s for s in seq_hashes[held:]]
            self.tree.store_blocks(worker, parent, engine_ids, list(local_hashes[held:]))
        for run, end in cuts:  # the path's blocks are the new run's now
            del starts[run.hashes[run.lo - run.base]]
            if end == run.hi:
                del table.runs[run]
            else:
                starts[run.hashes[end - run.base]] = run
                run.lo = end
                run.compact()
        run = _Run(seq_hashes, expiry)
        table.runs[run] = None
        starts[seq_hashes[0]] = run
        added = n - held
        table.size += added
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
        for worker, table in self._tables.items():
            expired = []
            for run in table.runs:
                if run.expiry > now:
                    next_expiry = min(next_expiry, run.expiry)
                    break
                expired.append(run)
            if expired:
                hashes: list[int] = []
                for run in expired:
                    hashes.extend(reversed(run.owned()))
                    table.drop(run)
                self._remove(worker, hashes)
                self.expired_blocks += len(hashes)
        self._next_expiry = next_expiry

    def remove_worker(self, worker: Worker) -> None:
        """Forget `worker`'s predictions without touching the tree (the caller clears it)."""
        table = self._tables.pop(worker, None)
        if table:
            self._size -= table.size

    def drop_worker(self, worker: Worker) -> None:
        """Withdraw `worker`'s predictions from the tree (its real events take over)."""
        table = self._tables.pop(worker, None)
        if table and table.size:
            self._size -= table.size
            base = _PREDICTED_BASE
            ids = tuple(base - s for run in reversed(table.runs) for s in run.owned())
            self.tree.apply_event(BlocksRemoved(worker, ids))

    def _remove(self, worker: Worker, seq_hashes: list[int]) -> None:
        base = _PREDICTED_BASE
        self._size -= len(seq_hashes)
        self.tree.apply_event(BlocksRemoved(worker, tuple(base - s for s in seq_hashes)))

    def _pop_oldest(self, count: int) -> int:
        """Pop the `count` least recently routed predictions over all workers, oldest first.

        Order: (expiry, worker's position in `_tables`), then a table's own order. A table's
        predictions are taken in runs, as many as come before every other table's head, so the
        heap is touched once per stretch of runs rather than once per prediction.
        """
        tables = [(w, t) for w, t in self._tables.items() if t.runs]
        heads = [(next(iter(t.runs)).expiry, i) for i, (_, t) in enumerate(tables)]
        heapq.heapify(heads)
        removed: dict[int, list[int]] = {}
        left = count
        while left and heads:
            _, i = heads[0]
            table = tables[i][1]
            # the next head among the other tables: a heap's second smallest is a child of the root;
            # with none left, one that comes after every run (even one that never expires)
            if len(heads) > 2:
                next_head = min(heads[1], heads[2])
            elif len(heads) == 2:
                next_head = heads[1]
            else:
                next_head = (float("inf"), len(tables))
            taken = removed.setdefault(i, [])
            head = None
            emptied = []
            for run in table.runs:
                expiry = run.expiry
                if not left or (expiry, i) > next_head:
                    head = expiry
                    break
                size = run.hi - run.lo
                if size <= left:
                    taken.extend(reversed(run.owned()))
                    emptied.append(run)
                    left -= size
                else:  # its leaf end
                    taken.extend(reversed(run.hashes[run.hi - left - run.base : run.hi - run.base]))
                    run.hi -= left
                    table.size -= left
                    run.compact()
                    left = 0
                    head = expiry
                    break
            for run in emptied:
                table.drop(run)
            if head is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (head, i))
        for i, hashes in removed.items():
            self._remove(tables[i][0], hashes)
        return count - left


def _along(run: _Run, seq_hashes: Sequence[int], depth: int) -> int:
    """The depth where `seq_hashes` leaves `run`'s owned slice, which holds its block at `depth`
    (sequence hashes are chained: equal at a depth, equal at every depth above)."""
    hashes, base = run.hashes, run.base
    hi = min(run.hi, len(seq_hashes))
    if hashes[hi - 1 - base] == seq_hashes[hi - 1]:
        return hi
    lo, hi = depth + 1, hi - 1  # seq_hashes[:lo] along the run; the answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1 - base] == seq_hashes[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo
