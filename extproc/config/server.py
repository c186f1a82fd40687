"""The picker's own settings: its listeners (ext_proc, health, admin), request limits, tokenizer,
the TLS of its servers, and shutdown -> `ServerConfig`, which `PickerConfig` carries as flat fields.

The file section is `picker:` (which also holds the router-group flags, groups.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from extproc.config.options import (
    ConfigError,
    Option,
    Reader,
    _int_or_none,
    check_at_least_zero,
    check_pair,
    check_positive,
    check_readable,
)
from extproc.config.tls import TlsConfig
from extproc.request.token_cache import DEFAULT_PIECE_CACHE_BYTES

SECTION = "picker"

HOST = Option(
    "--host",
    str,
    "127.0.0.1",
    "Address for the ext_proc and health servers; 0.0.0.0 to listen beyond loopback.",
)
PORT = Option("--port", int, 9002, "ext_proc gRPC port (Inference Extension convention: 9002).")
EXT_PROC_SERVER = Option(
    "--ext-proc-server",
    str,
    "h2",
    "What serves ext_proc's gRPC stream: 'h2', the picker's own HTTP/2 server on its event loop "
    "(about a third of grpcio's CPU per request), or 'grpcio' (grpc.aio). Health and the "
    "router-group API are grpcio either way.",
    choices=("h2", "grpcio"),
)
HEALTH_PORT = Option(
    "--health-port",
    int,
    9003,
    "gRPC health port (liveness, readiness, ExternalProcessor, inference-extension).",
)
ADMIN_PORT = Option(
    "--admin-port",
    _int_or_none,
    None,
    "HTTP admin port: /metrics (Prometheus), /health, /debug/workers (per-worker cache source and "
    "load). 0 picks a free port. Off when not set. Also read from DYN_SYSTEM_PORT (Dynamo's standalone "
    "router serves its /metrics there).",
    env_aliases=("DYN_SYSTEM_PORT",),
)
ADMIN_HOST = Option(
    "--admin-host",
    str,
    "127.0.0.1",
    "Address of the admin HTTP server; 0.0.0.0 to expose it beyond loopback.",
)
ADMIN_TOKEN: Option[str | None] = Option(
    "--admin-token",
    str,
    None,
    "Bearer token required by mutating admin endpoints (POST /busy_threshold with values). Also "
    "read from DYN_ADMIN_TOKEN. Without it, admin writes are refused (403) unless "
    "--admin-allow-unauthenticated-writes.",
)
ADMIN_ALLOW_UNAUTHENTICATED_WRITES = Option(
    "--admin-allow-unauthenticated-writes",
    bool,
    False,
    "Without --admin-token, let anyone who reaches the admin port change busy thresholds (the "
    "picker says so at start). Off: admin writes need --admin-token.",
)
ROUTER_QUEUE_MAX_WAIT_MS = Option(
    "--router-queue-max-wait-ms",
    float,
    30_000.0,
    "A request queued longer than this is answered 503 (429 when marked sheddable).",
)
SESSION_TTL_SECS = Option(
    "--session-ttl-secs",
    float,
    300.0,
    "Sticky sessions (nvext.session_control.session_id or x-session-id): seconds of inactivity "
    "after which a session's worker pin lapses.",
)
SESSION_MAX_PINS = Option(
    "--session-max-pins",
    int,
    100_000,
    "Sticky sessions pinned per model at most; a new session beyond it evicts the least recently "
    'used pin (extproc_session_pins_dropped_total{reason="evicted"}).',
)
SESSION_ID_MAX_LENGTH = Option(
    "--session-id-max-length",
    int,
    256,
    "Longest sticky-session id accepted, in characters; a longer one is answered 400.",
)
WORKER_SESSION_CONTROL = Option(
    "--worker-session-control",
    str,
    "sglang",
    'Worker-side sessions (nvext.session_control.action "open" / "close", as Dynamo\'s session '
    "control): sglang calls the chosen worker's SGLang /open_session before the request and "
    "/close_session after the closing request ends or when the session's pin lapses (best effort, "
    "counted in extproc_worker_session_calls_total); off makes no call (pins still work).",
    choices=("sglang", "off"),
)
MAX_BODY_BYTES = Option(
    "--max-body-bytes",
    int,
    16 * 1024 * 1024,
    "Larger request bodies are answered 413. An upload (a multipart form, such as "
    "/v1/audio/transcriptions) sent FULL_DUPLEX_STREAMED is routed once its form's model field is read: "
    "only what comes before that field counts.",
)
BODY_PARSE_WORKERS = Option(
    "--body-parse-workers",
    int,
    1,
    "Processes that parse request bodies larger than --body-parse-inline-bytes, so that a big body "
    "never holds the event loop (JSON parsing holds Python's GIL: a thread would not help). At most "
    "this many are parsed at once; each may use about 50x the body's size for deeply nested JSON. "
    "0 parses every body on the event loop.",
)
BODY_PARSE_INLINE_BYTES = Option(
    "--body-parse-inline-bytes",
    int,
    16 * 1024,
    "Bodies up to this size are parsed on the event loop (about 0.5 ms at 16 KiB even when deeply "
    "nested; 2.3 ms at 64 KiB, 29 ms at 256 KiB).",
)
OUTLIER_CONSECUTIVE_5XX = Option(
    "--outlier-consecutive-5xx",
    int,
    5,
    "Eject a worker from routing after this many 5xx answers in a row (Envoy's own 503 for a worker "
    "it cannot reach counts), as Envoy's outlier detection would; 0 turns it off. At most half a "
    "model's workers are ejected at once.",
)
OUTLIER_BASE_EJECTION_SECS = Option(
    "--outlier-base-ejection-secs",
    float,
    10.0,
    "How long a first ejection lasts; the n-th in a row lasts n times this (at most 300 s).",
)
MAX_PROMPT_TOKENS = Option(
    "--max-prompt-tokens",
    _int_or_none,
    None,
    "Requests whose prompt tokenizes to more tokens than this are answered 413 (set it to the "
    "engines' max_model_len). Off when not set.",
)
MAX_CONCURRENT_STREAMS = Option(
    "--max-concurrent-streams",
    _int_or_none,
    None,
    "ext_proc streams (one per HTTP request in flight) beyond this are answered 429 "
    "(rejected-too-many-streams) at once. Each may buffer up to --max-body-bytes. Off when not set.",
)
TOKENIZER: Option[str | None] = Option(
    "--tokenizer",
    str,
    None,
    "Hugging Face tokenizer directory (tokenizer.json + "
    "tokenizer_config.json) for models without their own. Default: byte-level tokenizer.",
)
TOKENIZE_URL: Option[str | None] = Option(
    "--tokenize-url",
    str,
    None,
    "Tokenize through the engine's /tokenize endpoint: "
    "a base URL, or 'worker' for each model's first worker. Falls back to load-only routing on failure.",
)
TOKENIZER_TIMEOUT_MS = Option(
    "--tokenizer-timeout-ms",
    float,
    2000.0,
    "Give up tokenizing after this long and route on load only.",
)
TOKENIZER_CACHE_SIZE = Option("--tokenizer-cache-size", int, 1024, "Remote tokenization results kept.")
TOKENIZER_CACHE_BYTES = Option(
    "--tokenizer-cache-bytes",
    int,
    DEFAULT_PIECE_CACHE_BYTES,
    "Bytes of token ids a local tokenizer keeps per model for the text between a chat prompt's special "
    "tokens, so that a conversation's earlier turns are not tokenized again (about 4.3 bytes a token; "
    "least recently used first out). 0: every chat prompt is tokenized whole.",
)
CONFORMANCE_HOOKS = Option(
    "--conformance-hooks",
    bool,
    False,
    "Honour the Inference Extension "
    "conformance headers (test-epp-endpoint-selection). Lets clients choose endpoints: tests only.",
)
SEED = Option("--seed", _int_or_none, None, "Seed for tie-breaking and sampling (reproducible runs).")
LOG_LEVEL = Option(
    "--log-level",
    str,
    "info",
    "debug, info, warning or error.",
    choices=("debug", "info", "warning", "error"),
)

PICKER_OPTIONS: tuple[Option[Any], ...] = (
    HOST,
    PORT,
    EXT_PROC_SERVER,
    HEALTH_PORT,
    ADMIN_PORT,
    ADMIN_HOST,
    ADMIN_TOKEN,
    ADMIN_ALLOW_UNAUTHENTICATED_WRITES,
    ROUTER_QUEUE_MAX_WAIT_MS,
    SESSION_TTL_SECS,
    SESSION_MAX_PINS,
    SESSION_ID_MAX_LENGTH,
    WORKER_SESSION_CONTROL,
    MAX_BODY_BYTES,
    BODY_PARSE_WORKERS,
    BODY_PARSE_INLINE_BYTES,
    OUTLIER_CONSECUTIVE_5XX,
    OUTLIER_BASE_EJECTION_SECS,
    MAX_PROMPT_TOKENS,
    MAX_CONCURRENT_STREAMS,
    TOKENIZER,
    TOKENIZE_URL,
    TOKENIZER_TIMEOUT_MS,
    TOKENIZER_CACHE_SIZE,
    TOKENIZER_CACHE_BYTES,
    CONFORMANCE_HOOKS,
    SEED,
    LOG_LEVEL,
)

TLS_CERT_FILE: Option[str | None] = Option(
    "--tls-cert-file",
    str,
    None,
    "Serve ext_proc and the router-group API over TLS with this PEM certificate (chain), with "
    "--tls-key-file. The gRPC health server stays plaintext (kubelet probes). Off when not set.",
)
TLS_KEY_FILE: Option[str | None] = Option("--tls-key-file", str, None, "PEM private key of --tls-cert-file.")
TLS_SELF_SIGNED = Option(
    "--tls-self-signed",
    bool,
    False,
    "Serve over TLS with a key and self-signed certificate generated at start (like the Inference "
    "Extension's --secure-serving): encrypted, but clients cannot verify who they talk to.",
)
TLS_CLIENT_CA_FILE: Option[str | None] = Option(
    "--tls-client-ca-file",
    str,
    None,
    "Mutual TLS: require every ext_proc and group API client to present a certificate signed by "
    "this CA bundle; others fail the handshake. Needs --tls-cert-file or --tls-self-signed.",
)

# --help lists these under "transport security", before the TLS flags for remote groups (groups.py)
SERVER_TLS_OPTIONS: tuple[Option[Any], ...] = (
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    TLS_SELF_SIGNED,
    TLS_CLIENT_CA_FILE,
)

SHUTDOWN_GRACE_SECS = Option(
    "--shutdown-grace-secs",
    float,
    25.0,
    "On SIGTERM: report not ready, refuse new ext_proc streams, give in-flight ones this long to "
    "finish, then cancel the rest and exit. Keep it below the pod's terminationGracePeriodSeconds "
    "(30 in gateway/base). 0 cancels at once.",
)

SHUTDOWN_DELAY_SECS = Option(
    "--shutdown-delay-secs",
    float,
    0.0,
    "On SIGTERM: report not ready at once but keep routing new ext_proc streams for this long before "
    "refusing them (and before the --shutdown-grace-secs drain), so that load balancers and the "
    "gateway take this replica out first: a stream that reaches a stopping gRPC server is answered "
    "CANCELLED, a 503 for its client unless the gateway retries it. Set it to the time your gateway "
    "needs to notice (Envoy's health checks: interval x unhealthy threshold; Kubernetes: endpoint "
    "removal, a few seconds); the ports stay bound meanwhile. 0 (default): refuse at once.",
)

SHUTDOWN_OPTIONS: tuple[Option[Any], ...] = (SHUTDOWN_DELAY_SECS, SHUTDOWN_GRACE_SECS)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The picker's own settings, in the units `PickerConfig` carries them (seconds, not ms)."""

    host: str
    port: int
    ext_proc_server: str
    health_port: int
    admin_port: int | None
    admin_host: str
    admin_token: str | None
    admin_allow_unauthenticated_writes: bool
    queue_max_wait_s: float
    session_ttl_s: float
    session_max_pins: int
    session_id_max_length: int
    worker_session_control: str
    max_body_bytes: int
    body_parse_workers: int
    body_parse_inline_bytes: int
    max_prompt_tokens: int | None
    outlier_consecutive_5xx: int
    outlier_base_ejection_s: float
    max_concurrent_streams: int | None
    tokenizer: str | None
    tokenize_url: str | None
    tokenizer_timeout_s: float
    tokenizer_cache_size: int
    tokenizer_cache_bytes: int
    conformance_hooks: bool
    seed: int | None
    log_level: str
    tls: TlsConfig
    shutdown_grace_s: float
    shutdown_delay_s: float


def read_server(reader: Reader) -> ServerConfig:
    """The picker's own settings. Raises ConfigError."""
    read = reader.read
    host = read(HOST)
    port = read(PORT)
    ext_proc_server = read(EXT_PROC_SERVER)
    health_port = read(HEALTH_PORT)
    admin_port = read(ADMIN_PORT)
    admin_host = read(ADMIN_HOST)
    admin_token = read(ADMIN_TOKEN)
    admin_allow_unauthenticated_writes = read(ADMIN_ALLOW_UNAUTHENTICATED_WRITES)
    queue_max_wait_ms = read(ROUTER_QUEUE_MAX_WAIT_MS)
    session_ttl_secs = read(SESSION_TTL_SECS)
    session_max_pins = read(SESSION_MAX_PINS)
    session_id_max_length = read(SESSION_ID_MAX_LENGTH)
    worker_session_control = read(WORKER_SESSION_CONTROL)
    max_body_bytes = read(MAX_BODY_BYTES)
    body_parse_workers = read(BODY_PARSE_WORKERS)
    body_parse_inline_bytes = read(BODY_PARSE_INLINE_BYTES)
    outlier_consecutive_5xx = read(OUTLIER_CONSECUTIVE_5XX)
    outlier_base_ejection_secs = read(OUTLIER_BASE_EJECTION_SECS)
    max_prompt_tokens = read(MAX_PROMPT_TOKENS)
    max_concurrent_streams = read(MAX_CONCURRENT_STREAMS)
    tokenizer = read(TOKENIZER)
    tokenize_url = read(TOKENIZE_URL)
    tokenizer_timeout_ms = read(TOKENIZER_TIMEOUT_MS)
    tokenizer_cache_size = read(TOKENIZER_CACHE_SIZE)
    tokenizer_cache_bytes = read(TOKENIZER_CACHE_BYTES)
    conformance_hooks = read(CONFORMANCE_HOOKS)
    seed = read(SEED)
    log_level = read(LOG_LEVEL)

    check_positive("router-queue-max-wait-ms", queue_max_wait_ms)
    check_positive("session-ttl-secs", session_ttl_secs)
    check_positive("session-max-pins", session_max_pins)
    check_positive("session-id-max-length", session_id_max_length)
    check_at_least_zero("body-parse-workers", body_parse_workers)
    check_at_least_zero("body-parse-inline-bytes", body_parse_inline_bytes)
    check_at_least_zero("outlier-consecutive-5xx", outlier_consecutive_5xx)
    check_at_least_zero("tokenizer-cache-bytes", tokenizer_cache_bytes)
    check_positive("outlier-base-ejection-secs", outlier_base_ejection_secs)
    if max_prompt_tokens is not None:
        check_positive("max-prompt-tokens", max_prompt_tokens)
    if max_concurrent_streams is not None:
        check_positive("max-concurrent-streams", max_concurrent_streams)
    tls = read_server_tls(reader)
    shutdown_grace_secs = read(SHUTDOWN_GRACE_SECS)
    check_at_least_zero("shutdown-grace-secs", shutdown_grace_secs)
    shutdown_delay_secs = read(SHUTDOWN_DELAY_SECS)
    if not 0 <= shutdown_delay_secs < math.inf:  # NaN or inf would hold the stop until a second signal
        raise ConfigError(f"invalid shutdown-delay-secs={shutdown_delay_secs}: expected a finite number >= 0")
    return ServerConfig(
        host=host,
        port=port,
        ext_proc_server=ext_proc_server,
        health_port=health_port,
        admin_port=admin_port,
        admin_host=admin_host,
        admin_token=admin_token,
        admin_allow_unauthenticated_writes=admin_allow_unauthenticated_writes,
        queue_max_wait_s=queue_max_wait_ms / 1000.0,
        session_ttl_s=session_ttl_secs,
        session_max_pins=session_max_pins,
        session_id_max_length=session_id_max_length,
        worker_session_control=worker_session_control,
        max_body_bytes=max_body_bytes,
        body_parse_workers=body_parse_workers,
        body_parse_inline_bytes=body_parse_inline_bytes,
        max_prompt_tokens=max_prompt_tokens,
        outlier_consecutive_5xx=outlier_consecutive_5xx,
        outlier_base_ejection_s=outlier_base_ejection_secs,
        max_concurrent_streams=max_concurrent_streams,
        tokenizer=tokenizer,
        tokenize_url=tokenize_url,
        tokenizer_timeout_s=tokenizer_timeout_ms / 1000.0,
        tokenizer_cache_size=tokenizer_cache_size,
        tokenizer_cache_bytes=tokenizer_cache_bytes,
        conformance_hooks=conformance_hooks,
        seed=seed,
        log_level=log_level,
        tls=tls,
        shutdown_grace_s=shutdown_grace_secs,
        shutdown_delay_s=shutdown_delay_secs,
    )


def read_server_tls(reader: Reader) -> TlsConfig:
    """TLS of the ext_proc and group API servers: files that exist, one way to get a certificate."""
    read = reader.read
    tls = TlsConfig(
        cert_file=read(TLS_CERT_FILE),
        key_file=read(TLS_KEY_FILE),
        self_signed=read(TLS_SELF_SIGNED),
        client_ca_file=read(TLS_CLIENT_CA_FILE),
    )
    check_pair(TLS_CERT_FILE, tls.cert_file, TLS_KEY_FILE, tls.key_file)
    check_readable(TLS_CERT_FILE, tls.cert_file)
    check_readable(TLS_KEY_FILE, tls.key_file)
    check_readable(TLS_CLIENT_CA_FILE, tls.client_ca_file)
    if tls.self_signed and tls.cert_file is not None:
        raise ConfigError("give either --tls-self-signed or --tls-cert-file/--tls-key-file, not both")
    if tls.mutual and not tls.enabled:
        raise ConfigError(
            "--tls-client-ca-file (mutual TLS) needs TLS: "
            "add --tls-cert-file/--tls-key-file or --tls-self-signed"
        )
    return tls
