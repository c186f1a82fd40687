"""Replicas for replica sync's message-by-message tests, without NATS.

Each `Node` is one replica: a router, its `ReplicaSync` and a `Wire` that keeps what it publishes
for the test to deliver by hand (or lose, or deliver twice). Its clock is the number `node.now`;
`handle` and `tick` are also given times, so sequence gaps, digests, state parts, leases and
batches are checked exactly, with no sleep. Used by test_replica_sync_protocol.py,
test_replica_sync_batch.py and test_replica_sync_edges.py.
"""

from __future__ import annotations

from collections.abc import Collection

import msgpack

from extproc.events.counters import EventCounters
from extproc.events.replica_sync import (
    DEFAULT_BATCH_S,
    ReplicaSync,
    RouteSink,
    active_sequences_subject,
)
from extproc.router import Worker

from .conftest import make_router

SUBJECT = active_sequences_subject("test", "backend")
W7, W8 = Worker("7"), Worker("8")
HEARTBEAT_S, LEASE_S = 1.0, 5.0


class Wire:
    """Stands in for the publishing queue: keeps every payload for the test to deliver (what goes
    to another subject, a replica's inbox, in `replies`)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.replies: list[tuple[str, bytes]] = []

    def submit(self, subject: str, payload: bytes) -> None:
        if subject == SUBJECT:
            self.sent.append(payload)
        else:
            self.replies.append((subject, payload))

    def take(self) -> list[bytes]:
        out, self.sent = self.sent, []
        return out

    async def flush(self, timeout_s: float) -> None:
        pass  # nothing queued: every payload is kept at once

    async def stop(self) -> None:
        pass

    def ops(self) -> list[str]:
        return [msgpack.unpackb(p)["op"] for p in self.sent]

    def messages(self) -> list[dict]:
        return [msgpack.unpackb(p) for p in self.sent]


class Node:
    """One replica: a router, its ReplicaSync and its outgoing wire."""

    def __init__(
        self,
        name: str,
        *workers: str,
        boot: int = 1,
        batch_s: float = DEFAULT_BATCH_S,
        heartbeat_s: float = HEARTBEAT_S,
        lease_s: float = LEASE_S,
        routes: RouteSink | None = None,
        inbox: bool = False,
    ) -> None:
        self.name = name
        self.now = 0.0  # what the sync's clock says (handle and tick are also given times)
        self.router = make_router(*workers)
        self.counters = EventCounters()
        self.sync = ReplicaSync(
            None,  # type: ignore[arg-type]  # nothing goes through a connection here
            self.router,
            name,
            SUBJECT,
            counters=self.counters,
            heartbeat_s=heartbeat_s,
            lease_s=lease_s,
            clock=lambda: self.now,
            boot=boot,
            batch_s=batch_s,
            routes=routes,
        )
        self.wire = Wire()
        self.sync._sender = self.wire  # type: ignore[assignment]
        if inbox:  # what start() subscribes to: answers to its want_routes come there
            self.sync._inbox = f"_INBOX.{name}"
        self.count = 0

    def route(self, worker: Worker = W7, n_tokens: int = 9) -> str:
        self.count += 1
        request_id = f"req-{self.count}"
        tokens = list(range(self.count * 100, self.count * 100 + n_tokens))
        hashes = self.router.block_hashes(tokens)
        self.router.add_request(request_id, worker, hashes, n_tokens, 0, expected_output_tokens=8)
        self.sync.publish_added(request_id, worker, hashes, n_tokens, 0, 8)
        return request_id

    def finish(self, request_id: str) -> None:
        self.router.free(request_id)
        self.sync.publish_freed(request_id)

    def deliver(
        self, *others: Node, now: float = 0.0, lose: Collection[int] = (), twice: Collection[int] = ()
    ) -> None:
        """Hand what this replica sent to the others (the message numbers in `lose` are lost, those
        in `twice` arrive twice)."""
        for i, payload in enumerate(self.wire.take()):
            if i in lose:
                continue
            for _ in range(2 if i in twice else 1):
                for other in others:
                    other.sync.handle(payload, now=now)

    def hears(self, other: Node) -> None:
        """`other`'s heartbeat reaches this replica (which then knows whether it reads batches)."""
        other.sync.tick(0.0)
        other.deliver(self)
        other.sync._next_heartbeat = 0.0  # the next tick heartbeats again

    def load(self) -> dict[Worker, tuple[int, float]]:
        seqs = self.router.sequences
        return {w: (seqs.prefill_tokens(w), seqs.decode_blocks(w)) for w in self.router.workers()}

    def view(self) -> tuple[dict[Worker, tuple[int, float]], set[tuple[str, str, object]]]:
        """The load its router counts and every remote request it tracks (records included)."""
        remote = {(origin, request_id, (r.worker, r.hashes, r.isl, r.overlap, r.eot, r.prefilled))
                  for origin, request_id, r in self.sync.remote_requests()}  # fmt: skip
        return self.load(), remote


def exchange(*nodes: Node, now: float = 0.0, rounds: int = 4) -> None:
    """Deliver everything everybody sends, answers included, until the wires are quiet."""
    for _ in range(rounds):
        for node in nodes:
            node.deliver(*(o for o in nodes if o is not node), now=now)


def started(*names: str) -> list[Node]:
    """Replicas that started at -1 s and exchanged their states: at 0 s everything is quiet."""
    nodes = [Node(name) for name in names]
    for node in nodes:
        node.now = -1.0
        node.sync._want_all("test start")
    exchange(*nodes, now=-1.0)
    for node in nodes:
        node.sync.tick(-0.5)  # first heartbeats (the next at 0.5 s), the states asked for at start
    exchange(*nodes, now=-0.5)
    for node in nodes:
        node.now = 0.0
    return nodes
