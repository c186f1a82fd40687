"""Disaggregated prefill/decode: which worker decodes a request, which prefills it, or neither split.

A model with prefill workers is routed in two stages over two routers (REFERENCE: Dynamo's
disaggregated serving):

1. The decode router chooses the decode worker, the request's HTTP destination, among the decode
   (and aggregated) workers. Its overlap weight may be set apart (`decode_overlap_weight`; 0 is
   Dynamo's decode stage: balance decode load only).
2. Conditional disaggregation: when the part of the prompt the decode worker does not cache is
   short, or the decode worker already caches most of the prompt, it prefills locally (an
   aggregated request). Otherwise the prefill router chooses the prefill worker by overlap and
   prefill load; it tracks no decode blocks (prefill workers do not decode).
3. No prefill worker, or all busy: the decode worker prefills locally (fallback, never an error).

A remotely prefilled request's prompt work is not the decode worker's: its prefill tokens are
released on the decode router at once. The prefill worker's share ends at the first token (the
prompt is prefilled and transferred by then), or when the request ends first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from extproc.router.config import RouterConfig, RouterConfigOverride
from extproc.router.errors import AllWorkersBusy, NoWorkers
from extproc.router.radix import OverlapScores
from extproc.router.router import KV_RULES, KvRouter, WorkerFilter
from extproc.router.types import Decision, Worker, WorkerId

# why a request of a disaggregated model is prefilled on its decode worker
LOCAL_SHORT = "short-uncached"  # fewer uncached tokens than min_remote_prefill_tokens
LOCAL_CACHED = "decode-cached"  # the decode worker caches at least max_decode_prefix_frac
LOCAL_NO_PREFILL = "no-prefill-worker"  # none registered, or none allowed/healthy
LOCAL_PREFILL_BUSY = "prefill-busy"  # every prefill worker is over a busy threshold


@dataclass(frozen=True, slots=True)
class DisaggPolicy:
    """When a prompt is worth sending to a prefill worker (conditional disaggregation)."""

    min_remote_prefill_tokens: int = 256
    max_decode_prefix_frac: float = 0.8
    decode_overlap_weight: float | None = None  # None: the decode router's own weight

    def local_reason(self, isl: int, decode_cached_tokens: int) -> str | None:
        """Why the decode worker should prefill this prompt itself, or None to prefill remotely."""
        cached = min(isl, decode_cached_tokens)
        if isl - cached < self.min_remote_prefill_tokens:
            return LOCAL_SHORT
        if isl > 0 and cached / isl >= self.max_decode_prefix_frac:
            return LOCAL_CACHED
        return None


def prefill_router_config(config: RouterConfig) -> RouterConfig:
    """The prefill router's config: the model's, without decode tracking or an admission queue.

    Prefill tokens are always tracked there: `--no-router-track-prefill-tokens` and
    `--no-router-assume-kv-reuse` describe the decode side (Dynamo's decode-only path).
    """
    return replace(
        config,
        router_track_prefill_tokens=True,
        router_track_active_blocks=False,
        router_track_output_blocks=False,
        router_queue_threshold=None,
    )


@dataclass(frozen=True, slots=True)
class DisaggDecision:
    """Both stages' answers: `prefill` None means the decode worker prefills (`local_reason` says why)."""

    decode: Decision
    prefill: Decision | None = None
    local_reason: str | None = None

    @property
    def prefill_worker(self) -> Worker | None:
        return self.prefill.worker if self.prefill is not None else None


class DisaggRouter:
    """The two stages over a decode router and a prefill router; both track the same request id."""

    def __init__(self, decode: KvRouter, prefill: KvRouter, policy: DisaggPolicy) -> None:
        self.decode = decode
        self.prefill = prefill
        self.policy = policy

    def route(
        self,
        local_hashes: Sequence[int],
        isl: int,
        *,
        request_id: str,
        config_override: RouterConfigOverride | None = None,
        preferred_worker: Worker | WorkerId | None = None,
        allowed_workers: WorkerFilter | None = None,
        prefill_allowed: WorkerFilter | None = None,
        expected_output_tokens: int | None = None,
        found: OverlapScores | None = None,
    ) -> DisaggDecision:
        """Choose the decode worker, then (unless prefilling locally) the prefill worker.

        `found`: a KV indexer's answer for every worker of the model, decode and prefill (each
        router reads its own workers' part), in place of both routers' own indexes.

        Raises what the decode router raises (NoWorkers, AllWorkersBusy); never fails for want
        of a prefill worker.
        """
        decode_override = self._decode_override(config_override)
        cfg = self.decode.config.merged(decode_override)
        looked_up = cfg.mode in KV_RULES and cfg.overlap_score_weight > 0
        # the decision records its own prediction of the worker's cache: look up before it
        cached: OverlapScores = {}
        if not looked_up and local_hashes:
            cached = self.decode.find_matches(local_hashes) if found is None else found
        decode = self.decode.best_worker_for_hashes(
            local_hashes,
            isl,
            request_id=request_id,
            config_override=decode_override,
            preferred_worker=preferred_worker,
            allowed_workers=allowed_workers,
            expected_output_tokens=expected_output_tokens,
            found=found,
        )
        cached_blocks = decode.overlap_blocks if looked_up else cached.get(decode.worker, 0)
        reason = self.policy.local_reason(isl, cached_blocks * self.block_size)
        if reason is not None:
            return DisaggDecision(decode, None, reason)
        try:
            prefill = self.prefill.best_worker_for_hashes(
                local_hashes,
                isl,
                request_id=request_id,
                config_override=config_override,
                allowed_workers=prefill_allowed,
                found=found,
            )
        except NoWorkers:
            return DisaggDecision(decode, None, LOCAL_NO_PREFILL)
        except AllWorkersBusy:
            return DisaggDecision(decode, None, LOCAL_PREFILL_BUSY)
        self.decode.mark_prefill_complete(request_id)  # the prompt work is the prefill worker's
        return DisaggDecision(decode, prefill)

    def first_token(self, request_id: str) -> bool:
        """The decode worker streams: the prompt is prefilled (and transferred). True if tracked."""
        freed = self.prefill.free(request_id)
        return self.decode.mark_prefill_complete(request_id) or freed

    def free(self, request_id: str) -> bool:
        """The request ended: release it on both routers (idempotent). True if it was tracked."""
        freed = self.prefill.free(request_id)
        return self.decode.free(request_id) or freed

    def is_idle(self) -> bool:
        return self.decode.is_idle() and self.prefill.is_idle()

    @property
    def block_size(self) -> int:
        return self.decode.config.block_size

    def _decode_override(self, override: RouterConfigOverride | None) -> RouterConfigOverride | None:
        weight = self.policy.decode_overlap_weight
        if weight is None or (override is not None and override.overlap_score_weight is not None):
            return override
        return replace(override or RouterConfigOverride(), overlap_score_weight=weight)
