"""A quick calibration: the first 600 requests of the shared trace, round robin on 4 workers, against
Dynamo 1.6.1's mocker (`run_mocker_trace_replay(..., router_mode="round_robin",
trace_block_size=512)`). The full-trace calibration (4 and 8 workers, 1x and 4x) is in
benchmarks/bench_quality.py --calibrate."""

import itertools

import pytest

from extproc.router.config import RouterConfig
from extproc.sim.replay import ReplayConfig, Replayer
from extproc.sim.replay_metrics import summarize
from extproc.sim.trace import load_mooncake

from .replay_helpers import SHARED_TRACE

# speed-up -> Dynamo's TTFT mean, p50, p99 (ms) and prefix reuse on that slice (its times are rounded to
# microseconds, hence rel=1e-6)
DYNAMO = {
    1.0: (298.76485942500005, 134.30559600002016, 1281.236740000022, 0.022061230217293355),
    4.0: (2658.4415996916637, 2350.4312919999866, 8205.18781199999, 0.022061230217293355),
}


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="needs ../shared/traces/mooncake_synthetic_trace.jsonl")
@pytest.mark.parametrize("speedup", sorted(DYNAMO))
def test_round_robin_on_a_slice_of_the_shared_trace_reproduces_dynamos_mocker(tmp_path, speedup):
    head = tmp_path / "head.jsonl"
    with open(SHARED_TRACE, encoding="utf-8") as f:
        head.write_text("".join(itertools.islice(f, 600)))
    requests = load_mooncake([head], trace_block_size=512, speedup=speedup)
    result = Replayer(requests, ReplayConfig(4, router=RouterConfig(mode="round-robin", block_size=64))).run()
    s = summarize(result)
    mean, p50, p99, reuse = DYNAMO[speedup]
    assert s["ttft_ms"]["mean"] == pytest.approx(mean, rel=1e-6)
    assert s["ttft_ms"]["p50"] == pytest.approx(p50, rel=1e-6)
    assert s["ttft_ms"]["p99"] == pytest.approx(p99, rel=1e-6)
    assert s["reuse"] == pytest.approx(reuse, rel=1e-6)
