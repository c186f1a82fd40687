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
    tree.apply_event(stored(W0, [(2, 2)], parent=999))
    tree.apply_event(BlocksRemoved(W0, (12345,)))
    tree.apply_event(BlocksRemoved(W1, (1,)))
    assert tree.stats.unknown_parent == 1
    assert tree.stats.unknown_removal == 2
    assert tree.find_matches([2]) == {}


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
    assert tree.num_nodes == 2
    tree.remove_worker(W1)
    assert tree.num_nodes == 0
    assert tree.workers() == [W0]
    tree.apply_event(stored(W2, [(1, 1)]))  # a new worker reuses the freed slot without ghosts
    assert tree.find_matches([1, 3]) == {W2: 1}


# --- property test against a brute-force model ---------------------------------------------------


class BruteForce:
    """Per worker: engine id -> full local-hash path. A worker matches q[:n] if it holds every prefix."""

    def __init__(self):
        self.blocks: dict[Worker, dict[int, tuple[int, ...]]] = {}

    def apply(self, op):
        kind, worker, *args = op
        if kind == "remove_worker":
            self.blocks.pop(worker, None)
            return
        m = self.blocks.setdefault(worker, {})
        if kind == "stored":
            parent, pairs = args
            if parent is None:
                path = ()
            elif parent in m:
                path = m[parent]
            else:
                return
            for engine_hash, local_hash in pairs:
                path = (*path, local_hash)
                m[engine_hash] = path
        elif kind == "removed":
            for engine_hash in args[0]:
                m.pop(engine_hash, None)
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


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=40))
def test_radix_tree_agrees_with_brute_force_and_rebuilds_from_its_dump(sequence):
    tree, model = RadixTree(), BruteForce()
    for op in sequence:
        apply_to_tree(tree, op)
        model.apply(op)
    for query in QUERIES:
        assert tree.find_matches(query) == model.find_matches(query), query
    assert sorted((str(w), e, p) for w, e, p in tree.entries()) == model.entries()

    rebuilt = RadixTree()
    for event in tree.dump_events():
        rebuilt.apply_event(event)
    for query in QUERIES:
        assert rebuilt.find_matches(query) == tree.find_matches(query), query
    assert sorted((str(w), p) for w, _, p in rebuilt.entries()) == sorted(
        (str(w), p) for w, _, p in tree.entries()
    )
    assert rebuilt.num_nodes <= tree.num_nodes
