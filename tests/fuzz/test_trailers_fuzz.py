"""Fuzz trailers: ext_proc streams with request and response trailers in every phase.

Promise (extproc/epp/service.py): trailers anywhere in a stream (before the headers, with no body,
between body chunks, after the body, after the response, twice) never raise, never get a 500,
and change no accounting: every routed request is finished once, no stream stays counted open, the
picker is idle afterwards. Each trailers message gets at most one trailers answer. Where Envoy sends
trailers in HTTP/2 order the answer is the documented one:
- BUFFERED, the body in one message whose `end_of_stream` is false, then the trailers: decided on
  that message (routed);
- FULL_DUPLEX_STREAMED, body chunks without `end_of_stream`, then the trailers: the trailers end the
  body, the request is routed once;
- BUFFERED, headers then trailers and no data: 400 `invalid-request`.
The trailers' own header maps are hostile (headers the picker owns, pseudo-headers, session ids,
long or undecodable values) and must change nothing of the decision.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from dataclasses import replace

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import given
from hypothesis import strategies as st

from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker
from tests.fuzz.gen import chance, pick
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
from tests.fuzz.test_ext_proc_fuzz import RecordingPicker, StreamCase, header_message, outcome_of, run_stream
from tests.picker_fixtures import BUFFERED, DUPLEX, MODEL, picker_config

NONE_MODE = 0
CANONICAL = ("buffered-body-then-trailers", "duplex-chunks-then-trailers", "buffered-trailers-only")
TRAILER_KEYS = (
    epp.DESTINATION_HEADER, "x-data-parallel-rank", "x-prefill-endpoint", ":path", ":status", "x-session-id",
    "x-request-id", "grpc-status", "content-length", "x-custom", "",
)  # fmt: skip

Case = tuple[str, StreamCase]  # the kind of placement ("canonical" ones have a documented answer)


def _trailers(r: random.Random) -> pb.HttpTrailers:
    pairs = []
    for _ in range(r.randint(0, 3)):
        key = pick(r, TRAILER_KEYS)
        value = pick(r, (b"10.9.9.9:80", b"0", b"/v1/completions", b"\xff\xfe", b"x" * 70000, b""))
        pairs.append(base_pb2.HeaderValue(key=key, raw_value=value))
    return pb.HttpTrailers(trailers=base_pb2.HeaderMap(headers=pairs))


def _request_trailers(r: random.Random) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=_trailers(r))


def _response_trailers(r: random.Random) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_trailers=_trailers(r))


def _headers(mode: int, end_of_stream: bool) -> pb.ProcessingRequest:
    pairs = {":path": b"/v1/chat/completions", ":method": b"POST", "x-request-id": b"trailers"}
    message = pb.ProcessingRequest(request_headers=header_message(pairs, end_of_stream))
    message.protocol_config.request_body_mode = mode
    message.protocol_config.response_body_mode = pick(random.Random(mode), (BUFFERED, NONE_MODE))
    return message


def _body(r: random.Random) -> bytes:
    text = "trailers follow " * r.randint(1, 40)
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]}).encode()


def _chunks(r: random.Random, data: bytes, last_ends: bool) -> list[pb.ProcessingRequest]:
    cuts = sorted(r.randint(0, len(data)) for _ in range(r.randint(0, 3)))
    parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    ends = [last_ends and i + 1 == len(parts) for i in range(len(parts))]
    return [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=part, end_of_stream=end))
        for part, end in zip(parts, ends, strict=True)
    ]


def _response(r: random.Random) -> list[pb.ProcessingRequest]:
    status = pick(r, (b"200", b"200", b"503"))
    out = [pb.ProcessingRequest(response_headers=header_message({":status": status}, False))]
    for i in range(r.randint(0, 2)):
        chunk = pb.HttpBody(body=b"data: {}\n\n", end_of_stream=i == 1)
        out.append(pb.ProcessingRequest(response_body=chunk))
    if chance(r, 0.5):
        out.append(_response_trailers(r))
    return out


def generate(r: random.Random) -> Case:
    roll = r.random()
    if roll < 0.45:  # HTTP/2 order, each documented
        kind = pick(r, CANONICAL)
        if kind == "buffered-body-then-trailers":
            body = pb.ProcessingRequest(request_body=pb.HttpBody(body=_body(r), end_of_stream=False))
            messages = [_headers(BUFFERED, False), body, _request_trailers(r), *_response(r)]
        elif kind == "duplex-chunks-then-trailers":
            chunks = _chunks(r, _body(r), False)
            messages = [_headers(DUPLEX, False), *chunks, _request_trailers(r), *_response(r)]
        else:
            messages = [_headers(BUFFERED, False), _request_trailers(r)]
        return kind, StreamCase(tuple(messages), None)
    # trailers anywhere: before the headers, between chunks, twice, after the end, alone
    mode = pick(r, (BUFFERED, DUPLEX, NONE_MODE))
    messages = [_headers(mode, chance(r, 0.1)), *_chunks(r, _body(r), chance(r, 0.5)), *_response(r)]
    for _ in range(r.randint(1, 3)):
        make = _request_trailers if chance(r, 0.6) else _response_trailers
        messages.insert(r.randint(0, len(messages)), make(r))
    if chance(r, 0.05):
        messages = [make(r) for make in (_request_trailers, _response_trailers)]
    cancel_at = r.randint(0, len(messages)) if chance(r, 0.1) else None
    return "anywhere", StreamCase(tuple(messages), cancel_at)


@contextlib.contextmanager
def session() -> Iterator[Check]:
    loop = LoopRunner()
    config = replace(picker_config(2), max_body_bytes=1 << 16)

    def fresh() -> tuple[ExtProcService, RecordingPicker, EndpointPicker]:
        picker = EndpointPicker(config)
        recorder = RecordingPicker(picker)
        service = ExtProcService(recorder, max_body_bytes=config.max_body_bytes)  # type: ignore[arg-type]
        return service, recorder, picker

    state = [fresh()]
    endpoints = {w.endpoint for w in config.workers}

    def check(case: Case) -> Outcome:
        kind, stream = case
        service, recorder, picker = state[0]
        recorder.problems.clear()
        try:
            answers = loop.run(run_stream(service, stream))
            assert not recorder.problems, recorder.problems
            assert not recorder.open, f"{len(recorder.open)} routed requests never finished"
            assert service.open_streams == 0 and picker.is_idle()
            if answers is None:
                return {"cancelled": 1}
            immediate = [a.immediate_response for a in answers if a.HasField("immediate_response")]
            assert all(i.status.code != 500 for i in immediate), immediate
            for phase in ("request_trailers", "response_trailers"):
                sent = sum(m.HasField(phase) for m in stream.messages)
                assert sum(a.HasField(phase) for a in answers) <= sent, f"more {phase} answers than sent"
            outcome = outcome_of(answers)
            destinations = {d for a in answers if (d := _destination(a))}
            assert destinations <= endpoints, f"routed to {destinations}: a trailer chose the destination"
            if kind in ("buffered-body-then-trailers", "duplex-chunks-then-trailers"):
                assert outcome == "routed", (kind, answers)
                phase = "request_body" if "buffered" in kind else "request_headers"
                routing = [a for a in answers if a.HasField(phase) and _destination(a)]
                assert len(routing) == 1, answers
            elif kind == "buffered-trailers-only":
                assert len(immediate) == 1 and immediate[0].status.code == 400, answers
                assert immediate[0].details == "invalid-request", immediate
        except BaseException:
            state[0] = fresh()  # what leaked must not fail the next inputs
            raise
        return tally([f"{kind}-{outcome}" if kind != "anywhere" else outcome])

    try:
        yield check
    finally:
        loop.run(state[0][2].close())
        loop.close()


def _destination(answer: pb.ProcessingResponse) -> str | None:
    """The endpoint an answer routes to (its `envoy.lb` metadata), if any."""
    fields = answer.dynamic_metadata.fields.get("envoy.lb")
    if fields is None or epp.DESTINATION_HEADER not in fields.struct_value.fields:
        return None
    return fields.struct_value.fields[epp.DESTINATION_HEADER].string_value


def describe(case: Case) -> str:
    kind, stream = case
    kinds = [m.WhichOneof("request") or "none" for m in stream.messages]
    return f"{kind} cancel_at={stream.cancel_at}: {kinds} {[str(m)[:200] for m in stream.messages]}"[:4000]


TARGET = Target("trailers", generate, session, describe)
check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_trailers_in_every_phase_change_nothing_but_what_is_documented(
    check_target: Check, seed: int
) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_trailers_in_every_phase_change_nothing_but_what_is_documented_shrinking(
    check_target: Check, r: random.Random
) -> None:
    check_target(TARGET.generate(r))


def test_generated_trailers_reach_every_outcome(check_target: Check) -> None:
    total: dict[str, int] = {}
    for i in range(300):
        for key, n in check_target(generate(random.Random(i))).items():
            total[key] = total.get(key, 0) + n
    wanted = [f"{k}-{'rejected' if k == 'buffered-trailers-only' else 'routed'}" for k in CANONICAL]
    assert min(total.get(k, 0) for k in [*wanted, "routed", "rejected", "cancelled"]) > 5, total
