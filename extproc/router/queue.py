"""AdmissionQueue: requests held back while every eligible worker is saturated, in policy order.

Pure: the caller passes the arrival time and decides when capacity frees (REFERENCE section 5).
Each entry gets a key when it is queued; the highest key leaves first, equal keys in arrival order:

    fcfs   (priority, latency_sensitivity - arrival)   earliest first, moved up by its jump
    lcfs   (priority, latency_sensitivity + arrival)   newest first (policy comparisons, not production)
    wspt   (priority, (1 + latency_sensitivity) / new prompt tokens)   Smith's rule: short jobs first

`priority` is a strict class (higher always first); `latency_sensitivity` is a jump in seconds
(never negative) and, for wspt, a weight. New prompt tokens are the prompt minus its best cached
prefix, at least 1. Both come from `nvext.agent_hints`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from extproc.router.config import QueuePolicy


@dataclass(slots=True)
class QueuedRequest:
    """One held request; `handle` is whatever the caller needs to resume it."""

    request_id: str
    arrival_s: float
    new_tokens: int = 1
    priority: int = 0
    latency_sensitivity: float = 0.0
    sheddable: bool = False
    handle: Any = None
    key: tuple[float, float] = field(default=(0.0, 0.0))


def queue_key(policy: QueuePolicy, entry: QueuedRequest) -> tuple[float, float]:
    """The entry's rank under `policy`: higher leaves the queue first."""
    jump = max(0.0, entry.latency_sensitivity)
    if policy is QueuePolicy.FCFS:
        score = jump - entry.arrival_s
    elif policy is QueuePolicy.LCFS:
        score = jump + entry.arrival_s
    else:
        score = (1.0 + jump) / max(1, entry.new_tokens)
    return (float(entry.priority), score)


class AdmissionQueue:
    """Held requests ordered by policy; removal by id (a client gave up) is O(log n) amortised."""

    def __init__(self, policy: QueuePolicy | str = QueuePolicy.FCFS) -> None:
        self.policy = QueuePolicy(policy)
        self._heap: list[tuple[float, float, int, str]] = []  # (-priority, -score, seq, request id)
        self._entries: dict[str, QueuedRequest] = {}
        self._seq = count()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def push(self, entry: QueuedRequest) -> None:
        if entry.request_id in self._entries:
            raise ValueError(f"request {entry.request_id!r} is already queued")
        entry.key = queue_key(self.policy, entry)
        self._entries[entry.request_id] = entry
        heapq.heappush(self._heap, (-entry.key[0], -entry.key[1], next(self._seq), entry.request_id))

    def remove(self, request_id: str) -> QueuedRequest | None:
        """Take a request out (released or gone); its heap slot is dropped lazily."""
        entry = self._entries.pop(request_id, None)
        if entry is not None and len(self._heap) > 2 * len(self._entries) + 16:
            self._compact()
        return entry

    def peek(self) -> QueuedRequest | None:
        """The request that leaves next, or None."""
        heap = self._heap
        while heap and heap[0][3] not in self._entries:
            heapq.heappop(heap)
        return self._entries[heap[0][3]] if heap else None

    def in_order(self) -> Iterator[QueuedRequest]:
        """Every held request, first to leave first (a snapshot: removing while iterating is fine)."""
        for *_, request_id in sorted(self._heap):
            entry = self._entries.get(request_id)
            if entry is not None:
                yield entry

    def oldest_arrival(self) -> float | None:
        return min((e.arrival_s for e in self._entries.values()), default=None)

    def _compact(self) -> None:
        self._heap = [item for item in self._heap if item[3] in self._entries]
        heapq.heapify(self._heap)
