"""Where workers come from besides the file's static list: a headless Service's DNS records, and the
config file itself, re-read when it changes; and which LoRA adapters they serve, read from their
model lists -> `DiscoveryConfig`. The file section is `discovery:`.

extproc/runtime/discovery.py does the looking up and the watching, extproc/runtime/lora_discovery.py
the reading of model lists; this module only says what to watch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from extproc.config.options import ConfigError, Option, Reader, check_positive

SECTION = "discovery"


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
    lora_interval_s: float = 30.0  # each worker's /v1/models read this often for its LoRA adapters; 0 = off
    lora_timeout_s: float = 2.0


DISCOVERY_DNS: Option[str | None] = Option(
    "--discovery-dns",
    str,
    None,
    "Discover workers from the A/AAAA records of this name (a headless Service, e.g. "
    "vllm.default.svc.cluster.local), refreshed periodically; pods come and go without a restart.",
)
DISCOVERY_PORT = Option("--discovery-port", int, 8000, "The discovered workers' HTTP port.")
DISCOVERY_MODEL: Option[str | None] = Option(
    "--discovery-model",
    str,
    None,
    "Model served by the discovered workers (default: the only configured model).",
)
DISCOVERY_DNS_SERVER: Option[str | None] = Option(
    "--discovery-dns-server",
    str,
    None,
    "DNS server ip[:port] to ask instead of the system resolver.",
)
DISCOVERY_REFRESH_SECS = Option("--discovery-refresh-secs", float, 10.0, "Seconds between DNS lookups.")
DISCOVERY_ROLE = Option(
    "--discovery-role",
    str,
    "both",
    "Role of the workers found by --discovery-dns: both (aggregated), prefill or decode.",
    choices=("both", "prefill", "decode"),
)
DISCOVERY_PREFILL_DNS: Option[str | None] = Option(
    "--discovery-prefill-dns",
    str,
    None,
    "A second name whose A/AAAA records are prefill workers (disaggregated serving).",
)
DISCOVERY_DEVICE = Option(
    "--discovery-device",
    str,
    "cuda",
    "Device class of the discovered workers: cuda (any accelerator) or cpu.",
    choices=("cuda", "cpu"),
)
RELOAD_CONFIG = Option(
    "--reload-config",
    bool,
    False,
    "Watch the config file and apply changes to its worker list without a restart.",
)

LORA_DISCOVERY_INTERVAL_MS = Option(
    "--lora-discovery-interval-ms",
    int,
    30_000,
    "Read each worker's /v1/models this often: the LoRA adapters vLLM lists there (with a parent) "
    "become model names requests may give, routed to that worker's model and matched against the "
    "blocks cached under the adapter; adapters loaded at run time appear within an interval. The "
    "model's other served names listed there (vLLM's --served-model-name llama llama-3.1) become "
    "its aliases. 0 turns it off (models[].lora-adapters and models[].aliases in the file still name "
    "them; SGLang's MODEL:ADAPTER and lora_path need neither).",
)
LORA_DISCOVERY_TIMEOUT_MS = Option(
    "--lora-discovery-timeout-ms", int, 2000, "Time limit of one /v1/models read (connect, headers, body)."
)

DISCOVERY_OPTIONS: tuple[Option[Any], ...] = (
    DISCOVERY_DNS,
    DISCOVERY_PORT,
    DISCOVERY_MODEL,
    DISCOVERY_DNS_SERVER,
    DISCOVERY_REFRESH_SECS,
    DISCOVERY_ROLE,
    DISCOVERY_PREFILL_DNS,
    DISCOVERY_DEVICE,
    RELOAD_CONFIG,
    LORA_DISCOVERY_INTERVAL_MS,
    LORA_DISCOVERY_TIMEOUT_MS,
)


def read_discovery(reader: Reader) -> DiscoveryConfig:
    """The discovery settings. Raises ConfigError. (That --reload-config has a file to watch is
    checked by `load_config`, which knows the file.)"""
    read = reader.read
    discovery = DiscoveryConfig(
        dns_name=read(DISCOVERY_DNS),
        dns_port=read(DISCOVERY_PORT),
        dns_model=read(DISCOVERY_MODEL),
        dns_server=read(DISCOVERY_DNS_SERVER),
        refresh_s=read(DISCOVERY_REFRESH_SECS),
        role=read(DISCOVERY_ROLE),
        prefill_dns_name=read(DISCOVERY_PREFILL_DNS),
        device=read(DISCOVERY_DEVICE),
        reload_config=read(RELOAD_CONFIG),
        lora_interval_s=read(LORA_DISCOVERY_INTERVAL_MS) / 1000,
        lora_timeout_s=read(LORA_DISCOVERY_TIMEOUT_MS) / 1000,
    )
    check_positive("discovery-refresh-secs", discovery.refresh_s)
    if discovery.lora_interval_s < 0:
        interval_ms = discovery.lora_interval_s * 1000
        raise ConfigError(f"invalid lora-discovery-interval-ms={interval_ms:g}: expected >= 0 (0 = off)")
    check_positive("lora-discovery-timeout-ms", discovery.lora_timeout_s)
    return discovery
