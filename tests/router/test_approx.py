"""Approximate indexer: predictions from decisions, TTL expiry and LRU pruning, on a fake clock."""

import random

from extproc.router import KvRouter, RadixTree, RouterConfig, Worker, WorkerSpec, compute_block_hashes
from extproc.router.approx import ApproxIndexer

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
