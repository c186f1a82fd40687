"""Edges of output-token counting in the ext_proc stream (--router-track-output-blocks): what the
picker is told per chunk (only the new tokens, per sequence, with the sequences), requests whose
counting stops (freed, untracked, a failure), and SSE lines over the bound."""

from __future__ import annotations

import logging

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import (
    chat_body,
    picker_config,
    request_body,
    request_headers,
    response_body,
    response_headers,
)
from .test_output_tokens import chat_chunk, usage_chunk
from .test_service import OpenStream, until

BS = 16
SSE = "text/event-stream"
LONG_LINE = b"data: " + b"x" * (70 * 1024) + b"\n\n"  # over the 64 KiB bound of one SSE line


class Picker(EndpointPicker):
    """Records what it is told: each (output tokens, sequences), each free's cause."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.told: list[tuple[int, int]] = []
        self.frees: list[str] = []

    def output_tokens(self, pick, count: int, sequences: int = 1) -> None:
        self.told.append((count, sequences))
        super().output_tokens(pick, count, sequences)

    def finish(self, pick, cause: str) -> None:
        self.frees.append(cause)
        super().finish(pick, cause)


class FailingPicker(Picker):
    """Its first `output_tokens` raises (a picker that cannot take the count)."""

    def output_tokens(self, pick, count: int, sequences: int = 1) -> None:
        super().output_tokens(pick, count, sequences)
        if len(self.told) == 1:
            raise RuntimeError("cannot take output tokens")


def make(picker_class=Picker):
    picker = picker_class(picker_config(block_size=BS, router_track_output_blocks=True))
    return picker, ExtProcService(picker, max_body_bytes=1 << 20)


def decode_blocks(picker) -> float:
    router = picker.pools["demo-model"].router
    return sum(router.sequences.decode_blocks(w) for w in router.workers())


async def send(stream: OpenStream, *messages) -> None:
    """Send `messages` and wait for their answers, one each; a stream that fails raises its error."""
    n = len(stream.answers) + len(messages)
    stream.send(*messages)
    await until(lambda: len(stream.answers) >= n or stream.task.done())
    if stream.task.done():
        stream.task.result()
    assert len(stream.answers) == n


async def routed(service, body=None, content_type=SSE) -> OpenStream:
    stream = OpenStream(service)
    await send(stream, request_headers(), request_body(body or chat_body("hello")))
    await send(stream, response_headers(content_type=content_type))
    return stream


def response_trailers():
    return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())


def tokens(n: int, index: int = 0) -> bytes:
    return b"".join(chat_chunk("x", index=index) for _ in range(n))


async def test_each_chunk_tells_the_picker_only_the_tokens_new_since_the_last():
    picker, service = make()
    stream = await routed(service)
    await send(stream, response_body(chat_chunk("", role=True)))
    for n in (2, 1, 0, 3, 1):
        await send(stream, response_body(tokens(n) or b": keep-alive\n\n"))  # 0: a chunk of no token
    await send(stream, response_body(usage_chunk(7) + b"data: [DONE]\n\n", end_of_stream=True))
    assert picker.told == [(2, 1), (1, 1), (3, 1), (1, 1)]  # the engine's usage agrees: nothing more
    await stream.close()
    assert picker.is_idle() and picker.frees == ["complete"]


async def test_n_choices_tell_their_sequences_and_the_tokens_of_one_of_them():
    picker, service = make()
    stream = await routed(service, chat_body("hello", n=2))
    await send(stream, response_body(chat_chunk("", role=True, index=0)))  # no token, one sequence
    await send(stream, response_body(chat_chunk("", role=True, index=1)))  # no token, a second one
    assert picker.told == [(0, 2)]
    for _ in range(2):
        await send(stream, response_body(tokens(1, index=0) + tokens(1, index=1)))
    await send(stream, response_body(tokens(2, index=0) + tokens(2, index=1)))
    assert picker.told == [(0, 2), (1, 2), (1, 2), (2, 2)]
    await stream.close()
    assert picker.is_idle()


async def test_a_request_freed_by_an_error_status_adds_no_load_to_a_later_request_with_its_id():
    picker, service = make()
    first = await routed(service)
    await send(first, response_headers("503"))  # freed: its id goes back to the clients
    assert picker.frees == ["upstream_status_503"] and picker.is_idle()
    second = await routed(service)  # the same x-request-id, now tracked under it
    load = decode_blocks(picker)
    await send(first, response_body(tokens(3 * BS)))
    assert picker.told == [] and decode_blocks(picker) == load
    await first.close()
    await second.close()
    assert picker.is_idle() and len(picker.frees) == 2


async def test_response_trailers_of_an_untracked_request_end_its_stream_normally():
    picker, service = make()
    stream = OpenStream(service)
    await send(stream, request_headers("/v1/models", method="GET", end_of_stream=True))
    await send(stream, response_headers(content_type="application/json"))
    await send(stream, response_body(b'{"object":"list","data":[]}'))
    await send(stream, response_trailers())
    assert stream.answers[-1].HasField("response_trailers")
    await stream.close()
    assert picker.told == [] and picker.is_idle()


async def test_a_counting_failure_stops_counting_that_response_but_not_its_stream():
    picker, service = make(FailingPicker)
    stream = await routed(service)
    await send(stream, response_body(tokens(2)))  # the picker fails to take these
    await send(stream, response_body(tokens(3)))
    await send(stream, response_body(tokens(1) + b"data: [DONE]\n\n"))
    await send(stream, response_trailers())
    assert picker.told == [(2, 1)]  # not counted further
    assert all(a.HasField("response_body") for a in stream.answers[3:-1])
    assert stream.answers[-1].HasField("response_trailers")
    await stream.close()
    assert picker.is_idle() and picker.frees == ["complete"]
    assert picker.metrics.requests.values["demo-model", "completed"] == 1


async def test_sse_lines_over_the_bound_are_skipped_and_summed_over_chunks_and_streams():
    picker, service = make()
    assert service.output_lines_skipped == 0
    first = await routed(service)
    await send(first, response_body(tokens(1) + LONG_LINE))
    await send(first, response_body(LONG_LINE + tokens(2)))
    assert service.output_lines_skipped == 2
    assert picker.told == [(1, 1), (2, 1)]  # the lines around them still count
    await send(first, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    await first.close()
    second = await routed(service)
    await send(second, response_body(LONG_LINE, end_of_stream=True))
    await second.close()
    assert service.output_lines_skipped == 3
    assert picker.is_idle() and picker.frees == ["complete", "complete"]


async def test_a_response_without_overlong_lines_logs_no_warning(caplog):
    picker, service = make()
    caplog.set_level(logging.WARNING, logger="extproc.service")
    stream = await routed(service)
    for n in (1, 2):
        await send(stream, response_body(tokens(n)))
    await send(stream, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    await stream.close()
    assert picker.told == [(1, 1), (2, 1)] and service.output_lines_skipped == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
