"""Approximate indexer: predictions from decisions, TTL expiry and LRU pruning, on a fake clock."""

import random

from extproc.router import KvRouter, RadixTree, RouterConfig, Worker, WorkerSpec, compute_block_hashes
from extproc.router.approx import ApproxIndexer, first_predicted, is_predicted_id, predicted_engine_id
from extproc.router.hashing import compute_sequence_hashes
from extproc.router.types import BlocksStored, StoredBlock

from .clock import FakeClock

A, B = Worker("a"), Worker("b")


def test_routed_blocks_are_predicted_cached_until_the_ttl_passes():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=120.0)
    approx.record_routing(A, [1, 2, 3], now=0.0)
    assert tree.find_matches([1, 2, 3]) == {A: 3}
    approx.expire(119.9)
    assert tree.find_matches([1, 2, 3]) == {A: 3}
    approx.expire(120.0)
    assert tree.find_matches([1, 2, 3]) == {}
    assert tree.num_nodes == 0 and len(approx) == 0


def test_routing_again_refreshes_the_ttl_of_the_shared_prefix_only():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=120.0)
    approx.record_routing(A, [1, 2, 3], now=0.0)
    approx.record_routing(A, [1, 2], now=100.0)
    approx.expire(150.0)
    assert tree.find_matches([1, 2, 3]) == {A: 2}
    approx.expire(220.0)
    assert tree.find_matches([1, 2, 3]) == {}


def test_pruning_drops_least_recently_routed_blocks_tail_first():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=1e9, max_tree_size=10, prune_target_ratio=0.8)
    approx.record_routing(A, [1, 2, 3, 4], now=0.0)
    approx.record_routing(B, [5, 6, 7, 8], now=1.0)
    assert len(approx) == 8
    approx.record_routing(A, [9, 10, 11], now=2.0)  # 11 entries > 10: prune down to 8
    assert len(approx) == 8
    assert tree.num_blocks() == 8
    # the oldest request lost its tail: A keeps the head of [1, 2, 3, 4], reachable from the root
    assert tree.find_matches([1, 2, 3, 4]) == {A: 1}
    assert tree.find_matches([5, 6, 7, 8]) == {B: 4}
    assert tree.find_matches([9, 10, 11]) == {A: 3}


def test_router_without_kv_events_predicts_from_its_own_decisions():
    clock = FakeClock()
    router = KvRouter(
        RouterConfig(block_size=4, use_kv_events=False),
        clock=clock,
        rng=random.Random(0),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    prompt = list(range(40))
    first = router.best_worker(prompt, request_id="r1")
    router.free("r1")
    second = router.best_worker(prompt, request_id="r2")
    assert second.worker == first.worker and second.overlap_blocks == 10
    router.free("r2")
    clock.advance(121.0)
    third = router.best_worker(prompt)
    assert third.overlap_blocks == 0
    assert router.indexer.find_matches(compute_block_hashes(prompt, 4)) == {}


def test_a_second_routing_stores_only_the_new_suffix_under_the_predicted_prefix():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=120.0)
    approx.record_routing(A, [1, 2, 3], now=0.0)
    stored = tree.stats.stored_blocks
    approx.record_routing(A, [1, 2, 3, 4, 5], now=1.0)
    assert tree.stats.stored_blocks - stored == 2
    assert tree.find_matches([1, 2, 3, 4, 5]) == {A: 5}
    assert len(approx) == 5 and tree.num_blocks(A) == 5


def test_pruning_takes_the_oldest_predictions_over_all_workers():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=1e9, max_tree_size=6, prune_target_ratio=0.5)
    approx.record_routing(A, [1, 2], now=0.0)
    approx.record_routing(B, [3, 4], now=1.0)
    approx.record_routing(A, [5, 6], now=2.0)
    approx.record_routing(B, [7], now=3.0)  # 7 > 6: prune to 3, the oldest first
    assert len(approx) == 3
    assert tree.find_matches([1, 2]) == {} and tree.find_matches([3, 4]) == {}
    assert tree.find_matches([5, 6]) == {A: 2} and tree.find_matches([7]) == {B: 1}


def test_predictions_stay_prefix_closed_under_random_routing_expiry_and_pruning():
    rng = random.Random(7)
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=10.0, max_tree_size=40, prune_target_ratio=0.7)
    paths = [[rng.randrange(4) for _ in range(rng.randrange(1, 9))] for _ in range(30)]
    now = 0.0
    for _ in range(400):
        now += rng.random() * 2
        worker = rng.choice([A, B])
        path = rng.choice(paths)
        approx.record_routing(worker, path, now)
        assert len(approx) <= 40
        # every predicted block is reachable: the tree holds exactly the predictions
        assert tree.num_blocks() == len(approx)
        for w in (A, B):
            for p in paths:
                held = approx.num_blocks(w) and tree.find_matches(p).get(w, 0)
                seq = compute_sequence_hashes(p)
                assert all(s in approx.predictions().get(w, {}) for s in seq[:held])


def test_predicted_ids_never_collide_with_a_real_engine_naming_blocks_by_sequence_hash():
    clock = FakeClock()
    router = KvRouter(RouterConfig(block_size=4, use_kv_events=True), clock=clock, workers=[WorkerSpec("a")])
    worker = Worker("a")
    prompt = list(range(16))
    local = compute_block_hashes(prompt, 4)
    seq = compute_sequence_hashes(local)
    router.best_worker(prompt, request_id="r1")  # predicted: no events yet
    assert router.indexer.find_matches(local) == {worker: 4}
    assert not router.is_event_fed(worker)
    # the engine reports the same blocks under ids equal to their sequence hashes (as the mock does)
    router.apply_event(BlocksStored(worker, tuple(map(StoredBlock, seq[:2], local[:2]))))
    assert router.is_event_fed(worker)
    assert router.indexer.find_matches(local) == {worker: 2}  # predictions withdrawn, real blocks kept
    router.set_event_fed(worker, False)  # the stream went down: predict on top of the real blocks
    router.free("r1")
    router.best_worker(prompt, request_id="r2")
    assert router.indexer.find_matches(local) == {worker: 4}
    clock.advance(121.0)
    router.best_worker(prompt)
    assert router.indexer.find_matches(local) == {worker: 2}  # predictions expired, real blocks stay
    router.reset_worker_cache(worker)
    assert router.indexer.find_matches(local) == {}


def test_event_fed_workers_get_no_predictions_and_others_do():
    router = KvRouter(
        RouterConfig(block_size=4, use_kv_events=True, overlap_score_weight=0.0),
        clock=FakeClock(),
        rng=random.Random(1),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    router.set_event_fed(A, True)
    local = compute_block_hashes(list(range(8)), 4)
    for i in range(4):
        router.best_worker_for_hashes(local, 8, request_id=f"r{i}", pinned_worker=A if i % 2 else B)
    assert router.indexer.find_matches(local) == {B: 2}


def test_without_kv_events_the_event_source_switch_is_ignored():
    router = KvRouter(
        RouterConfig(block_size=4, use_kv_events=False), clock=FakeClock(), workers=[WorkerSpec("a")]
    )
    router.set_event_fed(A, True)
    assert not router.is_event_fed(A)
    router.best_worker(list(range(8)), request_id="r")
    assert router.indexer.find_matches(compute_block_hashes(list(range(8)), 4)) == {A: 2}


def test_dumped_state_holds_the_engines_blocks_not_the_routers_predictions():
    router = KvRouter(
        RouterConfig(block_size=4, use_kv_events=True),
        clock=FakeClock(),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    prompt = list(range(16))
    local = compute_block_hashes(prompt, 4)
    router.apply_event(BlocksStored(A, tuple(StoredBlock(100 + i, h) for i, h in enumerate(local[:3]))))
    router.best_worker(prompt, request_id="r", pinned_worker=B)  # b is predicted
    assert router.indexer.find_matches(local) == {A: 3, B: 4}
    rebuilt = RadixTree()
    for event in router.dump_events():
        rebuilt.apply_event(event)
    assert rebuilt.find_matches(local) == {A: 3}
    assert len(router.dump_events(include_predicted=True)) > len(router.dump_events())


def test_predicted_ids_are_recognised_and_real_ones_are_not():
    for seq_hash in (0, 1, 2**63, 2**64 - 1):
        assert is_predicted_id(predicted_engine_id(seq_hash))
    for engine_hash in (None, 0, 7, 2**64 - 1, -1, -5):  # engines' ids, dump_events' stand-ins
        assert not is_predicted_id(engine_hash)


def test_the_first_predicted_id_is_found_wherever_it_is():
    p = predicted_engine_id(5)
    assert first_predicted([]) == 0
    assert first_predicted([3, -1, 2**64 - 1]) == 3  # none: the length
    assert first_predicted([p]) == 0
    assert first_predicted([3, -1, p, 4, predicted_engine_id(0)]) == 2
    assert first_predicted([3, 4, predicted_engine_id(2**64 - 1)]) == 2
    assert first_predicted([3, predicted_engine_id(0)]) == 1  # the highest predicted id there is


def test_the_defaults_are_dynamos():
    approx = ApproxIndexer(RadixTree())
    assert approx.ttl_s == 120.0 and approx.max_tree_size == 2**20
    assert approx.prune_target_size == int(2**20 * 0.8)


def test_expired_and_pruned_blocks_are_counted_exactly():
    approx = ApproxIndexer(RadixTree(), ttl_s=10.0, max_tree_size=4, prune_target_ratio=0.5)
    assert (approx.expired_blocks, approx.pruned_blocks) == (0, 0)
    approx.record_routing(A, [1, 2, 3], now=0.0)
    approx.record_routing(A, [4, 5], now=1.0)  # 5 > 4: prune to 2
    assert approx.pruned_blocks == 3 and len(approx) == 2
    approx.record_routing(B, [6, 7, 8], now=2.0)  # 5 again: 3 more
    assert approx.pruned_blocks == 6 and len(approx) == 2
    approx.expire(11.9)
    assert approx.expired_blocks == 0
    approx.expire(12.0)  # B's two left (routed at 2 s) passed their TTL
    assert approx.expired_blocks == 2 and len(approx) == 0
    approx.record_routing(A, [9], now=13.0)
    approx.record_routing(A, [10], now=30.0)  # [9] expires on the way
    assert approx.expired_blocks == 3 and len(approx) == 1


def test_blocks_per_worker_and_a_worker_forgotten_or_dropped():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=100.0)
    assert approx.num_blocks(A) == 0
    approx.record_routing(A, [1, 2, 3], now=0.0)
    approx.record_routing(B, [1, 2], now=0.0)
    assert (approx.num_blocks(A), approx.num_blocks(B), len(approx)) == (3, 2, 5)
    approx.remove_worker(A)  # the caller clears the tree
    assert (approx.num_blocks(A), len(approx)) == (0, 2)
    assert tree.find_matches([1, 2, 3]) == {A: 3, B: 2}
    approx.remove_worker(A)
    assert len(approx) == 2
    approx.drop_worker(B)
    assert (approx.num_blocks(B), len(approx)) == (0, 0)
    assert tree.find_matches([1, 2, 3]) == {A: 3}
    approx.drop_worker(B)
    assert len(approx) == 0


def test_a_refreshed_prefix_moves_behind_older_predictions_so_these_still_expire():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=120.0)
    approx.record_routing(A, [1, 2], now=0.0)
    approx.record_routing(A, [7], now=10.0)
    approx.record_routing(A, [1, 2, 3, 4], now=50.0)  # [1, 2] refreshed, [3, 4] new
    approx.expire(135.0)  # [7] (routed at 10 s) is due, the rest (50 s) are not
    assert tree.find_matches([7]) == {}
    assert tree.find_matches([1, 2, 3, 4]) == {A: 4}
    assert approx.num_blocks(A) == 4


def test_routing_a_fully_predicted_path_again_sends_the_tree_nothing():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=120.0)
    approx.record_routing(A, [1, 2, 3], now=0.0)
    events = tree.stats.stored_events
    approx.record_routing(A, [1, 2, 3], now=1.0)
    approx.record_routing(A, [1, 2], now=2.0)
    assert tree.stats.stored_events == events


def test_pruning_may_empty_one_workers_predictions_and_go_on_with_the_next():
    tree = RadixTree()
    approx = ApproxIndexer(tree, ttl_s=1e9, max_tree_size=4, prune_target_ratio=0.5)
    approx.record_routing(A, [1], now=0.0)
    approx.record_routing(B, [2, 3, 4], now=1.0)
    approx.record_routing(B, [5], now=2.0)  # 5 > 4: A's only block, then B's oldest two
    assert (approx.num_blocks(A), approx.num_blocks(B), len(approx)) == (0, 2, 2)
    assert tree.find_matches([1]) == {} and tree.find_matches([5]) == {B: 1}
