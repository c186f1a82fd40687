"""AdmissionQueue: requests held back while every eligible worker is saturated, in policy order.

Pure: the caller passes the arrival time and decides when capacity frees (REFERENCE section 5).
Each entry gets a key when it is queued; the highest key leaves first, equal keys in arrival order:

    fcfs   (priority, latency_sensitivity - arrival)   earliest first, moved up by its jump
    lcfs   (priority, latency_sensitivity + arrival)   newest first (policy comparisons, not production)
    wspt   (priority, (1 + latency_sensitivity) / new prompt tokens)   Smith's rule: short jobs first

`priority` is a strict class (higher always first); `latency_sensitivity` is a jump in seconds
(never negative) and, for wspt, a weight. New prompt tokens are the prompt minus its best cached
prefix, at least 1. Both come from `nvext.agent_hints`.

Fairness between flows (a flow: the requests of one `flow` id, a tenant's, within one priority), as
the Inference Extension's flow control names its policies:

    global-strict   every request of a priority in policy order, whatever its flow (the default)
    round-robin     the flows of a priority take turns: the flow served longest ago first, then
                    the next; within a flow, policy order. One tenant's burst waits behind
                    another's single request instead of in front of it.

A flow is remembered only while it has requests waiting, so nothing grows with the ids clients
send beyond the requests held.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from extproc.router.config import QueueFairness, QueuePolicy


@dataclass(slots=True)
class QueuedRequest:
    """One held request; `handle` is whatever the caller needs to resume it."""

    request_id: str
    arrival_s: float
    new_tokens: int = 1
    priority: int = 0
    latency_sensitivity: float = 0.0
    sheddable: bool = False
    flow: str = ""  # its fairness id (round-robin fairness)
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

    def __init__(
        self,
        policy: QueuePolicy | str = QueuePolicy.FCFS,
        fairness: QueueFairness | str = QueueFairness.GLOBAL_STRICT,
    ) -> None:
        self.policy = QueuePolicy(policy)
        self.fairness = QueueFairness(fairness)
        self._heap: list[tuple[float, float, int, str]] = []  # (-priority, -score, seq, request id)
        self._entries: dict[str, QueuedRequest] = {}
        self._seq = count()
        # round-robin: per (priority, flow) with requests waiting, how many; and when it was last
        # served (a count of releases; -1: not yet, and among those the one whose first request
        # comes first in policy order goes first)
        self._waiting: dict[tuple[int, str], int] = {}
        self._served: dict[tuple[int, str], int] = {}
        self._releases = count()

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
        if self.fairness is QueueFairness.ROUND_ROBIN:
            flow = (entry.priority, entry.flow)
            self._waiting[flow] = self._waiting.get(flow, 0) + 1
            self._served.setdefault(flow, -1)

    def remove(self, request_id: str, *, released: bool = False) -> QueuedRequest | None:
        """Take a request out: `released` (its turn came: its flow was served) or gone. Its heap
        slot is dropped lazily."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return None
        if self.fairness is QueueFairness.ROUND_ROBIN:
            flow = (entry.priority, entry.flow)
            if self._waiting[flow] == 1:  # its last: the flow is forgotten
                del self._waiting[flow], self._served[flow]
            else:
                self._waiting[flow] -= 1
                if released:
                    self._served[flow] = next(self._releases)
        if len(self._heap) > 2 * len(self._entries) + 16:
            self._compact()
        return entry

    def peek(self) -> QueuedRequest | None:
        """The request that leaves next, or None."""
        if self.fairness is QueueFairness.ROUND_ROBIN:
            return next(self.in_order(), None)
        heap = self._heap
        while heap and heap[0][3] not in self._entries:
            heapq.heappop(heap)
        return self._entries[heap[0][3]] if heap else None

    def in_order(self) -> Iterator[QueuedRequest]:
        """Every held request, first to leave first (a snapshot: removing while iterating is fine)."""
        ordered = [e for *_, rid in sorted(self._heap) if (e := self._entries.get(rid)) is not None]
        if self.fairness is QueueFairness.ROUND_ROBIN:
            ordered = self._taking_turns(ordered)
        for entry in ordered:
            if entry.request_id in self._entries:
                yield entry

    def _taking_turns(self, ordered: list[QueuedRequest]) -> list[QueuedRequest]:
        """`ordered` (policy order) with the flows of each priority taking turns: their first
        requests, the flow served longest ago first, then their second ones, and so on."""
        result: list[QueuedRequest] = []
        start = 0
        while start < len(ordered):  # one priority at a time, highest first
            priority = ordered[start].priority
            end = start
            flows: dict[str, list[QueuedRequest]] = {}
            while end < len(ordered) and ordered[end].priority == priority:
                flows.setdefault(ordered[end].flow, []).append(ordered[end])
                end += 1
            served = self._served
            turns = sorted(flows.values(), key=lambda queue: served[priority, queue[0].flow])
            for rank in range(max(len(queue) for queue in turns)):
                result.extend(queue[rank] for queue in turns if rank < len(queue))
            start = end
        return result

    def oldest_arrival(self) -> float | None:
        return min((e.arrival_s for e in self._entries.values()), default=None)

    def _compact(self) -> None:
        self._heap = [item for item in self._heap if item[3] in self._entries]
        heapq.heapify(self._heap)
