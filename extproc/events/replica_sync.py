"""Replica sync (Dynamo's `--router-replica-sync`): router replicas share their in-flight requests.

Each replica publishes what it routes (add, prefill complete, free) on a NATS core subject,
`namespace.<ns>.component.<component>.active_sequences`, and applies the other replicas'
messages to its own `KvRouter`, so that every replica's active load (prefill tokens, decode
blocks per worker) counts the requests the others sent there. A replica that joins late misses
the requests already in flight and converges as they end (frees of unknown ids are harmless).

Messages are msgpack maps, version 1:

    {"v": 1, "router": str, "op": "add", "id": str, "worker": int | str, "dp": int,
     "hashes": [local block hash, ...], "isl": int, "overlap": int, "eot": int | nil}
    {"v": 1, "router": str, "op": "prefill" | "free", "id": str}
    {"v": 1, "router": str, "op": "bye"}            # the replica stops: free all its requests

A replica ignores its own messages. Remote requests are tracked under `<router>:<id>`, so that two
replicas reusing a request id never touch each other's entries. Publishing never blocks a pick:
messages are queued and sent in order by a background task (buffered by the client while the
connection is down); failures are counted. A replica that dies without `stop()` leaves its
requests in the others' view until they are freed by hand (`forget_replica`).

Bounded buffers (`queue_size`, `--event-queue-size`): the subscription holds at most that many
unhandled messages and the publishing queue at most that many unsent ones. A message nats.py drops
from a full subscription (reported through `overflowed()`) may have been a `free`: the other
replicas' requests are no longer trustworthy, so once every message received before the drop has
been applied, all of them are forgotten (`sync.resync`). Their load is under-counted until they
end, never leaked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import msgpack
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from extproc.events.counters import EventCounters
from extproc.events.nats_events import DEFAULT_QUEUE_SIZE, OrderedSender
from extproc.router.types import Worker

log = logging.getLogger("extproc.events.replica_sync")

VERSION = 1


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


class ReplicaSync:
    """Publishes this replica's request lifecycle and applies the other replicas' to `router`.

    Counter keys: `sync.published`, `sync.publish_failed`, `sync.publish_dropped`, `sync.applied`,
    `sync.malformed`, `sync.apply_failed`, `sync.dropped`, `sync.resync`.
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
    ) -> None:
        if not router_id:
            raise ValueError("router_id must not be empty (replicas tell their messages apart by it)")
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        self.nc = nc
        self.router = router
        self.router_id = router_id
        self.subject = subject
        self.queue_size = queue_size
        self.counters = counters if counters is not None else EventCounters()
        self._sender = OrderedSender(nc, self.counters, "sync", drop_while_down=False, max_queued=queue_size)
        self._remote: dict[str, set[str]] = {}  # origin replica -> its request ids we track
        self._sub: Any = None
        self._handled = 0  # messages taken from the subscription so far
        self._resync_at: int | None = None  # forget every remote request once _handled reaches this

    @property
    def subscription(self) -> Any:
        """The nats.py subscription (for `NatsLink.on_overflow`); None before `start`."""
        return self._sub

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(
            self.subject, cb=self._on_message, pending_msgs_limit=self.queue_size
        )
        await self.nc.flush()  # subscribed when start returns

    async def stop(self) -> None:
        """Tell the others to forget our requests, deliver what is queued, unsubscribe."""
        self._publish({"op": "bye"})
        with contextlib.suppress(Exception):
            await self._sender.flush(timeout_s=2.0)
        await self._sender.stop()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

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
        self._publish(
            {
                "op": "add",
                "id": request_id,
                "worker": worker.worker_id,
                "dp": worker.dp_rank,
                "hashes": list(local_hashes),
                "isl": isl,
                "overlap": overlap,
                "eot": expected_output_tokens,
            }
        )

    def publish_prefill_complete(self, request_id: str) -> None:
        self._publish({"op": "prefill", "id": request_id})

    def publish_freed(self, request_id: str) -> None:
        self._publish({"op": "free", "id": request_id})

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until everything published so far reached the server."""
        await self._sender.flush(timeout_s)

    def _publish(self, message: dict[str, Any]) -> None:
        try:
            payload = msgpack.packb({"v": VERSION, "router": self.router_id, **message}, use_bin_type=True)
        except Exception as exc:
            self.counters.loud("sync.publish_failed", "cannot encode replica sync message: %r", exc)
            return
        self._sender.submit(self.subject, payload)

    # --- applying others' messages ---------------------------------------------------------------

    def forget_replica(self, router_id: str) -> int:
        """Free every request of replica `router_id` (it stopped or died); returns how many."""
        ids = self._remote.pop(router_id, set())
        for key in ids:
            self.router.free(key)
        return len(ids)

    def tracked_remote(self) -> dict[str, int]:
        """In-flight requests per other replica, as this replica tracks them."""
        return {origin: len(ids) for origin, ids in self._remote.items() if ids}

    def overflowed(self) -> None:
        """nats.py dropped a message: the subscription's queue was full. Counted; every remote
        request is forgotten once the messages received before the drop are applied."""
        self.counters.dropped("sync", "*", "queue-full")
        self.counters.loud(
            "sync.queue_full",
            "replica sync messages arrive faster than they are applied (more than %d pending): "
            "dropping, then forgetting the other replicas' requests",
            self.queue_size,
        )
        self._resync_at = self._handled + (self._sub.pending_msgs if self._sub is not None else 0)
        self._maybe_resync()

    def _maybe_resync(self) -> None:
        if self._resync_at is not None and self._handled >= self._resync_at:
            self._resync_at = None
            forgotten = sum(self.forget_replica(origin) for origin in list(self._remote))
            self.counters.add("sync.resync")
            log.warning("replica sync lost messages: forgot %d requests of other replicas", forgotten)

    async def _on_message(self, msg: Msg) -> None:
        self.handle(msg.data)
        self._handled += 1
        self._maybe_resync()

    def handle(self, data: bytes) -> None:
        """Apply one sync message (what the subscription does); never raises."""
        try:
            message = msgpack.unpackb(data, raw=False)
            origin = message["router"]
            op = message["op"]
            if message.get("v") != VERSION or not isinstance(origin, str) or not isinstance(op, str):
                raise ValueError(f"version {message.get('v')!r}, router {origin!r:.40}, op {op!r:.20}")
        except Exception as exc:
            self.counters.loud("sync.malformed", "malformed replica sync message (%r); dropped", exc)
            return
        if origin == self.router_id:
            return
        try:
            self._apply(origin, op, message)
        except Exception as exc:
            self.counters.loud(
                "sync.apply_failed", "replica sync %s from %s not applied: %r", op, origin, exc
            )
            return
        self.counters.add("sync.applied")

    def _apply(self, origin: str, op: str, message: dict[str, Any]) -> None:
        if op == "bye":
            self.forget_replica(origin)
            return
        request_id = message["id"]
        if not isinstance(request_id, str):
            raise TypeError(f"request id {request_id!r:.40} is not a string")
        key = f"{origin}:{request_id}"
        if op == "add":
            worker = Worker(message["worker"], int(message["dp"]))
            hashes = [int(h) for h in message["hashes"]]
            eot = message.get("eot")
            self.router.add_request(
                key,
                worker,
                hashes,
                int(message["isl"]),
                int(message["overlap"]),
                expected_output_tokens=None if eot is None else int(eot),
            )
            self._remote.setdefault(origin, set()).add(key)
        elif op == "prefill":
            self.router.mark_prefill_complete(key)
        elif op == "free":
            self.router.free(key)
            ids = self._remote.get(origin)
            if ids is not None:
                ids.discard(key)
        else:
            raise ValueError(f"unknown op {op!r:.20}")
