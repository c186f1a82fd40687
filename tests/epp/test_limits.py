"""Limits with clear answers, through the ext_proc servicer driven in-process as Envoy drives it.

- `--max-concurrent-streams`: a stream beyond the limit is answered 429 at once and counted;
- per-stage deadlines: a stalled remote tokenizer (routed on load only), a stalled router group
  (skipped; 503 when it was the only one) and a long admission queue (503, 429 when sheddable)
  each give their documented answer within their bound.

Stalled peers are real sockets that accept and never answer (as a stopped process's kernel does).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import GroupConfig, GroupsConfig, load_config
from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker
from extproc.runtime.server import start_picker

from ..picker_fixtures import (
    chat_body,
    closed_after_test,
    mutation_headers,
    picker_config,
    request_body,
    request_headers,
    run,
)

BOUND_SLACK_S = 1.0  # scheduling slack on a shared 2-core machine; the deadlines tested are 0.2-0.3 s


async def until(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


class OpenStream:
    """One ext_proc stream kept open (Envoy waiting for the upstream); answers are collected."""

    def __init__(self, service: ExtProcService) -> None:
        self.messages: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        self.answers: list[pb.ProcessingResponse] = []
        self.task = asyncio.create_task(self._run(service))

    async def _feed(self) -> AsyncIterator[pb.ProcessingRequest]:
        while (message := await self.messages.get()) is not None:
            yield message

    async def _run(self, service: ExtProcService) -> None:
        async for answer in service.Process(self._feed(), None):
            self.answers.append(answer)

    def send(self, *messages: pb.ProcessingRequest) -> None:
        for message in messages:
            self.messages.put_nowait(message)

    async def close(self) -> None:
        self.messages.put_nowait(None)
        await asyncio.wait_for(self.task, 5)


def rejections(picker: EndpointPicker, status: int, reason: str) -> float:
    value = picker.metrics.registry.get_sample_value(
        "extproc_rejections_total", {"status": str(status), "reason": reason}
    )
    return value or 0.0


def routed_to(answer: pb.ProcessingResponse) -> str:
    return mutation_headers(answer.request_body.response)[epp.DESTINATION_HEADER]


# --- concurrent streams ------------------------------------------------------------------------------


async def test_a_stream_beyond_the_limit_is_answered_429_at_once_and_counted():
    picker = closed_after_test(EndpointPicker(picker_config()))
    service = ExtProcService(picker, max_body_bytes=1 << 20, max_concurrent_streams=2)
    held = [OpenStream(service), OpenStream(service)]
    for i, stream in enumerate(held):
        stream.send(request_headers(), request_body(chat_body(f"held {i}")))
    await until(lambda: all(len(s.answers) == 2 for s in held))
    assert service.open_streams == 2

    answers = await run(service, [request_headers(), request_body(chat_body("one too many"))])
    assert len(answers) == 1  # the headers message is answered and the stream ends
    immediate = answers[0].immediate_response
    assert immediate.status.code == 429 and immediate.details == "rejected-too-many-streams"
    headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    assert headers[epp.DROPPED_REASON_HEADER] == "rejected-too-many-streams"
    error = json.loads(immediate.body)["error"]
    assert error["code"] == 429 and error["type"] == "RateLimitError" and "limit of 2" in error["message"]
    assert rejections(picker, 429, "rejected-too-many-streams") == 1
    assert service.open_streams == 2

    await held[0].close()  # a stream ends: its slot is free again
    again = OpenStream(service)
    again.send(request_headers(), request_body(chat_body("room again")))
    await until(lambda: len(again.answers) == 2)
    assert routed_to(again.answers[1])
    for stream in (held[1], again):
        await stream.close()
    assert service.open_streams == 0 and picker.is_idle()
    assert rejections(picker, 429, "rejected-too-many-streams") == 1


def test_the_stream_limit_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        ExtProcService(EndpointPicker(picker_config()), max_body_bytes=1, max_concurrent_streams=0)


async def test_serve_gives_its_service_the_stream_limit_and_the_metrics():
    config = load_config(["--max-concurrent-streams", "3", "--port", "0", "--health-port", "0"], environ={})
    running = await start_picker(config)
    try:
        assert running.service.max_concurrent_streams == 3
        assert running.service.picker is running.picker  # upstream answers are counted (picker.answered)
    finally:
        await running.stop(0)


# --- per-stage deadlines -------------------------------------------------------------------------------


@pytest.fixture
async def stalled_tokenizer() -> AsyncIterator[str]:
    """An engine whose /tokenize accepts the request and never answers."""
    release = asyncio.Event()

    async def tokenize(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"tokens": []})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        release.set()
        await server.close()


async def test_a_stalled_tokenizer_is_given_up_at_its_deadline_and_the_request_routed_on_load(
    stalled_tokenizer: str,
):
    config = replace(picker_config(), tokenize_url=stalled_tokenizer, tokenizer_timeout_s=0.2)
    picker = EndpointPicker(config)
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    try:
        start = time.monotonic()
        answers = await run(service, [request_headers(), request_body(chat_body("tokenize me " * 20))])
        elapsed_s = time.monotonic() - start
        assert routed_to(answers[-1]) in {w.endpoint for w in config.workers}
        assert 0.19 <= elapsed_s < 0.2 + BOUND_SLACK_S
        assert picker.is_idle()
    finally:
        await picker.close()


@pytest.fixture
def stalled_group() -> Iterator[str]:
    """A router-group address that accepts connections and never says a word: a listening socket
    that nobody accepts from (the kernel completes the handshake, queues the connection and sends
    nothing). Closing it resets what it queued. An asyncio server here left connections accepted
    during its teardown unclosed, whose warnings failed whichever test the garbage collector ran in."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("with_local_group", [True, False], ids=["local-group-takes-it", "only-group"])
async def test_a_stalled_group_is_skipped_at_the_probe_deadline(stalled_group: str, with_local_group: bool):
    groups = (GroupConfig("stalled", stalled_group),) + ((GroupConfig("here"),) if with_local_group else ())
    # with another group answering, the stalled one is skipped at the deadline; alone, it is given
    # the grace too (nobody answered: a loaded machine?) unless gRPC gives up its silent connection
    # first (its 200 ms handshake bound: unreachable), then the answer is 503
    groups_config = GroupsConfig(groups=groups, probe_timeout_s=0.2, probe_grace_s=0.3)
    config = replace(picker_config(), groups=groups_config)
    picker = EndpointPicker(config)
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    try:
        start = time.monotonic()
        answers = await run(service, [request_headers(), request_body(chat_body("probe me " * 20))])
        elapsed_s = time.monotonic() - start
        if with_local_group:
            assert routed_to(answers[-1]) in {w.endpoint for w in config.workers}
            assert 0.19 <= elapsed_s < 0.2 + BOUND_SLACK_S
        else:
            immediate = answers[-1].immediate_response
            assert immediate.status.code == 503 and immediate.details == "rejected-no-endpoints"
            reason = immediate.body.split(b"stalled: ")[1].split(b")")[0]
            assert reason in (b"timeout", b"unreachable"), immediate.body
            assert 0.19 <= elapsed_s < 0.5 + BOUND_SLACK_S
        assert picker.selector is not None
        await picker.selector.drain()  # the group frees its request in the background
        assert picker.is_idle()
    finally:
        await picker.close()


@pytest.mark.parametrize(
    ("extra", "status", "reason"),
    [({}, 503, "rejected-queue-timeout"), ({"priority": -1}, 429, "shed-queue-timeout")],
    ids=["normal", "sheddable"],
)
async def test_a_request_queued_past_its_bound_is_answered_503_or_429_when_sheddable(extra, status, reason):
    max_wait_s = 0.3
    picker = EndpointPicker(replace(picker_config(router_queue_threshold=0.0), queue_max_wait_s=max_wait_s))
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    held = [OpenStream(service), OpenStream(service)]  # one prompt in prefill saturates each worker
    try:
        for i, stream in enumerate(held):
            stream.send(request_headers(), request_body(chat_body(f"held {i} " * 30)))
        await until(lambda: all(len(s.answers) == 2 for s in held))
        start = time.monotonic()
        body = chat_body("waits " * 30, nvext={"agent_hints": extra}) if extra else chat_body("waits " * 30)
        answers = await run(service, [request_headers(), request_body(body)])
        elapsed_s = time.monotonic() - start
        # Envoy is first asked to wait longer than its message timeout, then gets the answer
        assert answers[1].HasField("override_message_timeout")
        assert answers[1].override_message_timeout.ToMilliseconds() >= max_wait_s * 1000
        immediate = answers[-1].immediate_response
        assert (immediate.status.code, immediate.details) == (status, reason)
        assert max_wait_s - 0.01 <= elapsed_s < max_wait_s + BOUND_SLACK_S
        assert rejections(picker, status, reason) == 1
    finally:
        for stream in held:
            await stream.close()
        await picker.close()
    assert picker.is_idle()
