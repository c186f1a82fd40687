"""Disaggregated trace replay: prefill engines, decode engines and the picker's two-stage router. No I/O.

`DisaggReplayer` is the replayer (`extproc.sim.replay`) with a second kind of engine. The
decode workers are engines 0..D-1 (the request's destination, as in aggregated serving), the
prefill workers engines D..D+P-1. The real `DisaggRouter` decides through
`extproc.sim.replay_router.DisaggRouterAdapter`, so the replay measures the product's policy.
Per request:

- Local (the router's `local_reason`: short uncached part, decode-cached prefix, no or busy prefill
  worker): the decode engine prefills and decodes it, exactly as an aggregated replay does.
- Remote: the prefill engine computes the prompt as a request with one output token (its KV events
  reach the prefill router). When that token is emitted the KV transfer starts; it lasts
  `setup.kv_transfer.duration_ms(blocks)` (`extproc.sim.transfer`, the mock worker's model too) for
  the prompt's transferable blocks (its full blocks up to the cached-prefix cap). It then lands in
  the decode engine's pool as cached blocks (`Engine.receive_blocks`: they are reported stored to
  the decode router) and the request joins the decode engine's queue, which is admitted with them as
  its cached prefix, computes the rest of the prompt (1 to B tokens, priced by the prefill formula
  like any prefill) and decodes. Its TTFT is that first decode-side token: prefill + transfer + the
  decode engine's first pass; its ITL the decode engine's. Its prefix reuse is the prefill engine's.
- Lifecycle to the router: `first_token` when the decode engine emits the first token, `free` at
  the end (or when an engine refuses the request).

With `replicas` (`extproc.sim.replay_replicas.ReplicaSetup`) of more than one, arrivals are spread
over that many disaggregated routers kept in step by the replica-sync model, the prefill legs shared
or not (`share_prefill`).

A transfer the decode pool cannot take (all its blocks held by running requests) is counted and the
request prefills its whole prompt on the decode worker. With no prefill worker every request is
local and the replay equals the aggregated one request by request.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from extproc.router.config import RouterConfig
from extproc.router.disagg import DisaggPolicy
from extproc.router.hashing import compute_sequence_hashes
from extproc.router.types import WorkerSpec
from extproc.sim.engine import PassEntry, RequestTooLarge
from extproc.sim.replay import ReplayConfig, Replayer, ReplayResult, _Worker
from extproc.sim.replay_replicas import PrefillFleet, ReplicaSetup, ReplicatedRouter
from extproc.sim.replay_router import DisaggRouterAdapter, ReplayRouter, RouteResult
from extproc.sim.trace import TraceRequest
from extproc.sim.transfer import KvTransferModel

_TRANSFER = 3  # a KV transfer lands on its decode worker (after pass ends, KV events and polls)


@dataclass(frozen=True, slots=True)
class DisaggSetup:
    """The prefill fleet, the simulated KV transfer and the conditional-disaggregation policy."""

    prefill_workers: int
    policy: DisaggPolicy = field(default_factory=DisaggPolicy)
    kv_transfer: KvTransferModel = field(default_factory=KvTransferModel)

    def __post_init__(self) -> None:
        if self.prefill_workers < 0:
            raise ValueError(f"prefill_workers must be >= 0, got {self.prefill_workers}")


@dataclass(slots=True)
class _InFlight:
    """A remotely prefilled request between its prefill and its arrival on the decode worker."""

    req: TraceRequest
    tokens: list[int]
    local: list[int]
    decode_worker: int
    blocks: list[int] = field(default_factory=list)  # sequence hashes of the transferred blocks


class DisaggReplayer(Replayer):
    """Replays `requests` through `config.num_workers` decode and `setup.prefill_workers` prefill engines."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        config: ReplayConfig,
        setup: DisaggSetup,
        *,
        replicas: ReplicaSetup | None = None,
        progress: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.setup = setup
        self.replica_setup = replicas or ReplicaSetup()
        self.num_decode = config.num_workers
        super().__init__(requests, config, router_factory=self._router_factory, progress=progress)
        self._workers += [self._make_worker(config.num_workers + j) for j in range(setup.prefill_workers)]
        self._in_flight: dict[str, _InFlight] = {}
        self._transfers_not_landed = 0

    def _router_factory(
        self,
        config: RouterConfig,
        decode: Sequence[WorkerSpec],
        clock_s: Callable[[], float],
        rng: random.Random,
    ) -> ReplayRouter:
        e = self.config.engine
        prefill = [
            WorkerSpec(
                self.num_decode + j,
                total_blocks=e.num_gpu_blocks,
                max_num_batched_tokens=e.max_num_batched_tokens,
            )
            for j in range(self.setup.prefill_workers)
        ]
        r = self.replica_setup
        if r.replicas > 1:
            return ReplicatedRouter(
                config,
                decode,
                clock_s=clock_s,
                rng=rng,
                replicas=r.replicas,
                sync_lag_ms=r.sync_lag_ms,
                assignment=r.assignment,
                disagg=PrefillFleet(prefill, self.setup.policy),
                share_prefill=r.share_prefill,
            )
        # the prefill router's rng is its own, so the decode router draws as an aggregated one would
        prefill_rng = random.Random(f"prefill-{self.config.seed}")
        return DisaggRouterAdapter(
            config, decode, prefill, self.setup.policy, clock_s=clock_s, rng=rng, prefill_rng=prefill_rng
        )

    def run(self) -> ReplayResult:
        result = super().run()
        result.disaggregated = True
        result.num_prefill_workers = self.setup.prefill_workers
        result.transfers_not_landed = self._transfers_not_landed
        return result

    def _place(self, result: RouteResult, touched: set[_Worker]) -> int:
        if result.prefill_worker is None:
            self._records[result.request_id].local_reason = result.local_reason
            return super()._place(result, touched)
        req, tokens, local = self._pending.pop(result.request_id)
        record = self._records[result.request_id]
        record.worker = int(result.worker.worker_id)
        record.prefill_worker = int(result.prefill_worker.worker_id)
        record.routed_ms = self.now_ms
        record.overlap_blocks = result.overlap_blocks
        record.best_overlap_blocks = result.best_overlap_blocks
        prefill = self._workers[record.prefill_worker]
        try:  # the prompt alone, as a request with one output token
            prefill.engine.add_request(result.request_id, tokens, 1, self.now_ms, local_block_hashes=local)
        except RequestTooLarge:
            record.rejected = True
            self.router.on_end(result.request_id)
            return 1
        self._in_flight[result.request_id] = _InFlight(req, tokens, local, record.worker)
        touched.add(prefill)
        return 0

    def _admitted(self, w: _Worker, entry: PassEntry) -> None:
        if w.index < self.num_decode and self._records[entry.request_id].remote_prefill:
            return  # its prompt came by transfer: its reuse is the prefill engine's
        super()._admitted(w, entry)

    def _finish_pass(self, w: _Worker) -> int:
        if w.index < self.num_decode:
            return super()._finish_pass(w)
        p = w.busy
        assert p is not None
        w.busy = None
        bs = self.config.engine.block_size
        for entry in w.engine.finish_pass(p):
            if not entry.finished:
                continue
            # the prompt is computed: transfer its full blocks up to the cached-prefix cap
            flight = self._in_flight[entry.request_id]
            cap = (len(flight.tokens) - 1) // bs
            flight.blocks = compute_sequence_hashes(flight.local[:cap])
            record = self._records[entry.request_id]
            record.prefill_end_ms = self.now_ms
            record.transfer_ms = self.setup.kv_transfer.duration_ms(len(flight.blocks))
            self._push(self.now_ms + record.transfer_ms, _TRANSFER, entry.request_id)
        return 0

    def _on_event(self, kind: int, payload: object, touched: set[_Worker]) -> int:
        if kind != _TRANSFER:
            return super()._on_event(kind, payload, touched)
        assert isinstance(payload, str)
        flight = self._in_flight.pop(payload)
        decode = self._workers[flight.decode_worker]
        if not decode.engine.receive_blocks(flight.blocks, flight.tokens):
            self._transfers_not_landed += 1
        try:
            decode.engine.add_request(
                payload, flight.tokens, flight.req.output_tokens, self.now_ms, local_block_hashes=flight.local
            )
        except RequestTooLarge:  # not with equal pools: the prefill engine took it
            self._records[payload].rejected = True
            self.router.on_end(payload)
            return 1
        touched.add(decode)
        return 0
