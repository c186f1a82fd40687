"""`KvRouterConfig` and the per-request `router_config_override` dict, in Dynamo's names.

Takes exactly the keyword arguments of ai-dynamo-runtime 1.6.1's `KvRouterConfig` (same defaults)
and turns them into our `RouterConfig`. The knobs this router applies map one to one; the rest are
accepted (so a Dynamo script constructs unchanged), and setting one of those to anything but its
default logs one warning naming it, never a silent no-op. Mirrors `dynamo._core.KvRouterConfig`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from extproc.router import InvalidConfig, RouterConfig, RouterConfigOverride

log = logging.getLogger("extproc.compat")

# Dynamo 1.6.1 keyword -> our RouterConfig field (same meaning)
_APPLIED = {
    "router_temperature": "temperature",
    "use_kv_events": "use_kv_events",
    "router_track_active_blocks": "router_track_active_blocks",
    "router_track_output_blocks": "router_track_output_blocks",
    "router_assume_kv_reuse": "router_assume_kv_reuse",
    "router_track_prefill_tokens": "router_track_prefill_tokens",
    "router_prefill_load_model": "prefill_load_model",
    "router_ttl_secs": "router_ttl_secs",
    "router_queue_threshold": "router_queue_threshold",
    "router_queue_policy": "router_queue_policy",
}
# Dynamo 1.6.1 keywords this router has no equivalent of, with Dynamo's defaults
_NOT_APPLIED: dict[str, Any] = {
    "host_cache_hit_weight": 0.75,
    "disk_cache_hit_weight": 0.25,
    "router_replica_sync": False,
    "router_approximate_cache_policy": "ttl",
    "router_event_threads": 4,
    "use_remote_indexer": False,
    "serve_indexer": False,
    "enable_session_prefix_index": False,
    "shared_cache_multiplier": None,
    "shared_cache_type": "none",
    "router_predicted_ttl_secs": None,
    "conditional_disagg_enabled": False,
    "conditional_disagg_policy": "isl_bounding",
    "conditional_disagg_eff_isl_threshold": 2048,
    "conditional_disagg_eff_isl_ratio_threshold": 0.7,
    "conditional_disagg_prefill_busy_threshold": None,
    "conditional_disagg_decode_busy_threshold": None,
    "overlap_score_credit": 1.0,
    "overlap_score_credit_decay": 0.0,
    "prefill_load_scale": 1.0,
    "decode_active_request_weight": 0.0,
    "router_policy_config": None,
    "router_prefill_policy": None,
    "router_decode_policy": None,
    "router_tracking_hash": "public-xxh3-v1",
    "router_tracking_key_file": None,
    "router_tracking_key_id": None,
}
# what a router_config_override dict may hold -> RouterConfigOverride field
_OVERRIDES = {"overlap_score_weight": "overlap_score_weight", "router_temperature": "temperature"}


class KvRouterConfig:
    """Dynamo's router settings; `router_config(block_size)` is our `RouterConfig` for them.

    Defaults are Dynamo's, including `router_prefill_load_model="none"` (ours is `timing`).
    Raises ValueError (`InvalidConfig`) for a value the router does not accept.
    """

    def __init__(
        self,
        overlap_score_weight: float | None = None,
        host_cache_hit_weight: float = 0.75,
        disk_cache_hit_weight: float = 0.25,
        router_temperature: float = 0.0,
        use_kv_events: bool = True,
        *,
        router_replica_sync: bool = False,
        router_track_active_blocks: bool = True,
        router_track_output_blocks: bool = False,
        router_assume_kv_reuse: bool = True,
        router_track_prefill_tokens: bool = True,
        router_prefill_load_model: str = "none",
        router_ttl_secs: float = 120.0,
        router_queue_threshold: float | None = None,
        router_queue_policy: str = "fcfs",
        **others: Any,
    ) -> None:
        unknown = sorted(set(others) - set(_NOT_APPLIED))
        if unknown:
            raise TypeError(f"KvRouterConfig() got unexpected keyword arguments: {', '.join(unknown)}")
        given = {
            "router_temperature": router_temperature,
            "use_kv_events": use_kv_events,
            "router_track_active_blocks": router_track_active_blocks,
            "router_track_output_blocks": router_track_output_blocks,
            "router_assume_kv_reuse": router_assume_kv_reuse,
            "router_track_prefill_tokens": router_track_prefill_tokens,
            "router_prefill_load_model": router_prefill_load_model,
            "router_ttl_secs": router_ttl_secs,
            "router_queue_threshold": router_queue_threshold,
            "router_queue_policy": router_queue_policy,
        }
        self._fields: dict[str, Any] = {_APPLIED[k]: v for k, v in given.items()}
        if overlap_score_weight is not None:
            self._fields["overlap_score_weight"] = overlap_score_weight
        ignored = {
            "host_cache_hit_weight": host_cache_hit_weight,
            "disk_cache_hit_weight": disk_cache_hit_weight,
        }
        ignored |= {"router_replica_sync": router_replica_sync, **others}
        for name, value in ignored.items():
            if value != _NOT_APPLIED[name]:
                log.warning("KvRouterConfig(%s=%r) has no effect in extproc.compat; ignored", name, value)
        self.router_config(16)  # check the values now, not at the first request

    @property
    def overlap_score_weight(self) -> float:
        return float(self._fields.get("overlap_score_weight", 1.0))

    def router_config(self, block_size: int) -> RouterConfig:
        """Our `RouterConfig` with these settings and `block_size` (tokens per KV block)."""
        return RouterConfig(block_size=block_size, **self._fields)

    def __repr__(self) -> str:
        return f"KvRouterConfig({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


def parse_override(override: Mapping[str, Any] | None) -> RouterConfigOverride | None:
    """A `router_config_override` dict (`overlap_score_weight`, `router_temperature`) as our override.

    Raises InvalidConfig for another key or a value that is not a number.
    """
    if override is None:
        return None
    values: dict[str, float] = {}
    for key, value in override.items():
        field = _OVERRIDES.get(key)
        if field is None:
            raise InvalidConfig("router_config_override key", key, " or ".join(_OVERRIDES))
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise InvalidConfig(f"router_config_override[{key!r}]", value, "a number >= 0")
        values[field] = float(value)
    return RouterConfigOverride(**values) if values else None
