"""Three picker replicas (`python -m extproc serve --router-replica-sync`, child processes) and a real
nats-server under faults, with traffic: NATS stopped by pid for 1, 3 and 5 s and restarted on its
port, a replica SIGKILLed and started again (under a new id: `host-pid`), a worker flapping in one
replica's DNS discovery (a real DNS server, tests/k8s/dns_server.py) while the others keep it.

Traffic is ext_proc streams the test opens to the replicas (as Envoy would; the same faults with a
real Envoy in front: tests/e2e/test_replicas_under_faults_e2e.py): each stream is routed and held open, a
request in flight until the test cancels it (Envoy's reset, which frees it). After each fault and
at the end, every replica's load per worker (`/debug/workers`: `active_requests`) must equal the
streams really open, and be zero once traffic ends, polled with a bound.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
import pytest_asyncio
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from extproc.devstack.procs import NatsServer

from ..picker_fixtures import chat_body, request_body, request_headers
from ..replica_helpers import FLAPPY, STABLE, FlappingZone, ServeReplica, dns_server, views_match
from .conftest import eventually

MODEL = "demo-model"
PORT = 8000
ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
WORKER_IDS = tuple(f"{a}:{PORT}" for a in ADDRESSES)  # what DNS discovery names them
FLAPPING = WORKER_IDS[2]
HEARTBEAT_S, LEASE_S = 0.25, 1.5
pytestmark = pytest.mark.asyncio


@pytest.fixture
def dns(tmp_path: Path) -> Iterator[tuple[FlappingZone, int]]:
    zone = FlappingZone(tmp_path / "zone.json", ADDRESSES)
    with dns_server(zone.path, tmp_path / "dns.log") as port:
        yield zone, port


class Replica(ServeReplica):
    """A `serve` replica (ports 0, a new id at each start) and the ext_proc streams held on it."""

    def __init__(self, name: str, tmp: Path, nats_url: str, dns_port: int, *, flapping: bool) -> None:
        super().__init__(
            name, tmp, model=MODEL, nats_url=nats_url, namespace="chaos", dns_port=dns_port,
            dns_name=FLAPPY if flapping else STABLE, worker_port=PORT, heartbeat_s=HEARTBEAT_S,
            lease_s=LEASE_S,
        )  # fmt: skip
        self.channel: grpc.aio.Channel | None = None
        self.open: dict[int, tuple[grpc.aio.StreamStreamCall, str]] = {}  # stream -> (call, worker)
        self.paused = False  # no new traffic through it

    async def start(self) -> None:
        await super().start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.ports['port']}")

    async def crash(self) -> None:
        """SIGKILL: its streams break, their requests are no longer in flight anywhere."""
        self.kill()
        self.open.clear()
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    async def close(self) -> None:
        for call, _ in self.open.values():
            call.cancel()
        self.open.clear()
        if self.channel is not None:
            await self.channel.close()
        self.stop()

    async def route(self, n: int) -> None:
        """Open an ext_proc stream, send a chat request, keep the stream once it is routed."""
        assert self.channel is not None
        call = ext_grpc.ExternalProcessorStub(self.channel).Process()
        await call.write(request_headers())
        await call.write(request_body(chat_body(f"{self.name} request {n} " + "words " * 40)))
        answer = await asyncio.wait_for(call.read(), 5.0)  # request headers: go on
        assert answer.WhichOneof("response") == "request_headers", answer
        answer = await asyncio.wait_for(call.read(), 5.0)  # the body: routed
        headers = {h.header.key: h.header.raw_value.decode() for h in
                   answer.request_body.response.header_mutation.set_headers}  # fmt: skip
        worker = headers.get("x-gateway-destination-endpoint")
        assert worker in WORKER_IDS, answer
        self.open[n] = (call, worker)

    def finish(self, n: int) -> None:
        call, _ = self.open.pop(n)
        call.cancel()  # Envoy resets the stream: the picker frees the request


@pytest_asyncio.fixture
async def group(tmp_path, nats_server: NatsServer, dns) -> AsyncIterator[list[Replica]]:
    _, dns_port = dns
    replicas = [Replica(n, tmp_path, nats_server.url, dns_port, flapping=n == "c") for n in ("a", "b", "c")]
    try:
        await asyncio.gather(*(r.start() for r in replicas))
        yield replicas
    finally:
        for r in replicas:
            await r.close()


def truth(replicas: list[Replica]) -> dict[str, int]:
    counts = dict.fromkeys(WORKER_IDS, 0)
    for r in replicas:
        for _, worker in r.open.values():
            counts[worker] += 1
    return counts


async def all_views_match(replicas: list[Replica], http: aiohttp.ClientSession, timeout_s: float,
                          what: str) -> float:  # fmt: skip
    """Poll until every live replica's view equals the streams open; returns how long it took."""
    return await views_match(replicas, http, lambda: truth(replicas), timeout_s, what)


async def test_every_replicas_load_equals_the_requests_in_flight_through_nats_restarts_a_kill_and_a_flap(
    group, nats_server, restart_nats, dns
):
    zone, _ = dns
    rng = random.Random(20)
    a, b, c = group
    figures: dict[str, float] = {}
    counter = iter(range(1_000_000))
    stop = asyncio.Event()

    async def traffic(replica: Replica) -> None:
        while not stop.is_set():
            if replica.channel is None or replica.paused:
                await asyncio.sleep(0.05)  # dead or paused: nothing to send
                continue
            try:
                if len(replica.open) < 8:
                    await replica.route(next(counter))
                if replica.open and rng.random() < 0.4:
                    replica.finish(rng.choice(list(replica.open)))
            except (TimeoutError, grpc.aio.AioRpcError):
                pass  # a replica being killed
            await asyncio.sleep(0.02)  # pacing, not synchronisation

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        await eventually(lambda: all_seen(group, http), 20.0, "every replica discovered the workers")
        tasks = [asyncio.create_task(traffic(r)) for r in group]
        server = nats_server
        try:
            for outage_s in (1.0, 3.0, 5.0):
                server.stop()  # by pid
                await asyncio.sleep(outage_s)  # the outage, traffic going on (frees included)
                server = restart_nats(nats_server.port)
                await asyncio.sleep(0.5)  # traffic after the restart
                stop.set()
                await asyncio.gather(*tasks)
                what = f"after a {outage_s} s NATS restart"
                figures[f"nats {outage_s:.0f} s"] = await all_views_match(group, http, 15.0, what)
                stop.clear()
                tasks = [asyncio.create_task(traffic(r)) for r in group]

            await b.crash()  # SIGKILL, under traffic
            await asyncio.sleep(0.5)  # traffic after the kill; the loads are polled below
            stop.set()
            await asyncio.gather(*tasks)
            figures["kill"] = await all_views_match([a, c], http, 3 * LEASE_S + 2, "after b was SIGKILLed")
            await b.start()  # a new process: a new default id
            stop.clear()
            tasks = [asyncio.create_task(traffic(r)) for r in group]

            c.paused = True  # c sends nothing meanwhile, so what it forgets is known exactly
            zone.set(flapping_present=False)  # c's discovery loses a worker the others keep
            await eventually(lambda: c.knows(http, 2), 10.0, "c dropped the flapping worker")
            for n in [n for n, (_, w) in c.open.items() if w == FLAPPING]:
                c.finish(n)  # c forgot these (and told the others): they are in flight nowhere now
            await asyncio.sleep(0.5)  # a and b keep routing to the flapping worker
            zone.set(flapping_present=True)
            await eventually(lambda: c.knows(http, 3), 10.0, "c has the flapping worker back")
            c.paused = False
            await asyncio.sleep(0.5)  # traffic after the worker's return; the loads are polled below
            stop.set()
            await asyncio.gather(*tasks)
            figures["flap"] = await all_views_match(group, http, 10.0, "after the flap")

            for r in group:
                for n in list(r.open):
                    r.finish(n)
            figures["end"] = await all_views_match(group, http, 10.0, "after traffic ended")
            assert truth(group) == dict.fromkeys(WORKER_IDS, 0)
            counters = [await r.counters(http) for r in group]
            assert sum(c.get("sync.lease_expired", 0) for c in counters) >= 2  # a and c forgot b
            print("replica views converged (s):", {k: round(v, 2) for k, v in figures.items()})
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def all_seen(group: list[Replica], http: aiohttp.ClientSession) -> bool:
    return all([await r.knows(http, len(WORKER_IDS)) for r in group])
