"""The picker's event loop: some sockets are read when the loop is awake anyway, not on their own.

Waking a sleeping process for one small message costs far more than handling the message: on the
2-core virtual machines of `benchmarks/bench_replicas.py` a picker spends about 200-330 us of CPU
per wake-up, against about 25 us to decode and apply a Dynamo KV event. Every picker consumes
every worker's KV events, and every replica every other replica's sync messages, so at a few
hundred messages a second their arrivals, not their contents, were most of what an event cost.

KV events and replica sync can wait a few milliseconds; Envoy's calls cannot. So a socket can be
*held* (`DeferringSelector.hold`): after it was read, the loop stops listening to it, and reads
it again

- when bytes wait for it while the loop is awake anyway (woken for an ext_proc message or a
  timer, or about to sleep): reading then costs no wake-up of its own. A wake-up that finds
  nothing waiting leaves it held (letting it go then would let its next message wake the loop);
- at the latest `max_delay_s` after it was held (the loop sleeps no longer than that), when it is
  let go whether bytes wait or not: a quiet socket wakes the loop again when something comes.

Nothing that is already there is held back past a sleep: a sender faster than the picker is read
as fast as before; one the picker catches up with waits at most the delay each time, its bytes in
the socket's buffer. Nothing is lost or reordered: unread bytes stay in the kernel's socket
buffer, TCP flow control applies as always, and the socket is read by its own transport exactly
as before. Only plain sockets are held (a TLS transport keeps reading its socket into its own
buffers; `hold` returns False). Pauses go through the transport's `pause_reading` /
`resume_reading`, so its owner's own flow control keeps working.

Timers are the other wake-ups a quiet picker pays for: heartbeats, lease checks, scrapes, a batch
of replica sync messages waiting for its window. `lazy_sleep(delay, slack)` ends a periodic
task's sleep with the first wake-up the loop has anyway after `delay`, or `delay + slack` at the
latest; `call_when_idle(callback, latest)` runs a callback once the loop has nothing else to run,
before it would sleep (a batch goes out with the wake-up that filled it), or by `latest` in a
loop that never sleeps.

`new_event_loop()` makes such a loop (`run()` runs a coroutine on one, as `asyncio.run` does);
`deferring_selector()` finds the running loop's selector, or None on any other loop, where
nothing is held, lazy sleeps are plain sleeps and everything works as before.
"""

from __future__ import annotations

import asyncio
import fcntl
import math
import selectors
import struct
import termios
import time
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

_FIONREAD_BUF = b"\0\0\0\0"


@dataclass(slots=True)
class _Held:
    fd: int
    deadline: float  # clock time by which it is read again


@dataclass(slots=True, eq=False)
class _Lazy:
    earliest: float  # clock times: resolved when the loop is awake anyway from `earliest` on,
    latest: float  # and wakes for it at `latest`
    future: asyncio.Future[None]


@dataclass(slots=True)
class HoldStats:
    """Why held sockets were read again (counts): bytes waited when the loop was awake for
    something else (`on_wake`) or about to sleep (`waiting`), or the delay ran out (`deadline`);
    lazy futures resolved (`lazy`); and how often the loop had nothing to run and waited for a
    socket or a timer (`sleeps`: each ends in a wake-up, the costly part)."""

    held: int = 0
    on_wake: int = 0
    waiting: int = 0
    deadline: int = 0
    closed: int = 0  # held transports found closing (dropped, not resumed)
    lazy: int = 0
    sleeps: int = 0


class DeferringSelector(selectors.DefaultSelector):
    """The platform's default selector, plus held sockets and lazy wake-ups (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._held: dict[asyncio.ReadTransport, _Held] = {}
        self._lazy: list[_Lazy] = []
        self._lazy_latest = math.inf  # the earliest `latest` of `_lazy`: the loop sleeps no longer
        self.stats = HoldStats()

    def hold(self, transport: asyncio.ReadTransport, max_delay_s: float) -> bool:
        """Stop reading `transport` until bytes wait for it when the loop is awake anyway (woken for
        something else, or about to sleep), or `max_delay_s` passed. False (nothing done): not a
        plain socket transport, closing, or a delay of 0."""
        if max_delay_s <= 0 or transport.is_closing() or transport in self._held:
            return transport in self._held
        if transport.get_extra_info("sslcontext") is not None:
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        transport.pause_reading()
        self._held[transport] = _Held(sock.fileno(), self._clock() + max_delay_s)
        self.stats.held += 1
        return True

    @property
    def holding(self) -> int:
        return len(self._held)

    def let_go(self, transport: asyncio.ReadTransport) -> bool:
        """Listen to `transport` again now if it is held (its owner needs what waits at once);
        whether it was."""
        if transport not in self._held:
            return False
        self._let_go(transport)
        return True

    def resolve_lazily(self, future: asyncio.Future[None], earliest_s: float, latest_s: float) -> None:
        """Resolve `future` (with None) the first time the loop is idle or just woke `earliest_s`
        from now or later, waking the loop for it `latest_s` from now at the latest; a loop busy
        with callbacks resolves it by `latest_s`. A future done meanwhile (cancelled) is skipped."""
        now = self._clock()
        entry = _Lazy(now + earliest_s, now + max(earliest_s, latest_s), future)
        self._lazy.append(entry)
        self._lazy_latest = min(self._lazy_latest, entry.latest)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if not self._held and not self._lazy:
            self.stats.sleeps += timeout != 0
            return super().select(timeout)
        if timeout != 0:
            timeout = self._before_sleep(timeout)
        ready = super().select(timeout)
        now = self._clock()
        slept = timeout != 0  # and woke: what is held with bytes waiting is read now
        self.stats.sleeps += slept
        self._release(now, awake=slept or bool(ready))  # a busy loop's poll still reads what is due
        self._resolve(now, idle=slept)
        return ready

    def _before_sleep(self, timeout: float | None) -> float | None:
        """Resolve the lazy futures that are due (then the loop does not sleep), release what has
        bytes waiting; the sleep ends by the earliest deadline of the rest."""
        if self._lazy and self._resolve(self._clock(), idle=True):
            return 0  # their callbacks run first; the loop comes back here to sleep
        deadline = self._lazy_latest
        for transport, held in list(self._held.items()):
            if transport.is_closing():  # its fd may already be another socket's
                self._let_go(transport)
            elif bytes_waiting(held.fd):
                self.stats.waiting += 1
                self._let_go(transport)
            elif held.deadline < deadline:
                deadline = held.deadline
        if deadline == math.inf:
            return timeout
        until = max(0.0, deadline - self._clock())  # the clock last: what comes after it waits
        return until if timeout is None or until < timeout else timeout

    def _release(self, now: float, *, awake: bool) -> None:
        """Let go of what is due, and, when the loop is awake for something anyway, of what has
        bytes waiting; the rest stays held (a wake-up with nothing to read costs no new one)."""
        for transport, held in list(self._held.items()):
            if transport.is_closing() or held.deadline <= now:
                self.stats.deadline += not transport.is_closing()
                self._let_go(transport)
            elif awake and bytes_waiting(held.fd):
                self.stats.on_wake += 1
                self._let_go(transport)

    def _let_go(self, transport: asyncio.ReadTransport) -> None:
        del self._held[transport]
        if transport.is_closing():
            self.stats.closed += 1
            return
        transport.resume_reading()

    def _resolve(self, now: float, *, idle: bool) -> bool:
        """Resolve the lazy futures due now (`idle`: from their earliest, else by their latest);
        whether any was."""
        if not self._lazy or (not idle and now < self._lazy_latest):
            return False
        due = [e for e in self._lazy if (e.earliest if idle else e.latest) <= now or e.future.done()]
        if not due:
            return False
        self._lazy = [e for e in self._lazy if e not in due]
        self._lazy_latest = min((e.latest for e in self._lazy), default=math.inf)
        resolved = False
        for entry in due:
            if not entry.future.done():
                entry.future.set_result(None)
                self.stats.lazy += 1
                resolved = True
        return resolved


def bytes_waiting(fd: int) -> bool:
    """Whether the socket has bytes to read (FIONREAD); an error counts as yes (let it be read)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, _FIONREAD_BUF))[0] > 0
    except (OSError, ValueError):  # ValueError: a closed socket's fd is -1
        return True


_SELECTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DeferringSelector]
_SELECTORS = weakref.WeakKeyDictionary()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A selector event loop whose selector can hold sockets (the picker's loop)."""
    selector = DeferringSelector()
    loop = asyncio.SelectorEventLoop(selector)
    _SELECTORS[loop] = selector
    return loop


def deferring_selector(loop: asyncio.AbstractEventLoop | None = None) -> DeferringSelector | None:
    """The selector of `loop` (default: the running one) if it was made by `new_event_loop`."""
    return _SELECTORS.get(loop if loop is not None else asyncio.get_running_loop())


async def lazy_sleep(delay_s: float, slack_s: float) -> None:
    """Sleep `delay_s`, then up to `slack_s` more until the loop is awake for something else: a
    periodic task that can run a little late costs no wake-up of its own. On any loop but the
    picker's (or with no slack), `asyncio.sleep(delay_s)`."""
    loop = asyncio.get_running_loop()
    selector = _SELECTORS.get(loop)
    if selector is None or slack_s <= 0:
        await asyncio.sleep(delay_s)
        return
    future: asyncio.Future[None] = loop.create_future()
    selector.resolve_lazily(future, delay_s, delay_s + slack_s)
    await future  # a cancelled sleep's entry is dropped before the loop next sleeps


def call_when_idle(
    callback: Callable[[], object], latest_s: float
) -> asyncio.Future[None] | asyncio.TimerHandle:
    """Call `callback` once the running loop has nothing else to run (before it sleeps) or just
    woke, or `latest_s` from now at the latest; `.cancel()` the result to call it no more. On any
    loop but the picker's, a timer of `latest_s`."""
    loop = asyncio.get_running_loop()
    selector = _SELECTORS.get(loop)
    if selector is None:
        return loop.call_later(latest_s, callback)
    future: asyncio.Future[None] = loop.create_future()
    future.add_done_callback(lambda f: None if f.cancelled() else callback())
    selector.resolve_lazily(future, 0.0, latest_s)
    return future


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a `new_event_loop()`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
