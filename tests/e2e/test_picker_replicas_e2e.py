"""Several picker replicas behind a real Envoy 1.40: a dead or draining replica stops getting streams
(issue 20).

Three `python -m extproc serve` replicas (static workers: one in-process echo worker) sit behind one
Envoy whose endpoint_picker cluster lists them (`render_envoy_config(picker_address=[...])`), with
the gRPC health checks, outlier detection and ext_proc retry of `envoy/picker_cluster.yaml` and
`envoy/picker_retry.yaml`. Under steady traffic one replica is SIGKILLed and then another SIGTERMed
while it still holds streams (it drains them). Clients may lose only what was in flight on the
killed replica; no new request fails beyond the health checks' detection time, the draining
replica finishes what it held, and afterwards the survivor serves everything.

Before the fix (the same cluster without health checks, outlier detection or retry) about half of
the requests failed with 503 from the kill to the end of the test; see docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.devstack.envoy_config import PickerHealth
from extproc.devstack.procs import ManagedProcess
from extproc.devstack.stack import MODEL

from ..replica_helpers import Traffic, detection_s, envoy_counter, picker_hosts, seconds, until, within
from .harness import EchoWorker, EnvoyUnderTest, serve_replicas, start_echo_workers, start_envoy_over_replicas

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEALTH = PickerHealth()  # the defaults: checks every 1 s, out after 2 failures, back after 1 pass
DETECTION_S = detection_s(HEALTH)
REPLICAS = 3
# Clients sending one request after another, unpaced (about 500 requests/s here): enough that
# streams arrive in the instant a replica starts draining, which its gRPC server answers CANCELLED
# (Envoy retries them only with `cancelled` in retry_on: 7 to 12 such 503s per run before).
LOOPS = 24
PACE_S = 0.0
HELD = 6  # requests the worker holds (no answer yet), spread over the replicas' ext_proc streams
BODY = json.dumps({"model": MODEL, "prompt": "which replica?", "max_tokens": 1}).encode()
TIMEOUT = aiohttp.ClientTimeout(total=30)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("picker-replicas")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker() -> AsyncIterator[EchoWorker]:
    (echo,) = await start_echo_workers(1)
    yield echo
    await echo.stop()


@pytest.fixture(scope="module")
def replicas(worker: EchoWorker, log_dir: Path) -> Iterator[list[ManagedProcess]]:
    """Three `serve` processes for the echo worker; each binds port 0 and reports ext_proc and health."""
    with serve_replicas(worker, MODEL, log_dir, REPLICAS, "--shutdown-grace-secs", "20") as started:
        yield started


@pytest.fixture(scope="module")
def envoy(replicas: list[ManagedProcess], log_dir: Path) -> Iterator[EnvoyUnderTest]:
    started = start_envoy_over_replicas(replicas, HEALTH, log_dir)
    yield started
    started.stop()


async def test_a_dead_and_a_draining_replica_stop_getting_streams(
    envoy: EnvoyUnderTest, replicas: list[ManagedProcess], worker: EchoWorker
) -> None:
    ports = [r.ports()["port"] for r in replicas]
    await until(
        lambda: all(not h.failed_health_check for h in picker_hosts(envoy).values()),
        10,
        "Envoy sees every replica healthy",
    )
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        traffic = Traffic(session, envoy.url, BODY)
        held = [asyncio.ensure_future(traffic.send(f"?hold=h{i}")) for i in range(HELD)]
        await until(
            lambda: sum(h.streams_active for h in picker_hosts(envoy).values()) == HELD,
            10,
            "the held requests' ext_proc streams are open",
        )
        # The replica holding the most streams drains (SIGTERM), the next one dies (SIGKILL).
        active = {port: host.streams_active for port, host in picker_hosts(envoy).items()}
        draining, dead, survivor = sorted(ports, key=lambda p: -active[p])
        held_on_dead = active[dead]
        by_port = dict(zip(ports, replicas, strict=True))
        loops = [asyncio.ensure_future(traffic.loop(PACE_S)) for _ in range(LOOPS)]
        try:
            await until(lambda: traffic.served_since(0) >= 50, 10, "traffic flows through every replica")

            t_kill = traffic.now()
            os.kill(by_port[dead].pid, signal.SIGKILL)
            out_after_kill = await within(lambda: picker_hosts(envoy)[dead].failed_health_check, DETECTION_S)
            await until(lambda: traffic.now() > t_kill + DETECTION_S, 10, "traffic past the detection time")

            t_term = traffic.now()
            os.kill(by_port[draining].pid, signal.SIGTERM)
            out_after_term = await within(
                lambda: picker_hosts(envoy)[draining].failed_health_check, DETECTION_S
            )
            await until(lambda: traffic.now() > t_term + DETECTION_S, 10, "traffic past the detection time")
            assert by_port[draining].is_running(), "the SIGTERMed replica still drains its held streams"

            before = picker_hosts(envoy)
            t_after = traffic.now()
            await until(lambda: traffic.served_since(t_after) >= 100, 15, "traffic after both faults")
        finally:
            traffic.stopping.set()
            await asyncio.gather(*loops)
        after = picker_hosts(envoy)
        served_after = sum(1 for when, _, _ in traffic.answers if when >= t_after)
        for index in range(HELD):
            worker.release(f"h{index}")
        held_answers = await asyncio.gather(*held)
    retries = envoy_counter(envoy, "cluster.endpoint_picker.upstream_rq_retry")
    failures = traffic.failures()
    figures = (
        f"{traffic.failure_summary()}; SIGKILL at {t_kill:.2f} s (failed Envoy's health checks "
        f"{seconds(out_after_kill)} later), SIGTERM at {t_term:.2f} s ({seconds(out_after_term)} later); "
        f"{retries} ext_proc streams retried; held: {[s for _, s, _ in held_answers]}"
    )
    print(figures)

    # Only what was in flight on the killed replica may fail, and only as that replica died.
    assert len(failures) <= LOOPS, figures
    assert all(t_kill <= t < t_kill + DETECTION_S for t, _, _ in failures), figures
    assert {(status, reason) for _, status, reason in failures} <= {(503, "picker-unavailable")}, figures
    # The draining replica finished every request it held; those held on the dead one are lost.
    assert sum(1 for _, status, _ in held_answers if status != 200) <= held_on_dead, figures
    await until(lambda: not by_port[draining].is_running(), 15, "the drained replica exits")
    assert by_port[draining].returncode == 0, by_port[draining].log_tail()
    # Afterwards every stream goes to the survivor.
    assert after[dead].streams_total == before[dead].streams_total, figures
    assert after[draining].streams_total == before[draining].streams_total, figures
    # (requests in flight when `before` was read had their stream already)
    assert after[survivor].streams_total - before[survivor].streams_total >= served_after - LOOPS, figures
    assert out_after_kill is not None and out_after_term is not None, figures
