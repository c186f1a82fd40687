"""Fleet-sized decisions (KvRouter._fast_choice, router/load_order.py) choose what the full scan chooses.

The oracle is the same router forced to the full scan (the algorithm every decision took before):
both get the same workers, events, requests and rng seed, and must make the same choices with the
same costs and draw the same random numbers, over random fleets, loads, prompts and thresholds,
for both prefill load models (the timing model's own fast path, `_timed_choice`, is checked the
same way in test_fleet_decision_timing.py).
"""

from __future__ import annotations

import random

import pytest

from extproc.router import (
    AllWorkersBusy,
    BlocksStored,
    KvRouter,
    RouterConfig,
    RouterConfigOverride,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
)
from extproc.router.load_order import LoadOrder

from .clock import FakeClock

BS = 4


class Pair:
    """A fast router and its full-scan oracle, driven alike."""

    def __init__(self, config: RouterConfig, specs: list[WorkerSpec], seed: int) -> None:
        self.clock = FakeClock(100.0)
        self.fast = KvRouter(config, clock=self.clock, rng=random.Random(seed), workers=specs)
        self.oracle = KvRouter(config, clock=self.clock, rng=random.Random(seed), workers=specs)
        self.fast.full_scan_max_workers = 0
        self.oracle.full_scan_max_workers = 10**9
        self.both = (self.fast, self.oracle)
        self.visited: list[int] = []  # costs evaluated by fast decisions

    def call(self, name: str, *args: object, **kwargs: object) -> object:
        results = [getattr(r, name)(*args, **kwargs) for r in self.both]
        assert results[0] == results[1], name
        return results[0]

    def decide(self, tokens: list[int], **kwargs: object) -> None:
        outcomes = []
        for router in self.both:
            try:
                outcomes.append(router.best_worker(tokens, **kwargs))  # type: ignore[arg-type]
            except AllWorkersBusy as e:
                outcomes.append(str(e))  # type: ignore[arg-type]
        fast, oracle = outcomes
        if isinstance(oracle, str) or isinstance(fast, str):
            assert fast == oracle
            return
        assert (fast.worker, fast.cost) == (oracle.worker, oracle.cost)
        assert fast.overlap_blocks == oracle.overlap_blocks
        assert fast.best_overlap_blocks == oracle.best_overlap_blocks
        every = {c.worker: c for c in oracle.costs}
        assert all(every[c.worker] == c for c in fast.costs)  # the same cost lines, fewer of them
        assert fast.worker in {c.worker for c in fast.costs}
        self.visited.append(len(fast.costs))
        assert self.fast._rng.getstate() == self.oracle._rng.getstate()  # the same draws


def prompt(rng: random.Random, families: int) -> list[int]:
    """A prefix family (shared blocks), then a random continuation: hits, partial hits, misses."""
    family = rng.randrange(families)
    head = [family * 1000 + i for i in range(rng.randrange(0, 12) * BS)]
    tail = [rng.randrange(10**6, 2 * 10**6) for _ in range(rng.randrange(1, 3 * BS))]
    return head + tail


def store(pair: Pair, worker: Worker, tokens: list[int]) -> None:
    hashes = compute_block_hashes(tokens, BS)
    if hashes:
        pair.call("apply_event", BlocksStored(worker, tuple(StoredBlock(h ^ 0x5A5A, h) for h in hashes)))


def random_config(rng: random.Random, model: str) -> RouterConfig:
    thresholds: dict[str, object] = {}
    if rng.random() < 0.5:
        thresholds["active_decode_blocks_threshold"] = rng.choice([0.05, 0.2, 0.5])
    if rng.random() < 0.5:
        thresholds["active_prefill_tokens_threshold"] = rng.choice([8, 40, 200])
    if rng.random() < 0.3:
        thresholds["active_prefill_tokens_threshold_frac"] = rng.choice([0.01, 0.1])
    return RouterConfig(
        block_size=BS,
        prefill_load_model=model,
        overlap_score_weight=rng.choice([0.0, 0.5, 1.0, 1.0, 2.0]),
        router_assume_kv_reuse=rng.random() < 0.8,
        router_track_active_blocks=rng.random() < 0.9,
        router_track_prefill_tokens=rng.random() < 0.9,
        router_track_output_blocks=rng.random() < 0.3,
        use_kv_events=rng.random() < 0.7,
        **thresholds,  # type: ignore[arg-type]
    )


def run_fleet(seed: int, model: str) -> Pair:
    rng = random.Random(seed)
    config = random_config(rng, model)
    specs = [
        WorkerSpec(
            f"w{i:03d}" if rng.random() < 0.8 else i,
            dp_ranks=(0, 1) if rng.random() < 0.2 else (0,),
            total_blocks=rng.choice([40, 200, 1000]),
            max_num_batched_tokens=rng.choice([64, 512]),
        )
        for i in range(rng.randrange(33, 90))
    ]
    pair = Pair(config, specs, seed)
    families = rng.randrange(2, 8)
    in_flight: list[str] = []
    for step in range(250):
        workers = pair.oracle.workers()
        roll = rng.random()
        if roll < 0.15 and workers:
            store(pair, rng.choice(workers), prompt(rng, families))
        elif roll < 0.45:
            rid = f"r{step}"
            tokens = prompt(rng, families)
            pair.decide(tokens, request_id=rid, expected_output_tokens=rng.choice([None, 20]))
            if rid in pair.oracle.sequences:
                in_flight.append(rid)
        elif roll < 0.55 and in_flight:
            pair.call("mark_prefill_complete", rng.choice(in_flight))
        elif roll < 0.62 and in_flight:
            pair.call("add_output_tokens", rng.choice(in_flight), rng.randrange(1, 9))
        elif roll < 0.72 and in_flight:
            pair.call("free", in_flight.pop(rng.randrange(len(in_flight))))
        elif roll < 0.74:
            spec = rng.choice(specs)
            if rng.random() < 0.5:
                pair.call("remove_worker", spec.worker_id)
            else:
                pair.call("add_worker", spec)
        elif roll < 0.75:
            value = rng.choice([None, 10, 100])
            pair.call("set_thresholds", active_prefill_tokens_threshold=value)
        elif roll < 0.78:
            weight = rng.choice([None, 0.0, 3.0])
            override = RouterConfigOverride(overlap_score_weight=weight)
            pair.decide(prompt(rng, families), config_override=override)
        else:
            pair.decide(prompt(rng, families))  # a probe
        pair.clock.advance(rng.random() * 0.05)
    return pair


@pytest.mark.parametrize("seed", range(40))
def test_fast_decisions_match_the_full_scan_dynamo_cost(seed: int) -> None:
    pair = run_fleet(seed, "none")
    assert pair.visited  # decisions were compared


@pytest.mark.parametrize("seed", range(6))
def test_timing_model_decisions_match_the_full_scan(seed: int) -> None:
    pair = run_fleet(1000 + seed, "timing")
    assert pair.visited


def test_a_miss_on_a_large_idle_fleet_visits_few_workers() -> None:
    specs = [WorkerSpec(f"w{i:04d}") for i in range(1024)]
    pair = Pair(RouterConfig(block_size=BS, prefill_load_model="none"), specs, 3)
    rng = random.Random(5)
    for k in range(64):
        pair.decide(prompt(rng, 4), request_id=f"load{k}")
    for _ in range(50):
        pair.decide(prompt(rng, 4))
    assert max(pair.visited[64:]) < 100  # not the fleet: the matching, one idle worker, the best loaded
    chosen = {pair.fast.best_worker([7, 7, 7, 7, 9]).worker for _ in range(200)}
    assert len(chosen) > 50  # ties among idle workers are still drawn over all of them


def test_load_order_index_of_idle_ties_matches_a_merge() -> None:
    rng = random.Random(1)
    workers = [Worker(i) for i in range(200)]
    for _ in range(50):
        order = LoadOrder(workers)
        for r in rng.sample(range(200), 120):
            if rng.random() < 0.5:
                order.set_key(r, float(rng.randrange(5)))
            else:
                order.set_busy(r)
        for r in rng.sample(range(200), 30):
            order.set_idle(r)
        idle = list(order.idle)
        excluded = sorted(rng.sample(idle, min(len(idle), 5)))
        extra = sorted(set(rng.sample(range(200), 8)) - (set(idle) - set(excluded)))
        merged = sorted((set(idle) - set(excluded)) | set(extra))
        assert [order.idle_rank_at(i, excluded, extra) for i in range(len(merged))] == merged
        assert sorted(order.keyed) == order.keyed and len(order) == len(idle) + len(order.keyed)
