"""Real Envoy 1.40 reaching the real picker over TLS: verified mutual TLS, refusals, self-signed mode.

Envoy's ext_proc cluster gets the UpstreamTlsContext that `render_envoy_config(picker_tls=...)`
writes; the picker runs in this event loop with the TLS settings of `serve`; one in-process echo
worker answers. The variant is "buffered" (fails closed), so a failed handshake is a 503: the
picker-unavailable answer (JSON, reason header, retry-after), saying that the TLS handshake failed
when Envoy refused the picker, and Envoy's access log says why (issue 20: before, the client got
the generic answer and nothing named the certificate error).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import ModelConfig, PickerConfig, TlsConfig, WorkerConfig
from extproc.devstack.envoy_config import PickerTls
from extproc.devstack.stack import MODEL
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from ..certs import TestCa
from ..replica_helpers import until
from .harness import EchoWorker, envoy_version, start_echo_workers, start_envoy_variant

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


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: Any  # JSON
    envoy_log: list[dict[str, Any]]  # Envoy's access log lines (5xx answers), parsed


async def post(url: str) -> tuple[int, dict[str, str], Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
        session.post(url + "/v1/completions", data=BODY, headers={"content-type": "application/json"}) as r,
    ):
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.json(content_type=None)


async def through_envoy(running: RunningPicker, picker_tls: bool | PickerTls, log_dir: Path) -> Answer:
    envoy = start_envoy_variant(
        "buffered",
        picker_address=f"127.0.0.1:{running.port}",
        picker_health_port=running.health_port,
        workers=[],
        log_dir=log_dir,
        picker_tls=picker_tls,
    )
    try:
        status, headers, body = await post(envoy.url)
    finally:
        envoy.stop()
    lines = envoy.process.log_path.read_text().splitlines()
    return Answer(status, headers, body, [json.loads(line) for line in lines if line.startswith("{")])


def assert_picker_unavailable(answer: Answer, *, tls_named: bool) -> str:
    """The picker-unavailable 503 (as when the picker is down), saying so when Envoy refused the
    picker's certificate; returns the details Envoy logged for it."""
    assert answer.status == 503, answer
    assert answer.headers["x-gateway-request-dropped-reason"] == "picker-unavailable", answer
    assert answer.headers["retry-after"] == "1"
    message = answer.body["error"]["message"]
    assert answer.body["error"]["type"] == "ServiceUnavailableError" and answer.body["error"]["code"] == 503
    expected = "the endpoint picker is unavailable" + (
        ": the TLS handshake with it failed" if tls_named else ""
    )
    assert message == expected, answer.body
    (logged,) = answer.envoy_log
    assert (logged["status"], logged["reason"]) == (503, "picker-unavailable"), logged
    return str(logged["details"])


async def test_envoy_routes_through_a_picker_that_requires_mutual_tls(mtls_picker, worker, cas, log_dir):
    ca, _ = cas
    envoy_cert = ca.issue("envoy", client=True)
    tls = PickerTls(
        ca_file=ca.ca_file,
        server_name=PICKER_NAME,
        cert_file=envoy_cert.cert_file,
        key_file=envoy_cert.key_file,
    )
    answer = await through_envoy(mtls_picker, tls, log_dir)
    assert answer.status == 200, answer
    assert answer.body["worker"] == answer.body["headers"]["x-gateway-destination-endpoint"] == worker.address
    assert answer.envoy_log == []  # only 5xx answers are logged


@pytest.mark.parametrize(
    ("envoy_side", "logged"),
    [
        ("without a client certificate", "remote_connection_failure"),  # the picker refused Envoy
        ("trusting another CA", "CERTIFICATE_VERIFY_FAILED:verify_cert_failed:_X509_verify_cert"),
        ("expecting another name", "CERTIFICATE_VERIFY_FAILED:verify_cert_failed:_SAN_matcher"),
    ],
)
async def test_envoy_gets_no_route_when_the_handshake_fails(mtls_picker, cas, log_dir, envoy_side, logged):
    """Fails closed (status_on_error 503): the picker refuses Envoy, or Envoy refuses the picker,
    which the client's answer says and Envoy's access log details."""
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
        "expecting another name": PickerTls(
            ca_file=ca.ca_file,
            server_name="other.extproc.internal",
            cert_file=envoy_cert.cert_file,
            key_file=envoy_cert.key_file,
        ),
    }[envoy_side]
    answer = await through_envoy(mtls_picker, tls, log_dir)
    details = assert_picker_unavailable(answer, tls_named=envoy_side != "without a client certificate")
    if envoy_version() < (1, 37):  # Envoy 1.36 names BoringSSL's reason alone, not the failed check
        logged = logged.split(":")[0]
    assert logged in details, details
    await until(mtls_picker.picker.is_idle, 5.0, "the picker freed every request")


async def test_an_expired_picker_certificate_is_named(worker, cas, log_dir):
    ca, _ = cas
    expired = ca.issue(
        "picker-expired",
        (PICKER_NAME,),
        valid_from=datetime.timedelta(days=-2),
        valid_until=datetime.timedelta(days=-1),
    )
    running = await start_picker(
        base_config(worker, TlsConfig(cert_file=expired.cert_file, key_file=expired.key_file))
    )
    try:
        answer = await through_envoy(running, PickerTls(ca_file=ca.ca_file, server_name=PICKER_NAME), log_dir)
    finally:
        await running.stop(0)
    details = assert_picker_unavailable(answer, tls_named=True)
    assert "CERTIFICATE_VERIFY_FAILED" in details, details
    assert "certificate_has_expired" in details or envoy_version() < (1, 37), (
        details
    )  # 1.36: the reason alone


async def test_envoy_encrypts_to_a_self_signed_picker_without_verifying(worker, log_dir):
    running = await start_picker(base_config(worker, TlsConfig(self_signed=True)))
    try:
        answer = await through_envoy(running, True, log_dir)
        assert answer.status == 200, answer
        assert answer.body["worker"] == worker.address
        answer = await through_envoy(running, False, log_dir)  # plaintext Envoy: the picker refuses
        assert_picker_unavailable(answer, tls_named=False)
    finally:
        await running.stop(0)
