"""Readiness: whether the picker should receive traffic yet.

Ready when every model has at least one worker (or, hierarchical, router groups are configured:
each group's own picker reports its readiness) and, when the routers use KV events, every
worker's event stream has been up once (its first sync: a replay rebuilt its blocks, or its
events started arriving). An engine that never publishes (idle, or no replay socket) would hold
readiness forever, so after `sync_grace_s` the picker is ready anyway and says which workers are
still routed on predictions. A replica with replica sync that just started is not ready either
until another replica handed it the routes clients name (answers' workers, session pins), or two
heartbeats passed without a replica to ask (`ReplicaSync.awaiting_routes`), within the same grace: a
rolling restart behind a readiness gate then sends no follow-up to a replica that does not know
where its answer is. The admin `/readyz` and the gRPC health `readiness` service follow it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker

SYNC_GRACE_S = 30.0


@dataclass(slots=True)
class ReadinessReport:
    ready: bool
    reason: str
    workers: int
    unsynced: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "reason": self.reason,
            "workers": self.workers,
            "unsynced": self.unsynced,
        }


class Readiness:
    def __init__(
        self,
        picker: EndpointPicker,
        sources: EventSources,
        *,
        sync_grace_s: float = SYNC_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.picker = picker
        self.sources = sources
        self.sync_grace_s = sync_grace_s
        self.clock = clock
        self.started = clock()
        self.draining = False

    def check(self) -> ReadinessReport:
        pools = self.picker.pools
        workers = [w for pool in pools.values() for r in pool.routers() for w in r.workers()]
        if self.draining:
            return ReadinessReport(False, "shutting down", len(workers))
        if self.picker.hierarchical:  # workers live behind the groups
            groups = self.picker.config.groups.groups
            return ReadinessReport(True, f"routing through {len(groups)} router groups", len(workers))
        empty = [model for model, pool in pools.items() if not pool.router.workers()]
        if not pools or empty:
            return ReadinessReport(
                False, f"no workers known for {', '.join(empty) or 'any model'}", len(workers)
            )
        sync = self.sources.replica_sync
        if sync is not None and sync.awaiting_routes() and self.clock() - self.started < self.sync_grace_s:
            return ReadinessReport(False, "waiting for another replica's routes (answers' workers, "
                                   "session pins)", len(workers))  # fmt: skip
        if not self.picker.config.router.use_kv_events:
            return ReadinessReport(True, "workers known; cache state predicted from routing", len(workers))
        feed = self.sources.feed
        unsynced = [str(w) for w in workers if not feed.synced(w)]
        if not unsynced:
            return ReadinessReport(True, "workers known; every KV event stream synced", len(workers))
        waited = self.clock() - self.started
        if waited >= self.sync_grace_s:
            reason = f"ready after {self.sync_grace_s:.0f} s; {len(unsynced)} workers without KV events yet"
            return ReadinessReport(True, reason, len(workers), unsynced)
        return ReadinessReport(False, f"waiting for the first KV event sync of {len(unsynced)} workers",
                               len(workers), unsynced)  # fmt: skip
