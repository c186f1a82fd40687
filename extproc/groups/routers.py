"""GroupRouters: one picker's routers seen as a router group. Probe, commit, lifecycle, potential loads.

Synchronous decisions over the picker's pools (one `KvRouter` per model): no I/O, no protobuf.
`servicer.py` serves it over gRPC to other pickers; `local.py` offers it to this picker's own
selector. Both see the same routers the picker's ext_proc stream uses, so a worker's load is one
picture whichever way its requests came in.

- A probe is a `best_worker_for_hashes` call without a request id: it changes no load and tracks
  nothing (ties and temperature draw from the router's rng).
- A commit pins the probed worker; if that worker has left the group, is no longer allowed or is
  over a busy threshold, the group decides again and says so (`redecided`).
- Request ids are the caller's, extended with `@n` when this group already tracks that id (two
  top-level pickers, or the picker's own ext_proc traffic, may reuse one).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import count
from typing import Protocol

from extproc.epp.answers import endpoint_matches
from extproc.errors import UnknownModel
from extproc.groups.types import (
    GroupChoice,
    GroupDecision,
    GroupLoad,
    GroupLoads,
    GroupProbe,
    GroupRequest,
    GroupWorkerLoad,
)
from extproc.router import Decision, KvRouter, NoWorkers, Worker, WorkerId


class GroupPool(Protocol):
    """One model's workers as the group needs them (`extproc.picker.ModelPool` fits)."""

    @property
    def router(self) -> KvRouter: ...

    def endpoint_of(self, worker: Worker) -> str: ...


class GroupRouters:
    """The decisions of a router group over a picker's pools (model -> pool)."""

    def __init__(self, name: str, pools: Mapping[str, GroupPool]) -> None:
        self.name = name
        self.pools = pools
        self._ids = count(1)
        self._hashes: tuple[GroupRequest, int, list[int]] | None = None  # the last request's block hashes

    # --- decisions ---------------------------------------------------------------------------

    def probe(self, request: GroupRequest) -> GroupProbe:
        """Which worker this group would choose; changes no state.

        Raises UnknownModel, NoWorkers (none registered or allowed) or AllWorkersBusy.
        """
        pool = self._pool(request.model)
        router = pool.router
        decision = router.best_worker_for_hashes(
            self._block_hashes(router, request),
            request.input_tokens,
            config_override=request.overrides,
            allowed_workers=self._allowed(pool, request.restrictions),
            expected_output_tokens=request.expected_output_tokens,
        )
        return GroupProbe(self.name, _choice(pool, decision), group_load(router), router.config.block_size)

    def commit(self, request: GroupRequest, request_id: str, probed: Worker | None) -> GroupDecision:
        """Track the request on `probed`, or on a new decision if `probed` cannot take it any more.

        Raises UnknownModel, NoWorkers or AllWorkersBusy (a new decision found nothing).
        """
        pool = self._pool(request.model)
        router = pool.router
        hashes = self._block_hashes(router, request)
        allowed = self._allowed(pool, request.restrictions)
        tracked_id = self._unique_id(router, request_id)
        pinned = _resolve(router, probed) if probed is not None else None
        decision = router.best_worker_for_hashes(
            hashes,
            request.input_tokens,
            request_id=tracked_id,
            config_override=request.overrides,
            preferred_worker=pinned,
            allowed_workers=allowed,
            expected_output_tokens=request.expected_output_tokens,
        )
        redecided = pinned is None or decision.worker != pinned
        self._hashes = None
        choice = _choice(pool, decision)
        return GroupDecision(self.name, tracked_id, choice, redecided, choice.best_overlap_blocks)

    def potential_loads(self, request: GroupRequest) -> GroupLoads:
        """Per allowed worker: its load if the request went there, and its overlap. Changes no state."""
        pool = self._pool(request.model)
        router = pool.router
        loads = router.get_potential_loads(
            request.token_ids,
            lora_name=request.lora_name,
            cache_salt=request.cache_salt,
            allowed_workers=self._allowed(pool, request.restrictions),
            config_override=request.overrides,
        )
        workers = tuple(
            GroupWorkerLoad(
                load.worker, pool.endpoint_of(load.worker), load.prefill_tokens, load.decode_blocks,
                load.overlap_blocks,
            )
            for load in loads
        )  # fmt: skip
        return GroupLoads(self.name, workers, group_load(router), router.config.block_size)

    # --- lifecycle ---------------------------------------------------------------------------

    def mark_prefill_complete(self, model: str, request_id: str) -> bool:
        pool = self.pools.get(model)
        return pool is not None and pool.router.mark_prefill_complete(request_id)

    def free(self, model: str, request_id: str) -> bool:
        pool = self.pools.get(model)
        return pool is not None and pool.router.free(request_id)

    # --- internals ---------------------------------------------------------------------------

    def _pool(self, model: str) -> GroupPool:
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
            if request.isl is None
            else []
        )
        self._hashes = (request, block_size, hashes)
        return hashes

    def _allowed(
        self, pool: GroupPool, restrictions: Sequence[Sequence[str]] | None
    ) -> Collection[WorkerId | Worker] | None:
        if restrictions is None:
            return None
        allowed = {
            w
            for w in pool.router.workers()
            if all(endpoint_matches(pool.endpoint_of(w), r) for r in restrictions)
        }
        if not allowed:
            raise NoWorkers(f"no worker of router group {self.name!r} is in the allowed endpoint subset")
        return allowed

    def _unique_id(self, router: KvRouter, request_id: str) -> str:
        tracked = request_id or "req"
        while tracked in router.sequences:
            tracked = f"{request_id or 'req'}@{next(self._ids)}"
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


def _choice(pool: GroupPool, decision: Decision) -> GroupChoice:
    return GroupChoice(
        worker=decision.worker,
        endpoint=pool.endpoint_of(decision.worker),
        headers=_headers(pool.router, decision.worker),
        overlap_blocks=decision.overlap_blocks,
        request_blocks=decision.request_blocks,
        cost=decision.cost,
        best_overlap_blocks=max(decision.best_overlap_blocks, decision.overlap_blocks),
    )


def _headers(router: KvRouter, worker: Worker) -> dict[str, str]:
    spec = router.spec(worker.worker_id)
    if spec is None or len(spec.dp_ranks) <= 1:
        return {}
    from extproc.picker.pipeline import (
        DP_RANK_HEADER,  # the picker imports this package: a top-level import cycles
    )

    return {DP_RANK_HEADER: str(worker.dp_rank)}
