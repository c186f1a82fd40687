"""Disaggregated router replicas: what replica sync shares of the prefill side, in a replay."""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Callable, Sequence

import pytest

from extproc.cli import main as cli_main
from extproc.events.replica_wire import prefill_leg_id
from extproc.router.config import RouterConfig
from extproc.router.disagg import LOCAL_SHORT, DisaggPolicy
from extproc.router.types import BlocksStored, StoredBlock, Worker, WorkerSpec
from extproc.sim.engine import EngineConfig
from extproc.sim.replay import VirtualClock
from extproc.sim.replay_disagg import DisaggReplayer, DisaggSetup
from extproc.sim.replay_replicas import PrefillFleet, ReplicaSetup, ReplicatedRouter
from extproc.sim.replay_router import DisaggRouterAdapter, ReplayRouter
from extproc.sim.trace import write_mooncake

from .replay_helpers import replayer
from .test_replay_disagg import BENCH
from .test_replay_events import churn, tree_blocks

BS = 16
POLICY = DisaggPolicy(min_remote_prefill_tokens=32)
SMALL = EngineConfig(block_size=BS, num_gpu_blocks=40, max_num_batched_tokens=128)


def replicas(share_prefill: bool = True, lag_ms: float = 0.0) -> tuple[ReplicatedRouter, VirtualClock]:
    """Two disaggregated replicas over 2 decode workers (0, 1) and 2 prefill workers (2, 3)."""
    clock = VirtualClock()
    decode = [WorkerSpec(i, total_blocks=1000, max_num_batched_tokens=8192) for i in range(2)]
    prefill = [WorkerSpec(2 + j, total_blocks=1000, max_num_batched_tokens=8192) for j in range(2)]
    router = ReplicatedRouter(
        RouterConfig(block_size=BS),
        decode,
        clock_s=clock.seconds,
        rng=random.Random(1),
        replicas=2,
        sync_lag_ms=lag_ms,
        disagg=PrefillFleet(prefill, POLICY),
        share_prefill=share_prefill,
    )
    return router, clock


def prompt(i: int, blocks: int = 10) -> list[int]:
    return [1000 * (i + 1) + k for k in range(blocks)]


def all_idle(router: ReplicatedRouter) -> bool:
    return all(r.is_idle() for i in range(len(router.replicas)) for r in router.routers_of(i))


def test_a_shared_prefill_leg_is_on_the_other_replicas_prefill_router_until_the_first_token():
    router, _ = replicas(share_prefill=True)
    result = router.route("a", prompt(0), 10 * BS, 5)
    assert result is not None and result.prefill_worker is not None
    (owner_decode, owner_prefill), (decode, prefill) = router.routers_of(0), router.routers_of(1)
    assert owner_prefill.sequences.prefill_tokens(result.prefill_worker) == 10 * BS
    # replica 1 holds the prompt's load on the same prefill worker, under the leg's id
    assert prefill.sequences.worker_of(prefill_leg_id("a")) == result.prefill_worker
    assert prefill.sequences.prefill_tokens(result.prefill_worker) == 10 * BS
    # and the decode side as the owner does: the request, its prompt not the decode worker's work
    assert decode.sequences.worker_of("a") == owner_decode.sequences.worker_of("a") == result.worker
    assert decode.sequences.prefill_tokens(result.worker) == 0
    router.on_first_token("a")
    assert owner_prefill.is_idle() and prefill.is_idle()
    assert not decode.is_idle() and not owner_decode.is_idle()  # still decoding
    router.on_end("a")
    assert all_idle(router)
    assert router.messages == 5  # add, prefill, leg add; leg free; free (as serve publishes them)


def test_the_leg_carries_the_prefill_decisions_overlap():
    router, _ = replicas(share_prefill=True)
    cached = prompt(0, 8)
    blocks = tuple(StoredBlock(engine_hash=10_000 + k, local_hash=h) for k, h in enumerate(cached))
    router.on_kv_event(BlocksStored(Worker(3), blocks, None, 1))  # every replica's prefill router
    result = router.route("a", prompt(0), 10 * BS, 5)
    assert result is not None and result.prefill_worker == Worker(3)
    assert result.prefill_overlap_blocks == 8
    owner, other = router.routers_of(0)[1], router.routers_of(1)[1]
    assert owner.sequences.prefill_tokens(Worker(3)) == other.sequences.prefill_tokens(Worker(3)) == 2 * BS


def test_without_sharing_the_other_replicas_prefill_router_holds_nothing():
    router, _ = replicas(share_prefill=False)
    result = router.route("a", prompt(0), 10 * BS, 5)
    assert result is not None and result.prefill_worker is not None
    decode, prefill = router.routers_of(1)
    assert prefill.is_idle() and prefill.sequences.prefill_tokens(result.prefill_worker) == 0
    assert decode.sequences.worker_of("a") == result.worker  # the decode side is still shared
    router.on_first_token("a")
    router.on_end("a")
    assert all_idle(router) and router.messages == 4  # add, prefill; prefill; free


@pytest.mark.parametrize("share_prefill", [True, False])
def test_a_prompt_prefilled_locally_publishes_the_decode_side_only(share_prefill):
    router, _ = replicas(share_prefill=share_prefill)
    result = router.route("short", prompt(0, 1), BS, 5)
    assert result is not None and result.prefill_worker is None and result.local_reason == LOCAL_SHORT
    decode, prefill = router.routers_of(1)
    assert decode.sequences.prefill_tokens(result.worker) == BS and prefill.is_idle()
    assert router.messages == 1


def test_a_replica_that_sees_the_other_ones_prefill_sends_the_next_prompt_elsewhere():
    router, _ = replicas(share_prefill=True)
    first = router.route("a", prompt(0), 10 * BS, 5)  # replica 0
    second = router.route("b", prompt(1), 10 * BS, 5)  # replica 1: worker of "a" is loaded
    assert first is not None and second is not None
    assert first.prefill_worker is not None and second.prefill_worker is not None
    assert first.prefill_worker != second.prefill_worker


def test_the_leg_reaches_the_others_after_the_lag_and_is_freed_in_order():
    router, clock = replicas(share_prefill=True, lag_ms=10.0)
    result = router.route("a", prompt(0), 10 * BS, 5)
    assert result is not None and result.prefill_worker is not None
    prefill = router.routers_of(1)[1]
    clock.now_ms = 5.0
    router.on_first_token("a")  # before the leg reached replica 1
    assert prefill.is_idle()
    clock.now_ms = 10.0
    router.released()  # add, prefill, leg add due: the leg is held
    assert prefill.sequences.worker_of(prefill_leg_id("a")) == result.prefill_worker
    clock.now_ms = 15.0
    router.on_end("a")  # the first token's prefill and leg free are due: the leg is gone
    assert prefill.is_idle()
    router.settle()
    assert all_idle(router)


def disagg_replay(tmp_path, rows, replica_setup: ReplicaSetup | None, **kwargs) -> DisaggReplayer:
    base = replayer(tmp_path, rows, engine=SMALL, workers=2, mode="kv", **kwargs)
    return DisaggReplayer(base.requests, base.config, DisaggSetup(2, POLICY), replicas=replica_setup)


@pytest.mark.parametrize("share_prefill", [True, False])
def test_a_replay_through_disaggregated_replicas_ends_idle_with_every_tree_equal_to_the_pools(
    tmp_path, share_prefill
):
    run = disagg_replay(tmp_path, churn(4), ReplicaSetup(3, 5.0, share_prefill=share_prefill))
    result = run.run()
    router = run.router
    assert isinstance(router, ReplicatedRouter)
    assert all(r.end_ms is not None for r in result.records)
    remote = sum(r.remote_prefill for r in result.records)
    assert 0 < remote < len(result.records)  # both paths ran
    router.settle()
    assert all_idle(router)
    per_remote = 5 if share_prefill else 4
    assert router.messages == 3 * (len(result.records) - remote) + per_remote * remote
    for i in range(3):  # every replica got every engine's KV events, each on the router of its worker
        decode, prefill = router.routers_of(i)
        for index, engine in enumerate(run.engines):
            tree = prefill if index >= 2 else decode
            assert tree_blocks(tree, Worker(index)) == set(engine.cache._ref_counts)


class _Today(DisaggReplayer):
    """The disaggregated replayer's router as it was built before replicas: one adapter."""

    def _router_factory(
        self,
        config: RouterConfig,
        decode: Sequence[WorkerSpec],
        clock_s: Callable[[], float],
        rng: random.Random,
    ) -> ReplayRouter:
        e = self.config.engine
        prefill = [
            WorkerSpec(i, total_blocks=e.num_gpu_blocks, max_num_batched_tokens=e.max_num_batched_tokens)
            for i in range(self.num_decode, self.num_decode + self.setup.prefill_workers)
        ]
        prefill_rng = random.Random(f"prefill-{self.config.seed}")
        return DisaggRouterAdapter(
            config, decode, prefill, self.setup.policy, clock_s=clock_s, rng=rng, prefill_rng=prefill_rng
        )


def test_one_replica_is_todays_disaggregated_replay_request_by_request(tmp_path):
    rows = churn(2)
    one = disagg_replay(tmp_path, rows, ReplicaSetup(1, 50.0, share_prefill=False), seed=7)
    assert isinstance(one.router, DisaggRouterAdapter)
    result = one.run()
    base = replayer(tmp_path, rows, engine=SMALL, workers=2, mode="kv", seed=7)
    today = _Today(base.requests, base.config, DisaggSetup(2, POLICY)).run()

    def key(r):
        return (r.worker, r.prefill_worker, r.routed_ms, r.first_token_ms, r.end_ms, r.cached_tokens)

    assert [key(r) for r in result.records] == [key(r) for r in today.records]
    assert any(r.remote_prefill for r in result.records)


@pytest.mark.parametrize("sync_prefill", ["shared", "own"])
def test_the_cli_replays_disaggregated_replicas_and_names_the_setting(tmp_path, capsys, sync_prefill):
    path = tmp_path / "trace.jsonl"
    write_mooncake(path, [(i * 30, 8 * BS, 3, prompt(i % 4, 8)) for i in range(20)])
    argv = ["replay", str(path), "--disagg", "1:2", "--router-replicas", "2", "--replica-sync-lag-ms", "5"]
    argv += ["--replica-sync-prefill", sync_prefill, "--block-size", str(BS), "--trace-block-size", str(BS)]
    argv += ["--disagg-min-remote-prefill-tokens", "32", "--json", "--quiet"]
    assert cli_main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["router_replicas"] == 2 and doc["replica_sync_lag_ms"] == 5.0
    assert doc["replica_sync_prefill"] == sync_prefill
    d = doc["routers"]["kv"]["disagg"]
    assert d["remote_prefill"] + d["local_prefill"] == 20 and d["remote_prefill"] > 0


def test_bench_disagg_shows_one_router_and_replicas_sharing_the_prefill_side_or_not(tmp_path, capsys):
    rng = random.Random(0)
    rows = [
        (i * 200, rng.randrange(600, 3000), rng.randrange(2, 8), [i % 5, 100 + i, 200 + i]) for i in range(30)
    ]
    write_mooncake(tmp_path / "trace.jsonl", rows)
    spec = importlib.util.spec_from_file_location("bench_disagg", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--quick", "--jobs", "1", "--replicas", "2", "--trace", str(tmp_path / "trace.jsonl")]
    assert bench.main([*argv, "--out-dir", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert [(c["replicas"], c["replica_sync"]) for c in doc["cells"]] == [
        (1, None),  # aggregated
        (1, None),
        (2, "shared"),
        (2, "own"),
    ]
    (row,) = doc["replica_comparison"]
    assert row["layout"].startswith("1P:3D") and {"one_router", "shared", "own"} <= row.keys()
    assert doc["replicas"] == 2 and doc["replica_sync_lag_ms"] == 10.0
    assert "Router replicas: 1 router / 2 sharing" in err
