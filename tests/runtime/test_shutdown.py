"""Graceful shutdown of the picker process (`python -m extproc serve`) behind a real Envoy.

Envoy runs the "failopen" variant (failure_mode_allow, round robin over the workers when the
picker gives no destination): that is the documented deployment for restarts without errors.
With a fail-closed variant the requests that arrive while no picker listens get 503 instead.
The worker is an in-process echo worker whose server-sent events advance only when the test
releases them, so "a long response in flight" is a fact, not a timing guess.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
import pytest_asyncio
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.devstack.procs import ManagedProcess, port_is_open, reserve_port
from extproc.devstack.stack import MODEL

from ..e2e.harness import EchoWorker, EnvoyUnderTest, start_echo_workers, start_envoy_variant

pytestmark = pytest.mark.asyncio(loop_scope="module")

DESTINATION = "x-gateway-destination-endpoint"
BODY = json.dumps({"model": MODEL, "prompt": "drain me", "max_tokens": 4}).encode()
SSE_EVENTS = 3


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shutdown")


@pytest.fixture(scope="module")
def picker_port() -> Iterator[int]:
    # Every picker of this module listens here (Envoy's endpoint_picker cluster), one after the
    # other: the port is held for the module so no other process takes it between two pickers.
    with reserve_port() as reserved:
        yield reserved.port


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker() -> AsyncIterator[EchoWorker]:
    (echo,) = await start_echo_workers(1)
    yield echo
    await echo.stop()


@pytest.fixture(scope="module")
def envoy(worker: EchoWorker, picker_port: int, log_dir: Path) -> Iterator[EnvoyUnderTest]:
    started = start_envoy_variant(
        "failopen", picker_address=f"127.0.0.1:{picker_port}", workers=[worker.address], log_dir=log_dir
    )
    yield started
    started.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


class PickerProcess:
    """`python -m extproc serve` for the echo worker on `port`, with admin and health on ports it
    binds itself (port 0) and reports (`--ports-file`)."""

    def __init__(self, worker: EchoWorker, port: int, log_dir: Path, grace_s: float) -> None:
        config = log_dir / "picker.yaml"
        config.write_text(
            yaml.safe_dump({"workers": [{"id": "w0", "endpoint": worker.address, "model": MODEL}]})
        )
        self.port, self.health_port, self.admin_port = port, 0, 0
        name = f"picker-{uuid.uuid4().hex[:6]}"
        ports_file = log_dir / f"{name}.ports.json"
        argv = [
            sys.executable, "-m", "extproc", "serve", "--config", str(config), "--no-kv-events",
            "--port", str(port), "--health-port", "0", "--admin-port", "0", "--ports-file", str(ports_file),
            "--shutdown-grace-secs", str(grace_s),
        ]  # fmt: skip
        self.process = ManagedProcess(argv, log_path=log_dir / f"{name}.log", ports_file=ports_file)

    async def start(self) -> PickerProcess:
        self.process.start()
        ports = await asyncio.to_thread(self.process.ports, 30.0)  # written once every server listens
        self.health_port, self.admin_port = ports["health_port"], ports["admin_port"]
        assert ports["port"] == self.port
        return self

    def terminate(self) -> None:
        os.kill(self.process.pid, signal.SIGTERM)

    async def health(self, service: str) -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.health_port}") as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2
            )
        return answer.status

    async def readyz(self, client: aiohttp.ClientSession) -> int:
        async with client.get(f"http://127.0.0.1:{self.admin_port}/readyz") as response:
            return response.status

    async def exit_code(self, within_s: float) -> int:
        await until(lambda: not self.process.is_running(), within_s, "the picker exits")
        return self.process.returncode  # type: ignore[return-value]

    def log(self) -> str:
        return self.process.log_tail(20_000)


async def until(
    predicate: Callable[[], object], timeout_s: float, what: str, process: ManagedProcess | None = None
) -> None:
    """Poll `predicate` (which may be async) until it holds; fail after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if process is not None and not process.is_running():
            pytest.fail(f"{what}: the process exited with {process.returncode}\n{process.log_tail()}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"not true after {timeout_s} s: {what}" + (f"\n{process.log_tail()}" if process else "")
            )
        await asyncio.sleep(0.02)


async def post(client: aiohttp.ClientSession, envoy: EnvoyUnderTest) -> dict:
    async with client.post(envoy.url + "/v1/completions", data=BODY) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def read_event(response: aiohttp.ClientResponse) -> str:
    """The data of the next server-sent event, within 5 s."""

    async def read() -> str:
        data = []
        while (line := await response.content.readline()) not in (b"\n", b"\r\n"):
            if not line:
                raise EOFError("the stream ended inside an event")
            if line.startswith(b"data: "):
                data.append(line[6:].decode().rstrip("\r\n"))
        return "".join(data)

    return await asyncio.wait_for(read(), 5.0)


async def finish_stream(response: aiohttp.ClientResponse, worker: EchoWorker, key: str) -> list[str]:
    """Release the held events one by one; the events after the first, ending with [DONE]."""
    events = []
    for _ in range(SSE_EVENTS):
        worker.release(key)
        events.append(await read_event(response))
    return events


async def test_sigterm_drains_the_stream_in_flight_and_a_new_picker_routes_again(
    worker, envoy, client, picker_port, log_dir
):
    picker = await PickerProcess(worker, picker_port, log_dir, grace_s=20).start()
    try:
        assert (await post(client, envoy))["headers"][DESTINATION] == worker.address  # the picker routes
        key = uuid.uuid4().hex
        async with client.post(envoy.url + f"/sse?n={SSE_EVENTS}&key={key}", data=BODY) as stream:
            assert stream.status == 200
            assert json.loads(await read_event(stream))["index"] == 0  # in flight, held by the worker
            picker.terminate()
            # Not ready at once (kubelet and Envoy health checks stop sending), still alive.
            serving, not_serving = (
                health_pb2.HealthCheckResponse.SERVING,
                health_pb2.HealthCheckResponse.NOT_SERVING,
            )
            await until(lambda: _is(picker.health("readiness"), not_serving), 10, "readiness NOT_SERVING")
            assert await picker.health("liveness") == serving
            assert await picker.readyz(client) == 503
            # New ext_proc streams are refused: Envoy fails open and the worker still answers.
            await until(lambda: not port_is_open("127.0.0.1", picker_port), 10, "the ext_proc port closes")
            echoed = await post(client, envoy)
            assert DESTINATION not in echoed["headers"]
            assert picker.process.is_running()  # still draining the stream in flight
            events = await finish_stream(stream, worker, key)
        assert [json.loads(e)["index"] for e in events[:-1]] == list(range(1, SSE_EVENTS))
        assert events[-1] == "[DONE]"
        assert await picker.exit_code(within_s=20) == 0
        log = picker.log()
        assert "draining 1 ext_proc streams" in log and "all 1 in-flight ext_proc streams finished" in log
        assert "streams were in flight, 0 cancelled" in log and "streams cancelled" not in log
    finally:
        picker.process.stop()
    restarted = await PickerProcess(worker, picker_port, log_dir, grace_s=20).start()
    try:
        await until(lambda: _routed(client, envoy), 10, "requests are routed by the new picker")
        restarted.terminate()  # nothing in flight: it exits at once
        assert await restarted.exit_code(within_s=10) == 0
    finally:
        restarted.process.stop()


async def test_streams_still_open_after_the_grace_are_cancelled_and_envoy_carries_on(
    worker, envoy, client, picker_port, log_dir
):
    picker = await PickerProcess(worker, picker_port, log_dir, grace_s=1).start()
    try:
        await until(lambda: _routed(client, envoy), 10, "requests are routed by the picker")
        key = uuid.uuid4().hex
        async with client.post(envoy.url + f"/sse?n={SSE_EVENTS}&key={key}", data=BODY) as stream:
            assert json.loads(await read_event(stream))["index"] == 0
            started = time.monotonic()
            picker.terminate()
            assert await picker.exit_code(within_s=15) == 0
            assert time.monotonic() - started >= 1.0  # it waited the grace for the held stream
            # The picker is gone; with failure_mode_allow Envoy finishes the response without it.
            events = await finish_stream(stream, worker, key)
        assert events[-1] == "[DONE]"
        log = picker.log()
        assert "draining 1 ext_proc streams" in log
        assert "1 ext_proc streams cancelled after the 1 s grace" in log
        assert "stopped in" in log and "1 cancelled" in log
    finally:
        picker.process.stop()


async def _is(status: object, expected: int) -> bool:
    return await status == expected  # type: ignore[misc]


async def _routed(client: aiohttp.ClientSession, envoy: EnvoyUnderTest) -> bool:
    return DESTINATION in (await post(client, envoy))["headers"]
