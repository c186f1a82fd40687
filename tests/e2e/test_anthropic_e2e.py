"""The Anthropic Messages API (`/v1/messages`) through a real Envoy, sent by the real `anthropic` client.

Claude Code and the `anthropic` SDK speak this API to vLLM and SGLang; its requests carry long
system prompts and tool definitions that every turn repeats, so where they land decides the cache
hits. Three mock workers (child processes, `extproc mock-worker`, whose `/v1/messages` answers as
vLLM's does: `extproc/sim/mock_anthropic.py`), KV events over ZMQ, the picker in-process, Envoy a
child process. The prompt the picker rebuilds is checked against vLLM's own code in
`tests/request/test_anthropic.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import pytest
import pytest_asyncio

from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker

from ..replica_helpers import until
from .harness import picker_behind_envoy

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16
SYSTEM = [
    {
        "type": "text",
        "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=4f2a9;",
    },  # Claude Code's, per request
    {"type": "text", "text": "You are a coding agent. " + "Follow the repository's conventions. " * 60},
]
TOOLS = [
    {"name": "read_file", "description": "Read a file", "input_schema": {"type": "object", "properties": {}}}
]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("anthropic-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(3, log_dir, speedup=50.0, block_size=BLOCK, kv_events=True)
    yield started
    for w in started:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    workers: list[WorkerProcess], log_dir: Path
) -> AsyncIterator[tuple[RunningPicker, anthropic.AsyncAnthropic]]:
    router = RouterConfig(block_size=BLOCK, use_kv_events=True)
    async with picker_behind_envoy(workers, router, log_dir, kv_events=True) as (picker, envoy):
        client = anthropic.AsyncAnthropic(base_url=envoy.url, api_key="unused", max_retries=0, timeout=30)
        try:
            yield picker, client
        finally:
            await client.close()


async def test_an_agents_turns_go_where_its_prompt_is_cached(stack):
    picker, client = stack
    router = picker.picker.pools[MODEL].router
    history = [{"role": "user", "content": "Read the README."}]
    first = await client.messages.with_raw_response.create(
        model=MODEL, max_tokens=4, system=SYSTEM, tools=TOOLS, messages=history
    )
    served = first.headers["x-worker-id"]
    assert (await first.parse()).content[0].text == " tok" * 4
    # the worker's KV events arrive: its tree holds the prompt's blocks
    await until(lambda: router.indexer.num_blocks() > 0, 10.0, "the first turn's blocks are indexed")
    for turn in range(3):  # each turn repeats the system prompt, the tools and the conversation so far
        history = [
            *history,
            {"role": "assistant", "content": " tok" * 4},
            {"role": "user", "content": f"next {turn}"},
        ]
        answer = await client.messages.with_raw_response.create(
            model=MODEL, max_tokens=4, system=SYSTEM, tools=TOOLS, messages=history
        )
        assert answer.headers["x-worker-id"] == served
        assert int(answer.headers["x-prefix-cache-hit-tokens"]) > 400
    await until(picker.picker.is_idle, 5.0, "the picker freed every request")


async def test_a_streamed_message_is_followed_to_its_end(stack):
    picker, client = stack
    kinds = []
    async with client.messages.stream(
        model=MODEL, max_tokens=6, system=SYSTEM, messages=[{"role": "user", "content": "stream it"}]
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.usage.output_tokens == 6 and final.content[0].text == " tok" * 6
    await until(picker.picker.is_idle, 5.0, "the picker freed every request")


async def test_a_malformed_message_request_is_the_pickers_400(stack):
    _, client = stack
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "tool", "content": "x"}])
    assert "role must be user, assistant or system" in str(caught.value)
    assert (
        caught.value.response.headers["x-gateway-request-dropped-reason"] == "invalid-request"
    )  # not the worker
