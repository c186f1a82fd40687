"""The ext_proc stream's lifecycle and response side, at its edges: response trailers, a response
without a body, a cancelled or rejected stream, a queued stream that goes away, duplex response
bodies, answering before booking, and where a Responses API answer's id is read."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import (
    DUPLEX,
    MODEL,
    chat_body,
    mutation_headers,
    picker_config,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
)
from .test_service import OpenStream, until

TRAILERS = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
SSE = "text/event-stream"


class Picker(EndpointPicker):
    """Records each free (request id, cause) and each stored response id it is told."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.frees: list[tuple[str, str]] = []
        self.stored: list[str] = []

    def finish(self, pick, cause: str) -> None:
        self.frees.append((pick.request_id, cause))
        super().finish(pick, cause)

    def response_stored(self, pick, response_id: str) -> None:
        self.stored.append(response_id)
        super().response_stored(pick, response_id)


def make(n_workers: int = 2, **router):
    picker = Picker(picker_config(n_workers, **router))
    return picker, ExtProcService(picker, max_body_bytes=1 << 20)


def outcomes(picker) -> dict[str, float]:
    """extproc_requests_total of the model, by outcome (zeros left out)."""
    return {key[1]: n for key, n in picker.metrics.requests.values.items() if key[0] == MODEL and n}


async def answered(stream: OpenStream, count: int) -> None:
    """Wait until the stream has `count` answers or has ended; it must have exactly `count`."""
    await until(lambda: len(stream.answers) >= count or stream.task.done())
    if stream.task.done() and stream.task.exception() is not None:
        raise stream.task.exception()
    assert len(stream.answers) == count


async def routed(service, *, content_type="application/json") -> OpenStream:
    stream = OpenStream(service)
    stream.send(request_headers(), request_body(chat_body("x" * 200)))
    await answered(stream, 2)
    stream.send(response_headers(content_type=content_type))
    await answered(stream, 3)
    return stream


# --- the end of a response -------------------------------------------------------------------------


async def test_response_trailers_end_the_response_count_its_answer_and_free_it_as_completed():
    """Envoy sends the last body chunk with end_of_stream false when trailers follow: the trailers
    end the response while the stream is still open."""
    picker, service = make(router_track_output_blocks=True)
    counted = []
    output_tokens = picker.output_tokens

    def record(pick, count, sequences=1):
        counted.append((count, sequences))
        output_tokens(pick, count, sequences)

    picker.output_tokens = record  # type: ignore[method-assign]
    stream = await routed(service)
    answer = {"choices": [{"index": 0, "message": {"content": "hi"}}], "usage": {"completion_tokens": 40}}
    stream.send(response_body(json.dumps(answer).encode()))
    await answered(stream, 4)
    assert stream.answers[3] == epp.CONTINUE_RESPONSE_BODY
    assert not picker.is_idle()
    stream.send(TRAILERS)
    await answered(stream, 5)
    assert stream.answers[4] == epp.CONTINUE_RESPONSE_TRAILERS
    assert counted == [(40, 1)]  # the whole JSON answer, counted at its end
    assert picker.is_idle()  # freed at the trailers, before the stream ends
    await stream.close()
    assert picker.frees == [("rid-1", "complete")]
    assert outcomes(picker) == {"routed": 1, "completed": 1}


async def test_a_response_without_a_body_frees_its_request_as_completed_at_its_headers():
    picker, service = make()
    stream = OpenStream(service)
    stream.send(request_headers(), request_body(chat_body()))
    await answered(stream, 2)
    stream.send(response_headers("204", end_of_stream=True))
    await answered(stream, 3)
    assert stream.answers[2].HasField("response_headers")
    assert picker.is_idle()
    await stream.close()
    assert picker.frees == [("rid-1", "complete")]
    assert outcomes(picker) == {"routed": 1, "completed": 1}


async def test_a_completed_response_is_freed_exactly_once():
    picker, service = make()
    stream = await routed(service, content_type=SSE)
    stream.send(response_body(b"data: {}\n\n"), response_body(b"data: [DONE]\n\n", end_of_stream=True))
    await answered(stream, 5)
    await until(picker.is_idle)
    await stream.close()  # the stream's end frees nothing more
    assert picker.frees == [("rid-1", "complete")]
    assert outcomes(picker) == {"routed": 1, "completed": 1}


async def test_a_cancelled_stream_frees_its_request_once_as_cancelled():
    picker, service = make()
    stream = await routed(service)
    stream.task.cancel()  # what grpc.aio does when Envoy resets the stream
    with pytest.raises(asyncio.CancelledError):
        await stream.task
    assert picker.is_idle()
    assert picker.frees == [("rid-1", "cancelled")]
    assert outcomes(picker) == {"routed": 1, "cancelled": 1}
    assert service.open_streams == 0


async def test_a_rejected_stream_ends_after_its_error_answer_even_if_envoy_keeps_it_open():
    """The stream ends with the immediate response: it does not hold a stream slot (or read on)
    while Envoy keeps its side open."""
    picker, service = make()

    async def feed():
        yield request_headers()
        yield request_body(b"{not json")
        await asyncio.Event().wait()  # Envoy never closes its side

    async def collect():
        return [answer async for answer in service.Process(feed(), None)]

    answers = await asyncio.wait_for(collect(), 5)
    assert len(answers) == 2
    assert answers[1].immediate_response.status.code == 400
    assert service.open_streams == 0
    assert picker.is_idle() and picker.frees == []


async def test_a_response_chunk_is_answered_before_its_first_token_is_booked():
    """Envoy forwards the chunk while the picker books it: the booking waits until gRPC comes back
    for the next answer, off the client's path."""
    picker, service = make()
    booked: list[bool] = []
    first_token = picker.first_token

    def record(pick, *, at_first_token: bool = True) -> None:
        booked.append(at_first_token)
        first_token(pick, at_first_token=at_first_token)

    picker.first_token = record  # type: ignore[method-assign]
    messages = [
        request_headers(), request_body(chat_body("x" * 200)), response_headers(content_type=SSE),
        response_body(b"data: {}\n\n"), response_body(b"data: [DONE]\n\n", end_of_stream=True),
    ]  # fmt: skip

    async def feed():
        for m in messages:
            yield m

    stream = service.Process(feed(), None)
    for _ in range(4):
        await stream.__anext__()
    assert booked == []  # the first chunk is answered, not yet booked
    assert await stream.__anext__() == epp.CONTINUE_RESPONSE_BODY
    assert booked == [True]  # booked when the next message was asked for
    assert [a async for a in stream] == []
    assert picker.is_idle() and picker.frees == [("rid-1", "complete")]


# --- duplex response bodies --------------------------------------------------------------------------


async def test_a_duplex_response_body_is_echoed_chunk_by_chunk_and_a_streamed_one_continued():
    picker, service = make()
    headers = request_headers()
    headers.protocol_config.response_body_mode = DUPLEX
    chunks = [b"data: first\n\n", b"data: second\n\n", b"data: [DONE]\n\n"]
    bodies = [response_body(c, end_of_stream=i == len(chunks) - 1) for i, c in enumerate(chunks)]
    answers = await run(service, [headers, request_body(chat_body()), response_headers(), *bodies])
    echoed = [a.response_body.response.body_mutation.streamed_response for a in answers[3:]]
    assert [(e.body, e.end_of_stream) for e in echoed] == [(c, i == 2) for i, c in enumerate(chunks)]
    # STREAMED (the fixtures' mode): each chunk passes unchanged, without a body mutation
    answers = await run(service, [request_headers(), request_body(chat_body()), response_headers(), *bodies])
    assert answers[3:] == [epp.CONTINUE_RESPONSE_BODY] * 3
    assert picker.is_idle()


# --- a Responses API answer's id --------------------------------------------------------------------


async def respond(service, chunks: list[bytes]) -> str:
    answers = await run(service, [
        request_headers("/v1/responses"), request_body(json.dumps({"model": MODEL, "input": "hi"}).encode()),
        response_headers(content_type="application/json"),
        *(response_body(c, end_of_stream=i == len(chunks) - 1) for i, c in enumerate(chunks)),
    ])  # fmt: skip
    return mutation_headers(answers[1].request_body.response)[epp.DESTINATION_HEADER]


@pytest.mark.parametrize(
    "chunks",
    [
        [b'{"id": "resp_1", "object": "response", ', b'"output": [], ', b'"status": "completed"}'],
        [b'{"object": "response", ', b'"id": "resp_1", "output": [], ', b'"status": "completed"}'],
    ],
    ids=["in-the-first-chunk", "in-the-second-chunk"],
)
async def test_a_responses_id_is_learned_once_from_the_chunk_that_holds_it(chunks):
    picker, service = make(overlap_score_weight=0.0)
    home = await respond(service, chunks)
    assert picker.stored == ["resp_1"]  # told once, not again for each later chunk
    assert picker.response_homes.get("resp_1", 0.0).endpoint == home
    assert picker.is_idle()


async def test_an_id_past_the_first_64_kb_is_not_read_even_when_the_head_came_in_two_chunks():
    picker, service = make()
    first = b'{"object": "response", "pad": "' + b"x" * 1000
    second = b"y" * 65_000 + b'", "id": "resp_far"}'  # the id starts past byte 66 000 of the answer
    await respond(service, [first, second])
    assert picker.stored == []
    assert len(picker.response_homes) == 0
    assert picker.is_idle()


# --- a queued stream that goes away ---------------------------------------------------------------


async def test_a_queued_stream_that_goes_away_leaves_the_queue_and_ends_cancelled():
    config = picker_config(router_queue_threshold=0.0)
    picker = Picker(replace(config, queue_max_wait_s=30.0))
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    held = [OpenStream(service), OpenStream(service)]  # one prompt in prefill saturates each worker
    try:
        for i, stream in enumerate(held):
            stream.send(request_headers(), request_body(chat_body(f"held {i} " * 30)))
        await until(lambda: all(len(s.answers) == 2 for s in held))
        queued = OpenStream(service)
        queued.send(request_headers(), request_body(chat_body("waits " * 30)))
        await until(lambda: len(queued.answers) == 2)  # CONTINUE, then "wait longer" for the body
        assert queued.answers[1].HasField("override_message_timeout")
        gate = picker.gate(MODEL)
        assert len(gate) == 1
        queued.task.cancel()  # Envoy resets the stream while its request waits
        with pytest.raises(asyncio.CancelledError):
            await queued.task
        assert len(gate) == 0 and gate.stats.cancelled == 1  # out of the queue at once
    finally:
        for stream in held:
            await stream.close()
        await picker.close()
    assert picker.is_idle()
    assert service.open_streams == 0
    assert sorted(cause for _, cause in picker.frees) == ["stream_closed", "stream_closed"]
