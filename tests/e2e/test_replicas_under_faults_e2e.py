"""Three picker replicas behind a real Envoy, sharing their load over a real NATS, under faults
(issue 20, "How it is shown").

Three `python -m extproc serve --router-replica-sync` replicas (heartbeat 0.25 s, lease 1.5 s, each
on ports held for the test) find three echo workers (127.0.0.1-3, one port) in a real DNS server
(tests/k8s/dns_server.py); one Envoy (`buffered`) lists the replicas in its endpoint_picker cluster
with the gRPC health checks, outlier detection and ext_proc retry of our configs. Clients send
requests through Envoy that the workers hold until the test releases them (`?hold=K`), so the test
knows every request in flight and its worker. Faults, one after another, under that traffic:

- nats-server stopped by pid for 1 and 5 s and started again on its port (the 3 s outage between
  them is tests/nats/test_replica_sync_chaos.py's, without Envoy);
- a replica SIGKILLed (Envoy takes it out through its health checks), then started again on the
  same ports (Envoy takes it back in);
- a worker gone from one replica's DNS view only, while the others keep routing to it, then back.

After each fault and at the end, once the clients stopped sending, every live replica's load per
worker (`/debug/workers`: `active_requests`) must equal the requests the workers hold for clients
still waiting (zero at the end), polled with a bound. The clients' answers are all 200 except 503
`picker-unavailable` between the SIGKILL and Envoy's detection time (the requests in flight on the
killed replica, whose ext_proc stream was answered and cannot be retried). Figures are printed and
written down in docs/reliability.md ("Shared load across replicas").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.devstack.envoy_config import PickerHealth
from extproc.devstack.procs import PortReservation, reserve_port
from extproc.devstack.stack import MODEL

from ..replica_helpers import (
    FLAPPY,
    STABLE,
    FlappingZone,
    RestartableNats,
    ServeReplica,
    Traffic,
    detection_s,
    dns_server,
    envoy_counter,
    picker_hosts,
    seconds,
    until,
    views_match,
    within,
)
from .harness import EchoWorker, EnvoyUnderTest, start_envoy_variant

pytestmark = pytest.mark.asyncio

ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")  # the workers, one port for all (DNS gives none)
HEALTH = PickerHealth()  # our configs' defaults: checks every 1 s, out after 2 failures, back after 1
DETECTION_S = detection_s(HEALTH)
HEARTBEAT_S, LEASE_S = 0.25, 1.5
MAX_OPEN = 10  # requests held at once
MAX_REQUESTS = 1_000  # a bound on the whole test's traffic (it sends about 220)
PACE_S = 0.03  # between the clients' steps: pacing, not synchronisation
RELEASE_P = 0.4  # each step releases one held request with this probability
HOLD_S = 60.0  # the workers' bound on a held request (the test releases them all far sooner)
TIMEOUT = aiohttp.ClientTimeout(total=60)


@pytest_asyncio.fixture
async def workers() -> AsyncIterator[list[EchoWorker]]:
    """Echo workers on 127.0.0.1, .2 and .3, all on the port the first one was given."""
    started: list[EchoWorker] = []
    for _ in range(5):  # another process may hold that port on .2 or .3: try another
        try:
            started.append(await EchoWorker(ADDRESSES[0], 0, HOLD_S).start())
            for address in ADDRESSES[1:]:
                started.append(await EchoWorker(address, started[0].port, HOLD_S).start())
            break
        except OSError:
            for worker in started:
                await worker.stop()
            started.clear()
    assert len(started) == len(ADDRESSES), "no port free on every worker address"
    try:
        yield started
    finally:
        for worker in started:
            for key in list(worker.holding):
                worker.release(key)  # also those of clients Envoy answered (their picker died)
        for worker in started:
            await worker.stop()


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[RestartableNats]:
    server = RestartableNats(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def dns(tmp_path: Path) -> Iterator[tuple[FlappingZone, int]]:
    zone = FlappingZone(tmp_path / "zone.json", ADDRESSES)
    with dns_server(zone.path, tmp_path / "dns.log") as port:
        yield zone, port


@pytest.fixture
def held_ports() -> Iterator[list[dict[str, int]]]:
    """Each replica's ext_proc, health and admin ports, held for the test so that a restarted
    replica binds the same ones (where Envoy's cluster lists it)."""
    reservations: list[PortReservation] = []
    ports = []
    try:
        for _ in range(3):
            reservations += [reserve_port() for _ in range(3)]
            port, health, admin = (r.port for r in reservations[-3:])
            ports.append({"port": port, "health_port": health, "admin_port": admin})
        yield ports
    finally:
        for reservation in reservations:
            reservation.release()


@pytest_asyncio.fixture
async def replicas(tmp_path, nats, dns, workers, held_ports) -> AsyncIterator[list[ServeReplica]]:
    """a, b and c; c discovers its workers under the flapping name."""
    _, dns_port = dns
    group = [
        ServeReplica(
            name,
            tmp_path,
            model=MODEL,
            nats_url=nats.url,
            namespace="faults",
            dns_port=dns_port,
            dns_name=FLAPPY if name == "c" else STABLE,
            worker_port=workers[0].port,
            heartbeat_s=HEARTBEAT_S,
            lease_s=LEASE_S,
            ports=ports,
        )
        for name, ports in zip("abc", held_ports, strict=True)
    ]
    try:
        await asyncio.gather(*(r.start() for r in group))
        yield group
    finally:
        for r in group:
            r.stop()


@pytest.fixture
def envoy(held_ports: list[dict[str, int]], tmp_path: Path) -> Iterator[EnvoyUnderTest]:
    started = start_envoy_variant(
        "buffered",
        picker_address=[f"127.0.0.1:{p['port']}" for p in held_ports],
        picker_health_port=[p["health_port"] for p in held_ports],
        picker_health=HEALTH,
        workers=[],
        log_dir=tmp_path,
    )
    yield started
    started.stop()


class Clients:
    """Requests through Envoy that the workers hold until the test releases them: the test knows
    which are in flight, and on which worker."""

    def __init__(self, traffic: Traffic, workers: list[EchoWorker]) -> None:
        self.traffic = traffic
        self.workers = workers
        self.requests: dict[str, asyncio.Future] = {}  # key -> the client's answer
        self._keys = (f"r{n}" for n in itertools.count())
        self._rng = random.Random(20)

    def open(self) -> None:
        key = next(self._keys)
        body = json.dumps({"model": MODEL, "prompt": f"request {key} " + "words " * 40, "max_tokens": 1})
        self.requests[key] = asyncio.ensure_future(self._send(key, body.encode()))

    async def _send(self, key: str, body: bytes) -> None:
        self.traffic.answers.append(await self.traffic.send(f"?hold={key}", body))

    def waiting(self) -> list[str]:
        """Requests whose client has no answer yet."""
        return [key for key, answer in self.requests.items() if not answer.done()]

    def in_flight(self) -> dict[str, str]:
        """Requests a worker holds for a client still waiting -> that worker (as discovery names it)."""
        holders = {key: w.address for w in self.workers for key in w.holding}
        return {key: holders[key] for key in self.waiting() if key in holders}

    def truth(self) -> dict[str, int]:
        counts = dict.fromkeys((w.address for w in self.workers), 0)
        for worker in self.in_flight().values():
            counts[worker] += 1
        return counts

    def release(self, key: str) -> None:
        for worker in self.workers:
            if key in worker.holding:
                worker.release(key)

    def settled(self) -> bool:
        """Every request sent is held by a worker or answered (none between Envoy and a worker)."""
        return len(self.in_flight()) == len(self.waiting())

    async def step(self, keep: str | None) -> None:
        """Open a request (up to MAX_OPEN), release one now and then (not one held by `keep`)."""
        if len(self.waiting()) < MAX_OPEN and len(self.requests) < MAX_REQUESTS:
            self.open()
        held = [key for key, worker in self.in_flight().items() if worker != keep]
        if held and self._rng.random() < RELEASE_P:
            self.release(self._rng.choice(held))

    @asynccontextmanager
    async def running(self, keep: str | None = None) -> AsyncIterator[None]:
        """Traffic while the block runs; after it, once every request sent settled, none moves."""
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                await self.step(keep)
                await asyncio.sleep(PACE_S)

        task = asyncio.ensure_future(loop())
        try:
            yield
        finally:
            stop.set()
            await task
        await until(self.settled, 10, lambda: f"requests sent settle: {self.waiting()}, {self.in_flight()}")


async def test_every_replicas_load_equals_the_requests_in_flight_through_envoy_under_nats_a_kill_and_a_flap(
    replicas: list[ServeReplica], workers: list[EchoWorker], envoy: EnvoyUnderTest, nats: RestartableNats, dns
) -> None:
    zone, _ = dns
    a, b, c = replicas
    flapping = workers[-1].address  # the worker c's DNS view loses
    figures: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await until(lambda: all_know(replicas, http, 3), 30, "every replica discovered the workers")
        await until(lambda: all(not h.failed_health_check for h in picker_hosts(envoy).values()),
                    15, "Envoy sees every replica healthy")  # fmt: skip
        traffic = Traffic(http, envoy.url, b"")
        clients = Clients(traffic, workers)

        async def converge(what: str, live: list[ServeReplica], timeout_s: float = 15.0) -> None:
            figures[what] = await views_match(live, http, clients.truth, timeout_s, what)

        try:
            for outage_s in (1.0, 5.0):
                async with clients.running():
                    nats.stop()  # by pid
                    await asyncio.sleep(outage_s)  # the outage, under traffic (frees included)
                    nats.start()  # on the same port
                    await asyncio.sleep(0.5)  # traffic after the restart
                await converge(f"nats {outage_s:.0f} s", replicas)

            b_port = b.ports["port"]
            async with clients.running():
                await until(lambda: picker_hosts(envoy)[b_port].streams_active > 0, 10, "b holds a request")
                held_on_b = picker_hosts(envoy)[b_port].streams_active
                t_kill = traffic.now()
                b.kill()
                out_after_kill = await within(lambda: picker_hosts(envoy)[b_port].failed_health_check, 10)
                await until(lambda: traffic.now() > t_kill + DETECTION_S, 10, "traffic past detection")
            await converge("kill", [a, c], 3 * LEASE_S + 2)

            t_start = traffic.now()
            await b.start()  # on its ports again, under a new id (host-pid)
            started_s = traffic.now() - t_start
            back_after_start = await within(lambda: not picker_hosts(envoy)[b_port].failed_health_check, 10)
            streams_before = picker_hosts(envoy)[b_port].streams_total
            async with clients.running():
                await until(lambda: picker_hosts(envoy)[b_port].streams_total >= streams_before + 3,
                            15, "Envoy sends streams to b again")  # fmt: skip
            await converge("restart", replicas)

            zone.set(flapping_present=False)  # c's discovery loses a worker that a and b keep
            await until(lambda: c.knows(http, 2), 10, "c dropped the flapping worker")
            # c forgot its requests on that worker and announced them freed: end them all, so that
            # what is held there afterwards is a's and b's, which c must count once the worker is back.
            for key in [k for k, w in clients.in_flight().items() if w == flapping]:
                clients.release(key)
            await until(lambda: flapping not in clients.in_flight().values(), 10, "the flapping worker idle")
            async with clients.running(keep=flapping):  # a and b route there, c does not
                await until(lambda: list(clients.in_flight().values()).count(flapping) >= 3,
                            15, "a and b hold requests on the flapping worker")  # fmt: skip
            held_on_flapping = list(clients.in_flight().values()).count(flapping)
            zone.set(flapping_present=True)
            await until(lambda: c.knows(http, 3), 10, "c has the flapping worker back")
            await converge("flap", replicas)

            for key in clients.in_flight():
                clients.release(key)
            await until(lambda: not clients.waiting(), 10, "every client answered")
            await converge("end", replicas)
            assert clients.truth() == dict.fromkeys((w.address for w in workers), 0)
        finally:
            for answer in clients.requests.values():
                answer.cancel()  # none left unless the test failed (the workers' fixture releases them)
            await asyncio.gather(*clients.requests.values(), return_exceptions=True)

        expired = sum([(await r.counters(http)).get("sync.lease_expired", 0) for r in (a, c)])
    retries = envoy_counter(envoy, "cluster.endpoint_picker.upstream_rq_retry")
    failures = traffic.failures()
    report = (
        f"{traffic.failure_summary(since=t_kill)} from the SIGKILL; {held_on_b} streams on b at the "
        f"kill; b out of Envoy's checks {seconds(out_after_kill)} after the kill, started again in "
        f"{started_s:.2f} s, back in the checks {seconds(back_after_start)} later; {held_on_flapping} of "
        f"a and b's requests on the flapping worker at its return; {retries} ext_proc streams retried; "
        f"views equal to the truth after (s): { {k: round(v, 2) for k, v in figures.items()} }"
    )
    print(report)

    assert out_after_kill is not None and out_after_kill <= DETECTION_S, report
    assert back_after_start is not None, report
    assert expired >= 2, report  # a and c forgot b's first life when its lease ran out
    # No 503 from a dead replica beyond Envoy's detection time; nothing else failed.
    assert all(t_kill <= t <= t_kill + DETECTION_S for t, _, _ in failures), report
    assert {(status, reason) for _, status, reason in failures} <= {(503, "picker-unavailable")}, report


async def all_know(replicas: list[ServeReplica], http: aiohttp.ClientSession, workers: int) -> bool:
    return all([await r.knows(http, workers) for r in replicas])
