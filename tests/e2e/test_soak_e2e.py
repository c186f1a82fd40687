"""The soak and fault test (`benchmarks/soak.py`) at CI size, and the rules it judges answers by.

The soak runs as a child process exactly as a person runs it: 600 requests at 40 req/s through a
real Envoy (fail-open), the picker, four mock workers and a nats-server, while one worker is killed
and restarted, the picker is restarted (SIGTERM, drain, start on the same ports) and nats-server is
killed and restarted. Its JSON summary must say that every request got a documented answer, that
every fault had traffic during it and was recovered from, and that nothing leaked afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DOCUMENTED_STATUSES = {200, 400, 404, 413, 502, 503}
SOAK_ARGS = ["--requests", "600", "--rate", "40", "--faults", "kill:w0,picker,nats", "--seed", "11"]


def load_benchmark_module(name: str) -> ModuleType:
    """A module of benchmarks/ (not a package): importable once its folder is on sys.path."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def soak_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    log_dir = tmp_path_factory.mktemp("soak")
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "soak.py"), *SOAK_ARGS, "--log-dir", str(log_dir)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert completed.stdout, f"no JSON summary; stderr:\n{completed.stderr[-4000:]}"
    return completed.returncode, json.loads(completed.stdout), completed.stderr


@pytest.mark.timeout(180)
def test_every_request_gets_a_documented_answer_through_faults(soak_run) -> None:
    code, summary, stderr = soak_run
    failed = [name for name, ok in summary["checks"].items() if not ok]
    unexpected = summary["answers"]["unexpected"]
    assert not failed, f"failed checks {failed}; unexpected answers {unexpected}\n{stderr}"
    assert summary["pass"] is True and code == 0
    assert summary["requests"] == 600
    statuses = {int(s) for s in summary["answers"]["by_status"]}
    assert statuses <= DOCUMENTED_STATUSES
    assert summary["answers"]["accepted_as"].get("unexpected", 0) == 0
    by_kind = summary["answers"]["by_kind"]
    assert set(by_kind) == set(summary["config"]["mix"])  # every kind of request was sent
    assert by_kind["cancel_early"] == {"cancelled": sum(by_kind["cancel_early"].values())}
    assert summary["answers"]["cancelled_by_client"] > 0


@pytest.mark.timeout(180)
def test_each_fault_happens_under_traffic_and_is_recovered_from(soak_run) -> None:
    _, summary, _ = soak_run
    faults = {f["kind"]: f for f in summary["faults"]}
    assert set(faults) == {"kill", "picker", "nats"}
    for fault in summary["faults"]:
        assert fault["error"] is None and fault["requests_during"] >= 10, fault
    assert faults["kill"]["recovery"]["resynced_after_s"] is not None  # the worker's cache view reset
    assert faults["nats"]["recovery"]["resynced_after_s"] is not None  # NATS events flow again
    picker = faults["picker"]["recovery"]
    assert picker["exit_code"] == 0 and picker["ready_after_s"] is not None
    assert summary["leaks"]["last_picker_requests"]["routed"] > 0  # the restarted picker routes


@pytest.mark.timeout(180)
def test_nothing_is_left_behind(soak_run) -> None:
    _, summary, _ = soak_run
    leaks = summary["leaks"]
    for worker, load in leaks["picker_state"]["workers"].items():
        assert load == {"active_prefill_tokens": 0, "active_decode_blocks": 0}, worker
    assert not any(leaks["picker_state"]["queued"].values())
    assert all(v == 0 for v in leaks["worker_running_waiting"].values())
    last = leaks["last_picker_requests"]
    assert last["routed"] == sum(last["finished"].values())
    bounds = summary["bounds"]
    assert len(summary["picker_processes"]) == 2
    for life in summary["picker_processes"]:
        assert life["rss_growth_mib"] <= bounds["rss_growth_mib"], life
        assert life["fd_growth"] <= bounds["fd_growth"], life


def _result(kind: str, status: int | None, outcome: str, *, t: float = 10.0, reason: str | None = None):
    soak_requests = load_benchmark_module("soak_requests")
    return soak_requests.Result(0, kind, t, t + 0.1, status, outcome, reason=reason)


def _fault(kind: str, start: float = 5.0, end: float = 8.0):
    soak_requests = load_benchmark_module("soak_requests")
    return soak_requests.Fault(kind, kind, 0, injected_s=start, recovered_s=end)


@pytest.mark.parametrize(
    "kind, status, outcome, faults, verdict",
    [
        ("chat", 200, "ok", [], "expected"),
        ("invalid", 400, "status", [], "expected"),
        ("body_too_large", 413, "status", [], "expected"),
        ("cancel_early", None, "cancelled", [], "cancelled"),
        ("chat", 503, "status", [], None),  # a 503 with no fault going on
        ("chat", 503, "status", [("kill", 9.5, 11.0)], "worker-fault"),
        ("chat", 503, "status", [("kill", 2.0, 5.0)], None),  # the worker was back long before
        ("chat_stream", 200, "truncated", [("kill", 9.5, 11.0)], "worker-fault"),
        ("chat_stream", 200, "bad-body", [("kill", 9.5, 11.0)], None),
        ("chat", 503, "status", [("nats", 9.5, 11.0)], None),  # a NATS restart costs no request
        ("invalid", 200, "ok", [], None),  # the picker must refuse an invalid body
        ("invalid", 200, "ok", [("picker", 9.5, 11.0)], "picker-bypassed"),  # the worker served it
        ("body_too_large", 400, "status", [("picker", 9.5, 11.0)], "picker-bypassed"),
        ("chat", None, "unanswered", [("kill", 9.5, 11.0)], None),
        ("chat", None, "error", [("picker", 9.5, 11.0)], None),
    ],
)
def test_judge_accepts_only_documented_answers(kind, status, outcome, faults, verdict) -> None:
    soak_requests = load_benchmark_module("soak_requests")
    windows = [_fault(k, start, end) for k, start, end in faults]
    assert soak_requests.judge(_result(kind, status, outcome), windows) == verdict


def test_a_picker_503_is_not_excused_by_a_worker_fault() -> None:
    soak_requests = load_benchmark_module("soak_requests")
    refused = _result("chat", 503, "status", reason="rejected-no-endpoints")
    assert soak_requests.judge(refused, [_fault("kill", 9.5, 11.0)]) is None
