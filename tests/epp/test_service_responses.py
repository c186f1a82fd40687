"""The Responses API through the ext_proc servicer in-process: answers as vLLM 0.33.0 writes them
(`tests/request/engines/vllm-0.33.0/responses.json`, `answers`), the stored response's home, what
names it, and the first token of a stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from extproc.epp import answers as epp
from extproc.epp.responses_stream import MAX_ID_SCAN_BYTES
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import (
    MODEL,
    closed_after_test,
    mutation_headers,
    picker_config,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
)

ANSWERS = json.loads(
    (Path(__file__).parents[1] / "request" / "engines" / "vllm-0.33.0" / "responses.json").read_text()
)["answers"]
SSE = "text/event-stream; charset=utf-8"


def make_service(workers: int = 4):
    # no cache credit: idle workers tie and requests spread (ties are broken at random)
    picker = closed_after_test(EndpointPicker(picker_config(workers, overlap_score_weight=0.0)))
    return picker, ExtProcService(picker, max_body_bytes=1 << 20)


def body(**fields) -> bytes:
    return json.dumps({"model": MODEL, **fields}).encode()


async def respond(
    service, request: bytes, answer: list[bytes], *, content_type="application/json", status="200"
):
    """One POST /v1/responses: where it went, and the picker's first-token calls."""
    answers = await run(service, [
        request_headers("/v1/responses"), request_body(request),
        response_headers(status, content_type=content_type),
        *(response_body(chunk, end_of_stream=i == len(answer) - 1) for i, chunk in enumerate(answer)),
    ])  # fmt: skip
    return mutation_headers(answers[1].request_body.response)[epp.DESTINATION_HEADER]


def answer_of(response_id: str) -> list[bytes]:
    return [ANSWERS["json"].replace(ANSWERS["id"], response_id).encode()]


async def test_a_follow_up_goes_to_the_worker_that_stored_the_response():
    picker, service = make_service()
    homes = {}
    for i in range(8):  # answers land on every worker
        rid = f"resp_{i}"
        homes[rid] = await respond(service, body(input=f"question {i}"), answer_of(rid))
    assert len(set(homes.values())) > 1 and len(picker.response_homes) == 8
    assert "extproc_response_homes 8.0" in generate_latest(picker.metrics.registry).decode()
    for rid, home in homes.items():
        for _ in range(3):  # on load alone the follow-ups would spread over the workers
            follow_up = body(input="and then?", previous_response_id=rid)
            assert await respond(service, follow_up, answer_of(rid + "-next")) == home
    assert picker.is_idle()


@pytest.mark.parametrize(
    ("path", "method"),
    [("/v1/responses/{id}", "GET"), ("/v1/responses/{id}/cancel", "POST"), ("/v1/responses/{id}", "DELETE"),
     ("/v1/responses/{id}/input_items?limit=5", "GET")],
)  # fmt: skip
async def test_what_names_a_stored_response_goes_where_it_is(path, method):
    picker, service = make_service()
    homes = {
        f"resp_{i}": await respond(service, body(input=f"q {i}"), answer_of(f"resp_{i}")) for i in range(6)
    }
    for rid, home in homes.items():
        answers = await run(
            service, [request_headers(path.format(id=rid), method=method, end_of_stream=True)]
        )
        assert mutation_headers(answers[0].request_headers.response)[epp.DESTINATION_HEADER] == home
    assert picker.is_idle()


async def test_the_id_is_read_from_the_streams_first_event_and_the_first_token_is_the_first_delta():
    picker, service = make_service(1)
    created, in_progress, delta = (
        ANSWERS[k].encode() for k in ("sse_created", "sse_in_progress", "sse_first_delta")
    )
    for chunks, first_token_at in (
        ([created, in_progress, delta, b"event: response.completed\n"], 2),
        ([created + in_progress, delta, b"event: response.completed\n"], 1),  # the two events in one chunk
        ([created, in_progress + delta, b"event: response.completed\n"], 1),
    ):
        fed: list[int] = []  # response body chunks handed to the servicer so far
        seen: list[tuple[int, bool]] = []
        first_token = picker.first_token

        def record(pick, *, at_first_token: bool = True, first_token=first_token, seen=seen, fed=fed) -> None:
            seen.append((len(fed) - 1, at_first_token))
            first_token(pick, at_first_token=at_first_token)

        picker.first_token = record
        messages = [
            request_headers("/v1/responses"), request_body(body(input="hi", stream=True)),
            response_headers(content_type=SSE),
            *(response_body(c, end_of_stream=i == len(chunks) - 1) for i, c in enumerate(chunks)),
        ]  # fmt: skip

        async def feed(messages=messages, fed=fed):
            for m in messages:
                if m.HasField("response_body"):
                    fed.append(1)
                yield m

        _ = [a async for a in service.Process(feed(), None)]
        picker.first_token = first_token
        assert seen == [(first_token_at, True)]  # created and in_progress come before generation
    assert picker.response_homes.get(ANSWERS["id"], 0.0) is not None
    assert picker.is_idle()


async def test_a_client_named_id_is_its_home_without_reading_the_answer():
    picker, service = make_service()
    home = await respond(service, body(input="hi", request_id="resp_named"), [b'{"object": "response"}'])
    assert picker.response_homes.get("resp_named", 0.0).endpoint == home


async def test_an_error_answer_and_an_answer_without_id_teach_nothing():
    picker, service = make_service()
    await respond(service, body(input="hi"), answer_of("resp_failed"), status="500")
    await respond(service, body(input="hi"), [b"x" * 40_000, b"y" * 40_000, b'{"id": "resp_late"}'])
    assert len(picker.response_homes) == 0  # the id is looked for in the first 64 KB only
    assert MAX_ID_SCAN_BYTES == 64 * 1024


async def test_an_unknown_previous_response_is_routed_on_load():
    picker, service = make_service()
    assert await respond(service, body(input="hi", previous_response_id="resp_nowhere"), answer_of("resp_x"))
    assert picker.is_idle() and picker.response_homes.get("resp_x", 0.0) is not None
