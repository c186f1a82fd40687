"""The ext_proc servicer driven in-process with ProcessingRequest messages: phases, errors, lifecycle."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import ModelConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

from ..config.test_inference_extension import rewrite
from ..picker_fixtures import (
    BUFFERED,
    DUPLEX,
    chat_body,
    closed_after_test,
    mutation_headers,
    picker_config,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
)


def make_service(**router):
    picker = closed_after_test(EndpointPicker(picker_config(**router)))
    return picker, ExtProcService(picker, max_body_bytes=1 << 20)


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
    await stream.__anext__()  # answered first; the chunk is booked before the next message is read
    messages.put_nowait(response_body(b"data: more\n\n"))
    await stream.__anext__()
    assert router.sequences.prefill_tokens(worker) == 0 and not picker.is_idle()
    messages.put_nowait(response_body(b"data: [DONE]\n\n", end_of_stream=True))
    await stream.__anext__()
    messages.put_nowait(None)
    assert [a async for a in stream] == []
    assert picker.is_idle()
    assert picker.metrics.requests.values["demo-model", "completed"] == 1


async def test_a_stream_closed_right_after_its_last_answer_still_books_the_response_complete():
    """The last chunk is answered before it is accounted (Envoy forwards it meanwhile); a stream
    that goes away at that moment still books the first token and frees the request as completed."""
    picker, service = make_service()
    router = picker.pools["demo-model"].router
    messages = [
        request_headers(),
        request_body(chat_body("x" * 200)),
        response_headers(),
        response_body(b"data: [DONE]\n\n", end_of_stream=True),
    ]

    async def feed():
        for m in messages:
            yield m

    stream = service.Process(feed(), None)
    for _ in messages:
        await stream.__anext__()
    await stream.aclose()  # gRPC closes the generator at its last yield
    assert picker.is_idle() and all(router.sequences.prefill_tokens(w) == 0 for w in router.workers())
    assert picker.metrics.requests.values["demo-model", "completed"] == 1
    assert picker.metrics.requests.values["demo-model", "cancelled"] == 0


@pytest.mark.parametrize(
    ("content_type", "at_first_token"),
    [
        ("application/json", False),  # a non-streamed answer comes whole: its first chunk ends it
        ("application/json; charset=utf-8", False),
        ("text/event-stream", True),  # vLLM, SGLang, Dynamo: the first event is the first token
        ("Text/Event-Stream; charset=utf-8", True),
        (None, True),  # no type said: taken as before, for the first token
    ],
)
async def test_only_an_event_streams_first_chunk_is_taken_for_the_first_token(content_type, at_first_token):
    picker, service = make_service()
    seen: list[bool] = []
    first_token = picker.first_token

    def record(pick, *, at_first_token: bool = True) -> None:
        seen.append(at_first_token)
        first_token(pick, at_first_token=at_first_token)

    picker.first_token = record
    await run(service, [
        request_headers(), request_body(chat_body("x" * 200)), response_headers(content_type=content_type),
        response_body(b"{}"), response_body(b"", end_of_stream=True),
    ])  # fmt: skip
    assert seen == [at_first_token]  # once, for the first chunk
    assert picker.is_idle()


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
    picker = closed_after_test(EndpointPicker(picker_config()))
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
    picker = closed_after_test(EndpointPicker(picker_config(1, dp_ranks=(0, 1))))
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    ranks = set()
    for i in range(8):
        answers = await run(service, [request_headers(), request_body(chat_body(f"p{i}" * 50))])
        ranks.add(mutation_headers(answers[-1].request_body.response)["x-data-parallel-rank"])
    assert ranks == {"0", "1"}


# --- issue 19: what a client may not send past the picker ------------------------------------

CLIENT_COPIES = {
    "x-prefill-endpoint": "10.9.9.9:80",
    "x-data-parallel-rank": "7",
    "x-extproc-worker": "forged",
    "x-gateway-destination-endpoint-served": "10.9.9.9:80",
}


def common_of(answer):
    return (
        answer.request_body.response if answer.HasField("request_body") else answer.request_headers.response
    )


def removed_headers(answer) -> set[str]:
    return set(common_of(answer).header_mutation.remove_headers)


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
async def test_every_routing_answer_removes_the_client_copies_of_owned_headers(mode, path):
    picker, service = make_service()
    headers = request_headers(path, mode=mode, extra=CLIENT_COPIES)
    answers = await run(service, [headers, request_body(chat_body())])
    routed = next(a for a in answers if epp.DESTINATION_HEADER in mutation_headers(common_of(a)))
    assert removed_headers(routed) == set(CLIENT_COPIES) | epp.INPUT_HEADERS
    assert service.owned_headers == epp.owned_headers() == {*CLIENT_COPIES, epp.DESTINATION_HEADER}
    assert picker.is_idle()


async def test_owned_headers_the_pick_sets_are_set_not_removed():
    picker = closed_after_test(EndpointPicker(picker_config(1, dp_ranks=(0, 1))))
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    answers = await run(service, [request_headers(extra=CLIENT_COPIES), request_body(chat_body())])
    routed = answers[-1]
    assert mutation_headers(routed.request_body.response)[epp.DP_RANK_HEADER] in {"0", "1"}
    assert removed_headers(routed) == (set(CLIENT_COPIES) | epp.INPUT_HEADERS) - {epp.DP_RANK_HEADER}


async def test_the_configured_prefill_header_is_owned():
    from dataclasses import replace

    from extproc.config.disagg import DisaggConfig

    config = replace(picker_config(), disagg=DisaggConfig(prefill_header="x-my-prefill"))
    service = ExtProcService(closed_after_test(EndpointPicker(config)), max_body_bytes=1 << 20)
    answers = await run(
        service, [request_headers(extra={"x-my-prefill": "10.9.9.9:80"}), request_body(chat_body())]
    )
    assert "x-my-prefill" in removed_headers(answers[-1])
    assert "x-prefill-endpoint" not in service.owned_headers
    explicit = ExtProcService(
        closed_after_test(EndpointPicker(config)), max_body_bytes=1 << 20, owned_headers=["X-Other"]
    )
    assert explicit.owned_headers == {"x-other"}


def test_the_owned_header_names_are_the_ones_the_picker_sets():
    from extproc.config.disagg import DisaggConfig
    from extproc.picker.pools import DP_RANK_HEADER

    assert DP_RANK_HEADER == epp.DP_RANK_HEADER
    assert DisaggConfig().prefill_header == epp.DEFAULT_PREFILL_HEADER


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/%63ompletions",
        "/v1//chat/completions",
        "/v1/x/../chat/completions?a=1",
        "/v1\\chat/completions",
    ],
)
async def test_an_encoded_chat_path_is_parsed_and_tracked(path):
    picker, service = make_service()
    stream = OpenStream(service)
    stream.send(request_headers(path), request_body(chat_body()))
    await until(lambda: len(stream.answers) == 2)
    assert epp.DESTINATION_HEADER in mutation_headers(stream.answers[-1].request_body.response)
    assert routed_load(picker) == 1  # tracked, not routed on the headers alone
    await stream.close()
    assert picker.is_idle()
    answers = await run(service, [request_headers(path), request_body(chat_body(model="other-model"))])
    assert answers[-1].immediate_response.details == "unknown-model"  # the model is checked


@pytest.mark.parametrize(
    "path", ["/v1%2Fchat%2Fcompletions", "/v1/chat%5ccompletions", "/v1/%00", "/v1/models#x"]
)
async def test_an_encoded_slash_nul_or_fragment_is_a_400(path):
    picker, service = make_service()
    answers = await run(service, [request_headers(path, method="GET", end_of_stream=True)])
    assert answers[-1].immediate_response.status.code == 400
    assert answers[-1].immediate_response.details == "invalid-request"
    assert picker.is_idle()


async def test_a_buffered_body_followed_by_trailers_is_decided_on_its_one_message():
    """Envoy sends a BUFFERED body with end_of_stream false when HTTP/2 trailers follow, and the
    trailers only after that message is answered."""
    picker, service = make_service()
    stream = OpenStream(service)
    stream.send(request_headers(), request_body(chat_body(), end_of_stream=False))
    await until(lambda: len(stream.answers) == 2)
    assert epp.DESTINATION_HEADER in mutation_headers(stream.answers[-1].request_body.response)
    assert routed_load(picker) == 1
    stream.send(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    await until(lambda: len(stream.answers) == 3)
    assert stream.answers[-1].HasField("request_trailers")
    await stream.close()
    assert picker.is_idle()
    over = await run(service, [request_headers(), request_body(b"{", end_of_stream=False)])
    assert over[-1].immediate_response.details == "invalid-request"


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
async def test_headers_then_trailers_without_data_are_decided_on_an_empty_body(mode):
    picker, service = make_service()
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    answers = await run(service, [request_headers(mode=mode), trailers])
    assert answers[-1].immediate_response.details == "invalid-request"
    assert b"request body is empty" in answers[-1].immediate_response.body
    # not a generation request: duplex still routes it (the headers answer was held); in BUFFERED
    # the headers were answered already and nothing can route it any more, so it is refused too
    answers = await run(service, [request_headers("/v1/models", mode=mode), trailers])
    if mode == DUPLEX:
        assert epp.DESTINATION_HEADER in mutation_headers(answers[0].request_headers.response)
        assert answers[-1].HasField("request_trailers")
    else:
        assert answers[-1].immediate_response.details == "invalid-request"
        assert b"trailers but no body" in answers[-1].immediate_response.body
    assert picker.is_idle()


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
async def test_a_post_without_body_to_a_routable_path_is_a_400(mode):
    picker, service = make_service()
    answers = await run(service, [request_headers("/v1/completions", mode=mode, end_of_stream=True)])
    immediate = answers[-1].immediate_response
    assert (immediate.status.code, immediate.details) == (400, "invalid-request")
    assert b"request body is empty" in immediate.body
    for method in ("GET", "OPTIONS"):  # not a generation request: the worker answers (405, CORS)
        answers = await run(service, [request_headers("/v1/completions", method=method, end_of_stream=True)])
        assert epp.DESTINATION_HEADER in mutation_headers(answers[-1].request_headers.response)
    assert picker.is_idle()


class OpenStream:
    """One ext_proc stream kept open (Envoy waiting for the upstream); answers are collected."""

    def __init__(self, service: ExtProcService) -> None:
        self.messages: asyncio.Queue = asyncio.Queue()
        self.answers: list = []
        self.task = asyncio.create_task(self._run(service))

    async def _feed(self):
        while (message := await self.messages.get()) is not None:
            yield message

    async def _run(self, service: ExtProcService) -> None:
        async for answer in service.Process(self._feed(), None):
            self.answers.append(answer)

    def send(self, *messages) -> None:
        for message in messages:
            self.messages.put_nowait(message)

    async def close(self) -> None:
        self.messages.put_nowait(None)
        await asyncio.wait_for(self.task, 5)


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
async def test_a_model_rewrite_sends_the_rewritten_body_in_either_body_mode(mode, tmp_path):
    """BUFFERED: the body mutation with its content-length; DUPLEX: the streamed chunks are the new
    body (Envoy drops the length there). Through Envoy: tests/e2e/test_inference_extension_e2e.py."""
    path = tmp_path / "resources.yaml"
    rules = "  - matches:\n    - model: {value: alias}\n    targets:\n    - modelRewrite: lora-a\n"
    path.write_text(rewrite("to-adapter", rules))
    config = replace(
        picker_config(),
        models=(ModelConfig("demo-model", lora_adapters=("lora-a",)),),
        inference_extension=InferenceExtensionConfig(str(path), Pool(), read_resources(str(path), Pool())),
    )
    picker = EndpointPicker(config)
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    body = chat_body("a question", model="alias")
    answers = await run(service, [request_headers(mode=mode), request_body(body)])
    if mode == BUFFERED:
        common = answers[-1].request_body.response
        sent = common.body_mutation.body
        assert mutation_headers(common)["content-length"] == str(len(sent))
    else:
        sent = b"".join(a.request_body.response.body_mutation.streamed_response.body for a in answers[1:])
    assert json.loads(sent) == {**json.loads(body), "model": "lora-a"}
    assert picker.is_idle()  # the stream ended: the request was freed
    await picker.close()
