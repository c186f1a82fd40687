"""EventSink: where every KV event transport delivers what it decoded.

Transports (ZMQ subscriber, NATS subscriber, JetStream consumer, snapshot loader) call these
methods from the event loop thread; the sink applies them to the router. Workers are named as
the router names them: `Worker(worker_id, dp_rank)` with the worker id from the picker's config.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from extproc.router.types import KvEvent, Worker


class EventSink(Protocol):
    def apply_events(self, events: Iterable[KvEvent]) -> None:
        """Apply decoded events in order (stores are idempotent, unknown removals are counted)."""
        ...

    def reset_worker(self, worker: Worker, reason: str) -> None:
        """Forget what the router knows of `worker`'s cache: a full replay or a new stream follows
        (publisher restarted, gap that replay could not fill, engine cleared)."""
        ...

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        """The worker's event stream became usable (`up`) or was lost; while down the router
        predicts that worker's cache from its own decisions."""
        ...
