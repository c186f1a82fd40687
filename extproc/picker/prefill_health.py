"""Active health checks of prefill workers: who may be named in the prefill header.

A decode worker that cannot reach its prefill worker prefills locally, so a dead prefill worker
costs time, not requests; probing keeps the picker from naming it again. Every `interval_s`, each
prefill worker's `GET /health` must answer 2xx within `timeout_s`; one failure marks the worker
unhealthy, one success healthy again. Probing starts with the first disaggregated request and
covers whatever prefill workers the picker has at each round (discovery may change them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import aiohttp

from extproc.runtime.rounds import Rounds

log = logging.getLogger("extproc.worker_health")


class WorkerHealth(Rounds):
    """The set of workers whose last health probe failed, kept fresh by rounds in a task of their own."""

    def __init__(
        self, targets: Callable[[], Mapping[str, str]], *, interval_s: float, timeout_s: float = 1.0
    ) -> None:
        """`targets()`: worker id -> ip:port of the workers to probe now."""
        super().__init__("prefill-health", interval_s, log)
        self._targets = targets
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.unhealthy: set[str] = set()
        self._round = asyncio.Lock()  # one round at a time: a slow round must not undo a newer one

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def start(self) -> None:
        """Start probing (idempotent; needs a running event loop)."""
        if self.enabled and self._task is None:
            super().start()

    async def one_round(self) -> None:
        await self.probe_all()

    async def probe_all(self) -> None:
        """One round: probe every target concurrently and update `unhealthy`."""
        async with self._round:
            await self._probe_round()

    async def _probe_round(self) -> None:
        targets = dict(self._targets())
        if self._session is None:
            self._session = aiohttp.ClientSession(  # a fresh connection per probe: a listener must answer
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(force_close=True),
            )
        results = await asyncio.gather(*(self._probe(endpoint) for endpoint in targets.values()))
        for (wid, endpoint), (ok, why) in zip(targets.items(), results, strict=True):
            if not ok and wid not in self.unhealthy:
                log.warning("prefill worker %s at %s is unhealthy (%s): not chosen until it answers", wid,
                            endpoint, why)  # fmt: skip
                self.unhealthy.add(wid)
            elif ok and wid in self.unhealthy:
                log.info("prefill worker %s at %s is healthy again", wid, endpoint)
                self.unhealthy.discard(wid)
        self.unhealthy &= set(targets)  # forget workers that left

    async def _probe(self, endpoint: str) -> tuple[bool, str]:
        assert self._session is not None
        try:
            async with self._session.get(f"http://{endpoint}/health") as response:
                return (200 <= response.status < 300), f"status {response.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
