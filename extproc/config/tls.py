"""The two TLS shapes: the picker's own gRPC servers (`TlsConfig`) and its outgoing connections
(`ClientTlsConfig`, to remote router groups and to NATS).

Their flags live with the section they secure: server.py (--tls-*), groups.py (--group-tls-*),
events.py (--nats-tls-*). extproc/runtime/tls.py turns these into what the transports take.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClientTlsConfig:
    """TLS of an outgoing connection (to remote router groups, to NATS): on when any field is set."""

    ca_file: str | None = None  # verify the server against this CA bundle (default: the system's roots)
    cert_file: str | None = None  # with key_file: a client certificate, for servers that require mutual TLS
    key_file: str | None = None
    server_name: str | None = None  # name to verify (and send as SNI) instead of the address's host

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.ca_file, self.cert_file, self.server_name))


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS of the picker's gRPC servers: ext_proc and the router-group API (health stays plaintext).

    Off by default. A certificate and key from files, or `self_signed`: a key and certificate made at
    start, as the Inference Extension's EPP does with --secure-serving (encryption without identity;
    Envoy then skips verification). `client_ca_file` turns on mutual TLS: clients must present a
    certificate signed by that CA or the handshake fails.
    """

    cert_file: str | None = None
    key_file: str | None = None
    self_signed: bool = False
    client_ca_file: str | None = None

    @property
    def enabled(self) -> bool:
        return self.self_signed or self.cert_file is not None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None
