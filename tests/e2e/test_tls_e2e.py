"""Real Envoy 1.40 reaching the real picker over TLS: verified mutual TLS, refusals, self-signed mode.

Envoy's ext_proc cluster gets the UpstreamTlsContext that `render_envoy_config(picker_tls=...)`
writes; the picker runs in this event loop with the TLS settings of `serve`; one in-process echo
worker answers. The variant is "buffered" (fails closed), so a failed handshake is a 503.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import ModelConfig, PickerConfig, TlsConfig, WorkerConfig
from extproc.devstack.envoy_config import PickerTls
from extproc.devstack.stack import MODEL
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from ..certs import TestCa
from .harness import EchoWorker, start_echo_workers, start_envoy_variant

pytestmark = pytest.mark.asyncio(loop_scope="module")

PICKER_NAME = (
    "picker.extproc.internal"  # the picker's certificate names only this: Envoy must send and check it
)
BODY = b'{"model": "demo-model", "prompt": "hello over TLS", "max_tokens": 1}'


def base_config(worker: EchoWorker, tls: TlsConfig) -> PickerConfig:
    return PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=(WorkerConfig("w0", worker.address, MODEL),),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        tls=tls,
    )


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tls-e2e")


@pytest.fixture(scope="module")
def cas(log_dir: Path) -> tuple[TestCa, TestCa]:
    return TestCa(log_dir / "ca", "picker-ca"), TestCa(log_dir / "other", "other-ca")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker() -> AsyncIterator[EchoWorker]:
    (echo,) = await start_echo_workers(1)
    yield echo
    await echo.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mtls_picker(worker, cas) -> AsyncIterator[RunningPicker]:
    ca, _ = cas
    server = ca.issue("picker", (PICKER_NAME,))
    tls = TlsConfig(cert_file=server.cert_file, key_file=server.key_file, client_ca_file=ca.ca_file)
    running = await start_picker(base_config(worker, tls))
    yield running
    await running.stop(0)


async def post(url: str) -> tuple[int, dict | str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
        session.post(url + "/v1/completions", data=BODY, headers={"content-type": "application/json"}) as r,
    ):
        return r.status, (await r.json() if r.status == 200 else await r.text())


async def through_envoy(
    running: RunningPicker, picker_tls: bool | PickerTls, log_dir: Path
) -> tuple[int, object]:
    envoy = start_envoy_variant(
        "buffered",
        picker_address=f"127.0.0.1:{running.port}",
        workers=[],
        log_dir=log_dir,
        picker_tls=picker_tls,
    )
    try:
        return await post(envoy.url)
    finally:
        envoy.stop()


async def test_envoy_routes_through_a_picker_that_requires_mutual_tls(mtls_picker, worker, cas, log_dir):
    ca, _ = cas
    envoy_cert = ca.issue("envoy", client=True)
    tls = PickerTls(
        ca_file=ca.ca_file,
        server_name=PICKER_NAME,
        cert_file=envoy_cert.cert_file,
        key_file=envoy_cert.key_file,
    )
    status, echoed = await through_envoy(mtls_picker, tls, log_dir)
    assert status == 200, echoed
    assert echoed["worker"] == echoed["headers"]["x-gateway-destination-endpoint"] == worker.address


@pytest.mark.parametrize("envoy_side", ["without a client certificate", "trusting another CA"])
async def test_envoy_gets_no_route_when_the_handshake_fails(mtls_picker, cas, log_dir, envoy_side):
    """Fails closed (status_on_error 503): the picker refuses Envoy, or Envoy refuses the picker."""
    ca, other = cas
    envoy_cert = ca.issue("envoy", client=True)
    tls = {
        "without a client certificate": PickerTls(ca_file=ca.ca_file, server_name=PICKER_NAME),
        "trusting another CA": PickerTls(
            ca_file=other.ca_file,
            server_name=PICKER_NAME,
            cert_file=envoy_cert.cert_file,
            key_file=envoy_cert.key_file,
        ),
    }[envoy_side]
    status, _ = await through_envoy(mtls_picker, tls, log_dir)
    assert status == 503
    assert mtls_picker.picker.is_idle()


async def test_envoy_encrypts_to_a_self_signed_picker_without_verifying(worker, log_dir):
    running = await start_picker(base_config(worker, TlsConfig(self_signed=True)))
    try:
        status, echoed = await through_envoy(running, True, log_dir)
        assert status == 200, echoed
        assert echoed["worker"] == worker.address
        status, _ = await through_envoy(running, False, log_dir)  # plaintext Envoy: the picker refuses
        assert status == 503
    finally:
        await running.stop(0)
