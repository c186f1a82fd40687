"""--router-track-output-blocks through the ext_proc stream: generated tokens in the response body
become output blocks on the request's worker, and leave with the request, exactly once."""

from __future__ import annotations

import asyncio

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import chat_body, picker_config, request_body, request_headers, response_body
from .test_output_tokens import chat_chunk, usage_chunk
from .test_service import OpenStream, until

BS = 16


def sse_headers(content_type="text/event-stream", status="200"):
    pairs = {":status": status, "content-type": content_type}
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
            )
        )
    )


class Picker(EndpointPicker):
    """Counts frees per request."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.frees: list[str] = []

    def finish(self, pick, cause: str) -> None:
        self.frees.append(pick.request_id)
        super().finish(pick, cause)


def make(track=True):
    picker = Picker(picker_config(block_size=BS, router_track_output_blocks=track))
    return picker, ExtProcService(picker, max_body_bytes=1 << 20)


def decode_blocks(picker) -> float:
    router = picker.pools["demo-model"].router
    return sum(router.sequences.decode_blocks(w) for w in router.workers())


async def routed(service, body, content_type="text/event-stream") -> OpenStream:
    stream = OpenStream(service)
    stream.send(request_headers(), request_body(body))
    await until(lambda: len(stream.answers) == 2)
    stream.send(sse_headers(content_type))
    await until(lambda: len(stream.answers) == 3)
    return stream


async def send(stream: OpenStream, *messages) -> None:
    n = len(stream.answers) + len(messages)
    stream.send(*messages)
    await until(lambda: len(stream.answers) == n)


async def test_output_blocks_grow_with_streamed_tokens_and_are_freed_once():
    picker, service = make()
    stream = await routed(service, chat_body("a b c d " * 10))
    prompt = decode_blocks(picker)
    assert prompt > 0
    await send(stream, response_body(chat_chunk("", role=True)))
    seen = [decode_blocks(picker)]
    for _ in range(4):
        await send(stream, response_body(b"".join(chat_chunk("x") for _ in range(BS))))
        seen.append(decode_blocks(picker))
    assert seen == sorted(seen) and seen[-1] >= prompt + 3  # one block per 16 tokens (tail aside)
    await send(stream, response_body(usage_chunk(4 * BS) + b"data: [DONE]\n\n", end_of_stream=True))
    assert picker.is_idle() and decode_blocks(picker) == 0
    await stream.close()
    assert len(picker.frees) == 1


async def test_the_osl_hint_decays_the_output_blocks():
    picker, service = make()
    body = chat_body("hello", max_tokens=4000, nvext={"agent_hints": {"osl": 4 * BS}})
    stream = await routed(service, body)
    prompt = decode_blocks(picker)
    await send(stream, response_body(b"".join(chat_chunk("x") for _ in range(2 * BS))))
    half = decode_blocks(picker) - prompt
    assert half == pytest.approx(2 * 0.5, abs=1.01)  # ~2 blocks at half progress toward osl
    await send(stream, response_body(b"".join(chat_chunk("x") for _ in range(2 * BS))))
    assert decode_blocks(picker) == pytest.approx(prompt)  # at the expected length: no weight left
    await stream.close()
    assert picker.is_idle() and picker.frees and len(picker.frees) == 1


async def test_n_choices_count_as_n_sequences():
    picker, service = make()
    stream = await routed(service, chat_body("hello", n=3))
    prompt = decode_blocks(picker)
    chunks = b"".join(chat_chunk("x", index=i % 3) for i in range(3 * 2 * BS))
    await send(stream, response_body(chunks))
    assert decode_blocks(picker) - prompt == pytest.approx(3 * 2, abs=3)  # 2 blocks each, x3
    assert decode_blocks(picker) - prompt >= 3 * 1
    await stream.close()
    assert picker.is_idle()


async def test_a_non_streamed_answer_is_counted_then_freed():
    picker, service = make()
    counted = []
    picker.output_tokens = lambda pick, count, sequences=1: counted.append((count, sequences))  # type: ignore[method-assign]
    stream = await routed(service, chat_body("hello"), "application/json")
    await send(stream, response_body(b'{"choices":[{"index":0,"message":{"content":"hi"}}],'))
    await send(stream, response_body(b'"usage":{"completion_tokens":40}}', end_of_stream=True))
    assert counted == [(40, 1)] and picker.is_idle()
    await stream.close()
    assert len(picker.frees) == 1


async def test_tracking_off_reads_no_body_and_adds_nothing():
    picker, service = make(track=False)
    assert service.output is None
    stream = await routed(service, chat_body("a b c d " * 10))
    prompt = decode_blocks(picker)
    await send(stream, response_body(b"".join(chat_chunk("x") for _ in range(4 * BS))))
    assert decode_blocks(picker) == prompt
    await stream.close()
    assert picker.is_idle() and len(picker.frees) == 1


async def test_a_cancelled_stream_frees_its_output_blocks_once():
    picker, service = make()
    stream = await routed(service, chat_body("hello"))
    await send(stream, response_body(b"".join(chat_chunk("x") for _ in range(3 * BS))))
    assert decode_blocks(picker) > 0
    stream.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stream.task
    assert picker.is_idle() and decode_blocks(picker) == 0 and len(picker.frees) == 1
