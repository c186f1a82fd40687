"""Bounded event buffers over ZMQ (`--event-queue-size`): a burst larger than the bound, while the
consumer is held, is dropped, counted and the worker resynchronised; nothing grows without bound.

The publisher is real (PUB and replay sockets on loopback). The test publishes the burst without
yielding to the event loop, so the subscriber cannot read: ZMQ buffers up to the bound on the
subscriber's side (ZMQ_RCVHWM), TCP pushes back and the publisher drops at its high-water mark, as
vLLM's does. The seq gaps are counted as drops and filled from the replay socket, in parts of at
most the bound: afterwards the router holds exactly the publisher's blocks.
The NATS and replica-sync counterparts are in tests/nats/test_backpressure.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from extproc.admin.metrics import PickerCollector
from extproc.events.counters import MAX_DROPPED_AT_ONCE, EventCounters
from extproc.events.dynamo_intake import follow_gap
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources
from extproc.events.vllm import WireBlockStored
from extproc.events.zmq_publisher import ZmqEventPublisher
from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscriber
from extproc.picker.pipeline import EndpointPicker
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.router.types import KvEvent, Worker
from tests.nats.conftest import eventually, prime
from tests.picker_fixtures import picker_config

BS = 4  # as the NATS tests' routers (tests/nats/conftest.py)
ZMQ_BS = 64  # big blocks make big batches: the ZMQ burst must outgrow the kernel's socket buffers too
MAX_CHAIN_BLOCKS = 64
W0 = Worker("w0")
QUEUE = 50  # --event-queue-size in these tests


class RecordingSink:
    """The router calls a picker's feed makes, plus what the test observes at each call."""

    def __init__(self, router: KvRouter, observe: Callable[[], int] = lambda: 0) -> None:
        self.router = router
        self.observe = observe
        self.observed_max = 0
        self.applied: Counter[Worker] = Counter()
        self.resets: list[tuple[Worker, str]] = []

    def apply_events(self, events: Sequence[KvEvent]) -> None:
        self.observed_max = max(self.observed_max, self.observe())
        for event in events:
            self.router.apply_event(event)
            self.applied[event.worker] += 1

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.resets.append((worker, reason))
        self.router.indexer.clear_worker(worker)

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        pass


def chain_tokens(index: int, blocks: int, block_size: int = BS) -> list[int]:
    """Tokens of `blocks` whole blocks, distinct per index (ids above 2^16: bigger batches)."""
    assert blocks <= MAX_CHAIN_BLOCKS
    base = 100_000 + index * MAX_CHAIN_BLOCKS * block_size
    return list(range(base, base + blocks * block_size))


def held_for(router: KvRouter, tokens: list[int], worker: Worker = W0, block_size: int = BS) -> int:
    return router.indexer.find_matches(compute_block_hashes(tokens, block_size)).get(worker, 0)


# --- ZMQ -----------------------------------------------------------------------------------------------


async def test_a_zmq_burst_beyond_the_bound_is_counted_as_dropped_and_replayed():
    burst, blocks = 2000, 16  # ~5 KB per batch: 10 MB, far beyond the bound and the socket buffers
    publisher = ZmqEventPublisher(port=0, replay_port=0, hwm=QUEUE, buffer_steps=burst + 100)
    await publisher.start()
    router = KvRouter(RouterConfig(block_size=ZMQ_BS, use_kv_events=True), clock=lambda: 0.0)
    counters = EventCounters()
    timings = SubscriberTimings(silence_s=60.0, replay_timeout_s=2.0, backoff_min_s=0.02, backoff_max_s=0.2)
    subscriber = ZmqEventSubscriber(
        ZmqEndpoint(W0, publisher.endpoint, publisher.replay_endpoint),
        RecordingSink(router),
        block_size=ZMQ_BS,
        counters=counters,
        timings=timings,
        queue_size=QUEUE,
    )
    await subscriber.start()
    chains: list[list[int]] = []

    def publish(tokens: list[int]) -> int:
        chains.append(tokens)
        hashes = compute_sequence_hashes(compute_block_hashes(tokens, ZMQ_BS))
        return publisher.publish([WireBlockStored(hashes, None, tokens, ZMQ_BS)])

    try:
        await eventually(lambda: subscriber.status.complete, what="the start replay")
        # live batches flow (not only the replay): the SUB socket is connected
        await prime(
            lambda _: publish(chain_tokens(len(chains), 1, ZMQ_BS)),
            lambda: subscriber.status.last_seq == publisher.next_seq - 1,
        )
        dropped_before = counters.drops[("zmq", "w0", "seq-gap")]

        for _ in range(burst):  # never yields: the subscriber is held for the whole burst
            publish(chain_tokens(len(chains), blocks, ZMQ_BS))
        # a dropped batch shows as a gap at the next one that arrives: send until one does
        await prime(
            lambda _: publish(chain_tokens(len(chains), 1, ZMQ_BS)),
            lambda: subscriber.status.last_seq == publisher.next_seq - 1,
            timeout_s=30,
        )
        dropped = counters.drops[("zmq", "w0", "seq-gap")] - dropped_before
        assert dropped > 0, "the burst fitted in the buffers: make it bigger"
        assert counters["zmq.unfilled_gap"] == 0 and subscriber.status.complete
        # resynchronised: every batch applied exactly once, the router holds the publisher's blocks
        assert counters["zmq.batch"] == len(chains)
        assert router.indexer.num_blocks(W0) == sum(len(c) // ZMQ_BS for c in chains)
        assert all(held_for(router, c, W0, ZMQ_BS) == len(c) // ZMQ_BS for c in chains)
    finally:
        await subscriber.stop()
        await publisher.stop()


async def test_dropped_batches_with_nothing_after_them_are_found_by_the_silence_probe():
    publisher = ZmqEventPublisher(port=0, replay_port=0)
    await publisher.start()
    router = KvRouter(RouterConfig(block_size=BS, use_kv_events=True), clock=lambda: 0.0)
    counters = EventCounters()
    subscriber = ZmqEventSubscriber(
        ZmqEndpoint(W0, publisher.endpoint, publisher.replay_endpoint),
        RecordingSink(router),
        block_size=BS,
        counters=counters,
        timings=SubscriberTimings(silence_s=0.3, replay_timeout_s=2.0),
        queue_size=QUEUE,
    )
    await subscriber.start()
    chains: list[list[int]] = []

    def publish() -> int:
        chains.append(chain_tokens(len(chains), 2))
        hashes = compute_sequence_hashes(compute_block_hashes(chains[-1], BS))
        return publisher.publish([WireBlockStored(hashes, None, chains[-1], BS)])

    try:
        await eventually(lambda: subscriber.status.complete, what="the start replay")
        await prime(lambda _: publish(), lambda: subscriber.status.last_seq == publisher.next_seq - 1)
        dropped_before = counters.drops[("zmq", "w0", "seq-gap")]
        publisher.withhold(3)  # the last three never reach the SUB socket, and nothing follows them
        last = [publish() for _ in range(3)][-1]
        await eventually(lambda: subscriber.status.last_seq == last, what="the probe's replay")
        assert counters.drops[("zmq", "w0", "seq-gap")] - dropped_before == 3
        assert counters["zmq.probe"] >= 1
        assert all(held_for(router, c) == 2 for c in chains)
    finally:
        await subscriber.stop()
        await publisher.stop()


async def test_a_replay_longer_than_the_bound_is_read_in_parts():
    publisher = ZmqEventPublisher(port=0, replay_port=0, buffer_steps=1000)
    await publisher.start()
    router = KvRouter(RouterConfig(block_size=BS, use_kv_events=True), clock=lambda: 0.0)
    counters = EventCounters()
    chains = [chain_tokens(i, 2) for i in range(7 * QUEUE // 2)]  # 3.5 times the bound, before we start
    for tokens in chains:
        hashes = compute_sequence_hashes(compute_block_hashes(tokens, BS))
        publisher.publish([WireBlockStored(hashes, None, tokens, BS)])
    subscriber = ZmqEventSubscriber(
        ZmqEndpoint(W0, publisher.endpoint, publisher.replay_endpoint),
        RecordingSink(router),
        block_size=BS,
        counters=counters,
        timings=SubscriberTimings(silence_s=60.0, replay_timeout_s=2.0),
        queue_size=QUEUE,
    )
    await subscriber.start()
    try:
        await eventually(lambda: subscriber.status.reason.startswith("rebuilt"), what="the start replay")
        assert subscriber.status.reason == f"rebuilt from replay ({len(chains)} batches)"
        assert counters["zmq.replay_truncated"] == 3  # parts of 50, 50, 50 and 25 batches
        assert counters["zmq.unfilled_gap"] == 0 and subscriber.status.complete
        assert all(held_for(router, c) == 2 for c in chains)
    finally:
        await subscriber.stop()
        await publisher.stop()


@pytest.mark.parametrize("size", [0, -1])
def test_queue_sizes_must_be_positive(size: int):
    router = KvRouter(RouterConfig(block_size=BS), clock=lambda: 0.0)
    with pytest.raises(ValueError, match="queue_size"):
        ZmqEventSubscriber(
            ZmqEndpoint(W0, "tcp://127.0.0.1:1"),
            RecordingSink(router),
            block_size=BS,
            counters=EventCounters(),
            queue_size=size,
        )


def test_drops_are_exported_per_source_worker_and_reason():
    picker = EndpointPicker(picker_config())
    counters = EventCounters()
    counters.dropped("zmq", "w0/dp1", "seq-gap", 3)
    counters.dropped("nats", "*", "queue-full")
    registry = CollectorRegistry()
    registry.register(PickerCollector(picker, EventSources(RouterFeed(picker.routers_by_worker()), counters)))
    sample = registry.get_sample_value
    name = "extproc_kv_events_dropped_total"
    assert sample(name, {"source": "zmq", "worker": "w0/dp1", "reason": "seq-gap"}) == 3
    assert sample(name, {"source": "nats", "worker": "*", "reason": "queue-full"}) == 1
    assert sample("extproc_kv_event_transport_total", {"key": "zmq.dropped"}) == 3


def test_a_nats_event_id_far_ahead_counts_at_most_the_bound():
    """Dynamo's event ids are u64 on the wire: one id far ahead of the last is a gap counted as at
    most MAX_DROPPED_AT_ONCE events (before: 2**64 - 2 from one message)."""
    router = KvRouter(RouterConfig(block_size=BS), clock=lambda: 0.0)
    counters = EventCounters()
    follow_gap(RecordingSink(router), counters, W0, 1, 2**64 - 1, "kv_events")
    follow_gap(RecordingSink(router), counters, W0, 2**64, 2**64 + 5, "kv_events")  # an honest gap after it
    assert counters.drops[("nats", str(W0), "event-id-gap")] == MAX_DROPPED_AT_ONCE + 5
    assert counters["nats.dropped"] == MAX_DROPPED_AT_ONCE + 5 and counters["nats.gap_clamped"] == 1
