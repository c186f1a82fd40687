"""Fleet-sized decisions under the timing model (KvRouter._timed_choice) choose what the full scan chooses.

The oracle is the same router forced to the full scan: both get the same workers, events, requests,
first tokens, frees, learned speeds and clock, and must choose the same worker at the same cost
with the same random draws, over random fleets of more than 32 workers, loads, prompt sizes (one
pass or several) and clock steps (within a pass, past whole streams).
"""

from __future__ import annotations

import random

import pytest

from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.prefill_model import PrefillTiming

from .clock import FakeClock
from .test_fleet_decision import BS, Pair, prompt, store

SMALL = PrefillTiming(max_num_batched_tokens=32, kv_capacity_tokens=2048)  # passes of 8 blocks


def timed_config(rng: random.Random) -> RouterConfig:
    return RouterConfig(
        block_size=BS,
        prefill_load_model="timing",
        prefill_timing=rng.choice([SMALL, PrefillTiming(max_num_batched_tokens=8, kv_capacity_tokens=512)]),
        learn_prefill_timing=rng.random() < 0.6,
        overlap_score_weight=rng.choice([0.0, 1.0, 1.0, 2.0]),
        router_assume_kv_reuse=rng.random() < 0.8,
        router_track_active_blocks=rng.random() < 0.9,
        router_track_output_blocks=rng.random() < 0.3,
        use_kv_events=rng.random() < 0.7,
        active_decode_blocks_threshold=rng.choice([None, None, 0.05, 0.3]),
    )


def long_prompt(rng: random.Random, families: int) -> list[int]:
    tokens = prompt(rng, families)
    if rng.random() < 0.3:
        tokens += [rng.randrange(10**6, 2 * 10**6) for _ in range(rng.randrange(20, 120))]
    return tokens


def run_timed_fleet(seed: int) -> Pair:
    rng = random.Random(seed)
    config = timed_config(rng)
    specs = [
        WorkerSpec(
            f"w{i:03d}", dp_ranks=(0, 1) if rng.random() < 0.2 else (0,), total_blocks=rng.choice([40, 400])
        )
        for i in range(rng.randrange(33, 80))
    ]
    pair = Pair(config, specs, seed)
    families = rng.randrange(2, 8)
    in_flight: list[str] = []
    for step in range(300):
        workers = pair.oracle.workers()
        roll = rng.random()
        if roll < 0.1 and workers:
            store(pair, rng.choice(workers), long_prompt(rng, families))
        elif roll < 0.45:
            rid = f"r{step}"
            pair.decide(
                long_prompt(rng, families), request_id=rid, expected_output_tokens=rng.choice([None, 20])
            )
            if rid in pair.oracle.sequences:
                in_flight.append(rid)
        elif roll < 0.6 and in_flight:
            pair.call("mark_prefill_complete", rng.choice(in_flight))  # a first token: learning too
        elif roll < 0.65 and in_flight:
            pair.call("add_output_tokens", rng.choice(in_flight), rng.randrange(1, 9))
        elif roll < 0.75 and in_flight:
            pair.call("free", in_flight.pop(rng.randrange(len(in_flight))))
        elif roll < 0.76:
            spec = rng.choice(specs)
            if rng.random() < 0.5:
                pair.call("remove_worker", spec.worker_id)
            else:
                pair.call("add_worker", spec)
        else:
            pair.decide(long_prompt(rng, families))  # a probe
        pair.clock.advance(rng.choice([0.0, 0.001, 0.01, 0.05, 0.3]) * rng.random())
    return pair


@pytest.mark.parametrize("seed", range(30))
def test_timed_fast_decisions_match_the_full_scan(seed: int) -> None:
    pair = run_timed_fleet(seed)
    assert pair.visited


def test_a_timed_miss_on_a_large_fleet_visits_few_workers() -> None:
    """Idle workers are one class, loaded ones are bounded away: a miss costs what matters."""
    specs = [WorkerSpec(f"w{i:04d}") for i in range(1024)]
    pair = Pair(RouterConfig(block_size=BS, prefill_load_model="timing", prefill_timing=SMALL), specs, 3)
    rng = random.Random(5)
    for k in range(300):  # a third of the fleet loaded, half of those past their first token
        pair.decide(prompt(rng, 4), request_id=f"load{k}")
        if k % 2:
            pair.call("mark_prefill_complete", f"load{k}")
    pair.clock.advance(5.0)  # every stream done as predicted
    start = len(pair.visited)
    for _ in range(30):
        pair.decide([rng.randrange(10**7, 2 * 10**7) for _ in range(rng.randrange(1, 200))])  # misses
    assert max(pair.visited[start:]) < 10
    chosen = {pair.fast.best_worker([7, 7, 7, 7, 9]).worker for _ in range(200)}
    assert len(chosen) > 50  # ties within a class are drawn over all of its workers


def test_a_clock_that_goes_back_takes_the_full_scan() -> None:
    clock = FakeClock(10.0)
    router = KvRouter(
        RouterConfig(block_size=BS, prefill_load_model="timing"),
        clock=clock,
        rng=random.Random(1),
        workers=[WorkerSpec(i) for i in range(40)],
    )
    router.full_scan_max_workers = 0
    router.best_worker(list(range(40)), request_id="a")
    clock.now = 9.0
    assert len(router.best_worker(list(range(40))).costs) == 40
