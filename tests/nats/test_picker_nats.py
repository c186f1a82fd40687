"""The picker with NATS switched on by its config: Dynamo-style events from a mock worker process,
durable state across a picker restart, and replica sync between two pickers."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.procs import ManagedProcess, wait_http_ok
from extproc.request.parse import parse_openai_body
from extproc.router import RouterConfig, Worker
from extproc.runtime.server import RunningPicker, start_picker

from .conftest import eventually

MODEL = "demo-model"
BLOCK = 16
W0 = Worker("w0")
pytestmark = pytest.mark.asyncio


@pytest.fixture
def mock_worker(nats_server, tmp_path):
    ports_file = tmp_path / "worker.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "mock-worker", "--port", "0", "--worker-id", "w0",
        "--model", MODEL, "--block-size", str(BLOCK), "--speedup", "50", "--kv-events", "nats",
        "--nats-url", nats_server.url, "--instance-id", "7", "--namespace", "test",
        "--ports-file", str(ports_file),
    ]  # fmt: skip
    process = ManagedProcess(argv, log_path=tmp_path / "worker.log", ports_file=ports_file).start()
    try:
        port = process.ports()["port"]
        wait_http_ok(f"http://127.0.0.1:{port}/health", 30.0, process=process)
        yield f"127.0.0.1:{port}"
    finally:
        process.stop()


def picker_config(endpoint: str, nats_url: str, **events) -> PickerConfig:
    return PickerConfig(
        # Dynamo's cost: these tests count a request's prefill tokens until its first token
        router=RouterConfig(block_size=BLOCK, use_kv_events=True, prefill_load_model="none"),
        workers=(WorkerConfig("w0", endpoint, MODEL, instance_id=7),),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        events=EventsConfig(nats_url=nats_url, namespace="test", **events),
        kv_events_source=True,
    )


@pytest_asyncio.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def body(text: str) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}


async def hashes_of(picker: RunningPicker, request: dict) -> list[int]:
    pool = picker.picker.pools[MODEL]
    parsed = parse_openai_body(json.dumps(request).encode(), "/v1/chat/completions", max_bytes=1 << 20)
    return pool.router.block_hashes(await pool.tokenizer.tokenize(parsed))


async def serve_until_events_flow(picker: RunningPicker, client, endpoint: str) -> None:
    """Requests to the worker until its first events reach the picker (nats-server may drop the
    first messages after a new subscription: nats-io/nats-server#5677)."""
    feed = picker.sources.feed
    for i in range(50):
        async with client.post(
            f"http://{endpoint}/v1/chat/completions", json=body(f"warm up {i} " * 10)
        ) as r:
            assert r.status == 200
        if feed.counters["feed.events"]:
            return
        await asyncio.sleep(0.05)  # poll interval
    pytest.fail("no KV event reached the picker")


async def cached_on_w0(picker: RunningPicker, client, endpoint: str, text: str) -> list[int]:
    request = body(text)
    hashes = await hashes_of(picker, request)
    async with client.post(f"http://{endpoint}/v1/chat/completions", json=request) as r:
        assert r.status == 200
    router = picker.picker.pools[MODEL].router
    await eventually(lambda: router.indexer.find_matches(hashes).get(W0) == len(hashes), 5.0, "blocks arrive")
    return hashes


async def test_dynamo_events_from_a_worker_process_feed_the_picker(nats_server, mock_worker, client):
    picker = await start_picker(picker_config(mock_worker, nats_server.url))
    try:
        await serve_until_events_flow(picker, client, mock_worker)
        await cached_on_w0(picker, client, mock_worker, "events over NATS core " * 20)
        assert picker.sources.feed.state(W0) == "event-fed"
    finally:
        await picker.stop(0)


async def test_a_durable_picker_restarted_keeps_its_prefix_state(nats_server, mock_worker, client):
    config = picker_config(mock_worker, nats_server.url, durable_kv_events=True, router_id="r1")
    first = await start_picker(config)
    try:
        await serve_until_events_flow(first, client, mock_worker)
        hashes = await cached_on_w0(first, client, mock_worker, "kept across restarts " * 20)
        before = first.picker.pools[MODEL].router.indexer.find_matches(hashes)
    finally:
        await first.stop(0)
    second = await start_picker(config)
    try:
        router = second.picker.pools[MODEL].router
        await eventually(lambda: router.indexer.find_matches(hashes) == before, 10.0, "the state is back")
    finally:
        await second.stop(0)


async def test_two_pickers_with_replica_sync_see_each_others_load(nats_server, mock_worker):
    pickers = [
        await start_picker(picker_config(mock_worker, nats_server.url, replica_sync=True, router_id=name))
        for name in ("a", "b")
    ]
    a, b = (p.picker for p in pickers)
    router_b = b.pools[MODEL].router
    try:

        async def pick(picker, request_id: str, text: str):
            return await picker.pick(
                body=json.dumps(body(text)).encode(),
                path="/v1/chat/completions",
                headers={},
                subset=None,
                client_request_id=request_id,
            )

        for i in range(50):  # prime the subject (nats-io/nats-server#5677)
            probe = await pick(a, f"probe-{i}", "probe " * 40)
            seen = False
            for _ in range(10):
                if router_b.sequences.prefill_tokens(W0):
                    seen = True
                    break
                await asyncio.sleep(0.02)  # poll interval
            a.finish(probe, "done")
            if seen:
                break
        await eventually(lambda: router_b.is_idle(), 5.0, "probes freed on b")

        first = await pick(a, "r1", "long shared prompt " * 60)
        router_a = a.pools[MODEL].router
        load_a = (router_a.sequences.prefill_tokens(W0), router_a.sequences.decode_blocks(W0))
        assert load_a[0] > 0
        await eventually(
            lambda: (router_b.sequences.prefill_tokens(W0), router_b.sequences.decode_blocks(W0)) == load_a,
            5.0,
            "b sees a's request",
        )
        a.first_token(first)
        await eventually(lambda: router_b.sequences.prefill_tokens(W0) == 0, 5.0, "prefill done on b")
        a.finish(first, "done")
        await eventually(lambda: router_b.is_idle(), 5.0, "b back to zero")
        assert router_a.is_idle()
    finally:
        for p in pickers:
            await p.stop(0)
