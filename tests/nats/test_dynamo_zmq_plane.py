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
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import pytest_asyncio
import zmq

from extproc.config import load_config
from extproc.events.counters import EventCounters
from extproc.events.dynamo_plane import event_plane_subject
from extproc.events.dynamo_zmq_plane import DynamoZmqPlaneSubscriber, read_file_channels, unframe
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources, start_event_sources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.types import Worker
from tests.router.clock import FakeClock

from .conftest import eventually
from .dynamo_helpers import BS, ENDPOINT, DynamoWorker, require_dynamo
from .test_dynamo_recovery import advertised, h, held

W7, W7_DP1, W8 = Worker("w7"), Worker("w7", 1), Worker("w8")
FIXTURES = Path(__file__).parent / "fixtures" / "dynamo-zmq-1.6.1"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
SUBJECT = event_plane_subject("ns1", "backend", "generate")
CONFIG = """\
workers:
  - {id: w7, endpoint: "127.0.0.1:8001", model: m, instance-id: 7, dp-size: 2}
  - {id: w8, endpoint: "127.0.0.1:8002", model: m, instance-id: 8}
"""


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> Path:
    return tmp_path / "dynamo_store_kv"


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
    """Until the picker hears publisher `name` (`until`, by default: an event of `worker` arrived; a
    ZMQ subscriber misses what is sent before its subscription reaches the publisher): removals of a
    block nobody stored, until one arrives."""
    for _ in range(100):
        await plane.rescan()  # the store's newest publishers, without waiting for the next listing
        await dynamo.call("removed", name=name, block_hashes=[0])
        with contextlib.suppress(pytest.fail.Exception):
            await eventually(until or (lambda: plane.event_ids.knows(worker)), 0.1)
            return
    pytest.fail(f"the picker never heard Dynamo's publisher {name}")


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

                # another component's worker publishes through the same brokers: not this picker's
                await dynamo.call(
                    "publisher", name="other", endpoint="ns1.prefill.generate", worker_id=8, block_size=BS
                )
                for _ in range(100):
                    await dynamo.stored("other", a[:16], [41])
                    with contextlib.suppress(pytest.fail.Exception):
                        await eventually(lambda: sources.counters["zmq_plane.topic"] > 0, 0.1)
                        break
                assert not any(w == W8 for w, _ in held(router))
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


# --- the bytes Dynamo 1.6.1 sent (tests/nats/fixtures/capture_dynamo_zmq.py) ---------------------------


def captured(mode: str) -> list[list[bytes]]:
    return [
        msgpack.unpackb((FIXTURES / m["file"]).read_bytes())
        for m in MANIFEST["messages"]
        if m["mode"] == mode
    ]


def plane_into_router() -> tuple[KvRouter, DynamoZmqPlaneSubscriber]:
    config = RouterConfig(block_size=BS, use_kv_events=True)
    router = KvRouter(config, clock=FakeClock(), workers=[WorkerSpec("w7", (0, 1))])
    feed = RouterFeed({"w7": router}, EventCounters())
    plane = DynamoZmqPlaneSubscriber(
        feed, feed.counters, SUBJECT, brokers=("tcp://127.0.0.1:1",), worker_id_of=lambda i: f"w{i}"
    )
    return router, plane


@pytest.mark.parametrize("mode", ["direct", "broker"])
def test_dynamo_1_6_1s_messages_decode_to_what_each_call_asked_for(mode):
    assert MANIFEST["ai-dynamo-runtime"] == "1.6.1"
    messages = captured(mode)
    assert len(messages) == 4
    for frames in messages:
        topic, publisher_id, sequence, envelope = unframe(frames)
        assert topic == (b"kv-events" if mode == "direct" else SUBJECT.encode())
        assert msgpack.unpackb(envelope)["publisher_id"] == publisher_id  # the frames repeat the envelope's
        assert msgpack.unpackb(envelope)["sequence"] == sequence
    router, plane = plane_into_router()
    for frames in messages:
        plane.handle_frames(frames)
    a = list(range(48))
    # stored 0..31 and 32..47 (the latter under LoRA my-lora), removed the LoRA block, dp1 stored 0..15
    assert held(router) == sorted([(W7, x) for x in h(a)[:2]] + [(W7_DP1, h(a)[0])])
    assert plane.counters["zmq_plane.event"] == 4 and plane.counters["zmq_plane.gap"] == 0
    assert router.best_worker(a).overlap_blocks == 2


def test_a_copy_from_a_second_broker_and_a_message_of_another_endpoint_are_dropped():
    router, plane = plane_into_router()
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
    variant("nats-transport", {"transport": {"kind": "Nats", "config": {"subject_prefix": "x"}}})
    variant("ipc-endpoint", {"transport": {"kind": "Zmq", "config": {"endpoint": "ipc:///tmp/x"}}})
    variant("a-source", {"type": "EventSource"})
    (folder / "being-written").write_text('{"type": "EventCh')
    (folder / "a-list").write_text("[]")
    (found,) = read_file_channels(str(tmp_path), "ns1", "backend", "generate")
    assert (found.publisher_id, found.endpoint) == (entry["instance_id"], url)
    every_endpoint = read_file_channels(str(tmp_path), "ns1", "backend", "*")
    assert {c.publisher_id for c in every_endpoint} == {entry["instance_id"], len("other-endpoint")}
    assert read_file_channels(str(tmp_path / "nowhere"), "ns1", "backend", "generate") == []


@pytest.mark.parametrize(
    "frames, reason",
    [
        ([b"kv-events", b"\0" * 8, b"\0" * 8], "3 frames"),
        ([b"kv-events", b"\0" * 7, b"\0" * 8, b"\1\0\0\0\0"], "8 bytes"),
        ([b"kv-events", b"\0" * 8, b"\0" * 8, b"\1\0"], "no header"),
        ([b"kv-events", b"\0" * 8, b"\0" * 8, b"\2\0\0\0\0"], "version 2"),
        ([b"kv-events", b"\0" * 8, b"\0" * 8, b"\1\0\0\0\x09xyz"], "says 9 bytes, carries 3"),
    ],
)
def test_a_malformed_message_is_counted_and_dropped(frames, reason, caplog):
    router, plane = plane_into_router()
    with pytest.raises(ValueError, match=reason):
        unframe(frames)
    plane.handle_frames(frames)
    assert plane.counters["zmq_plane.malformed"] == 1 and held(router) == []
    assert reason in caplog.text


def test_an_envelope_that_is_not_dynamos_is_counted_by_the_decoder_and_dropped():
    router, plane = plane_into_router()
    junk = msgpack.packb({"publisher_id": 1, "sequence": 1, "payload": b"\xc1"})
    plane.handle_frames([b"kv-events", b"\0" * 8, b"\0" * 8, b"\1" + len(junk).to_bytes(4, "big") + junk])
    assert held(router) == [] and plane.counters["zmq_plane.event"] == 0
    assert any(k.startswith("dynamo.") for k in plane.counters.snapshot()), plane.counters.snapshot()
