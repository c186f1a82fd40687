"""A replica stopped with `--shutdown-delay-secs` behind a real Envoy 1.40 that does not retry
ext_proc streams: no request fails at its SIGTERM.

Gateways other than ours may not retry an ext_proc stream (`grpc_service.retry_policy`), and a
stream that reaches a gRPC server in the instant it begins to stop is answered CANCELLED: a 503
for its client. With the delay the SIGTERMed replica reports NOT_SERVING at once but still routes
for longer than Envoy's health checks take to notice, so Envoy has stopped sending to it before it
refuses anything. Two `serve` replicas, the endpoint_picker cluster's health checks and outlier
detection of `envoy/picker_cluster.yaml`, no retry (`PickerHealth(retries=0)`), unpaced traffic.

With the delay Envoy took the replica out 0.8 s after the signal (it reads NOT_SERVING) and no request
failed in any run. Without it (the same test, `--shutdown-delay-secs 0`, the check that the delay
was still running left out) 2 requests failed within 20 ms of the SIGTERM in each of 3 runs
(`ext_proc_error_gRPC_error_1{CANCELLED{via_upstream}}` in Envoy's log).
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

from ..replica_helpers import Traffic, detection_s, picker_hosts, seconds, until, within
from .harness import EchoWorker, EnvoyUnderTest, serve_replicas, start_echo_workers, start_envoy_over_replicas

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEALTH = PickerHealth(retries=0)  # a gateway that does not retry ext_proc streams
DETECTION_S = detection_s(HEALTH)
DELAY_S = DETECTION_S + 1.0  # --shutdown-delay-secs: longer than Envoy takes to notice
LOOPS = 24  # unpaced clients: streams arrive at every instant of the SIGTERM
BODY = json.dumps({"model": MODEL, "prompt": "which replica?", "max_tokens": 1}).encode()
TIMEOUT = aiohttp.ClientTimeout(total=30)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("picker-shutdown-delay")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker() -> AsyncIterator[EchoWorker]:
    (echo,) = await start_echo_workers(1)
    yield echo
    await echo.stop()


@pytest.fixture(scope="module")
def replicas(worker: EchoWorker, log_dir: Path) -> Iterator[list[ManagedProcess]]:
    flags = ("--shutdown-delay-secs", str(DELAY_S), "--shutdown-grace-secs", "10")
    with serve_replicas(worker, MODEL, log_dir, 2, *flags) as started:
        yield started


@pytest.fixture(scope="module")
def envoy(replicas: list[ManagedProcess], log_dir: Path) -> Iterator[EnvoyUnderTest]:
    started = start_envoy_over_replicas(replicas, HEALTH, log_dir)
    yield started
    started.stop()


async def test_a_replica_stopped_with_a_delay_fails_no_request_without_retries(
    envoy: EnvoyUnderTest, replicas: list[ManagedProcess], log_dir: Path
) -> None:
    ports = [r.ports()["port"] for r in replicas]
    stopping, survivor = replicas
    await until(
        lambda: all(not h.failed_health_check for h in picker_hosts(envoy).values()),
        10,
        "Envoy sees every replica healthy",
    )
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        traffic = Traffic(session, envoy.url, BODY)
        loops = [asyncio.ensure_future(traffic.loop(0.0)) for _ in range(LOOPS)]
        try:
            await until(lambda: traffic.served_since(0) >= 200, 15, "traffic flows through both replicas")
            assert all(h.streams_total > 0 for h in picker_hosts(envoy).values())
            t_term = traffic.now()
            os.kill(stopping.pid, signal.SIGTERM)
            out_after = await within(lambda: picker_hosts(envoy)[ports[0]].failed_health_check, DETECTION_S)
            # the stopping replica still routes while Envoy takes it out
            assert stopping.is_running() and traffic.now() < t_term + DELAY_S, "the delay ran out first"
            await until(lambda: not stopping.is_running(), DELAY_S + 15, "the stopped replica exits")
            t_after = traffic.now()
            await until(lambda: traffic.served_since(t_after) >= 200, 15, "traffic after the stop")
        finally:
            traffic.stopping.set()
            await asyncio.gather(*loops)
    out = seconds(out_after)
    figures = f"{traffic.failure_summary(t_term)}; out of Envoy's health checks {out} after SIGTERM"
    print(figures)
    assert not traffic.failures(), figures
    assert out_after is not None, figures
    assert stopping.returncode == 0, stopping.log_tail()
    assert survivor.is_running()
    assert "still routing new ext_proc streams" in (log_dir / "replica-0.log").read_text()
