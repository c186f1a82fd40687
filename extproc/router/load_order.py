"""LoadOrder: the registered workers ordered by their load alone, so a decision need not visit them all.

Owned here: one state per registered worker, by its rank (its position in the router's worker
order): busy (left out of every decision), idle (no request in flight: all idle workers cost the
same for a prompt none of them matches) or loaded, with a key that orders the workers by what a
prompt they do not match would cost there. The router (`KvRouter`) computes states and keys and
tells this structure whenever a worker's load changes; this module knows nothing of costs.

Under Dynamo's cost (prefill load model `none`), a worker with no cached and no in-flight block of
the prompt costs `weight * (P + isl) / block_size + D + new_blocks`, where only P (its active prefill
tokens) and D (its active decode blocks) are its own: the key is `weight * P / block_size + D`, and
the cost is the key plus a term the same for every such worker. A decision then evaluates the
workers that match the prompt, one idle worker, and the loaded workers in key order until the key
exceeds the best cost found (`KvRouter._fast_choice`), instead of every worker.

Pure: no I/O, no clock. Ranks are ints; ties of keys keep rank order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence

from extproc.router.types import Worker


class LoadOrder:
    """Busy, idle or keyed, per worker rank; idle ranks sorted, keyed (key, rank) pairs sorted."""

    __slots__ = ("_idle", "_keyed", "_state", "rank", "workers")

    def __init__(self, workers: Sequence[Worker]) -> None:
        """Every worker starts idle."""
        self.workers = list(workers)
        self.rank = {w: i for i, w in enumerate(self.workers)}
        self._idle: list[int] = list(range(len(self.workers)))
        self._keyed: list[tuple[float, int]] = []
        self._state: dict[int, float | None] = {}  # absent: idle; None: busy; else the key

    def __len__(self) -> int:
        """Workers that may take a request (idle or keyed)."""
        return len(self._idle) + len(self._keyed)

    @property
    def idle(self) -> list[int]:
        """Ranks of the idle workers, ascending (read only)."""
        return self._idle

    @property
    def keyed(self) -> list[tuple[float, int]]:
        """(key, rank) of the loaded workers, ascending (read only)."""
        return self._keyed

    def is_idle(self, rank: int) -> bool:
        return rank not in self._state

    def is_busy(self, rank: int) -> bool:
        return rank in self._state and self._state[rank] is None

    def set_idle(self, rank: int) -> None:
        if rank in self._state:
            self._leave(rank)
            insort(self._idle, rank)

    def set_busy(self, rank: int) -> None:
        if not self.is_busy(rank):
            self._leave(rank)
            self._state[rank] = None

    def set_key(self, rank: int, key: float) -> None:
        if rank in self._state and self._state[rank] == key:
            return
        self._leave(rank)
        self._state[rank] = key
        insort(self._keyed, (key, rank))

    def _leave(self, rank: int) -> None:
        if rank not in self._state:
            del self._idle[bisect_left(self._idle, rank)]
            return
        state = self._state.pop(rank)
        if state is not None:
            del self._keyed[bisect_left(self._keyed, (state, rank))]

    def idle_rank_at(self, index: int, excluded: Sequence[int], extra: Sequence[int]) -> int:
        """The `index`-th smallest rank (from 0) of (idle ranks - `excluded`) + `extra`.

        `excluded` must be idle ranks, `extra` ranks counted besides (excluded ones among them),
        both sorted ascending and without repeats; `index` must be below the size of the result.
        Binary search on the rank: O(log(workers)^2), whatever the number of idle workers.
        """
        idle = self._idle
        lo, hi = 0, len(self.workers) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            below = bisect_right(idle, mid) - bisect_right(excluded, mid) + bisect_right(extra, mid)
            if below > index:
                hi = mid
            else:
                lo = mid + 1
        return lo
