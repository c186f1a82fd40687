"""The replay's seam between simulated engines and the router: what a real router gets, nothing more.

A real router learns about the fleet from three things only: its own decisions, the lifecycle of
the requests it routed (first token, end) and the engines' KV events. `ReplayRouter` is exactly
that surface, and the replayer talks to routers through it alone. `KvRouterAdapter` puts the real
`KvRouter` behind it (never a copy), built from a `RouterConfig`, a virtual clock and a seeded rng
with no reference to any engine, plus the router's own admission queue when
`router_queue_threshold` is set (as `extproc.admission.AdmissionGate` does in the picker).
`DisaggRouterAdapter` does the same for the picker's two-stage `DisaggRouter` (a decode and a prefill
router). `KvEventTap` is the engines' side: it turns a prefix cache's listener callbacks into the router's
one event model (`BlocksStored` / `BlocksRemoved` / `AllBlocksCleared`), re-hashing each stored
block's tokens as the vLLM ZMQ decoder does, and hands them to whoever delivers events.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from extproc.router.config import QueuePolicy, RouterConfig
from extproc.router.disagg import DisaggPolicy, DisaggRouter, prefill_router_config
from extproc.router.hashing import compute_block_hashes
from extproc.router.queue import AdmissionQueue, QueuedRequest
from extproc.router.router import KvRouter
from extproc.router.tiers import tier_of_medium
from extproc.router.types import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    Decision,
    KvEvent,
    StoredBlock,
    Worker,
    WorkerSpec,
)


@dataclass(frozen=True, slots=True)
class RouteResult:
    """What the replay records of a decision: the worker, and overlaps as the router saw them."""

    request_id: str
    worker: Worker
    overlap_blocks: int  # cached prefix blocks on the chosen worker
    best_overlap_blocks: int  # the largest cached prefix on any worker
    # disaggregated routing: the worker that prefills the prompt (None: `worker` does), or why not
    prefill_worker: Worker | None = None
    local_reason: str | None = None
    prefill_overlap_blocks: int = 0  # the prefill decision's overlap (what replica sync shares)


class ReplayRouter(Protocol):
    """Everything a router may see during a replay. Arguments are plain data; no engine state."""

    def route(
        self, request_id: str, local_hashes: Sequence[int], isl: int, output_tokens: int
    ) -> RouteResult | None:
        """Choose a worker for a new request and start tracking it; None: it waits in the router's
        admission queue and comes out of `released` later."""
        ...

    def released(self) -> list[RouteResult]:
        """Queued requests decided now (capacity freed); called after every instant of the replay."""
        ...

    @property
    def waiting(self) -> int:
        """Requests held in the admission queue."""
        ...

    def on_first_token(self, request_id: str) -> None: ...

    def on_end(self, request_id: str) -> None:
        """The request finished or was rejected by its worker."""
        ...

    def on_kv_event(self, event: KvEvent) -> None: ...


@dataclass(slots=True)
class _Held:
    local_hashes: Sequence[int]
    isl: int
    output_tokens: int


class KvRouterAdapter:
    """The real KvRouter behind the `ReplayRouter` surface.

    `clock_s` is the replay's virtual clock in seconds. Round-robin and random are the router's own
    modes; for them the best available overlap is read from the router's indexer, which the KV
    events keep up to date whatever the mode.
    """

    def __init__(
        self,
        config: RouterConfig,
        workers: Sequence[WorkerSpec],
        *,
        clock_s: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self.router = KvRouter(config, clock=clock_s, rng=rng, workers=workers)
        self._clock_s = clock_s
        self._queue = AdmissionQueue(config.router_queue_policy)
        self._held: dict[str, _Held] = {}

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def route(
        self, request_id: str, local_hashes: Sequence[int], isl: int, output_tokens: int
    ) -> RouteResult | None:
        router = self.router
        if router.config.router_queue_threshold is not None and (self._queue or not router.has_capacity()):
            entry = QueuedRequest(request_id, self._clock_s(), new_tokens=isl)
            if self._queue.policy is QueuePolicy.WSPT:
                best = (
                    max(router.indexer.find_matches(local_hashes).values(), default=0) if local_hashes else 0
                )
                entry.new_tokens = max(1, isl - best * router.config.block_size)
            self._queue.push(entry)
            self._held[request_id] = _Held(local_hashes, isl, output_tokens)
            return None
        return self._decide(request_id, local_hashes, isl, output_tokens)

    def released(self) -> list[RouteResult]:
        out = []
        while self._queue and self.router.has_capacity():
            entry = self._queue.peek()
            assert entry is not None
            self._queue.remove(entry.request_id, released=True)
            held = self._held.pop(entry.request_id)
            out.append(self._decide(entry.request_id, held.local_hashes, held.isl, held.output_tokens))
        return out

    def _decide(
        self, request_id: str, local_hashes: Sequence[int], isl: int, output_tokens: int
    ) -> RouteResult:
        decision = self.router.best_worker_for_hashes(
            local_hashes, isl, request_id=request_id, expected_output_tokens=output_tokens
        )
        chosen, best = _overlaps(self.router, decision, local_hashes)
        return RouteResult(request_id, decision.worker, chosen, best)

    def on_first_token(self, request_id: str) -> None:
        self.router.mark_prefill_complete(request_id)

    def on_end(self, request_id: str) -> None:
        self.router.free(request_id)

    def on_kv_event(self, event: KvEvent) -> None:
        if self.router.config.use_kv_events:  # approximate mode: no subscription, the router predicts
            self.router.apply_event(event)


def _overlaps(
    router: KvRouter, decision: Decision, local_hashes: Sequence[int], looked: bool | None = None
) -> tuple[int, int]:
    """Cached prefix blocks on the chosen worker and the best one, as the router's indexer sees them."""
    chosen, best = decision.overlap_blocks, decision.best_overlap_blocks
    if looked is None:
        looked = bool(decision.costs)
    if not looked and local_hashes:  # round robin, random, overlap weight 0: the router did not look
        overlaps = router.indexer.find_matches(local_hashes)
        chosen, best = overlaps.get(decision.worker, 0), max(overlaps.values(), default=0)
    return chosen, max(best, chosen)


class DisaggRouterAdapter(KvRouterAdapter):
    """The real `DisaggRouter` (the picker's two stages) behind the `ReplayRouter` surface.

    `self.router` is the decode router (its admission queue is the replay's, as for one router) and
    `self.prefill` the prefill router, built with `prefill_router_config` and its own rng. KV events
    go to the router that knows their worker; the lifecycle calls are the DisaggRouter's: the first
    token (on the decode worker) ends the prefill share, the end frees both.
    """

    def __init__(
        self,
        config: RouterConfig,
        decode_workers: Sequence[WorkerSpec],
        prefill_workers: Sequence[WorkerSpec],
        policy: DisaggPolicy,
        *,
        clock_s: Callable[[], float],
        rng: random.Random,
        prefill_rng: random.Random,
    ) -> None:
        super().__init__(config, decode_workers, clock_s=clock_s, rng=rng)
        self.prefill = KvRouter(
            prefill_router_config(config), clock=clock_s, rng=prefill_rng, workers=prefill_workers
        )
        self.disagg = DisaggRouter(self.router, self.prefill, policy)
        self._prefill_ids = {spec.worker_id for spec in prefill_workers}

    def _decide(
        self, request_id: str, local_hashes: Sequence[int], isl: int, output_tokens: int
    ) -> RouteResult:
        d = self.disagg.route(local_hashes, isl, request_id=request_id, expected_output_tokens=output_tokens)
        weight = self.disagg.policy.decode_overlap_weight
        looked = bool(d.decode.costs) and weight != 0  # None: the decode router's own weight
        chosen, best = _overlaps(self.router, d.decode, local_hashes, looked)
        prefill_overlap = d.prefill.overlap_blocks if d.prefill is not None else 0  # as serve shares it
        return RouteResult(
            request_id, d.decode.worker, chosen, best, d.prefill_worker, d.local_reason, prefill_overlap
        )

    def on_first_token(self, request_id: str) -> None:
        self.disagg.first_token(request_id)

    def on_end(self, request_id: str) -> None:
        self.disagg.free(request_id)

    def on_kv_event(self, event: KvEvent) -> None:
        if not self.router.config.use_kv_events:
            return
        if event.worker.worker_id in self._prefill_ids:
            self.prefill.apply_event(event)
        else:
            self.router.apply_event(event)

    def is_idle(self) -> bool:
        return self.disagg.is_idle() and not self.waiting


class KvEventTap:
    """A prefix cache's `KvCacheListener` that emits the router's KV events for one worker.

    Stored blocks carry the engine's id (the cache's sequence hash) and the router's local hash of
    the block's tokens, recomputed here as a real event decoder does. `sink` receives each event;
    event ids are consecutive per worker, as engines number them.
    """

    def __init__(self, worker: Worker, block_size: int, sink: Callable[[KvEvent], None]) -> None:
        self.worker = worker
        self.block_size = block_size
        self.sink = sink
        self._event_id = 0

    def _next_id(self) -> int:
        self._event_id += 1
        return self._event_id

    def on_stored(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
    ) -> None:
        bs = self.block_size
        blocks = tuple(
            StoredBlock(engine_hash, compute_block_hashes(tokens, bs, namespace=cache_salt)[0])
            for engine_hash, tokens in zip(block_hashes, token_ids, strict=True)
        )
        self.sink(BlocksStored(self.worker, blocks, parent_hash, self._next_id()))

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        self.sink(BlocksRemoved(self.worker, tuple(block_hashes), self._next_id()))

    def on_offloaded(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
        medium: str = "CPU",
    ) -> None:
        """The engine's host tier (an `OffloadListener`): events of that tier, as a decoder makes them."""
        bs = self.block_size
        blocks = tuple(
            StoredBlock(engine_hash, compute_block_hashes(tokens, bs, namespace=cache_salt)[0])
            for engine_hash, tokens in zip(block_hashes, token_ids, strict=True)
        )
        self.sink(BlocksStored(self.worker, blocks, parent_hash, self._next_id(), _tier(medium)))

    def on_offload_removed(self, block_hashes: Sequence[int], *, medium: str = "CPU") -> None:
        self.sink(BlocksRemoved(self.worker, tuple(block_hashes), self._next_id(), _tier(medium)))

    def on_cleared(self) -> None:
        self.sink(AllBlocksCleared(self.worker, self._next_id()))


def _tier(medium: str) -> str:
    tier = tier_of_medium(medium)
    if tier is None:
        raise ValueError(f"unknown medium {medium!r}")
    return tier
