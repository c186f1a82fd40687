"""The model a request is sent as, and its answer: the servicer driven in-process.

A rewrite (an InferenceModelRewrite rule, else the `x-gateway-model-name-rewrite` header) sends the
request as another model; the answer's body names the model the client asked for again, in either
response body mode (Envoy drops the content-length of an answer whose body a processor may change,
and sends it chunked). Through a real Envoy, with vLLM's and SGLang's own answer bytes:
tests/e2e/test_asked_model_e2e.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import ModelConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.epp.service import ExtProcService
from extproc.picker.inference_extension import MODEL_REWRITE_HEADER
from extproc.picker.pipeline import EndpointPicker

from ..config.test_inference_extension import rewrite
from ..picker_fixtures import (
    BUFFERED,
    DUPLEX,
    MODEL,
    chat_body,
    closed_after_test,
    picker_config,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
)

STREAMED = processing_mode_pb2.ProcessingMode.STREAMED
ADAPTERS = ("lora-a", "lora-b")
ALIAS_TO_A = "  - matches:\n    - model: {value: alias}\n    targets:\n    - modelRewrite: lora-a\n"


def make_service(tmp_path, rules: str | None = None) -> tuple[EndpointPicker, ExtProcService]:
    config = replace(picker_config(), models=(ModelConfig(MODEL, lora_adapters=ADAPTERS),))
    if rules is not None:
        path = tmp_path / "resources.yaml"
        path.write_text(rewrite("to-adapter", rules))
        resources = InferenceExtensionConfig(str(path), Pool(), read_resources(str(path), Pool()))
        config = replace(config, inference_extension=resources)
    picker = closed_after_test(EndpointPicker(config))
    return picker, ExtProcService(picker, max_body_bytes=1 << 20)


def answer_chunks(model: str) -> list[bytes]:
    """An engine's event stream naming `model`, cut inside its `"model":"..."` members."""
    event = (
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"%s","choices":[]}\n\n' % model.encode()
    )
    stream = event * 3 + b"data: [DONE]\n\n"
    cuts = [len(event) - 30, len(event) + 40, 2 * len(event) + 43, len(stream)]
    return [stream[a:b] for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]


def headers_with(mode: int, extra: dict[str, str] | None = None) -> pb.ProcessingRequest:
    """Request headers of a stream whose answer's body comes in `mode` (STREAMED as our buffered
    template sends it, after a BUFFERED request body; duplex both ways, as the duplex one)."""
    message = request_headers(mode=DUPLEX if mode == DUPLEX else BUFFERED, extra=extra)
    message.protocol_config.response_body_mode = mode
    return message


def body_sent(answers: list[pb.ProcessingResponse]) -> bytes:
    """What the servicer had Envoy send upstream (the body's mutation, in either request body mode)."""
    for answer in answers:
        if answer.HasField("request_body") and answer.request_body.response.body_mutation.body:
            return answer.request_body.response.body_mutation.body
    return b"".join(
        a.request_body.response.body_mutation.streamed_response.body
        for a in answers
        if a.HasField("request_body")
    )


def answer_seen(answers: list[pb.ProcessingResponse], mode: int) -> bytes:
    """The answer's body as Envoy passes it on to the client."""
    chunks = [a.response_body.response.body_mutation for a in answers if a.HasField("response_body")]
    if mode == DUPLEX:
        return b"".join(m.streamed_response.body for m in chunks)
    return b"".join(m.body for m in chunks)


async def exchange(service, mode: int, body: bytes, extra: dict[str, str] | None = None, sent_as="lora-a"):
    """One request through the servicer and an answer naming `sent_as` (the model the engine serves)."""
    chunks = answer_chunks(sent_as)
    return await run(service, [
        headers_with(mode, extra), request_body(body), response_headers(content_type="text/event-stream"),
        *[response_body(c, end_of_stream=i == len(chunks) - 1) for i, c in enumerate(chunks)],
    ])  # fmt: skip


@pytest.mark.parametrize("mode", [STREAMED, DUPLEX], ids=["streamed", "duplex"])
async def test_a_rewritten_requests_answer_names_the_asked_model_in_every_chunk(mode, tmp_path) -> None:
    picker, service = make_service(tmp_path, ALIAS_TO_A)
    answers = await exchange(service, mode, chat_body("a question", model="alias"))
    assert json.loads(body_sent(answers))["model"] == "lora-a"
    assert answer_seen(answers, mode) == b"".join(answer_chunks("alias"))
    assert picker.is_idle()


@pytest.mark.parametrize("mode", [STREAMED, DUPLEX], ids=["streamed", "duplex"])
async def test_the_rewrite_header_sends_the_request_as_that_model_and_stops_at_the_picker(
    mode, tmp_path
) -> None:
    picker, service = make_service(tmp_path)  # no resources file: the header alone
    forged = {MODEL_REWRITE_HEADER: "lora-b", "x-prefill-endpoint": "10.9.9.9:80"}  # and an owned one
    answers = await exchange(service, mode, chat_body("hi"), forged, sent_as="lora-b")
    assert json.loads(body_sent(answers))["model"] == "lora-b"
    assert picker.metrics.lora_requests.values[(MODEL, "lora-b")] == 1
    routed = next(
        a for a in answers if a.HasField("request_body") or a.request_headers.response.clear_route_cache
    )
    common = (
        routed.request_body.response if routed.HasField("request_body") else routed.request_headers.response
    )
    assert {MODEL_REWRITE_HEADER, "x-prefill-endpoint"} <= set(common.header_mutation.remove_headers)
    assert answer_seen(answers, mode) == b"".join(answer_chunks(MODEL))


async def test_a_rule_wins_over_the_header(tmp_path) -> None:
    _, service = make_service(tmp_path, ALIAS_TO_A)
    answers = await exchange(
        service, STREAMED, chat_body("hi", model="alias"), {MODEL_REWRITE_HEADER: "lora-b"}
    )
    assert json.loads(body_sent(answers))["model"] == "lora-a"


@pytest.mark.parametrize(("header", "status"), [("no-such-adapter", 404), ("", None)])
async def test_a_header_naming_no_served_model_is_a_404_and_an_empty_one_changes_nothing(
    header, status, tmp_path
) -> None:
    picker, service = make_service(tmp_path)
    body = chat_body("hi")
    answers = await run(service, [request_headers(extra={MODEL_REWRITE_HEADER: header}), request_body(body)])
    if status is None:
        assert not answers[-1].request_body.response.body_mutation.body  # the body passes as sent
        assert not answers[-1].HasField("immediate_response")
    else:
        assert answers[-1].immediate_response.status.code == status
        assert b"no-such-adapter" in answers[-1].immediate_response.body
    assert picker.is_idle()


async def test_an_answer_as_asked_passes_untouched(tmp_path) -> None:
    """No rewrite, or one whose target is the asked model: the answers stay the shared constants."""
    _, service = make_service(tmp_path, ALIAS_TO_A.replace("alias", "lora-b").replace("lora-a", "lora-b"))
    for body in (chat_body("hi", model="lora-b"), chat_body("hi")):
        answers = await exchange(service, STREAMED, body, sent_as=json.loads(body)["model"])
        bodies = [a for a in answers if a.HasField("response_body")]
        assert all(not a.response_body.response.HasField("body_mutation") for a in bodies)


async def test_bytes_held_back_when_a_duplex_answer_ends_with_trailers_go_out_before_them(tmp_path) -> None:
    _, service = make_service(tmp_path, ALIAS_TO_A)
    answers = await run(service, [
        headers_with(DUPLEX), request_body(chat_body("hi", model="alias")), response_headers(),
        response_body(b'{"id":1,"mod'), pb.ProcessingRequest(response_trailers=pb.HttpTrailers()),
    ])  # fmt: skip
    assert answer_seen(answers, DUPLEX) == b'{"id":1,"mod'
    flushed = answers[-2].response_body.response.body_mutation.streamed_response
    assert not flushed.end_of_stream  # the trailers end the stream
    assert answers[-1].HasField("response_trailers")


@pytest.mark.parametrize("mode", [STREAMED, DUPLEX], ids=["streamed", "duplex"])
async def test_an_answer_ending_in_what_could_begin_the_name_is_sent_whole(mode, tmp_path) -> None:
    """A tail held back for the next chunk goes out with the body's last chunk."""
    _, service = make_service(tmp_path, ALIAS_TO_A)
    answers = await run(service, [
        headers_with(mode), request_body(chat_body("hi", model="alias")), response_headers(),
        response_body(b'{"id":1,"model":"lora-a"}\n{"id":2,"mod'),
        response_body(b'el":"lo', end_of_stream=True),
    ])  # fmt: skip
    assert answer_seen(answers, mode) == b'{"id":1,"model":"alias"}\n{"id":2,"model":"lo'


async def test_a_rewritten_body_is_routed_removing_the_services_own_owned_headers(tmp_path) -> None:
    """The routing answer that carries a rewritten body removes the headers this service owns (here
    one of its own, as with another --prefill-endpoint-header), like every routing answer."""
    picker, _ = make_service(tmp_path, ALIAS_TO_A)
    service = ExtProcService(picker, max_body_bytes=1 << 20, owned_headers=["x-prefiller-host-port"])
    answers = await run(service, [
        headers_with(STREAMED, {"x-prefiller-host-port": "10.9.9.9:80"}),
        request_body(chat_body("hi", model="alias")),
    ])  # fmt: skip
    routed = answers[-1].request_body.response
    assert json.loads(routed.body_mutation.body)["model"] == "lora-a"
    assert "x-prefiller-host-port" in routed.header_mutation.remove_headers
