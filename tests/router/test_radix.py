"""RadixTree: matches per worker from KV events, per-worker engine ids, dump and rebuild."""

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.router import AllBlocksCleared, BlocksRemoved, BlocksStored, RadixTree, StoredBlock, Worker

W0, W1, W2 = Worker("w0"), Worker("w1"), Worker("w2")
W0_DP1 = Worker("w0", 1)


def stored(worker, pairs, parent=None):
    return BlocksStored(worker, tuple(StoredBlock(e, h) for e, h in pairs), parent)


def test_find_matches_counts_the_shared_prefix_per_worker():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(10, 1), (11, 2), (12, 3)]))
    tree.apply_event(stored(W1, [(20, 1), (21, 2), (22, 9)]))
    assert tree.find_matches([1, 2, 3]) == {W0: 3, W1: 2}
    assert tree.find_matches([1, 2, 9, 4]) == {W0: 2, W1: 3}
    assert tree.find_matches([5]) == {}
    assert tree.find_matches([]) == {}


def test_dp_ranks_are_separate_workers():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(1, 1)]))
    tree.apply_event(stored(W0_DP1, [(1, 1), (2, 2)]))
    assert tree.find_matches([1, 2]) == {W0: 1, W0_DP1: 2}


def test_events_chain_through_the_parent_engine_id():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(100, 1)]))
    tree.apply_event(stored(W0, [(101, 2), (102, 3)], parent=100))
    assert tree.find_matches([1, 2, 3]) == {W0: 3}


def test_different_engine_ids_for_the_same_content_resolve_per_worker():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(1, 7), (2, 8)]))
    tree.apply_event(stored(W1, [(2, 7), (1, 8)]))  # engine ids swapped on the other worker
    tree.apply_event(stored(W1, [(3, 9)], parent=1))  # W1's id 1 is content 8
    assert tree.find_matches([7, 8, 9]) == {W0: 2, W1: 3}
    tree.apply_event(BlocksRemoved(W0, (2,)))  # W0's id 2 is content 8
    assert tree.find_matches([7, 8, 9]) == {W0: 1, W1: 3}
    tree.apply_event(BlocksRemoved(W1, (2,)))  # W1's id 2 is content 7: breaks W1's chain at the root
    assert tree.find_matches([7, 8, 9]) == {W0: 1}


def test_duplicate_stores_are_idempotent():
    tree = RadixTree()
    for _ in range(3):
        tree.apply_event(stored(W0, [(1, 1), (2, 2)]))
    assert tree.num_blocks(W0) == 2
    tree.apply_event(BlocksRemoved(W0, (2,)))
    assert tree.find_matches([1, 2]) == {W0: 1}


def test_same_content_under_two_engine_ids_stays_until_both_are_removed():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(1, 5)]))
    tree.apply_event(stored(W0, [(2, 5)]))
    tree.apply_event(BlocksRemoved(W0, (1,)))
    assert tree.find_matches([5]) == {W0: 1}
    tree.apply_event(BlocksRemoved(W0, (2,)))
    assert tree.find_matches([5]) == {}


def test_unknown_parents_and_removals_are_counted_not_raised():
    tree = RadixTree()
    assert tree.apply_event(stored(W0, [(2, 2)], parent=999)) is False  # an orphan: the caller resyncs
    assert tree.apply_event(BlocksRemoved(W0, (12345,))) is True
    tree.apply_event(BlocksRemoved(W1, (1,)))
    assert tree.apply_event(stored(W0, [(1, 1)])) is True
    assert tree.apply_event(stored(W0, [(3, 3)], parent=1)) is True
    assert tree.stats.unknown_parent == 1
    assert tree.stats.unknown_removal == 2
    assert tree.find_matches([2]) == {}
    assert tree.find_matches([1, 3]) == {W0: 2}


def test_removing_a_middle_block_cuts_the_match_there():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(1, 1), (2, 2), (3, 3)]))
    tree.apply_event(BlocksRemoved(W0, (2,)))
    assert tree.find_matches([1, 2, 3]) == {W0: 1}
    tree.apply_event(stored(W0, [(4, 2)], parent=1))  # stored again under a new id: whole path back
    assert tree.find_matches([1, 2, 3]) == {W0: 3}


def test_cleared_and_removed_workers_leave_no_nodes_behind():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(1, 1), (2, 2)]))
    tree.apply_event(stored(W1, [(1, 1), (3, 3)]))
    tree.apply_event(AllBlocksCleared(W0))
    assert tree.find_matches([1, 2]) == {W1: 1}
    assert tree.num_nodes == 1  # runs: [1] and [3] merge back into one once W0's [2] is gone
    tree.remove_worker(W1)
    assert tree.num_nodes == 0
    assert tree.workers() == [W0]
    tree.apply_event(stored(W2, [(1, 1)]))  # a new worker reuses the freed slot without ghosts
    assert tree.find_matches([1, 3]) == {W2: 1}


# --- runs: splits, merges and engine ids across them ---------------------------------------------


def check_runs(tree, canonical=True):
    """Internal invariants of the run tree (reads private state; test-only)."""
    root, count = tree._root, 0
    held = [0] * len(tree._own)
    shared_users: dict[int, set[int]] = {}  # shared name -> offsets of the holders using it
    stack = [root]
    while stack:
        node = stack.pop()
        if node is not root:
            count += 1
            assert node.hashes, "empty run"
            assert set(node.eids) == {
                s for s in range(len(tree._own)) if (node.workers | node.partial) >> s & 1
            }
            assert not node.workers & node.partial
            for slot, ids in node.eids.items():
                assert 0 < len(ids) <= len(node.hashes)
                assert (len(ids) == len(node.hashes)) == bool(node.workers >> slot & 1)
                held[slot] += len(ids)
                for off, e in enumerate(ids):  # the worker's own name, else the shared one, is here
                    if e in tree._own[slot]:
                        assert tree._own[slot][e] is node
                    else:
                        assert tree._names[e] is node
                        shared_users.setdefault(e, set()).add(off)
            assert node.workers or node.children, "a leaf ends with blocks nobody holds"
        for key, child in (node.children or {}).items():
            assert child.parent is node and child.hashes[0] == key
            stack.append(child)
        if canonical and node is not root and node.children and len(node.children) == 1:
            (child,) = node.children.values()
            assert (child.workers | child.partial) & ~node.workers, "two runs that could be one"
    assert count == tree.num_nodes
    # every shared name is used, by holders all at one offset (so none is kept for nobody)
    assert shared_users.keys() == dict(tree._names.items()).keys()
    assert all(len(offsets) == 1 for offsets in shared_users.values())
    for slot, m in enumerate(tree._own):
        for e, node in m.items():
            assert node.parent is not None and e in node.eids[slot]
        for alias, first in tree._aliases[slot].items():
            assert tree._held_at(slot, first) is not None and tree._held_at(slot, alias) is None
        assert tree._counts[slot] == held[slot] + len(tree._aliases[slot])


def chain(worker, start, hashes, parent=None):
    """One event storing `hashes` with engine ids start, start+1, ..."""
    return stored(worker, [(start + i, h) for i, h in enumerate(hashes)], parent)


def test_one_event_is_one_run_and_decode_steps_extend_it():
    tree = RadixTree()
    tree.apply_event(chain(W0, 100, [1, 2, 3, 4]))
    assert tree.num_nodes == 1
    for i, h in enumerate([5, 6, 7]):  # one block per event, parent = the previous block
        tree.apply_event(stored(W0, [(104 + i, h)], parent=103 + i))
    assert tree.num_nodes == 1
    assert tree.find_matches([1, 2, 3, 4, 5, 6, 7, 8]) == {W0: 7}
    assert tree.find_matches([1, 2, 3, 9]) == {W0: 3}  # a query that leaves the run in its middle
    assert tree.find_matches((1, 2)) == {W0: 2}  # a query that ends in its middle, given as a tuple
    assert tree.find_matches(iter([1, 2, 3])) == {W0: 3}
    assert tree.num_blocks(W0) == 7
    check_runs(tree)


def test_removing_the_middle_of_a_run_splits_it_and_storing_it_again_joins_it():
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2, 3, 4, 5, 6]))
    tree.apply_event(BlocksRemoved(W0, (12,)))  # block 3
    assert tree.find_matches([1, 2, 3, 4, 5, 6]) == {W0: 2}
    assert tree.num_nodes == 2  # [1 2 3] (W0 holds its first 2 blocks) -> [4 5 6]
    check_runs(tree)
    tree.apply_event(BlocksRemoved(W0, (14,)))  # 5, behind the gap: still held, still unreachable
    assert tree.num_nodes == 3
    assert sorted(p for _, _, p in tree.entries()) == [(1,), (1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)]
    tree.apply_event(stored(W0, [(30, 3)], parent=11))  # 3 again under a new id
    assert tree.find_matches([1, 2, 3, 4, 5, 6]) == {W0: 4}
    tree.apply_event(stored(W0, [(31, 5)], parent=13))
    assert tree.find_matches([1, 2, 3, 4, 5, 6]) == {W0: 6}
    assert tree.num_nodes == 1
    check_runs(tree)
    tree.apply_event(BlocksRemoved(W0, (10, 11, 30, 13, 31, 15)))  # root first, one event
    assert tree.num_nodes == 0 and tree.num_blocks() == 0
    assert tree.stats.removed_blocks == 8 and tree.stats.unknown_removal == 0


def test_removing_a_run_tail_first_block_by_block():
    tree = RadixTree()
    tree.apply_event(chain(W0, 0, list(range(1, 41))))
    tree.apply_event(chain(W1, 100, list(range(1, 21))))
    for e in reversed(range(40)):
        tree.apply_event(BlocksRemoved(W0, (e,)))
        assert tree.find_matches(list(range(1, 41))) == {W1: 20} | ({W0: e} if e else {})
        check_runs(tree)
    assert tree.num_nodes == 1


def test_a_second_worker_storing_a_prefix_of_a_run_holds_a_prefix_of_it():
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2, 3, 4]))
    tree.apply_event(chain(W1, 20, [1, 2]))
    assert tree.num_nodes == 1  # no split: W1 holds the run's first 2 blocks
    assert tree.find_matches([1, 2, 3, 4]) == {W0: 4, W1: 2}
    assert tree.find_matches([1, 9]) == {W0: 1, W1: 1}
    assert tree.find_matches([1, 2, 3]) == {W0: 3, W1: 2}
    tree.apply_event(stored(W1, [(22, 3)], parent=21))  # W1 catches up by one block
    assert tree.find_matches([1, 2, 3, 4]) == {W0: 4, W1: 3}
    tree.apply_event(stored(W1, [(23, 4)], parent=22))
    assert tree.num_nodes == 1
    tree.apply_event(BlocksRemoved(W1, (23, 22)))  # tail first: W1's list gets shorter, nothing moves
    assert tree.find_matches([1, 2, 3, 4]) == {W0: 4, W1: 2}
    assert tree.num_nodes == 1
    tree.apply_event(chain(W1, 40, [5], parent=21))  # branching off where W1's part ends: a split
    assert tree.num_nodes == 3
    assert tree.find_matches([1, 2, 5]) == {W0: 2, W1: 3}
    check_runs(tree)
    tree.apply_event(BlocksRemoved(W1, (40,)))
    assert tree.num_nodes == 1
    tree.apply_event(chain(W1, 22, [3, 4], parent=21))
    tree.apply_event(BlocksRemoved(W0, (10, 11, 12, 13)))
    assert tree.find_matches([1, 2, 3, 4]) == {W1: 4}
    # W0's ids were re-pointed by every split and merge: removing them removed the right blocks
    assert tree.num_blocks(W0) == 0 and tree.stats.unknown_removal == 0
    check_runs(tree)


def test_workers_holding_a_prefix_of_a_run_score_what_they_hold_of_it():
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2, 3, 4, 5]))
    tree.apply_event(chain(W1, 20, [1, 2, 3]))
    tree.apply_event(chain(W2, 30, [1]))
    assert tree.num_nodes == 1
    assert tree.find_matches([1, 2, 3, 4, 5]) == {W0: 5, W1: 3, W2: 1}
    assert tree.find_matches([1, 2, 9]) == {W0: 2, W1: 2, W2: 1}
    assert tree.find_matches([1, 2, 3, 4, 9]) == {W0: 4, W1: 3, W2: 1}
    assert tree.find_matches([1]) == {W0: 1, W1: 1, W2: 1}
    tree.apply_event(BlocksRemoved(W0, (14,)))
    assert tree.find_matches([1, 2, 3, 4, 5]) == {W0: 4, W1: 3, W2: 1}
    check_runs(tree)  # the run is cut after the last block someone holds
    tree.apply_event(BlocksRemoved(W0, (13, 12, 11, 10)))
    assert tree.find_matches([1, 2, 3, 4, 5]) == {W1: 3, W2: 1}
    assert tree._root.children[1].hashes == [1, 2, 3]
    tree.apply_event(BlocksRemoved(W1, (20,)))  # W1 keeps 2 and 3, unreachable
    assert tree.find_matches([1, 2, 3]) == {W2: 1}
    assert sorted(p for w, _, p in tree.entries() if w == W1) == [(1, 2), (1, 2, 3)]
    check_runs(tree)


def test_diverging_children_at_a_split_point():
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2, 3, 4]))
    tree.apply_event(chain(W1, 20, [1, 2, 7, 8]))
    tree.apply_event(chain(W2, 30, [1, 2, 3, 9]))
    assert tree.num_nodes == 5  # [1 2] -> [3] -> ([4], [9]); [1 2] -> [7 8]
    assert tree.find_matches([1, 2, 3, 4]) == {W0: 4, W1: 2, W2: 3}
    assert tree.find_matches([1, 2, 7, 8]) == {W0: 2, W1: 4, W2: 2}
    assert tree.find_matches([1, 2, 3]) == {W0: 3, W1: 2, W2: 3}
    assert tree.find_matches([1, 2, 5]) == {W0: 2, W1: 2, W2: 2}
    tree.apply_event(stored(W2, [(33, 5)], parent=31))  # a third branch out of the first run
    assert tree.find_matches([1, 2, 5]) == {W0: 2, W1: 2, W2: 3}
    check_runs(tree)
    tree.remove_worker(W1)
    tree.remove_worker(W2)
    assert tree.num_nodes == 1 and tree.find_matches([1, 2, 3, 4]) == {W0: 4}
    check_runs(tree)


def test_engine_id_reuse_across_a_split():
    tree = RadixTree()
    tree.apply_event(chain(W0, 1, [10, 20, 30, 40]))  # ids 1..4
    tree.apply_event(stored(W0, [(3, 99)]))  # id 3 now names other content: 30 is dropped
    assert tree.find_matches([10, 20, 30, 40]) == {W0: 2}
    assert tree.find_matches([99]) == {W0: 1}
    check_runs(tree)
    tree.apply_event(stored(W0, [(5, 30)], parent=2))  # 30 back under id 5: the path is whole again
    assert tree.find_matches([10, 20, 30, 40]) == {W0: 4}
    tree.apply_event(BlocksRemoved(W0, (3,)))  # removes 99, not 30
    assert tree.find_matches([99]) == {}
    assert tree.find_matches([10, 20, 30, 40]) == {W0: 4}
    assert tree.stats.unknown_removal == 0
    check_runs(tree)


def test_engine_id_reused_inside_one_event():
    tree = RadixTree()
    tree.apply_event(stored(W0, [(1, 10), (1, 20), (2, 30)]))  # id 1 names 10, then 20
    assert tree.find_matches([10, 20, 30]) == {}  # 10 is no longer held
    assert sorted(p for _, _, p in tree.entries()) == [(10, 20), (10, 20, 30)]
    tree.apply_event(stored(W0, [(3, 10)]))
    assert tree.find_matches([10, 20, 30]) == {W0: 3}
    check_runs(tree)


def test_same_content_under_two_ids_survives_splits_and_promotion():
    tree = RadixTree()
    tree.apply_event(chain(W0, 1, [10, 20, 30]))  # ids 1, 2, 3
    tree.apply_event(chain(W0, 7, [10, 20]))  # ids 7, 8 name the same blocks
    assert tree.num_blocks(W0) == 5 and tree.stats.stored_blocks == 5
    tree.apply_event(chain(W1, 50, [10]))  # splits W0's run after 10
    tree.apply_event(BlocksRemoved(W0, (1, 2)))  # 7 and 8 still name them
    assert tree.find_matches([10, 20, 30]) == {W0: 3, W1: 1}
    tree.apply_event(stored(W0, [(9, 40)], parent=8))  # 8 still resolves as a parent
    assert tree.find_matches([10, 20, 40]) == {W0: 3, W1: 1}
    tree.apply_event(BlocksRemoved(W0, (8,)))
    assert tree.find_matches([10, 20, 30]) == {W0: 1, W1: 1}
    check_runs(tree)


def test_dump_and_rebuild_after_splits():
    tree = RadixTree()
    tree.apply_event(chain(W0, 10, [1, 2, 3, 4, 5, 6]))
    tree.apply_event(chain(W1, 20, [1, 2, 3, 7, 8]))
    tree.apply_event(chain(W2, 30, [1, 2]))
    tree.apply_event(chain(W0, 40, [1, 2]))  # aliases
    tree.apply_event(BlocksRemoved(W0, (11, 14)))  # 2 has alias 41; 5 is gone: 6 is unreachable
    tree.apply_event(BlocksRemoved(W1, (20, 21, 22)))  # W1 keeps only 7 and 8, unreachable
    check_runs(tree)
    events = tree.dump_events()
    rebuilt = RadixTree()
    for event in events:
        rebuilt.apply_event(event)
    check_runs(rebuilt)
    assert sorted((str(w), e, p) for w, e, p in rebuilt.entries()) == sorted(
        (str(w), e, p) for w, e, p in tree.entries()
    )
    for query in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8], [1, 2, 9]):
        assert rebuilt.find_matches(query) == tree.find_matches(query)
    assert rebuilt.num_nodes == tree.num_nodes
    assert rebuilt.stats.unknown_parent == 0 and rebuilt.stats.unknown_removal == 0


def test_dump_stand_ins_avoid_negative_ids_the_worker_holds():
    """Fuzz-found: a snapshot may store negative engine ids; a stand-in reusing one dropped that block."""
    tree = RadixTree()
    tree.apply_event(stored(W0, [(-1, 7)]))
    tree.apply_event(stored(W0, [(30, 1), (31, 2)]))
    tree.apply_event(BlocksRemoved(W0, (30,)))  # block 2 is held without its parent: dumped after a stand-in
    check_rebuild(tree, [[7], [1, 2]])
    assert tree.find_matches([7]) == {W0: 1}


# --- property test against a brute-force model ---------------------------------------------------


class BruteForce:
    """Per worker: engine id -> full local-hash path. A worker matches q[:n] if it holds every prefix."""

    def __init__(self):
        self.blocks: dict[Worker, dict[int, tuple[int, ...]]] = {}
        self.stored_blocks = self.removed_blocks = self.unknown_parent = self.unknown_removal = 0

    def apply(self, op):
        kind, worker, *args = op
        if kind == "remove_worker":
            self.blocks.pop(worker, None)
            return
        if kind == "removed" and worker not in self.blocks:
            self.unknown_removal += len(args[0])
            return
        m = self.blocks.setdefault(worker, {})
        if kind == "stored":
            parent, pairs = args
            if parent is None:
                path = ()
            elif parent in m:
                path = m[parent]
            else:
                self.unknown_parent += 1
                return
            for engine_hash, local_hash in pairs:
                path = (*path, local_hash)
                if m.get(engine_hash) != path:
                    self.stored_blocks += 1
                m[engine_hash] = path
        elif kind == "removed":
            for engine_hash in args[0]:
                if m.pop(engine_hash, None) is None:
                    self.unknown_removal += 1
                else:
                    self.removed_blocks += 1
        elif kind == "cleared":
            m.clear()

    def find_matches(self, query):
        scores = {}
        for worker, m in self.blocks.items():
            held = set(m.values())
            n = 0
            while n < len(query) and tuple(query[: n + 1]) in held:
                n += 1
            if n:
                scores[worker] = n
        return scores

    def entries(self):
        return sorted((str(w), e, p) for w, m in self.blocks.items() for e, p in m.items())

    def queries(self):
        """Every held path, one block longer and cut in its middle."""
        out = set()
        for m in self.blocks.values():
            for path in m.values():
                out.update((path, (*path, 0), path[: len(path) // 2], (*path[:-1], 9)))
        return [list(q) for q in out]


def apply_to_tree(tree, op):
    kind, worker, *args = op
    if kind == "stored":
        tree.apply_event(stored(worker, args[1], parent=args[0]))
    elif kind == "removed":
        tree.apply_event(BlocksRemoved(worker, tuple(args[0])))
    elif kind == "cleared":
        tree.apply_event(AllBlocksCleared(worker))
    else:
        tree.remove_worker(worker)


def check_against(tree, model, queries):
    for query in queries:
        assert tree.find_matches(query) == model.find_matches(query), query
    assert sorted((str(w), e, p) for w, e, p in tree.entries()) == model.entries()
    assert tree.num_blocks() == sum(len(m) for m in model.blocks.values())
    s = tree.stats
    assert (s.stored_blocks, s.removed_blocks, s.unknown_parent, s.unknown_removal) == (
        model.stored_blocks,
        model.removed_blocks,
        model.unknown_parent,
        model.unknown_removal,
    )


def check_rebuild(tree, queries):
    rebuilt = RadixTree()
    for event in tree.dump_events():
        rebuilt.apply_event(event)
    check_runs(rebuilt)
    for query in queries:
        assert rebuilt.find_matches(query) == tree.find_matches(query), query
    assert sorted((str(w), e, p) for w, e, p in rebuilt.entries()) == sorted(
        (str(w), e, p) for w, e, p in tree.entries()
    )
    assert rebuilt.num_nodes <= tree.num_nodes
    assert rebuilt.stats.unknown_parent == 0 and rebuilt.stats.unknown_removal == 0


workers = st.sampled_from([W0, W1, W2, W0_DP1])
engine_ids = st.integers(0, 7)
local_hashes = st.integers(0, 3)
ops = st.one_of(
    st.tuples(
        st.just("stored"),
        workers,
        st.one_of(st.none(), engine_ids),
        st.lists(st.tuples(engine_ids, local_hashes), min_size=1, max_size=4),
    ),
    st.tuples(st.just("removed"), workers, st.lists(engine_ids, min_size=1, max_size=3)),
    st.tuples(st.just("cleared"), workers),
    st.tuples(st.just("remove_worker"), workers),
)
QUERIES = [[a, b, c, d] for a in range(4) for b in range(4) for c in range(4) for d in range(4)]


def agrees_with_brute_force(sequence) -> None:
    tree, model = RadixTree(), BruteForce()
    for op in sequence:
        apply_to_tree(tree, op)
        model.apply(op)
    check_runs(tree)
    check_against(tree, model, QUERIES)
    check_rebuild(tree, QUERIES)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=40))
def test_radix_tree_agrees_with_brute_force_and_rebuilds_from_its_dump(sequence):
    agrees_with_brute_force(sequence)


@settings(max_examples=25, deadline=None)
@given(st.lists(ops, max_size=40))
def test_a_few_histories_agree_with_brute_force(sequence):
    """The oracle in brief, for the fast test set (benchmarks/mutation.py leaves the long ones out)."""
    agrees_with_brute_force(sequence)


# Long runs: stores of up to 12 blocks over a 3-letter alphabet (so runs share prefixes and split),
# mostly fresh engine ids (the bulk path) with some reused ones (the block-by-block path), removals
# of random ids and of whole stretches of an earlier store, in any order.


@st.composite
def long_ops(draw, alike=False):
    """`alike`: workers mostly name a block by its path, as a deployment's engines do (the shared
    names), some blocks under a fresh id (a worker naming content its own way)."""
    sequence, stores = [], []
    next_id = 100
    by_path: dict[tuple[int, ...], int] = {}  # alike: the id every worker gives a path
    path_of: dict[tuple[Worker, int], tuple[int, ...]] = {}
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(
            st.sampled_from(["stored"] * 5 + ["removed", "removed_stretch", "cleared", "remove_worker"])
        )
        worker = draw(workers)
        if kind == "stored":
            size = draw(st.integers(1, 12))
            hashes = draw(st.lists(st.integers(0, 2), min_size=size, max_size=size))
            known = [e for w, es in stores if w == worker for e in es]
            parent = draw(st.one_of(st.none(), st.sampled_from(known))) if known else None
            path = () if parent is None else path_of.get((worker, parent), ())
            ids = []
            for h in hashes:
                path = (*path, h)
                roll = draw(st.integers(0, 9))
                if roll == 0:
                    ids.append(draw(st.integers(0, 15)))  # a small id, maybe in use already
                elif alike and roll > 1:
                    if path not in by_path:
                        by_path[path] = next_id
                        next_id += 1
                    ids.append(by_path[path])
                else:
                    ids.append(next_id)
                    next_id += 1
                path_of[(worker, ids[-1])] = path
            stores.append((worker, ids))
            sequence.append(("stored", worker, parent, list(zip(ids, hashes, strict=True))))
        elif kind == "removed_stretch" and stores:
            w, ids = draw(st.sampled_from(stores))
            lo = draw(st.integers(0, len(ids) - 1))
            hi = draw(st.integers(lo + 1, len(ids)))
            stretch = ids[lo:hi]
            leaf_first = stretch[::-1] if draw(st.booleans()) else draw(st.permutations(stretch))
            sequence.append(("removed", w, leaf_first))
        elif kind == "removed":
            pool = [e for _, es in stores for e in es] or [0]
            sequence.append(
                ("removed", worker, draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6)))
            )
        elif kind in ("cleared", "remove_worker"):
            sequence.append((kind, worker))
    return sequence


def long_runs_agree_with_brute_force(sequence) -> None:
    tree, model = RadixTree(), BruteForce()
    for op in sequence:
        apply_to_tree(tree, op)
        model.apply(op)
        check_runs(tree)
    queries = model.queries() + QUERIES
    check_against(tree, model, queries)
    check_rebuild(tree, queries)


@settings(max_examples=300, deadline=None)
@given(long_ops())
def test_long_runs_split_and_merge_like_the_brute_force_model(sequence):
    long_runs_agree_with_brute_force(sequence)


@settings(max_examples=25, deadline=None)
@given(long_ops())
def test_a_few_long_runs_agree_with_brute_force(sequence):
    """The long-run oracle in brief, for the fast test set."""
    long_runs_agree_with_brute_force(sequence)


@settings(max_examples=300, deadline=None)
@given(long_ops(alike=True))
def test_workers_naming_blocks_alike_share_names_like_the_brute_force_model(sequence):
    """The shared map of engine ids: workers naming content alike, a few naming it their own way."""
    long_runs_agree_with_brute_force(sequence)


def test_an_id_a_worker_holds_elsewhere_is_not_taken_for_another_workers_name():
    """W0 names content A [1, 2]; W1 already uses 1 (or 2, as an alias) for other content. W1 then
    storing A as [1, 2] reuses the id (the engine freed it), it does not share W0's names twice."""
    w1_owns_one = [
        ("stored", W0, None, [(1, 0), (2, 1)]),
        ("stored", W1, None, [(1, 2)]),  # another content under W0's id: W1's own name
        ("stored", W1, None, [(1, 0), (2, 1)]),
    ]
    w1_aliases_two = [
        ("stored", W0, None, [(1, 0), (2, 1)]),
        ("stored", W1, None, [(9, 2)]),
        ("stored", W1, None, [(2, 2)]),  # the same content again: 2 is an alias of 9
        ("stored", W1, None, [(1, 0), (2, 1)]),
        ("removed", W0, [2, 1]),
    ]
    for sequence in (w1_owns_one, w1_aliases_two):
        long_runs_agree_with_brute_force(sequence)
