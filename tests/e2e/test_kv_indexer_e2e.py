"""`--kv-indexer-url` end to end: Dynamo 1.6.1's own standalone indexer (`python -m dynamo.indexer`)
consumes the workers' ZMQ KV events, the picker consumes none and asks it for each prompt's
overlaps, and requests go through a real Envoy.

The picker runs in-process (the test reads its counters); the indexer, the mock workers (vLLM's
event format, checked against vLLM's own bytes in tests/events/test_engine_fixtures.py) and Envoy are
child processes, stopped by pid.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from functools import partial
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.dynamo_indexer import DynamoIndexer, start_dynamo_indexer
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.events.kv_indexer import KvIndexerClient
from extproc.router import RouterConfig, Worker
from extproc.runtime.server import RunningPicker
from tests.e2e.harness import behind_envoy
from tests.e2e.test_kv_events_e2e import TIMEOUT, chat, prompt_hashes, send
from tests.replica_helpers import until, within

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-indexer-e2e")


@pytest.fixture(scope="module")
def indexer(log_dir: Path) -> Iterator[DynamoIndexer]:
    started = start_dynamo_indexer(log_dir / "indexer.log")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(2, log_dir, speedup=50.0, block_size=BLOCK, kv_events=True)
    yield started
    for w in started:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workers, indexer, log_dir) -> AsyncIterator[tuple[RunningPicker, str]]:
    config = PickerConfig(
        router=RouterConfig(block_size=BLOCK, use_kv_events=True),
        workers=tuple(worker_config(w, i + 1) for i, w in enumerate(workers)),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        admin_port=0,
        conformance_hooks=True,
        events=EventsConfig(kv_indexer_url=indexer.url, kv_indexer_timeout_s=1.0),
        kv_events_source=True,
    )
    async with behind_envoy(config, log_dir, workers=[w.endpoint for w in workers]) as (picker, envoy):
        await until_heard(picker, workers)
        yield picker, envoy.url


def worker_config(w: WorkerProcess, instance_id: int) -> WorkerConfig:
    kv = {"kv_events": w.kv_events, "kv_replay": w.kv_replay}
    return WorkerConfig(w.worker_id, w.endpoint, MODEL, instance_id=instance_id, **kv)


async def indexer_workers(url: str) -> dict[int, str]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client, client.get(f"{url}/workers") as r:
        return {w["instance_id"]: w["endpoints"]["0"] for w in await r.json()}


async def test_the_picker_registers_its_workers_and_consumes_no_kv_event(stack, workers, indexer):
    picker, _ = stack
    want = {i + 1: w.kv_events for i, w in enumerate(workers)}
    await until(lambda: indexer_workers(indexer.url), 10.0, "the workers are registered")
    assert await indexer_workers(indexer.url) == want
    assert picker.sources.zmq is None and picker.sources.nats_events is None
    assert picker.sources.counters["zmq.batch"] == 0
    admin = f"http://127.0.0.1:{picker.admin.port}"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.get(f"{admin}/debug/workers") as r:
            rows = (await r.json())["workers"]
        async with http.get(f"{admin}/readyz") as r:
            ready = r.status
    # nothing is predicted for them, and readiness does not wait 30 s for events it will never hear
    assert {(row["cache_source"], row["cache_source_reason"]) for row in rows} == {
        ("event-fed", f"its KV events are the KV indexer's at {indexer.url}")
    }
    assert ready == 200


async def test_follow_ups_go_where_the_indexer_says_their_prefix_is_cached(stack, workers):
    """Each prompt's first request is sent to a worker of the test's choosing; once the indexer has
    that worker's events, every follow-up goes there: a rule of load alone could not match both."""
    picker, url = stack
    client = picker.picker.kv_indexer
    assert client is not None
    queries, failed = client.counters["kv_indexer.query"], client.counters["kv_indexer.query_failed"]
    for target in workers:
        body = chat(f"a long prefix kept by {target.worker_id}, which the indexer knows of " * 12)
        hashes = await prompt_hashes(picker, body)
        await send(url, body, target)
        await until_indexed(client, hashes, Worker(target.worker_id))
        for n in range(4):
            follow_up = chat(f"a long prefix kept by {target.worker_id}, which the indexer knows of " * 12)
            follow_up["messages"].append({"role": "user", "content": f"and question {n}"})
            served = await send(url, follow_up)
            assert served.headers["x-worker-id"] == target.worker_id
            assert int(served.headers["x-prefix-cache-hit-tokens"]) >= (len(hashes) - 1) * BLOCK
    assert client.counters["kv_indexer.query"] > queries
    assert client.counters["kv_indexer.query_failed"] == failed


async def test_concurrent_decisions_each_count_their_own_prompts_overlaps(stack, workers):
    """Decisions wait on the indexer concurrently: each must decide with its own answer."""
    picker, url = stack
    client = picker.picker.kv_indexer
    assert client is not None
    texts = {w.worker_id: f"concurrent prefix of {w.worker_id} " * 14 for w in workers}
    for target in workers:
        body = chat(texts[target.worker_id])
        await send(url, body, target)
        await until_indexed(client, await prompt_hashes(picker, body), Worker(target.worker_id))
    for n in range(4):  # one follow-up of each prompt at a time: more at once would balance load
        asked = []
        for wid, text in texts.items():
            body = chat(text)
            body["messages"].append({"role": "user", "content": f"question {n}"})
            asked.append((wid, body))
        served = await asyncio.gather(*(send(url, body) for _, body in asked))
        assert [r.headers["x-worker-id"] for r in served] == [wid for wid, _ in asked]
        hits = [int(r.headers["x-prefix-cache-hit-tokens"]) for r in served]
        assert min(hits) >= 10 * BLOCK, (hits, client.counters.snapshot())


async def test_salted_requests_go_by_load_without_asking(stack):
    picker, url = stack
    client = picker.picker.kv_indexer
    assert client is not None
    before = client.counters["kv_indexer.query"], client.counters["kv_indexer.salted_by_load"]
    await send(url, {**chat("a tenant's own prompt " * 10), "cache_salt": "tenant-a"})
    after = client.counters["kv_indexer.query"], client.counters["kv_indexer.salted_by_load"]
    assert after == (before[0], before[1] + 1)


async def test_without_the_indexer_requests_are_routed_by_load_and_it_is_refilled_on_return(
    stack, workers, indexer
):
    picker, url = stack
    client = picker.picker.kv_indexer
    registrar = picker.sources.kv_indexer
    assert client is not None and registrar is not None
    failed = client.counters["kv_indexer.query_failed"]
    indexer.stop()
    for n in range(3):
        assert (await send(url, chat(f"while the indexer is down {n} " * 8))).status == 200
    assert client.counters["kv_indexer.query_failed"] == failed + 3

    registrar.interval_s = 0.2  # the next pass is due now, not in 10 s
    indexer.restart()
    registrar.want([])
    want = {i + 1: w.kv_events for i, w in enumerate(workers)}
    await until(lambda: _equals(indexer_workers(indexer.url), want), 10.0, "the workers are registered again")
    target = workers[1]
    body = chat("cached after the indexer came back " * 12)
    hashes = await prompt_hashes(picker, body)
    await send(url, body, target)

    await until_indexed(client, hashes, Worker(target.worker_id))
    follow_up = chat("cached after the indexer came back " * 12)
    follow_up["messages"].append({"role": "user", "content": "one more"})
    assert (await send(url, follow_up)).headers["x-worker-id"] == target.worker_id


async def until_heard(picker: RunningPicker, workers: Sequence[WorkerProcess]) -> None:
    """Until the indexer hears each worker's KV events: a prompt of its own, sent to it directly, is
    indexed on it. The picker registers its workers at start, and the indexer's ZMQ listener then
    connects: a batch published before that is lost, so another prompt is sent each second."""
    client = picker.picker.kv_indexer
    assert client is not None
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for w in workers:
            for attempt in range(20):
                body = chat(f"is {w.worker_id} heard yet, attempt {attempt} " * 4)
                hashes = await prompt_hashes(picker, body)
                async with http.post(f"{w.url}/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                if await within(partial(_holds_all, client, hashes, Worker(w.worker_id)), 1.0) is not None:
                    break
            else:
                pytest.fail(f"the indexer never heard {w.worker_id}'s KV events")


async def until_indexed(client: KvIndexerClient, hashes: list[int], worker: Worker) -> None:
    """Until the indexer holds the whole prompt for `worker` (others may hold the template's start)."""
    seen: list[object] = []

    async def holds() -> bool:
        seen[:] = [await client.overlaps(MODEL, BLOCK, hashes)]
        return isinstance(seen[0], dict) and seen[0].get(worker) == len(hashes)

    await until(holds, 10.0, lambda: f"the indexer holds {worker}'s {len(hashes)} blocks: {seen}")


async def _holds_all(client: KvIndexerClient, hashes: list[int], worker: Worker) -> bool:
    return (await client.overlaps(MODEL, BLOCK, hashes) or {}).get(worker) == len(hashes)


async def _equals(value: object, want: object) -> bool:
    return (await value if asyncio.iscoroutine(value) else value) == want
