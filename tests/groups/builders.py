"""Builders shared by the router-group tests: pickers' pools, requests, and groups on free ports."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from extproc.config import DisaggConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.groups import GroupRequest
from extproc.picker.local_group import LocalGroup, Routed
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig

MODEL = "demo-model"
BLOCK = 16


def group_config(
    prefix: str, n_workers: int = 2, *, subnet: int = 1, dp_ranks: Sequence[int] = (0,), **router
) -> PickerConfig:
    """Workers `<prefix>0..` at 127.0.<subnet>.<i+1>:8000, predicted cache state, block size 16."""
    router.setdefault("block_size", BLOCK)
    router.setdefault("use_kv_events", False)
    router.setdefault("prefill_load_model", "none")  # Dynamo's cost, which these tests' loads are counted in
    workers = tuple(
        WorkerConfig(f"{prefix}{i}", f"127.0.{subnet}.{i + 1}:8000", MODEL, dp_ranks=tuple(dp_ranks))
        for i in range(n_workers)
    )
    return PickerConfig(router=RouterConfig(**router), workers=workers, models=(ModelConfig(MODEL),), seed=7)


def disagg_config(
    n_decode: int = 2, prefill_endpoints: Sequence[str] = ("127.0.9.1:8000",), *, disagg=None, **router
) -> PickerConfig:
    """Decode workers `w0..` (as `group_config("w", n_decode)`) and prefill workers `p0..` at
    `prefill_endpoints`; `disagg`: DisaggConfig's fields (no health probes unless said)."""
    config = group_config("w", n_decode, **router)
    decode = tuple(replace(w, role="decode") for w in config.workers)
    prefill = tuple(
        WorkerConfig(f"p{i}", endpoint, MODEL, role="prefill") for i, endpoint in enumerate(prefill_endpoints)
    )
    fields = {"prefill_health_interval_s": 0.0, **(disagg or {})}
    return replace(config, workers=decode + prefill, disagg=DisaggConfig(**fields))


@dataclass
class RouteListener:
    """A route listener (what replica sync is to a group) that records what it hears."""

    routed: list[tuple[Routed, list[int], int, int | None]] = field(default_factory=list)
    prefilled: list[Routed] = field(default_factory=list)
    freed_routes: list[Routed] = field(default_factory=list)

    def on_routed(
        self, routed: Routed, local_hashes: Sequence[int], isl: int, expected_output_tokens: int | None
    ) -> None:
        self.routed.append((routed, list(local_hashes), isl, expected_output_tokens))

    def on_prefill_complete(self, routed: Routed) -> None:
        self.prefilled.append(routed)

    def on_freed(self, routed: Routed) -> None:
        self.freed_routes.append(routed)

    def freed(self) -> list[str]:
        return [routed.request_id for routed in self.freed_routes]


def local_group(
    prefix: str, n_workers: int = 2, *, name: str = "g", cls: type[LocalGroup] = LocalGroup, **kwargs
) -> LocalGroup:
    """A local group (what `--group-api-port` serves) named `name`, over a real EndpointPicker's
    pools of workers `<prefix>0..`; `cls` may be a scripted subclass."""
    config = group_config(prefix, n_workers, **kwargs)
    picker = EndpointPicker(config)
    return cls(name, picker.pools, config=config, clock=time.monotonic, metrics=picker.metrics, listeners=[])


def prompt(seed: int, n_tokens: int = 160) -> list[int]:
    """Distinct prompts per seed: n_tokens token ids (10 blocks of 16 by default)."""
    return [seed * 1000 + i for i in range(n_tokens)]


def request(tokens: Sequence[int], **kwargs) -> GroupRequest:
    return GroupRequest(MODEL, list(tokens), **kwargs)


def loads(group: LocalGroup, tokens: Sequence[int]) -> list[tuple]:
    """A comparable snapshot of a group's potential loads for `tokens`."""
    return [
        (w.worker, w.prefill_tokens, w.decode_blocks, w.overlap_blocks)
        for w in group.potential_loads_now(request(tokens)).workers
    ]
