"""The ext_proc servicer driven in-process with ProcessingRequest messages: phases, errors, lifecycle."""

from __future__ import annotations

import asyncio

import pytest

from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import (
    DUPLEX,
    chat_body,
    mutation_headers,
    picker_config,
    request_body,
    request_headers,
    response_body,
    response_headers,
)


def make_service(**router):
    picker = EndpointPicker(picker_config(**router))
    return picker, ExtProcService(picker, max_body_bytes=1 << 20)


async def run(service, messages):
    async def feed():
        for m in messages:
            yield m

    return [answer async for answer in service.Process(feed(), None)]


def routed_load(picker) -> int:
    router = picker.pools["demo-model"].router
    return sum(router.sequences.num_requests(w) for w in router.workers())


async def test_buffered_body_is_routed_in_the_body_answer_and_freed_at_the_end():
    picker, service = make_service()
    answers = await run(service, [request_headers(), request_body(chat_body())])
    assert answers[0].HasField("request_headers")  # CONTINUE at once in BUFFERED mode
    routed = answers[1]
    headers = mutation_headers(routed.request_body.response)
    endpoint = headers[epp.DESTINATION_HEADER]
    assert endpoint in {"127.0.0.1:8000", "127.0.0.2:8001"}
    assert routed.request_body.response.clear_route_cache
    assert (
        routed.dynamic_metadata.fields["envoy.lb"].struct_value.fields[epp.DESTINATION_HEADER].string_value
        == endpoint
    )
    assert picker.is_idle()  # the stream ended without a response: freed by the finally


async def test_full_lifecycle_marks_prefill_then_frees():
    picker, service = make_service()
    router = picker.pools["demo-model"].router
    messages = asyncio.Queue()
    for m in (request_headers(), request_body(chat_body("x" * 200))):
        messages.put_nowait(m)

    async def feed():
        while (m := await messages.get()) is not None:
            yield m

    stream = service.Process(feed(), None)
    await stream.__anext__()
    await stream.__anext__()
    worker = (
        router.workers()[0] if router.sequences.num_requests(router.workers()[0]) else router.workers()[1]
    )
    assert router.sequences.prefill_tokens(worker) > 0
    messages.put_nowait(response_headers())
    served = await stream.__anext__()
    assert served.dynamic_metadata.fields["envoy.lb"].struct_value.fields[epp.SERVED_KEY].string_value
    messages.put_nowait(response_body())
    await stream.__anext__()
    assert router.sequences.prefill_tokens(worker) == 0 and not picker.is_idle()
    messages.put_nowait(response_body(b"data: [DONE]\n\n", end_of_stream=True))
    await stream.__anext__()
    assert picker.is_idle()
    messages.put_nowait(None)
    assert [a async for a in stream] == []


async def test_duplex_holds_headers_then_answers_with_mutation_and_echoes_the_body():
    picker, service = make_service()
    body = chat_body("y" * 150_000)
    chunks = [body[i : i + 40_000] for i in range(0, len(body), 40_000)]
    messages = [request_headers(mode=DUPLEX)] + [
        request_body(c, end_of_stream=i == len(chunks) - 1) for i, c in enumerate(chunks)
    ]
    answers = await run(service, messages)
    assert answers[0].HasField("request_headers")
    assert epp.DESTINATION_HEADER in mutation_headers(answers[0].request_headers.response)
    echoed = [a.request_body.response.body_mutation.streamed_response for a in answers[1:]]
    assert b"".join(e.body for e in echoed) == body
    assert all(len(e.body) <= epp.MAX_STREAMED_CHUNK for e in echoed)
    assert [e.end_of_stream for e in echoed] == [False] * (len(echoed) - 1) + [True]
    assert picker.is_idle()


async def test_requests_without_a_body_are_routed_on_the_headers_and_not_tracked():
    picker, service = make_service()
    answers = await run(service, [request_headers("/v1/models", method="GET", end_of_stream=True)])
    assert epp.DESTINATION_HEADER in mutation_headers(answers[0].request_headers.response)
    assert picker.is_idle()


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "invalid-request"),
        (b'{"messages": []}', 400, "invalid-request"),
        (b'{"model": 7, "messages": []}', 400, "invalid-request"),
        (chat_body(model="other-model"), 404, "unknown-model"),
        (b"x" * ((1 << 20) + 1), 413, "body-too-large"),
    ],
)
async def test_bad_requests_get_an_immediate_error_and_leave_no_state(body, status, reason):
    picker, service = make_service()
    answers = await run(service, [request_headers(), request_body(body)])
    immediate = answers[-1].immediate_response
    assert immediate.status.code == status
    assert immediate.details == reason
    assert b'"error"' in immediate.body
    assert not answers[-1].HasField("dynamic_metadata")  # never a destination and an error together
    assert picker.is_idle()


async def test_all_workers_busy_is_a_503_with_the_saturated_reason():
    picker, service = make_service(active_prefill_tokens_threshold=10)
    first = service.Process(_once([request_headers(), request_body(chat_body("a" * 400))]), None)
    second = service.Process(_once([request_headers(), request_body(chat_body("b" * 400))]), None)
    for stream in (first, second):
        await stream.__anext__()
        await stream.__anext__()
    third = await run(service, [request_headers(), request_body(chat_body("c" * 400))])
    assert third[-1].immediate_response.status.code == 503
    assert third[-1].immediate_response.details == "rejected-saturated"
    await first.aclose()
    await second.aclose()
    assert picker.is_idle()


async def _once_gen(messages):
    for m in messages:
        yield m
    await asyncio.Event().wait()  # keep the stream open like Envoy waiting for the response


def _once(messages):
    return _once_gen(messages)


@pytest.mark.parametrize("status", ["500", "429", "404"])
async def test_a_non_2xx_response_frees_the_request(status):
    picker, service = make_service()
    answers = await run(service, [request_headers(), request_body(chat_body()), response_headers(status)])
    assert answers[-1].HasField("response_headers")
    assert picker.is_idle()


async def test_cancelled_stream_frees_the_request():
    picker, service = make_service()
    task_stream = service.Process(_once([request_headers(), request_body(chat_body())]), None)
    await task_stream.__anext__()
    await task_stream.__anext__()
    assert not picker.is_idle()
    await task_stream.aclose()  # what grpc.aio does when Envoy resets the stream
    assert picker.is_idle()


async def test_request_headers_again_after_routing_are_not_routed_again():
    """Fuzz-found: a second request-headers message routed anew and the first request was never freed."""
    picker, service = make_service()
    messages = [request_headers(), request_body(chat_body()), request_headers(end_of_stream=True)]
    stream = service.Process(_once(messages), None)
    answers = [await stream.__anext__() for _ in messages]
    assert epp.DESTINATION_HEADER not in mutation_headers(answers[2].request_headers.response)
    assert routed_load(picker) == 1
    await stream.aclose()
    assert picker.is_idle()


async def test_subset_hint_restricts_the_choice_and_an_empty_match_is_503():
    from google.protobuf import struct_pb2

    picker, service = make_service()

    def with_hint(values):
        msg = request_headers()
        hint = struct_pb2.Struct()
        hint.fields[epp.SUBSET_KEY].list_value.extend(values)
        msg.metadata_context.filter_metadata[epp.SUBSET_NAMESPACE].CopyFrom(hint)
        return msg

    for _ in range(5):
        answers = await run(service, [with_hint(["127.0.0.2:8001"]), request_body(chat_body())])
        assert mutation_headers(answers[-1].request_body.response)[epp.DESTINATION_HEADER] == "127.0.0.2:8001"
    answers = await run(service, [with_hint(["127.0.0.2"]), request_body(chat_body())])  # bare IP: any port
    assert mutation_headers(answers[-1].request_body.response)[epp.DESTINATION_HEADER] == "127.0.0.2:8001"
    answers = await run(service, [with_hint(["10.9.9.9:1"]), request_body(chat_body())])
    assert answers[-1].immediate_response.status.code == 503
    answers = await run(service, [with_hint([]), request_body(chat_body())])
    assert answers[-1].immediate_response.status.code == 503
    assert picker.is_idle()


async def test_conformance_selection_header_only_when_hooks_are_enabled():
    picker = EndpointPicker(picker_config())
    hooked = ExtProcService(picker, max_body_bytes=1 << 20, conformance_hooks=True)
    plain = ExtProcService(picker, max_body_bytes=1 << 20)
    extra = {epp.CONFORMANCE_SELECTION_HEADER: "127.0.0.2"}
    # without hooks in the picker config the header is ignored, whatever the service says
    seen = set()
    for _ in range(10):
        answers = await run(plain, [request_headers(extra=extra), request_body(chat_body(f"q{_}"))])
        seen.add(mutation_headers(answers[-1].request_body.response)[epp.DESTINATION_HEADER])
    assert seen == {"127.0.0.1:8000", "127.0.0.2:8001"}
    answers = await run(hooked, [request_headers(extra=extra), request_body(chat_body()), response_headers()])
    served = mutation_headers(answers[-1].response_headers.response)
    assert epp.CONFORMANCE_SERVED_HEADER in served


async def test_dp_rank_is_passed_to_the_engine_in_a_header():
    picker = EndpointPicker(picker_config(1, dp_ranks=(0, 1)))
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    ranks = set()
    for i in range(8):
        answers = await run(service, [request_headers(), request_body(chat_body(f"p{i}" * 50))])
        ranks.add(mutation_headers(answers[-1].request_body.response)["x-data-parallel-rank"])
    assert ranks == {"0", "1"}
