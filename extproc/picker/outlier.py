"""Outlier ejection: workers whose answers keep failing are left out of routing for a while.

Envoy cannot do this for us: the picker chooses the host (ORIGINAL_DST), so Envoy's outlier
detection never sees a pool. The rule is Envoy's `consecutive_5xx` one: after `consecutive` 5xx
answers in a row (Envoy's own 503 for a worker it cannot connect to counts; a 2xx resets the run,
other statuses leave it, as `extproc_worker_consecutive_failures` counts), a worker is ejected
for `base_s` times the number of times it has been ejected (capped at `max_s`); when that time is
up it takes requests again, and one success resets both counts. At most `max_fraction` of a
model's workers are ejected at once (at least one stays), so a pool-wide outage still gets its
answers from the workers rather than from the picker. Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(slots=True)
class _Record:
    failures: int = 0  # consecutive 5xx answers
    ejections: int = 0  # times ejected since the last success
    until: float = 0.0  # ejected until this time


class OutlierEjection:
    """Consecutive-5xx ejection per worker id."""

    def __init__(
        self, *, consecutive: int = 5, base_s: float = 10.0, max_s: float = 300.0, max_fraction: float = 0.5
    ) -> None:
        self.consecutive = consecutive
        self.base_s = base_s
        self.max_s = max_s
        self.max_fraction = max_fraction
        self._records: dict[str, _Record] = {}

    @property
    def enabled(self) -> bool:
        return self.consecutive > 0

    def answered(self, worker_id: str, status: int, now: float, pool: Collection[str]) -> float | None:
        """Record a worker's answer; returns the ejection time in seconds if this one ejects it.

        `pool`: the ids of the worker's model, for the `max_fraction` cap.
        """
        if not self.enabled:
            return None
        if 200 <= status < 300:
            self._records.pop(worker_id, None)
            return None
        if status < 500:
            return None
        record = self._records.setdefault(worker_id, _Record())
        record.failures += 1
        if record.failures < self.consecutive or record.until > now:
            return None
        ejected = len(self.ejected(now, pool))
        if ejected + 1 > max(1, int(len(pool) * self.max_fraction)) or ejected + 1 >= len(pool):
            return None  # keep enough workers in routing
        record.ejections += 1
        record.failures = 0
        duration = min(self.max_s, self.base_s * record.ejections)
        record.until = now + duration
        return duration

    def ejected(self, now: float, pool: Collection[str]) -> set[str]:
        """The workers of `pool` ejected at `now`."""
        return {wid for wid in pool if (r := self._records.get(wid)) is not None and r.until > now}

    def forget(self, worker_id: str) -> None:
        """A worker left the pool."""
        self._records.pop(worker_id, None)
