"""The Responses API through a real Envoy, sent by the real `openai` client (`client.responses`).

Workers store each answer in their own memory, as vLLM does with `VLLM_ENABLE_RESPONSES_API_STORE=1`:
a follow-up (`previous_response_id`) or a retrieval that reaches another worker gets a 404. Three
mock workers (child processes, `extproc mock-worker`, whose `/v1/responses` answers as vLLM 0.33.0
does: `extproc/sim/mock_responses.py`), the picker in-process, Envoy a child process. vLLM itself
cannot run here (no GPU); the prompt the picker rebuilds is checked against vLLM's own code in
`tests/request/test_responses.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker

from ..replica_helpers import until
from .harness import picker_behind_envoy

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONVERSATIONS = 6
FOLLOW_UPS = 3


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("responses-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(3, log_dir, speedup=20.0, kv_events=False)
    yield started
    for w in started:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    workers: list[WorkerProcess], log_dir: Path
) -> AsyncIterator[tuple[RunningPicker, openai.AsyncOpenAI]]:
    async with picker_behind_envoy(workers, RouterConfig(block_size=16, use_kv_events=False), log_dir) as (
        picker,
        envoy,
    ):
        client = openai.AsyncOpenAI(base_url=f"{envoy.url}/v1", api_key="unused", max_retries=0, timeout=30)
        try:
            yield picker, client
        finally:
            await client.close()


async def test_follow_ups_and_retrievals_reach_the_worker_that_stored_the_response(stack):
    picker, client = stack

    async def conversation(i: int) -> list[str]:
        answer = await client.responses.create(
            model=MODEL,
            instructions="Be brief.",
            input=f"conversation {i}: tell me about caches",
            max_output_tokens=4,
        )
        ids = [answer.id]
        assert answer.output_text == " tok" * 4
        for turn in range(FOLLOW_UPS):  # each would be a 404 on any other worker
            answer = await client.responses.create(
                model=MODEL, input=f"and then? ({turn})", previous_response_id=ids[-1], max_output_tokens=4
            )
            ids.append(answer.id)
        for rid in ids:
            assert (await client.responses.retrieve(rid)).id == rid
        return ids

    chains = await asyncio.gather(*(conversation(i) for i in range(CONVERSATIONS)))
    homes = {picker.picker.response_homes.get(ids[0], 0.0).worker for ids in chains}
    assert len(homes) > 1  # the conversations were spread over the workers
    await until(picker.picker.is_idle, 5.0, "the picker freed every request")


async def test_a_streamed_answer_is_stored_and_continued(stack):
    picker, client = stack
    stream = await client.responses.create(model=MODEL, input="stream it", max_output_tokens=6, stream=True)
    kinds = []
    completed = None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.completed":
            completed = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 6 and completed is not None
    follow_up = await client.responses.create(
        model=MODEL, input="more", previous_response_id=completed.id, max_output_tokens=2
    )
    assert follow_up.output_text == " tok" * 2
    await until(picker.picker.is_idle, 5.0, "the picker freed every request")


async def test_an_unknown_response_is_the_workers_404(stack):
    _, client = stack
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model=MODEL, input="x", previous_response_id="resp_never_made")
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_never_made")
