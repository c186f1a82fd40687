"""Trace replay in virtual time: N simulated engines, one router, a discrete-event loop. No I/O.

Owns the loop and the per-request record; the engines (`extproc.sim.engine`) own scheduling and
the router (behind `extproc.sim.replay_router.ReplayRouter`) owns decisions. Mirrors Dynamo
1.6.1's offline mocker replay (REFERENCE section 6), event by event:

- Each worker runs one pass at a time. When a pass ends its tokens are emitted: a request's first
  token tells the router its prefill is complete, its last one frees it.
- At one instant, in this order: passes end, due KV events reach the router, arrivals are routed
  and queued on their workers, then every idle worker with work starts its next pass. So requests
  arriving together share a pass, and one arriving while its worker is busy waits for the pass end.
- KV events are made while a pass is built (blocks allocated, evicted) and reach the router
  `kv_event_lag_ms` later (0: before anything else happens).

The router sees only its own decisions, lifecycle calls and KV events; engine internals stay here.
"""

from __future__ import annotations

import array
import heapq
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from extproc.router.config import RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import KvEvent, Worker, WorkerSpec
from extproc.sim.engine import Engine, EngineConfig, Pass, PassEntry, RequestTooLarge
from extproc.sim.replay_router import KvEventTap, KvRouterAdapter, ReplayRouter, RouteResult
from extproc.sim.trace import TraceRequest

_PASS_END, _KV_EVENT, _POLL = 0, 1, 2  # order of heap events at one instant (arrivals come last)


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One replay: the fleet, the router, and how events reach it."""

    num_workers: int
    router: RouterConfig = field(default_factory=RouterConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    kv_event_lag_ms: float = 0.0
    seed: int = 0
    load_window_ms: float = 10_000.0  # width of the windows of the per-worker load series
    queue_poll_ms: float = 50.0  # while requests wait in the router's queue, re-check this often
    worker_speeds: tuple[float, ...] = ()  # per worker index, its engine's speed (empty: all 1)

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.worker_speeds and len(self.worker_speeds) != self.num_workers:
            raise ValueError(
                f"worker_speeds names {len(self.worker_speeds)} workers, the fleet has {self.num_workers}"
            )
        if any(not speed > 0 for speed in self.worker_speeds):
            raise ValueError(f"worker_speeds must all be > 0, got {self.worker_speeds}")
        if self.kv_event_lag_ms < 0:
            raise ValueError(f"kv_event_lag_ms must be >= 0, got {self.kv_event_lag_ms}")
        if self.router.block_size != self.engine.block_size:
            raise ValueError(
                f"router block size {self.router.block_size} differs from the engines' "
                f"{self.engine.block_size}: no prefix would ever match"
            )


@dataclass(slots=True)
class RequestRecord:
    """What happened to one trace request. Times are virtual ms from the trace start."""

    index: int
    arrival_ms: float
    input_tokens: int
    output_tokens: int
    worker: int = -1
    routed_ms: float | None = None  # when the router decided (later than arrival if it queued)
    overlap_blocks: int = 0  # router's view at the decision, chosen worker
    best_overlap_blocks: int = 0  # router's view at the decision, best worker
    first_token_ms: float | None = None
    last_token_ms: float = 0.0
    end_ms: float | None = None
    cached_tokens: int = 0  # largest cached prefix over all admissions where its prompt was computed
    admissions: int = 0
    rejected: bool = False
    # disaggregated replays (`extproc.sim.replay_disagg`): `worker` is the decode worker
    prefill_worker: int = -1  # the prefill worker that computed the prompt; -1: prefilled on `worker`
    local_reason: str | None = None  # why it was prefilled on its decode worker (DisaggDecision)
    prefill_end_ms: float | None = None  # the prefill worker finished the prompt
    transfer_ms: float = 0.0  # simulated KV transfer from the prefill to the decode worker

    @property
    def remote_prefill(self) -> bool:
        return self.prefill_worker >= 0

    @property
    def queued_ms(self) -> float:
        return 0.0 if self.routed_ms is None else self.routed_ms - self.arrival_ms

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_ms is None else self.first_token_ms - self.arrival_ms

    @property
    def e2e_ms(self) -> float | None:
        return None if self.end_ms is None else self.end_ms - self.arrival_ms

    @property
    def tpot_ms(self) -> float | None:
        """Mean gap between tokens after the first (time per output token); None for one token."""
        if self.first_token_ms is None or self.end_ms is None or self.output_tokens < 2:
            return None
        return (self.end_ms - self.first_token_ms) / (self.output_tokens - 1)


@dataclass(slots=True)
class LoadSample:
    """One worker's load over one window of `load_window_ms` (passes counted where they start)."""

    time_ms: float  # window start
    worker: int
    busy_ms: float = 0.0  # time spent in passes
    prefill_tokens: int = 0  # prompt tokens computed (priced T)
    max_requests: int = 0  # most requests in its engine (running + waiting) at a pass start
    peak_active_blocks: int = 0


@dataclass(slots=True)
class ReplayResult:
    records: list[RequestRecord]
    load: list[LoadSample]
    num_workers: int
    wall_s: float
    passes: int
    preemptions: int
    kv_events: int
    token_gaps_ms: array.array = field(default_factory=lambda: array.array("d"))  # every inter-token gap
    disaggregated: bool = False  # the last `num_prefill_workers` of the `num_workers` engines prefill
    num_prefill_workers: int = 0
    transfers_not_landed: int = 0  # KV transfers the decode pool could not take (prompt recomputed)


class VirtualClock:
    """The replay's time. The router gets `seconds`, which reaches nothing else of the replay."""

    __slots__ = ("now_ms",)

    def __init__(self) -> None:
        self.now_ms = 0.0

    def seconds(self) -> float:
        return self.now_ms / 1000.0


class _Worker:
    __slots__ = ("busy", "engine", "index", "load", "tap")

    def __init__(self, index: int, engine: Engine, tap: KvEventTap) -> None:
        self.index = index
        self.engine = engine
        self.tap = tap
        self.busy: Pass | None = None
        self.load: LoadSample | None = None


RouterFactory = Callable[
    [RouterConfig, Sequence[WorkerSpec], Callable[[], float], random.Random], ReplayRouter
]


def kv_router_factory(
    config: RouterConfig, workers: Sequence[WorkerSpec], clock_s: Callable[[], float], rng: random.Random
) -> ReplayRouter:
    return KvRouterAdapter(config, workers, clock_s=clock_s, rng=rng)


class Replayer:
    """Replays `requests` (sorted by arrival) through `config.num_workers` engines and one router."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        config: ReplayConfig,
        *,
        router_factory: RouterFactory = kv_router_factory,
        progress: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.requests = requests
        self.config = config
        self.progress = progress
        self.clock = VirtualClock()
        ecfg = config.engine
        specs = [
            WorkerSpec(
                i, total_blocks=ecfg.num_gpu_blocks, max_num_batched_tokens=ecfg.max_num_batched_tokens
            )
            for i in range(config.num_workers)
        ]
        # The router gets a config, a clock, an rng and the worker specs: nothing of the engines
        # (tests/sim/test_replay_interface.py walks its references to make sure).
        self.router = router_factory(config.router, specs, self.clock.seconds, random.Random(config.seed))
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._workers = [self._make_worker(i) for i in range(config.num_workers)]
        self._records: dict[str, RequestRecord] = {}
        self._load: list[LoadSample] = []
        self._passes = 0
        self._kv_events = 0
        self._token_gaps = array.array("d")
        self._pending: dict[str, tuple[TraceRequest, list[int], list[int]]] = {}  # queued in the router
        self._poll_at: float | None = None

    @property
    def engines(self) -> list[Engine]:
        """The simulated engines, by worker index (for analysis and tests; the router never sees them)."""
        return [w.engine for w in self._workers]

    @property
    def now_ms(self) -> float:
        return self.clock.now_ms

    def engine_config(self, index: int) -> EngineConfig:
        """Worker `index`'s engine: the fleet's shape at its own speed."""
        speeds = self.config.worker_speeds
        engine = self.config.engine
        return replace(engine, speed=speeds[index]) if index < len(speeds) else engine

    def _make_worker(self, index: int) -> _Worker:
        tap = KvEventTap(Worker(index), self.config.engine.block_size, self._emit)
        return _Worker(index, Engine(self.engine_config(index), tap), tap)

    def _push(self, at_ms: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_ms, kind, self._seq, payload))

    def _emit(self, event: KvEvent) -> None:
        self._kv_events += 1
        lag = self.config.kv_event_lag_ms
        if lag == 0:
            self.router.on_kv_event(event)
        else:
            self._push(self.now_ms + lag, _KV_EVENT, event)

    def run(self) -> ReplayResult:
        started = time.perf_counter()
        requests = self.requests
        n = len(requests)
        heap = self._heap
        i = 0
        done = 0
        steps = 0
        while i < n or heap:
            t = heap[0][0] if heap else float("inf")
            if i < n and requests[i].arrival_ms < t:
                t = requests[i].arrival_ms
            self.clock.now_ms = t
            touched: set[_Worker] = set()
            while heap and heap[0][0] == t:
                _, kind, _, payload = heapq.heappop(heap)
                if kind == _PASS_END:
                    assert isinstance(payload, _Worker)
                    done += self._finish_pass(payload)
                    touched.add(payload)
                elif kind == _KV_EVENT:
                    assert isinstance(payload, KvEvent)  # only _emit pushes a _KV_EVENT
                    self.router.on_kv_event(payload)
                elif kind == _POLL:
                    self._poll_at = None
                else:
                    done += self._on_event(kind, payload, touched)
            for result in self.router.released() if self.router.waiting else ():
                done += self._place(result, touched)
            while i < n and requests[i].arrival_ms == t:
                done += self._arrive(requests[i], touched)
                i += 1
            for w in sorted(touched, key=lambda w: w.index):
                if w.busy is None:
                    self._start_pass(w)
            if self.router.waiting and self._poll_at is None:
                self._poll_at = t + self.config.queue_poll_ms
                self._push(self._poll_at, _POLL, None)
            steps += 1
            if self.progress is not None and not steps & 1023:
                self.progress(done, n, t)
        if self.progress is not None:
            self.progress(done, n, self.now_ms)
        records = sorted(self._records.values(), key=lambda r: r.index)
        return ReplayResult(
            records,
            self._load,
            len(self._workers),
            time.perf_counter() - started,
            self._passes,
            sum(w.engine.num_preemptions for w in self._workers),
            self._kv_events,
            self._token_gaps,
        )

    def _on_event(self, kind: int, payload: object, touched: set[_Worker]) -> int:
        """A heap event of a kind a subclass added; returns the requests it finished."""
        raise ValueError(f"unknown replay event kind {kind}")

    def _arrive(self, req: TraceRequest, touched: set[_Worker]) -> int:
        """Route (or queue) a new request; returns 1 if it is already over (rejected)."""
        rid = f"r{req.index}"
        tokens = req.token_ids()
        self._records[rid] = RequestRecord(req.index, req.arrival_ms, req.input_tokens, req.output_tokens)
        local = compute_block_hashes(tokens, self.config.engine.block_size)
        self._pending[rid] = (req, tokens, local)
        result = self.router.route(rid, local, len(tokens), req.output_tokens)
        return 0 if result is None else self._place(result, touched)

    def _place(self, result: RouteResult, touched: set[_Worker]) -> int:
        """Hand a routed request to its worker's engine; returns 1 if the engine refused it."""
        req, tokens, local = self._pending.pop(result.request_id)
        record = self._records[result.request_id]
        record.worker = int(result.worker.worker_id)
        record.routed_ms = self.now_ms
        record.overlap_blocks = result.overlap_blocks
        record.best_overlap_blocks = result.best_overlap_blocks
        worker = self._workers[record.worker]
        try:
            worker.engine.add_request(
                result.request_id, tokens, req.output_tokens, self.now_ms, local_block_hashes=local
            )
        except RequestTooLarge:
            record.rejected = True
            self.router.on_end(result.request_id)
            return 1
        touched.add(worker)
        return 0

    def _start_pass(self, w: _Worker) -> None:
        p = w.engine.next_pass(self.now_ms)
        if p is None:
            return
        w.busy = p
        self._passes += 1
        for entry in p.entries:
            if entry.cached_tokens is not None:
                self._admitted(w, entry)
        window = self.config.load_window_ms
        start = self.now_ms // window * window
        sample = w.load
        if sample is None or sample.time_ms != start:
            sample = w.load = LoadSample(start, w.index)
            self._load.append(sample)
        e = w.engine
        sample.busy_ms += p.duration_ms
        sample.prefill_tokens += p.prefill_tokens
        sample.max_requests = max(sample.max_requests, e.num_running + e.num_waiting)
        sample.peak_active_blocks = max(sample.peak_active_blocks, e.cache.num_active_blocks)
        self._push(p.end_ms, _PASS_END, w)

    def _admitted(self, w: _Worker, entry: PassEntry) -> None:
        """A request was admitted by `w` in the pass starting now (first time or after a preemption)."""
        record = self._records[entry.request_id]
        record.admissions += 1
        if entry.cached_tokens is not None and entry.cached_tokens > record.cached_tokens:
            record.cached_tokens = entry.cached_tokens

    def _finish_pass(self, w: _Worker) -> int:
        p = w.busy
        assert p is not None
        w.busy = None
        finished = 0
        records = self._records
        router = self.router
        gaps = self._token_gaps
        for entry in w.engine.finish_pass(p):
            if not entry.emits_token:
                continue
            record = records[entry.request_id]
            if record.first_token_ms is None:
                record.first_token_ms = self.now_ms
                router.on_first_token(entry.request_id)
            else:
                gaps.append(self.now_ms - record.last_token_ms)
            record.last_token_ms = self.now_ms
            if entry.finished:
                record.end_ms = self.now_ms
                router.on_end(entry.request_id)
                finished += 1
        return finished
