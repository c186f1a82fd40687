"""Durable KV events (Dynamo's `--router-durable-kv-events`): JetStream log plus object-store snapshots.

What lives where, on the NATS server:

- stream `kv-events-<ns>-<component>` captures the `kv_events` subject (Dynamo JSON, published
  with NATS core by the workers) and the endpoint's event-plane subject (`...endpoint.<e>.kv-events`,
  the msgpack envelopes of Dynamo's own `KvEventPublisher`; Dynamo 1.0-1.3 workers with a local
  indexer: the component's, `...component.<c>.kv-events`), file storage, `max_age` one hour. It
  also sources the stream Dynamo 1.0-1.3 workers publish into themselves (`namespace-<ns>-component-
  <component>-kv-events`, Dynamo JSON: `dynamo_json.jetstream_stream`), whether it exists yet or
  not: the server copies each of its messages here as it comes, under its own subject;
- one durable pull consumer per router replica, named `router-<replica id>` (replica ids must be
  unique), acking in stream order; unused consumers disappear after `max_age`;
- object store bucket `kv-snapshots-<ns>-<component>`, object `radix-tree`: the router's tree as
  its `dump_events()` in the `extproc.events.snapshot` codec, with the last stream sequence it
  reflects (dumped and encoded in slices, one per loop turn, so that routing goes on meanwhile);
- KV bucket `kv-locks-<ns>-<component>`, key `snapshot`: a create-only lock with a TTL.

A replica starts by loading the snapshot (if any) and (re)creating its consumer at the snapshot's
sequence + 1: its in-memory tree is new, so an old consumer position would be meaningless. It then
applies events in order. When the stream holds more than `snapshot_threshold` messages (or
`snapshot_interval_s` passed, so that nothing ages out of the stream before a snapshot covers it),
the replica that takes the lock writes a snapshot at its last applied sequence and purges the
stream up to it, unless its view of some worker is known to miss blocks (`RouterFeed.lossy`): a
good snapshot is never replaced by a poorer one. Invariant: every purged message is covered by the
current snapshot. A replica whose next message was purged meanwhile sees a hole in the stream
sequence and reloads the snapshot. In a quiet stream no message may come to show the hole, so an
idle replica asks the stream every `PURGE_CHECK_EVERY_S` whether its next messages are gone. A
hole no snapshot covers (the stream aged out, or was reset) is counted as lost, and the per-worker
event-id check follows the gap (`dynamo_intake.follow_gap`).

`reset_states()` (Dynamo's `--router-reset-states`) purges the stream, empties the snapshot and
deletes every consumer: replicas started afterwards begin empty. A replica that starts without a
snapshot although the stream's history was purged says so (`durable.snapshot_missing`): the blocks
of the purged events are unknown to it. Counter keys: `durable.*`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from extproc.events.counters import EventCounters
from extproc.events.dynamo_intake import EventIdTracker, GapHook, follow_gap
from extproc.events.dynamo_json import decode_event, jetstream_stream, kv_events_subject
from extproc.events.dynamo_plane import (
    DEFAULT_ENDPOINT,
    PlaneEvent,
    component_plane_subject,
    decode_envelope,
    event_plane_subject,
)
from extproc.events.object_read import ObjectReadError, read_object
from extproc.events.sink import EventSink
from extproc.events.snapshot import Snapshot, SnapshotError, SnapshotWriter, decode_snapshot, encode_snapshot
from extproc.router.radix_dump import TreeChanged
from extproc.router.types import BlocksStored, KvEvent, Worker, WorkerId
from extproc.runtime.heap import bulk_load
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.events.durable")

SNAPSHOT_OBJECT = "radix-tree"
LOCK_KEY = "snapshot"
RETRY_MAX_S = 5.0  # longest pause between attempts after a JetStream error
PROGRESS_EVERY_S = 5.0  # a snapshot read that takes longer logs its progress this often
PURGE_CHECK_EVERY_S = 2.0  # while no message comes, how often to ask whether ours were purged
SNAPSHOT_SLICE_BLOCKS = 4_096  # blocks of a snapshot applied or dumped per loop turn (5-25 ms at 2^22)


class TreeSource(Protocol):
    """What a snapshot is taken from: `KvRouter` satisfies it (its `dump_slices` raises
    `TreeChanged` when the tree was written to between two slices)."""

    def dump_slices(self, blocks_per_slice: int) -> Iterator[list[KvEvent]]: ...


@dataclass(frozen=True, slots=True)
class DurableConfig:
    """Names and limits of durable mode; names derive from the Dynamo namespace and component."""

    namespace: str
    component: str
    replica_id: str
    endpoint: str | None = DEFAULT_ENDPOINT  # Dynamo's event plane endpoint (`*`: all); None: JSON only
    snapshot_threshold: int = 10_000  # stream messages above which a snapshot is taken
    snapshot_interval_s: float | None = None  # also snapshot this often (None: half of max_age_s)
    max_age_s: float = 3600.0
    lock_ttl_s: float = 30.0
    fetch_batch: int = 256
    fetch_timeout_s: float = 1.0
    snapshot_read_timeout_s: float = 30.0  # longest wait for the next chunk of a snapshot being read
    snapshot_read_attempts: int = 3

    def __post_init__(self) -> None:
        if self.snapshot_threshold < 1:
            raise ValueError(f"snapshot_threshold must be at least 1, got {self.snapshot_threshold}")
        if not self.replica_id:
            raise ValueError("replica_id must not be empty (it names this replica's durable consumer)")

    @property
    def subject(self) -> str:
        return kv_events_subject(self.namespace, self.component)

    @property
    def plane_subject(self) -> str | None:
        if self.endpoint is None:
            return None
        return event_plane_subject(self.namespace, self.component, self.endpoint)

    @property
    def subjects(self) -> list[str]:
        """The JSON subject, and with an endpoint the event plane's and Dynamo 1.0-1.3's component one."""
        if self.plane_subject is None:
            return [self.subject]
        return [self.subject, self.plane_subject, component_plane_subject(self.namespace, self.component)]

    @property
    def stream(self) -> str:
        return _name(f"kv-events-{self.namespace}-{self.component}")

    @property
    def dynamo_stream(self) -> str:
        """The stream Dynamo 1.0-1.3 workers create and publish into (sourced into `stream`)."""
        return jetstream_stream(self.namespace, self.component)

    @property
    def consumer(self) -> str:
        return _name(f"router-{self.replica_id}")

    @property
    def snapshot_bucket(self) -> str:
        return _name(f"kv-snapshots-{self.namespace}-{self.component}")

    @property
    def lock_bucket(self) -> str:
        return _name(f"kv-locks-{self.namespace}-{self.component}")


def _ignore_result(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a failed release only means the TTL frees the lock


class _ReadProgress:
    """Logs a long snapshot read's progress, at most every `PROGRESS_EVERY_S`."""

    def __init__(self, started: float) -> None:
        self._next_log = started + PROGRESS_EVERY_S

    def __call__(self, read: int, size: int) -> None:
        now = time.monotonic()
        if now >= self._next_log and read < size:
            self._next_log = now + PROGRESS_EVERY_S
            log.info("reading the KV snapshot: %.1f of %.1f MB", read / 1e6, size / 1e6)


def _name(raw: str) -> str:
    """A JetStream stream/consumer/bucket name: letters, digits, '-' and '_' only."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", raw)


class DurableKvEvents:
    """One router replica's durable event consumer, snapshot writer and snapshot loader."""

    def __init__(
        self,
        nc: NatsClient,
        sink: EventSink,
        tree: TreeSource,
        config: DurableConfig,
        *,
        counters: EventCounters | None = None,
        on_gap: GapHook | None = None,
        worker_id_of: Callable[[int], WorkerId] = str,
        lossy: Callable[[], Sequence[Worker]] = tuple,
        retry_sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """`lossy()` names the workers whose view is known to miss blocks (`RouterFeed.lossy`): while
        there is any, no snapshot is written, so a good snapshot is never replaced by a poorer one.
        `retry_sleep` waits out the pause after a JetStream error (0.1 s, doubling up to `RETRY_MAX_S`)."""
        self.js = nc.jetstream()
        self.sink = sink
        self.tree = tree
        self.config = config
        self.counters = counters if counters is not None else EventCounters()
        self.on_gap: GapHook = on_gap or self._follow_gap
        self._worker_id_of = worker_id_of
        self._lossy = lossy
        self._retry_sleep = retry_sleep
        self.event_ids = EventIdTracker()
        self.applied_seq = 0  # last stream sequence applied (0: none yet)
        self._seq_known = False  # whether applied_seq + 1 is the next sequence to expect
        self._workers: set[Worker] = set()
        self._objects: ObjectStore | None = None
        self._locks: KeyValue | None = None
        self._psub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._last_check = (0.0, 0)  # (monotonic time, applied_seq) of the last snapshot check
        self._last_purge_check = 0.0
        self._last_snapshot_try = time.monotonic()

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, reset_states: bool = False) -> None:
        """Create stream and buckets if needed, load the snapshot, consume from its sequence + 1."""
        await self._prepare()
        if reset_states:
            await self.reset_states()
        with bulk_load():  # no full garbage collection stops routing meanwhile (runtime/heap.py)
            snapshot = await self.load_snapshot()
            if snapshot is not None:
                await self._apply_snapshot(snapshot, "starting from the snapshot")
        if snapshot is None:
            await self._warn_if_history_is_gone()
        await self._subscribe(self.applied_seq + 1 if self._seq_known else None)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop consuming; the durable consumer stays on the server (until `max_age_s` idle)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._psub is not None:
            with contextlib.suppress(Exception):
                await self._psub.unsubscribe()
            self._psub = None

    async def resume(self) -> None:
        """After `stop`: consume again from the durable consumer's position, keeping this state.

        Messages purged meanwhile (another replica snapshotted) make it reload the snapshot.
        """
        if self._task is not None:
            return
        cfg = self.config
        self._psub = await self.js.pull_subscribe_bind(durable=cfg.consumer, stream=cfg.stream)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def reset_states(self) -> None:
        """Purge the event stream, empty the snapshot and delete every replica's consumer.

        The snapshot is replaced by an empty one at the last purged sequence rather than deleted, so
        that "every purged message is covered by the snapshot" still holds: a replica that later
        finds purged history and no snapshot knows the snapshot was lost, not reset, and says so.
        """
        await self._prepare()
        cfg = self.config
        last_seq = (await self.js.stream_info(cfg.stream)).state.last_seq
        await self.js.purge_stream(cfg.stream)
        assert self._objects is not None
        empty = Snapshot((), last_seq, cfg.replica_id, time.time())
        await self._objects.put(SNAPSHOT_OBJECT, encode_snapshot(empty))
        for info in await self.js.consumers_info(cfg.stream):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await self.js.delete_consumer(cfg.stream, info.name)
        self.counters.add("durable.reset_states")
        log.info("durable KV events reset: stream %s purged, snapshot emptied, consumers deleted", cfg.stream)

    # --- snapshots -----------------------------------------------------------------------------

    async def load_snapshot(self) -> Snapshot | None:
        """The stored snapshot; None if there is none or it cannot be decoded (counted loudly).

        A read that finds the snapshot replaced under it (another replica wrote a newer one and
        purged the chunks being read), no chunk for `snapshot_read_timeout_s`, or a digest that does
        not match is retried, up to `snapshot_read_attempts` times, then TimeoutError. A large
        snapshot may take as long as it needs while its chunks keep coming (`object_read`).
        """
        assert self._objects is not None
        cfg = self.config
        for _ in range(cfg.snapshot_read_attempts):
            started = time.monotonic()
            progress = _ReadProgress(started)
            try:
                data = await read_object(
                    self.js,
                    self._objects,
                    cfg.snapshot_bucket,
                    SNAPSHOT_OBJECT,
                    chunk_timeout_s=cfg.snapshot_read_timeout_s,
                    on_chunk=progress,
                )
            except nats.js.errors.NotFoundError:
                return None
            except (ObjectReadError, TimeoutError) as exc:  # TimeoutError: a JetStream API call timed out
                self.counters.loud(
                    "durable.snapshot_read_retry", "reading the KV snapshot failed (%s); retrying", exc
                )
                continue
            try:
                snapshot = await asyncio.to_thread(decode_snapshot, data)
            except SnapshotError as exc:
                self.counters.loud("durable.bad_snapshot", "ignoring unreadable KV snapshot: %s", exc)
                return None
            log.info(
                "read the KV snapshot at stream seq %d: %d events, %d bytes in %.2f s",
                snapshot.stream_seq,
                len(snapshot.events),
                len(data),
                time.monotonic() - started,
            )
            return snapshot
        raise TimeoutError(f"could not read the KV snapshot in {cfg.snapshot_read_attempts} attempts")

    async def snapshot_now(self) -> bool:
        """Take the lock, write a snapshot at `applied_seq`, purge the stream up to it.

        Returns False (nothing written) when another replica holds the lock or has already purged
        past this replica's position, or when this replica's view of some worker is known to miss
        blocks (a snapshot of it would replace one that has them). Must run on the consumer's event
        loop between batches (it does from the consume loop), so that the tree and `applied_seq` agree.
        """
        assert self._locks is not None and self._objects is not None
        cfg = self.config
        self._last_snapshot_try = time.monotonic()
        lossy = self._lossy()
        if lossy:
            self.counters.loud(
                "durable.snapshot_withheld",
                "no KV snapshot written: the view of %s misses blocks its engine holds (a snapshot of "
                "it would replace a better one); waiting until it is whole again",
                ", ".join(map(str, lossy)),
            )
            return False
        revision = await self._take_lock()
        if revision is None:
            self.counters.add("durable.snapshot_lock_busy")
            return False
        try:
            seq = self.applied_seq
            state = (await self.js.stream_info(cfg.stream)).state
            if seq == 0 or state.first_seq > seq + 1:
                return False  # nothing applied, or a newer snapshot already covers what we have
            writer = await self._dump(seq)
            data = await asyncio.to_thread(writer.finish)
            await self._objects.put(SNAPSHOT_OBJECT, data)
            await self.js.purge_stream(cfg.stream, seq=seq + 1)  # removes every message <= seq
            self.counters.add("durable.snapshot")
            log.info(
                "KV snapshot at stream seq %d: %d events, %d bytes; stream purged",
                seq,
                writer.events,
                len(data),
            )
            return True
        finally:  # released even when cancelled (stop), or the others would wait out the TTL
            await self._release_lock(revision)

    async def _dump(self, seq: int) -> SnapshotWriter:
        """The tree dumped and encoded in slices of about `SNAPSHOT_SLICE_BLOCKS` blocks, one per loop
        turn: in one go, 2^22 entries held routing still for about a second. The consumer applies
        nothing meanwhile (this runs in its task). Anything else that writes the tree between two
        slices (the router predicting for a worker whose events are not flowing, a worker leaving)
        makes the slices disagree: then the tree is dumped again, in one go."""
        writer = SnapshotWriter(seq, self.config.replica_id, time.time())
        try:
            for events in self.tree.dump_slices(SNAPSHOT_SLICE_BLOCKS):
                writer.add(events)
                await asyncio.sleep(0)  # routing's turn
            return writer
        except TreeChanged as exc:
            self.counters.add("durable.snapshot_dumped_whole")
            log.info("KV snapshot: %s; dumping it again in one go", exc)
        whole = SnapshotWriter(seq, self.config.replica_id, time.time())
        for events in self.tree.dump_slices(sys.maxsize):  # one slice: nothing else runs until it ends
            whole.add(events)
        return whole

    async def _take_lock(self) -> int | None:
        """The snapshot lock's revision, or None when another replica holds it.

        A cancel (stop) while the create is in flight does not leave the lock taken: the server may
        already have granted it, so the create is awaited to its end and a granted lock released.
        nats.py's create, refused because the key exists, reads the key to tell a deleted one: when
        the holder's TTL runs out in between, it raises KeyNotFoundError. The lock is free then, so
        the create is tried once more.
        """
        assert self._locks is not None
        cfg = self.config
        for _ in range(2):
            create = asyncio.ensure_future(
                self._locks.create(LOCK_KEY, cfg.replica_id.encode(), msg_ttl=cfg.lock_ttl_s)
            )
            try:
                return await asyncio.shield(create)
            except nats.js.errors.KeyWrongLastSequenceError:
                return None
            except nats.js.errors.KeyNotFoundError:
                continue
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self._release_lock(await create)
                raise
        return None

    async def _release_lock(self, revision: int) -> None:
        assert self._locks is not None
        release = asyncio.ensure_future(self._locks.delete(LOCK_KEY, last=revision))
        release.add_done_callback(_ignore_result)
        with contextlib.suppress(Exception):
            await asyncio.shield(release)

    async def _warn_if_history_is_gone(self) -> None:
        """No snapshot: if the stream no longer starts at 1, the snapshot that covered its purged (or
        aged-out) messages was deleted or never written, and the blocks they stored are unknown."""
        state = (await self.js.stream_info(self.config.stream)).state
        if state.first_seq > 1:
            self.counters.loud(
                "durable.snapshot_missing",
                "no KV snapshot in bucket %s, but stream %s starts at seq %d: the blocks stored by "
                "events 1..%d are unknown to this replica (snapshot deleted, or the stream aged out "
                "before one was written); it learns them again as engines store blocks",
                self.config.snapshot_bucket, self.config.stream, state.first_seq, state.first_seq - 1,
            )  # fmt: skip

    # --- internals -----------------------------------------------------------------------------

    async def _prepare(self) -> None:
        if self._objects is not None and self._locks is not None:
            return
        cfg = self.config
        stream = api.StreamConfig(
            name=cfg.stream,
            subjects=cfg.subjects,
            sources=[api.StreamSource(name=cfg.dynamo_stream)],
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            max_age=cfg.max_age_s,
        )
        try:
            await self.js.add_stream(stream)
        except nats.js.errors.BadRequestError:  # exists with another config: bring it to ours
            await self.js.update_stream(stream)
        self._objects = await self.js.create_object_store(cfg.snapshot_bucket)
        self._locks = await self.js.create_key_value(bucket=cfg.lock_bucket)

    async def _subscribe(self, start_seq: int | None) -> None:
        """(Re)create this replica's durable consumer to deliver from `start_seq` (None: the first)."""
        cfg = self.config
        if self._psub is not None:
            with contextlib.suppress(Exception):
                await self._psub.unsubscribe()
            self._psub = None
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_consumer(cfg.stream, cfg.consumer)
        policy = api.DeliverPolicy.ALL if start_seq is None else api.DeliverPolicy.BY_START_SEQUENCE
        await self.js.add_consumer(
            cfg.stream,
            api.ConsumerConfig(
                durable_name=cfg.consumer,
                deliver_policy=policy,
                opt_start_seq=start_seq,
                ack_policy=api.AckPolicy.ALL,
                max_ack_pending=max(1000, 4 * cfg.fetch_batch),
                inactive_threshold=cfg.max_age_s,
            ),
        )
        self._psub = await self.js.pull_subscribe_bind(durable=cfg.consumer, stream=cfg.stream)

    async def _run(self) -> None:
        retry_s = 0.1
        # A batch left half handled (an error, say a snapshot reload that failed) was delivered and
        # not acknowledged: the server would send its rest again only after the ack wait (30 s), the
        # replica meanwhile applying nothing. So the consumer starts over where this replica stands.
        restart = False
        while True:
            try:
                if restart:
                    await self._subscribe(self.applied_seq + 1 if self._seq_known else None)
                    self.counters.add("durable.resubscribe")
                    restart = False
                try:
                    msgs = await self._psub.fetch(
                        self.config.fetch_batch, timeout=self.config.fetch_timeout_s
                    )
                except TimeoutError:  # nats.py 2.16 may raise asyncio's, not its own, when a
                    msgs = []  # busy server answers its no-wait probe late: no message either way
                restart = bool(msgs)
                for msg in msgs:
                    await self._handle(msg.metadata.sequence.stream, msg.data, msg.subject)
                if msgs:
                    await msgs[-1].ack()  # AckPolicy.ALL: acks the whole batch
                restart = False
                await self._maybe_snapshot()
                if not msgs:
                    await self._reload_if_purged()
                retry_s = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.counters.loud("durable.error", "durable KV event consumer error: %r; retrying", exc)
                await self._retry_sleep(retry_s)
                retry_s = min(RETRY_MAX_S, retry_s * 2)
                if not restart:
                    with contextlib.suppress(Exception):
                        await self._resubscribe_if_gone()

    async def _handle(self, seq: int, data: bytes, subject: str | None = None) -> None:
        if self._seq_known and seq <= self.applied_seq:
            self.counters.add("durable.redelivered")
            return
        if self._seq_known and seq > self.applied_seq + 1:
            await self._reload(seq)
            if seq <= self.applied_seq:
                return
            self._count_lost_before(seq)
        self.applied_seq, self._seq_known = seq, True
        for item in self._decode(data, subject):
            self._apply(item)

    def _decode(self, data: bytes, subject: str | None) -> list[PlaneEvent]:
        """The events of one stream message: a Dynamo JSON event, or an event-plane envelope."""
        cfg = self.config
        if subject is not None and subject != cfg.subject and not subject.startswith(f"{cfg.dynamo_stream}."):
            return decode_envelope(data, self.counters, worker_id_of=self._worker_id_of)
        decoded = decode_event(data, self.counters, worker_id_of=self._worker_id_of)
        if decoded is None:
            return []
        _, event_id, event = decoded
        return [PlaneEvent(event.worker, event_id, event)]

    def _apply(self, item: PlaneEvent) -> None:
        worker = item.worker
        if worker not in self._workers:
            self._workers.add(worker)
            self.sink.stream_state(worker, True, f"first durable event from stream {self.config.stream}")
        expected = self.event_ids.check(worker, item.event_id)
        if expected is not None:
            self.counters.loud(
                "durable.gap", "KV event gap from %s: expected event %d, got %d", worker, expected,
                item.event_id,
            )  # fmt: skip
            self.on_gap(worker, expected, item.event_id)
        if item.event is not None:
            self.sink.apply_events((item.event,))
            self.counters.add("durable.event")

    async def _reload_if_purged(self) -> None:
        """While no message comes: were the messages after ours purged (another replica snapshotted
        past them before this one read them)? A replica learns it from the hole in the sequence when
        the next message comes; in a quiet stream none may come for long, and its view would miss
        those messages' blocks meanwhile. So it asks the stream every `PURGE_CHECK_EVERY_S`."""
        now = time.monotonic()
        if not self._seq_known or now - self._last_purge_check < PURGE_CHECK_EVERY_S:
            return
        self._last_purge_check = now
        state = (await self.js.stream_info(self.config.stream)).state
        first = state.first_seq
        if state.last_seq <= self.applied_seq or first <= self.applied_seq + 1:
            return
        self.counters.add("durable.purged_while_idle")
        await self._reload(first)
        self._count_lost_before(first)
        self.applied_seq = max(self.applied_seq, first - 1)  # what is gone is not looked for again

    def _count_lost_before(self, seq: int) -> None:
        """After a reload: the messages between the snapshot and `seq` are gone, none covers them."""
        if seq > self.applied_seq + 1:
            self.counters.loud(
                "durable.lost", "KV event stream seqs %d..%d are gone and no snapshot covers them",
                self.applied_seq + 1, seq - 1,
            )  # fmt: skip

    async def _reload(self, seq: int) -> None:
        """Messages before `seq` were purged under us: replace our state by the snapshot's."""
        with bulk_load():  # as in `start`
            await self._reload_snapshot(seq)

    async def _reload_snapshot(self, seq: int) -> None:
        snapshot = await self.load_snapshot()
        if snapshot is None or snapshot.stream_seq <= self.applied_seq:
            return
        self.counters.add("durable.reload")
        log.info(
            "stream seq %d follows %d: reloading the snapshot at %d",
            seq,
            self.applied_seq,
            snapshot.stream_seq,
        )
        for worker in self._workers:
            self.sink.reset_worker(worker, f"reloading the KV snapshot at stream seq {snapshot.stream_seq}")
        await self._apply_snapshot(snapshot, "reloaded snapshot")

    async def _apply_snapshot(self, snapshot: Snapshot, reason: str) -> None:
        """Apply the snapshot's events in slices of about `SNAPSHOT_SLICE_BLOCKS` blocks, one per
        loop turn: a large one (2^22 entries: about 6 s) would otherwise hold routing still. A slice
        ends only before a store, so a store and the removal of its stand-ins stay together."""
        self.event_ids.clear()  # engines' event ids restart being checked after a snapshot
        events = snapshot.events
        for event in events:
            if event.worker not in self._workers:
                self._workers.add(event.worker)
                self.sink.stream_state(event.worker, True, reason)
        start = blocks = 0
        for i, event in enumerate(events):
            if isinstance(event, BlocksStored):
                if blocks >= SNAPSHOT_SLICE_BLOCKS:
                    self.sink.apply_events(events[start:i])
                    start, blocks = i, 0
                    await asyncio.sleep(0)  # routing's turn
                blocks += len(event.blocks)
        self.sink.apply_events(events[start:])
        self.applied_seq, self._seq_known = snapshot.stream_seq, True
        self.counters.add("durable.snapshot_loaded")

    async def _maybe_snapshot(self) -> None:
        cfg = self.config
        now = time.monotonic()
        checked_at, checked_seq = self._last_check
        interval_s = cfg.snapshot_interval_s if cfg.snapshot_interval_s is not None else cfg.max_age_s / 2
        due = now - self._last_snapshot_try >= interval_s
        new = self.applied_seq - checked_seq
        if not due and (new <= 0 or (new < max(1, cfg.snapshot_threshold // 4) and now - checked_at < 2.0)):
            return  # ask the server only every quarter threshold of new messages, or every 2 s
        self._last_check = (now, self.applied_seq)
        messages = (await self.js.stream_info(cfg.stream)).state.messages
        if messages > cfg.snapshot_threshold or (due and messages > 0):
            await self.snapshot_now()

    async def _resubscribe_if_gone(self) -> None:
        """After an error: if our consumer vanished (deleted, aged out), recreate it where we are."""
        try:
            await self.js.consumer_info(self.config.stream, self.config.consumer)
        except nats.js.errors.NotFoundError:
            self.counters.add("durable.resubscribe")
            await self._subscribe(self.applied_seq + 1 if self._seq_known else None)

    def _follow_gap(self, worker: Worker, expected: int, got: int) -> None:
        follow_gap(self.sink, self.counters, worker, expected, got, f"stream {self.config.stream}")
