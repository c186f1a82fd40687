"""A real nats-server (JetStream on) per test, on a loopback port held for the test, stopped by pid.

Helpers: `nats_server` (a `NatsServer`: `.port`, `.url`, `.pid`), `restart_nats` (a new
server on the same port and store, to follow a kill), `dynamo` (Dynamo's own KV event publisher in
a child process on that server: `dynamo_helpers.DynamoWorker`), `make_router`, `connect`,
`eventually` (poll with a deadline), `prime` (until the server delivers between two connections).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio

from extproc.devstack.procs import NatsServer, reserve_port, start_nats_server
from extproc.events.counters import EventCounters
from extproc.events.dynamo_json import encode_event
from extproc.events.feed import RouterFeed
from extproc.events.nats_events import NatsLink
from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.types import AllBlocksCleared, Worker
from tests.router.clock import FakeClock

BLOCK_SIZE = 4
WORKER_IDS = ("7", "8")  # Dynamo's u64 worker ids 7 and 8, as the picker's config names them


@pytest.fixture
def nats_store(tmp_path: Path) -> Path:
    return tmp_path / "jetstream"


@pytest.fixture
def nats_server(nats_store: Path) -> Iterator[NatsServer]:
    # The port is held for the whole test: `restart_nats` starts a server there again after a kill,
    # and nobody else can take it meanwhile (a server started with no port reports its own instead).
    with reserve_port() as port:
        server = start_nats_server(port.port, store_dir=nats_store)
        try:
            yield server
        finally:
            server.stop(grace_s=2.0)


@pytest.fixture
def restart_nats(nats_store: Path) -> Iterator[Callable[[int], NatsServer]]:
    """Start nats-server again on `port` with the same store; stopped at teardown."""
    started: list[NatsServer] = []

    def restart(port: int) -> NatsServer:
        server = start_nats_server(port, store_dir=nats_store)
        started.append(server)
        return server

    try:
        yield restart
    finally:
        for server in started:
            server.stop(grace_s=2.0)


@pytest_asyncio.fixture
async def dynamo(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator:
    """Dynamo's own publishers in a child process (a `dynamo_helpers.DynamoWorker`), stopped by pid."""
    from .dynamo_helpers import DynamoWorker, require_dynamo  # it imports this module

    require_dynamo()
    worker = await DynamoWorker.start(nats_server.url, tmp_path / "dynamo-worker.log")
    try:
        yield worker
    finally:
        await worker.stop()


def make_router(*worker_ids: str) -> KvRouter:
    return KvRouter(
        # Dynamo's cost: the replica tests count a request's prefill tokens until its first token
        RouterConfig(block_size=BLOCK_SIZE, use_kv_events=True, prefill_load_model="none"),
        clock=FakeClock(),
        rng=random.Random(0),
        workers=[WorkerSpec(w) for w in worker_ids or WORKER_IDS],
    )


def make_feed(router: KvRouter) -> RouterFeed:
    return RouterFeed({w.worker_id: router for w in router.workers()}, EventCounters())


async def connect(server: NatsServer, name: str, counters: EventCounters | None = None) -> NatsLink:
    return await NatsLink.connect(server.url, name=name, counters=counters)


async def eventually(
    predicate: Callable[[], object], timeout_s: float = 5.0, what: str | Callable[[], str] = ""
) -> None:
    """Poll `predicate` on the event loop until it is true; fail after `timeout_s` seconds.

    `predicate` may return an awaitable (an async check). `what` describes the condition in the
    failure message (a callable is asked at failure time).
    """
    deadline = time.monotonic() + timeout_s
    while not await _value(predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"not true after {timeout_s} s: {what() if callable(what) else what or predicate}")
        await asyncio.sleep(0.01)


def matches(router: KvRouter, local_hashes: list[int]) -> dict:
    """The router's overlap per worker for `local_hashes`, workers with none left out."""
    return {w: n for w, n in router.indexer.find_matches(local_hashes).items() if n}


async def _value(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


async def prime(
    publish_probe: Callable[[int], object], delivered: Callable[[], object], timeout_s: float = 5.0
) -> int:
    """Publish probes (numbered 0, 1, ...) until one is delivered; returns how many were sent.

    nats-server may drop messages published in the first moments after a subscription was made on
    another connection, even after a flush on both sides (nats-io/nats-server#5677, seen here with
    JetStream on); NATS core is at most once. Tests that count messages prime the path first.
    """
    deadline = time.monotonic() + timeout_s
    sent = 0
    while True:
        await _value(publish_probe(sent))
        sent += 1
        probe_deadline = time.monotonic() + 0.05
        while time.monotonic() < probe_deadline:
            if await _value(delivered()):
                return sent
            await asyncio.sleep(0.005)
        if time.monotonic() > deadline:
            pytest.fail(f"no probe delivered after {timeout_s} s")


PROBE_WORKER_BASE = 10**6  # probe events come from worker ids the routers do not know


async def prime_events(nc, subject: str, delivered: Callable[[], object]) -> int:
    """Prime a Dynamo KV event subject from `nc` with `cleared` events of unknown workers."""

    async def probe(n: int) -> None:
        event = AllBlocksCleared(Worker(str(PROBE_WORKER_BASE + n)))
        await nc.publish(subject, encode_event(PROBE_WORKER_BASE + n, event, 0, 0))
        await nc.flush()

    return await prime(probe, delivered)


def from_another_thread(server: NatsServer, action: Callable[[Any], Awaitable[None]]) -> None:
    """Run `action(jetstream)` on its own connection and event loop, and wait until it is done.

    Called from a callback on the test's event loop, this holds that loop still meanwhile: what the
    action changes on the server happens between two steps of the code under test."""

    async def run() -> None:
        nc = await nats.connect(server.url)
        try:
            await action(nc.jetstream())
        finally:
            await nc.close()

    thread = threading.Thread(target=asyncio.run, args=(run(),))
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the action on another thread did not finish in 30 s"


def on_first_chunk(
    server: NatsServer, action: Callable[[Any], Awaitable[None]]
) -> Callable[[int, int], None]:
    """A progress callback for `read_object` that runs `action` (see `from_another_thread`) once,
    when the first chunk has been read."""
    done: list[bool] = []

    def on_chunk(read: int, size: int) -> None:
        if not done:
            done.append(True)
            from_another_thread(server, action)

    return on_chunk
