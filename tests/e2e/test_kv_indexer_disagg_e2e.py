"""`--kv-indexer-url` with disaggregated workers, end to end: Dynamo 1.6.1's own standalone indexer
(`python -m dynamo.indexer`) consumes the ZMQ KV events of two prefill and two decode mock workers,
the picker consumes none, and one answer per request chooses both: the prefill worker caching the
prompt's prefix prefills it, and a decode worker that received a prompt's KV prefills its follow-up
itself. Requests go through a real Envoy.

The picker runs in-process (the test reads its routes and counters); the indexer, the workers and
Envoy are child processes, stopped by pid.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import DisaggConfig, EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.dynamo_indexer import DynamoIndexer
from extproc.devstack.stack import MODEL
from extproc.router import RouterConfig, Worker
from extproc.runtime.server import RunningPicker
from tests.e2e.harness import behind_envoy
from tests.e2e.test_disagg_e2e import TIMEOUT, Recorder, Workers, chat, prompt_hashes, running_workers, send
from tests.e2e.test_kv_indexer_e2e import indexer, indexer_workers, until_heard, until_indexed
from tests.replica_helpers import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16
__all__ = ["indexer"]  # the module's own Dynamo indexer, started as test_kv_indexer_e2e.py starts it
Stack = tuple[RunningPicker, str, Recorder]  # the picker, Envoy's URL, what the picker routed


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-indexer-disagg-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[Workers]:
    yield from running_workers(log_dir)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workers: Workers, indexer: DynamoIndexer, log_dir: Path) -> AsyncIterator[Stack]:
    prefill, decode = workers
    roles = [*(("prefill", w) for w in prefill), *(("decode", w) for w in decode)]
    config = PickerConfig(
        router=RouterConfig(block_size=BLOCK, use_kv_events=True),
        workers=tuple(
            WorkerConfig(
                w.worker_id,
                w.endpoint,
                MODEL,
                kv_events=w.kv_events,
                kv_replay=w.kv_replay,
                role=role,
                instance_id=instance_id,
            )
            for instance_id, (role, w) in enumerate(roles, start=1)
        ),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        events=EventsConfig(kv_indexer_url=indexer.url, kv_indexer_timeout_s=1.0),
        kv_events_source=True,
        disagg=DisaggConfig(
            min_remote_prefill_tokens=128, max_decode_prefix_frac=0.5, prefill_health_interval_s=0.2
        ),
    )
    async with behind_envoy(config, log_dir, workers=[w.endpoint for w in decode]) as (picker, envoy):
        await until_heard(picker, [*prefill, *decode])
        recorder = Recorder()
        picker.picker.listeners.append(recorder)
        yield picker, envoy.url, recorder


async def test_every_prefill_and_decode_worker_is_registered_and_no_event_consumed_here(
    stack, workers, indexer
):
    picker, _, _ = stack
    prefill, decode = workers
    want = {i: w.kv_events for i, w in enumerate([*prefill, *decode], start=1)}
    await until(lambda: _registered(indexer.url, want), 10.0, "the four workers are registered")
    assert picker.sources.zmq is None and picker.sources.nats_events is None


async def test_the_indexers_answer_names_the_prefill_worker_then_keeps_the_follow_up_on_its_decode_worker(
    stack, workers
):
    picker, url, recorder = stack
    prefill, _ = workers
    client = picker.picker.kv_indexer
    assert client is not None
    failed = client.counters["kv_indexer.query_failed"]
    shared = "a long shared system prompt that p1 prefilled before, told to the indexer " * 12
    body = chat(shared)
    hashes = await prompt_hashes(picker, body)
    async with (  # warm p1 directly: only the indexer hears its KV events
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.post(f"{prefill[1].url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
    p1 = Worker(prefill[1].worker_id)
    await until_indexed(client, hashes, p1)

    status, headers, payload = await send(url, chat(shared + "and a first question"))
    assert status == 200, payload
    pick = recorder.picks[-1]
    assert headers["x-prefill-source"] == "remote"
    assert pick.prefill_worker == p1
    assert pick.prefill_overlap_blocks >= len(hashes) - 1  # the template's end after the text differs
    assert headers["x-worker-id"] == pick.worker.worker_id  # Envoy went to the decode worker named

    follow_up = chat(shared + "and a first question")  # the decode worker now holds it: received KV
    await until_indexed(client, await prompt_hashes(picker, follow_up), pick.worker)
    # more new tokens than --min-remote-prefill-tokens, but fewer than the cached half of the prompt
    follow_up["messages"].append({"role": "user", "content": "and a second, longer question " * 25})
    status, headers, payload = await send(url, follow_up)
    assert status == 200, payload
    again = recorder.picks[-1]
    new = len(await prompt_hashes(picker, follow_up)) - again.overlap_blocks
    assert (headers["x-prefill-source"], again.worker, again.prefill_worker) == (
        "local",
        pick.worker,
        None,
    ), new
    assert again.overlap_blocks >= len(hashes) - 1
    local = {"model": MODEL, "where": "local", "reason": "decode-cached"}
    assert picker.picker.metrics.registry.get_sample_value("extproc_disagg_decisions_total", local) == 1
    assert client.counters["kv_indexer.query_failed"] == failed
    await until(picker.picker.is_idle, 10.0, "every load is released")


async def _registered(url: str, want: dict[int, str]) -> bool:
    return await indexer_workers(url) == want
