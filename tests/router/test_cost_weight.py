"""`--router-kv-overlap-score-weight 0` means load balancing (Dynamo: "pure load balancing, no
indexer lookups") under either prefill load model, never a random pick."""

from __future__ import annotations

import random

import pytest

from extproc.router import KvRouter, RouterConfig, Worker, WorkerSpec

from .clock import FakeClock

BS = 16


def router(model: str, seed: int) -> KvRouter:
    return KvRouter(
        RouterConfig(block_size=BS, overlap_score_weight=0.0, prefill_load_model=model),
        clock=FakeClock(),
        rng=random.Random(seed),
        workers=[WorkerSpec("a"), WorkerSpec("b"), WorkerSpec("c")],
    )


@pytest.mark.parametrize("model", ["none", "timing"])
def test_weight_zero_spreads_requests_over_the_least_loaded_workers(model):
    for seed in range(20):
        r = router(model, seed)
        chosen = [
            r.best_worker(list(range(i * 1000, i * 1000 + 256)), request_id=f"r{i}").worker for i in range(3)
        ]
        # three requests of the same size, none finished: each goes to a worker without one
        assert sorted(str(w.worker_id) for w in chosen) == ["a", "b", "c"], (model, seed, chosen)


@pytest.mark.parametrize("model", ["none", "timing"])
def test_weight_zero_never_picks_the_busy_worker_over_an_idle_one(model):
    for seed in range(20):
        r = router(model, seed)
        r.best_worker(list(range(4096)), request_id="long", pinned_worker=Worker("a"))
        r.best_worker(list(range(5000, 9096)), request_id="long-b", pinned_worker=Worker("b"))
        assert r.best_worker(list(range(10_000, 10_064)), request_id="new").worker == Worker("c")
