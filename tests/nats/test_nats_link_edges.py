"""`NatsLink` at its edges, against a real nats-server: what its watchers and counters are told when
the server goes away, comes back or stops answering, how fast it retries, what a close leaves
behind, and the reconnect backoff itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from nats.aio.client import Server

from extproc.devstack.procs import reserve_port, start_nats_server
from extproc.events import nats_events
from extproc.events.counters import EventCounters
from extproc.events.nats_events import NatsLink, _backoff

from .conftest import connect, eventually


def kill(server) -> None:
    os.kill(server.pid, signal.SIGKILL)
    server.stop()  # reaps it


class Watcher:
    """A `NatsLink` watcher remembering every (up, reason) it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[bool, str]] = []

    def __call__(self, up: bool, reason: str) -> None:
        self.calls.append((up, reason))


# --- the reconnect backoff (nats.py's reconnect_to_server_handler) --------------------------------


def servers(*reconnects: int) -> list[Server]:
    return [
        Server(uri=urlparse(f"nats://127.0.0.1:{4222 + i}"), reconnects=n) for i, n in enumerate(reconnects)
    ]


def test_backoff_retries_the_least_retried_server():
    pool = servers(3, 5, 1, 2)
    server, _ = _backoff(pool, {})
    assert server is pool[2]


def test_backoff_doubles_from_a_tenth_of_a_second_up_to_five_with_jitter_down_to_half():
    for attempts in range(20):
        full = min(5.0, 0.1 * 2**attempts)
        delays = [_backoff(servers(attempts), {})[1] for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays), (attempts, min(delays), max(delays))
        # jittered across the whole range, so that restarted pickers do not retry in step
        assert min(delays) < 0.6 * full and max(delays) > 0.9 * full, (attempts, min(delays), max(delays))


# --- state and counters -----------------------------------------------------------------------------


async def test_a_link_never_connected_is_down_has_no_connection_and_closes_as_a_no_op():
    link = NatsLink()
    assert link.up is False
    with pytest.raises(RuntimeError, match="not connected"):
        link.nc  # noqa: B018
    await link.close()
    assert link.up is False


async def test_a_link_whose_server_restarts_reports_down_then_up_once_each_and_counts_both(
    nats_server, restart_nats
):
    link = await connect(nats_server, "restarting")
    watcher = Watcher()
    link.watch(watcher)
    try:
        kill(nats_server)
        await eventually(lambda: watcher.calls, what="the link reports the loss")
        assert [up for up, _ in watcher.calls] == [False]
        assert "connection lost" in watcher.calls[0][1].lower()
        assert link.up is False
        assert link.counters["nats.disconnect"] == 1
        assert link.counters["nats.error"] >= 1  # the end of the stream, then each refused attempt

        restart_nats(nats_server.port)
        await eventually(lambda: link.up, timeout_s=10, what="the link reconnects")
        assert [up for up, _ in watcher.calls] == [False, True]
        assert "reconnected" in watcher.calls[1][1].lower()
        assert link.counters["nats.reconnect"] == 1
        assert link.counters["nats.disconnect"] == 1
    finally:
        await link.close()
    # a close is reported once, as down (nats.py calls its disconnected callback, then closed)
    assert [up for up, _ in watcher.calls] == [False, True, False]
    assert all(isinstance(reason, str) and reason for _, reason in watcher.calls)
    assert link.up is False


async def test_an_unwatched_watcher_hears_nothing_and_unwatching_twice_is_harmless(nats_server):
    link = await connect(nats_server, "watched")
    gone, staying = Watcher(), Watcher()
    unwatch = link.watch(gone)
    link.watch(staying)
    try:
        unwatch()
        unwatch()
        kill(nats_server)
        await eventually(lambda: staying.calls, what="the remaining watcher hears the loss")
        assert [up for up, _ in staying.calls] == [False]
        assert gone.calls == []
    finally:
        await link.close()


async def test_overflow_of_a_subscription_whose_handler_was_removed_is_counted_as_a_client_error(
    nats_server,
):
    link = await connect(nats_server, "slow")
    release = asyncio.Event()

    async def held(_msg) -> None:
        await release.wait()

    removed_calls: list[int] = []
    kept_calls: list[int] = []
    try:
        removed_sub = await link.nc.subscribe("slow.removed", cb=held, pending_msgs_limit=1)
        kept_sub = await link.nc.subscribe("slow.kept", cb=held, pending_msgs_limit=1)
        stop = link.on_overflow(removed_sub, lambda: removed_calls.append(1))
        link.on_overflow(kept_sub, lambda: kept_calls.append(1))
        stop()
        stop()  # harmless
        for i in range(6):  # one taken by the held callback, one queued, the rest dropped
            await link.nc.publish("slow.removed", b"%d" % i)
            await link.nc.publish("slow.kept", b"%d" % i)
        await link.nc.flush()
        await eventually(
            lambda: len(kept_calls) >= 4 and link.counters["nats.error"] >= 4,
            what=lambda: f"drops handled {len(kept_calls)}, counted as errors {link.counters.snapshot()}",
        )
        assert removed_calls == []
    finally:
        release.set()
        await link.close()


# --- close ---------------------------------------------------------------------------------------------


async def test_closing_a_lost_link_with_a_subscription_without_callback_ends_quietly_reported_down_once(
    nats_server,
):
    """A pull-style subscription (no callback, read with next_msg) has no delivery task."""
    link = await connect(nats_server, "lost-at-close")
    watcher = Watcher()
    link.watch(watcher)
    received: list[bytes] = []

    async def on_message(msg) -> None:
        received.append(msg.data)

    await link.nc.subscribe("probe.cb", cb=on_message)
    pull = await link.nc.subscribe("probe.pull")
    await link.nc.publish("probe.pull", b"queued")
    await link.nc.flush()
    assert (await pull.next_msg(timeout=2)).data == b"queued"
    kill(nats_server)
    await eventually(lambda: not link.up, what="the link sees the server gone")
    await link.nc.publish("probe.cb", b"buffered while disconnected")  # makes nats.py's close fail

    await asyncio.wait_for(link.close(), 5)

    assert link.nc.is_closed
    assert link.up is False
    assert [up for up, _ in watcher.calls] == [False]  # the loss, and nothing more at close


# --- connection options ----------------------------------------------------------------------------


class SilentServer:
    """Accepts TCP connections on loopback and never answers (a hung server)."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self._closing = False
        self.url = ""

    async def __aenter__(self) -> SilentServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def _accept(self, _reader, writer) -> None:
        self.writers.append(writer)
        if self._closing:  # accepted as the server closed: no socket left behind
            writer.close()

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._closing = True
        self._server.close()
        for writer in self.writers:
            writer.close()
        await self._server.wait_closed()


async def first_attempt_given_up_after(url: str, **kwargs) -> float:
    """Seconds until the first connection attempt to `url` fails (counted as a client error)."""
    counters = EventCounters()
    start = time.monotonic()
    task = asyncio.create_task(NatsLink.connect(url, counters=counters, **kwargs))
    try:
        await eventually(
            lambda: counters["nats.error"] >= 1, timeout_s=4.0, what="the first attempt given up"
        )
        return time.monotonic() - start
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_attempt_on_a_server_that_never_answers_is_given_up_after_connect_timeout_s():
    async with SilentServer() as silent:
        assert await first_attempt_given_up_after(silent.url, connect_timeout_s=0.3) < 1.5


async def test_by_default_an_attempt_on_a_server_that_never_answers_is_given_up_after_two_seconds():
    async with SilentServer() as silent:
        assert 1.8 <= await first_attempt_given_up_after(silent.url) < 2.8


async def test_the_links_name_and_its_connect_options_reach_the_server(tmp_path: Path):
    """Credentials (like TLS) go through `options`; the name is how the server lists the client."""
    with reserve_port() as monitor:
        server = start_nats_server(
            store_dir=tmp_path,
            jetstream=False,
            extra_args=["-m", str(monitor.port), "--user", "picker", "--pass", "secret"],
        )
        try:
            link = await asyncio.wait_for(
                NatsLink.connect(server.url, name="picker-a", user="picker", password="secret"), 3
            )
            try:
                assert await listed_connections(monitor.port) == ["picker-a"]
            finally:
                await link.close()
        finally:
            server.stop()


async def listed_connections(monitor_port: int) -> list[str]:
    """The names of the connections nats-server's monitoring port lists, once it lists any (bounded)."""
    names: list[str] = []

    async def listed() -> bool:
        names[:] = await asyncio.to_thread(connection_names, monitor_port)
        return bool(names)

    await eventually(listed, what="the server lists the connection")
    return names


def connection_names(monitor_port: int) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/connz", timeout=2) as answer:
            return [c.get("name", "") for c in json.load(answer).get("connections") or []]
    except OSError:
        return []  # the monitoring port is not up yet


# --- dead connections and retries -----------------------------------------------------------------


class HalfOpenProxy:
    """A TCP proxy to nats-server; `freeze` makes the connections open now half-open: nothing they
    send is forwarded (their PINGs are counted) and nothing comes back. Later connections pass."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.url = ""
        self.frozen: set[int] = set()  # ids of frozen connections
        self.swallowed: dict[int, bytes] = {}
        self._connections = 0
        self._open: list[int] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self._closing = False

    async def __aenter__(self) -> HalfOpenProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def freeze(self) -> None:
        self.frozen.update(self._open)

    def pings_swallowed(self, conn: int) -> int:
        return self.swallowed.get(conn, b"").count(b"PING\r\n")

    async def _accept(self, client_r, client_w) -> None:
        conn = self._connections
        self._connections += 1
        self._open.append(conn)
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [client_w, server_w]
        if self._closing:  # accepted as the proxy closed: no socket left behind
            for writer in (client_w, server_w):
                writer.close()
            return
        pumps = [
            asyncio.create_task(self._pump(conn, client_r, server_w, upstream=True)),
            asyncio.create_task(self._pump(conn, server_r, client_w, upstream=False)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        self._open.remove(conn)
        for writer in (client_w, server_w):
            writer.close()

    async def _pump(self, conn: int, reader, writer, *, upstream: bool) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if conn not in self.frozen:
                    writer.write(data)
                elif upstream:
                    self.swallowed[conn] = self.swallowed.get(conn, b"") + data

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._closing = True
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


async def test_a_half_open_connection_is_declared_dead_after_three_unanswered_pings_and_replaced(
    nats_server, monkeypatch
):
    monkeypatch.setattr(nats_events, "PING_INTERVAL_S", 0.1)  # 20 s in production
    async with HalfOpenProxy(nats_server.port) as proxy:
        link = await NatsLink.connect(proxy.url, name="half-open")
        proxy.freeze()  # before the first ping: none is outstanding
        watcher = Watcher()
        link.watch(watcher)
        try:
            await eventually(lambda: watcher.calls, timeout_s=3, what="the dead connection noticed")
            assert watcher.calls[0][0] is False
            assert proxy.pings_swallowed(0) == 3
            await eventually(lambda: link.up, timeout_s=5, what="a new connection through the proxy")
            await link.nc.flush(timeout=2)  # the new connection answers
        finally:
            await link.close()


async def test_after_an_outage_the_link_retries_within_a_fraction_of_a_second(nats_server):
    link = await connect(nats_server, "retrying")
    try:
        kill(nats_server)
        await eventually(lambda: not link.up, what="the link sees the server gone")
        errors = link.counters["nats.error"]
        # backoff 0.05-0.1 s, then 0.1-0.2 s, 0.2-0.4 s: three refused attempts within 0.7 s
        # (nats.py's own pacing waits 2 s before each)
        await eventually(lambda: link.counters["nats.error"] >= errors + 3, timeout_s=3.0, what="retries")
    finally:
        await link.close()


async def test_a_link_retries_without_limit_and_reconnects_after_a_long_outage(
    nats_server, restart_nats, monkeypatch
):
    """nats.py gives up after 60 failed attempts by default (minutes of outage at 5 s each)."""
    monkeypatch.setattr(nats_events, "RECONNECT_BASE_S", 0.001)
    monkeypatch.setattr(nats_events, "RECONNECT_MAX_S", 0.002)
    link = await connect(nats_server, "patient")
    try:
        kill(nats_server)
        await eventually(
            lambda: link.counters["nats.error"] > 80 or link.nc.is_closed,
            timeout_s=5,
            what="more refused attempts than nats.py's default limit",
        )
        assert not link.nc.is_closed
        restart_nats(nats_server.port)
        await eventually(lambda: link.up, timeout_s=10, what="the link reconnects")
        assert link.counters["nats.reconnect"] == 1
    finally:
        await link.close()


async def test_a_deliberate_close_is_reported_as_closed_and_not_counted_as_a_loss(nats_server):
    counters = EventCounters()
    link = await connect(nats_server, "picker", counters)
    watcher = Watcher()
    link.watch(watcher)
    await link.close()
    assert watcher.calls == [(False, "NATS connection closed")]
    assert counters["nats.disconnect"] == 0


async def test_closing_a_link_that_lost_its_server_reports_nothing_more(nats_server):
    """Down already: the close neither reports it up for a moment nor down a second time."""
    link = await connect(nats_server, "lost")
    watcher = Watcher()
    link.watch(watcher)
    kill(nats_server)
    await eventually(lambda: watcher.calls, what="the link reports the loss")
    await link.close()
    assert watcher.calls == [(False, "NATS connection lost")] and link.up is False
