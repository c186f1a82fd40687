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

from extproc.router.config import RouterConfig
from extproc.router.types import KvEvent, Worker, WorkerSpec
from extproc.sim.replay_router import KvRouterAdapter, RouteResult


class ReplicaAssignment(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    SESSION = "session"  # hashed by the prompt's first block


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    worker: Worker
    local_hashes: Sequence[int]
    isl: int
    overlap_blocks: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class _Lifecycle:
    request_id: str
    prefill: bool  # True: prefill complete; False: free


class ReplicatedRouter:
    """`replicas` real routers (each a `KvRouterAdapter`), one replay, a lagged sync between them."""

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
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if sync_lag_ms < 0:
            raise ValueError(f"sync_lag_ms must be >= 0, got {sync_lag_ms}")
        seeds = [rng.getrandbits(64) for _ in range(replicas)]
        self.replicas = [
            KvRouterAdapter(config, workers, clock_s=clock_s, rng=random.Random(s)) for s in seeds
        ]
        self.router = self.replicas[0].router  # the first replica's router (for analysis)
        self._clock_s = clock_s
        self._lag_s = sync_lag_ms / 1000.0
        self._assignment = ReplicaAssignment(assignment)
        self._next = 0
        self._owner: dict[str, int] = {}
        self._held: dict[str, _Add] = {}  # what a queued request's `add` will carry
        # (due s, sender, message): one lag for all, so one FIFO keeps every sender's order
        self._outbox: deque[tuple[float, int, _Add | _Lifecycle]] = deque()
        self.messages = 0

    @property
    def waiting(self) -> int:
        return sum(r.waiting for r in self.replicas)

    def _deliver(self, until_s: float | None = None) -> None:
        now = self._clock_s() if until_s is None else until_s
        box = self._outbox
        while box and box[0][0] <= now:
            _, sender, message = box.popleft()
            for i, replica in enumerate(self.replicas):
                if i == sender:
                    continue
                router = replica.router
                if isinstance(message, _Add):
                    router.add_request(
                        message.request_id,
                        message.worker,
                        message.local_hashes,
                        message.isl,
                        message.overlap_blocks,
                        expected_output_tokens=message.output_tokens,
                    )
                elif message.prefill:
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
        self._owner[result.request_id] = replica
        self._publish(
            replica,
            _Add(
                result.request_id,
                result.worker,
                held.local_hashes,
                held.isl,
                result.overlap_blocks,
                held.output_tokens,
            ),
        )
        return result

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
        self._publish(owner, _Lifecycle(request_id, True))

    def on_end(self, request_id: str) -> None:
        self._deliver()
        owner = self._owner.pop(request_id, None)
        if owner is None:
            return
        self.replicas[owner].on_end(request_id)
        self._publish(owner, _Lifecycle(request_id, False))

    def on_kv_event(self, event: KvEvent) -> None:
        self._deliver()
        for replica in self.replicas:
            replica.on_kv_event(event)


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
