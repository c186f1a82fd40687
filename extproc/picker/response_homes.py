"""ResponseHomes: the worker that stored each Responses API answer, so that what names it goes there.

vLLM (with `VLLM_ENABLE_RESPONSES_API_STORE=1`) keeps a stored response in the memory of the server
that produced it, and so does SGLang: a follow-up naming it (`previous_response_id`), its retrieval
(`GET /v1/responses/{id}`), its input items and its cancellation answer 404 on any other worker. The
picker learns each answer's id as it passes (`extproc.epp.service`) and remembers where it was made.

Pure: time comes in as `now` (seconds). Bounded, as the ids come from the engines' answers and
from clients (vLLM's `request_id` body field names the answer): at most `max_homes` ids, the least
recently used evicted first; an id lapses `ttl_s` after its last use; ids over `MAX_ID_CHARS`
characters are not kept. A worker that leaves takes its homes with it (`drop_worker`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.router.types import Worker

if TYPE_CHECKING:
    from extproc.picker.home_waits import HomeWaits

MAX_ID_CHARS: Final = 256
DEFAULT_TTL_S: Final = 3600.0  # a chain of responses (tool calls, turns) within an hour of its last use
DEFAULT_MAX_HOMES: Final = 100_000  # about 30 MB at most


@dataclass(slots=True)
class Home:
    model: str
    worker: Worker
    endpoint: str  # where Envoy sends what names the response (ip:port)
    group: str  # the router group that owns the worker
    last_used_s: float


class ResponseHomes:
    """response id -> the worker that stored it, with a sliding TTL and at most `max_homes` ids (LRU)."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_homes: int = DEFAULT_MAX_HOMES) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, not {ttl_s!r}")
        if max_homes < 1:
            raise ValueError(f"max_homes must be at least 1, not {max_homes!r}")
        self.ttl_s = ttl_s
        self.max_homes = max_homes
        self._homes: OrderedDict[str, Home] = OrderedDict()  # least recently used first
        self.evicted = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._homes)

    def remember(
        self, response_id: str, model: str, worker: Worker, endpoint: str, group: str, now: float
    ) -> bool:
        """Record that `worker` stored `response_id`; False (nothing kept) for an unusable id."""
        if not response_id or len(response_id) > MAX_ID_CHARS:
            return False
        self.expire(now)
        home = self._homes.pop(response_id, None)
        if home is None and len(self._homes) >= self.max_homes:
            self._homes.popitem(last=False)
            self.evicted += 1
        self._homes[response_id] = Home(model, worker, endpoint, group, now)
        return True

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._homes

    def homes(self, now: float) -> Iterator[tuple[str, Home]]:
        """Every id kept (and not lapsed at `now`) with its home, least recently used first: the
        table as it is now, read as the iterator is (the table may change meanwhile)."""
        self.expire(now)
        homes, ids = self._homes, list(self._homes)
        return (
            (rid, h) for rid in ids if (h := homes.get(rid)) is not None and now - h.last_used_s < self.ttl_s
        )

    def get(self, response_id: str, now: float) -> Home | None:
        """Where `response_id` is stored (its TTL restarts), or None: unknown, lapsed or evicted."""
        self.expire(now)
        home = self._homes.get(response_id)
        if home is not None and now - home.last_used_s >= self.ttl_s:
            # remembered at a time before ids after it (handed over by another replica, its last
            # use there): lapsed, though the sweep in order has not reached it
            del self._homes[response_id]
            self.expired += 1
            return None
        if home is not None:
            home.last_used_s = now
            self._homes.move_to_end(response_id)
        return home

    def drop_worker(self, model: str, worker_id: object, group: str | None = None) -> int:
        """Forget the responses stored by a worker that left (its store went with it)."""
        gone = [
            rid
            for rid, h in self._homes.items()
            if h.model == model and h.worker.worker_id == worker_id and (group is None or h.group == group)
        ]
        for rid in gone:
            del self._homes[rid]
        return len(gone)

    def expire(self, now: float) -> int:
        """Drop the ids unused for `ttl_s` (oldest first); returns how many."""
        homes = self._homes
        dropped = 0
        while homes:
            rid, home = next(iter(homes.items()))
            if now - home.last_used_s < self.ttl_s:
                break
            del homes[rid]
            dropped += 1
        self.expired += dropped
        return dropped


class ResponseHomesCollector(Collector):
    """`extproc_response_homes` (ids remembered), `extproc_response_homes_dropped_total{why}` and, with
    `waits`, `extproc_response_home_waits_total{outcome}`."""

    def __init__(self, homes: ResponseHomes, waits: HomeWaits | None = None) -> None:
        self._homes = homes
        self._waits = waits

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "extproc_response_homes",
            "Responses API answers whose worker the picker remembers (what names them goes there).",
            value=len(self._homes),
        )
        dropped = CounterMetricFamily(
            "extproc_response_homes_dropped",
            "Remembered Responses API answers forgotten: evicted (the bound) or expired (unused an hour).",
            labels=["why"],
        )
        dropped.add_metric(["evicted"], self._homes.evicted)
        dropped.add_metric(["expired"], self._homes.expired)
        yield dropped
        if self._waits is not None:
            waits = CounterMetricFamily(
                "extproc_response_home_waits",
                "Requests naming a stored answer whose worker was not known, waited for while other "
                "replicas share routes: it arrived, the wait ran out, or too many waited already.",
                labels=["outcome"],
            )
            waits.add_metric(["arrived"], self._waits.arrived)
            waits.add_metric(["timed_out"], self._waits.timed_out)
            waits.add_metric(["refused"], self._waits.refused)
            yield waits
