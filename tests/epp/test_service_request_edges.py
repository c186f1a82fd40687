"""Edges of the ext_proc servicer's request side and its small readers, driven in-process: the body
limit, streams that end after an error answer, headers Envoy may send in another form (a key's
case, `value` instead of `raw_value`, bytes that are not UTF-8, no `:path` / `:method` / `:status`
/ `x-request-id`), the queued request's notices, and the service's own settings."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.epp import answers as epp
from extproc.epp.output_tokens import MAX_LINE_BYTES
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import (
    BUFFERED,
    DUPLEX,
    MODEL,
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
from .test_output_tokens import chat_chunk
from .test_service import OpenStream, until

STREAMED = 1  # ProcessingMode.STREAMED: Envoy does not show this servicer a request body it can route on
TRAILERS = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


class Recorder(EndpointPicker):
    """The project's picker, recording what the service gives it and asks of it."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.picks: list = []
        self.first_tokens: list[bool] = []
        self.counted: list[tuple[int, int]] = []
        self.frees: list[str] = []

    async def pick(self, **kwargs):
        chosen = await super().pick(**kwargs)
        self.picks.append(chosen)
        return chosen

    def first_token(self, pick, *, at_first_token: bool = True) -> None:
        self.first_tokens.append(at_first_token)
        super().first_token(pick, at_first_token=at_first_token)

    def output_tokens(self, pick, count: int, sequences: int = 1) -> None:
        self.counted.append((count, sequences))
        super().output_tokens(pick, count, sequences)

    def finish(self, pick, cause: str) -> None:
        self.frees.append(cause)
        super().finish(pick, cause)


class Failing(EndpointPicker):
    """A picker whose decision fails with an error it does not document."""

    async def pick(self, **kwargs):
        raise RuntimeError("a bug in the picker")


class PlainPicker:
    """A picker with only the narrow `Picker` protocol: it takes no output tokens."""

    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker

    @property
    def may_queue(self) -> bool:
        return self.picker.may_queue

    async def pick(self, **kwargs):
        return await self.picker.pick(**kwargs)

    def first_token(self, pick, *, at_first_token: bool = True) -> None:
        self.picker.first_token(pick, at_first_token=at_first_token)

    def finish(self, pick, cause: str) -> None:
        self.picker.finish(pick, cause)

    def answered(self, pick, status: int) -> None:
        self.picker.answered(pick, status)

    def response_stored(self, pick, response_id: str) -> None:
        self.picker.response_stored(pick, response_id)

    def rejected(self, status: int, reason: str) -> None:
        self.picker.rejected(status, reason)


def make(config=None, **options):
    picker = Recorder(config or picker_config())
    return picker, ExtProcService(picker, max_body_bytes=options.pop("max_body_bytes", 1 << 20), **options)


def routed_load(picker) -> int:
    router = picker.pools[MODEL].router
    return sum(router.sequences.num_requests(w) for w in router.workers())


def upstream_answers(picker, status: str) -> float:
    return sum(count for (_, _, code), count in picker.metrics.upstream.values.items() if code == status)


def rejections(picker, status: int, reason: str) -> float:
    value = picker.metrics.registry.get_sample_value(
        "extproc_rejections_total", {"status": str(status), "reason": reason}
    )
    return value or 0.0


def headers_without(name: str, **kwargs) -> pb.ProcessingRequest:
    """`request_headers(**kwargs)` without header `name`."""
    message = request_headers(**kwargs)
    kept = [h for h in message.request_headers.headers.headers if h.key != name]
    del message.request_headers.headers.headers[:]
    message.request_headers.headers.headers.extend(kept)
    return message


def response_with(*headers: base_pb2.HeaderValue, end_of_stream=False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=headers), end_of_stream=end_of_stream
        )
    )


def error_of(answer: pb.ProcessingResponse) -> tuple[int, str, str]:
    immediate = answer.immediate_response
    return immediate.status.code, immediate.details, json.loads(immediate.body)["error"]["message"]


def is_routed(answer: pb.ProcessingResponse) -> bool:
    common = (
        answer.request_body.response if answer.HasField("request_body") else answer.request_headers.response
    )
    return epp.DESTINATION_HEADER in mutation_headers(common)


async def routed_stream(service, **headers) -> OpenStream:
    stream = OpenStream(service)
    stream.send(request_headers(**headers), request_body(chat_body("a b c d " * 10)))
    await until(lambda: len(stream.answers) == 2)
    assert is_routed(stream.answers[1])
    return stream


async def answered(stream: OpenStream, *messages) -> list[pb.ProcessingResponse]:
    """Send `messages` and wait for one answer each; those answers."""
    n = len(stream.answers)
    stream.send(*messages)
    await until(lambda: len(stream.answers) == n + len(messages))
    return stream.answers[n:]


# --- the request body limit --------------------------------------------------------------------------


async def test_a_body_over_the_services_limit_is_413_with_its_size_and_the_limit():
    picker, service = make(max_body_bytes=100)  # below the picker config's own limit (1 MiB)
    body = chat_body("x" * 150)
    answers = await run(service, [request_headers(), request_body(body)])
    assert error_of(answers[-1]) == (
        413, "body-too-large", f"request body of {len(body)} bytes exceeds the limit of 100 bytes"
    )  # fmt: skip
    assert picker.picks == [] and picker.is_idle()


async def test_a_duplex_body_over_the_limit_over_several_chunks_is_413_with_its_whole_size():
    picker, service = make(max_body_bytes=100)
    answers = await run(service, [
        request_headers(mode=DUPLEX), request_body(b"a" * 60, end_of_stream=False),
        request_body(b"b" * 60, end_of_stream=False),
    ])  # fmt: skip
    assert len(answers) == 1  # the headers answer was held: the error is the only answer
    assert error_of(answers[0]) == (
        413,
        "body-too-large",
        "request body of 120 bytes exceeds the limit of 100 bytes",
    )
    assert picker.is_idle()


async def test_a_body_of_exactly_the_limit_is_routed():
    body = chat_body("exactly at the limit")
    picker, service = make(max_body_bytes=len(body))
    answers = await run(service, [request_headers(), request_body(body)])
    assert is_routed(answers[-1])
    assert len(picker.picks) == 1 and picker.is_idle()


# --- an error answer ends the stream -------------------------------------------------------------------


async def test_a_stream_ends_after_its_413_and_answers_nothing_more():
    picker, service = make(max_body_bytes=10)
    answers = await run(service, [request_headers(), request_body(b"x" * 11, end_of_stream=False), TRAILERS])
    assert len(answers) == 2 and answers[-1].immediate_response.status.code == 413
    assert service.open_streams == 0 and picker.is_idle()


async def test_a_stream_ends_after_the_400_for_an_encoded_slash_and_answers_nothing_more():
    picker, service = make()
    answers = await run(service, [request_headers("/v1%2Fchat%2Fcompletions"), request_body(chat_body())])
    assert len(answers) == 1
    assert error_of(answers[0])[:2] == (400, "invalid-request")
    assert picker.picks == [] and picker.is_idle()


async def test_a_stream_ends_after_the_400_for_trailers_without_a_body_and_answers_nothing_more():
    picker, service = make()
    answers = await run(service, [request_headers(), TRAILERS, request_body(chat_body())])
    assert len(answers) == 2  # CONTINUE for the headers, the 400 for the trailers; the body is not read
    assert error_of(answers[1])[:2] == (400, "invalid-request")
    assert picker.picks == [] and picker.is_idle()


async def test_an_unexpected_picker_failure_is_a_500_that_ends_the_stream():
    picker = Failing(picker_config())
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    answers = await run(service, [request_headers(), request_body(chat_body()), TRAILERS])
    assert len(answers) == 2
    assert error_of(answers[1]) == (500, "internal-error", "internal error in the picker")
    assert rejections(picker, 500, "internal-error") == 1
    assert service.open_streams == 0 and picker.is_idle()


# --- request headers: the body mode, the path, the method, the request id ------------------------------


async def test_a_streamed_body_mode_is_routed_on_the_request_headers_untracked():
    picker, service = make()
    answers = await run(service, [request_headers(mode=STREAMED), request_body(chat_body())])
    assert answers[0].HasField("request_headers") and is_routed(answers[0])
    assert (
        answers[0]
        .dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields[epp.DESTINATION_HEADER]
        .string_value
    )
    assert answers[1] == epp.CONTINUE_REQUEST_BODY  # decided already: the body passes
    assert len(picker.picks) == 1 and not picker.picks[0].tracked and picker.is_idle()


async def test_a_buffered_request_is_answered_continue_then_routed_on_its_body():
    picker, service = make()
    answers = await run(service, [request_headers(), request_body(chat_body())])
    assert answers[0] == epp.CONTINUE_REQUEST_HEADERS
    assert answers[1].HasField("request_body") and is_routed(answers[1])
    assert picker.picks[0].tracked and picker.is_idle()


async def test_request_headers_without_a_path_are_routed_on_the_headers():
    picker, service = make()
    answers = await run(service, [headers_without(":path", method="GET", end_of_stream=True)])
    assert len(answers) == 1 and is_routed(answers[0])
    assert picker.is_idle()


async def test_a_bodiless_request_without_a_method_to_a_routable_path_is_routed_on_the_headers():
    picker, service = make()
    answers = await run(service, [headers_without(":method", end_of_stream=True)])
    assert len(answers) == 1 and is_routed(answers[0])
    assert picker.is_idle()


async def test_a_bodiless_post_to_a_routable_path_with_a_query_is_a_400():
    picker, service = make()
    answers = await run(service, [request_headers("/v1/completions?stream=true", end_of_stream=True)])
    assert error_of(answers[0]) == (
        400, "invalid-request", "request body is empty; send the request as a JSON object"
    )  # fmt: skip
    assert picker.is_idle()


async def test_buffered_trailers_without_a_body_to_a_routable_path_with_a_query_say_the_body_is_empty():
    picker, service = make()
    answers = await run(service, [request_headers("/v1/chat/completions?x=1"), TRAILERS])
    assert error_of(answers[-1]) == (
        400, "invalid-request", "request body is empty; send the request as a JSON object"
    )  # fmt: skip
    assert picker.is_idle()


async def test_a_request_is_tracked_under_its_x_request_id():
    picker, service = make()
    stream = await routed_stream(service, extra={"x-request-id": "client-id-7"})
    assert [p.request_id for p in picker.picks] == ["client-id-7"]
    assert picker.selector.owner_of("client-id-7") is not None
    await stream.close()
    assert picker.is_idle()


async def test_a_request_without_x_request_id_is_routed_under_an_id_of_its_own():
    picker, service = make()
    answers = await run(service, [headers_without("x-request-id"), request_body(chat_body())])
    assert is_routed(answers[-1])
    assert re.fullmatch(r"[0-9a-f]{32}", picker.picks[0].request_id)
    assert picker.is_idle()


async def test_a_duplex_response_body_is_echoed_back_chunk_by_chunk():
    picker, service = make()
    headers = request_headers()
    headers.protocol_config.response_body_mode = DUPLEX
    answers = await run(service, [
        headers, request_body(chat_body()), response_headers(),
        response_body(b"data: one\n\n"), response_body(b"data: [DONE]\n\n", end_of_stream=True),
    ])  # fmt: skip
    echoed = [a.response_body.response.body_mutation.streamed_response for a in answers[3:]]
    assert [(e.body, e.end_of_stream) for e in echoed] == [
        (b"data: one\n\n", False),
        (b"data: [DONE]\n\n", True),
    ]
    assert picker.frees == ["complete"] and picker.is_idle()


@pytest.mark.parametrize("first_mode", [BUFFERED, DUPLEX], ids=["streamed", "duplex"])
async def test_envoys_own_answer_is_passed_on_in_the_body_mode_its_first_message_names(first_mode):
    """Envoy answers a request itself (an encoded slash: 400) before the picker sees it: the
    stream's first message is that answer's response headers, and it carries the body modes. A
    duplex body answered as a plain body mutation makes Envoy send a 503 instead
    (tests/e2e/test_client_input_e2e.py shows it with a real Envoy)."""
    picker, service = make()
    mode = DUPLEX if first_mode == DUPLEX else processing_mode_pb2.ProcessingMode.STREAMED
    first = response_headers(status="400", content_type="application/json")
    first.protocol_config.request_body_mode = first_mode
    first.protocol_config.response_body_mode = mode
    error = b'{"error":{"code":400}}'
    answers = await run(service, [first, response_body(error, end_of_stream=True)])
    assert answers[0] == epp.CONTINUE_RESPONSE_HEADERS
    body = answers[1].response_body.response
    if mode == DUPLEX:
        assert (
            body.body_mutation.streamed_response.body,
            body.body_mutation.streamed_response.end_of_stream,
        ) == (
            error,
            True,
        )
    else:
        assert answers[1] == epp.CONTINUE_RESPONSE_BODY
    assert picker.picks == [] and picker.is_idle()


async def test_trailers_ending_a_duplex_body_echo_it_without_ending_the_body():
    """The trailers follow the body: the echoed body must not say it ends the stream."""
    picker, service = make()
    body = chat_body()
    answers = await run(
        service, [request_headers(mode=DUPLEX), request_body(body, end_of_stream=False), TRAILERS]
    )
    assert answers[0].HasField("request_headers") and is_routed(answers[0])
    echoed = answers[1].request_body.response.body_mutation.streamed_response
    assert (echoed.body, echoed.end_of_stream) == (body, False)
    assert answers[2] == epp.CONTINUE_REQUEST_TRAILERS
    assert picker.is_idle()


# --- response headers: :status and content-type as Envoy may send them ----------------------------------


def header(key: str, raw: bytes | None = None, value: str | None = None) -> base_pb2.HeaderValue:
    return base_pb2.HeaderValue(key=key, raw_value=raw or b"", value=value or "")


async def test_response_headers_without_a_status_are_taken_as_a_200():
    picker, service = make()
    stream = await routed_stream(service)
    [served] = await answered(stream, response_with(header("content-type", b"text/event-stream")))
    assert served.dynamic_metadata.fields["envoy.lb"].struct_value.fields[epp.SERVED_KEY].string_value
    assert upstream_answers(picker, "200") == 1 and routed_load(picker) == 1  # still generating
    await answered(stream, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    assert picker.frees == ["complete"] and picker.is_idle()
    await stream.close()


@pytest.mark.parametrize(
    "status",
    [header(":Status", b"503"), header(":STATUS", b"503"), header(":status", value="503")],
    ids=["mixed-case-key", "upper-case-key", "in-value"],
)
async def test_a_status_in_another_key_case_or_in_value_is_read(status):
    picker, service = make()
    stream = await routed_stream(service)
    await answered(stream, response_with(status))
    assert upstream_answers(picker, "503") == 1
    assert picker.frees == ["upstream_status_503"] and picker.is_idle()
    await stream.close()


async def test_a_status_that_is_not_utf8_does_not_break_the_stream():
    picker, service = make()
    stream = await routed_stream(service)
    [served] = await answered(stream, response_with(header(":status", b"20\xff")))
    assert served.HasField("response_headers")
    assert upstream_answers(picker, "200") == 0 and routed_load(picker) == 1  # not a number: not counted
    await answered(stream, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    assert picker.frees == ["complete"] and picker.is_idle()
    await stream.close()


@pytest.mark.parametrize(
    "content_type",
    [
        header("Content-Type", b"application/json"),
        header("CONTENT-TYPE", b"application/json"),
        header("content-type", value="application/json"),
        header("content-type", b"application/json\xff"),
    ],
    ids=["mixed-case-key", "upper-case-key", "in-value", "not-utf8"],
)
async def test_a_whole_json_answer_is_not_taken_for_the_first_token_however_its_type_is_sent(content_type):
    picker, service = make()
    stream = await routed_stream(service)
    await answered(stream, response_with(header(":status", b"200"), content_type))
    await answered(stream, response_body(b'{"choices": []}', end_of_stream=True))
    assert picker.first_tokens == [False]
    assert picker.frees == ["complete"] and picker.is_idle()
    await stream.close()


async def test_tracked_output_tokens_are_counted_in_a_response_without_a_content_type():
    picker, service = make(picker_config(router_track_output_blocks=True))
    stream = await routed_stream(service)
    await answered(stream, response_with(header(":status", b"200")))
    await answered(stream, response_body(b"".join(chat_chunk("x") for _ in range(5))))
    assert picker.counted == [(5, 1)]
    await answered(stream, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    assert picker.frees == ["complete"] and picker.is_idle()
    await stream.close()


# --- the service's settings ------------------------------------------------------------------------------


async def test_the_served_answer_has_no_conformance_header_by_default():
    picker, service = make()
    answers = await run(service, [request_headers(), request_body(chat_body()), response_headers()])
    assert answers[-1].HasField("response_headers")
    assert epp.CONFORMANCE_SERVED_HEADER not in mutation_headers(answers[-1].response_headers.response)
    assert picker.is_idle()


async def test_a_limit_of_one_stream_is_accepted_and_enforced():
    picker, service = make(max_concurrent_streams=1)
    held = await routed_stream(service)
    answers = await run(service, [request_headers(), request_body(chat_body())])
    assert len(answers) == 1 and answers[0].immediate_response.status.code == 429
    await held.close()
    answers = await run(service, [request_headers(), request_body(chat_body())])
    assert is_routed(answers[-1])
    assert picker.is_idle()


@pytest.mark.parametrize(("in_config", "in_service"), [(False, True), (True, False)])
async def test_the_services_track_output_blocks_wins_over_the_pickers(in_config, in_service):
    picker, service = make(
        picker_config(router_track_output_blocks=in_config), track_output_blocks=in_service
    )
    stream = await routed_stream(service)
    await answered(stream, response_headers(content_type="text/event-stream"))
    await answered(stream, response_body(b"".join(chat_chunk("x") for _ in range(3))))
    assert picker.counted == ([(3, 1)] if in_service else [])
    await stream.close()
    assert picker.is_idle()


async def test_an_sse_line_over_the_bound_is_skipped_counted_once_and_the_stream_goes_on():
    picker, service = make(picker_config(router_track_output_blocks=True))
    stream = await routed_stream(service)
    await answered(stream, response_headers(content_type="text/event-stream"))
    too_long = b"data: " + b"x" * MAX_LINE_BYTES + b"\n\n"
    await answered(stream, response_body(too_long + chat_chunk("y")))
    assert service.output_lines_skipped == 1
    assert picker.counted == [(1, 1)]  # the tokens after it are still counted
    await answered(stream, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    assert picker.frees == ["complete"] and picker.is_idle()
    await stream.close()


async def test_a_picker_that_takes_no_output_tokens_has_no_response_body_read():
    picker = closed_after_test(EndpointPicker(picker_config(router_track_output_blocks=True)))
    service = ExtProcService(PlainPicker(picker), max_body_bytes=1 << 20)
    assert service.output is None
    stream = await routed_stream(service)
    await answered(stream, response_headers(content_type="text/event-stream"))
    await answered(stream, response_body(b"data: " + b"x" * MAX_LINE_BYTES + b"\n\n"))
    assert service.output_lines_skipped == 0  # nothing counted, nothing skipped
    await answered(stream, response_body(b"data: [DONE]\n\n", end_of_stream=True))
    await stream.close()
    assert picker.is_idle()


# --- a queued request asks Envoy to wait -----------------------------------------------------------------

MAX_WAIT_S = 30.0  # never reached: each test frees a worker once the notice is seen


def queued(mode: int, ending: str) -> list[pb.ProcessingRequest]:
    body = chat_body("waits " * 30)
    if ending == "end_of_stream":
        return [request_headers(mode=mode), request_body(body)]
    if ending == "trailers_follow":  # BUFFERED: the one body message, then the trailers
        return [request_headers(mode=mode), request_body(body, end_of_stream=False)]
    return [request_headers(mode=mode), request_body(body, end_of_stream=False), TRAILERS]


@pytest.mark.parametrize(
    ("mode", "ending"),
    [
        (BUFFERED, "end_of_stream"),
        (BUFFERED, "trailers_follow"),
        (DUPLEX, "end_of_stream"),
        (DUPLEX, "trailers"),
    ],
)
async def test_a_queued_request_asks_envoy_to_wait_its_queue_bound_and_a_second_more(mode, ending):
    config = replace(picker_config(router_queue_threshold=0.0), queue_max_wait_s=MAX_WAIT_S)
    picker, service = make(config)
    held = [await routed_stream(service) for _ in range(2)]  # one prompt in prefill saturates each worker
    waiting = OpenStream(service)
    waiting.send(*queued(mode, ending))
    await until(lambda: any(a.HasField("override_message_timeout") for a in waiting.answers))
    notice = next(a for a in waiting.answers if a.HasField("override_message_timeout"))
    assert notice.override_message_timeout.ToMilliseconds() == (MAX_WAIT_S + 1.0) * 1000
    assert len(picker.picks) == 2  # asked while it still waits, not once it is decided
    await held[0].close()  # a worker frees: the queued request is routed
    await until(lambda: len(picker.picks) == 3)
    await until(lambda: any(is_routed(a) for a in waiting.answers))
    for stream in (held[1], waiting):
        await stream.close()
    assert picker.is_idle()
