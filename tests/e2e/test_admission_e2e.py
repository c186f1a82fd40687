"""Admission queue and sticky sessions through a real Envoy 1.40.

Queue: two echo workers that hold answers until the test releases them (so a request stays in
prefill), a picker with `router_queue_threshold = 0` (one prompt in prefill saturates a worker)
and an Envoy whose message timeout (500 ms) is shorter than the waits: queued requests only
survive because the picker extends the deadline with `override_message_timeout`.
Sessions: four mock workers; every turn of a session lands on one worker until the pin lapses
or its worker leaves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import ManagedProcess, start_envoy
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from .harness import EchoWorker, start_echo_workers

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = aiohttp.ClientTimeout(total=30)
MESSAGE_TIMEOUT_MS = 500
MAX_WAIT_S = 1.5


def config(endpoints: list[str], **router) -> PickerConfig:
    return PickerConfig(
        # Dynamo's cost: a held prompt stays in prefill (saturating its worker) until its first token;
        # the timing model would predict it done after a few ms
        router=RouterConfig(block_size=16, use_kv_events=False, prefill_load_model="none", **router),
        workers=tuple(WorkerConfig(f"w{i}", ep, MODEL) for i, ep in enumerate(endpoints)),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        seed=5,
    )


def envoy_for(picker: RunningPicker, log_dir: Path, name: str) -> tuple[ManagedProcess, str]:
    yaml = render_envoy_config(
        "buffered", picker_address=f"127.0.0.1:{picker.port}", message_timeout_ms=MESSAGE_TIMEOUT_MS
    )
    envoy = start_envoy(yaml, log_path=log_dir / f"envoy-{name}.log")  # on ports it picks and reports
    return envoy, envoy.url


def chat(text: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("admission-e2e")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def queue_stack(log_dir) -> AsyncIterator[tuple[RunningPicker, str, list[EchoWorker]]]:
    workers = await start_echo_workers(2)
    cfg = replace(
        config([w.address for w in workers], router_queue_threshold=0.0), queue_max_wait_s=MAX_WAIT_S
    )
    picker = await start_picker(cfg)
    envoy, url = envoy_for(picker, log_dir, "queue")
    try:
        yield picker, url, workers
    finally:
        envoy.stop()
        await picker.stop(0)
        for w in workers:
            await w.stop()


async def post(http: aiohttp.ClientSession, url: str, body: dict, query: str = "") -> tuple[int, dict]:
    async with http.post(f"{url}/v1/chat/completions{query}", json=body) as r:
        return r.status, json.loads(await r.read() or b"{}")


async def test_a_queued_request_waits_past_envoys_message_timeout_and_is_routed_when_capacity_frees(
    queue_stack,
) -> None:
    picker, url, workers = queue_stack
    gate = picker.picker.gate(MODEL)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        held = [asyncio.create_task(post(http, url, chat(f"held {k} " * 30), f"?hold={k}")) for k in "ab"]
        router = picker.picker.pools[MODEL].router
        await until(lambda: len(router.sequences) == 2)  # both workers hold a prompt in prefill
        queued = asyncio.create_task(post(http, url, chat("waiting " * 30)))
        await until(lambda: len(gate) == 1)
        await asyncio.sleep(MESSAGE_TIMEOUT_MS / 1000 * 1.6)  # time passes beyond Envoy's message timeout
        assert not queued.done() and len(gate) == 1
        for w in workers:
            w.release("a")  # whichever worker holds "a" answers it; its capacity frees
        status, answer = await queued
        assert status == 200 and answer["path"] == "/v1/chat/completions"
        for w in workers:
            w.release("b")
        assert [(await t)[0] for t in held] == [200, 200]
    await until(picker.picker.is_idle)
    assert gate.stats.released >= 1


async def test_the_bounded_wait_ends_in_503_or_429_for_sheddable_requests(queue_stack) -> None:
    picker, url, workers = queue_stack
    gate = picker.picker.gate(MODEL)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        held = [asyncio.create_task(post(http, url, chat(f"hold {k} " * 30), f"?hold={k}")) for k in "cd"]
        await until(lambda: len(picker.picker.pools[MODEL].router.sequences) == 2)
        normal = asyncio.create_task(post(http, url, chat("normal " * 30)))
        shed = asyncio.create_task(
            post(http, url, chat("shed " * 30, nvext={"agent_hints": {"priority": -1}}))
        )
        (s1, a1), (s2, a2) = await normal, await shed
        assert (s1, s2) == (503, 429)
        assert "saturated" in a1["error"]["message"] and "shed" in a2["error"]["message"]
        for w in workers:
            for k in "cd":
                w.release(k)
        assert [(await t)[0] for t in held] == [200, 200]
    await until(picker.picker.is_idle)
    assert len(gate) == 0


async def test_a_client_that_disconnects_while_queued_leaves_the_queue(queue_stack) -> None:
    picker, url, workers = queue_stack
    gate = picker.picker.gate(MODEL)
    cancelled_before = gate.stats.cancelled
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        held = [asyncio.create_task(post(http, url, chat(f"keep {k} " * 30), f"?hold={k}")) for k in "ef"]
        await until(lambda: len(picker.picker.pools[MODEL].router.sequences) == 2)
        leaving = asyncio.create_task(post(http, url, chat("leaving " * 30)))
        await until(lambda: len(gate) == 1)
        leaving.cancel()  # the client closes its connection; Envoy resets the ext_proc stream
        with pytest.raises(asyncio.CancelledError):
            await leaving
        await until(lambda: len(gate) == 0)
        assert gate.stats.cancelled == cancelled_before + 1
        for w in workers:
            for k in "ef":
                w.release(k)
        assert [(await t)[0] for t in held] == [200, 200]
    await until(picker.picker.is_idle)


# --- sticky sessions ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mock_workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    workers = start_workers(4, log_dir, speedup=50.0, kv_events=False)
    yield workers
    for w in workers:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session_stack(mock_workers, log_dir) -> AsyncIterator[tuple[RunningPicker, str]]:
    cfg = replace(config([w.endpoint for w in mock_workers]), session_ttl_s=1.0)
    picker = await start_picker(cfg)
    envoy, url = envoy_for(picker, log_dir, "sessions")
    try:
        yield picker, url
    finally:
        envoy.stop()
        await picker.stop(0)


async def turn(http: aiohttp.ClientSession, url: str, session: str, text: str) -> str:
    body = chat(text, nvext={"session_control": {"session_id": session}})
    async with http.post(f"{url}/v1/chat/completions", json=body) as r:
        await r.read()
        assert r.status == 200
        return r.headers["x-worker-id"]


async def test_every_turn_of_a_session_stays_on_one_worker_until_the_pin_lapses(session_stack) -> None:
    picker, url = session_stack
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for session in ("alpha", "beta", "gamma"):
            # unrelated prompts of growing size: load-and-overlap routing alone would spread them
            workers = {
                await turn(http, url, session, f"{session} turn {i} " * (10 + 20 * i)) for i in range(5)
            }
            assert len(workers) == 1, (session, workers)
        sessions = picker.picker.sessions(MODEL)
        assert all(session in sessions for session in ("alpha", "beta", "gamma"))
        await asyncio.sleep(1.2)  # longer than the 1 s TTL: the pins lapse
        assert sessions.get("alpha", picker.picker._clock()) is None
    await until(picker.picker.is_idle)


async def test_a_session_whose_worker_goes_away_moves_and_sticks_to_the_new_one(session_stack) -> None:
    picker, url = session_stack
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        first = await turn(http, url, "delta", "delta opening " * 40)
        remaining = [w for w in picker.picker.config.workers if w.id != first]
        picker.picker.set_workers(MODEL, remaining)  # what discovery does when the pod goes
        try:
            moved = {await turn(http, url, "delta", f"delta next {i} " * 40) for i in range(4)}
            assert len(moved) == 1 and first not in moved
        finally:
            picker.picker.set_workers(MODEL, picker.picker.config.workers)
    await until(picker.picker.is_idle)
