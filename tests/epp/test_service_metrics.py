"""The ext_proc service's own numbers as /metrics shows them: streams open now, and response SSE
lines that output-token counting skipped (their tokens are not in the router's decode load)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from extproc.epp.output_tokens import MAX_LINE_BYTES
from extproc.epp.service_metrics import ServiceCollector

from ..picker_fixtures import picker_config, response_body, response_headers
from .test_output_tokens import chat_chunk
from .test_service import until
from .test_service_request_edges import answered, make, routed_stream


async def test_streams_open_and_skipped_sse_lines_are_read_when_scraped():
    picker, service = make(picker_config(router_track_output_blocks=True))
    registry = CollectorRegistry()
    registry.register(ServiceCollector(service))

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name)

    assert (sample("extproc_streams_open"), sample("extproc_output_sse_lines_skipped_total")) == (0, 0)
    stream = await routed_stream(service)
    assert sample("extproc_streams_open") == 1
    await answered(stream, response_headers(content_type="text/event-stream"))
    too_long = b"data: " + b"x" * MAX_LINE_BYTES + b"\n\n"
    await answered(stream, response_body(too_long + chat_chunk("y")))
    assert sample("extproc_output_sse_lines_skipped_total") == 1
    await answered(stream, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    await stream.close()
    await until(lambda: sample("extproc_streams_open") == 0)
    assert sample("extproc_output_sse_lines_skipped_total") == 1 and picker.is_idle()
