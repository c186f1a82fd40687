"""RadixTree behaviours that mutation testing found unpinned (issue 19): seeded histories against the
brute-force model (the same every run, unlike the hypothesis tests' random examples), exact dumps
(stand-in numbering, parents named), engine-id reuse, aliases and removals."""

from __future__ import annotations

import random

import pytest

from extproc.router import AllBlocksCleared, BlocksRemoved, RadixTree, Worker

from .test_radix import (
    QUERIES,
    W0,
    W0_DP1,
    W1,
    W2,
    BruteForce,
    apply_to_tree,
    chain,
    check_against,
    check_rebuild,
    check_runs,
    stored,
)

WORKERS = [W0, W1, W2, W0_DP1]


def short_history(rng: random.Random) -> list[tuple]:
    """Like test_radix's `ops`: few engine ids and hashes, so ids are reused and runs alias."""
    ops: list[tuple] = []
    for _ in range(rng.randrange(1, 30)):
        kind = rng.choice(["stored"] * 4 + ["removed"] * 2 + ["cleared", "remove_worker"])
        worker = rng.choice(WORKERS)
        if kind == "stored":
            parent = None if rng.random() < 0.4 else rng.randrange(8)
            pairs = [(rng.randrange(8), rng.randrange(4)) for _ in range(rng.randrange(1, 5))]
            ops.append(("stored", worker, parent, pairs))
        elif kind == "removed":
            ops.append(("removed", worker, [rng.randrange(8) for _ in range(rng.randrange(1, 4))]))
        else:
            ops.append((kind, worker))
    return ops


def long_history(rng: random.Random) -> list[tuple]:
    """Like test_radix's `long_ops`: long stores over 3 hashes, mostly fresh ids, stretches removed."""
    ops: list[tuple] = []
    stores: list[tuple[Worker, list[int]]] = []
    next_id = 100
    for _ in range(rng.randrange(1, 30)):
        kind = rng.choice(["stored"] * 5 + ["removed", "removed_stretch", "cleared", "remove_worker"])
        worker = rng.choice(WORKERS)
        if kind == "stored":
            size = rng.randrange(1, 13)
            hashes = [rng.randrange(3) for _ in range(size)]
            ids = []
            for _ in range(size):
                if rng.random() < 0.1:
                    ids.append(rng.randrange(16))
                else:
                    ids.append(next_id)
                    next_id += 1
            known = [e for w, es in stores if w == worker for e in es]
            parent = rng.choice([None, *known]) if known else None
            stores.append((worker, ids))
            ops.append(("stored", worker, parent, list(zip(ids, hashes, strict=True))))
        elif kind == "removed_stretch" and stores:
            w, ids = rng.choice(stores)
            lo = rng.randrange(len(ids))
            stretch = ids[lo : rng.randrange(lo + 1, len(ids) + 1)]
            rng.shuffle(stretch)
            ops.append(("removed", w, stretch))
        elif kind == "removed":
            pool = [e for _, es in stores for e in es] or [0]
            ops.append(("removed", worker, [rng.choice(pool) for _ in range(rng.randrange(1, 7))]))
        elif kind in ("cleared", "remove_worker"):
            ops.append((kind, worker))
    return ops


@pytest.mark.parametrize("make", [short_history, long_history])
@pytest.mark.parametrize("seed", range(4))
def test_seeded_histories_agree_with_brute_force_and_rebuild_from_their_dump(make, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        tree, model = RadixTree(), BruteForce()
        history = make(rng)
        for op in history:
            apply_to_tree(tree, op)
            model.apply(op)
            check_runs(tree)
        queries = model.queries() + QUERIES[:: 7 if make is short_history else 17]
        check_against(tree, model, queries)
        check_rebuild(tree, queries)


# --- exact dumps ------------------------------------------------------------------------------------


def test_a_dump_names_held_parents_and_numbers_stand_ins_from_minus_one_up_the_tree() -> None:
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2, 3, 4]))
    tree.apply_event(chain(W1, 20, [1, 2, 5]))  # splits W0's run after 2
    assert tree.dump_events() == [
        chain(W0, 10, [1, 2]),
        chain(W0, 12, [3, 4], parent=11),
        chain(W1, 20, [1, 2]),
        chain(W1, 22, [5], parent=21),
    ]
    tree.apply_event(BlocksRemoved(W0, (10, 11)))  # W0 keeps 3 and 4 without their parents
    events = tree.dump_events()
    assert events[:2] == [
        stored(W0, [(-2, 1), (-1, 2), (12, 3), (13, 4)]),  # numbered from the run up
        BlocksRemoved(W0, (-2, -1)),
    ]


def test_stand_ins_skip_every_negative_id_the_worker_holds() -> None:
    tree = RadixTree()
    tree.apply_event(stored(W0, [(-1, 7), (-2, 8)]))  # a snapshot's negative ids
    tree.apply_event(stored(W0, [(-4, 9)]))
    tree.apply_event(chain(W0, 30, [1, 2, 3]))
    tree.apply_event(BlocksRemoved(W0, (30, 31)))
    events = tree.dump_events()
    assert stored(W0, [(-5, 1), (-3, 2), (32, 3)]) in events
    assert BlocksRemoved(W0, (-5, -3)) in events
    check_rebuild(tree, [[7, 8], [9], [1, 2, 3]])


def test_an_alias_at_the_head_of_an_unreachable_run_is_dumped_behind_stand_ins() -> None:
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2, 3]))
    tree.apply_event(chain(W0, 40, [1, 2]))  # 40, 41 alias 10, 11
    tree.apply_event(chain(W1, 20, [1, 2, 5]))  # W0's run splits after 2
    tree.apply_event(BlocksRemoved(W0, (10, 40)))  # 1 is gone: 2 (11, alias 41) and 3 unreachable
    check_runs(tree)
    check_rebuild(tree, [[1, 2, 3], [1, 2, 5]])
    assert tree.num_blocks(W0) == 3


# --- engine ids: repeats, aliases, promotion, slots --------------------------------------------------


def test_repeating_a_store_that_names_aliases_adds_nothing_and_keeps_its_place() -> None:
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2]))
    tree.apply_event(chain(W0, 40, [1, 2]))  # 40, 41: aliases of 10, 11
    stored_blocks = tree.stats.stored_blocks
    tree.apply_event(stored(W0, [(40, 1), (41, 2), (42, 3)]))  # a repeat of the aliases, one block more
    assert tree.stats.stored_blocks == stored_blocks + 1
    assert sorted(e for _, e, _ in tree.entries()) == [10, 11, 40, 41, 42]
    assert {e: p for _, e, p in tree.entries()}[42] == (1, 2, 3)
    assert tree.find_matches([1, 2, 3]) == {W0: 3}
    check_runs(tree)


def test_a_block_named_thrice_stays_until_every_name_is_removed() -> None:
    tree = RadixTree()
    for start in (10, 40, 50):
        tree.apply_event(chain(W0, start, [1, 2]))
    tree.apply_event(BlocksRemoved(W0, (10, 11)))  # 40 takes 10's place; 50 now aliases 40
    assert sorted(e for _, e, _ in tree.entries()) == [40, 41, 50, 51]
    tree.apply_event(BlocksRemoved(W0, (40,)))
    assert sorted((e, p) for _, e, p in tree.entries()) == [(41, (1, 2)), (50, (1,)), (51, (1, 2))]
    assert tree.find_matches([1, 2]) == {W0: 2}
    tree.apply_event(BlocksRemoved(W0, (50, 41, 51)))
    assert tree.find_matches([1, 2]) == {} and tree.num_blocks(W0) == 0
    assert tree.stats.unknown_removal == 0
    check_runs(tree)


def test_slots_of_removed_workers_are_reused() -> None:
    """Workers come and go (scaling, restarts): the tree's per-slot tables do not grow with them."""
    tree = RadixTree()
    tree.apply_event(chain(W0, 1, [1]))
    for i in range(20):
        worker = Worker(f"gone{i}")
        tree.apply_event(chain(worker, 1, [1, 2]))
        tree.apply_event(chain(W1, 100 + i, [100 + i]))
        tree.remove_worker(worker)
    assert len(tree._own) == len(tree._counts) == 3  # W0's slot, W1's, and the one every departed worker used
    assert tree.find_matches([1, 2]) == {W0: 1}


def test_the_event_counters_count_each_event_once() -> None:
    """`IndexerStats` is exported as metrics: one count per event of each kind, blocks as applied."""
    tree = RadixTree()
    assert tree.apply_event(stored(W0, [])) is True  # an empty store is a no-op, not a failure
    tree.apply_event(stored(W0, [(10, 1), (11, 2)]))
    tree.apply_event(stored(W1, [(20, 1)]))
    tree.apply_event(BlocksRemoved(W0, (11,)))
    tree.apply_event(BlocksRemoved(W1, (20,)))
    tree.apply_event(AllBlocksCleared(W0))
    tree.apply_event(AllBlocksCleared(W1))
    s = tree.stats
    assert (s.stored_events, s.removed_events, s.cleared_events) == (3, 2, 2)
    assert (s.stored_blocks, s.removed_blocks, s.unknown_parent, s.unknown_removal) == (3, 2, 0, 0)
    with pytest.raises(TypeError, match="not a KV event"):
        tree.apply_event(object())  # type: ignore[arg-type]


def test_a_leaf_that_empties_lets_its_parent_merge_with_the_only_child_left() -> None:
    tree = RadixTree()
    tree.apply_event(stored(W0, [(10, 1), (11, 2), (12, 3)]))
    tree.apply_event(stored(W1, [(20, 1), (21, 2), (22, 4)]))  # [1 2] then [3] (w0) and [4] (w1)
    assert tree.num_nodes == 3
    tree.apply_event(BlocksRemoved(W1, (22,)))  # [4] empties: [1 2] and [3] are one run again
    assert tree.num_nodes == 1
    assert tree.find_matches([1, 2, 3]) == {W0: 3, W1: 2}


@pytest.mark.parametrize("where", ["inside another worker's run", "extending its leaf", "a new run"])
def test_an_alias_id_reused_for_a_new_block_names_that_block_only(where: str) -> None:
    """An engine id the worker uses as an alias (a second id for a block it holds) that comes back
    naming another block: the block is stored under it once, the alias goes (the worker holds
    three blocks, not four)."""
    tree = RadixTree()
    tree.apply_event(stored(W0, [(10, 1), (12, 2)]))
    tree.apply_event(stored(W0, [(11, 1)]))  # 11: a second id for the block of 10
    if where == "inside another worker's run":
        tree.apply_event(stored(W1, [(30, 1), (31, 2), (32, 3)]))
        tree.apply_event(stored(W0, [(11, 3)], parent=12))
        expected = {W0: 3, W1: 3}
    elif where == "extending its leaf":
        tree.apply_event(stored(W0, [(11, 3)], parent=12))
        expected = {W0: 3}
    else:
        tree.apply_event(stored(W0, [(11, 7)]))
        expected = {W0: 2}
        assert tree.find_matches([7]) == {W0: 1}
    assert tree.num_blocks(W0) == 3
    assert sorted(e for w, e, _ in tree.entries() if w == W0) == [10, 11, 12]
    assert tree.find_matches([1, 2, 3]) == expected
