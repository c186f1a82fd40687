"""What a test that cancels requests checks afterwards: no task of the picker's left pending.

asyncio reports a task collected while still pending ("Task was destroyed but it is pending!") at
ERROR level; a task that stays pending but referenced holds its work (a gRPC call, a worker) for
nobody. `new_tasks_left` polls, with a bound, until every task started since a snapshot has ended,
ignoring the tasks of the test's own HTTP servers and clients (aiohttp keeps one per keep-alive
connection, from Envoy to a mock worker and from the test to Envoy) and gRPC's accept loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def _foreign(task: asyncio.Task) -> bool:
    """A task of aiohttp (a mock worker's connection, a test client) or gRPC's server loop (the one
    waiting for the next call, made again for each), not of a request's handling."""
    coro = task.get_coro()
    if getattr(coro, "__qualname__", "").startswith("AioServer._request"):
        return True
    code = getattr(coro, "cr_code", None)
    return code is not None and "/aiohttp/" in code.co_filename


def running_tasks() -> set[asyncio.Task]:
    return set(asyncio.all_tasks())


async def new_tasks_left(before: set[asyncio.Task], timeout_s: float = 5.0) -> list[asyncio.Task]:
    """The tasks started since `before` (not aiohttp's) still pending after up to `timeout_s`."""
    me = asyncio.current_task()
    deadline = time.monotonic() + timeout_s
    while True:
        left = [t for t in asyncio.all_tasks() if t not in before and t is not me and not _foreign(t)]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.01)


@contextmanager
def destroyed_pending(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """Collects garbage on exit and fills the list with asyncio's "Task was destroyed but it is
    pending!" reports made meanwhile."""
    reports: list[str] = []
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        start = len(caplog.records)
        yield reports
        gc.collect()
        reports += [r.getMessage() for r in caplog.records[start:] if "Task was destroyed" in r.getMessage()]
