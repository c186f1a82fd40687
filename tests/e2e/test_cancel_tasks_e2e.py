"""A client that leaves mid-decision leaves no task behind, through a real Envoy 1.40 (issue 19).

Issue 19 saw "Task was destroyed but it is pending!" when queued clients left (that case is in
test_picker_bounds_e2e.py). Here are the other places a client can leave while the picker is
still deciding, each with a picker in this event loop so the test can see its tasks:

- while its body is parsed in a parse worker (the worker stopped with SIGSTOP): the call to the
  worker runs to its end by design (the worker's answer must be read before it takes another
  body), then nothing is left and the worker parses the next body;
- while a router group is probed (a remote group that never answers, a 30 s probe deadline);
- while a remote group commits it (its Commit held after the group tracked the request): the
  group frees it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
import pytest_asyncio

from extproc.config import GroupConfig, GroupsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import EnvoyProcess, start_envoy
from extproc.devstack.stack import MODEL
from extproc.groups._generated import router_group_pb2_grpc as group_grpc
from extproc.groups.servicer import RouterGroupServicer
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from .harness import EchoWorker, start_echo_workers
from .tasks import destroyed_pending, new_tasks_left, running_tasks

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = aiohttp.ClientTimeout(total=30)
PROBE_TIMEOUT_S = 30.0  # far longer than the test waits: a probe left running shows


def chat(text: str) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def status_of(url: str, body: dict) -> int:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.post(f"{url}/v1/chat/completions", json=body) as r,
    ):
        await r.read()
        return r.status


async def leave_when(url: str, body: dict, ready: Callable[[], bool], what: str) -> None:
    """Send `body`, and close the connection once `ready()` (the request is where the test wants it)."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def post() -> int:
            async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
                return r.status

        leaving = asyncio.ensure_future(post())
        try:
            await until(ready, what)
        finally:
            leaving.cancel()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cancel-tasks-e2e")


# --- a body in a parse worker ---------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def parsing(log_dir) -> AsyncIterator[tuple[RunningPicker, str]]:
    workers = await start_echo_workers(1)
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=(WorkerConfig("w0", workers[0].address, MODEL),),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        seed=3,
        body_parse_workers=1,
        body_parse_inline_bytes=1024,
    )
    picker = await start_picker(config)
    envoy = start_envoy(
        render_envoy_config("buffered", picker_address=f"127.0.0.1:{picker.port}"),
        log_path=log_dir / "envoy-parse.log",
    )
    try:
        yield picker, envoy.url
    finally:
        envoy.stop()
        await picker.stop(0)
        await workers[0].stop()


async def test_a_client_that_leaves_while_its_body_is_parsed_leaves_nothing_behind(parsing, caplog) -> None:
    running, url = parsing
    bodies = running.picker.bodies
    assert await status_of(url, chat("warm " * 400)) == 200  # the parse worker is running
    [pid] = bodies.worker_pids()
    before = running_tasks()
    with destroyed_pending(caplog) as destroyed:
        os.kill(pid, signal.SIGSTOP)
        try:
            calls = bodies._calls  # the calls to parse workers in flight
            await leave_when(url, chat("slow " * 400), lambda: len(calls) == 1, "not sent to the worker")
            await until(lambda: running.service.open_streams == 0, "the stream stayed open")
            assert len(calls) == 1  # the call runs to its end: the worker's answer must be read
        finally:
            os.kill(pid, signal.SIGCONT)
        left = await new_tasks_left(before)
    assert not left and not destroyed, (left, destroyed)
    assert bodies.worker_pids() == [pid] and bodies.stats.workers_lost == 0
    assert await status_of(url, chat("next " * 400)) == 200  # the same worker parses the next body
    assert bodies.worker_pids() == [pid]
    await until(running.picker.is_idle, "load was left behind")


# --- router groups --------------------------------------------------------------------------------


class HeldGroupServicer(RouterGroupServicer):
    """A group's API whose Probe or Commit (after the group tracked the request) waits for `release`."""

    def __init__(self, group, *, hold_probe: bool = False, hold_commit: bool = False) -> None:
        super().__init__(group)
        self.hold_probe = hold_probe
        self.hold_commit = hold_commit
        self.release = asyncio.Event()
        self.held = 0  # calls waiting now

    async def _hold(self) -> None:
        self.held += 1
        try:
            await self.release.wait()
        finally:
            self.held -= 1

    async def Probe(self, request, context):
        if self.hold_probe:
            await self._hold()
        return await super().Probe(request, context)

    async def Commit(self, request, context):
        answer = await super().Commit(request, context)
        if self.hold_commit:
            await self._hold()
        return answer


@dataclass
class Group:
    picker: EndpointPicker
    servicer: HeldGroupServicer
    server: grpc.aio.Server
    port: int


@dataclass
class Hierarchy:
    top: RunningPicker
    groups: list[Group]
    envoy: EnvoyProcess
    workers: list[EchoWorker] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.envoy.url


async def serve_group(name: str, address: str, **hold: bool) -> Group:
    picker = EndpointPicker(
        PickerConfig(
            router=RouterConfig(block_size=16, use_kv_events=False),
            workers=(WorkerConfig(f"{name}0", address, MODEL),),
            models=(ModelConfig(MODEL),),
            seed=5,
        )
    )
    servicer = HeldGroupServicer(picker.local, **hold)
    server = grpc.aio.server()
    group_grpc.add_RouterGroupServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return Group(picker, servicer, server, port)


async def start_hierarchy(log_dir: Path, name: str, **hold: bool) -> Hierarchy:
    """Two remote groups over one echo worker each, the first held as `hold` says; a top-level picker
    over them (in this loop) and an Envoy in front."""
    workers = await start_echo_workers(2)
    groups = [
        await serve_group("held", workers[0].address, **hold),
        await serve_group("free", workers[1].address),
    ]
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=(),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        seed=3,
        groups=GroupsConfig(
            groups=tuple(GroupConfig(f"g{i}", f"127.0.0.1:{g.port}") for i, g in enumerate(groups)),
            probe_timeout_s=PROBE_TIMEOUT_S,
        ),
    )
    top = await start_picker(config)
    yaml = render_envoy_config("buffered", picker_address=f"127.0.0.1:{top.port}")
    envoy = start_envoy(yaml, log_path=log_dir / f"envoy-{name}.log")
    return Hierarchy(top, groups, envoy, workers)


async def stop_hierarchy(stack: Hierarchy) -> None:
    stack.envoy.stop()
    for group in stack.groups:
        group.servicer.release.set()
    await stack.top.stop(0)
    for group in stack.groups:
        await group.server.stop(0)
        await group.picker.close()
    for worker in stack.workers:
        await worker.stop()


async def test_a_client_that_leaves_while_groups_are_probed_leaves_no_probe_behind(log_dir, caplog) -> None:
    """The probe of a group that does not answer is cancelled with the stream that waited for it,
    not left running (holding its gRPC call) until the 30 s probe deadline."""
    stack = await start_hierarchy(log_dir, "probe", hold_probe=True)
    try:
        held = stack.groups[0].servicer
        before = running_tasks()
        with destroyed_pending(caplog) as destroyed:
            await leave_when(stack.url, chat("probe " * 30), lambda: held.held == 1, "the probe was not held")
            await until(lambda: stack.top.service.open_streams == 0, "the stream stayed open")
            left = await new_tasks_left(before)
        assert not left and not destroyed, (left, destroyed)
        assert held.held == 0  # the group saw its probe cancelled
        assert stack.top.picker.is_idle()
    finally:
        await stop_hierarchy(stack)


async def test_a_client_that_leaves_while_a_group_commits_is_freed_there(log_dir, caplog) -> None:
    """The group tracked the request before its Commit answer was held; the client leaves: the
    top-level picker frees it in the group (in the background, acknowledged) and nothing is left."""
    stack = await start_hierarchy(log_dir, "commit", hold_commit=True)
    try:
        stack.groups[1].servicer.hold_commit = True  # whichever group the request goes to holds it
        servicers = [g.servicer for g in stack.groups]
        before = running_tasks()
        with destroyed_pending(caplog) as destroyed:
            await leave_when(
                stack.url,
                chat("commit " * 30),
                lambda: sum(s.held for s in servicers) == 1,
                "the commit was not held",
            )
            await until(lambda: stack.top.service.open_streams == 0, "the stream stayed open")
            await until(lambda: all(g.picker.is_idle() for g in stack.groups), "a group kept the request")
            left = await new_tasks_left(before)
        assert not left and not destroyed, (left, destroyed)
        assert sum(s.held for s in servicers) == 0  # the group saw its commit cancelled
        assert stack.top.picker.is_idle()
        for servicer in servicers:
            servicer.hold_commit = False
        assert await status_of(stack.url, chat("next " * 30)) == 200  # routing carries on
        await until(stack.top.picker.is_idle, "load was left behind")
    finally:
        await stop_hierarchy(stack)
