"""Durable mode: JetStream stream + durable consumers + object-store snapshots, on a real nats-server."""

import asyncio
import gc
import itertools
import logging
import random

import pytest

from extproc.events import durable as durable_module
from extproc.events.durable import SNAPSHOT_OBJECT, DurableConfig, DurableKvEvents
from extproc.events.dynamo_json import kv_events_subject
from extproc.events.nats_events import NatsEventPublisher
from extproc.events.object_read import ObjectStalled
from extproc.events.snapshot import Snapshot, encode_snapshot
from extproc.router import compute_block_hashes
from extproc.router.hashing import compute_sequence_hashes
from extproc.router.types import BlocksStored, StoredBlock, Worker

from .conftest import (
    BLOCK_SIZE,
    connect,
    eventually,
    make_feed,
    make_router,
    matches,
    on_first_chunk,
    prime_events,
)

NS, COMPONENT = "test", "backend"
SUBJECT = kv_events_subject(NS, COMPONENT)
CONFIG = DurableConfig(NS, COMPONENT, "names-only")  # stream and bucket names for the checks
BASE = list(range(1000, 1008))  # a 2-block system prompt every prompt starts with


class Replica:
    """A router replica in durable mode: its own connection, router and consumer."""

    def __init__(self, server, replica_id: str, **config) -> None:
        self.server = server
        self.config = DurableConfig(NS, COMPONENT, replica_id, **config)
        self.router = make_router()

    async def start(self, *, reset_states: bool = False) -> "Replica":
        self.link = await connect(self.server, self.config.replica_id)
        self.durable = DurableKvEvents(self.link.nc, make_feed(self.router), self.router, self.config)
        await self.durable.start(reset_states=reset_states)
        return self

    async def stop(self) -> None:
        await self.durable.stop()
        await self.link.close()

    def answers(self, queries: list[list[int]]) -> list[dict]:
        return [matches(self.router, q) for q in queries]


class Workers:
    """Two engines publishing Dynamo events; prompts share BASE, each stored chain from the root."""

    def __init__(self, link) -> None:
        self.publishers = [NatsEventPublisher(link.nc, SUBJECT, w) for w in (7, 8)]
        self.link = link
        self.queries: list[list[int]] = []
        self.rounds = 0
        self.base = 0  # stream messages before the first event: the probes

    async def prime(self, config: DurableConfig) -> None:
        """Until the stream captures what the workers publish (see `prime` in conftest)."""
        await prime_events(self.link.nc, SUBJECT, lambda: _last_seq_at_least(self.link, config, 1))
        self.base = (await stream_state(self.link, config)).last_seq

    def publish_round(self, prompts: int = 6) -> None:
        r = self.rounds
        self.rounds += 1
        for i in range(prompts):
            tokens = [*BASE, *range(10_000 * r + 100 * i, 10_000 * r + 100 * i + 4 * (1 + i % 3))]
            local = compute_block_hashes(tokens, BLOCK_SIZE)
            engine = compute_sequence_hashes(local)
            blocks = [tokens[k : k + BLOCK_SIZE] for k in range(0, len(local) * BLOCK_SIZE, BLOCK_SIZE)]
            pub = self.publishers[i % 2]
            pub.on_stored(None, engine, blocks)
            if i % 3 == 2:
                pub.on_removed([engine[-1]])  # evicts the tail: the overlap drops by one
            self.queries.append(local)

    @property
    def published(self) -> int:
        return sum(p.next_event_id for p in self.publishers)

    async def flush(self) -> None:
        for p in self.publishers:
            await p.flush()

    async def stop(self) -> None:
        for p in self.publishers:
            await p.stop()


async def stream_state(link, config: DurableConfig):
    return (await link.nc.jetstream().stream_info(config.stream)).state


async def published_and_stored(workers: Workers, link, config: DurableConfig) -> int:
    """Flush the publishers and wait until the stream holds every event; returns the last seq."""
    await workers.flush()
    last = workers.base + workers.published
    await eventually(lambda: _last_seq_is(link, config, last), what=f"{last} messages in the stream")
    return last


async def _last_seq_is(link, config, seq: int) -> bool:
    return (await stream_state(link, config)).last_seq == seq


async def _last_seq_at_least(link, config, seq: int) -> bool:
    return (await stream_state(link, config)).last_seq >= seq


@pytest.fixture
async def worker_link(nats_server):
    link = await connect(nats_server, "workers")
    yield link
    await link.close()


async def test_a_restarted_replica_answers_the_same_overlaps(nats_server, worker_link):
    replica = await Replica(nats_server, "r1", snapshot_threshold=1000).start()
    workers = Workers(worker_link)
    try:
        await workers.prime(CONFIG)
        workers.publish_round()
        workers.publish_round()
        last = await published_and_stored(workers, worker_link, replica.config)
        await eventually(lambda: replica.durable.applied_seq == last, what="all events applied")
        before = replica.answers(workers.queries)
        assert all(before) and len({len(a) for a in before}) == 1
        assert {n for a in before for n in a.values()} == {2, 3, 4}  # tails evicted, BASE shared
        await replica.stop()

        restarted = await Replica(nats_server, "r1", snapshot_threshold=1000).start()
        try:
            await eventually(lambda: restarted.durable.applied_seq == last, what="replayed after restart")
            assert restarted.answers(workers.queries) == before
            assert restarted.durable.counters["durable.snapshot"] == 0
            assert (await stream_state(worker_link, replica.config)).messages == last  # nothing purged
        finally:
            await restarted.stop()
    finally:
        await workers.stop()


async def test_past_the_threshold_a_snapshot_is_written_and_the_stream_purged(nats_server, worker_link):
    replica = await Replica(nats_server, "r1", snapshot_threshold=5, snapshot_read_timeout_s=1.0).start()
    workers = Workers(worker_link)
    try:
        await workers.prime(CONFIG)
        workers.publish_round(prompts=12)  # 16 events
        last = await published_and_stored(workers, worker_link, replica.config)
        await eventually(lambda: replica.durable.applied_seq == last, what="all events applied")
        found = {}

        async def purged_up_to_the_snapshot() -> bool:
            found["snapshot"] = await replica.durable.load_snapshot()
            if found["snapshot"] is None:
                return False
            found["state"] = await stream_state(worker_link, replica.config)  # read after the snapshot
            seq = found["snapshot"].stream_seq
            return found["state"].first_seq == seq + 1 and last - seq <= 5  # the final snapshot

        await eventually(purged_up_to_the_snapshot, what=lambda: f"purged up to the snapshot: {found}")
        snapshot, state = found["snapshot"], found["state"]
        assert replica.durable.counters["durable.snapshot"] >= 1
        assert 5 < snapshot.stream_seq <= last and snapshot.created_by == "r1"
        assert state.messages == last - snapshot.stream_seq <= 5
        assert snapshot.events  # the tree, as dump_events gave it
    finally:
        await workers.stop()
        await replica.stop()


async def r2_falls_behind_a_purge(r1: Replica, r2: Replica, workers: Workers, link) -> None:
    """Both apply a round; then r2 stops consuming (its consumer stays on the server) while r1
    applies a second round, snapshots and purges the stream past where r2 stopped."""
    await workers.prime(CONFIG)
    workers.publish_round()
    last = await published_and_stored(workers, link, r1.config)
    await eventually(lambda: r1.durable.applied_seq == r2.durable.applied_seq == last, what="both applied")
    await r2.durable.stop()
    stalled_at = r2.durable.applied_seq
    workers.publish_round(prompts=12)
    last = await published_and_stored(workers, link, r1.config)
    await eventually(lambda: r1.durable.applied_seq == last, what="r1 applied round 2")
    await eventually(lambda: _first_seq_above(link, r1.config, stalled_at + 1), what="purged past r2")


async def test_a_new_replica_recovers_everything_from_snapshot_and_stream(nats_server, worker_link):
    r1 = await Replica(nats_server, "r1", snapshot_threshold=8).start()
    r2 = await Replica(nats_server, "r2", snapshot_threshold=8).start()
    workers = Workers(worker_link)
    try:
        await r2_falls_behind_a_purge(r1, r2, workers, worker_link)
        await r2.durable.resume()
        workers.publish_round(prompts=3)
        last = await published_and_stored(workers, worker_link, r1.config)
        await eventually(  # r2 reloads the snapshot first: allow a loaded machine its time
            lambda: r1.durable.applied_seq == r2.durable.applied_seq == last,
            timeout_s=15,
            what="both caught up",
        )
        assert r2.durable.counters["durable.reload"] >= 1
        before = r1.answers(workers.queries)
        assert r2.answers(workers.queries) == before
        assert all(before)
    finally:
        await r1.stop()
        await r2.stop()

    r3 = await Replica(nats_server, "r3", snapshot_threshold=8).start()
    try:
        await eventually(lambda: r3.durable.applied_seq == last, what="r3 applied snapshot and stream")
        assert r3.durable.counters["durable.snapshot_loaded"] == 1
        assert r3.answers(workers.queries) == before
    finally:
        await r3.stop()
        await workers.stop()


async def test_a_replica_stopped_while_taking_the_snapshot_lock_leaves_it_free(nats_server, worker_link):
    """The server may grant the lock just as `stop` cancels the replica: the replica releases it
    anyway, or every other replica would wait out its TTL (30 s) before its next snapshot."""
    r1 = await Replica(nats_server, "r1", snapshot_threshold=1000).start()
    r2 = await Replica(nats_server, "r2", snapshot_threshold=1000).start()
    workers = Workers(worker_link)
    try:
        await workers.prime(CONFIG)
        workers.publish_round()
        last = await published_and_stored(workers, worker_link, r1.config)
        await eventually(lambda: r1.durable.applied_seq == r2.durable.applied_seq == last, what="applied")
        granted, reply_seen = asyncio.Event(), asyncio.Event()
        create = r1.durable._locks.create

        async def granted_before_the_reply_is_seen(*args, **kwargs):
            revision = await create(*args, **kwargs)  # the real server grants the lock
            granted.set()
            await reply_seen.wait()  # the cancel comes before r1 has read the reply
            return revision

        r1.durable._locks.create = granted_before_the_reply_is_seen
        taking = asyncio.create_task(r1.durable.snapshot_now())
        await asyncio.wait_for(granted.wait(), 5.0)
        taking.cancel()
        reply_seen.set()
        with pytest.raises(asyncio.CancelledError):
            await taking
        assert await r2.durable.snapshot_now()  # the lock is free at once
        assert r1.durable.counters["durable.snapshot"] == 0
        assert r2.durable.counters["durable.snapshot"] == 1
    finally:
        await r1.stop()
        await r2.stop()
        await workers.stop()


async def _first_seq_above(link, config, seq: int) -> bool:
    return (await stream_state(link, config)).first_seq > seq


async def test_reset_states_purges_everything_and_a_new_replica_starts_empty(nats_server, worker_link):
    r1 = await Replica(nats_server, "r1", snapshot_threshold=5).start()
    workers = Workers(worker_link)
    try:
        await workers.prime(CONFIG)
        workers.publish_round(prompts=9)
        last = await published_and_stored(workers, worker_link, r1.config)
        await eventually(lambda: r1.durable.applied_seq == last, what="applied")
        await eventually(lambda: r1.durable.counters["durable.snapshot"] >= 1, what="a snapshot")
        assert any(r1.answers(workers.queries))
        await r1.stop()

        fresh = await Replica(nats_server, "r9", snapshot_threshold=5).start(reset_states=True)
        try:
            assert not any(fresh.answers(workers.queries))
            assert (await stream_state(worker_link, fresh.config)).messages == 0
            emptied = await fresh.durable.load_snapshot()
            assert emptied is not None and emptied.events == () and emptied.stream_seq == last
            assert fresh.durable.counters["durable.snapshot_missing"] == 0  # a reset is not a loss
            js = worker_link.nc.jetstream()
            assert [c.name for c in await js.consumers_info(fresh.config.stream)] == ["router-r9"]
            # and it goes on with what comes next
            tokens = list(range(4))
            workers.publishers[0].on_stored(None, [77], [tokens])
            await eventually(lambda: matches(fresh.router, compute_block_hashes(tokens, 4)), what="new event")
        finally:
            await fresh.stop()
    finally:
        await workers.stop()


async def test_a_replica_that_finds_purged_history_and_no_snapshot_says_so(nats_server, worker_link, caplog):
    r1 = await Replica(nats_server, "r1", snapshot_threshold=5).start()
    workers = Workers(worker_link)
    try:
        await workers.prime(CONFIG)
        workers.publish_round(prompts=9)
        last = await published_and_stored(workers, worker_link, r1.config)
        await eventually(lambda: r1.durable.applied_seq == last, what="applied")
        await eventually(lambda: _first_seq_above(worker_link, r1.config, 1), what="a snapshot and a purge")
    finally:
        await r1.stop()
    objects = await worker_link.nc.jetstream().object_store(CONFIG.snapshot_bucket)
    await objects.delete("radix-tree")  # an operator's mistake, or a bucket lost with its volume

    r2 = await Replica(nats_server, "r2", snapshot_threshold=5).start()
    try:
        assert r2.durable.counters["durable.snapshot_missing"] == 1
        assert "no KV snapshot" in caplog.text and "are unknown to this replica" in caplog.text
    finally:
        await r2.stop()
        await workers.stop()


def _large_snapshot(stream_seq: int) -> bytes:
    """A snapshot of about 4.5 MB: more than the server sends ahead of a reader that stops."""
    rng = random.Random(stream_seq)
    blocks = tuple(StoredBlock(rng.getrandbits(64), rng.getrandbits(64)) for _ in range(250_000))
    return encode_snapshot(Snapshot((BlocksStored(Worker("7", 0), blocks),), stream_seq, "writer"))


async def test_a_snapshot_replaced_while_it_is_read_is_read_again_at_once(nats_server, monkeypatch):
    """Another replica writes a newer snapshot while this one reads: the read stops when the chunks
    it reads are purged and starts over, long before `snapshot_read_timeout_s` (60 s here)."""
    replica = await Replica(nats_server, "r1", snapshot_threshold=1000, snapshot_read_timeout_s=60).start()
    try:
        await replica.durable._objects.put(SNAPSHOT_OBJECT, _large_snapshot(stream_seq=5))
        newer = _large_snapshot(stream_seq=9)

        async def write_newer(js) -> None:
            await (await js.object_store(replica.config.snapshot_bucket)).put(SNAPSHOT_OBJECT, newer)

        reads: list[int] = []
        real_read = durable_module.read_object

        async def first_read_overtaken(*args, **kwargs):
            reads.append(1)
            if len(reads) == 1:
                kwargs["on_chunk"] = on_first_chunk(nats_server, write_newer)
            return await real_read(*args, **kwargs)

        monkeypatch.setattr(durable_module, "read_object", first_read_overtaken)
        async with asyncio.timeout(30):  # half the limit: it did not wait for it
            snapshot = await replica.durable.load_snapshot()
        assert snapshot is not None and snapshot.stream_seq == 9
        assert len(reads) == 2 and replica.durable.counters["durable.snapshot_read_retry"] == 1
    finally:
        await replica.stop()


async def test_a_fetch_that_times_out_with_asyncios_own_error_is_an_empty_fetch(nats_server, worker_link):
    """nats.py 2.16's `fetch` raises asyncio's TimeoutError, not its own, when a busy server answers
    its no-wait probe late: no message came, which is no error (and no reason to back off)."""
    replica = await Replica(nats_server, "r1", snapshot_threshold=1000).start()
    workers = Workers(worker_link)
    try:
        psub = replica.durable._psub
        real_fetch, timeouts = psub.fetch, [3]

        async def fetch(*args, **kwargs):
            if timeouts[0]:
                timeouts[0] -= 1
                raise TimeoutError
            return await real_fetch(*args, **kwargs)

        psub.fetch = fetch
        await workers.prime(CONFIG)
        workers.publish_round()
        last = await published_and_stored(workers, worker_link, replica.config)
        await eventually(lambda: replica.durable.applied_seq == last, what="all events applied")
        assert timeouts == [0]
        assert replica.durable.counters["durable.error"] == 0
    finally:
        await workers.stop()
        await replica.stop()


async def test_a_reload_that_fails_is_tried_again_at_once_not_after_the_ack_wait(
    nats_server, worker_link, monkeypatch
):
    """The batch whose gap asked for the reload was delivered and not acknowledged: the consumer
    starts over where the replica stands instead of waiting for the server to send it again (the
    ack wait, 30 s)."""
    r1 = await Replica(nats_server, "r1", snapshot_threshold=8).start()
    r2 = await Replica(nats_server, "r2", snapshot_threshold=8, snapshot_read_attempts=1).start()
    workers = Workers(worker_link)
    try:
        await r2_falls_behind_a_purge(r1, r2, workers, worker_link)
        reads: list[int] = []
        real_read = durable_module.read_object

        async def first_read_fails(*args, **kwargs):
            reads.append(1)
            if len(reads) == 1:
                raise ObjectStalled("no chunk (a test's stand-in for a read that failed)")
            return await real_read(*args, **kwargs)

        monkeypatch.setattr(durable_module, "read_object", first_read_fails)
        await r2.durable.resume()
        workers.publish_round(prompts=3)
        last = await published_and_stored(workers, worker_link, r1.config)
        await eventually(
            lambda: r1.durable.applied_seq == r2.durable.applied_seq == last,
            timeout_s=15,  # half the ack wait
            what=lambda: f"both caught up: r1 {r1.durable.applied_seq}, r2 {r2.durable.applied_seq}, {last}",
        )
        counters = r2.durable.counters
        assert len(reads) >= 2 and counters["durable.error"] == 1 and counters["durable.resubscribe"] == 1
        assert counters["durable.reload"] == 1
        assert r2.answers(workers.queries) == r1.answers(workers.queries)
    finally:
        await workers.stop()
        await r1.stop()
        await r2.stop()


async def test_a_large_snapshot_is_applied_in_slices_that_let_the_event_loop_turn(nats_server):
    """Routing shares the replica's event loop: a snapshot of 2^22 entries took seconds to apply in
    one go. Here 64 runs of 1,024 blocks (four slices' worth) go in several calls to the feed, and
    another task gets turns between them."""
    events = _runs(64, seed=3)
    await _write_snapshot(nats_server, events, stream_seq=0)
    reader = Replica(nats_server, "r", snapshot_threshold=1000)
    calls: list[tuple[int, int]] = []  # (events in the call, the other task's turns so far)
    feed = make_feed(reader.router)
    real_apply = feed.apply_events

    def apply_events(batch) -> None:
        batch = list(batch)
        calls.append((len(batch), turns[0]))
        real_apply(batch)

    feed.apply_events = apply_events
    turns, ticker = _count_turns()
    try:
        reader.link = await connect(nats_server, "r")
        reader.durable = DurableKvEvents(reader.link.nc, feed, reader.router, reader.config)
        await reader.durable.start()
        assert sum(n for n, _ in calls) == 64 and len(calls) >= 4
        assert all(before < after <= before + 3 for (_, before), (_, after) in itertools.pairwise(calls))
        assert _whole_runs(reader.router.dump_events()) == _whole_runs(events)
    finally:
        ticker.cancel()
        await reader.stop()


async def test_a_large_tree_is_snapshotted_in_slices_that_let_the_event_loop_turn(nats_server):
    """The replica that snapshots routes on the same loop: dumping 2^22 entries in one go held it
    about a second. Here 64 runs of 1,024 blocks are dumped in slices, another task gets turns
    between them, and the snapshot written holds every run whole."""
    replica, events = await _replica_holding_runs(nats_server, runs=64)
    slices: list[int] = []  # the other task's turns when each slice came
    real_dump = replica.router.dump_slices

    def dump_slices(blocks_per_slice):
        for part in real_dump(blocks_per_slice):
            slices.append(turns[0])
            yield part

    replica.router.dump_slices = dump_slices
    turns, ticker = _count_turns()
    try:
        assert await replica.durable.snapshot_now()
        assert len(slices) >= 4 and slices[-1] - slices[0] >= len(slices) - 1
        assert slices[-1] - slices[0] <= 3 * (len(slices) - 1)  # a turn between slices, not a wait
        assert replica.durable.counters["durable.snapshot_dumped_whole"] == 0
        written = await replica.durable.load_snapshot()
        assert written is not None and written.stream_seq == 1
        assert _whole_runs(written.events) == _whole_runs(events)
    finally:
        ticker.cancel()
        await replica.stop()


async def test_a_tree_written_to_during_its_dump_in_slices_is_dumped_again_in_one_go(nats_server, caplog):
    """Routing may write the tree between two slices (predictions for a worker whose events are not
    flowing; a worker leaving): slices of two trees must not make one snapshot."""
    replica, events = await _replica_holding_runs(nats_server, runs=64)
    dumping = asyncio.Event()
    real_dump = replica.router.dump_slices

    def dump_slices(blocks_per_slice):
        dumping.set()
        yield from real_dump(blocks_per_slice)

    late = BlocksStored(Worker("9", 0), (StoredBlock(5, 6), StoredBlock(7, 8)))

    async def write_during_the_dump() -> None:
        await dumping.wait()
        replica.router.apply_event(late)

    replica.router.dump_slices = dump_slices
    writer = asyncio.ensure_future(write_during_the_dump())
    try:
        with caplog.at_level(logging.INFO, "extproc.events.durable"):
            assert await replica.durable.snapshot_now()
        assert writer.done() and replica.durable.counters["durable.snapshot_dumped_whole"] == 1
        said = [r.getMessage() for r in caplog.records if "dumping it again" in r.getMessage()]
        assert said == [
            "KV snapshot: the tree was written to 1 times during its dump; dumping it again in one go"
        ]
        written = await replica.durable.load_snapshot()
        assert written is not None
        assert _whole_runs(written.events) == _whole_runs((*events, late))  # the tree after the write
    finally:
        writer.cancel()
        await replica.stop()


def _runs(count: int, seed: int) -> tuple[BlocksStored, ...]:
    """`count` runs of 1,024 blocks with random ids, alternately on workers 7 and 8."""
    rng = random.Random(seed)
    return tuple(
        BlocksStored(
            Worker(("7", "8")[i % 2], 0),
            tuple(StoredBlock(rng.getrandbits(63), rng.getrandbits(64)) for _ in range(1024)),
        )
        for i in range(count)
    )


def _whole_runs(events) -> set:
    """The (worker, blocks) of each stored event: a run that comes back whole compares equal."""
    return {(e.worker, tuple(e.blocks)) for e in events}


async def _write_snapshot(nats_server, events: tuple[BlocksStored, ...], stream_seq: int) -> None:
    """Put a snapshot of `events` in the object store, as another replica would have written it."""
    writer = await Replica(nats_server, "writer", snapshot_threshold=1000).start()
    try:
        data = encode_snapshot(Snapshot(events, stream_seq, "test"))
        await writer.durable._objects.put(SNAPSHOT_OBJECT, data)
    finally:
        await writer.stop()


def _count_turns() -> tuple[list[int], asyncio.Future]:
    """Another task on the loop, counting its turns in [0] (routing's stand-in): cancel the future."""
    turns = [0]

    async def other_task() -> None:
        while True:
            turns[0] += 1
            await asyncio.sleep(0)  # a turn given back at once: this counts turns, it waits for nothing

    return turns, asyncio.ensure_future(other_task())


async def _replica_holding_runs(nats_server, runs: int) -> tuple[Replica, tuple[BlocksStored, ...]]:
    """A replica started from a snapshot (at stream seq 1) of `runs` runs of 1,024 blocks."""
    events = _runs(runs, seed=runs)
    await _write_snapshot(nats_server, events, stream_seq=1)
    return await Replica(nats_server, "r", snapshot_threshold=1000).start(), events


async def test_a_replica_starting_from_a_snapshot_freezes_what_it_loaded(nats_server):
    """Loading goes under `runtime.heap.bulk_load`: no full garbage collection meanwhile, and the
    tree it built is frozen afterwards, so that later full collections do not examine it."""
    before = gc.get_freeze_count()
    thresholds = gc.get_threshold()
    try:
        replica, _ = await _replica_holding_runs(nats_server, runs=64)
        await replica.stop()
        assert gc.get_freeze_count() >= before + 64  # at least the tree's runs
        assert gc.get_threshold() == thresholds
    finally:
        gc.unfreeze()


async def test_a_replica_whose_unread_messages_were_all_purged_reloads_without_waiting_for_a_new_one(
    nats_server, worker_link
):
    """r1 snapshots and purges every message r2 has not read, and no event comes after: r2 sees no
    hole in the sequence, as no message follows it. It asks the stream while idle and reloads."""
    r1 = await Replica(nats_server, "r1", snapshot_threshold=8).start()
    r2 = await Replica(nats_server, "r2", snapshot_threshold=8).start()
    workers = Workers(worker_link)
    try:
        await r2_falls_behind_a_purge(r1, r2, workers, worker_link)
        last = r1.durable.applied_seq

        async def purged_to_the_end() -> bool:
            await r1.durable.snapshot_now()  # r1 is idle: between batches, as its consumer would call it
            return await _first_seq_above(worker_link, r1.config, last)

        await eventually(purged_to_the_end, what="r1 snapshotted and purged the whole stream")
        await r2.durable.resume()
        await eventually(lambda: r2.durable.applied_seq == last, timeout_s=10, what="r2 reloaded")
        assert r2.durable.counters["durable.purged_while_idle"] == 1
        assert r2.durable.counters["durable.reload"] == 1
        assert r2.answers(workers.queries) == r1.answers(workers.queries)
    finally:
        await workers.stop()
        await r1.stop()
        await r2.stop()


async def test_an_idle_replica_whose_unread_messages_aged_out_counts_them_lost_once(
    nats_server, worker_link, monkeypatch
):
    """Messages gone with no snapshot covering them (aged out, or a purge by hand): the idle replica
    counts them lost once and goes on from there, not reading the snapshot again at every check."""
    monkeypatch.setattr(durable_module, "PURGE_CHECK_EVERY_S", 0.02)  # and a check per empty fetch:
    replica = await Replica(nats_server, "r1", snapshot_threshold=1000, fetch_timeout_s=0.05).start()
    workers = Workers(worker_link)
    checks, loads = [0], [0]
    real_check, real_load = replica.durable._reload_if_purged, replica.durable.load_snapshot

    async def counted_check() -> None:
        checks[0] += 1
        await real_check()

    async def counted_load():
        loads[0] += 1
        return await real_load()

    replica.durable._reload_if_purged = counted_check
    replica.durable.load_snapshot = counted_load
    try:
        await workers.prime(CONFIG)
        workers.publish_round()
        last = await published_and_stored(workers, worker_link, replica.config)
        await eventually(lambda: replica.durable.applied_seq == last, what="round 1 applied")
        await replica.durable.stop()
        workers.publish_round()
        missed = await published_and_stored(workers, worker_link, replica.config)
        await worker_link.nc.jetstream().purge_stream(replica.config.stream)  # as max_age would
        await replica.durable.resume()
        await eventually(lambda: replica.durable.applied_seq == missed, what="the missed messages passed")
        assert replica.durable.counters["durable.lost"] == 1 and loads[0] == 1
        seen = checks[0]
        await eventually(lambda: checks[0] >= seen + 5, what="five more checks")
        assert loads[0] == 1  # nothing new was gone
        workers.publish_round()
        last = await published_and_stored(workers, worker_link, replica.config)
        await eventually(lambda: replica.durable.applied_seq == last, what="round 3 applied")
        assert replica.durable.counters["durable.lost"] == 1
    finally:
        await workers.stop()
        await replica.stop()
