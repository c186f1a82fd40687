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
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

STAGES = ("parse", "tokenize", "hash", "match", "select", "queue")
_STAGE_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 1, 5, 30,
)  # fmt: skip
_REGRET_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)

OUTCOMES = {"complete": "completed", "cancelled": "cancelled", "stream_closed": "cancelled"}


class PickMetrics:
    """The picker's request-path metrics, in their own registry (the admin server adds the rest)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("extproc_requests", "Requests by outcome.", ["model", "outcome"], registry=r)
        self.rejections = Counter(
            "extproc_rejections", "Error answers by HTTP status and reason.", ["status", "reason"], registry=r
        )
        self.stage = Histogram(
            "extproc_decision_stage_seconds",
            "Time spent in each stage of a routing decision.",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )
        self._stages = {name: self.stage.labels(name) for name in STAGES}
        self.overlap = Counter(
            "extproc_overlap_blocks",
            "Prompt blocks cached on the chosen worker (which=chosen) and the best candidate (which=best).",
            ["model", "which"],
            registry=r,
        )
        self.regret = Histogram(
            "extproc_overlap_regret_blocks",
            "Per request: best available overlap minus the chosen worker's overlap, in blocks.",
            ["model"],
            buckets=_REGRET_BUCKETS,
            registry=r,
        )
        self.sessions = Counter(
            "extproc_session_pins", "Sticky-session pin events.", ["model", "event"], registry=r
        )
        self.upstream = Counter(
            "extproc_upstream_responses",
            "Response status of routed requests, per worker (Envoy's 503 for a failed connection included).",
            ["model", "worker", "status"],
            registry=r,
        )
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
        for name, ns in timings_ns.items():
            hist = self._stages.get(name)
            if hist is not None:
                hist.observe(ns / 1e9)

    def routed(self, model: str, overlap: int, best: int) -> None:
        self.requests.labels(model, "routed").inc()
        if best:
            self.overlap.labels(model, "chosen").inc(overlap)
            self.overlap.labels(model, "best").inc(best)
        self.regret.labels(model).observe(max(0, best - overlap))

    def finished(self, model: str, cause: str) -> None:
        outcome = OUTCOMES.get(cause, "upstream_error" if cause.startswith("upstream_status") else cause)
        self.requests.labels(model, outcome).inc()

    def disagg(self, model: str, local_reason: str | None) -> None:
        """A disaggregated model's request: `local_reason` None when a prefill worker was named."""
        where = "remote" if local_reason is None else "local"
        self.disagg_decisions.labels(model, where, local_reason or "").inc()

    def rejected(self, status: int, reason: str) -> None:
        self.rejections.labels(str(status), reason).inc()

    def upstream_answered(self, model: str, worker: str, status: int) -> tuple[int, int]:
        """Count a worker's response status; returns its consecutive 5xx answers before and after
        this one (4xx and other statuses leave the run as it is)."""
        self.upstream.labels(model, worker, str(status)).inc()
        key = (model, worker)
        before = self._failures.get(key, 0)
        after = before + 1 if status >= 500 else 0 if 200 <= status < 300 else before
        if after != before:
            self._failures[key] = after
            self.consecutive_failures.labels(model, worker).set(after)
        return before, after
