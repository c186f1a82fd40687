"""The Inference Extension's per-request series (`inference_objective_*`), the servicer driven
in-process with a real picker and the answer bytes vLLM 0.33.0's own serving code writes (a 5-token
prompt, 3 tokens generated: `tests/request/engines/`). Through a real Envoy:
tests/e2e/test_objective_metrics_e2e.py."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from openai.types import CreateEmbeddingResponse, Embedding
from prometheus_client import CollectorRegistry

from extproc.config import ModelConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.epp.objective_metrics import HELP, HISTOGRAMS, ObjectiveMetrics, error_code
from extproc.epp.service import ExtProcService
from extproc.epp.service_metrics import ServiceCollector
from extproc.picker.inference_extension import MODEL_REWRITE_HEADER, OBJECTIVE_HEADER
from extproc.picker.pipeline import EndpointPicker

from ..config.test_inference_extension import objective, rewrite
from ..picker_fixtures import (
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
from .test_output_tokens import chat_chunk
from .test_service import OpenStream, until

ANSWERS = json.loads(
    (Path(__file__).resolve().parents[1] / "request/engines/vllm-0.33.0/answers.json").read_text()
)["by_model"]["foodreview-v2"]
SSE = ANSWERS["chat_sse"].encode()  # asked with stream_options.include_usage: its last chunk's usage
JSON = ANSWERS["chat_json"].encode()
RULES = "  - matches:\n    - model: {value: alias}\n    targets:\n    - modelRewrite: lora-a\n"
ANY_MODEL_RULE = "  - targets:\n    - modelRewrite: lora-b\n"


class Scrape:
    """/metrics of a servicer, as read when scraped."""

    def __init__(self, service: ExtProcService) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ServiceCollector(service))

    def __call__(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(f"inference_objective_{name}", labels)


def make(
    tmp_path: Path | None = None, resources: str | None = None, **router
) -> tuple[EndpointPicker, ExtProcService, Scrape]:
    models = (ModelConfig(MODEL, lora_adapters=("lora-a", "lora-b")),)
    config = replace(picker_config(**router), models=models)
    if resources is not None and tmp_path is not None:
        path = tmp_path / "resources.yaml"
        path.write_text(resources)
        ie = InferenceExtensionConfig(str(path), Pool(), read_resources(str(path), Pool()))
        config = replace(config, inference_extension=ie)
    picker = closed_after_test(EndpointPicker(config))
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    return picker, service, Scrape(service)


def answer(body: bytes, chunk: int = 40, content_type: str = "text/event-stream") -> list:
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    return [
        response_headers(content_type=content_type),
        *(response_body(p, end_of_stream=i == len(pieces) - 1) for i, p in enumerate(pieces)),
    ]


MODELS = {"model_name": MODEL, "target_model_name": MODEL}


@pytest.mark.parametrize(("body", "content_type"), [(SSE, "text/event-stream"), (JSON, "application/json")])
async def test_an_answered_request_is_counted_sized_timed_and_its_tokens_are_the_engines(
    body, content_type
) -> None:
    picker, service, scrape = make()
    request = chat_body("a question", stream=content_type == "text/event-stream")
    await run(service, [request_headers(), request_body(request), *answer(body, content_type=content_type)])
    assert scrape("request_total", **MODELS, priority="0") == 1
    assert scrape("request_sizes_sum", **MODELS) == len(request)
    assert scrape("running_requests", model_name=MODEL) == 0
    assert scrape("request_duration_seconds_count", **MODELS) == 1
    assert scrape("response_sizes_sum", **MODELS) == len(body)
    assert scrape("input_tokens_sum", **MODELS) == 5  # the engine's count, not ours of "a question"
    assert scrape("output_tokens_sum", **MODELS) == 3
    assert scrape("output_tokens_bucket", **MODELS, le="1.0") == 0
    assert scrape("output_tokens_bucket", **MODELS, le="8.0") == 1
    duration = scrape("request_duration_seconds_sum", **MODELS)
    assert duration is not None
    assert scrape("normalized_time_per_output_token_seconds_sum", **MODELS) == pytest.approx(duration / 3)
    assert scrape("prompt_cached_tokens_count", **MODELS) is None  # vLLM's default: no details
    assert scrape("request_error_total", **MODELS, error_code="ModelServerError") is None
    assert picker.is_idle()


async def test_running_requests_counts_a_routed_request_until_its_stream_ends() -> None:
    _, service, scrape = make()
    stream = OpenStream(service)
    stream.send(request_headers(), request_body(chat_body("a question", stream=True)))
    await until(lambda: len(stream.answers) == 2)
    assert scrape("running_requests", model_name=MODEL) == 1
    assert scrape("request_total", **MODELS, priority="0") == 1
    stream.send(response_headers(content_type="text/event-stream"), response_body(SSE[:50]))
    await until(lambda: len(stream.answers) == 4)
    assert scrape("running_requests", model_name=MODEL) == 1
    await stream.close()  # the client went away mid-answer
    await until(lambda: scrape("running_requests", model_name=MODEL) == 0)
    assert scrape("request_duration_seconds_count", **MODELS) is None  # no answer ended
    assert scrape("request_error_total", **MODELS, error_code="ModelServerError") is None


async def test_without_the_engines_usage_the_prompt_is_counted_as_tokenized_here() -> None:
    no_usage = SSE[: SSE.rindex(b'data: {"id"')] + b"data: [DONE]\n\n"  # asked without include_usage
    _, service, scrape = make()
    await run(service, [request_headers(), request_body(chat_body("a b c d " * 8)), *answer(no_usage)])
    tokens = scrape("input_tokens_sum", **MODELS)
    assert tokens is not None and tokens > 32  # the chat template's tokens and the 32 words
    assert scrape("output_tokens_count", **MODELS) is None  # nothing counted them
    assert scrape("normalized_time_per_output_token_seconds_count", **MODELS) is None
    assert scrape("response_sizes_sum", **MODELS) == len(no_usage)


async def test_with_output_tracking_the_tokens_counted_stand_in_for_the_engines() -> None:
    no_usage = SSE[: SSE.rindex(b'data: {"id"')] + b"data: [DONE]\n\n"
    _, service, scrape = make(router_track_output_blocks=True)
    await run(service, [request_headers(), request_body(chat_body("hi", stream=True)), *answer(no_usage)])
    assert scrape("output_tokens_sum", **MODELS) == 3  # three content deltas


async def test_a_workers_error_answer_is_a_model_server_error_once_and_not_timed() -> None:
    picker, service, scrape = make()
    await run(service, [
        request_headers(), request_body(chat_body("hi")), response_headers("500"),
        response_body(b'{"error": {"message": "engine died"}}', end_of_stream=True),
    ])  # fmt: skip
    assert scrape("request_error_total", **MODELS, error_code="ModelServerError") == 1
    assert scrape("request_total", **MODELS, priority="0") == 1
    assert scrape("running_requests", model_name=MODEL) == 0
    assert scrape("request_duration_seconds_count", **MODELS) is None
    assert picker.is_idle()


@pytest.mark.parametrize(
    ("body", "labels", "code"),
    [
        (b"{not json", ("", ""), "BadRequest"),  # refused before its model was read
        (chat_body("hi", model="no-such-model-" + "x" * 50), ("unlisted", "unlisted"), "NotFound"),
        (chat_body("x" * (2 << 20)), ("", ""), "BadRequest"),  # over the body limit: 413
    ],
    ids=["not-json", "unknown-model", "too-large"],
)
async def test_a_refused_request_is_an_error_under_a_label_that_is_never_the_clients_text(
    body, labels, code
) -> None:
    _, service, scrape = make()
    answers = await run(service, [request_headers(), request_body(body)])
    assert answers[-1].HasField("immediate_response")
    names = {"model_name": labels[0], "target_model_name": labels[1]}
    assert scrape("request_error_total", **names, error_code=code) == 1
    errors = [s for m in scrape.registry.collect() for s in m.samples if s.name.endswith("error_total")]
    assert len(errors) == 1  # one series, whatever the client sent
    assert scrape("request_total", **names, priority="0") is None


async def test_a_rewritten_request_is_labelled_as_asked_and_as_sent_with_its_objectives_priority(
    tmp_path,
) -> None:
    resources = rewrite("to-adapter", RULES) + "---\n" + objective("critical", 5)
    _, service, scrape = make(tmp_path, resources)
    headers = request_headers(extra={OBJECTIVE_HEADER: "critical"})
    await run(service, [headers, request_body(chat_body("hi", model="alias")), *answer(SSE)])
    names = {"model_name": "alias", "target_model_name": "lora-a"}
    assert scrape("request_total", **names, priority="5") == 1
    assert scrape("running_requests", model_name="alias") == 0
    assert scrape("output_tokens_sum", **names) == 3
    unknown = request_headers(extra={OBJECTIVE_HEADER: "not-listed"})  # no priority of its own
    await run(service, [unknown, request_body(chat_body("hi")), *answer(SSE)])
    assert scrape("request_total", **MODELS, priority="0") == 1


async def test_a_name_only_a_client_chose_is_unlisted(tmp_path) -> None:
    """A rule without matches sends any model: the name asked for is the client's free text."""
    _, service, scrape = make(tmp_path, rewrite("everything", ANY_MODEL_RULE))
    await run(service, [request_headers(), request_body(chat_body("hi", model="made-up-1")), *answer(SSE)])
    header = request_headers(extra={MODEL_REWRITE_HEADER: "lora-b"})
    await run(service, [header, request_body(chat_body("hi", model="made-up-2")), *answer(SSE)])
    assert scrape("request_total", model_name="unlisted", target_model_name="lora-b", priority="0") == 2
    labels = {s.labels.get("model_name") for m in scrape.registry.collect() for s in m.samples}
    assert not {"made-up-1", "made-up-2"} & labels


async def test_a_request_that_names_no_model_is_not_counted_whatever_its_answer() -> None:
    _, service, scrape = make()
    models_list = request_headers("/v1/models", method="GET", end_of_stream=True)
    await run(service, [models_list, *answer(b"{}")])
    await run(service, [models_list, response_headers("500"), response_body(b"oops", end_of_stream=True)])
    assert [s for m in scrape.registry.collect() for s in m.samples if s.name.startswith("inference_")] == []


async def test_an_error_answer_is_counted_once_even_if_its_headers_came_twice() -> None:
    _, service, scrape = make()
    again = response_headers("500")
    await run(service, [request_headers(), request_body(chat_body("hi")), again, again])
    assert scrape("request_error_total", **MODELS, error_code="ModelServerError") == 1


async def test_the_duration_is_the_requests_time_in_seconds() -> None:
    _, service, scrape = make()
    started = time.perf_counter()
    await run(service, [request_headers(), request_body(chat_body("hi")), *answer(SSE)])
    elapsed = time.perf_counter() - started
    duration = scrape("request_duration_seconds_sum", **MODELS)
    assert duration is not None and 0 < duration <= elapsed


@pytest.mark.parametrize(("usage", "expected"), [(5, 5), (None, 6)], ids=["engine-says", "counted"])
async def test_n_sequences_output_is_the_engines_total_else_the_count_of_every_sequence(
    usage, expected
) -> None:
    """Two choices of three tokens each (`n: 2`), with output tracking on: the engine's usage when it
    says one (5 here, whatever the deltas), else the tokens counted per sequence times two."""
    chunks = [chat_chunk(word, index=i) for word in ("a", "b", "c") for i in (0, 1)]
    if usage is not None:
        chunks.append(b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\n' % usage)
    body = b"".join(chunks) + b"data: [DONE]\n\n"
    _, service, scrape = make(router_track_output_blocks=True)
    await run(service, [request_headers(), request_body(chat_body("hi", n=2, stream=True)), *answer(body)])
    assert scrape("output_tokens_sum", **MODELS) == expected


async def test_the_engines_cached_tokens_are_observed_when_it_says_them() -> None:
    """vLLM with --enable-prompt-tokens-details fills the details its answer otherwise leaves null."""
    detailed = JSON.replace(b'"prompt_tokens_details":null', b'"prompt_tokens_details":{"cached_tokens":4}')
    assert detailed != JSON
    _, service, scrape = make()
    whole = answer(detailed, 16, "application/json")
    await run(service, [request_headers(), request_body(chat_body("hi")), *whole])
    assert scrape("prompt_cached_tokens_sum", **MODELS) == 4
    assert scrape("prompt_cached_tokens_bucket", **MODELS, le="1.0") == 0
    assert scrape("prompt_cached_tokens_bucket", **MODELS, le="8.0") == 1


async def test_requests_in_flight_together_and_failures_each_count() -> None:
    _, service, scrape = make()
    streams = [OpenStream(service) for _ in range(2)]
    for stream in streams:
        stream.send(request_headers(), request_body(chat_body("a question")))
    await until(lambda: all(len(s.answers) == 2 for s in streams))
    assert scrape("running_requests", model_name=MODEL) == 2
    for stream in streams:
        stream.send(response_headers("503"), response_body(b"busy", end_of_stream=True))
    await until(lambda: scrape("running_requests", model_name=MODEL) == 0)
    assert scrape("request_error_total", **MODELS, error_code="ModelServerError") == 2
    for stream in streams:
        await stream.close()
    for _ in range(3):
        await run(service, [request_headers(), request_body(b"[]")])
    assert scrape("request_error_total", model_name="", target_model_name="", error_code="BadRequest") == 3


def test_a_status_the_inference_extension_has_no_code_for_is_unknown() -> None:
    assert [error_code(s) for s in (400, 404, 413, 429, 503, 504)] == [
        "BadRequest", "NotFound", "BadRequest", "ResourceExhausted", "ServiceUnavailable", "Unknown"
    ]  # fmt: skip


def test_each_series_says_what_it_counts() -> None:
    """The HELP a person reads in a metrics browser: ours, for every series."""
    families = {f.name: f.documentation for f in ObjectiveMetrics().collect()}
    expected = {f"inference_objective_{name}": text for name, text in HELP.items()}
    expected |= {f"inference_objective_{name}": text for name, (text, _) in HISTOGRAMS.items()}
    assert families == expected


async def test_an_embeddings_request_is_counted_under_its_model_with_the_engines_prompt_tokens() -> None:
    """Routed on load alone and not tracked, but it named a model: counted, as the Inference
    Extension's picker counts every request it parses."""
    answer_body = (
        CreateEmbeddingResponse(
            data=[Embedding(embedding=[0.1, 0.2], index=0, object="embedding")],
            model=MODEL,
            object="list",
            usage={"prompt_tokens": 3, "total_tokens": 3},
        )
        .model_dump_json()
        .encode()
    )
    picker, service, scrape = make()
    request = json.dumps({"model": MODEL, "input": "the soup is good"}).encode()
    headers = request_headers("/v1/embeddings")
    await run(service, [headers, request_body(request), *answer(answer_body, 1 << 10, "application/json")])
    assert scrape("request_total", **MODELS, priority="0") == 1
    assert scrape("input_tokens_sum", **MODELS) == 3
    assert scrape("output_tokens_count", **MODELS) is None
    assert scrape("running_requests", model_name=MODEL) == 0
    unknown = json.dumps({"model": "no-such-embedder", "input": "x"}).encode()
    await run(service, [request_headers("/v1/embeddings"), request_body(unknown)])
    names = {"model_name": "unlisted", "target_model_name": "unlisted"}
    assert scrape("request_error_total", **names, error_code="NotFound") == 1
    assert picker.is_idle()
