"""Fleet-sized decisions (KvRouter._fast_choice, _timed_choice) against the full scan where mutation
testing found them unpinned (issue 19): pass-time models with zero or small parts, busy thresholds
changed at run time, and how few workers a decision visits."""

from __future__ import annotations

import logging
import random

import pytest

from extproc.router import (
    BlocksStored,
    KvRouter,
    RouterConfig,
    RouterConfigOverride,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
)
from extproc.router.config import PrefillLoadModel
from extproc.router.prefill_model import PrefillTiming
from extproc.router.router import FULL_SCAN_MAX_WORKERS

from .clock import FakeClock
from .test_fleet_decision import BS, Pair, prompt, store

SMALL = {"max_num_batched_tokens": 32, "kv_capacity_tokens": 2048}
TIMINGS = {
    "no quadratic part": PrefillTiming(prefill_quadratic_ms=0.0, **SMALL),
    "no constant part": PrefillTiming(prefill_constant_ms=0.0, **SMALL),
    "every part below 1 ms": PrefillTiming(prefill_constant_ms=0.5, **SMALL),
}


def drive(pair: Pair, rng: random.Random, steps: int, *, learn: bool = True) -> None:
    """Requests, first tokens, frees and probes over a few prompt families, the clock moving."""
    in_flight: list[str] = []
    for step in range(steps):
        roll = rng.random()
        if roll < 0.45:
            rid = f"r{step}"
            tokens = prompt(rng, 4) + [rng.randrange(10**6) for _ in range(rng.choice([0, 0, 40]))]
            pair.decide(tokens, request_id=rid)
            if rid in pair.oracle.sequences:
                in_flight.append(rid)
        elif roll < 0.65 and in_flight:
            pair.call("mark_prefill_complete", rng.choice(in_flight))
        elif roll < 0.8 and in_flight:
            pair.call("free", in_flight.pop(rng.randrange(len(in_flight))))
        else:
            pair.decide(prompt(rng, 4))
        pair.clock.advance(rng.choice([0.0, 0.002, 0.02, 0.2]) * rng.random())


@pytest.mark.parametrize("name", sorted(TIMINGS))
@pytest.mark.parametrize("seed", range(3))
def test_timed_fast_decisions_match_the_full_scan_for_unusual_pass_time_models(name: str, seed: int) -> None:
    rng = random.Random(seed)
    config = RouterConfig(
        block_size=BS,
        prefill_load_model=PrefillLoadModel.TIMING,
        prefill_timing=TIMINGS[name],
        learn_prefill_timing=seed != 0,
    )
    pair = Pair(config, [WorkerSpec(f"w{i:03d}", total_blocks=200) for i in range(40)], seed)
    drive(pair, rng, 150)
    assert len(pair.visited) > 50


@pytest.mark.parametrize("name", sorted(TIMINGS))
def test_a_timed_miss_visits_few_workers_whatever_the_parts_of_the_pass_time(name: str) -> None:
    """Loaded workers are bounded away by their prefill scale (a part of the configured model that
    is 0 bounds nothing, so the other parts' ratio is the scale)."""
    specs = [WorkerSpec(f"w{i:03d}") for i in range(60)]
    config = RouterConfig(
        block_size=BS, prefill_load_model=PrefillLoadModel.TIMING, prefill_timing=TIMINGS[name]
    )
    pair = Pair(config, specs, 3)
    rng = random.Random(5)
    for k in range(40):
        pair.decide(prompt(rng, 4), request_id=f"load{k}")
        pair.call("mark_prefill_complete", f"load{k}")  # decoding from now on: every pass costs more
    start = len(pair.visited)
    for _ in range(10):
        pair.decide([rng.randrange(10**7, 2 * 10**7) for _ in range(rng.randrange(40, 200))])  # misses
    assert max(pair.visited[start:]) < 10


@pytest.mark.parametrize("model", [PrefillLoadModel.NONE, PrefillLoadModel.TIMING])
def test_busy_thresholds_changed_at_run_time_reach_the_fleet_sized_decision(model: PrefillLoadModel) -> None:
    """The best worker for a prompt (it caches it) becomes busy by a threshold set after the load
    order was built: both decisions must leave it."""
    specs = [WorkerSpec(f"w{i:03d}", total_blocks=800) for i in range(40)]
    pair = Pair(RouterConfig(block_size=BS, prefill_load_model=model), specs, 1)
    tokens = list(range(500 * BS))  # long: its cached prefill outweighs a decoding request
    pair.decide(tokens, request_id="r", pinned_worker="w007")
    pair.call("mark_prefill_complete", "r")
    pair.clock.advance(1.0)

    def chosen() -> set[str]:
        return {str(router.best_worker(tokens).worker.worker_id) for router in pair.both}

    pair.decide(tokens)  # the load order is built; w007 caches the prompt and is not busy
    assert chosen() == {"w007"}
    pair.call("set_thresholds", active_decode_blocks_threshold=0.5)  # 500 of 800 blocks: busy
    pair.decide(tokens)
    assert "w007" not in chosen()
    pair.call("set_thresholds", active_decode_blocks_threshold=None)
    pair.decide(tokens)
    assert chosen() == {"w007"}


def test_a_timed_miss_skips_workers_whose_prompt_stream_runs_past_the_best_cost() -> None:
    """Workers still prefilling long prompts are bounded away by the end of their stream, without
    computing their cost (their load-only key alone cannot tell them from idle workers)."""
    timing = PrefillTiming(max_num_batched_tokens=32, kv_capacity_tokens=2048)
    config = RouterConfig(block_size=BS, prefill_load_model=PrefillLoadModel.TIMING, prefill_timing=timing)
    pair = Pair(config, [WorkerSpec(f"w{i:03d}") for i in range(40)], 2)
    rng = random.Random(3)
    for k in range(20):  # 20 workers take a prompt of 25 passes each
        pair.decide([rng.randrange(10**6) for _ in range(800)], request_id=f"long{k}")
    start = len(pair.visited)
    for _ in range(10):
        pair.decide([rng.randrange(10**7, 2 * 10**7) for _ in range(rng.randrange(4, 40))])  # misses
        pair.clock.advance(0.001)
    assert max(pair.visited[start:]) <= 2


def idle_fleet(count: int, **config: object) -> KvRouter:
    return KvRouter(
        RouterConfig(block_size=BS, prefill_load_model=PrefillLoadModel.NONE, **config),  # type: ignore[arg-type]
        clock=FakeClock(1.0),
        rng=random.Random(4),
        workers=[WorkerSpec(f"w{i:03d}", device="cpu" if i % 4 == 0 else "cuda") for i in range(count)],
    )


def test_the_full_scan_decides_up_to_its_size_and_the_fleet_path_past_it() -> None:
    tokens = list(range(3 * BS))
    assert len(idle_fleet(FULL_SCAN_MAX_WORKERS).best_worker(tokens).costs) == FULL_SCAN_MAX_WORKERS
    assert len(idle_fleet(FULL_SCAN_MAX_WORKERS + 1).best_worker(tokens).costs) == 1  # one idle worker


@pytest.mark.parametrize(
    "how",
    [
        "pinned",
        "preferred",
        "allowed",
        "temperature",
        "weight",
        "device-aware",
        "formula",
        "debug",
        "reports",
    ],
)
def test_decisions_the_fleet_path_cannot_make_take_the_full_scan(how: str, caplog) -> None:
    """Each of these changes the candidates, the costs or the draw: every worker is costed."""
    n = FULL_SCAN_MAX_WORKERS + 8
    config: dict[str, object] = {
        "device-aware": {"mode": "device-aware-weighted"},
        "formula": {"log_formula": True},
        "reports": {"active_decode_blocks_threshold": 0.9},
    }.get(how, {})
    router = idle_fleet(n, **config)
    kwargs: dict[str, object] = {
        "pinned": {"pinned_worker": "w005"},
        "preferred": {"preferred_worker": "w005"},
        "allowed": {"allowed_workers": [f"w{i:03d}" for i in range(n - 1)]},
        "temperature": {"config_override": RouterConfigOverride(temperature=0.5)},
        "weight": {"config_override": RouterConfigOverride(overlap_score_weight=2.0)},
    }.get(how, {})
    if how == "debug":
        caplog.set_level(logging.DEBUG, logger="extproc.router")
    if how == "reports":
        router.set_reported_load(Worker("w001"), kv_usage=0.1, max_age_s=60.0)
    decision = router.best_worker(list(range(3 * BS)), **kwargs)  # type: ignore[arg-type]
    if how in ("pinned", "preferred"):
        assert decision.worker == Worker("w005") and len(decision.costs) == 1  # chosen without comparing
    elif how == "device-aware":
        cpus = len(range(0, n, 4))  # idle_fleet: every fourth worker is a CPU
        assert len(decision.costs) in (cpus, n - cpus)  # one device class, all of it
    else:
        assert len(decision.costs) == (n - 1 if how == "allowed" else n)


def test_engine_reports_alone_or_a_decode_threshold_alone_keep_the_fleet_path() -> None:
    """Only both together make busy states follow the reports' age, which the load order does not see."""
    tokens = list(range(3 * BS))
    with_reports = idle_fleet(FULL_SCAN_MAX_WORKERS + 8)
    with_reports.set_reported_load(Worker("w001"), kv_usage=0.1, max_age_s=60.0)
    assert len(with_reports.best_worker(tokens).costs) == 1
    with_threshold = idle_fleet(FULL_SCAN_MAX_WORKERS + 8, active_decode_blocks_threshold=0.9)
    assert len(with_threshold.best_worker(tokens).costs) == 1


def test_a_full_scan_after_thresholds_changed_and_loads_moved_reports_the_best_overlap() -> None:
    """The load order is dropped when the config changes; a decision the full scan makes before the
    next fleet-sized one still reads the registered workers' overlaps."""
    router = idle_fleet(FULL_SCAN_MAX_WORKERS + 8)
    tokens = list(range(4 * BS))
    router.best_worker(tokens, request_id="a", pinned_worker="w003")  # w003 is predicted to cache it
    router.mark_prefill_complete("a")
    router.best_worker(list(range(100, 108)), request_id="b")  # the fleet path builds its order
    router.set_thresholds(active_prefill_tokens_threshold=1000)
    router.free("b")  # a load change while the order waits to be rebuilt
    decision = router.best_worker(tokens, pinned_worker="w010")
    assert decision.worker == Worker("w010") and decision.best_overlap_blocks == 4
    assert router.best_worker(tokens).worker == Worker("w003")


@pytest.mark.parametrize("weight", [1.0, 0.5])
def test_a_miss_on_a_loaded_fleet_costs_only_the_least_loaded_workers(weight: float) -> None:
    """No worker is idle and the loads differ but for the two least loaded: a worker that caches
    nothing of the prompt costs its load plus what every such worker pays for the prompt, so the
    load order stops after those two, which tie; a worker caching the prompt under a heavy load is
    costed apart and does not stop the order early."""
    n = FULL_SCAN_MAX_WORKERS + 8
    router = idle_fleet(n, overlap_score_weight=weight)
    for i in range(n):
        rid, blocks = f"load{i}", max(i, 1)  # w000 and w001 hold one block each
        tokens = [10**6 * (i + 1) + t for t in range(blocks * BS)]
        router.best_worker(tokens, request_id=rid, pinned_worker=f"w{i:03d}")
        router.mark_prefill_complete(rid)
    least = [Worker("w000"), Worker("w001")]
    for size in (1, BS, 5 * BS + 2):
        decision = router.best_worker([7 * 10**8 + t for t in range(size)])  # a miss
        assert decision.worker in least
        assert [c.worker for c in decision.costs] == least
    assert {router.best_worker([7 * 10**8 + t for t in range(BS)]).worker for _ in range(30)} == set(least)
    prompt = [8 * 10**8 + t for t in range(5 * BS)]
    router.best_worker(prompt, request_id="cached", pinned_worker=f"w{n - 1:03d}")  # cached there, loaded
    router.mark_prefill_complete("cached")
    decision = router.best_worker(prompt)
    assert decision.worker in least and decision.best_overlap_blocks == 5
    assert [c.worker for c in decision.costs] == [*least, Worker(f"w{n - 1:03d}")]


def test_a_worker_holding_the_prompt_in_flight_is_costed_apart_though_nothing_caches_it() -> None:
    """An event-fed worker running the same prompt shares its active blocks (no new ones): it costs
    less than its load-only key says, so the fleet path must cost it like a matching worker."""
    n = FULL_SCAN_MAX_WORKERS + 8
    router = idle_fleet(n, use_kv_events=True)
    h = n // 2
    holder = Worker(f"w{h:03d}")
    router.set_event_fed(holder, True)  # no predictions: the index does not know what it holds
    prompt = list(range(5 * BS))
    for i in range(n):
        rid = f"load{i}"
        tokens = prompt if i == h else [10**6 * (i + 1) + t for t in range((i % 3 + 1) * BS)]
        router.best_worker(tokens, request_id=rid, pinned_worker=f"w{i:03d}")
        router.mark_prefill_complete(rid)
    assert router.find_matches(router.block_hashes(prompt)) == {}
    decision = router.best_worker(prompt)
    assert decision.worker == holder and holder in {c.worker for c in decision.costs}


@pytest.mark.parametrize("seed", range(3))
def test_a_long_prompt_goes_where_the_prompt_streams_end_first_as_the_full_scan_says(seed: int) -> None:
    """Every worker is still prefilling a prompt of its own, of different lengths, on a pass-time
    model that is all linear: where a new prompt goes depends on when each stream ends and on what
    its tokens add, the stream bound's marginal time per token (doubled, it skipped the best)."""
    rng = random.Random(seed)
    linear = {"prefill_quadratic_ms": 0.0, "prefill_linear_ms": 1.0, "prefill_constant_ms": 0.0}
    timing = PrefillTiming(**linear, max_num_batched_tokens=32, kv_capacity_tokens=4096)  # type: ignore[arg-type]
    config = RouterConfig(block_size=BS, prefill_load_model=PrefillLoadModel.TIMING, prefill_timing=timing)
    pair = Pair(config, [WorkerSpec(f"w{i:03d}") for i in range(40)], seed)
    for k in range(40):  # every worker takes a prompt of 1 to 40 passes
        length = rng.randrange(32, 40 * 32)
        pair.decide([rng.randrange(10**6) for _ in range(length)], request_id=f"long{k}")
    for _ in range(30):
        pair.decide([rng.randrange(10**7, 2 * 10**7) for _ in range(rng.randrange(4, 600))])
        pair.clock.advance(rng.choice([0.0, 0.001, 0.01]))
    pair.decide([])  # an empty prompt (the Python API allows it): no tokens for the stream bound


def test_an_idle_fleet_that_all_caches_the_prompt_is_decided_among_its_matching_workers() -> None:
    """Every idle worker holds the prompt's first blocks: the one idle class has no member left to
    stand for it (all were costed as matching), and the decision is the full scan's."""
    timing = PrefillTiming(max_num_batched_tokens=32, kv_capacity_tokens=2048)
    config = RouterConfig(block_size=BS, prefill_load_model=PrefillLoadModel.TIMING, prefill_timing=timing)
    specs = [WorkerSpec(f"w{i:03d}") for i in range(40)]
    pair = Pair(config, specs, 4)
    rng = random.Random(4)
    head = list(range(7000, 7000 + 2 * BS))
    for i, spec in enumerate(specs):
        store(pair, Worker(spec.worker_id), head + [8000 + i] * BS)  # the head, then a block of its own
    for k in range(12):
        pair.decide(head + [rng.randrange(10**6, 2 * 10**6) for _ in range(rng.randrange(1, 3 * BS))])
        pair.decide(head[: BS * (k % 2 + 1)], request_id=f"r{k}")  # some take load: keyed, not idle


def test_the_best_overlap_among_allowed_workers_is_theirs_in_a_large_fleet() -> None:
    """Past 32 workers the load order exists (an earlier decision built it): a decision filtered to
    some workers still reports the best overlap among them, not the fleet's."""
    specs = [WorkerSpec(f"w{i:03d}") for i in range(40)]
    router = KvRouter(RouterConfig(block_size=BS), clock=FakeClock(100.0), workers=specs)
    tokens = list(range(9000, 9000 + 4 * BS))
    hashes = compute_block_hashes(tokens, BS)
    router.apply_event(
        BlocksStored(Worker("w001"), tuple(StoredBlock(100 + i, h) for i, h in enumerate(hashes)))
    )
    router.apply_event(BlocksStored(Worker("w002"), (StoredBlock(200, hashes[0]),)))
    assert router.best_worker(tokens).best_overlap_blocks == 4  # unfiltered: builds the load order
    only = router.best_worker(tokens, allowed_workers=["w002", "w003"])
    assert (only.worker, only.overlap_blocks, only.best_overlap_blocks) == (Worker("w002"), 1, 1)
