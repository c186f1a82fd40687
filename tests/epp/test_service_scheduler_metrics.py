"""The Inference Extension's scheduler, prefix-cache, flow-control and latency series, the servicer
driven in-process with a real picker: `inference_extension_scheduler_*`, `..._prefix_indexer_*`,
`..._flow_control_*` and `inference_objective_request_ttft_seconds` / `..._tpot_seconds`. Through a
real Envoy: tests/e2e/test_objective_metrics_e2e.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from google.protobuf import struct_pb2
from prometheus_client import CollectorRegistry

from extproc.config.inference_extension import InferenceExtensionConfig, Pool
from extproc.epp import answers as epp
from extproc.epp.scheduler_metrics import (
    CHARACTERS_PER_TOKEN,
    HELP,
    SchedulerMetrics,
    decision_seconds,
    for_picker,
)
from extproc.epp.service import ExtProcService
from extproc.epp.service_metrics import ServiceCollector
from extproc.errors import NoEligibleWorker, RequestInvalid
from extproc.picker.flow_metrics import DISPATCHED, EVICTED_TTL
from extproc.picker.inference_extension import FAIRNESS_HEADER
from extproc.picker.pick import ObjectiveLabels, Pick, label_refusal
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker

from ..picker_fixtures import (
    MODEL,
    chat_body,
    closed_after_test,
    picker_config,
    request_body,
    request_headers,
    run,
)
from .test_service import OpenStream, until
from .test_service_objective_metrics import JSON, SSE, answer

MODELS = {"model_name": MODEL, "target_model_name": MODEL}
LONG = "the same long system prompt, shared by every request here " * 30


class Scrape:
    """The servicer's and the picker's /metrics, as read when scraped."""

    def __init__(self, picker: EndpointPicker, service: ExtProcService) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ServiceCollector(service))
        self.picker_registry = picker.metrics.registry

    def __call__(self, name: str, **labels: str) -> float | None:
        value = self.registry.get_sample_value(name, labels)
        return value if value is not None else self.picker_registry.get_sample_value(name, labels)


def make(config=None) -> tuple[EndpointPicker, ExtProcService, Scrape]:
    picker = closed_after_test(EndpointPicker(config or picker_config()))
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    return picker, service, Scrape(picker, service)


def attempts(scrape: Scrape, status: str, **labels: str) -> float | None:
    return scrape("inference_extension_scheduler_attempts_total", status=status, **labels)


def with_hint(endpoints: list[str]):
    message = request_headers()
    hint = struct_pb2.Struct()
    hint.fields[epp.SUBSET_KEY].list_value.extend(endpoints)
    message.metadata_context.filter_metadata[epp.SUBSET_NAMESPACE].CopyFrom(hint)
    return message


# --- the scheduler's attempts and durations ------------------------------------------------------


async def test_a_routed_request_is_a_successful_attempt_on_the_chosen_pod_and_port() -> None:
    picker, service, scrape = make()
    answers = await run(service, [with_hint(["127.0.0.2:8001"]), request_body(chat_body("a question"))])
    assert epp.DESTINATION_HEADER in str(answers[-1])
    pod = {"target_model_name": MODEL, "pod_name": "w1-rank-0", "namespace": "", "port": "8001"}
    assert attempts(scrape, "success", **pod) == 1
    assert scrape("inference_extension_scheduler_e2e_duration_seconds_count") == 1
    seconds = scrape("inference_extension_scheduler_e2e_duration_seconds_sum")
    assert seconds is not None and 0 < seconds < 1
    assert picker.is_idle()


async def test_a_success_is_labelled_with_the_pools_namespace() -> None:
    config = picker_config()
    config = replace(config, inference_extension=InferenceExtensionConfig(None, Pool("pool", "prod")))
    _, service, scrape = make(config)
    await run(service, [with_hint(["127.0.0.1:8000"]), request_body(chat_body("a question"))])
    pod = {"target_model_name": MODEL, "pod_name": "w0-rank-0", "namespace": "prod", "port": "8000"}
    assert attempts(scrape, "success", **pod) == 1


async def test_no_eligible_worker_is_a_failed_attempt_and_a_bad_request_is_no_attempt() -> None:
    _, service, scrape = make()
    answers = await run(service, [with_hint(["10.9.9.9:1"]), request_body(chat_body("a question"))])
    assert answers[-1].immediate_response.status.code == 503
    failure = {"target_model_name": MODEL, "pod_name": "", "namespace": "", "port": ""}
    assert attempts(scrape, "failure", **failure) == 1  # its model was read: labelled with it
    for body in (b"{not json", chat_body("a question", model="nobody-serves-this")):  # 400, 404
        answers = await run(service, [request_headers(), request_body(body)])
        assert answers[-1].immediate_response.status.code in (400, 404)
    total = sum(
        s.value
        for family in scrape.registry.collect()
        if family.name == "inference_extension_scheduler_attempts"
        for s in family.samples
    )
    assert total == 1  # neither reached a decision
    assert scrape("inference_extension_scheduler_e2e_duration_seconds_count") is None


def test_the_scheduler_duration_is_the_routers_stages_alone() -> None:
    timings = {"parse": 10**9, "tokenize": 10**9, "queue": 10**9, "hash": 1000, "match": 2000, "select": 3000}
    assert decision_seconds(timings) == 6000 / 1e9
    assert decision_seconds({"groups": 5000, "queue": 10**9}) == 5000 / 1e9  # remote groups
    assert decision_seconds({"parse": 10**6}) is None and decision_seconds({}) is None  # untracked


# --- the prefix match --------------------------------------------------------------------------------


async def test_a_repeated_prompt_shows_its_prefix_hit_in_ratio_and_bytes() -> None:
    _, service, scrape = make()
    for _ in range(2):
        await run(service, [with_hint(["127.0.0.1:8000"]), request_body(chat_body(LONG))])
    assert scrape("inference_extension_prefix_indexer_hit_ratio_count") == 2
    assert scrape("inference_extension_prefix_indexer_hit_ratio_bucket", le="0.0") == 1  # the first: cold
    ratio = scrape("inference_extension_prefix_indexer_hit_ratio_sum")
    assert ratio is not None and 0.9 < ratio <= 1  # the second: all its full blocks, predicted cached
    assert ratio == scrape("extproc_kv_hit_rate_sum", model=MODEL)  # the picker's own view of the same
    overlap = scrape("extproc_overlap_blocks_total", model=MODEL, which="chosen")
    assert overlap is not None and overlap > 0
    hit_bytes = scrape("inference_extension_prefix_indexer_hit_bytes_sum")
    assert hit_bytes == overlap * 16 * CHARACTERS_PER_TOKEN  # 16-token blocks, 4 characters a token


async def test_a_request_routed_on_load_alone_has_no_prefix_match() -> None:
    _, service, scrape = make()
    embeddings = json.dumps({"model": MODEL, "input": "a sentence"}).encode()
    await run(service, [request_headers("/v1/embeddings"), request_body(embeddings)])
    assert (
        sum(
            s.value
            for family in scrape.registry.collect()
            if family.name == "inference_extension_scheduler_attempts"
            for s in family.samples
        )
        == 1
    )
    assert scrape("inference_extension_prefix_indexer_hit_ratio_count") is None
    assert scrape("inference_extension_scheduler_e2e_duration_seconds_count") is None  # not timed


def test_the_scheduler_series_carry_the_inference_extensions_names_and_bounds() -> None:
    families = {family.name: family for family in SchedulerMetrics().collect()}
    assert sorted(families) == [
        "inference_extension_prefix_indexer_hit_bytes",
        "inference_extension_prefix_indexer_hit_ratio",
        "inference_extension_scheduler_attempts",
        "inference_extension_scheduler_e2e_duration_seconds",
    ]
    assert families["inference_extension_scheduler_attempts"].type == "counter"


# --- time to first token and per output token ----------------------------------------------------


async def test_a_streamed_answer_has_its_first_tokens_time_and_its_time_per_token() -> None:
    _, service, scrape = make()
    await run(service, [request_headers(), request_body(chat_body("a question", stream=True)), *answer(SSE)])
    duration = scrape("inference_objective_request_duration_seconds_sum", **MODELS)
    ttft = scrape("inference_objective_request_ttft_seconds_sum", **MODELS)
    tpot = scrape("inference_objective_request_tpot_seconds_sum", **MODELS)
    assert duration is not None and ttft is not None and tpot is not None
    assert 0 < ttft < duration
    assert tpot == pytest.approx((duration - ttft) / (3 - 1))  # the engine's 3 tokens


async def test_a_whole_answer_has_no_first_token_of_its_own() -> None:
    _, service, scrape = make()
    await run(
        service,
        [
            request_headers(),
            request_body(chat_body("a question")),
            *answer(JSON, content_type="application/json"),
        ],
    )
    assert scrape("inference_objective_request_duration_seconds_count", **MODELS) == 1
    assert scrape("inference_objective_request_ttft_seconds_count", **MODELS) is None
    assert scrape("inference_objective_request_tpot_seconds_count", **MODELS) is None


def sse_with_usage(completion_tokens: int) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [
        {"index": 0, "delta": {"content": "x"}, "finish_reason": None}
    ]}  # fmt: skip
    usage = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens,
                       "total_tokens": 5 + completion_tokens}}  # fmt: skip
    return f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()


@pytest.mark.parametrize(
    ("n", "completion_tokens", "per_sequence"),
    [(2, 8, 4), (2, 7, 4), (1, 2, 2), (1, 1, 1), (3, 3, 1)],  # 7 of 2: 3.5 each, rounded up
)
async def test_the_time_per_token_is_per_sequence_and_needs_a_second_token(
    n, completion_tokens, per_sequence
):
    _, service, scrape = make()
    body = chat_body("a question", stream=True, n=n)
    await run(service, [request_headers(), request_body(body), *answer(sse_with_usage(completion_tokens))])
    duration = scrape("inference_objective_request_duration_seconds_sum", **MODELS)
    ttft = scrape("inference_objective_request_ttft_seconds_sum", **MODELS)
    tpot = scrape("inference_objective_request_tpot_seconds_sum", **MODELS)
    assert duration is not None and ttft is not None
    if per_sequence > 1:
        assert tpot == pytest.approx((duration - ttft) / (per_sequence - 1))
    else:
        assert tpot is None  # one token per sequence: nothing after the first


# --- flow control, through the picker's admission queue ------------------------------------------


async def routed_stream(service: ExtProcService) -> OpenStream:
    stream = OpenStream(service)
    stream.send(request_headers(), request_body(chat_body("a b c d " * 10)))
    await until(lambda: len(stream.answers) == 2)
    return stream


FLOW = {"fairness_id": "tenant-a", "priority": "0", "inference_pool": MODEL, **MODELS}


async def test_a_queued_request_is_counted_waiting_with_its_bytes_then_dispatched() -> None:
    picker, service, scrape = make(picker_config(router_queue_threshold=0.0))
    held = [await routed_stream(service) for _ in range(2)]  # one prompt in prefill saturates each worker
    duration = "inference_extension_flow_control_request_queue_duration_seconds_count"
    assert scrape(duration, **{**FLOW, "fairness_id": ""}, outcome=DISPATCHED) == 2  # at once
    waiting = OpenStream(service)
    body = chat_body("a question")
    waiting.send(request_headers(extra={FAIRNESS_HEADER: "tenant-a"}), request_body(body))
    await until(lambda: scrape("inference_extension_flow_control_queue_size", **FLOW) == 1)
    assert scrape("inference_extension_flow_control_queue_bytes", **FLOW) == len(body)
    await held[0].close()  # a worker frees: the queued request is routed
    await until(lambda: scrape(duration, **FLOW, outcome=DISPATCHED) == 1)
    assert scrape("inference_extension_flow_control_queue_size", **FLOW) is None
    assert (scrape("inference_extension_flow_control_dispatch_cycle_duration_seconds_count") or 0) >= 1
    for stream in (held[1], waiting):
        await stream.close()
    assert picker.is_idle()


async def test_a_request_that_waits_out_its_bound_is_evicted_by_ttl() -> None:
    config = replace(picker_config(router_queue_threshold=0.0), queue_max_wait_s=0.05)
    picker, service, scrape = make(config)
    held = [await routed_stream(service) for _ in range(2)]
    answers = await run(
        service, [request_headers(extra={FAIRNESS_HEADER: "tenant-a"}), request_body(chat_body("a question"))]
    )
    assert answers[-1].immediate_response.status.code == 503
    count = "inference_extension_flow_control_request_queue_duration_seconds_count"
    assert scrape(count, **FLOW, outcome=EVICTED_TTL) == 1
    assert scrape("inference_extension_flow_control_queue_size", **FLOW) is None
    for stream in held:
        await stream.close()
    assert picker.is_idle()


async def test_without_a_queue_nothing_is_recorded_as_flow_control() -> None:
    _, service, scrape = make()
    await run(service, [request_headers(), request_body(chat_body("a question"))])
    assert [s for f in scrape.picker_registry.collect() if "flow_control" in f.name for s in f.samples] == []


# --- the recorder alone ------------------------------------------------------------------------------


def pick(endpoint: str = "10.0.0.1:8000", *, blocks: int = 4, overlap: int = 3, tokens: int = 64) -> Pick:
    return Pick(
        "r", MODEL, Worker("w7", 1), endpoint, {}, overlap, blocks, tracked=True,
        timings_ns={"hash": 1000, "parse": 10**6}, prompt_tokens=tokens, labels=ObjectiveLabels("a", "b"),
    )  # fmt: skip


def test_each_attempt_counts_on_its_pod_and_an_ipv6_endpoints_port_is_its_last_part() -> None:
    metrics = SchedulerMetrics("ns", block_size=32)
    for _ in range(2):
        metrics.scheduled(pick("[fd00::1]:8000"))
    (family,) = [f for f in metrics.collect() if f.name == "inference_extension_scheduler_attempts"]
    (sample,) = [s for s in family.samples if s.name.endswith("_total")]
    assert sample.labels == {
        "status": "success", "target_model_name": "b", "pod_name": "w7-rank-1", "namespace": "ns",
        "port": "8000",
    }  # fmt: skip
    assert sample.value == 2
    assert metrics.hit_bytes.series[()][1] == [2 * 3 * 32 * CHARACTERS_PER_TOKEN]
    assert metrics.hit_ratio.series[()][1] == [2 * 0.75]
    assert metrics.duration.series[()][1] == [2 * 1000 / 1e9]


def test_a_pick_without_a_tokenized_prompt_or_without_blocks_has_no_prefix_match() -> None:
    metrics = SchedulerMetrics()
    metrics.scheduled(pick(blocks=5, overlap=0, tokens=0))  # routed on load alone: blocks from its size
    metrics.scheduled(pick(blocks=0, overlap=0, tokens=3))  # a prompt shorter than a block
    assert metrics.hit_ratio.series == {} and metrics.hit_bytes.series == {}
    assert metrics.attempts.values[("success", "b", "w7-rank-1", "", "8000")] == 2


def test_only_a_refusal_no_worker_could_take_is_a_failed_attempt() -> None:
    metrics = SchedulerMetrics()
    unlabelled, labelled = NoEligibleWorker("none"), NoEligibleWorker("none")
    label_refusal(labelled, ObjectiveLabels("a", "b"))
    for exc in (unlabelled, labelled, labelled, RequestInvalid("bad")):
        metrics.refused(exc)
    assert dict(metrics.attempts.values) == {("failure", "", "", "", ""): 1, ("failure", "b", "", "", ""): 2}


def test_the_labels_come_from_the_pickers_config_and_default_without_one() -> None:
    default = for_picker(object())
    assert (default.namespace, default.block_size) == ("", 16)
    config = replace(
        picker_config(block_size=32), inference_extension=InferenceExtensionConfig(None, Pool("p", "ns"))
    )
    picker = closed_after_test(EndpointPicker(config))
    configured = for_picker(picker)
    assert (configured.namespace, configured.block_size) == ("ns", 32)
    unnamespaced = for_picker(closed_after_test(EndpointPicker(picker_config())))
    assert (unnamespaced.namespace, unnamespaced.block_size) == ("", 16)


def test_each_scheduler_series_says_what_it_counts() -> None:
    families = {f.name: f.documentation for f in SchedulerMetrics().collect()}
    assert families == HELP


# --- the router's predicted time to first token --------------------------------------------------


@pytest.mark.parametrize("model", ["timing", "aic"])
async def test_a_streamed_answer_shows_the_time_to_first_token_its_router_predicted(model) -> None:
    picker, service, scrape = make(picker_config(prefill_load_model=model))
    picks: list[Pick] = []
    pick_one = picker.pick

    async def seen(**kwargs) -> Pick:  # the picker as it is; its picks kept to read their prediction
        chosen = await pick_one(**kwargs)
        picks.append(chosen)
        return chosen

    picker.pick = seen  # type: ignore[method-assign]
    await run(service, [request_headers(), request_body(chat_body(LONG, stream=True)), *answer(SSE)])
    predicted = scrape("inference_objective_request_predicted_ttft_seconds_sum", **MODELS)
    assert scrape("inference_objective_request_predicted_ttft_seconds_count", **MODELS) == 1
    (chosen,) = picks
    assert chosen.predicted_ttft_ms is not None and predicted == pytest.approx(
        chosen.predicted_ttft_ms / 1000
    )
    timing = picker.pools[MODEL].router.sequences.timing(chosen.worker)
    assert chosen.predicted_ttft_ms > timing.prompt_ms(16)  # a prompt of many blocks


async def test_no_prediction_without_a_timed_model_nor_for_a_whole_answer() -> None:
    _, service, scrape = make()  # prefill_load_model "none": Dynamo's static count predicts no time
    await run(service, [request_headers(), request_body(chat_body(LONG, stream=True)), *answer(SSE)])
    assert scrape("inference_objective_request_ttft_seconds_count", **MODELS) == 1
    assert scrape("inference_objective_request_predicted_ttft_seconds_count", **MODELS) is None
    _, service, scrape = make(picker_config(prefill_load_model="timing"))
    whole = answer(JSON, content_type="application/json")
    await run(service, [request_headers(), request_body(chat_body(LONG)), *whole])
    assert scrape("inference_objective_request_predicted_ttft_seconds_count", **MODELS) is None
