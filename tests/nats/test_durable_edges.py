"""Durable mode's less travelled paths, on a real nats-server: what JetStream is asked to keep, the
snapshot lock's expiry and ownership, when a replica asks the stream and snapshots, the sequence's
boundaries (a redelivery, a hole of one message), a vanished consumer, and what is logged on the way.

Where a rule depends on time, the module's clock is replaced (`Clock`), so that its boundaries are
exact; everything else runs against the server. The replica's own consumer task is stopped where a
test drives a step itself (`stopped`), so that nothing else moves meanwhile.
"""

import asyncio
import gc
import logging

import nats.js.errors
import pytest
from nats.js import api

from extproc.events import durable as durable_module
from extproc.events.durable import SNAPSHOT_OBJECT, DurableConfig, DurableKvEvents, _ReadProgress
from extproc.events.dynamo_json import encode_event
from extproc.events.snapshot import Snapshot, SnapshotError, decode_snapshot, encode_snapshot
from extproc.router.types import BlocksStored, StoredBlock, Worker

from .conftest import connect, eventually, make_feed, make_router
from .test_durable import COMPONENT, NS, Replica, _write_snapshot

W7 = Worker("7", 0)


class Clock:
    """`durable`'s `time` module: monotonic seconds the test moves (or that move by `step` at each
    reading), and a wall clock beside it."""

    def __init__(self, now: float = 10_000.0) -> None:
        self.now = now
        self.step = 0.0

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def time(self) -> float:
        return 1.7e9 + self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(durable_module, "time", fake)
    return fake


def stored(event_id: int, first_block: int, worker_id: int = 7) -> bytes:
    """Dynamo JSON: engine `worker_id` stores one block (engine hash `first_block`) at the root."""
    event = BlocksStored(Worker(str(worker_id), 0), (StoredBlock(first_block, first_block + 1),))
    return encode_event(worker_id, event, event_id, 0)


@pytest.fixture
async def stopped(nats_server):
    """Makes started replicas whose consumer task is stopped (the test drives each step), each
    stopped again after the test: `await stopped("r2", lock_ttl_s=1.0)`."""
    made: list[Replica] = []

    async def make(replica_id: str = "r1", **config) -> Replica:
        replica = await Replica(nats_server, replica_id, **config).start()
        made.append(replica)
        await replica.durable.stop()
        return replica

    yield make
    for replica in made:
        await replica.stop()


async def publish(replica: Replica, count: int, first_event_id: int = 1) -> int:
    """`count` stored events of engine 7 into the stream (acknowledged by JetStream); the last seq."""
    js = replica.link.nc.jetstream()
    ack = None
    for i in range(count):
        ack = await js.publish(replica.config.subject, stored(first_event_id + i, 100 + i))
    assert ack is not None
    return ack.seq


def messages(caplog) -> list[str]:
    """Each log record's message, whole: a check that it is in the text would pass a longer one."""
    return [record.getMessage() for record in caplog.records]


class Calls:
    """Counts the calls of an async method, each still made."""

    def __init__(self, owner, name: str) -> None:
        self.count = 0
        real = getattr(owner, name)

        async def counted(*args, **kwargs):
            self.count += 1
            return await real(*args, **kwargs)

        setattr(owner, name, counted)


# --- names and configuration ------------------------------------------------------------------


def test_names_keep_letters_digits_dashes_and_underscores_and_replace_the_rest():
    config = DurableConfig("dyn.ns", "Vllm Worker*", "pod/1")
    assert config.stream == "kv-events-dyn_ns-Vllm_Worker_"
    assert config.consumer == "router-pod_1"
    assert config.snapshot_bucket == "kv-snapshots-dyn_ns-Vllm_Worker_"
    assert config.lock_bucket == "kv-locks-dyn_ns-Vllm_Worker_"


def test_a_config_that_cannot_work_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"^snapshot_threshold must be at least 1, got 0$"):
        DurableConfig(NS, COMPONENT, "r1", snapshot_threshold=0)
    with pytest.raises(
        ValueError, match=r"^replica_id must not be empty \(it names this replica's durable consumer\)$"
    ):
        DurableConfig(NS, COMPONENT, "")


async def test_the_stream_and_consumers_are_made_as_the_docstring_says(stopped):
    """File storage, limits retention, an hour's max age, Dynamo 1.0-1.3's stream sourced; consumers
    that ack a batch with its last message, hold at least 1,000 unacknowledged messages (four
    batches when larger) and vanish after an idle max age."""
    small = await stopped("small", fetch_batch=10)
    large = await stopped("large", fetch_batch=300)
    js = small.link.nc.jetstream()
    stream = (await js.stream_info(small.config.stream)).config
    assert sorted(stream.subjects) == sorted(small.config.subjects)
    assert [s.name for s in stream.sources] == [small.config.dynamo_stream]
    assert stream.storage == api.StorageType.FILE and stream.retention == api.RetentionPolicy.LIMITS
    assert stream.max_age == 3600.0
    for replica, pending in ((small, 1000), (large, 1200)):
        consumer = (await js.consumer_info(replica.config.stream, replica.config.consumer)).config
        assert consumer.durable_name == replica.config.consumer
        assert consumer.ack_policy == api.AckPolicy.ALL
        assert consumer.max_ack_pending == pending
        assert consumer.inactive_threshold == 3600.0


async def test_a_stream_left_with_another_config_is_brought_to_ours(nats_server, stopped):
    """An older picker (or a hand) made the stream with one subject and a minute's max age."""
    link = await connect(nats_server, "old")
    config = DurableConfig(NS, COMPONENT, "r1")
    try:
        await link.nc.jetstream().add_stream(
            api.StreamConfig(name=config.stream, subjects=[config.subject], max_age=60.0)
        )
    finally:
        await link.close()
    replica = await stopped()
    stream = (await replica.link.nc.jetstream().stream_info(config.stream)).config
    assert sorted(stream.subjects) == sorted(config.subjects) and stream.max_age == 3600.0
    assert [s.name for s in stream.sources] == [config.dynamo_stream]


async def test_a_batch_is_acknowledged_whole_so_nothing_comes_again_after_the_ack_wait(nats_server):
    replica = await Replica(nats_server, "r1").start()
    try:
        last = await publish(replica, 5)
        await eventually(lambda: replica.durable.applied_seq == last, what="5 messages applied")
        js = replica.link.nc.jetstream()

        async def all_acked() -> bool:
            info = await js.consumer_info(replica.config.stream, replica.config.consumer)
            return info.ack_floor.stream_seq == last and info.num_ack_pending == 0

        await eventually(all_acked, what="the whole batch acknowledged")
    finally:
        await replica.stop()


# --- the snapshot lock ----------------------------------------------------------------------------


async def test_a_lock_left_by_a_replica_that_died_expires_after_its_ttl(stopped, caplog):
    dead = await stopped("dead", lock_ttl_s=1.0)
    alive = await stopped("alive")
    await publish(alive, 2)
    alive.durable.applied_seq, alive.durable._seq_known = 2, True
    assert await dead.durable._take_lock() is not None
    await dead.link.close()  # gone without releasing it
    assert await alive.durable.snapshot_now() is False
    assert alive.durable.counters["durable.snapshot_lock_busy"] == 1
    await eventually(alive.durable.snapshot_now, timeout_s=10, what="the dead replica's lock expired")
    assert alive.durable.counters["durable.snapshot"] == 1


async def test_a_replica_releasing_a_lock_that_expired_does_not_release_the_next_holders(stopped):
    slow = await stopped("slow", lock_ttl_s=1.0)
    other = await stopped("other")
    old = await slow.durable._take_lock()
    assert old is not None

    async def taken_by_other() -> bool:
        return await other.durable._take_lock() is not None

    await eventually(taken_by_other, timeout_s=10, what="the slow replica's lock expired")
    await slow.durable._release_lock(old)  # its snapshot took longer than the TTL
    assert await slow.durable._take_lock() is None  # still the other's


# --- when a snapshot is written --------------------------------------------------------------------


async def test_a_replica_that_applied_nothing_writes_no_snapshot(stopped):
    replica = await stopped()
    assert await replica.durable.snapshot_now() is False
    assert await replica.durable.load_snapshot() is None
    assert await replica.durable._take_lock() is not None  # and the lock was given back


async def test_a_snapshot_never_replaces_a_newer_one(stopped):
    """The stream starts two after this replica's position: another replica's snapshot at the one
    between covers more than this one's would. Right after it, this replica's is as new: written."""
    replica = await stopped()
    await publish(replica, 4)
    js = replica.link.nc.jetstream()
    await js.purge_stream(replica.config.stream, seq=3)  # 1 and 2 purged, as a snapshot at 2 would
    newer = Snapshot((), 2, "newer")
    await replica.durable._objects.put(SNAPSHOT_OBJECT, encode_snapshot(newer))
    replica.durable.applied_seq, replica.durable._seq_known = 1, True
    assert await replica.durable.snapshot_now() is False
    assert (await replica.durable.load_snapshot()).created_by == "newer"
    replica.durable.applied_seq = 2
    assert await replica.durable.snapshot_now() is True
    assert (await replica.durable.load_snapshot()).created_by == "r1"


async def test_a_lossy_view_withholds_the_snapshot_and_names_its_workers(nats_server, caplog):
    replica = Replica(nats_server, "r1")
    replica.link = await connect(nats_server, "r1")
    lossy = [Worker("7", 0), Worker("8", 1)]
    replica.durable = DurableKvEvents(
        replica.link.nc, make_feed(replica.router), replica.router, replica.config, lossy=lambda: lossy
    )
    await replica.durable.start()
    await replica.durable.stop()
    try:
        await publish(replica, 1)
        replica.durable.applied_seq, replica.durable._seq_known = 1, True
        with caplog.at_level(logging.WARNING, "extproc"):
            assert await replica.durable.snapshot_now() is False
        assert (
            "no KV snapshot written: the view of 7, 8/dp1 misses blocks its engine holds (a snapshot of "
            "it would replace a better one); waiting until it is whole again"
        ) in messages(caplog)
        assert replica.durable.counters["durable.snapshot_withheld"] == 1
    finally:
        await replica.stop()


@pytest.mark.parametrize(
    ("threshold", "messages", "new", "since_check_s", "since_try_s", "interval_s", "asks", "writes"),
    [
        (4, 4, 0, 10.0, 0.0, None, False, False),  # nothing new since the last check
        (4, 5, 1, 0.0, 0.0, None, True, True),  # a quarter of 4 is one message; over the threshold
        (4, 4, 1, 0.0, 0.0, None, True, False),  # at the threshold: not over it
        (100, 5, 24, 1.9, 0.0, None, False, False),  # under a quarter, and checked under 2 s ago
        (100, 5, 25, 0.0, 0.0, None, True, False),  # a quarter
        (102, 5, 25, 0.0, 0.0, None, True, False),  # a quarter of 102 is 25 messages
        (100, 5, 1, 2.0, 0.0, None, True, False),  # 2 s since the last check
        (100, 5, 1, 2.5, 0.0, None, True, False),
        (100, 0, 0, 0.0, 1800.0, None, True, False),  # due (half of max_age), but the stream is empty
        (100, 1, 0, 0.0, 1800.0, None, True, True),  # due, with a message
        (100, 1, 0, 0.0, 1200.5, None, False, False),  # not due yet
        (100, 1, 0, 0.0, 10.0, 10.0, True, True),  # due by its own interval
        (100, 1, 0, 0.0, 9.9, 10.0, False, False),
    ],
)
async def test_when_a_replica_asks_the_stream_and_snapshots(
    stopped, clock, threshold, messages, new, since_check_s, since_try_s, interval_s, asks, writes
):
    """It asks the server only after a quarter of the threshold in new messages, 2 s since it last
    asked, or when a snapshot is due; it snapshots over the threshold, or when due and not empty."""
    replica = await stopped(snapshot_threshold=threshold, snapshot_interval_s=interval_s)
    durable = replica.durable
    if messages:
        await publish(replica, messages)
    durable.applied_seq, durable._seq_known = 10 + new, True
    durable._last_check = (clock.now - since_check_s, 10)
    durable._last_snapshot_try = clock.now - since_try_s
    info = Calls(durable.js, "stream_info")
    written: list[bool] = []

    async def snapshot_now() -> bool:
        written.append(True)
        return True

    durable.snapshot_now = snapshot_now
    await durable._maybe_snapshot()
    assert (info.count == 1, bool(written)) == (asks, writes)


# --- the sequence: redelivery, holes, reloads --------------------------------------------------------


async def test_the_last_applied_message_delivered_again_is_not_applied_again(stopped):
    replica = await stopped()
    durable = replica.durable
    await durable._handle(1, stored(1, 100), replica.config.subject)
    await durable._handle(1, stored(1, 100), replica.config.subject)
    assert durable.counters["durable.redelivered"] == 1 and durable.counters["durable.event"] == 1
    assert durable.counters["durable.gap"] == 0


async def test_a_hole_of_one_message_is_seen_and_counted_lost(stopped, caplog):
    replica = await stopped()
    durable = replica.durable
    await durable._handle(4, stored(1, 100), replica.config.subject)
    with caplog.at_level(logging.WARNING, "extproc"):
        await durable._handle(6, stored(2, 101), replica.config.subject)
    assert "KV event stream seqs 5..5 are gone and no snapshot covers them" in messages(caplog)
    assert durable.counters["durable.lost"] == 1 and durable.applied_seq == 6
    await durable._handle(7, stored(3, 102), replica.config.subject)  # the next one follows
    assert durable.counters["durable.lost"] == 1 and durable.counters["durable.event"] == 3


async def test_a_message_the_reloaded_snapshot_covers_is_not_applied_again(stopped, caplog):
    replica = await stopped()
    durable = replica.durable
    await durable._handle(2, stored(1, 100), replica.config.subject)
    snapshot = Snapshot(
        (
            BlocksStored(W7, (StoredBlock(100, 101), StoredBlock(200, 201))),
            BlocksStored(Worker("8", 0), (StoredBlock(300, 301),)),
        ),
        5,
        "r2",
    )
    await durable._objects.put(SNAPSHOT_OBJECT, encode_snapshot(snapshot))
    with caplog.at_level(logging.INFO, "extproc"):
        await durable._handle(5, stored(2, 200), replica.config.subject)
    assert "stream seq 5 follows 2: reloading the snapshot at 5" in messages(caplog)
    assert "worker 7: forgetting its cached blocks (reloading the KV snapshot at stream seq 5)" in (
        messages(caplog)
    )
    assert durable.sink.reason(Worker("8", 0)) == "reloaded snapshot"  # first named by the snapshot
    assert durable.counters["durable.reload"] == 1 and durable.counters["durable.event"] == 1
    assert durable.counters["durable.lost"] == 0 and durable.applied_seq == 5


async def test_a_snapshot_no_newer_than_the_replica_is_not_reloaded(stopped):
    replica = await stopped()
    durable = replica.durable
    await durable._handle(3, stored(1, 100), replica.config.subject)
    await durable._objects.put(SNAPSHOT_OBJECT, encode_snapshot(Snapshot((), 3, "r2")))
    await durable._handle(5, stored(2, 101), replica.config.subject)
    assert durable.counters["durable.reload"] == 0 and durable.counters["durable.lost"] == 1
    assert durable.sink.counters["feed.reset"] == 0


async def test_a_replica_starting_from_a_snapshot_reads_only_what_follows_it(nats_server, stopped, caplog):
    """The snapshot was written at 3 and the stream not purged (its writer stopped in between)."""
    writer = await stopped("writer")
    await publish(writer, 5)
    snapshot = encode_snapshot(Snapshot((BlocksStored(W7, (StoredBlock(100, 101),)),), 3, "writer"))
    snapshot_bytes = len(snapshot)
    await writer.durable._objects.put(SNAPSHOT_OBJECT, snapshot)
    await writer.stop()
    with caplog.at_level(logging.INFO, "extproc"):
        replica = await Replica(nats_server, "r1").start()
    feed_reason, feed_state = replica.durable.sink.reason(W7), replica.durable.sink.state(W7)
    try:
        await eventually(lambda: replica.durable.applied_seq == 5, what="messages 4 and 5 applied")
        counters = replica.durable.counters
        assert counters["durable.event"] == 2 and counters["durable.redelivered"] == 0
        assert feed_reason == "starting from the snapshot" and feed_state == "event-fed"
        assert replica.durable.sink.reason(W7) == "starting from the snapshot"  # not news: 4 and 5 are its
        read = [m for m in messages(caplog) if m.startswith("read the KV snapshot")]
        assert len(read) == 1, read
        head, seconds = read[0].removesuffix(" s").rsplit(" in ", 1)
        assert head == f"read the KV snapshot at stream seq 3: 1 events, {snapshot_bytes} bytes"
        assert 0 <= float(seconds) < 60
    finally:
        await replica.stop()


async def test_a_workers_first_event_says_where_it_came_from(stopped):
    replica = await stopped()
    await replica.durable._handle(1, stored(1, 100), replica.config.subject)
    assert replica.durable.sink.reason(W7) == "first durable event from stream kv-events-test-backend"


async def test_an_event_id_gap_is_logged_and_followed_on_the_stream(stopped, caplog):
    """A higher id: the events between were lost (counted dropped); a lower one: the publisher
    restarted, and its engine's blocks are forgotten."""
    replica = await stopped()
    durable = replica.durable
    await durable._handle(1, stored(1, 100), replica.config.subject)
    with caplog.at_level(logging.INFO, "extproc"):
        await durable._handle(2, stored(4, 101), replica.config.subject)
        await durable._handle(3, stored(1, 102), replica.config.subject)
    assert "KV event gap from 7: expected event 2, got 4" in messages(caplog)
    assert durable.counters["durable.gap"] == 2
    assert durable.counters.drops[("nats", "7", "event-id-gap")] == 2
    assert (
        "worker 7: forgetting its cached blocks (its publisher restarted on stream "
        "kv-events-test-backend (event 1 after 4))"
    ) in messages(caplog)


async def test_wire_worker_ids_are_named_as_configured(nats_server):
    replica = Replica(nats_server, "r1")
    replica.router = make_router("engine-7")
    replica.link = await connect(nats_server, "r1")
    replica.durable = DurableKvEvents(
        replica.link.nc,
        make_feed(replica.router),
        replica.router,
        replica.config,
        worker_id_of=lambda wire_id: f"engine-{wire_id}",
    )
    await replica.durable.start()
    await replica.durable.stop()
    try:
        await replica.durable._handle(1, stored(1, 100), replica.config.subject)
        assert replica.durable.sink.counters["feed.unknown_worker"] == 0
        assert replica.router.indexer.find_matches([101]) == {Worker("engine-7", 0): 1}
    finally:
        await replica.stop()


# --- an idle replica asking whether its messages were purged ---------------------------------------


async def test_an_idle_replica_asks_the_stream_at_most_every_two_seconds(stopped, clock):
    replica = await stopped()
    durable = replica.durable
    info = Calls(durable.js, "stream_info")
    await durable._reload_if_purged()
    assert info.count == 0  # nothing applied yet: nothing to miss
    durable.applied_seq, durable._seq_known = 3, True
    await durable._reload_if_purged()
    assert info.count == 1
    clock.now += 1.9
    await durable._reload_if_purged()
    assert info.count == 1
    clock.now += 0.1
    await durable._reload_if_purged()
    assert info.count == 2


async def test_an_idle_replica_reloads_for_a_hole_of_one_and_not_for_a_next_message_still_there(
    stopped, clock, caplog
):
    replica = await stopped()
    durable = replica.durable
    await publish(replica, 4)
    durable.applied_seq, durable._seq_known = 1, True
    await replica.link.nc.jetstream().purge_stream(replica.config.stream, seq=2)  # 1 gone, 2 first
    await durable._reload_if_purged()  # message 2 is there: it will come
    assert durable.counters["durable.purged_while_idle"] == 0
    await replica.link.nc.jetstream().purge_stream(replica.config.stream, seq=3)  # 1 and 2 gone
    await durable._objects.put(SNAPSHOT_OBJECT, encode_snapshot(Snapshot((), 2, "r2")))
    clock.now += 2.0
    with caplog.at_level(logging.INFO, "extproc"):
        await durable._reload_if_purged()
    assert durable.counters["durable.purged_while_idle"] == 1 and durable.counters["durable.reload"] == 1
    assert "stream seq 3 follows 1: reloading the snapshot at 2" in messages(caplog)
    assert durable.applied_seq == 2 and durable.counters["durable.lost"] == 0


# --- a consumer that vanished --------------------------------------------------------------------------


async def test_a_replica_whose_consumer_was_deleted_makes_it_again_where_it_stands(nats_server):
    replica = await Replica(nats_server, "r1", fetch_timeout_s=0.2).start()
    try:
        last = await publish(replica, 3)
        await eventually(lambda: replica.durable.applied_seq == last, what="3 messages applied")
        js = replica.link.nc.jetstream()
        await js.delete_consumer(replica.config.stream, replica.config.consumer)
        last = await publish(replica, 2, first_event_id=4)
        await eventually(
            lambda: replica.durable.applied_seq == last, timeout_s=10, what="the 2 later messages applied"
        )
        counters = replica.durable.counters
        assert counters["durable.resubscribe"] == 1 and counters["durable.redelivered"] == 0
        assert counters["durable.event"] == 5 and counters["durable.gap"] == 0
    finally:
        await replica.stop()


# --- reset, and what is logged ------------------------------------------------------------------------


async def test_reset_states_survives_a_consumer_deleted_under_it_and_says_what_it_did(stopped, caplog):
    """Two replicas resetting at once: the other deleted a consumer between the listing and our delete."""
    replica = await stopped()
    other = await stopped("r2")
    await publish(replica, 2)
    js = replica.durable.js
    real_delete = js.delete_consumer

    async def deleted_first(stream, consumer):
        await other.link.nc.jetstream().delete_consumer(stream, consumer)
        return await real_delete(stream, consumer)

    js.delete_consumer = deleted_first
    with caplog.at_level(logging.INFO, "extproc"):
        await replica.durable.reset_states()
    assert (
        "durable KV events reset: stream kv-events-test-backend purged, snapshot emptied, "
        "consumers deleted" in messages(caplog)
    )
    assert (await js.consumers_info(replica.config.stream)) == []
    empty = await replica.durable.load_snapshot()
    assert empty is not None and empty.stream_seq == 2 and empty.events == ()
    assert empty.created_at_s > 1.6e9  # when (wall clock), for operators


async def test_a_replica_with_no_snapshot_and_purged_history_says_which_events_it_misses(
    nats_server, stopped, caplog
):
    first = await stopped("first")
    await publish(first, 3)
    await first.stop()
    replica = await Replica(nats_server, "r1").start()  # history from seq 1, no snapshot: nothing to say
    await replica.stop()
    assert replica.durable.counters["durable.snapshot_missing"] == 0
    link = await connect(nats_server, "hand")
    try:
        await link.nc.jetstream().purge_stream(replica.config.stream, seq=2)  # only 1 gone
    finally:
        await link.close()
    with caplog.at_level(logging.WARNING, "extproc"):
        replica = await Replica(nats_server, "r2").start()
    try:
        assert replica.durable.counters["durable.snapshot_missing"] == 1
        await eventually(lambda: replica.durable.applied_seq == 3, what="messages 2 and 3 applied")
        assert replica.durable.counters["durable.lost"] == 0  # said once, at the start
        assert (
            "no KV snapshot in bucket kv-snapshots-test-backend, but stream kv-events-test-backend starts "
            "at seq 2: the blocks stored by events 1..1 are unknown to this replica (snapshot deleted, "
            "or the stream aged out before one was written); it learns them again as engines store blocks"
        ) in messages(caplog)
    finally:
        await replica.stop()


def test_a_long_snapshot_read_logs_its_progress_every_five_seconds(clock, caplog):
    progress = _ReadProgress(clock.now)
    with caplog.at_level(logging.INFO, "extproc"):
        for after_s, read in ((4.9, 500_000), (5.0, 1_050_000), (9.9, 1_500_000), (10.0, 1_850_000)):
            clock.now = 10_000.0 + after_s
            progress(read, 2_350_000)
        clock.now = 10_030.0
        progress(2_350_000, 2_350_000)  # done: nothing more to say
    assert [r.getMessage() for r in caplog.records] == [
        "reading the KV snapshot: 1.1 of 2.4 MB",
        "reading the KV snapshot: 1.9 of 2.4 MB",
    ]


async def test_an_unreadable_snapshot_is_ignored_loudly_with_the_reason(stopped, caplog):
    replica = await stopped()
    await replica.durable._objects.put(SNAPSHOT_OBJECT, b"not msgpack at all \xc1")
    with caplog.at_level(logging.WARNING, "extproc"):
        assert await replica.durable.load_snapshot() is None
    assert replica.durable.counters["durable.bad_snapshot"] == 1
    message = next(r.getMessage() for r in caplog.records if "unreadable" in r.getMessage())
    assert message.startswith("ignoring unreadable KV snapshot: ") and len(message) > 34


async def test_a_snapshot_read_that_keeps_failing_gives_up_after_its_attempts(stopped, monkeypatch, caplog):
    replica = await stopped(snapshot_read_attempts=2)

    async def timed_out(*args, **kwargs):
        raise TimeoutError("the object store did not answer")

    monkeypatch.setattr(durable_module, "read_object", timed_out)
    with (
        caplog.at_level(logging.WARNING, "extproc"),
        pytest.raises(TimeoutError, match="could not read the KV snapshot in 2 attempts"),
    ):
        await replica.durable.load_snapshot()
    assert replica.durable.counters["durable.snapshot_read_retry"] == 2
    assert "reading the KV snapshot failed (the object store did not answer); retrying" in messages(caplog)


async def test_a_snapshot_written_says_where_and_how_large(stopped, caplog):
    replica = await stopped()
    await publish(replica, 1)
    await replica.durable._handle(1, stored(1, 100), replica.config.subject)
    with caplog.at_level(logging.INFO, "extproc"):
        assert await replica.durable.snapshot_now()
    message = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV snapshot at"))
    size = (await replica.durable._objects.get_info(SNAPSHOT_OBJECT)).size
    assert message == f"KV snapshot at stream seq 1: 1 events, {size} bytes; stream purged"


async def test_stop_leaves_no_subscription_behind(nats_server):
    replica = await Replica(nats_server, "r1").start()
    subs_before_stop = len(replica.link.nc._subs)
    await replica.durable.stop()
    try:
        assert len(replica.link.nc._subs) == subs_before_stop - 1
    finally:
        await replica.stop()


# --- the consumer loop after an error ------------------------------------------------------------------


class FailingFetches:
    """A pull subscription whose `fetch` raises for the first `failures` calls marked True, then
    answers as the real one does; `failures` is consumed in order (False: a real fetch). `batches`:
    how many messages each fetch that brought any brought."""

    def __init__(self, real, failures: list[bool]) -> None:
        self.real = real
        self.failures = failures
        self.batches: list[int] = []

    async def fetch(self, *args, **kwargs):
        if self.failures and self.failures.pop(0):
            raise RuntimeError("boom")
        msgs = await self.real.fetch(*args, **kwargs)
        if msgs:
            self.batches.append(len(msgs))
        return msgs

    async def unsubscribe(self) -> None:
        await self.real.unsubscribe()


async def replica_with_recorded_pauses(nats_server) -> tuple[Replica, list[float]]:
    pauses: list[float] = []

    async def retry_sleep(seconds: float) -> None:
        pauses.append(seconds)
        await asyncio.sleep(0)

    replica = Replica(nats_server, "r1", fetch_timeout_s=0.05)
    replica.link = await connect(nats_server, "r1")
    replica.durable = DurableKvEvents(
        replica.link.nc, make_feed(replica.router), replica.router, replica.config, retry_sleep=retry_sleep
    )
    await replica.durable.start()
    await replica.durable.stop()
    return replica, pauses


async def test_errors_in_a_row_pause_longer_each_time_up_to_five_seconds_and_success_starts_over(
    nats_server, caplog
):
    replica, pauses = await replica_with_recorded_pauses(nats_server)
    durable = replica.durable
    try:
        await durable.resume()
        durable._psub = FailingFetches(durable._psub, [True] * 8 + [False] + [True] * 2)
        with caplog.at_level(logging.WARNING, "extproc"):
            await eventually(lambda: len(pauses) == 10, what=lambda: f"ten pauses: {pauses}")
        assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 0.1, 0.2]
        assert durable.counters["durable.error"] == 10
        assert "durable KV event consumer error: RuntimeError('boom'); retrying" in messages(caplog)
        last = await publish(replica, 2)
        await eventually(lambda: durable.applied_seq == last, what="the consumer goes on")
    finally:
        await replica.stop()


async def test_a_consumer_check_that_fails_after_an_error_does_not_end_the_loop(nats_server):
    replica, pauses = await replica_with_recorded_pauses(nats_server)
    durable = replica.durable
    checks: list[int] = []
    real_info = durable.js.consumer_info

    async def unreachable_once(*args, **kwargs):
        checks.append(1)
        if len(checks) == 1:
            raise ConnectionError("the server did not answer")
        return await real_info(*args, **kwargs)

    durable.js.consumer_info = unreachable_once
    try:
        await durable.resume()
        durable._psub = FailingFetches(durable._psub, [True, True])
        last = await publish(replica, 2)
        await eventually(lambda: durable.applied_seq == last, what="applied after two errors")
        assert len(checks) == 2 and durable.counters["durable.resubscribe"] == 0 and pauses == [0.1, 0.2]
    finally:
        await replica.stop()


async def test_a_batch_left_half_handled_is_taken_up_after_its_last_applied_message(nats_server, caplog):
    """Applying the third of five messages fails: the consumer starts over at the fourth (not at
    the first, not skipping one), without waiting out the ack wait."""
    replica, pauses = await replica_with_recorded_pauses(nats_server)
    durable = replica.durable
    real_apply = durable.sink.apply_events
    applied: list[int] = []

    def apply_events(events) -> None:
        events = list(events)
        first = events[0].blocks[0].engine_hash
        if first == 102 and 102 not in applied:
            applied.append(102)
            raise RuntimeError("a bug in applying")
        applied.extend(e.blocks[0].engine_hash for e in events)
        real_apply(events)

    durable.sink.apply_events = apply_events
    try:
        last = await publish(replica, 5)
        await durable.resume()
        subscriptions = len(replica.link.nc._subs)  # nats.py's own table: one per pull subscription
        await eventually(lambda: durable.applied_seq == last, what="all five handled")
        assert applied == [100, 101, 102, 103, 104]
        assert len(replica.link.nc._subs) == subscriptions  # the one it left was unsubscribed
        counters = durable.counters
        assert counters["durable.error"] == 1 and counters["durable.resubscribe"] == 1 and pauses == [0.1]
        assert counters["durable.redelivered"] == 0 and counters["durable.lost"] == 0
    finally:
        await replica.stop()


async def test_a_fetch_that_fails_right_after_a_restart_is_not_a_reason_to_restart_again(nats_server):
    replica, pauses = await replica_with_recorded_pauses(nats_server)
    durable = replica.durable
    real_apply, real_subscribe = durable.sink.apply_events, durable._subscribe
    failed: list[int] = []

    def apply_events(events) -> None:
        events = list(events)
        if not failed:
            failed.append(1)
            raise RuntimeError("a bug in applying")
        real_apply(events)

    async def subscribe(start_seq):
        await real_subscribe(start_seq)
        durable._psub = FailingFetches(durable._psub, [True])  # the first fetch after it fails

    durable.sink.apply_events = apply_events
    try:
        last = await publish(replica, 3)
        await durable.resume()
        durable._subscribe = subscribe
        await eventually(lambda: durable.applied_seq == last, what="all three handled")
        assert durable.counters["durable.resubscribe"] == 1 and pauses == [0.1, 0.2]
    finally:
        await replica.stop()


async def test_messages_waiting_come_in_one_fetch(stopped):
    replica = await stopped()
    durable = replica.durable
    last = await publish(replica, 5)
    await durable.resume()
    durable._psub = recorder = FailingFetches(durable._psub, [])
    await eventually(lambda: durable.applied_seq == last, what="all five applied")
    assert recorder.batches == [5]


async def test_a_snapshot_is_applied_in_slices_that_end_before_the_store_that_fills_one(nats_server):
    """A slice ends before a store once it holds `SNAPSHOT_SLICE_BLOCKS` (4,096) blocks."""
    sizes = (4096, 4095, 1, 1)
    events = tuple(
        BlocksStored(W7, tuple(StoredBlock(1000 * n + k, 1000 * n + k + 1) for k in range(size)))
        for n, size in enumerate(sizes, start=1)
    )
    await _write_snapshot(nats_server, events, stream_seq=0)
    replica = Replica(nats_server, "r1")
    feed = make_feed(replica.router)
    real_apply = feed.apply_events
    calls: list[int] = []

    def apply_events(batch) -> None:
        batch = list(batch)
        calls.append(len(batch))
        real_apply(batch)

    feed.apply_events = apply_events
    replica.link = await connect(nats_server, "r1")
    replica.durable = DurableKvEvents(replica.link.nc, feed, replica.router, replica.config)
    try:
        await replica.durable.start()
        assert calls == [1, 2, 1]
    finally:
        await replica.stop()


async def test_a_snapshot_read_logs_its_progress_while_it_goes_on(stopped, clock, caplog):
    """Three chunks of the object store (128 KiB each), each read 3 s after the last on `clock`."""
    replica = await stopped()
    junk = bytes(range(256)) * 1172  # 300,032 bytes, not a snapshot
    await replica.durable._objects.put(SNAPSHOT_OBJECT, junk)
    clock.step = 3.0
    with caplog.at_level(logging.INFO, "extproc"):
        assert await replica.durable.load_snapshot() is None
    with pytest.raises(SnapshotError) as unreadable:
        decode_snapshot(junk)
    assert messages(caplog) == [
        "reading the KV snapshot: 0.3 of 0.3 MB",
        f"ignoring unreadable KV snapshot: {unreadable.value}",
    ]


# --- the lock: nats.py's race, cancels, and what the loop is told ---------------------------------------


async def test_a_lock_that_expires_while_nats_py_looks_at_it_is_taken_on_the_second_try(stopped):
    """nats.py's `KeyValue.create`, refused because the key exists, reads the key to tell a deleted
    one; when the holder's TTL runs out in between it raises KeyNotFoundError (seen in
    `test_a_lock_left_by_a_replica_that_died_expires_after_its_ttl`, about one run in ten). Here the
    first create raises it as nats.py does."""
    replica = await stopped()
    locks = replica.durable._locks
    real_create = locks.create
    raised: list[int] = []

    async def expired_meanwhile(*args, **kwargs):
        if len(raised) < times:
            raised.append(1)
            raise nats.js.errors.KeyNotFoundError
        return await real_create(*args, **kwargs)

    locks.create = expired_meanwhile
    times = 1
    revision = await replica.durable._take_lock()
    assert revision is not None and (await locks.get("snapshot")).value == b"r1"
    await replica.durable._release_lock(revision)
    raised.clear()
    times = 2
    assert await replica.durable._take_lock() is None  # twice in a row: left for the next check
    assert len(raised) == 2


async def test_a_released_lock_is_gone_when_the_release_returns(stopped):
    replica = await stopped()
    revision = await replica.durable._take_lock()
    await replica.durable._release_lock(revision)
    with pytest.raises(nats.js.errors.NotFoundError):
        await replica.durable._locks.get("snapshot")


async def test_a_snapshot_that_outlasts_its_lock_leaves_the_next_holders_lock(stopped):
    slow = await stopped("slow", lock_ttl_s=1.0)
    other = await stopped("other")
    objects = slow.durable._objects
    real_put = objects.put

    async def put_after_the_lock_expired(*args, **kwargs):
        async def taken_by_other() -> bool:
            return await other.durable._take_lock() is not None

        await eventually(taken_by_other, timeout_s=10, what="the slow replica's lock expired")
        return await real_put(*args, **kwargs)

    objects.put = put_after_the_lock_expired
    await publish(slow, 1)
    slow.durable.applied_seq, slow.durable._seq_known = 1, True
    assert await slow.durable.snapshot_now()
    assert (await slow.durable._locks.get("snapshot")).value == b"other"


async def test_a_take_cancelled_while_another_holds_the_lock_is_a_plain_cancel(stopped):
    holder = await stopped("holder")
    replica = await stopped()
    assert await holder.durable._take_lock() is not None
    take = asyncio.ensure_future(replica.durable._take_lock())
    await asyncio.sleep(0)  # the create is on its way
    take.cancel()
    with pytest.raises(asyncio.CancelledError):
        await take
    assert (await replica.durable._locks.get("snapshot")).value == b"holder"


async def test_a_release_tells_the_loop_nothing(stopped, loop_errors):
    replica = await stopped()
    await replica.durable._release_lock(await replica.durable._take_lock())
    await asyncio.sleep(0)  # the release's done callbacks run
    gc.collect()
    assert loop_errors == []


async def test_a_release_cancelled_whose_delete_then_fails_leaves_no_unretrieved_error(stopped, loop_errors):
    """A stop while the lock is released: the release goes on, and its failure is nobody's to hear."""
    replica = await stopped()
    locks = replica.durable._locks
    go = asyncio.Event()

    async def delete_that_fails(*args, **kwargs):
        await go.wait()
        raise ConnectionError("the server went away")

    revision = await replica.durable._take_lock()
    locks.delete = delete_that_fails
    release = asyncio.ensure_future(replica.durable._release_lock(revision))
    await asyncio.sleep(0)
    release.cancel()
    with pytest.raises(asyncio.CancelledError):
        await release
    go.set()
    for _ in range(3):
        await asyncio.sleep(0)  # the delete fails and its callbacks run
    gc.collect()
    assert loop_errors == []


async def test_a_replica_stops_cleanly_after_its_connection_closed(nats_server):
    replica = await Replica(nats_server, "r1").start()
    await replica.link.close()
    await replica.durable.stop()  # nothing raised
    assert replica.durable._psub is None and replica.durable._task is None


async def test_a_replica_never_started_stops_without_complaint(nats_server):
    link = await connect(nats_server, "r1")
    router = make_router()
    try:
        durable = DurableKvEvents(link.nc, make_feed(router), router, DurableConfig(NS, COMPONENT, "r1"))
        await durable.stop()
        await durable.stop()
    finally:
        await link.close()
