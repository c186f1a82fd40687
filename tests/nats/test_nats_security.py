"""The picker's NATS connection with credentials and TLS, against a real nats-server that demands both.

The server requires TLS, verifies client certificates (`tls { verify: true }`) against one CA and
admits one user with a password. A picker configured with the right settings starts and receives
Dynamo KV events over that connection; every wrong setting stops the start with one log line that
names what to fix.
"""

from __future__ import annotations

import gc
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from extproc.config import PickerConfig, load_config
from extproc.devstack.procs import NatsServer, start_nats_server
from extproc.events.dynamo_json import encode_event, kv_events_subject
from extproc.events.nats_security import NatsRefused, connect_nats
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import BlocksStored, StoredBlock, Worker
from extproc.runtime.server import start_picker
from extproc.runtime.wakeups import run

from ..certs import Issued, TestCa
from .conftest import eventually

USER, PASSWORD = "picker", "s3cret-pass"


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    return TestCa(tmp_path / "ca", "nats-ca")


@pytest.fixture
def secure_nats(tmp_path: Path, ca: TestCa) -> Iterator[NatsServer]:
    """nats-server on loopback: TLS required, client certificates from `ca` verified, one user."""
    cert = ca.issue("nats-server")
    config = tmp_path / "nats.conf"
    config.write_text(
        f'tls {{ cert_file: "{cert.cert_file}", key_file: "{cert.key_file}", ca_file: "{ca.ca_file}", '
        "verify: true, timeout: 2 }\n"
        f'authorization {{ user: "{USER}", password: "{PASSWORD}" }}\n'
    )
    # no port: the server binds a free one on 127.0.0.1 and reports it in its ports file
    server = start_nats_server(
        jetstream=False,
        store_dir=tmp_path / "nats",
        log_path=tmp_path / "nats.log",
        extra_args=["-c", str(config)],
    )
    try:
        yield server
    finally:
        server.stop(grace_s=2.0)


def picker_config(
    tmp_path: Path, server: NatsServer, *flags: str, environ: dict | None = None
) -> PickerConfig:
    path = tmp_path / "picker.yaml"
    path.write_text(yaml.safe_dump({"workers": [{"id": "7", "endpoint": "127.0.0.1:8000", "model": "m"}]}))
    argv = ["--config", str(path), "--port", "0", "--health-port", "0", "--kv-cache-block-size", "4"]
    return load_config([*argv, "--nats-url", server.url, *flags], environ=environ or {})


def tls_flags(client: Issued | None, ca_file: str) -> list[str]:
    flags = ["--nats-tls-ca-file", ca_file]
    if client is not None:
        flags += ["--nats-tls-cert-file", client.cert_file, "--nats-tls-key-file", client.key_file]
    return flags


async def test_a_picker_with_the_right_certificate_and_password_receives_kv_events(tmp_path, secure_nats, ca):
    client = ca.issue("picker", client=True)
    # the password from Dynamo's environment variable, as a pod would get it from a Secret
    config = picker_config(
        tmp_path, secure_nats, *tls_flags(client, ca.ca_file), "--nats-user", USER,
        environ={"NATS_AUTH_PASSWORD": PASSWORD},
    )  # fmt: skip
    assert PASSWORD not in repr(config)
    running = await start_picker(config)
    publisher = await connect_nats(config.events, name="test-publisher")
    try:
        router = running.picker.pools["m"].router
        tokens = list(range(1, 9))
        hashes = compute_block_hashes(tokens, 4)
        event = BlocksStored(Worker("7"), tuple(StoredBlock(h, h) for h in hashes), None, event_id=0)
        subject = kv_events_subject(config.events.namespace, config.events.component)

        async def stored() -> bool:  # NATS core is at most once: publish until it is seen
            await publisher.nc.publish(subject, encode_event(7, event, 0, 0))
            await publisher.nc.flush()
            return router.indexer.find_matches(hashes).get(Worker("7"), 0) == 2

        await eventually(stored, 10.0, "the picker learns the stored blocks over TLS")
    finally:
        await publisher.close()
        await running.stop(0)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("CA that did not sign the server", "the server's TLS certificate was not accepted"),
        ("no CA: the system's roots", "the system's CA roots (no --nats-tls-ca-file)"),
        ("no client certificate", "requires a client certificate"),
        ("client certificate from another CA", "did not accept the client certificate"),
        ("wrong password", "authentication refused"),
    ],
)
async def test_a_refused_picker_says_which_setting_to_fix(tmp_path, secure_nats, ca, caplog, case, expected):
    other = TestCa(tmp_path / "other", "other-ca")
    client = ca.issue("picker", client=True)
    flags = {
        "CA that did not sign the server": tls_flags(client, other.ca_file),
        "no CA: the system's roots": [
            "--nats-tls-cert-file",
            client.cert_file,
            "--nats-tls-key-file",
            client.key_file,
        ],
        "no client certificate": tls_flags(None, ca.ca_file),
        "client certificate from another CA": tls_flags(other.issue("intruder", client=True), ca.ca_file),
        "wrong password": tls_flags(client, ca.ca_file),
    }[case]
    password = "not-the-password" if case == "wrong password" else PASSWORD
    config = picker_config(tmp_path, secure_nats, *flags, "--nats-user", USER, "--nats-password", password)
    with caplog.at_level(logging.ERROR, logger="extproc.events.nats"), pytest.raises(NatsRefused) as refused:
        await start_picker(config)
    assert expected in refused.value.reason
    assert [r.getMessage() for r in caplog.records] == [
        f"NATS at {secure_nats.url} refused the picker: {refused.value.reason}"
    ]
    assert password not in refused.value.reason
    del refused  # nats-py leaves a refused TLS socket to the collector: close it here, quietly
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_a_tls_connection_is_read_as_it_arrives_and_says_why(tmp_path, secure_nats, ca, caplog):
    client = ca.issue("picker", client=True)
    config = picker_config(
        tmp_path,
        secure_nats,
        *tls_flags(client, ca.ca_file),
        "--nats-user",
        USER,
        "--nats-password",
        PASSWORD,
    )

    async def main() -> None:
        link = await connect_nats(config.events, name="tls-held-reads")
        try:
            await link.nc.flush(timeout=5)
        finally:
            await link.close()

    with caplog.at_level(logging.INFO, logger="extproc.events.nats"):
        run(main())  # the picker's own loop: it would hold a plaintext socket
    assert "messages read as they arrive: a TLS connection" in caplog.text
