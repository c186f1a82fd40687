"""Audio uploads (multipart forms) through the servicer: routed to the model their form names.

vLLM and SGLang take `/v1/audio/transcriptions` as a multipart form whose `model` field names the
model; before, the picker read only JSON bodies, so on a picker serving several models an upload went
to the models in turn (the wrong model's worker answered 404), and an upload over --max-body-bytes
(16 MiB; vLLM takes 25 MB of audio) was refused. In duplex mode an upload is now routed as soon as
its `model` field is read and its file streams on; in buffered mode Envoy sends the form whole.
The forms are the `openai` client's own bytes (`tests/request/test_form.py`: `openai_upload`).
"""

from __future__ import annotations

import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig

from ..picker_fixtures import (
    BUFFERED,
    DUPLEX,
    closed_after_test,
    mutation_headers,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
)
from ..request.test_form import openai_upload

PATH = "/v1/audio/transcriptions"
LIMIT = 1 << 20
WORKERS = {"chat": {"127.0.0.1:8000", "127.0.0.2:8000"}, "whisper": {"127.0.1.1:8000", "127.0.1.2:8000"}}


def make_service() -> tuple[EndpointPicker, ExtProcService]:
    workers = tuple(
        WorkerConfig(f"{model}{i}", endpoint, model)
        for model, endpoints in WORKERS.items()
        for i, endpoint in enumerate(sorted(endpoints))
    )
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=workers,
        models=tuple(ModelConfig(model) for model in WORKERS),
        seed=1,
        worker_session_control="off",
    )
    picker = closed_after_test(EndpointPicker(config))
    return picker, ExtProcService(picker, max_body_bytes=LIMIT)


def upload_messages(content_type: str, body: bytes, *, mode: int, chunk: int = 65536, last: bool = True):
    headers = {"content-type": content_type, "content-length": str(len(body))}
    chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    return [request_headers(PATH, mode=mode, extra=headers)] + [
        request_body(c, end_of_stream=last and i == len(chunks) - 1) for i, c in enumerate(chunks)
    ]


def echoed(answers) -> list[tuple[bytes, bool]]:
    return [
        (a.request_body.response.body_mutation.streamed_response.body,
         a.request_body.response.body_mutation.streamed_response.end_of_stream)
        for a in answers
        if a.HasField("request_body")
    ]  # fmt: skip


@pytest.mark.parametrize("model", ["whisper", "chat"])
async def test_a_duplex_upload_is_routed_on_its_first_chunk_to_its_models_workers(model) -> None:
    picker, service = make_service()
    content_type, body = openai_upload({"model": model}, audio=b"\x01" * 200_000)
    messages = upload_messages(content_type, body, mode=DUPLEX)
    answers = await run(service, messages[:2])  # the headers and one chunk: the body has not ended
    assert answers[0].HasField("request_headers")
    assert mutation_headers(answers[0].request_headers.response)[epp.DESTINATION_HEADER] in WORKERS[model]
    passed = echoed(answers[1:])  # what came so far, in chunks of at most epp.MAX_STREAMED_CHUNK
    assert b"".join(chunk for chunk, _ in passed) == body[:65536] and not any(end for _, end in passed)
    assert picker.is_idle()


async def test_every_chunk_of_an_upload_routed_early_passes_through_in_order() -> None:
    picker, service = make_service()
    content_type, body = openai_upload({"model": "whisper"}, audio=bytes(range(256)) * 1000)
    answers = await run(service, upload_messages(content_type, body, mode=DUPLEX, chunk=10_000))
    assert [a.WhichOneof("response") for a in answers[:1]] == ["request_headers"]
    passed = echoed(answers[1:])
    assert b"".join(chunk for chunk, _ in passed) == body
    assert [end for _, end in passed] == [False] * (len(passed) - 1) + [True]
    assert len(answers) == 1 + len(passed)
    assert picker.is_idle()


async def test_an_upload_larger_than_the_body_limit_is_routed_when_its_model_comes_first() -> None:
    _, service = make_service()
    content_type, body = openai_upload({"model": "whisper"}, audio=b"\0" * (3 * LIMIT))
    answers = await run(service, upload_messages(content_type, body, mode=DUPLEX))
    assert not any(a.HasField("immediate_response") for a in answers)
    assert b"".join(chunk for chunk, _ in echoed(answers)) == body
    counts, total = service.objectives.request_bytes.child(("whisper", "whisper"))
    assert sum(counts) == 1 and total == [len(body)]  # its declared size, though routed on its first chunk


def file_first(model: bytes, audio: bytes) -> tuple[str, bytes]:
    boundary = b"curlBoundary"
    body = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n" + audio + b"\r\n--" + boundary + b"\r\n"
        b'Content-Disposition: form-data; name="model"\r\n\r\n' + model + b"\r\n--" + boundary + b"--\r\n"
    )
    return f"multipart/form-data; boundary={boundary.decode()}", body


async def test_a_file_first_upload_is_routed_on_the_model_after_it() -> None:
    _, service = make_service()
    content_type, body = file_first(b"whisper", b"\x02" * 300_000)
    answers = await run(service, upload_messages(content_type, body, mode=DUPLEX))
    assert mutation_headers(answers[0].request_headers.response)[epp.DESTINATION_HEADER] in WORKERS["whisper"]
    assert b"".join(chunk for chunk, _ in echoed(answers)) == body


async def test_a_file_first_upload_over_the_limit_is_a_413_that_says_what_to_do() -> None:
    picker, service = make_service()
    content_type, body = file_first(b"whisper", b"\x02" * (2 * LIMIT))
    answers = await run(service, upload_messages(content_type, body, mode=DUPLEX))
    immediate = answers[-1].immediate_response
    assert immediate.status.code == 413 and immediate.details == "body-too-large"
    message = json.loads(immediate.body)["error"]["message"]
    assert "`model` field" in message and "--max-body-bytes" in message
    assert picker.is_idle()


async def test_a_buffered_upload_is_routed_to_its_models_workers() -> None:
    _, service = make_service()
    for model in ("whisper", "chat", "whisper"):
        content_type, body = openai_upload({"model": model}, audio=b"\x03" * 5000)
        answers = await run(service, upload_messages(content_type, body, mode=BUFFERED, chunk=len(body)))
        routed = mutation_headers(answers[-1].request_body.response)
        assert routed[epp.DESTINATION_HEADER] in WORKERS[model]


async def test_an_unknown_model_in_a_form_is_a_404_before_the_upload_ends() -> None:
    picker, service = make_service()
    content_type, body = openai_upload({"model": "nope"}, audio=b"\x04" * 200_000)
    answers = await run(service, upload_messages(content_type, body, mode=DUPLEX))
    assert len(answers) == 1  # answered on the first chunk; the stream ends
    assert answers[0].immediate_response.status.code == 404
    assert picker.is_idle()


async def test_a_form_to_a_chat_path_is_decided_whole_and_refused() -> None:
    _, service = make_service()
    content_type, body = openai_upload({"model": "chat"}, audio=b"\x05" * 100_000)
    messages = upload_messages(content_type, body, mode=DUPLEX)
    messages[0] = request_headers("/v1/chat/completions", mode=DUPLEX, extra={"content-type": content_type})
    answers = await run(service, messages)
    assert len(answers) == 1 and answers[0].immediate_response.status.code == 400


async def test_a_form_without_a_model_is_routed_when_it_ends_to_the_models_in_turn() -> None:
    _, service = make_service()
    content_type, body = openai_upload({"model": "whisper"}, audio=b"\x06" * 1000)
    body = body.replace(b'name="model"', b'name="other"')
    models = []
    for _ in range(4):
        answers = await run(service, upload_messages(content_type, body, mode=DUPLEX))
        endpoint = mutation_headers(answers[0].request_headers.response)[epp.DESTINATION_HEADER]
        models.append(next(m for m, endpoints in WORKERS.items() if endpoint in endpoints))
    assert sorted(models) == ["chat", "chat", "whisper", "whisper"]


async def test_an_upload_answered_before_it_ends_passes_its_last_chunks_and_trailers_through() -> None:
    """A worker may answer an upload before the client has sent all of it (vLLM's 413 for audio over
    its limit): the stream follows the answer and still passes the rest of the body on, then its
    trailers (HTTP/2)."""
    picker, service = make_service()
    content_type, body = openai_upload({"model": "whisper"}, audio=b"\x09" * 200_000)
    messages = upload_messages(content_type, body, mode=DUPLEX, last=False)
    messages[2:2] = [response_headers("413"), response_body(b'{"error": {}}', end_of_stream=True)]
    messages.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    answers = await run(service, messages)
    kinds = [a.WhichOneof("response") for a in answers]
    assert kinds[0] == "request_headers" and kinds[-1] == "request_trailers"
    assert "response_headers" in kinds and "response_body" in kinds
    assert b"".join(chunk for chunk, _ in echoed(answers)) == body
    assert picker.is_idle()


@pytest.mark.parametrize("length", [None, "12x", "\u00b2"])
async def test_an_upload_without_a_readable_length_counts_the_bytes_it_was_routed_on(length) -> None:
    _, service = make_service()
    content_type, body = openai_upload({"model": "whisper"}, audio=b"\x0a" * 100_000)
    messages = upload_messages(content_type, body, mode=DUPLEX)
    extra = {"content-type": content_type} | ({"content-length": length} if length is not None else {})
    messages[0] = request_headers(PATH, mode=DUPLEX, extra=extra)
    await run(service, messages)
    counts, total = service.objectives.request_bytes.child(("whisper", "whisper"))
    assert sum(counts) == 1 and total == [65536]  # the first chunk's, which named the model


async def test_a_form_to_a_chat_path_is_held_as_any_chat_body_even_with_a_query() -> None:
    """Only an upload is routed on its form's field: a chat body over the limit is a 413, never an
    early 400 from a form read on its first chunk."""
    _, service = make_service()
    content_type, body = openai_upload({"model": "chat"}, audio=b"\x0b" * (2 * LIMIT))
    for path in ("/v1/chat/completions", "/v1/chat/completions?api-version=1"):
        messages = upload_messages(content_type, body, mode=DUPLEX)
        messages[0] = request_headers(path, mode=DUPLEX, extra={"content-type": content_type})
        answers = await run(service, messages)
        assert [a.immediate_response.status.code for a in answers] == [413]
