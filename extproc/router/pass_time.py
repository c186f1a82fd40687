"""Learned pass time: each worker's speed against the configured pass-time model, learned online.

Pure: no I/O, no clock; observations come in as numbers.

The `timing` prefill load model predicts a request's time to first token on every worker from one
configured pass-time model (`PrefillTiming`). A fleet that mixes GPU generations, or a model
fitted on other hardware, makes those predictions wrong worker by worker. Here each worker gets a
scale s (its passes take s times the configured model's time: s = 2 for a worker at half speed),
learned from what the router observes anyway: the time from its decision to the first token,
against the time to first token it predicted for that worker when it decided.

Why one scale: a slower GPU (or a mis-fitted model) stretches every pass, prefill and decode
alike, so the prediction error of a worker is, to first order, one factor. Why the prediction
rather than the prompt alone: the time to first token also holds the work routed there before,
which the prediction accounts for; at the right scale, the observed over predicted ratio is 1 on
average whatever the queue, and a scale too low under-predicts both the queue and the prompt, so
the ratio points the way to the fixed point.

The estimate is robust by construction:
- it moves in log space by a bounded step: one observation's log ratio is clipped to
  +-log(`MAX_RATIO`), so a stalled first token (a preemption, a hung connection) moves the scale
  by at most `MAX_RATIO ** (1 / WINDOW_SAMPLES)` (4.4 %) and the next observations undo it;
- the configured model counts as `PRIOR_SAMPLES` observations, so the first few, noisy ones
  cannot swing it; after that the step is 1 / n, an average, until it settles to an exponential
  average over the last `WINDOW_SAMPLES` observations (a worker's speed may change: a throttled GPU);
- the scale stays within [1 / `MAX_SCALE`, `MAX_SCALE`].
These are statistical choices (a window, a clip, a prior weight), not fitted to any trace.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from extproc.router.prefill_model import PrefillTiming

WINDOW_SAMPLES = 32  # the exponential average's memory, in observations
PRIOR_SAMPLES = 4  # the configured model's weight, in observations
MAX_RATIO = 4.0  # one observation counts as at most 4x (or 1/4x) the prediction
MAX_SCALE = 16.0  # a worker is at most 16x slower (or faster) than configured

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class LearnedPassTime:
    """One worker's learned pass time: `scale` x the configured model, from `samples` observations."""

    scale: float
    samples: int
    last_ratio: float  # the last observation's observed / predicted time to first token (unclipped)


class PassTimeLearner(Generic[K]):
    """Per worker, the scale of the configured pass-time model that its first tokens show."""

    __slots__ = ("_base", "_learned", "_timings")

    def __init__(self, base: PrefillTiming) -> None:
        self._base = base
        self._learned: dict[K, LearnedPassTime] = {}
        self._timings: dict[K, PrefillTiming] = {}

    @property
    def base(self) -> PrefillTiming:
        return self._base

    def timing(self, worker: K) -> PrefillTiming:
        """The pass-time model to predict `worker` with: the configured one, scaled as learned."""
        return self._timings.get(worker, self._base)

    def learned(self, worker: K) -> LearnedPassTime | None:
        return self._learned.get(worker)

    def snapshot(self) -> dict[K, LearnedPassTime]:
        return dict(self._learned)

    def observe(self, worker: K, predicted_ms: float, observed_ms: float) -> PrefillTiming | None:
        """A first token came `observed_ms` after the decision that predicted `predicted_ms` (both with
        the worker's model at the time). Returns the worker's new model, or None if unchanged
        (an unusable observation: not finite, or not positive)."""
        if not (math.isfinite(predicted_ms) and math.isfinite(observed_ms)) or predicted_ms <= 0:
            return None
        if observed_ms <= 0:
            return None
        ratio = observed_ms / predicted_ms
        old = self._learned.get(worker)
        scale, samples = (1.0, 0) if old is None else (old.scale, old.samples)
        step = 1.0 / min(WINDOW_SAMPLES, samples + 1 + PRIOR_SAMPLES)
        bound = math.log(MAX_RATIO)
        log_scale = math.log(scale) + step * max(-bound, min(bound, math.log(ratio)))
        limit = math.log(MAX_SCALE)
        scale = math.exp(max(-limit, min(limit, log_scale)))
        self._learned[worker] = LearnedPassTime(scale, samples + 1, ratio)
        timing = self._base.scaled(scale)
        self._timings[worker] = timing
        return timing

    def forget(self, worker: K) -> None:
        """The worker left: what was learned of it goes (a new process may run on other hardware)."""
        self._learned.pop(worker, None)
        self._timings.pop(worker, None)
