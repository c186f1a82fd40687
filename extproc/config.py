"""Picker configuration: flags, `DYN_*` environment variables and the YAML config file, read once.

Precedence, per setting: command-line flag > environment variable > config file > default.
Flag names follow Dynamo's frontend (`--router-mode`, `--router-temperature`, ...), and every
router flag `--router-foo-bar` / `--foo-bar` is also read from `DYN_ROUTER_FOO_BAR` /
`DYN_FOO_BAR`. The result is a frozen `PickerConfig`; components receive only their slice.

Config file (YAML; keys in kebab-case or snake_case):

    router:                      # any router flag without the leading dashes
      router-mode: kv
      kv-cache-block-size: 16
    models:                      # optional: per-model tokenizer
      - name: llama
        tokenizer: /models/llama # a Hugging Face tokenizer directory
        tokenize-url: worker     # or http://host:port: the engine's /tokenize
    workers:
      - id: w0
        endpoint: 10.0.0.5:8000
        model: llama
        dp-ranks: [0]
        total-blocks: 16384
        max-num-batched-tokens: 8192
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.router import DisaggPolicy, RouterConfig
from extproc.router.errors import InvalidConfig


class ConfigError(ValueError):
    """The configuration is unusable; the message names the setting, the value and what is accepted."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    id: str
    endpoint: str
    model: str
    dp_ranks: tuple[int, ...] = (0,)
    total_blocks: int = 16384
    max_num_batched_tokens: int = 8192
    kv_events: str | None = None  # ZMQ PUB endpoint of dp rank 0 (tcp://ip:port); rank r uses port + r
    kv_replay: str | None = None  # ZMQ replay (ROUTER) endpoint of dp rank 0, same port rule
    instance_id: int | None = None  # the engine's u64 id in Dynamo-style NATS events (default: int(id))
    role: str = "both"  # prefill | decode | both (aggregated): see WORKER_ROLES
    device: str = "cuda"  # cuda (any accelerator) | cpu: see WORKER_DEVICES

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0].strip("[]")


WORKER_ROLES = ("prefill", "decode", "both")
WORKER_DEVICES = ("cuda", "cpu")
_DEVICE_ALIASES = {"gpu": "cuda", "accelerator": "cuda", "xpu": "cuda", "npu": "cuda", "hpu": "cuda"}


def worker_role(text: object, where: str) -> str:
    """A worker role from config or discovery: prefill, decode or both (aggregated, the default)."""
    role = str(text).strip().lower() if text is not None else "both"
    role = {"aggregated": "both", "agg": "both"}.get(role, role)
    if role not in WORKER_ROLES:
        raise ConfigError(f"invalid {where}={text!r}: expected one of {', '.join(WORKER_ROLES)}")
    return role


def worker_device(text: object, where: str) -> str:
    """A worker device class: cuda (any accelerator; gpu, xpu, ... are aliases) or cpu."""
    device = str(text).strip().lower() if text is not None else "cuda"
    device = _DEVICE_ALIASES.get(device, device)
    if device not in WORKER_DEVICES:
        raise ConfigError(f"invalid {where}={text!r}: expected cuda (or another accelerator) or cpu")
    return device


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    """Disaggregated prefill/decode serving: active for a model that has prefill workers."""

    prefill_header: str = "x-prefill-endpoint"  # tells the decode side where to prefill
    min_remote_prefill_tokens: int = 256  # prefill locally when fewer prompt tokens are uncached
    max_decode_prefix_frac: float = 0.8  # prefill locally when the decode worker caches this much
    decode_overlap_weight: float | None = None  # decode stage's overlap weight (None: the router's)
    prefill_health_interval_s: float = 2.0  # GET /health of prefill workers; 0 = off

    @property
    def policy(self) -> DisaggPolicy:
        """The router core's view: when to prefill remotely, and the decode stage's weight."""
        return DisaggPolicy(
            self.min_remote_prefill_tokens, self.max_decode_prefix_frac, self.decode_overlap_weight
        )


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


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """Where KV events and replica state come from (all off by default: the embedded picker)."""

    kv_events_port: int | None = None
    kv_replay_port: int | None = None
    nats_url: str | None = None
    namespace: str = "dynamo"
    component: str = "backend"
    dynamo_endpoint: str = "generate"  # event plane: namespace.<ns>.component.<c>.endpoint.<this>.kv-events
    durable_kv_events: bool = False
    snapshot_threshold: int = 100_000
    reset_states: bool = False
    replica_sync: bool = False
    router_id: str | None = None
    queue_size: int = 10_000  # per subscription: ZMQ SUB high-water mark, NATS pending messages
    nats_tls: ClientTlsConfig = field(default_factory=ClientTlsConfig)
    nats_creds_file: str | None = None  # a NATS .creds file (JWT + nkey seed)
    nats_user: str | None = None
    nats_password: str | None = field(default=None, repr=False)
    nats_token: str | None = field(default=None, repr=False)

    @property
    def nats_needed(self) -> bool:
        return self.nats_url is not None


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
    policy: str = "max-overlap"  # max-overlap | min-cost | weighted
    fallback: str | None = None  # name of a local group used when no group answers
    tls: ClientTlsConfig = field(default_factory=ClientTlsConfig)  # to every remote group's API


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """Where workers come from besides the static list: a headless Service's DNS, config reload."""

    dns_name: str | None = None  # e.g. vllm.default.svc.cluster.local; None = off
    dns_port: int = 8000  # the workers' HTTP port (A records carry no port)
    dns_model: str | None = None  # model served by the discovered workers (default: the only model)
    dns_server: str | None = None  # ip[:port] of the DNS server; default: the system resolver
    refresh_s: float = 10.0
    reload_config: bool = False  # re-read the config file's workers when it changes
    role: str = "both"  # role of the workers behind dns_name
    device: str = "cuda"  # device class of the workers behind dns_name
    prefill_dns_name: str | None = None  # a second headless Service whose workers are prefill workers


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    tokenizer: str | None = None
    tokenize_url: str | None = None


@dataclass(frozen=True, slots=True)
class PickerConfig:
    router: RouterConfig
    workers: tuple[WorkerConfig, ...]
    models: tuple[ModelConfig, ...]
    host: str = "127.0.0.1"
    port: int = 9002
    health_port: int = 9003
    admin_port: int | None = None  # HTTP /metrics, /healthz, /readyz, /busy_threshold, /debug/...; None = off
    admin_host: str = "127.0.0.1"
    admin_token: str | None = None  # bearer token required by mutating admin endpoints
    queue_max_wait_s: float = 30.0  # a request queued longer is answered 503 (429 when sheddable)
    session_ttl_s: float = 300.0  # sliding TTL of a sticky session's pin
    max_body_bytes: int = 16 * 1024 * 1024
    max_prompt_tokens: int | None = None  # longer tokenized prompts are answered 413; None = no limit
    outlier_consecutive_5xx: int = 5  # 5xx answers in a row that eject a worker; 0 = off
    outlier_base_ejection_s: float = 10.0  # first ejection's length (then x2, x3, ... up to 300 s)
    max_concurrent_streams: int | None = None  # ext_proc streams beyond this are answered 429; None = off
    tokenizer: str | None = None
    tokenize_url: str | None = None
    tokenizer_timeout_s: float = 2.0
    tokenizer_cache_size: int = 1024
    conformance_hooks: bool = False
    seed: int | None = None
    log_level: str = "info"
    kv_events_source: bool = False  # whether any KV event source is configured
    events: EventsConfig = field(default_factory=EventsConfig)
    groups: GroupsConfig = field(default_factory=GroupsConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    disagg: DisaggConfig = field(default_factory=DisaggConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    shutdown_grace_s: float = 25.0  # SIGTERM: in-flight ext_proc streams get this long to finish
    config_path: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Option:
    flags: tuple[str, ...]
    dest: str
    kind: Callable[[str], Any] | type[bool]
    default: Any
    help: str
    router_field: str | None = None  # RouterConfig field it feeds
    choices: tuple[str, ...] | None = None


def _float_or_none(text: str | float) -> float | None:
    if isinstance(text, str) and text.lower() in ("", "none", "null"):
        return None
    return float(text)


def _int_or_none(text: str | int) -> int | None:
    if isinstance(text, str) and text.lower() in ("", "none", "null"):
        return None
    if isinstance(text, float) and not text.is_integer():
        raise ValueError(f"{text!r} is not an integer")
    return int(text)


ROUTER_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--router-mode",),
        "router_mode",
        str,
        "kv",
        "How to choose a worker: kv (cache overlap and load), round-robin, random, or "
        "device-aware-weighted (share requests between cuda and cpu workers by their throughput ratio, "
        "then choose within a class by kv rules).",
        "mode",
        ("kv", "round-robin", "random", "device-aware-weighted"),
    ),
    _Option(
        ("--router-cuda-to-cpu-ratio",),
        "router_cuda_to_cpu_ratio",
        float,
        8.0,
        "device-aware-weighted: throughput of one accelerator worker over one cpu worker, both "
        "measured at the same latency target; under load each accelerator worker holds this many "
        "requests in flight for each one a cpu worker holds (an idle pool uses the accelerators). "
        "Also read from DYN_ENCODER_CUDA_TO_CPU_RATIO.",
        "cuda_to_cpu_ratio",
    ),
    _Option(
        ("--router-kv-overlap-score-weight", "--kv-overlap-score-weight"),
        "kv_overlap_score_weight",
        float,
        1.0,
        "Weight of prefill cost against decode load. Higher favours cache hits (TTFT), lower favours "
        "balance (ITL); 0 = pure load balancing, no indexer lookups.",
        "overlap_score_weight",
    ),
    _Option(
        ("--router-temperature",),
        "router_temperature",
        float,
        0.0,
        "Softmax sampling temperature over normalised costs; 0 always takes the cheapest worker.",
        "temperature",
    ),
    _Option(
        ("--kv-cache-block-size",),
        "kv_cache_block_size",
        int,
        16,
        "Engine KV block size in tokens; must "
        "equal the engine's (vLLM default 16) or no prefix ever matches.",
        "block_size",
    ),
    _Option(
        ("--router-kv-events",),
        "router_kv_events",
        bool,
        None,
        "Use KV events from the engines for exact "
        "cache state. --no-router-kv-events (alias --no-kv-events) predicts the cache from the router's "
        "own decisions instead (TTL + pruning). Default: events when an event source is configured.",
        "use_kv_events",
    ),
    _Option(
        ("--router-ttl-secs",),
        "router_ttl_secs",
        float,
        120.0,
        "Without KV events: seconds a routed prefix is assumed cached.",
        "router_ttl_secs",
    ),
    _Option(
        ("--router-max-tree-size",),
        "router_max_tree_size",
        int,
        2**20,
        "Without KV events: (worker, block) entries before pruning least recently used ones.",
        "router_max_tree_size",
    ),
    _Option(
        ("--router-prune-target-ratio",),
        "router_prune_target_ratio",
        float,
        0.8,
        "Without KV events: prune down to this fraction of the maximum tree size.",
        "router_prune_target_ratio",
    ),
    _Option(
        ("--router-assume-kv-reuse",),
        "router_assume_kv_reuse",
        bool,
        True,
        "Count blocks shared by in-flight requests on a worker once (engines with prefix caching).",
        "router_assume_kv_reuse",
    ),
    _Option(
        ("--router-track-active-blocks",),
        "router_track_active_blocks",
        bool,
        True,
        "Track decode blocks of in-flight requests.",
        "router_track_active_blocks",
    ),
    _Option(
        ("--router-track-prefill-tokens",),
        "router_track_prefill_tokens",
        bool,
        True,
        "Track prefill tokens of requests whose first token has not arrived.",
        "router_track_prefill_tokens",
    ),
    _Option(
        ("--router-track-output-blocks",),
        "router_track_output_blocks",
        bool,
        False,
        "Add placeholder blocks as output is generated.",
        "router_track_output_blocks",
    ),
    _Option(
        ("--active-decode-blocks-threshold",),
        "active_decode_blocks_threshold",
        _float_or_none,
        None,
        "Busy when active decode blocks exceed this fraction of the worker's KV cache.",
        "active_decode_blocks_threshold",
    ),
    _Option(
        ("--active-prefill-tokens-threshold",),
        "active_prefill_tokens_threshold",
        _int_or_none,
        None,
        "Busy when active prefill tokens exceed this count.",
        "active_prefill_tokens_threshold",
    ),
    _Option(
        ("--active-prefill-tokens-threshold-frac",),
        "active_prefill_tokens_threshold_frac",
        _float_or_none,
        None,
        "Busy when active prefill tokens exceed this fraction of max_num_batched_tokens.",
        "active_prefill_tokens_threshold_frac",
    ),
    _Option(
        ("--router-queue-threshold",),
        "router_queue_threshold",
        _float_or_none,
        None,
        "Admission queue: hold a request while every eligible worker has more active prefill tokens "
        "than this fraction of its max_num_batched_tokens; release when one drops to it. Off when unset.",
        "router_queue_threshold",
    ),
    _Option(
        ("--router-queue-policy",),
        "router_queue_policy",
        str,
        "fcfs",
        "Order of the admission queue: fcfs (arrival, moved up by priority), lcfs (newest first) or "
        "wspt (highest (1 + priority) / prompt length first).",
        "router_queue_policy",
        ("fcfs", "lcfs", "wspt"),
    ),
    _Option(
        ("--router-prefill-load-model",),
        "router_prefill_load_model",
        str,
        "none",
        "How a routed prompt loads its worker until its first token: none counts its tokens until the "
        "first token; timing predicts its prefill time and lets the load decay as that time passes.",
        "prefill_load_model",
        ("none", "timing"),
    ),
    _Option(
        ("--router-prefill-timing",),
        "router_prefill_timing",
        str,
        None,
        "With --router-prefill-load-model timing: the workers' pass-time polynomials A,B,C[,D2,D1,D0] "
        "(prefill ms = A T^2 + B T + C for T uncached tokens; decode ms = D2 u^2 + D1 u + D0 for KV "
        "usage u). Default: the Dynamo mocker's (REFERENCE section 6); fit your engine's pass times.",
        "prefill_timing",
    ),
    _Option(
        ("--router-log-formula",),
        "router_log_formula",
        bool,
        False,
        "Log the cost formula of every worker for every decision.",
        "log_formula",
    ),
)

PICKER_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--host",),
        "host",
        str,
        "127.0.0.1",
        "Address for the ext_proc and health servers; 0.0.0.0 to listen beyond loopback.",
    ),
    _Option(("--port",), "port", int, 9002, "ext_proc gRPC port (Inference Extension convention: 9002)."),
    _Option(
        ("--health-port",),
        "health_port",
        int,
        9003,
        "gRPC health port (liveness, readiness, ExternalProcessor, inference-extension).",
    ),
    _Option(
        ("--admin-port",),
        "admin_port",
        _int_or_none,
        None,
        "HTTP admin port: /metrics (Prometheus), /health, /debug/workers (per-worker cache source and "
        "load). 0 picks a free port. Off when not set.",
    ),
    _Option(
        ("--admin-host",),
        "admin_host",
        str,
        "127.0.0.1",
        "Address of the admin HTTP server; 0.0.0.0 to expose it beyond loopback.",
    ),
    _Option(
        ("--admin-token",),
        "admin_token",
        str,
        None,
        "Bearer token required by mutating admin endpoints (POST /busy_threshold with values). "
        "Also read from DYN_ADMIN_TOKEN. Off when not set.",
    ),
    _Option(
        ("--router-queue-max-wait-ms",),
        "router_queue_max_wait_ms",
        float,
        30_000.0,
        "A request queued longer than this is answered 503 (429 when marked sheddable).",
    ),
    _Option(
        ("--session-ttl-secs",),
        "session_ttl_secs",
        float,
        300.0,
        "Sticky sessions (nvext.session_control.session_id or x-session-id): seconds of inactivity "
        "after which a session's worker pin lapses.",
    ),
    _Option(
        ("--max-body-bytes",),
        "max_body_bytes",
        int,
        16 * 1024 * 1024,
        "Larger request bodies are answered 413.",
    ),
    _Option(
        ("--outlier-consecutive-5xx",),
        "outlier_consecutive_5xx",
        int,
        5,
        "Eject a worker from routing after this many 5xx answers in a row (Envoy's own 503 for a worker "
        "it cannot reach counts), as Envoy's outlier detection would; 0 turns it off. At most half a "
        "model's workers are ejected at once.",
    ),
    _Option(
        ("--outlier-base-ejection-secs",),
        "outlier_base_ejection_secs",
        float,
        10.0,
        "How long a first ejection lasts; the n-th in a row lasts n times this (at most 300 s).",
    ),
    _Option(
        ("--max-prompt-tokens",),
        "max_prompt_tokens",
        _int_or_none,
        None,
        "Requests whose prompt tokenizes to more tokens than this are answered 413 (set it to the "
        "engines' max_model_len). Off when not set.",
    ),
    _Option(
        ("--max-concurrent-streams",),
        "max_concurrent_streams",
        _int_or_none,
        None,
        "ext_proc streams (one per HTTP request in flight) beyond this are answered 429 "
        "(rejected-too-many-streams) at once. Each may buffer up to --max-body-bytes. Off when not set.",
    ),
    _Option(
        ("--tokenizer",),
        "tokenizer",
        str,
        None,
        "Hugging Face tokenizer directory (tokenizer.json + "
        "tokenizer_config.json) for models without their own. Default: byte-level tokenizer.",
    ),
    _Option(
        ("--tokenize-url",),
        "tokenize_url",
        str,
        None,
        "Tokenize through the engine's /tokenize endpoint: "
        "a base URL, or 'worker' for each model's first worker. Falls back to load-only routing on failure.",
    ),
    _Option(
        ("--tokenizer-timeout-ms",),
        "tokenizer_timeout_ms",
        float,
        2000.0,
        "Give up tokenizing after this long and route on load only.",
    ),
    _Option(
        ("--tokenizer-cache-size",), "tokenizer_cache_size", int, 1024, "Remote tokenization results kept."
    ),
    _Option(
        ("--conformance-hooks",),
        "conformance_hooks",
        bool,
        False,
        "Honour the Inference Extension "
        "conformance headers (test-epp-endpoint-selection). Lets clients choose endpoints: tests only.",
    ),
    _Option(
        ("--seed",), "seed", _int_or_none, None, "Seed for tie-breaking and sampling (reproducible runs)."
    ),
    _Option(
        ("--log-level",),
        "log_level",
        str,
        "info",
        "debug, info, warning or error.",
        None,
        ("debug", "info", "warning", "error"),
    ),
)

EVENT_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--kv-events-port",),
        "kv_events_port",
        _int_or_none,
        None,
        "Subscribe to each worker's vLLM/SGLang ZMQ KV events on its endpoint's IP at this port "
        "(+ dp rank); a worker's `kv-events: tcp://ip:port` in the config file overrides it. vLLM: 5557.",
    ),
    _Option(
        ("--kv-replay-port",),
        "kv_replay_port",
        _int_or_none,
        None,
        "The engines' ZMQ replay port (+ dp rank), used to rebuild a worker's blocks on start, on a "
        "sequence gap and after a publisher restart; per worker: `kv-replay: tcp://ip:port`.",
    ),
    _Option(
        ("--nats-url", "--nats-server"),
        "nats_url",
        str,
        None,
        "NATS server (nats://host:4222) for Dynamo-style KV events, durable state and replica sync. "
        "Also read from NATS_SERVER.",
    ),
    _Option(
        ("--namespace",), "namespace", str, "dynamo", "NATS subject namespace: namespace.<ns>.component..."
    ),
    _Option(("--component",), "component", str, "backend", "NATS subject component of the workers."),
    _Option(
        ("--dynamo-endpoint",),
        "dynamo_endpoint",
        str,
        "generate",
        "The workers' Dynamo endpoint, as `python -m dynamo.router --endpoint` names it: "
        "namespace.component.endpoint (sets --namespace and --component) or just the endpoint. With NATS "
        "the picker hears namespace.<ns>.component.<component>.endpoint.<endpoint>.kv-events, where "
        "Dynamo's own KvEventPublisher sends its msgpack events (on the endpoint a worker serves, or its "
        "kv_state_endpoint), beside the JSON kv_events subject. `*` hears every endpoint of the "
        "component: use it only when each worker and dp rank publishes on one of them (two publishers "
        "of one worker interleave event ids, and each seeming gap resets the worker).",
    ),
    _Option(
        ("--router-durable-kv-events",),
        "router_durable_kv_events",
        bool,
        False,
        "Consume KV events from a JetStream stream (1 hour retention) as a durable consumer, with "
        "tree snapshots in the NATS object store, so a restarted or new replica keeps the prefix state.",
    ),
    _Option(
        ("--router-snapshot-threshold",),
        "router_snapshot_threshold",
        int,
        100_000,
        "Durable mode: messages in the stream before one replica snapshots the tree and purges them.",
    ),
    _Option(
        ("--router-reset-states",),
        "router_reset_states",
        bool,
        False,
        "Durable mode: purge the event stream, snapshot and consumers on start (start from empty).",
    ),
    _Option(
        ("--router-replica-sync",),
        "router_replica_sync",
        bool,
        False,
        "Share active requests with other picker replicas over NATS so every replica sees the whole "
        "load of each worker.",
    ),
    _Option(
        ("--router-id",),
        "router_id",
        str,
        None,
        "This replica's name in replica sync and its durable consumer (default: host-pid).",
    ),
    _Option(
        ("--event-queue-size",),
        "event_queue_size",
        int,
        10_000,
        "Messages buffered per KV event subscription (each worker's ZMQ socket, each NATS subject) while "
        "the picker is busy. Beyond it messages are dropped, counted, and the worker resynchronised.",
    ),
)

NATS_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--nats-creds-file",),
        "nats_creds_file",
        str,
        None,
        "NATS credentials file (.creds: user JWT and nkey seed). Also read from NATS_AUTH_CREDENTIALS_FILE.",
    ),
    _Option(
        ("--nats-user",),
        "nats_user",
        str,
        None,
        "NATS user name, with --nats-password. Also read from NATS_AUTH_USERNAME.",
    ),
    _Option(
        ("--nats-password",),
        "nats_password",
        str,
        None,
        "NATS password. Prefer the environment (DYN_NATS_PASSWORD or NATS_AUTH_PASSWORD): a flag is "
        "visible to every local user in the process list.",
    ),
    _Option(
        ("--nats-token",),
        "nats_token",
        str,
        None,
        "NATS authentication token. Also read from NATS_AUTH_TOKEN; prefer the environment.",
    ),
    _Option(
        ("--nats-tls-ca-file",),
        "nats_tls_ca_file",
        str,
        None,
        "Connect to NATS over TLS and verify the server against this CA bundle. Also read from "
        "NATS_TLS_CA_CERT_PATH. A tls:// URL alone uses TLS with the system's roots.",
    ),
    _Option(
        ("--nats-tls-cert-file",),
        "nats_tls_cert_file",
        str,
        None,
        "Client certificate for a NATS server that verifies clients (tls { verify: true }), with "
        "--nats-tls-key-file. Also read from NATS_TLS_CLIENT_CERT_PATH.",
    ),
    _Option(
        ("--nats-tls-key-file",),
        "nats_tls_key_file",
        str,
        None,
        "Private key of --nats-tls-cert-file. Also read from NATS_TLS_CLIENT_KEY_PATH.",
    ),
)
# Dynamo's runtime reads the same settings from these (lib/runtime/src/config/environment_names.rs).
_NATS_ENV_ALIASES = {
    "nats_creds_file": ("NATS_AUTH_CREDENTIALS_FILE",),
    "nats_user": ("NATS_AUTH_USERNAME",),
    "nats_password": ("NATS_AUTH_PASSWORD",),
    "nats_token": ("NATS_AUTH_TOKEN",),
    "nats_tls_ca_file": ("NATS_TLS_CA_CERT_PATH",),
    "nats_tls_cert_file": ("NATS_TLS_CLIENT_CERT_PATH",),
    "nats_tls_key_file": ("NATS_TLS_CLIENT_KEY_PATH",),
}


GROUP_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--group-api-port",),
        "group_api_port",
        _int_or_none,
        None,
        "Serve the router-group gRPC API (Probe, Commit, MarkPrefillComplete, Free, PotentialLoads) on "
        "this port so a top-level picker can use this one as a group. 0 picks a free port. Off when not set.",
    ),
    _Option(
        ("--group-probe-timeout-ms",),
        "group_probe_timeout_ms",
        float,
        50.0,
        "Hierarchical mode: groups that have not answered a probe within this deadline are skipped.",
    ),
    _Option(
        ("--group-policy",),
        "group_policy",
        str,
        "max-overlap",
        "How to choose a group from their probes: max-overlap (cost breaks ties), min-cost, or weighted "
        "(a blend of overlap and cost scaled by each group's weight).",
        None,
        ("max-overlap", "min-cost", "weighted"),
    ),
    _Option(
        ("--group-fallback",),
        "group_fallback",
        str,
        None,
        "Name of a local group to route with when no group answers; without it such requests get 503.",
    ),
)

TLS_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--tls-cert-file",),
        "tls_cert_file",
        str,
        None,
        "Serve ext_proc and the router-group API over TLS with this PEM certificate (chain), with "
        "--tls-key-file. The gRPC health server stays plaintext (kubelet probes). Off when not set.",
    ),
    _Option(("--tls-key-file",), "tls_key_file", str, None, "PEM private key of --tls-cert-file."),
    _Option(
        ("--tls-self-signed",),
        "tls_self_signed",
        bool,
        False,
        "Serve over TLS with a key and self-signed certificate generated at start (like the Inference "
        "Extension's --secure-serving): encrypted, but clients cannot verify who they talk to.",
    ),
    _Option(
        ("--tls-client-ca-file",),
        "tls_client_ca_file",
        str,
        None,
        "Mutual TLS: require every ext_proc and group API client to present a certificate signed by "
        "this CA bundle; others fail the handshake. Needs --tls-cert-file or --tls-self-signed.",
    ),
    _Option(
        ("--group-tls-ca-file",),
        "group_tls_ca_file",
        str,
        None,
        "Reach remote router groups over TLS and verify them against this CA bundle.",
    ),
    _Option(
        ("--group-tls-cert-file",),
        "group_tls_cert_file",
        str,
        None,
        "Client certificate presented to remote groups that require mutual TLS, with "
        "--group-tls-key-file (turns TLS on; without --group-tls-ca-file the system's roots verify).",
    ),
    _Option(
        ("--group-tls-key-file",), "group_tls_key_file", str, None, "Private key of --group-tls-cert-file."
    ),
    _Option(
        ("--group-tls-server-name",),
        "group_tls_server_name",
        str,
        None,
        "Name the remote groups' certificates must carry (and the SNI sent) instead of the host part of "
        "their address; for certificates issued to a DNS name reached by IP.",
    ),
)

SHUTDOWN_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--shutdown-grace-secs",),
        "shutdown_grace_secs",
        float,
        25.0,
        "On SIGTERM: report not ready, refuse new ext_proc streams, give in-flight ones this long to "
        "finish, then cancel the rest and exit. Keep it below the pod's terminationGracePeriodSeconds "
        "(30 in gateway/base). 0 cancels at once.",
    ),
)

DISAGG_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--prefill-endpoint-header",),
        "prefill_endpoint_header",
        str,
        "x-prefill-endpoint",
        "Disaggregated serving (a model with `role: prefill` workers): request header that names the "
        "chosen prefill worker (ip:port) to the decode worker's side.",
    ),
    _Option(
        ("--disagg-min-remote-prefill-tokens",),
        "disagg_min_remote_prefill_tokens",
        int,
        256,
        "Prefill on the decode worker itself when fewer prompt tokens than this are uncached there.",
    ),
    _Option(
        ("--disagg-max-decode-prefix-frac",),
        "disagg_max_decode_prefix_frac",
        float,
        0.8,
        "Prefill on the decode worker itself when it already caches at least this fraction of the prompt.",
    ),
    _Option(
        ("--disagg-decode-overlap-weight",),
        "disagg_decode_overlap_weight",
        _float_or_none,
        None,
        "Overlap weight when choosing the decode worker of a disaggregated model (default: the router's "
        "--router-kv-overlap-score-weight; 0 is Dynamo's decode stage: balance decode load only).",
    ),
    _Option(
        ("--prefill-health-interval-secs",),
        "prefill_health_interval_secs",
        float,
        2.0,
        "Probe each prefill worker's GET /health this often; one that fails is not named in the prefill "
        "header until it answers again. 0 turns probing off.",
    ),
)

DISCOVERY_OPTIONS: tuple[_Option, ...] = (
    _Option(
        ("--discovery-dns",),
        "discovery_dns",
        str,
        None,
        "Discover workers from the A/AAAA records of this name (a headless Service, e.g. "
        "vllm.default.svc.cluster.local), refreshed periodically; pods come and go without a restart.",
    ),
    _Option(("--discovery-port",), "discovery_port", int, 8000, "The discovered workers' HTTP port."),
    _Option(
        ("--discovery-model",),
        "discovery_model",
        str,
        None,
        "Model served by the discovered workers (default: the only configured model).",
    ),
    _Option(
        ("--discovery-dns-server",),
        "discovery_dns_server",
        str,
        None,
        "DNS server ip[:port] to ask instead of the system resolver.",
    ),
    _Option(
        ("--discovery-refresh-secs",), "discovery_refresh_secs", float, 10.0, "Seconds between DNS lookups."
    ),
    _Option(
        ("--discovery-role",),
        "discovery_role",
        str,
        "both",
        "Role of the workers found by --discovery-dns: both (aggregated), prefill or decode.",
        None,
        ("both", "prefill", "decode"),
    ),
    _Option(
        ("--discovery-prefill-dns",),
        "discovery_prefill_dns",
        str,
        None,
        "A second name whose A/AAAA records are prefill workers (disaggregated serving).",
    ),
    _Option(
        ("--discovery-device",),
        "discovery_device",
        str,
        "cuda",
        "Device class of the discovered workers: cuda (any accelerator) or cpu.",
        None,
        ("cuda", "cpu"),
    ),
    _Option(
        ("--reload-config",),
        "reload_config",
        bool,
        False,
        "Watch the config file and apply changes to its worker list without a restart.",
    ),
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file with workers, models and router settings."
    )
    groups = (
        ("router", ROUTER_OPTIONS),
        ("KV events and replicas", EVENT_OPTIONS),
        ("picker", PICKER_OPTIONS),
        ("router groups", GROUP_OPTIONS),
        ("transport security", TLS_OPTIONS),
        ("NATS credentials and TLS", NATS_OPTIONS),
        ("shutdown", SHUTDOWN_OPTIONS),
        ("disaggregated prefill/decode", DISAGG_OPTIONS),
        ("worker discovery", DISCOVERY_OPTIONS),
    )
    for title, options in groups:
        add_options(parser.add_argument_group(f"{title} (env DYN_<FLAG>, e.g. DYN_ROUTER_MODE)"), options)


def add_options(
    group: argparse._ActionsContainer, options: Sequence[_Option], *, skip: Sequence[str] = ()
) -> None:
    """Add `options` as flags (None default: `load_config` resolves env, file and defaults);
    `skip` names dests to leave out."""
    for opt in options:
        if opt.dest in skip:
            continue
        flags = list(opt.flags)
        default_text = "auto" if opt.default is None and opt.kind is bool else opt.default
        help_text = f"{opt.help} (default: {default_text})"
        if opt.kind is bool:
            if opt.dest == "router_kv_events":
                flags.append("--kv-events")
            group.add_argument(
                *flags, dest=opt.dest, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            group.add_argument(
                *flags, dest=opt.dest, default=None, choices=opt.choices, type=opt.kind, help=help_text
            )


def _env_names(opt: _Option) -> list[str]:
    names = []
    for flag in opt.flags:
        names.append("DYN_" + flag.lstrip("-").upper().replace("-", "_"))
    if opt.router_field == "use_kv_events":
        names += ["DYN_ROUTER_USE_KV_EVENTS", "DYN_KV_EVENTS"]
    if opt.dest == "nats_url":
        names.append("NATS_SERVER")
    names.extend(_NATS_ENV_ALIASES.get(opt.dest, ()))
    if opt.dest == "router_cuda_to_cpu_ratio":
        names.append("DYN_ENCODER_CUDA_TO_CPU_RATIO")
    return names


def _parse_bool(name: str, text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid {name}={text!r}: expected true or false")


def _convert(opt: _Option, name: str, raw: Any) -> Any:
    if opt.kind is bool:
        return raw if isinstance(raw, bool) else _parse_bool(name, raw)
    if raw is None:  # null in the config file: unset
        return opt.default
    try:
        value = opt.kind(str(raw)) if not isinstance(raw, int | float) or opt.kind is str else opt.kind(raw)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"invalid {name}={raw!r}: expected {getattr(opt.kind, '__name__', 'a value')}"
        ) from None
    if opt.choices and value not in opt.choices:
        raise ConfigError(f"invalid {name}={raw!r}: expected one of {', '.join(opt.choices)}")
    return value


def _file_value(section: Mapping[str, Any], opt: _Option) -> tuple[bool, Any, str]:
    for flag in opt.flags:
        key = flag.lstrip("-")
        for candidate in (key, key.replace("-", "_")):
            if candidate in section:
                return True, section[candidate], candidate
    return False, None, ""


def _resolve(
    opt: _Option, args: argparse.Namespace, environ: Mapping[str, str], section: Mapping[str, Any]
) -> Any:
    flag_value = getattr(args, opt.dest, None)
    if flag_value is not None:
        return flag_value
    for env in _env_names(opt):
        if env in environ:
            return _convert(opt, env, environ[env])
    found, raw, key = _file_value(section, opt)
    if found:
        return _convert(opt, key, raw)
    return opt.default


_DYNAMO_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _dynamo_names(namespace: str, component: str, endpoint: str) -> dict[str, str]:
    """namespace, component and dynamo_endpoint from --dynamo-endpoint, which may name all three.

    `ns.component.endpoint` (optionally `dyn://`-prefixed, as Dynamo's runtime takes it) sets the
    namespace and component, unless --namespace or --component (not their defaults) name others.
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
        for given, default, named, flag in (
            (namespace, "dynamo", ns, "--namespace"),
            (component, "backend", comp, "--component"),
        ):
            if given not in (default, named):
                raise ConfigError(
                    f"invalid dynamo-endpoint={endpoint!r}: it names {flag.lstrip('-')} {named!r} but "
                    f"{flag} is {given!r}; give one of them"
                )
        namespace, component = ns, comp
    elif len(parts) == 1:
        name = path
    else:
        raise ConfigError(f"invalid dynamo-endpoint={endpoint!r}: expected {accepted}")
    if name != "*" and not _DYNAMO_NAME.fullmatch(name):
        raise ConfigError(f"invalid dynamo-endpoint={endpoint!r}: expected {accepted}")
    return {"namespace": namespace, "component": component, "dynamo_endpoint": name}


def _norm(mapping: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in mapping.items()}


MAX_DP_SIZE = 1024  # data-parallel ranks per worker a config's dp_size may ask for


def _workers(raw: Any) -> tuple[WorkerConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("invalid workers: expected a list of {id, endpoint, model, ...}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ConfigError(f"invalid workers[{i}]={item!r}: expected a mapping")
        w = _norm(item)
        for key in ("id", "endpoint", "model"):
            if not w.get(key):
                raise ConfigError(f"invalid workers[{i}]: missing {key!r}")
        endpoint = str(w["endpoint"])
        if ":" not in endpoint:
            raise ConfigError(f"invalid workers[{i}].endpoint={endpoint!r}: expected ip:port")
        try:
            dp = w.get("dp_ranks")
            if dp is None and "dp_size" in w:
                dp = range(int(w["dp_size"]))
                if not 1 <= len(dp) <= MAX_DP_SIZE:
                    raise ValueError(f"dp_size={w['dp_size']!r} is not in [1, {MAX_DP_SIZE}]")
            out.append(
                WorkerConfig(
                    id=str(w["id"]),
                    endpoint=endpoint,
                    model=str(w["model"]),
                    dp_ranks=tuple(int(r) for r in (dp if dp is not None else [0])),
                    total_blocks=int(w.get("total_blocks", 16384)),
                    max_num_batched_tokens=int(w.get("max_num_batched_tokens", 8192)),
                    kv_events=_zmq_endpoint(w, "kv_events", i),
                    kv_replay=_zmq_endpoint(w, "kv_replay", i),
                    instance_id=int(w["instance_id"]) if w.get("instance_id") is not None else None,
                    role=worker_role(w.get("role"), f"workers[{i}].role"),
                    device=worker_device(w.get("device"), f"workers[{i}].device"),
                )
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"invalid workers[{i}]: {exc}") from None
    ids = [w.id for w in out]
    if len(set(ids)) != len(ids):
        raise ConfigError("invalid workers: worker ids must be unique")
    return tuple(out)


def _zmq_endpoint(w: Mapping[str, Any], key: str, index: int) -> str | None:
    value = w.get(key)
    if value is None:
        return None
    text = str(value)
    if not text.startswith("tcp://") or ":" not in text[6:]:
        raise ConfigError(
            f"invalid workers[{index}].{key.replace('_', '-')}={text!r}: expected tcp://host:port"
        )
    return text


def _models(raw: Any, workers: Sequence[WorkerConfig]) -> tuple[ModelConfig, ...]:
    models: dict[str, ModelConfig] = {}
    for i, item in enumerate(raw or []):
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ConfigError(f"invalid models[{i}]={item!r}: expected a mapping with a name")
        m = _norm(item)
        models[str(m["name"])] = ModelConfig(str(m["name"]), m.get("tokenizer"), m.get("tokenize_url"))
    for w in workers:
        models.setdefault(w.model, ModelConfig(w.model))
    return tuple(models.values())


def load_config(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    args: argparse.Namespace | None = None,
) -> PickerConfig:
    """Build the frozen configuration from flags (or parsed `args`), `environ` and the config file."""
    environ = os.environ if environ is None else environ
    if args is None:
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser)
        args = parser.parse_args(argv)
    config_path = getattr(args, "config", None) or environ.get("DYN_CONFIG")
    document: Mapping[str, Any] = {}
    if config_path:
        try:
            loaded = yaml.safe_load(Path(config_path).read_text())
        except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: not UTF-8, a bad escape
            raise ConfigError(f"cannot read config file {config_path}: {exc}") from exc
        if loaded is not None and not isinstance(loaded, Mapping):
            raise ConfigError(f"config file {config_path}: expected a mapping at the top level")
        document = loaded or {}
    router_section = document.get("router") or {}
    picker_section = document.get("picker") or {}
    events_section = document.get("events") or {}
    discovery_section = document.get("discovery") or {}
    disagg_section = document.get("disagg") or {}
    sections = (router_section, picker_section, events_section, discovery_section, disagg_section)
    if not all(isinstance(s, Mapping) for s in sections):
        raise ConfigError(
            "config file: 'router', 'events', 'picker', 'discovery' and 'disagg' must be mappings"
        )

    workers = _workers(document.get("workers"))
    ev = {opt.dest: _resolve(opt, args, environ, events_section) for opt in EVENT_OPTIONS}
    na = {opt.dest: _resolve(opt, args, environ, events_section) for opt in NATS_OPTIONS}
    events = EventsConfig(
        kv_events_port=ev["kv_events_port"],
        kv_replay_port=ev["kv_replay_port"],
        nats_url=ev["nats_url"],
        **_dynamo_names(ev["namespace"], ev["component"], ev["dynamo_endpoint"]),
        durable_kv_events=ev["router_durable_kv_events"],
        snapshot_threshold=ev["router_snapshot_threshold"],
        reset_states=ev["router_reset_states"],
        replica_sync=ev["router_replica_sync"],
        router_id=ev["router_id"],
        queue_size=ev["event_queue_size"],
        **_nats_settings(na),
    )
    _positive("event-queue-size", events.queue_size)
    if (events.durable_kv_events or events.replica_sync) and not events.nats_url:
        raise ConfigError(
            "--router-durable-kv-events and --router-replica-sync need NATS: set --nats-url or NATS_SERVER"
        )
    if events.snapshot_threshold < 1:
        raise ConfigError(f"invalid router-snapshot-threshold={events.snapshot_threshold}: expected >= 1")
    # ZMQ from the workers, or Dynamo-style events on NATS core (JetStream when durable)
    kv_events_source = (
        events.kv_events_port is not None or events.nats_url is not None or any(w.kv_events for w in workers)
    )
    router_values = {opt.router_field: _resolve(opt, args, environ, router_section) for opt in ROUTER_OPTIONS}
    if router_values["use_kv_events"] is None:
        router_values["use_kv_events"] = kv_events_source
    if router_values["prefill_timing"] is None:
        del router_values["prefill_timing"]  # the model's default
    try:
        router = RouterConfig(**router_values)
    except InvalidConfig as exc:
        raise ConfigError(str(exc)) from exc
    picker = {opt.dest: _resolve(opt, args, environ, picker_section) for opt in PICKER_OPTIONS}
    _positive("router-queue-max-wait-ms", picker["router_queue_max_wait_ms"])
    _positive("session-ttl-secs", picker["session_ttl_secs"])
    if (consecutive := picker["outlier_consecutive_5xx"]) < 0:
        raise ConfigError(f"invalid outlier-consecutive-5xx={consecutive}: expected >= 0")
    _positive("outlier-base-ejection-secs", picker["outlier_base_ejection_secs"])
    if picker["max_prompt_tokens"] is not None:
        _positive("max-prompt-tokens", picker["max_prompt_tokens"])
    if picker["max_concurrent_streams"] is not None:
        _positive("max-concurrent-streams", picker["max_concurrent_streams"])
    gr = {opt.dest: _resolve(opt, args, environ, picker_section) for opt in GROUP_OPTIONS}
    tl = {opt.dest: _resolve(opt, args, environ, picker_section) for opt in (*TLS_OPTIONS, *SHUTDOWN_OPTIONS)}
    tls, group_tls = _tls_settings(tl)
    if tl["shutdown_grace_secs"] < 0:
        raise ConfigError(f"invalid shutdown-grace-secs={tl['shutdown_grace_secs']}: expected >= 0")
    groups = GroupsConfig(
        groups=_groups(document.get("groups")),
        api_port=gr["group_api_port"],
        probe_timeout_s=gr["group_probe_timeout_ms"] / 1000.0,
        policy=gr["group_policy"],
        fallback=gr["group_fallback"],
        tls=group_tls,
    )
    _positive("group-probe-timeout-ms", gr["group_probe_timeout_ms"])
    if groups.fallback is not None and groups.fallback not in {g.name for g in groups.groups if g.is_local}:
        raise ConfigError(f"invalid group-fallback={groups.fallback!r}: expected the name of a local group")
    dc = {opt.dest: _resolve(opt, args, environ, discovery_section) for opt in DISCOVERY_OPTIONS}
    discovery = DiscoveryConfig(
        dns_name=dc["discovery_dns"],
        dns_port=dc["discovery_port"],
        dns_model=dc["discovery_model"],
        dns_server=dc["discovery_dns_server"],
        refresh_s=dc["discovery_refresh_secs"],
        reload_config=dc["reload_config"],
        role=dc["discovery_role"],
        device=dc["discovery_device"],
        prefill_dns_name=dc["discovery_prefill_dns"],
    )
    _positive("discovery-refresh-secs", discovery.refresh_s)
    ds = {opt.dest: _resolve(opt, args, environ, disagg_section) for opt in DISAGG_OPTIONS}
    disagg = DisaggConfig(
        prefill_header=ds["prefill_endpoint_header"].strip().lower(),
        min_remote_prefill_tokens=ds["disagg_min_remote_prefill_tokens"],
        max_decode_prefix_frac=ds["disagg_max_decode_prefix_frac"],
        decode_overlap_weight=ds["disagg_decode_overlap_weight"],
        prefill_health_interval_s=ds["prefill_health_interval_secs"],
    )
    if not disagg.prefill_header or any(c.isspace() or c == ":" for c in disagg.prefill_header):
        raise ConfigError(
            f"invalid prefill-endpoint-header={disagg.prefill_header!r}: expected a header name"
        )
    if disagg.min_remote_prefill_tokens < 0:
        raise ConfigError(
            f"invalid disagg-min-remote-prefill-tokens={disagg.min_remote_prefill_tokens}: expected >= 0"
        )
    if not 0 <= disagg.max_decode_prefix_frac <= 1:
        raise ConfigError(
            f"invalid disagg-max-decode-prefix-frac={disagg.max_decode_prefix_frac}: "
            "expected a fraction in [0, 1]"
        )
    if disagg.prefill_health_interval_s < 0:
        raise ConfigError(
            f"invalid prefill-health-interval-secs={disagg.prefill_health_interval_s}: expected >= 0"
        )
    weight = disagg.decode_overlap_weight
    if weight is not None and not 0 <= weight < float("inf"):
        raise ConfigError(f"invalid disagg-decode-overlap-weight={weight}: expected a number >= 0")
    if discovery.reload_config and not config_path:
        raise ConfigError("--reload-config needs a config file (--config or DYN_CONFIG)")
    return PickerConfig(
        router=router,
        workers=workers,
        models=_models(document.get("models"), workers),
        host=picker["host"],
        port=picker["port"],
        health_port=picker["health_port"],
        admin_port=picker["admin_port"],
        admin_host=picker["admin_host"],
        admin_token=picker["admin_token"],
        queue_max_wait_s=picker["router_queue_max_wait_ms"] / 1000.0,
        session_ttl_s=picker["session_ttl_secs"],
        max_body_bytes=picker["max_body_bytes"],
        max_prompt_tokens=picker["max_prompt_tokens"],
        outlier_consecutive_5xx=picker["outlier_consecutive_5xx"],
        outlier_base_ejection_s=picker["outlier_base_ejection_secs"],
        max_concurrent_streams=picker["max_concurrent_streams"],
        tokenizer=picker["tokenizer"],
        tokenize_url=picker["tokenize_url"],
        tokenizer_timeout_s=picker["tokenizer_timeout_ms"] / 1000.0,
        tokenizer_cache_size=picker["tokenizer_cache_size"],
        conformance_hooks=picker["conformance_hooks"],
        seed=picker["seed"],
        log_level=picker["log_level"],
        kv_events_source=kv_events_source,
        events=events,
        groups=groups,
        discovery=discovery,
        disagg=disagg,
        tls=tls,
        shutdown_grace_s=tl["shutdown_grace_secs"],
        config_path=str(config_path) if config_path else None,
    )


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"invalid {name}={value}: expected > 0")


def _files(values: Mapping[str, Any], *dests: str) -> None:
    """Each of `dests` that is set must name a readable file: said at start, not at the first handshake."""
    for dest in dests:
        path = values[dest]
        if path is None:
            continue
        try:
            readable = os.access(path, os.R_OK)
        except ValueError:  # a NUL or a lone surrogate: no file has that name
            readable = False
        if not readable:
            what = "not found" if not os.path.exists(path) else "not readable"
            raise ConfigError(f"invalid {dest.replace('_', '-')}={path!r}: file {what}")


def _pair(values: Mapping[str, Any], cert: str, key: str) -> None:
    if (values[cert] is None) != (values[key] is None):
        raise ConfigError(f"--{cert.replace('_', '-')} and --{key.replace('_', '-')} go together: give both")


def _tls_settings(values: Mapping[str, Any]) -> tuple[TlsConfig, ClientTlsConfig]:
    """The servers' TlsConfig and the remote groups' ClientTlsConfig from the TLS options."""
    _pair(values, "tls_cert_file", "tls_key_file")
    _pair(values, "group_tls_cert_file", "group_tls_key_file")
    _files(values, "tls_cert_file", "tls_key_file", "tls_client_ca_file")
    _files(values, "group_tls_ca_file", "group_tls_cert_file", "group_tls_key_file")
    tls = TlsConfig(
        cert_file=values["tls_cert_file"],
        key_file=values["tls_key_file"],
        self_signed=values["tls_self_signed"],
        client_ca_file=values["tls_client_ca_file"],
    )
    if tls.self_signed and tls.cert_file is not None:
        raise ConfigError("give either --tls-self-signed or --tls-cert-file/--tls-key-file, not both")
    if tls.mutual and not tls.enabled:
        raise ConfigError(
            "--tls-client-ca-file (mutual TLS) needs TLS: "
            "add --tls-cert-file/--tls-key-file or --tls-self-signed"
        )
    group_tls = ClientTlsConfig(
        ca_file=values["group_tls_ca_file"],
        cert_file=values["group_tls_cert_file"],
        key_file=values["group_tls_key_file"],
        server_name=values["group_tls_server_name"],
    )
    return tls, group_tls


def _nats_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """EventsConfig's NATS credential and TLS fields; one way to authenticate at most."""
    _pair(values, "nats_user", "nats_password")
    _pair(values, "nats_tls_cert_file", "nats_tls_key_file")
    _files(values, "nats_creds_file", "nats_tls_ca_file", "nats_tls_cert_file", "nats_tls_key_file")
    methods = [name for name in ("nats_creds_file", "nats_user", "nats_token") if values[name] is not None]
    if len(methods) > 1:
        given = ", ".join("--" + m.replace("_", "-") for m in methods)
        raise ConfigError(
            f"NATS authentication: give one of a creds file, user/password or a token, not {given}"
        )
    return {
        "nats_tls": ClientTlsConfig(
            ca_file=values["nats_tls_ca_file"],
            cert_file=values["nats_tls_cert_file"],
            key_file=values["nats_tls_key_file"],
        ),
        "nats_creds_file": values["nats_creds_file"],
        "nats_user": values["nats_user"],
        "nats_password": values["nats_password"],
        "nats_token": values["nats_token"],
    }


def _groups(raw: Any) -> tuple[GroupConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("invalid groups: expected a list of {name, address | local: true, weight}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ConfigError(f"invalid groups[{i}]={item!r}: expected a mapping with a name")
        g = _norm(item)
        address = g.get("address")
        local = bool(g.get("local", address is None))
        if local == (address is not None):
            raise ConfigError(f"invalid groups[{i}]: give either 'address: host:port' or 'local: true'")
        if address is not None and ":" not in str(address):
            raise ConfigError(f"invalid groups[{i}].address={address!r}: expected host:port")
        try:
            weight = float(g.get("weight", 1.0))
        except (TypeError, ValueError):
            raise ConfigError(f"invalid groups[{i}].weight={g.get('weight')!r}: expected a number") from None
        if not weight > 0:
            raise ConfigError(f"invalid groups[{i}].weight={weight}: expected > 0")
        out.append(GroupConfig(str(g["name"]), None if local else str(address), weight))
    names = [g.name for g in out]
    if len(set(names)) != len(names):
        raise ConfigError("invalid groups: group names must be unique")
    return tuple(out)
