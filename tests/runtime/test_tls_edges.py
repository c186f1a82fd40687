"""Transport security, the details test_tls.py leaves out: the self-signed certificate's exact shape
(validity, names, extensions, whatever the host's time zone), each unusable file's message as a
user reads it, the warnings of a certificate outside its validity, the start-up description, the
system's roots for outgoing TLS, and a remote router group whose certificate names another host
than its address (`--group-tls-server-name`), against the real gRPC TLS stack on loopback."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extproc.config import ClientTlsConfig, TlsConfig
from extproc.groups import GroupUnreachable, RemoteGroup
from extproc.runtime.server import start_picker
from extproc.runtime.tls import (
    SELF_SIGNED_VALID_DAYS,
    TlsError,
    channel_credentials,
    channel_options,
    describe,
    load_ca,
    load_pair,
    self_signed_pair,
)

from ..certs import TestCa
from ..groups.builders import request
from .test_tls import serve_config

NOW = datetime.datetime(2026, 11, 29, 12, 0, 0, tzinfo=datetime.UTC)


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    return TestCa(tmp_path / "ca", "picker-ca")


# --- the self-signed certificate --------------------------------------------------------------------


def test_the_self_signed_certificate_has_exactly_the_documented_shape() -> None:
    cert = self_signed_pair(["[2001:db8::7]", "picker.example", "::", ""], now=NOW).certificate
    assert cert.not_valid_before_utc == NOW - datetime.timedelta(minutes=5)  # a client's clock skew
    assert cert.not_valid_after_utc == NOW + datetime.timedelta(days=SELF_SIGNED_VALID_DAYS)
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "extproc self-signed"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "extproc"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    ips = set(names.value.get_values_for_type(x509.IPAddress))
    assert ipaddress.ip_address("2001:db8::7") in ips  # a bracketed IPv6 bind address, as a URL writes it
    assert ipaddress.ip_address("::") not in ips  # names no address a client dials
    assert "" not in names.value.get_values_for_type(x509.DNSName)
    # RFC 5280: a subject alternative name is critical only when the subject is empty; a server
    # certificate is no CA; its key usage as the Inference Extension's EPP writes it
    assert names.critical is False
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert (constraints.value.ca, constraints.critical) == (False, True)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert (list(usage.value), usage.critical) == ([ExtendedKeyUsageOID.SERVER_AUTH], False)


@pytest.fixture
def tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone nine hours ahead of UTC."""
    monkeypatch.setenv("TZ", "JST-9")  # a POSIX rule: no time zone database needed
    time.tzset()
    assert time.localtime().tm_gmtoff == 9 * 3600
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_self_signed_certificate_is_valid_from_now_whatever_the_hosts_time_zone(tokyo) -> None:
    before = datetime.datetime.now(datetime.UTC)
    cert = self_signed_pair().certificate
    after = datetime.datetime.now(datetime.UTC)
    skew = datetime.timedelta(minutes=5)
    assert before - skew - datetime.timedelta(seconds=1) <= cert.not_valid_before_utc <= after - skew


# --- unusable files, named ----------------------------------------------------------------------------


def test_each_unusable_file_is_named_with_what_is_wrong(ca, tmp_path) -> None:
    issued = ca.issue("picker")
    missing = str(tmp_path / "missing.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    cases = [
        (lambda: load_pair(missing, issued.key_file), f"cannot read {missing}: No such file or directory"),
        (lambda: load_pair(str(tmp_path), issued.key_file), f"cannot read {tmp_path}: Is a directory"),
        (lambda: load_pair(str(garbage), issued.key_file), f"{garbage}: no PEM certificate in it"),
        (lambda: load_ca(str(garbage)), f"{garbage}: no PEM certificate in it"),
        (lambda: load_ca(missing), f"cannot read {missing}: No such file or directory"),
    ]
    for call, message in cases:
        with pytest.raises(TlsError) as refused:
            call()
        assert str(refused.value) == message
    with pytest.raises(TlsError) as refused:
        load_pair(issued.cert_file, str(garbage))
    assert str(refused.value).startswith(f"{garbage}: not a PEM private key (")
    assert load_ca(ca.ca_file) == Path(ca.ca_file).read_bytes()


def test_an_encrypted_key_is_refused_at_start_with_what_to_give_instead(ca, tmp_path) -> None:
    issued = ca.issue("picker")
    key = serialization.load_pem_private_key(Path(issued.key_file).read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with pytest.raises(TlsError) as refused:
        load_pair(issued.cert_file, str(encrypted))
    assert str(refused.value) == f"{encrypted}: the private key is encrypted; give an unencrypted PEM key"


def test_a_certificate_outside_its_validity_is_warned_about_in_one_exact_line(ca, caplog) -> None:
    expired = ca.issue("old", valid_from=datetime.timedelta(days=-3), valid_until=datetime.timedelta(days=-1))
    later = ca.issue("later", valid_from=datetime.timedelta(days=1), valid_until=datetime.timedelta(days=2))
    with caplog.at_level(logging.WARNING, logger="extproc.tls"):
        load_pair(expired.cert_file, expired.key_file)
        load_pair(later.cert_file, later.key_file)
    old, early = (r.getMessage() for r in caplog.records)
    expires = load_pair(expired.cert_file, expired.key_file).certificate.not_valid_after_utc
    assert (
        old
        == f"the certificate in {expired.cert_file} expired on {expires}: clients that verify it will refuse"
    )
    starts = load_pair(later.cert_file, later.key_file).certificate.not_valid_before_utc
    pattern = (
        re.escape(f"the certificate in {later.cert_file} is not valid before {starts} (now ")
        + r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00"  # to the second
        + re.escape(
            "; a clock behind, or a certificate issued for later): "
            "clients that verify it will refuse until then"
        )
    )
    assert re.fullmatch(pattern, early), early


# --- the start-up description, outgoing TLS ------------------------------------------------------------


def test_the_servers_security_is_described_in_the_start_line() -> None:
    assert describe(TlsConfig()) == "plaintext"
    assert describe(TlsConfig(self_signed=True)) == "TLS (self-signed certificate)"
    assert describe(TlsConfig(cert_file="c.pem", key_file="k.pem", client_ca_file="ca.pem")) == (
        "TLS (certificate c.pem, client certificates from ca.pem required)"
    )


def test_outgoing_tls_without_a_ca_file_verifies_against_the_systems_roots() -> None:
    named = ClientTlsConfig(server_name="groups.internal")  # TLS on, no CA file, no client certificate
    assert isinstance(channel_credentials(named), grpc.ChannelCredentials)
    assert channel_options(named) == [("grpc.ssl_target_name_override", "groups.internal")]
    assert channel_options(ClientTlsConfig(ca_file="ca.pem")) == []
    assert channel_credentials(ClientTlsConfig()) is None


async def test_a_remote_group_whose_certificate_names_another_host_is_reached_with_its_server_name(
    tmp_path, ca
) -> None:
    """The group API's certificate names groups.internal only (as in a cluster, where it is dialled by
    address); with --group-tls-server-name that name is verified, without it the group is unreachable."""
    cert = ca.issue("group", ("groups.internal",))
    running = await start_picker(
        serve_config(tmp_path, "--tls-cert-file", cert.cert_file, "--tls-key-file", cert.key_file,
                     "--group-api-port", "0")
    )  # fmt: skip
    address = f"127.0.0.1:{running.group_api.port}"
    try:
        named = RemoteGroup(
            "named", address, tls=ClientTlsConfig(ca_file=ca.ca_file, server_name="groups.internal")
        )
        try:
            probe = await named.probe(request(list(range(64))), timeout_s=5.0)
            assert probe.choice.endpoint
        finally:
            await named.close()
        by_address = RemoteGroup("by-address", address, tls=ClientTlsConfig(ca_file=ca.ca_file))
        try:
            with pytest.raises(GroupUnreachable):
                await by_address.probe(request(list(range(64))), timeout_s=2.0)
        finally:
            await by_address.close()
    finally:
        await running.stop(0)
