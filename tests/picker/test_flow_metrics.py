"""The Inference Extension's flow-control series (`inference_extension_flow_control_*`), as the
admission queue records them: what waits now, for how long, and how each request left. Through the
servicer and a real picker: tests/epp/test_service_scheduler_metrics.py."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from extproc.picker.flow_metrics import (
    DISPATCHED,
    EVICTED_CANCELLED,
    EVICTED_TTL,
    HELP,
    OTHER,
    PREFIX,
    Flow,
    FlowMetrics,
)
from extproc.picker.inference_extension import queue_entry
from extproc.picker.pick import ObjectiveLabels
from extproc.router import QueuedRequest, QueueTimeout

from .test_admission import decider, make, saturate, until

LABELS = ObjectiveLabels("asked", "sent")


class Scrape:
    def __init__(self, metrics: FlowMetrics) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(metrics)

    def __call__(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(f"{PREFIX}{name}", labels)


def flow_labels(fairness_id: str = "tenant", **extra: str) -> dict[str, str]:
    return {
        "fairness_id": fairness_id, "priority": "2", "inference_pool": "pool",
        "model_name": "asked", "target_model_name": "sent", **extra,
    }  # fmt: skip


def flow(metrics: FlowMetrics, fairness_id: str | None = "tenant", size: int = 100) -> Flow:
    return metrics.flow(fairness_id, 2, "model", LABELS, size)


async def test_a_request_with_room_is_dispatched_at_once_and_never_counted_waiting() -> None:
    metrics = FlowMetrics("pool")
    router, gate = make(flow_metrics=metrics)
    scrape = Scrape(metrics)
    await gate.admit(QueuedRequest("r", 0.0), decider(router, "r", []), flow=flow(metrics))
    assert scrape("request_queue_duration_seconds_count", **flow_labels(outcome=DISPATCHED)) == 1
    assert scrape("request_queue_duration_seconds_sum", **flow_labels(outcome=DISPATCHED)) == 0
    assert scrape("queue_size", **flow_labels()) is None
    assert scrape("dispatch_cycle_duration_seconds_count") is None  # no pass over waiting requests


async def test_waiting_requests_are_counted_with_their_bytes_until_dispatched() -> None:
    metrics = FlowMetrics("pool")
    router, gate = make(flow_metrics=metrics)
    scrape = Scrape(metrics)
    saturate(router)
    tasks = [
        asyncio.create_task(
            gate.admit(QueuedRequest(r, 0.0), decider(router, r, []), flow=flow(metrics, size=s))
        )
        for r, s in (("r1", 100), ("r2", 250))
    ]
    await until(lambda: len(gate) == 2)
    assert scrape("queue_size", **flow_labels()) == 2
    assert scrape("queue_bytes", **flow_labels()) == 350
    router.free("bg-a")
    router.free("bg-b")
    gate.kick()
    results = await asyncio.gather(*tasks)
    assert scrape("queue_size", **flow_labels()) is None  # no request of its labels waits: no series
    assert scrape("queue_bytes", **flow_labels()) is None
    assert scrape("request_queue_duration_seconds_count", **flow_labels(outcome=DISPATCHED)) == 2
    waited = scrape("request_queue_duration_seconds_sum", **flow_labels(outcome=DISPATCHED))
    assert waited == pytest.approx(sum(w for _, w in results), rel=0.5) and waited > 0
    cycles = scrape("dispatch_cycle_duration_seconds_count")
    assert cycles is not None and cycles >= 1
    assert scrape("dispatch_cycle_duration_seconds_sum") < cycles * 1.0  # each pass well under a second


async def test_a_request_whose_wait_runs_out_is_evicted_by_its_ttl() -> None:
    metrics = FlowMetrics("pool")
    router, gate = make(max_wait_s=0.05, flow_metrics=metrics)
    scrape = Scrape(metrics)
    saturate(router)
    for request_id, sheddable in (("r", False), ("s", True)):  # a 503 and a 429 alike
        with pytest.raises(QueueTimeout):
            entry = QueuedRequest(request_id, 0.0, sheddable=sheddable)
            await gate.admit(entry, decider(router, request_id, []), flow=flow(metrics))
    assert scrape("request_queue_duration_seconds_count", **flow_labels(outcome=EVICTED_TTL)) == 2
    assert scrape("request_queue_duration_seconds_sum", **flow_labels(outcome=EVICTED_TTL)) >= 0.1
    assert (
        scrape("request_queue_duration_seconds_bucket", **flow_labels(outcome=EVICTED_TTL), le="0.025") == 0
    )
    assert scrape("queue_size", **flow_labels()) is None


async def test_a_client_leaving_the_queue_is_evicted_as_cancelled() -> None:
    metrics = FlowMetrics("pool")
    router, gate = make(flow_metrics=metrics)
    scrape = Scrape(metrics)
    saturate(router)
    task = asyncio.create_task(
        gate.admit(QueuedRequest("r", 0.0), decider(router, "r", []), flow=flow(metrics))
    )
    await until(lambda: len(gate) == 1)
    assert scrape("queue_size", **flow_labels()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert scrape("request_queue_duration_seconds_count", **flow_labels(outcome=EVICTED_CANCELLED)) == 1
    assert scrape("request_queue_duration_seconds_count", **flow_labels(outcome=DISPATCHED)) is None
    assert scrape("queue_size", **flow_labels()) is None


@pytest.mark.parametrize("queued", [False, True])
async def test_a_request_without_a_flow_and_a_gate_without_metrics_record_nothing(queued: bool) -> None:
    metrics = FlowMetrics("pool")
    router, gate = make(flow_metrics=metrics)
    router2, bare = make()
    if queued:  # both wait, then leave
        saturate(router)
        saturate(router2)
    tasks = [
        asyncio.create_task(gate.admit(QueuedRequest("r", 0.0), decider(router, "r", []))),  # no flow
        asyncio.create_task(
            bare.admit(QueuedRequest("r", 0.0), decider(router2, "r", []), flow=flow(metrics))
        ),
    ]
    if queued:
        await until(lambda: len(gate) == 1 and len(bare) == 1)
        for r in (router, router2):
            r.free("bg-a")
        gate.kick()
        bare.kick()
    await asyncio.gather(*tasks)
    assert list(metrics.duration.series) == [] and metrics.waiting == {}


def test_fairness_ids_are_labels_up_to_a_bound_then_other() -> None:
    metrics = FlowMetrics(max_fairness_labels=2)
    assert [metrics.fairness_label(f) for f in ("a", "b", "a", "c", None, "")] == [
        "a",
        "b",
        "a",
        OTHER,
        "",
        "",
    ]
    assert metrics.fairness_label("b") == "b"  # a kept id stays itself
    long = FlowMetrics()

    def label(header: str) -> str:  # as the picker labels a queued request: by its queue entry's flow
        return long.fairness_label(queue_entry("r", 0.0, 1, {}, None, header).flow)

    assert label("t" * 10_000) == "t" * 256  # as the queue names its flow
    assert label("t" * 256 + "other text") == "t" * 256 and len(long._fairness_ids) == 1


def test_a_flow_is_labelled_with_the_pool_name_else_its_model_and_the_objective_priority() -> None:
    assert FlowMetrics("pool").flow("t", 3, "m", LABELS, 7) == Flow(
        FlowMetrics().flow("t", 3, "pool", LABELS, 7).labels, 7
    )
    labels = FlowMetrics().flow(None, None, "m", LABELS, 7).labels
    assert labels == ("", "0", "m", "asked", "sent")


def test_the_series_carry_the_inference_extensions_names_labels_and_bounds() -> None:
    metrics = FlowMetrics("pool")
    f = flow(metrics)
    metrics.queued(f)
    metrics.left(f, DISPATCHED, 0.3, waited=True)
    metrics.queued(f)
    metrics.dispatch_cycle(0.0004)
    families = {family.name: family for family in metrics.collect()}
    assert sorted(families) == [
        f"{PREFIX}dispatch_cycle_duration_seconds", f"{PREFIX}queue_bytes", f"{PREFIX}queue_size",
        f"{PREFIX}request_queue_duration_seconds",
    ]  # fmt: skip
    duration = families[f"{PREFIX}request_queue_duration_seconds"]
    buckets = [s.labels["le"] for s in duration.samples if s.name.endswith("_bucket")]
    assert (
        buckets[:3] == ["0.0001", "0.0005", "0.001"]
        and buckets[-2:] == ["60.0", "+Inf"]
        and len(buckets) == 17
    )
    assert {k for s in duration.samples for k in s.labels} == {
        "fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name", "le",
    }  # fmt: skip
    cycle = families[f"{PREFIX}dispatch_cycle_duration_seconds"]
    bounds = [s.labels["le"] for s in cycle.samples if s.name.endswith("_bucket")]
    assert bounds == [
        "0.0001",
        "0.0002",
        "0.0005",
        "0.001",
        "0.002",
        "0.005",
        "0.01",
        "0.02",
        "0.05",
        "0.1",
        "+Inf",
    ]
    assert [s.value for s in families[f"{PREFIX}queue_bytes"].samples] == [100]


def test_one_request_leaving_leaves_the_others_of_its_labels_counted_with_their_bytes() -> None:
    metrics = FlowMetrics("pool")
    first, second = flow(metrics, size=100), flow(metrics, size=250)
    metrics.queued(first)
    metrics.queued(second)
    metrics.left(first, DISPATCHED, 0.5, waited=True)
    scrape = Scrape(metrics)
    assert scrape("queue_size", **flow_labels()) == 1
    assert scrape("queue_bytes", **flow_labels()) == 250
    metrics.left(second, EVICTED_TTL, 0.5, waited=True)
    assert scrape("queue_size", **flow_labels()) is None and metrics.waiting_bytes == {}


def test_each_series_says_what_it_counts() -> None:
    """The HELP a person reads in a metrics browser: ours, for every series."""
    families = {f.name: f.documentation for f in FlowMetrics().collect()}
    assert families == {f"{PREFIX}{name}": text for name, text in HELP.items()}
