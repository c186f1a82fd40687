"""NatsEventSubscriber at its edges: the reasons it gives the feed (shown on the admin API as a
worker's `cache_source_reason`), a gate that takes events, a failing sink, a pending queue that
overflows, a subscriber on the event plane only, and stop in every order.

Most tests hand messages to `handle` / `handle_event_plane` as the subscription does (no server);
those about the connection, the subjects and the pending queue run against a real nats-server.
"""

from __future__ import annotations

import pytest

from extproc.events.counters import EventCounters
from extproc.events.dynamo_intake import EventIdTracker
from extproc.events.dynamo_json import encode_event, kv_events_subject
from extproc.events.dynamo_plane import event_plane_subject
from extproc.events.feed import EVENT_FED, STALE, RouterFeed
from extproc.events.nats_events import NatsEventSubscriber
from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.router.types import AllBlocksCleared, BlocksStored, StoredBlock, Worker

from .conftest import (
    BLOCK_SIZE,
    PROBE_WORKER_BASE,
    connect,
    eventually,
    make_feed,
    make_router,
    matches,
    prime,
)
from .test_backpressure import ThreadPublisher
from .test_dynamo_plane import SUBJECT as PLANE_SUBJECT
from .test_dynamo_plane import fixture

SUBJECT = kv_events_subject("test", "backend")
W7 = Worker("7")


def stored(tokens: list[int], parent: int | None = None) -> BlocksStored:
    local = compute_block_hashes(tokens, BLOCK_SIZE)
    seq = compute_sequence_hashes(local)
    return BlocksStored(W7, tuple(StoredBlock(s, h) for s, h in zip(seq, local, strict=True)), parent)


def json_event(event_id: int, event) -> bytes:
    return encode_event(7, event, event_id, 0)


def offline(feed, **kwargs) -> NatsEventSubscriber:
    """A subscriber handed its messages directly (no link: `counters` given)."""
    kwargs.setdefault("counters", EventCounters())
    return NatsEventSubscriber(None, feed, kwargs.pop("subject", SUBJECT), **kwargs)  # type: ignore[arg-type]


class FailingFeed(RouterFeed):
    """The picker's feed, whose next `fail` applications raise."""

    fail = 0

    def apply_events(self, events) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("sink broke")
        super().apply_events(events)


# --- reasons the feed shows (admin API `cache_source_reason`) -----------------------------------


def test_the_first_event_of_a_worker_names_its_subject_as_the_reason():
    router = make_router()
    feed = make_feed(router)
    sub = offline(feed)
    sub.handle(json_event(0, stored(list(range(8)))))
    assert feed.state(W7) == EVENT_FED
    assert feed.reason(W7) == f"first event on {SUBJECT}"


def test_a_lost_worker_whose_publisher_restarts_is_reset_with_the_subject_and_ids_as_the_reason():
    router = make_router()
    feed = make_feed(router)
    sub = offline(feed)
    sub.handle(json_event(0, stored(list(range(8)))))
    sub.handle(json_event(1, stored(list(range(8, 12)), parent=999)))  # under a block never seen: lost
    assert feed.lost(W7)
    sub.handle(json_event(0, stored(list(range(50, 54)))))  # ids start over: a new engine
    assert not feed.lost(W7) and feed.state(W7) == EVENT_FED
    assert feed.reason(W7) == f"reset (its publisher restarted on {SUBJECT} (event 0 after 1))"
    assert matches(router, compute_block_hashes(list(range(50, 54)), BLOCK_SIZE)) == {W7: 1}
    assert matches(router, compute_block_hashes(list(range(8)), BLOCK_SIZE)) == {}


def test_an_event_plane_message_handed_without_a_subject_is_reported_on_the_configured_subject():
    feed = make_feed(make_router())
    sub = offline(feed, subject=None, event_plane_subject=PLANE_SUBJECT)
    sub.handle_event_plane(fixture("stored-root"))
    assert feed.reason(W7) == f"first event on {PLANE_SUBJECT}"


async def test_a_wildcard_event_plane_only_subscriber_reports_the_subject_each_event_came_on(nats_server):
    feed = make_feed(make_router())
    link = await connect(nats_server, "router")
    every_endpoint = event_plane_subject("ns1", "backend", "*")
    sub = NatsEventSubscriber(link, feed, None, event_plane_subject=every_endpoint)
    try:
        await sub.start()
        # from the subscriber's own connection: the server has its subscription before the message
        await link.nc.publish(PLANE_SUBJECT, fixture("stored-root"))
        await eventually(lambda: link.counters["nats.event"] == 1, what="the plane event applied")
        assert feed.state(W7) == EVENT_FED
        assert feed.reason(W7) == f"first event on {PLANE_SUBJECT}"  # the endpoint's, not the pattern
    finally:
        await sub.stop()
        await link.close()


async def test_a_lost_connection_marks_the_workers_stale_with_the_links_reason(nats_server):
    feed = make_feed(make_router())
    link = await connect(nats_server, "router")
    sub = NatsEventSubscriber(link, feed, SUBJECT)
    try:
        await sub.start()
        await link.nc.publish(SUBJECT, json_event(0, stored(list(range(8)))))
        await eventually(lambda: feed.state(W7) == EVENT_FED, what="event-fed")
        nats_server.stop()
        await eventually(lambda: feed.state(W7) == STALE, what="stale after the server went away")
        assert feed.reason(W7) == "NATS connection lost"
    finally:
        await sub.stop()
        await link.close()


# --- a gate that takes events ------------------------------------------------------------------


def test_events_a_gate_took_still_advance_the_workers_event_id():
    router = make_router()
    feed = make_feed(router)
    sub = offline(feed)
    taken: list[int] = []
    sub.gate = lambda worker, event_id, event: event_id < 2 and not taken.append(event_id)
    sub.handle(json_event(0, stored(list(range(4)))))
    sub.handle(json_event(1, stored(list(range(4, 8)))))
    assert taken == [0, 1] and sub.counters["nats.event"] == 0  # the gate applies them itself
    sub.handle(json_event(2, stored(list(range(8, 12)))))  # the gate lets go: the next id, no gap
    assert sub.gaps == 0 and sub.counters["nats.event"] == 1
    sub.handle(json_event(5, stored(list(range(12, 16)))))  # 3 and 4 lost
    assert sub.gaps == 1 and sub.counters.drops[("nats", "7", "event-id-gap")] == 2


def test_after_a_gate_took_a_workers_events_a_lower_id_is_a_restart():
    feed = make_feed(make_router())
    sub = offline(feed)
    sub.gate = lambda worker, event_id, event: event_id == 7
    sub.handle(json_event(7, stored(list(range(4)))))
    sub.gate = None
    sub.handle(json_event(0, stored(list(range(4, 8)))))
    assert sub.gaps == 1 and feed.counters["feed.reset"] == 1


# --- a failing sink ----------------------------------------------------------------------------


def test_a_sink_that_fails_is_counted_and_the_next_event_is_applied():
    router = make_router()
    feed = FailingFeed({w.worker_id: router for w in router.workers()}, EventCounters())
    sub = offline(feed)
    feed.fail = 1
    sub.handle(json_event(0, stored(list(range(8)))))  # never raises
    assert sub.counters["nats.sink_error"] == 1 and sub.counters["nats.event"] == 0
    sub.handle(json_event(1, stored(list(range(8, 12)))))
    assert sub.counters["nats.sink_error"] == 1 and sub.counters["nats.event"] == 1
    assert sub.gaps == 0
    assert matches(router, compute_block_hashes(list(range(8, 12)), BLOCK_SIZE)) == {W7: 1}


# --- the pending queue -------------------------------------------------------------------------


def test_a_queue_size_of_one_is_accepted_and_zero_is_not():
    feed = make_feed(make_router())
    assert offline(feed, queue_size=1).queue_size == 1
    with pytest.raises(ValueError):
        offline(feed, queue_size=0)
    with pytest.raises(ValueError):
        offline(feed, subject=None)


async def test_each_message_dropped_from_a_full_queue_is_counted_under_queue_full(nats_server):
    feed = make_feed(make_router())
    link = await connect(nats_server, "router")
    sub = NatsEventSubscriber(link, feed, SUBJECT, queue_size=2)
    burst = ThreadPublisher(nats_server.url)
    first = PROBE_WORKER_BASE + 1000  # the burst's workers; the probes' are below

    def cleared(worker_id: int) -> bytes:
        return encode_event(worker_id, AllBlocksCleared(Worker(str(worker_id))), 0, 0)

    def burst_seen() -> int:
        return sum(1 for w in sub.event_ids.workers() if int(w.worker_id) >= first)

    def dropped() -> int:
        return link.counters.drops[("nats", "*", "queue-full")]

    try:
        await sub.start()
        await prime(
            lambda n: burst.publish(SUBJECT, cleared(PROBE_WORKER_BASE + n)),
            lambda: link.counters["nats.event"],
        )
        burst.burst(SUBJECT, [cleared(first + i) for i in range(300)])  # this event loop is held meanwhile
        await eventually(lambda: burst_seen() + dropped() == 300, what="every message applied or dropped")
        assert dropped() > 0, "no drop: the burst fitted in the bound"
        assert link.counters["nats.queue_full"] == dropped()
        assert link.counters["nats.error"] == 0  # a slow consumer is not reported as a client error
    finally:
        burst.close()
        await sub.stop()
        await link.close()


# --- stop --------------------------------------------------------------------------------------


async def test_stop_before_start_and_stop_twice_do_nothing(nats_server):
    link = await connect(nats_server, "router")
    sub = NatsEventSubscriber(link, make_feed(make_router()), SUBJECT)
    try:
        await sub.stop()
        await sub.start()
        await sub.stop()
        await sub.stop()
        assert sub.pending == 0
    finally:
        await link.close()


async def test_stop_after_the_link_closed_does_not_raise(nats_server):
    link = await connect(nats_server, "router")
    sub = NatsEventSubscriber(link, make_feed(make_router()), SUBJECT)
    await sub.start()
    await link.close()
    await sub.stop()  # nats.py refuses to unsubscribe on a closed connection: nothing left to do
    assert sub.pending == 0


# --- EventIdTracker ----------------------------------------------------------------------------


def test_a_forgotten_worker_starts_over_and_forgetting_an_unknown_worker_is_harmless():
    tracker = EventIdTracker()
    w8 = Worker("8")
    assert tracker.check(W7, 5) is None
    assert tracker.check(w8, 1) is None
    tracker.forget(W7)
    tracker.forget(Worker("9"))  # never seen
    assert not tracker.knows(W7) and tracker.workers() == [w8]
    assert tracker.check(W7, 0) is None  # its first id again: in order
    assert tracker.check(w8, 2) is None
