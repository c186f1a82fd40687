"""AdmissionGate: the async edge of the admission queue (one per model, in front of every group).

With `--router-queue-threshold` set, a request that finds every group's eligible workers saturated
waits here instead of being routed onto an overloaded worker. Whenever capacity may have freed (a
first token, a finished request, a worker added, thresholds changed, and on a short poll for load
that changes on its own or in a remote group), waiting requests are decided in policy order, one
at a time, each against the load left by the previous decision. A request leaves with its decision,
with `QueueTimeout` after the bounded wait, or silently when its client goes away (its task is
cancelled; a decision that raced with the cancel is undone, so nothing leaks).

The gate knows nothing of groups: it is given, per request, an awaitable capacity check and an
awaitable decision. For a local group neither awaits anything, so the queue is drained in one
step of the event loop, as if it were synchronous.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from extproc.picker.flow_metrics import DISPATCHED, EVICTED_CANCELLED, EVICTED_TTL, Flow, FlowMetrics
from extproc.router import AdmissionQueue, QueuedRequest, QueueFairness, QueuePolicy, QueueTimeout
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.admission")

POLL_S = 0.05  # re-check capacity this often while requests wait (load can change with no event)

T = TypeVar("T")


@dataclass(slots=True)
class _Waiter(Generic[T]):
    future: asyncio.Future[T]
    decide: Callable[[], Awaitable[T]]
    has_capacity: Callable[[], Awaitable[bool]]
    key: Hashable
    undo: Callable[[T], object] | None  # its result is ignored
    gone: bool = False  # its client left (or it timed out) while it waited or was being decided


@dataclass(slots=True)
class AdmissionStats:
    queued: int = 0  # requests that had to wait
    released: int = 0  # decided after waiting
    timed_out: int = 0  # answered 503 after the bounded wait
    shed: int = 0  # sheddable requests answered 429 after the bounded wait
    cancelled: int = 0  # the client went away while waiting
    failed: int = 0  # decided after waiting, and the decision raised (answered as an immediate one's)
    wait_s: list[float] = field(default_factory=list)  # recent waits, for the demo and tests


class AdmissionGate:
    """Holds requests while every eligible worker is saturated and decides them as capacity frees."""

    def __init__(
        self,
        *,
        enabled: bool,
        policy: QueuePolicy | str = QueuePolicy.FCFS,
        fairness: QueueFairness | str = QueueFairness.GLOBAL_STRICT,
        max_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = POLL_S,
        flow_metrics: FlowMetrics | None = None,
    ) -> None:
        """`flow_metrics`: where each request's passage is recorded (the Inference Extension's
        flow-control series), for a request `admit` is given a `flow` for."""
        self.enabled = enabled
        self.flow_metrics = flow_metrics
        self.max_wait_s = max_wait_s
        self.clock = clock
        self.poll_s = poll_s
        self.queue = AdmissionQueue(policy, fairness)
        self.stats = AdmissionStats()
        self._poll: asyncio.Task[None] | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._again = False

    def __len__(self) -> int:
        return len(self.queue)

    async def admit(
        self,
        entry: QueuedRequest,
        decide: Callable[[], Awaitable[T]],
        *,
        has_capacity: Callable[[], Awaitable[bool]],
        key: Hashable = None,
        on_queued: Callable[[float], None] | None = None,
        new_tokens: Callable[[], int] | None = None,
        undo: Callable[[T], object] | None = None,
        flow: Flow | None = None,
    ) -> tuple[T, float]:
        """Run `decide` now if a worker has room (and nobody waits), else when one frees.

        Returns (decide's result, seconds waited). `key` names the request's candidate set: requests
        with the same key share one capacity answer per round. `on_queued(max_wait_s)` is called
        when the request starts waiting; `new_tokens()` estimates its uncached prompt tokens for
        wspt (asked only then); `undo(result)` gives back a decision its client no longer wants.
        `flow`: the request's labels and size for `flow_metrics`. Raises QueueTimeout, or whatever
        `decide` raises.
        """
        if not self.enabled:
            return await decide(), 0.0
        if not self.queue and await has_capacity():
            self._left(flow, DISPATCHED, 0.0, waited=False)
            return await decide(), 0.0
        loop = asyncio.get_running_loop()
        waiter: _Waiter[T] = _Waiter(loop.create_future(), decide, has_capacity, key, undo)
        entry.handle = waiter
        if new_tokens is not None and self.queue.policy is QueuePolicy.WSPT:
            entry.new_tokens = new_tokens()
        self.queue.push(entry)
        self.stats.queued += 1
        start = self.clock()
        if flow is not None and self.flow_metrics is not None:
            self.flow_metrics.queued(flow)
        outcome = DISPATCHED
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
            async with asyncio.timeout(self.max_wait_s):
                result = await asyncio.shield(waiter.future)
        except TimeoutError:
            if self._withdraw(entry.request_id, waiter):
                waited = self.clock() - start
                if entry.sheddable:
                    self.stats.shed += 1
                else:
                    self.stats.timed_out += 1
                log.warning("%s left the queue after %.1f s without capacity", entry.request_id, waited)
                outcome = EVICTED_TTL
                raise QueueTimeout(waited, sheddable=entry.sheddable) from None
            if waiter.future.exception() is not None:  # decided at the last moment, like any other
                self.stats.failed += 1
            result = waiter.future.result()
        except asyncio.CancelledError:
            if not self._withdraw(entry.request_id, waiter):
                self._give_back(waiter)  # decided as the client left
            self.stats.cancelled += 1
            log.info("%s left the queue: its client went away", entry.request_id)
            outcome = EVICTED_CANCELLED
            raise
        except Exception:
            self.stats.failed += 1
            raise
        finally:
            self._left(flow, outcome, self.clock() - start, waited=True)
        waited = self.clock() - start
        self.stats.released += 1
        self.stats.wait_s.append(waited)
        del self.stats.wait_s[:-1000]
        return result, waited

    def kick(self) -> None:
        """Capacity may have freed: decide waiting requests (now, or right after the running round)."""
        if not self.queue:
            return
        if self._drainer is not None and not self._drainer.done():
            self._again = True
            return
        self._drainer = asyncio.get_running_loop().create_task(self._drain_rounds(), name="admission-queue")

    async def close(self) -> None:
        await cancel_and_wait(self._poll, self._drainer)
        self._poll = self._drainer = None

    # --- internals ---------------------------------------------------------------------------

    async def _drain_rounds(self) -> None:
        while True:
            self._again = False
            started = time.perf_counter()
            await self._drain()
            if self.flow_metrics is not None:
                self.flow_metrics.dispatch_cycle(time.perf_counter() - started)
            if not self._again:
                return

    async def _drain(self) -> None:
        """Decide waiting requests, in policy order, while their workers have room."""
        no_room: set[Hashable] = set()  # candidate sets found saturated since the last decision
        for entry in self.queue.in_order():
            waiter: _Waiter[Any] = entry.handle
            if entry.request_id not in self.queue or waiter.key in no_room:
                continue
            try:
                room = await waiter.has_capacity()
            except Exception:  # a group that cannot answer has no room for now
                room = False
            if not room:
                no_room.add(waiter.key)
                continue
            if self.queue.remove(entry.request_id, released=True) is None:
                continue  # its client left while capacity was asked
            try:
                result = await waiter.decide()
            except Exception as exc:  # answered like an immediate decision would be
                if not waiter.gone:
                    waiter.future.set_exception(exc)
            else:
                if waiter.gone:  # its client left while it was being decided: give it back
                    if waiter.undo is not None:
                        waiter.undo(result)
                else:
                    waiter.future.set_result(result)
            no_room.clear()

    def _left(self, flow: Flow | None, outcome: str, seconds: float, *, waited: bool) -> None:
        if flow is not None and self.flow_metrics is not None:
            self.flow_metrics.left(flow, outcome, seconds, waited=waited)

    def _withdraw(self, request_id: str, waiter: _Waiter[Any]) -> bool:
        """Take a request out of the queue; False if it had already been decided."""
        if self.queue.remove(request_id) is not None or not waiter.future.done():
            waiter.gone = True  # waiting, or being decided right now (undone when that ends)
            return True
        return False

    def _give_back(self, waiter: _Waiter[Any]) -> None:
        future = waiter.future
        if waiter.undo is not None and not future.cancelled() and future.exception() is None:
            waiter.undo(future.result())

    def _ensure_poll(self) -> None:
        if self._poll is None or self._poll.done():
            self._poll = asyncio.get_running_loop().create_task(self._poll_loop())

    async def _poll_loop(self) -> None:
        while self.queue:
            await asyncio.sleep(self.poll_s)  # a timer, not synchronisation: load may free silently
            self.kick()
