"""Replica sync: router replicas, each with its own NATS connection, see each other's active load."""

import asyncio

import msgpack

from extproc.events.counters import EventCounters
from extproc.events.replica_sync import ReplicaSync, active_sequences_subject

from .conftest import WORKER_IDS, connect, eventually, make_router, prime

SUBJECT = active_sequences_subject("test", "backend")


class Replica:
    def __init__(self, server, router_id: str, **sync_options: float) -> None:
        self.server = server
        self.router_id = router_id
        self.router = make_router()
        self.count = 0
        self.sync_options = sync_options

    async def start(self) -> "Replica":
        self.link = await connect(self.server, self.router_id)
        self.sync = ReplicaSync(self.link.nc, self.router, self.router_id, SUBJECT, **self.sync_options)
        await self.sync.start()
        return self

    async def prime(self, *others: "Replica") -> None:
        """Until the others receive what this replica publishes (see `prime` in conftest)."""
        before = {o.router_id: o.sync.counters["sync.applied"] for o in others}

        async def probe(n: int) -> None:
            message = {"v": 1, "router": f"probe-{self.router_id}", "op": "free", "id": f"probe-{n}"}
            await self.link.nc.publish(SUBJECT, msgpack.packb(message))
            await self.link.nc.flush()

        await prime(probe, lambda: all(o.sync.counters["sync.applied"] > before[o.router_id] for o in others))

    async def stop(self) -> None:
        await self.sync.stop()
        await self.link.close()

    def route(self, tokens: list[int]) -> str:
        """Route a request as the picker does: decide, track, publish."""
        self.count += 1
        request_id = f"req-{self.count}"  # the same ids on every replica: they must not collide
        decision = self.router.best_worker(tokens, request_id=request_id, expected_output_tokens=32)
        self.sync.publish_added(
            request_id,
            decision.worker,
            self.router.block_hashes(tokens),
            len(tokens),
            decision.overlap_blocks,
            expected_output_tokens=32,
        )
        return request_id

    def first_token(self, request_id: str) -> None:
        self.router.mark_prefill_complete(request_id)
        self.sync.publish_prefill_complete(request_id)

    def finish(self, request_id: str) -> None:
        self.router.free(request_id)
        self.sync.publish_freed(request_id)

    def load(self) -> dict:
        seqs = self.router.sequences
        return {w: (seqs.prefill_tokens(w), seqs.decode_blocks(w)) for w in self.router.workers()}


def same_load(*replicas: Replica) -> bool:
    loads = [r.load() for r in replicas]
    return all(load == loads[0] for load in loads)


def idle(load: dict) -> bool:
    return all(prefill == 0 and abs(decode) < 1e-9 for prefill, decode in load.values())


async def primed(*replicas: Replica) -> None:
    for r in replicas:
        await r.prime(*(o for o in replicas if o is not r))


async def test_two_replicas_report_the_same_load_and_return_to_zero(nats_server):
    a = await Replica(nats_server, "router-a").start()
    b = await Replica(nats_server, "router-b").start()
    try:
        await primed(a, b)
        a_ids = [a.route(list(range(i * 50, i * 50 + 10 + i))) for i in range(4)]
        b_ids = [b.route(list(range(i * 70, i * 70 + 13))) for i in range(3)]
        await eventually(lambda: same_load(a, b), what=lambda: f"{a.load()} vs {b.load()}")
        assert not idle(a.load())
        total_prefill = sum(p for p, _ in a.load().values())
        assert total_prefill == sum(10 + i for i in range(4)) + 3 * 13  # nothing cached: whole prompts
        assert a.sync.tracked_remote() == {"router-b": 3} and b.sync.tracked_remote() == {"router-a": 4}

        for rid in a_ids:
            a.first_token(rid)
        await eventually(lambda: same_load(a, b), what=lambda: f"{a.load()} vs {b.load()}")
        assert sum(p for p, _ in b.load().values()) == 3 * 13  # only b's prompts still prefill

        for rid in a_ids:
            a.finish(rid)
        for rid in b_ids:
            b.finish(rid)
        await eventually(lambda: a.router.is_idle() and b.router.is_idle(), what="both idle")
        assert idle(a.load()) and idle(b.load())
        assert a.sync.counters["sync.publish_failed"] == 0
    finally:
        await a.stop()
        await b.stop()


async def test_a_late_replica_learns_the_requests_in_flight_at_once(nats_server):
    a = await Replica(nats_server, "router-a").start()
    b = await Replica(nats_server, "router-b").start()
    late = None
    try:
        await primed(a, b)
        early = [a.route(list(range(i * 40, i * 40 + 9))) for i in range(3)]
        early.append(b.route(list(range(500, 517))))
        await eventually(lambda: same_load(a, b))

        # it asks for the others' state at start, or at the first heartbeat it hears (numbered past 1)
        late = await Replica(nats_server, "router-c").start()
        await eventually(lambda: late.sync.tracked_remote() == {"router-a": 3, "router-b": 1}, 5.0,
                         lambda: f"{late.sync.tracked_remote()}")  # fmt: skip
        await eventually(lambda: same_load(a, b, late), what=lambda: f"{a.load()} vs {late.load()}")

        for rid in early[:3]:
            a.finish(rid)
        b.finish(early[3])
        await eventually(lambda: a.router.is_idle() and b.router.is_idle() and late.router.is_idle())
    finally:
        await a.stop()
        await b.stop()
        if late is not None:
            await late.stop()


async def test_a_stopping_replica_takes_its_requests_with_it(nats_server):
    a = await Replica(nats_server, "router-a").start()
    b = await Replica(nats_server, "router-b").start()
    try:
        await primed(a, b)
        a.route(list(range(20)))
        await eventually(lambda: b.sync.tracked_remote() == {"router-a": 1})
        await a.stop()
        await eventually(lambda: b.router.is_idle(), what="b forgot a's request")
    finally:
        await b.stop()


def sync_tasks(router_id: str) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"replica-sync-{router_id}" and not t.done()]


async def test_heartbeats_keep_a_replica_alive_past_many_leases_and_stop_leaves_nothing_running(nats_server):
    fast = {"heartbeat_s": 0.05, "lease_s": 0.25}
    a = await Replica(nats_server, "router-a", **fast).start()
    b = await Replica(nats_server, "router-b", **fast).start()
    try:
        await primed(a, b)
        a.route(list(range(20)))
        await eventually(lambda: b.sync.tracked_remote() == {"router-a": 1})
        heard = b.sync.counters["sync.applied"]
        # 20 heartbeats later (a second, four leases): still tracked, nothing expired
        await eventually(lambda: b.sync.counters["sync.applied"] >= heard + 20, what="20 more heartbeats")
        assert b.sync.tracked_remote() == {"router-a": 1} and b.sync.counters["sync.lease_expired"] == 0
        assert a.sync.counters["sync.published"] >= 20 and sync_tasks("router-a")
        await a.sync.stop()
        assert not sync_tasks("router-a") and a.sync.subscription is None
        await a.sync.stop()  # again: nothing more to do, nothing raised
        await eventually(lambda: b.router.is_idle(), what="b forgot a's request")
        await a.link.close()
    finally:
        await b.stop()


async def test_a_replica_whose_connection_closed_first_still_stops_cleanly(nats_server):
    a = await Replica(nats_server, "router-a").start()
    await a.link.close()
    await a.sync.stop()  # its bye and its unsubscribe cannot go out: nothing raised
    assert not sync_tasks("router-a") and a.sync.subscription is None


async def test_a_replica_stopped_before_it_started_only_says_goodbye(nats_server):
    link = await connect(nats_server, "early")
    try:
        sync = ReplicaSync(link.nc, make_router(), "early", SUBJECT)
        await sync.catch_up()  # before start: nothing to catch up with
        await sync.stop()
        counts = sync.counters.snapshot()
        assert counts.get("sync.published") == 1 and "sync.catch_up_error" not in counts
    finally:
        await link.close()


def test_bad_and_own_messages_are_ignored():
    router = make_router()
    sync = ReplicaSync(None, router, "me", SUBJECT, counters=EventCounters())  # handle() needs no connection
    own = {"v": 1, "router": "me", "op": "add", "id": "x", "worker": WORKER_IDS[0], "dp": 0}
    sync.handle(msgpack.packb({**own, "hashes": [1], "isl": 4, "overlap": 0, "eot": None}))
    assert router.is_idle()
    for bad in (b"\xc1", msgpack.packb([1]), msgpack.packb({"v": 2, "router": "x", "op": "free", "id": "a"})):
        sync.handle(bad)
    sync.handle(msgpack.packb({"v": 1, "router": "other", "op": "teleport", "id": "a"}))
    assert sync.counters["sync.malformed"] == 3 and sync.counters["sync.apply_failed"] == 1
    sync.handle(msgpack.packb({"v": 1, "router": "other", "op": "free", "id": "never-seen"}))
    assert sync.counters["sync.applied"] == 1 and router.is_idle()
