"""RouterConfig: the router's one typed, frozen configuration, and per-request overrides.

Field names follow Dynamo's `KvRouterConfig` (lib/kv-router/src/scheduling/config.rs) so its
flags map one to one (`--router-temperature` -> `temperature`, ...). Values are checked when
the object is built, with a message naming the field, the value and what is accepted.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields, replace
from typing import TypeGuard, TypeVar

from extproc.router.errors import InvalidConfig
from extproc.router.prefill_model import PrefillTiming

_DEFAULT_TIMING = PrefillTiming()  # frozen, so one shared default


class RouterMode(enum.StrEnum):
    KV = "kv"
    ROUND_ROBIN = "round-robin"
    RANDOM = "random"
    DEVICE_AWARE_WEIGHTED = "device-aware-weighted"  # share by device class throughput, then kv


class PrefillLoadModel(enum.StrEnum):
    NONE = "none"  # a routed prompt's tokens load its worker until the first token
    TIMING = "timing"  # the load decays as the predicted prefill time passes
    AIC = "aic"  # Dynamo's: only the oldest active prefill decays, over its predicted duration


class QueuePolicy(enum.StrEnum):
    FCFS = "fcfs"
    LCFS = "lcfs"
    WSPT = "wspt"


class QueueFairness(enum.StrEnum):
    """Between the flows of one priority (a flow: the requests of one fairness id)."""

    GLOBAL_STRICT = "global-strict"  # none: every request of a priority in policy order
    ROUND_ROBIN = "round-robin"  # the flows take turns, each flow's requests in policy order


@dataclass(frozen=True, slots=True)
class RouterConfigOverride:
    """Per-request overrides; None keeps the router's value."""

    overlap_score_weight: float | None = None
    temperature: float | None = None


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """How the router chooses. Defaults are Dynamo's, except the prefill load model: `timing`, which
    never did worse than Dynamo's `none` in benchmarks/bench_quality.py's matrix (README, routing
    quality); `none` keeps Dynamo's exact behaviour."""

    mode: RouterMode = RouterMode.KV
    block_size: int = 16
    overlap_score_weight: float = 1.0
    temperature: float = 0.0
    use_kv_events: bool = True
    router_ttl_secs: float = 120.0
    router_max_tree_size: int = 2**20
    router_prune_target_ratio: float = 0.8
    router_assume_kv_reuse: bool = True
    router_track_active_blocks: bool = True
    router_track_prefill_tokens: bool = True
    router_track_output_blocks: bool = False
    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: int | None = None
    active_prefill_tokens_threshold_frac: float | None = None
    router_queue_threshold: float | None = None
    router_queue_policy: QueuePolicy = QueuePolicy.FCFS
    router_queue_fairness: QueueFairness = QueueFairness.GLOBAL_STRICT
    prefill_load_model: PrefillLoadModel = PrefillLoadModel.TIMING  # Dynamo's: NONE (bench_quality.py)
    prefill_timing: PrefillTiming = _DEFAULT_TIMING  # the workers' pass-time model (timing only)
    # timing: learn each worker's pass-time scale from its first tokens (mixed fleets, a model fitted
    # elsewhere; extproc/router/pass_time.py). On by default since the fleet-pooled estimate (issue 24)
    learn_prefill_timing: bool = True
    cuda_to_cpu_ratio: float = 8.0  # device-aware-weighted: one accelerator worker's share per cpu worker's
    # tiered KV (extproc/router/tiers.py): the credit of a block offloaded to host memory, or to disk or
    # an external store, as a fraction of a device block's (Dynamo's defaults)
    host_cache_hit_weight: float = 0.75
    disk_cache_hit_weight: float = 0.25
    log_formula: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _enum(RouterMode, "mode", self.mode))
        object.__setattr__(
            self, "router_queue_policy", _enum(QueuePolicy, "router_queue_policy", self.router_queue_policy)
        )
        object.__setattr__(
            self,
            "router_queue_fairness",
            _enum(QueueFairness, "router_queue_fairness", self.router_queue_fairness),
        )
        object.__setattr__(
            self, "prefill_load_model", _enum(PrefillLoadModel, "prefill_load_model", self.prefill_load_model)
        )
        _check(
            self.prefill_load_model is not PrefillLoadModel.AIC or self.router_track_prefill_tokens,
            "prefill_load_model",
            str(self.prefill_load_model),
            "none or timing without router_track_prefill_tokens (as in Dynamo, aic requires "
            "router_track_prefill_tokens=true)",
        )
        if isinstance(self.prefill_timing, str):
            object.__setattr__(self, "prefill_timing", PrefillTiming.parse(self.prefill_timing))
        _check(
            isinstance(self.prefill_timing, PrefillTiming),
            "prefill_timing",
            self.prefill_timing,
            "a PrefillTiming or 'a,b,c[,d2,d1,d0]'",
        )
        _check(self.block_size >= 1, "block_size", self.block_size, "an integer >= 1")
        _check(
            _finite(self.overlap_score_weight) and self.overlap_score_weight >= 0,
            "overlap_score_weight",
            self.overlap_score_weight,
            "a number >= 0",
        )
        _check(
            _finite(self.temperature) and self.temperature >= 0,
            "temperature",
            self.temperature,
            "a number >= 0",
        )
        _check(
            _finite(self.cuda_to_cpu_ratio) and self.cuda_to_cpu_ratio > 0,
            "cuda_to_cpu_ratio",
            self.cuda_to_cpu_ratio,
            "a number > 0",
        )
        for name in ("host_cache_hit_weight", "disk_cache_hit_weight"):
            weight = getattr(self, name)
            _check(_finite(weight) and 0 <= weight <= 1, name, weight, "a fraction in [0, 1]")
        _check(self.router_ttl_secs > 0, "router_ttl_secs", self.router_ttl_secs, "seconds > 0")
        _check(
            self.router_max_tree_size >= 1,
            "router_max_tree_size",
            self.router_max_tree_size,
            "an integer >= 1",
        )
        _check(
            0 < self.router_prune_target_ratio <= 1,
            "router_prune_target_ratio",
            self.router_prune_target_ratio,
            "a fraction in (0, 1]",
        )
        _check(
            self.active_decode_blocks_threshold is None
            or (
                _finite(self.active_decode_blocks_threshold) and 0 <= self.active_decode_blocks_threshold <= 1
            ),
            "active_decode_blocks_threshold",
            self.active_decode_blocks_threshold,
            "a fraction of the KV cache in [0, 1], or unset",
        )
        _check(
            self.active_prefill_tokens_threshold is None
            or (
                isinstance(self.active_prefill_tokens_threshold, int)
                and not isinstance(self.active_prefill_tokens_threshold, bool)
                and self.active_prefill_tokens_threshold >= 0
            ),
            "active_prefill_tokens_threshold",
            self.active_prefill_tokens_threshold,
            "a token count >= 0, or unset",
        )
        frac = self.active_prefill_tokens_threshold_frac
        _check(
            _fraction_or_none(frac),
            "active_prefill_tokens_threshold_frac",
            frac,
            "a fraction in [0, 1], or unset",
        )
        _check(
            self.router_queue_threshold is None or self.router_queue_threshold >= 0,
            "router_queue_threshold",
            self.router_queue_threshold,
            "a number >= 0, or unset",
        )

    def merged(self, override: RouterConfigOverride | None) -> RouterConfig:
        """A new config with the override's set fields applied; self is untouched."""
        if override is None:
            return self
        changes = {f.name: getattr(override, f.name) for f in fields(override)}
        changes = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **changes) if changes else self


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and math.isfinite(value)


def _fraction_or_none(value: object) -> bool:
    return value is None or (_finite(value) and 0 <= value <= 1)


def _check(ok: bool, name: str, value: object, accepted: str) -> None:
    if not ok:
        raise InvalidConfig(name, value, accepted)


_E = TypeVar("_E", bound=enum.StrEnum)


def _enum(cls: type[_E], name: str, value: object) -> _E:
    if isinstance(value, str):  # a member is a str too
        try:
            return cls(value)
        except ValueError:
            pass
    raise InvalidConfig(name, value, "one of " + ", ".join(m.value for m in cls))
