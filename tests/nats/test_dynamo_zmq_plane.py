"""Dynamo's ZMQ event plane, against Dynamo 1.6.1's own publishers (`--event-plane zmq`).

Dynamo's runtime (ai-dynamo-runtime 1.6.1, the `compat` extra) runs in a child process
(`tests/nats/dynamo_worker.py`) with `event_plane="zmq"` and its file discovery (the store in the
test's directory): each `KvEventPublisher` binds its own PUB socket and advertises it there, or, with
DYN_ZMQ_BROKER_URL, connects to the brokers. The picker is started as `serve` starts it, from a
Dynamo user's flags (`--event-plane zmq --discovery-backend file --file-kv <store>`, or
`--zmq-broker-url`), with no NATS server at all. Dynamo's broker is a separate program that its
wheel does not ship; the brokers here are libzmq's own XSUB/XPUB proxy (`zmq.proxy`), which is what
such a broker is. Everything binds 127.0.0.1; conditions are polled with a deadline; the child is
stopped by pid.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_asyncio
import zmq

from extproc.config import load_config
from extproc.events import dynamo_zmq_plane
from extproc.events.counters import EventCounters
from extproc.events.dynamo_plane import event_plane_subject
from extproc.events.dynamo_zmq_plane import Channel, DynamoZmqPlaneSubscriber, read_file_channels, unframe
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources, start_event_sources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.types import Worker
from tests.router.clock import FakeClock

from .conftest import eventually
from .dynamo_helpers import BS, ENDPOINT, DynamoWorker, require_dynamo
from .test_dynamo_recovery import CONFIG, W7, W7_DP1, W8, advertised, h, held

RELEASES = ("1.6.1", "1.3.1")  # the compat extra's, and the last before 1.4 changed the plane's shapes
FIXTURES = Path(__file__).parent / "fixtures" / "dynamo-zmq-1.6.1"
SUBJECT = event_plane_subject("ns1", "backend", "generate")
TWO_BROKERS = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")  # not connected to: each message is fed twice


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> Path:
    return tmp_path / "dynamo_store_kv"  # as test_dynamo_recovery's


async def start_worker(tmp_path: Path, **env: str) -> DynamoWorker:
    require_dynamo()
    return await DynamoWorker.start(None, tmp_path / "dynamo-worker.log", **env)


@pytest_asyncio.fixture
async def worker(tmp_path: Path, store: Path) -> AsyncIterator[DynamoWorker]:
    """Dynamo's runtime on its ZMQ event plane with file discovery at `store`, stopped by pid."""
    process = await start_worker(tmp_path, DYNAMO_WORKER_DISCOVERY="file", DYN_FILE_KV=str(store))
    try:
        yield process
    finally:
        await process.stop()


@contextlib.asynccontextmanager
async def picker(tmp_path: Path, *flags: str) -> AsyncIterator[tuple[KvRouter, EventSources]]:
    path = tmp_path / "picker.yaml"
    path.write_text(CONFIG)
    argv = ["--config", str(path), "--kv-cache-block-size", str(BS), "--dynamo-endpoint", ENDPOINT, *flags]
    config = load_config(argv, environ={})
    assert config.events.hears_zmq_plane and config.events.nats_url is None
    assert any("hears Dynamo's ZMQ event plane" in line for line in config.notices), config.notices
    p = EndpointPicker(config)
    sources = await start_event_sources(config, p)
    try:
        assert sources.zmq_plane is not None
        yield p.pools["m"].router, sources
    finally:
        await sources.stop()


def direct(store: Path) -> tuple[str, ...]:
    return ("--event-plane", "zmq", "--discovery-backend", "file", "--file-kv", str(store))


async def heard(
    dynamo: DynamoWorker,
    name: str,
    worker: Worker,
    plane: DynamoZmqPlaneSubscriber,
    until: Callable[[], bool] | None = None,
) -> None:
    """Until the picker hears publisher `name` (`until`, by default: an event of `worker` arrived):
    removals of a block nobody stored, each after listing the store's newest publishers."""

    async def probe() -> None:
        await plane.rescan()  # without waiting for the next listing
        await dynamo.call("removed", name=name, block_hashes=[0])

    await keep_sending(
        probe, until or (lambda: plane.event_ids.knows(worker)), f"Dynamo's publisher {name} heard"
    )


async def keep_sending(send: Callable[[], object], done: Callable[[], object], what: str) -> None:
    """`send()` (awaited if it is a coroutine) until `done()` holds, at most 100 times 0.1 s: a ZMQ
    subscriber misses what a publisher sends before the subscription reached it."""
    for _ in range(100):
        sent = send()
        if inspect.isawaitable(sent):
            await sent
        with contextlib.suppress(pytest.fail.Exception):
            await eventually(done, 0.1)
            return
    pytest.fail(f"never: {what}")


def channels(store: Path) -> dict[int, str]:
    return {c.publisher_id: c.endpoint for c in read_file_channels(str(store), "ns1", "backend", "generate")}


async def test_the_picker_hears_each_publisher_dynamo_advertises_and_follows_them_as_they_come_and_go(
    worker, tmp_path, store
):
    await worker.publisher("w7", 7)
    await worker.call("removed", name="w7", block_hashes=[0])  # Dynamo advertises at the first event
    await eventually(lambda: len(channels(store)) == 1, what="w7's ZMQ publisher in the file store")
    async with picker(tmp_path, *direct(store)) as (router, sources):
        plane = sources.zmq_plane
        assert plane is not None
        assert set(plane.publishers) == set(channels(store).values())  # connected at start
        assert all(url.startswith("tcp://127.0.0.1:") for url in plane.publishers)
        await heard(worker, "w7", W7, plane)
        a = list(range(64))
        await worker.stored("w7", a[:32], [11, 12])
        await worker.stored("w7", a[32:48], [13], parent=12)
        await eventually(lambda: router.best_worker(a).overlap_blocks == 3, what=lambda: held(router))
        assert sources.feed.state(W7) == "event-fed"

        # a publisher that appears later (another dp rank, another worker) is found and heard
        await worker.publisher("w7dp1", 7, dp_rank=1)
        await worker.publisher("w8", 8)
        await heard(worker, "w7dp1", W7_DP1, plane)
        await heard(worker, "w8", W8, plane)
        assert len(plane.publishers) == 3
        await worker.stored("w7dp1", a[:16], [21])
        await worker.stored("w8", a[:32], [31, 32], lora_name="my-lora")
        expected = sorted(
            [
                *((W7, x) for x in h(a)[:3]),
                (W7_DP1, h(a)[0]),
                *((W8, x) for x in h(a[:32], lora_name="my-lora")),
            ]
        )
        await eventually(lambda: held(router) == expected, what=lambda: f"{held(router)} != {expected}")
        assert router.best_worker(a[:32], lora_name="my-lora").worker == W8

        # a publisher that shuts down leaves the store and is disconnected; its restart (a new
        # publisher, a new socket, event ids from 1 again) is heard, and its old blocks forgotten
        gone = channels(store)
        await worker.call("shutdown", name="w8")
        await eventually(lambda: len(channels(store)) == 2, what="w8 gone from the file store")
        await plane.rescan()
        assert len(plane.publishers) == 2
        await worker.publisher("w8", 8)
        await heard(worker, "w8", W8, plane, until=lambda: not any(w == W8 for w, _ in held(router)))
        assert len(plane.publishers) == 3 and set(plane.publishers) != set(gone.values())
        assert router.best_worker(a[:32], lora_name="my-lora").overlap_blocks == 0
        assert sources.counters["zmq_plane.event"] > 0 and sources.counters["zmq_plane.malformed"] == 0


async def test_a_picker_started_after_the_workers_rebuilds_them_from_their_local_indexers(
    worker, tmp_path, store
):
    """The picker misses what was published before it connected; the workers' local indexers have it."""
    await worker.publisher("w7", 7, enable_local_indexer=True)
    a = list(range(48))
    await worker.stored("w7", a[:32], [11, 12])
    await worker.stored("w7", a[32:], [13], parent=12)
    await advertised(store, (7, 0))
    async with picker(tmp_path, *direct(store)) as (router, sources):
        assert sources.recovery is not None
        await eventually(lambda: router.best_worker(a).overlap_blocks == 3, what=lambda: held(router))
        assert sources.counters["recovery.dump"] >= 1
        plane = sources.zmq_plane
        assert plane is not None
        await eventually(lambda: sources.recovery is not None and sources.recovery.cursor(W7) == 2)
        await worker.call("removed", name="w7", block_hashes=[13])  # event 3, live over ZMQ
        await eventually(lambda: router.best_worker(a).overlap_blocks == 2, what=lambda: held(router))
        assert sources.recovery.cursor(W7) == 3


@contextlib.contextmanager
def brokers(count: int) -> Iterator[list[tuple[str, str]]]:
    """`count` brokers (libzmq's XSUB/XPUB proxy, each in a thread, on 127.0.0.1): (xsub, xpub) URLs."""
    ctx = zmq.Context()
    urls, threads, controls = [], [], []
    for n in range(count):
        xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
        control = ctx.socket(zmq.PAIR)
        control.bind(f"inproc://broker-{n}")
        urls.append((
            f"tcp://127.0.0.1:{xsub.bind_to_random_port('tcp://127.0.0.1')}",
            f"tcp://127.0.0.1:{xpub.bind_to_random_port('tcp://127.0.0.1')}",
        ))  # fmt: skip

        def run(xsub: zmq.Socket = xsub, xpub: zmq.Socket = xpub, n: int = n) -> None:
            steer = ctx.socket(zmq.PAIR)
            steer.connect(f"inproc://broker-{n}")
            with contextlib.suppress(zmq.ContextTerminated):
                zmq.proxy_steerable(xsub, xpub, None, steer)
            for sock in (xsub, xpub, steer):
                sock.close(linger=0)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        controls.append(control)
    try:
        yield urls
    finally:
        for control in controls:
            control.send(b"TERMINATE")
            control.close(linger=0)
        for thread in threads:
            thread.join(5.0)
        ctx.term()


def broker_url(urls: list[tuple[str, str]]) -> str:
    return f"xsub={';'.join(x for x, _ in urls)} , xpub={';'.join(p for _, p in urls)}"


async def test_through_two_brokers_each_event_is_applied_once_and_other_endpoints_are_not_ours(tmp_path):
    with brokers(2) as urls:
        url = broker_url(urls)
        dynamo = await start_worker(tmp_path, DYN_ZMQ_BROKER_URL=url)
        try:
            async with picker(tmp_path, "--event-plane", "zmq", "--zmq-broker-url", url) as (router, sources):
                plane = sources.zmq_plane
                assert plane is not None and plane.brokers == tuple(p for _, p in urls)
                await dynamo.publisher("w7", 7)
                await heard(dynamo, "w7", W7, plane)
                a = list(range(48))
                await dynamo.stored("w7", a[:32], [11, 12])
                await dynamo.stored("w7", a[32:], [13], parent=12)
                await eventually(lambda: router.best_worker(a).overlap_blocks == 3, what=lambda: held(router))
                # every message came through both brokers; the second copy was dropped, so no event
                # id went back (which would have reset the worker) and none was applied twice
                await eventually(lambda: sources.counters["zmq_plane.duplicate"] >= 2)
                assert sources.counters["zmq_plane.gap"] == 0
                assert held(router) == sorted((W7, x) for x in h(a))

                # another component's worker publishes through the same brokers: a plain subscriber
                # there sees its events go by; the picker's subscription never takes them (its
                # worker id 8 is one of the picker's workers, so one taken would show)
                await dynamo.call(
                    "publisher", name="other", endpoint="ns1.prefill.generate", worker_id=8, block_size=BS
                )
                with zmq.Context() as ctx, ctx.socket(zmq.SUB) as onlooker:
                    onlooker.connect(urls[0][1])
                    onlooker.setsockopt(zmq.SUBSCRIBE, b"namespace.ns1.component.prefill.")
                    await keep_sending(
                        lambda: dynamo.stored("other", a[:16], [41]),
                        lambda: onlooker.poll(0),
                        "the other component's event through the broker",
                    )
                    onlooker.setsockopt(zmq.LINGER, 0)
                await dynamo.call("removed", name="w7", block_hashes=[13])  # after it, from our worker
                await eventually(lambda: router.best_worker(a).overlap_blocks == 2, what=lambda: held(router))
                assert not any(w == W8 for w, _ in held(router))
                assert sources.counters["zmq_plane.topic"] == 0  # filtered by the subscription itself
        finally:
            await dynamo.stop()


async def test_the_picker_says_when_it_cannot_hear_dynamos_zmq_event_plane(tmp_path):
    path = tmp_path / "picker.yaml"
    path.write_text(CONFIG)
    config = load_config(
        ["--config", str(path), "--event-plane", "zmq", "--discovery-backend", "etcd"], environ={}
    )
    assert not config.events.hears_zmq_plane
    assert not config.router.use_kv_events  # nothing to hear: the caches are predicted
    (line,) = [n for n in config.notices if n.startswith("--event-plane=zmq")]
    assert "cannot be heard" in line and "--zmq-broker-url" in line and "--discovery-backend file" in line


# --- the bytes Dynamo 1.6.1 and 1.3.1 sent (tests/nats/fixtures/capture_dynamo_zmq.py) -----------------


def captured(mode: str, release: str = "1.6.1") -> list[list[bytes]]:
    folder = FIXTURES.parent / f"dynamo-zmq-{release}"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["ai-dynamo-runtime"] == release
    return [
        msgpack.unpackb((folder / m["file"]).read_bytes()) for m in manifest["messages"] if m["mode"] == mode
    ]


def plane_into_router(subject: str = SUBJECT, **options: Any) -> tuple[KvRouter, DynamoZmqPlaneSubscriber]:
    """A subscriber (`options`: its brokers or channels, ...) feeding a router of worker w7's two dp
    ranks (Dynamo's worker id 7 is w7)."""
    config = RouterConfig(block_size=BS, use_kv_events=True)
    router = KvRouter(config, clock=FakeClock(), workers=[WorkerSpec("w7", (0, 1))])
    feed = RouterFeed({"w7": router}, EventCounters())
    plane = DynamoZmqPlaneSubscriber(feed, feed.counters, subject, worker_id_of=lambda i: f"w{i}", **options)
    return router, plane


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("mode", ["direct", "broker"])
def test_each_releases_messages_decode_to_what_each_call_asked_for(mode, release):
    messages = captured(mode, release)
    assert len(messages) == 4
    for frames in messages:
        topic, publisher_id, sequence, envelope = unframe(frames)
        # through a broker 1.6.1 names the whole subject; 1.3.1 the topic alone, as a direct publisher
        assert topic == (SUBJECT.encode() if (mode, release) == ("broker", "1.6.1") else b"kv-events")
        # 1.3.1's envelope carries one RouterEvent, 1.6.1's an array of them
        payload = msgpack.unpackb(msgpack.unpackb(envelope)["payload"])
        assert isinstance(payload, list if release == "1.6.1" else dict)
        assert msgpack.unpackb(envelope)["publisher_id"] == publisher_id  # the frames repeat the envelope's
        assert msgpack.unpackb(envelope)["sequence"] == sequence
    router, plane = plane_into_router(brokers=TWO_BROKERS)
    for frames in messages:
        plane.handle_frames(frames)
    a = list(range(48))
    # stored 0..31 and 32..47 (the latter under LoRA my-lora), removed the LoRA block, dp1 stored 0..15
    assert held(router) == sorted([(W7, x) for x in h(a)[:2]] + [(W7_DP1, h(a)[0])])
    assert plane.counters["zmq_plane.event"] == 4 and plane.counters["zmq_plane.gap"] == 0
    assert router.best_worker(a).overlap_blocks == 2


def test_a_copy_from_a_second_broker_and_a_message_of_another_endpoint_are_dropped():
    router, plane = plane_into_router(brokers=TWO_BROKERS)
    root, child, removed, dp1 = captured("broker")
    for frames in (root, root, child, dp1, child):
        plane.handle_frames(frames)
    assert plane.counters["zmq_plane.duplicate"] == 2 and plane.counters["zmq_plane.gap"] == 0
    other = [SUBJECT.replace("backend", "prefill").encode(), *removed[1:]]  # the same event, not ours
    plane.handle_frames(other)
    assert plane.counters["zmq_plane.topic"] == 1
    assert len(held(router)) == 4  # the LoRA block was not removed


def test_the_publisher_dynamo_advertised_is_read_from_its_file_store_entry_and_foreign_ones_are_not(tmp_path):
    entry = json.loads((FIXTURES / "direct-channel.json").read_text())
    folder = tmp_path / "v1" / "event_channels"
    folder.mkdir(parents=True)
    (folder / "ours").write_text(json.dumps(entry))
    url = entry["transport"]["config"]["endpoint"]
    assert url.startswith("tcp://127.0.0.1:")

    def variant(name: str, change: dict) -> None:
        (folder / name).write_text(json.dumps({**entry, **change, "instance_id": len(name)}))

    scope = entry["scope"]
    variant("other-namespace", {"scope": {**scope, "endpoint": {**scope["endpoint"], "namespace": "ns2"}}})
    variant("other-endpoint", {"scope": {**scope, "endpoint": {**scope["endpoint"], "name": "clear"}}})
    variant("other-topic", {"topic": "kv_metrics"})
    variant("nats-transport", {"transport": {"kind": "Nats", "config": {"endpoint": url}}})
    variant("scope-a-list", {"scope": []})
    variant("config-a-list", {"transport": {"kind": "Zmq", "config": [url]}})
    variant("ipc-endpoint", {"transport": {"kind": "Zmq", "config": {"endpoint": "ipc:///tmp/x"}}})
    variant("a-source", {"type": "EventSource"})
    (folder / "being-written").write_text('{"type": "EventCh')
    (folder / "a-list").write_text("[]")
    (found,) = read_file_channels(str(tmp_path), "ns1", "backend", "generate")
    assert (found.publisher_id, found.endpoint) == (entry["instance_id"], url)
    every_endpoint = read_file_channels(str(tmp_path), "ns1", "backend", "*")
    assert {c.publisher_id for c in every_endpoint} == {entry["instance_id"], len("other-endpoint")}
    # Dynamo 1.3.1 names the namespace and component at the top, no endpoint: the component's
    old = json.loads((FIXTURES.parent / "dynamo-zmq-1.3.1" / "direct-channel.json").read_text())
    assert "scope" not in old and old["namespace"] == "ns1" and old["component"] == "backend"
    (folder / "dynamo-1.3.1").write_text(json.dumps(old))
    (folder / "dynamo-1.3.1-other-component").write_text(
        json.dumps({**old, "component": "prefill", "instance_id": 3})
    )
    found_ids = {c.publisher_id for c in read_file_channels(str(tmp_path), "ns1", "backend", "generate")}
    assert found_ids == {entry["instance_id"], old["instance_id"]}
    (folder / "dynamo-1.3.1").unlink()
    (folder / "dynamo-1.3.1-other-component").unlink()
    # a component-scoped channel names no endpoint: it is the component's, whichever endpoint is asked
    component = {"kind": "component", "component": {"namespace": "ns1", "component": "backend"}}
    variant("component-scope", {"scope": component})
    found_ids = {c.publisher_id for c in read_file_channels(str(tmp_path), "ns1", "backend", "generate")}
    assert found_ids == {entry["instance_id"], len("component-scope")}
    assert read_file_channels(str(tmp_path / "nowhere"), "ns1", "backend", "generate") == []


@pytest.mark.parametrize(
    "frames, reason",
    [
        ([b"kv-events", b"\0" * 8, b"\0" * 8], "3 frames"),
        (
            [b"kv-events", b"\0" * 7, b"\0" * 8, b"\1\0\0\0\0"],
            "publisher id and sequence must be 8 bytes each",
        ),
        ([b"kv-events", b"\0" * 8, b"\0" * 8, b"\1\0"], "no header"),
        ([b"kv-events", b"\0" * 8, b"\0" * 8, b"\2\0\0\0\0"], "version 2"),
        ([b"kv-events", b"\0" * 8, b"\0" * 8, b"\1\0\0\0\x09xyz"], "says 9 bytes, carries 3"),
    ],
)
def test_a_malformed_message_is_counted_and_dropped(frames, reason, caplog):
    router, plane = plane_into_router(brokers=TWO_BROKERS)
    with pytest.raises(ValueError, match=reason):
        unframe(frames)
    plane.handle_frames(frames)
    assert plane.counters["zmq_plane.malformed"] == 1 and held(router) == []
    assert "malformed message on Dynamo's ZMQ event plane (" in caplog.text and reason in caplog.text


def test_an_envelope_that_is_not_dynamos_is_counted_by_the_decoder_and_dropped():
    router, plane = plane_into_router(brokers=TWO_BROKERS)
    junk = msgpack.packb({"publisher_id": 1, "sequence": 1, "payload": b"\xc1"})
    plane.handle_frames([b"kv-events", b"\0" * 8, b"\0" * 8, b"\1" + len(junk).to_bytes(4, "big") + junk])
    assert held(router) == [] and plane.counters["zmq_plane.event"] == 0
    assert any(k.startswith("dynamo.") for k in plane.counters.snapshot()), plane.counters.snapshot()


# --- the subscriber's own mechanics, replaying Dynamo's captured bytes from PUB sockets here ---------


@contextlib.contextmanager
def replaying_publishers(count: int) -> Iterator[list[tuple[zmq.Socket, str]]]:
    """`count` PUB sockets on 127.0.0.1 (closed on exit): what Dynamo's direct publishers bind."""
    ctx = zmq.Context()
    sockets = []
    for _ in range(count):
        sock = ctx.socket(zmq.PUB)
        sockets.append((sock, f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"))
    try:
        yield sockets
    finally:
        for sock, _ in sockets:
            sock.close(linger=0)
        ctx.term()


def listed_plane(listing: list[Channel], **options: Any) -> tuple[KvRouter, DynamoZmqPlaneSubscriber]:
    return plane_into_router(channels=lambda: list(listing), **options)


async def test_publishers_are_connected_as_listed_and_disconnected_when_no_longer_listed():
    direct = captured("direct")
    with replaying_publishers(2) as pubs:
        listing = [Channel(1, pubs[0][1])]
        router, plane = listed_plane(listing, rescan_s=0.05)
        await plane.start()
        try:
            assert plane.publishers == {pubs[0][1]: 1}
            listing.append(Channel(2, pubs[1][1]))  # a new publisher: found by the next listing
            await eventually(lambda: len(plane.publishers) == 2, what="the second publisher connected")
            await keep_sending(
                lambda: pubs[0][0].send_multipart(direct[0]),
                lambda: plane.counters["zmq_plane.event"] > 0,
                "the first publisher heard",
            )
            for frames in direct[1:3]:
                pubs[0][0].send_multipart(frames)
            await eventually(lambda: plane.counters["zmq_plane.event"] >= 3)
            a = list(range(48))
            assert held(router) == sorted((W7, x) for x in h(a)[:2])
            listing.pop(0)  # gone from the store
            await eventually(lambda: plane.publishers == {pubs[1][1]: 2}, what="the first disconnected")
        finally:
            await plane.stop()
        assert plane.publishers == {}
        await plane.rescan()  # stopped: nothing is connected again
        assert plane.publishers == {}


async def test_no_more_than_max_channels_publishers_are_connected(monkeypatch):
    monkeypatch.setattr(dynamo_zmq_plane, "MAX_CHANNELS", 2)
    listing = [Channel(n, f"tcp://127.0.0.1:{40000 + n}") for n in range(3)]
    _, plane = listed_plane(listing)
    await plane.start()
    try:
        assert list(plane.publishers) == [c.endpoint for c in listing[:2]]
        assert plane.counters["zmq_plane.channels_capped"] == 1
    finally:
        await plane.stop()


async def test_a_publisher_zmq_cannot_connect_to_is_counted_and_the_others_are_connected():
    listing = [Channel(1, "tcp://*:5555"), Channel(2, "tcp://127.0.0.1:40002")]  # a bind address
    _, plane = listed_plane(listing)
    await plane.start()
    try:
        assert plane.publishers == {"tcp://127.0.0.1:40002": 2}
        assert plane.counters["zmq_plane.connect_failed"] == 1
    finally:
        await plane.stop()


def test_a_subscriber_needs_a_listing_or_brokers():
    feed = RouterFeed({}, EventCounters())
    with pytest.raises(ValueError, match="listing, brokers or both"):
        DynamoZmqPlaneSubscriber(feed, feed.counters, SUBJECT)


async def test_what_the_subscriber_does_with_publishers_is_logged(caplog):
    with replaying_publishers(2) as pubs:
        listing = [Channel(0x1A, pubs[0][1]), Channel(0x2B, pubs[1][1])]
        _, plane = listed_plane(listing)
        with caplog.at_level(logging.INFO, logger="extproc.events.dynamo"):
            await plane.start()
            try:
                listing.pop()
                await plane.rescan()
            finally:
                await plane.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert f"Dynamo ZMQ event plane: connected to publisher 1a at {pubs[0][1]}" in lines
    assert (
        f"Dynamo ZMQ event plane: publisher 2b at {pubs[1][1]} is gone from discovery; disconnected" in lines
    )


async def test_the_brokers_connected_to_are_logged_and_stopping_twice_or_unstarted_is_harmless(caplog):
    feed = RouterFeed({}, EventCounters())
    brokers = ("tcp://127.0.0.1:40001", "tcp://127.0.0.1:40002")
    plane = DynamoZmqPlaneSubscriber(feed, feed.counters, SUBJECT, brokers=brokers)
    await plane.stop()  # never started
    with caplog.at_level(logging.INFO, logger="extproc.events.dynamo"):
        await plane.start()
    tasks = list(plane._tasks)
    await plane.stop()
    await plane.stop()
    assert all(task.done() for task in tasks) and tasks
    lines = [r.getMessage() for r in caplog.records]
    assert (
        "Dynamo ZMQ event plane: connected to the brokers tcp://127.0.0.1:40001, tcp://127.0.0.1:40002"
        in lines
    )


async def test_a_listing_that_fails_is_logged_and_the_connected_publishers_stay(caplog):
    calls = []

    def listing() -> list[Channel]:
        calls.append(1)
        if len(calls) > 1:
            raise OSError("the store's disk went away")
        return [Channel(1, "tcp://127.0.0.1:40003")]

    feed = RouterFeed({}, EventCounters())
    plane = DynamoZmqPlaneSubscriber(feed, feed.counters, SUBJECT, channels=listing, rescan_s=0.01)
    with caplog.at_level(logging.INFO, logger="extproc.events.dynamo"):
        await plane.start()
        try:
            await eventually(lambda: len(calls) >= 3, what="listed again after a failure")
            assert plane.publishers == {"tcp://127.0.0.1:40003": 1}
        finally:
            await plane.stop()
    failed = [r for r in caplog.records if r.getMessage() == "listing Dynamo's ZMQ publishers failed"]
    assert failed and failed[0].exc_info is not None


async def test_exactly_max_channels_publishers_are_all_connected_without_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(dynamo_zmq_plane, "MAX_CHANNELS", 2)
    _, plane = listed_plane([Channel(n, f"tcp://127.0.0.1:{40000 + n}") for n in range(2)])
    await plane.start()
    await plane.stop()
    assert plane.counters["zmq_plane.channels_capped"] == 0
    monkeypatch.setattr(dynamo_zmq_plane, "MAX_CHANNELS", 1)
    _, plane = listed_plane([Channel(n, f"tcp://127.0.0.1:{40000 + n}") for n in range(2)])
    with caplog.at_level(logging.WARNING):
        await plane.start()
        await plane.stop()
    assert "Dynamo's discovery lists 2 ZMQ publishers; connecting to the first 1 only" in caplog.text


async def test_a_publisher_that_cannot_be_connected_to_is_named_in_the_warning(caplog):
    _, plane = listed_plane([Channel(1, "tcp://*:5555")])
    with caplog.at_level(logging.WARNING):
        await plane.start()
        await plane.stop()
    assert "cannot connect to tcp://*:5555: Invalid argument" in caplog.text


async def test_with_every_endpoint_a_broker_subscription_takes_each_endpoint_of_the_component():
    """`--dynamo-endpoint '*'`: the SUB prefix stops at the first wildcard, the topic is matched by token."""
    root, child, _, _ = captured("broker")
    with replaying_publishers(1) as ((pub, url),):
        every = event_plane_subject("*", "backend", "*")  # any namespace too, as a NATS subject reads it
        router, plane = plane_into_router(every, brokers=(url,))
        await plane.start()
        try:
            await keep_sending(
                lambda: pub.send_multipart(root), lambda: plane.counters["zmq_plane.event"] > 0, "heard"
            )
            for topic in (SUBJECT.replace("generate", "clear"), SUBJECT.replace("backend", "prefill")):
                pub.send_multipart(
                    [topic.encode(), *child[1:]]
                )  # another endpoint: ours; another component: not
            await eventually(
                lambda: plane.counters["zmq_plane.event"] + plane.counters["zmq_plane.duplicate"] >= 2
            )
        finally:
            await plane.stop()
    assert plane.counters["zmq_plane.event"] == 2 and plane.counters["zmq_plane.duplicate"] == 0
    assert len(held(router)) == 3  # the root's two blocks and the LoRA child


def test_a_topic_that_is_not_utf8_is_not_ours_and_does_not_raise():
    _, plane = plane_into_router(brokers=TWO_BROKERS)
    root = captured("broker")[0]
    plane.handle_frames([b"\xff\xfe", *root[1:]])
    assert plane.counters["zmq_plane.topic"] == 1


def test_the_last_dedup_keys_messages_are_remembered_and_no_more(monkeypatch):
    monkeypatch.setattr(dynamo_zmq_plane, "DEDUP_KEYS", 2)
    _, plane = plane_into_router(brokers=TWO_BROKERS)
    a, b, c, _ = captured("broker")
    for frames in (a, b, a, c, c):  # a is a repeat (2 remembered); c is remembered once it came
        plane.handle_frames(frames)
    assert plane.counters["zmq_plane.duplicate"] == 2
    plane.handle_frames(a)  # evicted by c: the oldest goes first
    assert plane.counters["zmq_plane.duplicate"] == 2


def test_a_restart_names_the_zmq_publisher_it_was_heard_from(caplog):
    _, plane = plane_into_router(brokers=TWO_BROKERS)
    root, child, _, _ = captured("broker")
    restarted = msgpack.unpackb(unframe(child)[3])
    restarted["publisher_id"] += 1
    envelope = msgpack.packb(restarted)
    frame = b"\x01" + len(envelope).to_bytes(4, "big") + envelope
    with caplog.at_level(logging.INFO, logger="extproc.events.dynamo"):
        plane.handle_frames(root)
        plane.handle_frames([child[0], (restarted["publisher_id"]).to_bytes(8, "big"), child[2], frame])
    pid = restarted["publisher_id"]
    assert f"on Dynamo's ZMQ event plane (publisher {pid:x}): it restarted" in caplog.text
    assert plane.counters["zmq_plane.new_publisher"] == 1


async def test_through_a_broker_dynamo_1_3_1s_messages_are_heard_though_their_topic_names_no_subject():
    messages = captured("broker", "1.3.1")
    with replaying_publishers(1) as ((pub, url),):
        router, plane = plane_into_router(brokers=(url,))
        await plane.start()
        try:
            await keep_sending(
                lambda: pub.send_multipart(messages[0]),
                lambda: plane.counters["zmq_plane.event"] > 0,
                "heard",
            )
            for frames in messages[1:]:
                pub.send_multipart(frames)
            await eventually(
                lambda: plane.counters["zmq_plane.event"] == 4, what=lambda: plane.counters.snapshot()
            )
        finally:
            await plane.stop()
    a = list(range(48))
    assert held(router) == sorted([(W7, x) for x in h(a)[:2]] + [(W7_DP1, h(a)[0])])


def test_through_one_broker_or_directly_a_repeated_pair_is_not_taken_for_a_copy():
    """Dynamo 1.0's publishers of one runtime share a publisher id, so (publisher id, sequence) names
    a message only within one socket: without a second broker nothing is dropped as a copy."""
    router, plane = plane_into_router(brokers=("tcp://127.0.0.1:1",))
    root = captured("broker")[0]
    plane.handle_frames(root)
    plane.handle_frames(root)
    assert plane.counters["zmq_plane.duplicate"] == 0 and plane.counters["zmq_plane.event"] == 2
    assert len(held(router)) == 2
