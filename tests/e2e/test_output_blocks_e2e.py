"""--router-track-output-blocks end to end: a mock worker streams SSE through a real Envoy (response
body STREAMED), the picker counts the generated tokens as they pass and the worker's decode load
grows with them, then returns to zero when the response ends.

The picker runs in-process so the test can read its router; the worker and Envoy are child processes.
Envoy sends each response chunk to the picker before the client gets it, so once the client has read
k token chunks the picker has counted at least k tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import start_envoy
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from ..replica_helpers import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16
TOKENS = 160  # 10 output blocks
TIMEOUT = aiohttp.ClientTimeout(total=60)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("output-blocks-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(
        1,
        log_dir,
        speedup=20.0,
        block_size=BLOCK,
        kv_events=False,
        extra_args=("--default-max-tokens", str(TOKENS)),  # no max_tokens: no expected length, no decay
    )
    yield started
    for w in started:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workers, log_dir) -> AsyncIterator[tuple[RunningPicker, str]]:
    config = PickerConfig(
        router=RouterConfig(
            block_size=BLOCK, use_kv_events=False, router_track_output_blocks=True, prefill_load_model="none"
        ),
        workers=tuple(WorkerConfig(w.worker_id, w.endpoint, MODEL) for w in workers),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        admin_port=0,
    )
    picker = await start_picker(config)
    envoy_yaml = render_envoy_config(
        "buffered", picker_address=f"127.0.0.1:{picker.port}", workers=[w.endpoint for w in workers]
    )
    envoy = start_envoy(envoy_yaml, log_path=log_dir / "envoy.log")
    try:
        yield picker, envoy.url
    finally:
        envoy.stop()
        await picker.stop(0)


def decode_blocks(picker: RunningPicker) -> float:
    router = picker.picker.pools[MODEL].router
    return sum(router.sequences.decode_blocks(w) for w in router.workers())


async def stream_chat(picker: RunningPicker, url: str, body: dict) -> tuple[list[float], int, int | None]:
    """Stream a chat completion; the decode load seen after each token chunk while the request is in
    flight, the token chunks, the usage."""
    seen: list[float] = []
    chunks, usage = 0, None
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as client,
        client.post(f"{url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in event["choices"]):
                chunks += 1
                if not picker.picker.is_idle():  # the end may have passed the picker already
                    seen.append(decode_blocks(picker))
    return seen, chunks, usage


@pytest.mark.parametrize("include_usage", [False, True])
async def test_decode_load_grows_with_generated_tokens_and_returns_to_zero(stack, include_usage):
    picker, url = stack
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a long story " * 8}], "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    seen, chunks, usage = await stream_chat(picker, url, body)
    assert chunks == TOKENS and usage == (TOKENS if include_usage else None)
    assert seen == sorted(seen)  # never shrinks while tokens come (no expected length: no decay)
    # the picker counted each chunk before the client read it: one block more per 16 tokens
    assert seen[-1] - seen[0] >= TOKENS // BLOCK - 2
    await until(lambda: picker.picker.is_idle() and decode_blocks(picker) == 0, 5.0, "every request freed")


async def test_with_an_expected_length_the_output_blocks_decay_toward_it(stack):
    picker, url = stack
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a long story " * 8}],
        "stream": True,
        "max_tokens": TOKENS,
        "nvext": {"agent_hints": {"osl": TOKENS}},
    }
    seen, chunks, _ = await stream_chat(picker, url, body)
    assert chunks == TOKENS
    peak = max(seen)
    # blocks x (1 - progress): highest mid-way (~TOKENS / BLOCK / 4 blocks), none left at the end
    assert peak - seen[0] >= TOKENS // BLOCK // 4 - 1
    assert seen[-1] <= seen[0] + 1 and seen.index(peak) < len(seen) - 1
    await until(lambda: picker.picker.is_idle() and decode_blocks(picker) == 0, 5.0, "every request freed")


async def test_a_non_streamed_answer_leaves_no_load(stack):
    picker, url = stack
    body = {"model": MODEL, "messages": [{"role": "user", "content": "short"}], "max_tokens": 40}
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as client,
        client.post(f"{url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
        assert (await r.json())["usage"]["completion_tokens"] == 40
    await until(lambda: picker.picker.is_idle() and decode_blocks(picker) == 0, 5.0, "every request freed")


# --- what each request saw, on /metrics (Dynamo's router histograms beside ours) ------------------


async def histograms(picker: RunningPicker) -> dict[str, tuple[float, float]]:
    """(count, sum) of each per-request histogram of MODEL, ours and Dynamo's names, from /metrics."""
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as client,
        client.get(f"http://127.0.0.1:{picker.admin.port}/metrics") as r,
    ):
        text = await r.text()
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == MODEL and sample.name.endswith(("_count", "_sum")):
                name, _, which = sample.name.rpartition("_")
                out.setdefault(name, [0.0, 0.0])[which == "sum"] = sample.value
    return {name: (count, total) for name, (count, total) in out.items()}


def grown(before: dict, after: dict, name: str) -> tuple[float, float]:
    """How much a histogram grew; one no request observed yet has no series at all."""
    (c0, s0), (c1, s1) = before.get(name, (0.0, 0.0)), after.get(name, (0.0, 0.0))
    return c1 - c0, s1 - s0


async def test_a_streamed_answers_ttft_itl_and_lengths_as_the_picker_saw_them(stack):
    picker, url = stack
    before = await histograms(picker)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        sent = time.perf_counter()
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a long story " * 8}], stream=True
        )
        arrivals = [
            time.perf_counter() async for chunk in stream if chunk.choices and chunk.choices[0].delta.content
        ]
    assert len(arrivals) == TOKENS
    await until(lambda: picker.picker.is_idle(), 5.0, "the request freed")
    after = await histograms(picker)
    for ours, dynamo in [
        ("extproc_time_to_first_token_seconds", "dynamo_component_router_time_to_first_token_seconds"),
        ("extproc_inter_token_latency_seconds", "dynamo_component_router_inter_token_latency_seconds"),
        ("extproc_output_sequence_tokens", "dynamo_component_router_output_sequence_tokens"),
        ("extproc_input_sequence_tokens", "dynamo_component_router_input_sequence_tokens"),
        ("extproc_kv_hit_rate", "dynamo_component_router_kv_hit_rate"),
    ]:
        assert grown(before, after, ours)[0] == 1, ours
        assert after[dynamo] == after[ours], dynamo
    # the picker saw the first token after its decision began and before the client did
    ttft = grown(before, after, "extproc_time_to_first_token_seconds")[1]
    assert 0 < ttft < arrivals[0] - sent
    # its mean gap between tokens spans no more than the client's whole request did
    itl = grown(before, after, "extproc_inter_token_latency_seconds")[1]
    assert 0 < itl * (TOKENS - 1) < arrivals[-1] - sent
    assert grown(before, after, "extproc_output_sequence_tokens")[1] == TOKENS
    assert grown(before, after, "extproc_input_sequence_tokens")[1] > 0
    assert 0 <= grown(before, after, "extproc_kv_hit_rate")[1] <= 1


async def test_a_whole_answer_has_a_length_but_no_first_token_or_gaps(stack):
    """A non-streamed answer reaches the picker whole, when generation is over: no TTFT, no ITL."""
    picker, url = stack
    before = await histograms(picker)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        answer = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "short"}], max_tokens=40
        )
    assert answer.usage is not None and answer.usage.completion_tokens == 40
    await until(lambda: picker.picker.is_idle(), 5.0, "the request freed")
    after = await histograms(picker)
    assert grown(before, after, "extproc_output_sequence_tokens") == (1, 40)
    assert grown(before, after, "extproc_input_sequence_tokens")[0] == 1
    for name in ("extproc_time_to_first_token_seconds", "extproc_inter_token_latency_seconds"):
        assert grown(before, after, name)[0] == 0, name
