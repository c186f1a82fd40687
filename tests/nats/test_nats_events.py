"""NATS core: a worker's publisher -> nats-server -> subscriber -> a real KvRouter; event-id gaps."""

from extproc.events.counters import EventCounters
from extproc.events.dynamo_intake import EventIdTracker
from extproc.events.dynamo_json import kv_events_subject
from extproc.events.feed import EVENT_FED
from extproc.events.nats_events import NatsEventPublisher, NatsEventSubscriber
from extproc.router import Worker, WorkerSpec, compute_block_hashes
from extproc.router.hashing import compute_sequence_hashes
from extproc.sim.prefix_cache import BlockTable, PrefixCache

from .conftest import (
    BLOCK_SIZE,
    PROBE_WORKER_BASE,
    connect,
    eventually,
    make_feed,
    make_router,
    matches,
    prime_events,
)

SUBJECT = kv_events_subject("test", "backend")
W7, W8 = Worker("7"), Worker("8")


async def primed(pub_link, subscriber: NatsEventSubscriber) -> int:
    """Prime the subject from the publisher's connection; returns how many probes arrived."""
    await prime_events(pub_link.nc, SUBJECT, lambda: probes_seen(subscriber))
    return probes_seen(subscriber)


def probes_seen(subscriber: NatsEventSubscriber) -> int:
    return sum(1 for w in subscriber.event_ids.workers() if int(w.worker_id) >= PROBE_WORKER_BASE)


def blocks_of(tokens: list[int]) -> list[list[int]]:
    return [tokens[i : i + BLOCK_SIZE] for i in range(0, len(tokens) - len(tokens) % BLOCK_SIZE, BLOCK_SIZE)]


async def test_the_router_sees_what_the_workers_cache_store_and_evict(nats_server):
    router = make_router()
    feed = make_feed(router)
    sub_link = await connect(nats_server, "router")
    pub_link = await connect(nats_server, "worker-7")
    subscriber = NatsEventSubscriber(sub_link, feed, SUBJECT)
    publisher = NatsEventPublisher(pub_link.nc, SUBJECT, 7)
    try:
        await subscriber.start()
        await primed(pub_link, subscriber)
        cache = PrefixCache(num_blocks=8, block_size=BLOCK_SIZE, listener=publisher)
        first = list(range(18))  # 4 full blocks and a partial one
        first_local = compute_block_hashes(first, BLOCK_SIZE)
        table = BlockTable()
        assert cache.allocate(table, compute_sequence_hashes(first_local), len(first), first)
        await eventually(lambda: matches(router, first_local) == {W7: 4}, what="4 blocks stored")
        assert feed.state(W7) == EVENT_FED
        assert matches(router, [*first_local[:2], 123]) == {W7: 2}

        cache.release(table)  # cached, still matchable
        second = list(range(100, 128))  # 7 blocks: evicts 3 of the first prompt's 4, tail first? LRU
        second_local = compute_block_hashes(second, BLOCK_SIZE)
        assert cache.allocate(BlockTable(), compute_sequence_hashes(second_local), len(second), second)
        await eventually(lambda: matches(router, second_local) == {W7: 7}, what="second prompt stored")
        expected_first = cache.match_prefix(compute_sequence_hashes(first_local))
        await eventually(
            lambda: matches(router, first_local).get(W7, 0) == expected_first,
            what=f"first prompt evicted down to {expected_first} blocks",
        )
        assert expected_first < 4

        cache.clear_cached()  # nothing cached but the active second prompt: a removal, not a clear
        publisher.on_cleared()
        await eventually(lambda: not matches(router, second_local), what="cleared")
        assert subscriber.gaps == 0
        assert sub_link.counters["nats.event"] == publisher.next_event_id + probes_seen(subscriber)
    finally:
        await subscriber.stop()
        await publisher.stop()
        await sub_link.close()
        await pub_link.close()


async def test_an_event_id_gap_is_counted_and_calls_the_hook(nats_server):
    router = make_router()
    router.add_worker(WorkerSpec("8", dp_ranks=(0, 1)))  # its events name dp rank 1
    gaps = []
    sub_link = await connect(nats_server, "router")
    pub_link = await connect(nats_server, "worker-8")
    subscriber = NatsEventSubscriber(
        sub_link, make_feed(router), SUBJECT, on_gap=lambda *gap: gaps.append(gap)
    )
    publisher = NatsEventPublisher(pub_link.nc, SUBJECT, 8, dp_rank=1, first_event_id=10)
    try:
        await subscriber.start()
        await primed(pub_link, subscriber)
        tokens = list(range(8))
        publisher.on_stored(None, [1, 2], blocks_of(tokens))
        publisher.next_event_id += 3  # three events lost on the way
        publisher.on_stored(2, [3], [[9, 9, 9, 9]])
        w8 = Worker("8", 1)
        await eventually(lambda: gaps, what=lambda: f"gap hook called {sub_link.counters.snapshot()}")
        assert gaps == [(w8, 11, 14)]
        assert subscriber.gaps == 1
        # the custom hook did not reset: the event after the gap extends the known prefix
        await eventually(
            lambda: matches(router, compute_block_hashes([*tokens, 9, 9, 9, 9], BLOCK_SIZE)) == {w8: 3}
        )
    finally:
        await subscriber.stop()
        await publisher.stop()
        await sub_link.close()
        await pub_link.close()


async def test_by_default_lost_events_keep_the_known_blocks_and_a_restart_resets(nats_server):
    """An id that jumps ahead is events lost (an outage): the blocks known stay, since the engine
    still holds them; an id that goes back is a restarted publisher, whose engine is empty."""
    router = make_router()
    feed = make_feed(router)
    sub_link = await connect(nats_server, "router")
    pub_link = await connect(nats_server, "worker-7")
    subscriber = NatsEventSubscriber(sub_link, feed, SUBJECT)
    publisher = NatsEventPublisher(pub_link.nc, SUBJECT, 7)
    try:
        await subscriber.start()
        await primed(pub_link, subscriber)
        old = list(range(8))
        publisher.on_stored(None, [1, 2], blocks_of(old))
        await eventually(lambda: matches(router, compute_block_hashes(old, BLOCK_SIZE)) == {W7: 2})
        publisher.next_event_id += 3  # three events lost
        publisher.on_stored(2, [3], blocks_of(list(range(8, 12))))  # under a block still known
        extended = compute_block_hashes(list(range(12)), BLOCK_SIZE)
        await eventually(lambda: matches(router, extended) == {W7: 3})
        assert subscriber.gaps == 1 and feed.counters["feed.reset"] == 0
        assert sub_link.counters.drops[("nats", "7", "event-id-gap")] == 3
        assert feed.state(W7) == "event-fed"

        publisher.next_event_id = 0  # the worker restarted: its ids start over, its cache is empty
        new = list(range(50, 54))
        publisher.on_stored(None, [5], blocks_of(new))
        await eventually(lambda: matches(router, compute_block_hashes(new, BLOCK_SIZE)) == {W7: 1})
        assert matches(router, compute_block_hashes(old, BLOCK_SIZE)) == {}
        assert subscriber.gaps == 2 and feed.counters["feed.reset"] == 1
    finally:
        await subscriber.stop()
        await publisher.stop()
        await sub_link.close()
        await pub_link.close()


async def test_bad_messages_are_counted_and_the_subscription_goes_on(nats_server):
    router = make_router()
    counters = EventCounters()
    sub_link = await connect(nats_server, "router", counters)
    pub_link = await connect(nats_server, "worker-7")
    subscriber = NatsEventSubscriber(sub_link, make_feed(router), SUBJECT)
    publisher = NatsEventPublisher(pub_link.nc, SUBJECT, 7)
    try:
        await subscriber.start()
        await primed(pub_link, subscriber)
        await pub_link.nc.publish(SUBJECT, b"{not json")
        await pub_link.nc.publish(SUBJECT, b'{"worker_id":7,"event":{"event_id":0,"data":"moved"}}')
        publisher.on_stored(None, [1], [[1, 2, 3, 4]])
        await eventually(
            lambda: matches(router, compute_block_hashes([1, 2, 3, 4], 4)) == {W7: 1},
            what=f"{counters.snapshot()} {publisher.counters.snapshot()}",
        )
        assert counters["dynamo.malformed"] == 1 and counters["dynamo.unknown_variant"] == 1
        assert subscriber.gaps == 0
    finally:
        await subscriber.stop()
        await publisher.stop()
        await sub_link.close()
        await pub_link.close()


def test_event_id_tracker():
    tracker = EventIdTracker()
    assert tracker.check(W7, 5) is None  # the first id is always in order
    assert tracker.check(W7, 6) is None
    assert tracker.check(W8, 0) is None
    assert tracker.check(W7, 9) == 7  # lost 7, 8
    assert tracker.check(W7, 0) == 10  # publisher restarted
    assert tracker.check(W7, 1) is None
