"""Disaggregated replay: prefill engines, KV transfers, decode engines and the picker's DisaggRouter."""

import gc
import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from extproc.cli import main as cli_main
from extproc.router.disagg import LOCAL_CACHED, LOCAL_SHORT, DisaggPolicy
from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.router.types import BlocksRemoved, Worker
from extproc.sim import replay as replay_module
from extproc.sim.engine import Engine, EngineConfig
from extproc.sim.prefix_cache import PrefixCache
from extproc.sim.replay import Replayer
from extproc.sim.replay_disagg import DisaggReplayer, DisaggSetup
from extproc.sim.replay_router import DisaggRouterAdapter
from extproc.sim.timing import prefill_ms
from extproc.sim.trace import write_mooncake
from extproc.sim.transfer import KvTransferModel

from .replay_helpers import replayer
from .test_replay_events import churn, tree_blocks

BS = 16
ENGINE = EngineConfig(block_size=BS, num_gpu_blocks=1024, max_num_batched_tokens=256)
SMALL = EngineConfig(block_size=BS, num_gpu_blocks=40, max_num_batched_tokens=128)
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_disagg.py"


def disagg(tmp_path, rows, *, prefill=1, decode=2, engine=ENGINE, mode="kv", policy=None, **setup):
    """A DisaggReplayer over `rows` (hash ids of BS tokens) and the aggregated replayer's config."""
    base = replayer(tmp_path, rows, engine=engine, workers=decode, mode=mode)
    policy = policy or DisaggPolicy(min_remote_prefill_tokens=32)
    return DisaggReplayer(base.requests, base.config, DisaggSetup(prefill, policy, **setup))


def long_prompt(i: int, blocks: int = 10) -> list[int]:
    return [1000 * (i + 1) + k for k in range(blocks)]


def test_a_remote_prompt_is_prefilled_then_transferred_and_its_ttft_adds_the_three_stages(tmp_path):
    # one 100-token prompt on idle engines: prefill pass, transfer of its 6 full blocks up to the
    # cached-prefix cap, then the decode engine's first pass computes the last 4 tokens
    run = disagg(tmp_path, [(0, 100, 5, long_prompt(0, 7))], kv_transfer=KvTransferModel(5.0, 1.0))
    (record,) = run.run().records
    assert record.remote_prefill and record.worker in (0, 1) and record.prefill_worker == 2
    assert record.prefill_end_ms == pytest.approx(prefill_ms(100))
    assert record.transfer_ms == pytest.approx(5.0 + 6 * 1.0)
    assert record.ttft_ms == pytest.approx(prefill_ms(100) + 11.0 + prefill_ms(4))
    assert record.end_ms is not None and record.end_ms > record.first_token_ms
    assert record.cached_tokens == 0  # reuse is the prefill engine's: nothing was cached there


def test_remote_prompts_blocks_are_in_the_prefill_and_the_decode_engine_and_both_routers(tmp_path):
    rows = [(i * 500, 10 * BS, 4, long_prompt(i)) for i in range(4)]
    run = disagg(tmp_path, rows)
    result = run.run()
    adapter = run.router
    assert isinstance(adapter, DisaggRouterAdapter)
    tokens = {r.index: r.token_ids() for r in run.requests}
    for record in result.records:
        assert record.remote_prefill
        local = compute_block_hashes(tokens[record.index], BS)
        cap = (len(tokens[record.index]) - 1) // BS
        sequence = compute_sequence_hashes(local)[:cap]
        assert all(h in run.engines[record.prefill_worker].cache for h in sequence)
        assert all(h in run.engines[record.worker].cache for h in sequence)
        # and their KV events reached the router of each stage
        assert adapter.prefill.indexer.find_matches(local)[Worker(record.prefill_worker)] >= cap
        assert adapter.router.indexer.find_matches(local)[Worker(record.worker)] >= cap
    assert adapter.is_idle()
    assert result.num_workers == 3 and result.num_prefill_workers == 1


def test_short_prompts_and_prompts_cached_on_the_decode_worker_are_prefilled_there(tmp_path):
    rows = [
        (0, 20 * BS, 4, long_prompt(0, 20)),  # remote
        (10, 2 * BS, 4, long_prompt(1, 2)),  # 32 tokens: under 48, short
        # the first prompt and 4 blocks more: 64 tokens uncached, but 20 of 24 blocks (0.83) are
        # cached on the first one's decode worker (19 received, the last computed there)
        (500, 24 * BS, 4, long_prompt(0, 20) + long_prompt(2, 4)),
    ]
    run = disagg(tmp_path, rows, policy=DisaggPolicy(min_remote_prefill_tokens=48))
    first, short, again = run.run().records
    assert first.remote_prefill and first.local_reason is None
    assert not short.remote_prefill and short.local_reason == LOCAL_SHORT
    assert not again.remote_prefill and again.local_reason == LOCAL_CACHED and again.worker == first.worker
    prefill_pool = run.engines[first.prefill_worker].cache
    short_blocks = compute_sequence_hashes(compute_block_hashes(run.requests[1].token_ids(), BS))
    assert not any(h in prefill_pool for h in short_blocks)  # the prefill engine never saw it
    assert again.cached_tokens == 20 * BS  # the decode engine's reuse


@pytest.mark.parametrize("mode", ["kv", "round-robin"])
def test_without_prefill_workers_it_is_the_aggregated_replay_request_by_request(tmp_path, mode):
    rows = churn(2)
    aggregated = replayer(tmp_path, rows, engine=SMALL, workers=3, mode=mode).run()
    result = disagg(tmp_path, rows, prefill=0, decode=3, engine=SMALL, mode=mode).run()

    def key(r):
        return (
            r.worker,
            r.routed_ms,
            r.first_token_ms,
            r.end_ms,
            r.cached_tokens,
            r.admissions,
            r.overlap_blocks,
        )

    assert [key(r) for r in result.records] == [key(r) for r in aggregated.records]
    assert list(result.token_gaps_ms) == list(aggregated.token_gaps_ms)
    assert result.preemptions == aggregated.preemptions > 0  # the small pools overflow
    assert not any(r.remote_prefill for r in result.records)


@pytest.mark.parametrize("lag_ms", [0.0, 7.5])
def test_under_evictions_both_routers_end_idle_and_their_trees_equal_the_pools(tmp_path, lag_ms):
    base = replayer(tmp_path, churn(4), engine=SMALL, workers=2, mode="kv", kv_event_lag_ms=lag_ms)
    run = DisaggReplayer(
        base.requests, base.config, DisaggSetup(2, DisaggPolicy(min_remote_prefill_tokens=16))
    )
    removed = []
    adapter = run.router
    assert isinstance(adapter, DisaggRouterAdapter)
    forward = adapter.on_kv_event

    def spy(event):
        removed.append(isinstance(event, BlocksRemoved))
        forward(event)

    adapter.on_kv_event = spy  # type: ignore[method-assign]
    result = run.run()
    assert sum(removed) > 10  # the pools really overflowed
    assert all(r.end_ms is not None for r in result.records)
    summary = {r.remote_prefill for r in result.records}
    assert summary == {True, False}  # both paths ran
    assert adapter.is_idle() and adapter.prefill.is_idle() and adapter.router.is_idle()
    for index, engine in enumerate(run.engines):
        router = adapter.prefill if index >= 2 else adapter.router
        assert tree_blocks(router, Worker(index)) == set(engine.cache._ref_counts)


def test_a_transfer_the_decode_pool_cannot_take_is_counted_and_the_prompt_recomputed_there(tmp_path):
    # the first request's prompt and generated tokens hold 21 of the decode worker's 24 blocks when
    # the second one's 9 blocks land (a full pool decodes at about 30 ms a token); it is admitted,
    # all of its prompt to compute, once the first one ends
    engine = EngineConfig(block_size=BS, num_gpu_blocks=24, max_num_batched_tokens=256)
    rows = [(0, 10 * BS, 200, long_prompt(0)), (5000, 10 * BS, 3, long_prompt(1))]
    run = disagg(tmp_path, rows, prefill=1, decode=1, engine=engine)
    result = run.run()
    first, second = result.records
    assert first.remote_prefill and second.remote_prefill
    assert result.transfers_not_landed == 1
    assert second.first_token_ms == pytest.approx(first.end_ms + prefill_ms(10 * BS))  # all of it
    assert run.router.is_idle()


def held_by(root: object) -> list[object]:
    """Every object `root` holds, directly or through others: its attributes, their contents, the
    closures and defaults of its functions. Not classes, modules or module namespaces: a function
    reaches its module's globals, and from there anything any module holds (a logger's handlers and
    their records, a cache), which depends on what ran before, not on what `root` holds."""
    namespaces = {id(vars(m)) for m in list(sys.modules.values()) if isinstance(m, ModuleType)}
    seen: set[int] = set()
    found: list[object] = []
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in namespaces or isinstance(obj, type | ModuleType):
            continue
        seen.add(id(obj))
        found.append(obj)
        stack.extend(gc.get_referents(obj))
    return found


def test_the_disagg_router_holds_no_reference_to_any_engine(tmp_path):
    run = disagg(tmp_path, [(i * 50, 10 * BS, 3, long_prompt(i % 3)) for i in range(6)])
    run.run()
    held = held_by(run.router)
    forbidden = [type(o).__name__ for o in held if isinstance(o, Engine | PrefixCache | Replayer)]
    assert not forbidden, f"the router reaches {forbidden}"
    assert len(held) > 100


def test_what_an_object_holds_is_its_own_graph_not_what_its_modules_hold(tmp_path, monkeypatch):
    """The check above must not depend on test order: an engine left in a module's namespace by
    earlier code (here put there on purpose) is not held by the router, one in its attributes is."""
    run = disagg(tmp_path, [(0, 10 * BS, 3, long_prompt(0))])
    engine = Engine(ENGINE)
    monkeypatch.setattr(replay_module, "left_over_by_an_earlier_test", engine, raising=False)
    assert all(o is not engine for o in held_by(run.router))
    monkeypatch.setattr(run.router, "leaked", [engine], raising=False)
    assert any(o is engine for o in held_by(run.router))


def test_the_cli_replays_a_disaggregated_fleet_with_serves_policy_flags(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    write_mooncake(path, [(i * 30, 8 * BS, 3, long_prompt(i % 4, 8)) for i in range(20)])
    argv = ["replay", str(path), "--disagg", "1:2", "--block-size", str(BS), "--trace-block-size", str(BS)]
    argv += ["--disagg-min-remote-prefill-tokens", "32", "--kv-transfer-base-ms", "3", "--json", "--quiet"]
    assert cli_main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workers"] == 3
    assert doc["disagg"]["prefill_workers"] == 1 and doc["disagg"]["min_remote_prefill_tokens"] == 32
    d = doc["routers"]["kv"]["disagg"]
    assert d["remote_prefill"] + d["local_prefill"] == 20 and d["remote_prefill"] >= 4
    assert d["transfer_ms"]["mean"] == pytest.approx(3 + 0.2 * 7)  # 7 blocks up to the cap of 128 tokens
    assert len(doc["routers"]["kv"]["imbalance"]["requests_per_worker"]) == 2  # the decode workers


def test_bench_disagg_quick_compares_aggregated_and_disaggregated(tmp_path, capsys):
    rng = random.Random(0)
    rows = [
        (i * 200, rng.randrange(600, 3000), rng.randrange(2, 8), [i % 5, 100 + i, 200 + i]) for i in range(30)
    ]
    write_mooncake(tmp_path / "trace.jsonl", rows)
    spec = importlib.util.spec_from_file_location("bench_disagg", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = [
        "--quick",
        "--jobs",
        "1",
        "--trace",
        str(tmp_path / "trace.jsonl"),
        "--out-dir",
        str(tmp_path / "out"),
    ]
    assert bench.main(argv) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    aggregated, split = doc["cells"]
    assert aggregated["aggregated"] and aggregated["layout"] == "aggregated 4"
    assert split["layout"].startswith("1P:3D") and split["remote_frac"] > 0
    assert "| TTFT mean |" in err and (tmp_path / "out" / "disagg.md").exists()
