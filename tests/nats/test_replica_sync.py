"""Replica sync: router replicas, each with its own NATS connection, see each other's active load."""

import msgpack

from extproc.events.counters import EventCounters
from extproc.events.replica_sync import ReplicaSync, active_sequences_subject

from .conftest import WORKER_IDS, connect, eventually, make_router, prime

SUBJECT = active_sequences_subject("test", "backend")


class Replica:
    def __init__(self, server, router_id: str) -> None:
        self.server = server
        self.router_id = router_id
        self.router = make_router()
        self.count = 0

    async def start(self) -> "Replica":
        self.link = await connect(self.server, self.router_id)
        self.sync = ReplicaSync(self.link.nc, self.router, self.router_id, SUBJECT)
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
