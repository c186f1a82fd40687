"""KvRouter: the embedded KV-aware router. Composes indexer, active sequences and selection.

The public surface mirrors Dynamo's Python `KvRouter` (best_worker, get_potential_loads,
mark_prefill_complete, free, dump_events) so its users find their way. Pure logic: it reads the
clock it is given (only for the approximate indexer's TTL) and draws randomness from the `rng`
it is given, so tests and the simulator drive it deterministically.

A call without `request_id` changes no state (a probe); with one, it is tracked until `free`.

Fleet-sized decisions. Past `full_scan_max_workers` workers, a decision at temperature 0
evaluates only the workers that cache or hold in flight part of the prompt, one idle worker (under
the timing model: one per idle class) and the loaded workers in the order of a load-only bound
until none can beat the best cost found (`extproc.router.load_order`): O(matching + log W) instead
of O(W), with the same costs, the same ties and the same random draw as the full scan, which every
other decision still takes (temperature > 0, allowed, pinned or preferred workers, device-aware
mode, a weight override, formula logging; under the timing model also prefill-token busy
thresholds, a pass-time model with negative parts, and a clock that went back).
"""

from __future__ import annotations

import logging
import math
import random
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from extproc.router.approx import ApproxIndexer, first_predicted
from extproc.router.config import RouterConfig, RouterConfigOverride, RouterMode
from extproc.router.device_share import device_class_candidates
from extproc.router.errors import AllWorkersBusy, InvalidConfig, NoWorkers, PinnedWorkerUnavailable
from extproc.router.hashing import TokenIds, compute_block_hashes, compute_sequence_hashes
from extproc.router.load_order import LoadOrder, TimedLoadOrder
from extproc.router.prefill_model import PrefillTiming
from extproc.router.radix import OverlapScores, RadixTree
from extproc.router.radix_dump import dump_slices
from extproc.router.reported import ReportedLoad, ReportedLoads
from extproc.router.selection import compute_costs, cost_weight, is_busy, pick
from extproc.router.sequences import ActiveSequences
from extproc.router.tiers import LowerTiers, TierMatch
from extproc.router.types import (
    DEVICE_TIER,
    BlocksRemoved,
    BlocksStored,
    Decision,
    KvEvent,
    Worker,
    WorkerCost,
    WorkerId,
    WorkerLoad,
    WorkerSpec,
    engine_ids,
)

log = logging.getLogger("extproc.router")

KV_RULES = (RouterMode.KV, RouterMode.DEVICE_AWARE_WEIGHTED)  # modes that choose by overlap and load
# Up to this many workers every decision visits them all (see the docstring): past it the fleet-sized
# decision is cheaper (bench_router's 8k-token probes, 2026-11-26: 0.93-0.96x the full scan's time at
# 8 workers, 0.79-0.83x at 16, 0.49-0.66x at 32; 0.97-1.14x at 4, 1.05-1.68x at 2).
FULL_SCAN_MAX_WORKERS = 6
_KEY_SLACK = 1e-9  # relative: far above the rounding of a cost, far below a difference of loads
_BOUND_SLACK = 1e-9  # timing model: `bound` lowers each bound by this fraction, far above a time's rounding

WorkerFilter = Collection[WorkerId | Worker]


class KvRouter:
    """Chooses the worker that caches most of a request's prefix at the least load."""

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        workers: Iterable[WorkerSpec] = (),
        timer: Callable[[], int] | None = None,
    ) -> None:
        """`clock`: seconds, for TTLs. `timer`: nanoseconds, to time decision stages (optional)."""
        self.config = config or RouterConfig()
        self._clock = clock
        self._timer = timer
        self._rng = rng or random.Random()
        cfg = self.config
        self.indexer = RadixTree()
        self.tiers = LowerTiers()  # offloaded blocks, per lower tier (extproc.router.tiers)
        self.approx = ApproxIndexer(
            self.indexer,
            ttl_s=cfg.router_ttl_secs,
            max_tree_size=cfg.router_max_tree_size,
            prune_target_ratio=cfg.router_prune_target_ratio,
        )
        self._event_fed: set[Worker] = set()  # workers whose cache state comes from their KV events
        self.sequences = ActiveSequences(
            cfg.block_size,
            assume_kv_reuse=cfg.router_assume_kv_reuse,
            track_active_blocks=cfg.router_track_active_blocks,
            track_prefill_tokens=cfg.router_track_prefill_tokens,
            track_output_blocks=cfg.router_track_output_blocks,
            prefill_load_model=cfg.prefill_load_model,
            prefill_timing=cfg.prefill_timing,
            learn_prefill_timing=cfg.learn_prefill_timing,
            clock=clock,
        )
        self.reported = ReportedLoads(clock)  # what the engines say about their own load
        self._specs: dict[WorkerId, WorkerSpec] = {}
        self._workers: list[Worker] = []
        self._round_robin = 0
        self.full_scan_max_workers = FULL_SCAN_MAX_WORKERS
        self._order: LoadOrder | TimedLoadOrder | None = None  # built lazily; None after a change of workers
        self._order_config: RouterConfig | None = None  # the config the order's keys and busy states follow
        self._order_timing: PrefillTiming | None = None  # timing model: the shared pass-time model it follows
        self._order_now_ms = -math.inf  # timing model: the latest clock reading the order was kept at
        self.sequences.on_load_change = self._reorder
        for spec in workers:
            self.add_worker(spec)

    # --- workers and events ------------------------------------------------------------------

    def add_worker(self, spec: WorkerSpec) -> None:
        """Register (or update) a worker and its dp ranks."""
        self._order = None
        old = self._specs.get(spec.worker_id)
        self._specs[spec.worker_id] = spec
        if old is not None:
            for worker in old.workers():
                if worker.dp_rank not in spec.dp_ranks:
                    self._forget(worker)
        self._workers = sorted((w for s in self._specs.values() for w in s.workers()), key=_worker_order)

    def remove_worker(self, worker_id: WorkerId) -> list[str]:
        """Forget a worker, its cached blocks and its in-flight requests (whose ids are returned)."""
        spec = self._specs.pop(worker_id, None)
        if spec is None:
            return []
        self._order = None
        dropped = [request_id for worker in spec.workers() for request_id in self._forget(worker)]
        self._workers = [w for w in self._workers if w.worker_id != worker_id]
        return dropped

    def _forget(self, worker: Worker) -> list[str]:
        self.indexer.remove_worker(worker)
        self.tiers.clear_worker(worker)
        self.approx.remove_worker(worker)
        self._event_fed.discard(worker)
        self.reported.drop(worker)
        return self.sequences.remove_worker(worker)

    def workers(self) -> list[Worker]:
        return list(self._workers)

    def spec(self, worker_id: WorkerId) -> WorkerSpec | None:
        return self._specs.get(worker_id)

    def apply_event(self, event: KvEvent, *, feeds: bool = True) -> bool:
        """Apply one KV event from an engine (never raises on inconsistent content).

        With KV events on, the first event of a worker makes it event-fed (see `set_event_fed`),
        unless `feeds` is False: its stream is known to be incomplete, so the router keeps
        predicting on top. Returns False when a store was dropped because its parent block is not
        known for that worker (an orphan: the view lost blocks the engine still holds).
        """
        if feeds and event.worker not in self._event_fed and self.config.use_kv_events:
            self.set_event_fed(event.worker, True)
        return self.indexer.apply_event(event) if event.tier == DEVICE_TIER else self.tiers.apply_event(event)

    def set_event_fed(self, worker: Worker, fed: bool) -> None:
        """Switch where `worker`'s cache state comes from.

        Event-fed: its KV events are flowing; the router's predictions for it are withdrawn.
        Predicted (the start state of every worker, and the state while its event stream is
        down): the router predicts from its own decisions, on top of whatever real blocks it
        last knew (kept until a reset, since they are still the best knowledge).
        Ignored unless the config uses KV events.
        """
        if not self.config.use_kv_events:
            return
        if fed and worker not in self._event_fed:
            self._event_fed.add(worker)
            self.approx.drop_worker(worker)
        elif not fed:
            self._event_fed.discard(worker)

    def is_event_fed(self, worker: Worker) -> bool:
        return worker in self._event_fed

    def set_reported_load(
        self,
        worker: Worker,
        *,
        kv_usage: float | None,
        running: int | None = None,
        waiting: int | None = None,
        max_age_s: float,
        at: float | None = None,
    ) -> ReportedLoad | None:
        """What `worker`'s engine reports (KV usage fraction, running and waiting requests), fresh
        for `max_age_s` from `at` (default: now). While fresh, the decode-blocks busy threshold
        compares the engine's KV usage (router/reported.py). None for a worker not registered."""
        spec = self._specs.get(worker.worker_id)
        if spec is None or worker.dp_rank not in spec.dp_ranks:
            return None
        return self.reported.set(
            worker, kv_usage=kv_usage, running=running, waiting=waiting, max_age_s=max_age_s, at=at
        )

    def reset_worker_cache(self, worker: Worker) -> None:
        """Forget every block known for `worker`, real or predicted, in every tier (a full replay follows)."""
        self.indexer.clear_worker(worker)
        self.tiers.clear_worker(worker)
        self.approx.remove_worker(worker)

    def dump_events(self, *, include_predicted: bool = False) -> list[KvEvent]:
        """Events that rebuild the tree: what the engines reported, without the router's own
        predictions (they belong to this router's clock and TTLs) unless `include_predicted`. A
        run is dumped up to its first prediction (predictions extend what a worker reported)."""
        return next(self._dump_slices(sys.maxsize, include_predicted))

    def dump_slices(self, blocks_per_slice: int) -> Iterator[list[KvEvent]]:
        """`dump_events()` in slices of about `blocks_per_slice` blocks, for a caller that lets others
        run between them; raises `TreeChanged` (`radix_dump`) when the tree changed meanwhile."""
        return self._dump_slices(blocks_per_slice, False)

    def _dump_slices(self, blocks_per_slice: int, include_predicted: bool) -> Iterator[list[KvEvent]]:
        slices = dump_slices(self.indexer, blocks_per_slice)
        if include_predicted:
            yield from slices
            return
        cut: set[tuple[Worker, int | None]] = set()  # not dumped: predictions and the blocks after them
        for events in slices:
            kept: list[KvEvent] = []
            keep = False
            for i, event in enumerate(events):  # a removal follows its store (its stand-ins), same slice
                if isinstance(event, BlocksStored):
                    after = events[i + 1] if i + 1 < len(events) else None
                    chain = len(after.engine_hashes) if isinstance(after, BlocksRemoved) else 0
                    ids = engine_ids(event.blocks)
                    n = first_predicted(ids)
                    n = 0 if cut and (event.worker, event.parent_hash) in cut else n  # parents come first
                    if n < len(ids):
                        cut.update((event.worker, e) for e in ids[n:])
                    keep = n > chain
                    if keep:
                        kept.append(event if n == len(ids) else replace(event, blocks=event.blocks[:n]))
                elif keep:
                    kept.append(event)
            yield kept

    # --- decisions ---------------------------------------------------------------------------

    def block_hashes(
        self, tokens: TokenIds, *, lora_name: str | None = None, cache_salt: str | None = None
    ) -> list[int]:
        """Local block hashes of a request; a `cache_salt` seeds them as Dynamo's cache namespace does."""
        return compute_block_hashes(tokens, self.config.block_size, lora_name=lora_name, namespace=cache_salt)

    def best_worker(
        self,
        tokens: TokenIds,
        *,
        request_id: str | None = None,
        config_override: RouterConfigOverride | None = None,
        pinned_worker: Worker | WorkerId | None = None,
        preferred_worker: Worker | WorkerId | None = None,
        allowed_workers: WorkerFilter | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        expected_output_tokens: int | None = None,
    ) -> Decision:
        """Choose a worker for `tokens`; with `request_id` the request is also tracked.

        `pinned_worker` must take the request (else PinnedWorkerUnavailable); `preferred_worker`
        takes it when it is an eligible candidate, and otherwise the usual choice is made (a sticky
        session, a probed worker). Either skips the cost comparison when it is used.
        Raises NoWorkers, AllWorkersBusy or PinnedWorkerUnavailable.
        """
        return self.best_worker_for_hashes(
            self.block_hashes(tokens, lora_name=lora_name, cache_salt=cache_salt),
            len(tokens),
            request_id=request_id,
            config_override=config_override,
            pinned_worker=pinned_worker,
            preferred_worker=preferred_worker,
            allowed_workers=allowed_workers,
            expected_output_tokens=expected_output_tokens,
        )

    def best_worker_for_hashes(
        self,
        local_hashes: Sequence[int],
        isl: int,
        *,
        request_id: str | None = None,
        config_override: RouterConfigOverride | None = None,
        pinned_worker: Worker | WorkerId | None = None,
        preferred_worker: Worker | WorkerId | None = None,
        allowed_workers: WorkerFilter | None = None,
        expected_output_tokens: int | None = None,
        found: OverlapScores | None = None,
    ) -> Decision:
        """As `best_worker`, given the local block hashes, the ISL and maybe each worker's cached
        blocks (`found`: a KV indexer's answer, in place of this router's own index)."""
        timer = self._timer
        t0 = timer() if timer is not None else 0
        cfg = self.config.merged(config_override)
        candidates = self._candidates(allowed_workers)
        block_keys = self._block_keys(local_hashes)
        overlaps = self._overlaps(cfg, local_hashes, found)
        t1 = timer() if timer is not None else 0
        fast = None
        if self._fast_path_applies(cfg, pinned_worker, preferred_worker, allowed_workers):
            fast = self._fast_choice(cfg, block_keys, isl, overlaps)
        if fast is not None:
            chosen, costs = fast
            worker, cost = chosen.worker, chosen.cost
        else:
            worker, cost, costs = self._full_scan(
                cfg, candidates, pinned_worker, preferred_worker, block_keys, isl, overlaps, request_id
            )
        overlap = overlaps.get(worker, 0)  # credited (device and lower tiers): the tracked prefill's
        if request_id is not None:
            self._track(request_id, worker, local_hashes, block_keys, isl, overlap, expected_output_tokens)
        device = overlaps.device if isinstance(overlaps, TierMatch) else overlaps
        best = self._best_overlap(device, candidates, allowed_workers is None)
        t2 = timer() if timer is not None else 0
        return Decision(worker, device.get(worker, 0), len(local_hashes), costs, cost, best, t1 - t0, t2 - t1)

    def _full_scan(
        self,
        cfg: RouterConfig,
        candidates: list[Worker],
        pinned_worker: Worker | WorkerId | None,
        preferred_worker: Worker | WorkerId | None,
        block_keys: Sequence[int],
        isl: int,
        overlaps: Mapping[Worker, float],
        request_id: str | None,
    ) -> tuple[Worker, float, tuple[WorkerCost, ...]]:
        """Every candidate's load and cost, then the pick: (worker, cost, every cost evaluated)."""
        eligible = [w for w in candidates if not self._busy(cfg, w)]
        if pinned_worker is not None:
            pinned = self._resolve_pinned(pinned_worker, candidates)
            if pinned not in eligible:
                raise PinnedWorkerUnavailable(pinned, "busy")
            eligible = [pinned]
        elif preferred_worker is not None:
            preferred = next((w for w in eligible if _is(w, preferred_worker)), None)
            if preferred is not None:
                eligible = [preferred]
        if not eligible:
            raise AllWorkersBusy(len(candidates))

        if cfg.mode is RouterMode.DEVICE_AWARE_WEIGHTED and len(eligible) > 1:
            eligible = device_class_candidates(  # the class whose turn it is, then the kv rules
                eligible,
                device_of=self._device_of,
                in_flight=self.sequences.num_requests,
                ratio=cfg.cuda_to_cpu_ratio,
            )

        if cfg.mode in KV_RULES or len(eligible) == 1:
            loads = self._loads(eligible, block_keys, isl, overlaps)
            weight = cost_weight(cfg)
            worker_costs = compute_costs(loads, cfg.block_size, weight)
            chosen = pick(worker_costs, cfg.temperature, self._rng)
            if cfg.log_formula or log.isEnabledFor(logging.DEBUG):
                for c in worker_costs:
                    log.info(c.formula(weight))
            return chosen.worker, chosen.cost, tuple(worker_costs)
        if cfg.mode is RouterMode.ROUND_ROBIN:
            worker = eligible[self._round_robin % len(eligible)]
            if request_id is not None:
                self._round_robin += 1
            return worker, 0.0, ()
        return eligible[self._rng.randrange(len(eligible))], 0.0, ()

    # --- fleet-sized decisions (see the module docstring) ----------------------------------------

    def _fast_path_applies(
        self,
        cfg: RouterConfig,
        pinned_worker: Worker | WorkerId | None,
        preferred_worker: Worker | WorkerId | None,
        allowed_workers: WorkerFilter | None,
    ) -> bool:
        """Whether the decision can skip workers: the conditions under which `_fast_choice` makes the
        choice the full scan makes (costs independent of the clock, a load-only key per worker)."""
        return (
            len(self._workers) > self.full_scan_max_workers
            and cfg.mode is RouterMode.KV
            and cfg.temperature <= 0
            and pinned_worker is None
            and preferred_worker is None
            and allowed_workers is None
            and (not self.sequences.loads_follow_clock or self._timed_fast_path_applies(cfg))
            and not (len(self.reported) and cfg.active_decode_blocks_threshold is not None)  # reports age
            and cfg.overlap_score_weight == self.config.overlap_score_weight
            and not cfg.log_formula
            and not log.isEnabledFor(logging.DEBUG)
        )

    def _timed_fast_path_applies(self, cfg: RouterConfig) -> bool:
        """Timing model (not aic, whose decay the load order's keys do not follow): busy states must
        not follow the clock (no prefill-token threshold: the remaining prefill decays with time) and
        the pass-time model must have the shape the bounds rely on (prefill passes grow with tokens)."""
        base = self.sequences.prefill_timing
        return (
            self.sequences.timed
            and cfg.active_prefill_tokens_threshold is None
            and cfg.active_prefill_tokens_threshold_frac is None
            and base.prefill_quadratic_ms >= 0
            and min(base.prefill_constant_ms, base.decode_min_ms) >= 0
        )

    def _load_order(self) -> LoadOrder:
        """The load order of the registered workers, rebuilt after a change of workers or config."""
        order = self._order
        if not isinstance(order, LoadOrder) or self._order_config is not self.config:
            order = self._order = LoadOrder(self._workers)
            self._order_config = self.config
            for worker in self._workers:
                self._reorder(worker)
        return order

    def _reorder(self, worker: Worker) -> None:
        """`worker`'s load changed (called by `self.sequences`): move it in the load order."""
        order = self._order
        if order is None:
            return
        if isinstance(order, TimedLoadOrder):
            self._reorder_timed(order, worker)
            return
        cfg = self.config
        if self._order_config is not cfg:
            self._order = None  # the config changed (thresholds): rebuilt at the next decision
            return
        rank = order.rank.get(worker)
        if rank is None:
            return
        seqs = self.sequences
        if self._busy(cfg, worker):
            order.set_busy(rank)
        elif seqs.num_requests(worker) == 0:
            order.set_idle(rank)
        else:
            prefill_blocks = seqs.prefill_tokens(worker) / cfg.block_size
            order.set_key(rank, cost_weight(cfg) * prefill_blocks + seqs.decode_blocks(worker))

    def _fast_choice(
        self, cfg: RouterConfig, block_keys: Sequence[int], isl: int, overlaps: Mapping[Worker, float]
    ) -> tuple[WorkerCost, tuple[WorkerCost, ...]] | None:
        """The full scan's choice at temperature 0, visiting the workers that match the prompt, one
        idle worker and the loaded ones in load order while they can still tie the best cost.

        A worker that neither caches nor holds in flight any block of the prompt costs its key
        (`weight * P / block_size + D`) plus `weight * isl / block_size + new blocks`, the same for
        all of them: once the key exceeds the best exact cost found minus that term (with a relative
        slack well above float rounding), no later worker can reach it, nor tie it. Costs are
        always computed by the same code as the full scan's; the key only decides where to stop.
        The ties are the full scan's (every worker whose exact cost equals the lowest) in worker
        order, so the one random draw picks the same worker. Returns (chosen, evaluated costs in
        worker order), or None when the full scan must decide (no eligible worker: its error).
        """
        if self.sequences.timed:
            if self.sequences.counts_delay_behind:
                return None  # costs that depend on each worker's arrivals: no idle classes, no bounds
            return self._timed_choice(cfg, block_keys, isl, overlaps)
        order = self._load_order()
        if not len(order):
            return None
        seqs = self.sequences
        bs, weight = cfg.block_size, cost_weight(cfg)
        workers, rank = order.workers, order.rank
        matching = {rank[w] for w in overlaps if w in rank}
        if seqs.track_active_blocks and seqs.assume_kv_reuse:
            matching.update(rank[w] for w in seqs.holders_of(block_keys) if w in rank)
        evaluated: dict[int, WorkerCost] = {}
        excluded: list[int] = []  # idle workers evaluated apart (they match)
        for r in matching:
            if order.is_busy(r):
                continue
            if order.is_idle(r):
                excluded.append(r)
            w = workers[r]
            evaluated[r] = self._cost(seqs.potential_load(w, block_keys, isl, overlaps.get(w, 0)), bs, weight)
        excluded.sort()
        idle_cost: WorkerCost | None = None
        idle_count = len(order.idle) - len(excluded)
        if idle_count > 0:
            some = next(r for r in order.idle if r not in matching)
            idle_cost = self._cost(seqs.potential_load(workers[some], block_keys, isl, 0), bs, weight)
        best = min((c.cost for c in evaluated.values()), default=math.inf)
        if idle_cost is not None:
            best = min(best, idle_cost.cost)
        common = weight * isl / bs + seqs.unmatched_new_blocks(block_keys, isl)
        for key, r in order.keyed:
            if key - (best - common) > _KEY_SLACK * (1.0 + abs(best) + common + abs(key)):
                break
            if r in matching:
                continue
            c = self._cost(seqs.potential_load(workers[r], block_keys, isl, 0), bs, weight)
            evaluated[r] = c
            if c.cost < best:
                best = c.cost
        ties = sorted(r for r, c in evaluated.items() if c.cost == best)
        idle_ties = idle_count if idle_cost is not None and idle_cost.cost == best else 0
        total = len(ties) + idle_ties
        draw = 0 if total == 1 else self._rng.randrange(total)
        if not idle_ties:
            chosen = evaluated[ties[draw]]
        else:
            assert idle_cost is not None
            r = order.idle_rank_at(draw, excluded, ties)
            chosen = evaluated[r] if r in evaluated else replace(idle_cost, worker=workers[r])
            evaluated[r] = chosen
        return chosen, tuple(evaluated[r] for r in sorted(evaluated))

    # --- fleet-sized decisions under the timing model ----------------------------------------------

    def _timed_load_order(self, now_ms: float) -> TimedLoadOrder:
        """The timing model's order, rebuilt after a change of workers, config or shared pass-time
        model (which every worker nothing was learned of predicts with)."""
        order = self._order
        shared = self.sequences.shared_timing()
        if (
            not isinstance(order, TimedLoadOrder)
            or self._order_config is not self.config
            or self._order_timing is not shared
        ):
            order = self._order = TimedLoadOrder(self._workers)
            self._order_config, self._order_timing = self.config, shared
            self._order_now_ms = now_ms
            for worker in self._workers:
                self._reorder_timed(order, worker)
        return order

    def _reorder_timed(self, order: TimedLoadOrder, worker: Worker) -> None:
        """Classify `worker` under the timing model (see `_timed_choice` for the bounds).

        With u the prompt's uncached tokens, n its passes and pi(u) its prefill alone on the
        configured model (P its pass time), a worker predicting with a model s times the configured
        one (every worker's model is the configured one scaled, `PrefillTiming.scaled`, so s is the
        ratio of the linear parts, kept above 0 by validation), paying a decode part dp each pass
        now and, while its prompt stream runs, sd per pass of the stream, predicts at least
          done (no stream, for good): dp / 2 + s pi(u) + n dp    >= pi(u) (s + dp / P(budget))
          stream running:            (end of pass - now) + its prefill of (stream rest + u) tokens
                                                                  >= pi(u) (s + sd / P(budget))
        since n >= pi(u) / P(budget) and the prefill grows with its tokens. While the stream runs it
        also predicts at least (end of stream - now) + s * linear ms * u (the marginal time of u
        more tokens). Done and nothing decoding, the prediction is the same computation for every
        worker with the same model: an idle class.
        """
        rank = order.rank.get(worker)
        if rank is None:
            return
        cfg, seqs = self.config, self.sequences
        if self._busy(cfg, worker):
            order.set_busy(rank)
            return
        now = self._clock() * 1000.0
        self._order_now_ms = max(self._order_now_ms, now)
        timeline = seqs.timeline(worker)
        timing = timeline.timing if timeline is not None else seqs.timing(worker)
        base = seqs.prefill_timing
        scale = timing.prefill_linear_ms / base.prefill_linear_ms
        full_pass = base.prefill_ms(base.max_num_batched_tokens)
        dp = seqs.decode_part_ms(worker)
        if timeline is not None and not timeline.finished_by(now):
            sd = timeline.stream_decode_ms
            key = scale + min(sd, dp) / full_pass
            end = timeline.end_ms(now)
            slack = abs(end) * 1e-12 + 1e-6
            order.set_key(rank, key, (end - slack, timing.prefill_linear_ms), end + slack)
        elif dp == 0:
            order.set_class(rank, timing, scale)
        else:
            order.set_key(rank, scale + dp / full_pass, None, None)

    def _timed_choice(
        self, cfg: RouterConfig, block_keys: Sequence[int], isl: int, overlaps: Mapping[Worker, float]
    ) -> tuple[WorkerCost, tuple[WorkerCost, ...]] | None:
        """The full scan's choice at temperature 0 under the timing model: the matching workers, one
        worker per idle class and the keyed workers, both in bound order, while the bound (turned
        into a cost by the cost's own monotone steps) does not exceed the best exact cost found.
        Every worker whose cost equals the lowest is thus evaluated or in an evaluated class; the
        ties are drawn over them in worker order, as the full scan draws. None when the full scan
        must decide (no eligible worker, or a clock that went back).
        """
        now = self._clock() * 1000.0
        if now < self._order_now_ms:
            return None  # the bounds hold from the clock they were made at on
        order = self._timed_load_order(now)
        workers = order.workers
        for r in order.due(now):
            self._reorder_timed(order, workers[r])
        self._order_now_ms = now
        if not len(order):
            return None
        seqs = self.sequences
        bs, weight = cfg.block_size, cost_weight(cfg)
        rank = order.rank
        matching = {rank[w] for w in overlaps if w in rank}
        if seqs.track_active_blocks and seqs.assume_kv_reuse:
            matching.update(rank[w] for w in seqs.holders_of(block_keys) if w in rank)
        evaluated: dict[int, WorkerCost] = {}
        excluded: list[int] = []  # class members evaluated apart (they match)
        for r in matching:
            if order.is_busy(r):
                continue
            if order.class_id(r) is not None:
                excluded.append(r)
            w = workers[r]
            evaluated[r] = self._cost(seqs.potential_load(w, block_keys, isl, overlaps.get(w, 0)), bs, weight)
        best = min((c.cost for c in evaluated.values()), default=math.inf)
        base = seqs.prefill_timing
        alone = base.prompt_ms(isl)  # at least one token's prefill, as every prediction counts
        ms_per_token = base.ms_per_token

        def bound(ms: float) -> float:  # a lower bound of a time as a cost (float error: the slack)
            return weight * max(0.0, round(ms * (1.0 - _BOUND_SLACK) / ms_per_token) / bs)

        class_costs: dict[int, WorkerCost] = {}
        for key, cid in order.class_keys:
            if bound(key * alone) > best:
                break
            some = next((r for r in order.classes[cid] if r not in matching), None)
            if some is None:
                continue
            c = self._cost(seqs.potential_load(workers[some], block_keys, isl, 0), bs, weight)
            class_costs[cid] = c
            best = min(best, c.cost)
        streams = order.streams
        for key, r in order.keyed:
            if bound(key * alone) > best:
                break
            if r in matching:
                continue
            w = workers[r]
            stream = streams.get(r)
            if stream is not None and bound(stream[0] - now + stream[1] * isl) > best:
                timeline = seqs.timeline(w)
                if timeline is not None and timeline.running_at(now):
                    continue
            c = self._cost(seqs.potential_load(w, block_keys, isl, 0), bs, weight)
            evaluated[r] = c
            best = min(best, c.cost)
        ties = sorted(r for r, c in evaluated.items() if c.cost == best)
        tied = [cid for cid, c in class_costs.items() if c.cost == best]
        lists = [order.classes[cid] for cid in tied]
        gone = sorted(r for r in excluded if order.class_id(r) in tied)
        total = len(ties) + sum(len(m) for m in lists) - len(gone)
        draw = 0 if total == 1 else self._rng.randrange(total)
        if not lists:
            chosen = evaluated[ties[draw]]
        else:
            r = order.rank_at(draw, lists, gone, ties)
            if r in evaluated:
                chosen = evaluated[r]
            else:
                member_of = order.class_id(r)
                assert member_of is not None
                chosen = evaluated[r] = replace(class_costs[member_of], worker=workers[r])
        for c in class_costs.values():
            evaluated.setdefault(rank[c.worker], c)
        return chosen, tuple(evaluated[r] for r in sorted(evaluated))

    @staticmethod
    def _cost(load: WorkerLoad, block_size: int, weight: float) -> WorkerCost:
        return compute_costs((load,), block_size, weight)[0]

    def _best_overlap(self, overlaps: OverlapScores, candidates: list[Worker], every_worker: bool) -> int:
        """The largest overlap among the candidates (every registered worker: only the matching)."""
        if not overlaps:
            return 0
        if every_worker:
            order = self._order
            known = order.rank if order is not None else set(candidates)
            return max((n for w, n in overlaps.items() if w in known), default=0)
        return max((overlaps.get(w, 0) for w in candidates), default=0)

    def add_request(
        self,
        request_id: str,
        worker: Worker,
        local_hashes: Sequence[int],
        isl: int,
        overlap_blocks: int,
        *,
        expected_output_tokens: int | None = None,
    ) -> None:
        """Track a request routed elsewhere (another replica's decision), as `best_worker` would."""
        if worker.worker_id not in self._specs:
            return  # a worker this replica does not route to
        self._track(
            request_id,
            worker,
            local_hashes,
            self._block_keys(local_hashes),
            isl,
            overlap_blocks,
            expected_output_tokens,
            learn=False,  # its decision time reaches this replica late: no speed to learn from it
        )

    def _track(
        self,
        request_id: str,
        worker: Worker,
        local_hashes: Sequence[int],
        block_keys: Sequence[int],
        isl: int,
        overlap: float,
        expected_output_tokens: int | None,
        *,
        learn: bool = True,
    ) -> None:
        seq_hashes = block_keys if block_keys is not local_hashes else None
        self.sequences.add_request(
            request_id,
            worker,
            block_keys,
            isl,
            overlap,
            expected_output_tokens=expected_output_tokens,
            learn=learn,
        )
        if worker not in self._event_fed:
            self.approx.record_routing(worker, local_hashes, self._clock(), seq_hashes=seq_hashes)

    def get_potential_loads(
        self,
        tokens: TokenIds,
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        allowed_workers: WorkerFilter | None = None,
        config_override: RouterConfigOverride | None = None,
        found: OverlapScores | None = None,
    ) -> list[WorkerLoad]:
        """Per worker: prefill tokens and decode blocks if the request went there, and its overlap."""
        cfg = self.config.merged(config_override)
        local_hashes = self.block_hashes(tokens, lora_name=lora_name, cache_salt=cache_salt)
        keys, overlaps = self._block_keys(local_hashes), self._overlaps(cfg, local_hashes, found)
        return self._loads(self._candidates(allowed_workers), keys, len(tokens), overlaps)

    def find_matches(self, local_hashes: Sequence[int]) -> OverlapScores:
        """Each worker's cached leading blocks of `local_hashes` (expired predictions dropped first)."""
        if len(self.approx):
            self.approx.expire(self._clock())
        return self.indexer.find_matches(local_hashes)

    # --- admission ---------------------------------------------------------------------------

    def has_capacity(
        self,
        *,
        allowed_workers: WorkerFilter | None = None,
        pinned_worker: Worker | WorkerId | None = None,
    ) -> bool:
        """Whether a request may be decided now rather than queued (REFERENCE section 5).

        True when some candidate is under every busy threshold and, with a queue threshold t,
        has active prefill tokens <= t * max_num_batched_tokens. Without workers: True (the
        decision itself answers NoWorkers).
        """
        cfg = self.config
        try:
            candidates = self._candidates(allowed_workers)
        except NoWorkers:
            return True
        if pinned_worker is not None:
            candidates = [
                w
                for w in candidates
                if w == pinned_worker
                or (not isinstance(pinned_worker, Worker) and w.worker_id == pinned_worker)
            ] or candidates
        threshold = cfg.router_queue_threshold
        for worker in candidates:
            if self._busy(cfg, worker):
                continue
            if threshold is None:
                return True
            limit = threshold * self._specs[worker.worker_id].max_num_batched_tokens
            if self.sequences.prefill_tokens(worker) <= limit:
                return True
        return False

    def thresholds(self) -> dict[str, float | int | None]:
        """The busy thresholds in force (None = unset)."""
        names = ("decode_blocks_threshold", "prefill_tokens_threshold", "prefill_tokens_threshold_frac")
        return {f"active_{name}": getattr(self.config, f"active_{name}") for name in names}

    def set_thresholds(self, **values: float | int | None) -> dict[str, float | int | None]:
        """Change busy thresholds at run time (only the names given); returns the full record.

        Raises InvalidConfig for an unknown name or a value out of range; nothing changes then.
        """
        known = self.thresholds()
        for name in values:
            if name not in known:
                raise InvalidConfig(name, values[name], "one of " + ", ".join(known))
        changes: dict[str, Any] = dict(values)  # names checked above, values by RouterConfig itself
        self.config = replace(self.config, **changes)
        return self.thresholds()

    # --- lifecycle ---------------------------------------------------------------------------

    def mark_prefill_complete(self, request_id: str, *, at_first_token: bool = True) -> bool:
        """The first token came back: the request's prompt no longer loads prefill. Pass
        `at_first_token=False` when the call comes later (a non-streamed answer, seen only when
        whole): its time then teaches the learned pass-time model nothing."""
        return self.sequences.mark_prefill_complete(request_id, at_first_token=at_first_token)

    def add_output_tokens(self, request_id: str, count: int, *, sequences: int = 1) -> None:
        """`count` more tokens generated per sequence, of `sequences` (output-block tracking only)."""
        self.sequences.add_output_tokens(request_id, count, sequences=sequences)

    def free(self, request_id: str) -> bool:
        """The request ended (done, failed or cancelled); idempotent."""
        return self.sequences.free(request_id)

    def is_idle(self) -> bool:
        return self.sequences.is_idle()

    # --- internals ---------------------------------------------------------------------------

    def _candidates(self, allowed: WorkerFilter | None) -> list[Worker]:
        if not self._workers:
            raise NoWorkers()
        if allowed is None:
            return self._workers
        picked = [w for w in self._workers if w in allowed or w.worker_id in allowed]
        if not picked:
            raise NoWorkers("no registered worker is allowed for this request")
        return picked

    def _resolve_pinned(self, pinned: Worker | WorkerId, candidates: list[Worker]) -> Worker:
        for w in candidates:
            if _is(w, pinned):
                return w
        raise PinnedWorkerUnavailable(pinned, "unknown or not allowed")

    def _block_keys(self, local_hashes: Sequence[int]) -> Sequence[int]:
        cfg = self.config
        if not (cfg.router_track_active_blocks and cfg.router_assume_kv_reuse):
            return local_hashes  # only their count matters
        return compute_sequence_hashes(local_hashes)

    def _overlaps(
        self, cfg: RouterConfig, local_hashes: Sequence[int], found: OverlapScores | None = None
    ) -> OverlapScores | TierMatch:
        """Each worker's cached blocks (`found`, else the device tree's), plus lower tiers' if any."""
        if cfg.mode not in KV_RULES or cfg.overlap_score_weight == 0 or not local_hashes:
            return {}
        found, tiers = self.find_matches(local_hashes) if found is None else found, self.tiers
        if not tiers.active:
            return found
        return tiers.credit(
            self.indexer, local_hashes, found, cfg.host_cache_hit_weight, cfg.disk_cache_hit_weight
        )

    def _device_of(self, worker: Worker) -> str:
        return self._specs[worker.worker_id].device

    def _busy(self, cfg: RouterConfig, worker: Worker) -> bool:
        if (
            cfg.active_decode_blocks_threshold is None
            and cfg.active_prefill_tokens_threshold is None
            and cfg.active_prefill_tokens_threshold_frac is None
        ):
            return False
        spec = self._specs[worker.worker_id]
        return is_busy(
            decode_blocks=self.sequences.decode_blocks(worker),
            prefill_tokens=self.sequences.prefill_tokens(worker),
            total_blocks=spec.total_blocks,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            decode_blocks_threshold=cfg.active_decode_blocks_threshold,
            prefill_tokens_threshold=cfg.active_prefill_tokens_threshold,
            prefill_tokens_threshold_frac=cfg.active_prefill_tokens_threshold_frac,
            reported_kv_usage=self.reported.fresh_kv_usage(worker) if len(self.reported) else None,
        )

    def _loads(
        self, workers: Sequence[Worker], block_keys: Sequence[int], isl: int, overlaps: Mapping[Worker, float]
    ) -> list[WorkerLoad]:
        seqs = self.sequences  # the prefill load model decides how loads are counted
        return [seqs.potential_load(w, block_keys, isl, overlaps.get(w, 0)) for w in workers]


def _is(worker: Worker, ref: Worker | WorkerId) -> bool:
    return worker == ref or (not isinstance(ref, Worker) and worker.worker_id == ref)


def _worker_order(worker: Worker) -> tuple[str, str, int]:
    return (type(worker.worker_id).__name__, str(worker.worker_id), worker.dp_rank)
