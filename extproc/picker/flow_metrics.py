"""The Inference Extension's flow-control series, kept by the admission queue, so a dashboard or alert
built on GIE's or llm-d's picker reads ours unchanged.

Our admission queue (`--router-queue-threshold`, `AdmissionGate`) is what the Inference Extension
calls flow control: requests wait while every eligible worker is saturated and leave in policy and
fairness order. Names, label names, meanings and bucket bounds are those of llm-d's picker
(`pkg/epp/metrics/metrics.go`, `flowcontrol/controller/internal/item.go`, read at
llm-d-inference-scheduler 520af47):

    inference_extension_flow_control_request_queue_duration_seconds
        {fairness_id, priority, outcome, inference_pool, model_name, target_model_name}
        per request the queue admitted or held, from its arrival to its outcome: `Dispatched` (decided
        at once, or after waiting), `EvictedTTL` (its bounded wait ran out: a 503, or a 429 for a
        sheddable request) or `EvictedContextCancelled` (its client went away)
    inference_extension_flow_control_queue_size{fairness_id, priority, inference_pool, model_name,
        target_model_name}                                 requests waiting now
    inference_extension_flow_control_queue_bytes{...}       their request bodies' bytes
    inference_extension_flow_control_dispatch_cycle_duration_seconds   one pass over the waiting
        requests, deciding those whose workers have room

Nothing is recorded while the queue is off (no `--router-queue-threshold`): the picker then has no
flow control, as the Inference Extension's picker without its flow-control feature.

Labels: `priority` is the request's InferenceObjective's (0 without one), never a body's hint.
`fairness_id` is the `x-gateway-inference-fairness-id` header a client (or its gateway) sent, as
the queue's round-robin fairness names its flow (`queue_entry`: the first 256 characters); the first
`MAX_FAIRNESS_LABELS` distinct ids are kept as labels and any later one is `other`, so a client
cannot grow the series without bound.
`inference_pool` is `--pool-name` (else the model); the models are the per-request series' labels
(`extproc.picker.pick.ObjectiveLabels`). Not rendered: the pool's saturation (ours is each
worker's load against `--router-queue-threshold`: `extproc_worker_active_prefill_tokens`) and the
time to enqueue (no more than a heap push here).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.picker.metrics import LabelledHistogram
from extproc.picker.pick import ObjectiveLabels

DISPATCHED = "Dispatched"
EVICTED_TTL = "EvictedTTL"
EVICTED_CANCELLED = "EvictedContextCancelled"
MAX_FAIRNESS_LABELS = 32  # distinct fairness ids kept as labels; later ones are OTHER
OTHER = "other"
PREFIX = "inference_extension_flow_control_"

_QUEUE_SECONDS = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_CYCLE_SECONDS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_FLOW_LABELS = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]
# series (after PREFIX) -> its HELP (what a person reads in a metrics browser)
HELP: dict[str, str] = {
    "request_queue_duration_seconds": (
        "Seconds from a request's arrival at the admission queue to its outcome."
    ),
    "dispatch_cycle_duration_seconds": (
        "Seconds one pass over the waiting requests took, deciding those whose workers have room."
    ),
    "queue_size": "Requests waiting in the admission queue now.",
    "queue_bytes": "Body bytes of the requests waiting in the admission queue now.",
}


class FlowLabels(NamedTuple):
    fairness_id: str
    priority: str
    inference_pool: str
    model_name: str
    target_model_name: str


@dataclass(frozen=True, slots=True)
class Flow:
    """What the queue records for one request: its labels and its body's size."""

    labels: FlowLabels
    size_bytes: int


class FlowMetrics(Collector):
    """The series above, as plain numbers per label tuple; a collector of its own."""

    def __init__(self, pool_name: str | None = None, max_fairness_labels: int = MAX_FAIRNESS_LABELS) -> None:
        self.pool_name = pool_name  # `--pool-name`: every request's pool (else its model's)
        self.max_fairness_labels = max_fairness_labels
        self._fairness_ids: set[str] = set()
        self.waiting: Counter[FlowLabels] = Counter()
        self.waiting_bytes: Counter[FlowLabels] = Counter()
        self.duration = LabelledHistogram(
            f"{PREFIX}request_queue_duration_seconds",
            HELP["request_queue_duration_seconds"],
            ["fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"],
            _QUEUE_SECONDS,
        )
        self.cycles = LabelledHistogram(
            f"{PREFIX}dispatch_cycle_duration_seconds",
            HELP["dispatch_cycle_duration_seconds"],
            [],
            _CYCLE_SECONDS,
        )

    def fairness_label(self, fairness_id: str | None) -> str:
        """`fairness_id` (the queue's flow name, `QueuedRequest.flow`: cut to its length already) as
        a label: itself while at most `max_fairness_labels` distinct ids were seen."""
        if not fairness_id:
            return ""
        if fairness_id in self._fairness_ids:
            return fairness_id
        if len(self._fairness_ids) < self.max_fairness_labels:
            self._fairness_ids.add(fairness_id)
            return fairness_id
        return OTHER

    def flow(
        self,
        fairness_id: str | None,
        priority: int | None,
        model: str,
        labels: ObjectiveLabels,
        size_bytes: int,
    ) -> Flow:
        """A request's `Flow`: its fairness header, objective's priority, the pool of `model` (the
        one whose workers serve it), its labels and its body's size."""
        return Flow(
            FlowLabels(
                self.fairness_label(fairness_id),
                str(priority or 0),
                self.pool_name or model,
                labels.model_name,
                labels.target_model_name,
            ),
            size_bytes,
        )

    def queued(self, flow: Flow) -> None:
        """A request started waiting."""
        self.waiting[flow.labels] += 1
        self.waiting_bytes[flow.labels] += flow.size_bytes

    def left(self, flow: Flow, outcome: str, seconds: float, *, waited: bool) -> None:
        """A request left the queue with `outcome` after `seconds`; `waited` when `queued` saw it."""
        labels = flow.labels
        if waited:
            self.waiting[labels] -= 1
            self.waiting_bytes[labels] -= flow.size_bytes
            if self.waiting[labels] <= 0:  # the last of its labels: forgotten
                del self.waiting[labels], self.waiting_bytes[labels]
        fairness_id, priority, pool, model, target = labels
        self.duration.observe((fairness_id, priority, outcome, pool, model, target), seconds)

    def dispatch_cycle(self, seconds: float) -> None:
        self.cycles.observe((), seconds)

    def collect(self) -> Iterator[Metric]:
        yield from self.duration.collect()
        yield from self.cycles.collect()
        size = GaugeMetricFamily(f"{PREFIX}queue_size", HELP["queue_size"], labels=_FLOW_LABELS)
        size_bytes = GaugeMetricFamily(f"{PREFIX}queue_bytes", HELP["queue_bytes"], labels=_FLOW_LABELS)
        for labels, count in sorted(self.waiting.items()):
            size.add_metric(list(labels), count)
            size_bytes.add_metric(list(labels), self.waiting_bytes[labels])
        yield from (size, size_bytes)
