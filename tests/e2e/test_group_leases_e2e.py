"""Router-group leases through real processes: Envoy, a top-level picker and two groups (each a
`serve --group-api-port` child process over mock workers), stopped by pid.

- A group paused (SIGSTOP) while its requests' streams end misses their Free calls; once it
  resumes, the top-level picker's retries and its lease renewal free them: no load is left.
- A top-level picker killed (SIGKILL) with requests in flight never frees them; every group frees
  them once the picker's lease (`--group-lease-secs`, 2 s here) runs out.
Requests are streams held open by the client (a long generation), so they are in flight when the
fault comes; conditions are polled with a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from extproc.devstack.groups import GroupProcess, Hierarchy, start_hierarchy
from extproc.devstack.stack import MODEL
from extproc.groups import GroupRequest, RemoteGroup

pytestmark = pytest.mark.asyncio(loop_scope="module")

LEASE_S = 2.0
STREAMS = 6


@pytest.fixture  # each test its own: one of them kills the top-level picker
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hierarchy]:
    started = start_hierarchy(
        tmp_path_factory.mktemp("group-leases"),
        groups=("east", "west"),
        workers_per_group=2,
        speedup=1.0,  # real-time generation: a 2,000-token answer streams for many seconds
        kv_events=False,
        probe_timeout_ms=1000.0,
        top_args=["--group-lease-secs", str(LEASE_S)],
    )
    yield started
    started.stop()


async def in_flight(group: GroupProcess) -> int:
    remote = RemoteGroup(group.name, group.address)
    try:
        return (await remote.potential_loads(GroupRequest(MODEL, [1]))).load.active_requests
    finally:
        await remote.close()


async def loads(stack: Hierarchy) -> dict[str, int]:
    return {g.name: await in_flight(g) for g in stack.groups}


async def until(condition, what: str, timeout_s: float) -> float:
    """Poll the async `condition` (bounded); returns the seconds it took."""
    start = time.monotonic()
    while not await condition():
        assert time.monotonic() - start < timeout_s, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


@contextlib.asynccontextmanager
async def open_streams(stack: Hierarchy, n: int, tag: str) -> AsyncIterator[list[aiohttp.ClientResponse]]:
    """`n` streaming chat requests through Envoy, each read up to its first chunk and held open."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    responses: list[aiohttp.ClientResponse] = []
    try:
        for i in range(n):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"{tag} conversation {i} " * 30}],
                "max_tokens": 2000,
                "stream": True,
            }
            r = await session.post(f"{stack.url}/v1/chat/completions", json=body)
            assert r.status == 200, await r.text()
            await r.content.readline()  # the first chunk: prefilled, generating
            responses.append(r)
        yield responses
    finally:
        for r in responses:
            r.close()
        await session.close()


async def test_a_paused_groups_requests_are_freed_once_it_resumes(stack):
    async with open_streams(stack, STREAMS, "paused") as streams:
        await until(lambda: _total(stack, STREAMS), f"{STREAMS} requests tracked", 10)
        east = stack.group("east")
        os.kill(east.picker.pid, signal.SIGSTOP)  # hung: its Free calls time out
        try:
            for r in streams:
                r.close()  # the clients leave: the top-level picker frees every request
            pause_started = time.monotonic()
            while time.monotonic() - pause_started < 2.0:  # a 2 s pause, as a GC stall or a freeze
                await asyncio.sleep(0.1)
        finally:
            os.kill(east.picker.pid, signal.SIGCONT)
        took = await until(lambda: _total(stack, 0), "every group is idle again", 20)
    assert took < 15.0, took  # retried frees, or at worst the next renewal


async def test_a_killed_top_level_pickers_requests_are_freed_within_its_lease(stack):
    async with open_streams(stack, STREAMS, "killed"):
        await until(lambda: _total(stack, STREAMS), f"{STREAMS} requests tracked", 10)
        assert stack.top is not None
        os.kill(stack.top.pid, signal.SIGKILL)  # no Free will ever come, no renewal either
        took = await until(lambda: _total(stack, 0), "the groups freed the dead picker's requests", 15)
        assert took <= LEASE_S + 2.0, took  # the lease, plus the sweep and a poll
    stack.top.stop()


async def _total(stack: Hierarchy, expected: int) -> bool:
    return sum((await loads(stack)).values()) == expected
