"""Selection: the cost function, busy filters and the pick. Pure functions; randomness injected.

Mirrors Dynamo's default selector (lib/kv-router/src/scheduling/selector/default.rs):
    prefill_blocks = potential prefill tokens / block_size   (active + uncached tokens)
    decode_blocks  = potential decode blocks                   (active + this request's new)
    cost           = overlap_score_weight * prefill_blocks + decode_blocks
Temperature 0 takes the lowest cost, exact ties broken uniformly at random. Temperature T > 0
samples from a softmax over min-max normalised costs: p(w) ~ exp(-(c_w - c_min) / ((c_max - c_min) T)).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from extproc.router.config import PrefillLoadModel, RouterConfig
from extproc.router.types import WorkerCost, WorkerLoad


def compute_costs(
    loads: Sequence[WorkerLoad], block_size: int, overlap_score_weight: float
) -> list[WorkerCost]:
    """One WorkerCost per load, in the same order."""
    out = []
    for load in loads:
        prefill_blocks = max(0.0, load.prefill_tokens / block_size)
        cost = overlap_score_weight * prefill_blocks + load.decode_blocks
        out.append(WorkerCost(load.worker, cost, prefill_blocks, load.decode_blocks, load.overlap_blocks))
    return out


def cost_weight(cfg: RouterConfig) -> float:
    """The weight of the prefill term in the cost. Under the timing model the prefill term is the
    predicted time to first token, which already weighs cached blocks against every kind of load
    (and the decode term is 0): a positive weight only scales every cost alike, and 0, Dynamo's
    "pure load balancing, no indexer lookups", would make every cost 0 and the pick random. So at 0
    the timing model keeps ranking by predicted time, without cache credit (no lookups are made)."""
    weight = cfg.overlap_score_weight
    if weight == 0 and cfg.prefill_load_model is PrefillLoadModel.TIMING:
        return 1.0
    return weight


def softmax_probabilities(costs: Sequence[float], temperature: float) -> list[float]:
    """Selection probabilities for `costs` at `temperature` > 0 (uniform when all are equal)."""
    lo, hi = min(costs), max(costs)
    if hi - lo <= 0 or temperature <= 0:
        if temperature <= 0:
            best = [1.0 if c == lo else 0.0 for c in costs]
            total = sum(best)
            return [b / total for b in best]
        return [1.0 / len(costs)] * len(costs)
    scale = (hi - lo) * temperature
    weights = [math.exp(-(c - lo) / scale) for c in costs]
    total = sum(weights)
    return [w / total for w in weights]


def pick(costs: Sequence[WorkerCost], temperature: float, rng: random.Random) -> WorkerCost:
    """The chosen candidate: argmin with random tie-break, or a softmax draw when temperature > 0."""
    if not costs:
        raise ValueError("no candidates")
    if temperature <= 0:
        lo = min(c.cost for c in costs)
        best = [c for c in costs if c.cost == lo]
        return best[0] if len(best) == 1 else best[rng.randrange(len(best))]
    probabilities = softmax_probabilities([c.cost for c in costs], temperature)
    draw = rng.random()
    acc = 0.0
    for candidate, p in zip(costs, probabilities, strict=True):
        acc += p
        if draw < acc:
            return candidate
    return costs[-1]


def is_busy(
    *,
    decode_blocks: float,
    prefill_tokens: int,
    total_blocks: int,
    max_num_batched_tokens: int,
    decode_blocks_threshold: float | None,
    prefill_tokens_threshold: int | None,
    prefill_tokens_threshold_frac: float | None,
    reported_kv_usage: float | None = None,
) -> bool:
    """Whether a worker's current load excludes it (REFERENCE section 5, busy filters).

    `reported_kv_usage`: the engine's own KV usage fraction (a fresh report, router/reported.py);
    when given, the decode-blocks threshold compares it instead of decode_blocks / total_blocks.
    """
    if decode_blocks_threshold is not None:
        if reported_kv_usage is not None:
            if reported_kv_usage > decode_blocks_threshold:
                return True
        elif total_blocks > 0 and decode_blocks / total_blocks > decode_blocks_threshold:
            return True
    if prefill_tokens_threshold is not None and prefill_tokens > prefill_tokens_threshold:
        return True
    return (
        prefill_tokens_threshold_frac is not None
        and prefill_tokens > prefill_tokens_threshold_frac * max_num_batched_tokens
    )
