"""RouterFeed: the EventSink that applies every transport's events to the picker's routers.

The picker has one router per model; each worker's events go to its model's router. Only a
configured (worker, dp rank) is fed: an event of a worker id not in the worker list, or of a dp rank
its worker does not have, is counted (`feed.unknown_worker`; `feed.unknown_dp_rank` and
`drops[("feed", worker, "unknown-dp-rank")]`) and ignored, and so are resets and stream states
naming them, so nothing is indexed that no reset of a configured worker would clear.

It also keeps, per worker, where its cache state comes from, for logs, metrics and /debug/workers:

- `predicted`: no event stream yet (or none configured); the router predicts from its decisions.
- `event-fed`: the worker's KV events are flowing, its view is whole, and they are applied.
- `stale`: the router keeps the blocks it knows, applies what still arrives and predicts on top,
  because the view is not whole: the stream was lost (the transport said so), or the view lost
  blocks the engine still holds.

How a lost view is noticed and healed. Blocks are lost to the picker when events are (a NATS
restart, an event-id gap, an unreadable snapshot, `--router-reset-states`, a picker started after
the workers). The engine then keeps storing blocks under parents the router never saw, and the
router drops those stores (orphans: `KvRouter.apply_event` returns False). The first orphan marks
the worker lost: the router predicts its cache from routing decisions on top of the known blocks,
so new prompts are learned again at once, and the worker's transport is asked to rebuild it from
the engine's own state where it can (`set_resync`: the ZMQ replay). The worker is whole again
after a reset that a rebuild follows (`reset_worker`: a replay or snapshot starts from nothing the
router could have wrong), after the engine cleared its own cache, or after `recover_after_stores`
stores in a row hung under known blocks (the engine's working set is known again: what is still
missing is no longer built on).

A worker's predictions are withdrawn (the router made event-fed) only once one of its events
applied, not when its transport first says its stream is up: that first event may hang under blocks
the picker never saw (a picker started after the engines, an unreadable snapshot), and then what
it predicted from its routing until then is all it knows of the prompts it routed there.

Runs on the event loop thread, like every transport that calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from extproc.events.counters import EventCounters
from extproc.router import KvRouter
from extproc.router.types import AllBlocksCleared, BlocksStored, KvEvent, Worker, WorkerId

log = logging.getLogger("extproc.events")

PREDICTED, EVENT_FED, STALE = "predicted", "event-fed", "stale"
RECOVER_AFTER_STORES = 100  # stores in a row under known blocks that make a lost view whole again

Resync = Callable[[str], None]  # asks a transport to rebuild one worker from the engine's own state


@dataclass(slots=True)
class _Loss:
    """A worker whose view lost blocks: how many orphaned stores, and the run of good ones since."""

    why: str
    orphans: int = 0
    good_run: int = 0


class RouterFeed:
    """Applies decoded KV events to each worker's router and tracks each worker's cache source."""

    def __init__(
        self,
        routers: Mapping[str, KvRouter] | Mapping[WorkerId, KvRouter],  # (Mapping's keys are invariant)
        counters: EventCounters | None = None,
        *,
        recover_after_stores: int = RECOVER_AFTER_STORES,
    ) -> None:
        self.routers: dict[WorkerId, KvRouter] = dict(routers.items())
        self.counters = counters or EventCounters()
        self.recover_after_stores = recover_after_stores
        self._state: dict[Worker, str] = {}
        self._reason: dict[Worker, str] = {}
        self._up: set[Worker] = set()  # workers whose transport says their stream is usable
        self._lost: dict[Worker, _Loss] = {}  # workers whose view lost blocks the engine holds
        self._synced: set[Worker] = set()  # workers that have been event-fed with a whole view
        self._heard: set[Worker] = set()  # workers one of whose events reached the feed, or reset
        self._resync: dict[Worker, Resync] = {}

    # --- EventSink -----------------------------------------------------------------------------

    def apply_events(self, events: Iterable[KvEvent]) -> None:
        applied = 0
        for event in events:
            worker = event.worker
            router = self._router(worker)
            if router is None:
                self._unknown(worker)
                continue
            whole = worker in self._up and worker not in self._lost
            first = worker not in self._heard
            self._heard.add(worker)
            if not router.apply_event(event, feeds=whole and not first):
                self._orphaned(worker, event)
                continue
            if first and whole:
                router.set_event_fed(worker, True)  # its predictions go now, not before the event
            applied += 1
            if isinstance(event, AllBlocksCleared):
                self._found(worker, "the engine cleared its cache")
            elif worker in self._lost and isinstance(event, BlocksStored):
                loss = self._lost[worker]
                loss.good_run += 1
                if loss.good_run >= self.recover_after_stores:
                    self._found(worker, f"{loss.good_run} stores in a row under known blocks")
        self.counters.add("feed.events", applied)

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.counters.add("feed.reset")
        router = self._router(worker)
        if router is None:
            return
        log.info("worker %s: forgetting its cached blocks (%s)", worker, reason)
        router.reset_worker_cache(worker)
        self._heard.add(worker)  # its view is rebuilt from the engine's own state: no prediction is kept
        self._found(worker, f"reset ({reason})", promote=False)  # nothing left that could be wrong

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        if self._router(worker) is None:
            return
        if up:
            self._up.add(worker)
        else:
            self._up.discard(worker)
        self._refresh(worker, reason)

    def _router(self, worker: Worker) -> KvRouter | None:
        """The router of `worker` when its worker id and dp rank are configured, else None."""
        router = self.routers.get(worker.worker_id)
        if router is None:
            return None
        spec = router.spec(worker.worker_id)
        return router if spec is not None and worker.dp_rank in spec.dp_ranks else None

    def _unknown(self, worker: Worker) -> None:
        if worker.worker_id not in self.routers:
            self.counters.loud(
                "feed.unknown_worker",
                "KV event for worker %s, which is not in the worker list: ignored",
                worker,
            )
            return
        self.counters.dropped("feed", str(worker), "unknown-dp-rank")
        self.counters.loud(
            "feed.unknown_dp_rank",
            "KV event for %s: worker %s has no dp rank %d: ignored",
            worker,
            worker.worker_id,
            worker.dp_rank,
        )

    # --- recovery ------------------------------------------------------------------------------

    def set_resync(self, worker: Worker, resync: Resync | None) -> None:
        """Register (or with None, remove) how `worker`'s view is rebuilt from the engine's state."""
        if resync is None:
            self._resync.pop(worker, None)
        else:
            self._resync[worker] = resync

    def lost(self, worker: Worker) -> bool:
        """Whether the worker's view is known to miss blocks its engine holds."""
        return worker in self._lost

    def lossy(self) -> list[Worker]:
        """Workers whose view is known to miss blocks (a snapshot of this state would lose them)."""
        return sorted(self._lost)

    def _orphaned(self, worker: Worker, event: KvEvent) -> None:
        self.counters.add("feed.orphaned")
        self.counters.dropped("feed", str(worker), "unknown-parent")
        loss = self._lost.get(worker)
        if loss is not None:
            loss.orphans += 1
            loss.good_run = 0
            return
        parent = event.parent_hash if isinstance(event, BlocksStored) else None
        why = (
            f"a stored block's parent {parent} is unknown: blocks the engine holds were lost to the "
            "picker; predicting on top until resynchronised"
        )
        self._lost[worker] = _Loss(why, orphans=1)
        self._refresh(worker, "")
        resync = self._resync.get(worker)
        if resync is not None:
            resync(f"a stored block's parent {parent} is unknown")

    def _found(self, worker: Worker, reason: str, *, promote: bool = True) -> None:
        loss = self._lost.pop(worker, None)
        if loss is not None:
            log.info("worker %s: its cache view is whole again (%s; %d orphaned stores)", worker, reason,
                     loss.orphans)  # fmt: skip
        if promote or loss is not None:
            self._refresh(worker, reason)

    # --- cache source --------------------------------------------------------------------------

    def _refresh(self, worker: Worker, reason: str) -> None:
        router = self._router(worker)
        if router is None:
            return
        whole = worker in self._up and worker not in self._lost
        router.set_event_fed(worker, whole and worker in self._heard)
        loss = self._lost.get(worker)
        if loss is not None:  # the loss is the news; what the stream said comes after it
            reason = f"{loss.why}; stream: {reason}" if reason else loss.why
        if whole:
            self._set(worker, EVENT_FED, reason)
        elif worker in self._lost or self._state.get(worker) in (EVENT_FED, STALE):
            self._set(worker, STALE, reason)
        else:
            self._set(worker, PREDICTED, reason)

    def fed_elsewhere(self, worker: Worker, reason: str) -> None:
        """Another process consumes the worker's KV events and routing asks it (a KV indexer): the
        router predicts nothing for it, and the operator sees it event-fed, for `reason`."""
        router = self._router(worker)
        if router is not None:
            router.set_event_fed(worker, True)
        self._set(worker, EVENT_FED, reason)

    def synced(self, worker: Worker) -> bool:
        """Whether the worker has been event-fed with a whole view at some point (first sync done)."""
        return worker in self._synced

    def state(self, worker: Worker) -> str:
        return self._state.get(worker, PREDICTED)

    def reason(self, worker: Worker) -> str:
        """Why the worker's cache source is what it is (the last change's reason)."""
        return self._reason.get(worker, "no KV events yet")

    def states(self) -> dict[Worker, str]:
        """Every routed worker's cache source."""
        routers = {id(r): r for r in self.routers.values()}.values()
        return {w: self.state(w) for r in routers for w in r.workers()}

    def _set(self, worker: Worker, state: str, reason: str) -> None:
        old = self._state.get(worker, PREDICTED)
        self._state[worker] = state
        self._reason[worker] = reason
        if state == EVENT_FED:
            self._synced.add(worker)
        if old != state:
            level = logging.WARNING if state == STALE else logging.INFO
            log.log(level, "worker %s: cache state %s -> %s (%s)", worker, old, state, reason)
