"""Fuzz sticky-session ids: long and many, any bytes, from the header or the body, closed or not.

Promise (extproc/picker/client_ids.py and the pipeline's sessions): a request's session id is
`nvext.session_control.session_id`, else the `x-session-id` header; an id longer than
`--session-id-max-length` (256 characters; undecodable header bytes count one each) is a 400
`invalid-request` that pins nothing, a body id of another type is a 400 too, any other request is
routed. A session is pinned to the worker that answered it 2xx and its next request goes there
(no worker is busy here), `"action": "close"` drops the pin, and the pins of a model never exceed
`--session-max-pins` (8 here; the least recently used goes). No id gets a 500, and every stream
leaves the picker idle. Each input is a short run of requests (1-6, one after the other) drawing
ids from a small pool, so that sessions come back, and fresh ones, so that the bound is reached.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import given
from hypothesis import strategies as st

from extproc.epp.service import ExtProcService
from extproc.picker.client_ids import SESSION_HEADER
from extproc.picker.pipeline import EndpointPicker
from tests.fuzz.gen import chance, pick, text
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
from tests.fuzz.test_ext_proc_fuzz import RecordingPicker, StreamCase, header_message, run_stream
from tests.fuzz.test_trailers_fuzz import _destination
from tests.picker_fixtures import BUFFERED, MODEL, picker_config

MAX_PINS = 8
MAX_LENGTH = 256
POOL = (
    "s", "s2", "\u00e9t\u00e9", "x" * MAX_LENGTH, "x" * (MAX_LENGTH + 1),
    "a\x00b", "a\r\nb", " ", "\U0001f600",
)  # fmt: skip
HEADER_BYTES = (b"\xff\xfe", b"\x80" * MAX_LENGTH, b"\x80" * (MAX_LENGTH + 1), b"\xc3\xa9" * 200, b"s")
NO_VALUE = object()  # the field is left out


@dataclass(frozen=True)
class Request:
    header: bytes | None  # x-session-id, None: not sent
    body_id: Any  # nvext.session_control.session_id: a str, another type, or NO_VALUE
    close: bool
    status: bytes  # the worker's answer


def _id(r: random.Random) -> str:
    roll = r.random()
    if roll < 0.55:
        return pick(r, POOL)
    if roll < 0.8:
        return f"fresh-{r.getrandbits(48):x}"  # a new session: fills the pins up to their bound
    return text(r)


def _request(r: random.Random) -> Request:
    header: bytes | None = None
    if chance(r, 0.5):
        header = pick(r, HEADER_BYTES) if chance(r, 0.2) else _id(r).encode("utf-8", "surrogatepass")
    body_id: Any = NO_VALUE
    if chance(r, 0.6):
        body_id = _id(r) if chance(r, 0.9) else pick(r, (None, 7, ["s"], {"id": "s"}, True, ""))
    return Request(header, body_id, chance(r, 0.1), pick(r, (b"200", b"200", b"200", b"429")))


def generate(r: random.Random) -> tuple[Request, ...]:
    return tuple(_request(r) for _ in range(r.randint(1, 6)))


def effective_id(request: Request) -> type[ValueError] | str | None:
    """The id the picker must use; ValueError: a 400 for the body's (another type than a string, or
    a string with a lone surrogate, which is no UTF-8)."""
    body_id = request.body_id
    if body_id is not NO_VALUE and body_id is not None and not isinstance(body_id, str):
        return ValueError
    if isinstance(body_id, str) and any("\ud800" <= ch <= "\udfff" for ch in body_id):
        return ValueError
    header = request.header.decode("utf-8", "replace") if request.header else None
    body = request.body_id if isinstance(request.body_id, str) else None
    return body or header or None


def _stream(request: Request) -> StreamCase:
    pairs = {":path": b"/v1/chat/completions", ":method": b"POST", "x-request-id": b"session"}
    if request.header is not None:
        pairs[SESSION_HEADER] = request.header
    headers = pb.ProcessingRequest(request_headers=header_message(pairs, False))
    headers.protocol_config.request_body_mode = BUFFERED
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "which worker has me"}]}
    control: dict[str, Any] = {}
    if request.body_id is not NO_VALUE:
        control["session_id"] = request.body_id
    if request.close:
        control["action"] = "close"
    if control:
        body["nvext"] = {"session_control": control}
    data = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return StreamCase(
        (
            headers,
            pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=True)),
            pb.ProcessingRequest(response_headers=header_message({":status": request.status}, False)),
            pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True)),
        ),
        None,
    )


@contextlib.contextmanager
def session() -> Iterator[Check]:
    loop = LoopRunner()
    config = replace(picker_config(3), session_max_pins=MAX_PINS, session_id_max_length=MAX_LENGTH)

    def fresh() -> tuple[ExtProcService, RecordingPicker, EndpointPicker]:
        picker = EndpointPicker(config)
        recorder = RecordingPicker(picker)
        service = ExtProcService(recorder, max_body_bytes=config.max_body_bytes)  # type: ignore[arg-type]
        return service, recorder, picker

    state = [fresh()]

    def check(requests: tuple[Request, ...]) -> Outcome:
        service, recorder, picker = state[0]
        pins = picker.sessions(MODEL)
        outcomes = []
        pinned: dict[str, str] = {}  # session -> the endpoint that answered it 2xx, in this input
        try:
            for request in requests:
                recorder.problems.clear()
                answers = loop.run(run_stream(service, _stream(request)))
                assert answers is not None
                assert not recorder.problems, recorder.problems
                assert not recorder.open and service.open_streams == 0 and picker.is_idle()
                immediate = [a.immediate_response for a in answers if a.HasField("immediate_response")]
                destination = next((d for a in answers if (d := _destination(a))), None)
                sid = effective_id(request)
                if sid is ValueError or (isinstance(sid, str) and len(sid) > MAX_LENGTH):
                    assert len(immediate) == 1 and destination is None, answers
                    assert (immediate[0].status.code, immediate[0].details) == (400, "invalid-request")
                    if isinstance(sid, str):
                        assert sid not in pins, "an over-long session id was pinned"
                    outcomes.append("refused")
                    continue
                assert not immediate and destination is not None, answers
                if isinstance(sid, str):
                    if sid in pinned:
                        assert destination == pinned[sid], f"session {sid[:40]!r} left its worker"
                    if request.close:
                        pinned.pop(sid, None)
                        assert sid not in pins
                    elif request.status == b"200":
                        pinned[sid] = destination
                        assert sid in pins
                outcomes.append("sticky" if isinstance(sid, str) and sid in pinned else "routed")
                assert len(pins) <= MAX_PINS, len(pins)
        except BaseException:
            state[0] = fresh()  # what leaked must not fail the next inputs
            raise
        return tally(outcomes)

    try:
        yield check
    finally:
        loop.run(state[0][2].close())
        loop.close()


def describe(requests: tuple[Request, ...]) -> str:
    return repr([(r.header[:80] if r.header else r.header, repr(r.body_id)[:80], r.close, r.status)
                 for r in requests])  # fmt: skip


TARGET = Target("sessions", generate, session, describe)
check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_session_ids_are_bounded_sticky_and_never_a_500(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_session_ids_are_bounded_sticky_and_never_a_500_shrinking(
    check_target: Check, r: random.Random
) -> None:
    check_target(TARGET.generate(r))


def test_generated_sessions_reach_every_outcome(check_target: Check) -> None:
    total: dict[str, int] = {}
    for i in range(200):
        for key, n in check_target(generate(random.Random(i))).items():
            total[key] = total.get(key, 0) + n
    assert min(total.get(k, 0) for k in ("refused", "routed", "sticky")) > 20, total
