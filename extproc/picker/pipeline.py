"""EndpointPicker: one request's way from body bytes to a routed worker, and its lifecycle.

Reads top to bottom in request order: parse, find the model's pool, restrict candidates
(subset hint, conformance header), tokenize, hash, route, and name the endpoint. Speaks no
protocol: `service.py` feeds it bytes and headers and turns its `Pick` or its exception into
an ext_proc answer through `epp.py`.

A request whose path is not an OpenAI generation endpoint (GET /v1/models, /health, ...) or
whose tokenization fails is still routed, on load alone; only generation requests are tracked
until `finish`.

With router groups configured (`groups:`), a tokenized request goes to `extproc.groups`'
selector instead of this picker's own router: it probes every group, commits to the best one and
owns the request's lifecycle; the Pick names the group.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Protocol

from extproc.config import PickerConfig, WorkerConfig
from extproc.epp import answers as epp
from extproc.errors import NoEligibleWorker, PromptTooLong, TokenizerUnavailable, UnknownModel
from extproc.groups import GroupCollector, GroupRequest, GroupSelector
from extproc.picker.admission import AdmissionGate
from extproc.picker.metrics import PickMetrics
from extproc.picker.outlier import OutlierEjection
from extproc.picker.prefill_health import WorkerHealth
from extproc.request.parse import ROUTABLE_PATHS, ParsedRequest, parse_openai_body
from extproc.request.tokenizer import RequestTokenizer
from extproc.router import (
    Decision,
    DisaggDecision,
    DisaggRouter,
    KvRouter,
    QueuedRequest,
    RouterConfigOverride,
    SessionPins,
    Worker,
    WorkerSpec,
    prefill_router_config,
)

log = logging.getLogger("extproc.picker")

DP_RANK_HEADER = "x-data-parallel-rank"  # vLLM's header for pinning a data-parallel rank
SESSION_HEADER = "x-session-id"  # sticky session, when the body has no nvext.session_control


@dataclass(slots=True)
class Pick:
    """A routed request: where it goes and what the router tracks for it."""

    request_id: str  # the router's id (unique while in flight)
    model: str
    worker: Worker
    endpoint: str
    headers: dict[str, str]
    overlap_blocks: int = 0
    request_blocks: int = 0
    tracked: bool = False
    timings_ns: dict[str, int] = field(default_factory=dict)
    session_id: str | None = None
    queued_s: float = 0.0  # time spent in the admission queue
    group: str | None = None  # the router group that owns the request (hierarchical mode)
    prefill_worker: Worker | None = None  # disaggregated: the worker that prefills the prompt
    prefill_endpoint: str | None = None  # its ip:port (also in `headers` under the prefill header)


class WorkerSetListener(Protocol):
    """Told when a model's workers change at run time (discovery, config reload)."""

    def on_workers_changed(
        self, model: str, added: Sequence[WorkerConfig], removed: Sequence[str]
    ) -> None: ...


class PickListener(Protocol):
    """Told about every tracked request's lifecycle (replica sync publishes these to other replicas)."""

    def on_routed(
        self,
        pick: Pick,
        local_hashes: Sequence[int],
        isl: int,
        expected_output_tokens: int | None,
    ) -> None: ...

    def on_prefill_complete(self, pick: Pick) -> None: ...

    def on_freed(self, pick: Pick) -> None: ...


@dataclass(slots=True)
class ModelPool:
    """The workers serving one model, their routers and their tokenizer.

    `router` chooses among the decode and aggregated workers (`workers`): the HTTP destination.
    `prefill` holds the prefill workers (`prefill_workers`); while it has any, requests go
    through `disagg`, which chooses the prefill worker too (or prefills on the decode worker).
    """

    model: str
    router: KvRouter
    tokenizer: RequestTokenizer
    workers: dict[str, WorkerConfig]
    gate: AdmissionGate
    sessions: SessionPins
    prefill: KvRouter
    disagg: DisaggRouter
    prefill_workers: dict[str, WorkerConfig] = field(default_factory=dict)

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill_workers)

    def endpoint_of(self, worker: Worker) -> str:
        wid = str(worker.worker_id)
        config = self.workers.get(wid) or self.prefill_workers[wid]
        return config.endpoint

    def router_for(self, worker: WorkerConfig) -> KvRouter:
        """The router that tracks this worker: the prefill router for prefill workers."""
        return self.prefill if worker.role == "prefill" else self.router

    def routers(self) -> tuple[KvRouter, KvRouter]:
        return self.router, self.prefill

    def all_workers(self) -> dict[str, WorkerConfig]:
        return {**self.workers, **self.prefill_workers}


class EndpointPicker:
    """Chooses a worker for each request and keeps the routers' load picture true."""

    def __init__(
        self,
        config: PickerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._rng = rng or random.Random(config.seed)
        self._ids = count(1)
        self.metrics = PickMetrics()
        self.listeners: list[PickListener] = []
        self.worker_listeners: list[WorkerSetListener] = []
        self._pools: dict[str, ModelPool] = {}
        for model in config.models:
            served = [w for w in config.workers if w.model == model.name]
            workers = {w.id: w for w in served if w.role != "prefill"}
            prefill_workers = {w.id: w for w in served if w.role == "prefill"}
            router = KvRouter(
                config.router,
                clock=clock,
                rng=self._rng,
                workers=_specs(workers.values()),
                timer=time.perf_counter_ns,
            )
            prefill = KvRouter(
                prefill_router_config(config.router),
                clock=clock,
                rng=self._rng,
                workers=_specs(prefill_workers.values()),
                timer=time.perf_counter_ns,
            )
            disagg = DisaggRouter(router, prefill, config.disagg.policy)
            remote = model.tokenize_url or config.tokenize_url
            if remote == "worker":
                any_worker = next(iter({**workers, **prefill_workers}.values()), None)
                remote = f"http://{any_worker.endpoint}" if any_worker else None
            tokenizer = RequestTokenizer.from_settings(
                local_path=model.tokenizer or config.tokenizer,
                remote_url=remote,
                model=model.name,
                timeout_s=config.tokenizer_timeout_s,
                cache_size=config.tokenizer_cache_size,
            )
            gate = AdmissionGate(router, max_wait_s=config.queue_max_wait_s, clock=clock)
            sessions = SessionPins(config.session_ttl_s)
            self._pools[model.name] = ModelPool(
                model.name, router, tokenizer, workers, gate, sessions, prefill, disagg, prefill_workers
            )
            if prefill_workers:
                log.info(
                    "%s: disaggregated serving with %d prefill and %d decode workers",
                    model.name, len(prefill_workers), len(workers),
                )  # fmt: skip
        self.prefill_health = WorkerHealth(
            lambda: {wid: w.endpoint for p in self._pools.values() for wid, w in p.prefill_workers.items()},
            interval_s=config.disagg.prefill_health_interval_s,
        )
        self.outliers = OutlierEjection(
            consecutive=config.outlier_consecutive_5xx, base_s=config.outlier_base_ejection_s
        )
        self.groups: GroupSelector | None = None  # hierarchical mode: every tracked request goes through it
        if config.groups.groups:
            self.groups = GroupSelector.from_config(config.groups, self._pools, rng=self._rng)
            self.metrics.registry.register(GroupCollector(self.groups.metrics))

    @property
    def may_queue(self) -> bool:
        """Whether a request can wait in an admission queue (`--router-queue-threshold` is set)."""
        return any(pool.gate.enabled for pool in self._pools.values())

    @property
    def pools(self) -> Mapping[str, ModelPool]:
        return self._pools

    def routers_by_worker(self) -> dict[str, KvRouter]:
        """Each configured worker id's router (one router per model)."""
        return {
            wid: pool.router_for(w) for pool in self._pools.values() for wid, w in pool.all_workers().items()
        }

    def set_workers(self, model: str, workers: Sequence[WorkerConfig]) -> tuple[list[str], list[str]]:
        """Make `workers` the model's worker set; returns the ids added and removed.

        A changed worker (new endpoint, dp ranks or capacity) is updated in place. A removed worker's
        cached blocks and in-flight requests are forgotten (their streams still end normally).
        """
        pool = self._pools.get(model)
        if pool is None:
            raise UnknownModel(model, list(self._pools))
        wanted = {w.id: w for w in workers}
        current = pool.all_workers()
        removed = [wid for wid in current if wid not in wanted]
        added = [w for wid, w in wanted.items() if current.get(wid) != w]
        moved = [w.id for w in added if w.id in current and current[w.id].role != w.role]
        for wid in [*removed, *moved]:  # gone, or changed between prefill and decode
            old = current[wid]
            dropped = pool.router_for(old).remove_worker(wid)
            pool.workers.pop(wid, None)
            pool.prefill_workers.pop(wid, None)
            pool.sessions.drop_worker(wid)
            self.outliers.forget(wid)
            if wid in removed:
                log.info("worker %s of %s removed (%d in-flight requests forgotten)",
                         wid, model, len(dropped))  # fmt: skip
        for w in added:  # new, moved, or changed in place (endpoint, dp ranks, capacity)
            pool.router_for(w).add_worker(_specs([w])[0])
            (pool.prefill_workers if w.role == "prefill" else pool.workers)[w.id] = w
            log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], w.id, model, w.endpoint)
        if added or removed:
            for listener in self.worker_listeners:
                listener.on_workers_changed(model, added, removed)
            pool.gate.kick()
        return [w.id for w in added], removed

    def set_thresholds(self, model: str, **values: float | int | None) -> dict[str, float | int | None]:
        """Change a model's busy thresholds at run time; returns its full record (see KvRouter)."""
        pool = self._pools.get(model)
        if pool is None:
            raise UnknownModel(model, list(self._pools))
        record = pool.router.set_thresholds(**values)
        log.info("busy thresholds of %s: %s", model, record)
        pool.gate.kick()  # looser thresholds can release queued requests
        return record

    async def close(self) -> None:
        if self.groups is not None:
            await self.groups.close()
        await self.prefill_health.stop()
        for pool in self._pools.values():
            await pool.gate.close()
            await pool.tokenizer.close()

    def is_idle(self) -> bool:
        """No request is tracked anywhere and every load counter is back at zero."""
        groups_idle = self.groups is None or self.groups.in_flight() == 0
        return groups_idle and all(pool.disagg.is_idle() for pool in self._pools.values())

    async def pick(
        self,
        *,
        body: bytes | None,
        path: str,
        headers: Mapping[str, str],
        subset: list[str] | None,
        client_request_id: str,
        on_queued: Callable[[float], None] | None = None,
        override: RouterConfigOverride | None = None,
    ) -> Pick:
        """Route one request. Raises PickerError or RouterError subclasses (mapped by `epp`).

        `on_queued(max_wait_s)` is called if the request has to wait in the admission queue.
        `override` replaces the body's `nvext.agent_hints` overlap weight and temperature (callers
        of the Python client; Envoy traffic has none).
        """
        timings: dict[str, int] = {}
        t0 = time.perf_counter_ns()
        if body is None or path.partition("?")[0] not in ROUTABLE_PATHS:
            if self.groups is not None:
                return await self._pick_in_groups(None, None, subset, headers, client_request_id, timings)
            return self._pick_untracked(path, headers, subset)
        request = parse_openai_body(body, path, max_bytes=self.config.max_body_bytes)
        t1 = time.perf_counter_ns()
        timings["parse"] = t1 - t0
        pool = self._pools.get(request.model)
        if pool is None:
            raise UnknownModel(request.model, list(self._pools))
        allowed = self._routable(pool, self._allowed(pool, subset, headers)) if self.groups is None else None

        tokens: list[int] | None
        try:
            tokens = await pool.tokenizer.tokenize(request)
        except TokenizerUnavailable as exc:
            log.warning("tokenizer failed for %s (%s): routing on load only", client_request_id, exc.message)
            tokens = None
        t2 = time.perf_counter_ns()
        timings["tokenize"] = t2 - t1
        limit = self.config.max_prompt_tokens
        if limit is not None and tokens is not None and len(tokens) > limit:
            raise PromptTooLong(len(tokens), limit)
        if self.groups is not None:
            return await self._pick_in_groups(request, tokens, subset, headers, client_request_id, timings)

        router = pool.router
        if tokens is None:
            override = _override(request, load_only=True)
        elif override is None:
            override = _override(request, load_only=False)
        hashes = (
            router.block_hashes(tokens, lora_name=request.lora_name, cache_salt=request.cache_salt)
            if tokens
            else []
        )
        t3 = time.perf_counter_ns()
        timings["hash"] = t3 - t2
        request_id = self._request_id(router, client_request_id)
        isl = len(tokens) if tokens is not None else max(1, request.body_size // 4)
        expected_output = _expected_output(request)
        session_id = request.session_id or headers.get(SESSION_HEADER) or None
        pinned = pool.sessions.get(session_id, self._clock()) if session_id else None

        split: list[DisaggDecision] = []  # a disaggregated model's two-stage decision

        def decide() -> Decision:  # a session's worker takes it when it can (no cost comparison)
            if pool.disaggregated:
                split.append(
                    pool.disagg.route(
                        hashes,
                        isl,
                        request_id=request_id,
                        config_override=override,
                        preferred_worker=pinned,
                        allowed_workers=allowed,
                        prefill_allowed=self._healthy_prefill(pool),
                        expected_output_tokens=expected_output,
                    )
                )
                return split[-1].decode
            return router.best_worker_for_hashes(
                hashes,
                isl,
                request_id=request_id,
                config_override=override,
                preferred_worker=pinned,
                allowed_workers=allowed,
                expected_output_tokens=expected_output,
            )

        entry = QueuedRequest(
            request_id,
            self._clock(),
            new_tokens=isl,
            priority=_priority(request),
            latency_sensitivity=_latency_sensitivity(request),
            sheddable=_sheddable(request),
        )

        def new_tokens() -> int:  # the prompt minus its best cached prefix
            best = max(router.indexer.find_matches(hashes).values(), default=0) if hashes else 0
            return max(1, isl - best * router.config.block_size)

        decision, waited_s = await pool.gate.admit(
            entry, decide, allowed=allowed, on_queued=on_queued, new_tokens=new_tokens
        )
        timings["queue"] = int(waited_s * 1e9)
        timings["match"] = decision.match_ns
        timings["select"] = decision.select_ns
        self._update_session(pool, request, session_id, pinned, decision.worker)
        pick = Pick(
            request_id=request_id,
            model=request.model,
            worker=decision.worker,
            endpoint=pool.endpoint_of(decision.worker),
            headers=_extra_headers(pool, decision.worker),
            overlap_blocks=decision.overlap_blocks,
            request_blocks=decision.request_blocks,
            tracked=True,
            timings_ns=timings,
            session_id=session_id,
            queued_s=waited_s,
        )
        disagg_note = ""
        if split:
            disagg_note = self._name_prefill_worker(pool, pick, split[-1])
        self.metrics.observe_stages(timings)
        self.metrics.routed(request.model, decision.overlap_blocks, decision.best_overlap_blocks)
        log.info(
            "routed %s model=%s to %s (%s) overlap=%d/%d blocks (best %d) cost=%.1f%s%s",
            client_request_id,
            request.model,
            decision.worker,
            pick.endpoint,
            decision.overlap_blocks,
            decision.request_blocks,
            decision.best_overlap_blocks,
            decision.cost,
            f" session={session_id}" if session_id else "",
            f" queued {waited_s * 1000:.0f} ms" if waited_s else "",
        )
        if disagg_note:
            log.info("%s %s", client_request_id, disagg_note)
        for listener in self.listeners:
            listener.on_routed(pick, hashes, isl, expected_output)
            if pick.prefill_worker is not None:  # its prompt is not the decode worker's work
                listener.on_prefill_complete(pick)
        return pick

    def first_token(self, pick: Pick) -> None:
        """The first response chunk arrived: the prompt is prefilled."""
        if pick.group is not None and self.groups is not None:
            self.groups.first_token(pick.request_id)
            return
        pool = self._pools[pick.model]
        if not pick.tracked:
            return
        if pick.prefill_worker is not None:  # the prefill worker's share ends too
            changed = pool.disagg.first_token(pick.request_id)
        else:
            changed = pool.router.mark_prefill_complete(pick.request_id)
        if changed:
            for listener in self.listeners:
                listener.on_prefill_complete(pick)
            pool.gate.kick()

    def finish(self, pick: Pick, cause: str) -> None:
        """The stream ended (complete, error status, reset, cancel); frees the request once."""
        if pick.group is not None and self.groups is not None:
            if pick.tracked:
                self.groups.finish(pick.request_id, cause)
                self.metrics.finished(pick.model, cause)
            return
        pool = self._pools[pick.model]
        if pick.tracked and pick.prefill_worker is not None:
            pool.prefill.free(pick.request_id)
        if pick.tracked and pool.router.free(pick.request_id):
            log.debug("freed %s (%s)", pick.request_id, cause)
            self.metrics.finished(pick.model, cause)
            for listener in self.listeners:
                listener.on_freed(pick)
            pool.gate.kick()

    def answered(self, pick: Pick, status: int) -> None:
        """The worker's response status arrived: count it, and feed outlier ejection with it."""
        worker = str(pick.worker.worker_id)
        before, after = self.metrics.upstream_answered(pick.model, worker, status)
        if after and (after == 1 or after % 10 == 0):
            log.warning(
                "worker %s (%s) answered %d: %d failed answers in a row", worker, pick.endpoint, status, after
            )
        elif before and not after:
            log.info("worker %s (%s) answers again after %d failed answers", worker, pick.endpoint, before)
        pool = self._pools.get(pick.model)
        if pick.group is not None or pool is None or worker not in pool.workers:
            return  # a group's worker (its own picker ejects it) or one that left
        ejected_s = self.outliers.answered(worker, status, self._clock(), pool.workers)
        if ejected_s is not None:
            self.metrics.ejections.labels(pool.model, worker).inc()
            log.warning("worker %s of %s ejected from routing for %.0f s after %d failed answers in a row",
                        worker, pool.model, ejected_s, self.outliers.consecutive)  # fmt: skip

    def rejected(self, status: int, reason: str) -> None:
        """An error answer was given (counted by status and reason)."""
        self.metrics.rejected(status, reason)

    # --- internals ---------------------------------------------------------------------------

    async def _pick_in_groups(
        self,
        request: ParsedRequest | None,
        tokens: list[int] | None,
        subset: list[str] | None,
        headers: Mapping[str, str],
        client_request_id: str,
        timings: dict[str, int],
    ) -> Pick:
        """Hierarchical mode: the selector probes every router group and commits to the best one.

        A request that is not a generation request (`request` None) is routed on load and freed
        at once, as `_pick_untracked` does locally.
        """
        assert self.groups is not None
        start = time.perf_counter_ns()
        restrictions = tuple(tuple(r) for r in self._restrictions(subset, headers)) or None
        if request is None:
            model = next(iter(self._pools), "")
            group_request = GroupRequest(model, [], restrictions=restrictions, isl=1)
        else:
            model = request.model
            group_request = GroupRequest(
                model,
                tokens or [],
                lora_name=request.lora_name,
                cache_salt=request.cache_salt,
                overrides=_override(request, load_only=tokens is None),
                expected_output_tokens=_expected_output(request),
                restrictions=restrictions,
                isl=None if tokens is not None else max(1, request.body_size // 4),
            )
        request_id = client_request_id or "req"
        if self.groups.owner_of(request_id) is not None:
            request_id = f"{request_id}#{next(self._ids)}"
        decision = await self.groups.route(group_request, request_id)
        timings["groups"] = time.perf_counter_ns() - start
        choice = decision.choice
        tracked = request is not None
        if not tracked:
            self.groups.finish(request_id, "untracked")
        pick = Pick(
            request_id, model, choice.worker, choice.endpoint, dict(choice.headers), choice.overlap_blocks,
            choice.request_blocks, tracked=tracked, timings_ns=timings, group=decision.group,
        )  # fmt: skip
        self.metrics.observe_stages(timings)
        if tracked:
            self.metrics.routed(model, choice.overlap_blocks, decision.best_overlap_blocks)
        log.info(
            "routed %s model=%s to group %s worker %s (%s) overlap=%d/%d blocks (best %d) cost=%.1f%s",
            client_request_id, model, decision.group, choice.worker, choice.endpoint, choice.overlap_blocks,
            choice.request_blocks, decision.best_overlap_blocks, choice.cost,
            " (re-decided at commit)" if decision.redecided else "",
        )  # fmt: skip
        return pick

    def _routable(self, pool: ModelPool, allowed: set[str] | None) -> set[str] | None:
        """`allowed` without ejected workers (unless that leaves none)."""
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

    def _name_prefill_worker(self, pool: ModelPool, pick: Pick, split: DisaggDecision) -> str:
        """Put the prefill worker on the pick (and in its headers); returns a note for the log."""
        self.metrics.disagg(pool.model, split.local_reason)
        if split.prefill is None:
            return f"prefills on its decode worker ({split.local_reason})"
        endpoint = pool.prefill_workers[str(split.prefill.worker_id)].endpoint
        pick.prefill_worker = split.prefill.worker
        pick.prefill_endpoint = endpoint
        pick.headers[self.config.disagg.prefill_header] = endpoint
        return (
            f"prefills on {split.prefill.worker} ({endpoint}) overlap="
            f"{split.prefill.overlap_blocks}/{split.prefill.request_blocks} blocks"
        )

    def _pick_untracked(self, path: str, headers: Mapping[str, str], subset: list[str] | None) -> Pick:
        if not self._pools:
            raise NoEligibleWorker("no worker is configured")
        pool = next(iter(self._pools.values()))
        allowed = self._routable(pool, self._allowed(pool, subset, headers))
        decision = pool.router.best_worker_for_hashes([], 0, allowed_workers=allowed)
        endpoint = pool.endpoint_of(decision.worker)
        log.info("routed %s (untracked) to %s (%s)", path[:100], decision.worker, endpoint)
        return Pick("", pool.model, decision.worker, endpoint, _extra_headers(pool, decision.worker))

    def _restrictions(self, subset: list[str] | None, headers: Mapping[str, str]) -> list[list[str]]:
        restrictions: list[list[str]] = []
        if subset is not None:
            restrictions.append(subset)
        if self.config.conformance_hooks and epp.CONFORMANCE_SELECTION_HEADER in headers:
            selection = headers[epp.CONFORMANCE_SELECTION_HEADER]
            restrictions.append([s.strip() for s in selection.split(",") if s.strip()])
        return restrictions

    def _allowed(
        self, pool: ModelPool, subset: list[str] | None, headers: Mapping[str, str]
    ) -> set[str] | None:
        restrictions = self._restrictions(subset, headers)
        if not restrictions:
            return None
        allowed = {
            wid
            for wid, w in pool.workers.items()
            if all(epp.endpoint_matches(w.endpoint, r) for r in restrictions)
        }
        if not allowed:
            raise NoEligibleWorker("no worker of this model is in the allowed endpoint subset")
        return allowed

    def _update_session(
        self,
        pool: ModelPool,
        request: ParsedRequest,
        session_id: str | None,
        pinned: Worker | None,
        worker: Worker,
    ) -> None:
        if not session_id:
            return
        sessions = pool.sessions
        if request.session_action == "close":
            if sessions.close(session_id):
                self.metrics.sessions.labels(pool.model, "closed").inc()
                log.info("session %s closed", session_id)
            return
        if pinned is None:
            self.metrics.sessions.labels(pool.model, "pinned").inc()
        elif pinned != worker:
            self.metrics.sessions.labels(pool.model, "moved").inc()
            log.info("session %s moved from %s to %s (gone, busy or not allowed)", session_id, pinned, worker)
        sessions.pin(session_id, worker, self._clock())

    def _request_id(self, router: KvRouter, client_request_id: str) -> str:
        if client_request_id and client_request_id not in router.sequences:
            return client_request_id
        return f"{client_request_id or 'req'}#{next(self._ids)}"


def _specs(workers: Iterable[WorkerConfig]) -> list[WorkerSpec]:
    return [
        WorkerSpec(w.id, w.dp_ranks, w.total_blocks, w.max_num_batched_tokens, device=w.device)
        for w in workers
    ]


def _extra_headers(pool: ModelPool, worker: Worker) -> dict[str, str]:
    config = pool.workers[str(worker.worker_id)]
    return {DP_RANK_HEADER: str(worker.dp_rank)} if len(config.dp_ranks) > 1 else {}


_ROLE_NAMES = {"prefill": "prefill", "decode": "decode", "both": "aggregated"}


def _expected_output(request: ParsedRequest) -> int | None:
    osl = request.agent_hints.get("osl")
    if isinstance(osl, int) and not isinstance(osl, bool) and osl > 0:
        return osl
    return request.max_tokens


def _priority(request: ParsedRequest) -> int:
    value = request.agent_hints.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _latency_sensitivity(request: ParsedRequest) -> float:
    value = _non_negative(request.agent_hints.get("latency_sensitivity"))
    return value or 0.0


def _sheddable(request: ParsedRequest) -> bool:
    """Sheddable: `nvext.agent_hints.sheddable: true`, or a negative priority (the Inference
    Extension's convention for sheddable objectives)."""
    return request.agent_hints.get("sheddable") is True or _priority(request) < 0


def _override(request: ParsedRequest, *, load_only: bool) -> RouterConfigOverride | None:
    if load_only:
        return RouterConfigOverride(overlap_score_weight=0.0)
    hints = request.agent_hints
    weight = _non_negative(hints.get("kv_overlap_score_weight"))
    temperature = _non_negative(hints.get("temperature"))
    if weight is None and temperature is None:
        return None
    return RouterConfigOverride(overlap_score_weight=weight, temperature=temperature)


def _non_negative(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf"):
        return float(value)
    return None
