"""extproc/router/pass_time.py: each worker's pass-time scale, learned from first tokens."""

from __future__ import annotations

import math
import random

import pytest

from extproc.router.config import RouterConfig
from extproc.router.pass_time import (
    MAX_RATIO,
    MAX_SCALE,
    PRIOR_NOISE,
    PRIOR_SAMPLES,
    SIGNIFICANCE,
    WINDOW_SAMPLES,
    LearnedPassTime,
    PassTimeLearner,
)
from extproc.router.prefill_model import PrefillEstimate, PrefillTiming
from extproc.router.router import KvRouter
from extproc.router.sequences import ActiveSequences
from extproc.router.types import Worker, WorkerSpec
from tests.router.clock import FakeClock

BASE = PrefillTiming()
W = Worker("w")


def feed(learner: PassTimeLearner[Worker], true_scale: float, n: int, unit_ms: float = 100.0) -> None:
    """`n` first tokens of a worker whose passes take `true_scale` x the configured model's time."""
    for _ in range(n):
        predicted = unit_ms * learner.timing(W).prefill_linear_ms / BASE.prefill_linear_ms
        learner.observe(W, predicted, unit_ms * true_scale)


def scale(learner: PassTimeLearner[Worker]) -> float:
    learned = learner.learned(W)
    assert learned is not None
    return learned.scale


@pytest.mark.parametrize("true_scale", [0.5, 1.0, 2.0, 10.0])
def test_the_scale_converges_to_the_workers_speed(true_scale):
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    feed(learner, true_scale, 12 * WINDOW_SAMPLES)
    assert scale(learner) == pytest.approx(true_scale, rel=0.02)
    timing = learner.timing(W)
    assert timing.prefill_ms(1000) == pytest.approx(BASE.prefill_ms(1000) * scale(learner))
    assert timing.decode_ms(0.5) == pytest.approx(BASE.decode_ms(0.5) * scale(learner))
    assert timing.max_num_batched_tokens == BASE.max_num_batched_tokens


def test_before_any_observation_a_worker_has_the_configured_model():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    assert learner.timing(W) is BASE and learner.learned(W) is None and learner.snapshot() == {}


def test_the_configured_model_weighs_as_a_few_observations():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    learner.observe(W, 100.0, 300.0)  # one slow first token is no evidence against the configuration
    assert scale(learner) == 1.0 and learner.timing(W) is BASE
    feed(learner, 3.0, 7)  # a few more are: the fleet's model moves, not all the way yet
    assert 1.5 < scale(learner) < 3.0


def test_a_stalled_first_token_moves_a_settled_scale_by_a_bounded_step():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    feed(learner, 1.0, 4 * WINDOW_SAMPLES)
    settled = scale(learner)
    learner.observe(W, 100.0, 60_000.0)  # a minute: a hung connection, a preemption storm
    bound = MAX_RATIO ** (1.0 / WINDOW_SAMPLES)
    assert settled <= scale(learner) <= settled * bound * 1.000001  # its own spread hides it, or a step
    assert learner.learned(W).last_ratio == pytest.approx(600.0)  # reported as seen
    feed(learner, 1.0, 3 * WINDOW_SAMPLES)  # and the next observations undo it
    assert scale(learner) == pytest.approx(1.0, rel=0.01)


def test_a_burst_of_stalls_does_not_poison_it():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    feed(learner, 1.0, 4 * WINDOW_SAMPLES)
    for _ in range(5):
        learner.observe(W, 100.0, 1e9)
    assert scale(learner) < 1.3


def test_the_scale_stays_bounded():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    for _ in range(50 * WINDOW_SAMPLES):
        learner.observe(W, 1.0, 1e12)
    assert scale(learner) == pytest.approx(MAX_SCALE)
    for _ in range(100 * WINDOW_SAMPLES):
        learner.observe(W, 1e12, 1.0)
    assert scale(learner) == pytest.approx(1.0 / MAX_SCALE)


@pytest.mark.parametrize(
    "predicted, observed",
    [(0.0, 10.0), (-1.0, 10.0), (10.0, 0.0), (10.0, -5.0), (math.nan, 1.0), (1.0, math.inf)],
)
def test_unusable_observations_change_nothing(predicted, observed):
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    assert learner.observe(W, predicted, observed) is None
    assert learner.learned(W) is None


def test_forget_goes_back_to_the_configured_model():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    feed(learner, 3.0, WINDOW_SAMPLES)
    learner.forget(W)
    assert learner.timing(W) is BASE and learner.learned(W) is None


def test_active_sequences_learn_from_the_time_to_first_token_against_the_prediction():
    clock = FakeClock()
    seqs = ActiveSequences(16, prefill_load_model="timing", clock=clock)
    for i in range(6 * WINDOW_SAMPLES):  # one prompt at a time on an idle worker, twice as slow
        rid = f"r{i}"
        seqs.add_request(rid, W, [], 4000, 0)
        clock.advance(2 * BASE.prompt_ms(4000) / 1000.0)
        seqs.mark_prefill_complete(rid)
        seqs.free(rid)
        clock.advance(1.0)
    learned = seqs.learned_pass_time(W)
    assert learned is not None and learned.scale == pytest.approx(2.0, rel=0.02)
    assert seqs.timing(W).prefill_linear_ms == pytest.approx(2.0 * BASE.prefill_linear_ms, rel=0.02)
    seqs.remove_worker(W)
    assert seqs.learned_pass_time(W) is None


def test_learning_can_be_turned_off_and_is_off_without_the_timing_model():
    clock = FakeClock()
    for seqs in (
        ActiveSequences(16, prefill_load_model="timing", learn_prefill_timing=False, clock=clock),
        ActiveSequences(16, prefill_load_model="none", clock=clock),
    ):
        seqs.add_request("a", W, [], 4000, 0)
        clock.advance(5.0)
        seqs.mark_prefill_complete("a")
        assert seqs.learned_pass_time(W) is None


def test_another_replicas_requests_teach_nothing():
    """Replica sync delivers another replica's decision late: its first token is no measurement."""
    clock = FakeClock()
    router = KvRouter(
        RouterConfig(block_size=16, prefill_load_model="timing", learn_prefill_timing=True),
        clock=clock,
        workers=[WorkerSpec("w")],
    )
    worker = router.workers()[0]
    router.add_request("theirs", worker, [1, 2], 4000, 0)
    clock.advance(5.0)
    router.mark_prefill_complete("theirs")
    assert router.sequences.learned_pass_time(worker) is None
    router.best_worker([1] * 4000, request_id="mine")
    clock.advance(5.0)
    router.mark_prefill_complete("mine")
    assert router.sequences.learned_pass_time(worker) is not None


@pytest.mark.parametrize("model", ["timing", "aic"])
def test_a_whole_answer_ends_the_prompts_load_but_teaches_nothing(model):
    """A non-streamed answer is seen only when generation is over: its time is no time to first token.
    Taken for one, every such answer would count as a stall of up to MAX_RATIO x the prediction."""
    clock = FakeClock()
    router = KvRouter(
        RouterConfig(
            block_size=16,
            prefill_load_model=model,
            learn_prefill_timing=True,
            router_track_prefill_tokens=True,
        ),
        clock=clock,
        workers=[WorkerSpec("w")],
    )
    worker = router.workers()[0]
    for i in range(WINDOW_SAMPLES):
        router.best_worker([i + 1] * 4000, request_id=f"whole{i}")
        clock.advance(30.0)  # the answer's 2,000 tokens were generated before it was seen
        assert router.mark_prefill_complete(f"whole{i}", at_first_token=False)
        assert router.sequences.prefill_tokens(worker) == 0  # the prompt's load ended
        router.free(f"whole{i}")
    assert router.sequences.learned_pass_time(worker) is None
    assert router.sequences.timing(worker) == router.config.prefill_timing
    router.best_worker([7] * 4000, request_id="streamed")
    clock.advance(0.5)
    router.mark_prefill_complete("streamed")  # at the first token (the default)
    assert router.sequences.learned_pass_time(worker) is not None


# --- the fleet-pooled estimate (issue 24) ------------------------------------------------------------


def noisy_fleet(
    learner: PassTimeLearner[Worker], true_scales: list[float], rounds: int, seed: int = 0, sd: float = 0.15
) -> list[Worker]:
    """`rounds` first tokens per worker, in turn; each observed time is the true one times a log-normal
    noise of `sd` (packing, the pass in progress), predicted with the worker's current model."""
    rng = random.Random(seed)
    workers = [Worker(f"w{i}") for i in range(len(true_scales))]
    for _ in range(rounds):
        for worker, true_scale in zip(workers, true_scales, strict=True):
            predicted = 100.0 * learner.timing(worker).prefill_linear_ms / BASE.prefill_linear_ms
            learner.observe(worker, predicted, 100.0 * true_scale * math.exp(rng.gauss(0.0, sd)))
    return workers


@pytest.mark.parametrize("seed", range(5))
def test_identical_workers_keep_the_fleets_scale_exactly(seed):
    """Noise alone never ranks one of identical workers faster: they tie as they would unlearned."""
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    workers = noisy_fleet(learner, [1.0] * 16, 8 * WINDOW_SAMPLES, seed=seed)
    fleet = learner.timing(workers[0])
    assert learner.fleet_scale == pytest.approx(1.0, abs=0.05)
    own = [learner.learned(w).own_scale for w in workers]
    assert max(own) > min(own)  # their own estimates do differ, by noise
    for worker in workers:
        assert learner.timing(worker) is fleet
        assert learner.learned(worker).scale == learner.fleet_scale


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 9])
def test_first_tokens_exactly_as_predicted_after_noisy_ones_keep_the_model(seed):
    """The prior fades and the variances decay to 0: the fleet's running sum of them then sits a
    rounding error from 0, below it for these seeds (a math domain error at the first token, once)."""
    rng = random.Random(seed)
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    workers = [Worker(f"w{i}") for i in range(4)]
    for i in range(6_000):
        ratio = rng.uniform(0.2, 5.0) if i < 50 else 1.0
        learner.observe(rng.choice(workers), 10.0, 10.0 * ratio)
        if i == 1_000:
            settled = learner.snapshot()
    assert learner._noise_var() >= 0.0
    assert {w: learned.scale for w, learned in learner.snapshot().items()} == pytest.approx(
        {w: learned.scale for w, learned in settled.items()}, rel=1e-6
    )  # predictions that come true keep the model they were made with


def test_a_fleet_configured_wrong_is_learned_from_every_worker():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    workers = noisy_fleet(learner, [3.0] * 4, 2 * WINDOW_SAMPLES)
    assert learner.fleet_scale == pytest.approx(3.0, rel=0.05)
    assert all(learner.timing(w) is learner.timing(workers[0]) for w in workers)


@pytest.mark.parametrize("seed", range(3))
def test_a_worker_at_half_speed_is_learned_within_a_window(seed):
    """One of eight workers at half speed departs from the fleet within `WINDOW_SAMPLES` first tokens
    of its own, and the fast ones stay at the fleet's scale."""
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    workers = noisy_fleet(learner, [1.0] * 7 + [2.0], WINDOW_SAMPLES, seed=seed)
    slow = learner.learned(workers[-1])
    assert slow.samples == WINDOW_SAMPLES
    assert slow.scale == pytest.approx(2.0, rel=0.12)
    # the pooled mean holds the slow worker's eighth, so the fast ones read up to ~10 % slow and some
    # depart from it by a few % (a known limit of a mean as the fleet's centre), well below the slow one
    fast = [learner.learned(w).scale for w in workers[:-1]]
    assert max(fast) / min(fast) < 1.06 and max(fast) < 1.12
    assert slow.scale / max(fast) > 1.6


def test_half_a_fleet_at_half_speed():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    workers = noisy_fleet(learner, [1.0] * 4 + [2.0] * 4, 4 * WINDOW_SAMPLES)
    for worker in workers[:4]:
        assert learner.learned(worker).scale == pytest.approx(1.0, rel=0.1)
    for worker in workers[4:]:
        assert learner.learned(worker).scale == pytest.approx(2.0, rel=0.1)


def test_only_predictions_mostly_of_the_requests_own_prefill_measure():
    own = BASE.prompt_ms(4000)
    assert PassTimeLearner.measures(PrefillEstimate(own, own, 4000, 0.0))
    assert PassTimeLearner.measures(PrefillEstimate(2 * own, own, 4000, 0.0))
    assert not PassTimeLearner.measures(PrefillEstimate(2 * own + 1.0, own, 4000, 0.0))


def test_a_first_token_delayed_by_a_predicted_queue_does_not_move_the_scale():
    """Under overload the engine's queue holds first tokens the pass-time model cannot explain: a
    request routed behind a long predicted queue teaches nothing, however late its first token."""
    clock = FakeClock()
    seqs = ActiveSequences(16, prefill_load_model="timing", clock=clock)
    for i in range(4):  # a queue of four long prompts, routed at once
        seqs.add_request(f"q{i}", W, [], 8000, 0)
    seqs.add_request("late", W, [], 2000, 0)  # behind them: predicted wait >> its own prefill
    clock.advance(60.0)  # a minute: the engine held it far beyond any prediction
    for i in range(4):
        seqs.free(f"q{i}")  # the ones ahead were cancelled: no first token of theirs to learn from
    seqs.mark_prefill_complete("late")
    assert seqs.learned_pass_time(W) is None
    assert seqs.timing(W) is seqs.prefill_timing


def test_an_unobserved_worker_is_never_predicted_faster_than_the_bound_of_an_observed_one():
    # first tokens far faster than configured (a mock engine, a far better GPU): the fleet's scale
    # and the worker's both stop at 1 / MAX_SCALE, so an idle unobserved worker does not look
    # faster than the observed one holding the prompt's cache (which lost a fully cached prompt)
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    observed, unobserved = Worker("fast"), Worker("never")
    for _ in range(4 * WINDOW_SAMPLES):
        learner.observe(observed, predicted_ms=100.0, observed_ms=0.1)
    assert learner.fleet_scale == pytest.approx(1 / MAX_SCALE)
    assert learner.timing(unobserved) == learner.timing(observed)


def test_the_first_worker_observed_keeps_the_same_model_as_identical_workers_not_observed_yet():
    # engines faster than configured (noisily): the one serving the first requests must not depart
    # from the fleet's scale (which the configured model still pulls) and win every idle tie for ever
    rng = random.Random(3)
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    first, others = Worker("first"), Worker("not-yet")
    for _ in range(20):
        predicted = 100.0 * learner.timing(first).prefill_linear_ms / BASE.prefill_linear_ms
        learner.observe(first, predicted_ms=predicted, observed_ms=100.0 * rng.uniform(0.05, 0.15))
        assert learner.timing(first) == learner.timing(others)
    assert learner.fleet_scale < 0.5


# --- forgetting a worker, and what the learner reports --------------------------------------------


def _observe_all(learner: PassTimeLearner[Worker], worker: Worker, ratios: list[float]) -> None:
    for ratio in ratios:
        predicted = 100.0 * learner.timing(worker).prefill_linear_ms / BASE.prefill_linear_ms
        learner.observe(worker, predicted, predicted * ratio)


def test_forgetting_a_worker_leaves_the_learner_as_if_it_had_never_been_observed():
    rng = random.Random(5)
    ys = [math.exp(rng.gauss(0.0, 0.1)) for _ in range(40)]  # y at the configured speed
    xs = [4.0 * math.exp(rng.gauss(0.0, 0.1)) for _ in range(25)]  # x four times as slow
    y, x, never = Worker("y"), Worker("x"), Worker("never")
    both: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    only_y: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    _observe_all(both, y, ys)
    _observe_all(only_y, y, ys)
    _observe_all(both, x, xs)
    assert both.learned(x).scale > 2.0 and both.timing(x) != both.timing(never)  # x departed
    both.forget(x)
    assert both.learned(x) is None and both.timing(x) is both.timing(never)
    # the statistics are as if x had never been; the fleet's model in use is the estimate again, which
    # the learner without x may not have taken into use (within its significance band)
    assert both.fleet_scale == pytest.approx(only_y.fleet_scale, rel=0.01)
    assert both.timing(y).prefill_linear_ms == pytest.approx(only_y.timing(y).prefill_linear_ms, rel=0.01)
    assert both.snapshot().keys() == {y}
    more = [math.exp(rng.gauss(0.0, 0.1)) for _ in range(10)]
    _observe_all(both, y, more)  # and it goes on learning alike (the prior's weight too)
    _observe_all(only_y, y, more)
    a, b = both.learned(y), only_y.learned(y)
    assert a.samples == b.samples  # what each learns goes through the model in use: alike, within the band
    assert (a.scale, a.own_scale, a.fleet_scale) == pytest.approx(
        (b.scale, b.own_scale, b.fleet_scale), rel=0.01
    )


def test_forgetting_every_worker_starts_over():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    a, b = Worker("a"), Worker("b")
    _observe_all(learner, a, [3.0] * 20)
    _observe_all(learner, b, [2.0] * 30)
    learner.forget(a)
    learner.forget(b)
    learner.forget(b)  # twice, or a worker never observed: nothing happens
    assert learner.fleet_scale == 1.0 and learner.timing(a) is BASE and learner.snapshot() == {}
    fresh: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    for ratios in ([1.5] * 3, [2.0] * 12):  # the second moves the fleet's model: sums and prior alike
        _observe_all(learner, a, ratios)
        _observe_all(fresh, a, ratios)
        assert learner.learned(a) == fresh.learned(a)
    assert learner.fleet_scale == fresh.fleet_scale > 1.3


def test_what_is_learned_is_reported_per_worker_with_the_fleets_scale():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    fast, slow = Worker("fast"), Worker("slow")
    _observe_all(learner, fast, [1.0] * 40)
    _observe_all(learner, slow, [3.0] * 40)
    snapshot = learner.snapshot()
    assert snapshot == {fast: learner.learned(fast), slow: learner.learned(slow)}
    assert learner.fleet_scale > 1.2  # the slow worker pulls the fleet's scale up
    for worker, learned in snapshot.items():
        assert learned.fleet_scale == learner.fleet_scale
        assert learned.samples == 40
        assert learned.scale == pytest.approx(
            learner.timing(worker).prefill_linear_ms / BASE.prefill_linear_ms
        )
    assert snapshot[slow].own_scale > 2.0 > snapshot[fast].own_scale


def test_a_new_workers_first_token_as_predicted_shows_the_scale_it_was_predicted_with():
    """A worker not observed yet is predicted with the fleet's scale; a first token that comes exactly
    as predicted says the worker runs at that scale (its own estimate is it), however the fleet's
    prior is spread over the workers once the new one counts."""
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    learner.observe(W, 100.0, 200.0)
    predicted_with = learner.fleet_scale
    newcomer = Worker("new")
    assert learner.timing(newcomer).prefill_linear_ms == pytest.approx(
        BASE.prefill_linear_ms * predicted_with
    )
    learner.observe(newcomer, 100.0, 100.0)
    assert learner.learned(newcomer).own_scale == pytest.approx(predicted_with, rel=1e-12)


# --- the estimate, number for number ------------------------------------------------------------


def test_one_first_token_is_no_evidence_against_the_configured_model():
    """The configured model weighs as PRIOR_SAMPLES observations at scale 1 (less 1/W of that per
    observation of each worker): after one first token twice as slow as predicted, the fleet's
    estimate is log 2 / (1 + 4 (31/32)), about 0.14, within SIGNIFICANCE standard errors (the
    prior's noise over the same weight, about 0.28 each) of the model in use, which stays."""
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    learner.observe(W, 100.0, 200.0)
    prior = PRIOR_SAMPLES * (1 - 1 / WINDOW_SAMPLES)
    estimate = math.log(2.0) / (prior + 1.0)
    se = math.sqrt(prior * PRIOR_NOISE**2 / (prior + 1.0) / (prior + 1.0))
    assert estimate < SIGNIFICANCE * se
    assert learner.fleet_scale == 1.0 and learner.timing(W) is BASE
    assert learner.learned(W) == LearnedPassTime(1.0, 1, 2.0, 2.0, 1.0)


class _Model:
    """The documented estimate, recomputed from each worker's statistics at every step (the learner
    keeps running sums): per worker an average of z (step 1/n, then 1/W) and its exponentially
    weighted variance; the fleet's log scale the weighted mean of the workers' with the prior at 0,
    taken into use when it moved by more than SIGNIFICANCE standard errors of that mean; a worker's
    own deviation from the workers' mean, soft-thresholded by SIGNIFICANCE standard errors of the
    pooled noise: the fleet's in use when nothing is left, else the fleet's estimate plus what is
    left, both clamped to +-log MAX_SCALE."""

    def __init__(self) -> None:
        self.stats: dict[Worker, dict[str, float]] = {}
        self.observations = 0
        self.fleet_used = 0.0

    def _noise(self) -> float:
        weights = {w: self._weight(t) for w, t in self.stats.items()}
        prior = self._prior()
        spread = sum(weights[w] * t["var"] for w, t in self.stats.items())
        return (prior * PRIOR_NOISE**2 + spread) / (prior + sum(weights.values()))

    def settle(self) -> None:
        sw = sum(self._weight(t) for t in self.stats.values())
        se = math.sqrt(self._noise() / (self._prior() + sw))
        if abs(self.fleet() - self.fleet_used) > SIGNIFICANCE * se:
            self.fleet_used = self.fleet()

    def _weight(self, s: dict[str, float]) -> float:
        return float(min(s["count"], 2 * WINDOW_SAMPLES - 1))

    def _prior(self) -> float:
        return PRIOR_SAMPLES * (1 - 1 / WINDOW_SAMPLES) ** (self.observations / max(1, len(self.stats)))

    def fleet(self) -> float:
        sw = sum(self._weight(s) for s in self.stats.values())
        swm = sum(self._weight(s) * s["mean"] for s in self.stats.values())
        limit = math.log(MAX_SCALE)
        return max(-limit, min(limit, swm / (self._prior() + sw)))

    def used(self, worker: Worker) -> float:
        s = self.stats[worker]
        return s["applied"] if s["departed"] else self.fleet_used

    def observe(self, worker: Worker, predicted: float, observed: float) -> None:
        clip = math.log(MAX_RATIO)
        # z: the log scale the prediction was made with (the fleet's, for a worker not seen yet)
        z = (self.used(worker) if worker in self.stats else self.fleet_used) + max(
            -clip, min(clip, math.log(observed / predicted))
        )
        s = self.stats.setdefault(
            worker, {"mean": 0.0, "var": 0.0, "count": 0, "applied": 0.0, "departed": 0}
        )
        s["count"] += 1
        self.observations += 1
        step = 1.0 / min(WINDOW_SAMPLES, s["count"])
        delta = z - s["mean"]
        s["mean"] += step * delta
        s["var"] = (1.0 - step) * (s["var"] + step * delta * delta)
        self.settle()
        weights = {w: self._weight(t) for w, t in self.stats.items()}
        centre = sum(weights[w] * t["mean"] for w, t in self.stats.items()) / sum(weights.values())
        deviation = s["mean"] - centre
        se = math.sqrt(self._noise() / weights[worker])
        shrunk = math.copysign(max(0.0, abs(deviation) - SIGNIFICANCE * se), deviation)
        limit = math.log(MAX_SCALE)
        s["applied"] = max(-limit, min(limit, self.fleet() + shrunk)) if shrunk else self.fleet_used
        s["departed"] = s["applied"] != self.fleet_used

    def forget(self, worker: Worker) -> None:
        s = self.stats.pop(worker)
        self.observations -= int(s["count"])
        if self.stats:
            self.settle()
        else:
            self.fleet_used = 0.0


@pytest.mark.parametrize("seed", range(3))
def test_the_learner_follows_the_documented_estimate(seed):
    rng = random.Random(seed)
    workers = [Worker(f"w{i}") for i in range(5)]
    speeds = dict(zip(workers, [1.0, 1.0, 1.0, 2.0, 0.4], strict=True))
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    model = _Model()
    for step in range(400):
        worker = rng.choice(workers)
        if step % 97 == 96 and worker in model.stats:
            learner.forget(worker)
            model.forget(worker)
            continue
        predicted = 100.0 * learner.timing(worker).prefill_linear_ms / BASE.prefill_linear_ms
        observed = 100.0 * speeds[worker] * math.exp(rng.gauss(0.0, 0.2))
        learner.observe(worker, predicted, observed)
        model.observe(worker, predicted, observed)
        assert math.log(learner.fleet_scale) == pytest.approx(model.fleet_used, rel=1e-9, abs=1e-12)
        for w, s in model.stats.items():
            learned = learner.learned(w)
            assert learned.samples == s["count"]
            assert math.log(learned.own_scale) == pytest.approx(s["mean"], rel=1e-9, abs=1e-12)
            assert math.log(learned.scale) == pytest.approx(model.used(w), rel=1e-9, abs=1e-12)
    assert any(s["departed"] for s in model.stats.values())  # the slow and fast workers departed


@pytest.mark.parametrize("seed", range(3))
def test_a_fleet_is_mixed_when_a_worker_is_learned_a_quarter_or_more_apart_from_it(seed):
    """`mixed`: some worker learned `DISTINCT_SPEED` times slower or faster than the fleet's model;
    identical workers (noise) and workers 10 % apart are not a mixed fleet, nor is a fleet not seen yet."""
    assert not PassTimeLearner(BASE).mixed
    for scales, mixed in (([1.0] * 16, False), ([1.0] * 7 + [1.1], False), ([1.0] * 7 + [2.0], True)):
        learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
        workers = noisy_fleet(learner, scales, 4 * WINDOW_SAMPLES, seed=seed)
        assert learner.mixed is mixed, scales
        if mixed:
            learner.forget(workers[0])  # a fast worker leaves: the slow one is still apart
            assert learner.mixed is True
            learner.forget(workers[-1])  # the slow worker leaves: the fast ones are one fleet again
            assert learner.mixed is False


def test_whether_a_fleet_is_mixed_follows_the_fleets_model_as_it_moves():
    """Two workers, one twice as slow: both are a quarter or more from the fleet's model between them.
    Once the slow one is gone the fleet settles on the fast one, and nothing is apart any more."""
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    fast, slow = noisy_fleet(learner, [1.0, 2.0], 4 * WINDOW_SAMPLES, sd=0.0)
    assert learner.mixed
    learner.forget(slow)
    assert not learner.mixed and learner.learned(fast).scale == pytest.approx(1.0, rel=0.05)
    # the same fleet taught the other way round: a fast worker joins slow ones
    learner = PassTimeLearner(BASE)
    noisy_fleet(learner, [2.0, 2.0, 2.0, 1.0], 4 * WINDOW_SAMPLES, sd=0.0)
    assert learner.mixed


def test_a_fleet_configured_wrong_with_a_worker_ten_percent_slower_is_not_mixed():
    """Apart is measured from the fleet's model in use (here twice the configured one), not from
    the configured model."""
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    workers = noisy_fleet(learner, [2.0] * 7 + [2.2], 4 * WINDOW_SAMPLES, sd=0.0)
    assert learner.fleet_scale == pytest.approx(2.0, rel=0.1) and not learner.mixed
    learner.forget(workers[0])
    assert not learner.mixed


def test_a_worker_once_apart_is_not_counted_apart_after_the_fleet_caught_up_with_it():
    """One worker at 1.5x among three at 1x is apart; then the three slow down to 1.5x too: the
    fleet's model moves to theirs, and the first one, not observed since, is no longer apart."""
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    first, *others = noisy_fleet(learner, [1.5, 1.0, 1.0, 1.0], 4 * WINDOW_SAMPLES, sd=0.0)
    assert learner.mixed
    for _ in range(8 * WINDOW_SAMPLES):
        for worker in others:
            predicted = 100.0 * learner.timing(worker).prefill_linear_ms / BASE.prefill_linear_ms
            learner.observe(worker, predicted, 150.0)
    assert learner.learned(first).scale == pytest.approx(1.5, rel=0.1)
    assert learner.fleet_scale == pytest.approx(1.5, rel=0.1)
    assert not learner.mixed


def test_a_worker_that_comes_back_to_the_fleets_speed_is_no_longer_apart():
    learner: PassTimeLearner[Worker] = PassTimeLearner(BASE)
    workers = noisy_fleet(learner, [1.0] * 7 + [2.0], 8 * WINDOW_SAMPLES, sd=0.0)
    assert learner.mixed
    slow = workers[-1]
    for _ in range(8 * WINDOW_SAMPLES):  # its GPU was replaced: its first tokens are the fleet's now
        predicted = 100.0 * learner.timing(slow).prefill_linear_ms / BASE.prefill_linear_ms
        learner.observe(slow, predicted, 100.0)
    assert learner.learned(slow).scale == pytest.approx(1.0, rel=0.1)
    assert not learner.mixed
