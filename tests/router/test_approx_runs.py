"""Approximate mode keeps its predictions per routed run, and predicts what it did per block.

`PerBlock` is the ApproxIndexer of commit 9f559c6, verbatim but for its name: per worker an
`OrderedDict` of sequence hash -> expiry, least recently routed first, a routing moving each block
of its path to the end. The run-based ApproxIndexer must hold the same predictions in the same
order, send its tree the same events and count the same, whatever is routed, expired, pruned or
dropped.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence

import pytest

from extproc.router.approx import ApproxIndexer, predicted_engine_id
from extproc.router.hashing import compute_sequence_hashes
from extproc.router.radix import RadixTree
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker

BASE = predicted_engine_id(0)


class PerBlock:
    """approx.py's ApproxIndexer before runs (commit 9f559c6): one OrderedDict entry per block."""

    def __init__(
        self,
        tree: RadixTree,
        *,
        ttl_s: float = 120.0,
        max_tree_size: int = 2**20,
        prune_target_ratio: float = 0.8,
        prune_slice: int = 2048,
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
            base = BASE
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
            self.tree.apply_event(BlocksRemoved(worker, tuple(BASE - s for s in reversed(table))))

    def _remove(self, worker: Worker, seq_hashes: list[int]) -> None:
        base = BASE
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


class Recorder:
    """A tree that records what it is sent (and forwards it to a real one)."""

    def __init__(self) -> None:
        self.events: list[BlocksStored | BlocksRemoved] = []
        self.tree = RadixTree()

    def apply_event(self, event: BlocksStored | BlocksRemoved) -> bool:
        self.events.append(event)
        return self.tree.apply_event(event)

    def store_blocks(self, worker: Worker, parent_hash: int | None, es: list[int], hs: list[int]) -> bool:
        blocks = tuple(StoredBlock(e, h) for e, h in zip(es, hs, strict=True))
        return self.apply_event(BlocksStored(worker, blocks, parent_hash=parent_hash))


def state(approx: ApproxIndexer | PerBlock) -> tuple:
    tables = approx.predictions() if isinstance(approx, ApproxIndexer) else approx._expiry
    workers = list(tables)
    return (
        workers,
        {w: list(t.items()) for w, t in tables.items()},
        {w: approx.num_blocks(w) for w in workers},
        len(approx),
        approx.pruning,
        approx.expired_blocks,
        approx.pruned_blocks,
    )


class Paths:
    """Paths as chats make them: shared system prompts, growing conversations, branches, prefixes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.paths: list[list[int]] = [[rng.randrange(3)] for _ in range(3)]

    def next(self) -> list[int]:
        rng = self.rng
        base = rng.choice(self.paths)
        kind = rng.random()
        if kind < 0.35:  # the next turn of a chat
            path = base + [rng.randrange(10**6) for _ in range(rng.randint(1, 6))]
        elif kind < 0.55:  # a branch off it
            path = base[: rng.randint(1, len(base))] + [
                rng.randrange(10**6) for _ in range(rng.randint(1, 4))
            ]
        elif kind < 0.75:  # a shorter request on the same prefix
            path = base[: rng.randint(1, len(base))]
        elif kind < 0.8:
            path = [rng.randrange(3) for _ in range(rng.randint(1, 5))]
        else:  # the same again
            path = list(base)
        if len(path) < 40:
            self.paths.append(path)
        return path


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize(("max_tree_size", "prune_slice"), [(10**6, 2048), (60, 1), (60, 7), (40, 10**6)])
def test_runs_predict_what_the_per_block_model_did(seed, max_tree_size, prune_slice):
    rng = random.Random(seed)
    workers = [Worker(w) for w in range(3)]
    kwargs = dict(ttl_s=6.0, max_tree_size=max_tree_size, prune_target_ratio=0.6, prune_slice=prune_slice)
    ours_tree, ref_tree = Recorder(), Recorder()
    ours, ref = ApproxIndexer(ours_tree, **kwargs), PerBlock(ref_tree, **kwargs)  # type: ignore[arg-type]
    paths = Paths(rng)
    now = 0.0
    for _ in range(300):
        now += rng.random() * (0.5 if rng.random() < 0.9 else 8.0)
        op = rng.random()
        if op < 0.08:
            ours.expire(now)
            ref.expire(now)
        elif op < 0.11:
            worker = rng.choice(workers)
            ours.drop_worker(worker)
            ref.drop_worker(worker)
        elif op < 0.13:
            worker = rng.choice(workers)
            ours.remove_worker(worker)
            ref.remove_worker(worker)
        elif op < 0.15:
            ours.record_routing(rng.choice(workers), [], now)
            ref.record_routing(rng.choice(workers), [], now)
        else:
            worker, local = rng.choice(workers), paths.next()
            seq = compute_sequence_hashes(local)
            if rng.random() < 0.5:
                ours.record_routing(worker, local, now, seq_hashes=seq)
            else:
                ours.record_routing(worker, local, now)
            ref.record_routing(worker, local, now, seq_hashes=list(seq))
        assert state(ours) == state(ref)
        assert ours_tree.events == ref_tree.events
    for local in paths.paths:
        assert ours_tree.tree.find_matches(local) == ref_tree.tree.find_matches(local)


def test_a_growing_chat_is_one_run_however_long():
    approx = ApproxIndexer(Recorder(), ttl_s=100.0)  # type: ignore[arg-type]
    worker = Worker(0)
    chat: list[int] = []
    for turn in range(50):
        chat = chat + list(range(turn * 125, (turn + 1) * 125))
        approx.record_routing(worker, chat, now=float(turn))
    table = approx._tables[worker]
    assert len(table.runs) == 1 and len(table.starts) == 1 and table.size == 6250 == len(approx)
    approx.record_routing(worker, chat[:100], now=60.0)  # its first 100 blocks are the new run's
    assert [(run.lo, run.hi, run.expiry) for run in table.runs] == [(100, 6250, 149.0), (0, 100, 160.0)]
    approx.expire(149.0)
    assert len(approx) == 100 and len(table.runs) == 1


def test_a_routing_walks_on_past_a_run_its_path_leaves():
    tree = Recorder()
    approx = ApproxIndexer(tree, ttl_s=100.0)  # type: ignore[arg-type]
    a = Worker("a")
    approx.record_routing(a, [1, 2], now=0.0)
    approx.record_routing(a, [1, 3], now=1.0)  # owns 1 and 3; [1, 2]'s run owns 2 only
    approx.record_routing(a, [1, 2, 4], now=2.0)  # 1 from the second run, 2 from the first
    seq = compute_sequence_hashes([1, 2, 4])
    assert tree.events[-1] == BlocksStored(
        a, (StoredBlock(predicted_engine_id(seq[2]), 4),), predicted_engine_id(seq[1])
    )
    assert [(run.lo, run.hi) for run in approx._tables[a].runs] == [(1, 2), (0, 3)]
    assert approx.num_blocks(a) == 4 and len(approx) == 4


def test_a_run_keeps_only_its_slice_once_it_owns_half_of_what_it_keeps():
    approx = ApproxIndexer(Recorder(), ttl_s=100.0)  # type: ignore[arg-type]
    worker = Worker(0)
    path = list(range(10))
    seq = compute_sequence_hashes(path)
    approx.record_routing(worker, path, now=0.0, seq_hashes=seq)
    first = next(iter(approx._tables[worker].runs))
    assert first.hashes is seq
    approx.record_routing(worker, path[:4], now=1.0)  # owns 6 of 10: kept whole
    assert first.hashes is seq and (first.lo, first.hi, first.base) == (4, 10, 0)
    approx.record_routing(worker, path[:5], now=2.0)  # owns 5 of 10: its slice only
    assert first.hashes == seq[5:] and (first.lo, first.hi, first.base) == (5, 10, 5)
    assert approx.predictions()[worker] == OrderedDict(
        [*((s, 100.0) for s in reversed(seq[5:])), *((s, 102.0) for s in reversed(seq[:5]))]
    )


def test_pruning_a_runs_leaf_end_keeps_its_slice_once_it_owns_half():
    approx = ApproxIndexer(Recorder(), ttl_s=100.0, max_tree_size=12, prune_target_ratio=0.5, prune_slice=1)  # type: ignore[arg-type]
    worker, other = Worker(0), Worker(1)
    seq = compute_sequence_hashes(list(range(10)))
    approx.record_routing(worker, list(range(10)), now=0.0, seq_hashes=seq)
    first = next(iter(approx._tables[worker].runs))
    approx.record_routing(other, [50, 51, 52], now=1.0)  # 13 > 12: 3 pruned (what it added)
    assert (first.lo, first.hi, first.hashes is seq) == (0, 7, True)
    approx.expire(2.0)  # 1 more: owns 6 of 10
    assert (first.hi, first.hashes is seq) == (6, True)
    approx.expire(2.0)  # owns 5 of 10: its slice only
    assert (first.hi, first.hashes, first.base) == (5, seq[:5], 0)
    assert approx.predictions()[worker] == OrderedDict((s, 100.0) for s in reversed(seq[:5]))


def test_a_prune_goes_back_and_forth_between_workers_oldest_first():
    approx = ApproxIndexer(Recorder(), ttl_s=100.0, max_tree_size=6, prune_target_ratio=0.2)  # type: ignore[arg-type]
    a, b = Worker("a"), Worker("b")
    approx.record_routing(a, [1, 2], now=0.0)
    approx.record_routing(b, [3], now=1.0)
    approx.record_routing(a, [4, 5], now=2.0)
    approx.record_routing(b, [6], now=3.0)
    approx.record_routing(a, [7], now=4.0)  # 7 > 6: down to 1, oldest first over both workers
    assert approx.pruned_blocks == 6 and len(approx) == 1
    assert {w: list(t) for w, t in approx.predictions().items()} == {a: compute_sequence_hashes([7]), b: []}


def test_predictions_routed_at_the_same_time_are_pruned_in_the_workers_order():
    approx = ApproxIndexer(Recorder(), ttl_s=100.0, max_tree_size=5, prune_target_ratio=0.6)  # type: ignore[arg-type]
    a, b, c = Worker("a"), Worker("b"), Worker("c")
    approx.record_routing(a, [1, 2], now=0.0)
    approx.record_routing(b, [3, 4], now=0.0)
    approx.record_routing(c, [5, 6], now=1.0)  # 6 > 5: down to 3, a's before b's
    assert {w: len(t) for w, t in approx.predictions().items()} == {a: 0, b: 1, c: 2}
    assert approx.num_blocks(b) == 1 and approx.pruned_blocks == 3


def test_predictions_that_never_expire_are_pruned_too():
    tree = Recorder()
    approx = ApproxIndexer(tree, ttl_s=float("inf"), max_tree_size=4, prune_target_ratio=0.5)  # type: ignore[arg-type]
    worker = Worker(0)
    approx.record_routing(worker, [1, 2, 3], now=0.0)
    approx.record_routing(worker, [9, 8], now=1.0)  # 5 > 4: down to 2, the oldest first
    assert len(approx) == 2 and approx.pruned_blocks == 3
    assert tree.tree.find_matches([1, 2, 3]) == {} and tree.tree.find_matches([9, 8]) == {worker: 2}
