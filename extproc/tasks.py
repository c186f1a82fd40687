"""Stopping background tasks so that they really stop.

Every long-lived task here (event subscribers, pollers, sweepers, renewers) is stopped the same way:
cancel it and wait until it has ended. A plain `task.cancel(); await task` is not enough on Python
3.11: `asyncio.wait_for` (ours until 3.12's rewrite, and nats.py's, grpc's) drops a cancellation
that arrives in the same loop round as its inner future's result, so the task runs on and the
`await` never returns. `cancel_and_wait` cancels again until the task is done, and never swallows
a cancellation of its own caller.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("extproc.tasks")

RECANCEL_S = 0.5  # how long a cancelled task gets to end before it is cancelled again


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task and wait until all have ended, cancelling again any that ran on.

    A task that ended with an error is logged (its stop is not the place to raise it); `None`
    entries are skipped, so an optional task can be passed as it is.
    """
    pending = {task for task in tasks if task is not None}
    while pending := {task for task in pending if not task.done()}:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=RECANCEL_S)
    for ended in tasks:
        if ended is not None and not ended.cancelled() and ended.exception() is not None:
            log.error("task %s ended with an error", ended.get_name(), exc_info=ended.exception())
