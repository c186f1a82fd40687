"""Replica sync (Dynamo's `--router-replica-sync`): router replicas share their in-flight requests.

Each replica publishes what it routes (add, prefill complete, free) on a NATS core subject,
`namespace.<ns>.component.<component>.active_sequences`, and applies the other replicas'
messages to its own `KvRouter`, so that every replica's active load (prefill tokens, decode
blocks per worker) counts the requests the others sent there. Replicas given a `RouteSink` (the
picker) also share the routes clients name, Responses API answers' workers and sticky sessions'
pins (`publish_route`; `replica_wire` says when they go), and hand them all over to a replica that
was not listening when they went (`route_catchup`). NATS core is at most once, so the shared
view of the requests in flight heals itself instead of trusting every message to arrive:

- Sequence: every message carries its sender's incarnation (`boot`, random at start) and number
  (`seq`, 1, 2, ... in publishing order; NATS keeps one connection's order). A receiver that sees
  a number skipped (messages lost in a NATS outage, a full queue, a replica that joined late) asks
  that replica for its whole in-flight set (`want`) and replaces what it tracks for it with the
  answer (`state`); until then it goes on applying what arrives. A new `boot` under a known router
  id is a restarted replica: its previous requests are forgotten.
- Leases: every `--replica-sync-heartbeat-secs` (1 s) a replica sends a heartbeat (`hb`) with a
  digest of its own in-flight set. A replica silent for its lease (`--replica-sync-lease-secs`, 5 s,
  carried in the heartbeat) has its requests forgotten by the others, logged and counted
  (`sync.lease_expired`): a SIGKILLed replica leaves nothing behind, also when it comes back under a
  new id. Leases do not run out while this replica's own connection is down (it cannot hear
  anyone); when it is back every lease starts again.
- Digest: a heartbeat says how many requests its sender has in flight and an order-independent
  hash of them. A receiver that is caught up (no number skipped since its last `state`) compares
  it with what it tracks for that sender; a difference (`sync.digest_mismatch`) asks for a `state`.
- Reconnect: when its NATS connection comes back a replica publishes its whole in-flight set and
  asks every other replica for theirs (`want` from `*`), as it does at start.
- Catch-up: the picker awaits `catch_up` before each decision (`EndpointPicker.before_decision`):
  messages that already reached this replica's socket, held there until its next wake-up
  (`--nats-read-delay-ms`), are applied first, so a decision counts every request the others
  announced before it (replay: other replicas' load 50 ms late costs 4-8 % of TTFT).

Every applied `state` that changed something or was asked for is counted (`sync.resync`) and logged
with what it added and forgot. Remote requests are tracked under `<router>:<id>`, so that two
replicas reusing a request id never touch each other's entries. The records of the other replicas'
requests are kept here as well as in the router: a worker this replica does not (or no longer)
know is skipped by the router, and its requests are applied again when the worker comes back
(`workers_added`), so a worker flapping in one replica's discovery leaves no hole in its view.

The messages, their format versions, the digest and the checks of values from the wire are
`extproc.events.replica_wire`'s.

Batches: receiving a message costs far more than applying one (a wake-up of the event loop and
the NATS client's per-message machinery: 0.2-0.3 ms of a picker's CPU per message on a busy
2-core host, against about 0.05 ms to apply an add; benchmarks/bench_replicas.py), so a replica's
lifecycle messages are gathered until the sender's loop has nothing else to run (on the picker's
loop, `extproc.runtime.wakeups.call_when_idle`: the ops of one wake-up go out together and cost
no wake-up of their own), for up to `batch_s` (`DEFAULT_BATCH_S`, 10 ms, from the first one) in a
loop that never sleeps, or until `MAX_BATCH_OPS` ops / `BATCH_BYTES`, and sent as one `batch`,
whose ops are applied in order exactly as the single messages would be; block hashes travel
packed (8 bytes each, decoded in one call, no per-hash checks). Any other message first sends the
batch gathered so far, so a sender's order never changes (a heartbeat's digest counts every op
sent before it). A batch is one message: its `seq` is checked, and a lost or repeated batch is
healed as any message is.
Heartbeats say `"batch": 1`. A replica sends batches only while every other replica it knows
said so in its last heartbeat (none known yet counts as all), else single format-1 messages: a
replica of the previous version drops a batch as malformed, so from its first message on (its
`want` at start) it gets single messages, and a batch it missed before shows as a sequence gap
that its `want` heals.

Messages of a version-1 replica (format 1 without `seq`) are applied as before: it sends no
heartbeat, so it has no lease and no digest (its requests end with its frees or its `bye`), and
a lost message of its can only be healed by forgetting its requests (below).

Bounded: at most `MAX_ORIGINS` other replicas and `MAX_REQUESTS_PER_ORIGIN` requests of each are
tracked (more is dropped and counted: `sync.origins_full`, `sync.requests_full`), an `add` holds at
most `MAX_HASHES` block hashes (its counts in range: `replica_wire.add_record`), a `state` at most
`MAX_STATE_PARTS` parts. The subscription holds at most `queue_size` (`--event-queue-size`)
unhandled messages and the publishing queue as many unsent ones. A message nats.py drops from a full
subscription (`overflowed()`) may have been a `free`: once every message received before the drop is
applied, every replica is asked for its state and version-1 replicas' requests are forgotten (their
load is under-counted until they end, never leaked).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from extproc.events.counters import EventCounters
from extproc.events.nats_events import DEFAULT_QUEUE_SIZE, OrderedSender
from extproc.events.nats_reads import catch_up
from extproc.events.replica_wire import (
    MAX_BATCH_OPS,
    OP_ADD,
    OP_FREE,
    OP_HOME,
    OP_NAMES,
    OP_PREFILL,
    ROUTE_NAMES,
    V1,
    V3,
    VERSION,
    InFlight,
    Record,
    SharedHome,
    SharedPin,
    SharedRoute,
    SharedUnpin,
    add_record,
    batch_op,
    batch_op_from_wire,
    is_int,
    route_from_message,
    route_message,
    route_op,
    single_message,
    wire_hashes,
    wire_int,
    wire_text,
    wire_worker,
)
from extproc.events.route_catchup import (
    MAX_PENDING_ANSWERS,
    Answer,
    RouteSink,
    RoutesWanted,
    answer_stream,
    fill_from_answer,
    reply_subject,
)
from extproc.router.types import Worker
from extproc.runtime.wakeups import call_when_idle, lazy_sleep
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.events.replica_sync")


DEFAULT_HEARTBEAT_S = 1.0  # --replica-sync-heartbeat-secs
DEFAULT_LEASE_S = 5.0  # --replica-sync-lease-secs
MIN_LEASE_S, MAX_LEASE_S = 0.1, 3600.0  # a lease_s from the wire is clamped into this range
MAX_ORIGINS = 256  # other replicas tracked at once
MAX_REQUESTS_PER_ORIGIN = 100_000
MAX_STATE_PARTS = 4096
STATE_PART_BYTES = 256 * 1024  # below NATS's default max_payload of 1 MiB
_TICK_MAX_S = 0.25  # the background task looks at heartbeats, leases and wants at least this often
_ROUTE = -1  # what a route is gathered as in a batch (route_op and route_message write its own code)
DEFAULT_BATCH_S = 0.01  # lifecycle messages gathered into one batch for at most this long
BATCH_BYTES = 128 * 1024  # sent at once past this (estimated) size


def active_sequences_subject(namespace: str, component: str) -> str:
    """The NATS subject router replicas of one component share their in-flight requests on."""
    return f"namespace.{namespace}.component.{component}.active_sequences"


class SyncedRouter(Protocol):
    """The part of `KvRouter` replica sync drives."""

    def add_request(
        self,
        request_id: str,
        worker: Worker,
        local_hashes: Sequence[int],
        isl: int,
        overlap_blocks: int,
        *,
        expected_output_tokens: int | None = None,
    ) -> None: ...

    def mark_prefill_complete(self, request_id: str) -> bool: ...

    def free(self, request_id: str) -> bool: ...


@dataclass(slots=True)
class _Origin:
    """What this replica knows of another one."""

    boot: int | None  # None: a version-1 replica (no sequence, no lease)
    heard_at: float
    lease_s: float
    in_flight: InFlight = field(default_factory=InFlight)
    next_seq: int = 0
    synced: bool = True  # False: messages were missed and its state was asked for
    wanted_at: float = 0.0
    parts: list[tuple[str, Record]] | None = None  # a state being received
    parts_next: int = 0
    parts_total: int = 0
    batch: bool = False  # its last heartbeat said it reads batches
    routes: bool = False  # its last heartbeat said it keeps the routes others share
    handover: bool = False  # ... and hands them over when asked (`route_catchup`)


class ReplicaSync:
    """Publishes this replica's request lifecycle and applies the other replicas' to `router`.

    Counter keys: `sync.published`, `sync.publish_failed`, `sync.publish_dropped`, `sync.applied`,
    `sync.malformed`, `sync.apply_failed`, `sync.dropped`, `sync.gap`, `sync.missed`, `sync.want`,
    `sync.wanted`, `sync.state_sent`, `sync.resync`, `sync.digest_mismatch`, `sync.lease_expired`,
    `sync.restarted`, `sync.origins_full`, `sync.requests_full`, `sync.id_clash`; routes:
    `sync.routes`, `sync.routes_unshared`, `sync.routes_want`, `sync.routes_want_timeout`,
    `sync.routes_want_dropped`, `sync.routes_parts_sent`, `sync.routes_learned`, `sync.routes_late`.
    """

    def __init__(
        self,
        nc: NatsClient,
        router: SyncedRouter,
        router_id: str,
        subject: str,
        *,
        counters: EventCounters | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        lease_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.monotonic,
        boot: int | None = None,
        batch_s: float = DEFAULT_BATCH_S,
        routes: RouteSink | None = None,
    ) -> None:
        if not router_id:
            raise ValueError("router_id must not be empty (replicas tell their messages apart by it)")
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        if not 0 < heartbeat_s < lease_s:
            raise ValueError(f"need 0 < heartbeat_s < lease_s, got {heartbeat_s} and {lease_s}")
        if not 0 <= batch_s < heartbeat_s:
            raise ValueError(f"need 0 <= batch_s < heartbeat_s, got {batch_s} and {heartbeat_s}")
        self.nc = nc
        self.router = router
        self.router_id = router_id
        self.subject = subject
        self.queue_size = queue_size
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self.batch_s = batch_s  # 0: every lifecycle message on its own
        self.routes = routes  # None: other replicas' routes are not kept (and this one says so)
        # routes learned before this replica listened, asked of another (`route_catchup`)
        self._routes_wanted = RoutesWanted(lease_s) if routes is not None else None
        self._inbox: str | None = None  # where the answers come (subscribed at start)
        self._inbox_sub: Any = None
        self._answers: dict[str, Answer] = {}  # the replicas asking this one for its routes
        self._started_at: float | None = None
        self.boot = boot if boot is not None else secrets.randbits(62)
        self.counters = counters if counters is not None else EventCounters()
        self._clock = clock
        self._sender = OrderedSender(nc, self.counters, "sync", drop_while_down=False, max_queued=queue_size)
        self._seq = 0
        self._own = InFlight()
        self._origins: dict[str, _Origin] = {}
        self._sub: Any = None
        self._handled = 0  # messages taken from the subscription so far
        self._resync_at: int | None = None  # after an overflow: act once _handled reaches this
        self._link_up = True
        self._next_heartbeat = 0.0
        self._dump_wanted = False
        self._last_dump = float("-inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._batch: list[tuple[int, str, Record | SharedRoute | None]] = []  # ops not sent yet
        self._batch_size = 0
        self._batch_due = 0.0  # (clock) when the gathered ops must go at the latest
        self._batch_timer: asyncio.Future[None] | asyncio.TimerHandle | None = None

    @property
    def subscription(self) -> Any:
        """The nats.py subscription (for `NatsLink.on_overflow`); None before `start`."""
        return self._sub

    async def start(self) -> None:
        """Subscribe, ask the others for their state, and start heartbeats and leases."""
        self._sub = await self.nc.subscribe(
            self.subject, cb=self._on_message, pending_msgs_limit=self.queue_size
        )
        if self._routes_wanted is not None:
            self._inbox = self.nc.new_inbox()
            self._inbox_sub = await self.nc.subscribe(self._inbox, cb=self._on_routes)
        await self.nc.flush()  # subscribed when start returns
        self._started_at = self._clock()
        self._want_all("this replica started")
        name = f"replica-sync-{self.router_id}"
        self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    async def stop(self) -> None:
        """Tell the others to forget our requests, deliver what is queued, unsubscribe."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self._publish(V1, {"op": "bye"})
        with contextlib.suppress(Exception):
            await self._sender.flush(timeout_s=2.0)
        await self._sender.stop()
        for sub in (self._sub, self._inbox_sub):
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        self._sub = self._inbox_sub = None
        if self._routes_wanted is not None:
            self._routes_wanted.give_up()  # an answer cut short by the stop ends its bulk load

    # --- publishing (never blocks, never raises) -------------------------------------------------

    def publish_added(
        self,
        request_id: str,
        worker: Worker,
        local_hashes: Sequence[int],
        isl: int,
        overlap: int,
        expected_output_tokens: int | None = None,
    ) -> None:
        record = Record(worker, tuple(local_hashes), isl, overlap, expected_output_tokens)
        self._own.put(request_id, record)
        self._op_out(OP_ADD, request_id, record, 48 + len(request_id) + 8 * len(record.hashes))

    def publish_prefill_complete(self, request_id: str) -> None:
        self._own.mark_prefilled(request_id)
        self._op_out(OP_PREFILL, request_id, None, 8 + len(request_id))

    def publish_freed(self, request_id: str) -> None:
        self._own.pop(request_id)
        self._op_out(OP_FREE, request_id, None, 8 + len(request_id))

    def batching(self) -> bool:
        """Whether lifecycle messages go out in batches now: on, and every replica heard reads them."""
        return self.batch_s > 0 and all(entry.batch for entry in self._origins.values())

    def publish_route(self, key: str, route: SharedRoute) -> None:
        """Tell the others a route clients name (a Responses API answer's worker, a session's pin or
        its close), when every one keeps routes."""
        if not self.shares_routes():
            self.counters.add("sync.routes_unshared")
            return
        self._op_out(_ROUTE, key, route, 80 + len(key) + 2 * len(route.model))

    def shares_routes(self) -> bool:
        """Whether routes go out now: some replica is known and every one said it keeps them."""
        return bool(self._origins) and all(entry.routes for entry in self._origins.values())

    def _op_out(self, code: int, key: str, payload: Record | SharedRoute | None, size: int) -> None:
        if not self.batching():
            self._single_out(code, key, payload)
            return
        if not self._batch:
            self._batch_due = self._clock() + self.batch_s
            with contextlib.suppress(RuntimeError):  # no running loop: tick() or the next message sends it
                self._batch_timer = call_when_idle(self.flush_batch, self.batch_s)
        self._batch.append((code, key, payload))
        self._batch_size += size
        if len(self._batch) >= MAX_BATCH_OPS or self._batch_size >= BATCH_BYTES:
            self.flush_batch()

    def flush_batch(self) -> None:
        """Send the ops gathered so far: one batch, or single messages if a replica that does not read
        batches appeared meanwhile (routes only while every replica still keeps them)."""
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        ops, self._batch, self._batch_size = self._batch, [], 0
        if not self.shares_routes() and any(op[0] == _ROUTE for op in ops):
            kept = [op for op in ops if op[0] != _ROUTE]
            self.counters.add("sync.routes_unshared", len(ops) - len(kept))
            ops = kept
        if not ops:
            return
        if not self.batching():
            for op in ops:
                self._single_out(*op)
            return
        self._publish(V3, {"op": "batch", "ops": [_batch_op(*op) for op in ops]})

    def _single_out(self, code: int, key: str, payload: Record | SharedRoute | None) -> None:
        if isinstance(payload, SharedHome | SharedPin | SharedUnpin):
            self._publish(VERSION, route_message(key, payload))
        else:
            self._publish(V1, single_message(code, key, payload))

    def publishes(self, request_id: str) -> bool:
        """Whether this replica announced `request_id` and has not freed it yet."""
        return request_id in self._own.requests

    def own_summary(self) -> tuple[int, int]:
        """(requests in flight, digest) of this replica, as its heartbeats say."""
        return self._own.summary()

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until everything published so far reached the server."""
        await self._sender.flush(timeout_s)

    def _publish(self, version: int, message: dict[str, Any]) -> None:
        if self._batch and version != V3:
            self.flush_batch()  # what was gathered goes first: a sender's order never changes
        self._seq += 1
        head = {"v": version, "router": self.router_id, "boot": self.boot, "seq": self._seq}
        try:
            payload = msgpack.packb({**head, **message}, use_bin_type=True)
        except Exception as exc:  # the receivers see a sequence gap and ask for our state
            self.counters.loud("sync.publish_failed", "cannot encode replica sync message: %r", exc)
            return
        self._sender.submit(self.subject, payload)

    def _publish_heartbeat(self) -> None:
        n, digest = self._own.summary()
        heartbeat = {"op": "hb", "n": n, "digest": digest, "lease_s": self.lease_s, "batch": 1}
        if self.routes is not None:  # it keeps the routes others share, and hands them over when asked
            heartbeat["routes"] = heartbeat["handover"] = 1
        self._publish(VERSION, heartbeat)

    def _publish_state(self) -> None:
        """Our whole in-flight set, in parts of at most STATE_PART_BYTES, back to back."""
        parts: list[list[list[Any]]] = [[]]
        size = 0
        for request_id, record in self._own.requests.items():
            item = record.wire(request_id)
            item_size = 32 + len(request_id) + 9 * len(record.hashes)  # msgpack, generously
            if parts[-1] and size + item_size > STATE_PART_BYTES:
                parts.append([])
                size = 0
            parts[-1].append(item)
            size += item_size
        for i, items in enumerate(parts):
            self._publish(VERSION, {"op": "state", "part": i, "parts": len(parts), "reqs": items})
        self.counters.add("sync.state_sent")
        self._last_dump = self._clock()
        self._dump_wanted = False

    def _want(self, origin: str, entry: _Origin | None, now: float, reason: str) -> None:
        if entry is not None:
            entry.synced = False
            entry.wanted_at = now
        self.counters.add("sync.want")
        log.info("replica sync: asking %s for its in-flight requests (%s)", origin, reason)
        self._publish(VERSION, {"op": "want", "from": origin})

    def _want_all(self, reason: str) -> None:
        """Publish our state and ask every replica for theirs."""
        now = self._clock()
        for entry in self._origins.values():
            if entry.boot is not None:
                entry.synced, entry.wanted_at = False, now
        self._publish_state()
        self._want("*", None, now, reason)

    # --- time: heartbeats, leases, wants asked again ---------------------------------------------

    def tick(self, now: float) -> None:
        """Heartbeat when due, answer wants, expire silent replicas, ask again for missing states."""
        if self._batch and now >= self._batch_due:
            self.flush_batch()
        if now >= self._next_heartbeat and self._link_up:  # no stale heartbeats buffered while down
            self._next_heartbeat = now + self.heartbeat_s
            self._publish_heartbeat()
        if self._dump_wanted and now - self._last_dump >= min(self.heartbeat_s / 2, _TICK_MAX_S):
            self._publish_state()
        if self._answers:
            self._answer_routes()  # one part to each replica that asked, per tick
        if self._routes_wanted is not None and (silent := self._routes_wanted.expired(now)) is not None:
            self.counters.add("sync.routes_want_timeout")
            log.warning("replica sync: %s handed over %d parts of its routes, then nothing for %.1f s: "
                        "asking again", silent.origin, silent.parts_next, now - silent.heard_at)  # fmt: skip
        if not self._link_up:
            return  # we hear nobody: a silence says nothing about them
        for origin, entry in list(self._origins.items()):
            if entry.boot is None:
                continue
            if now - entry.heard_at > entry.lease_s:
                n = self._forget(origin)
                self.counters.add("sync.lease_expired")
                log.warning("replica sync: %s silent for %.1f s (lease %.1f s): forgot its %d requests",
                            origin, now - entry.heard_at, entry.lease_s, n)  # fmt: skip
            elif not entry.synced and now - entry.wanted_at >= 2 * self.heartbeat_s:
                self._want(origin, entry, now, "no state came yet")

    def connection_changed(self, up: bool, reason: str) -> None:
        """The NATS connection went down or came back (a `NatsLink` watcher)."""
        self._link_up = up
        if not up:
            return
        now = self._clock()
        for entry in self._origins.values():
            entry.heard_at = now  # every lease starts again
        if self._routes_wanted is not None:
            self._routes_wanted.missed_some()  # routes shared while this one was away
        self._want_all(reason)
        self._wake.set()

    def _next_tick(self, now: float) -> tuple[float, float]:
        """(delay, slack) of the next tick: a state wanted by another replica goes out within
        `_TICK_MAX_S`; otherwise the tick comes with the next heartbeat, up to a quarter of the
        period late if the loop has no other wake-up before (leases and wants need no more)."""
        if self._answers:
            return 0.0, 0.0
        if self._dump_wanted:
            return max(0.0, self._last_dump + min(self.heartbeat_s / 2, _TICK_MAX_S) - now), 0.0
        if not self._link_up:  # no heartbeats are due: look again as often as before
            return min(self.heartbeat_s / 4, _TICK_MAX_S), 0.0
        return min(max(0.0, self._next_heartbeat - now), self.heartbeat_s), self.heartbeat_s / 4

    async def _run(self) -> None:
        while True:
            try:
                self.tick(self._clock())
            except Exception:  # keep the heartbeats going
                log.exception("replica sync tick failed")
            delay, slack = self._next_tick(self._clock())
            woken = asyncio.ensure_future(self._wake.wait())
            slept = asyncio.ensure_future(lazy_sleep(delay, slack))
            try:
                await asyncio.wait((woken, slept), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                slept.cancel()
            self._wake.clear()

    # --- the others' requests --------------------------------------------------------------------

    def forget_replica(self, router_id: str) -> int:
        """Free every request of replica `router_id` (it stopped or died); returns how many."""
        return self._forget(router_id)

    def tracked_remote(self) -> dict[str, int]:
        """In-flight requests per other replica, as this replica tracks them."""
        return {origin: len(e.in_flight) for origin, e in self._origins.items() if len(e.in_flight)}

    def remote_requests(self) -> Iterator[tuple[str, str, Record]]:
        """(origin, request id, record) of every other replica's request tracked here."""
        for origin, entry in self._origins.items():
            for request_id, record in entry.in_flight.requests.items():
                yield origin, request_id, record

    def workers_added(self, worker_ids: Collection[str]) -> int:
        """Workers joined (or came back to) this replica's set: apply the other replicas' requests
        on them, which the router skipped while it did not know them. Returns how many."""
        applied = 0
        for origin, request_id, record in self.remote_requests():
            if str(record.worker.worker_id) in worker_ids:
                self._track(f"{origin}:{request_id}", record)
                applied += 1
        return applied

    def overflowed(self) -> None:
        """nats.py dropped a message: the subscription's queue was full. Counted; once the
        messages received before the drop are applied, every replica is asked for its state."""
        self.counters.dropped("sync", "*", "queue-full")
        self.counters.loud(
            "sync.queue_full",
            "replica sync messages arrive faster than they are applied (more than %d pending): "
            "dropping, then asking the other replicas for their state",
            self.queue_size,
        )
        self._resync_at = self._handled + (self._sub.pending_msgs if self._sub is not None else 0)
        self._maybe_resync()

    def _maybe_resync(self) -> None:
        if self._resync_at is None or self._handled < self._resync_at:
            return
        self._resync_at = None
        legacy = [origin for origin, entry in self._origins.items() if entry.boot is None]
        forgotten = sum(self._forget(origin) for origin in legacy)
        self.counters.add("sync.resync")
        log.warning("replica sync lost messages: asking every replica for its state%s",
                    f" (forgot {forgotten} requests of version-1 replicas)" if legacy else "")  # fmt: skip
        self._want_all("messages were dropped")

    async def catch_up(self) -> None:
        """Apply what other replicas said that already reached this one (a decision is about to
        count their load): a held NATS socket is read now, not with a later wake-up."""
        sub = self._sub
        if self.nc is None or sub is None:
            return
        try:
            turns = await catch_up(self.nc, lambda: sub.pending_msgs)
        except Exception as exc:  # a decision never fails for it: it goes on with what it has
            self.counters.loud("sync.catch_up_error", "replica sync: no catch-up before a decision: %r", exc)
            return
        if turns:
            self.counters.add("sync.catch_up")
            self.counters.add("sync.catch_up_turns", turns)

    async def _on_message(self, msg: Msg) -> None:
        self.handle(msg.data)
        self._handled += 1
        self._maybe_resync()

    def handle(self, data: bytes, now: float | None = None) -> None:
        """Apply one sync message (what the subscription does); never raises."""
        try:
            message = msgpack.unpackb(data, raw=False)
            origin, op, version = message["router"], message["op"], message.get("v")
            if version not in (V1, VERSION, V3) or not isinstance(origin, str) or not isinstance(op, str):
                raise ValueError(f"version {version!r:.20}, router {origin!r:.40}, op {op!r:.20}")
            boot, seq = message.get("boot"), message.get("seq")
            if (version != V1 or seq is not None or boot is not None) and not (
                is_int(boot) and is_int(seq) and seq > 0
            ):
                raise ValueError(f"boot {boot!r:.30} and seq {seq!r:.30} must be integers")
        except Exception as exc:
            self.counters.loud("sync.malformed", "malformed replica sync message (%r); dropped", exc)
            return
        if origin == self.router_id:
            if boot is not None and boot != self.boot:
                self.counters.loud("sync.id_clash", "another replica publishes as %r: give each "
                                   "replica its own --router-id", origin)  # fmt: skip
            return
        try:
            self._receive(origin, op, message, boot, seq, self._clock() if now is None else now)
        except Exception as exc:
            self.counters.loud(
                "sync.apply_failed", "replica sync %.20s from %.60s not applied: %r", op, origin, exc
            )
            return
        self.counters.add("sync.applied")

    def _receive(self, origin: str, op: str, message: dict[str, Any], boot: int | None, seq: int | None,
                 now: float) -> None:  # fmt: skip
        entry = self._origins.get(origin)
        if entry is not None and entry.boot != boot:
            n = self._forget(origin)
            entry = None
            self.counters.add("sync.restarted")
            log.warning("replica sync: %s restarted: forgot the %d requests of its previous run", origin, n)
        if op == "bye":
            self._forget(origin)
            return
        new = entry is None
        if entry is None:
            if len(self._origins) >= MAX_ORIGINS:
                self.counters.loud("sync.origins_full", "replica sync: more than %d other replicas; "
                                   "messages of %.60s dropped", MAX_ORIGINS, origin)  # fmt: skip
                return
            entry = self._origins[origin] = _Origin(boot, now, self.lease_s)
        entry.heard_at = now
        starts_state = op == "state" and message.get("part") == 0
        if seq is not None:
            expected = entry.next_seq
            entry.next_seq = seq + 1
            if new and seq != 1 and not starts_state:
                self._want(origin, entry, now, f"first heard at its message {seq}")
            elif not new and seq != expected:
                entry.parts = None
                self.counters.add("sync.missed", min(max(seq - expected, 0), 1 << 20))
                self.counters.loud("sync.gap", "replica sync: missed messages %d..%d of %s",
                                   expected, seq - 1, origin)  # fmt: skip
                if not starts_state:
                    self._want(origin, entry, now, f"missed its messages {expected}..{seq - 1}")
        if op in OP_NAMES:
            self._lifecycle(origin, entry, op, message)
        elif seq is None:
            raise ValueError(f"op {op!r:.20} needs format {VERSION}")
        elif op == "batch":
            ops = message["ops"]
            if not isinstance(ops, list) or len(ops) > MAX_BATCH_OPS:
                raise ValueError(f"a batch is a list of at most {MAX_BATCH_OPS} ops")
            decoded = [batch_op_from_wire(item) for item in ops]  # a malformed op: none applied
            for code, key, payload in decoded:
                try:
                    if isinstance(payload, SharedHome | SharedPin | SharedUnpin):
                        self._route(key, payload)
                    else:
                        self._apply(origin, entry, code, key, payload)
                except Exception as exc:  # as for a single message: this op only
                    self.counters.loud("sync.apply_failed", "replica sync %.20s from %.60s not applied: %r",
                                       _op_name(code), origin, exc)  # fmt: skip
            self.counters.add("sync.batch_ops", len(decoded))
        elif op == "hb":
            self._heartbeat(origin, entry, message, now)
        elif op == "want":
            wanted = message["from"]
            if wanted in (self.router_id, "*"):
                self.counters.add("sync.wanted")
                self._dump_wanted = True
                self._wake.set()
        elif op == "state":
            self._state_part(origin, entry, message)
        elif op == "want_routes":
            self._routes_asked(origin, message)
        elif (route := route_from_message(op, message)) is not None:
            self._route(*route)
        else:
            raise ValueError(f"unknown op {op!r:.20}")

    def _lifecycle(self, origin: str, entry: _Origin, op: str, message: dict[str, Any]) -> None:
        request_id = wire_text(message["id"], "request id")
        if op == "add":
            record = add_record(
                wire_worker(message["worker"], message["dp"]),
                wire_hashes(message["hashes"]),
                message["isl"],
                message["overlap"],
                message.get("eot"),
            )
            self._apply(origin, entry, OP_ADD, request_id, record)
        else:
            self._apply(origin, entry, OP_PREFILL if op == "prefill" else OP_FREE, request_id, None)

    def _apply(self, origin: str, entry: _Origin, code: int, request_id: str, record: Record | None) -> None:
        """One lifecycle op of `origin`, from a single message or a batch."""
        key = f"{origin}:{request_id}"
        if record is not None:  # OP_ADD
            if request_id not in entry.in_flight.requests and len(entry.in_flight) >= MAX_REQUESTS_PER_ORIGIN:
                self.counters.loud("sync.requests_full", "replica sync: %.60s has more than %d requests in "
                                   "flight; dropped", origin, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip
                return
            if entry.in_flight.put(request_id, record) is not None:
                self.router.free(key)  # the same id added again: the new one counts
            self._track(key, record)
        elif code == OP_PREFILL:
            if entry.in_flight.mark_prefilled(request_id):
                self.router.mark_prefill_complete(key)
        else:
            entry.in_flight.pop(request_id)
            self.router.free(key)

    def _route(self, key: str, route: SharedRoute) -> None:
        """Another replica's route: what names `key` goes where it said, from here too."""
        sink = self.routes
        if sink is None:
            return  # this replica said it keeps none: the sender knows
        if isinstance(route, SharedHome):
            sink.remember_response_home(key, route.model, route.worker, route.endpoint, route.group)
        elif isinstance(route, SharedPin):
            sink.remember_session_pin(key, route.model, route.worker, route.group)
        else:
            sink.forget_session_pin(key, route.model)
        self.counters.add("sync.routes")

    # --- routes handed over to a replica that missed them (`route_catchup`) ----------------------

    def _ask_routes(self, origin: str, now: float) -> None:
        if self._routes_wanted is None or self._inbox is None:
            return
        ask = self._routes_wanted.ask(origin, now)
        if ask is None:
            return
        self.counters.add("sync.routes_want")
        log.info("replica sync: asking %s for the routes it keeps (answers' workers, session pins)", origin)
        self._publish(VERSION, {"op": "want_routes", "from": origin, "reply": self._inbox, "ask": ask.ask})

    def awaiting_routes(self) -> bool:
        """Whether this replica, just started, still waits for the routes the others keep: from its
        start until an answer came whole, unless two heartbeats passed without a replica that
        hands them over to ask (readiness, `extproc.runtime.readiness`, bounds the wait). Once
        answered, never again: a NATS blip must not make every replica unready."""
        wanted = self._routes_wanted
        if wanted is None or wanted.answered or self._started_at is None:
            return False
        return wanted.asked or self._clock() - self._started_at < 2 * self.heartbeat_s

    def _routes_asked(self, origin: str, message: dict[str, Any]) -> None:
        """`origin` asks some replica for its routes: remember to answer if it is this one."""
        if message["from"] != self.router_id or self.routes is None:
            return
        reply, ask = reply_subject(message["reply"]), wire_int(message["ask"])
        if origin not in self._answers and len(self._answers) >= MAX_PENDING_ANSWERS:
            self.counters.loud("sync.routes_want_dropped", "replica sync: more than %d replicas ask for "
                               "routes at once; %.60s asks again", MAX_PENDING_ANSWERS, origin)  # fmt: skip
            return
        # asked again (its answer was cut short): it starts over
        self._answers[origin] = Answer(reply, answer_stream(self.routes, self.router_id, ask))
        self._wake.set()

    def _answer_routes(self) -> None:
        """Send the next part of the answer to each replica that asked (to its inbox)."""
        for asker, answer in list(self._answers.items()):
            payload = next(answer.parts, None)
            if payload is not None:
                self._sender.submit(answer.reply, payload)
                answer.sent += 1
                self.counters.add("sync.routes_parts_sent")
                continue
            del self._answers[asker]
            log.info("replica sync: handed its routes to %s (%d parts)", asker, answer.sent)

    async def _on_routes(self, msg: Msg) -> None:
        self.handle_routes(msg.data)

    def handle_routes(self, data: bytes, now: float | None = None) -> None:
        """Take one part of an answer to this replica's want_routes (what its inbox gets); never raises."""
        if self._routes_wanted is None or self.routes is None:
            return
        try:
            got = self._routes_wanted.take(data, self._clock() if now is None else now)
        except Exception as exc:
            self.counters.loud("sync.malformed", "malformed routes answer (%r); dropped", exc)
            return
        if got is None:
            self.counters.add("sync.routes_late")  # an answer to an ask given up already
            return
        ask, items, last = got
        for item in items:
            try:
                ask.learned += fill_from_answer(self.routes, item)
            except Exception as exc:  # this route only
                self.counters.loud("sync.malformed", "malformed route in an answer (%r); dropped", exc)
            ask.told += 1
        if last:
            self.counters.add("sync.routes_learned", ask.learned)
            log.info("replica sync: learned %d routes from %s (%d more were known here or lapsed)",
                     ask.learned, ask.origin, ask.told - ask.learned)  # fmt: skip

    def _heartbeat(self, origin: str, entry: _Origin, message: dict[str, Any], now: float) -> None:
        entry.batch = message.get("batch") == 1
        entry.routes = message.get("routes") == 1
        entry.handover = message.get("handover") == 1
        if entry.routes and entry.handover:
            self._ask_routes(origin, now)
        lease = message.get("lease_s")
        if isinstance(lease, int | float) and not isinstance(lease, bool) and lease == lease:
            entry.lease_s = min(max(float(lease), MIN_LEASE_S), MAX_LEASE_S)
        theirs = (wire_int(message["n"]), wire_int(message["digest"]))
        if entry.synced and entry.parts is None and theirs != entry.in_flight.summary():
            self.counters.add("sync.digest_mismatch")
            self._want(origin, entry, now, f"its heartbeat says {theirs[0]} requests, we track "
                       f"{len(entry.in_flight)} (or different ones)")  # fmt: skip

    def _state_part(self, origin: str, entry: _Origin, message: dict[str, Any]) -> None:
        part, total, items = wire_int(message["part"]), wire_int(message["parts"]), message["reqs"]
        if not 1 <= total <= MAX_STATE_PARTS or not isinstance(items, list):
            raise ValueError(f"state part {part} of {total}: bad shape")
        if part == 0:
            entry.parts, entry.parts_next, entry.parts_total = [], 0, total
        if entry.parts is None or part != entry.parts_next or total != entry.parts_total:
            entry.parts = None  # a part is missing: the want is asked again in time
            return
        if len(entry.parts) + len(items) > MAX_REQUESTS_PER_ORIGIN:
            entry.parts = None
            self.counters.loud("sync.requests_full", "replica sync: the state of %.60s has more than %d "
                               "requests; dropped", origin, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip
            return
        entry.parts += [Record.from_wire(item) for item in items]
        entry.parts_next += 1
        if entry.parts_next == total:
            records, entry.parts = entry.parts, None
            self._replace(origin, entry, records)

    def _replace(self, origin: str, entry: _Origin, records: list[tuple[str, Record]]) -> None:
        """Make `records` what this replica tracks of `origin` (its state), changing only differences."""
        asked = not entry.synced
        entry.synced = True
        new = InFlight()
        for request_id, record in records:
            new.put(request_id, record)
        old = entry.in_flight
        if new.summary() == old.summary() and not asked:
            return
        added = forgotten = 0
        for request_id, record in old.requests.items():
            now_record = new.requests.get(request_id)
            if now_record is None or now_record.worker != record.worker or now_record.hashes != record.hashes:
                self.router.free(f"{origin}:{request_id}")
                forgotten += 1
        entry.in_flight = new
        for request_id, record in new.requests.items():
            before = old.requests.get(request_id)
            key = f"{origin}:{request_id}"
            if before is None or before.worker != record.worker or before.hashes != record.hashes:
                self._track(key, record)
                added += 1
            elif record.prefilled and not before.prefilled:
                self.router.mark_prefill_complete(key)
        self.counters.add("sync.resync")
        level = logging.WARNING if added or forgotten else logging.INFO
        log.log(level, "replica sync: resynchronised %s: %d requests in flight (%d added, %d forgotten)",
                origin, len(new), added, forgotten)  # fmt: skip

    def _track(self, key: str, record: Record) -> None:
        self.router.add_request(
            key, record.worker, record.hashes, record.isl, record.overlap, expected_output_tokens=record.eot
        )
        if record.prefilled:
            self.router.mark_prefill_complete(key)

    def _forget(self, origin: str) -> int:
        entry = self._origins.pop(origin, None)
        if entry is None:
            return 0
        for request_id in entry.in_flight.requests:
            self.router.free(f"{origin}:{request_id}")
        return len(entry.in_flight)


def _batch_op(code: int, key: str, payload: Record | SharedRoute | None) -> list[Any]:
    if isinstance(payload, SharedHome | SharedPin | SharedUnpin):
        return route_op(key, payload)
    return batch_op(code, key, payload)


def _op_name(code: int) -> str:
    return ROUTE_NAMES[code - OP_HOME] if code >= OP_HOME else OP_NAMES[code]
