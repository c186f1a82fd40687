"""device-aware-weighted: the class share (Dynamo's in-flight budget), then the kv rules within a class.

The pool of most tests: two accelerator workers (g0, g1) and two CPU workers (c0, c1). A CPU class
takes a request only if its in-flight requests per worker stay within 1/ratio of the accelerators'
after taking it, so with ratio 8 and N requests in flight the CPU class holds exactly N // 9 of them.
"""

import math
import random
from collections import Counter
from dataclasses import replace

import pytest

from extproc.config import load_config
from extproc.picker.pipeline import EndpointPicker
from extproc.router import (
    BlocksStored,
    KvRouter,
    RouterConfig,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
)
from extproc.router.device_share import class_shares, cpu_takes_next, device_class, device_class_candidates

from .clock import FakeClock

BS = 16
G0, G1, C0, C1 = Worker("g0"), Worker("g1"), Worker("c0"), Worker("c1")
ACCEL, CPU = {"g0", "g1"}, {"c0", "c1"}
PROMPT = list(range(1000, 1128))  # 8 full blocks


def make_router(
    *, ratio: float = 8.0, seed: int = 7, specs: list[WorkerSpec] | None = None, **config
) -> KvRouter:
    config.setdefault("block_size", BS)
    config.setdefault("mode", "device-aware-weighted")
    specs = specs or [
        WorkerSpec("g0"),
        WorkerSpec("g1"),
        WorkerSpec("c0", device="cpu"),
        WorkerSpec("c1", device="cpu"),
    ]
    return KvRouter(
        RouterConfig(cuda_to_cpu_ratio=ratio, **config),
        clock=FakeClock(),
        rng=random.Random(seed),
        workers=specs,
    )


def prompt(rng: random.Random, length: int = 64) -> list[int]:
    return [rng.randrange(1, 50_000) for _ in range(length)]


def route_held(router: KvRouter, count: int, *, seed: int = 1, start: int = 0) -> Counter:
    """`count` requests with fresh prompts that stay in flight; the number each worker took."""
    rng = random.Random(seed)
    taken = Counter()
    for i in range(start, start + count):
        taken[router.best_worker(prompt(rng), request_id=f"r{i}").worker_id] += 1
    return taken


def in_flight(router: KvRouter, ids: set[str]) -> int:
    return sum(router.sequences.num_requests(w) for w in router.workers() if w.worker_id in ids)


def cache(router: KvRouter, worker: Worker, tokens: list[int]) -> None:
    hashes = compute_block_hashes(tokens, BS)
    router.apply_event(BlocksStored(worker, tuple(StoredBlock(h ^ 0xABC, h) for h in hashes)))


# --- the share rule ------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [1, 2, 3, 8, 10])
def test_the_cpu_budget_is_dynamos_integer_rule(ratio):
    # push_router.rs: allowed = accel_in_flight * cpu_count / (ratio * accel_count) in integers;
    # the CPU class takes the request if cpu_in_flight < allowed
    for cpu_count in range(1, 4):
        for accel_count in range(1, 4):
            for accel_load in range(0, 60):
                for cpu_load in range(0, 12):
                    allowed = accel_load * cpu_count // (ratio * accel_count)
                    assert cpu_takes_next(cpu_load, cpu_count, accel_load, accel_count, float(ratio)) == (
                        cpu_load < allowed
                    ), (cpu_load, cpu_count, accel_load, accel_count)


def test_a_fractional_ratio_keeps_exact_ties():
    # 10 accelerators at ratio 0.1 weigh as 1 cpu: 3 cpu requests for 3 accelerator requests is a tie,
    # although (2 + 1) * 0.1 * 10 is 3.0000000000000004 in binary floating point
    assert cpu_takes_next(2, 1, 3, 10, 0.1)
    assert not cpu_takes_next(3, 1, 3, 10, 0.1)


@pytest.mark.parametrize("ratio", [1e-12, 1e-9, 0.5, 8.0])
def test_with_idle_accelerators_the_cpus_never_take_a_request_whatever_the_ratio(ratio):
    for cpu_workers in (1, 4):
        assert not cpu_takes_next(0, cpu_workers, 0, 1, ratio)


def test_every_device_but_cpu_is_an_accelerator():
    assert [device_class(d) for d in ("cpu", "cuda", "xpu", "")] == ["cpu", "cuda", "cuda", "cuda"]


def test_one_class_alone_keeps_every_worker():
    for device in ("cpu", "cuda"):
        devices = {"a": device, "b": device}
        kept = device_class_candidates(["a", "b"], device_of=devices.get, in_flight=lambda _: 5, ratio=8)
        assert kept == ["a", "b"]


def test_class_shares_under_sustained_load():
    assert class_shares(2, 2, 8) == pytest.approx({"cuda": 16 / 18, "cpu": 2 / 18})
    assert class_shares(1, 4, 2) == pytest.approx({"cuda": 2 / 6, "cpu": 4 / 6})
    assert class_shares(0, 1, 8) == {"cuda": 0.0, "cpu": 1.0}
    assert class_shares(1, 0, 8) == {"cuda": 1.0, "cpu": 0.0}
    assert class_shares(0, 0, 8) == {"cuda": 0.0, "cpu": 0.0}


@pytest.mark.parametrize(("ratio", "cpu_load"), [(0.1, 99_998), (0.2, 12_345), (0.2, 99_998)])
def test_a_fractional_ratio_keeps_ties_at_large_counts(ratio, cpu_load):
    # the rounding error grows with the counts: (99,998 + 1) * 0.1 * 10 is 99999.00000000001, still
    # a tie with 99,999 accelerator requests; one cpu request more is not
    accel_load = round((cpu_load + 1) * ratio * 10)
    assert cpu_takes_next(cpu_load, 1, accel_load, 10, ratio)
    assert not cpu_takes_next(cpu_load + 1, 1, accel_load, 10, ratio)


# --- the router in this mode -----------------------------------------------------------------------


def test_an_idle_pool_goes_to_the_accelerators():
    router = make_router()
    for _ in range(5):
        assert router.best_worker(PROMPT).worker_id in ACCEL  # probes: nothing is tracked


def test_a_saturated_run_splits_8_to_1_per_worker():
    router = make_router()
    taken = route_held(router, 2000)
    # the CPU class holds 2000 // 9 = 222 requests; within each class the kv rules balance the load
    assert taken == {"g0": 889, "g1": 889, "c0": 111, "c1": 111}


def test_a_long_run_with_completions_splits_8_to_1_per_worker():
    """2,000 requests, 90 in flight, a random in-flight request (of either class) ending before each
    new one arrives. The router keeps the in-flight split exact at every step: the CPU class holds
    N // 9 of N requests, 5 per CPU worker against 40 per accelerator at full concurrency. The
    counts of requests taken then differ from 8:1 only by which class's requests happened to end:
    each of the K = 1,910 completions is a CPU request with probability q = 1/9, so the CPU class
    takes 10 + Binomial(K, q) requests (mean 222.2, sigma 13.7). Bound: 3 sigma."""
    n, concurrency, seed = 2000, 90, 20240611
    router, rng = make_router(seed=seed), random.Random(seed)
    live: list[str] = []
    taken = Counter()
    for i in range(n):
        if len(live) == concurrency:
            assert router.free(live.pop(rng.randrange(len(live))))
        taken[router.best_worker(prompt(rng), request_id=f"r{i}").worker_id] += 1
        live.append(f"r{i}")
        total = len(live)
        assert in_flight(router, CPU) == total // 9, f"step {i}"
    assert [router.sequences.num_requests(w) for w in (G0, G1, C0, C1)] == [40, 40, 5, 5]

    completions, q = n - concurrency, 1 / 9
    sigma = math.sqrt(completions * q * (1 - q))
    cpu = taken["c0"] + taken["c1"]
    assert abs(cpu - (10 + completions * q)) <= 3 * sigma, taken
    per_worker = ((n - cpu) / 2) / (cpu / 2)
    assert 6.6 <= per_worker <= 10.0  # 8:1 within the 3-sigma bound of the CPU count
    assert abs(taken["c0"] - taken["c1"]) <= 3 * math.sqrt(cpu / 2) + 1  # within a class: balanced


@pytest.mark.parametrize(("ratio", "cpu_class"), [(1.0, 450), (2.0, 300), (4.0, 180), (0.5, 600)])
def test_the_ratio_sets_the_split(ratio, cpu_class):
    taken = route_held(make_router(ratio=ratio), 900)
    assert taken["c0"] + taken["c1"] == cpu_class  # 900 / (1 + ratio): one accelerator = `ratio` cpus
    per_worker = (taken["g0"] + taken["g1"]) / (taken["c0"] + taken["c1"])
    assert per_worker == pytest.approx(ratio)


def test_a_changed_ratio_applies_from_the_next_decision():
    router = make_router(ratio=8.0)
    route_held(router, 90)
    assert in_flight(router, CPU) == 10
    router.config = replace(router.config, cuda_to_cpu_ratio=2.0)  # no share state to reset
    taken = route_held(router, 30, seed=2, start=90)
    assert taken["c0"] + taken["c1"] == 30  # catching up to 80 / 2 = 40 in flight
    assert in_flight(router, CPU) == 40
    taken = route_held(router, 30, seed=3, start=120)
    assert taken["c0"] + taken["c1"] == 10  # then 1 in 3, as 2:1 per worker says


def busy_router(busy: set[str]) -> KvRouter:
    """A router whose workers in `busy` hold a request that puts them over the decode threshold."""
    specs = [
        WorkerSpec(wid, total_blocks=8 if wid in busy else 16384, device="cpu" if wid in CPU else "cuda")
        for wid in ("g0", "g1", "c0", "c1")
    ]
    router = make_router(specs=specs, active_decode_blocks_threshold=0.5)
    for wid in busy:
        router.best_worker(PROMPT, request_id=f"bg-{wid}", pinned_worker=wid)  # 8 of 8 blocks
    return router


def test_busy_cpu_workers_send_everything_to_the_accelerators():
    router = busy_router({"c0", "c1"})
    taken = route_held(router, 100)
    assert set(taken) == ACCEL  # the CPU class is under its share (2 of 102) but has no eligible worker
    router.free("bg-c0")
    router.free("bg-c1")
    taken = route_held(router, 1, seed=5, start=100)
    assert set(taken) <= CPU  # eligible again, and 0 in flight against 100 on the accelerators


def test_busy_accelerators_send_everything_to_the_cpus():
    router = busy_router({"g0", "g1"})
    assert set(route_held(router, 20)) == CPU


def test_allowed_workers_limit_the_classes():
    router = make_router()
    rng = random.Random(4)
    for i in range(20):
        decision = router.best_worker(prompt(rng), request_id=f"cpu-{i}", allowed_workers={"c0", "c1"})
        assert decision.worker_id in CPU
    # one worker per class allowed: the share compares the allowed workers only (g0: 8 for c1's 1)
    router, taken = make_router(), Counter()
    for i in range(90):
        decision = router.best_worker(prompt(rng), request_id=f"mix-{i}", allowed_workers={"g0", "c1"})
        taken[decision.worker_id] += 1
    assert taken == {"g0": 80, "c1": 10}


def test_within_a_class_the_cached_prefix_decides():
    router = make_router()
    cache(router, G1, PROMPT)
    cache(router, C1, PROMPT)
    decision = router.best_worker(PROMPT)
    assert (decision.worker, decision.overlap_blocks) == (G1, 8)  # the accelerators' turn: g1 caches it
    route_held(router, 8)  # 8 accelerator requests in flight: now the CPU class's turn
    decision = router.best_worker(PROMPT)
    assert (decision.worker, decision.overlap_blocks) == (C1, 8)
    assert {c.worker for c in decision.costs} == {C0, C1}  # costs of the chosen class only


def test_the_class_comes_before_the_cache():
    router = make_router()
    cache(router, C0, PROMPT)  # only a CPU worker caches the prompt, but it is the accelerators' turn
    decision = router.best_worker(PROMPT)
    assert decision.worker_id in ACCEL and decision.best_overlap_blocks == 8


def test_temperature_draws_within_the_chosen_class():
    router = make_router(temperature=2.0, seed=11)
    rng = random.Random(6)
    assert {router.best_worker(prompt(rng)).worker_id for _ in range(50)} == ACCEL


def test_pinned_and_preferred_workers_take_the_request_in_any_class():
    router = make_router()
    assert router.best_worker(PROMPT, request_id="p", pinned_worker="c0").worker == C0
    assert router.best_worker(PROMPT, request_id="s", preferred_worker="c1").worker == C1
    # both count toward the CPU class's share: it now needs 24 accelerator requests for its third
    taken = route_held(router, 16)
    assert set(taken) == ACCEL


def test_a_single_class_pool_decides_as_kv_mode():
    specs = [WorkerSpec(w, device="cpu") for w in ("c0", "c1", "c2")]
    weighted, kv = make_router(specs=specs, seed=3), make_router(specs=specs, seed=3, mode="kv")
    rng = random.Random(9)
    for i in range(60):
        tokens = prompt(rng, length=rng.randrange(16, 200))
        a = weighted.best_worker(tokens, request_id=f"r{i}")
        b = kv.best_worker(tokens, request_id=f"r{i}")
        assert (a.worker, a.costs) == (b.worker, b.costs)
        if i % 3 == 0:
            weighted.free(f"r{i - 1}")
            kv.free(f"r{i - 1}")


def test_data_parallel_ranks_count_as_workers():
    specs = [WorkerSpec("g0", dp_ranks=(0, 1)), WorkerSpec("c0", device="cpu")]
    taken = route_held(make_router(specs=specs), 170)
    by_class = Counter("cpu" if wid == "c0" else "cuda" for wid in taken.elements())
    assert by_class == {"cuda": 160, "cpu": 10}  # two accelerator targets: 16 for each cpu request


# --- from the config file to the router ------------------------------------------------------------


def test_the_config_file_and_environment_reach_the_router(tmp_path):
    config_file = tmp_path / "picker.yaml"
    config_file.write_text(
        "models: [{name: m}]\n"
        "workers:\n"
        "- {id: g0, endpoint: 127.0.0.1:8001, model: m}\n"
        "- {id: c0, endpoint: 127.0.0.1:8002, model: m, device: cpu}\n"
    )
    config = load_config(
        ["--config", str(config_file), "--router-mode", "device-aware-weighted"],
        environ={"DYN_ENCODER_CUDA_TO_CPU_RATIO": "3"},
    )
    router = EndpointPicker(config).pools["m"].router
    assert (router.config.mode, router.config.cuda_to_cpu_ratio) == ("device-aware-weighted", 3.0)
    assert [(w, router.spec(w).device) for w in ("g0", "c0")] == [("g0", "cuda"), ("c0", "cpu")]
    taken = route_held(router, 8)
    assert taken == {"g0": 6, "c0": 2}  # 3:1


def test_a_ratio_within_the_slack_of_a_tie_is_a_tie():
    # one part in 10^9 over 1: 1 cpu request against 1 accelerator request still ties, the cpus take it
    assert cpu_takes_next(0, 1, 1, 1, 1.0 + 1e-9)
    assert not cpu_takes_next(0, 1, 1, 1, 1.0 + 3e-9)
