"""Model pools: the workers serving one model in this process, their routers and their tokenizer.

`ModelPool.router` chooses among the decode and aggregated workers (`workers`): the HTTP
destination. `prefill` holds the prefill workers (`prefill_workers`); while it has any, requests
go through `disagg`, which chooses the prefill worker too (or prefills on the decode worker).
`build_pools` makes one pool per configured model; the local router group decides over them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from extproc.config import PickerConfig, WorkerConfig
from extproc.request.tokenizer import RequestTokenizer
from extproc.router import DisaggRouter, KvRouter, Worker, WorkerSpec, prefill_router_config

log = logging.getLogger("extproc.picker")

DP_RANK_HEADER = "x-data-parallel-rank"  # vLLM's header for pinning a data-parallel rank


@dataclass(slots=True)
class ModelPool:
    """The workers serving one model, their routers and their tokenizer."""

    model: str
    router: KvRouter
    tokenizer: RequestTokenizer
    workers: dict[str, WorkerConfig]
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

    def extra_headers(self, worker: Worker) -> dict[str, str]:
        """Headers the worker needs besides the destination: its dp rank when it has several."""
        config = self.workers.get(str(worker.worker_id))
        return {DP_RANK_HEADER: str(worker.dp_rank)} if config and len(config.dp_ranks) > 1 else {}


def build_pools(
    config: PickerConfig, *, clock: Callable[[], float], rng: random.Random
) -> dict[str, ModelPool]:
    """One pool per configured model, over the configured workers of that model."""
    pools: dict[str, ModelPool] = {}
    for model in config.models:
        served = [w for w in config.workers if w.model == model.name]
        workers = {w.id: w for w in served if w.role != "prefill"}
        prefill_workers = {w.id: w for w in served if w.role == "prefill"}
        router = KvRouter(
            config.router, clock=clock, rng=rng, workers=specs(workers.values()), timer=time.perf_counter_ns
        )
        prefill = KvRouter(
            prefill_router_config(config.router),
            clock=clock,
            rng=rng,
            workers=specs(prefill_workers.values()),
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
            piece_cache_bytes=config.tokenizer_cache_bytes,
        )
        pools[model.name] = ModelPool(
            model.name, router, tokenizer, workers, prefill, disagg, prefill_workers
        )
        if prefill_workers:
            log.info(
                "%s: disaggregated serving with %d prefill and %d decode workers",
                model.name, len(prefill_workers), len(workers),
            )  # fmt: skip
    return pools


def specs(workers: Iterable[WorkerConfig]) -> list[WorkerSpec]:
    return [
        WorkerSpec(w.id, w.dp_ranks, w.total_blocks, w.max_num_batched_tokens, device=w.device)
        for w in workers
    ]
