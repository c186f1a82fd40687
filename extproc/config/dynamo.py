"""Knobs of Dynamo's frontend and engines on a picker's command line: each named at startup.

Dynamo's router guides (../shared/dynamo-docs/) give whole command lines: the frontend's HTTP port,
its discovery and request planes, the engines' own event flags. So that such a command line starts
the picker unchanged, every one of them is an option here, and `dynamo_notices` turns each one given
(flag, DYN_<FLAG> variable or `router:` file key) into one startup line saying what it means here and
what to use instead; never a silent no-op, never a refusal. Those that can apply do:
`--event-plane nats` without a NATS server means Dynamo's default, nats://localhost:4222
(`with_event_plane`); `--event-plane zmq` hears Dynamo's ZMQ event plane through `--zmq-broker-url`
or the publishers in the file store of `--discovery-backend file` (`with_zmq_plane`), which also
names the workers' local indexers (`local_indexer_store`). The router's own such knobs
(--router-track-output-blocks, --router-event-threads, --aic-*) are in router.py, beside the
settings they qualify."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from extproc.config.events import NATS_URL, EventsConfig, read_events
from extproc.config.options import ConfigError, Option, Reader, _int_or_none

DEFAULT_NATS_URL = "nats://localhost:4222"  # Dynamo's runtime without NATS_SERVER
_TCP = re.compile(r"tcp://[^\s/]+:\d{1,5}")


def _engine(flag: str, whose: str, what: str, kind: Any = bool) -> Option[Any]:
    default = False if kind is bool else None
    return Option(flag, kind, default, f"{whose}'s flag ({what}). Accepted; no effect here.")


ENABLE_LOCAL_INDEXER = _engine(
    "--enable-local-indexer",
    "Dynamo workers",
    "a local indexer the router queries on start; the picker queries it with --discovery-backend file",
)
KV_EVENTS_CONFIG = _engine("--kv-events-config", "vLLM's and SGLang's", "their ZMQ KV event publisher", str)
PUBLISH_EVENTS_AND_METRICS = _engine(
    "--publish-events-and-metrics", "TensorRT-LLM workers", "their KV events and metrics"
)
ENABLE_STREAMING_SESSION = _engine(
    "--enable-streaming-session", "SGLang", "the session RPCs Dynamo's AgentController calls"
)
MODEL = _engine("--model", "The engines", "the model they load", str)
EVENT_PLANE = Option(
    "--event-plane",
    str,
    "nats",
    "Dynamo's KV event transport. nats, given: the picker hears Dynamo's NATS event plane at --nats-url, "
    f"NATS_SERVER or else {DEFAULT_NATS_URL}, as Dynamo does (not given: only with --nats-url or "
    "NATS_SERVER). zmq: the picker hears Dynamo's ZMQ event plane, through the brokers of "
    "--zmq-broker-url, else from each publisher advertised in Dynamo's file store (--discovery-backend "
    "file); Dynamo's etcd and Kubernetes discovery cannot be read here (startup says so).",
    choices=("nats", "zmq"),
)
ZMQ_BROKER_URL: Option[str | None] = Option(
    "--zmq-broker-url",
    str,
    None,
    "Dynamo's ZMQ event plane brokers, as its workers' DYN_ZMQ_BROKER_URL: 'xsub=tcp://host:5555 , "
    "xpub=tcp://host:5556' (several brokers: URLs separated by ';'). With --event-plane zmq the picker "
    "subscribes at every xpub endpoint; a message that comes through two brokers is applied once.",
)
ZMQ_BROKER_ENABLED = Option(
    "--zmq-broker-enabled",
    bool,
    False,
    "Dynamo's DYN_ZMQ_BROKER_ENABLED: its ZMQ event plane's brokers found in Dynamo's discovery. "
    "Accepted; not read here (startup says so): name the brokers with --zmq-broker-url.",
)
DISCOVERY_BACKEND: Option[str | None] = Option(
    "--discovery-backend",
    str,
    None,
    "Dynamo's worker discovery (etcd, kubernetes, file, mem). The picker's workers come from the config "
    "file's workers: or --discovery-dns. file: with KV events on NATS core or Dynamo's ZMQ event plane, "
    "the picker reads the workers' KV event sources in Dynamo's file store (--file-kv), rebuilds each "
    "worker that has a local indexer from it (on start, when it appears, after lost events) and, with "
    "--event-plane zmq, connects to each ZMQ publisher advertised there. The others: accepted, no effect "
    "(startup says so).",
)
FILE_KV: Option[str | None] = Option(
    "--file-kv",
    str,
    None,
    "Dynamo's file discovery store, as its workers' DYN_FILE_KV (default $TMPDIR/dynamo_store_kv), read "
    "with --discovery-backend file.",
)
REQUEST_PLANE: Option[str | None] = Option(
    "--request-plane",
    str,
    None,
    "Dynamo's transport of requests to workers (tcp, http, nats). Accepted; here Envoy sends them over "
    "HTTP (startup says so).",
)
STATIC_ENDPOINT: Option[str | None] = Option(
    "--static-endpoint",
    str,
    None,
    "Dynamo's static worker endpoint (namespace.component.endpoint). Accepted; the picker's workers are "
    "listed in the config file or found by DNS, and KV routing works with both (startup says so).",
)
HTTP_PORT = Option(
    "--http-port",
    _int_or_none,
    None,
    "Dynamo frontend's OpenAI HTTP port. Accepted; Envoy serves HTTP here, and /metrics and "
    "/busy_threshold are on --admin-port (startup says so).",
)

DYNAMO_OPTIONS: tuple[Option[Any], ...] = (
    EVENT_PLANE,
    ZMQ_BROKER_URL,
    ZMQ_BROKER_ENABLED,
    DISCOVERY_BACKEND,
    FILE_KV,
    REQUEST_PLANE,
    STATIC_ENDPOINT,
    HTTP_PORT,
    ENABLE_LOCAL_INDEXER,
    KV_EVENTS_CONFIG,
    PUBLISH_EVENTS_AND_METRICS,
    ENABLE_STREAMING_SESSION,
    MODEL,
)


def with_event_plane(reader: Reader, events: Reader) -> Reader:
    """`events`' reader, with Dynamo's default NATS server when --event-plane nats names none."""
    if _nats_by_default(reader, events):
        return dataclasses.replace(events, environ={**events.environ, "NATS_SERVER": DEFAULT_NATS_URL})
    return events


def file_store(reader: Reader) -> str | None:
    """Dynamo's file discovery store when --discovery-backend file, else None."""
    if reader.read(DISCOVERY_BACKEND) != "file":
        return None
    return reader.read(FILE_KV) or f"{reader.environ.get('TMPDIR') or '/tmp'}/dynamo_store_kv"


def parse_broker_url(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Dynamo's DYN_ZMQ_BROKER_URL, `xsub=<urls> , xpub=<urls>` (urls `;`-separated): the XSUB and
    XPUB endpoints. Raises ValueError, naming what is wrong."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2:
        raise ValueError(f"expected 'xsub=<urls> , xpub=<urls>', got {text!r}")
    found: dict[str, tuple[str, ...]] = {}
    for part in parts:
        name, sep, urls = part.partition("=")
        if not sep or name.strip() not in ("xsub", "xpub"):
            raise ValueError(f"expected an 'xsub=' or 'xpub=' part, got {part!r}")
        found[name.strip()] = tuple(url.strip() for url in urls.split(";") if url.strip())
    xsub, xpub = found.get("xsub", ()), found.get("xpub", ())
    if not xsub or not xpub:
        raise ValueError(f"at least one xsub and one xpub endpoint are needed, got {text!r}")
    for url in xsub + xpub:
        if not _TCP.fullmatch(url):
            raise ValueError(f"expected tcp://host:port, got {url!r}")
    return xsub, xpub


def with_zmq_plane(reader: Reader, events: EventsConfig) -> EventsConfig:
    """`events` with Dynamo's ZMQ event plane when --event-plane zmq: its brokers (--zmq-broker-url)
    and, with --discovery-backend file, the store its direct publishers are listed in. Raises
    ConfigError for a malformed broker URL."""
    if reader.read(EVENT_PLANE) != "zmq":
        return events
    brokers: tuple[str, ...] = ()
    if (url := reader.read(ZMQ_BROKER_URL)) is not None:
        try:
            _, brokers = parse_broker_url(url)
        except ValueError as exc:
            raise ConfigError(f"invalid zmq-broker-url: {exc}") from None
    return dataclasses.replace(events, dynamo_zmq_plane=True, zmq_brokers=brokers)


def local_indexer_store(reader: Reader, events: EventsConfig) -> str | None:
    """The file store the picker reads Dynamo's workers from: --discovery-backend file with KV events
    over NATS core or Dynamo's ZMQ event plane (the JetStream consumer of --router-durable-kv-events
    has its own snapshots)."""
    store = file_store(reader)
    usable = (events.nats_url is not None or events.dynamo_zmq_plane) and not events.durable_kv_events
    return store if usable else None


def dynamo_notices(reader: Reader, events: Reader) -> tuple[str, ...]:
    """One line for each of these knobs given, saying what it means here and what to use instead."""
    plane = reader.read(EVENT_PLANE)
    if _nats_by_default(reader, events):
        plane_line = f"no --nats-url or NATS_SERVER, so NATS at {DEFAULT_NATS_URL} as in Dynamo"
    elif plane == "zmq":
        plane_line = _zmq_plane_line(reader, events)
    else:
        plane_line = ""  # nats with a server named: the picker does what Dynamo does, nothing to say
    lines: dict[Option[Any], str] = {
        EVENT_PLANE: plane_line,
        ZMQ_BROKER_URL: ""
        if plane == "zmq"
        else "Dynamo's ZMQ event plane brokers, used only with --event-plane zmq (as in Dynamo)",
        ZMQ_BROKER_ENABLED: "brokers found in Dynamo's discovery are not looked up: name them with "
        "--zmq-broker-url (DYN_ZMQ_BROKER_URL)",
        DISCOVERY_BACKEND: _discovery_line(reader, events),
        REQUEST_PLANE: "requests reach the workers through Envoy over HTTP, not over Dynamo's request plane",
        STATIC_ENDPOINT: "the picker's workers are listed in the config file (or found with "
        "--discovery-dns), and KV routing works with them",
        HTTP_PORT: "the picker serves no OpenAI HTTP (Envoy's listener does: envoy-config --listen-port); "
        "/metrics and /busy_threshold are on --admin-port",
        ENABLE_LOCAL_INDEXER: "a worker flag: the picker queries the workers' local indexers with "
        "--discovery-backend file (Dynamo's file discovery, --file-kv); otherwise it rebuilds from the "
        "engines' ZMQ replay (--kv-replay-port) or JetStream (--router-durable-kv-events)",
        KV_EVENTS_CONFIG: _kv_events_config(reader.read(KV_EVENTS_CONFIG)),
        PUBLISH_EVENTS_AND_METRICS: "a TensorRT-LLM worker flag: the picker hears those events over NATS "
        "(--nats-url)",
        ENABLE_STREAMING_SESSION: "an SGLang flag: the picker pins sessions itself (--session-ttl-secs) and "
        "does not call the workers' open_session/close_session",
        MODEL: "an engine flag: the picker's models come from the config file's models: "
        "(or --discovery-model)",
    }
    recovering = local_indexer_store(reader, _events(reader, events)) is not None
    notices = []
    for opt, line in lines.items():
        source = reader.source(opt)
        if source is None or not line:
            continue
        if opt is not EVENT_PLANE and not (opt is DISCOVERY_BACKEND and recovering):
            line = f"accepted from Dynamo, no effect here: {line}"
        notices.append(f"{source}={reader.read(opt)}: {line}" if opt is EVENT_PLANE else f"{source}: {line}")
    return tuple(notices)


def _discovery_line(reader: Reader, events: Reader) -> str:
    store = file_store(reader)
    if store is None:
        return (
            "the picker does not use Dynamo's discovery: workers come from the config file's workers: or "
            "--discovery-dns (--discovery-backend file recovers workers from their local indexers)"
        )
    if local_indexer_store(reader, _events(reader, events)) is None:
        return (
            f"Dynamo's discovery: its file store {store} is read only with KV events over NATS core "
            "(--nats-url) or Dynamo's ZMQ event plane (--event-plane zmq), not with "
            "--router-durable-kv-events; workers come from the config file's workers: or --discovery-dns"
        )
    return (
        f"Dynamo's file discovery at {store}: each worker with a local indexer is rebuilt from it (on "
        "start, when it appears, after lost events); workers still come from the config file's workers: "
        "or --discovery-dns"
    )


def _events(reader: Reader, events: Reader) -> EventsConfig:
    return with_zmq_plane(reader, read_events(with_event_plane(reader, events)))


def _zmq_plane_line(reader: Reader, events: Reader) -> str:
    config = _events(reader, events)
    if config.durable_kv_events:
        return (
            "Dynamo's ZMQ event plane is not heard with --router-durable-kv-events (JetStream carries them)"
        )
    if config.zmq_brokers:
        brokers = ", ".join(config.zmq_brokers)
        return f"the picker hears Dynamo's ZMQ event plane through the brokers at {brokers}"
    store = local_indexer_store(reader, config)
    if store is not None:
        return f"the picker hears Dynamo's ZMQ event plane from each publisher advertised in {store}"
    return (
        "Dynamo's ZMQ event plane cannot be heard: its publishers are advertised in Dynamo's discovery, "
        "which the picker reads only as a file store (--discovery-backend file, --file-kv), or give the "
        "brokers (--zmq-broker-url, DYN_ZMQ_BROKER_URL); the workers' caches are predicted from routing "
        "decisions meanwhile"
    )


def _nats_by_default(reader: Reader, events: Reader) -> bool:
    """--event-plane nats given, and no NATS server named: Dynamo's default server applies."""
    given = reader.source(EVENT_PLANE) is not None
    return given and reader.read(EVENT_PLANE) == "nats" and events.source(NATS_URL) is None


def _kv_events_config(text: str | None) -> str:
    """What --kv-events-config's JSON means for the picker: the ports to subscribe to."""
    base = "an engine flag: the picker subscribes with --kv-events-port and --kv-replay-port"
    try:
        config = json.loads(text or "")
    except ValueError:
        return base
    if not isinstance(config, dict):
        return base
    if config.get("enable_kv_cache_events") is False:
        return "an engine flag; with the engine's events off, give the picker --no-router-kv-events"
    ports = [
        f"{flag} {str(config[key]).rsplit(':', 1)[-1]}"
        for key, flag in (("endpoint", "--kv-events-port"), ("replay_endpoint", "--kv-replay-port"))
        if isinstance(config.get(key), str) and ":" in config[key]
    ]
    return f"{base} ({' '.join(ports)} for this JSON)" if ports else base
