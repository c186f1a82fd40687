"""Disaggregated prefill/decode end to end: prefill and decode mock workers (child processes, KV
events over ZMQ), the picker in-process, requests through a real Envoy.

The picker names the prefill worker in `x-prefill-endpoint`; the decode worker asks it to prefill,
receives the KV and streams the answer, saying where the prompt was prefilled in
`x-prefill-source` (remote, local, local-fallback). Killing every prefill worker must lose no
request: the decode side prefills locally until the picker's health probe stops naming them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import DisaggConfig, EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import start_envoy
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.picker.local_group import Routed
from extproc.request.parse import parse_openai_body
from extproc.router import RouterConfig, Worker
from extproc.runtime.server import RunningPicker, start_picker

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16
TIMEOUT = aiohttp.ClientTimeout(total=30)
HEALTH_INTERVAL_S = 0.2


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("disagg-e2e")


Workers = tuple[list[WorkerProcess], list[WorkerProcess]]  # (prefill, decode)
Stack = tuple[RunningPicker, str, "Recorder"]  # the picker, Envoy's URL, what the picker routed


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[Workers]:
    yield from running_workers(log_dir)


@pytest.fixture
def own_workers(tmp_path: Path) -> Iterator[Workers]:
    """Workers for one test that kills some of them."""
    yield from running_workers(tmp_path)


def running_workers(log_dir: Path) -> Iterator[Workers]:
    common = dict(speedup=50.0, block_size=BLOCK, kv_events=True)
    prefill = start_workers(2, log_dir, id_prefix="p", extra_args=["--role", "prefill"], **common)
    try:
        decode = start_workers(2, log_dir, id_prefix="d", extra_args=["--role", "decode"], **common)
    except BaseException:
        for w in prefill:
            w.process.stop()
        raise
    yield prefill, decode
    for w in [*prefill, *decode]:
        w.process.stop()


class Recorder:
    """Every routed request (a real RouteListener), to see which prefill worker was named."""

    def __init__(self) -> None:
        self.picks: list[Routed] = []

    def on_routed(self, routed: Routed, local_hashes: Sequence[int], isl: int, expected: int | None) -> None:
        self.picks.append(routed)

    def on_prefill_complete(self, routed: Routed) -> None:
        pass

    def on_freed(self, routed: Routed) -> None:
        pass


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workers: Workers, log_dir: Path) -> AsyncIterator[Stack]:
    async for started in running_stack(workers, log_dir):
        yield started


@pytest_asyncio.fixture(loop_scope="module")
async def own_stack(own_workers: Workers, tmp_path: Path) -> AsyncIterator[Stack]:
    async for started in running_stack(own_workers, tmp_path):
        yield started


async def running_stack(workers: Workers, log_dir: Path) -> AsyncIterator[Stack]:
    prefill, decode = workers
    config = PickerConfig(
        router=RouterConfig(block_size=BLOCK, use_kv_events=True),
        workers=tuple(
            WorkerConfig(
                w.worker_id, w.endpoint, MODEL, kv_events=w.kv_events, kv_replay=w.kv_replay, role=role
            )
            for role, group in (("prefill", prefill), ("decode", decode))
            for w in group
        ),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        events=EventsConfig(),
        kv_events_source=True,
        disagg=DisaggConfig(min_remote_prefill_tokens=128, prefill_health_interval_s=HEALTH_INTERVAL_S),
    )
    picker = await start_picker(config)
    recorder = Recorder()
    picker.picker.listeners.append(recorder)
    envoy_yaml = render_envoy_config(
        "buffered", picker_address=f"127.0.0.1:{picker.port}", workers=[w.endpoint for w in decode]
    )
    envoy = start_envoy(envoy_yaml, log_path=log_dir / "envoy.log")  # on ports it picks and reports
    try:
        yield picker, envoy.url, recorder
    finally:
        envoy.stop()
        await picker.stop(0)


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)


def chat(text: str, *, stream: bool = False) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8,
        "stream": stream,
    }


async def send(url: str, body: dict) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as client,
        client.post(f"{url}/v1/chat/completions", json=body) as r,
    ):
        return r.status, dict(r.headers), await r.read()


async def prompt_hashes(picker: RunningPicker, body: dict) -> list[int]:
    pool = picker.picker.pools[MODEL]
    request = parse_openai_body(json.dumps(body).encode(), "/v1/chat/completions", max_bytes=1 << 20)
    return pool.router.block_hashes(await pool.tokenizer.tokenize(request))


async def test_the_prefill_worker_caching_the_prefix_prefills_and_the_decode_worker_streams(stack, workers):
    picker, url, recorder = stack
    prefill, _ = workers
    prefill_router = picker.picker.pools[MODEL].prefill
    shared = "a long shared system prompt about routing prefill work " * 30
    body = chat(shared)
    hashes = await prompt_hashes(picker, body)
    # warm p1 directly: its KV events reach the prefill router
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as client,
        client.post(f"{prefill[1].url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
    p1 = Worker(prefill[1].worker_id)
    await until(
        lambda: prefill_router.indexer.find_matches(hashes).get(p1) == len(hashes), "p1's blocks arrive"
    )

    streamed = chat(
        "a long shared system prompt about routing prefill work " * 30 + "and one question", stream=True
    )
    status, headers, payload = await send(url, streamed)
    assert status == 200, payload
    assert headers["x-prefill-source"] == "remote"
    assert payload.rstrip().endswith(b"data: [DONE]")
    pick = recorder.picks[-1]
    assert pick.prefill_worker == p1  # named in x-prefill-endpoint: the decode worker prefilled there
    assert headers["x-worker-id"] == str(pick.worker.worker_id)  # Envoy went to the decode worker
    # the decode worker received the prompt's KV: its events show the blocks there too
    decode_router = picker.picker.pools[MODEL].router
    full = await prompt_hashes(picker, streamed)
    await until(
        lambda: decode_router.indexer.find_matches(full).get(pick.worker, 0) == len(full),
        "the decode worker's received blocks arrive as events",
    )
    await until(picker.picker.is_idle, "every load is released")


async def test_short_prompts_are_prefilled_on_the_decode_worker(stack):
    picker, url, recorder = stack
    status, headers, payload = await send(url, chat("hi"))
    assert status == 200, payload
    assert headers["x-prefill-source"] == "local"
    assert recorder.picks[-1].prefill_worker is None
    await until(picker.picker.is_idle, "every load is released")


async def test_killing_every_prefill_worker_falls_back_to_aggregated_serving_without_failures(
    own_stack, own_workers
):
    picker, url, recorder = own_stack
    prefill, _ = own_workers
    for w in prefill:
        w.process.stop()
    statuses, sources = [], []
    for i in range(12):  # the first ones may still name a dead prefill worker: the decode side falls back
        status, headers, _ = await send(url, chat(f"request {i} after the prefill pool died " * 20))
        statuses.append(status)
        sources.append(headers.get("x-prefill-source"))
        await asyncio.sleep(HEALTH_INTERVAL_S / 4)  # pacing: lets the health probe run between requests
    assert statuses == [200] * 12, sources
    assert set(sources) <= {"local-fallback", "local"}
    await until(
        lambda: picker.picker.local.prefill_health.unhealthy == {w.worker_id for w in prefill}, "probes fail"
    )
    status, headers, _ = await send(url, chat("after the probes noticed " * 20))
    assert status == 200 and headers["x-prefill-source"] == "local"
    assert recorder.picks[-1].prefill_worker is None
    count = picker.picker.metrics.registry.get_sample_value
    no_prefill = {"model": MODEL, "where": "local", "reason": "no-prefill-worker"}
    assert count("extproc_disagg_decisions_total", no_prefill) >= 1
    await until(picker.picker.is_idle, "every load is released")
