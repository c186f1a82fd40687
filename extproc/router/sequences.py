"""ActiveSequences: the write model of each worker's in-flight load. No I/O, no clock.

Per worker it owns two numbers the cost function reads:
- active prefill tokens: uncached prompt tokens of requests whose prefill has not completed;
- active decode blocks: KV blocks held by in-flight requests. With KV reuse assumed (the
  default) a block shared by several requests counts once (blocks are named by their sequence
  hash); otherwise every request's blocks count separately. A partial last block is always the
  request's own.
With output-block tracking on, generated tokens add placeholder blocks, weighted by
`1 - progress` toward the expected output length when one is given (a request near its end will
soon release its blocks).

The prefill load model decides what "active prefill tokens" means. `none`: a request's uncached
tokens count in full until its first token. `timing` (`extproc.router.prefill_model`): each
worker keeps a timeline of predicted prefill durations that decays as the clock moves and is
re-anchored by every first token; `potential_load` then predicts a request's time to first token
on each worker (the work ahead of it plus its own chunked prefill) and reports it as prefill-token
equivalents of time, so the unchanged cost function compares time. Each worker's pass-time model
starts as the configured one and is scaled by what its first tokens show against the predictions
(`extproc.router.pass_time`): a slower GPU, or a model fitted elsewhere, is learned online. On a
fleet learned to mix speeds, the time also counts the delay the request's prompt imposes on the
requests that arrive at that worker after it (`extproc.router.arrivals`, `counts_delay_behind`).
`aic` (Dynamo's, `extproc.router.aic`): a request's uncached tokens count in full, except on each
worker the oldest active prefill's, which decay over the duration the pass-time model predicted for
it at admission.

Every call is idempotent: adding a known request id, completing prefill twice or freeing an
unknown id changes nothing, so edges may call `free` from every path that ends a stream.

For decisions that visit only the workers that matter (`extproc.router.load_order`), it also
keeps which workers hold a prompt's first block in flight (`holders_of`), and calls
`on_load_change(worker)` after every change of a worker's load.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from itertools import repeat

from extproc.router.aic import OldestPrefillDecay, admission_estimate, expected_prefill_ms
from extproc.router.arrivals import ArrivalRates, delay_behind_ms
from extproc.router.config import PrefillLoadModel
from extproc.router.pass_time import LearnedPassTime, PassTimeLearner
from extproc.router.prefill_model import PrefillEstimate, PrefillTimeline, PrefillTiming, estimate
from extproc.router.types import Worker, WorkerLoad

_NO_WORKERS: frozenset[Worker] = frozenset()
_NOBODY = Worker("\0no worker")  # never registered: what `shared_timing` asks the learner about


@dataclass(slots=True)
class _Request:
    worker: Worker
    block_keys: tuple[int, ...]
    own_blocks: int  # blocks never shared: the partial tail, or all blocks without KV reuse (x sequences)
    prefill_tokens: int
    isl: int
    expected_output_tokens: int | None
    output_tokens: int = 0
    output_weight: float = 0.0  # placeholder output blocks, decayed
    sequences: int = 1  # sequences generated from the prompt (the request's `n`, as the response shows)
    prefilled: bool = False  # the first token came back
    routed_ms: float = 0.0  # timing and aic models: when it was added, and the time to first token
    predicted_ttft_ms: float = 0.0  # predicted then on its worker (0: none predicted)
    teaches: bool = False  # its first token's time teaches the pass-time learner (not another replica's)


@dataclass(slots=True)
class _WorkerLoad:
    """A worker's in-flight load. The blocks its requests hold (chained keys, so each request holds a
    prefix path and the blocks held are a union of such paths) are kept in one of two shapes: `solo`,
    the keys of the only request holding any, as they are (no per-block work to add or free it); or,
    from a second such request until the worker holds none again, `block_refs`, how many requests
    hold each block."""

    prefill_tokens: int = 0
    own_blocks: float = 0.0
    solo: tuple[int, ...] = ()
    block_refs: Counter[int] = field(default_factory=Counter)  # block key -> requests holding it
    requests: int = 0
    decoding: int = 0  # requests past their first token

    @property
    def decode_blocks(self) -> float:
        return len(self.block_refs) + len(self.solo) + self.own_blocks

    def held_prefix(self, block_keys: Sequence[int]) -> int:
        """How many leading blocks of `block_keys` (chained) requests here hold: a request holding
        block i holds every block before it, so the held ones are a prefix, found by bisection."""
        solo = self.solo
        if solo:  # key i matches only at position i: compare in place
            reach = range(min(len(block_keys), len(solo)))
            return bisect_left(reach, True, key=lambda i: solo[i] != block_keys[i])
        refs = self.block_refs
        return bisect_left(block_keys, True, key=lambda k: k not in refs) if refs else 0

    def holds_first(self, keys: Sequence[int]) -> bool:
        """Whether a request here holds the first block of `keys` (non-empty)."""
        return self.solo[0] == keys[0] if self.solo else keys[0] in self.block_refs

    def hold(self, keys: tuple[int, ...]) -> None:
        """Count a new request's blocks (`keys` non-empty)."""
        refs = self.block_refs
        if not (self.solo or refs):
            self.solo = keys
            return
        if self.solo:  # a second request: from now on, counts
            refs.update(self.solo)  # counted in C (collections' _count_elements), not a Python loop
            self.solo = ()
        refs.update(keys)

    def release(self, keys: tuple[int, ...]) -> None:
        """Uncount a leaving request's blocks (`keys` non-empty, counted by `hold`)."""
        if self.solo:  # it was the only request holding blocks
            self.solo = ()
            return
        refs = self.block_refs
        # the blocks other requests hold too (count >= 2) are a prefix of its path: those lose one
        # holder, the rest (its own) go, popped in C (9x the loop's speed at 6,300 blocks)
        shared = bisect_left(keys, True, key=lambda k: refs[k] < 2)
        for k in keys[:shared]:
            refs[k] -= 1
        deque(map(dict.pop, repeat(refs), keys[shared:]), maxlen=0)


class ActiveSequences:
    """In-flight requests and the load they put on each worker."""

    def __init__(
        self,
        block_size: int,
        *,
        assume_kv_reuse: bool = True,
        track_active_blocks: bool = True,
        track_prefill_tokens: bool = True,
        track_output_blocks: bool = False,
        prefill_load_model: PrefillLoadModel | str = PrefillLoadModel.NONE,
        prefill_timing: PrefillTiming | None = None,
        learn_prefill_timing: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`clock` (seconds) is read only by the timing and aic models, which need one (ValueError).
        `learn_prefill_timing`: they learn each worker's pass-time scale from its first tokens
        (`extproc.router.pass_time`)."""
        self.block_size = block_size
        self.assume_kv_reuse = assume_kv_reuse
        self.track_active_blocks = track_active_blocks
        self.track_prefill_tokens = track_prefill_tokens
        self.track_output_blocks = track_output_blocks
        self.prefill_load_model = PrefillLoadModel(prefill_load_model)
        self.prefill_timing = prefill_timing or PrefillTiming()
        self._timed = self.prefill_load_model is PrefillLoadModel.TIMING and track_prefill_tokens
        self._aic = self.prefill_load_model is PrefillLoadModel.AIC and track_prefill_tokens
        if (self._timed or self._aic) and clock is None:
            raise ValueError(f"the {self.prefill_load_model} prefill load model needs a clock")
        self._clock = clock
        self._requests: dict[str, _Request] = {}
        self._loads: dict[Worker, _WorkerLoad] = {}
        self._timelines: dict[Worker, PrefillTimeline] = {}
        self._decays: dict[Worker, OldestPrefillDecay] = {}  # aic: each worker's active prefills
        self._learner: PassTimeLearner[Worker] | None = (
            PassTimeLearner(self.prefill_timing)
            if (self._timed or self._aic) and learn_prefill_timing
            else None
        )
        # timing model, learning: arrivals per worker, for the delay a prompt adds behind it
        self._arrivals: ArrivalRates[Worker] | None = (
            ArrivalRates() if self._timed and self._learner is not None else None
        )
        self._holders: dict[int, set[Worker]] = {}  # first block key -> workers holding it in flight
        self.on_load_change: Callable[[Worker], None] | None = None

    @property
    def timed(self) -> bool:
        """Whether the timing model counts prefill (then loads also depend on the clock)."""
        return self._timed

    @property
    def counts_delay_behind(self) -> bool:
        """Whether a worker's cost adds the delay the request's prompt imposes on the requests that
        arrive there after it (`extproc.router.arrivals`): the timing model, learning, on a fleet
        whose workers were learned to differ in speed (`PassTimeLearner.mixed`). The cost then
        depends on each worker's recent arrivals too."""
        return self._arrivals is not None and self._learner is not None and self._learner.mixed

    @property
    def loads_follow_clock(self) -> bool:
        """Whether active prefill loads change as time passes (the timing and aic models)."""
        return self._timed or self._aic

    # --- reading -----------------------------------------------------------------------------

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def worker_of(self, request_id: str) -> Worker | None:
        request = self._requests.get(request_id)
        return request.worker if request else None

    def prefill_tokens(self, worker: Worker) -> int:
        """Active prefill tokens; with the timing model, those still predicted to be computed; with
        aic, the oldest active prefill's decayed."""
        if self._aic:
            decay = self._decays.get(worker)
            return decay.active_tokens(self._now_ms()) if decay is not None else 0
        if self._timed:
            timeline = self._timelines.get(worker)
            return timeline.remaining_tokens(self._now_ms()) if timeline is not None else 0
        load = self._loads.get(worker)
        return load.prefill_tokens if load else 0

    def decode_blocks(self, worker: Worker) -> float:
        load = self._loads.get(worker)
        return load.decode_blocks if load else 0.0

    def potential(self, worker: Worker, block_keys: Sequence[int], isl: int) -> tuple[int, float]:
        """(active prefill tokens, active decode blocks + this request's new blocks) on `worker`."""
        load = self._loads.get(worker)
        new = self._new_blocks(load, block_keys, isl)
        if load is None:
            return 0, float(new)
        prefill = self.prefill_tokens(worker) if self._timed or self._aic else load.prefill_tokens
        return prefill, load.decode_blocks + new

    def potential_load(
        self, worker: Worker, block_keys: Sequence[int], isl: int, overlap_blocks: float
    ) -> WorkerLoad:
        """The load `worker` would carry with this request, as the cost function reads it.

        `none`: active prefill tokens + this request's uncached tokens, and active decode blocks +
        this request's new blocks (Dynamo's potential loads); `aic` alike, the active prefill tokens
        decayed. `timing`: the request's predicted time
        to first token there, in prefill-token equivalents (ms / the timing model's ms per prefill
        token), and no decode blocks: decoding requests enter the prediction through what they add
        to every pass (the decode part, and half a pass of waiting when the worker has no prompt
        work). Blocks in flight on the worker count as cached: the engine matches a block as soon
        as it is scheduled. On a mixed fleet (`counts_delay_behind`) the time adds the delay the
        prompt's own prefill imposes on the requests expected to arrive there before it is done.
        """
        if not self._timed:
            active_prefill, decode = self.potential(worker, block_keys, isl)
            uncached = max(0, isl - round(overlap_blocks * self.block_size))  # credited tiers: fractional
            return WorkerLoad(worker, active_prefill + uncached, decode, overlap_blocks)
        load = self._loads.get(worker)
        new = self.new_blocks(worker, block_keys, isl)
        now = self._now_ms()
        guess = self._estimate(worker, block_keys, isl, overlap_blocks, new, load, now)
        ms = guess.ttft_ms
        if self._arrivals is not None and self.counts_delay_behind:
            ms += delay_behind_ms(self._arrivals.per_ms(worker, now), guess.prefill_ms, guess.wait_ms)
        return WorkerLoad(worker, round(ms / self.prefill_timing.ms_per_token), 0.0, overlap_blocks)

    def arrivals_per_s(self, worker: Worker) -> float:
        """Requests routed to `worker` per second lately (`extproc.router.arrivals`; the timing model
        with learning, else 0): what the delay a prompt imposes behind it reads on a mixed fleet."""
        return self._arrivals.per_ms(worker, self._now_ms()) * 1000.0 if self._arrivals is not None else 0.0

    def timing(self, worker: Worker) -> PrefillTiming:
        """The pass-time model the timing model predicts `worker` with (learned, or the configured)."""
        return self._learner.timing(worker) if self._learner is not None else self.prefill_timing

    def learned_pass_time(self, worker: Worker) -> LearnedPassTime | None:
        """What the timing model learned of `worker`'s speed; None before its first observation."""
        return self._learner.learned(worker) if self._learner is not None else None

    def timeline(self, worker: Worker) -> PrefillTimeline | None:
        """`worker`'s predicted prompt work (timing model; None when it has none). Read only."""
        return self._timelines.get(worker)

    def decode_part_ms(self, worker: Worker) -> float:
        """Timing model: the decode part each of `worker`'s passes pays now (0 when nothing decodes)."""
        load = self._loads.get(worker)
        if load is None or load.decoding <= 0:
            return 0.0
        timing = self.timing(worker)
        return timing.decode_ms(load.decode_blocks * self.block_size / timing.kv_capacity_tokens)

    def shared_timing(self) -> PrefillTiming:
        """The pass-time model of a worker nothing was learned of (it may follow every worker's
        first tokens: then every worker's prediction may change with any first token)."""
        return self._learner.timing(_NOBODY) if self._learner is not None else self.prefill_timing

    def holders_of(self, block_keys: Sequence[int]) -> Set[Worker]:
        """Workers holding the first of `block_keys` (sequence hashes) in flight: with KV reuse
        assumed, the only workers where `new_blocks` is below `unmatched_new_blocks`."""
        if not block_keys:
            return _NO_WORKERS
        return self._holders.get(block_keys[0], _NO_WORKERS)

    def unmatched_new_blocks(self, block_keys: Sequence[int], isl: int) -> int:
        """`new_blocks` on a worker that holds none of the request's blocks in flight."""
        return self._new_blocks(None, block_keys, isl)

    def predicted_ttft_ms(self, request_id: str) -> float | None:
        """The time to first token predicted for a request when it was added here (the timing and
        aic prefill models); None for another model, a request added without a prompt to prefill,
        or one not tracked."""
        request = self._requests.get(request_id)
        if request is None or not request.predicted_ttft_ms:
            return None
        return request.predicted_ttft_ms

    def num_requests(self, worker: Worker) -> int:
        load = self._loads.get(worker)
        return load.requests if load else 0

    def new_blocks(self, worker: Worker, block_keys: Sequence[int], isl: int) -> int:
        """Blocks this request would add on `worker` (its full blocks not active there + tail).

        `block_keys` must be chained (sequence) hashes, as everywhere in this class.
        """
        return self._new_blocks(self._loads.get(worker), block_keys, isl)

    def _new_blocks(self, load: _WorkerLoad | None, block_keys: Sequence[int], isl: int) -> int:
        """`new_blocks` for the worker whose load is `load` (one lookup of the worker per request)."""
        if not self.track_active_blocks:
            return 0
        tail = 1 if isl % self.block_size else 0
        if not self.assume_kv_reuse or load is None:
            return len(block_keys) + tail
        return len(block_keys) - load.held_prefix(block_keys) + tail

    def _now_ms(self) -> float:
        assert self._clock is not None
        return self._clock() * 1000.0

    def _estimate(
        self,
        worker: Worker,
        block_keys: Sequence[int],
        isl: int,
        overlap_blocks: float,
        new_blocks: int,
        load: _WorkerLoad | None,
        now_ms: float,
    ) -> PrefillEstimate:
        bs = self.block_size
        cached = overlap_blocks
        if self.track_active_blocks and self.assume_kv_reuse:
            in_flight = len(block_keys) - (new_blocks - (1 if isl % bs else 0))
            cached = max(cached, in_flight)
        cached = min(cached, max(0, (isl - 1) // bs))  # the engine computes at least one token
        decoding = load is not None and load.decoding > 0
        timing = self.timing(worker)
        usage = (load.decode_blocks if load else 0.0) * bs / timing.kv_capacity_tokens
        return estimate(
            timing,
            self._timelines.get(worker),
            max(1, isl - round(cached * bs)),
            decoding=decoding,
            kv_usage=usage,
            now_ms=now_ms,
        )

    def is_idle(self) -> bool:
        """True when nothing is in flight (a worker's counters leave with its last request)."""
        return not self._requests

    # --- writing -----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        worker: Worker,
        block_keys: Sequence[int],
        isl: int,
        overlap_blocks: float,
        *,
        expected_output_tokens: int | None = None,
        learn: bool = True,
        sequences: int = 1,
    ) -> bool:
        """Track a routed request; False (and no change) if the id is already tracked.

        `sequences`: the decoding sequences the prompt starts (the request's `n`): its prompt is
        computed once (prefill tokens count once), and each sequence holds its own partial last
        block, every prompt block without KV reuse assumed, and its own output blocks.

        `learn`: its first token teaches the timing model its worker's speed (False for a request
        another replica routed, whose decision time is known here only after the sync lag)."""
        if request_id in self._requests:
            return False
        prefill = max(0, isl - round(overlap_blocks * self.block_size)) if self.track_prefill_tokens else 0
        keys = tuple(block_keys) if self.track_active_blocks and self.assume_kv_reuse else ()
        own = 0
        n = max(1, sequences)
        if self.track_active_blocks:
            own = (1 if isl % self.block_size else 0) + (0 if self.assume_kv_reuse else len(block_keys))
            own *= n
        request = _Request(worker, keys, own, prefill, isl, expected_output_tokens, sequences=n)
        if self._aic and prefill > 0:
            self._admit_aic(request, request_id, learn=learn)
        if self._timed:
            now = self._now_ms()
            current = self._loads.get(worker)
            new = self.new_blocks(worker, block_keys, isl)
            guess = self._estimate(worker, block_keys, isl, overlap_blocks, new, current, now)
            timeline = self._timelines.get(worker)
            if timeline is None:
                timeline = self._timelines[worker] = PrefillTimeline(self.timing(worker))
            timeline.add(request_id, guess.uncached_tokens, now, guess.decode_ms)
            self._predicted(request, guess, now, learn=learn)
            if self._arrivals is not None:
                self._arrivals.add(worker, now)
        self._requests[request_id] = request
        load = self._loads.setdefault(worker, _WorkerLoad())
        load.requests += 1
        load.prefill_tokens += prefill
        load.own_blocks += own
        if keys:
            if not load.holds_first(keys):
                self._holders.setdefault(keys[0], set()).add(worker)
            load.hold(keys)
        if self.on_load_change is not None:
            self.on_load_change(worker)
        return True

    def _admit_aic(self, request: _Request, request_id: str, *, learn: bool) -> None:
        """aic: one expected duration, predicted now on the worker's pass-time model; the request
        joins the worker's active prefills (the oldest of them decays)."""
        now = self._now_ms()
        worker = request.worker
        own = expected_prefill_ms(self.timing(worker), request.prefill_tokens)
        decay = self._decays.get(worker)
        self._predicted(
            request, admission_estimate(decay, own, request.prefill_tokens, now), now, learn=learn
        )
        if decay is None:
            decay = self._decays[worker] = OldestPrefillDecay()
        decay.add(request_id, request.prefill_tokens, own, now)

    def _predicted(self, request: _Request, guess: PrefillEstimate, now: float, *, learn: bool) -> None:
        """Keep the time to first token predicted for `request` as it is added; `learn`: its first
        token's time teaches the learner, when it measures such a guess."""
        request.routed_ms, request.predicted_ttft_ms = now, guess.ttft_ms
        request.teaches = learn and self._learner is not None and self._learner.measures(guess)

    def _aic_done(self, worker: Worker, request_id: str) -> None:
        decay = self._decays.get(worker)
        if decay is not None and decay.remove(request_id, self._now_ms()) and not decay:
            del self._decays[worker]

    def mark_prefill_complete(self, request_id: str, *, at_first_token: bool = True) -> bool:
        """The first token came back; False if unknown or already marked. `at_first_token` False:
        the call comes later than the first token (a non-streamed answer is seen only whole), so the
        prompt's load ends but its time teaches the pass-time model nothing."""
        request = self._requests.get(request_id)
        if request is None or request.prefilled:
            return False
        request.prefilled = True
        if not at_first_token:
            request.teaches = False  # its time is not the first token's
        if self._aic:
            if self._learner is not None and request.teaches:
                observed = self._now_ms() - request.routed_ms
                self._learner.observe(request.worker, request.predicted_ttft_ms, observed)
            self._aic_done(request.worker, request_id)
        load = self._loads[request.worker]
        load.prefill_tokens -= request.prefill_tokens
        load.decoding += 1
        request.prefill_tokens = 0
        if self._timed:
            if self._learner is not None and request.teaches:
                observed = self._now_ms() - request.routed_ms
                timing = self._learner.observe(request.worker, request.predicted_ttft_ms, observed)
                timeline = self._timelines.get(request.worker)
                if timing is not None and timeline is not None:
                    timeline.retime(timing)
            self._timeline_done(request.worker, request_id, complete=True)
        if self.on_load_change is not None:
            self.on_load_change(request.worker)
        return True

    def _timeline_done(self, worker: Worker, request_id: str, *, complete: bool) -> None:
        timeline = self._timelines.get(worker)
        if timeline is None:
            return
        now = self._now_ms()
        if complete:
            timeline.complete(request_id, now)
        else:
            timeline.drop(request_id)
        if not timeline:
            del self._timelines[worker]

    def add_output_tokens(self, request_id: str, count: int, *, sequences: int = 1) -> None:
        """Record `count` generated tokens per sequence (counted with output-block tracking only).

        `sequences`: how many sequences the request generates (its `n`, from the request or as the
        response shows it; it only grows). Each holds its own blocks past the shared prompt (`_own`),
        and its own output blocks, so the placeholder blocks are `sequences` times one sequence's.
        The decay toward `expected_output_tokens` reads one sequence's progress."""
        request = self._requests.get(request_id)
        if request is None:
            return
        grown = sequences > request.sequences
        if grown:
            own = request.own_blocks // request.sequences * sequences
            self._loads[request.worker].own_blocks += own - request.own_blocks
            request.own_blocks, request.sequences = own, sequences
        if not self.track_output_blocks or not self.track_active_blocks or (count <= 0 and not grown):
            if grown and self.on_load_change is not None:
                self.on_load_change(request.worker)
            return
        request.output_tokens += max(0, count)
        bs = self.block_size
        blocks = (request.isl + request.output_tokens) // bs - request.isl // bs
        weight = float(blocks * request.sequences)
        if request.expected_output_tokens:
            weight *= max(0.0, 1.0 - request.output_tokens / request.expected_output_tokens)
        load = self._loads[request.worker]
        load.own_blocks += weight - request.output_weight
        request.output_weight = weight
        if self.on_load_change is not None:
            self.on_load_change(request.worker)

    def free(self, request_id: str) -> bool:
        """Forget a request; False if it was not tracked."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        load = self._loads[request.worker]
        load.requests -= 1
        load.prefill_tokens -= request.prefill_tokens
        if request.prefilled:
            load.decoding -= 1
        elif self._timed:
            self._timeline_done(request.worker, request_id, complete=False)
        elif self._aic:
            self._aic_done(request.worker, request_id)
        load.own_blocks -= request.own_blocks + request.output_weight
        keys = request.block_keys
        if keys and load.requests:  # else its worker's last request: the load goes below
            load.release(keys)
        if keys and (not load.requests or not load.holds_first(keys)):
            first = keys[0]
            holders = self._holders[first]
            holders.discard(request.worker)
            if not holders:
                del self._holders[first]
        if load.requests == 0:
            del self._loads[request.worker]  # exact zero, no float drift left behind
        if self.on_load_change is not None:
            self.on_load_change(request.worker)
        return True

    def remove_worker(self, worker: Worker) -> list[str]:
        """Drop every request on `worker`; returns their ids."""
        ids = [rid for rid, r in self._requests.items() if r.worker == worker]
        for rid in ids:
            self.free(rid)
        if self._learner is not None:
            self._learner.forget(worker)
        if self._arrivals is not None:
            self._arrivals.forget(worker)
        return ids
