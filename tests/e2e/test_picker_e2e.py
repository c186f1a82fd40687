"""The real picker behind a real Envoy 1.40, with real mock workers and echo workers.

One in-process picker per upstream kind (so the test can read its router state), Envoys in
BUFFERED and FULL_DUPLEX_STREAMED mode in front of it, workers as child processes (mock
workers) or in-process servers (echo workers that report the body's sha256).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import Variant, render_envoy_config
from extproc.devstack.procs import ManagedProcess, start_envoy
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from .harness import EchoWorker, start_echo_workers

pytestmark = pytest.mark.asyncio(loop_scope="module")

MiB = 1024 * 1024
TIMEOUT = aiohttp.ClientTimeout(total=30)
MODES: list[Variant] = ["buffered", "duplex"]
SUBSET_HEADER = "x-test-subset-hint"
# A test-only filter: copies a request header into the subset-hint metadata a gateway would set.
SUBSET_FILTER = f"""\
          - name: envoy.filters.http.header_to_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
              request_rules:
              - header: {SUBSET_HEADER}
                remove: true
                on_header_present:
                  metadata_namespace: envoy.lb.subset_hint
                  key: x-gateway-destination-endpoint-subset
                  type: STRING
"""


def picker_config(workers: list[str], *, max_body_bytes: int = 6 * MiB) -> PickerConfig:
    return PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=tuple(WorkerConfig(f"w{i}", ep, MODEL) for i, ep in enumerate(workers)),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        max_body_bytes=max_body_bytes,
        conformance_hooks=True,
        seed=3,
    )


def envoy_for(
    picker: RunningPicker, variant: Variant, log_dir: Path, workers: list[str]
) -> tuple[ManagedProcess, str]:
    config = render_envoy_config(
        variant, picker_address=f"127.0.0.1:{picker.port}", workers=workers, max_body_bytes=8 * MiB
    )
    config = config.replace("          - name: envoy.filters.http.ext_proc\n", SUBSET_FILTER
                            + "          - name: envoy.filters.http.ext_proc\n", 1)  # fmt: skip
    process = start_envoy(config, log_path=log_dir / f"envoy-{variant}-{picker.port}.log")  # ports: its own
    return process, process.url


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("picker-e2e")


@pytest.fixture(scope="module")
def mock_workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    workers = start_workers(2, log_dir, speedup=50.0)
    yield workers
    for w in workers:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mock_stack(mock_workers, log_dir) -> AsyncIterator[tuple[RunningPicker, dict[str, str]]]:
    endpoints = [w.endpoint for w in mock_workers]
    picker = await start_picker(picker_config(endpoints))
    envoys: dict[str, tuple[ManagedProcess, str]] = {}
    try:
        for mode in MODES:
            envoys[mode] = envoy_for(picker, mode, log_dir, endpoints)
        yield picker, {mode: url for mode, (_, url) in envoys.items()}
    finally:
        for process, _ in envoys.values():
            process.stop()
        await picker.stop(0)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["h2", "grpcio"])
async def echo_stack(
    request: pytest.FixtureRequest, log_dir: Path
) -> AsyncIterator[tuple[RunningPicker, dict[str, str], list[EchoWorker]]]:
    """Both ext_proc servers (--ext-proc-server): the bodies, errors and hints tests run on each."""
    workers = await start_echo_workers(2)
    endpoints = [w.address for w in workers]
    config = replace(picker_config(endpoints, max_body_bytes=6 * MiB), ext_proc_server=request.param)
    picker = await start_picker(config)
    envoys: dict[str, tuple[ManagedProcess, str]] = {}
    try:
        for mode in MODES:
            envoys[mode] = envoy_for(picker, mode, log_dir, endpoints)
        yield picker, {mode: url for mode, (_, url) in envoys.items()}, workers
    finally:
        for process, _ in envoys.values():
            process.stop()
        await picker.stop(0)
        for w in workers:
            await w.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        yield session


async def wait_idle(picker: RunningPicker, timeout_s: float = 5.0) -> None:
    """Poll (bounded) until the picker tracks nothing: the response path ends asynchronously."""
    deadline = time.monotonic() + timeout_s
    while not picker.picker.is_idle():
        assert time.monotonic() < deadline, "router state did not return to zero"
        await asyncio.sleep(0.01)


def chat(text: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}


@pytest.mark.parametrize("mode", MODES)
async def test_requests_land_on_the_worker_the_router_chose(mode, mock_stack, mock_workers, client):
    picker, urls = mock_stack
    worker_of = {w.endpoint: w.worker_id for w in mock_workers}
    seen = set()
    for i in range(6):
        async with client.post(
            f"{urls[mode]}/v1/chat/completions", json=chat(f"{i} {mode} prompt " * 30)
        ) as r:
            assert r.status == 200, await r.text()
            served = r.headers["x-conformance-test-served-endpoint"]
            assert r.headers["x-worker-id"] == worker_of[served]
            seen.add(served)
            await r.read()
    assert len(seen) == 2  # load spreads new prompts over both workers
    # the same long prompt again: the router predicts the cache and goes back to the same worker
    first = second = None
    for attempt in range(2):
        async with client.post(f"{urls[mode]}/v1/chat/completions", json=chat(f"{mode} repeat " * 100)) as r:
            assert r.status == 200
            if attempt == 0:
                first = r.headers["x-worker-id"]
            else:
                second = r.headers["x-worker-id"]
                assert int(r.headers["x-prefix-cache-hit-tokens"]) > 0
            await r.read()
    assert first == second
    await wait_idle(picker)


@pytest.mark.parametrize("mode", MODES)
async def test_sse_streaming_through_the_picker(mode, mock_stack, client):
    picker, urls = mock_stack
    body = chat("stream me " * 20, stream=True, max_tokens=8)
    events = []
    async with client.post(f"{urls[mode]}/v1/chat/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert sum(1 for c in chunks for ch in c["choices"] if ch["delta"].get("content")) == 8
    await wait_idle(picker)


@pytest.mark.parametrize(("mode", "size"), [("buffered", 3 * MiB), ("duplex", 5 * MiB), ("duplex", 1000)])
async def test_bodies_arrive_byte_identical(mode, size, echo_stack, client):
    picker, urls, _ = echo_stack
    text = (uuid.uuid4().hex * (size // 32 + 1))[: max(1, size - 100)]
    body = json.dumps(chat(text)).encode()
    async with client.post(f"{urls[mode]}/v1/chat/completions", data=io.BytesIO(body),
                           headers={"content-type": "application/json"}) as r:  # fmt: skip
        assert r.status == 200, await r.text()
        echoed = await r.json()
    assert echoed["body_len"] == len(body)
    assert echoed["body_sha256"] == hashlib.sha256(body).hexdigest()
    await wait_idle(picker)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"{not json", {}, 400),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', {}, 400),
        (json.dumps({"model": MODEL, "messages": "not a list"}).encode(), {}, 400),
        (json.dumps(chat("hi", model="no-such-model")).encode(), {}, 404),
        (json.dumps(chat("x" * (7 * MiB))).encode(), {}, 413),
        (json.dumps(chat("hi")).encode(), {"test-epp-endpoint-selection": "10.255.0.1"}, 503),
        (json.dumps(chat("hi")).encode(), {SUBSET_HEADER: "10.255.0.1:9"}, 503),
    ],
)
async def test_errors_return_their_status_and_leave_no_state(mode, body, headers, status, echo_stack, client):
    picker, urls, _ = echo_stack
    async with client.post(f"{urls[mode]}/v1/chat/completions", data=io.BytesIO(body), headers=headers) as r:
        assert r.status == status, await r.text()
        assert "error" in await r.json()  # the picker's answer, or Envoy's own in the same shape
        assert r.headers["x-gateway-request-dropped-reason"]
    await wait_idle(picker)


@pytest.mark.parametrize("mode", MODES)
async def test_subset_hints_are_honoured(mode, echo_stack, client):
    picker, urls, workers = echo_stack
    target = workers[1].address
    for i in range(6):
        async with client.post(f"{urls[mode]}/v1/chat/completions", json=chat(f"subset {i}"),
                               headers={SUBSET_HEADER: target}) as r:  # fmt: skip
            assert r.status == 200
            assert (await r.json())["worker"] == target
    await wait_idle(picker)


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_cannot_choose_the_destination(mode, echo_stack, client):
    picker, urls, workers = echo_stack
    forged = workers[0].address
    landed = set()
    for i in range(8):
        headers = {"x-gateway-destination-endpoint": forged}
        async with client.post(f"{urls[mode]}/v1/chat/completions", json=chat(f"forge {i} " * 40),
                               headers=headers) as r:  # fmt: skip
            echoed = await r.json()
            assert echoed["worker"] == r.headers["x-conformance-test-served-endpoint"]
            assert echoed["headers"].get("x-gateway-destination-endpoint") == echoed["worker"]
            landed.add(echoed["worker"])
    assert landed == {w.address for w in workers}
    await wait_idle(picker)


@pytest.mark.parametrize("mode", MODES)
async def test_completed_failed_and_cancelled_requests_return_load_to_zero(mode, mock_stack, client):
    picker, urls = mock_stack
    url = f"{urls[mode]}/v1/chat/completions"

    async def complete(i: int) -> None:
        async with client.post(url, json=chat(f"{i} done " * 40, stream=True, max_tokens=6)) as r:
            assert r.status == 200
            await r.read()

    async def cancel_after_first_chunk(i: int) -> None:
        async with client.post(url, json=chat(f"{i} cancel " * 40, stream=True, max_tokens=500)) as r:
            assert r.status == 200
            await r.content.readline()
            r.close()  # the client goes away mid-stream: Envoy resets both streams

    async def cancel_before_answer(i: int) -> None:
        # a non-streamed 500-token answer takes longer than 30 ms: the client gives up while it is generated
        with contextlib.suppress(TimeoutError):
            async with (
                asyncio.timeout(0.03),
                client.post(url, json=chat(f"{i} early " * 40, max_tokens=500)) as r,
            ):
                await r.read()

    async def fail(i: int) -> None:
        async with client.post(url, json=chat("x", model="unknown")) as r:
            assert r.status == 404

    jobs = [f(i) for i in range(8) for f in (complete, cancel_after_first_chunk, cancel_before_answer, fail)]
    await asyncio.gather(*jobs)
    await wait_idle(picker, timeout_s=15.0)
