"""Scraping the engines' own Prometheus metrics (KV cache usage, running and waiting requests) ->
`EngineMetricsConfig`. The file section is `engine-metrics:`.

extproc/runtime/engine_metrics.py does the scraping; this module only says where and how often.

On by default, every second: Dynamo's busy thresholds read the load the workers publish, and the
Inference Extension's pickers scrape the engines' gauges (every 50 ms by default); without it the
decode-blocks threshold divides what this picker routed by a configured `total-blocks` (16384 for
every DNS-discovered worker), blind to load from elsewhere. One GET per worker per interval, at
most MAX_CONCURRENT_SCRAPES at once, each bounded in time and size; 0 turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from extproc.config.options import ConfigError, Option, Reader, check_positive

SECTION = "engine-metrics"
MAX_CONCURRENT_SCRAPES = 16  # scrapes in flight at once, whatever the number of workers
STALE_AFTER_INTERVALS = 3  # a report older than this many intervals is stale


@dataclass(frozen=True, slots=True)
class EngineMetricsConfig:
    """Where each worker's metrics are and how often they are read."""

    interval_s: float = 1.0  # 0 = off
    timeout_s: float = 1.0  # per scrape: connect, headers and body
    port: int | None = None  # None: the worker's own port (vLLM and SGLang serve /metrics there)
    path: str = "/metrics"
    max_bytes: int = 4 * 1024 * 1024  # a larger body is an error (vLLM's is ~30-200 KB per engine)

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    @property
    def stale_after_s(self) -> float:
        """A report older than this falls back to the router's own view."""
        return STALE_AFTER_INTERVALS * self.interval_s


ENGINE_METRICS_INTERVAL_MS = Option(
    "--engine-metrics-interval-ms",
    int,
    1000,
    "Scrape each worker's Prometheus metrics (vLLM's and SGLang's KV cache usage, running and "
    "waiting requests) this often; busy thresholds and /debug/workers use the engine's numbers "
    "while fresh (3 intervals). 0 turns it off.",
)
ENGINE_METRICS_TIMEOUT_MS = Option(
    "--engine-metrics-timeout-ms", int, 1000, "Time limit of one scrape (connect, headers and body)."
)
ENGINE_METRICS_PORT: Option[int | None] = Option(
    "--engine-metrics-port",
    int,
    None,
    "Port of the workers' metrics endpoint (default: each worker's own port).",
)
ENGINE_METRICS_PATH = Option(
    "--engine-metrics-path", str, "/metrics", "Path of the workers' metrics endpoint."
)
ENGINE_METRICS_MAX_BYTES = Option(
    "--engine-metrics-max-bytes",
    int,
    4 * 1024 * 1024,
    "A metrics body larger than this is not read (the scrape counts as failed).",
)

ENGINE_METRICS_OPTIONS: tuple[Option[Any], ...] = (
    ENGINE_METRICS_INTERVAL_MS,
    ENGINE_METRICS_TIMEOUT_MS,
    ENGINE_METRICS_PORT,
    ENGINE_METRICS_PATH,
    ENGINE_METRICS_MAX_BYTES,
)


def read_engine_metrics(reader: Reader) -> EngineMetricsConfig:
    """The scrape settings. Raises ConfigError naming the setting and value."""
    read = reader.read
    interval_ms = read(ENGINE_METRICS_INTERVAL_MS)
    if interval_ms < 0:
        raise ConfigError(f"invalid engine-metrics-interval-ms={interval_ms}: expected >= 0 (0 = off)")
    timeout_ms = read(ENGINE_METRICS_TIMEOUT_MS)
    check_positive("engine-metrics-timeout-ms", timeout_ms)
    port = read(ENGINE_METRICS_PORT)
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"invalid engine-metrics-port={port}: expected 1..65535")
    path = read(ENGINE_METRICS_PATH)
    if not path.startswith("/") or any(c.isspace() for c in path):
        raise ConfigError(f"invalid engine-metrics-path={path!r}: expected a path like /metrics")
    max_bytes = read(ENGINE_METRICS_MAX_BYTES)
    check_positive("engine-metrics-max-bytes", max_bytes)
    return EngineMetricsConfig(
        interval_s=interval_ms / 1000, timeout_s=timeout_ms / 1000, port=port, path=path, max_bytes=max_bytes
    )
