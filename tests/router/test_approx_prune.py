"""Approximate mode prunes in slices: bounded work per call, the same predictions as a one-go prune.

`OneGo` is the algorithm before slicing (every prune down to the target in the call that went over
`max_tree_size`), reduced to its tables: per worker, sequence hash -> expiry, least recently
routed first. The sliced ApproxIndexer runs the same operations; the two may differ only in how
many of the oldest predictions they hold while a prune is under way, never in their order.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict

import pytest

from extproc.router import radix
from extproc.router.approx import ApproxIndexer, predicted_engine_id
from extproc.router.hashing import compute_sequence_hashes
from extproc.router.radix import RadixTree
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker


class OneGo:
    def __init__(self, ttl_s: float, max_tree_size: int, prune_target_ratio: float) -> None:
        self.ttl_s = ttl_s
        self.max_tree_size = max_tree_size
        self.target = int(max_tree_size * prune_target_ratio)
        self.tables: dict[Worker, OrderedDict[int, float]] = {}

    def expire(self, now: float) -> None:
        for table in self.tables.values():
            while table and next(iter(table.values())) <= now:
                table.popitem(last=False)

    def route(self, worker: Worker, seq: list[int], now: float) -> None:
        self.expire(now)
        table = self.tables.setdefault(worker, OrderedDict())
        for s in reversed(seq):  # root last
            table.pop(s, None)
            table[s] = now + self.ttl_s
        size = sum(map(len, self.tables.values()))
        if size <= self.max_tree_size:
            return
        tables = list(self.tables.values())
        heads = [(next(iter(t.values())), i) for i, t in enumerate(tables) if t]
        heapq.heapify(heads)
        for _ in range(size - self.target):  # one prediction at a time, oldest first
            _, i = heads[0]
            tables[i].popitem(last=False)
            if tables[i]:
                heapq.heapreplace(heads, (next(iter(tables[i].values())), i))
            else:
                heapq.heappop(heads)


def held(tables: dict[Worker, OrderedDict[int, float]]) -> list[tuple[float, Worker, int]]:
    """Every prediction in the pruning order, oldest first: expiry, worker's place, table's order."""
    order = {w: i for i, w in enumerate(tables)}
    ranked = sorted((e, order[w], k, w, s) for w, t in tables.items() for k, (s, e) in enumerate(t.items()))
    return [(e, w, s) for e, _, _, w, s in ranked]


def random_path(rng: random.Random) -> list[int]:
    family = rng.randrange(6)
    shared = [family * 1000 + j for j in range(rng.randint(1, 8))]
    return shared + [rng.randrange(10**6) for _ in range(rng.randint(0, 6))]


def assert_tree_predicts(tree: RadixTree, tables: dict[Worker, OrderedDict[int, float]], paths) -> None:
    for local in paths:
        seq = compute_sequence_hashes(local)
        want = {}
        for worker, table in tables.items():
            n = 0
            while n < len(seq) and seq[n] in table:
                n += 1
            if n:
                want[worker] = n
        assert tree.find_matches(local) == want


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("prune_slice", [1, 3, 10**6])
def test_sliced_pruning_keeps_the_one_go_order_and_only_shifts_how_many_are_held(seed, prune_slice):
    rng = random.Random(seed)
    workers = [Worker(w) for w in range(4)]
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=5.0, max_tree_size=40, prune_target_ratio=0.5, prune_slice=prune_slice)
    ref = OneGo(ttl_s=5.0, max_tree_size=40, prune_target_ratio=0.5)
    paths = [random_path(rng) for _ in range(30)]
    now = 0.0
    differed = 0
    for _ in range(400):
        now += rng.random() * 0.2
        if rng.random() < 0.1:
            approx.expire(now)
            ref.expire(now)
        else:
            worker, local = rng.choice(workers), rng.choice(paths)
            approx.record_routing(worker, local, now)
            ref.route(worker, compute_sequence_hashes(local), now)
        ours, theirs = held(approx.predictions()), held(ref.tables)
        small, large = sorted((ours, theirs), key=len)
        assert large[len(large) - len(small) :] == small  # the newest of the same order
        if prune_slice >= 40:
            assert ours == theirs
        differed += ours != theirs
        assert_tree_predicts(tree, approx.predictions(), paths)
    if prune_slice == 1:
        assert differed  # the workload does prune in slices


@pytest.mark.parametrize("seed", range(6))
def test_each_call_prunes_at_most_the_slice_or_what_it_added_and_the_size_stays_bounded(seed):
    rng = random.Random(seed)
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=1e9, max_tree_size=50, prune_target_ratio=0.6, prune_slice=4)
    paths = [random_path(rng) for _ in range(40)]
    slices = 0
    for step in range(600):
        before_size, before_pruned = len(approx), approx.pruned_blocks
        before_removed = tree.stats.removed_blocks
        if rng.random() < 0.2:
            approx.expire(float(step))
            added = 0
        else:
            worker = Worker(rng.randrange(5))
            approx.record_routing(worker, rng.choice(paths), float(step))
            added = len(approx) - before_size + approx.pruned_blocks - before_pruned
        pruned = approx.pruned_blocks - before_pruned
        assert pruned <= max(4, added)
        assert tree.stats.removed_blocks - before_removed == pruned  # the tree touches only those
        assert len(approx) <= 50
        if approx.pruning:
            assert pruned == min(max(4, added), before_size + added - approx.prune_target_size)
            slices += 1
        assert len(approx) == tree.num_blocks()
    assert slices > 10


def test_a_prune_under_way_goes_on_in_expire_and_ends_at_the_target():
    approx = ApproxIndexer(RadixTree(), ttl_s=1e9, max_tree_size=10, prune_target_ratio=0.5, prune_slice=2)
    approx.record_routing(Worker(0), list(range(10)), now=1.0)
    assert (len(approx), approx.pruning) == (10, False)
    approx.record_routing(Worker(1), [100], now=2.0)  # 11 > 10: prune to 5, two at a time (one added)
    assert (len(approx), approx.pruning) == (9, True)
    approx.expire(3.0)
    assert (len(approx), approx.pruning) == (7, True)
    approx.expire(3.0)
    assert (len(approx), approx.pruning) == (5, False)
    approx.expire(3.0)
    assert (len(approx), approx.pruned_blocks) == (5, 6)


def test_the_slice_must_be_positive():
    with pytest.raises(ValueError, match="prune_slice"):
        ApproxIndexer(RadixTree(), prune_slice=0)


def test_removing_the_end_of_what_a_worker_holds_does_not_index_the_whole_run(monkeypatch):
    tree = RadixTree()
    worker = Worker(0)
    blocks = tuple(StoredBlock(predicted_engine_id(i), i) for i in range(1000))
    tree.apply_event(BlocksStored(worker, blocks, None))
    assert tree.num_nodes == 1
    indexed = []

    def counting(items):  # radix's `enumerate` over a run's engine ids is the whole-run index
        indexed.append(len(items))
        return enumerate(items)

    monkeypatch.setattr(radix, "enumerate", counting, raising=False)
    tree.apply_event(BlocksRemoved(worker, tuple(b.engine_hash for b in reversed(blocks[-8:]))))
    assert indexed == []
    assert tree.num_blocks(worker) == 992
    assert tree.find_matches(list(range(1000))) == {worker: 992}
    tree.apply_event(BlocksRemoved(worker, tuple(b.engine_hash for b in blocks[500:508])))  # the middle
    assert indexed == [992]
    assert tree.find_matches(list(range(1000))) == {worker: 500}
