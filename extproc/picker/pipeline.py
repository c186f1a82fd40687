"""EndpointPicker: one request's way from body bytes to a routed worker, and its lifecycle.

The one decision pipeline. Reads top to bottom in request order: parse, find the model, restrict
candidates (subset hint, conformance header), tokenize, then hand the request to the router groups
(`extproc.groups.GroupSelector`) through the admission queue, and name the endpoint. Speaks no
protocol: `epp/service.py` feeds it bytes and headers and turns its `Pick` or its exception into an
ext_proc answer through `epp/answers.py`.

Where each feature lives (the same in every mode: no feature is off because groups are on):

- here, above the groups: parsing (`body_parser.py`: large bodies in worker processes, never on the
  event loop) and tokenizing; the admission queue (a request waits while no group has a worker under
  the queue threshold); sticky sessions, which pin a group and a worker once that worker answered
  2xx, bounded in length and number and swept on a timer; request ids (`client_ids.py`: the ids
  the picker makes cannot collide with a client's); metrics of the request path.
- in each local group (`local_group.py`: this process's workers; a plain deployment is one of
  them): candidates and endpoint restrictions, outlier ejection, disaggregated prefill/decode and
  prefill health checks, replica-sync listeners, the request's load until it ends.
- a remote group (another picker's `--group-api-port`) applies all of that in its own process; the
  response status travels with the free so its outlier ejection sees its workers' failures.

A request whose path is not an OpenAI generation endpoint is routed on load alone and not tracked:
to the workers of the model it names (a JSON body's `model`: `/v1/embeddings`, `/v1/rerank`, ...;
an audio upload form's `model` field, `extproc.request.form`; a Realtime connection's `?model=`; an
unknown model is a 404), or, without one (GET /v1/models, /health, ...), to any worker, the models
taken in turn. A request whose tokenization fails, or whose prompt is too large to bring back from
a parse worker, is routed on load alone and tracked until `finish`. What the groups are handed
(limits, hints, the prompt's ids) is built in `group_request.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from itertools import count
from typing import Protocol

from extproc.config import PickerConfig, WorkerConfig
from extproc.config.workers import other_names
from extproc.epp import answers as epp
from extproc.errors import (
    NoEligibleWorker,
    PickerError,
    RequestInvalid,
    TokenizerUnavailable,
    UnknownModel,
)
from extproc.events.kv_indexer import KvIndexerClient
from extproc.groups import GroupCollector, GroupError, GroupRequest, GroupSelector, RemoteGroup, RouterGroup
from extproc.groups.policy import parse_policy
from extproc.groups.types import GroupDecision
from extproc.picker import client_ids
from extproc.picker.admission import AdmissionGate
from extproc.picker.body_parser import BodyParser
from extproc.picker.client_ids import SESSION_HEADER, RequestIds, loggable
from extproc.picker.flow_metrics import FlowMetrics
from extproc.picker.group_request import group_request as group_request_of
from extproc.picker.home_waits import HomeWaits
from extproc.picker.inference_extension import FAIRNESS_HEADER, InferenceExtension, queue_entry
from extproc.picker.local_group import LocalGroup, RouteListener
from extproc.picker.metrics import PickMetrics
from extproc.picker.model_names import ModelNames
from extproc.picker.parse_worker import ParsedBody
from extproc.picker.pick import UNLISTED, ObjectiveLabels, Pick, label_refusal
from extproc.picker.pools import DP_RANK_HEADER, ModelPool, build_pools
from extproc.picker.response_homes import Home, ResponseHomes, ResponseHomesCollector
from extproc.picker.worker_sessions import Outcome, WorkerSessionCollector, WorkerSessions, session_timeout
from extproc.request.cache_metrics import BlockHashCacheCollector, PromptPrefixCollector
from extproc.request.parse import ParsedRequest, is_routable, realtime_model, route_of
from extproc.request.responses import RESPONSES_PATH
from extproc.router import KvRouter, QueuePolicy, RouterConfigOverride, RouterError, SessionPins, Worker
from extproc.router.hashing import PREFIX_CACHE
from extproc.runtime.wakeups import lazy_sleep
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.picker")

LOCAL_GROUP = "local"  # the name of a plain deployment's one group
_is_routable = functools.lru_cache(maxsize=256)(is_routable)  # a handful of paths; failures not kept
_NO_RESTRICTIONS: list[list[str]] = []  # shared, never changed: no subset hint, no conformance header
MAX_SESSION_SWEEP_S = 30.0  # lapsed session pins are swept every ttl/4, at most this far apart

__all__ = ["DP_RANK_HEADER", "SESSION_HEADER", "EndpointPicker", "ModelPool", "Pick", "WorkerSetListener"]


class WorkerSetListener(Protocol):
    """Told when a model's workers change at run time (discovery, config reload)."""

    def on_workers_changed(
        self, model: str, added: Sequence[WorkerConfig], removed: Sequence[str]
    ) -> None: ...


class RouteShare(Protocol):
    """Told the routes clients name as this picker learns them, for other replicas (replica sync):
    which worker stored a Responses API answer, where a sticky session is pinned, a session closed."""

    def response_home(
        self, response_id: str, model: str, worker: Worker, endpoint: str, group: str
    ) -> None: ...

    def session_pinned(self, session_id: str, model: str, worker: Worker, group: str) -> None: ...

    def session_closed(self, session_id: str, model: str) -> None: ...

    def shared(self) -> bool:
        """Whether other replicas share routes now: an id not known here may be on its way."""
        ...


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
        self._ids = RequestIds()
        self._id_in_use: Callable[[str], bool] = self._request_id_in_use  # bound once, not per request
        self._turns = count()  # untracked requests without a model: the models in turn
        self.bodies = BodyParser(
            max_bytes=config.max_body_bytes,
            workers=config.body_parse_workers,
            inline_max_bytes=config.body_parse_inline_bytes,
        )
        self.owner_id = uuid.uuid4().hex  # names this picker's requests in remote groups (leases)
        self.metrics = PickMetrics()
        self.listeners: list[RouteListener] = []
        self.worker_listeners: list[WorkerSetListener] = []
        # awaited before each decision: replica sync reads what other replicas said that already came
        self.before_decision: Callable[[], Awaitable[None]] | None = None
        self.route_share: RouteShare | None = None  # replica sync (`extproc.events.sources`)
        self._pools = build_pools(config, clock=clock, rng=self._rng)
        # aliases and LoRA adapters, configured and listed by the workers: what requests resolve with
        self._names = ModelNames(self._pools, other_names(config.models))
        events = config.events  # --kv-indexer-url: this process's decisions ask that indexer for overlaps
        self.kv_indexer = (
            KvIndexerClient(events.kv_indexer_url, timeout_s=events.kv_indexer_timeout_s, clock=clock)
            if events.kv_indexer_url is not None
            else None
        )
        groups = self._groups(config)
        local = [g for g in groups if isinstance(g, LocalGroup)]
        # this process's workers: routed to when configured as a group, served by --group-api-port
        self.local = local[0] if local else self._local_group(LOCAL_GROUP)
        self.selector = GroupSelector(
            groups,
            probe_timeout_s=config.groups.probe_timeout_s,
            probe_grace_s=config.groups.probe_grace_s,
            policy=parse_policy(config.groups.policy),
            fallback=config.groups.fallback,
            rng=self._rng,
            clock=clock,
        )
        for group in groups:
            if isinstance(group, RemoteGroup):
                group.on_lifecycle_failure = self.selector.metrics.lifecycle_failed
        if self.hierarchical:
            self.metrics.registry.register(GroupCollector(self.selector.metrics))
        self.metrics.registry.register(BlockHashCacheCollector(PREFIX_CACHE.stats))
        self.metrics.registry.register(
            PromptPrefixCollector(
                lambda: {m: p.tokenizer.prefix_cache_stats() for m, p in self._pools.items()}
            )
        )
        self.worker_sessions = WorkerSessions() if config.worker_session_control == "sglang" else None
        if self.worker_sessions is not None:
            self.metrics.registry.register(WorkerSessionCollector(self.worker_sessions))
        self._sessions = {
            model: SessionPins(config.session_ttl_s, config.session_max_pins, on_drop=self._pin_left)
            for model in self._pools
        }
        self.response_homes = ResponseHomes()  # Responses API: which worker stored which answer
        # InferenceObjectives (x-gateway-inference-objective) and InferenceModelRewrites
        self.inference = InferenceExtension.from_config(
            config.inference_extension, self.metrics, self._rng, clock
        )
        self.home_waits = HomeWaits()  # follow-ups waiting for another replica's word on theirs
        self.metrics.registry.register(ResponseHomesCollector(self.response_homes, self.home_waits))
        self._sweeper: asyncio.Task[None] | None = None
        self.flow_metrics = FlowMetrics(config.inference_extension.pool.name)  # GIE's flow control
        self.metrics.registry.register(self.flow_metrics)
        self._gates = {
            model: AdmissionGate(
                enabled=config.router.router_queue_threshold is not None,
                policy=config.router.router_queue_policy,
                fairness=config.router.router_queue_fairness,
                max_wait_s=config.queue_max_wait_s,
                clock=clock,
                flow_metrics=self.flow_metrics,
            )
            for model in self._pools
        }
        self._may_queue = any(gate.enabled for gate in self._gates.values())  # asked once a stream

    def _groups(self, config: PickerConfig) -> list[RouterGroup]:
        if not config.groups.groups:
            return [self._local_group(LOCAL_GROUP)]
        groups: list[RouterGroup] = []
        for g in config.groups.groups:
            if g.address is None:
                groups.append(self._local_group(g.name, g.weight))
            else:
                groups.append(
                    RemoteGroup(
                        g.name, g.address, weight=g.weight, tls=config.groups.tls, owner=self.owner_id,
                        lease_s=config.groups.lease_s,
                    )
                )  # fmt: skip
        return groups

    def _local_group(self, name: str, weight: float = 1.0) -> LocalGroup:
        return LocalGroup(
            name, self._pools, config=self.config, clock=self._clock, metrics=self.metrics,
            listeners=self.listeners, weight=weight, kv_indexer=self.kv_indexer,
        )  # fmt: skip

    @property
    def hierarchical(self) -> bool:
        """Whether router groups are configured (`groups:`), rather than the one local group."""
        return bool(self.config.groups.groups)

    @property
    def may_queue(self) -> bool:
        """Whether a request can wait in an admission queue (`--router-queue-threshold` is set)."""
        return self._may_queue

    @property
    def pools(self) -> Mapping[str, ModelPool]:
        return self._pools

    def model_names(self) -> list[str]:
        """The names a request's `model` may give: the models, then their aliases and LoRA adapters."""
        return [*self._pools, *self._names.names()]

    def resolve_model(self, name: str) -> tuple[ModelPool, str | None]:
        """The pool serving a request's `model`, and the LoRA adapter it names (else None): a
        configured model; one of its aliases (vLLM's further `--served-model-name`s) or LoRA adapters
        (vLLM serves adapters as models), configured or listed by its workers; or SGLang's
        `MODEL:ADAPTER` (the longest configured model before the colon; an empty adapter is none).
        Raises UnknownModel."""
        pool = self._pools.get(name)
        if pool is not None:
            return pool, None
        meant = self._names.get(name)
        if meant is not None:
            return self._pools[meant.model], name if meant.kind == "adapter" else None
        bases = [m for m in self._pools if name.startswith(f"{m}:")]
        if not bases:
            raise UnknownModel(name, self.model_names())
        base = max(bases, key=len)
        return self._pools[base], name[len(base) + 1 :].strip() or None

    def model_label(self, name: str) -> str:
        """`name` as the per-request series' label: itself when this picker lists it (a model, an
        alias or adapter, a rewrite rule's match), else "unlisted" (never a client's free text)."""
        listed = name in self._pools or self._names.get(name) is not None or self.inference.matches(name)
        return name if listed else UNLISTED

    def _adapter_label(self, model: str, lora_name: str | None) -> str | None:
        """The metrics' name for the adapter a request named: a listed adapter of `model` (configured
        or discovered: bounded), else "unlisted" (SGLang's `MODEL:ADAPTER` and `lora_path` take any
        name, and a client's text must not make a series each)."""
        if not lora_name:
            return None
        listed = self._names.get(lora_name)
        if listed is not None and listed.kind == "adapter" and listed.model == model:
            return lora_name
        return "unlisted"

    def adapters(self, model: str) -> list[str]:
        """The LoRA adapters requests for `model`'s workers may name, configured or discovered."""
        return self._names.of(model, "adapter")

    def aliases(self, model: str) -> list[str]:
        """The other names requests for `model` may give, configured or discovered."""
        return self._names.of(model, "alias")

    def set_discovered_names(
        self, model: str, aliases: Iterable[str], adapters: Iterable[str]
    ) -> tuple[list[str], list[str]]:
        """The names `model`'s workers now list (their /v1/models, `runtime.lora_discovery`): they
        become names a request may give, on top of the configured ones. Returns the names added and
        removed. A name that is a model or another model's stays what it was (logged once)."""
        if model not in self._pools:
            raise UnknownModel(model, list(self._pools))
        return self._names.set_listed(model, {"alias": aliases, "adapter": adapters})

    def gate(self, model: str) -> AdmissionGate:
        """The model's admission queue."""
        return self._gates[model]

    def sessions(self, model: str) -> SessionPins:
        """The model's sticky sessions: session id -> (group, worker)."""
        return self._sessions[model]

    def routers_by_worker(self) -> dict[str, KvRouter]:
        """Each configured worker id's router (one router per model)."""
        return {
            wid: pool.router_for(w) for pool in self._pools.values() for wid, w in pool.all_workers().items()
        }

    def set_workers(self, model: str, workers: Sequence[WorkerConfig]) -> tuple[list[str], list[str]]:
        """Make `workers` the model's worker set; returns the ids added and removed.

        A changed worker (new endpoint, dp ranks or capacity) is updated in place. A removed worker's
        cached blocks and in-flight requests are forgotten (their streams still end normally), and
        sessions pinned to it are re-pinned on their next request.
        """
        if model not in self._pools:
            raise UnknownModel(model, list(self._pools))
        added, removed = self.local.set_workers(model, workers)
        for wid in [*removed, *(w.id for w in added)]:
            self._sessions[model].drop_worker(wid, self.local.name)
            self.response_homes.drop_worker(model, wid, self.local.name)
        if added or removed:
            for listener in self.worker_listeners:
                listener.on_workers_changed(model, added, removed)
            self._gates[model].kick()
        return [w.id for w in added], removed

    def set_thresholds(self, model: str, **values: float | int | None) -> dict[str, float | int | None]:
        """Change a model's busy thresholds at run time; returns its full record (see KvRouter)."""
        pool = self._pools.get(model)
        if pool is None:
            raise UnknownModel(model, list(self._pools))
        record = pool.router.set_thresholds(**values)
        log.info("busy thresholds of %s: %s", model, record)
        self._gates[model].kick()  # looser thresholds can release queued requests
        return record

    async def close(self) -> None:
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)
            self._sweeper = None
        await self.bodies.close()
        if self.worker_sessions is not None:
            await self.worker_sessions.close()
        await self.selector.close()
        if self.local not in self.selector.groups:
            await self.local.close()
        for model, pool in self._pools.items():
            await self._gates[model].close()
            await pool.tokenizer.close()
        if self.kv_indexer is not None:
            await self.kv_indexer.close()

    async def hear_before_deciding(self) -> None:
        """Await `before_decision` if set: every decision of this process, its own and those it
        makes for other pickers through the router-group API, first hears what already came."""
        if self.before_decision is not None:
            await self.before_decision()

    def is_idle(self) -> bool:
        """No request is tracked anywhere and every load counter is back at zero."""
        return self.selector.in_flight() == 0 and all(pool.disagg.is_idle() for pool in self._pools.values())

    # --- one request ---------------------------------------------------------------------------

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
        """Route one request. Raises PickerError, RouterError or GroupError subclasses (mapped by `epp`).

        `on_queued(max_wait_s)` is called if the request has to wait in the admission queue.
        `override` replaces the body's `nvext.agent_hints` overlap weight and temperature (callers
        of the Python client; Envoy traffic has none).
        """
        t0 = time.perf_counter_ns()
        restrictions = self._restrictions(subset, headers)
        if body is None or not _is_routable(path):  # decided normalised, as parse_openai_body does
            return await self._pick_not_generating(body, path, headers, restrictions)
        parsed = await self.bodies.request(body, path)
        request = parsed.request
        asked = request.model
        if (rewritten := self.inference.model_for(asked, headers)) is not None:  # routed and sent as that
            request, body = (
                dataclasses.replace(request, model=rewritten),
                await self.bodies.with_model(body, rewritten),
            )
        t1 = time.perf_counter_ns()
        labels = ObjectiveLabels(self.model_label(asked), self.model_label(request.model))
        try:
            pool, lora_name = self.resolve_model(request.model)
            if pool.model != request.model:  # an adapter: its base model's workers, its blocks hashed
                # with its name; one named by `model` wins over the body's `lora_path` (SGLang's order)
                lora_name = lora_name or request.lora_name
                request = dataclasses.replace(request, model=pool.model, lora_name=lora_name)
            session_id = client_ids.session_id(request.session_id, headers, self.config.session_id_max_length)
            objective = self.inference.objective(request.model, headers)
            worker_session = self._worker_session_action(request, session_id)
            request, tokens = await self._tokens(parsed, request, pool, client_request_id)
            t2 = time.perf_counter_ns()
            timings = {"parse": t1 - t0, "tokenize": t2 - t1}
            group_request, isl = group_request_of(
                request, tokens, restrictions=restrictions, override=override,
                max_prompt_tokens=self.config.max_prompt_tokens,
            )  # fmt: skip
            request_id = self._request_id(client_request_id)
            # first what already came: another replica's load, and the pin or answer's worker it shared
            # just before this client's next turn reached this replica (a NATS socket held until later)
            await self.hear_before_deciding()
            pinned: tuple[str, Worker] | None = None
            if session_id:
                pin = self._sessions[request.model].get_pin(session_id, self._clock())
                pinned = (pin.group, pin.worker) if pin is not None else None
            if request.previous_response_id is not None:  # its history is stored where it was answered
                pinned = await self._response_home(request, pinned)
            gate = self._gates[request.model]
            routed_at = time.perf_counter_ns()
            if not gate.enabled:  # what admit does without a queue, minus its entry and callbacks
                waited_s = 0.0
                # one local group: decided here and now, without a coroutine
                now = self.selector.route_now(group_request, request_id, pinned=pinned)
                decision = (
                    now
                    if now is not None
                    else await self.selector.route(group_request, request_id, pinned=pinned)
                )
            else:
                if self.kv_indexer is not None and gate.queue.policy is QueuePolicy.WSPT:
                    await self.local.fetch_overlaps(group_request)  # for wspt's estimate, if it waits
                fairness_id = headers.get(FAIRNESS_HEADER)
                entry = queue_entry(
                    request_id, self._clock(), isl, request.agent_hints, objective, fairness_id
                )
                decision, waited_s = await gate.admit(
                    entry,
                    lambda: self.selector.route(group_request, request_id, pinned=pinned),
                    has_capacity=lambda: self.selector.has_capacity(group_request),
                    key=group_request.restrictions,
                    on_queued=on_queued,
                    new_tokens=lambda: self._uncached_tokens(group_request),
                    undo=lambda _: self.selector.finish(request_id, "its client left the queue"),
                    flow=self.flow_metrics.flow(entry.flow, objective, request.model, labels, len(body)),
                )
            timings["queue"] = int(waited_s * 1e9)
            if request.n > 1:  # n sequences decode from the one prompt, each holding its blocks (any group)
                self.selector.output_tokens(request_id, 0, request.n)
            if decision.timings_ns:
                timings.update(decision.timings_ns)
            else:
                timings["groups"] = time.perf_counter_ns() - routed_at
            session_pin = self._session_route(request, session_id, pinned, decision) if session_id else None
            choice = decision.choice
            opened_on, opened_new = None, False
            if worker_session == "open" and session_id:
                outcome = await self._open_worker_session(choice.endpoint, session_id, request, request_id)
                opened_on = choice.endpoint if outcome in ("ok", "already_open") else None
                opened_new = outcome == "ok"
            pick = Pick(
                request_id, request.model, choice.worker, choice.endpoint, dict(choice.headers),
                choice.overlap_blocks, choice.request_blocks, tracked=True, timings_ns=timings,
                session_id=session_id, queued_s=waited_s, group=decision.group,
                predicted_ttft_ms=choice.predicted_ttft_ms,
                prefill_worker=choice.prefill_worker, prefill_endpoint=choice.prefill_endpoint,
                session_pin=session_pin, session_opened_on=opened_on, session_opened_new=opened_new,
                session_close_on=choice.endpoint if worker_session == "close" else None,
                responses_api=request.responses_api, response_id=request.response_id, started_ns=t0,
                body=body if rewritten is not None else None,
                renamed=(rewritten, asked) if rewritten is not None else None,
                prompt_tokens=len(tokens) if tokens is not None else 0, sequences=request.n,
                labels=dataclasses.replace(labels, priority=objective or 0),
            )  # fmt: skip
            self.metrics.observe_stages(timings)
            self.metrics.routed(
                request.model, choice.overlap_blocks, decision.best_overlap_blocks,
                len(tokens) if tokens is not None else 0, choice.request_blocks if tokens is not None else 0,
                self._adapter_label(request.model, request.lora_name),
            )  # fmt: skip
            if log.isEnabledFor(logging.INFO):  # its arguments cost more than a request's metrics
                log.info(
                    "routed %s model=%s%s to %s%s (%s) overlap=%d/%d blocks (best %d) cost=%.1f%s%s%s",
                    loggable(client_request_id), request.model,
                    (f" lora={request.lora_name}" if request.lora_name else "")
                    + (f" (asked as {loggable(asked)})" if rewritten is not None else ""),
                    f"group {decision.group} worker " if self.hierarchical else "",
                    choice.worker, choice.endpoint, choice.overlap_blocks, choice.request_blocks,
                    decision.best_overlap_blocks, choice.cost,
                    f" session={loggable(session_id)}" if session_id else "",
                    f" queued {waited_s * 1000:.0f} ms" if waited_s else "",
                    " (re-decided at commit)" if decision.redecided and pinned is None else "",
                )  # fmt: skip
            return pick
        except (PickerError, RouterError, GroupError) as exc:  # counted under its model too
            label_refusal(exc, labels)
            raise

    def first_token(self, pick: Pick, *, at_first_token: bool = True) -> None:
        """The first response chunk arrived: the prompt is prefilled. `at_first_token` False when that
        chunk is not the first token (a non-streamed answer comes whole): its time is not learned from."""
        if pick.tracked:
            if at_first_token and not pick.first_token_ns:
                pick.first_token_ns = time.perf_counter_ns()
                self.metrics.ttft.observe((pick.model,), (pick.first_token_ns - pick.started_ns) / 1e9)
            self.selector.first_token(pick.request_id, at_first_token=at_first_token)
            self._gates[pick.model].kick()

    @property
    def tracks_output_blocks(self) -> bool:
        """--router-track-output-blocks: the ext_proc stream counts generated tokens for `output_tokens`."""
        return bool(self.config.router.router_track_output_blocks)

    def output_tokens(self, pick: Pick, count: int, sequences: int = 1) -> None:
        """`count` more tokens generated per sequence, of `sequences` (the request's `n`)."""
        if pick.tracked:
            pick.output_tokens += count
            self.selector.output_tokens(pick.request_id, count, sequences)

    def finish(self, pick: Pick, cause: str) -> None:
        """The stream ended (complete, error status, reset, cancel); frees the request once."""
        if pick.tracked and self.selector.finish(pick.request_id, cause):
            if pick.session_close_on is not None and pick.session_id and self.worker_sessions is not None:
                self.worker_sessions.close_later(pick.session_close_on, pick.session_id)
            log.debug("freed %s (%s)", pick.request_id, cause)
            self.metrics.finished(pick.model, cause)
            if cause == "complete" and self.tracks_output_blocks:
                first = pick.first_token_ns  # 0: a whole answer, no first token seen
                decode_s = (time.perf_counter_ns() - first) / 1e9 if first else None
                self.metrics.answered(pick.model, pick.output_tokens, decode_s)
            self._gates[pick.model].kick()

    def response_stored(self, pick: Pick, response_id: str) -> None:
        """A Responses API answer of `pick`'s worker carries `response_id`: what names it later goes there."""
        group = pick.group or ""
        if pick.responses_api and self.response_homes.remember(
            response_id, pick.model, pick.worker, pick.endpoint, group, self._clock()
        ):
            log.debug("response %s is stored on %s (%s)", loggable(response_id), pick.worker, pick.endpoint)
            if self.route_share is not None:
                self.route_share.response_home(response_id, pick.model, pick.worker, pick.endpoint, group)

    def remember_response_home(
        self, response_id: str, model: str, worker: Worker, endpoint: str, group: str, *,
        age_s: float = 0.0, fill: bool = False,
    ) -> bool:  # fmt: skip
        """Another replica's answer `response_id` is stored on `worker` (replica sync), last used
        `age_s` ago: remember it here too. `fill`: unless this picker knows where it is (a route
        handed over to a replica that started late). False when nothing was kept: the id is
        unusable (empty or too long), known (`fill`), or lapsed."""
        if (fill and response_id in self.response_homes) or age_s >= self.response_homes.ttl_s:
            return False
        if not self.response_homes.remember(
            response_id, model, worker, endpoint, group, self._clock() - age_s
        ):
            return False
        self.home_waits.arrive(response_id)
        return True

    def remember_session_pin(
        self, session_id: str, model: str, worker: Worker, group: str, *,
        age_s: float = 0.0, fill: bool = False,
    ) -> bool:  # fmt: skip
        """Another replica pinned (or moved, or used) a sticky session, `age_s` ago: pin it here too
        (`fill`: unless it is pinned here). False when nothing was pinned: a model this picker does
        not serve, known (`fill`), or lapsed. A move closes a worker session opened here for it,
        as a move here does."""
        sessions = self._sessions.get(model)
        if sessions is None or (fill and session_id in sessions) or age_s >= sessions.ttl_s:
            return False
        now = self._clock()
        sessions.pin(session_id, worker, now - age_s, group)
        sessions.share_due(session_id, now, 0.0)  # told everywhere just now: no echo
        self._sweep_sessions_later()
        return True

    def known_response_homes(self) -> Iterator[tuple[str, str, Worker, str, str, float]]:
        """(response id, model, worker, endpoint, group, seconds since its last use) of every stored
        answer's home kept now, least recently used first, made as it is read (for a replica that
        missed them: `extproc.events.route_catchup`)."""
        now = self._clock()
        for rid, h in self.response_homes.homes(now):
            yield rid, h.model, h.worker, h.endpoint, h.group, now - h.last_used_s

    def known_session_pins(self) -> Iterator[tuple[str, str, Worker, str, float]]:
        """(session id, model, worker, group, seconds since its last use) of every sticky session
        pinned now, least recently used first per model, made as it is read."""
        now = self._clock()
        for model, sessions in list(self._sessions.items()):
            for sid, pin in sessions.pins(now):
                yield sid, model, pin.worker, pin.group, now - pin.last_used_s

    def forget_session_pin(self, session_id: str, model: str) -> bool:
        """Another replica closed a sticky session: unpin it here too (its request closes the worker's
        session, if any). False when nothing was pinned."""
        sessions = self._sessions.get(model)
        return sessions is not None and sessions.close(session_id)

    def answered(self, pick: Pick, status: int) -> None:
        """The worker's response status arrived: count it, feed outlier ejection with it, and pin the
        request's session to the worker when it answered 2xx."""
        if pick.response_id is not None and 200 <= status < 300:
            self.response_stored(pick, pick.response_id)
        if pick.session_pin is not None and 200 <= status < 300:
            self._pin_session(pick, pick.session_pin)
        elif (
            pick.session_opened_new
            and pick.session_opened_on
            and pick.session_id
            and self.worker_sessions is not None
        ):
            # opened for a request the worker then refused: nothing pins it, close it now. One that was
            # already open stays: an earlier request opened it, and its pin may still name it
            self.worker_sessions.close_later(pick.session_opened_on, pick.session_id)
        worker = str(pick.worker.worker_id)
        before, after = self.metrics.upstream_answered(pick.model, worker, status)
        if after and (after == 1 or after % 10 == 0):
            log.warning(
                "worker %s (%s) answered %d: %d failed answers in a row", worker, pick.endpoint, status, after
            )
        elif before and not after:
            log.info("worker %s (%s) answers again after %d failed answers", worker, pick.endpoint, before)
        if pick.tracked:
            self.selector.answered(pick.request_id, status)
        elif pick.group is not None:
            self.selector.answered_untracked(pick.group, pick.model, pick.worker, status)

    def rejected(self, status: int, reason: str) -> None:
        """An error answer was given (counted by status and reason)."""
        self.metrics.rejected(status, reason)

    # --- internals ---------------------------------------------------------------------------

    async def _pick_not_generating(
        self, body: bytes | None, path: str, headers: Mapping[str, str], restrictions: list[list[str]]
    ) -> Pick:
        """A request that is not a generation request: routed on load alone, untracked, to the
        workers of the model it names (a JSON body's or an upload form's `model`, a Realtime
        connection's query) and counted in the per-request series under it; or to any worker."""
        if body:
            model = await self.bodies.model_of(body, headers.get("content-type", ""))
        else:
            model = realtime_model(path)
        if model is None:
            return await self._pick_untracked(path, restrictions, model)
        label = self.model_label(model)  # asked and sent as the same
        labels = ObjectiveLabels(label, label)
        try:
            pick = await self._pick_untracked(path, restrictions, model)
        except (PickerError, RouterError, GroupError) as exc:
            label_refusal(exc, labels)
            raise
        pick.labels = labels
        return pick

    async def _tokens(
        self, parsed: ParsedBody, request: ParsedRequest, pool: ModelPool, client_request_id: str
    ) -> tuple[ParsedRequest, Sequence[int] | None]:
        """The prompt's token ids as the engine will prefill them, and the request as tokenized (a
        chat's system turn merged inline where the model's template does, as vLLM renders it). None:
        routed on load alone (the body says so, its prompt was too large to bring back from a parse
        worker, or the tokenizer failed), each logged."""
        if request.load_only_reason is not None:
            log.info("%s: %s: routing on load only", loggable(client_request_id), request.load_only_reason)
            return request, None
        if not parsed.has_prompt:
            log.warning(
                "%s: its prompt holds more than %d JSON values: routing on load only",
                loggable(client_request_id), self.bodies.max_prompt_values,
            )  # fmt: skip
            return request, None
        if request.system_merged is not None and pool.tokenizer.merges_inline_system:
            request = dataclasses.replace(request, messages=request.system_merged)
        try:
            return request, await pool.tokenizer.token_ids(request)
        except TokenizerUnavailable as exc:
            log.warning(
                "tokenizer failed for %s (%s): routing on load only", loggable(client_request_id), exc.message
            )
            return request, None

    async def _pick_untracked(self, path: str, restrictions: list[list[str]], model: str | None) -> Pick:
        """Route on load alone, tracking nothing: to `model`'s workers, or without one to any worker
        (every model's workers serve /v1/models, /health, ...), the models taken in turn. What names a
        stored response (`/v1/responses/{id}[/...]`) goes to the worker that stored it, when known."""
        if not self._pools:
            raise NoEligibleWorker("no worker is configured")
        stored = await self._stored_response(path, restrictions)
        if stored is not None:
            return stored
        if model is not None:
            model = self.resolve_model(model)[0].model  # an adapter's: its base model's workers
        models = list(self._pools)
        if model is not None:
            models = [model]
        else:
            start = next(self._turns) % len(models)
            models = models[start:] + models[:start]
        restricted = tuple(tuple(r) for r in restrictions) or None
        for position, name in enumerate(models):
            request = GroupRequest(name, [], restrictions=restricted, isl=0)
            try:
                group, choice = await self.selector.choose(request)
            except (PickerError, RouterError, GroupError):
                if position == len(models) - 1:
                    raise
                continue  # none of this model's workers may take it (subset hint, all busy): the next
            log.info("routed %s (untracked, model %s) to %s (%s)", loggable(path, 100), name, choice.worker,
                     choice.endpoint)  # fmt: skip
            return Pick("", name, choice.worker, choice.endpoint, dict(choice.headers), group=group)
        raise AssertionError("unreachable: the last model's failure is raised")

    async def _response_home(
        self, request: ParsedRequest, pinned: tuple[str, Worker] | None
    ) -> tuple[str, Worker] | None:
        """The worker storing the response a follow-up continues (it wins over a session's pin)."""
        assert request.previous_response_id is not None
        home = await self._home_of(request.previous_response_id)
        if home is None or home.model != request.model:
            log.info(
                "previous_response_id %s: no worker of %s is known to store it (unknown, lapsed or gone); "
                "routed on load", loggable(request.previous_response_id), request.model,
            )  # fmt: skip
            return pinned
        return (home.group, home.worker)

    async def _stored_response(self, path: str, restrictions: list[list[str]]) -> Pick | None:
        """An untracked pick to the worker storing the response `path` names, or None."""
        route = route_of(path)
        if not route.startswith(RESPONSES_PATH + "/"):
            return None
        await self.hear_before_deciding()  # its worker may have been shared by another replica just now
        response_id = route[len(RESPONSES_PATH) + 1 :].partition("/")[0]
        home = await self._home_of(response_id) if response_id else None
        if home is None or not all(epp.endpoint_matches(home.endpoint, allowed) for allowed in restrictions):
            return None
        log.info("routed %s (untracked) to %s (%s), which stores it", loggable(path, 100), home.worker,
                 home.endpoint)  # fmt: skip
        return Pick("", home.model, home.worker, home.endpoint, {}, group=home.group)

    async def _home_of(self, response_id: str) -> Home | None:
        """Where `response_id` is stored. One not known here, while other replicas share routes, is
        waited for a moment (`HomeWaits`): its answer may have passed through another replica an
        instant ago, and that replica's word be on its way."""
        home = self.response_homes.get(response_id, self._clock())
        if home is None and self.route_share is not None and self.route_share.shared():
            started = time.perf_counter()
            if await self.home_waits.wait(response_id):
                log.info("response %s: its worker was shared by another replica %.1f ms later",
                         loggable(response_id), (time.perf_counter() - started) * 1000)  # fmt: skip
            home = self.response_homes.get(response_id, self._clock())
        return home

    def _uncached_tokens(self, request: GroupRequest) -> int:
        """The queue's wspt estimate: the prompt minus its best cached prefix here."""
        return self.local.uncached_tokens(request)

    def _restrictions(self, subset: list[str] | None, headers: Mapping[str, str]) -> list[list[str]]:
        if subset is None and not self.config.conformance_hooks:
            return _NO_RESTRICTIONS
        restrictions: list[list[str]] = []
        if subset is not None:
            restrictions.append(subset)
        if self.config.conformance_hooks and epp.CONFORMANCE_SELECTION_HEADER in headers:
            selection = headers[epp.CONFORMANCE_SELECTION_HEADER]
            restrictions.append([s.strip() for s in selection.split(",") if s.strip()])
        return restrictions

    def _session_route(
        self,
        request: ParsedRequest,
        session_id: str | None,
        pinned: tuple[str, Worker] | None,
        decision: GroupDecision,
    ) -> str | None:
        """The session to pin when the worker answers 2xx (None: none, or closed now)."""
        if not session_id:
            return None
        if request.session_action == "close":
            if self._sessions[request.model].close(session_id):
                self.metrics.sessions.labels(request.model, "closed").inc()
                log.info("session %s closed", loggable(session_id))
            if self.route_share is not None:
                self.route_share.session_closed(session_id, request.model)
            return None
        if pinned is not None and pinned != (decision.group, decision.choice.worker):
            log.info("session %s leaves %s for %s (gone, busy or not allowed); pinned there once it answers",
                     loggable(session_id), pinned[1], decision.choice.worker)  # fmt: skip
        return session_id

    def _worker_session_action(self, request: ParsedRequest, session_id: str | None) -> str | None:
        """The session call this request asks of its worker, "open" or "close", or None (no action,
        no session id, or --worker-session-control off). Checked before routing: a bad timeout is
        answered 400 before any load is counted."""
        action = request.session_action
        if action not in ("open", "close") or not session_id or self.worker_sessions is None:
            return None
        if action == "open" and session_timeout(request.nvext) is None:
            raise RequestInvalid("nvext.session_control.timeout must be a positive integer (seconds)")
        return action

    async def _open_worker_session(
        self, endpoint: str, session_id: str, request: ParsedRequest, request_id: str
    ) -> Outcome:
        """Open the session on the chosen worker; the call's outcome (routed whatever it is).
        A cancel while waiting frees the request's load here: no Pick exists yet to free it."""
        assert self.worker_sessions is not None
        timeout_s = session_timeout(request.nvext)
        assert timeout_s is not None  # checked before routing (_worker_session_action)
        try:
            outcome = await self.worker_sessions.open(endpoint, session_id, timeout_s)
        except BaseException:
            self.selector.finish(request_id, "cancelled while its worker session opened")
            raise
        return outcome

    def _pin_left(self, session_id: str, endpoint: str) -> None:
        """A pin whose worker holds an open session lapsed, was evicted or moved: close it there."""
        if self.worker_sessions is not None:
            self.worker_sessions.close_later(endpoint, session_id)

    def _pin_session(self, pick: Pick, session_id: str) -> None:
        sessions = self._sessions[pick.model]
        now, group = self._clock(), pick.group or ""
        event = sessions.pin(session_id, pick.worker, now, group)
        if pick.session_opened_on is not None:
            sessions.mark_opened(session_id, pick.session_opened_on)
        if event != "refreshed":
            self.metrics.sessions.labels(pick.model, event).inc()
        # other replicas hear a new pin or a move at once, and a use while it lasts (their TTL restarts)
        # at most once a quarter of the TTL
        every_s = 0.0 if event != "refreshed" else self.config.session_ttl_s / 4
        if self.route_share is not None and sessions.share_due(session_id, now, every_s):
            self.route_share.session_pinned(session_id, pick.model, pick.worker, group)
        self._sweep_sessions_later()

    def _sweep_sessions_later(self) -> None:
        """Make sure lapsed pins are swept on a timer while any pin exists (no request needed)."""
        if self._sweeper is not None and not self._sweeper.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): lookups still drop lapsed pins
            return
        self._sweeper = loop.create_task(self._sweep_sessions(), name="session-sweeper")

    async def _sweep_sessions(self) -> None:
        interval_s = min(max(self.config.session_ttl_s / 4, 0.05), MAX_SESSION_SWEEP_S)
        while any(len(sessions) for sessions in self._sessions.values()):
            await lazy_sleep(
                interval_s, interval_s
            )  # a timer: pins lapse with no event (lookups drop them too)
            now = self._clock()
            for sessions in self._sessions.values():
                sessions.expire(now)

    def _request_id_in_use(self, request_id: str) -> bool:
        return self.selector.owner_of(request_id) is not None

    def _request_id(self, client_request_id: str) -> str:
        return self._ids.make(client_request_id, self._id_in_use)
