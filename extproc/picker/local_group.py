"""LocalGroup: this process's workers as a router group. Every local decision is made here.

A plain deployment is one local group; a hierarchical one probes it beside remote groups, and
`--group-api-port` serves it to other pickers (`extproc.groups.servicer`). Whichever way a request
comes, the decision is the same, so no feature depends on the mode:

- candidates: the workers of the request's model that every endpoint restriction allows (subset
  hint, conformance header), without the ones outlier ejection took out;
- disaggregated models: the decode worker, then the prefill worker among the healthy ones (or
  prefill on the decode worker), named in the prefill header;
- a preferred worker (the probed one, or a sticky session's) takes the request when it is
  eligible; otherwise the group decides again and says so (`redecided`);
- request ids are the caller's, extended with `@n` while another in-flight request uses it;
- listeners (replica sync) hear of each tracked request's route, first token and end;
- the response status each worker gave feeds outlier ejection (`answered`).

Probes change no state. Errors are the decision's own (UnknownModel, NoEligibleWorker, NoWorkers,
AllWorkersBusy); the selector reads them as a remote group's refusals. Runs on the event loop:
its async methods await nothing, so a local decision is as cheap as a direct call, except with a
KV indexer (`--kv-indexer-url`): then `fetch_overlaps` asks it for the prompt's cached blocks
first (the async methods do), and the synchronous ones decide with that answer (`decides_now` is
False: the selector awaits).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import count
from typing import Protocol

from extproc.config import PickerConfig, WorkerConfig
from extproc.epp.answers import endpoint_matches
from extproc.errors import NoEligibleWorker, UnknownModel
from extproc.events.kv_indexer import KvIndexerClient
from extproc.groups.types import (
    GroupChoice,
    GroupDecision,
    GroupLoad,
    GroupLoads,
    GroupProbe,
    GroupRequest,
    GroupWorkerLoad,
)
from extproc.picker.metrics import PickMetrics
from extproc.picker.outlier import OutlierEjection
from extproc.picker.pools import ModelPool, specs
from extproc.picker.prefill_health import WorkerHealth
from extproc.router import Decision, DisaggDecision, KvRouter, OverlapScores, Worker, WorkerId
from extproc.router.router import KV_RULES

log = logging.getLogger("extproc.picker")

_ROLE_NAMES = {"prefill": "prefill", "decode": "decode", "both": "aggregated"}
MAX_FETCHED = 4096  # requests whose KV indexer answer is held between their probe and their commit
FETCHED_FOR_S = 0.1  # an answer older than this is asked again (a request that waited in the queue)


@dataclass(frozen=True, slots=True)
class Routed:
    """A request this group tracks: where it went (what listeners hear)."""

    request_id: str
    model: str
    worker: Worker
    overlap_blocks: int
    prefill_worker: Worker | None = None  # set: the prompt is prefilled there, not on `worker`
    prefill_overlap_blocks: int = 0  # the prompt's blocks cached on the prefill worker


class RouteListener(Protocol):
    """Told about every tracked request's lifecycle (replica sync publishes these to other replicas).

    A request prefilled on a prefill worker (`Routed.prefill_worker` set) is two loads from its
    routing on: its prompt on the prefill worker, and its decode on `worker`, where the prompt is not
    work. `on_prefill_complete` then means its prompt left the prefill worker (the first token).
    """

    def on_routed(
        self, routed: Routed, local_hashes: Sequence[int], isl: int, expected_output_tokens: int | None
    ) -> None: ...

    def on_prefill_complete(self, routed: Routed) -> None: ...

    def on_freed(self, routed: Routed) -> None: ...


class LocalGroup:
    """A router group over this process's model pools."""

    def __init__(
        self,
        name: str,
        pools: Mapping[str, ModelPool],
        *,
        config: PickerConfig,
        clock: Callable[[], float],
        metrics: PickMetrics,
        listeners: list[RouteListener],
        weight: float = 1.0,
        kv_indexer: KvIndexerClient | None = None,
    ) -> None:
        self._name = name
        self._weight = weight
        self.pools = pools
        self.config = config
        self._clock = clock
        self.metrics = metrics
        self.listeners = listeners
        self.outliers = OutlierEjection(
            consecutive=config.outlier_consecutive_5xx, base_s=config.outlier_base_ejection_s
        )
        self.prefill_health = WorkerHealth(
            lambda: {wid: w.endpoint for p in self.pools.values() for wid, w in p.prefill_workers.items()},
            interval_s=config.disagg.prefill_health_interval_s,
        )
        self._tracked: dict[str, Routed] = {}
        self._ids = count(1)
        self._hashes: tuple[GroupRequest, int, list[int]] | None = None  # a probe's hashes, for its commit
        self.kv_indexer = kv_indexer
        # the indexer's answer per request being decided, and when (by identity; the request is held)
        self._found: dict[int, tuple[GroupRequest, OverlapScores, float]] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def weight(self) -> float:
        return self._weight

    @property
    def in_process(self) -> bool:
        return True

    @property
    def decides_now(self) -> bool:
        """Whether a decision needs no I/O (no KV indexer to ask): `commit_now` may be called directly."""
        return self.kv_indexer is None

    async def fetch_overlaps(self, request: GroupRequest) -> None:
        """With a KV indexer, ask it for `request`'s cached blocks on each worker, for the decisions
        about this request that follow within `FETCHED_FOR_S` (its probe and commit ask once; after
        a wait in the admission queue it is asked again). Without an answer, those go
        by load alone, as do salted requests: Dynamo 1.6.1's indexer hashes vLLM's blocks without
        their salt, so a salted prompt matches nothing there, or blocks the engine will not share
        with it (tests/events/test_kv_indexer.py). Raises nothing."""
        held = self._found.get(id(request))
        if self.kv_indexer is None or (held is not None and self._clock() - held[2] <= FETCHED_FOR_S):
            return
        pool = self.pools.get(request.model)
        if pool is None or pool.router.config.mode not in KV_RULES:
            return
        router = pool.router
        hashes = self._block_hashes(router, request)
        found: OverlapScores | None = {}
        if request.cache_salt is not None:  # its blocks are not told apart by Dynamo 1.6.1's indexer
            self.kv_indexer.counters.add("kv_indexer.salted_by_load")
        elif hashes:
            found = await self.kv_indexer.overlaps(pool.model, router.config.block_size, hashes)
        if len(self._found) >= MAX_FETCHED:  # probed, never committed (another group won): the oldest go
            del self._found[next(iter(self._found))]
        self._found.pop(id(request), None)  # a fresh answer goes last, as the newest
        self._found[id(request)] = (request, found if found is not None else {}, self._clock())

    def _found_for(self, request: GroupRequest) -> OverlapScores | None:
        """What the indexer answered for `request` ({} without an answer); None: no indexer (ours)."""
        if self.kv_indexer is None:
            return None
        held = self._found.get(id(request))
        return held[1] if held is not None else {}

    # --- decisions ---------------------------------------------------------------------------

    async def probe(self, request: GroupRequest, *, timeout_s: float = 0.0) -> GroupProbe:
        await self.fetch_overlaps(request)
        return self.probe_now(request)

    def probe_now(self, request: GroupRequest) -> GroupProbe:
        """Which worker this group would choose, and whether it has room; changes no state."""
        pool = self._pool(request.model)
        router = pool.router
        allowed = self._candidates(pool, request.restrictions)
        decision = router.best_worker_for_hashes(
            self._block_hashes(router, request),
            request.input_tokens,
            config_override=request.overrides,
            allowed_workers=allowed,
            expected_output_tokens=request.expected_output_tokens,
            found=self._found_for(request),
        )
        return GroupProbe(
            self._name,
            _choice(pool, decision),
            group_load(router),
            router.config.block_size,
            has_capacity=router.has_capacity(allowed_workers=allowed),
        )

    async def commit(self, request: GroupRequest, request_id: str, worker: Worker | None) -> GroupDecision:
        await self.fetch_overlaps(request)
        return self.commit_now(request, request_id, worker)

    def commit_now(self, request: GroupRequest, request_id: str, worker: Worker | None) -> GroupDecision:
        """Track the request on `worker` when it is eligible, else on a new decision."""
        pool = self._pool(request.model)
        router = pool.router
        t0 = time.perf_counter_ns()
        hashes = self._block_hashes(router, request)
        hashed = time.perf_counter_ns() - t0
        allowed = self._candidates(pool, request.restrictions)
        tracked_id = self._unique_id(router, request_id)
        preferred = _resolve(router, worker) if worker is not None else None
        split: DisaggDecision | None = None
        if pool.disaggregated:
            split = pool.disagg.route(
                hashes,
                request.input_tokens,
                request_id=tracked_id,
                config_override=request.overrides,
                preferred_worker=preferred,
                allowed_workers=allowed,
                prefill_allowed=self._healthy_prefill(pool),
                expected_output_tokens=request.expected_output_tokens,
                found=self._found_for(request),
            )
            decision = split.decode
        else:
            decision = router.best_worker_for_hashes(
                hashes,
                request.input_tokens,
                request_id=tracked_id,
                config_override=request.overrides,
                preferred_worker=preferred,
                allowed_workers=allowed,
                expected_output_tokens=request.expected_output_tokens,
                found=self._found_for(request),
            )
        self._hashes = None
        self._found.pop(id(request), None)
        choice = _choice(pool, decision, pool.router.sequences.predicted_ttft_ms(tracked_id))
        prefill, prefill_overlap = None, 0
        if split is not None:
            choice, prefill = self._name_prefill_worker(pool, choice, split, tracked_id)
            prefill_overlap = split.prefill.overlap_blocks if split.prefill is not None else 0
        routed = Routed(
            tracked_id, request.model, decision.worker, decision.overlap_blocks, prefill, prefill_overlap
        )
        self._tracked[tracked_id] = routed
        for listener in self.listeners:
            listener.on_routed(routed, hashes, request.input_tokens, request.expected_output_tokens)
        timings = {"hash": hashed, "match": decision.match_ns, "select": decision.select_ns}
        redecided = worker is not None and decision.worker != preferred
        return GroupDecision(self._name, tracked_id, choice, redecided, choice.best_overlap_blocks, timings)

    async def has_capacity(self, request: GroupRequest) -> bool:
        return self.has_capacity_now(request)

    def has_capacity_now(self, request: GroupRequest) -> bool:
        pool = self._pool(request.model)
        return pool.router.has_capacity(allowed_workers=self._candidates(pool, request.restrictions))

    def uncached_tokens(self, request: GroupRequest) -> int:
        """The prompt minus its best cached prefix in this group (the queue's wspt estimate)."""
        pool = self._pool(request.model)
        router = pool.router
        hashes = self._block_hashes(router, request)
        found = self._found_for(request)
        if found is None and hashes:
            found = router.indexer.find_matches(hashes)
        best = max(found.values()) if found else 0
        return max(1, request.input_tokens - best * router.config.block_size)

    async def potential_loads(self, request: GroupRequest) -> GroupLoads:
        await self.fetch_overlaps(request)
        return self.potential_loads_now(request)

    def potential_loads_now(self, request: GroupRequest) -> GroupLoads:
        """Per allowed worker: its load if the request went there, and its overlap. Changes no state."""
        pool = self._pool(request.model)
        router = pool.router
        loads = router.get_potential_loads(
            request.token_ids,
            lora_name=request.lora_name,
            cache_salt=request.cache_salt,
            allowed_workers=self._candidates(pool, request.restrictions),
            config_override=request.overrides,
            found=self._found_for(request),
        )
        workers = tuple(
            GroupWorkerLoad(
                load.worker, pool.endpoint_of(load.worker), load.prefill_tokens, load.decode_blocks,
                load.overlap_blocks,
            )
            for load in loads
        )  # fmt: skip
        return GroupLoads(self._name, workers, group_load(router), router.config.block_size)

    # --- lifecycle ---------------------------------------------------------------------------

    def tracked(self, request_id: str) -> Routed | None:
        return self._tracked.get(request_id)

    def in_flight(self) -> int:
        return len(self._tracked)

    def mark_prefill_complete(self, model: str, request_id: str, *, at_first_token: bool = True) -> None:
        self.first_token(request_id, at_first_token=at_first_token)

    def first_token(self, request_id: str, *, at_first_token: bool = True) -> bool:
        """The request's first token arrived: its prompt is prefilled. False if nothing changed.
        `at_first_token` False: seen later (a non-streamed answer), nothing is learned from its time."""
        routed = self._tracked.get(request_id)
        if routed is None:
            return False
        pool = self.pools[routed.model]
        if routed.prefill_worker is not None:
            # the prefill worker's share ends too; nothing is learned either way (the decode side's
            # prompt was marked complete at the decision)
            changed = pool.disagg.first_token(request_id)
        else:
            changed = pool.router.mark_prefill_complete(request_id, at_first_token=at_first_token)
        if changed:
            for listener in self.listeners:
                listener.on_prefill_complete(routed)
        return changed

    def add_output_tokens(self, model: str, request_id: str, count: int, sequences: int) -> None:
        """Generated tokens of a tracked request: its worker's router adds output blocks (when
        --router-track-output-blocks is on; a disaggregated request's are its decode worker's)."""
        self.output_tokens(request_id, count, sequences)

    def output_tokens(self, request_id: str, count: int, sequences: int) -> bool:
        """`add_output_tokens` for the group API (a remote owner's AddOutputTokens): False if the
        request is not tracked here (any more)."""
        routed = self._tracked.get(request_id)
        if routed is None:
            return False
        self.pools[routed.model].router.add_output_tokens(request_id, count, sequences=sequences)
        return True

    def free(self, model: str, request_id: str) -> None:
        self.finish(request_id)

    def finish(self, request_id: str, status: int | None = None) -> bool:
        """The request ended: give its load back, once. False if it was not tracked (any more).

        `status`: the worker's response status when it comes with the end (a remote owner's Free).
        """
        routed = self._tracked.pop(request_id, None)
        if routed is None:
            return False
        if status:
            self.answered(routed.model, request_id, routed.worker, status)
        pool = self.pools[routed.model]
        if routed.prefill_worker is not None:
            pool.prefill.free(request_id)
        freed = pool.router.free(request_id)
        for listener in self.listeners:  # also when the router had forgotten it: the others still count it
            listener.on_freed(routed)
        return freed

    def answered(self, model: str, request_id: str, worker: Worker, status: int) -> None:
        """The worker's response status: outlier ejection counts failed answers in a row."""
        pool = self.pools.get(model)
        wid = str(worker.worker_id)
        if pool is None or wid not in pool.workers:
            return  # a worker that left
        ejected_s = self.outliers.answered(wid, status, self._clock(), pool.workers)
        if ejected_s is not None:
            self.metrics.ejections.labels(pool.model, wid).inc()
            log.warning("worker %s of %s ejected from routing for %.0f s after %d failed answers in a row",
                        wid, pool.model, ejected_s, self.outliers.consecutive)  # fmt: skip

    async def close(self) -> None:
        await self.prefill_health.stop()

    # --- the worker set ----------------------------------------------------------------------

    def set_workers(
        self, model: str, workers: Sequence[WorkerConfig]
    ) -> tuple[list[WorkerConfig], list[str]]:
        """Make `workers` the model's worker set; returns the configs added or changed and the ids
        removed. A removed worker's cached blocks and in-flight requests are forgotten (their
        streams still end normally; their lifecycle calls then find nothing), and listeners hear
        each forgotten request as freed, so that other replicas forget it too. A removed prefill
        worker's requests stay tracked on their decode worker; only their prefill share goes."""
        pool = self._pool(model)
        wanted = {w.id: w for w in workers}
        current = pool.all_workers()
        removed = [wid for wid in current if wid not in wanted]
        added = [w for wid, w in wanted.items() if current.get(wid) != w]
        moved = [w.id for w in added if w.id in current and current[w.id].role != w.role]
        for wid in [*removed, *moved]:  # gone, or changed between prefill and decode
            old = current[wid]
            dropped = pool.router_for(old).remove_worker(wid)
            if old.role != "prefill":
                for request_id in dropped:
                    if (routed := self._tracked.pop(request_id, None)) is not None:
                        pool.prefill.free(request_id)
                        for listener in self.listeners:
                            listener.on_freed(routed)
            pool.workers.pop(wid, None)
            pool.prefill_workers.pop(wid, None)
            self.outliers.forget(wid)
            if wid in removed:
                log.info("worker %s of %s removed (%d in-flight requests forgotten)",
                         wid, model, len(dropped))  # fmt: skip
        for w in added:  # new, moved, or changed in place (endpoint, dp ranks, capacity)
            pool.router_for(w).add_worker(specs([w])[0])
            (pool.prefill_workers if w.role == "prefill" else pool.workers)[w.id] = w
            log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], w.id, model, w.endpoint)
        return added, removed

    # --- internals ---------------------------------------------------------------------------

    def _pool(self, model: str) -> ModelPool:
        pool = self.pools.get(model)
        if pool is None:
            raise UnknownModel(model, list(self.pools))
        return pool

    def _block_hashes(self, router: KvRouter, request: GroupRequest) -> list[int]:
        # A probe and its commit hash the same prompt: keep the last request's hashes.
        cached = self._hashes
        block_size = router.config.block_size
        if cached is not None and cached[0] is request and cached[1] == block_size:
            return cached[2]
        hashes = (
            router.block_hashes(request.token_ids, lora_name=request.lora_name, cache_salt=request.cache_salt)
            if request.isl is None and len(request.token_ids)
            else []
        )
        self._hashes = (request, block_size, hashes)
        return hashes

    def _candidates(
        self, pool: ModelPool, restrictions: Sequence[Sequence[str]] | None
    ) -> Collection[WorkerId | Worker] | None:
        """The workers every restriction allows, without ejected ones (unless that leaves none)."""
        allowed: set[str] | None = None
        if restrictions is not None:
            allowed = {
                wid
                for wid, w in pool.workers.items()
                if all(endpoint_matches(w.endpoint, r) for r in restrictions)
            }
            if not allowed:
                raise NoEligibleWorker("no worker of this model is in the allowed endpoint subset")
        ejected = self.outliers.ejected(self._clock(), pool.workers)
        if not ejected:
            return allowed
        kept = {wid for wid in (allowed if allowed is not None else pool.workers) if wid not in ejected}
        return kept or allowed

    def _healthy_prefill(self, pool: ModelPool) -> set[str] | None:
        """The prefill workers that may be named (None: all); starts probing on first use."""
        self.prefill_health.start()
        unhealthy = self.prefill_health.unhealthy
        if not unhealthy:
            return None
        return {wid for wid in pool.prefill_workers if wid not in unhealthy}

    def _name_prefill_worker(
        self, pool: ModelPool, choice: GroupChoice, split: DisaggDecision, request_id: str
    ) -> tuple[GroupChoice, Worker | None]:
        """The choice with the prefill worker named in its headers (when one prefills)."""
        self.metrics.disagg(pool.model, split.local_reason)
        if split.prefill is None:
            log.info("%s prefills on its decode worker (%s)", request_id, split.local_reason)
            return choice, None
        endpoint = pool.prefill_workers[str(split.prefill.worker_id)].endpoint
        headers = {**choice.headers, self.config.disagg.prefill_header: endpoint}
        log.info("%s prefills on %s (%s) overlap=%d/%d blocks", request_id, split.prefill.worker, endpoint,
                 split.prefill.overlap_blocks, split.prefill.request_blocks)  # fmt: skip
        named = replace(
            choice, headers=headers, prefill_worker=split.prefill.worker, prefill_endpoint=endpoint
        )
        return named, split.prefill.worker

    def _unique_id(self, router: KvRouter, request_id: str) -> str:
        # no NUL: replica sync shares a prompt on its prefill worker under the id, NUL, "prefill"
        base = request_id.replace("\x00", "\ufffd") or "req"
        tracked = base
        while tracked in self._tracked or tracked in router.sequences:  # replica sync's ids too
            tracked = f"{base}@{next(self._ids)}"
        return tracked


def group_load(router: KvRouter) -> GroupLoad:
    """The router's current load summed over its workers."""
    seqs = router.sequences
    workers = router.workers()
    return GroupLoad(
        workers=len(workers),
        active_requests=len(seqs),
        active_prefill_tokens=sum(seqs.prefill_tokens(w) for w in workers),
        active_decode_blocks=sum(seqs.decode_blocks(w) for w in workers),
    )


def _resolve(router: KvRouter, probed: Worker) -> Worker | None:
    """The router's own Worker for `probed` (ids cross the wire as strings); None when it left."""
    wanted = str(probed.worker_id)
    for worker in router.workers():
        if worker.dp_rank == probed.dp_rank and str(worker.worker_id) == wanted:
            return worker
    return None


def _choice(pool: ModelPool, decision: Decision, predicted_ttft_ms: float | None = None) -> GroupChoice:
    return GroupChoice(
        worker=decision.worker,
        endpoint=pool.endpoint_of(decision.worker),
        headers=pool.extra_headers(decision.worker),
        overlap_blocks=decision.overlap_blocks,
        request_blocks=decision.request_blocks,
        cost=decision.cost,
        best_overlap_blocks=max(decision.best_overlap_blocks, decision.overlap_blocks),
        predicted_ttft_ms=predicted_ttft_ms,
    )
