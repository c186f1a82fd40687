"""Mixed fleets (`worker_speeds`), router replicas (`extproc.sim.replay_replicas`) and the session trace."""

from __future__ import annotations

import itertools
import random

import pytest

from extproc.router.config import RouterConfig
from extproc.router.types import Worker, WorkerSpec
from extproc.sim.engine import EngineConfig
from extproc.sim.replay import ReplayConfig, Replayer, VirtualClock
from extproc.sim.replay_replicas import ReplicaAssignment, ReplicatedRouter, replicated_router_factory
from extproc.sim.synth import SessionTraceShape, session_trace
from extproc.sim.trace import load_mooncake, write_mooncake
from tests.sim.replay_helpers import replay


def sessions(tmp_path, requests: int, rate: float, seed: int = 3):
    rows = session_trace(seed, SessionTraceShape(requests=requests, session_rate_per_s=rate))
    path = tmp_path / "sessions.jsonl"
    write_mooncake(
        path, [(r["timestamp"], r["input_length"], r["output_length"], r["hash_ids"]) for r in rows]
    )
    return load_mooncake([path], trace_block_size=512)


def test_a_worker_at_half_speed_takes_twice_as_long(tmp_path):
    rows = [(0, 4096, 1, list(range(64)))]
    fast = replay(tmp_path, rows, workers=1)
    slow = replay(tmp_path, rows, workers=1, worker_speeds=(0.5,))
    assert slow.records[0].ttft_ms == pytest.approx(2 * fast.records[0].ttft_ms)


def test_worker_speeds_name_every_worker():
    with pytest.raises(ValueError, match="names 1 workers"):
        ReplayConfig(2, worker_speeds=(1.0,))
    with pytest.raises(ValueError, match="> 0"):
        ReplayConfig(2, worker_speeds=(1.0, 0.0))
    with pytest.raises(ValueError, match="speed"):
        EngineConfig(speed=-1.0)


def test_the_router_learns_a_mixed_fleet_from_first_tokens(tmp_path):
    """A fast worker and one at half speed, the configured model right for the fast one. Loaded enough
    that both are used; the slow one is learned about twice as slow (an idle slow worker is simply
    left alone, and learns nothing)."""
    requests = sessions(tmp_path, 600, rate=1.5)
    engine = EngineConfig()
    config = ReplayConfig(
        2,
        router=RouterConfig(
            block_size=engine.block_size, prefill_load_model="timing", learn_prefill_timing=True
        ),
        engine=engine,
        worker_speeds=(1.0, 0.5),
    )
    replayer = Replayer(requests, config)
    replayer.run()
    seqs = replayer.router.router.sequences  # type: ignore[attr-defined]
    fast, slow = (seqs.learned_pass_time(Worker(i)) for i in range(2))
    assert fast.samples > 300 and slow.samples > 20
    assert fast.scale == pytest.approx(1.0, rel=0.15)
    assert 1.6 < slow.scale / fast.scale < 2.4


def test_a_configuration_off_by_3x_is_mostly_learned_away(tmp_path):
    requests = sessions(tmp_path, 300, rate=0.3)
    engine = EngineConfig()
    config = ReplayConfig(
        2,
        router=RouterConfig(
            block_size=engine.block_size,
            prefill_load_model="timing",
            prefill_timing="1.26e-6,0.0455,49.5",
            learn_prefill_timing=True,
        ),
        engine=engine,
    )
    replayer = Replayer(requests, config)
    replayer.run()
    seqs = replayer.router.router.sequences  # type: ignore[attr-defined]
    for i in range(2):
        assert 0.25 < seqs.learned_pass_time(Worker(i)).scale < 0.5  # 1 / 3 is right


def make_replicas(replicas: int, lag_ms: float, clock: VirtualClock, **kwargs) -> ReplicatedRouter:
    specs = [WorkerSpec(i, total_blocks=1000, max_num_batched_tokens=8192) for i in range(2)]
    config = RouterConfig(block_size=16, prefill_load_model="timing")
    return ReplicatedRouter(
        config,
        specs,
        clock_s=clock.seconds,
        rng=random.Random(1),
        replicas=replicas,
        sync_lag_ms=lag_ms,
        **kwargs,
    )


def test_other_replicas_see_a_decision_and_its_lifecycle_after_the_lag():
    clock = VirtualClock()
    router = make_replicas(2, 10.0, clock)
    result = router.route("a", list(range(100)), 1600, 5)
    assert result is not None
    owner, other = router.replicas[0].router, router.replicas[1].router
    assert owner.sequences.worker_of("a") == result.worker and "a" not in other.sequences
    clock.now_ms = 9.9
    router.on_kv_event  # noqa: B018 - nothing delivered before the lag
    router.released()
    assert "a" not in other.sequences
    clock.now_ms = 10.0
    router.released()
    assert other.sequences.worker_of("a") == result.worker
    router.on_first_token("a")
    router.on_end("a")
    assert owner.is_idle() and not other.is_idle()
    clock.now_ms = 20.0
    router.released()
    assert other.is_idle() and router.messages == 3


def test_arrivals_go_round_robin_or_by_session():
    clock = VirtualClock()
    rr = make_replicas(3, 0.0, clock)
    owners = []
    for i in range(6):
        rr.route(f"r{i}", [7, i], 32, 1)
        owners.append(
            next(
                k
                for k, r in enumerate(rr.replicas)
                if r.router.sequences.worker_of(f"r{i}")
                and f"r{i}" in r.router.sequences
                and rr._owner[f"r{i}"] == k
            )
        )
    assert owners == [0, 1, 2, 0, 1, 2]
    by_session = make_replicas(3, 0.0, clock, assignment=ReplicaAssignment.SESSION)
    for i in range(6):
        by_session.route(f"s{i}", [7, i], 32, 1)
    assert {by_session._owner[f"s{i}"] for i in range(6)} == {7 % 3}


def test_a_replay_through_replicas_ends_with_every_replica_idle(tmp_path):
    requests = sessions(tmp_path, 200, rate=0.5)
    engine = EngineConfig()
    config = ReplayConfig(
        4, router=RouterConfig(block_size=engine.block_size, prefill_load_model="timing"), engine=engine
    )
    replayer = Replayer(requests, config, router_factory=replicated_router_factory(3, 10.0))
    result = replayer.run()
    assert all(r.first_token_ms is not None for r in result.records)
    router = replayer.router
    assert isinstance(router, ReplicatedRouter)
    router.settle()  # the last frees, still in flight to the other replicas
    assert all(r.router.is_idle() for r in router.replicas)
    assert router.messages == 3 * len(requests)  # add, prefill, free of each


def test_the_session_trace_is_a_seeded_chat_workload():
    a = session_trace(5, SessionTraceShape(requests=300))
    assert (
        a
        == session_trace(5, SessionTraceShape(requests=300))
        != session_trace(6, SessionTraceShape(requests=300))
    )
    assert len(a) == 300 and all(x["timestamp"] <= y["timestamp"] for x, y in itertools.pairwise(a))
    # system prompts and earlier turns come back: most prompt blocks extend a prefix seen before
    seen: set[tuple[int, ...]] = set()
    repeated = total = 0
    for row in a:
        ids = row["hash_ids"]
        for k in range(1, len(ids) + 1):
            total += 1
            repeated += tuple(ids[:k]) in seen
            seen.add(tuple(ids[:k]))
    assert repeated / total > 0.5
