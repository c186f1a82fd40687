"""The ext_proc service's own numbers on /metrics, read when scraped: the streams Envoy holds open
(requests in flight through the picker, queued ones included) and the SSE lines output-token
counting skipped (a line over `output_tokens.MAX_LINE_BYTES`: its tokens were not counted, so the
router's decode load for that response is short); and the Inference Extension's per-request series
the service keeps (`objective_metrics.py`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.epp.service import ExtProcService


class ServiceCollector(Collector):
    """`extproc_streams_open`, `extproc_output_sse_lines_skipped_total` and `inference_objective_*`,
    read from the service."""

    def __init__(self, service: ExtProcService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "extproc_streams_open",
            "ext_proc streams open now: requests in flight through the picker (queued ones too).",
            value=self._service.open_streams,
        )
        yield CounterMetricFamily(
            "extproc_output_sse_lines_skipped",
            "Response SSE lines over the line bound, skipped when counting output tokens (not counted).",
            value=self._service.output_lines_skipped,
        )
        yield from self._service.objectives.collect()
        yield from self._service.scheduler.collect()
