"""Fuzz the ext_proc servicer with arbitrary sequences of `ProcessingRequest` messages.

Promise (extproc/service.py): whatever Envoy (or anything speaking its protocol) sends, in any order,
`Process` answers without raising, errors reach the client as documented immediate responses (never
the 500 of an unexpected exception), every routed request is finished exactly once, and afterwards
the picker is idle and no stream is counted open. Each input is 1-3 concurrent streams: a plausible
exchange (request headers, body chunks, trailers, response headers and body) then shuffled, cut,
duplicated or salted with stray messages; some streams are cancelled midway, as a client reset does.
Three pickers take turns: plain; with an admission queue; with tight busy thresholds, a stream limit
and a small body limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.errors import PickerError
from extproc.picker.pipeline import SESSION_HEADER, EndpointPicker, Pick
from extproc.request.parse import CHAT_PATH, COMPLETIONS_PATH
from extproc.router.errors import RouterError
from tests.fuzz.gen import chance, json_bytes, mutate, pick, text
from tests.fuzz.harness import (
    SHRINKING_SHARE,
    Check,
    LoopRunner,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
    tally,
)
from tests.fuzz.test_request_fuzz import openai_object
from tests.picker_fixtures import BUFFERED, DUPLEX, MODEL, picker_config

NONE_MODE, STREAMED = 0, 1  # ProcessingMode.BodySendMode: NONE, STREAMED (the picker asks for neither)
STREAM_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StreamCase:
    messages: tuple[pb.ProcessingRequest, ...]
    cancel_at: int | None  # the client resets the stream when the servicer waits for this message


Case = tuple[int, tuple[StreamCase, ...]]  # picker index, concurrent streams


def header_message(pairs: Mapping[str, bytes], end_of_stream: bool) -> pb.HttpHeaders:
    return pb.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in pairs.items()]
        ),
        end_of_stream=end_of_stream,
    )


def _request_headers(r: random.Random, body_coming: bool) -> pb.ProcessingRequest:
    path = pick(r, (CHAT_PATH, CHAT_PATH, COMPLETIONS_PATH, CHAT_PATH + "?x=1", "/v1/models", "/", text(r),
                    "/v1/responses", "/v1/responses/resp_1", "/v1/responses/resp_1/cancel",
                    "/v1/messages"))  # fmt: skip
    pairs = {
        ":path": path.encode("utf-8", "surrogatepass"),
        ":method": pick(r, (b"POST", b"POST", b"GET")),
        "x-request-id": pick(r, (b"rid-1", b"rid-1", b"rid-2", b"", b"\xff\xfe")),
    }
    if chance(r, 0.1):
        pairs[SESSION_HEADER] = pick(r, (b"s1", b"", b"\x80"))
    message = pb.ProcessingRequest(request_headers=header_message(pairs, not body_coming or chance(r, 0.05)))
    if chance(r, 0.9):
        mode = pick(r, (BUFFERED, BUFFERED, DUPLEX, DUPLEX, NONE_MODE, STREAMED))
        message.protocol_config.request_body_mode = mode
        message.protocol_config.response_body_mode = pick(r, (BUFFERED, DUPLEX, NONE_MODE, STREAMED))
    if chance(r, 0.15):
        items = [
            pick(r, ("127.0.0.1:8000", "127.0.0.2", "10.0.0.1:1", "", "[::1]:1"))
            for _ in range(r.randint(0, 2))
        ]
        value = struct_pb2.Value()
        if chance(r, 0.5):
            value.list_value.values.extend(struct_pb2.Value(string_value=i) for i in items)
        else:
            value.string_value = ",".join(items)
        message.metadata_context.filter_metadata[epp.SUBSET_NAMESPACE].fields[epp.SUBSET_KEY].CopyFrom(value)
    return message


def _body(r: random.Random) -> bytes:
    obj = openai_object(r, pick(r, ("chat", "chat", "chat", "completion", "responses", "messages")))
    if chance(r, 0.9):
        obj["model"] = MODEL
    body = json_bytes(r, obj)
    return mutate(r, body) if chance(r, 0.1) else body


def _chunks(data: bytes, r: random.Random) -> list[bytes]:
    cuts = sorted(r.randint(0, len(data)) for _ in range(r.randint(0, 2)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _body_messages(r: random.Random, data: bytes, response: bool) -> list[pb.ProcessingRequest]:
    chunks = _chunks(data, r)
    out = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1 and chance(r, 0.9)
        body = pb.HttpBody(body=chunk, end_of_stream=last)
        out.append(
            pb.ProcessingRequest(response_body=body) if response else pb.ProcessingRequest(request_body=body)
        )
    return out


def _stray(r: random.Random) -> pb.ProcessingRequest:
    kind = r.randrange(7)
    if kind == 0:
        return _request_headers(r, chance(r, 0.5))
    if kind == 1:
        return pb.ProcessingRequest(
            request_body=pb.HttpBody(body=r.randbytes(r.randint(0, 8)), end_of_stream=chance(r, 0.5))
        )
    if kind == 2:
        return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    if kind == 3:
        return pb.ProcessingRequest(
            response_headers=header_message({":status": pick(r, (b"200", b"503", b"x"))}, chance(r, 0.3))
        )
    if kind == 4:
        return pb.ProcessingRequest(
            response_body=pb.HttpBody(body=b"data: {}\n\n", end_of_stream=chance(r, 0.5))
        )
    if kind == 5:
        return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    return pb.ProcessingRequest()  # no phase at all


def _stream(r: random.Random) -> StreamCase:
    body_coming = chance(r, 0.85)
    messages = [_request_headers(r, body_coming)]
    if body_coming:
        messages += _body_messages(r, _body(r), response=False)
        if chance(r, 0.1):
            messages.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    status = pick(r, (b"200", b"200", b"200", b"500", b"429", b"", b"2xx"))
    response = header_message({":status": status}, chance(r, 0.05))
    messages.append(pb.ProcessingRequest(response_headers=response))
    messages += _body_messages(r, b"data: {}\n\n" * r.randint(0, 3), response=True)
    if chance(r, 0.1):
        messages.append(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    hostility = pick(r, (0.0, 0.0, 0.1, 0.3))
    for _ in range(r.randint(0, 3)):
        if not chance(r, hostility):
            continue
        roll, at = r.random(), r.randrange(len(messages))
        if roll < 0.25:
            messages.insert(r.randint(0, len(messages)), _stray(r))
        elif roll < 0.5:
            messages.insert(at, messages[at])  # a duplicate
        elif roll < 0.75:
            del messages[at]
        else:
            end = min(len(messages), at + r.randint(2, 4))
            part = messages[at:end]
            r.shuffle(part)
            messages[at:end] = part
    if chance(r, 0.1):
        del messages[r.randint(1, len(messages)) :]  # the stream ends early
    cancel_at = r.randint(0, len(messages)) if chance(r, 0.15) else None
    return StreamCase(tuple(messages), cancel_at)


def generate(r: random.Random) -> Case:
    return r.randrange(3), tuple(_stream(r) for _ in range(pick(r, (1, 1, 1, 2, 3))))


class RecordingPicker:
    """The service's picker, recording what a fuzz check must see: each pick finished exactly once,
    no exception from `pick` other than the documented ones."""

    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker
        self.open: dict[int, Pick] = {}
        self.problems: list[str] = []

    @property
    def may_queue(self) -> bool:
        return self.picker.may_queue

    async def pick(self, **kwargs: Any) -> Pick:
        try:
            chosen = await self.picker.pick(**kwargs)
        except (PickerError, RouterError, asyncio.CancelledError):
            raise
        except Exception as exc:
            self.problems.append(f"pick raised {exc!r}")
            raise
        self.open[id(chosen)] = chosen
        return chosen

    def first_token(self, chosen: Pick, *, at_first_token: bool = True) -> None:
        if id(chosen) not in self.open:
            self.problems.append("first token of a finished request")
        self.picker.first_token(chosen, at_first_token=at_first_token)

    def finish(self, chosen: Pick, cause: str) -> None:
        if self.open.pop(id(chosen), None) is None:
            self.problems.append(f"request finished twice or never picked ({cause})")
        self.picker.finish(chosen, cause)

    def answered(self, chosen: Pick, status: int) -> None:
        self.picker.answered(chosen, status)

    def response_stored(self, chosen: Pick, response_id: str) -> None:
        self.picker.response_stored(chosen, response_id)

    def rejected(self, status: int, reason: str) -> None:
        if status == 500:
            self.problems.append(f"500 answer ({reason})")
        self.picker.rejected(status, reason)


def outcome_of(answers: list[pb.ProcessingResponse]) -> str:
    if any(a.HasField("immediate_response") for a in answers):
        return "rejected"
    if any(
        epp.DESTINATION_HEADER
        in a.dynamic_metadata.fields.get("envoy.lb", struct_pb2.Value()).struct_value.fields
        for a in answers
    ):
        return "routed"
    return "unrouted"


async def _run_stream(service: ExtProcService, case: StreamCase) -> str:
    answers = await run_stream(service, case)
    return "cancelled" if answers is None else outcome_of(answers)


async def run_stream(service: ExtProcService, case: StreamCase) -> list[pb.ProcessingResponse] | None:
    """The answers to one stream's messages; None when the client reset it (`cancel_at`)."""
    reached = asyncio.Event()

    async def feed() -> AsyncIterator[pb.ProcessingRequest]:
        for i, message in enumerate(case.messages):
            if i == case.cancel_at:
                reached.set()
                await asyncio.Event().wait()  # the client goes quiet; it resets the stream below
            yield message
        if case.cancel_at == len(case.messages):
            reached.set()
            await asyncio.Event().wait()

    async def consume() -> list[pb.ProcessingResponse]:
        return [answer async for answer in service.Process(feed(), None)]  # type: ignore[arg-type]

    task = asyncio.ensure_future(consume())
    waiter = asyncio.ensure_future(reached.wait())
    await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    answers = task.result()
    assert all(isinstance(a, pb.ProcessingResponse) for a in answers)
    return answers


def _services() -> list[tuple[ExtProcService, RecordingPicker, EndpointPicker]]:
    configs = [
        (picker_config(2), {}),
        (
            replace(
                picker_config(2, router_queue_threshold=0.0, active_prefill_tokens_threshold=20),
                queue_max_wait_s=0.05,
            ),
            {},
        ),
        (
            replace(
                picker_config(2, dp_ranks=(0, 1), active_prefill_tokens_threshold=10), max_body_bytes=2000
            ),
            {"max_concurrent_streams": 2, "conformance_hooks": True},
        ),
    ]
    out = []
    for config, options in configs:
        picker = EndpointPicker(config)
        recorder = RecordingPicker(picker)
        service = ExtProcService(recorder, max_body_bytes=config.max_body_bytes, **options)  # type: ignore[arg-type]
        out.append((service, recorder, picker))
    return out


@contextlib.contextmanager
def session() -> Iterator[Check]:
    loop = LoopRunner()
    services = _services()

    def check(case: Case) -> Outcome:
        index, streams = case
        service, recorder, picker = services[index]
        recorder.problems.clear()

        async def run_all() -> list[str]:
            runs = asyncio.gather(*(_run_stream(service, s) for s in streams))
            return await asyncio.wait_for(runs, STREAM_TIMEOUT_S)

        try:
            outcomes = loop.run(run_all())
            assert not recorder.problems, recorder.problems
            assert not recorder.open, f"{len(recorder.open)} routed requests never finished"
            assert service.open_streams == 0, service.open_streams
            assert picker.is_idle(), "the picker tracks load after every stream ended"
        except BaseException:
            services[index] = _services()[index]  # a fresh picker: what leaked must not fail the next inputs
            raise
        return tally(outcomes)

    try:
        yield check
    finally:
        for _, _, picker in services:
            loop.run(picker.close())
        loop.close()


def describe(case: Case) -> str:
    index, streams = case
    parts = [f"picker {index}"]
    for s in streams:
        kinds = [m.WhichOneof("request") or "none" for m in s.messages]
        parts.append(f"stream cancel_at={s.cancel_at}: {kinds} {[str(m)[:300] for m in s.messages]}")
    return "\n".join(parts)[:4000]


TARGET = Target("ext_proc", generate, session, describe)
check_target = session_fixture(TARGET)


@fuzz_settings(0.5)
@given(seed=st.integers(min_value=0))
def test_ext_proc_streams_end_idle_whatever_the_messages(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE / 2)
@given(st.randoms(use_true_random=False))
def test_ext_proc_streams_end_idle_whatever_the_messages_shrinking(
    check_target: Check, r: random.Random
) -> None:
    check_target(TARGET.generate(r))


def test_generated_streams_reach_every_outcome(check_target: Check) -> None:
    total: dict[str, int] = {}
    for i in range(150):
        for key, n in check_target(generate(random.Random(i))).items():
            total[key] = total.get(key, 0) + n
    assert min(total.get(k, 0) for k in ("routed", "rejected", "cancelled")) > 10, total
