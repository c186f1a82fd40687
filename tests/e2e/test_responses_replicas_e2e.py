"""The Responses API behind two picker replicas: follow-ups and retrievals reach the worker that stored
the answer whichever replica Envoy gives their ext_proc stream.

Workers keep each stored answer in their own memory, as vLLM does with
`VLLM_ENABLE_RESPONSES_API_STORE=1` (three mock workers whose `/v1/responses` answers as vLLM 0.33.0
does); a follow-up (`previous_response_id`) or a retrieval that reaches another worker gets a 404.
Two `python -m extproc serve --router-replica-sync` processes share a real nats-server; a real Envoy
spreads the ext_proc streams over them (round robin); the real `openai` client talks to Envoy.
Before replica sync shared the answers' workers, a replica sent the follow-ups of conversations that
began on the other one to a worker chosen on load: most of them met 404s. And before a replica that
starts hands over what it was not there to hear (`want_routes`), a rolling restart of the replicas
lost every answer's worker: each follow-up of an older conversation went where load sent it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio

from extproc.devstack.envoy_config import PickerHealth
from extproc.devstack.procs import ManagedProcess, NatsServer, reserve_port, start_nats_server
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers

from ..replica_helpers import until
from .harness import EnvoyUnderTest, serve_replicas_of, start_envoy_over_replicas

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPLICAS = 2
CONVERSATIONS = 6
FOLLOW_UPS = 3


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("responses-replicas-e2e")


@pytest.fixture(scope="module")
def nats(log_dir: Path) -> Iterator[NatsServer]:
    with reserve_port() as port:
        server = start_nats_server(port.port, store_dir=log_dir / "jetstream")
        try:
            yield server
        finally:
            server.stop(grace_s=2.0)


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(3, log_dir, speedup=20.0, kv_events=False)
    yield started
    for w in started:
        w.process.stop()


@pytest.fixture(scope="module")
def replicas(workers: list[WorkerProcess], nats: NatsServer, log_dir: Path) -> Iterator[list[ManagedProcess]]:
    listed = [{"id": w.worker_id, "endpoint": w.endpoint, "model": MODEL} for w in workers]
    sync = ["--admin-port", "0", "--nats-url", nats.url, "--router-replica-sync",
            "--replica-sync-heartbeat-secs", "0.2", "--replica-sync-lease-secs", "2"]  # fmt: skip
    with serve_replicas_of(
        listed, log_dir, REPLICAS, *sync, replica_flags=lambda index: ("--router-id", f"r{index}")
    ) as started:
        yield started


@pytest.fixture(scope="module")
def envoy(replicas: list[ManagedProcess], log_dir: Path) -> Iterator[EnvoyUnderTest]:
    # a replica restarted (the rolling restart) is out of Envoy's rotation for one short ejection
    started = start_envoy_over_replicas(replicas, PickerHealth(ejection_time_ms=1_000), log_dir)
    yield started
    started.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(envoy: EnvoyUnderTest) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{envoy.url}/v1", api_key="unused", max_retries=0, timeout=30
    ) as started:
        yield started


def admin(replica: ManagedProcess, path: str) -> str:
    return f"http://127.0.0.1:{replica.ports()['admin_port']}{path}"


async def counters(http: aiohttp.ClientSession, replica: ManagedProcess) -> dict[str, int]:
    async with http.get(admin(replica, "/debug/workers")) as r:
        return (await r.json())["kv_event_counters"]


async def test_follow_ups_through_either_replica_reach_the_worker_that_stored_the_answer(
    client: openai.AsyncOpenAI, replicas: list[ManagedProcess]
):
    async with aiohttp.ClientSession() as http:
        # both replicas ready (handed the other's routes) and taking Envoy's streams. After the rolling
        # restart, when it ran first, Envoy once gave every stream of this test to one replica (a full
        # run, seed 1302579266: [0, 42] below) though its /clusters showed both healthy and neither
        # ejected as the test began: streams that failed on the stopped process can eject its address
        # for a moment, about as long as this test takes. So it first waits for each to route one.
        await until(lambda: _all_ready(http, replicas), 15.0, "every replica ready")
        await _every_replica_takes_streams(client, http, replicas)
        # each replica has heard the other's heartbeats (they say it keeps routes) before any answer: at
        # most four of the first messages are its want and states, the rest heartbeats (every 0.2 s)
        await until(
            lambda: _all_applied(http, replicas, 8), 15.0, "the replicas hear each other's heartbeats"
        )

        async def conversation(i: int) -> list[str]:
            answer = await client.responses.create(
                model=MODEL, instructions="Be brief.", input=f"conversation {i}: tell me about caches",
                max_output_tokens=4,
            )  # fmt: skip
            ids = [answer.id]
            for turn in range(FOLLOW_UPS):  # each a 404 on any other worker
                answer = await client.responses.create(
                    model=MODEL, input=f"and then? ({turn})", previous_response_id=ids[-1],
                    max_output_tokens=4,
                )  # fmt: skip
                ids.append(answer.id)
            for rid in ids:
                assert (await client.responses.retrieve(rid)).id == rid
            return ids

        chains = await asyncio.gather(*(conversation(i) for i in range(CONVERSATIONS)))
        assert all(len(ids) == FOLLOW_UPS + 1 for ids in chains)
        shared = [(await counters(http, r)).get("sync.routes", 0) for r in replicas]
    # both replicas routed answers and learned the other's: without it most follow-ups met 404s
    assert all(n > 0 for n in shared), shared


def _restarted(replicas: list[ManagedProcess], index: int, log_dir: Path) -> ManagedProcess:
    """Replica `index` stopped (SIGTERM) and started again on the same ports, with the same router id
    (a rolling restart: Envoy's cluster names the addresses); it replaces the old one in `replicas`."""
    old = replicas[index]
    ports, argv = old.ports(), list(old.argv)
    ports_file = log_dir / f"replica-{index}-restarted.ports.json"
    for flag, value in (("--port", ports["port"]), ("--health-port", ports["health_port"]),
                        ("--ports-file", ports_file)):  # fmt: skip
        argv[argv.index(flag) + 1] = str(value)
    old.stop()
    new = ManagedProcess(argv, log_path=log_dir / f"replica-{index}-restarted.log", ports_file=ports_file)
    replicas[index] = new.start()  # the fixture stops whatever runs now
    new.ports(30.0)
    return new


async def test_conversations_go_on_after_a_rolling_restart_of_the_replicas(
    client: openai.AsyncOpenAI, replicas: list[ManagedProcess], log_dir: Path
):
    async with aiohttp.ClientSession() as http:
        await until(
            lambda: _all_applied(http, replicas, 8), 15.0, "the replicas hear each other's heartbeats"
        )
        firsts = await asyncio.gather(*(
            client.responses.create(model=MODEL, input=f"restart {i}: caches", max_output_tokens=4)
            for i in range(CONVERSATIONS)
        ))  # fmt: skip
        for index in range(REPLICAS):  # one at a time: the other one routes meanwhile
            new = _restarted(replicas, index, log_dir)
            await until(
                lambda new=new: _learned(http, new, CONVERSATIONS),
                15.0,
                f"replica {index} is handed the routes",
            )

        async def go_on(first_id: str) -> None:
            previous = first_id
            for turn in range(FOLLOW_UPS):  # each a 404 on any other worker
                answer = await client.responses.create(
                    model=MODEL,
                    input=f"and then? ({turn})",
                    previous_response_id=previous,
                    max_output_tokens=4,
                )
                previous = answer.id
            assert (await client.responses.retrieve(first_id)).id == first_id

        # every replica now started after the first turns: what it knows of them it was handed
        await asyncio.gather(*(go_on(first.id) for first in firsts))


async def _every_replica_takes_streams(
    client: openai.AsyncOpenAI, http: aiohttp.ClientSession, replicas: list[ManagedProcess]
) -> None:
    """Chat requests through Envoy (no stored answers) until each replica routed one of them: then
    Envoy holds a working connection to each, and round robin alternates between them."""
    before = [await _routed(http, r) for r in replicas]

    async def every_replica_routed() -> bool:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "which replica?"}], max_tokens=1
        )
        return all([await _routed(http, r) > n for r, n in zip(replicas, before, strict=True)])

    await until(every_replica_routed, 15.0, "each replica routes a request")


async def _routed(http: aiohttp.ClientSession, replica: ManagedProcess) -> float:
    """`extproc_requests_total{outcome="routed"}`, summed over its other labels."""
    async with http.get(admin(replica, "/metrics")) as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("extproc_requests_total{") and 'outcome="routed"' in line
    )


async def _all_ready(http: aiohttp.ClientSession, replicas: list[ManagedProcess]) -> bool:
    statuses = []
    for replica in replicas:
        async with http.get(admin(replica, "/readyz")) as r:
            statuses.append(r.status)
    return statuses == [200] * len(replicas)


async def _learned(http: aiohttp.ClientSession, replica: ManagedProcess, at_least: int) -> bool:
    return (await counters(http, replica)).get("sync.routes_learned", 0) >= at_least


async def _all_applied(http: aiohttp.ClientSession, replicas: list[ManagedProcess], at_least: int) -> bool:
    applied = [(await counters(http, r)).get("sync.applied", 0) for r in replicas]
    return all(n >= at_least for n in applied)
