"""The Inference Extension's pool metric names, beside ours, so its dashboards, alerts and autoscalers
(an HPA on `inference_pool_average_kv_cache_utilization`) carry over.

Rendered at scrape time from what the picker already keeps (the engines' scraped loads, the
rewrite counts): nothing is added to the request path. Names, label names and meanings are the
Inference Extension endpoint picker's, as llm-d ships it (`pkg/epp/metrics/metrics.go` and
`collectors/inference_pool.go`, read at llm-d-inference-scheduler 520af47):

    inference_pool_average_kv_cache_utilization{name}      the ready workers' mean KV cache usage (0-1)
    inference_pool_average_queue_size{name}                their mean requests waiting in the engine
    inference_pool_average_running_requests{name}          their mean requests running
    inference_pool_ready_pods{name}                        workers whose engine metrics are fresh
    inference_pool_per_pod_queue_size{name, model_server_pod}   each worker's waiting requests
    inference_extension_model_rewrite_decisions_total{model_rewrite_name, model_name, target_model}
    inference_extension_info{commit, build_ref}            1
    inference_extension_prefix_indexer_size                (worker, cached block) entries the routers know

As there, a worker is ready while its engine's metrics are fresh (`--engine-metrics-interval-ms`,
every second by default; three intervals old is stale), and the averages are over the ready ones,
left out while none is (the Inference Extension's picker then keeps its last values). A pod is a
worker's data-parallel rank, `<worker>-rank-<r>` as llm-d names its endpoints (`-rank-0` with one).
`name` is `--pool-name`, the pool as a whole (its workers counted once, whichever models they
serve); without it, one pool per model, named after the model. A rewrite's `model_name` is the
model its rule names, or `*` for a rule without matches (never a client's free text).

The per-request `inference_objective_*` series and the scheduler's attempts, durations and prefix
matches are the ext_proc servicer's, which sees each request and answer
(`extproc/epp/objective_metrics.py`, `extproc/epp/scheduler_metrics.py`); the flow-control series
are the admission queue's (`extproc/picker/flow_metrics.py`). Not rendered: the scheduler's plugin
latencies (ours, per stage: `extproc_decision_stage_seconds`) and the latency predictor's
(`request_predicted_*`, SLO violations).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import extproc
from extproc.picker.pick import pod_name
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker
from extproc.router.reported import ReportedLoad

# The pool averages over its ready pods: (name, help, a report's value; unknown counts as 0)
AVERAGES: tuple[tuple[str, str, Callable[[ReportedLoad], float]], ...] = (
    (
        "inference_pool_average_kv_cache_utilization",
        "The average kv cache utilization for an inference server pool.",
        lambda report: report.kv_usage or 0.0,
    ),
    (
        "inference_pool_average_queue_size",
        "The average number of requests pending in the model server queue.",
        lambda report: report.waiting or 0,
    ),
    (
        "inference_pool_average_running_requests",
        "The average number of running requests across model servers in the pool.",
        lambda report: report.running or 0,
    ),
)


@dataclass(frozen=True, slots=True)
class _Pod:
    name: str
    report: ReportedLoad | None
    fresh: bool


class InferenceExtensionMetricsCollector(Collector):
    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker

    def collect(self) -> Iterator[Metric]:
        averages = [
            (GaugeMetricFamily(name, documentation, labels=["name"]), value)
            for name, documentation, value in AVERAGES
        ]
        ready = GaugeMetricFamily(
            "inference_pool_ready_pods",
            "The number of ready pods in the inference server pool.",
            labels=["name"],
        )
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "The total number of requests pending in the model server queue for each underlying pod.",
            labels=["name", "model_server_pod"],
        )
        for name, pods in self._pools().items():
            fresh = [pod.report for pod in pods if pod.fresh and pod.report is not None]
            ready.add_metric([name], len(fresh))
            for pod in pods:
                per_pod.add_metric([name, pod.name], (pod.report.waiting if pod.report else None) or 0)
            if fresh:  # as there: nothing to average while no pod is ready
                for family, value in averages:
                    family.add_metric([name], sum(value(r) for r in fresh) / len(fresh))
        yield from (family for family, _ in averages)
        yield from (ready, per_pod)
        rewrites = CounterMetricFamily(
            "inference_extension_model_rewrite_decisions",
            "Total number of inference model rewrite decisions.",
            labels=["model_rewrite_name", "model_name", "target_model"],
        )
        for (rewrite, model, target), count in sorted(self.picker.metrics.model_rewrites.values.items()):
            rewrites.add_metric([rewrite, model, target], count)
        yield rewrites
        size = GaugeMetricFamily(
            "inference_extension_prefix_indexer_size",
            "Size of the prefix indexer: (worker, cached block) entries over every model's workers.",
        )
        size.add_metric([], self._indexed_blocks())
        yield size
        info = GaugeMetricFamily(
            "inference_extension_info",
            "General information of the current build.",
            labels=["commit", "build_ref"],
        )
        info.add_metric(["", f"extproc-{extproc.__version__}"], 1)
        yield info

    def _indexed_blocks(self) -> int:
        """The blocks the routers know cached, once per worker (every dp rank, every tier)."""
        return sum(
            router.indexer.num_blocks(worker)
            for pool in self.picker.pools.values()
            for router in pool.routers()
            for worker in router.workers()
        )

    def _pools(self) -> dict[str, list[_Pod]]:
        """Pool name -> its workers (each data-parallel rank a pod), each counted once."""
        pool_name = self.picker.config.inference_extension.pool.name
        pools: dict[str, dict[tuple[str, int], _Pod]] = {}
        for model, pool in self.picker.pools.items():
            pods = pools.setdefault(pool_name or model, {})
            for router in pool.routers():
                for worker in router.workers():
                    key = (pool.endpoint_of(worker), worker.dp_rank)
                    if key not in pods:
                        pods[key] = _pod(router.reported.get(worker), router.reported.age_s(worker), worker)
        return {name: list(pods.values()) for name, pods in pools.items()}


def _pod(report: ReportedLoad | None, age_s: float | None, worker: Worker) -> _Pod:
    fresh = report is not None and age_s is not None and age_s <= report.max_age_s
    return _Pod(pod_name(worker), report, fresh)
