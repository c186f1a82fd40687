"""`bulk_load`: no full garbage collection while a snapshot loads, the heap frozen after it."""

import gc
import random
import weakref

from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored, StoredBlock, Worker
from extproc.runtime.heap import bulk_load

from ..conftest import grow


class Thing:
    """A weak-referenceable object, to see whether a collection freed it."""

    def __init__(self) -> None:
        self.me = self  # a reference cycle: only a collection frees it


def test_growing_the_heap_runs_full_collections_without_it(full_collections):
    kept: list = []
    grow(kept, 300_000)
    assert full_collections[0] >= 1  # what bulk_load holds off: otherwise this test proves nothing


def test_no_full_collection_runs_while_a_bulk_load_lasts(full_collections):
    kept: list = []
    with bulk_load():
        grow(kept, 300_000)
        assert full_collections[0] == 0
        assert gc.get_threshold()[2] > 10**6
    assert full_collections[0] == 0  # its end collects the young generations only: no full pause
    assert gc.get_threshold() == (700, 10, 10)  # restored


def test_the_load_is_frozen_and_its_young_garbage_collected_when_it_ends(full_collections):
    kept: list = []
    frozen = gc.get_freeze_count()
    with bulk_load():
        grow(kept, 50_000)
        garbage = weakref.ref(Thing())  # unreachable at once, kept alive by its own cycle
    assert garbage() is None  # collected before the freeze, not kept forever
    # each kept list and its inner list (a dict of ints is not tracked by the collector); nothing
    # else is promised: the heap around them may have been frozen already by an earlier test
    assert gc.get_freeze_count() >= frozen + 50_000 * 2


def test_only_the_outermost_bulk_load_freezes_and_restores(full_collections):
    frozen = gc.get_freeze_count()
    with bulk_load():
        with bulk_load():
            pass
        assert gc.get_freeze_count() == frozen and gc.get_threshold()[2] > 10**6
        kept: list = []
        grow(kept, 1_000)
    assert gc.get_freeze_count() > frozen and gc.get_threshold() == (700, 10, 10)


def test_the_router_tree_makes_no_reference_cycles():
    """What freezing it relies on: a frozen block, run or name the tree drops is freed by its
    reference count, since no collection will look at it again."""
    router = KvRouter(
        RouterConfig(block_size=4, use_kv_events=True),
        clock=lambda: 0.0,
        workers=[WorkerSpec(str(i)) for i in range(4)],
    )
    rng = random.Random(0)
    held: list[tuple[Worker, list[int]]] = []
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(5_000):
            worker = Worker(str(rng.randrange(4)), 0)
            roll = rng.random()
            if roll < 0.5 or not held:
                parent = None
                if held and rng.random() < 0.5:
                    at, ids = rng.choice(held)
                    parent = rng.choice(ids) if at == worker else None
                ids = [rng.getrandbits(20) for _ in range(rng.randrange(1, 20))]
                blocks = [StoredBlock(e, rng.randrange(50)) for e in ids]  # few contents: runs split
                router.apply_event(BlocksStored(worker, blocks, parent))
                held.append((worker, ids))
            elif roll < 0.95:
                at, ids = held.pop(rng.randrange(len(held)))
                router.apply_event(BlocksRemoved(at, tuple(rng.sample(ids, rng.randrange(1, len(ids) + 1)))))
            elif roll < 0.99:
                router.apply_event(AllBlocksCleared(worker))
            else:
                router.indexer.remove_worker(worker)
        assert router.indexer.stats.stored_events > 2_000
        assert gc.collect() == 0
    finally:
        (gc.enable if enabled else gc.disable)()
