"""cancel_and_wait: a stop that really stops, whatever the task does with its first cancel."""

from __future__ import annotations

import asyncio
import logging

import pytest

from extproc.tasks import cancel_and_wait


async def test_a_task_that_drops_a_cancel_is_cancelled_again_until_it_ends() -> None:
    """Python 3.11's `asyncio.wait_for` drops a cancel that races with its result; the task runs on."""
    swallowed = 0
    started = asyncio.Event()

    async def stubborn() -> None:
        nonlocal swallowed
        started.set()
        while True:
            try:
                await asyncio.sleep(3600)  # idles until cancelled
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 2:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(cancel_and_wait(task), 5)
    assert task.cancelled() and swallowed == 2


async def test_the_callers_own_cancel_is_not_swallowed() -> None:
    """A stop that is itself cancelled (a shutdown timeout) must end cancelled, not carry on."""
    started, cleaning, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)  # idles until cancelled
        finally:
            cleaning.set()
            await release.wait()  # cleanup that takes a while

    task = asyncio.create_task(slow_to_stop())
    await asyncio.wait_for(started.wait(), 5)
    stopper = asyncio.create_task(cancel_and_wait(task))
    await asyncio.wait_for(cleaning.wait(), 5)  # the stop is waiting for the cleanup
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    release.set()
    await asyncio.wait({task}, timeout=5)
    assert task.done()


async def test_a_task_that_failed_is_logged_not_raised_and_none_is_skipped(caplog) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails(), name="poller")
    await asyncio.wait({failed})
    with caplog.at_level(logging.ERROR, logger="extproc.tasks"):
        await cancel_and_wait(failed, None)
    assert "task poller ended with an error" in caplog.text
