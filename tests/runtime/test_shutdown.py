"""Graceful shutdown of the picker process (`python -m extproc serve`) behind a real Envoy.

Envoy runs the "failopen" variant (failure_mode_allow, round robin over the workers when the
picker gives no destination): that is the documented deployment for restarts without errors.
With a fail-closed variant the requests that arrive while no picker listens get 503 instead.
The worker is an in-process echo worker whose server-sent events advance only when the test
releases them, so "a long response in flight" is a fact, not a timing guess.
"""

from __future__ import annotations

import asyncio
import http.client
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
    binds itself (port 0) and reports (`--ports-file`), or on the `side_ports` given (health, admin
    and router-group API, in that order)."""

    def __init__(
        self,
        worker: EchoWorker,
        port: int,
        log_dir: Path,
        grace_s: float,
        side_ports: tuple[int, int, int] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        config = log_dir / "picker.yaml"
        config.write_text(
            yaml.safe_dump({"workers": [{"id": "w0", "endpoint": worker.address, "model": MODEL}]})
        )
        health, admin, group_api = side_ports or (0, 0, None)
        self.port, self.health_port, self.admin_port, self.group_api_port = port, health, admin, group_api
        name = f"picker-{uuid.uuid4().hex[:6]}"
        ports_file = log_dir / f"{name}.ports.json"
        argv = [
            sys.executable, "-m", "extproc", "serve", "--config", str(config), "--no-kv-events",
            "--port", str(port), "--health-port", str(health), "--admin-port", str(admin),
            "--ports-file", str(ports_file), "--shutdown-grace-secs", str(grace_s),
            "--shutdown-delay-secs", str(delay_s),
        ]  # fmt: skip
        if group_api is not None:
            argv += ["--group-api-port", str(group_api)]
        self.process = ManagedProcess(argv, log_path=log_dir / f"{name}.log", ports_file=ports_file)

    async def start(self) -> PickerProcess:
        self.process.start()
        ports = await asyncio.to_thread(self.process.ports, 30.0)  # written once every server listens
        for name, asked in (("health_port", self.health_port), ("admin_port", self.admin_port)):
            assert asked in (0, ports[name]), ports
        self.health_port, self.admin_port = ports["health_port"], ports["admin_port"]
        assert ports["port"] == self.port and ports.get("group_api_port") == self.group_api_port
        return self

    @property
    def listening(self) -> dict[str, bool]:
        """Which of its ports accept connections right now."""
        ports = {"ext_proc": self.port, "health": self.health_port, "admin": self.admin_port}
        if self.group_api_port is not None:
            ports["group_api"] = self.group_api_port
        return {name: port_is_open("127.0.0.1", port) for name, port in ports.items()}

    def terminate(self) -> None:
        os.kill(self.process.pid, signal.SIGTERM)

    async def health(self, service: str) -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.health_port}") as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2
            )
        return answer.status

    async def exit_code(self, within_s: float) -> int:
        await until(lambda: not self.process.is_running(), within_s, "the picker exits")
        return self.process.returncode  # type: ignore[return-value]

    def log(self) -> str:
        return self.process.log_tail(20_000)


class AdminConnection:
    """One keep-alive HTTP/1.1 connection to an admin port: http.client sends every request on the
    same socket, and fails rather than open another once the server has closed it."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

    def __enter__(self) -> AdminConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.connection.close()

    def get(self, path: str) -> tuple[int, bytes]:
        self.connection.request("GET", path)
        response = self.connection.getresponse()
        return response.status, response.read()


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
            assert await picker.health("readiness") == health_pb2.HealthCheckResponse.SERVING
            with AdminConnection(picker.admin_port) as admin:  # open before the signal, kept alive
                assert admin.get("/readyz")[0] == 200
                picker.terminate()
                # Every port closes at once (a probe is refused: not ready), the process lives on;
                # an admin connection already open is still answered: not ready.
                await until(lambda: not any(picker.listening.values()), 10, "every port closes")
                assert admin.get("/readyz")[0] == 503
                assert admin.get("/metrics")[0] == 200
            # New ext_proc streams are refused: Envoy fails open and the worker still answers.
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


async def test_a_replacement_started_during_the_drain_binds_every_port_and_routes(
    worker, envoy, client, picker_port, log_dir
):
    """A picker restarted on the same host (a supervisor, the soak) starts while the old one still
    drains a stream: the old one freed its ext_proc, router-group API, health and admin ports at
    once. Before, the new one failed to bind the health port and exited."""
    with reserve_port() as health, reserve_port() as admin, reserve_port() as group_api:
        side_ports = (health.port, admin.port, group_api.port)
        old = await PickerProcess(worker, picker_port, log_dir, grace_s=20, side_ports=side_ports).start()
        new: PickerProcess | None = None
        try:
            await until(lambda: _routed(client, envoy), 10, "requests are routed by the old picker")
            key = uuid.uuid4().hex
            async with client.post(envoy.url + f"/sse?n={SSE_EVENTS}&key={key}", data=BODY) as stream:
                assert json.loads(await read_event(stream))["index"] == 0  # in flight on the old one
                old.terminate()
                await until(lambda: not any(old.listening.values()), 10, "the old picker's ports close")
                new = PickerProcess(worker, picker_port, log_dir, grace_s=20, side_ports=side_ports)
                await new.start()
                assert old.process.is_running()  # still draining
                assert all(new.listening.values()), new.listening
                assert await new.health("readiness") == health_pb2.HealthCheckResponse.SERVING
                await until(lambda: _routed(client, envoy), 10, "requests are routed by the new picker")
                with AdminConnection(new.admin_port) as admin:
                    assert admin.get("/readyz")[0] == 200
                events = await finish_stream(stream, worker, key)
            assert events[-1] == "[DONE]"
            assert await old.exit_code(within_s=20) == 0
            assert "all 1 in-flight ext_proc streams finished" in old.log()
            assert new.process.is_running() and all(new.listening.values())  # the old exit took nothing
        finally:
            old.process.stop()
            if new is not None:
                new.process.stop()


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


async def test_with_a_shutdown_delay_new_streams_are_routed_while_not_ready_then_refused(
    worker, envoy, client, picker_port, log_dir
):
    """`--shutdown-delay-secs`: after SIGTERM the picker says not ready at once but routes what still
    arrives for that long (the gateway takes it out meanwhile), then closes its ports and drains."""
    delay_s = 5.0
    picker = await PickerProcess(worker, picker_port, log_dir, grace_s=20, delay_s=delay_s).start()
    try:
        await until(lambda: _routed(client, envoy), 10, "requests are routed by the picker")
        signalled = time.monotonic()
        picker.terminate()
        await until(lambda: _not_ready(picker), 5, "readiness turns NOT_SERVING", picker.process)
        # Within the delay: not ready (gRPC health, /readyz), every port open, new streams routed.
        assert all(picker.listening.values()), picker.listening
        with AdminConnection(picker.admin_port) as admin:
            assert admin.get("/readyz")[0] == 503
        for _ in range(3):
            assert (await post(client, envoy))["headers"][DESTINATION] == worker.address
        assert time.monotonic() - signalled < delay_s, "checked after the delay: nothing above was tested"
        # Then the ports close (new streams refused: Envoy fails open) and it exits.
        await until(lambda: not any(picker.listening.values()), delay_s + 10, "every port closes")
        assert time.monotonic() - signalled >= delay_s
        assert DESTINATION not in (await post(client, envoy))["headers"]
        assert await picker.exit_code(within_s=15) == 0
        assert "still routing new ext_proc streams for 5.0 s (--shutdown-delay-secs)" in picker.log()
    finally:
        picker.process.stop()


async def test_a_second_signal_cuts_the_shutdown_delay_short(worker, envoy, client, picker_port, log_dir):
    picker = await PickerProcess(worker, picker_port, log_dir, grace_s=20, delay_s=60).start()
    try:
        await until(lambda: _routed(client, envoy), 10, "requests are routed by the picker")
        picker.terminate()
        await until(lambda: _not_ready(picker), 5, "readiness turns NOT_SERVING", picker.process)
        assert all(picker.listening.values())  # in the 60 s delay
        picker.terminate()
        assert await picker.exit_code(within_s=15) == 0  # not the 60 s
        assert "second signal: the shutdown delay is cut short" in picker.log()
    finally:
        picker.process.stop()


async def _not_ready(picker: PickerProcess) -> bool:
    return await picker.health("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING


async def _routed(client: aiohttp.ClientSession, envoy: EnvoyUnderTest) -> bool:
    return DESTINATION in (await post(client, envoy))["headers"]
