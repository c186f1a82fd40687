"""Dynamo-style KV events over NATS core: the router-side subscriber and the worker-side publisher.

- `NatsLink`: one NATS connection with reconnect options (unbounded attempts, exponential backoff
  with jitter) that tells its watchers when it goes down and comes back.
- `NatsEventSubscriber`: decodes `namespace.<ns>.component.<c>.kv_events` (Dynamo JSON,
  `extproc.events.dynamo_json`) and, beside it, Dynamo's event plane
  `namespace.<ns>.component.<c>.endpoint.<e>.kv-events` (the msgpack envelopes of Dynamo's own
  `KvEventPublisher`, `extproc.events.dynamo_plane`) into the router's event model and hands it to
  an `EventSink`. Both go through one event-id check (`dynamo_intake.DynamoEventIntake`).
  While the connection is down every worker seen so far is reported `stream_state(worker, False)`;
  on reconnect, up again.
- `NatsEventPublisher`: the worker side, a `KvCacheListener` (extproc/sim/prefix_cache.py) that
  numbers events consecutively and publishes them in order, never blocking the engine.

NATS core is at most once. The publisher drops (and counts) events while its connection is down
instead of letting the client buffer them: a buffered batch flushed after a reconnect reaches the
subscribers that are already back and not the others, while a dropped event leaves an id gap
that every subscriber sees. A loss is noticed at that worker's next event.

Bounded buffers: a subscription holds at most `queue_size` messages (`--event-queue-size`) that
its callback has not taken yet (nats.py's `pending_msgs_limit`; its 128 MiB `pending_bytes_limit`
stays). nats.py drops what arrives beyond that as a slow consumer; `NatsLink.on_overflow` hands
each such drop to the subscription's owner, which counts it (`drops[("nats", "*", "queue-full")]`:
which worker it came from is unknown) and relies on the event-id gap to notice the loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import SlowConsumerError

from extproc.events.counters import EventCounters
from extproc.events.dynamo_intake import DynamoEventIntake, GapHook
from extproc.events.dynamo_json import decode_event, encode_event
from extproc.events.sink import EventSink
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    StoredBlock,
    Worker,
    WorkerId,
)
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.events.nats")

StateWatcher = Callable[[bool, str], None]  # (connection up, reason)

DEFAULT_QUEUE_SIZE = 10_000  # messages a subscription buffers for its callback (--event-queue-size)

RECONNECT_BASE_S = 0.1  # first reconnect delay; doubles per failed attempt ...
RECONNECT_MAX_S = 5.0  # ... up to this, each with up to 50 % jitter
PING_INTERVAL_S = 20  # a silent half-open connection is declared dead after 3 missed pings


class NatsLink:
    """A NATS connection that reconnects forever with backoff and reports up/down to watchers."""

    def __init__(self, counters: EventCounters | None = None) -> None:
        self.counters = counters if counters is not None else EventCounters()
        self._nc: NatsClient | None = None
        self._watchers: list[StateWatcher] = []
        self._overflow: list[tuple[Any, Callable[[], None]]] = []  # (subscription, its drop handler)
        self._closing = False  # `close` was called: the disconnect that follows is no loss
        self.up = False

    @classmethod
    async def connect(
        cls,
        servers: str | list[str],
        *,
        name: str | None = None,
        counters: EventCounters | None = None,
        connect_timeout_s: float = 2.0,
        **options: Any,
    ) -> NatsLink:
        """Connect, retrying without limit: the first attempt too (a server not up yet is waited
        for), every `connect_timeout_s` at most, and every outage after. `nats_security.connect_nats`
        tries once first, so that a server refusing us (credentials, TLS) is reported, not retried.

        `options` go to `nats.connect` unchanged (credentials, TLS, pending_size, ...).
        """
        link = cls(counters)
        link._nc = await nats.connect(
            servers,
            name=name,
            connect_timeout=connect_timeout_s,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=3,
            reconnect_to_server_handler=_backoff,
            error_cb=link._on_error,
            disconnected_cb=link._on_disconnected,
            reconnected_cb=link._on_reconnected,
            closed_cb=link._on_closed,
            **options,
        )
        link.up = True
        return link

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise RuntimeError("NatsLink is not connected; use `await NatsLink.connect(...)`")
        return self._nc

    def watch(self, watcher: StateWatcher) -> Callable[[], None]:
        """Call `watcher(up, reason)` on every change of connection state; returns an unwatch function."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher) if watcher in self._watchers else None

    def on_overflow(self, subscription: Any, handler: Callable[[], None]) -> Callable[[], None]:
        """Call `handler()` for each message nats.py drops because `subscription`'s pending queue is
        full (a slow consumer); returns a function that stops it."""
        entry = (subscription, handler)
        self._overflow.append(entry)
        return lambda: self._overflow.remove(entry) if entry in self._overflow else None

    async def close(self) -> None:
        """Close the connection; never raises for a connection already lost.

        nats.py's `close` first writes out what it buffered while disconnected; with the socket gone
        that raises ConnectionError and skips the rest of its close (its subscriptions' tasks, the
        socket, the closed callback). That rest is done here, and the loss is logged as what it is.
        """
        nc = self._nc
        if nc is None or nc.is_closed:
            return
        self._closing = True
        try:
            await nc.close()
        except (ConnectionError, OSError) as exc:
            log.info("NATS connection was already lost at close (%r): messages buffered since not sent", exc)
            await _finish_close(nc)
            self._set(False, "NATS connection closed")

    def _set(self, up: bool, reason: str) -> None:
        if up == self.up:
            return
        self.up = up
        for watcher in list(self._watchers):
            try:
                watcher(up, reason)
            except Exception:
                log.exception("NATS connection watcher failed")

    async def _on_disconnected(self) -> None:
        if self._closing:  # nats.py calls this before its closed callback
            self._set(False, "NATS connection closed")
            return
        self.counters.add("nats.disconnect")
        self._set(False, "NATS connection lost")

    async def _on_reconnected(self) -> None:
        self.counters.add("nats.reconnect")
        self._set(True, "NATS reconnected")

    async def _on_closed(self) -> None:
        self._set(False, "NATS connection closed")

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            for subscription, handler in list(self._overflow):
                if exc.sub is subscription:
                    handler()
                    return
        self.counters.loud("nats.error", "NATS client error: %r", exc)


async def _finish_close(nc: NatsClient) -> None:
    """What nats.py's close skips when its last write fails: stop each subscription's delivery task
    and close the socket (nats.py's own attributes, read defensively: a release without them has
    nothing left to finish)."""
    subs = getattr(nc, "_subs", None)
    tasks = []
    for sub in list(subs.values()) if isinstance(subs, dict) else ():
        task = getattr(sub, "_wait_for_msgs_task", None)
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()
            tasks.append(task)
    if isinstance(subs, dict):
        subs.clear()
    transport = getattr(nc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()
    await asyncio.gather(*tasks, return_exceptions=True)


def _backoff(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
    """nats.py's reconnect hook: the least-retried server, after base * 2^attempts (jittered)."""
    server = min(servers, key=lambda s: s.reconnects)
    delay = min(RECONNECT_MAX_S, RECONNECT_BASE_S * 2 ** min(server.reconnects, 16))
    return server, delay * random.uniform(0.5, 1.0)


class NatsEventSubscriber(DynamoEventIntake):
    """Applies Dynamo KV events from NATS to an `EventSink`, detecting event-id gaps.

    `subject` carries Dynamo JSON (one event per message) and `event_plane_subject` Dynamo's event
    plane (msgpack envelopes of one or more events; it may hold a `*` wildcard); either may be None,
    not both. `jetstream_subject` carries Dynamo JSON too: what Dynamo 1.0-1.3 workers publish into
    their JetStream stream (`dynamo_json.jetstream_subject`), heard here as it is published;
    `component_plane_subject` the event plane of Dynamo 1.0-1.3 workers with a local indexer
    (`dynamo_plane.component_plane_subject`), read as the event plane is. Every
    decoded event, whichever the subject, goes through the same per-worker event-id check and the
    same sink calls (`DynamoEventIntake`). Counter keys: `nats.event` (applied), `nats.gap`, plus the
    decoders' `dynamo.*` and the link's.
    """

    source = "nats"

    def __init__(
        self,
        link: NatsLink,
        sink: EventSink,
        subject: str | None,
        *,
        event_plane_subject: str | None = None,
        jetstream_subject: str | None = None,
        component_plane_subject: str | None = None,
        counters: EventCounters | None = None,
        on_gap: GapHook | None = None,
        worker_id_of: Callable[[int], WorkerId] = str,
        queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        if subject is None and event_plane_subject is None:
            raise ValueError("NatsEventSubscriber needs a subject, an event_plane_subject or both")
        super().__init__(
            sink,
            counters if counters is not None else link.counters,
            on_gap=on_gap,
            worker_id_of=worker_id_of,
        )
        self.link = link
        self.subject = subject
        self.event_plane_subject = event_plane_subject
        self.jetstream_subject = jetstream_subject
        self.component_plane_subject = component_plane_subject
        self.queue_size = queue_size
        self._subs: list[Any] = []
        self._unwatch: Callable[[], None] | None = None
        self._unwatch_overflow: list[Callable[[], None]] = []

    @property
    def subjects(self) -> list[str]:
        """The subjects subscribed to: the JSON one, the event plane's, then Dynamo 1.0-1.3's JetStream
        and event plane ones."""
        named = (self.subject, self.event_plane_subject, self.jetstream_subject, self.component_plane_subject)
        return [s for s in named if s is not None]

    @property
    def pending(self) -> int:
        """Messages received and not yet handled (at most `queue_size` per subject)."""
        return sum(sub.pending_msgs for sub in self._subs)

    async def start(self) -> None:
        self._unwatch = self.link.watch(self.report_state)
        handlers = (
            (self.subject, self._on_message),
            (self.event_plane_subject, self._on_plane_message),
            (self.jetstream_subject, self._on_message),
            (self.component_plane_subject, self._on_plane_message),
        )
        for subject, handler in handlers:
            if subject is None:
                continue
            sub = await self.link.nc.subscribe(subject, cb=handler, pending_msgs_limit=self.queue_size)
            self._subs.append(sub)
            self._unwatch_overflow.append(
                self.link.on_overflow(sub, functools.partial(self._on_overflow, subject))
            )
        await self.link.nc.flush()  # the subscriptions are registered when start returns

    async def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        for unwatch in self._unwatch_overflow:
            unwatch()
        self._unwatch_overflow.clear()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    def _on_overflow(self, subject: str) -> None:
        self.counters.dropped("nats", "*", "queue-full")
        self.counters.loud(
            "nats.queue_full",
            "KV events on %s arrive faster than they are applied: more than %d pending, dropping "
            "(each worker concerned shows an event-id gap at its next event)",
            subject,
            self.queue_size,
        )

    async def _on_message(self, msg: Msg) -> None:
        self.handle(msg.data, msg.subject)

    async def _on_plane_message(self, msg: Msg) -> None:
        self.handle_event_plane(msg.data, msg.subject)

    def handle(self, data: bytes, subject: str | None = None) -> None:
        """Decode and apply one Dynamo JSON message (what its subscription does); never raises."""
        decoded = decode_event(data, self.counters, worker_id_of=self._worker_id_of)
        if decoded is None:
            return
        _, event_id, event = decoded
        self._apply(event.worker, event_id, event, subject or self.subject or "")

    def handle_event_plane(self, data: bytes, where: str | None = None) -> None:
        """Decode and apply one event-plane message, each of its events in order; never raises."""
        super().handle_event_plane(data, where or self.event_plane_subject or "")


class OrderedSender:
    """Publishes (subject, payload) in submission order from one background task.

    `submit` never blocks and never raises: it may be called from the event loop that owns the
    connection or from any other thread (the loop is the one running when the sender was made, else
    the one of the first `submit`, which must then come from that loop). Failures are counted under
    `<key>.publish_failed`, drops under `<key>.publish_dropped` (queue full, connection down with
    `drop_while_down`, or still queued at `stop`).
    """

    def __init__(
        self,
        nc: NatsClient,
        counters: EventCounters,
        key: str,
        *,
        drop_while_down: bool,
        max_queued: int = 100_000,
    ) -> None:
        self._nc = nc
        self._counters = counters
        self._key = key
        self._drop_while_down = drop_while_down
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(max_queued)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        with contextlib.suppress(RuntimeError):  # made outside a loop: the first `submit` tells it
            self._loop, self._thread = asyncio.get_running_loop(), threading.get_ident()
        self._task: asyncio.Task[None] | None = None

    def submit(self, subject: str, payload: bytes) -> None:
        loop = self._loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._counters.loud(f"{self._key}.publish_failed", "publish outside an event loop; dropped")
                return
            self._loop, self._thread = loop, threading.get_ident()
        if threading.get_ident() == self._thread:
            self._enqueue(subject, payload)
        else:
            loop.call_soon_threadsafe(self._enqueue, subject, payload)

    def _enqueue(self, subject: str, payload: bytes) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())
        try:
            self._queue.put_nowait((subject, payload))
        except asyncio.QueueFull:
            self._counters.loud(f"{self._key}.publish_dropped", "publish queue full; message dropped")

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until everything submitted so far was handed to the connection and flushed."""
        if self._task is not None:
            async with asyncio.timeout(timeout_s):
                await self._queue.join()
        if self._nc.is_connected:
            # nats-py annotates the timeout as int; a float goes to asyncio.wait_for as is
            await self._nc.flush(timeout=timeout_s)  # type: ignore[arg-type]

    async def stop(self) -> None:
        """Stop publishing; what is still queued is dropped and counted (flush first to deliver it)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        dropped = 0
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()
            dropped += 1
        if dropped:
            self._counters.add(f"{self._key}.publish_dropped", dropped)

    async def _drain(self) -> None:
        queue, nc = self._queue, self._nc
        while True:
            subject, payload = await queue.get()
            try:
                if self._drop_while_down and not nc.is_connected:
                    self._counters.add(f"{self._key}.publish_dropped")
                else:
                    await nc.publish(subject, payload)
                    self._counters.add(f"{self._key}.published")
            except Exception as exc:
                self._counters.loud(
                    f"{self._key}.publish_failed", "NATS publish on %s failed: %r", subject, exc
                )
            finally:
                queue.task_done()


class NatsEventPublisher:
    """A worker's KV events as Dynamo JSON on a NATS subject; a `KvCacheListener`.

    `worker_id` is the engine's u64 id on the wire. Event ids start at `first_event_id` and go up
    by one per event, including events dropped while the connection is down (so that subscribers
    see the gap). Local block hashes are computed from each stored block's tokens.
    """

    def __init__(
        self,
        nc: NatsClient,
        subject: str,
        worker_id: int,
        *,
        dp_rank: int = 0,
        counters: EventCounters | None = None,
        first_event_id: int = 0,
    ) -> None:
        self.subject = subject
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.counters = counters if counters is not None else EventCounters()
        self.next_event_id = first_event_id
        self._worker = Worker(worker_id, dp_rank)
        self._sender = OrderedSender(nc, self.counters, "nats", drop_while_down=True)

    def publish(self, event: KvEvent) -> int:
        """Number and publish one event (its own worker and id are ignored); returns its event id."""
        event_id = self.next_event_id
        self.next_event_id += 1
        self._sender.submit(self.subject, encode_event(self.worker_id, event, event_id, self.dp_rank))
        return event_id

    def on_stored(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
    ) -> None:
        blocks = tuple(  # Dynamo's tokens_hash: the local hash, under the request's salt
            StoredBlock(engine, compute_block_hashes(tokens, len(tokens), namespace=cache_salt)[0])
            for engine, tokens in zip(block_hashes, token_ids, strict=True)
        )
        self.publish(BlocksStored(self._worker, blocks, parent_hash))

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        self.publish(BlocksRemoved(self._worker, tuple(block_hashes)))

    def on_cleared(self) -> None:
        self.publish(AllBlocksCleared(self._worker))

    async def flush(self, timeout_s: float = 5.0) -> None:
        await self._sender.flush(timeout_s)

    async def stop(self) -> None:
        await self._sender.stop()
