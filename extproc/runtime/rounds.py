"""Reading every worker in rounds, in a task of its own: the engines' metrics
(`runtime.engine_metrics`) and their model lists (`runtime.lora_discovery`).

A round starts every `interval_s` from the start of the one before (on serve's own loop up to a
quarter of an interval late, with a wake-up the loop has anyway: `wakeups.lazy_sleep`); a round that
raises is logged and the next one runs. The rounds' HTTP session is made by the subclass when it
first reads and closed at `stop`.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from extproc.runtime.wakeups import lazy_sleep
from extproc.tasks import cancel_and_wait


class Rounds:
    """`one_round` every `interval_s` once started, until stopped (stopping twice is stopping once)."""

    def __init__(self, name: str, interval_s: float, log: logging.Logger) -> None:
        self._name = name
        self._interval_s = interval_s
        self._log = log
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def one_round(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = self._interval_s
        while True:
            started = loop.time()
            try:
                await self.one_round()
            except Exception:  # an edge loop: one bad round must not end the rounds
                self._log.exception("%s: a round failed", self._name)
            await lazy_sleep(max(0.0, interval_s - (loop.time() - started)), interval_s / 4)
