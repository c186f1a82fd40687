"""Local-indexer recovery against Dynamo 1.6.1's own worker side (issue 23).

Dynamo's runtime (ai-dynamo-runtime 1.6.1) runs in a child process (`tests/nats/dynamo_worker.py`)
with its file discovery (`DYNAMO_WORKER_DISCOVERY=file`, the store in the test's directory): each
`KvEventPublisher(enable_local_indexer=True)` advertises its local indexer's query endpoint there and
serves it on the runtime's TCP request plane. The picker is started as `serve` starts it, from a
Dynamo user's flags (`--discovery-backend file --file-kv <store>`), and queries those endpoints
itself (`extproc.events.dynamo_recovery`). Everything is on 127.0.0.1; conditions are polled with a
deadline; the child is stopped by pid.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from extproc.config import load_config
from extproc.devstack.procs import NatsServer
from extproc.events.dynamo_recovery import read_file_sources
from extproc.events.sources import EventSources, start_event_sources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import KvRouter
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import BlocksStored, Worker

from .conftest import eventually
from .dynamo_helpers import BS, ENDPOINT, DynamoWorker, primed, require_dynamo

W7, W7_DP1, W8 = Worker("w7"), Worker("w7", 1), Worker("w8")
CONFIG = """\
workers:
  - {id: w7, endpoint: "127.0.0.1:8001", model: m, instance-id: 7, dp-size: 2}
  - {id: w8, endpoint: "127.0.0.1:8002", model: m, instance-id: 8}
"""


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> Path:
    return tmp_path / "dynamo_store_kv"


@pytest_asyncio.fixture
async def worker(nats_server: NatsServer, tmp_path: Path, store: Path) -> AsyncIterator[DynamoWorker]:
    """Dynamo's runtime with file discovery at `store`, stopped by pid."""
    require_dynamo()
    process = await DynamoWorker.start(
        nats_server.url,
        tmp_path / "dynamo-worker.log",
        DYNAMO_WORKER_DISCOVERY="file",
        DYN_FILE_KV=str(store),
    )
    try:
        yield process
    finally:
        await process.stop()


@contextlib.asynccontextmanager
async def picker(
    nats_server: NatsServer, tmp_path: Path, store: Path
) -> AsyncIterator[tuple[KvRouter, EventSources]]:
    path = tmp_path / "picker.yaml"
    path.write_text(CONFIG)
    argv = ["--config", str(path), "--nats-url", nats_server.url, "--kv-cache-block-size", str(BS)]
    argv += ["--dynamo-endpoint", ENDPOINT, "--discovery-backend", "file", "--file-kv", str(store)]
    config = load_config(argv, environ={})
    assert config.events.dynamo_file_kv == str(store)
    assert any("rebuilt from it" in line for line in config.notices), config.notices
    p = EndpointPicker(config)
    sources = await start_event_sources(config, p)
    try:
        assert sources.recovery is not None
        yield p.pools["m"].router, sources
    finally:
        await sources.stop()


def h(tokens: list[int], **salting: str) -> list[int]:
    return compute_block_hashes(tokens, BS, **salting)


def held(router: KvRouter) -> list[tuple[Worker, int]]:
    """Every (worker, local hash) the index holds, as often as it holds it."""
    return sorted(
        (e.worker, b.local_hash)
        for e in router.dump_events()
        if isinstance(e, BlocksStored)
        for b in e.blocks
    )


async def advertised(store: Path, *keys: tuple[int, int]) -> None:
    """Until the worker's file discovery lists a local indexer for each (worker id, dp rank)."""
    await eventually(
        lambda: (
            {(t.wire_worker, t.dp_rank) for t in read_file_sources(str(store), "ns1", "backend", "generate")}
            >= set(keys)
        ),
        what=f"local indexers of {keys} advertised in {store}",
    )


async def test_a_picker_started_after_the_workers_published_rebuilds_them_and_routes_on_them(
    nats_server, worker, tmp_path, store
):
    await worker.publisher("w7", 7, enable_local_indexer=True)
    await worker.publisher("w7dp1", 7, dp_rank=1, enable_local_indexer=True)
    await worker.publisher("w8", 8, enable_local_indexer=True)
    a, b = list(range(64)), list(range(1000, 1032))
    await worker.stored("w7", a[:32], [11, 12])
    await worker.stored("w7", a[32:48], [13], parent=12)
    await worker.stored("w7", a[48:], [14], parent=13)
    await worker.call("removed", name="w7", block_hashes=[14])  # the dump holds what is left
    branch = [*a[:32], *range(3000, 3016)]
    await worker.stored("w7", branch[32:], [17], parent=12)  # a second child of block 12
    await worker.stored("w7dp1", a[:16], [21])
    await worker.stored("w8", b, [31, 32], lora_name="my-lora")
    await advertised(store, (7, 0), (7, 1), (8, 0))

    async with picker(nats_server, tmp_path, store) as (router, sources):
        recovery = sources.recovery
        assert recovery is not None
        others = [(W7_DP1, h(a)[0]), *((W8, x) for x in h(b, lora_name="my-lora"))]
        expected = sorted([*((W7, x) for x in h(a)[:3]), (W7, h(branch)[2]), *others])
        await eventually(lambda: held(router) == expected, what=lambda: f"{held(router)} != {expected}")
        assert sources.counters["recovery.dump"] == 3 and sources.counters["recovery.query_failed"] == 0
        assert recovery.cursor(W7) == 5 and recovery.cursor(W7_DP1) == 1 and recovery.cursor(W8) == 1
        decision = router.best_worker(a)  # only the local indexer can have told the picker these blocks
        assert (decision.worker, decision.overlap_blocks) == (W7, 3)
        assert router.best_worker(branch).overlap_blocks == 3  # the dump kept the branch under its parent
        assert router.best_worker(b, lora_name="my-lora").worker == W8
        assert {sources.feed.state(w) for w in (W7, W7_DP1, W8)} == {"event-fed"}
        await primed(worker, sources)  # the picker hears the worker's live events from here on

        # the live stream goes on from the dump: applied once each, in order, nothing lost
        c = list(range(2000, 2016))
        await worker.stored("w7", a[48:], [15], parent=13)  # event 6
        await worker.call("removed", name="w7", block_hashes=[13, 15])  # event 7
        await worker.stored("w8", c, [33])  # event 2
        expected = sorted([*((W7, x) for x in h(a)[:2]), (W7, h(branch)[2]), *others, (W8, h(c)[0])])
        await eventually(lambda: held(router) == expected, what=lambda: f"{held(router)} != {expected}")
        await eventually(lambda: recovery.cursor(W7) == 7 and recovery.cursor(W8) == 2)
        assert router.best_worker(a).overlap_blocks == 2


async def test_lost_events_are_asked_of_the_local_indexer_and_a_new_worker_is_rebuilt(
    nats_server, worker, tmp_path, store
):
    async with picker(nats_server, tmp_path, store) as (router, sources):
        recovery, subscriber = sources.recovery, sources.nats_events
        assert recovery is not None and subscriber is not None
        await primed(worker, sources)
        await worker.publisher("w8", 8, enable_local_indexer=True)  # appears after the picker started
        await advertised(store, (8, 0))
        tokens = list(range(64))
        await worker.stored("w8", tokens[:16], [1])  # event 1: the worker is found and rebuilt
        await eventually(lambda: recovery.cursor(W8) == 1, what="w8 rebuilt from its local indexer")

        # lose one event-plane message on the way to the picker, as NATS core may
        handle, lost = subscriber.handle_event_plane, list[bytes]()

        def lossy(data: bytes, subject: str | None = None) -> None:
            if not lost:
                lost.append(data)
                return
            handle(data, subject)

        subscriber.handle_event_plane = lossy  # type: ignore[method-assign]
        await worker.stored("w8", tokens[16:32], [2], parent=1)  # event 2: lost
        await eventually(lambda: lost, what="event 2 reached the picker")
        await worker.stored("w8", tokens[32:48], [3], parent=2)  # event 3: shows the gap
        expected = sorted((W8, x) for x in h(tokens)[:3])
        await eventually(lambda: held(router) == expected, what=lambda: f"{held(router)} != {expected}")
        assert sources.counters["recovery.gap"] == 1 and sources.counters["recovery.catch_up"] == 1
        assert recovery.cursor(W8) == 3 and router.best_worker(tokens).overlap_blocks == 3

        # a restarted publisher numbers its events from 1 again: its new local indexer is dumped
        await worker.call("shutdown", name="w8")
        await worker.publisher("w8", 8, enable_local_indexer=True)
        other = list(range(500, 516))
        await worker.stored("w8", other, [9])
        await eventually(lambda: held(router) == [(W8, h(other)[0])], what=lambda: str(held(router)))
        assert sources.counters["recovery.restart"] == 1 and recovery.cursor(W8) == 1
        assert sources.counters["recovery.query_failed"] == 0


async def test_a_worker_added_to_the_picker_is_rebuilt_without_waiting_for_its_next_event(
    nats_server, worker, tmp_path, store
):
    await worker.publisher("w8", 8, enable_local_indexer=True)
    tokens = list(range(32))
    await worker.stored("w8", tokens, [1, 2])
    await advertised(store, (8, 0))
    only_w7 = tmp_path / "w7.yaml"
    only_w7.write_text(CONFIG.split("  - {id: w8")[0])
    argv = ["--nats-url", nats_server.url, "--kv-cache-block-size", str(BS), "--dynamo-endpoint", ENDPOINT]
    argv += ["--discovery-backend", "file", "--file-kv", str(store)]
    config = load_config(["--config", str(only_w7), *argv], environ={})
    p = EndpointPicker(config)
    sources = await start_event_sources(config, p)
    try:
        assert sources.recovery is not None
        await sources.recovery.wait_idle()
        router = p.pools["m"].router
        assert held(router) == [] and not sources.recovery.owns(W8)  # w8 is not the picker's yet
        full = tmp_path / "both.yaml"
        full.write_text(CONFIG)
        p.set_workers("m", load_config(["--config", str(full), *argv], environ={}).workers)
        await eventually(
            lambda: held(router) == sorted((W8, x) for x in h(tokens)), what=lambda: str(held(router))
        )
        assert sources.recovery.cursor(W8) == 1 and router.best_worker(tokens).worker == W8
    finally:
        await sources.stop()
