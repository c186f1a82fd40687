"""Event-fed routing end to end: mock workers publish their caches' KV events over ZMQ, the picker
subscribes, and requests go through a real Envoy.

The picker runs in-process so the test can read its routers; the workers are child processes
(stopped and restarted by pid); Envoy is a child process.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio

from extproc.config import EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import ManagedProcess, start_envoy, wait_http_ok
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.epp.answers import CONFORMANCE_SELECTION_HEADER
from extproc.events.feed import EVENT_FED, STALE
from extproc.request.parse import parse_openai_body
from extproc.router import RouterConfig, Worker
from extproc.runtime.server import RunningPicker, start_picker

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16
TIMEOUT = aiohttp.ClientTimeout(total=30)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-events-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    # ports held: w0 restarts on its own (the picker's config names them)
    started = start_workers(2, log_dir, speedup=50.0, block_size=BLOCK, kv_events=True, hold_ports=True)
    yield started
    for w in started:
        w.process.stop()
        w.release_ports()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workers, log_dir) -> AsyncIterator[tuple[RunningPicker, str]]:
    config = PickerConfig(
        router=RouterConfig(block_size=BLOCK, use_kv_events=True),
        workers=tuple(
            WorkerConfig(w.worker_id, w.endpoint, MODEL, kv_events=w.kv_events, kv_replay=w.kv_replay)
            for w in workers
        ),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        admin_port=0,
        conformance_hooks=True,
        events=EventsConfig(),
        kv_events_source=True,
    )
    picker = await start_picker(config)
    envoy_yaml = render_envoy_config(
        "buffered", picker_address=f"127.0.0.1:{picker.port}", workers=[w.endpoint for w in workers]
    )
    envoy = start_envoy(envoy_yaml, log_path=log_dir / "envoy.log")  # on ports it picks and reports
    try:
        yield picker, envoy.url
    finally:
        envoy.stop()
        await picker.stop(0)


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    """Poll `condition` (bounded) on the picker's event loop."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)


def chat(text: str) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}


async def prompt_tokens(picker: RunningPicker, body: dict) -> list[int]:
    """The token ids the picker routes `body` by (what an engine caching it would store)."""
    request = parse_openai_body(json.dumps(body).encode(), "/v1/chat/completions", max_bytes=1 << 20)
    return list(await picker.picker.pools[MODEL].tokenizer.tokenize(request))


async def prompt_hashes(picker: RunningPicker, body: dict) -> list[int]:
    return picker.picker.pools[MODEL].router.block_hashes(await prompt_tokens(picker, body))


async def send(url: str, body: dict, worker: WorkerProcess | None = None) -> aiohttp.ClientResponse:
    headers = {CONFORMANCE_SELECTION_HEADER: worker.endpoint} if worker else {}
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as client,
        client.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        await r.read()
        return r


async def test_the_router_sees_exactly_what_the_serving_worker_cached(stack, workers):
    picker, url = stack
    router = picker.picker.pools[MODEL].router
    body = chat("the router follows the engine's own cache " * 20)
    hashes = await prompt_hashes(picker, body)
    first = await send(url, body)
    served = Worker(first.headers["x-worker-id"])
    # the worker's stored events arrive over ZMQ: the tree holds every full prompt block for it
    await until(lambda: router.indexer.find_matches(hashes).get(served) == len(hashes), "the blocks arrive")
    assert picker.sources.feed.state(served) == EVENT_FED
    assert router.approx.num_blocks(served) == 0  # nothing predicted for an event-fed worker
    second = await send(url, body)
    assert second.headers["x-worker-id"] == str(served.worker_id)
    assert int(second.headers["x-prefix-cache-hit-tokens"]) >= (len(hashes) - 1) * BLOCK
    # the admin endpoints say so too
    admin = f"http://127.0.0.1:{picker.admin.port}"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(f"{admin}/metrics") as r:
            metrics = await r.text()
        async with client.get(f"{admin}/debug/workers") as r:
            debug = await r.json()
    labels = f'dp_rank="0",model="{MODEL}",source="event-fed",worker="{served.worker_id}"'
    line = f"extproc_worker_cache_source{{{labels}}} 1.0"
    assert line in metrics
    assert 'extproc_kv_event_transport_total{key="zmq.batch"}' in metrics
    row = next(w for w in debug["workers"] if w["worker"] == str(served.worker_id))
    assert row["cache_source"] == "event-fed" and row["cached_blocks"] >= len(hashes)


async def test_a_restarted_worker_is_marked_stale_then_resynchronised(stack, workers, log_dir):
    picker, url = stack
    router = picker.picker.pools[MODEL].router
    feed = picker.sources.feed
    target = workers[0]
    worker = Worker(target.worker_id)
    body = chat("cached before the restart " * 20)
    hashes = await prompt_hashes(picker, body)
    await send(url, body, target)
    await until(lambda: router.indexer.find_matches(hashes).get(worker) == len(hashes), "the blocks arrive")

    target.process.stop()
    await until(lambda: feed.state(worker) == STALE, "the lost stream is noticed")
    # the picker keeps answering while w0's stream is down (w0 itself is dead: serve from w1)
    assert (await send(url, chat("while w0 is down " * 5), workers[1])).headers["x-worker-id"] == "w1"

    restarted = ManagedProcess(target.process.argv, log_path=log_dir / "worker-w0-restarted.log").start()
    target.process = restarted  # the fixture stops whatever runs now
    wait_http_ok(f"{target.url}/health", 30.0, process=restarted)
    # the new engine's cache is empty: the picker resets its view of w0 and follows the new stream
    await until(lambda: feed.state(worker) == EVENT_FED, "the stream is back")
    await until(lambda: worker not in router.indexer.find_matches(hashes), "the old blocks are forgotten")
    await send(url, body, target)
    await until(lambda: router.indexer.find_matches(hashes).get(worker) == len(hashes), "new blocks arrive")


async def test_salted_prompts_reuse_only_their_own_salts_blocks(stack, workers):
    """The openai client sends `cache_salt` (vLLM's and SGLang's per-tenant cache isolation) through
    Envoy. The worker keys its blocks under the salt and publishes them as vLLM 0.33 does (the salt in
    the first block's extra_keys); the picker hashes the salted request the same way, so it routes a
    tenant's repeat to the worker holding that tenant's blocks and never predicts a hit across salts."""
    picker, url = stack
    router = picker.picker.pools[MODEL].router
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30.0, max_retries=0)
    text = "a long shared system prompt that two tenants both send " * 12
    messages = [{"role": "user", "content": text}]

    async def ask(salt: str, to: str | None = None) -> tuple[str, int]:
        endpoint = next(w.endpoint for w in workers if w.worker_id == to) if to else None
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=4,
            extra_body={"cache_salt": salt},
            extra_headers={CONFORMANCE_SELECTION_HEADER: endpoint} if endpoint else None,
        )
        raw.parse()
        return raw.headers["x-worker-id"], int(raw.headers["x-prefix-cache-hit-tokens"])

    try:
        body = {**chat(text), "cache_salt": "tenant-a"}
        pool = picker.picker.pools[MODEL]
        parsed = parse_openai_body(json.dumps(body).encode(), "/v1/chat/completions", max_bytes=1 << 20)
        tokens = await pool.tokenizer.tokenize(parsed)
        salted = router.block_hashes(tokens, cache_salt="tenant-a")
        first, hits = await ask("tenant-a")
        assert hits == 0
        await until(
            lambda: router.indexer.find_matches(salted).get(Worker(first)) == len(salted), "salted blocks"
        )
        assert router.indexer.find_matches(router.block_hashes(tokens)) == {}  # stored under the salt only
        again, hits = await ask("tenant-a")
        assert again == first and hits >= (len(salted) - 1) * BLOCK
        other = router.block_hashes(tokens, cache_salt="tenant-b")
        assert router.indexer.find_matches(other) == {}  # no hit predicted for the other tenant
        served, hits = await ask("tenant-b", to=first)  # sent to tenant-a's worker on purpose
        assert served == first and hits == 0  # which reuses nothing of tenant-a's blocks for it
    finally:
        await client.close()
