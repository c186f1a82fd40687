"""Non-streamed answers through a real Envoy, sent by the real `openai` client: they teach the learned
pass-time model nothing.

The picker sees a response only through Envoy's ext_proc stream. A streamed answer's first body chunk
is the first token; a non-streamed answer (the `openai` client's default) comes whole, when
generation is over, so its first chunk is the end of the request, not its time to first token. Taken
for a first token, each such answer would tell the default `timing` model that the worker is up to
MAX_RATIO x slower than predicted. Mock workers (`extproc mock-worker`, the engine's pass-time model
at 1x, child processes) answer; the picker runs in-process with its admin API; Envoy is a child process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker

from ..replica_helpers import until
from .harness import picker_behind_envoy

pytestmark = pytest.mark.asyncio(loop_scope="module")

REQUESTS = 12  # per kind, 4 at a time
MAX_TOKENS = 24  # about 24 decode passes: the whole answer comes ~10x later than the first token


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("whole-answers-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(2, log_dir, speedup=1.0, kv_events=False)
    yield started
    for w in started:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workers: list[WorkerProcess], log_dir: Path) -> AsyncIterator[tuple[RunningPicker, str]]:
    # the default prefill load model (timing) with learning on, predicting from the model the mock
    # workers run at 1x
    async with picker_behind_envoy(workers, RouterConfig(block_size=16, use_kv_events=False), log_dir) as (
        picker,
        envoy,
    ):
        yield picker, envoy.url


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {i}: " + "tell me about block reuse " * 40}]


async def pass_times(picker: RunningPicker) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{picker.admin.port}/debug/workers") as r,
    ):
        assert r.status == 200
        rows = (await r.json())["workers"]
    assert len(rows) == 2 and all(row["pass_time"] is not None for row in rows)
    return [row["pass_time"] for row in rows]


async def test_whole_answers_end_their_prompts_load_and_teach_nothing(stack):
    picker, url = stack
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    gate = asyncio.Semaphore(4)

    async def whole(i: int) -> None:
        async with gate:
            answer = await client.chat.completions.create(
                model=MODEL, messages=messages(i), max_tokens=MAX_TOKENS
            )
            assert answer.choices[0].message.content

    async def streamed(i: int) -> None:
        async with gate:
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages(1000 + i), max_tokens=MAX_TOKENS, stream=True
            )
            chunks = [chunk async for chunk in stream]
            assert chunks

    await asyncio.gather(*(whole(i) for i in range(REQUESTS)))
    await until(picker.picker.is_idle, 5.0, "the picker freed every request")  # every whole answer
    before = await pass_times(picker)
    assert [p["samples"] for p in before] == [0, 0], before  # no answer passed for a first token
    assert [p["scale"] for p in before] == [1.0, 1.0]

    # streamed answers are measured: their first chunk is the first token, about as the model predicts
    await asyncio.gather(*(streamed(i) for i in range(REQUESTS)))
    after = await pass_times(picker)
    # (a first token predicted behind another prompt's prefill is not a measurement: not all count)
    assert REQUESTS // 2 <= sum(p["samples"] for p in after) <= REQUESTS, after
    observed = [p for p in after if p["samples"]]
    assert all(0.5 < p["scale"] < 2.0 for p in observed), after
    await client.close()
