"""RouterFeed: the EventSink that applies every transport's events to the picker's routers.

The picker has one router per model; each worker's events go to its model's router.

It also keeps, per worker, where its cache state comes from, for logs and metrics:

- `predicted`: no event stream yet (or none configured); the router predicts from its decisions.
- `event-fed`: the worker's KV events are flowing and applied.
- `stale`: the stream was lost; the router keeps the blocks it last knew and predicts on top
  until the stream is back and the worker is resynchronised.

Runs on the event loop thread, like every transport that calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from extproc.events.counters import EventCounters
from extproc.router import KvRouter
from extproc.router.types import KvEvent, Worker, WorkerId

log = logging.getLogger("extproc.events")

PREDICTED, EVENT_FED, STALE = "predicted", "event-fed", "stale"


class RouterFeed:
    """Applies decoded KV events to each worker's router and tracks each worker's cache source."""

    def __init__(self, routers: Mapping[WorkerId, KvRouter], counters: EventCounters | None = None) -> None:
        self.routers = dict(routers)
        self.counters = counters or EventCounters()
        self._state: dict[Worker, str] = {}
        self._synced: set[Worker] = set()  # workers whose event stream has been up at least once

    def apply_events(self, events: Iterable[KvEvent]) -> None:
        routers = self.routers
        applied = 0
        for event in events:
            worker = event.worker
            router = routers.get(worker.worker_id)
            if router is None:
                self.counters.loud(
                    "feed.unknown_worker",
                    "KV event for worker %s, which is not in the worker list: ignored",
                    worker,
                )
                continue
            router.apply_event(event)
            applied += 1
            if self._state.get(worker) != EVENT_FED:
                self._set(worker, EVENT_FED, "events arriving")
        self.counters.add("feed.events", applied)

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.counters.add("feed.reset")
        router = self.routers.get(worker.worker_id)
        if router is not None:
            log.info("worker %s: forgetting its cached blocks (%s)", worker, reason)
            router.reset_worker_cache(worker)

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        router = self.routers.get(worker.worker_id)
        if router is None:
            return
        router.set_event_fed(worker, up)
        if up:
            self._set(worker, EVENT_FED, reason)
        else:
            self._set(worker, STALE if self._state.get(worker) == EVENT_FED else PREDICTED, reason)

    def synced(self, worker: Worker) -> bool:
        """Whether the worker's KV events have been flowing at some point (its first sync is done)."""
        return worker in self._synced

    def state(self, worker: Worker) -> str:
        return self._state.get(worker, PREDICTED)

    def states(self) -> dict[Worker, str]:
        """Every routed worker's cache source."""
        routers = {id(r): r for r in self.routers.values()}.values()
        return {w: self.state(w) for r in routers for w in r.workers()}

    def _set(self, worker: Worker, state: str, reason: str) -> None:
        old = self._state.get(worker, PREDICTED)
        self._state[worker] = state
        if state == EVENT_FED:
            self._synced.add(worker)
        if old != state:
            level = logging.WARNING if state == STALE else logging.INFO
            log.log(level, "worker %s: cache state %s -> %s (%s)", worker, old, state, reason)
