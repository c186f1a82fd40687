"""PickMetrics: what the request path counts and times, as Prometheus metrics.

Updated as requests pass (the scrape-time view of routers and event sources is `metrics.py`):
- `extproc_requests_total{model, outcome}`: routed, completed, upstream_error, cancelled;
- `extproc_rejections_total{status, reason}`: every error answer the picker gave;
- `extproc_decision_stage_seconds{stage}`: parse, tokenize, hash, match, select, queue;
- `extproc_overlap_blocks_total{model, which}`: overlap of the chosen worker and the best available,
  and `extproc_overlap_regret_blocks{model}`: their difference per request (what load cost us);
- `extproc_session_pins_total{model, event}`: pinned, moved (its worker left or was busy), closed;
- `extproc_upstream_responses_total{model, worker, status}`: the status each routed request got back
  (Envoy's own 503 when it could not connect included), and
  `extproc_worker_consecutive_failures{model, worker}`: 5xx answers in a row (a 2xx resets it).
  Observed only: routing does not use them.

The metrics every request touches (requests, stages, overlap, regret, upstream responses) are plain
counts on the request path, rendered at scrape time by `_RequestPathCollector` (as
`extproc.groups.metrics` does): a prometheus_client child costs a label lookup and a lock per call,
several times per request. The rest are prometheus_client metrics.
"""

from __future__ import annotations

import bisect
from collections import Counter as Counts
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

STAGES = ("parse", "tokenize", "hash", "match", "select", "queue")
_STAGE_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 1, 5, 30,
)  # fmt: skip
_REGRET_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
_TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60,
)  # fmt: skip
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1)
_TOKEN_BUCKETS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
_RATE_BUCKETS = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1)

OUTCOMES = {"complete": "completed", "cancelled": "cancelled", "stream_closed": "cancelled"}


class LabelledCounts:
    """A counter family kept as plain numbers per label tuple; `collect()` renders it."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self.values: Counts[tuple[str, ...]] = Counts()

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, value in list(self.values.items()):
            family.add_metric(key, value)
        return [family]


class LabelledHistogram:
    """A histogram family kept as plain bucket counts per label tuple (`le` buckets, +Inf last)."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self.bounds = tuple(float(b) for b in buckets)
        self._bucket_names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def child(self, key: tuple[str, ...]) -> tuple[list[int], list[float]]:
        """(bucket counts, [sum]) of one label tuple, created empty on first use."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = ([0] * (len(self.bounds) + 1), [0.0])
        return series

    def observe(self, key: tuple[str, ...], value: float) -> None:
        counts, total = self.child(key)
        counts[bisect.bisect_left(self.bounds, value)] += 1
        total[0] += value

    def collect(self) -> list[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, (counts, total) in list(self.series.items()):
            cumulative, buckets = 0, []
            for bucket, count in zip(self._bucket_names, counts, strict=True):
                cumulative += count
                buckets.append((bucket, cumulative))
            family.add_metric(list(key), buckets, total[0])
        return [family]


class _RequestPathCollector(Collector):
    def __init__(self, families: Sequence[LabelledCounts | LabelledHistogram]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield from family.collect()


class PickMetrics:
    """The picker's request-path metrics, in their own registry (the admin server adds the rest)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = LabelledCounts("extproc_requests", "Requests by outcome.", ["model", "outcome"])
        self.rejections = Counter(
            "extproc_rejections", "Error answers by HTTP status and reason.", ["status", "reason"], registry=r
        )
        self.stage = LabelledHistogram(
            "extproc_decision_stage_seconds",
            "Time spent in each stage of a routing decision.",
            ["stage"],
            _STAGE_BUCKETS,
        )
        self._stages = {name: self.stage.child((name,)) for name in STAGES}
        self._stage_bounds = self.stage.bounds
        self.overlap = LabelledCounts(
            "extproc_overlap_blocks",
            "Prompt blocks cached on the chosen worker (which=chosen) and the best candidate (which=best).",
            ["model", "which"],
        )
        self.regret = LabelledHistogram(
            "extproc_overlap_regret_blocks",
            "Per request: best available overlap minus the chosen worker's overlap, in blocks.",
            ["model"],
            _REGRET_BUCKETS,
        )
        self.sessions = Counter(
            "extproc_session_pins", "Sticky-session pin events.", ["model", "event"], registry=r
        )
        self.upstream = LabelledCounts(
            "extproc_upstream_responses",
            "Response status of routed requests, per worker (Envoy's 503 for a failed connection included).",
            ["model", "worker", "status"],
        )
        # what a request saw, as the picker follows it: Dynamo's router keeps the same five
        self.ttft = LabelledHistogram(
            "extproc_time_to_first_token_seconds",
            "Per streamed answer: from the start of its routing decision to its first token, as Envoy "
            "passed it on (queueing in the picker included; a whole, non-streamed answer is left out).",
            ["model"],
            _TTFT_BUCKETS,
        )
        self.itl = LabelledHistogram(
            "extproc_inter_token_latency_seconds",
            "Per completed streamed answer whose tokens were counted (--router-track-output-blocks): "
            "the mean time between its tokens after the first.",
            ["model"],
            _ITL_BUCKETS,
        )
        self.input_tokens = LabelledHistogram(
            "extproc_input_sequence_tokens",
            "Per routed request: its prompt's tokens.",
            ["model"],
            _TOKEN_BUCKETS,
        )
        self.output_tokens = LabelledHistogram(
            "extproc_output_sequence_tokens",
            "Per completed answer whose tokens were counted (--router-track-output-blocks): the tokens "
            "generated per sequence.",
            ["model"],
            _TOKEN_BUCKETS,
        )
        self.lora_requests = LabelledCounts(
            "extproc_lora_requests",
            "Routed requests that named a LoRA adapter, per adapter (one that neither the config nor "
            'the workers\' /v1/models list counts as adapter="unlisted").',
            ["model", "adapter"],
        )
        self.objective_requests = LabelledCounts(
            "extproc_objective_requests",
            "Requests whose x-gateway-inference-objective header named an objective, per objective (one "
            'that --inference-resources does not list counts as objective="unlisted").',
            ["model", "objective"],
        )
        self.model_rewrites = LabelledCounts(
            "extproc_model_rewrites",
            "Requests an InferenceModelRewrite sent to another model, per rewrite, the model its rule "
            'matched (model="*" for a rule without matches) and the target model.',
            ["rewrite", "model", "target"],
        )
        self.kv_hit_rate = LabelledHistogram(
            "extproc_kv_hit_rate",
            "Per routed request: the share of its prompt's blocks cached on the chosen worker, as "
            "predicted when it was routed.",
            ["model"],
            _RATE_BUCKETS,
        )
        r.register(
            _RequestPathCollector(
                [
                    self.requests, self.stage, self.overlap, self.regret, self.upstream, self.ttft,
                    self.itl, self.input_tokens, self.output_tokens, self.kv_hit_rate, self.lora_requests,
                    self.objective_requests, self.model_rewrites,
                ]
            )
        )  # fmt: skip
        self.consecutive_failures = Gauge(
            "extproc_worker_consecutive_failures",
            "5xx answers in a row from a worker (a 2xx answer resets it).",
            ["model", "worker"],
            registry=r,
        )
        self._failures: dict[tuple[str, str], int] = {}
        self.ejections = Counter(
            "extproc_worker_ejections",
            "Times a worker was ejected from routing after failed answers in a row (outlier ejection).",
            ["model", "worker"],
            registry=r,
        )
        self.disagg_decisions = Counter(
            "extproc_disagg_decisions",
            "Requests of disaggregated models: prefilled remotely (where=remote) or on the decode worker "
            "(where=local, reason says why).",
            ["model", "where", "reason"],
            registry=r,
        )

    def observe_stages(self, timings_ns: dict[str, int]) -> None:
        stages, bounds = self._stages, self._stage_bounds
        for name, ns in timings_ns.items():
            series = stages.get(name)
            if series is not None:
                seconds = ns / 1e9
                series[0][bisect.bisect_left(bounds, seconds)] += 1
                series[1][0] += seconds

    def routed(
        self,
        model: str,
        overlap: int,
        best: int,
        prompt_tokens: int = 0,
        blocks: int = 0,
        adapter: str | None = None,
    ) -> None:
        """A request routed: its overlap and the best one; its prompt's tokens and blocks when known;
        the LoRA adapter it named (a listed name or "unlisted": never a client's free text)."""
        self.requests.values[model, "routed"] += 1
        if adapter is not None:
            self.lora_requests.values[model, adapter] += 1
        if prompt_tokens:
            self.input_tokens.observe((model,), prompt_tokens)
        if blocks:
            self.kv_hit_rate.observe((model,), overlap / blocks)
        if best:
            overlap_blocks = self.overlap.values
            overlap_blocks[model, "chosen"] += overlap
            overlap_blocks[model, "best"] += best
        self.regret.observe((model,), max(0, best - overlap))

    def finished(self, model: str, cause: str) -> None:
        outcome = OUTCOMES.get(cause, "upstream_error" if cause.startswith("upstream_status") else cause)
        self.requests.values[model, outcome] += 1

    def answered(self, model: str, output_tokens: int, decode_s: float | None) -> None:
        """A completed answer whose tokens were counted: `output_tokens` per sequence, generated in
        `decode_s` after the first (None: not streamed, no first token seen)."""
        self.output_tokens.observe((model,), output_tokens)
        if decode_s is not None and output_tokens > 1:
            self.itl.observe((model,), decode_s / (output_tokens - 1))

    def disagg(self, model: str, local_reason: str | None) -> None:
        """A disaggregated model's request: `local_reason` None when a prefill worker was named."""
        where = "remote" if local_reason is None else "local"
        self.disagg_decisions.labels(model, where, local_reason or "").inc()

    def rejected(self, status: int, reason: str) -> None:
        self.rejections.labels(str(status), reason).inc()

    def upstream_answered(self, model: str, worker: str, status: int) -> tuple[int, int]:
        """Count a worker's response status; returns its consecutive 5xx answers before and after
        this one (4xx and other statuses leave the run as it is)."""
        self.upstream.values[model, worker, str(status)] += 1
        key = (model, worker)
        before = self._failures.get(key, 0)
        after = before + 1 if status >= 500 else 0 if 200 <= status < 300 else before
        if after != before:
            self._failures[key] = after
            self.consecutive_failures.labels(model, worker).set(after)
        return before, after
