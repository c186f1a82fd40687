"""SessionPins: sticky sessions. A session's requests go to the worker its first request used.

Pure: time comes in as `now` (seconds). A pin lives `ttl_s` after its last use (a sliding TTL),
is dropped by a close action, and is moved when its worker disappears or is busy (the caller
re-pins to the replacement). Bounded, because the ids come from clients:
- at most `max_pins` pins: a new session beyond it evicts the least recently used one (`evicted`);
- lapsed pins are dropped when looked up and by `expire(now)`, which the caller runs on a timer
  (oldest first, so a sweep costs the pins it drops), so memory never waits for a request;
- the ids' length is the caller's to bound (the picker refuses ids over --session-id-max-length).

A pin may also stand for a session opened on its worker (SGLang's streaming sessions, opened by a
request's `nvext.session_control.action: "open"`): `mark_opened` records the endpoint, and when such
a pin leaves other than by `close` (lapsed, evicted, moved, its worker gone) `on_drop(session_id,
endpoint)` is told, so that the caller can close the worker's session too (as Dynamo's affinity
reaper does). `close` tells nobody: the caller closes the worker's session once the request that
asked for it has finished.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from extproc.router.ttl_table import TtlTable
from extproc.router.types import Worker

PinEvent = Literal["pinned", "moved", "refreshed"]


@dataclass(slots=True)
class Pin:
    worker: Worker
    last_used_s: float
    requests: int = 0
    group: str = ""  # the router group that owns the worker (hierarchical routing)
    opened_on: str | None = None  # the endpoint whose worker holds an open session for it, if any
    shared_s: float = float("-inf")  # when it was last told to other replicas (replica sync)


class SessionPins:
    """session id -> pinned worker, with a sliding TTL and at most `max_pins` pins (LRU)."""

    def __init__(
        self,
        ttl_s: float,
        max_pins: int | None = None,
        on_drop: Callable[[str, str], None] | None = None,
    ) -> None:
        self.on_drop = on_drop  # (session id, endpoint): a pin with an open worker session left
        self._pins: TtlTable[Pin] = TtlTable(ttl_s, max_pins, on_drop=self._dropped)
        self.closed = 0
        self.moved = 0

    @property
    def ttl_s(self) -> float:
        return self._pins.ttl_s

    @property
    def expired(self) -> int:
        return self._pins.expired

    @property
    def evicted(self) -> int:
        return self._pins.evicted

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._pins

    def pins(self, now: float) -> Iterator[tuple[str, Pin]]:
        """Every session pinned (and not lapsed at `now`) with its pin, least recently used first: the
        table as it is now, read as the iterator is (the table may change meanwhile)."""
        return self._pins.live(now)

    def get(self, session_id: str, now: float) -> Worker | None:
        """The session's worker, or None when it has none or its pin lapsed."""
        pin = self.get_pin(session_id, now)
        return pin.worker if pin is not None else None

    def get_pin(self, session_id: str, now: float) -> Pin | None:
        """The session's pin (worker and group), or None when it has none or it lapsed."""
        return self._pins.get(session_id, now)

    def pin(self, session_id: str, worker: Worker, now: float, group: str = "") -> PinEvent:
        """Record a use of the session on `worker` of `group`: a new pin (which may evict the least
        recently used one), a move, or a refresh of its TTL."""
        pin = self._pins.peek(session_id)
        if pin is None:
            self._pins.put(session_id, Pin(worker, now, 1, group))
            return "pinned"
        event: PinEvent = "refreshed"
        if pin.worker != worker or pin.group != group:
            self.moved += 1
            self._dropped(session_id, pin)
            pin.opened_on = None
            pin.worker = worker
            pin.group = group
            event = "moved"
        pin.requests += 1
        self._pins.used(session_id, now)
        return event

    def share_due(self, session_id: str, now: float, every_s: float) -> bool:
        """Whether the pin is to be told to other replicas now (not told for `every_s`); if so, it
        counts as told. False for a session without a pin."""
        pin = self._pins.peek(session_id)
        if pin is None or now - pin.shared_s < every_s:
            return False
        pin.shared_s = now
        return True

    def mark_opened(self, session_id: str, endpoint: str) -> bool:
        """Record that the pinned worker, at `endpoint`, holds an open session for `session_id`."""
        pin = self._pins.peek(session_id)
        if pin is None:
            return False
        pin.opened_on = endpoint
        return True

    def close(self, session_id: str) -> bool:
        if self._pins.pop(session_id) is None:
            return False
        self.closed += 1
        return True

    def drop_worker(self, worker_id: object, group: str | None = None) -> int:
        """Forget every pin to a worker that left (of `group`, or of any group when None); its
        sessions are re-pinned on their next request."""
        return self._pins.drop_where(
            lambda p: p.worker.worker_id == worker_id and (group is None or p.group == group)
        )

    def expire(self, now: float) -> int:
        """Drop the pins unused for `ttl_s` (oldest first); returns how many."""
        return self._pins.expire(now)

    def _dropped(self, session_id: str, pin: Pin) -> None:
        if pin.opened_on is not None and self.on_drop is not None:
            self.on_drop(session_id, pin.opened_on)

    def by_worker(self) -> dict[Worker, int]:
        counts: dict[Worker, int] = {}
        for pin in self._pins.entries():
            counts[pin.worker] = counts.get(pin.worker, 0) + 1
        return counts
