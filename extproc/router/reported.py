"""Reported load: what each worker's engine says about itself (KV cache usage, running and waiting
requests), kept beside the router's own view. No I/O; the clock is injected.

Mirrors Dynamo, whose busy detection reads the load the workers publish (`ForwardPassMetrics`:
active over total KV blocks), and the Inference Extension, whose pickers scrape the engines'
Prometheus gauges. Here an edge (extproc/runtime/engine_metrics.py) scrapes and calls
`KvRouter.set_reported_load`; the busy filter (`selection.is_busy`) takes the engine's KV usage
fraction instead of the router's own active decode blocks over the configured `total_blocks`,
while the report is fresh (at most `max_age_s` old). A stale or missing report falls back to the
router's own view, which only counts what this router routed.

Only the decode-blocks threshold uses it: the engines report no prefill token counts, and a
waiting request (vLLM's `num_requests_waiting`, SGLang's `num_queue_reqs`) is not a token count the
prefill thresholds could compare; the counts are kept for /debug/workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from extproc.router.types import Worker


@dataclass(frozen=True, slots=True)
class ReportedLoad:
    """One engine report. `kv_usage` is a fraction in [0, 1]; None where the engine did not say."""

    kv_usage: float | None
    running: int | None
    waiting: int | None
    at: float  # the router's clock, seconds, when the report arrived
    max_age_s: float  # older than this, the report is stale


class ReportedLoads:
    """The latest report per worker (dp rank), and whether it is fresh at the clock's now."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._loads: dict[Worker, ReportedLoad] = {}

    def __len__(self) -> int:
        return len(self._loads)

    def set(
        self,
        worker: Worker,
        *,
        kv_usage: float | None,
        running: int | None,
        waiting: int | None,
        max_age_s: float,
        at: float | None = None,
    ) -> ReportedLoad:
        """Record a report (stamped now unless `at`); a KV usage is clamped to [0, 1]."""
        if kv_usage is not None:
            kv_usage = min(1.0, max(0.0, kv_usage))
        load = ReportedLoad(kv_usage, running, waiting, self._clock() if at is None else at, max_age_s)
        self._loads[worker] = load
        return load

    def get(self, worker: Worker) -> ReportedLoad | None:
        """The latest report, fresh or not."""
        return self._loads.get(worker)

    def age_s(self, worker: Worker) -> float | None:
        load = self._loads.get(worker)
        return None if load is None else max(0.0, self._clock() - load.at)

    def fresh_kv_usage(self, worker: Worker) -> float | None:
        """The engine's KV usage fraction if a fresh report has one, else None (use the router's view)."""
        load = self._loads.get(worker)
        if load is None or load.kv_usage is None or self._clock() - load.at > load.max_age_s:
            return None
        return load.kv_usage

    def drop(self, worker: Worker) -> None:
        self._loads.pop(worker, None)
