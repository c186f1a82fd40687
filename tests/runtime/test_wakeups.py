"""The picker's event loop holds sockets between reads (extproc/runtime/wakeups.py), on real sockets.

A held socket must be read again when the loop wakes for anything else, at once when bytes already
wait as the loop is about to sleep (a flood is never slowed to one read per delay), and by the
delay at the latest; closing a held transport is harmless. Data that arrives "while the loop
sleeps" is sent by a thread once the selector has checked for waiting bytes and computed its
sleep (it reads its clock last), so no test depends on timing.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from extproc.runtime import wakeups
from extproc.runtime.wakeups import DeferringSelector, deferring_selector, new_event_loop

BOUND_S = 20.0  # every wait of these tests ends well before this unless the selector is wrong


class Received(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.transport: asyncio.Transport  # set when connected
        self._waiter: tuple[int, asyncio.Future[None]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self._waiter is not None and len(self.data) >= self._waiter[0] and not self._waiter[1].done():
            self._waiter[1].set_result(None)

    async def until(self, size: int) -> None:
        if len(self.data) >= size:
            return
        self._waiter = (size, asyncio.get_running_loop().create_future())
        await asyncio.wait_for(self._waiter[1], BOUND_S)


_OPEN: list[asyncio.BaseTransport] = []  # closed by `_closing` at the end of each test's coroutine


async def _connected() -> tuple[Received, socket.socket]:
    ours, peer = socket.socketpair()
    transport, protocol = await asyncio.get_running_loop().create_connection(Received, sock=ours)
    _OPEN.append(transport)
    return protocol, peer


async def _closing(main: Coroutine[Any, Any, None]) -> None:
    try:
        await main
    finally:
        for transport in _OPEN:
            transport.close()
        _OPEN.clear()
        await asyncio.sleep(0)  # the transports' connection_lost callbacks run


def _picker_selector() -> DeferringSelector:
    """The running loop's selector (every test here runs on a loop that holds sockets)."""
    selector = deferring_selector()
    assert selector is not None
    return selector


class SleepSignal:
    """A selector clock that tells a thread when the selector is about to sleep (armed once)."""

    def __init__(self) -> None:
        self.armed = False
        self.sleeping = threading.Event()

    def __call__(self) -> float:
        if self.armed:
            self.armed = False
            self.sleeping.set()
        return time.monotonic()


def _loop_with(clock: Callable[[], float]) -> asyncio.AbstractEventLoop:
    selector = DeferringSelector(clock)
    loop = asyncio.SelectorEventLoop(selector)
    wakeups._SELECTORS[loop] = selector
    return loop


def _run(main: Callable[[], object], clock: Callable[[], float] = time.monotonic) -> None:
    with asyncio.Runner(loop_factory=lambda: _loop_with(clock)) as runner:
        runner.run(_closing(main()))  # type: ignore[arg-type]


def test_the_picker_loop_is_found_and_any_other_is_not() -> None:
    async def ours() -> None:
        assert isinstance(deferring_selector(), DeferringSelector)

    async def theirs() -> None:
        assert deferring_selector() is None

    wakeups.run(ours())
    asyncio.run(theirs())
    loop = new_event_loop()
    try:
        assert deferring_selector(loop) is not None
    finally:
        loop.close()


def test_bytes_that_arrive_while_held_wait_for_the_next_wake_up_for_something_else() -> None:
    signal = SleepSignal()

    async def main() -> None:
        held, held_peer = await _connected()
        other, other_peer = await _connected()
        selector = _picker_selector()
        assert selector.hold(held.transport, max_delay_s=3600.0)

        def sender() -> None:
            signal.sleeping.wait(BOUND_S)
            held_peer.send(b"held")  # arrives while the loop sleeps: nothing wakes it for this
            other_peer.send(b"wake")  # something else wakes it

        signal.armed = True
        thread = threading.Thread(target=sender)
        thread.start()
        await other.until(4)
        await held.until(4)  # within an hour: read with the wake-up `other` caused
        thread.join(BOUND_S)
        assert held.data == b"held"
        assert (selector.stats.on_wake, selector.stats.deadline, selector.stats.waiting) == (1, 0, 0)
        held_peer.close()
        other_peer.close()

    _run(main, signal)


def test_a_held_socket_wakes_the_loop_at_its_delay_when_nothing_else_does() -> None:
    signal = SleepSignal()

    async def main() -> None:
        held, peer = await _connected()
        selector = _picker_selector()
        assert selector.hold(held.transport, max_delay_s=0.05)

        def sender() -> None:
            signal.sleeping.wait(BOUND_S)
            peer.send(b"late")

        signal.armed = True
        thread = threading.Thread(target=sender)
        thread.start()
        await held.until(4)  # nothing else happens on this loop: only the delay ends its sleep
        thread.join(BOUND_S)
        assert held.data == b"late"
        assert selector.stats.deadline == 1 and selector.stats.on_wake == 0
        peer.close()

    _run(main, signal)


def test_bytes_already_waiting_when_the_loop_is_about_to_sleep_are_read_at_once() -> None:
    async def main() -> None:
        received, peer = await _connected()
        selector = _picker_selector()
        transport = received.transport
        original = received.data_received

        def hold_after_each_read(data: bytes) -> None:  # what nats_reads does after each read
            original(data)
            selector.hold(transport, max_delay_s=3600.0)

        received.data_received = hold_after_each_read  # type: ignore[method-assign]
        for n in range(1, 6):  # each chunk is in the socket before the loop would sleep, held
            peer.send(b"x" * 1000)
            await received.until(1000 * n)  # with an hour's delay, only reading what waits ends this
        assert len(received.data) == 5000
        assert (selector.stats.waiting, selector.stats.deadline) == (4, 0)  # the first read held nothing
        peer.close()

    _run(main)


def test_a_loop_busy_with_callbacks_still_reads_a_held_socket_by_its_delay() -> None:
    async def main() -> None:
        held, peer = await _connected()
        selector = _picker_selector()
        deadline = time.monotonic() + BOUND_S
        for n in (1, 2):
            assert selector.hold(held.transport, max_delay_s=0.02)
            peer.send(b"busy")
            while len(held.data) < 4 * n and time.monotonic() < deadline:
                await asyncio.sleep(0)  # never sleeps: every select of the loop is a poll
            assert held.data == b"busy" * n
            assert selector.stats.deadline == n and selector.stats.on_wake == 0
        peer.close()

    _run(main)


def test_a_held_transport_that_closes_is_dropped_not_resumed() -> None:
    async def main() -> None:
        held, peer = await _connected()
        selector = _picker_selector()
        assert selector.hold(held.transport, max_delay_s=0.01)
        held.transport.close()
        deadline = time.monotonic() + BOUND_S
        while selector.holding and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # a timer wake-up: what is held is let go
        assert selector.holding == 0 and selector.stats.closed == 1
        other, other_peer = await _connected()
        assert selector.hold(other.transport, max_delay_s=0.01)
        other.transport.close()
        while selector.holding and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert selector.stats.closed == 2
        other_peer.close()
        peer.close()

    _run(main)


@pytest.mark.parametrize("delay", [0.0, -1.0])
def test_no_delay_holds_nothing(delay: float) -> None:
    async def main() -> None:
        held, peer = await _connected()
        selector = _picker_selector()
        assert not selector.hold(held.transport, max_delay_s=delay)
        assert selector.holding == 0 and held.transport.is_reading()
        peer.close()

    _run(main)


def test_a_wake_up_with_nothing_to_read_keeps_the_socket_held_until_its_delay() -> None:
    async def main() -> None:
        held, peer = await _connected()
        selector = _picker_selector()
        assert selector.hold(held.transport, max_delay_s=3600.0)
        assert selector.hold(held.transport, max_delay_s=3600.0)  # held already: nothing more
        for _ in range(3):
            await asyncio.sleep(0.001)  # a timer wakes the loop; the socket has nothing to read
            assert selector.holding == 1 and not held.transport.is_reading()
        assert (selector.stats.held, selector.stats.on_wake, selector.stats.deadline) == (1, 0, 0)
        held.transport.close()  # (let it go)
        quiet, quiet_peer = await _connected()
        assert selector.hold(quiet.transport, max_delay_s=0.02)
        deadline = time.monotonic() + BOUND_S
        while selector.holding and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # timer wake-ups, until its delay runs out
        assert quiet.transport.is_reading()  # a quiet socket is listened to again at its delay
        assert selector.stats.deadline == 1 and selector.stats.on_wake == 0
        quiet_peer.send(b"later")
        await quiet.until(5)
        peer.close()
        quiet_peer.close()

    wakeups.run(_closing(main()))  # the loop `extproc serve` runs on


def test_the_sleep_ends_by_the_earliest_delay_and_never_later_than_the_loop_asked() -> None:
    loop = new_event_loop()
    selector = deferring_selector(loop)
    assert selector is not None
    try:
        held, peer = loop.run_until_complete(_connected())
        assert selector.hold(held.transport, max_delay_s=0.05)
        for timeout in (None, 30.0):  # the loop would sleep long or forever: the delay ends it
            started = time.monotonic()
            assert selector.select(timeout) == []
            assert time.monotonic() - started < 15.0
            assert selector.holding == 0 and selector.stats.deadline >= 1
            assert selector.hold(held.transport, max_delay_s=0.05)
        selector.select(0.05)  # let it go (the delay is due)
        assert selector.hold(held.transport, max_delay_s=3600.0)
        started = time.monotonic()
        assert selector.select(0.01) == []  # a shorter sleep than the delay is kept
        assert time.monotonic() - started < 15.0
        peer.close()
        loop.run_until_complete(_closing(asyncio.sleep(0)))
    finally:
        loop.close()


def test_one_waiting_byte_is_enough_to_be_read_before_a_sleep() -> None:
    async def main() -> None:
        held, peer = await _connected()
        selector = _picker_selector()
        assert selector.hold(held.transport, max_delay_s=3600.0)
        peer.send(b"1")
        await held.until(1)
        assert selector.stats.waiting == 1
        peer.close()

    _run(main)


def test_tls_and_pipe_transports_are_not_held(tmp_path: Path) -> None:
    from tests.certs import TestCa

    ca = TestCa(tmp_path / "ca", "wakeups-ca")
    issued = ca.issue("localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(issued.cert_file, issued.key_file)
    client_ctx = ssl.create_default_context(cafile=ca.ca_file)

    async def main() -> None:
        selector = _picker_selector()
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        try:
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"
            )
            assert not selector.hold(writer.transport, max_delay_s=1.0)  # type: ignore[arg-type]
            writer.close()
        finally:
            server.close()
        read_fd, write_fd = os.pipe()
        try:
            pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
                asyncio.Protocol, os.fdopen(read_fd, "rb")
            )
            assert not selector.hold(pipe, max_delay_s=1.0)  # type: ignore[arg-type]
            assert selector.holding == 0 and selector.stats.held == 0
            pipe.close()
        finally:
            os.close(write_fd)

    _run(main)


def test_a_socket_that_cannot_be_asked_counts_as_waiting() -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    os.close(write_fd)
    assert wakeups.bytes_waiting(read_fd)  # closed: let its owner read and see why


def test_a_lazy_sleep_ends_with_the_next_wake_up_for_something_else_after_its_delay() -> None:
    async def main() -> None:
        selector = _picker_selector()
        started = time.monotonic()
        lazy = asyncio.create_task(wakeups.lazy_sleep(0.01, 3600.0))
        await asyncio.sleep(0.05)  # a timer wakes the loop after the lazy delay: the sleep ends then
        await asyncio.wait_for(lazy, BOUND_S)
        assert time.monotonic() - started < BOUND_S and selector.stats.lazy == 1
        started = time.monotonic()
        await asyncio.wait_for(wakeups.lazy_sleep(0.02, 0.01), BOUND_S)  # nothing else: by its slack
        assert time.monotonic() - started >= 0.02 and selector.stats.lazy == 2

    _run(main)


def test_a_lazy_sleep_never_ends_before_its_delay_however_often_the_loop_wakes() -> None:
    async def main() -> None:
        started = time.monotonic()
        lazy = asyncio.create_task(wakeups.lazy_sleep(0.05, 1.0))
        while not lazy.done() and time.monotonic() - started < BOUND_S:
            await asyncio.sleep(0.001)  # the loop wakes every millisecond
        assert lazy.done() and time.monotonic() - started >= 0.05

    _run(main)


def test_a_cancelled_lazy_sleep_is_dropped() -> None:
    async def main() -> None:
        selector = _picker_selector()
        lazy = asyncio.create_task(wakeups.lazy_sleep(3600.0, 3600.0))
        await asyncio.sleep(0)  # one loop turn: the task starts and registers its entry
        lazy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lazy
        await asyncio.sleep(0.001)  # the loop sleeps once more: the dead entry is dropped first
        assert selector._lazy == [] and selector.stats.lazy == 0

    _run(main)


def test_a_callback_when_idle_runs_once_the_loop_has_nothing_else_to_run() -> None:
    async def main() -> None:
        calls: list[str] = []
        wakeups.call_when_idle(lambda: calls.append("idle"), 3600.0)
        for _ in range(5):
            await asyncio.sleep(0)  # the loop is busy: this task is ready again at once
            assert calls == []
        cancelled = wakeups.call_when_idle(lambda: calls.append("cancelled"), 3600.0)
        cancelled.cancel()
        await asyncio.sleep(0.05)  # the loop would sleep (50 ms: 1 ms may pass before a busy loop polls)
        assert calls == ["idle"]
        busy_since = time.monotonic()
        wakeups.call_when_idle(lambda: calls.append("busy"), 0.02)
        wakeups.call_when_idle(lambda: calls.append("when idle"), 3600.0)
        while len(calls) < 2 and time.monotonic() - busy_since < BOUND_S:
            await asyncio.sleep(0)  # a loop that never sleeps runs it by its latest
        assert calls == ["idle", "busy"] and time.monotonic() - busy_since >= 0.02
        for _ in range(3):
            await asyncio.sleep(0)  # still busy: the other one waits for the loop to be idle
        assert calls == ["idle", "busy"]
        await asyncio.sleep(0.05)  # the loop would sleep (50 ms, as above): the waiting one runs first
        assert calls == ["idle", "busy", "when idle"]

    _run(main)


def test_lazy_sleeps_and_idle_callbacks_on_any_other_loop_are_timers() -> None:
    async def main() -> None:
        assert deferring_selector() is None
        started = time.monotonic()
        await wakeups.lazy_sleep(0.01, 3600.0)
        assert time.monotonic() - started < BOUND_S
        called = asyncio.Event()
        handle = wakeups.call_when_idle(called.set, 0.01)
        assert isinstance(handle, asyncio.TimerHandle)
        await asyncio.wait_for(called.wait(), BOUND_S)

    asyncio.run(main())


# --- the selector's arithmetic, with a fake clock and the platform's select replaced -----------


class FakeTransport:
    """What `hold` needs of a socket transport; its socket is one end of a real socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closing = False
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Arithmetic:
    """A DeferringSelector at clock `now`, whose underlying select records the timeout it is given
    (and runs `during`, as if while asleep) instead of sleeping."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 100.0
        self.timeouts: list[float | None] = []
        self.during: Callable[[], None] = lambda: None
        self.selector = DeferringSelector(lambda: self.now)
        self.pairs = [socket.socketpair() for _ in range(2)]
        self.transports = [FakeTransport(ours) for ours, _ in self.pairs]

        def select(selector: Any, timeout: float | None = None) -> list[Any]:
            self.timeouts.append(timeout)
            self.during()
            return []

        monkeypatch.setattr(selectors.DefaultSelector, "select", select)

    def close(self) -> None:
        for ours, peer in self.pairs:
            ours.close()
            peer.close()


@pytest.fixture
def arithmetic(monkeypatch: pytest.MonkeyPatch) -> Any:
    made = Arithmetic(monkeypatch)
    try:
        yield made
    finally:
        made.close()


def test_the_sleep_ends_at_the_earliest_of_the_loops_timeout_a_held_delay_and_a_lazy_latest(
    arithmetic,
) -> None:
    a, selector = arithmetic, arithmetic.selector
    loop = asyncio.new_event_loop()
    try:
        assert selector.hold(a.transports[0], 0.05)  # held until 100.05
        selector.select(10.0)
        assert a.timeouts[-1] == pytest.approx(0.05)  # the held delay, not the loop's 10 s
        selector.select(0.01)
        assert a.timeouts[-1] == 0.01  # a shorter sleep the loop asked for is kept
        later = loop.create_future()
        selector.resolve_lazily(later, 1.0, 2.0)  # due from 101.0, by 102.0 at the latest
        a.now = 100.2  # the held delay ran out: no sleep, and it is listened to again
        selector.select(10.0)
        assert a.timeouts[-1] == 0 and a.transports[0].reading and selector.stats.deadline == 1
        selector.select(10.0)
        assert a.timeouts[-1] == pytest.approx(1.8)  # until the lazy entry's latest
        assert not later.done() and selector.stats.sleeps == 3
        a.now = 101.5  # the lazy entry is due as the loop is about to sleep: it does not sleep
        selector.select(10.0)
        assert a.timeouts[-1] == 0 and later.done() and selector.stats.lazy == 1
        assert selector.stats.sleeps == 3  # (a poll, not a sleep)
        selector.select(10.0)  # nothing left: the loop's own timeout
        assert a.timeouts[-1] == 10.0 and selector.stats.sleeps == 4
    finally:
        loop.close()


def test_polls_and_sleeps_are_counted_apart_on_either_path(arithmetic) -> None:
    a, selector = arithmetic, arithmetic.selector
    selector.select(0)
    selector.select(0)
    selector.select(1.0)
    assert selector.stats.sleeps == 1  # nothing held: the plain path counts too
    assert selector.hold(a.transports[0], 3600.0)
    selector.select(0)
    selector.select(1.0)
    selector.select(None)
    assert selector.stats.sleeps == 3


def test_holds_releases_and_let_go_are_counted_one_by_one(arithmetic) -> None:
    a, selector = arithmetic, arithmetic.selector
    first, second = a.transports
    assert selector.hold(first, 3600.0) and selector.hold(second, 3600.0)
    assert selector.stats.held == 2 and selector.holding == 2
    a.during = lambda: [peer.send(b"x") for _, peer in a.pairs]  # bytes come while the loop sleeps
    selector.select(1.0)
    assert selector.stats.on_wake == 2 and selector.holding == 0 and first.reading and second.reading
    assert selector.stats.waiting == 0  # nothing waited before the sleep
    assert selector.hold(first, 3600.0)
    assert selector.let_go(first) and first.reading and selector.holding == 0
    assert not selector.let_go(first)  # not held (any more): nothing to do


def test_a_held_transport_found_closing_before_a_sleep_is_dropped(arithmetic) -> None:
    a, selector = arithmetic, arithmetic.selector
    assert selector.hold(a.transports[0], 3600.0)
    a.transports[0].closing = True
    selector.select(1.0)
    assert selector.holding == 0 and selector.stats.closed == 1 and selector.stats.deadline == 0


def test_a_lazy_sleep_asks_to_be_resolved_between_its_delay_and_its_slack() -> None:
    async def main() -> None:
        selector = _picker_selector()
        started = selector._clock()
        sleeping = asyncio.create_task(wakeups.lazy_sleep(30.0, 60.0))
        await asyncio.sleep(0)  # it registers
        (entry,) = selector._lazy
        assert entry.earliest - started == pytest.approx(30.0, abs=1.0)
        assert entry.latest - started == pytest.approx(90.0, abs=1.0)
        sleeping.cancel()

    _run(main)


def test_a_loop_busy_with_sockets_reads_a_held_socket_when_bytes_wait_not_at_its_delay() -> None:
    async def main() -> None:
        held, held_peer = await _connected()
        other, other_peer = await _connected()
        selector = _picker_selector()
        assert selector.hold(held.transport, max_delay_s=3600.0)
        held_peer.send(b"held")
        other_peer.send(b"busy")  # a poll of the busy loop finds this socket ready
        deadline = time.monotonic() + BOUND_S
        while len(held.data) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0)  # never sleeps: every select of the loop is a poll
        assert held.data == b"held" and other.data == b"busy" and selector.stats.on_wake == 1
        held_peer.close()
        other_peer.close()

    _run(main)
