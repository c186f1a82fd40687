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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.router.ttl_table import TtlTable
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
        self._homes: TtlTable[Home] = TtlTable(ttl_s, max_homes)

    @property
    def ttl_s(self) -> float:
        return self._homes.ttl_s

    @property
    def evicted(self) -> int:
        return self._homes.evicted

    @property
    def expired(self) -> int:
        return self._homes.expired

    def __len__(self) -> int:
        return len(self._homes)

    def remember(
        self, response_id: str, model: str, worker: Worker, endpoint: str, group: str, now: float
    ) -> bool:
        """Record that `worker` stored `response_id`; False (nothing kept) for an unusable id."""
        if not response_id or len(response_id) > MAX_ID_CHARS:
            return False
        self._homes.expire(now)
        self._homes.put(response_id, Home(model, worker, endpoint, group, now))
        return True

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._homes

    def homes(self, now: float) -> Iterator[tuple[str, Home]]:
        """Every id kept (and not lapsed at `now`) with its home, least recently used first: the
        table as it is now, read as the iterator is (the table may change meanwhile)."""
        return self._homes.live(now)

    def get(self, response_id: str, now: float) -> Home | None:
        """Where `response_id` is stored (its TTL restarts), or None: unknown, lapsed or evicted."""
        home = self._homes.get(response_id, now)
        if home is not None:
            self._homes.used(response_id, now)
        return home

    def drop_worker(self, model: str, worker_id: object, group: str | None = None) -> int:
        """Forget the responses stored by a worker that left (its store went with it)."""
        return self._homes.drop_where(
            lambda h: (
                h.model == model and h.worker.worker_id == worker_id and (group is None or h.group == group)
            )
        )

    def expire(self, now: float) -> int:
        """Drop the ids unused for `ttl_s` (oldest first); returns how many."""
        return self._homes.expire(now)


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
