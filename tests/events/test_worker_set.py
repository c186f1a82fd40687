"""The KV event transports follow the picker's worker set (DNS discovery, config reload).

Real ZMQ publishers on loopback; `EndpointPicker.set_workers` changes the set while the sources
run. Conditions are polled with a deadline, never slept for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from extproc.config import DiscoveryConfig, WorkerConfig
from extproc.events.sources import start_event_sources
from extproc.events.vllm import WireBlockStored
from extproc.events.zmq_publisher import ZmqEventPublisher
from extproc.events.zmq_subscriber import SubscriberTimings
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import Worker
from tests.events.test_zmq import wait_until
from tests.picker_fixtures import MODEL, picker_config

BS = 4
FAST = SubscriberTimings(silence_s=0.3, replay_timeout_s=0.3, backoff_min_s=0.02, backoff_max_s=0.2)


@pytest.fixture
async def publishers() -> AsyncIterator[list[ZmqEventPublisher]]:
    pubs = [ZmqEventPublisher(port=0, replay_port=0) for _ in range(3)]
    for pub in pubs:
        await pub.start()
    yield pubs
    for pub in pubs:
        await pub.stop()


def worker(wid: str, pub: ZmqEventPublisher, host: str = "127.0.0.1") -> WorkerConfig:
    return WorkerConfig(wid, f"{host}:8000", MODEL, kv_events=pub.endpoint, kv_replay=pub.replay_endpoint)


def events_config(workers: tuple[WorkerConfig, ...], *, use_kv_events: bool = True):
    base = picker_config(0)
    return dataclasses.replace(
        base,
        router=RouterConfig(block_size=BS, use_kv_events=use_kv_events),
        workers=workers,
        discovery=DiscoveryConfig(reload_config=True),
        config_path="/nonexistent/picker.yaml",
    )


def stored(pub: ZmqEventPublisher, block_hash: int, tokens: list[int]) -> None:
    pub.publish([WireBlockStored([block_hash], None, tokens, BS)])


async def test_subscribers_and_feed_follow_added_changed_and_removed_workers(publishers):
    a, b, c = publishers
    config = events_config((worker("w0", a),))
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker, timings=FAST)
    router = picker.pools[MODEL].router
    try:
        assert sources.zmq is not None
        assert set(sources.zmq.subscribers) == {Worker("w0")}

        picker.set_workers(MODEL, [worker("w0", a), worker("w1", b)])
        assert sources.feed.routers["w1"] is router  # at once, before any event can arrive
        await wait_until(lambda: Worker("w1") in sources.zmq.subscribers, what="w1 subscribed")
        await wait_until(lambda: _stored_and(b, router, Worker("w1")), what="w1's events applied")

        # w1 moves to another publisher: its subscriber is replaced, its blocks rebuilt from there
        picker.set_workers(MODEL, [worker("w0", a), worker("w1", c, host="127.0.0.2")])
        await wait_until(
            lambda: (
                Worker("w1") in sources.zmq.subscribers
                and sources.zmq.subscribers[Worker("w1")].endpoint.pub == c.endpoint
            ),
            what="w1 resubscribed to its new endpoint",
        )
        await wait_until(
            lambda: _stored_and(c, router, Worker("w1"), block=7) and not _holds(router, Worker("w1"), 1),
            what="w1's view rebuilt from c alone",
        )

        picker.set_workers(MODEL, [worker("w1", c, host="127.0.0.2")])
        assert "w0" not in sources.feed.routers
        await wait_until(lambda: Worker("w0") not in sources.zmq.subscribers, what="w0 unsubscribed")
        assert set(sources.feed.states()) == {Worker("w1")}
    finally:
        await sources.stop()
    assert picker.worker_listeners == []
    assert sources.zmq.subscribers == {}


def _holds(router, worker: Worker, block: int) -> bool:
    return router.indexer.find_matches(compute_block_hashes([block] * BS, BS)).get(worker, 0) == 1


def _stored_and(pub: ZmqEventPublisher, router, worker: Worker, block: int = 1) -> bool:
    """Publish one stored block of `block` tokens (idempotent); whether the router now holds it."""
    stored(pub, block, [block] * BS)
    return _holds(router, worker, block)


async def test_a_worker_added_without_any_at_start_gets_a_subscriber(publishers):
    a = publishers[0]
    config = events_config(())
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker, timings=FAST)
    try:
        assert sources.zmq is not None and sources.zmq.subscribers == {}  # ready for discovered workers
        picker.set_workers(MODEL, [worker("w9", a)])
        await wait_until(lambda: Worker("w9") in sources.zmq.subscribers, what="w9 subscribed")
        router = picker.pools[MODEL].router
        await wait_until(lambda: _stored_and(a, router, Worker("w9")), what="w9's events applied")
    finally:
        await sources.stop()


async def test_without_kv_events_only_the_feed_map_follows():
    config = events_config((WorkerConfig("w0", "127.0.0.1:8000", MODEL),), use_kv_events=False)
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker)
    try:
        assert sources.zmq is None
        picker.set_workers(MODEL, [WorkerConfig("7", "127.0.0.7:8000", MODEL)])
        assert set(sources.feed.routers) == {"7"}
        assert sources.instance_ids == {7: "7"}  # Dynamo-style events name workers by instance id
    finally:
        await sources.stop()
