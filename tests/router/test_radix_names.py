"""The radix tree's shared names: one map engine id -> run for every worker that names a block alike."""

from __future__ import annotations

from extproc.router.radix import RadixTree
from extproc.router.radix_names import SHARDS, ShardedNames
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker
from tests.router.test_radix import check_runs


def test_sharded_names_behave_as_one_dict_for_any_engine_id() -> None:
    """vLLM's ids are unsigned 64-bit, SGLang's signed: both land in a shard and come back."""
    names: ShardedNames[str] = ShardedNames()
    ids = [0, 1, SHARDS - 1, SHARDS, 2**64 - 1, -1, -(2**63), 12345678901234567]
    names.point(ids[:4], "a")
    names.update({e: "b" for e in ids[4:]})
    assert len(names) == len(ids) and dict(names.items()) == {
        **dict.fromkeys(ids[:4], "a"),
        **dict.fromkeys(ids[4:], "b"),
    }
    assert all(e in names and names[e] == names.get(e) for e in ids)
    assert names.get(7) is None and 7 not in names and "7" not in names
    assert not names.isdisjoint([7, 2**64 - 1]) and names.isdisjoint([7, 8])
    names[7] = "c"
    del names[-1]
    names.drop([0, 1])
    assert sorted(e for e, _ in names.items()) == sorted({*ids, 7} - {-1, 0, 1})


def _request(worker: Worker, blocks: range, salt: int = 0) -> BlocksStored:
    """A request's blocks: block i named 1000 + i (plus a salt for an engine naming them its own way)."""
    return BlocksStored(worker, tuple(StoredBlock(1000 + i + salt, i) for i in blocks), None)


def test_workers_naming_blocks_alike_share_one_name_per_block() -> None:
    """The memory the shared names save: 16 workers caching one prompt add no per-worker entries;
    a worker whose engine names the blocks its own way gets its own, and both read back right."""
    tree = RadixTree()
    workers = [Worker(f"w{i}") for i in range(16)]
    for i, worker in enumerate(workers):
        tree.apply_event(_request(worker, range(40 + i)))  # the same prompt, each a little longer
    odd = Worker("odd")
    tree.apply_event(_request(odd, range(10), salt=10**6))
    check_runs(tree)
    assert len(tree._names) == 55 + 10 and not any(tree._own)
    assert tree.num_blocks() == sum(40 + i for i in range(16)) + 10
    assert tree.find_matches(list(range(50))) == {
        **{w: min(50, 40 + i) for i, w in enumerate(workers)},
        odd: 10,
    }
    # the block stays named while any worker holds it, and goes with the last one
    for i, worker in enumerate(workers[:-1]):
        tree.apply_event(BlocksRemoved(worker, tuple(1000 + j for j in reversed(range(40 + i)))))
    check_runs(tree)
    assert len(tree._names) == 55 + 10
    tree.apply_event(BlocksRemoved(workers[-1], tuple(1000 + i for i in reversed(range(55)))))
    check_runs(tree)
    assert len(tree._names) == 10 and tree.find_matches(list(range(50))) == {odd: 10}


def test_an_id_named_alike_then_differently_is_the_workers_own() -> None:
    """Worker B names block 0 as A does but block 1 otherwise, and A's id for block 1 is a third
    block for B: each worker's ids resolve to its own blocks, parents and removals included."""
    a, b = Worker("a"), Worker("b")
    tree = RadixTree()
    tree.apply_event(BlocksStored(a, (StoredBlock(1, 10), StoredBlock(2, 11)), None))
    tree.apply_event(BlocksStored(b, (StoredBlock(1, 10), StoredBlock(5, 11)), None))
    tree.apply_event(BlocksStored(b, (StoredBlock(2, 12),), 5))  # A's id 2 is B's block 12 after 11
    check_runs(tree)
    assert tree.find_matches([10, 11, 12]) == {a: 2, b: 3}
    tree.apply_event(BlocksRemoved(a, (2,)))
    check_runs(tree)
    assert tree.find_matches([10, 11, 12]) == {a: 1, b: 3}
    tree.apply_event(BlocksRemoved(b, (2, 5)))
    check_runs(tree)
    assert tree.find_matches([10, 11, 12]) == {a: 1, b: 1}
    assert len(tree._names) == 1 and not any(tree._own)
