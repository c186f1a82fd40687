"""Router groups as child processes (`python -m extproc serve --group-api-port`), used from this
process by a selector exactly as a top-level picker does; a group restarts on the same port (held by
this module with `reserve_port`, so nobody takes it while the group is down)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.devstack.groups import launch_group_picker, wait_until_serving
from extproc.devstack.procs import ManagedProcess, reserve_port
from extproc.groups import GroupSelector, RemoteGroup
from extproc.groups.errors import UNREACHABLE

from .builders import BLOCK, prompt, request


def launch_group(name: str, subnet: int, api_port: int, log_dir: Path) -> ManagedProcess:
    """A picker over two workers that are never contacted, serving its routers on `api_port`."""
    workers = [(f"{name}{i}", f"127.0.{subnet}.{i + 1}:8000") for i in range(2)]
    return launch_group_picker(  # Dynamo's cost: the loads below are counted in tokens
        name,
        workers,
        log_dir,
        api_port=api_port,
        block_size=BLOCK,
        args=("--router-prefill-load-model", "none"),
    )


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("group-processes")


@pytest.fixture(scope="module")
def groups(log_dir: Path) -> Iterator[dict[str, tuple[ManagedProcess, int]]]:
    """Groups a (127.0.1.x) and b (127.0.2.x), started together; a test that restarts a leaves it
    running, and every test leaves both idle."""
    started: dict[str, tuple[ManagedProcess, int]] = {}
    reserved = [reserve_port(), reserve_port()]
    try:
        for (subnet, name), port in zip(enumerate(("a", "b"), start=1), reserved, strict=True):
            started[name] = (launch_group(name, subnet, port.port, log_dir), port.port)
        for process, port in started.values():
            assert wait_until_serving(process) == port
        yield started
    finally:
        for process, _ in started.values():
            process.stop(grace_s=2.0)
        for port in reserved:
            port.release()


def selector(groups: dict[str, tuple[ManagedProcess, int]], **kwargs) -> GroupSelector:
    remotes = [RemoteGroup(name, f"127.0.0.1:{port}") for name, (_, port) in groups.items()]
    return GroupSelector(remotes, probe_timeout_s=0.5, **kwargs)


async def test_routing_and_lifecycle_against_group_processes(groups):
    sel = selector(groups)
    try:
        first = await sel.route(request(prompt(1)), "r1")
        owner = next(g for g in sel.groups if g.name == first.group)
        loads = await owner.potential_loads(request(prompt(1)))
        assert loads.load.active_requests == 1 and loads.load.active_prefill_tokens == 160
        sel.first_token("r1")
        await sel.drain()
        assert (await owner.potential_loads(request(prompt(1)))).load.active_prefill_tokens == 0
        second = await sel.route(request(prompt(1) + prompt(2)), "r2")
        assert (second.group, second.choice.worker, second.choice.overlap_blocks) == (
            first.group,
            first.choice.worker,
            10,
        )
        sel.finish("r1", "complete")
        sel.finish("r2", "cancelled")
        await sel.drain()
        for group in sel.groups:
            assert (await group.potential_loads(request(prompt(1)))).load.active_requests == 0
    finally:
        await sel.close()


async def test_a_restarted_group_is_used_again(groups, log_dir):
    # prompts of its own: what it routes stays cached in the groups the other tests share
    sel = selector(groups, eject_after=1, eject_s=0.2)
    process, port = groups["a"]
    routed: list[str] = []
    try:
        process.stop(grace_s=2.0)
        for i in range(3):
            routed.append(f"down-{i}")
            assert (await sel.route(request(prompt(500 + i)), routed[-1])).group == "b"
        assert sel.metrics.groups["a"].probe_failures[UNREACHABLE] >= 1
        groups["a"] = (launch_group("a", 1, port, log_dir), port)
        wait_until_serving(groups["a"][0])
        deadline = time.monotonic() + 10  # the channel reconnects with a backoff of at most 2 s
        i = 0
        while True:
            i += 1
            routed.append(f"up-{i}")
            decision = await sel.route(request(prompt(600 + i)), routed[-1])
            if decision.group == "a":
                break
            assert time.monotonic() < deadline, "the restarted group was never chosen again"
            await asyncio.sleep(0.05)
        assert not sel.metrics.groups["a"].ejected
    finally:
        for request_id in routed:  # the groups are shared with the other tests: leave them idle
            sel.finish(request_id, "complete")
        await sel.close()
    for name in groups:
        remote = RemoteGroup(name, f"127.0.0.1:{groups[name][1]}")
        try:
            assert (await remote.potential_loads(request(prompt(1)))).load.active_requests == 0
        finally:
            await remote.close()
