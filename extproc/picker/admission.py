"""AdmissionGate: the async edge of the admission queue (one per model's router).

With `--router-queue-threshold` set, a request that finds every eligible worker saturated waits
here instead of being routed onto an overloaded worker. Whenever capacity may have freed (a
first token, a finished request, a worker added, thresholds changed, and on a short poll for
load that changes on its own), waiting requests are decided in policy order, one at a time,
each against the load left by the previous decision. A request leaves with its decision, with
`QueueTimeout` after the bounded wait, or silently when its client goes away (its task is
cancelled; a decision that raced with the cancel is freed again, so nothing leaks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from extproc.router import AdmissionQueue, KvRouter, QueuedRequest, QueuePolicy, QueueTimeout

log = logging.getLogger("extproc.admission")

POLL_S = 0.05  # re-check capacity this often while requests wait (load can change with no event)


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future
    decide: Callable[[], Any]
    allowed: Any


@dataclass(slots=True)
class AdmissionStats:
    queued: int = 0  # requests that had to wait
    released: int = 0  # decided after waiting
    timed_out: int = 0  # answered 503 after the bounded wait
    shed: int = 0  # sheddable requests answered 429 after the bounded wait
    cancelled: int = 0  # the client went away while waiting
    wait_s: list[float] = field(default_factory=list)  # recent waits, for the demo and tests


class AdmissionGate:
    """Holds requests while every eligible worker is saturated and decides them as capacity frees."""

    def __init__(
        self,
        router: KvRouter,
        *,
        max_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = POLL_S,
    ) -> None:
        self.router = router
        self.max_wait_s = max_wait_s
        self.clock = clock
        self.poll_s = poll_s
        self.queue = AdmissionQueue(router.config.router_queue_policy)
        self.stats = AdmissionStats()
        self._poll: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        return self.router.config.router_queue_threshold is not None

    def __len__(self) -> int:
        return len(self.queue)

    async def admit(
        self,
        entry: QueuedRequest,
        decide: Callable[[], Any],
        *,
        allowed: Any = None,
        on_queued: Callable[[float], None] | None = None,
        new_tokens: Callable[[], int] | None = None,
    ) -> tuple[Any, float]:
        """Run `decide` now if a worker has room (and nobody waits), else when one frees.

        Returns (decide's result, seconds waited). `on_queued(max_wait_s)` is called when the
        request starts waiting; `new_tokens()` estimates its uncached prompt tokens for wspt
        (asked only then). Raises QueueTimeout, or whatever `decide` raises.
        """
        if not self.enabled or (not self.queue and self.router.has_capacity(allowed_workers=allowed)):
            return decide(), 0.0
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), decide, allowed)
        entry.handle = waiter
        if new_tokens is not None and self.queue.policy is QueuePolicy.WSPT:
            entry.new_tokens = new_tokens()
        self.queue.push(entry)
        self.stats.queued += 1
        start = self.clock()
        log.info(
            "queued %s: every eligible worker is saturated (%d waiting, policy %s)",
            entry.request_id,
            len(self.queue),
            self.queue.policy,
        )
        if on_queued is not None:
            on_queued(self.max_wait_s)
        self.kick()  # a worker this request may use can have room while the head's cannot
        self._ensure_poll()
        try:
            result = await asyncio.wait_for(asyncio.shield(waiter.future), self.max_wait_s)
        except TimeoutError:
            if not self._withdraw(entry.request_id, waiter):
                return waiter.future.result(), self.clock() - start  # decided at the last moment
            waited = self.clock() - start
            if entry.sheddable:
                self.stats.shed += 1
            else:
                self.stats.timed_out += 1
            log.warning("%s left the queue after %.1f s without capacity", entry.request_id, waited)
            raise QueueTimeout(waited, sheddable=entry.sheddable) from None
        except asyncio.CancelledError:
            if not self._withdraw(entry.request_id, waiter) and waiter.future.exception() is None:
                self.router.free(entry.request_id)  # decided as the client left: give the load back
            self.stats.cancelled += 1
            log.info("%s left the queue: its client went away", entry.request_id)
            raise
        waited = self.clock() - start
        self.stats.released += 1
        self.stats.wait_s.append(waited)
        del self.stats.wait_s[:-1000]
        return result, waited

    def kick(self) -> int:
        """Decide waiting requests, in policy order, while their workers have room; returns how many."""
        if not self.queue:
            return 0
        decided = 0
        no_room: set[Hashable] = set()  # allowed sets found saturated since the last decision
        for entry in self.queue.in_order():
            waiter: _Waiter = entry.handle
            key = _key(waiter.allowed)
            if key in no_room:
                continue
            if not self.router.has_capacity(allowed_workers=waiter.allowed):
                no_room.add(key)
                continue
            self.queue.remove(entry.request_id)
            try:
                result = waiter.decide()
            except Exception as exc:  # answered like an immediate decision would be
                waiter.future.set_exception(exc)
            else:
                waiter.future.set_result(result)
            decided += 1
            no_room.clear()
        return decided

    async def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
            self._poll = None

    def _withdraw(self, request_id: str, waiter: _Waiter) -> bool:
        """Take a request out of the queue; False if it had already been decided."""
        if self.queue.remove(request_id) is not None:
            return True
        return not waiter.future.done()

    def _ensure_poll(self) -> None:
        if self._poll is None or self._poll.done():
            self._poll = asyncio.get_running_loop().create_task(self._poll_loop())

    async def _poll_loop(self) -> None:
        while self.queue:
            await asyncio.sleep(self.poll_s)  # a timer, not synchronisation: load may free silently
            self.kick()


def _key(allowed: Any) -> Hashable:
    return None if allowed is None else frozenset(allowed)
