"""Router replicas in a replay: N real routers share in-flight load through a lagged replica-sync model.

Owns the replicas' side of a replay (`ReplayRouter` surface, so the replayer is unchanged). Mirrors
what `extproc.events.replica_sync` shares between `serve` replicas, and nothing more:

- arrivals are spread over the replicas, round robin or hashed by session (here the first hash id of
  the prompt: a trace names no session, and requests of one conversation share their first block);
- the replica that routed a request sees its lifecycle at once (it holds the response stream); the
  others get its `add` (worker, block hashes, ISL, overlap, expected output), `prefill` and `free`
  `sync_lag_ms` later, in publishing order, as `KvRouter.add_request`, `mark_prefill_complete` and
  `free`, the calls replica sync makes;
- every replica receives every engine KV event (each subscribes to the engines).

Disaggregated replicas (`PrefillFleet`: each replica a `DisaggRouterAdapter`, decode and prefill
router) share what serve's replica sync shares of the picker's two stages. A remotely prefilled
request publishes its decode `add`, then `prefill` (its prompt is not the decode worker's work),
then the prefill leg: an `add` on the prefill worker under its own id (serve's `prefill_leg_id`),
with the prefill router's overlap and no expected output. Its first token publishes the leg's
`free` (the decode side is marked prefilled already); its end publishes `free`, and the leg's if
still open. A receiver applies an `add` to its router that knows the worker and `prefill` / `free`
to both (a router not tracking the id ignores it); prefill workers' KV events go to each replica's
prefill router. `share_prefill=False` models serve before it shared the leg (2026-11-27): only the
decode side is published, so each replica sees only its own requests' prefill load.

Messages are applied lazily: before any call that reads or changes a replica's state, every message
due by the virtual clock is delivered, which is what delivering each at its own instant would give,
since nothing reads a replica in between.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extproc.events.replica_wire import prefill_leg_id  # serve's id of a prefill leg
from extproc.router.config import RouterConfig
from extproc.router.disagg import DisaggPolicy
from extproc.router.router import KvRouter
from extproc.router.types import KvEvent, Worker, WorkerSpec
from extproc.sim.replay_router import DisaggRouterAdapter, KvRouterAdapter, RouteResult


class ReplicaAssignment(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    SESSION = "session"  # hashed by the prompt's first block


@dataclass(frozen=True, slots=True)
class PrefillFleet:
    """The prefill side of disaggregated replicas: every replica routes to these with this policy."""

    workers: Sequence[WorkerSpec]
    policy: DisaggPolicy


@dataclass(frozen=True, slots=True)
class ReplicaSetup:
    """How many router replicas a replay runs and what their replica sync shares, with what lag."""

    replicas: int = 1
    sync_lag_ms: float = 10.0
    assignment: ReplicaAssignment = ReplicaAssignment.ROUND_ROBIN
    share_prefill: bool = True  # disaggregated: publish the prefill leg (serve since 2026-11-27)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.sync_lag_ms < 0:
            raise ValueError(f"sync_lag_ms must be >= 0, got {self.sync_lag_ms}")


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    worker: Worker
    local_hashes: Sequence[int]
    isl: int
    overlap_blocks: int
    output_tokens: int | None  # None: a prefill leg (prefill workers decode nothing)


@dataclass(frozen=True, slots=True)
class _Lifecycle:
    request_id: str
    prefill: bool  # True: prefill complete; False: free


class ReplicatedRouter:
    """`replicas` real routers, one replay, a lagged sync between them.

    Each replica is a `KvRouterAdapter`, or with `disagg` a `DisaggRouterAdapter` over its prefill
    workers (its prefill router's rng seeded from the replica's seed). `share_prefill` says whether
    disaggregated replicas publish their prefill legs (see the module docstring).
    """

    def __init__(
        self,
        config: RouterConfig,
        workers: Sequence[WorkerSpec],
        *,
        clock_s: Callable[[], float],
        rng: random.Random,
        replicas: int,
        sync_lag_ms: float,
        assignment: ReplicaAssignment = ReplicaAssignment.ROUND_ROBIN,
        disagg: PrefillFleet | None = None,
        share_prefill: bool = True,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if sync_lag_ms < 0:
            raise ValueError(f"sync_lag_ms must be >= 0, got {sync_lag_ms}")
        seeds = [rng.getrandbits(64) for _ in range(replicas)]
        self.replicas = [_replica(config, workers, disagg, clock_s, seed) for seed in seeds]
        self.router = self.replicas[0].router  # the first replica's (decode) router (for analysis)
        self._clock_s = clock_s
        self._lag_s = sync_lag_ms / 1000.0
        self._assignment = ReplicaAssignment(assignment)
        self._prefill_ids = frozenset(spec.worker_id for spec in disagg.workers) if disagg else frozenset()
        self._share_prefill = share_prefill
        self._next = 0
        self._owner: dict[str, int] = {}
        self._held: dict[str, _Add] = {}  # what a queued request's `add` will carry
        self._open_legs: set[str] = set()  # requests whose published prefill leg is not freed yet
        # (due s, sender, message): one lag for all, so one FIFO keeps every sender's order
        self._outbox: deque[tuple[float, int, _Add | _Lifecycle]] = deque()
        self.messages = 0

    @property
    def waiting(self) -> int:
        return sum(r.waiting for r in self.replicas)

    def routers_of(self, replica: int) -> tuple[KvRouter, ...]:
        """A replica's routers: its decode (or only) router, then its prefill router if it has one."""
        adapter = self.replicas[replica]
        if isinstance(adapter, DisaggRouterAdapter):
            return adapter.router, adapter.prefill
        return (adapter.router,)

    def _deliver(self, until_s: float | None = None) -> None:
        now = self._clock_s() if until_s is None else until_s
        box = self._outbox
        while box and box[0][0] <= now:
            _, sender, message = box.popleft()
            for i in range(len(self.replicas)):
                if i != sender:
                    self._apply(i, message)

    def _apply(self, replica: int, message: _Add | _Lifecycle) -> None:
        """What a receiving replica's sync does with one message."""
        routers = self.routers_of(replica)
        if isinstance(message, _Add):
            # the router that knows the worker: the prefill router for a prefill worker
            router = routers[-1] if message.worker.worker_id in self._prefill_ids else routers[0]
            router.add_request(
                message.request_id,
                message.worker,
                message.local_hashes,
                message.isl,
                message.overlap_blocks,
                expected_output_tokens=message.output_tokens,
            )
            return
        for router in routers:  # one that does not track the id ignores it
            if message.prefill:
                router.mark_prefill_complete(message.request_id)
            else:
                router.free(message.request_id)

    def settle(self) -> None:
        """Deliver every message still in flight (the replay is over: for analysis)."""
        if self._outbox:
            self._deliver(until_s=self._outbox[-1][0])

    def _publish(self, sender: int, message: _Add | _Lifecycle) -> None:
        if len(self.replicas) > 1:
            self.messages += 1
            self._outbox.append((self._clock_s() + self._lag_s, sender, message))
            if not self._lag_s:
                self._deliver()

    def _choose(self, local_hashes: Sequence[int]) -> int:
        n = len(self.replicas)
        if self._assignment is ReplicaAssignment.SESSION and local_hashes:
            return local_hashes[0] % n
        i = self._next % n
        self._next += 1
        return i

    def _routed(self, replica: int, result: RouteResult, held: _Add) -> RouteResult:
        rid = result.request_id
        self._owner[rid] = replica
        self._publish(
            replica,
            _Add(rid, result.worker, held.local_hashes, held.isl, result.overlap_blocks, held.output_tokens),
        )
        if result.prefill_worker is not None:
            self._publish(replica, _Lifecycle(rid, True))  # the prompt is not the decode worker's work
            if self._share_prefill:
                self._open_legs.add(rid)
                leg = _Add(
                    prefill_leg_id(rid),
                    result.prefill_worker,
                    held.local_hashes,
                    held.isl,
                    result.prefill_overlap_blocks,
                    None,
                )
                self._publish(replica, leg)
        return result

    def _free_leg(self, owner: int, request_id: str) -> None:
        """The prefill worker's share is over (first token or end): free the leg, once."""
        if request_id in self._open_legs:
            self._open_legs.discard(request_id)
            self._publish(owner, _Lifecycle(prefill_leg_id(request_id), False))

    def route(
        self, request_id: str, local_hashes: Sequence[int], isl: int, output_tokens: int
    ) -> RouteResult | None:
        self._deliver()
        i = self._choose(local_hashes)
        self._held[request_id] = _Add(request_id, Worker(0), local_hashes, isl, 0, output_tokens)
        self._owner[request_id] = i
        result = self.replicas[i].route(request_id, local_hashes, isl, output_tokens)
        if result is None:
            return None
        return self._routed(i, result, self._held.pop(request_id))

    def released(self) -> list[RouteResult]:
        self._deliver()
        out = []
        for i, replica in enumerate(self.replicas):
            for result in replica.released() if replica.waiting else ():
                out.append(self._routed(i, result, self._held.pop(result.request_id)))
        return out

    def on_first_token(self, request_id: str) -> None:
        self._deliver()
        owner = self._owner.get(request_id)
        if owner is None:
            return
        self.replicas[owner].on_first_token(request_id)
        if request_id in self._open_legs:  # its decode side was marked prefilled when routed
            self._free_leg(owner, request_id)
        else:
            self._publish(owner, _Lifecycle(request_id, True))

    def on_end(self, request_id: str) -> None:
        self._deliver()
        owner = self._owner.pop(request_id, None)
        if owner is None:
            return
        self.replicas[owner].on_end(request_id)
        self._publish(owner, _Lifecycle(request_id, False))
        self._free_leg(owner, request_id)

    def on_kv_event(self, event: KvEvent) -> None:
        self._deliver()
        for replica in self.replicas:
            replica.on_kv_event(event)


def _replica(
    config: RouterConfig,
    workers: Sequence[WorkerSpec],
    disagg: PrefillFleet | None,
    clock_s: Callable[[], float],
    seed: int,
) -> KvRouterAdapter:
    """One replica's router(s): the decode router draws from `seed`, a prefill router from its own rng."""
    if disagg is None:
        return KvRouterAdapter(config, workers, clock_s=clock_s, rng=random.Random(seed))
    return DisaggRouterAdapter(
        config,
        workers,
        disagg.workers,
        disagg.policy,
        clock_s=clock_s,
        rng=random.Random(seed),
        prefill_rng=random.Random(f"prefill-{seed}"),
    )


def replicated_router_factory(
    replicas: int, sync_lag_ms: float, assignment: ReplicaAssignment = ReplicaAssignment.ROUND_ROBIN
) -> Callable[[RouterConfig, Sequence[WorkerSpec], Callable[[], float], random.Random], ReplicatedRouter]:
    """A `RouterFactory` for `Replayer`: `replicas` routers synced with `sync_lag_ms` of lag."""

    def factory(
        config: RouterConfig, workers: Sequence[WorkerSpec], clock_s: Callable[[], float], rng: random.Random
    ) -> ReplicatedRouter:
        return ReplicatedRouter(
            config,
            workers,
            clock_s=clock_s,
            rng=rng,
            replicas=replicas,
            sync_lag_ms=sync_lag_ms,
            assignment=assignment,
        )

    return factory
