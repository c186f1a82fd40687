"""Learned pass time: each worker's speed against the configured pass-time model, learned online.

Pure: no I/O, no clock; observations come in as numbers.

The `timing` prefill load model predicts a request's time to first token on every worker from one
configured pass-time model (`PrefillTiming`). A fleet that mixes GPU generations, or a model
fitted on other hardware, makes those predictions wrong worker by worker. Here each worker gets a
scale s (its passes take s times the configured model's time: s = 2 for a worker at half speed),
learned from what the router observes anyway: the time from its decision to the first token,
against the time to first token it predicted for that worker when it decided.

Why one scale: a slower GPU (or a mis-fitted model) stretches every pass, prefill and decode
alike, so the prediction error of a worker is, to first order, one factor. Each observation gives
an estimate of the worker's log scale, z = log(scale predicted with) + log(observed / predicted).

Two levels (a hierarchical, empirical-Bayes estimate). Most fleets are identical workers, and the
router ranks workers whose predictions are close: two identical workers whose estimates differ by
noise alone would no longer tie, and the one that happened to look faster would win every tie.
So the fleet has a common scale (the precision-weighted mean of every worker's z: a configuration
off for the whole fleet is learned from every first token), and a worker departs from it only by
as much of its own deviation as its evidence makes significant: its deviation d from the fleet,
with standard error se (the fleet's pooled noise over its effective number of observations), is
soft-thresholded to sign(d) max(0, |d| - `SIGNIFICANCE` se). Identical workers stay exactly at
the fleet's scale (their deviations are noise, within a few standard errors); a worker at half
speed deviates by log 2, dozens of standard errors after a few tens of first tokens.

The fleet's model in use moves only when its estimate has moved by more than `SIGNIFICANCE`
standard errors of that estimate (the pooled noise over the fleet's weight) from the scale in use.
Noise otherwise gives the fleet a new model at every first token, a fraction of a percent off: every
prediction and the order of the fleet-sized decision change with it, for nothing (replaying the shared
trace, 8 workers at 1x, the default lost 1 % of its reuse and 2 % of its time to first token to it).
A worker that departs takes the fleet's estimate plus its significant deviation.

What is not speed is not learned (`PassTimeLearner.measures`): a prediction whose wait for the work
ahead of it exceeds the request's own prefill is mostly a prediction of the engine's queue, which
the model knows least (admission held by a full KV cache, preemptions, packing), and under
overload every first token is late by queueing no pass time explains. Only predictions mostly
made of the request's own prefill are measurements.

Robust by construction:
- one observation's log ratio is clipped to +-log(`MAX_RATIO`), so a stalled first token (a
  preemption, a hung connection) moves a settled worker's estimate by at most log(MAX_RATIO) /
  `WINDOW_SAMPLES` (4.4 %) and the next observations undo it;
- a worker's mean is an average (step 1 / n) until it settles to an exponential average over the
  last `WINDOW_SAMPLES` observations (a worker's speed may change: a throttled GPU);
- the configured model counts as `PRIOR_SAMPLES` observations of the fleet at scale 1, and as the
  same weight of noise `PRIOR_NOISE`, so the first few observations cannot swing anything; that
  weight is forgotten as the workers' own averages forget observations;
- scales stay within [1 / `MAX_SCALE`, `MAX_SCALE`].
These are statistical choices (a window, a clip, a prior weight, a significance level), not fitted
to any trace.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from extproc.router.prefill_model import PrefillEstimate, PrefillTiming

WINDOW_SAMPLES = 32  # the exponential average's memory, in observations
PRIOR_SAMPLES = 4  # the configured model's weight, in observations
MAX_RATIO = 4.0  # one observation counts as at most 4x (or 1/4x) the prediction
MAX_SCALE = 16.0  # a worker is at most 16x slower (or faster) than configured
SIGNIFICANCE = 3.0  # standard errors of its own deviation a worker's scale does not follow
PRIOR_NOISE = math.log(MAX_RATIO) / 2  # prior sd of one observation's log ratio: the clip is 2 sd
DISTINCT_SPEED = 1.25  # a worker this many times slower or faster than the fleet makes it a mixed fleet
_LOG_DISTINCT_SPEED = math.log(DISTINCT_SPEED)

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class LearnedPassTime:
    """One worker's learned pass time: `scale` x the configured model, from `samples` observations.

    `own_scale`: what its observations alone say; `scale` departs from `fleet_scale` toward it only
    as far as the evidence is significant."""

    scale: float
    samples: int
    last_ratio: float  # the last observation's observed / predicted time to first token (unclipped)
    own_scale: float = 1.0
    fleet_scale: float = 1.0


@dataclass(slots=True)
class _Stats:
    mean: float = 0.0  # of z, the log scale each observation implies
    var: float = 0.0  # of z around the mean
    count: int = 0
    applied: float = 0.0  # the log scale predicted with
    last_ratio: float = math.nan

    @property
    def weight(self) -> float:
        """Effective number of observations behind `mean` (an exponential average with step 1/W
        has the variance of a plain average of 2W - 1)."""
        return float(min(self.count, 2 * WINDOW_SAMPLES - 1))


class PassTimeLearner(Generic[K]):
    """Per worker, the scale of the configured pass-time model that its first tokens show."""

    __slots__ = (
        "_base",
        "_fleet_timing",
        "_fleet_used",
        "_mixed",
        "_observations",
        "_stats",
        "_sum_w",
        "_sum_wm",
        "_sum_wv",
        "_timings",
    )

    def __init__(self, base: PrefillTiming) -> None:
        self._base = base
        self._stats: dict[K, _Stats] = {}
        self._timings: dict[K, PrefillTiming] = {}  # workers departed from the fleet
        self._mixed: bool | None = False  # whether one is DISTINCT_SPEED or more away (None: unknown)
        self._fleet_timing = base
        self._fleet_used = 0.0  # the fleet's log scale `_fleet_timing` predicts with
        # fleet sums over workers: effective weights, weighted means, weighted variances
        self._sum_w = 0.0
        self._sum_wm = 0.0
        self._sum_wv = 0.0
        self._observations = 0

    @property
    def base(self) -> PrefillTiming:
        return self._base

    @property
    def mixed(self) -> bool:
        """Whether some worker is learned at least `DISTINCT_SPEED` times faster or slower than the
        fleet's model (as of its last first token): workers of different speeds, not noise (identical
        workers that depart at all do so by a percent or two)."""
        if self._mixed is None:  # found again after the first token or departure that changed it
            fleet = self._fleet_used
            self._mixed = any(
                abs(self._stats[w].applied - fleet) >= _LOG_DISTINCT_SPEED for w in self._timings
            )
        return self._mixed

    @staticmethod
    def measures(guess: PrefillEstimate) -> bool:
        """Whether a prediction's first token will measure the worker's speed: its predicted wait for
        the work ahead of it is at most its own prefill (the rest is mostly the queue's model)."""
        return guess.wait_ms <= guess.prefill_ms

    def timing(self, worker: K) -> PrefillTiming:
        """The pass-time model to predict `worker` with: the configured one, scaled as learned."""
        return self._timings.get(worker, self._fleet_timing)

    @property
    def fleet_scale(self) -> float:
        """The fleet's scale predicted with (it moves when the estimate moved significantly)."""
        return math.exp(self._fleet_used)

    def learned(self, worker: K) -> LearnedPassTime | None:
        stats = self._stats.get(worker)
        if stats is None:
            return None
        return LearnedPassTime(
            math.exp(self._used(worker, stats)),
            stats.count,
            stats.last_ratio,
            math.exp(stats.mean),
            self.fleet_scale,
        )

    def snapshot(self) -> dict[K, LearnedPassTime]:
        out: dict[K, LearnedPassTime] = {}
        for worker in self._stats:
            learned = self.learned(worker)
            assert learned is not None
            out[worker] = learned
        return out

    def _used(self, worker: K, stats: _Stats) -> float:
        """The log scale `worker` is predicted with now."""
        return stats.applied if worker in self._timings else self._fleet_used

    def _prior(self) -> float:
        """The configured model's weight: `PRIOR_SAMPLES`, forgotten as the workers' own averages forget
        an observation (by 1 - 1 / `WINDOW_SAMPLES` per observation of each worker)."""
        per_worker = self._observations / max(1, len(self._stats))
        return PRIOR_SAMPLES * float((1.0 - 1.0 / WINDOW_SAMPLES) ** per_worker)

    def _fleet_log(self) -> float:
        """The fleet's log scale, within the same bounds as a worker's: a worker held at a bound and
        one predicted with the fleet's scale must not differ by the bound alone (an unobserved
        worker would then look faster than a cached one held at 1 / MAX_SCALE)."""
        limit = math.log(MAX_SCALE)
        mean = self._sum_wm / (self._prior() + self._sum_w)  # the prior sits at log 1 = 0
        return max(-limit, min(limit, mean))

    def _settle_fleet(self) -> float:
        """The fleet's log scale to predict with: the estimate once it moved by more than
        `SIGNIFICANCE` standard errors of the fleet's mean from the one in use, else the one in use.
        Noise then leaves the shared model (and every prediction made with it) as it is: a new
        model for every first token would re-rank the fleet on noise alone."""
        fleet = self._fleet_log()
        se = math.sqrt(self._noise_var() / (self._prior() + self._sum_w))
        if abs(fleet - self._fleet_used) > SIGNIFICANCE * se:
            self._fleet_used = fleet
            self._fleet_timing = self._base.scaled(math.exp(fleet))
        return self._fleet_used

    def _noise_var(self) -> float:
        """One observation's variance, pooled over the fleet (identical workers, identical noise).

        At least 0: once the prior has faded, workers whose first tokens all come as predicted leave
        the running sum a rounding error from 0, on either side."""
        prior = self._prior()
        return max(0.0, (prior * PRIOR_NOISE**2 + self._sum_wv) / (prior + self._sum_w))

    def _applied(self, stats: _Stats, fleet_used: float) -> float:
        """The log scale to predict with: the fleet's in use when the worker's deviation is not
        significant, else the fleet's estimate plus the significant part of the deviation.

        The deviation is measured from the mean of what the workers showed, not from the fleet's
        scale, which the configured model still pulls: otherwise the first workers observed would
        depart from it (they all carry the same pull) and look faster or slower than identical
        workers not observed yet, which would never get an idle tie again."""
        deviation = stats.mean - self._sum_wm / self._sum_w  # the caller counted this worker in
        se = math.sqrt(self._noise_var() / stats.weight)
        shrunk = math.copysign(max(0.0, abs(deviation) - SIGNIFICANCE * se), deviation)
        if not shrunk:
            return fleet_used
        limit = math.log(MAX_SCALE)
        return max(-limit, min(limit, self._fleet_log() + shrunk))

    def observe(self, worker: K, predicted_ms: float, observed_ms: float) -> PrefillTiming | None:
        """A first token came `observed_ms` after the decision that predicted `predicted_ms` (both with
        the worker's model at the time). Returns the worker's new model, or None if unchanged
        (an unusable observation: not finite, or not positive)."""
        if not (math.isfinite(predicted_ms) and math.isfinite(observed_ms)) or predicted_ms <= 0:
            return None
        if observed_ms <= 0:
            return None
        ratio = observed_ms / predicted_ms
        bound = math.log(MAX_RATIO)
        stats = self._stats.get(worker)
        # the log scale predicted with, taken before a new worker's statistics join the fleet's
        # (counting it would thin the prior per worker and move the fleet's scale it was predicted with)
        used = self._fleet_used if stats is None else self._used(worker, stats)
        z = used + max(-bound, min(bound, math.log(ratio)))
        if stats is None:
            stats = self._stats[worker] = _Stats()
        w_old = stats.weight
        self._sum_w -= w_old
        self._sum_wm -= w_old * stats.mean
        self._sum_wv -= w_old * stats.var
        stats.count += 1
        self._observations += 1
        step = 1.0 / min(WINDOW_SAMPLES, stats.count)
        delta = z - stats.mean
        stats.mean += step * delta
        stats.var = (1.0 - step) * (stats.var + step * delta * delta)  # exponentially weighted variance
        stats.last_ratio = ratio
        w = stats.weight
        self._sum_w += w
        self._sum_wm += w * stats.mean
        self._sum_wv += w * stats.var
        fleet = self._settle_fleet()
        stats.applied = self._applied(stats, fleet)
        self._mixed = None  # the worker, or the fleet's model, may have moved
        if stats.applied == fleet:
            self._timings.pop(worker, None)
            return self._fleet_timing
        timing = self._base.scaled(math.exp(stats.applied))
        self._timings[worker] = timing
        return timing

    def forget(self, worker: K) -> None:
        """The worker left: what was learned of it goes (a new process may run on other hardware)."""
        stats = self._stats.pop(worker, None)
        self._timings.pop(worker, None)
        if stats is not None:
            self._observations -= stats.count
            w = stats.weight
            self._sum_w -= w
            self._sum_wm -= w * stats.mean
            self._sum_wv -= w * stats.var
            if self._stats:
                self._settle_fleet()
            else:  # nobody left: start over (no float residue in the sums)
                self._sum_w = self._sum_wm = self._sum_wv = 0.0
                self._observations = 0
                self._fleet_timing, self._fleet_used = self._base, 0.0
        self._mixed = None
