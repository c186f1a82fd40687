"""Dynamo's router metric names, beside ours, so Dynamo dashboards and alerts carry over.

Rendered at scrape time from the numbers the picker already keeps (`PickMetrics`, the routers):
nothing is added to the request path. Names and label names are Dynamo 1.6.1's, as the installed
`ai-dynamo-runtime` package spells them (`dynamo/prometheus_names.py` and the strings of its compiled
`_core` module; `tests/admin/test_dynamo_metrics.py` checks every name below against both):

    dynamo_frontend_worker_active_decode_blocks{worker_id, dp_rank, worker_type}      gauge
    dynamo_frontend_worker_active_prefill_tokens{worker_id, dp_rank, worker_type}     gauge
    dynamo_component_router_worker_registered{router_worker_id, dp_rank, worker_type} gauge (1)
    dynamo_component_router_requests_started_total{router_id}                        requests routed
    dynamo_component_router_requests_total{router_id}                                requests finished
    dynamo_component_router_kv_best_eligible_cached_prefix_tokens_total{phase, model, router_id}
    dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase, model, router_id}
    dynamo_component_router_non_max_overlap_selections_total{worker_type, router_id}
    dynamo_component_router_overlap_blocks_lost{worker_type, router_id}               histogram
    dynamo_router_overhead_block_hashing_ms{router_id}                                histogram
    dynamo_router_overhead_indexer_find_matches_ms{router_id}                         histogram
    dynamo_router_overhead_scheduling_ms{router_id}                                   histogram
    dynamo_component_router_time_to_first_token_seconds{model, router_id}             histogram
    dynamo_component_router_inter_token_latency_seconds{model, router_id}             histogram
    dynamo_component_router_input_sequence_tokens{model, router_id}                   histogram
    dynamo_component_router_output_sequence_tokens{model, router_id}                  histogram
    dynamo_component_router_kv_hit_rate{model, router_id}                             histogram

Every series also carries `model` (Dynamo runs one router per model; a picker serves several, and
worker ids are per model), and the `dynamo_component_*` ones `dynamo_component="router"` (Dynamo's
component name for the KV router). `router_id` is the host name (Dynamo: the frontend's discovery
instance id). `worker_type` is `decode` for decode and aggregated workers, `prefill` for prefill
workers, as in Dynamo; `phase` is `aggregated`, or `decode` for a disaggregated model.

The last five are the picker's own per-request histograms (`extproc_time_to_first_token_seconds`,
...: what it sees of each answer as Envoy passes it on; ITL and output lengths only when it counts
the answers' tokens, `--router-track-output-blocks`).

Dynamo router metrics we cannot produce honestly are left out (the README lists them):
sequence hashing and total overhead (our sequence hashing is inside the select stage; we keep no
per-request total), shared-cache metrics and remote-indexer writes (the picker's KV indexer,
`--kv-indexer-url`, is only queried; its failed queries are counted), backend-reported reused tokens, KV
transfer latency, the router queue gauges (Dynamo's `policy_class` values) and the per-worker
last-TTFT/ITL gauges.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from extproc.picker.metrics import LabelledHistogram
from extproc.picker.pipeline import EndpointPicker

# Stage of `extproc_decision_stage_seconds` -> Dynamo's routing overhead histogram (milliseconds).
OVERHEAD_STAGES = {
    "hash": ("dynamo_router_overhead_block_hashing_ms", "Time spent computing block hashes in milliseconds"),
    "match": (
        "dynamo_router_overhead_indexer_find_matches_ms",
        "Time spent in indexer find_matches in milliseconds",
    ),
    "select": (
        "dynamo_router_overhead_scheduling_ms",
        "Time spent in scheduler worker selection in milliseconds",
    ),
}

WORKER_GAUGES = (
    "dynamo_frontend_worker_active_decode_blocks",
    "dynamo_frontend_worker_active_prefill_tokens",
)
COMPONENT = "router"  # Dynamo's component_names.ROUTER
# Dynamo's per-request router histograms -> the `PickMetrics` attribute holding ours, and Dynamo's help
REQUEST_HISTOGRAMS = {
    "dynamo_component_router_time_to_first_token_seconds": (
        "ttft",
        "Time to first token observed at the router",
    ),
    "dynamo_component_router_inter_token_latency_seconds": (
        "itl",
        "Average inter-token latency observed at the router",
    ),
    "dynamo_component_router_input_sequence_tokens": (
        "input_tokens",
        "Input sequence length in tokens observed at the router",
    ),
    "dynamo_component_router_output_sequence_tokens": (
        "output_tokens",
        "Output sequence length in tokens observed at the router",
    ),
    "dynamo_component_router_kv_hit_rate": ("kv_hit_rate", "Predicted KV cache hit rate at routing time"),
}


def exported_names() -> list[str]:
    """Every metric name this collector exposes (counters with their `_total`)."""
    return [
        *WORKER_GAUGES,
        "dynamo_component_router_worker_registered",
        "dynamo_component_router_requests_started_total",
        "dynamo_component_router_requests_total",
        "dynamo_component_router_kv_best_eligible_cached_prefix_tokens_total",
        "dynamo_component_router_kv_selected_cached_prefix_tokens_total",
        "dynamo_component_router_non_max_overlap_selections_total",
        "dynamo_component_router_overlap_blocks_lost",
        "dynamo_component_router_remote_indexer_query_failures_total",
        *(name for name, _ in OVERHEAD_STAGES.values()),
        *REQUEST_HISTOGRAMS,
    ]


class DynamoMetricsCollector(Collector):
    """Dynamo-named copies of the picker's router metrics, rendered on each scrape."""

    def __init__(self, picker: EndpointPicker, router_id: str | None = None) -> None:
        self.picker = picker
        self.router_id = router_id if router_id is not None else socket.gethostname()

    def collect(self) -> Iterator[Metric]:
        yield from self._workers()
        yield from self._requests()
        yield from self._overhead()
        yield from self._per_request()

    def _workers(self) -> Iterator[Metric]:
        labels = ["worker_id", "dp_rank", "worker_type", "model"]
        decode = GaugeMetricFamily(
            WORKER_GAUGES[0], "Active KV cache decode blocks per worker", labels=labels
        )
        prefill = GaugeMetricFamily(
            WORKER_GAUGES[1], "Active prefill tokens queued per worker", labels=labels
        )
        registered = GaugeMetricFamily(
            "dynamo_component_router_worker_registered",
            "Whether the router currently has this worker/dp_rank registered (1 = registered)",
            labels=["router_worker_id", "dp_rank", "worker_type", "model", "dynamo_component"],
        )
        for model, pool in self.picker.pools.items():
            for router, worker_type in ((pool.router, "decode"), (pool.prefill, "prefill")):
                for worker in router.workers():
                    values = [str(worker.worker_id), str(worker.dp_rank), worker_type, model]
                    decode.add_metric(values, router.sequences.decode_blocks(worker))
                    prefill.add_metric(values, router.sequences.prefill_tokens(worker))
                    registered.add_metric([*values, COMPONENT], 1)
        yield from (decode, prefill, registered)

    def _requests(self) -> Iterator[Metric]:
        metrics = self.picker.metrics
        rid = self.router_id
        labels = ["model", "router_id", "dynamo_component"]
        started = CounterMetricFamily(
            "dynamo_component_router_requests_started_total",
            "Total number of requests admitted by the router scheduler",
            labels=labels,
        )
        finished = CounterMetricFamily(
            "dynamo_component_router_requests_total",
            "Total number of requests processed by the router",
            labels=labels,
        )
        kv_labels = ["phase", "model", "router_id", "dynamo_component"]
        best = CounterMetricFamily(
            "dynamo_component_router_kv_best_eligible_cached_prefix_tokens_total",
            "Raw cached prefix tokens on the best eligible worker at selection time",
            labels=kv_labels,
        )
        selected = CounterMetricFamily(
            "dynamo_component_router_kv_selected_cached_prefix_tokens_total",
            "Raw cached prefix tokens on the selected worker and DP rank",
            labels=kv_labels,
        )
        lost_labels = ["worker_type", "model", "router_id", "dynamo_component"]
        non_max = CounterMetricFamily(
            "dynamo_component_router_non_max_overlap_selections_total",
            "Total admitted scheduler selections with less KV cache overlap than another eligible worker",
            labels=lost_labels,
        )
        lost = HistogramMetricFamily(
            "dynamo_component_router_overlap_blocks_lost",
            "Difference in KV cache overlap between the highest-overlap eligible worker and selected worker",
            labels=lost_labels,
        )
        counts = dict(metrics.requests.values)
        overlap = dict(metrics.overlap.values)
        regret = metrics.regret
        for model, pool in self.picker.pools.items():
            routed = counts.get((model, "routed"), 0)
            done = sum(n for (m, outcome), n in counts.items() if m == model and outcome != "routed")
            started.add_metric([model, rid, COMPONENT], routed)
            finished.add_metric([model, rid, COMPONENT], done)
            block_size = pool.router.config.block_size
            phase = "decode" if pool.disaggregated else "aggregated"
            best.add_metric([phase, model, rid, COMPONENT], overlap.get((model, "best"), 0) * block_size)
            selected.add_metric(
                [phase, model, rid, COMPONENT], overlap.get((model, "chosen"), 0) * block_size
            )
            # Dynamo observes overlap lost only when positive; ours observes every request's
            buckets, total, n = _cumulative(regret, (model,), above_zero=True)
            non_max.add_metric(["decode", model, rid, COMPONENT], n)
            lost.add_metric(["decode", model, rid, COMPONENT], buckets, total)
        failures = CounterMetricFamily(
            "dynamo_component_router_remote_indexer_query_failures_total",
            "Total number of remote indexer overlap queries that failed (--kv-indexer-url)",
            labels=["router_id", "dynamo_component"],
        )
        indexer = self.picker.kv_indexer
        failures.add_metric([rid, COMPONENT], indexer.counters["kv_indexer.query_failed"] if indexer else 0)
        yield from (started, finished, best, selected, non_max, lost, failures)

    def _overhead(self) -> Iterator[Metric]:
        stage = self.picker.metrics.stage
        for name, (metric, documentation) in OVERHEAD_STAGES.items():
            family = HistogramMetricFamily(metric, documentation, labels=["router_id"])
            counts, total = stage.child((name,))
            bounds = [floatToGoString(b * 1000) for b in stage.bounds] + ["+Inf"]
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, list(counts), strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([self.router_id], buckets, total[0] * 1000)
            yield family

    def _per_request(self) -> Iterator[Metric]:
        labels = ["model", "router_id", "dynamo_component"]
        for name, (attribute, documentation) in REQUEST_HISTOGRAMS.items():
            ours: LabelledHistogram = getattr(self.picker.metrics, attribute)
            family = HistogramMetricFamily(name, documentation, labels=labels)
            for model in self.picker.pools:
                buckets, total, _ = _cumulative(ours, (model,))
                family.add_metric([model, self.router_id, COMPONENT], buckets, total)
            yield family


def _cumulative(
    histogram: LabelledHistogram, key: tuple[str, ...], *, above_zero: bool = False
) -> tuple[list[tuple[str, int]], float, int]:
    """The histogram's series `key` (zeros when it has none): (cumulative buckets, sum, count); with
    `above_zero`, its observations above zero only."""
    counts, total = histogram.series.get(key) or ([0] * (len(histogram.bounds) + 1), [0.0])
    bounds = [*histogram.bounds, float("inf")]
    cumulative, buckets = 0, []
    for bound, count in zip(bounds, list(counts), strict=True):
        if above_zero and bound <= 0:
            continue
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else floatToGoString(bound), cumulative))
    return buckets, total[0], cumulative
