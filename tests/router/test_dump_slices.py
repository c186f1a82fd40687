"""A tree dumped in slices (`dump_slices`): the replica that snapshots lets routing run between them.

The slices must add up to `dump_events`, keep a store with the removal of its stand-ins, stay near
their size, and refuse to go on once anything wrote to the tree between two of them.
"""

import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.radix import RadixTree
from extproc.router.radix_dump import TreeChanged, dump_slices
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored, StoredBlock, Worker

from .test_radix import W0, W1, apply_to_tree, chain, ops, stored


def joined(slices) -> list:
    return [event for part in slices for event in part]


@settings(max_examples=100, deadline=None)
@given(st.lists(ops, max_size=40), st.integers(1, 6))
def test_the_slices_add_up_to_the_dump_and_never_part_a_store_from_its_stand_ins(sequence, size):
    tree = RadixTree()
    for op in sequence:
        apply_to_tree(tree, op)
    slices = list(dump_slices(tree, size))
    assert joined(slices) == tree.dump_events()
    for part in slices:
        if part:
            assert not isinstance(part[0], BlocksRemoved)  # it would belong to the slice before
        blocks = sum(len(e.blocks) for e in part if isinstance(e, BlocksStored))
        largest = max((len(e.blocks) for e in part if isinstance(e, BlocksStored)), default=0)
        assert blocks < size + largest  # a slice ends as soon as it reaches its size


def random_tree(runs: int, blocks: int, seed: int = 0) -> RadixTree:
    rng = random.Random(seed)
    tree = RadixTree()
    for i in range(runs):
        worker = Worker(str(i % 3), 0)
        tree.apply_event(BlocksStored(worker, [StoredBlock(rng.getrandbits(63), i) for _ in range(blocks)]))
    return tree


def test_a_large_tree_comes_in_many_slices_of_about_the_size_asked():
    tree = random_tree(runs=300, blocks=10)
    slices = list(dump_slices(tree, 100))
    stored = [sum(len(e.blocks) for e in part) for part in slices]
    assert joined(slices) == tree.dump_events()
    assert stored.count(100) == 30  # ten runs of ten blocks each
    assert stored.count(0) >= 3  # the walk that finds the held runs paused too: 300 runs, 100 a step
    assert len(next(dump_slices(tree, sys.maxsize))) == 300  # one slice: all of it


def test_the_walk_pauses_every_step_of_runs():
    tree = random_tree(runs=11, blocks=1)
    assert [len(s) for s in dump_slices(tree, 3)] == [0, 0, 0, 3, 3, 3, 2]


def test_aliases_come_in_slices_too_and_a_write_between_them_stops_the_dump():
    tree = RadixTree()
    for k in range(10):  # the same three blocks under ten sets of ids: one run and 27 aliases
        tree.apply_event(chain(W0, 100 * k, [1, 2, 3]))
    slices = list(dump_slices(tree, 2))
    assert joined(slices) == tree.dump_events()
    assert [sum(len(e.blocks) for e in part) for part in slices] == [3] + [2] * 13 + [1]
    slices = dump_slices(tree, 2)
    for _ in range(3):  # the run, then two slices of aliases
        next(slices)
    tree.apply_event(stored(W1, [(900, 9)]))
    with pytest.raises(TreeChanged, match="written to 1 times"):
        next(slices)


WRITES = {  # what writes the tree, and how many writes it counts
    "a store": (lambda t: t.apply_event(stored(W1, [(900, 9)])), 1),
    "a removal": (lambda t: t.apply_event(BlocksRemoved(W0, (1,))), 1),
    "a removal of nothing held": (lambda t: t.apply_event(BlocksRemoved(Worker("nobody", 0), (1,))), 1),
    "a clear": (lambda t: t.apply_event(AllBlocksCleared(W0)), 1),
    "a worker cleared": (lambda t: t.clear_worker(W0), 1),
    "a worker removed": (lambda t: t.remove_worker(W0), 2),  # and cleared
    "a predicted store": (lambda t: t.store_blocks(W1, None, [901], [9]), 1),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_between_two_slices_stops_the_dump(write):
    tree = RadixTree()
    tree.apply_event(chain(W0, 1, [1, 2, 3, 4]))
    tree.apply_event(chain(W1, 20, [5, 6, 7]))
    for _ in range(3):  # the count goes on from earlier writes
        tree.apply_event(BlocksRemoved(W1, (99,)))
    slices = dump_slices(tree, 1)
    next(slices)
    do, count = WRITES[write]
    do(tree)
    with pytest.raises(TreeChanged, match=f"written to {count} times during its dump"):
        list(slices)


def test_reads_between_two_slices_do_not_stop_the_dump():
    tree = random_tree(runs=30, blocks=4)
    dumped = []
    for part in dump_slices(tree, 8):
        dumped += part
        tree.find_matches([0, 1, 2])
        list(tree.entries())
    assert dumped == tree.dump_events()


def test_the_routers_slices_leave_out_predictions_as_its_dump_does():
    router = KvRouter(
        RouterConfig(block_size=4, use_kv_events=True),
        clock=lambda: 0.0,
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    rng = random.Random(1)
    for i in range(40):
        blocks = [StoredBlock(rng.getrandbits(63), rng.getrandbits(64)) for _ in range(1 + i % 5)]
        router.apply_event(BlocksStored(Worker("a", 0), blocks))
    router.set_event_fed(Worker("b", 0), False)  # b's blocks are predicted from the router's decisions
    for i in range(20):
        router.best_worker(list(range(i, i + 40)), request_id=f"r{i}")
    assert len(router.dump_events(include_predicted=True)) > len(router.dump_events())
    for size in (1, 3, 16):
        assert joined(router.dump_slices(size)) == router.dump_events()
