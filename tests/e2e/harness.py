"""End-to-end helpers: echo workers, the no-op picker and Envoy, in-process or as child processes.

Everything listens on 127.0.0.1 on ports its server binds itself (port 0) and reports: in-process
servers read the port back from their socket, child processes write it to a --ports-file. Child
processes are stopped by pid. In-process servers run in the caller's event loop.

Run a worker on its own: `python tests/e2e/harness.py worker --port 8001`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import itertools
import json
import re
import signal
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.config import EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import PickerHealth, Variant, render_envoy_config
from extproc.devstack.procs import EnvoyProcess, ManagedProcess, find_envoy, start_envoy
from extproc.devstack.stack import MODEL, WorkerProcess
from extproc.router import RouterConfig
from extproc.runtime.ports_file import write_ports_file
from extproc.runtime.server import RunningPicker, start_picker

REPO_ROOT = Path(__file__).resolve().parents[2]
NOOP_PICKER_PATH = REPO_ROOT / "benchmarks" / "noop_picker.py"
GATE_TIMEOUT_S = 10.0  # bound on how long a lock-step SSE worker waits for the test
_envoy_ids = itertools.count(1)


class EchoWorker:
    """A tiny upstream: answers with what it received, or streams server-sent events.

    Any path: JSON {worker, method, path, headers, body_len, body_sha256}; with `?hold=K` the answer
    waits for `release(K)` (a request the test keeps in prefill: no response byte yet), at most
    `hold_timeout_s`; `holding` names the requests waiting so.
    `/sse?n=N`: N events `data: {"worker": ..., "index": i}` then `data: [DONE]`. With `&key=K`
    it sends event i+1 only after `release(K)` (lock-step, so a test can prove that chunks pass
    one by one); with `&interval_ms=M` it paces events instead (for child-process workers).

    `models`, when set: the body of its `GET /v1/models` (an engine's recorded model list);
    `received`, the last 32 request bodies it read.
    Port 0 (the default) binds a free port at `start`; `port` and `address` are known from then on.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, hold_timeout_s: float = GATE_TIMEOUT_S
    ) -> None:
        self.host = host
        self.port = port
        self.hold_timeout_s = hold_timeout_s
        self.holding: set[str] = set()
        self.models: bytes | None = None
        self.received: deque[bytes] = deque(maxlen=32)  # the last request bodies, as they arrived
        self._gates: dict[str, asyncio.Queue[None]] = {}
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def release(self, key: str) -> None:
        """Let the lock-step SSE stream `key` send its next event."""
        self._gate(key).put_nowait(None)

    def _gate(self, key: str) -> asyncio.Queue[None]:
        return self._gates.setdefault(key, asyncio.Queue())

    async def start(self) -> EchoWorker:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/sse", self._sse)
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append(body)
        if self.models is not None and request.method == "GET" and request.path == "/v1/models":
            return web.Response(body=self.models, content_type="application/json")
        hold = request.query.get("hold")
        if hold is not None:
            self.holding.add(hold)
            try:
                await asyncio.wait_for(self._gate(hold).get(), self.hold_timeout_s)
            finally:
                self.holding.discard(hold)
                self._gates.pop(hold, None)
        return web.json_response(
            {
                "worker": self.address,
                "method": request.method,
                "path": request.path_qs,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body_len": len(body),
                "body_sha256": hashlib.sha256(body).hexdigest(),
            }
        )

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        count = int(request.query.get("n", "3"))
        key = request.query.get("key")
        interval_s = int(request.query.get("interval_ms", "0")) / 1000
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            for index in range(count):
                event = {"worker": self.address, "index": index}
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
                if key is not None:
                    await asyncio.wait_for(self._gate(key).get(), GATE_TIMEOUT_S)
                elif interval_s:
                    await asyncio.sleep(interval_s)  # pacing the stream, not synchronisation
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        finally:
            if key is not None:
                self._gates.pop(key, None)
        return response


@cache
def envoy_version() -> tuple[int, int]:
    """(major, minor) of the Envoy these tests start: 1.40 from the project's extras; another one first
    on PATH runs the suite against it (extproc/devstack/envoy/README.md, "Envoy versions"), and the few
    tests whose answer differs by version expect that version's."""
    out = subprocess.run([find_envoy(), "--version"], capture_output=True, text=True, timeout=60, check=True)
    found = re.search(r"/(\d+)\.(\d+)\.\d+/", out.stdout)
    assert found is not None, out.stdout
    return int(found.group(1)), int(found.group(2))


async def start_echo_workers(count: int) -> list[EchoWorker]:
    """`count` in-process echo workers on free ports, started in the running loop."""
    return [await EchoWorker().start() for _ in range(count)]


def start_reporting(argv: Sequence[str], log_path: Path, ready_timeout_s: float) -> ManagedProcess:
    """Start `argv` + `--ports-file <log_path>.ports.json` and return once the child reported the
    port it bound (`.ports()["port"]`); stopped if it never does."""
    ports_file = log_path.with_suffix(".ports.json")
    process = ManagedProcess(
        [*argv, "--ports-file", str(ports_file)], log_path=log_path, ports_file=ports_file
    )
    process.start()
    try:
        process.ports(ready_timeout_s)
    except BaseException:
        process.stop(grace_s=2.0)
        raise
    return process


def start_echo_worker_process(*, log_path: Path, ready_timeout_s: float = 15.0) -> ManagedProcess:
    """An echo worker as a child process (this file run as a script) on a port it picks; returns
    once it listens, with that port in `.ports()["port"]`."""
    argv = [sys.executable, str(Path(__file__).resolve()), "worker", "--port", "0"]
    return start_reporting(argv, log_path, ready_timeout_s)


def load_noop_picker() -> ModuleType:
    """benchmarks/noop_picker.py as a module (benchmarks/ is not a package)."""
    module = sys.modules.get("noop_picker")
    if module is None:
        spec = importlib.util.spec_from_file_location("noop_picker", NOOP_PICKER_PATH)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {NOOP_PICKER_PATH}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["noop_picker"] = module
        spec.loader.exec_module(module)
    return module


@dataclass
class InProcessPicker:
    """The no-op picker running in this event loop; `servicer` records headers and picks."""

    server: Any  # grpc.aio.Server
    servicer: Any  # noop_picker.NoopPicker
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace_s: float = 0.5) -> None:
        await self.server.stop(grace_s)


async def start_noop_picker(workers: Sequence[str], *, record: bool = True) -> InProcessPicker:
    """The no-op picker in the running event loop on a free port."""
    noop = load_noop_picker()
    servicer = noop.NoopPicker(list(workers), record=record)
    server, port = await noop.serve_noop_picker(0, workers, picker=servicer)
    return InProcessPicker(server=server, servicer=servicer, port=port)


class _StalledServicer(pb_grpc.ExternalProcessorServicer):
    """An ext_proc servicer that reads every message and never answers (a hung picker)."""

    async def Process(self, request_iterator: Any, context: Any) -> None:
        async for _ in request_iterator:
            pass


async def start_stalled_picker() -> InProcessPicker:
    """A picker that accepts streams but never answers, in the running loop on a free port."""
    servicer = _StalledServicer()
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return InProcessPicker(server=server, servicer=servicer, port=port)


def start_noop_picker_process(
    workers: Sequence[str], *, log_path: Path, ready_timeout_s: float = 15.0
) -> ManagedProcess:
    """The no-op picker as a child process (its command line) on a port it picks; returns once it
    listens, with that port in `.ports()["port"]`."""
    argv = [sys.executable, str(NOOP_PICKER_PATH), "--port", "0", "--workers", ",".join(workers)]
    return start_reporting(argv, log_path, ready_timeout_s)


@dataclass
class EnvoyUnderTest:
    variant: Variant
    process: EnvoyProcess

    @property
    def listen_port(self) -> int:
        return self.process.listen_port

    @property
    def admin_port(self) -> int:
        return self.process.admin_port

    @property
    def url(self) -> str:
        return self.process.url

    def stop(self) -> None:
        self.process.stop(grace_s=3.0)


def start_envoy_variant(
    variant: Variant, *, picker_address: str, workers: Sequence[str], log_dir: Path, **render_args: Any
) -> EnvoyUnderTest:
    """Render `variant` with port 0 listeners and run Envoy with it until /ready says LIVE (it
    binds free ports; `start_envoy` reads them back)."""
    config = render_envoy_config(variant, picker_address=picker_address, workers=workers, **render_args)
    log_path = log_dir / f"envoy-{variant}-{next(_envoy_ids)}.log"
    return EnvoyUnderTest(variant=variant, process=start_envoy(config, log_path=log_path))


@asynccontextmanager
async def picker_behind_envoy(
    workers: Sequence[WorkerProcess], router: RouterConfig, log_dir: Path, *, kv_events: bool = False
) -> AsyncIterator[tuple[RunningPicker, EnvoyProcess]]:
    """The picker in this event loop for mock `workers` of `MODEL` (free ports, its admin API on;
    with `kv_events`, subscribed to the workers' ZMQ KV events) behind a real Envoy (`buffered`, a
    child process). Both stopped on exit."""
    config = PickerConfig(
        router=router,
        workers=tuple(
            WorkerConfig(w.worker_id, w.endpoint, MODEL, kv_events=w.kv_events, kv_replay=w.kv_replay)
            if kv_events
            else WorkerConfig(w.worker_id, w.endpoint, MODEL)
            for w in workers
        ),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        admin_port=0,
        events=EventsConfig(),
        kv_events_source=kv_events,
    )
    async with behind_envoy(config, log_dir, workers=[w.endpoint for w in workers]) as running:
        yield running


@asynccontextmanager
async def behind_envoy(
    config: PickerConfig, log_dir: Path, variant: Variant = "buffered", **envoy: Any
) -> AsyncIterator[tuple[RunningPicker, EnvoyProcess]]:
    """The picker of `config` in this event loop behind a real Envoy (template `variant`, a child
    process; `envoy`: more of `render_envoy_config`'s arguments). Both stopped on exit."""
    picker = await start_picker(config)
    try:
        yaml = render_envoy_config(variant, picker_address=f"127.0.0.1:{picker.port}", **envoy)
        process = start_envoy(yaml, log_path=log_dir / f"envoy-{next(_envoy_ids)}.log")
        try:
            yield picker, process
        finally:
            process.stop()
    finally:
        await picker.stop(0)


@contextmanager
def serve_replicas(
    worker: EchoWorker, model: str, log_dir: Path, count: int, *flags: str
) -> Iterator[list[ManagedProcess]]:
    """`count` `python -m extproc serve` replicas for `worker` (static config, no KV events), each
    on free ports it reports (ext_proc and health), logging to `replica-<i>.log`; `flags` go to
    each. Stopped by pid on exit."""
    workers = [{"id": "w0", "endpoint": worker.address, "model": model}]
    with serve_replicas_of(workers, log_dir, count, *flags) as started:
        yield started


@contextmanager
def serve_replicas_of(
    workers: Sequence[Mapping[str, str]],
    log_dir: Path,
    count: int,
    *flags: str,
    replica_flags: Callable[[int], Sequence[str]] = lambda index: (),
) -> Iterator[list[ManagedProcess]]:
    """`serve_replicas` for a config file listing `workers` ({id, endpoint, model}); replica `index`
    also gets `replica_flags(index)` (its own --router-id, say)."""
    config = log_dir / "picker.yaml"
    config.write_text(json.dumps({"workers": list(workers)}))
    started: list[ManagedProcess] = []
    try:
        for index in range(count):
            ports = log_dir / f"replica-{index}.ports.json"
            argv = [
                sys.executable, "-m", "extproc", "serve", "--config", str(config), "--no-kv-events",
                "--port", "0", "--health-port", "0", "--ports-file", str(ports), *flags,
                *replica_flags(index),
            ]  # fmt: skip
            started.append(ManagedProcess(argv, log_path=log_dir / f"replica-{index}.log", ports_file=ports))
            started[-1].start()
        for replica in started:
            replica.ports(30.0)
        yield started
    finally:
        for replica in started:
            replica.stop()


def start_envoy_over_replicas(
    replicas: Sequence[ManagedProcess], health: PickerHealth, log_dir: Path
) -> EnvoyUnderTest:
    """The `buffered` variant whose endpoint_picker cluster lists `replicas` (ext_proc and health
    ports as each reported them), with `health`'s checks, outlier detection and retry."""
    return start_envoy_variant(
        "buffered",
        picker_address=[f"127.0.0.1:{r.ports()['port']}" for r in replicas],
        picker_health_port=[r.ports()["health_port"] for r in replicas],
        picker_health=health,
        workers=[],
        log_dir=log_dir,
    )


async def _serve_worker(port: int, ports_file: str | None) -> None:
    worker = await EchoWorker(port=port).start()
    if ports_file:
        write_ports_file(ports_file, {"port": worker.port})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await worker.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="end-to-end test helpers")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run an echo worker until SIGTERM")
    worker.add_argument("--port", type=int, required=True, help="0 picks a free port")
    worker.add_argument("--ports-file", help='once listening, write {"port": N} here')
    args = parser.parse_args(argv)
    if args.command == "worker":
        asyncio.run(_serve_worker(args.port, args.ports_file))


if __name__ == "__main__":
    main()
