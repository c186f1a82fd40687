"""Transport security of the picker's servers and clients, with real gRPC TLS on loopback.

The ext_proc server and the router-group API over TLS and mutual TLS (a client without a
certificate, or with one from another CA, is refused), the health server plaintext, self-signed
mode, unusable certificate files named at start, and every server on loopback by default.
Envoy in front of a TLS picker: tests/e2e/test_tls_e2e.py; NATS: tests/nats/test_nats_security.py.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import yaml
from cryptography import x509
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.config import ClientTlsConfig, GroupConfig, GroupsConfig, ModelConfig, PickerConfig, load_config
from extproc.groups import GroupUnreachable, RemoteGroup
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker
from extproc.runtime.tls import TlsError, load_pair, self_signed_pair

from ..certs import Issued, TestCa
from ..groups.builders import MODEL, request
from ..picker_fixtures import request_headers

WORKERS = [{"id": f"w{i}", "endpoint": f"127.0.0.{i + 1}:8000", "model": MODEL} for i in range(2)]


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    return TestCa(tmp_path / "ca", "picker-ca")


@pytest.fixture
def other_ca(tmp_path: Path) -> TestCa:
    return TestCa(tmp_path / "other", "other-ca")


def serve_config(tmp_path: Path, *flags: str) -> PickerConfig:
    """`serve`'s configuration for two workers, free ports, loopback defaults and `flags`."""
    path = tmp_path / "picker.yaml"
    path.write_text(yaml.safe_dump({"workers": WORKERS, "router": {"kv-cache-block-size": 16}}))
    argv = ["--config", str(path), "--port", "0", "--health-port", "0", "--no-kv-events", *flags]
    return load_config(argv, environ={})


@pytest_asyncio.fixture
async def mtls_picker(tmp_path: Path, ca: TestCa) -> AsyncIterator[tuple[RunningPicker, Issued]]:
    """A picker serving ext_proc and the group API over TLS, requiring client certificates from `ca`."""
    server = ca.issue("picker")
    config = serve_config(
        tmp_path, "--tls-cert-file", server.cert_file, "--tls-key-file", server.key_file,
        "--tls-client-ca-file", ca.ca_file, "--group-api-port", "0",
    )  # fmt: skip
    running = await start_picker(config)
    try:
        yield running, server
    finally:
        await running.stop(0)


def credentials(ca_file: str | None, client: Issued | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca_file).read_bytes() if ca_file else None,
        private_key=Path(client.key_file).read_bytes() if client else None,
        certificate_chain=Path(client.cert_file).read_bytes() if client else None,
    )


async def first_answer(port: int, creds: grpc.ChannelCredentials | None, *, name: str | None = None):
    """Open an ext_proc stream to 127.0.0.1:`port`, send GET request headers, return the first answer."""
    options = [("grpc.ssl_target_name_override", name)] if name else []
    channel = (
        grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=options)
        if creds is not None
        else grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    )
    async with channel:
        call = ext_grpc.ExternalProcessorStub(channel).Process(
            iter([request_headers("/v1/models", method="GET", end_of_stream=True)]), timeout=5
        )
        return await call.read()


async def test_ext_proc_over_mutual_tls_answers_a_client_with_a_certificate_from_the_ca(mtls_picker, ca):
    running, _ = mtls_picker
    answer = await first_answer(running.port, credentials(ca.ca_file, ca.issue("envoy", client=True)))
    assert answer.WhichOneof("response") in ("request_headers", "immediate_response")
    assert running.tls.startswith("TLS (certificate") and "client certificates" in running.tls


@pytest.mark.parametrize("client", ["no certificate", "certificate from another CA", "plaintext"])
async def test_ext_proc_over_mutual_tls_refuses_clients_without_a_valid_certificate(
    mtls_picker, ca, other_ca, client
):
    running, _ = mtls_picker
    creds = {
        "no certificate": credentials(ca.ca_file),
        "certificate from another CA": credentials(ca.ca_file, other_ca.issue("intruder", client=True)),
        "plaintext": None,
    }[client]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await first_answer(running.port, creds)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert running.service.open_streams == 0 and running.picker.is_idle()


async def test_the_client_verifies_the_picker_against_its_ca(mtls_picker, ca, other_ca):
    running, _ = mtls_picker
    client = ca.issue("envoy", client=True)
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # the picker's certificate is not from other_ca
        await first_answer(running.port, credentials(other_ca.ca_file, client))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError):  # nor does it name example.com
        await first_answer(running.port, credentials(ca.ca_file, client), name="example.com")


async def test_health_stays_plaintext_for_kubelet_probes(mtls_picker):
    running, _ = mtls_picker
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=5
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def test_the_group_api_shares_the_servers_mutual_tls(mtls_picker, ca, other_ca, tmp_path):
    """A top-level picker with --group-tls-* routes through the TLS group; a group client without a
    certificate, or with one from another CA, finds the group unreachable."""
    running, _ = mtls_picker
    address = f"127.0.0.1:{running.group_api.port}"
    client = ca.issue("top-picker", client=True)
    tls = ClientTlsConfig(ca_file=ca.ca_file, cert_file=client.cert_file, key_file=client.key_file)
    top = EndpointPicker(
        PickerConfig(
            router=RouterConfig(block_size=16, use_kv_events=False),
            workers=(),
            models=(ModelConfig(MODEL),),
            groups=GroupsConfig(groups=(GroupConfig("secure", address),), probe_timeout_s=2.0, tls=tls),
        )
    )
    try:
        pick = await top.pick(
            body=b'{"model": "demo-model", "prompt": "hello over TLS"}',
            path="/v1/completions",
            headers={},
            subset=None,
            client_request_id="r1",
        )
        assert pick.group == "secure" and pick.endpoint in {w["endpoint"] for w in WORKERS}
        top.finish(pick, "done")
    finally:
        await top.close()
    intruder = other_ca.issue("intruder", client=True)
    for name, client_tls in [
        ("no certificate", ClientTlsConfig(ca_file=ca.ca_file)),
        (
            "another CA's certificate",
            ClientTlsConfig(ca_file=ca.ca_file, cert_file=intruder.cert_file, key_file=intruder.key_file),
        ),
    ]:
        remote = RemoteGroup(name, address, tls=client_tls)
        try:
            with pytest.raises(GroupUnreachable):
                await remote.probe(request(list(range(64))), timeout_s=2.0)
        finally:
            await remote.close()
    assert running.picker.is_idle()


async def test_self_signed_mode_serves_tls_with_a_fresh_certificate(tmp_path):
    running = await start_picker(serve_config(tmp_path, "--tls-self-signed"))
    try:
        assert running.tls == "TLS (self-signed certificate)"
        with pytest.raises(grpc.aio.AioRpcError):  # plaintext is refused
            await first_answer(running.port, None)
        # A client that pins this very certificate can verify it: it names 127.0.0.1.
        pem = await _server_certificate(running.port)
        answer = await first_answer(running.port, grpc.ssl_channel_credentials(root_certificates=pem))
        assert answer.WhichOneof("response") in ("request_headers", "immediate_response")
    finally:
        await running.stop(0)


async def _server_certificate(port: int) -> bytes:
    """The PEM certificate the TLS server on `port` presents (read without verifying it)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return ssl.DER_cert_to_PEM_cert(der).encode()


def test_self_signed_certificate_is_for_servers_and_names_loopback_and_the_bind_address():
    pair = self_signed_pair(["10.1.2.3", "picker.example", "0.0.0.0"])
    cert = pair.certificate
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    assert {"127.0.0.1", "::1", "10.1.2.3"} <= ips and "0.0.0.0" not in ips
    assert {"localhost", "picker.example"} <= set(names.get_values_for_type(x509.DNSName))
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime > datetime.timedelta(days=3649)
    assert self_signed_pair().certificate.serial_number != cert.serial_number  # fresh at every start


def test_unusable_certificate_files_are_named(ca, other_ca, tmp_path):
    a, b = ca.issue("a"), other_ca.issue("b")
    with pytest.raises(TlsError, match=f"{b.key_file} is not the private key of the certificate in"):
        load_pair(a.cert_file, b.key_file)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(TlsError, match="no PEM certificate"):
        load_pair(str(garbage), a.key_file)
    with pytest.raises(TlsError, match="not a PEM private key"):
        load_pair(a.cert_file, str(garbage))


@pytest.mark.parametrize(
    ("valid_from", "valid_until", "said", "not_said"),
    [
        (datetime.timedelta(days=1), datetime.timedelta(days=2), "is not valid before", "expired"),
        (datetime.timedelta(days=-2), datetime.timedelta(days=-1), "expired on", "not valid before"),
    ],
)
def test_a_certificate_outside_its_validity_is_named_for_what_it_is(
    ca, caplog, valid_from, valid_until, said, not_said
):
    issued = ca.issue("dated", valid_from=valid_from, valid_until=valid_until)
    with caplog.at_level(logging.WARNING, logger="extproc"):
        load_pair(issued.cert_file, issued.key_file)
    assert said in caplog.text and issued.cert_file in caplog.text
    assert not_said not in caplog.text


def test_a_certificate_valid_now_is_loaded_without_a_warning(ca, caplog):
    issued = ca.issue("now")
    with caplog.at_level(logging.WARNING, logger="extproc"):
        load_pair(issued.cert_file, issued.key_file)
    assert caplog.text == ""


def test_serve_with_a_mismatched_key_exits_2_naming_the_file(ca, other_ca, tmp_path):
    a, b = ca.issue("a"), other_ca.issue("b")
    config = tmp_path / "picker.yaml"
    config.write_text(yaml.safe_dump({"workers": WORKERS}))
    result = subprocess.run(
        [sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", "0",
         "--health-port", "0", "--tls-cert-file", a.cert_file, "--tls-key-file", b.key_file],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"{b.key_file} is not the private key of the certificate in {a.cert_file}" in result.stderr


def _listening(ports: set[int]) -> dict[int, set[str]]:
    """Local addresses listening on `ports`, from the kernel's socket tables (Linux)."""
    found: dict[int, set[str]] = {p: set() for p in ports}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address_hex, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) not in ports:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address_hex)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            address = ipaddress.ip_address(raw)
            mapped = getattr(address, "ipv4_mapped", None)  # gRPC listens on ::ffff:127.0.0.1
            found[int(port_hex, 16)].add(str(mapped or address))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket tables")
async def test_every_server_listens_on_loopback_only_by_default(tmp_path):
    running = await start_picker(serve_config(tmp_path, "--admin-port", "0", "--group-api-port", "0"))
    try:
        ports = {running.port, running.health_port, running.admin.port, running.group_api.port}
        assert _listening(ports) == {port: {"127.0.0.1"} for port in ports}
    finally:
        await running.stop(0)
