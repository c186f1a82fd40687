"""device-aware-weighted through a real Envoy: two accelerator and two CPU echo workers, ratio 8.

The picker runs in this event loop (so the test reads its router), Envoy as a child process in
BUFFERED and FULL_DUPLEX_STREAMED mode. Requests with `?hold=K` stay in flight at their worker until
the test releases them, so every decision sees the ones before it: 54 concurrent requests split
48:6 between the classes, 24 per accelerator worker and 3 per CPU worker (8:1). Then they complete,
the router's state returns to zero, and requests one at a time (nothing in flight) go to the
accelerators, as in Dynamo.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import Variant
from extproc.devstack.stack import MODEL
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from .harness import EchoWorker, EnvoyUnderTest, start_echo_workers, start_envoy_variant

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODES: list[Variant] = ["buffered", "duplex"]
TIMEOUT = aiohttp.ClientTimeout(total=30)
DEVICES = {"g0": "cuda", "g1": "cuda", "c0": "cpu", "c1": "cpu"}
CONCURRENT = 54  # 54 // 9 = 6 for the CPU class: 3 per CPU worker against 24 per accelerator

Stack = tuple[
    RunningPicker, dict[str, EnvoyUnderTest], dict[str, EchoWorker]
]  # picker, Envoy per mode, workers


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("device-weighted-e2e")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(log_dir) -> AsyncIterator[Stack]:
    workers = dict(zip(DEVICES, await start_echo_workers(len(DEVICES)), strict=True))
    config = PickerConfig(
        router=RouterConfig(
            mode="device-aware-weighted",
            cuda_to_cpu_ratio=8.0,
            block_size=16,
            use_kv_events=False,
            prefill_load_model="none",  # Dynamo's cost: held requests keep their load, so 24/24/3/3
        ),
        workers=tuple(WorkerConfig(wid, w.address, MODEL, device=DEVICES[wid]) for wid, w in workers.items()),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        seed=5,
    )
    picker = await start_picker(config)
    envoys: dict[str, EnvoyUnderTest] = {}
    try:
        addresses = [w.address for w in workers.values()]
        for mode in MODES:
            envoys[mode] = start_envoy_variant(
                mode, picker_address=f"127.0.0.1:{picker.port}", workers=addresses, log_dir=log_dir
            )
        yield picker, envoys, workers
    finally:
        for envoy in envoys.values():
            envoy.stop()
        await picker.stop(0)
        for w in workers.values():
            await w.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        yield session


def chat(text: str) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 8.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_requests_split_8_to_1_per_worker(mode, stack, client):
    running, envoys, workers = stack
    router = running.picker.pools[MODEL].router
    id_of = {w.address: wid for wid, w in workers.items()}
    url = f"{envoys[mode].url}/v1/chat/completions"

    async def send(i: int) -> tuple[int, str]:
        # same-length prompts: within a class the kv cost ties and the load alternates
        async with client.post(f"{url}?hold={mode}-{i:03d}", json=chat(f"{mode} request {i:03d} " * 20)) as r:
            return r.status, (await r.json())["worker"]

    requests = [asyncio.create_task(send(i)) for i in range(CONCURRENT)]
    keys = [f"{mode}-{i:03d}" for i in range(CONCURRENT)]

    def held() -> dict[str, str]:  # key -> the worker holding it (an echo worker keeps a gate per held key)
        return {key: wid for wid, w in workers.items() for key in keys if key in w._gates}

    await wait_for(lambda: len(held()) == CONCURRENT, f"{CONCURRENT} requests held at their workers")
    in_flight = {w.worker_id: router.sequences.num_requests(w) for w in router.workers()}
    assert in_flight == {"g0": 24, "g1": 24, "c0": 3, "c1": 3}
    assert Counter(held().values()) == in_flight  # where Envoy sent them is where the router put them

    for key, wid in held().items():
        workers[wid].release(key)
    answers = await asyncio.gather(*requests)
    assert all(status == 200 for status, _ in answers)
    assert Counter(id_of[worker] for _, worker in answers) == {"g0": 24, "g1": 24, "c0": 3, "c1": 3}
    await wait_for(running.picker.is_idle, "router state back to zero")


@pytest.mark.parametrize("mode", MODES)
async def test_one_request_at_a_time_goes_to_the_accelerators(mode, stack, client):
    running, envoys, workers = stack
    accelerators = {w.address for wid, w in workers.items() if DEVICES[wid] == "cuda"}
    for i in range(6):
        async with client.post(f"{envoys[mode].url}/v1/chat/completions", json=chat(f"alone {i} " * 30)) as r:
            assert r.status == 200, await r.text()
            echoed = await r.json()
        assert (
            echoed["worker"] in accelerators
        )  # with nothing in flight the CPU class is never under its share
        assert echoed["headers"]["x-gateway-destination-endpoint"] == echoed["worker"]
        await wait_for(running.picker.is_idle, "request freed")
