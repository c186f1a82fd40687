"""The worker side of NATS core: `OrderedSender` and `NatsEventPublisher` at their edges.

Submissions from other threads, a full queue, a publish the server refuses, a connection that is
closed or a broker that stops reading, stop and flush, the request's cache salt, the counters the
caller hands in. Everything runs against a real nats-server; messages are read back from a
subscription on the publisher's own connection (nats-server echoes them back to it, and a
subscription flushed on the publishing connection sees everything published after it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from nats.aio.client import Client as NatsClient

from extproc.events.counters import EventCounters
from extproc.events.dynamo_json import decode_event, kv_events_subject
from extproc.events.nats_events import NatsEventPublisher, OrderedSender
from extproc.router import Worker, compute_block_hashes
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored

from .conftest import BLOCK_SIZE, connect, eventually

SUBJECT = kv_events_subject("edges", "backend")


async def listen(nc, subject: str = SUBJECT) -> list:
    """Subscribe on `nc` and return the list its messages are appended to, once registered."""
    received: list = []

    async def on_message(msg) -> None:
        received.append(msg)

    await nc.subscribe(subject, cb=on_message)
    await nc.flush()
    return received


def decoded(messages: list) -> list:
    """(worker id, event id, event) of each message, in arrival order."""
    out = []
    for msg in messages:
        event = decode_event(msg.data, EventCounters())
        assert event is not None, msg.data
        out.append(event)
    return out


def drain_tasks_started_since(before: set[asyncio.Task]) -> set[asyncio.Task]:
    return asyncio.all_tasks() - before - {asyncio.current_task()}


async def test_a_publisher_counts_into_the_counters_it_was_given(nats_server):
    counters = EventCounters()  # the worker's, exported on its /metrics
    link = await connect(nats_server, "worker-7")
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7, counters=counters)
    try:
        publisher.on_removed([1, 2])
        publisher.on_cleared()
        await publisher.flush(timeout_s=2)
        assert counters["nats.published"] == 2
        assert publisher.counters is counters
    finally:
        await publisher.stop()
        await link.close()


async def test_events_from_another_thread_follow_those_of_the_loop_in_order(nats_server):
    link = await connect(nats_server, "worker-7")
    received = await listen(link.nc)
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7, dp_rank=2, first_event_id=5)
    try:
        publisher.on_removed([1])  # on the loop: binds the sender to it

        def engine_thread() -> None:
            for h in (2, 3, 4):
                publisher.on_removed([h])
            publisher.on_cleared()

        await asyncio.to_thread(engine_thread)
        await publisher.flush(timeout_s=2)
        await eventually(lambda: len(received) >= 5, timeout_s=2, what=lambda: f"{len(received)} received")
        w = Worker("7", 2)
        assert [m.subject for m in received] == [SUBJECT] * 5
        assert decoded(received) == [
            ("7", 5, BlocksRemoved(w, (1,), event_id=5)),
            ("7", 6, BlocksRemoved(w, (2,), event_id=6)),
            ("7", 7, BlocksRemoved(w, (3,), event_id=7)),
            ("7", 8, BlocksRemoved(w, (4,), event_id=8)),
            ("7", 9, AllBlocksCleared(w, event_id=9)),
        ]
        assert publisher.counters["nats.published"] == 5
        assert publisher.counters["nats.publish_failed"] == 0
    finally:
        await publisher.stop()
        await link.close()


async def test_flush_returns_once_what_was_published_while_closed_is_counted_dropped(nats_server):
    link = await connect(nats_server, "worker-7")
    await link.close()
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7)
    try:
        publisher.on_removed([1])
        await publisher.flush(timeout_s=2)
        assert publisher.counters["nats.publish_dropped"] == 1
        publisher.on_cleared()
        publisher.on_removed([2])
        await publisher.flush(timeout_s=2)
        assert publisher.counters["nats.publish_dropped"] == 3
        assert publisher.counters["nats.published"] == 0
        assert publisher.next_event_id == 3  # the dropped events keep their ids: subscribers see a gap
    finally:
        await publisher.stop()


def test_an_event_published_before_any_event_loop_is_counted_and_does_not_raise():
    publisher = NatsEventPublisher(NatsClient(), SUBJECT, 7)  # never connected: nothing runs a loop
    publisher.on_cleared()
    publisher.on_removed([1])
    assert publisher.counters["nats.publish_failed"] == 2
    assert publisher.next_event_id == 2


async def test_a_full_queue_drops_and_counts_the_excess_and_sends_the_rest_in_order(nats_server):
    counters = EventCounters()
    link = await connect(nats_server, "sender")
    received = await listen(link.nc, "edges.q")
    sender = OrderedSender(link.nc, counters, "sync", drop_while_down=False, max_queued=2)
    try:
        for payload in (b"a", b"b", b"c"):  # no await in between: the queue is not drained yet
            sender.submit("edges.q", payload)
        assert counters["sync.publish_dropped"] == 1
        await sender.flush(timeout_s=2)
        assert counters["sync.published"] == 2
        await eventually(lambda: len(received) >= 2, timeout_s=2, what="two delivered")
        assert [m.data for m in received] == [b"a", b"b"]
    finally:
        await sender.stop()
        await link.close()


async def test_the_default_publish_queue_holds_100_000_messages(nats_server):
    counters = EventCounters()
    link = await connect(nats_server, "sender")
    sender = OrderedSender(link.nc, counters, "nats", drop_while_down=True)
    try:
        for _ in range(100_000):
            sender.submit("edges.bulk", b"x")
        assert counters["nats.publish_dropped"] == 0
        sender.submit("edges.bulk", b"x")
        assert counters["nats.publish_dropped"] == 1
    finally:
        await sender.stop()  # drops what is queued
        await link.close()


async def test_a_publish_the_server_refuses_is_counted_and_the_next_still_goes_out(nats_server):
    counters = EventCounters()
    link = await connect(nats_server, "sender")
    received = await listen(link.nc, "edges.big")
    sender = OrderedSender(link.nc, counters, "nats", drop_while_down=True)
    try:
        sender.submit("edges.big", b"x" * (link.nc.max_payload + 1))
        sender.submit("edges.big", b"small")
        await sender.flush(timeout_s=2)
        assert counters["nats.publish_failed"] == 1
        assert counters["nats.published"] == 1
        await eventually(lambda: received, timeout_s=2, what="the small message delivered")
        assert [m.data for m in received] == [b"small"]
    finally:
        await sender.stop()
        await link.close()


async def test_stop_leaves_no_publishing_task_behind(nats_server):
    link = await connect(nats_server, "worker-7")
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7)
    before = asyncio.all_tasks()
    try:
        publisher.on_cleared()
        await publisher.flush(timeout_s=2)
        started = drain_tasks_started_since(before)
        assert started, "publishing runs in a background task"
        await publisher.stop()
        assert all(task.done() for task in started)
        await publisher.stop()  # a second stop is harmless
    finally:
        await publisher.stop()
        await link.close()


async def test_flush_after_stop_does_not_wait_for_what_stop_dropped(nats_server):
    link = await connect(nats_server, "worker-7")
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7)
    try:
        publisher.on_cleared()  # queued, not yet sent: the background task has not run
        await publisher.stop()
        started = time.monotonic()
        await publisher.flush(timeout_s=1)
        assert time.monotonic() - started < 0.5
        assert publisher.counters["nats.published"] == 0
    finally:
        await publisher.stop()
        await link.close()


async def test_flush_gives_up_after_its_timeout_when_the_broker_stops_reading(nats_server):
    counters = EventCounters()
    link = await connect(nats_server, "sender")
    sender = OrderedSender(link.nc, counters, "sync", drop_while_down=False)
    payload = b"x" * (link.nc.max_payload // 2)
    os.kill(nats_server.pid, signal.SIGSTOP)  # hung: the socket stays open, nothing is read
    try:
        for _ in range(128):  # 64 MiB: more than the socket buffers and nats.py's pending buffer
            sender.submit("edges.stalled", payload)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sender.flush(timeout_s=0.3), timeout=3)
        assert time.monotonic() - started < 2, "flush waited past its own timeout"
        assert counters["sync.published"] < 128
    finally:
        os.kill(nats_server.pid, signal.SIGCONT)
        await sender.stop()
        await link.close()


async def test_a_stored_block_is_hashed_under_the_requests_cache_salt(nats_server):
    link = await connect(nats_server, "worker-7")
    received = await listen(link.nc)
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7)
    tokens = [1, 2, 3, 4]
    try:
        publisher.on_stored(None, [11], [tokens], cache_salt="tenant-a")
        publisher.on_stored(11, [12], [tokens])
        await publisher.flush(timeout_s=2)
        await eventually(lambda: len(received) >= 2, timeout_s=2, what="both stores delivered")
        (_, _, salted), (_, _, plain) = decoded(received)
        assert isinstance(salted, BlocksStored) and isinstance(plain, BlocksStored)
        salted_hash = compute_block_hashes(tokens, BLOCK_SIZE, namespace="tenant-a")[0]
        plain_hash = compute_block_hashes(tokens, BLOCK_SIZE)[0]
        assert salted_hash != plain_hash
        assert [(b.engine_hash, b.local_hash) for b in salted.blocks] == [(11, salted_hash)]
        assert [(b.engine_hash, b.local_hash) for b in plain.blocks] == [(12, plain_hash)]
    finally:
        await publisher.stop()
        await link.close()


async def test_stored_blocks_without_one_token_list_each_are_refused_and_not_published(nats_server):
    link = await connect(nats_server, "worker-7")
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7)
    try:
        with pytest.raises(ValueError):
            publisher.on_stored(None, [1, 2], [[1, 2, 3, 4]])
        with pytest.raises(ValueError):
            publisher.on_stored(None, [1], [[1, 2, 3, 4], [5, 6, 7, 8]])
        assert publisher.next_event_id == 0
        await publisher.flush(timeout_s=2)
        assert publisher.counters["nats.published"] == 0
    finally:
        await publisher.stop()
        await link.close()


async def test_what_stop_drops_is_counted_as_dropped(nats_server):
    counters = EventCounters()
    link = await connect(nats_server, "worker-7")
    publisher = NatsEventPublisher(link.nc, SUBJECT, 7, counters=counters)
    try:
        publisher.on_cleared()
        publisher.on_cleared()  # both queued: the background task has not run yet
        await publisher.stop()
        assert (counters["nats.published"], counters["nats.publish_dropped"]) == (0, 2)
    finally:
        await publisher.stop()
        await link.close()


async def test_a_sender_made_on_the_loop_takes_a_first_message_from_another_thread(nats_server):
    """An engine's thread may publish before anything on the loop does."""
    link = await connect(nats_server, "worker-7")
    received = await listen(link.nc)
    counters = EventCounters()
    sender = OrderedSender(link.nc, counters, "nats", drop_while_down=False)
    try:
        await asyncio.to_thread(sender.submit, SUBJECT, b"from a thread")
        await eventually(lambda: len(received) == 1, 5.0, "the thread's message")
        assert received[0].data == b"from a thread" and counters["nats.publish_failed"] == 0
    finally:
        await sender.stop()
        await link.close()


async def test_a_sender_made_off_the_loop_takes_the_loop_of_its_first_message(nats_server):
    """Made where no loop runs (an engine's start-up thread), it publishes from the loop of the first
    `submit`, and later ones from another thread follow in order."""
    link = await connect(nats_server, "worker-7")
    received = await listen(link.nc)
    counters = EventCounters()
    sender = await asyncio.to_thread(OrderedSender, link.nc, counters, "nats", drop_while_down=False)
    try:
        sender.submit(SUBJECT, b"first, from the loop")
        await asyncio.to_thread(sender.submit, SUBJECT, b"then from a thread")
        await eventually(lambda: len(received) == 2, 5.0, "both messages")
        assert [m.data for m in received] == [b"first, from the loop", b"then from a thread"]
        assert counters["nats.publish_failed"] == 0
    finally:
        await sender.stop()
        await link.close()
