"""Transport security: gRPC and NATS credentials from the TLS settings, and self-signed certificates.

Owns turning `TlsConfig` and `ClientTlsConfig` (extproc/config.py) into what the transports take:
`grpc.ServerCredentials` for the ext_proc and router-group servers, `grpc.ChannelCredentials` for
remote router groups, an `ssl.SSLContext` for NATS. Files are read and checked once, at start: a
file that holds no PEM certificate, an encrypted key or a key that does not belong to its
certificate is named here (`TlsError`) instead of surfacing as failed handshakes later.
Certificates are not reloaded while running: rotate them by restarting (a rolling restart drains
gracefully, see server.py).

Self-signed mode follows the Inference Extension's EPP (`--secure-serving` without a certificate
path; its CreateSelfSignedTLSCertificate): a fresh key and certificate in memory at every start,
nothing written to disk, valid ten years, for server authentication. It encrypts but proves no
identity, so clients connect without verifying (Envoy: `render_envoy_config(picker_tls=True)`).
Unlike the EPP's RSA-4096 key, an ECDSA P-256 key (made in about a millisecond where RSA-4096 takes
seconds on a busy core), and subject alternative names for localhost, the loopback addresses, this
host's name and the bind address, so a client that pins this very certificate can verify it.

The gRPC health server is never TLS, as in the EPP: kubelet's gRPC probes cannot use TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extproc.config import ClientTlsConfig, TlsConfig

log = logging.getLogger("extproc.tls")

SELF_SIGNED_VALID_DAYS = 3650  # the EPP's ten years
SELF_SIGNED_ORGANIZATION = "extproc"


class TlsError(ValueError):
    """A certificate, key or CA file is unusable; the message names the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate chain (leaf first) and the PEM private key of its leaf."""

    certificate_pem: bytes
    private_key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificates(self.certificate_pem)[0]


def self_signed_pair(
    hosts: Sequence[str] = (),
    *,
    valid_days: int = SELF_SIGNED_VALID_DAYS,
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A new ECDSA P-256 key and a self-signed server certificate for `hosts` (IPs or DNS names),
    localhost, 127.0.0.1, ::1 and this host's name."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, "localhost", "127.0.0.1", "::1", socket.gethostname()]):
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            if host:
                names.append(x509.DNSName(host))
        else:
            if not address.is_unspecified:  # 0.0.0.0 / :: name no address a client dials
                names.append(x509.IPAddress(address))
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, SELF_SIGNED_ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, "extproc self-signed"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate a client's clock skew
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(
        certificate.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def load_pair(cert_file: str, key_file: str) -> KeyPair:
    """Read a PEM certificate chain and its private key; raises TlsError unless the key is the leaf's."""
    chain_pem = _read(cert_file)
    certificates = _certificates(cert_file, chain_pem)
    key_pem = _read(key_file)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise TlsError(f"{key_file}: the private key is encrypted; give an unencrypted PEM key") from None
    except ValueError as exc:
        raise TlsError(f"{key_file}: not a PEM private key ({exc})") from None
    if _public_der(key.public_key()) != _public_der(certificates[0].public_key()):
        raise TlsError(f"{key_file} is not the private key of the certificate in {cert_file}")
    _warn_unless_valid_now(cert_file, certificates[0])
    return KeyPair(chain_pem, key_pem)


def _warn_unless_valid_now(cert_file: str, certificate: x509.Certificate) -> None:
    """Say why clients that verify the certificate will refuse it: expired, or not valid yet."""
    now = datetime.datetime.now(datetime.UTC)
    starts, expires = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    if expires < now:
        log.warning(
            "the certificate in %s expired on %s: clients that verify it will refuse", cert_file, expires
        )
    elif starts > now:
        log.warning(
            "the certificate in %s is not valid before %s (now %s; a clock behind, or a certificate "
            "issued for later): clients that verify it will refuse until then",
            cert_file,
            starts,
            now.replace(microsecond=0),
        )


def load_ca(ca_file: str) -> bytes:
    """The PEM bundle of CA certificates in `ca_file`; raises TlsError if it holds none."""
    pem = _read(ca_file)
    _certificates(ca_file, pem)
    return pem


def server_pair(tls: TlsConfig, *, host: str) -> KeyPair | None:
    """The servers' key pair: from the files, made now when self-signed, None when TLS is off."""
    if tls.self_signed:
        return self_signed_pair([host])
    if tls.cert_file is not None and tls.key_file is not None:
        return load_pair(tls.cert_file, tls.key_file)
    return None


def server_credentials(tls: TlsConfig, pair: KeyPair | None) -> grpc.ServerCredentials | None:
    """gRPC server credentials for `pair`, requiring client certificates signed by the client CA
    when `tls.mutual`; None (plaintext) without a pair."""
    if pair is None:
        return None
    client_ca = load_ca(tls.client_ca_file) if tls.client_ca_file is not None else None
    return grpc.ssl_server_credentials(
        [(pair.private_key_pem, pair.certificate_pem)],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def server_ssl_context(tls: TlsConfig, pair: KeyPair | None) -> ssl.SSLContext | None:
    """The same as `server_credentials`, for the picker's own HTTP/2 server (ALPN h2); the key
    pair goes to OpenSSL through memory files, so a self-signed key never touches the disk."""
    if pair is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    cert_fd, key_fd = os.memfd_create("extproc-cert"), os.memfd_create("extproc-key")
    try:
        os.write(cert_fd, pair.certificate_pem)
        os.write(key_fd, pair.private_key_pem)
        context.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
    finally:
        os.close(cert_fd)
        os.close(key_fd)
    if tls.client_ca_file is not None:
        context.load_verify_locations(cadata=load_ca(tls.client_ca_file).decode())
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def channel_credentials(tls: ClientTlsConfig) -> grpc.ChannelCredentials | None:
    """gRPC channel credentials for `tls` (the system's roots without a CA file); None when TLS is off."""
    if not tls.enabled:
        return None
    pair = load_pair(tls.cert_file, tls.key_file) if tls.cert_file and tls.key_file else None
    return grpc.ssl_channel_credentials(
        root_certificates=load_ca(tls.ca_file) if tls.ca_file is not None else None,
        private_key=pair.private_key_pem if pair else None,
        certificate_chain=pair.certificate_pem if pair else None,
    )


def channel_options(tls: ClientTlsConfig) -> list[tuple[str, str]]:
    """Channel options that make gRPC verify (and send as SNI) `tls.server_name` instead of the host."""
    return [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []


def client_ssl_context(tls: ClientTlsConfig) -> ssl.SSLContext | None:
    """An SSLContext verifying servers against `tls.ca_file` (or the system's roots), presenting the
    client certificate when one is set; None when TLS is off."""
    if not tls.enabled:
        return None
    if tls.ca_file is not None:
        load_ca(tls.ca_file)  # a readable message for a file that holds no certificate
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file and tls.key_file:
            load_pair(tls.cert_file, tls.key_file)
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot use {tls.ca_file or tls.cert_file}: {exc}") from exc
    return context


def describe(tls: TlsConfig) -> str:
    """How the TLS servers listen, for the start-up log line."""
    if not tls.enabled:
        return "plaintext"
    source = "self-signed certificate" if tls.self_signed else f"certificate {tls.cert_file}"
    clients = f", client certificates from {tls.client_ca_file} required" if tls.mutual else ""
    return f"TLS ({source}{clients})"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsError(f"cannot read {path}: {os.strerror(exc.errno or 0) or exc}") from None


def _certificates(path: str, pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise TlsError(f"{path}: no PEM certificate in it") from None


def _public_der(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
