"""Issue 20's replica-sync findings, one test each: three in-process pickers (the picker and its
event sources, as `serve` wires them) share their in-flight requests over a real nats-server.

- A NATS restart during traffic leaves no phantom request on any replica (before: 17-66 on two of
  three, forever: what one replica flushed after its reconnect never reached the ones back later).
- A worker that vanishes from one replica's discovery: the requests that replica forgets are freed
  on the others too, and the others' requests on it count again when it comes back (before: 23
  phantoms on the others, and holes in the view of the replica that lost it).
- A replica that dies without a word (no bye): its requests leave the others' load once its lease
  runs out, also when it comes back under a new id (before: counted forever).

"Requests really in flight" are the picks a test holds open; every replica's per-worker request
count must equal them, and all replicas' loads must agree. Conditions are polled with a bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from extproc.config import DisaggConfig, EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.events.sources import EventSources, start_event_sources
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.router import RouterConfig, Worker

from .conftest import eventually

MODEL = "demo-model"
WORKERS = tuple(WorkerConfig(f"w{i}", f"127.0.0.{i + 1}:8000", MODEL) for i in range(3))
HEARTBEAT_S, LEASE_S = 0.2, 1.0


@dataclass
class Replica:
    name: str
    picker: EndpointPicker
    sources: EventSources
    held: list[Pick] = field(default_factory=list)  # requests in flight through this replica
    count: int = 0

    @property
    def router(self):
        return self.picker.pools[MODEL].router

    async def route(self, worker: str | None = None, words: int = 30) -> Pick:
        self.count += 1
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{self.name} {self.count} " * words}],
        }
        subset = None if worker is None else [next(w.endpoint for w in WORKERS if w.id == worker)]
        pick = await self.picker.pick(
            body=json.dumps(body).encode(), path="/v1/chat/completions", headers={}, subset=subset,
            client_request_id=f"r{self.count}",
        )  # fmt: skip
        self.held.append(pick)
        return pick

    def finish(self, pick: Pick) -> None:
        self.held.remove(pick)
        self.picker.finish(pick, "done")

    def finish_all(self) -> None:
        for pick in list(self.held):
            self.finish(pick)

    def requests(self) -> dict[str, int]:
        seqs = self.router.sequences
        return {str(w.worker_id): seqs.num_requests(w) for w in self.router.workers()}

    def load(self) -> dict[Worker, tuple[int, float]]:
        seqs = self.router.sequences
        return {w: (seqs.prefill_tokens(w), round(seqs.decode_blocks(w), 6)) for w in self.router.workers()}


def config(nats_url: str, name: str) -> PickerConfig:
    return PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=WORKERS,
        models=(ModelConfig(MODEL),),
        max_body_bytes=1 << 20,
        seed=1,
        events=EventsConfig(
            nats_url=nats_url, namespace="test", replica_sync=True, router_id=name,
            replica_sync_heartbeat_s=HEARTBEAT_S, replica_sync_lease_s=LEASE_S,
        ),
    )  # fmt: skip


async def start_replica(nats_url: str, name: str) -> Replica:
    cfg = config(nats_url, name)
    picker = EndpointPicker(cfg)
    return Replica(name, picker, await start_event_sources(cfg, picker))


async def stop_replica(replica: Replica) -> None:
    await replica.sources.stop()
    await replica.picker.close()


@asynccontextmanager
async def replicas(nats_url: str, *names: str) -> AsyncIterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for name in names:
            started.append(await start_replica(nats_url, name))
        await primed(started)
        yield started
    finally:
        for replica in started:
            await stop_replica(replica)


async def primed(group: list[Replica]) -> None:
    """Until every replica hears every other (nats-server may drop the first messages after a
    subscription: nats-io/nats-server#5677): one request each, seen by all, then freed."""
    for replica in group:
        await replica.route()
    await eventually(views_match_truth(*group), 10.0, describe(*group))
    for replica in group:
        replica.finish_all()
    await eventually(lambda: all(r.router.is_idle() for r in group), 10.0, describe(*group))


def truth(*replicas: Replica) -> dict[str, int]:
    """Requests really in flight per worker: the picks the test holds."""
    counts = {w.id: 0 for w in WORKERS}
    for replica in replicas:
        for pick in replica.held:
            counts[str(pick.worker.worker_id)] += 1
    return counts


def views_match_truth(*replicas: Replica) -> Callable[[], bool]:
    def check() -> bool:
        real = truth(*replicas)
        loads = [r.load() for r in replicas]
        return all(r.requests() == real for r in replicas) and all(load == loads[0] for load in loads)

    return check


def describe(*replicas: Replica) -> Callable[[], str]:
    return lambda: f"truth {truth(*replicas)}; " + "; ".join(f"{r.name} {r.requests()}" for r in replicas)


async def test_a_nats_restart_during_traffic_leaves_no_phantom_request(nats_server, restart_nats):
    rng = random.Random(20)
    restarted = None
    async with replicas(nats_server.url, "a", "b", "c") as group:
        stop = asyncio.Event()

        async def traffic(replica: Replica) -> None:
            while not stop.is_set():
                if len(replica.held) < 12:
                    await replica.route()
                if replica.held and rng.random() < 0.45:
                    replica.finish(rng.choice(replica.held))
                await asyncio.sleep(0.01)  # pacing, not synchronisation

        tasks = [asyncio.create_task(traffic(r)) for r in group]
        try:
            await eventually(lambda: sum(r.count for r in group) > 60, 10.0, "traffic flows")
            os.kill(nats_server.pid, signal.SIGKILL)
            nats_server.stop()  # reaps it
            await asyncio.sleep(2.5)  # the outage: traffic goes on meanwhile (frees included)
            restarted = restart_nats(nats_server.port)
            await eventually(lambda: all(r.sources.nats.up for r in group), 15.0, "every replica reconnected")
            await asyncio.sleep(0.5)  # more traffic after the reconnects
            stop.set()
            await asyncio.gather(*tasks)
            await eventually(views_match_truth(*group), 10.0, describe(*group))
            assert sum(r.sources.counters["sync.resync"] for r in group) >= 1
            for replica in group:
                replica.finish_all()
            await eventually(lambda: all(r.router.is_idle() for r in group), 10.0, describe(*group))
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if restarted is not None:
        restarted.stop()


async def test_a_worker_gone_from_one_replicas_discovery_leaves_no_phantom_and_counts_again_when_back(
    nats_server,
):
    async with replicas(nats_server.url, "a", "b", "c") as group:
        a, b, c = group
        for _ in range(3):
            await c.route("w1")  # c's requests on the worker that flaps in c's discovery
            await a.route("w1")  # a's requests there, which c must count again when it is back
            await b.route("w0")
        await eventually(views_match_truth(*group), 5.0, describe(*group))

        c.picker.set_workers(MODEL, [w for w in WORKERS if w.id != "w1"])  # a DNS answer without w1
        assert "w1" not in c.requests()
        # c forgot its 3 requests on w1: the others forget them too, at once
        await eventually(lambda: a.requests()["w1"] == b.requests()["w1"] == 3, 5.0, describe(*group))

        c.picker.set_workers(MODEL, list(WORKERS))  # w1 is back in c's discovery
        for pick in [p for p in c.held if str(p.worker.worker_id) == "w1"]:
            c.held.remove(pick)  # c no longer tracks them: their streams end unseen
            c.picker.finish(pick, "done")
        assert c.requests()["w1"] == 3  # a's requests on w1 count again on c
        await eventually(views_match_truth(*group), 5.0, describe(*group))

        for replica in group:
            replica.finish_all()
        await eventually(lambda: all(r.router.is_idle() for r in group), 5.0, describe(*group))


async def test_a_replica_that_dies_without_a_word_leaves_the_others_load_when_its_lease_runs_out(
    nats_server,
):
    async with replicas(nats_server.url, "a", "b") as (a, b):
        dead = await start_replica(nats_server.url, "doomed")
        try:
            await primed([a, b, dead])
            for _ in range(4):
                await dead.route()
            await eventually(lambda: sum(a.requests().values()) == sum(b.requests().values()) == 4, 5.0,
                             describe(a, b))  # fmt: skip
            await dead.sources.nats.nc.close()  # a crash: the connection cut, no bye, no heartbeat
            await eventually(lambda: a.router.is_idle() and b.router.is_idle(), 4 * LEASE_S, describe(a, b))
            assert a.sources.counters["sync.lease_expired"] == b.sources.counters["sync.lease_expired"] == 1

            again = await start_replica(nats_server.url, "doomed-2")  # back under a new id
            try:
                await again.route()
                await eventually(views_match_truth(a, b, again), 5.0, describe(a, b, again))
                again.finish_all()
                await eventually(lambda: a.router.is_idle() and b.router.is_idle(), 5.0, describe(a, b))
            finally:
                await stop_replica(again)
        finally:
            dead.held.clear()
            await stop_replica(dead)


class Freed:
    """A route listener (as replica sync's) that records the requests it hears freed."""

    def __init__(self) -> None:
        self.freed: list[str] = []

    def on_routed(self, routed, local_hashes, isl, expected_output_tokens) -> None:
        pass

    def on_prefill_complete(self, routed) -> None:
        pass

    def on_freed(self, routed) -> None:
        self.freed.append(routed.request_id)


async def test_a_removed_prefill_worker_leaves_its_requests_on_their_decode_worker_freed_once():
    decode = tuple(replace(w, role="decode") for w in WORKERS[:2])
    prefill = WorkerConfig("p0", "127.0.0.9:8009", MODEL, role="prefill")
    cfg = replace(config("nats://unused", "a"), workers=(*decode, prefill),
                  disagg=DisaggConfig(prefill_health_interval_s=0.0), events=EventsConfig())  # fmt: skip
    picker = EndpointPicker(cfg)
    heard = Freed()
    picker.listeners.append(heard)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a long prompt to prefill " * 80}]}
    chosen = await picker.pick(body=json.dumps(body).encode(), path="/v1/chat/completions", headers={},
                               subset=None, client_request_id="r")  # fmt: skip
    assert chosen.prefill_worker is not None
    picker.set_workers(MODEL, list(decode))  # p0 left discovery: only the prefill share goes
    assert heard.freed == [] and not picker.pools[MODEL].router.is_idle()
    picker.finish(chosen, "done")
    assert heard.freed == [chosen.request_id] and picker.is_idle()  # before: the decode load leaked
    await picker.close()
