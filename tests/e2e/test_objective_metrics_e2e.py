"""The Inference Extension's per-request series on /metrics, through a real Envoy 1.40, as llm-d's own
end-to-end test of its picker reads them.

That test (llm-d-inference-scheduler 520af47, `test/e2e/epp/utils_test.go`) sends requests through
its gateway, scrapes the picker's /metrics and requires 14 names. Here the `openai` client asks
through our Envoy templates (buffered; full duplex both ways); the worker replays what vLLM 0.33.0
and SGLang 0.5.23 write (`tests/request/engines/*/answers.json`: a 5-token prompt, 3 tokens
generated), and an InferenceModelRewrite sends `foodreview` as the adapter `foodreview-v2`. Every
name must be there, with the counts each request makes: the engine's tokens, the bytes that passed,
one error per failed request (the picker's 404, a worker's 500), nothing left running.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from extproc.runtime.server import RunningPicker

from ..config.test_inference_extension import objective, rewrite
from ..runtime.test_engine_metrics import fixture
from .test_admission_e2e import until
from .test_asked_model_e2e import (
    ADAPTER,
    BASE,
    ENGINES,
    ROLLOUT,
    ReplayWorker,
    client,
    recorded,
    replay_behind_envoy,
)  # fmt: skip

pytestmark = pytest.mark.asyncio(loop_scope="module")

# the names llm-d's end-to-end test requires of a picker's /metrics, in its order
EXPECTED = (
    "inference_objective_request_total",
    "inference_objective_request_error_total",
    "inference_objective_request_duration_seconds",
    "inference_objective_normalized_time_per_output_token_seconds",
    "inference_objective_request_sizes",
    "inference_objective_response_sizes",
    "inference_objective_input_tokens",
    "inference_objective_output_tokens",
    "inference_pool_average_kv_cache_utilization",
    "inference_pool_average_queue_size",
    "inference_pool_per_pod_queue_size",
    "inference_objective_running_requests",
    "inference_pool_ready_pods",
    "inference_extension_info",
)
UNRECORDED = "foodreview-v3"  # an adapter the picker serves and the worker has no answer for: its 500
ASKED = {"model_name": "foodreview", "target_model_name": ADAPTER}


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=[(e, m) for e in ENGINES for m in ("buffered", "duplex")]
)
async def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[RunningPicker, str, str]]:
    engine, mode = request.param
    root = tmp_path_factory.mktemp(f"objective-metrics-{engine}-{mode}")
    resources = rewrite("foodreview-rollout", ROLLOUT) + "---\n" + objective("critical", 2)
    # its /metrics: what vLLM 0.33.0 exports (the pool gauges are read from it)
    worker = await ReplayWorker(recorded(engine), fixture("vllm", "0.33.0", "single-engine")).start()
    try:
        async with replay_behind_envoy(
            worker, root, mode, resources, (ADAPTER, UNRECORDED), admin_port=0
        ) as (picker, envoy):
            yield picker, envoy.url, engine
    finally:
        await worker.stop()


async def scrape(picker: RunningPicker) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics as a scraper reads it: sample name -> {sorted labels: value}."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{picker.admin.port}/metrics") as response,
    ):
        text = await response.text()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


async def test_every_series_llm_ds_end_to_end_test_requires_is_there_with_each_requests_counts(
    stack,
) -> None:
    picker, url, engine = stack
    before = await scrape(picker)
    async with client(url) as openai_client:
        chat = await openai_client.chat.completions.create(
            model="foodreview",
            messages=[{"role": "user", "content": "Is the soup good?"}],
            max_tokens=3,
            extra_headers={"x-gateway-inference-objective": "critical"},
        )
        assert chat.usage is not None and chat.usage.prompt_tokens == 5
        stream = await openai_client.completions.create(
            model="foodreview",
            prompt="Is the soup good?",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces = [chunk async for chunk in stream]
        assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 3
        with pytest.raises(openai.NotFoundError):
            await openai_client.chat.completions.create(
                model="never-served-" + "x" * 40, messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.InternalServerError):
            await openai_client.chat.completions.create(
                model=UNRECORDED, messages=[{"role": "user", "content": "hi"}]
            )
    await until(lambda: picker.picker.is_idle())
    router = picker.picker.pools[BASE].router  # the engine's metrics are read every second
    await until(lambda: all(router.reported.get(w) is not None for w in router.workers()))
    after = await scrape(picker)
    after = await scrape(picker)
    present = {name.removesuffix("_bucket") for name in after} | set(after)
    assert [name for name in EXPECTED if name not in present] == []

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("inference_objective_request_total", **ASKED, priority="2") == 1
    assert grew("inference_objective_request_total", **ASKED, priority="0") == 1
    assert grew("inference_objective_input_tokens_sum", **ASKED) == 10  # the engine's 5, twice
    assert grew("inference_objective_output_tokens_sum", **ASKED) == 6
    assert grew("inference_objective_normalized_time_per_output_token_seconds_count", **ASKED) == 2
    assert grew("inference_objective_request_duration_seconds_count", **ASKED) == 2
    assert grew("inference_objective_response_sizes_count", **ASKED) == 2
    sent = recorded(engine)["by_model"][ADAPTER]  # the bytes as the worker sent them (renamed after)
    assert grew("inference_objective_response_sizes_sum", **ASKED) == len(
        sent["chat_json"].encode() + sent["completion_sse"].encode()
    )
    assert grew("inference_objective_request_sizes_count", **ASKED) == 2
    unknown = {"model_name": "unlisted", "target_model_name": "unlisted"}
    assert grew("inference_objective_request_error_total", **unknown, error_code="NotFound") == 1
    failed = {"model_name": UNRECORDED, "target_model_name": UNRECORDED}
    assert grew("inference_objective_request_error_total", **failed, error_code="ModelServerError") == 1
    assert grew("inference_objective_request_duration_seconds_count", **failed) == 0
    running = after["inference_objective_running_requests"]
    assert set(running.values()) == {0.0}
    assert not any("never-served" in str(labels) for series in after.values() for labels in series)


async def test_the_scheduler_prefix_and_latency_series_follow_a_streamed_request(stack) -> None:
    """The rest of the Inference Extension's series a dashboard of its picker reads: the scheduler's
    attempts (on the worker's pod and port) and decision time, the prefix match, and the streamed
    answer's time to first token (measured and as predicted) and per output token."""
    picker, url, _ = stack
    before = await scrape(picker)
    async with client(url) as openai_client:
        stream = await openai_client.chat.completions.create(
            model="foodreview",
            messages=[{"role": "user", "content": "Is the soup good?"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces = [chunk async for chunk in stream]
        assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 3
    await until(lambda: picker.picker.is_idle())
    after = await scrape(picker)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    port = picker.picker.config.workers[0].endpoint.rpartition(":")[2]
    pod = {"target_model_name": ADAPTER, "pod_name": "w0-rank-0", "namespace": "", "port": port}
    assert grew("inference_extension_scheduler_attempts_total", status="success", **pod) == 1
    assert grew("inference_extension_scheduler_e2e_duration_seconds_count") == 1
    assert grew("inference_extension_prefix_indexer_hit_ratio_count") == 1
    assert value(after, "inference_extension_prefix_indexer_size") > 0  # its prompt, predicted cached
    assert grew("inference_objective_request_ttft_seconds_count", **ASKED) == 1
    assert grew("inference_objective_request_tpot_seconds_count", **ASKED) == 1  # 3 tokens: 2 after the first
    # the default prefill model (timing) predicted its time to first token when it chose the worker
    assert grew("inference_objective_request_predicted_ttft_seconds_count", **ASKED) == 1
    assert grew("inference_objective_request_predicted_ttft_seconds_sum", **ASKED) > 0
    ttft = grew("inference_objective_request_ttft_seconds_sum", **ASKED)
    assert 0 < ttft <= grew("inference_objective_request_duration_seconds_sum", **ASKED)
    # no admission queue here (no --router-queue-threshold): no flow control, as GIE's without it
    assert not any(name.startswith("inference_extension_flow_control") for name in after)
