"""Router groups: the file's `groups:` list, hierarchical probing, this picker's own group API and TLS
to remote groups -> `GroupsConfig`. Off while `groups:` is empty.

The flags are read from the file's `picker:` section; the list itself is the top-level `groups:`:

    groups:
      - {name: local, local: true}
      - {name: zone-b, address: 10.0.1.7:9100, weight: 2}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from extproc.config.options import (
    ConfigError,
    Option,
    Reader,
    _int_or_none,
    check_pair,
    check_positive,
    check_readable,
    snake_keys,
)
from extproc.config.tls import ClientTlsConfig

SECTION = "picker"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One router group of a hierarchical picker: the local routers or another picker's group API."""

    name: str
    address: str | None = None  # host:port of a remote group API; None = this picker's own routers
    weight: float = 1.0

    @property
    def is_local(self) -> bool:
        return self.address is None


@dataclass(frozen=True, slots=True)
class GroupsConfig:
    """Hierarchical probing (off when `groups` is empty) and this picker's own group API."""

    groups: tuple[GroupConfig, ...] = ()
    api_port: int | None = None  # serve the router-group gRPC API here; None = off
    probe_timeout_s: float = 0.05
    probe_grace_s: float = 0.2  # no group answered by the deadline: wait this much longer for the first
    policy: str = "max-overlap"  # max-overlap | min-cost | weighted
    fallback: str | None = None  # name of a local group used when no group answers
    tls: ClientTlsConfig = field(default_factory=ClientTlsConfig)  # to every remote group's API
    lease_s: float = 10.0  # a remote group frees this picker's requests this long after it stops renewing


GROUP_API_PORT = Option(
    "--group-api-port",
    _int_or_none,
    None,
    "Serve the router-group gRPC API (Probe, Commit, MarkPrefillComplete, Free, PotentialLoads, Renew) "
    "on this port so a top-level picker can use this one as a group. 0 picks a free port. Off when not set.",
)
GROUP_PROBE_TIMEOUT_MS = Option(
    "--group-probe-timeout-ms",
    float,
    50.0,
    "Hierarchical mode: groups that have not answered a probe within this deadline are skipped.",
)
GROUP_PROBE_GRACE_MS = Option(
    "--group-probe-grace-ms",
    float,
    200.0,
    "Hierarchical mode: when no group answered within the probe deadline (a loaded machine rather than "
    "dead groups), take the first answer within this much longer instead of answering 503. 0: no grace.",
)
GROUP_POLICY = Option(
    "--group-policy",
    str,
    "max-overlap",
    "How to choose a group from their probes: max-overlap (cost breaks ties), min-cost, or weighted "
    "(a blend of overlap and cost scaled by each group's weight).",
    choices=("max-overlap", "min-cost", "weighted"),
)
GROUP_FALLBACK: Option[str | None] = Option(
    "--group-fallback",
    str,
    None,
    "Name of a local group to route with when no group answers; without it such requests get 503.",
)

GROUP_LEASE_SECS = Option(
    "--group-lease-secs",
    float,
    10.0,
    "How long a remote group keeps this picker's requests counted without hearing from it: the picker "
    "renews them every third of it, and if it dies (or is cut off) its groups free them when it runs out.",
)

GROUP_OPTIONS: tuple[Option[Any], ...] = (
    GROUP_API_PORT,
    GROUP_PROBE_TIMEOUT_MS,
    GROUP_PROBE_GRACE_MS,
    GROUP_POLICY,
    GROUP_FALLBACK,
    GROUP_LEASE_SECS,
)

GROUP_TLS_CA_FILE: Option[str | None] = Option(
    "--group-tls-ca-file",
    str,
    None,
    "Reach remote router groups over TLS and verify them against this CA bundle.",
)
GROUP_TLS_CERT_FILE: Option[str | None] = Option(
    "--group-tls-cert-file",
    str,
    None,
    "Client certificate presented to remote groups that require mutual TLS, with "
    "--group-tls-key-file (turns TLS on; without --group-tls-ca-file the system's roots verify).",
)
GROUP_TLS_KEY_FILE: Option[str | None] = Option(
    "--group-tls-key-file", str, None, "Private key of --group-tls-cert-file."
)
GROUP_TLS_SERVER_NAME: Option[str | None] = Option(
    "--group-tls-server-name",
    str,
    None,
    "Name the remote groups' certificates must carry (and the SNI sent) instead of the host part of "
    "their address; for certificates issued to a DNS name reached by IP.",
)

# --help lists these under "transport security", after the servers' own TLS flags (server.py)
GROUP_TLS_OPTIONS: tuple[Option[Any], ...] = (
    GROUP_TLS_CA_FILE,
    GROUP_TLS_CERT_FILE,
    GROUP_TLS_KEY_FILE,
    GROUP_TLS_SERVER_NAME,
)


def read_groups(reader: Reader, raw_groups: Any) -> GroupsConfig:
    """The groups of the file's `groups:` list (`raw_groups`) and the group flags. Raises ConfigError."""
    read = reader.read
    api_port = read(GROUP_API_PORT)
    probe_timeout_ms = read(GROUP_PROBE_TIMEOUT_MS)
    probe_grace_ms = read(GROUP_PROBE_GRACE_MS)
    policy = read(GROUP_POLICY)
    fallback = read(GROUP_FALLBACK)
    lease_s = read(GROUP_LEASE_SECS)
    tls_ca_file = read(GROUP_TLS_CA_FILE)
    tls_cert_file = read(GROUP_TLS_CERT_FILE)
    tls_key_file = read(GROUP_TLS_KEY_FILE)
    tls_server_name = read(GROUP_TLS_SERVER_NAME)

    check_pair(GROUP_TLS_CERT_FILE, tls_cert_file, GROUP_TLS_KEY_FILE, tls_key_file)
    check_readable(GROUP_TLS_CA_FILE, tls_ca_file)
    check_readable(GROUP_TLS_CERT_FILE, tls_cert_file)
    check_readable(GROUP_TLS_KEY_FILE, tls_key_file)
    groups = _group_list(raw_groups)
    check_positive("group-probe-timeout-ms", probe_timeout_ms)
    if not probe_grace_ms >= 0:
        raise ConfigError(f"invalid group-probe-grace-ms={probe_grace_ms!r}: expected 0 or more")
    check_positive("group-lease-secs", lease_s)
    if fallback is not None and fallback not in {g.name for g in groups if g.is_local}:
        raise ConfigError(f"invalid group-fallback={fallback!r}: expected the name of a local group")
    return GroupsConfig(
        groups=groups,
        api_port=api_port,
        probe_timeout_s=probe_timeout_ms / 1000.0,
        probe_grace_s=probe_grace_ms / 1000.0,
        policy=policy,
        fallback=fallback,
        lease_s=lease_s,
        tls=ClientTlsConfig(
            ca_file=tls_ca_file, cert_file=tls_cert_file, key_file=tls_key_file, server_name=tls_server_name
        ),
    )


def _group_list(raw: Any) -> tuple[GroupConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("invalid groups: expected a list of {name, address | local: true, weight}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ConfigError(f"invalid groups[{i}]={item!r}: expected a mapping with a name")
        g = snake_keys(item)
        address = g.get("address")
        local = bool(g.get("local", address is None))
        if local == (address is not None):
            raise ConfigError(f"invalid groups[{i}]: give either 'address: host:port' or 'local: true'")
        if address is not None and ":" not in str(address):
            raise ConfigError(f"invalid groups[{i}].address={address!r}: expected host:port")
        try:
            weight = float(g.get("weight", 1.0))
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"invalid groups[{i}].weight={g.get('weight')!r}: expected a number") from None
        if not weight > 0:
            raise ConfigError(f"invalid groups[{i}].weight={weight}: expected > 0")
        out.append(GroupConfig(str(g["name"]), None if local else str(address), weight))
    names = [g.name for g in out]
    if len(set(names)) != len(names):
        raise ConfigError("invalid groups: group names must be unique")
    return tuple(out)
