"""The picker's event loop: some sockets are read when the loop is awake anyway, not on their own.

Waking a sleeping process for one small message costs far more than handling the message: on the
2-core virtual machines of `benchmarks/bench_replicas.py` a picker spends about 200-330 us of CPU
per wake-up, against about 25 us to decode and apply a Dynamo KV event. Every picker consumes
every worker's KV events, and every replica every other replica's sync messages, so at a few
hundred messages a second their arrivals, not their contents, were most of what an event cost.

KV events and replica sync can wait a few milliseconds; Envoy's calls cannot. So a socket can be
*held* (`DeferringSelector.hold`): after it was read, the loop stops listening to it, and reads
it again

- when the loop wakes for anything else (an ext_proc message, a timer): reading then costs no
  wake-up of its own;
- at once, when bytes are already waiting as the loop is about to sleep (nothing that is already
  there is held back: a sender faster than the picker is read as fast as before; one the picker
  catches up with waits at most the delay each time, its bytes in the socket's buffer);
- at the latest `max_delay_s` after it was held (the loop sleeps no longer than that).

Nothing is lost or reordered: unread bytes stay in the kernel's socket buffer, TCP flow control
applies as always, and the socket is read by its own transport exactly as before. Only plain
sockets are held (a TLS transport keeps reading its socket into its own buffers; `hold` returns
False). Pauses go through the transport's `pause_reading` / `resume_reading`, so its owner's own
flow control keeps working.

`new_event_loop()` makes such a loop (`run()` runs a coroutine on one, as `asyncio.run` does);
`deferring_selector()` finds the running loop's selector, or None on any other loop, where
nothing is held and everything works as before.
"""

from __future__ import annotations

import asyncio
import fcntl
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


@dataclass(slots=True)
class HoldStats:
    """Why held sockets were read again (counts): the loop woke for something else (`on_wake`),
    bytes were waiting as it was about to sleep (`waiting`), or the delay ran out (`deadline`)."""

    held: int = 0
    on_wake: int = 0
    waiting: int = 0
    deadline: int = 0
    closed: int = 0  # held transports found closing (dropped, not resumed)


class DeferringSelector(selectors.DefaultSelector):
    """The platform's default selector, plus held sockets (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._held: dict[asyncio.ReadTransport, _Held] = {}
        self.stats = HoldStats()

    def hold(self, transport: asyncio.ReadTransport, max_delay_s: float) -> bool:
        """Stop reading `transport` until the loop wakes for something else, bytes wait when it is
        about to sleep, or `max_delay_s` passed. False (nothing done): not a plain socket
        transport, closing, or a delay of 0."""
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

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if not self._held:
            return super().select(timeout)
        if timeout != 0:
            timeout = self._before_sleep(timeout)
        ready = super().select(timeout)
        if ready or timeout != 0:  # woken, or about to be: everything held is read now
            self._release_all(bool(ready))
        else:  # a busy loop that only runs callbacks still reads what is due
            self._release_due()
        return ready

    def _before_sleep(self, timeout: float | None) -> float | None:
        """Release what has bytes waiting; the sleep ends by the earliest deadline of the rest."""
        deadline = None
        for transport, held in list(self._held.items()):
            if transport.is_closing():  # its fd may already be another socket's
                self._release(transport)
            elif _waiting(held.fd):
                self.stats.waiting += 1
                self._release(transport)
            elif deadline is None or held.deadline < deadline:
                deadline = held.deadline
        if deadline is None:
            return timeout
        until = max(0.0, deadline - self._clock())
        return until if timeout is None or until < timeout else timeout

    def _release_all(self, woken: bool) -> None:
        now = self._clock()
        for transport, held in list(self._held.items()):
            if woken or now < held.deadline:
                self.stats.on_wake += 1
            else:
                self.stats.deadline += 1
            self._release(transport)

    def _release_due(self) -> None:
        now = self._clock()
        for transport, held in list(self._held.items()):
            if held.deadline <= now:
                self.stats.deadline += 1
                self._release(transport)

    def _release(self, transport: asyncio.ReadTransport) -> None:
        del self._held[transport]
        if transport.is_closing():
            self.stats.closed += 1
            return
        transport.resume_reading()


def _waiting(fd: int) -> bool:
    """Whether the socket has bytes to read (FIONREAD); an error counts as yes (let it be read)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, _FIONREAD_BUF))[0] > 0
    except OSError:
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


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a `new_event_loop()`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
