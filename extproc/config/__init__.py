"""Picker configuration: flags, `DYN_*` environment variables and the YAML config file, read once.

Precedence, per setting: command-line flag > environment variable > config file > default
(options.py). Flag names follow Dynamo's frontend (`--router-mode`, `--router-temperature`, ...),
and every flag `--foo-bar` is also read from `DYN_FOO_BAR`. The result is a frozen `PickerConfig`;
components receive only their slice (`config.router`, `config.events`, ...).

One module per section, each owning its dataclass, its flags (with their --help text), its
environment and file keys, and its checks:

    router.py     RouterConfig          file section router:
    dynamo.py     (none)                router:    (Dynamo frontend and engine knobs a picker cannot apply)
    events.py     EventsConfig          events:    (KV events, NATS, durable mode, replica sync)
    server.py     PickerConfig's own    picker:    (listeners, admin, limits, tokenizer, TLS, shutdown)
    groups.py     GroupsConfig          picker: and the top-level groups: list
    discovery.py  DiscoveryConfig       discovery:
    engine_metrics.py EngineMetricsConfig engine-metrics: (scraping the engines' own load gauges)
    inference_extension.py InferenceExtensionConfig inference-extension: (objectives, model rewrites)
    disagg.py     DisaggConfig          disagg:
    workers.py    WorkerConfig, ModelConfig from the top-level workers: and models: lists
    tls.py        TlsConfig, ClientTlsConfig (the flags live with the section they secure)

Config file (YAML; keys in kebab-case or snake_case; the file is `--config` or DYN_CONFIG):

    router:                      # any router flag without the leading dashes
      router-mode: kv
      kv-cache-block-size: 16
    models:
      - {name: llama, tokenizer: /models/llama}
    workers:
      - {id: w0, endpoint: 10.0.0.5:8000, model: llama}
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.config import (
    disagg,
    discovery,
    dynamo,
    engine_metrics,
    events,
    groups,
    inference_extension,
    router,
    server,
)
from extproc.config.disagg import DISAGG_OPTIONS, DisaggConfig, read_disagg
from extproc.config.discovery import DISCOVERY_OPTIONS, DiscoveryConfig, read_discovery
from extproc.config.dynamo import DYNAMO_OPTIONS
from extproc.config.engine_metrics import ENGINE_METRICS_OPTIONS, EngineMetricsConfig, read_engine_metrics
from extproc.config.events import EVENT_OPTIONS, NATS_OPTIONS, EventsConfig, read_events
from extproc.config.groups import GROUP_OPTIONS, GROUP_TLS_OPTIONS, GroupConfig, GroupsConfig, read_groups
from extproc.config.inference_extension import (
    INFERENCE_EXTENSION_OPTIONS,
    InferenceExtensionConfig,
    read_inference_extension,
)
from extproc.config.options import ConfigError, Option, Reader, add_options
from extproc.config.router import ROUTER_OPTIONS, read_router, router_notices
from extproc.config.server import PICKER_OPTIONS, SERVER_TLS_OPTIONS, SHUTDOWN_OPTIONS, read_server
from extproc.config.tls import ClientTlsConfig, TlsConfig
from extproc.config.workers import (
    MAX_DP_SIZE,
    WORKER_DEVICES,
    WORKER_ROLES,
    ModelConfig,
    WorkerConfig,
    read_models,
    read_workers,
    worker_device,
    worker_role,
)
from extproc.request.token_cache import DEFAULT_PIECE_CACHE_BYTES
from extproc.router import RouterConfig
from extproc.router.router import KV_RULES

__all__ = [
    "DISAGG_OPTIONS",
    "FILE_SECTIONS",
    "HELP_GROUPS",
    "MAX_DP_SIZE",
    "ROUTER_OPTIONS",
    "WORKER_DEVICES",
    "WORKER_ROLES",
    "ClientTlsConfig",
    "ConfigError",
    "DisaggConfig",
    "DiscoveryConfig",
    "EngineMetricsConfig",
    "EventsConfig",
    "GroupConfig",
    "GroupsConfig",
    "InferenceExtensionConfig",
    "ModelConfig",
    "Option",
    "PickerConfig",
    "TlsConfig",
    "WorkerConfig",
    "add_options",
    "add_serve_arguments",
    "load_config",
    "worker_device",
    "worker_role",
]


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """The whole configuration: the sections, and the picker's own settings as flat fields
    (server.py reads those; they stay flat because every component takes them from here)."""

    router: RouterConfig
    workers: tuple[WorkerConfig, ...]
    models: tuple[ModelConfig, ...]
    host: str = "127.0.0.1"
    port: int = 9002
    health_port: int = 9003
    admin_port: int | None = None  # HTTP /metrics, /healthz, /readyz, /busy_threshold, /debug/...; None = off
    admin_host: str = "127.0.0.1"
    admin_token: str | None = None  # bearer token required by mutating admin endpoints
    admin_allow_unauthenticated_writes: bool = False  # without a token, admin writes are refused unless set
    queue_max_wait_s: float = 30.0  # a request queued longer is answered 503 (429 when sheddable)
    session_ttl_s: float = 300.0  # sliding TTL of a sticky session's pin
    session_max_pins: int = 100_000  # per model; beyond it the least recently used pin is evicted
    session_id_max_length: int = 256  # longer session ids are answered 400
    worker_session_control: str = "sglang"  # sglang: open/close SGLang sessions on workers; off
    max_body_bytes: int = 16 * 1024 * 1024
    body_parse_workers: int = 1  # processes parsing bodies over body_parse_inline_bytes; 0 = on the loop
    body_parse_inline_bytes: int = 16 * 1024  # bodies up to this size are parsed on the event loop
    max_prompt_tokens: int | None = None  # longer tokenized prompts are answered 413; None = no limit
    outlier_consecutive_5xx: int = 5  # 5xx answers in a row that eject a worker; 0 = off
    outlier_base_ejection_s: float = 10.0  # first ejection's length (then x2, x3, ... up to 300 s)
    max_concurrent_streams: int | None = None  # ext_proc streams beyond this are answered 429; None = off
    tokenizer: str | None = None
    tokenize_url: str | None = None
    tokenizer_timeout_s: float = 2.0
    tokenizer_cache_size: int = 1024  # remote /tokenize results kept
    tokenizer_cache_bytes: int = DEFAULT_PIECE_CACHE_BYTES  # per model, local chat piece ids; 0 = off
    conformance_hooks: bool = False
    ext_proc_server: str = "h2"  # "h2" (extproc.runtime.h2_server) or "grpcio" (grpc.aio)
    seed: int | None = None
    log_level: str = "info"
    kv_events_source: bool = False  # whether any KV event source is configured
    events: EventsConfig = field(default_factory=EventsConfig)
    groups: GroupsConfig = field(default_factory=GroupsConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    disagg: DisaggConfig = field(default_factory=DisaggConfig)
    engine_metrics: EngineMetricsConfig = field(default_factory=EngineMetricsConfig)
    inference_extension: InferenceExtensionConfig = field(default_factory=InferenceExtensionConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    shutdown_grace_s: float = 25.0  # SIGTERM: in-flight ext_proc streams get this long to finish
    shutdown_delay_s: float = 0.0  # SIGTERM: new streams still routed this long (not ready meanwhile)
    config_path: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    notices: tuple[str, ...] = ()  # one line each for knobs accepted but not applied (logged at startup)


# The file's mapping sections and the options each holds (the top-level lists workers:, models: and
# groups: are read by workers.py and groups.py).
FILE_SECTIONS: dict[str, tuple[Option[Any], ...]] = {
    router.SECTION: (*ROUTER_OPTIONS, *DYNAMO_OPTIONS),
    server.SECTION: (
        *PICKER_OPTIONS,
        *GROUP_OPTIONS,
        *SERVER_TLS_OPTIONS,
        *GROUP_TLS_OPTIONS,
        *SHUTDOWN_OPTIONS,
    ),
    events.SECTION: (*EVENT_OPTIONS, *NATS_OPTIONS),
    discovery.SECTION: DISCOVERY_OPTIONS,
    disagg.SECTION: DISAGG_OPTIONS,
    engine_metrics.SECTION: ENGINE_METRICS_OPTIONS,
    inference_extension.SECTION: INFERENCE_EXTENSION_OPTIONS,
}

# `serve --help`, group by group, in this order.
HELP_GROUPS: tuple[tuple[str, tuple[Option[Any], ...]], ...] = (
    ("router", ROUTER_OPTIONS),
    ("KV events and replicas", EVENT_OPTIONS),
    ("picker", PICKER_OPTIONS),
    ("router groups", GROUP_OPTIONS),
    ("transport security", (*SERVER_TLS_OPTIONS, *GROUP_TLS_OPTIONS)),
    ("NATS credentials and TLS", NATS_OPTIONS),
    ("shutdown", SHUTDOWN_OPTIONS),
    ("disaggregated prefill/decode", DISAGG_OPTIONS),
    ("worker discovery", DISCOVERY_OPTIONS),
    ("engine metrics (the workers' own load)", ENGINE_METRICS_OPTIONS),
    ("Inference Extension resources (objectives, model rewrites)", INFERENCE_EXTENSION_OPTIONS),
    ("from Dynamo's command lines (startup names each one given, with what it does here)", DYNAMO_OPTIONS),
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config` and every option of every section, in HELP_GROUPS' order."""
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file with workers, models and router settings."
    )
    for title, options in HELP_GROUPS:
        add_options(parser.add_argument_group(f"{title} (env DYN_<FLAG>, e.g. DYN_ROUTER_MODE)"), options)


def load_config(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    args: argparse.Namespace | None = None,
) -> PickerConfig:
    """Build the frozen configuration from flags (or parsed `args`), `environ` and the config file.

    Raises ConfigError naming the setting, the value and what is accepted; argparse exits on a bad flag.
    """
    environ = os.environ if environ is None else environ
    if args is None:
        parser = argparse.ArgumentParser(allow_abbrev=False)  # a prefix of a flag is not that flag
        add_serve_arguments(parser)
        args = parser.parse_args(argv)
    config_path = getattr(args, "config", None) or environ.get("DYN_CONFIG")
    document = _read_file(config_path) if config_path else {}
    sections = {name: document.get(name) or {} for name in FILE_SECTIONS}
    if not all(isinstance(s, Mapping) for s in sections.values()):
        raise ConfigError(
            "config file: 'router', 'events', 'picker', 'discovery', 'disagg', 'engine-metrics' and "
            "'inference-extension' must be mappings"
        )

    def reader(section: str) -> Reader:
        return Reader(args, environ, sections[section])

    workers = read_workers(document.get("workers"))
    events_reader = reader(events.SECTION)
    notices = dynamo.dynamo_notices(reader(router.SECTION), events_reader)
    events_config = read_events(dynamo.with_event_plane(reader(router.SECTION), events_reader))
    events_config = dynamo.with_zmq_plane(reader(router.SECTION), events_config)
    if (file_kv := dynamo.local_indexer_store(reader(router.SECTION), events_config)) is not None:
        events_config = dataclasses.replace(events_config, dynamo_file_kv=file_kv)
    # ZMQ from the workers, Dynamo-style events on NATS core (JetStream when durable) or Dynamo's ZMQ plane
    kv_events_source = (
        events_config.kv_events_port is not None
        or events_config.nats_url is not None
        or any(w.kv_events for w in workers)
        or events_config.kv_indexer_url is not None
        or events_config.hears_zmq_plane
    )
    router_config = read_router(reader(router.SECTION), kv_events_source=kv_events_source)
    notices = router_notices(reader(router.SECTION), kv_events=router_config.use_kv_events) + notices
    own = read_server(reader(server.SECTION))
    groups_config = read_groups(reader(groups.SECTION), document.get("groups"))
    discovery_config = read_discovery(reader(discovery.SECTION))
    disagg_config = read_disagg(reader(disagg.SECTION))
    engine_metrics_config = read_engine_metrics(reader(engine_metrics.SECTION))
    inference_extension_config = read_inference_extension(reader(inference_extension.SECTION))
    if inference_extension_config.initial.priorities and router_config.router_queue_threshold is None:
        notices += (
            "--inference-resources: an objective's priority orders the admission queue, which is off "
            "(--router-queue-threshold unset): requests are counted per objective, in arrival order",
        )
    notices += _kv_indexer_check(events_config, router_config)
    if discovery_config.reload_config and not config_path:
        raise ConfigError("--reload-config needs a config file (--config or DYN_CONFIG)")
    return PickerConfig(
        router=router_config,
        workers=workers,
        models=read_models(document.get("models"), workers),
        host=own.host,
        port=own.port,
        health_port=own.health_port,
        admin_port=own.admin_port,
        admin_host=own.admin_host,
        admin_token=own.admin_token,
        admin_allow_unauthenticated_writes=own.admin_allow_unauthenticated_writes,
        queue_max_wait_s=own.queue_max_wait_s,
        session_ttl_s=own.session_ttl_s,
        session_max_pins=own.session_max_pins,
        session_id_max_length=own.session_id_max_length,
        worker_session_control=own.worker_session_control,
        max_body_bytes=own.max_body_bytes,
        body_parse_workers=own.body_parse_workers,
        body_parse_inline_bytes=own.body_parse_inline_bytes,
        max_prompt_tokens=own.max_prompt_tokens,
        outlier_consecutive_5xx=own.outlier_consecutive_5xx,
        outlier_base_ejection_s=own.outlier_base_ejection_s,
        max_concurrent_streams=own.max_concurrent_streams,
        tokenizer=own.tokenizer,
        tokenize_url=own.tokenize_url,
        tokenizer_timeout_s=own.tokenizer_timeout_s,
        tokenizer_cache_size=own.tokenizer_cache_size,
        tokenizer_cache_bytes=own.tokenizer_cache_bytes,
        conformance_hooks=own.conformance_hooks,
        ext_proc_server=own.ext_proc_server,
        seed=own.seed,
        log_level=own.log_level,
        kv_events_source=kv_events_source,
        events=events_config,
        groups=groups_config,
        discovery=discovery_config,
        disagg=disagg_config,
        engine_metrics=engine_metrics_config,
        inference_extension=inference_extension_config,
        tls=own.tls,
        shutdown_grace_s=own.shutdown_grace_s,
        shutdown_delay_s=own.shutdown_delay_s,
        config_path=str(config_path) if config_path else None,
        notices=notices,
    )


def _read_file(config_path: str) -> Mapping[str, Any]:
    """The config file's top-level mapping (empty for an empty file). Raises ConfigError."""
    try:
        loaded = yaml.safe_load(Path(config_path).read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: not UTF-8, a bad escape
        raise ConfigError(f"cannot read config file {config_path}: {exc}") from exc
    if loaded is not None and not isinstance(loaded, Mapping):
        raise ConfigError(f"config file {config_path}: expected a mapping at the top level")
    return loaded or {}


def _kv_indexer_check(events_config: EventsConfig, router_config: RouterConfig) -> tuple[str, ...]:
    """What --kv-indexer-url cannot be combined with (ConfigError), and what it makes moot (notices)."""
    if events_config.kv_indexer_url is None:
        return ()
    if not router_config.use_kv_events:
        raise ConfigError(
            "--kv-indexer-url with --no-router-kv-events: the indexer's view of the engines' KV events "
            "is what replaces this picker's own; drop one of them"
        )
    if events_config.durable_kv_events:
        raise ConfigError(
            "--kv-indexer-url with --router-durable-kv-events: with an indexer this picker consumes no "
            "KV events, durable or not; drop one of them"
        )
    if router_config.mode not in KV_RULES:
        return (f"--kv-indexer-url is not queried in --router-mode {router_config.mode.value}, which routes "
                "without overlaps",)  # fmt: skip
    return ()
