"""Bounded event buffers over NATS (`--event-queue-size`), with a real nats-server.

A publisher in another thread sends a burst while this event loop is blocked (a busy picker: nothing
is read from its sockets). When the loop runs again nats.py hands the subscription at most the
bound of messages and drops the rest as a slow consumer.
- KV events: the pending queue never holds more than the bound, each drop is counted, and the
  loss shows as an event-id gap of the worker, counted; its known blocks are kept (a gap is not a
  restart: the engine still holds them). The events after the burst come from the burst's own
  connection (`ThreadPublisher`): NATS orders messages per publisher only.
- Replica sync: a dropped message may be a free; once the messages before the drop are applied
  the other replicas' requests are forgotten, so no load leaks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import msgpack
import nats

from extproc.devstack.procs import NatsServer
from extproc.events.dynamo_json import encode_event, kv_events_subject
from extproc.events.nats_events import NatsEventSubscriber
from extproc.events.replica_sync import ReplicaSync, active_sequences_subject
from extproc.events.replica_wire import V1
from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker
from tests.events.test_backpressure import RecordingSink, chain_tokens, held_for

from .conftest import BLOCK_SIZE, PROBE_WORKER_BASE, connect, eventually, make_router, prime, prime_events

QUEUE = 51  # --event-queue-size here; odd, so that a run of drops can begin with the free of a queued add
HOLD_TIMEOUT_S = 20.0  # bound on how long the event loop is held while another thread publishes
T = TypeVar("T")


class ThreadPublisher:
    """A NATS connection on an event loop of its own thread. `burst` publishes and flushes while
    blocking the caller's event loop (a busy picker: nothing is read from its sockets); `publish`
    sends later messages on the same connection.

    NATS orders messages per publishing connection only: a worker's later events must come from
    the connection its burst came from. Sent from another connection, a later event overtook the
    burst's last ones (event 2040 delivered between 535 and 536, about once in 50-150 runs with the
    2 cores busy), which the subscriber rightly took as a restarted publisher."""

    def __init__(self, url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="burst-publisher", daemon=True)
        self._thread.start()
        try:
            self._nc = self._wait(nats.connect(url))
        except BaseException:
            self._stop_loop()
            raise

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the publisher's loop, blocking this thread until it is done."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(HOLD_TIMEOUT_S)

    def burst(self, subject: str, payloads: Sequence[bytes]) -> None:
        async def publish_all() -> None:
            for payload in payloads:
                await self._nc.publish(subject, payload)
            await self._nc.flush()

        self._wait(publish_all())

    async def publish(self, subject: str, payload: bytes) -> None:
        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._nc.publish(subject, payload), self._loop)
        )

    def close(self) -> None:
        try:
            self._wait(self._nc.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(HOLD_TIMEOUT_S)
        assert not self._thread.is_alive(), "the publisher thread did not stop"
        self._loop.close()


def stored_event(tokens: list[int], worker: Worker) -> BlocksStored:
    local = compute_block_hashes(tokens, BLOCK_SIZE)
    seq = compute_sequence_hashes(local)
    return BlocksStored(worker, tuple(StoredBlock(s, h) for s, h in zip(seq, local, strict=True)))


def probes_seen(subscriber: NatsEventSubscriber) -> int:
    return sum(1 for w in subscriber.event_ids.workers() if int(w.worker_id) >= PROBE_WORKER_BASE)


async def test_a_nats_burst_beyond_the_bound_is_dropped_counted_and_seen_as_a_gap(
    nats_server: NatsServer,
):
    router = make_router()
    worker = Worker("7")
    subject = kv_events_subject("ns", "backend")
    link, publisher = await connect(nats_server, "picker"), await connect(nats_server, "worker")
    counters = link.counters
    sink = RecordingSink(router)
    subscriber = NatsEventSubscriber(link, sink, subject, counters=counters, queue_size=QUEUE)
    sink.observe = lambda: subscriber.pending
    await subscriber.start()
    burst = ThreadPublisher(nats_server.url)
    try:
        await prime_events(publisher.nc, subject, lambda: probes_seen(subscriber))
        # each chain is stored then removed: a dropped removal would leave blocks the worker no longer has
        payloads, event_id = [], 0
        for i in range(20 * QUEUE):
            tokens = chain_tokens(i, 2)
            stored = stored_event(tokens, worker)
            removed = BlocksRemoved(worker, tuple(b.engine_hash for b in stored.blocks))
            for event in (stored, removed):
                payloads.append(encode_event(7, event, event_id, 0))
                event_id += 1
        burst.burst(subject, payloads)
        # more events until one gets through (the queue may still be full): a gap shows at the next
        # event that arrives; from the burst's connection, so that they come after it
        tails: list[list[int]] = []

        async def tail(_: int) -> None:
            tails.append(chain_tokens(10_000 + len(tails), 3))
            await burst.publish(
                subject, encode_event(7, stored_event(tails[-1], worker), event_id + len(tails) - 1, 0)
            )

        sent = await prime(tail, lambda: any(held_for(router, t, worker) for t in tails), timeout_s=10)

        def dropped() -> int:
            return counters.drops[("nats", "*", "queue-full")]

        # every event is applied or counted as dropped (a tail event may still be on its way)
        await eventually(lambda: sink.applied[worker] + dropped() == len(payloads) + sent, what="accounting")
        assert dropped() > 0, "no drop: the burst fitted in the bound"
        assert QUEUE // 2 < sink.observed_max <= QUEUE  # the queue filled up to the bound, never beyond
        # the loss shows as event-id gaps of that worker (counted), its known blocks are kept (a gap
        # is not a restart: the engine still holds them); the tail blocks that arrived are there
        seen = " ".join(f"{k}={v}" for k, v in sorted(counters.snapshot().items()))
        assert counters.drops[("nats", "7", "event-id-gap")] > 0 and not sink.resets, seen
        arrived = [t for t in tails if held_for(router, t, worker) == 3]
        assert arrived and router.indexer.num_blocks(worker) >= 3 * len(arrived)
    finally:
        burst.close()
        await subscriber.stop()
        await link.close()
        await publisher.close()


async def test_dropped_replica_sync_messages_forget_the_other_replicas_requests(nats_server: NatsServer):
    router = make_router()
    subject = active_sequences_subject("ns", "backend")
    link, other = await connect(nats_server, "replica-b"), await connect(nats_server, "replica-a")
    sync = ReplicaSync(link.nc, router, "b", subject, counters=link.counters, queue_size=QUEUE)
    await sync.start()
    unwatch = link.on_overflow(sync.subscription, sync.overflowed)
    w7, w8 = Worker("7"), Worker("8")

    def message(op: str, request_id: str, **fields) -> bytes:
        return msgpack.packb({"v": V1, "router": "a", "op": op, "id": request_id, **fields})

    def add(request_id: str, worker: Worker) -> bytes:
        return message("add", request_id, worker=worker.worker_id, dp=0, hashes=[1, 2], isl=8, overlap=0)

    try:
        warm = await prime(lambda n: other.nc.publish(subject, add(f"warm{n}", w8)), sync.tracked_remote)
        for n in range(warm):
            await other.nc.publish(subject, message("free", f"warm{n}"))
        await eventually(router.is_idle, what="the warm-up requests freed")

        payloads = []
        for i in range(20 * QUEUE):  # every request added then freed: nothing is in flight at the end
            payloads += [add(f"r{i}", w7), message("free", f"r{i}")]
        burst = ThreadPublisher(nats_server.url)
        try:
            burst.burst(subject, payloads)
        finally:
            burst.close()
        # requests on another worker until one gets through (the queue may still be full)
        await prime(
            lambda n: other.nc.publish(subject, add(f"after{n}", w8)),
            lambda: router.sequences.num_requests(w8) > 0,
            timeout_s=10,
        )

        assert link.counters.drops[("sync", "*", "queue-full")] > 0
        assert link.counters["sync.resync"] >= 1
        # no request of the burst leaked: all were freed, whether their free arrived or not
        assert router.sequences.num_requests(w7) == 0
    finally:
        unwatch()
        await sync.stop()
        await link.close()
        await other.close()
