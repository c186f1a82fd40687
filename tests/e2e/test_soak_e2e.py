"""The soak and fault test (`benchmarks/soak.py`) at CI size, and the rules it judges answers by.

The soak runs as a child process exactly as a person runs it: 600 requests at 40 req/s through a
real Envoy (fail-open), the picker, four mock workers and a nats-server, while one worker is killed
and restarted, the picker is restarted (SIGTERM, a new one on the ports it released while it
drains) and nats-server is killed and restarted; a third of the requests are hostile (headers the
picker owns, encoded paths, HTTP/2 trailers, 3 MiB bodies, session ids long and many, colliding
request ids). Its JSON summary must say that every request got a documented answer from the
documented party, none stalled, that every fault had traffic during it and was recovered from, and
that nothing leaked afterwards (load, sessions beyond their bound, RSS, fds).
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
    # the hostile kinds: what a healthy stack answers them (faults aside)
    for kind, allowed in {
        "owned_headers": {"200", "503"},  # never the destination the client named (nothing listens)
        "encoded_path": {"200", "503"},
        "encoded_path_too_long": {"413", "400"},  # the picker's; a worker's while it is bypassed
        "encoded_slash": {"400"},
        "trailers": {"200", "503"},
        "trailers_only": {"400"},
        "big_body": {"413"},
        "session_too_long": {"400", "200"},
    }.items():
        assert set(by_kind[kind]) <= allowed, (kind, by_kind[kind])
    assert not summary["answers"]["stalled"]


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
    assert 0 < leaks["last_picker_sessions"]["pinned"] <= summary["config"]["session_max_pins"]
    bounds = summary["bounds"]
    assert len(summary["picker_processes"]) == 2
    for life in summary["picker_processes"]:
        assert life["rss_growth_mib"] <= bounds["rss_growth_mib"], life
        assert life["fd_growth"] <= bounds["fd_growth"], life


def _result(
    kind: str, status: int | None, outcome: str, *, t: float = 10.0, reason: str | None = None, worker="w0"
):
    soak_requests = load_benchmark_module("soak_requests")
    worker = worker if reason is None and status is not None else None
    return soak_requests.Result(0, kind, t, t + 0.1, status, outcome, worker=worker, reason=reason)


def _fault(kind: str, start: float = 5.0, end: float = 8.0):
    soak_requests = load_benchmark_module("soak_requests")
    return soak_requests.Fault(kind, kind, 0, injected_s=start, recovered_s=end)


KILL, PICKER = ("kill", 9.5, 11.0), ("picker", 9.5, 11.0)  # fault windows around the request at 10 s
W = None  # a worker's own answer: no dropped-reason header, its x-worker-id


@pytest.mark.parametrize(
    "kind, status, reason, outcome, faults, verdict",
    [
        ("chat", 200, W, "ok", [], "expected"),
        ("invalid", 400, "invalid-request", "status", [], "expected"),
        ("invalid", 400, W, "status", [], None),  # the picker must refuse it, not the worker
        ("body_too_large", 413, "body-too-large", "status", [], "expected"),
        ("cancel_early", None, W, "cancelled", [], "cancelled"),
        ("chat", 503, W, "status", [], None),  # a 503 with no fault going on
        ("chat", 503, "upstream-unavailable", "status", [KILL], "worker-fault"),  # Envoy's local reply
        ("chat", 503, "upstream-unavailable", "status", [("kill", 2.0, 5.0)], None),  # back long before
        ("chat_stream", 200, W, "truncated", [KILL], "worker-fault"),
        ("chat_stream", 200, W, "bad-body", [KILL], None),
        ("chat", 503, "upstream-unavailable", "status", [("nats", 9.5, 11.0)], None),  # NATS costs nothing
        ("invalid", 200, W, "ok", [], None),  # the picker must refuse an invalid body
        ("invalid", 200, W, "ok", [PICKER], "picker-bypassed"),  # the worker served it
        ("body_too_large", 413, W, "status", [PICKER], "picker-bypassed"),  # the worker's 1 MiB limit
        ("chat", None, W, "unanswered", [KILL], None),
        ("chat", None, W, "error", [PICKER], None),
        # hostile requests
        ("owned_headers", 200, W, "ok", [], "expected"),
        ("owned_headers", 503, "upstream-unavailable", "status", [], None),  # the client's destination
        ("encoded_path", 200, W, "ok", [], "expected"),
        ("encoded_path_too_long", 413, "prompt-too-long", "status", [], "expected"),  # parsed as chat
        ("encoded_path_too_long", 400, W, "status", [], None),  # the worker's: the picker missed it
        ("encoded_path_too_long", 400, W, "status", [PICKER], "picker-bypassed"),
        ("encoded_slash", 400, "invalid-request", "status", [], "expected"),
        ("encoded_slash", 200, W, "ok", [PICKER], None),  # Envoy refuses it with or without a picker
        ("trailers", 200, W, "ok", [], "expected"),
        ("trailers", 504, "picker-timeout", "status", [], None),  # held until Envoy's message timeout
        ("trailers_only", 400, "invalid-request", "status", [], "expected"),
        ("big_body", 413, W, "status", [], "expected"),  # routed; the mock worker's own body limit
        ("big_body", 413, "body-too-large", "status", [], None),  # refused before reaching a worker
        ("big_body", 504, "picker-timeout", "status", [], None),
        ("session", 200, W, "ok", [], "expected"),
        ("session_too_long", 400, "invalid-request", "status", [], "expected"),
        ("session_too_long", 200, W, "ok", [], None),  # the picker must refuse it
        ("session_too_long", 200, W, "ok", [PICKER], "picker-bypassed"),
        ("colliding_id", 200, W, "ok", [], "expected"),
    ],
)
def test_judge_accepts_only_documented_answers(kind, status, reason, outcome, faults, verdict) -> None:
    soak_requests = load_benchmark_module("soak_requests")
    windows = [_fault(k, start, end) for k, start, end in faults]
    assert soak_requests.judge(_result(kind, status, outcome, reason=reason), windows) == verdict


def test_every_kind_is_planned_and_the_hostile_ones_look_as_documented() -> None:
    soak_requests = load_benchmark_module("soak_requests")
    plans = [soak_requests.request_plan(i, 11, "127.0.0.1:1") for i in range(400)]
    by_kind = {p.kind: p for p in reversed(plans)}
    assert set(by_kind) == set(soak_requests.MIX) == set(soak_requests.EXPECTED)
    assert [p.kind for p in plans[: len(soak_requests.MIX)]] == list(soak_requests.MIX)  # each at once
    assert by_kind["owned_headers"].headers["x-gateway-destination-endpoint"] == "127.0.0.1:1"
    assert by_kind["encoded_slash"].path == "/v1%2Fchat/completions"
    assert by_kind["trailers"].trailers and by_kind["trailers_only"].body == b""
    assert len(by_kind["big_body"].body) > 3 * 1024 * 1024 - 4096
    sessions = [p for p in plans if p.kind == "session_too_long"]
    assert all(len(json.dumps(p.headers) + p.body.decode()) > 257 for p in sessions)


def test_a_picker_503_is_not_excused_by_a_worker_fault() -> None:
    soak_requests = load_benchmark_module("soak_requests")
    refused = _result("chat", 503, "status", reason="rejected-no-endpoints")
    assert soak_requests.judge(refused, [_fault("kill", 9.5, 11.0)]) is None


def test_a_fault_that_slips_to_the_tail_still_gets_traffic_before_the_tail_waits() -> None:
    """The faults run one after another: when the first ones take long to recover, the last may
    come due after the tail has begun. Traffic then goes on into it, and the tail waits only once
    the last fault is in with requests started during it (CI: a slow picker restart made the tail
    wait before NATS was stopped, and the NATS fault ran with no request)."""
    soak = load_benchmark_module("soak")
    run = soak.Soak(soak.SoakConfig(requests=600, faults=("kill:w0", "nats")), stack=None, t0=0.0)
    run.started = 480  # the tail
    assert not run._tail_waits()  # the last fault is not in yet: traffic goes on
    run.started_at_last_fault = 500
    run.started = 500 + soak.MIN_REQUESTS_DURING_FAULT - 1
    assert not run._tail_waits()
    run.started += 1
    assert run._tail_waits()  # enough traffic during the last fault: wait until it is recovered
    run.tail_released = True  # the wait's bound ran out: the rest go on (the fault fails its check)
    assert not run._tail_waits()
    run.tail_released = False
    run.faults_done.set()
    assert not run._tail_waits()
