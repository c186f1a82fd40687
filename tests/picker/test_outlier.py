"""Outlier ejection: consecutive 5xx answers take a worker out of routing for a growing while."""

from __future__ import annotations

from dataclasses import replace

from extproc.picker.outlier import OutlierEjection
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import chat_body, picker_config

POOL = ("w0", "w1", "w2", "w3")


def fail(ejection: OutlierEjection, wid: str, times: int, now: float) -> list[float | None]:
    return [ejection.answered(wid, 503, now, POOL) for _ in range(times)]


def test_five_failures_in_a_row_eject_for_a_time_that_grows_with_each_ejection():
    ejection = OutlierEjection(consecutive=5, base_s=10.0)
    assert fail(ejection, "w0", 5, now=0.0) == [None] * 4 + [10.0]
    assert ejection.ejected(9.9, POOL) == {"w0"} and ejection.ejected(10.0, POOL) == set()
    assert fail(ejection, "w0", 5, now=11.0)[-1] == 20.0  # still failing when back: twice as long
    ejection.answered("w0", 200, 40.0, POOL)  # a success resets both counts
    assert fail(ejection, "w0", 5, now=41.0)[-1] == 10.0


def test_a_success_breaks_the_run_and_client_errors_leave_it():
    ejection = OutlierEjection(consecutive=3)
    fail(ejection, "w0", 2, now=0.0)
    ejection.answered("w0", 200, 0.0, POOL)
    assert fail(ejection, "w0", 2, now=0.0) == [None, None]
    ejection.answered("w0", 404, 0.0, POOL)  # the worker answered; says nothing of its health
    assert ejection.answered("w0", 502, 0.0, POOL) is not None


def test_at_most_half_the_pool_is_ejected_and_never_the_last_worker():
    ejection = OutlierEjection(consecutive=1)
    assert [ejection.answered(w, 503, 0.0, POOL) is not None for w in POOL] == [True, True, False, False]
    assert ejection.answered("solo", 503, 0.0, ("solo",)) is None


def test_off_when_consecutive_is_zero():
    ejection = OutlierEjection(consecutive=0)
    assert fail(ejection, "w0", 50, now=0.0) == [None] * 50 and not ejection.ejected(0.0, POOL)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def pick(picker, text, request_id):
    body = chat_body(text)
    return await picker.pick(
        body=body, path="/v1/chat/completions", headers={}, subset=None, client_request_id=request_id
    )


async def test_the_picker_stops_routing_to_a_failing_worker_until_its_ejection_ends():
    clock = Clock()
    picker = EndpointPicker(replace(picker_config(3), outlier_consecutive_5xx=3), clock=clock)
    chosen = []
    for i in range(30):  # w0 answers 503 every time (Envoy cannot reach it); the others 200
        p = await pick(picker, f"request {i} " * 20, f"r{i}")
        chosen.append(p.worker.worker_id)
        status = 503 if p.worker.worker_id == "w0" else 200
        picker.answered(p, status)  # what the service reports from the response headers
        picker.finish(p, "upstream_status_503" if status == 503 else "complete")
    assert chosen.count("w0") == 3, chosen  # three failures, then no more requests
    assert picker.metrics.registry.get_sample_value(
        "extproc_worker_ejections_total", {"model": "demo-model", "worker": "w0"}
    ) == 1  # fmt: skip
    clock.now = 10.0  # the ejection is over: w0 takes requests again
    again = [await pick(picker, f"later {i} " * 20, f"l{i}") for i in range(6)]
    assert "w0" in {p.worker.worker_id for p in again}
    for p in again:
        picker.answered(p, 200)
        picker.finish(p, "complete")
    assert picker.is_idle()
