"""Helpers of the multi-replica tests (issue 20): picker replicas as `serve` child processes with
replica sync over NATS and DNS discovery, a DNS zone with a flapping worker, a nats-server that
restarts on its port, Envoy's view of its endpoint_picker cluster, clients through Envoy, and
polling with a bound.

Used by tests/nats/test_replica_sync_chaos.py (ext_proc streams straight to the replicas),
tests/e2e/test_picker_replicas_e2e.py (Envoy's health checks, no NATS) and
tests/e2e/test_replicas_under_faults_e2e.py (both at once).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from extproc.devstack.envoy_config import PickerHealth
from extproc.devstack.procs import ManagedProcess, NatsServer, reserve_port, start_nats_server

if TYPE_CHECKING:
    from tests.e2e.harness import EnvoyUnderTest

DNS_SERVER = Path(__file__).parent / "k8s" / "dns_server.py"
STABLE, FLAPPY = "workers.test.", "flap.test."  # two DNS names of the same workers (below)
POLL_S = 0.02


# -- polling ------------------------------------------------------------------------------------


async def within(predicate: Callable[[], object], timeout_s: float) -> float | None:
    """Poll `predicate` (its result may be awaitable) until it holds: the seconds it took, or None
    if not within `timeout_s`."""
    started = time.monotonic()
    while not await _value(predicate()):
        if time.monotonic() - started > timeout_s:
            return None
        await asyncio.sleep(POLL_S)
    return time.monotonic() - started


async def until(predicate: Callable[[], object], timeout_s: float, what: str | Callable[[], str]) -> float:
    """Poll `predicate` until it holds (the seconds it took); fail after `timeout_s` with `what`
    (a callable is asked at failure time)."""
    took = await within(predicate, timeout_s)
    if took is None:
        pytest.fail(f"not true after {timeout_s} s: {what() if callable(what) else what}")
    return took


async def _value(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


# -- DNS discovery ------------------------------------------------------------------------------


class FlappingZone:
    """A zone for tests/k8s/dns_server.py: STABLE always lists every address; FLAPPY (the name one
    replica discovers) the same ones, except the last while `set(flapping_present=False)`."""

    def __init__(self, path: Path, addresses: Sequence[str]) -> None:
        self.path = path
        self.addresses = list(addresses)
        self.set(flapping_present=True)

    def set(self, *, flapping_present: bool) -> None:
        flap = self.addresses if flapping_present else self.addresses[:-1]
        zone = {"mode": "ok", "records": {STABLE: {"A": self.addresses}, FLAPPY: {"A": flap}}}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(zone))
        tmp.replace(self.path)  # the server re-reads the file at every query: never half written


@contextmanager
def dns_server(zone: Path, log_path: Path) -> Iterator[int]:
    """tests/k8s/dns_server.py answering from `zone`, as a child process; yields its UDP port."""
    server = ManagedProcess([sys.executable, str(DNS_SERVER), str(zone)], log_path=log_path)
    server.start()
    try:
        deadline = time.monotonic() + 10
        while "PORT " not in server.log_tail():
            assert server.is_running() and time.monotonic() < deadline, server.log_tail()
            time.sleep(POLL_S)  # the server prints its port once bound
        yield int(server.log_tail().split("PORT ")[1].split()[0])
    finally:
        server.stop()


# -- NATS -----------------------------------------------------------------------------------------


class RestartableNats:
    """A nats-server on a loopback port held until `close()`: `stop()` by pid, `start()` again on
    the same port (where the replicas reconnect)."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self._port = reserve_port()
        self.server: NatsServer | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self._port.port}"

    def start(self) -> RestartableNats:
        self.server = start_nats_server(self._port.port, store_dir=self.store_dir)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace_s=2.0)
            self.server = None

    def close(self) -> None:
        self.stop()
        self._port.release()


# -- picker replicas ----------------------------------------------------------------------------


class ServeReplica:
    """One `python -m extproc serve --router-replica-sync` child process discovering its workers
    in DNS (A records of `dns_name`, all on `worker_port`), and its admin API.

    Without `ports` it binds port 0 at every start (a restarted replica has new ports); with
    `ports` ({"port", "health_port", "admin_port"}, held by the test with `reserve_port()`) it binds
    those every time, so a restarted replica is where Envoy's cluster lists it.
    """

    def __init__(
        self,
        name: str,
        tmp: Path,
        *,
        model: str,
        nats_url: str,
        namespace: str,
        dns_port: int,
        dns_name: str,
        worker_port: int,
        heartbeat_s: float,
        lease_s: float,
        ports: Mapping[str, int] | None = None,
    ) -> None:
        config = tmp / f"{name}.yaml"
        config.write_text(f"models: [{{name: {model}}}]\nrouter: {{kv-cache-block-size: 16}}\n")
        fixed = dict(ports or {})
        self.name = name
        self.ports_file = tmp / f"{name}.ports.json"
        self.argv = [
            sys.executable, "-m", "extproc", "serve", "--config", str(config), "--no-kv-events",
            "--port", str(fixed.get("port", 0)), "--health-port", str(fixed.get("health_port", 0)),
            "--admin-port", str(fixed.get("admin_port", 0)), "--ports-file", str(self.ports_file),
            "--nats-url", nats_url, "--namespace", namespace, "--router-replica-sync",
            "--replica-sync-heartbeat-secs", str(heartbeat_s), "--replica-sync-lease-secs", str(lease_s),
            "--discovery-dns", dns_name, "--discovery-dns-server", f"127.0.0.1:{dns_port}",
            "--discovery-port", str(worker_port), "--discovery-model", model,
            "--discovery-refresh-secs", "0.2", "--shutdown-grace-secs", "0",
        ]  # fmt: skip
        self.log = tmp / f"{name}.log"
        self.process: ManagedProcess | None = None
        self.ports: dict[str, int] = fixed
        self.lives = 0

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.ports['admin_port']}"

    async def start(self) -> None:
        """Start it (again) and return once it listens (it wrote its ports)."""
        self.lives += 1
        self.process = ManagedProcess(self.argv, log_path=self.log.with_suffix(f".{self.lives}.log"),
                                      ports_file=self.ports_file).start()  # fmt: skip
        self.ports = await asyncio.to_thread(self.process.ports, 30.0)

    def kill(self) -> None:
        """SIGKILL, then reap it."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.stop()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    async def _workers(self, http: aiohttp.ClientSession) -> dict:
        async with http.get(f"{self.admin}/debug/workers") as r:
            return await r.json()

    async def view(self, http: aiohttp.ClientSession) -> dict[str, int]:
        """Its load: active requests per worker it knows."""
        return {w["worker"]: w["active_requests"] for w in (await self._workers(http))["workers"]}

    async def counters(self, http: aiohttp.ClientSession) -> dict[str, int]:
        return (await self._workers(http))["kv_event_counters"]

    async def knows(self, http: aiohttp.ClientSession, workers: int) -> bool:
        """Whether its discovery has exactly `workers` workers."""
        return len(await self.view(http)) == workers


async def views_match(
    replicas: Sequence[ServeReplica],
    http: aiohttp.ClientSession,
    truth: Callable[[], dict[str, int]],
    timeout_s: float,
    what: str,
) -> float:
    """Poll until every replica's load per worker equals `truth()` (the requests really in flight
    per worker); the seconds it took."""
    views: dict[str, dict[str, int]] = {}

    async def check() -> bool:
        real = truth()
        for r in replicas:
            views[r.name] = await r.view(http)
        return all(v == real for v in views.values())

    return await until(check, timeout_s, lambda: f"{what}: truth {truth()}, views {views}")


# -- Envoy in front of the replicas -------------------------------------------------------------


def seconds(value: float | None) -> str:
    """A duration from `within`, for a report."""
    return "never" if value is None else f"{value:.2f} s"


def detection_s(health: PickerHealth) -> float:
    """How long Envoy may take to take a dead replica out: its health checks failed
    `unhealthy_threshold` times in a row, each within `timeout_ms` (outlier detection and the retry
    usually act sooner)."""
    return (health.interval_ms * health.unhealthy_threshold + health.timeout_ms) / 1000


@dataclass(frozen=True, slots=True)
class PickerHost:
    """One replica as Envoy's endpoint_picker cluster sees it (admin /clusters)."""

    streams_total: int  # ext_proc streams Envoy started on it
    streams_active: int
    failed_health_check: bool
    ejected: bool


def picker_hosts(envoy: EnvoyUnderTest) -> dict[int, PickerHost]:
    """ext_proc port -> what Envoy knows of that replica."""
    with urllib.request.urlopen(f"{envoy.process.admin_url}/clusters?format=json", timeout=5) as answer:
        document = json.loads(answer.read())
    (cluster,) = [c for c in document["cluster_statuses"] if c["name"] == "endpoint_picker"]
    hosts = {}
    for host in cluster["host_statuses"]:
        stats = {s["name"]: int(s.get("value", 0)) for s in host["stats"]}
        health = host["health_status"]
        hosts[host["address"]["socket_address"]["port_value"]] = PickerHost(
            stats.get("rq_total", 0),
            stats.get("rq_active", 0),
            bool(health.get("failed_active_health_check")),
            bool(health.get("failed_outlier_check")),
        )
    return hosts


def envoy_counter(envoy: EnvoyUnderTest, name: str) -> int:
    with urllib.request.urlopen(f"{envoy.process.admin_url}/stats?filter=^{name}$", timeout=5) as answer:
        text = answer.read().decode()
    return int(text.split(":")[1]) if ":" in text else 0


Answer = tuple[float, int, str | None]  # seconds since t0, status (0: connection broke), dropped reason


@dataclass
class Traffic:
    """Clients sending requests through Envoy; the answers of `loop` recorded in `answers`."""

    session: aiohttp.ClientSession
    url: str
    body: bytes
    t0: float = field(default_factory=time.monotonic)
    answers: list[Answer] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def send(self, query: str = "", body: bytes | None = None) -> Answer:
        """One request; status 0 when the connection broke (the reason is the error's name)."""
        try:
            async with self.session.post(
                f"{self.url}/v1/completions{query}",
                data=self.body if body is None else body,
                headers={"content-type": "application/json"},
            ) as response:
                await response.read()
                return self.now(), response.status, response.headers.get("x-gateway-request-dropped-reason")
        except aiohttp.ClientError as exc:
            return self.now(), 0, type(exc).__name__

    async def loop(self, pace_s: float) -> None:
        """One request after another, `pace_s` apart, until `stopping` is set."""
        while not self.stopping.is_set():
            self.answers.append(await self.send())
            await asyncio.sleep(pace_s)  # pacing, not synchronisation

    def failures(self) -> list[Answer]:
        return [answer for answer in self.answers if answer[1] != 200]

    def failure_summary(self, since: float = 0.0) -> str:
        """How many answers, how many not 200, and the first of those (seconds after `since`)."""
        failures = self.failures()
        window = f"{failures[0][0] - since:+.2f} to {failures[-1][0] - since:+.2f} s" if failures else "none"
        listed = [(round(t - since, 2), status, reason) for t, status, reason in failures][:12]
        return f"{len(self.answers)} requests, {len(failures)} not 200 ({window}: {listed})"

    def served_since(self, t: float) -> int:
        return sum(1 for when, status, _ in self.answers if when >= t and status == 200)
