"""Envoy configurations that work with this picker: render the templates in `envoy/` (next to this
module, shipped as package data) for one deployment.

Owns the mapping from a few deployment facts (ports, picker address, workers, limits, the prefill
endpoint header) to the placeholders of `envoy/{buffered,duplex,failopen}.yaml`; the YAML files own
everything else and are documented in `envoy/README.md`. Every variant includes
`envoy/local_replies.yaml` (Envoy's own answers as OpenAI-style JSON; a failed TLS handshake with the
picker named as such) and `envoy/access_log.yaml` (every 5xx answer as a JSON line on Envoy's stderr,
with Envoy's details: the TLS verification error, for one), removes the request headers
the picker owns (`extproc.epp.answers.owned_headers`) before the picker runs, and passes WebSocket
upgrades (the Realtime API) on a route whose ext_proc sends the picker their headers alone
(`envoy/websocket_route.yaml`). No I/O besides reading
the templates; the caller writes or runs the result (see `extproc.devstack.procs.start_envoy`).

Variants:
    buffered   request body BUFFERED, ORIGINAL_DST keyed on envoy.lb metadata, fails closed (default)
    duplex     request body FULL_DUPLEX_STREAMED (Gateway API Inference Extension style), fails closed
    failopen   BUFFERED + failure_mode_allow, STATIC cluster of all workers with override_host,
               round robin when the picker gives no destination; with several models (`workers`
               as {model: endpoints}) over the request's model's workers only (json_to_metadata
               lifts the body's model, a subset load balancer keeps to its workers)

Every variant lists one or several picker replicas (`picker_address`) in its endpoint_picker cluster
(`envoy/picker_cluster.yaml`) with active gRPC health checks on each replica's health port, outlier
detection, and a retry of an ext_proc stream the picker has not answered yet on another replica
(`envoy/picker_retry.yaml`); `PickerHealth` holds their knobs. A dead or draining replica stops getting
new streams within about `PickerHealth.interval_ms` (tests/e2e/test_picker_replicas_e2e.py).

Any variant can reach the picker over TLS (`picker_tls`, a `PickerTls`): the endpoint_picker cluster
gets an UpstreamTlsContext (envoy.transport_sockets.tls) with ALPN h2; with a CA file Envoy verifies
the picker's chain and name (Envoy checks no name unless told to: match_typed_subject_alt_names), and
with a client certificate it can talk to a picker that requires mutual TLS (--tls-client-ca-file).
"""

from __future__ import annotations

import ipaddress
import json
import re
import string
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from extproc.epp.answers import DEFAULT_PREFILL_HEADER, owned_headers

Variant = Literal["buffered", "duplex", "failopen"]
VARIANTS: tuple[Variant, ...] = ("buffered", "duplex", "failopen")

DEFAULT_MESSAGE_TIMEOUT_MS = 5_000  # Envoy's default of 200 ms is too low (REFERENCE 2)
DEFAULT_MAX_MESSAGE_TIMEOUT_MS = 300_000  # bound for ProcessingResponse.override_message_timeout
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # Envoy's default buffer limit of 1 MiB answers 413 above it
# Gaps between SSE chunks (queueing, slow decode) stay far below this; it is also the only bound on a
# hung picker in FULL_DUPLEX_STREAMED, where Envoy 1.40 arms no message_timeout (measured).
DEFAULT_STREAM_IDLE_TIMEOUT_S = 600
DEFAULT_PICKER_HEALTH_PORT = 9003  # the picker's --health-port default

TEMPLATE_DIR = Path(__file__).resolve().parent / "envoy"  # package data: ships in the wheel
LOCAL_REPLIES = TEMPLATE_DIR / "local_replies.yaml"  # included by every variant
ACCESS_LOG = TEMPLATE_DIR / "access_log.yaml"  # 5xx answers with Envoy's details, on stderr
PICKER_CLUSTER = TEMPLATE_DIR / "picker_cluster.yaml"  # the replicas: health checks, outlier detection
PICKER_RETRY = TEMPLATE_DIR / "picker_retry.yaml"  # the ext_proc stream's retry policy
# failopen's fallback: round robin over every worker (one model), or per model (several)
ROUND_ROBIN = TEMPLATE_DIR / "failopen_round_robin.yaml"
MODEL_FILTER = TEMPLATE_DIR / "failopen_model_filter.yaml"
MODEL_SUBSETS = TEMPLATE_DIR / "failopen_model_subsets.yaml"
WEBSOCKET_ROUTE = TEMPLATE_DIR / "websocket_route.yaml"  # upgrades routed on their headers alone
# every fragment a variant may include (all ship in the wheel beside the variants)
FRAGMENTS: tuple[Path, ...] = (
    LOCAL_REPLIES,
    ACCESS_LOG,
    PICKER_CLUSTER,
    PICKER_RETRY,
    ROUND_ROBIN,
    MODEL_FILTER,
    MODEL_SUBSETS,
    WEBSOCKET_ROUTE,
)

Workers = Sequence[str] | Mapping[str, Sequence[str]]  # endpoints, or each model's endpoints


@dataclass(frozen=True, slots=True)
class PickerHealth:
    """How Envoy keeps ext_proc streams off a picker replica that died or is draining.

    Active gRPC health checks (grpc.health.v1, service envoy.service.ext_proc.v3.ExternalProcessor) on
    each replica's health port every `interval_ms`, each answered within `timeout_ms`: out after
    `unhealthy_threshold` failures in a row, back after `healthy_threshold` passes. Outlier
    detection ejects a replica for `ejection_time_ms` (longer each time) after `ejection_failures`
    gateway failures in a row (connection refused or reset, gRPC UNAVAILABLE). A stream that failed
    before the picker answered is retried up to `retries` times on other replicas.
    """

    interval_ms: int = 1_000
    timeout_ms: int = 1_000
    unhealthy_threshold: int = 2
    healthy_threshold: int = 1
    ejection_failures: int = 2
    ejection_time_ms: int = 5_000
    retries: int = 2

    def __post_init__(self) -> None:
        for name in ("interval_ms", "timeout_ms", "unhealthy_threshold", "healthy_threshold",
                     "ejection_failures", "ejection_time_ms"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"picker_health.{name}={getattr(self, name)} must be at least 1")
        if self.retries < 0:
            raise ValueError(f"picker_health.retries={self.retries} must be >= 0 (0: no retry)")


@dataclass(frozen=True, slots=True)
class PickerTls:
    """TLS from Envoy to the picker. Paths are read by Envoy at its start.

    No fields: encrypted but not verified (for a picker with --tls-self-signed, as Gateway API
    implementations treat the Inference Extension's self-signed EPP). `ca_file`: verify the
    picker's chain against it and its name: `server_name` (also sent as SNI) or else the picker's IP.
    `cert_file` + `key_file`: Envoy's client certificate, for a picker with --tls-client-ca-file.
    """

    ca_file: str | None = None
    server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def template_path(variant: Variant) -> Path:
    """The template file of `variant` (package data, `extproc/devstack/envoy/`); raises ValueError for
    an unknown variant."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown Envoy config variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    return TEMPLATE_DIR / f"{variant}.yaml"


def render_envoy_config(
    variant: Variant,
    *,
    listen_port: int = 0,
    admin_port: int = 0,
    picker_address: str | Sequence[str],
    picker_health_port: int | Sequence[int] = DEFAULT_PICKER_HEALTH_PORT,
    picker_health: PickerHealth = PickerHealth(),
    workers: Workers = (),
    message_timeout_ms: int = DEFAULT_MESSAGE_TIMEOUT_MS,
    max_message_timeout_ms: int = DEFAULT_MAX_MESSAGE_TIMEOUT_MS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    stream_idle_timeout_s: int = DEFAULT_STREAM_IDLE_TIMEOUT_S,
    picker_tls: bool | PickerTls = False,
    prefill_endpoint_header: str = DEFAULT_PREFILL_HEADER,
) -> str:
    """Render the Envoy v3 YAML of `variant`.

    `picker_address` is one picker replica or several, and each of `workers`, "ip:port" ("[v6]:port"
    for IPv6). `picker_health_port` is the replicas' gRPC health port (their `--health-port`), one for
    all or one per replica in the same order; `picker_health` tunes the health checks, outlier
    detection and retry that keep streams off a dead or draining replica. Workers are
    required by "failopen" (its STATIC cluster lists them) and only checked by the other variants,
    whose ORIGINAL_DST cluster reaches whatever endpoint the picker names. `workers` is a list of
    endpoints, or a mapping of each model to its workers' endpoints (a worker may serve several):
    with several models, failopen keeps a request the picker skipped on its model's workers (a
    request with no model, or a model no worker serves, goes to any worker); with one model the
    result is the same as for the plain list. `picker_tls` puts TLS on the
    connection to the picker: True encrypts without verifying, a `PickerTls` says what to verify
    and which client certificate to present. `listen_port` and `admin_port` 0 (the default) let
    Envoy bind free ports; `extproc.devstack.procs.start_envoy` reads them back.
    `prefill_endpoint_header` is the picker's `--prefill-endpoint-header`: like the other headers the
    picker owns, a client's copy is removed before the picker runs. Raises ValueError naming the bad
    argument.
    """
    path = template_path(variant)
    for name, port in (("listen_port", listen_port), ("admin_port", admin_port)):
        if port != 0:
            _check_port(name, port)
    pickers = _pickers(picker_address, picker_health_port)
    served = _models_of(workers)
    endpoints = list(served)
    if variant == "failopen" and not endpoints:
        raise ValueError("the failopen variant needs at least one worker (its STATIC cluster lists them)")
    if message_timeout_ms <= 0 or max_message_timeout_ms < message_timeout_ms:
        raise ValueError(
            f"need 0 < message_timeout_ms <= max_message_timeout_ms, got {message_timeout_ms} and "
            f"{max_message_timeout_ms}"
        )
    if max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes={max_body_bytes} is too small; pass at least 1024")
    if stream_idle_timeout_s < 0:
        raise ValueError(f"stream_idle_timeout_s={stream_idle_timeout_s} must be >= 0 (0 disables it)")
    if not _HEADER_NAME.fullmatch(prefill_endpoint_header.strip()):
        raise ValueError(f"prefill_endpoint_header={prefill_endpoint_header!r} is not a header name")
    values = {
        "listen_port": str(listen_port),
        "admin_port": str(admin_port),
        "picker_endpoints": _picker_endpoints(pickers),
        "picker_transport_socket": _picker_transport_socket(picker_tls, pickers),
        "picker_health_interval": _duration(picker_health.interval_ms),
        "picker_health_timeout": _duration(picker_health.timeout_ms),
        "picker_unhealthy_threshold": str(picker_health.unhealthy_threshold),
        "picker_healthy_threshold": str(picker_health.healthy_threshold),
        "picker_ejection_failures": str(picker_health.ejection_failures),
        "picker_ejection_time": _duration(picker_health.ejection_time_ms),
        "picker_retries": str(picker_health.retries),
        "message_timeout": _duration(message_timeout_ms),
        "max_message_timeout": _duration(max_message_timeout_ms),
        "max_body_bytes": str(max_body_bytes),
        "stream_idle_timeout": f"{stream_idle_timeout_s}s",
        "worker_endpoints": _lb_endpoints(served),
        "owned_header_removals": _removals(owned_headers(prefill_endpoint_header)),
    }
    values["local_reply_config"] = _included(LOCAL_REPLIES, values, indent=10)
    values["access_log"] = _included(ACCESS_LOG, values, indent=10)
    values["picker_cluster"] = _included(PICKER_CLUSTER, values, indent=2)
    values["picker_retry_policy"] = _included(PICKER_RETRY, values, indent=16)
    values["websocket_route"] = _included(WEBSOCKET_ROUTE, values, indent=14)
    per_model = len({m for models in served.values() for m in models}) > 1
    values["model_metadata_filter"] = _included(MODEL_FILTER, values, indent=10) if per_model else ""
    values["fallback_policy"] = _included(MODEL_SUBSETS if per_model else ROUND_ROBIN, values, indent=14)
    return string.Template(path.read_text()).substitute(values)


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token


def _removals(headers: frozenset[str]) -> str:
    """The header_mutation filter's request_mutations removing `headers`, as a YAML flow list."""
    return "[" + ", ".join(f"{{remove: {name}}}" for name in sorted(headers)) + "]"


def _included(fragment: Path, values: dict[str, str], *, indent: int) -> str:
    """`fragment` rendered with `values`, without its comment lines, indented to sit at a placeholder
    that is itself indented by `indent` spaces (its first line takes the placeholder's place)."""
    lines = [line for line in fragment.read_text().splitlines() if not line.startswith("#")]
    text = string.Template("\n".join(lines).strip("\n")).substitute(values)
    return textwrap.indent(text, " " * indent).lstrip(" ")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Split "ip:port" or "[ipv6]:port" into (ip, port); raises ValueError if it is neither."""
    host, sep, port_text = endpoint.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise ValueError(f"endpoint {endpoint!r} is not 'ip:port' (IPv6: '[addr]:port')") from None
    if not sep:
        raise ValueError(f"endpoint {endpoint!r} has no port; expected 'ip:port'")
    _check_port(f"port of {endpoint!r}", port)
    return host, port


def _pickers(addresses: str | Sequence[str], health_ports: int | Sequence[int]) -> list[tuple[str, int, int]]:
    """(ip, ext_proc port, health port) of each picker replica, in the order given, once each.
    Raises ValueError for a bad endpoint, port, or a health-port list of another length."""
    listed = [addresses] if isinstance(addresses, str) else list(addresses)
    endpoints = list(dict.fromkeys(parse_endpoint(a) for a in listed))
    if not endpoints:
        raise ValueError("picker_address: name at least one picker ('ip:port')")
    if len(endpoints) != len(listed):
        raise ValueError(f"picker_address lists a replica twice: {listed}")
    ports = [health_ports] * len(endpoints) if isinstance(health_ports, int) else list(health_ports)
    if len(ports) != len(endpoints):
        raise ValueError(
            f"picker_health_port: {len(ports)} ports for {len(endpoints)} pickers; give one for all or "
            "one per picker, in the same order"
        )
    for port in ports:
        _check_port("picker_health_port", port)
    return [(host, port, health) for (host, port), health in zip(endpoints, ports, strict=True)]


def _picker_endpoints(pickers: list[tuple[str, int, int]]) -> str:
    """The endpoint_picker cluster's lb_endpoints as a YAML flow list, each with its health port."""
    items = [
        f"{{endpoint: {{address: {{socket_address: {{address: '{host}', port_value: {port}}}}}, "
        f"health_check_config: {{port_value: {health}}}}}}}"
        for host, port, health in pickers
    ]
    return "[" + ", ".join(items) + "]"


def _check_port(name: str, port: int) -> None:
    if not 0 < port < 65536:
        raise ValueError(f"{name}={port} is not a TCP port (1-65535)")


def _duration(ms: int) -> str:
    return f"{ms / 1000:.3f}s"


def _models_of(workers: Workers) -> dict[tuple[str, int], list[str]]:
    """Each worker endpoint (in the order given, once) and the models it serves ([] when `workers` is
    a plain list). Raises ValueError for a bad endpoint or model name."""
    served: dict[tuple[str, int], list[str]] = {}
    if isinstance(workers, str):
        raise ValueError(
            f"workers={workers!r}: pass a list of 'ip:port' (or a mapping of model to such lists)"
        )
    if not isinstance(workers, Mapping):
        for worker in workers:
            served.setdefault(parse_endpoint(worker), [])
        return served
    for model, endpoints in workers.items():
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"workers: model name {model!r} is not a non-empty string")
        if isinstance(endpoints, str):
            raise ValueError(f"workers of model {model!r}: pass a list of 'ip:port', not {endpoints!r}")
        if not endpoints:
            raise ValueError(f"workers: model {model!r} has no worker")
        for worker in endpoints:
            models = served.setdefault(parse_endpoint(worker), [])
            if model not in models:
                models.append(model)
    return served


def _lb_endpoints(served: dict[tuple[str, int], list[str]]) -> str:
    """A YAML flow list of lb_endpoints (flow style keeps the template's indentation irrelevant), each
    with its models as envoy.lb metadata when more than one model is served (JSON strings are YAML)."""
    per_model = len({m for models in served.values() for m in models}) > 1
    items = []
    for (host, port), models in served.items():
        item = f"endpoint: {{address: {{socket_address: {{address: '{host}', port_value: {port}}}}}}}"
        if per_model:
            model = json.dumps(models[0] if len(models) == 1 else models)
            item += f", metadata: {{filter_metadata: {{envoy.lb: {{model: {model}}}}}}}"
        items.append("{" + item + "}")
    return "[" + ", ".join(items) + "]"


def _picker_transport_socket(tls: bool | PickerTls, pickers: list[tuple[str, int, int]]) -> str:
    """The endpoint_picker cluster's transport_socket line ("" for plaintext), as one JSON (= YAML
    flow) mapping so the template's indentation does not matter and paths need no escaping. Without
    a server name, the name checked is the picker's IP, which several replicas would need to share
    (ValueError otherwise)."""
    if tls is False:
        return ""
    tls = PickerTls() if tls is True else tls
    if (tls.cert_file is None) != (tls.key_file is None):
        raise ValueError("picker_tls: cert_file and key_file go together")
    common: dict[str, object] = {"alpn_protocols": ["h2"]}
    if tls.cert_file is not None:
        common["tls_certificates"] = [
            {"certificate_chain": {"filename": tls.cert_file}, "private_key": {"filename": tls.key_file}}
        ]
    if tls.ca_file is not None:
        hosts = sorted({host for host, _, _ in pickers})
        if not tls.server_name and len(hosts) > 1:
            raise ValueError(
                f"picker_tls: pickers on several IPs ({', '.join(hosts)}) need a server_name (the "
                "name in every replica's certificate): Envoy checks one name for the whole cluster"
            )
        san = (
            {"san_type": "DNS", "matcher": {"exact": tls.server_name}}
            if tls.server_name
            else {"san_type": "IP_ADDRESS", "matcher": {"exact": hosts[0]}}
        )
        common["validation_context"] = {
            "trusted_ca": {"filename": tls.ca_file},
            "match_typed_subject_alt_names": [san],
        }
    context: dict[str, object] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": common,
    }
    if tls.server_name:
        context["sni"] = tls.server_name
    socket = {"name": "envoy.transport_sockets.tls", "typed_config": context}
    return "transport_socket: " + json.dumps(socket)
