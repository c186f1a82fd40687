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
from collections.abc import Hashable, Sequence
from heapq import heappop, heappush

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


class TimedLoadOrder:
    """The registered workers under the timing model: busy, in an idle class, or keyed by a lower bound.

    An idle class holds the workers whose predicted time to first token, for a prompt none of them
    matches, is the same computation with the same pass-time model: nothing decoding and no prompt
    work left as predicted (from then on, for good). A keyed worker carries a bound `key` such that
    its predicted time is at least `key * prompt_ms` (`prompt_ms`: the prompt alone on the
    configured model), whatever the clock does until its load changes, and, while its prompt
    stream runs, `streams[rank] = (end, ms_per_token)`: its time is also at least
    `end - now + ms_per_token * tokens`. `KvRouter._timed_choice` computes them and visits classes
    and keyed workers in key order; `due` returns the workers whose stream ended by `now`, so the
    router can move them to an idle class (a change the clock makes, not an event).

    Pure: no I/O, no clock. Ties of keys keep rank order.
    """

    __slots__ = (
        "_class_ids",
        "_class_of",
        "_next_id",
        "_state",
        "_version",
        "_wakes",
        "class_keys",
        "classes",
        "keyed",
        "rank",
        "streams",
        "workers",
    )

    def __init__(self, workers: Sequence[Worker]) -> None:
        """Every worker starts busy: the router classifies each."""
        self.workers = list(workers)
        self.rank = {w: i for i, w in enumerate(self.workers)}
        self.classes: dict[int, list[int]] = {}  # class id -> its ranks, ascending
        self.class_keys: list[tuple[float, int]] = []  # (key, class id) of the non-empty classes
        self.keyed: list[tuple[float, int]] = []
        self.streams: dict[int, tuple[float, float]] = {}
        self._class_ids: dict[Hashable, tuple[int, float]] = {}  # class -> (id, key)
        self._class_of: dict[int, Hashable] = {}  # class id -> class
        self._next_id = 0
        self._state: dict[int, tuple[int, float]] = {r: (_BUSY, 0.0) for r in range(len(self.workers))}
        self._version = [0] * len(self.workers)
        self._wakes: list[tuple[float, int, int]] = []  # (when, rank, version)

    def __len__(self) -> int:
        """Workers that may take a request."""
        return sum(len(c) for c in self.classes.values()) + len(self.keyed)

    def class_id(self, rank: int) -> int | None:
        kind, value = self._state[rank]
        return int(value) if kind == _CLASS else None

    def is_busy(self, rank: int) -> bool:
        return self._state[rank][0] == _BUSY

    def set_busy(self, rank: int) -> None:
        self._leave(rank)
        self._state[rank] = (_BUSY, 0.0)

    def set_class(self, rank: int, cls: Hashable, key: float) -> None:
        """`rank` joins the idle class `cls`, whose bound is `key` (the same for every member)."""
        found = self._class_ids.get(cls)
        if found is not None and self._state[rank] == (_CLASS, float(found[0])):
            return
        self._leave(rank)
        if found is None:
            found = self._class_ids[cls] = (self._next_id, key)
            self._class_of[self._next_id] = cls
            self._next_id += 1
        cid = found[0]
        members = self.classes.get(cid)
        if members is None:
            members = self.classes[cid] = []
            insort(self.class_keys, (found[1], cid))
        insort(members, rank)
        self._state[rank] = (_CLASS, float(cid))

    def set_key(
        self, rank: int, key: float, stream: tuple[float, float] | None, wake_ms: float | None
    ) -> None:
        """`rank` is loaded: bound `key`; `stream` while its prompt stream runs, ending by `wake_ms`."""
        self._leave(rank)
        self._state[rank] = (_KEYED, key)
        insort(self.keyed, (key, rank))
        if stream is not None:
            self.streams[rank] = stream
        if wake_ms is not None:
            heappush(self._wakes, (wake_ms, rank, self._version[rank]))

    def due(self, now_ms: float) -> list[int]:
        """Keyed ranks whose stream was to end by `now_ms` (each once, until set again)."""
        out = []
        wakes, version = self._wakes, self._version
        while wakes and wakes[0][0] <= now_ms:
            _, rank, v = heappop(wakes)
            if v == version[rank]:
                out.append(rank)
        return out

    def _leave(self, rank: int) -> None:
        self._version[rank] += 1
        kind, value = self._state[rank]
        if kind == _KEYED:
            del self.keyed[bisect_left(self.keyed, (value, rank))]
            self.streams.pop(rank, None)
        elif kind == _CLASS:
            cid = int(value)
            members = self.classes[cid]
            del members[bisect_left(members, rank)]
            if not members:
                del self.classes[cid]
                cls = self._class_of.pop(cid)
                key = self._class_ids.pop(cls)[1]
                del self.class_keys[bisect_left(self.class_keys, (key, cid))]

    @staticmethod
    def rank_at(
        index: int, lists: Sequence[Sequence[int]], excluded: Sequence[int], extra: Sequence[int]
    ) -> int:
        """The `index`-th smallest rank (from 0) of the union of `lists` (disjoint, each ascending)
        minus `excluded` (ranks in them), plus `extra` (ranks besides); all ascending, no repeats."""
        if len(lists) == 1:
            ranks = lists[0]
            lo, hi = 0, max(ranks[-1] if ranks else 0, extra[-1] if extra else 0)
            while lo < hi:
                mid = (lo + hi) // 2
                below = bisect_right(ranks, mid) - bisect_right(excluded, mid) + bisect_right(extra, mid)
                if below > index:
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        gone = set(excluded)
        merged = sorted([r for ranks in lists for r in ranks if r not in gone] + list(extra))
        return merged[index]


_BUSY, _CLASS, _KEYED = 0, 1, 2
