"""`python -m extproc replay`: serve's router flags, several routers, JSON, request lines, plot, errors."""

import json

import pytest

from extproc.cli import main
from extproc.sim.trace import write_mooncake

ROWS = [(t * 20, 60 + t, 4, [t % 4, 1000 + t, 2000 + t, 3000 + t]) for t in range(40)]
SMALL = ["--block-size", "16", "--trace-block-size", "16", "--num-gpu-blocks", "64", "--quiet"]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    write_mooncake(path, ROWS)
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["replay", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_summary_for_several_routers_with_requests_out_and_a_plot(tmp_path, trace, capsys):
    lines, png = tmp_path / "requests.jsonl", tmp_path / "plot.png"
    rc, out, _ = run(
        capsys,
        trace,
        "--workers",
        "2",
        "--router",
        "round-robin,kv",
        "--router",
        "random",
        "--json",
        "--requests-out",
        str(lines),
        "--plot",
        str(png),
        *SMALL,
    )
    assert rc == 0
    doc = json.loads(out)
    assert list(doc["routers"]) == ["round-robin", "kv", "random"]
    kv = doc["routers"]["kv"]
    assert kv["completed"] == len(ROWS)
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "throughput", "reuse", "overlap", "imbalance"):
        assert key in kv
    assert kv["overlap"]["chosen_over_best"] <= 1.0
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(records) == 3 * len(ROWS) and {r["router"] for r in records} == {"round-robin", "kv", "random"}
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize(
    "flags",
    [
        ["--router-prefill-load-model", "timing"],
        ["--no-router-kv-events"],  # approximate mode: the router predicts the cache itself
        ["--router-queue-threshold", "0.1", "--router-queue-policy", "wspt"],
        ["--router-temperature", "0.5", "--kv-event-lag-ms", "20"],
        ["--router-prefill-timing", "4e-7,0.015,16.5", "--router-prefill-load-model", "timing"],
    ],
)
def test_router_flags_of_serve_apply(trace, capsys, flags):
    rc, out, err = run(capsys, trace, "--workers", "2", *SMALL, *flags)
    assert rc == 0, err
    assert f": {len(ROWS)}/{len(ROWS)} requests" in out and out.startswith("kv")


def test_text_summary_and_progress_on_stderr(trace, capsys):
    rc, out, err = run(capsys, trace, "--workers", "2", *[f for f in SMALL if f != "--quiet"])
    assert rc == 0
    assert "replaying 40 requests on 2 workers with kv" in err
    assert "TTFT ms  mean" in out and "prefix reuse" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--router", "fastest"], "invalid --router 'fastest'"),
        (["--kv-cache-block-size", "32"], "router block size 32 differs"),
        (["--router-prefill-timing", "1,2"], "prefill_timing"),
        (["--workers", "0"], "num_workers"),
    ],
)
def test_bad_input_exits_2_with_a_message(trace, capsys, flags, message):
    rc, _, err = run(capsys, trace, *SMALL, *flags)
    assert rc == 2 and message in err


def test_a_missing_trace_exits_2(tmp_path, capsys):
    rc, _, err = run(capsys, str(tmp_path / "nope.jsonl"))
    assert rc == 2 and "nope.jsonl" in err
