"""What happens to Dynamo's KV events once a transport has received them, whichever it is.

Dynamo numbers each publisher's events consecutively per worker and dp rank. `DynamoEventIntake`
checks every decoded event against that numbering and hands it to the picker's `EventSink`:
- an id that goes back is a restarted publisher, whose engine starts with an empty cache (the
  worker is reset); an id that jumps ahead is events lost (an outage, a slow consumer): the blocks
  known stay, since they are still the best knowledge, and a store lost in the gap shows when the
  engine stores under it (the feed then marks the worker lost and relearns it) (`follow_gap`);
- a worker whose events come from a new publisher id (Dynamo's event plane names the publisher in
  each envelope) restarted, whatever ids are heard first: a subscriber that joins late (a ZMQ
  subscription takes a moment to reach a new publisher) may miss the new publisher's first events,
  and its next ids can then look in order or ahead. The worker is reset, or, when `restarted`
  claims it (the local-indexer recovery), rebuilt from its new source;
- a `gate` may take an event first (the workers rebuilt from their local indexers keep their own
  order: `dynamo_recovery.LocalIndexerRecovery.take`).

The transports: NATS core (`nats_events.NatsEventSubscriber`: Dynamo JSON and the NATS event plane)
and Dynamo's ZMQ event plane (`dynamo_zmq_plane.DynamoZmqPlaneSubscriber`). Counter keys are
`<source>.event` (applied), `<source>.gap`, `<source>.new_publisher`, `<source>.sink_error`, with
the transport's `source`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from extproc.events.counters import EventCounters
from extproc.events.dynamo_plane import read_envelope
from extproc.events.sink import EventSink
from extproc.router.types import KvEvent, Worker, WorkerId

log = logging.getLogger("extproc.events.dynamo")

GapHook = Callable[[Worker, int, int], None]  # (worker, expected event id, received event id)
Gate = Callable[[Worker, int, KvEvent | None], bool]  # True: it took the event


def follow_gap(
    sink: EventSink,
    counters: EventCounters,
    worker: Worker,
    expected: int,
    got: int,
    where: str,
    source: str = "nats",
) -> None:
    """The default answer to an event-id gap of `worker` on `where` (a subject, a stream, a socket).

    An id lower than expected: the publisher restarted (Dynamo's count from 1 again), and with it
    its engine, whose cache is empty: forget the worker's blocks. A higher id: `got - expected`
    events were lost (counted as dropped under `source`); the known blocks are kept: resetting would
    throw away blocks the engine still holds (its chat templates' first blocks are stored once and
    then reused for hours) and leave every later store of the worker under unknown parents.
    """
    if got < expected:
        sink.reset_worker(worker, f"its publisher restarted on {where} (event {got} after {expected - 1})")
        return
    counters.dropped(source, str(worker), "event-id-gap", got - expected)


class EventIdTracker:
    """The next expected event id per worker and dp rank (Dynamo numbers events per publisher)."""

    def __init__(self) -> None:
        self._next: dict[Worker, int] = {}

    def check(self, worker: Worker, event_id: int) -> int | None:
        """Record `event_id`; returns the id that was expected instead, or None if in order.

        The first id seen from a worker is always in order (nothing earlier is known).
        """
        expected = self._next.get(worker)
        self._next[worker] = event_id + 1
        return None if expected is None or expected == event_id else expected

    def knows(self, worker: Worker) -> bool:
        return worker in self._next

    def workers(self) -> list[Worker]:
        return list(self._next)

    def forget(self, worker: Worker) -> None:
        self._next.pop(worker, None)

    def clear(self) -> None:
        self._next.clear()


class DynamoEventIntake:
    """Applies decoded Dynamo KV events to an `EventSink` in event-id order; a transport feeds it.

    `on_gap(worker, expected, got)` is called before an event whose id is not the next one
    (default `follow_gap`); `worker_id_of` maps the wire's worker id (a Dynamo instance id) to the
    picker's. `source` names the transport in counter keys.
    """

    source = "nats"

    def __init__(
        self,
        sink: EventSink,
        counters: EventCounters,
        *,
        on_gap: GapHook | None = None,
        worker_id_of: Callable[[int], WorkerId] = str,
    ) -> None:
        self.sink = sink
        self.counters = counters
        self.on_gap: GapHook = on_gap or self._follow_gap
        self._worker_id_of = worker_id_of
        self.event_ids = EventIdTracker()
        # Offered each event first; True: it took the event, whose order it keeps itself (the workers
        # rebuilt from their local indexers: dynamo_recovery.LocalIndexerRecovery.take)
        self.gate: Gate | None = None
        # Told first of a worker's new publisher; True: it rebuilds the worker itself (the recovery)
        self.restarted: Callable[[Worker], bool] | None = None
        self._publishers: dict[Worker, int] = {}  # each worker's publisher id, as last heard
        self._gap_where = ""  # where the event being checked came from, for the default gap reason

    @property
    def gaps(self) -> int:
        return self.counters[f"{self.source}.gap"]

    def handle_event_plane(self, data: bytes, where: str) -> None:
        """Decode and apply one event-plane envelope, each of its events in order; never raises."""
        publisher, events = read_envelope(data, self.counters, worker_id_of=self._worker_id_of)
        for item in events:
            if publisher is not None:
                self._heard_from(item.worker, publisher, where)
            self._apply(item.worker, item.event_id, item.event, where)

    def _heard_from(self, worker: Worker, publisher: int, where: str) -> None:
        """Note `worker`'s publisher; a new one is a restart (its engine's cache starts empty)."""
        last = self._publishers.get(worker)
        if last == publisher:
            return
        self._publishers[worker] = publisher
        if last is None:
            return
        self.counters.add(f"{self.source}.new_publisher")
        log.info("%s: a new publisher (%x, was %x) on %s: it restarted", worker, publisher, last, where)
        try:
            if self.restarted is not None and self.restarted(worker):
                return
            self.event_ids.forget(worker)  # its ids start again
            self.sink.reset_worker(worker, f"its publisher restarted on {where} (a new publisher id)")
        except Exception:
            self.counters.loud(f"{self.source}.sink_error", "resetting %s after its restart failed", worker)
            log.exception("event sink failed")

    def _follow_gap(self, worker: Worker, expected: int, got: int) -> None:
        follow_gap(self.sink, self.counters, worker, expected, got, self._gap_where, self.source)

    def _apply(self, worker: Worker, event_id: int, event: KvEvent | None, where: str) -> None:
        """Check `event_id` for a gap, then apply `event` (None: the id only, nothing to apply)."""
        if self.gate is not None and self.gate(worker, event_id, event):
            self.event_ids.check(worker, event_id)  # heard (link-state reports); the gate keeps the order
            return
        first = not self.event_ids.knows(worker)
        expected = self.event_ids.check(worker, event_id)
        source = self.source
        try:
            if first:
                self.sink.stream_state(worker, True, f"first event on {where}")
            if expected is not None:
                self.counters.loud(
                    f"{source}.gap",
                    "KV event gap from %s: expected event %d, got %d",
                    worker,
                    expected,
                    event_id,
                )
                self._gap_where = where
                self.on_gap(worker, expected, event_id)
            if event is not None:
                self.sink.apply_events((event,))
                self.counters.add(f"{source}.event")
        except Exception:
            self.counters.loud(
                f"{source}.sink_error", "applying KV event %d from %s failed", event_id, worker
            )
            log.exception("event sink failed")

    def report_state(self, up: bool, reason: str) -> None:
        """Tell the sink that every worker heard so far is (no longer) reachable."""
        for worker in self.event_ids.workers():
            self.sink.stream_state(worker, up, reason)
