"""Device-aware weighted routing: which device class takes the next request. Pure, no state.

Follows Dynamo's `device-aware-weighted` mode (lib/runtime/src/pipeline/network/egress/
push_router.rs, `device_aware_candidate_group`). Eligible workers split into a CPU class and an
accelerator class (every device that is not `cpu`). Each class's load is its in-flight requests
normalised by its capacity, with one accelerator worker counting `ratio` CPU workers:

    normalized_load(class) = in_flight(class) / (workers(class) * weight)
    weight = ratio for the accelerators, 1 for the CPUs

The CPU class takes the next request only if it stays within its share after taking it,

    (cpu_in_flight + 1) / cpu_workers  <=  accel_in_flight / (accel_workers * ratio)

which is Dynamo's integer budget `cpu_in_flight < floor(accel_in_flight * cpu_workers /
(ratio * accel_workers))` for a real-valued ratio; otherwise the accelerators take it. So under
sustained load the in-flight requests per worker settle at `ratio` : 1 (the CPU class at most one
request short of its exact share: 2 + 2 workers at ratio 8 hold N // 9 of N), ties and an idle pool go to
the accelerators (an idle accelerator answers sooner than an idle CPU), and a class with no eligible
worker leaves everything to the other. Nothing is remembered between decisions: the split follows
the live in-flight counts, so a changed ratio applies from the next decision on.

Within the chosen class the caller applies its usual rules (the KV cost and temperature).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

W = TypeVar("W")

CPU = "cpu"
ACCELERATOR = "cuda"
_EPSILON = 1e-9  # relative slack: a ratio like 0.1 is not exact in binary; a tie must stay a tie
# (relative only: with nothing in flight on the accelerators the CPUs never take a request, whatever
# the ratio)


def device_class(device: str) -> str:
    """`cpu` or `cuda` (any accelerator; an unknown device counts as one, as in Dynamo)."""
    return CPU if device == CPU else ACCELERATOR


def cpu_takes_next(
    cpu_in_flight: int, cpu_workers: int, accel_in_flight: int, accel_workers: int, ratio: float
) -> bool:
    """Whether the CPU class takes the next request (both classes have eligible workers)."""
    wanted = (cpu_in_flight + 1) * ratio * accel_workers
    allowed = accel_in_flight * cpu_workers
    return wanted <= allowed * (1.0 + _EPSILON)


def device_class_candidates(
    eligible: Sequence[W],
    *,
    device_of: Callable[[W], str],
    in_flight: Callable[[W], int],
    ratio: float,
) -> list[W]:
    """The eligible workers of the class that takes the next request, in their given order."""
    cpu = [w for w in eligible if device_class(device_of(w)) == CPU]
    if not cpu or len(cpu) == len(eligible):
        return list(eligible)
    accel = [w for w in eligible if device_class(device_of(w)) != CPU]
    cpu_load = sum(in_flight(w) for w in cpu)
    accel_load = sum(in_flight(w) for w in accel)
    return cpu if cpu_takes_next(cpu_load, len(cpu), accel_load, len(accel), ratio) else accel


def class_shares(accel_workers: int, cpu_workers: int, ratio: float) -> dict[str, float]:
    """The fraction of concurrent requests each class holds under sustained load (for docs and tests)."""
    accel = accel_workers * ratio
    total = accel + cpu_workers
    if total == 0:
        return {ACCELERATOR: 0.0, CPU: 0.0}
    return {ACCELERATOR: accel / total, CPU: cpu_workers / total}
