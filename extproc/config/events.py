"""Where KV events and replica state come from: ZMQ ports, NATS (subjects, durable mode, replica sync),
NATS credentials and TLS -> `EventsConfig`. All off by default: the embedded picker.

The file section is `events:`. The NATS settings are also read from the variables Dynamo's runtime
reads (lib/runtime/src/config/environment_names.rs): NATS_SERVER, NATS_AUTH_CREDENTIALS_FILE,
NATS_AUTH_USERNAME, NATS_AUTH_PASSWORD, NATS_AUTH_TOKEN, NATS_TLS_CA_CERT_PATH,
NATS_TLS_CLIENT_CERT_PATH and NATS_TLS_CLIENT_KEY_PATH, after the DYN_ ones.
"""

from __future__ import annotations

import re
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
)
from extproc.config.tls import ClientTlsConfig

SECTION = "events"


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """Where KV events and replica state come from (all off by default: the embedded picker)."""

    kv_events_port: int | None = None
    kv_replay_port: int | None = None
    nats_url: str | None = None
    namespace: str = "dynamo"
    component: str = "backend"
    dynamo_endpoint: str = "generate"  # event plane: namespace.<ns>.component.<c>.endpoint.<this>.kv-events
    dynamo_file_kv: str | None = None  # Dynamo's file discovery store: local indexers, ZMQ publishers
    dynamo_zmq_plane: bool = False  # --event-plane zmq: Dynamo's ZMQ event plane
    zmq_brokers: tuple[str, ...] = ()  # its brokers' XPUB endpoints (--zmq-broker-url)
    durable_kv_events: bool = False
    snapshot_threshold: int = 100_000
    reset_states: bool = False
    replica_sync: bool = False
    router_id: str | None = None
    replica_sync_heartbeat_s: float = 1.0  # a replica's lease renewal (heartbeat) interval
    replica_sync_lease_s: float = 5.0  # silence after which the others forget its requests
    replica_sync_batch_s: float = 0.01  # lifecycle messages gathered this long into one batch (0: none)
    queue_size: int = 10_000  # per subscription: ZMQ SUB high-water mark, NATS pending messages
    nats_read_delay_s: float = 0.2  # NATS is read with the loop's next wake-up, or after this at most
    kv_indexer_url: str | None = None  # a Dynamo standalone KV indexer answers overlaps (no events here)
    kv_indexer_timeout_s: float = 0.05
    nats_tls: ClientTlsConfig = field(default_factory=ClientTlsConfig)
    nats_creds_file: str | None = None  # a NATS .creds file (JWT + nkey seed)
    nats_user: str | None = None
    nats_password: str | None = field(default=None, repr=False)
    nats_token: str | None = field(default=None, repr=False)

    @property
    def nats_needed(self) -> bool:
        return self.nats_url is not None

    @property
    def hears_zmq_plane(self) -> bool:
        """Dynamo's ZMQ event plane is heard: through its brokers, or from the publishers in the store."""
        live = self.dynamo_zmq_plane and not self.durable_kv_events
        return live and (bool(self.zmq_brokers) or self.dynamo_file_kv is not None)


KV_EVENTS_PORT = Option(
    "--kv-events-port",
    _int_or_none,
    None,
    "Subscribe to each worker's vLLM/SGLang ZMQ KV events on its endpoint's IP at this port "
    "(+ dp rank); a worker's `kv-events: tcp://ip:port` in the config file overrides it. vLLM: 5557.",
)
KV_REPLAY_PORT = Option(
    "--kv-replay-port",
    _int_or_none,
    None,
    "The engines' ZMQ replay port (+ dp rank), used to rebuild a worker's blocks on start, on a "
    "sequence gap and after a publisher restart; per worker: `kv-replay: tcp://ip:port`.",
)
NATS_URL: Option[str | None] = Option(
    "--nats-url",
    str,
    None,
    "NATS server (nats://host:4222) for Dynamo-style KV events, durable state and replica sync. "
    "Also read from NATS_SERVER.",
    aliases=("--nats-server",),
    env_aliases=("NATS_SERVER",),
)
NAMESPACE = Option("--namespace", str, "dynamo", "NATS subject namespace: namespace.<ns>.component...")
COMPONENT = Option("--component", str, "backend", "NATS subject component of the workers.")
DYNAMO_ENDPOINT = Option(
    "--dynamo-endpoint",
    str,
    "generate",
    "The workers' Dynamo endpoint, as `python -m dynamo.router --endpoint` names it: "
    "namespace.component.endpoint (sets --namespace and --component) or just the endpoint. With NATS "
    "the picker hears namespace.<ns>.component.<component>.endpoint.<endpoint>.kv-events, where "
    "Dynamo's own KvEventPublisher sends its msgpack events (on the endpoint a worker serves, or its "
    "kv_state_endpoint), beside the JSON kv_events subject. `*` hears every endpoint of the "
    "component: use it only when each worker and dp rank publishes on one of them (two publishers "
    "of one worker interleave event ids, and each seeming gap resets the worker).",
)
ROUTER_DURABLE_KV_EVENTS = Option(
    "--router-durable-kv-events",
    bool,
    False,
    "Consume KV events from a JetStream stream (1 hour retention) as a durable consumer, with "
    "tree snapshots in the NATS object store, so a restarted or new replica keeps the prefix state.",
)
ROUTER_SNAPSHOT_THRESHOLD = Option(
    "--router-snapshot-threshold",
    int,
    100_000,
    "Durable mode: messages in the stream before one replica snapshots the tree and purges them.",
)
ROUTER_RESET_STATES = Option(
    "--router-reset-states",
    bool,
    False,
    "Durable mode: purge the event stream, snapshot and consumers on start (start from empty).",
)
ROUTER_REPLICA_SYNC = Option(
    "--router-replica-sync",
    bool,
    False,
    "Share active requests with other picker replicas over NATS so every replica sees the whole "
    "load of each worker (prefill workers' too), and share which worker stored each Responses API "
    "answer and where each sticky session is pinned, so that a follow-up may reach any replica (a "
    "replica that starts late or restarts is handed them by another one).",
)
ROUTER_ID: Option[str | None] = Option(
    "--router-id",
    str,
    None,
    "This replica's name in replica sync and its durable consumer (default: host-pid).",
)
REPLICA_SYNC_HEARTBEAT_SECS = Option(
    "--replica-sync-heartbeat-secs",
    float,
    1.0,
    "Replica sync: seconds between two heartbeats of this replica. A heartbeat renews its lease and "
    "carries a digest of its in-flight requests, from which the others notice what they missed and "
    "ask for its whole set.",
)
REPLICA_SYNC_LEASE_SECS = Option(
    "--replica-sync-lease-secs",
    float,
    5.0,
    "Replica sync: a replica silent for this long (no heartbeat, no message) is taken for dead and "
    "the others forget its requests. At least twice the heartbeat interval.",
)
REPLICA_SYNC_BATCH_MS = Option(
    "--replica-sync-batch-ms",
    float,
    10.0,
    "Replica sync: this replica's request lifecycle messages (add, first token, free) are gathered "
    "and sent as one batch when the picker has nothing else to run (receiving a message costs more "
    "than applying it), or after this many milliseconds in a picker that never idles. 0 sends each "
    "at once. Below the heartbeat interval.",
)
EVENT_QUEUE_SIZE = Option(
    "--event-queue-size",
    int,
    10_000,
    "Messages buffered per KV event subscription (each worker's ZMQ socket, each NATS subject) while "
    "the picker is busy. Beyond it messages are dropped, counted, and the worker resynchronised.",
)

DEFAULT_READ_DELAY_MS = 200.0  # decisions catch up on replica sync; KV events 200 ms late cost nothing
DURABLE_READ_DELAY_MS = 50.0  # durable KV events: one JetStream fetch per delay while idle


def _ms(text: Any) -> float | None:
    return float(text)


NATS_READ_DELAY_MS: Option[float | None] = Option(
    "--nats-read-delay-ms",
    _ms,
    None,
    "NATS messages (KV events, replica sync, JetStream replies) are read when the picker wakes up "
    "for anything else (an ext_proc message, a timer), or after this many milliseconds at most: a "
    "wake-up costs the picker several times what handling a message does. Bytes already waiting "
    "are read at once, and a replica about to decide first applies what other replicas said that "
    "already came. 0 reads each message as it arrives. Default 200, or 50 with "
    "--router-durable-kv-events (each JetStream fetch of an idle picker waits for the delay).",
)

KV_INDEXER_URL: Option[str | None] = Option(
    "--kv-indexer-url",
    str,
    None,
    "A Dynamo standalone KV indexer (`python -m dynamo.indexer --port 8090`, ai-dynamo-runtime "
    "1.6.1): http://host:8090. The indexer consumes the engines' ZMQ KV events, once for every "
    "picker replica, and each decision asks it for the prompt's cached prefix on each worker; this "
    "picker consumes no KV events itself. It registers each worker that has a ZMQ endpoint here "
    "(`kv-events:` or --kv-events-port) under its instance id (`instance-id:`, or a numeric worker "
    "id) and its model's name; others must be registered by whoever runs the indexer. A query "
    "that fails or takes over --kv-indexer-timeout-ms routes that request by load alone.",
)
KV_INDEXER_TIMEOUT_MS = Option(
    "--kv-indexer-timeout-ms",
    float,
    50.0,
    "--kv-indexer-url: how long a decision waits for the indexer's answer before it routes by load.",
)

EVENT_OPTIONS: tuple[Option[Any], ...] = (
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    KV_INDEXER_URL,
    KV_INDEXER_TIMEOUT_MS,
    NATS_URL,
    NAMESPACE,
    COMPONENT,
    DYNAMO_ENDPOINT,
    ROUTER_DURABLE_KV_EVENTS,
    ROUTER_SNAPSHOT_THRESHOLD,
    ROUTER_RESET_STATES,
    ROUTER_REPLICA_SYNC,
    ROUTER_ID,
    REPLICA_SYNC_HEARTBEAT_SECS,
    REPLICA_SYNC_LEASE_SECS,
    REPLICA_SYNC_BATCH_MS,
    EVENT_QUEUE_SIZE,
    NATS_READ_DELAY_MS,
)

NATS_CREDS_FILE: Option[str | None] = Option(
    "--nats-creds-file",
    str,
    None,
    "NATS credentials file (.creds: user JWT and nkey seed). Also read from NATS_AUTH_CREDENTIALS_FILE.",
    env_aliases=("NATS_AUTH_CREDENTIALS_FILE",),
)
NATS_USER: Option[str | None] = Option(
    "--nats-user",
    str,
    None,
    "NATS user name, with --nats-password. Also read from NATS_AUTH_USERNAME.",
    env_aliases=("NATS_AUTH_USERNAME",),
)
NATS_PASSWORD: Option[str | None] = Option(
    "--nats-password",
    str,
    None,
    "NATS password. Prefer the environment (DYN_NATS_PASSWORD or NATS_AUTH_PASSWORD): a flag is "
    "visible to every local user in the process list.",
    env_aliases=("NATS_AUTH_PASSWORD",),
)
NATS_TOKEN: Option[str | None] = Option(
    "--nats-token",
    str,
    None,
    "NATS authentication token. Also read from NATS_AUTH_TOKEN; prefer the environment.",
    env_aliases=("NATS_AUTH_TOKEN",),
)
NATS_TLS_CA_FILE: Option[str | None] = Option(
    "--nats-tls-ca-file",
    str,
    None,
    "Connect to NATS over TLS and verify the server against this CA bundle. Also read from "
    "NATS_TLS_CA_CERT_PATH. A tls:// URL alone uses TLS with the system's roots.",
    env_aliases=("NATS_TLS_CA_CERT_PATH",),
)
NATS_TLS_CERT_FILE: Option[str | None] = Option(
    "--nats-tls-cert-file",
    str,
    None,
    "Client certificate for a NATS server that verifies clients (tls { verify: true }), with "
    "--nats-tls-key-file. Also read from NATS_TLS_CLIENT_CERT_PATH.",
    env_aliases=("NATS_TLS_CLIENT_CERT_PATH",),
)
NATS_TLS_KEY_FILE: Option[str | None] = Option(
    "--nats-tls-key-file",
    str,
    None,
    "Private key of --nats-tls-cert-file. Also read from NATS_TLS_CLIENT_KEY_PATH.",
    env_aliases=("NATS_TLS_CLIENT_KEY_PATH",),
)

NATS_OPTIONS: tuple[Option[Any], ...] = (
    NATS_CREDS_FILE,
    NATS_USER,
    NATS_PASSWORD,
    NATS_TOKEN,
    NATS_TLS_CA_FILE,
    NATS_TLS_CERT_FILE,
    NATS_TLS_KEY_FILE,
)


def read_events(reader: Reader) -> EventsConfig:
    """The event sources and NATS settings. Raises ConfigError."""
    read = reader.read
    kv_events_port = read(KV_EVENTS_PORT)
    kv_replay_port = read(KV_REPLAY_PORT)
    nats_url = read(NATS_URL)
    namespace = read(NAMESPACE)
    component = read(COMPONENT)
    dynamo_endpoint = read(DYNAMO_ENDPOINT)
    durable = read(ROUTER_DURABLE_KV_EVENTS)
    snapshot_threshold = read(ROUTER_SNAPSHOT_THRESHOLD)
    reset_states = read(ROUTER_RESET_STATES)
    replica_sync = read(ROUTER_REPLICA_SYNC)
    router_id = read(ROUTER_ID)
    heartbeat_s = read(REPLICA_SYNC_HEARTBEAT_SECS)
    lease_s = read(REPLICA_SYNC_LEASE_SECS)
    batch_ms = read(REPLICA_SYNC_BATCH_MS)
    queue_size = read(EVENT_QUEUE_SIZE)
    kv_indexer_url = read(KV_INDEXER_URL)
    kv_indexer_timeout_ms = read(KV_INDEXER_TIMEOUT_MS)
    if kv_indexer_url is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", kv_indexer_url):
        raise ConfigError(f"invalid kv-indexer-url={kv_indexer_url!r}: expected http://host:port")
    if not 0 < kv_indexer_timeout_ms <= 10_000:
        raise ConfigError(f"invalid kv-indexer-timeout-ms={kv_indexer_timeout_ms}: expected > 0 and <= 10000")
    read_delay_ms = read(NATS_READ_DELAY_MS)
    if read_delay_ms is None:
        read_delay_ms = DURABLE_READ_DELAY_MS if durable else DEFAULT_READ_DELAY_MS
    creds_file = read(NATS_CREDS_FILE)
    user = read(NATS_USER)
    password = read(NATS_PASSWORD)
    token = read(NATS_TOKEN)
    tls_ca_file = read(NATS_TLS_CA_FILE)
    tls_cert_file = read(NATS_TLS_CERT_FILE)
    tls_key_file = read(NATS_TLS_KEY_FILE)

    namespace, component, dynamo_endpoint = dynamo_names(namespace, component, dynamo_endpoint)
    check_pair(NATS_USER, user, NATS_PASSWORD, password)
    check_pair(NATS_TLS_CERT_FILE, tls_cert_file, NATS_TLS_KEY_FILE, tls_key_file)
    check_readable(NATS_CREDS_FILE, creds_file)
    check_readable(NATS_TLS_CA_FILE, tls_ca_file)
    check_readable(NATS_TLS_CERT_FILE, tls_cert_file)
    check_readable(NATS_TLS_KEY_FILE, tls_key_file)
    methods = ((NATS_CREDS_FILE, creds_file), (NATS_USER, user), (NATS_TOKEN, token))
    given = [opt.flag for opt, value in methods if value is not None]
    if len(given) > 1:
        raise ConfigError(
            f"NATS authentication: give one of a creds file, user/password or a token, not {', '.join(given)}"
        )
    check_positive("event-queue-size", queue_size)
    if (durable or replica_sync) and not nats_url:
        raise ConfigError(
            "--router-durable-kv-events and --router-replica-sync need NATS: set --nats-url or NATS_SERVER"
        )
    if not 0 < heartbeat_s <= 60:
        raise ConfigError(f"invalid replica-sync-heartbeat-secs={heartbeat_s}: expected > 0 and <= 60")
    if not 2 * heartbeat_s <= lease_s <= 3600:
        raise ConfigError(
            f"invalid replica-sync-lease-secs={lease_s}: expected at least twice "
            f"--replica-sync-heartbeat-secs ({heartbeat_s}) and at most 3600"
        )
    if not 0 <= batch_ms < 1000 * heartbeat_s:
        raise ConfigError(
            f"invalid replica-sync-batch-ms={batch_ms}: expected >= 0 and below the heartbeat interval"
        )
    if not 0 <= read_delay_ms <= 1000:
        raise ConfigError(f"invalid nats-read-delay-ms={read_delay_ms}: expected >= 0 and <= 1000")
    if snapshot_threshold < 1:
        raise ConfigError(f"invalid router-snapshot-threshold={snapshot_threshold}: expected >= 1")
    return EventsConfig(
        kv_events_port=kv_events_port,
        kv_replay_port=kv_replay_port,
        nats_url=nats_url,
        namespace=namespace,
        component=component,
        dynamo_endpoint=dynamo_endpoint,
        durable_kv_events=durable,
        snapshot_threshold=snapshot_threshold,
        reset_states=reset_states,
        replica_sync=replica_sync,
        router_id=router_id,
        replica_sync_heartbeat_s=heartbeat_s,
        replica_sync_lease_s=lease_s,
        replica_sync_batch_s=batch_ms / 1000,
        queue_size=queue_size,
        nats_read_delay_s=read_delay_ms / 1000,
        kv_indexer_url=kv_indexer_url,
        kv_indexer_timeout_s=kv_indexer_timeout_ms / 1000,
        nats_tls=ClientTlsConfig(ca_file=tls_ca_file, cert_file=tls_cert_file, key_file=tls_key_file),
        nats_creds_file=creds_file,
        nats_user=user,
        nats_password=password,
        nats_token=token,
    )


_DYNAMO_NAME = re.compile(r"[A-Za-z0-9_-]+")


def dynamo_names(namespace: str, component: str, endpoint: str) -> tuple[str, str, str]:
    """(namespace, component, endpoint) from --dynamo-endpoint, which may name all three.

    `ns.component.endpoint` (optionally `dyn://`-prefixed, as Dynamo's runtime takes it) sets the
    namespace and component, unless --namespace or --component (not their defaults) name others.
    Raises ConfigError.
    """
    path = endpoint.strip().removeprefix("dyn://")
    parts = path.split(".")
    accepted = "an endpoint name, '*', or namespace.component.endpoint (e.g. dynamo.backend.generate)"
    if len(parts) == 3:
        ns, comp, name = parts
        for what, value in (("namespace", ns), ("component", comp)):
            if not _DYNAMO_NAME.fullmatch(value):
                raise ConfigError(
                    f"invalid dynamo-endpoint={endpoint!r}: {what} {value!r} is not a Dynamo name "
                    "(letters, digits, '-' and '_')"
                )
        for given, opt, named in ((namespace, NAMESPACE, ns), (component, COMPONENT, comp)):
            if given not in (opt.default, named):
                raise ConfigError(
                    f"invalid dynamo-endpoint={endpoint!r}: it names {opt.flag.lstrip('-')} {named!r} but "
                    f"{opt.flag} is {given!r}; give one of them"
                )
        namespace, component = ns, comp
    elif len(parts) == 1:
        name = path
    else:
        raise ConfigError(f"invalid dynamo-endpoint={endpoint!r}: expected {accepted}")
    if name != "*" and not _DYNAMO_NAME.fullmatch(name):
        raise ConfigError(f"invalid dynamo-endpoint={endpoint!r}: expected {accepted}")
    return namespace, component, name
