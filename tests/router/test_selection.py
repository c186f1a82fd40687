"""Cost function, argmin with random ties, softmax sampling and busy filters (REFERENCE section 5)."""

import math
import random

import pytest

from extproc.router import Worker, WorkerCost, WorkerLoad, compute_costs, pick, softmax_probabilities
from extproc.router.selection import is_busy

A, B, C = Worker("a"), Worker("b"), Worker("c")


def costs_of(*values):
    return [WorkerCost(Worker(f"w{i}"), v, 0.0, 0.0, 0) for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("load", "weight", "expected"),
    [
        (WorkerLoad(A, prefill_tokens=128, decode_blocks=10, overlap_blocks=0), 1.0, 18.0),
        (WorkerLoad(A, prefill_tokens=128, decode_blocks=10, overlap_blocks=0), 2.0, 26.0),
        (WorkerLoad(A, prefill_tokens=128, decode_blocks=10, overlap_blocks=0), 0.0, 10.0),
        (WorkerLoad(A, prefill_tokens=0, decode_blocks=3, overlap_blocks=8), 1.0, 3.0),
    ],
)
def test_cost_is_weighted_prefill_blocks_plus_decode_blocks(load, weight, expected):
    (cost,) = compute_costs([load], block_size=16, overlap_score_weight=weight)
    assert cost.cost == expected


def test_temperature_zero_always_takes_the_lowest_cost():
    rng = random.Random(0)
    candidates = costs_of(18, 10, 11)
    assert {pick(candidates, 0.0, rng).worker for _ in range(200)} == {Worker("w1")}


def test_exact_ties_are_broken_at_random():
    rng = random.Random(0)
    chosen = [pick(costs_of(5, 5, 9), 0.0, rng).worker for _ in range(2000)]
    assert Worker("w2") not in chosen
    share = chosen.count(Worker("w0")) / len(chosen)
    assert abs(share - 0.5) < 5 * math.sqrt(0.25 / len(chosen))


def test_softmax_probabilities_follow_min_max_normalised_costs():
    probs = softmax_probabilities([18, 10, 11], temperature=0.5)
    weights = [math.exp(-(c - 10) / (8 * 0.5)) for c in (18, 10, 11)]
    assert probs == pytest.approx([w / sum(weights) for w in weights])
    assert softmax_probabilities([3, 3, 3], temperature=1.0) == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize("temperature", [0.2, 1.0, 5.0])
def test_softmax_sampling_has_the_right_distribution(temperature):
    # Fixed seed; each count within 5 standard deviations of its binomial mean (sound, not flaky).
    rng = random.Random(1234)
    candidates = costs_of(18, 10, 11, 14)
    n = 20000
    counts = {c.worker: 0 for c in candidates}
    for _ in range(n):
        counts[pick(candidates, temperature, rng).worker] += 1
    for c, p in zip(
        candidates, softmax_probabilities([c.cost for c in candidates], temperature), strict=True
    ):
        assert abs(counts[c.worker] - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, (c.worker, p)


@pytest.mark.parametrize(
    ("decode", "prefill", "thresholds", "busy"),
    [
        (900, 0, {"decode_blocks_threshold": 0.8}, True),
        (800, 0, {"decode_blocks_threshold": 0.8}, False),
        (0, 5000, {"prefill_tokens_threshold": 4096}, True),
        (0, 4096, {"prefill_tokens_threshold": 4096}, False),
        (0, 5000, {"prefill_tokens_threshold_frac": 0.5}, True),
        (0, 4000, {"prefill_tokens_threshold_frac": 0.5}, False),
        (10**6, 10**6, {}, False),
    ],
)
def test_busy_filters(decode, prefill, thresholds, busy):
    args = {
        "decode_blocks_threshold": None,
        "prefill_tokens_threshold": None,
        "prefill_tokens_threshold_frac": None,
    }
    args.update(thresholds)
    assert (
        is_busy(
            decode_blocks=decode,
            prefill_tokens=prefill,
            total_blocks=1000,
            max_num_batched_tokens=8192,
            **args,
        )
        is busy
    )


class FixedDraw(random.Random):
    """A Random whose `random()` always returns `draw`: the pick at one point of [0, 1)."""

    def __init__(self, draw):
        super().__init__(0)
        self.draw = draw

    def random(self):
        return self.draw


@pytest.mark.parametrize(
    ("decode", "prefill", "total_blocks", "thresholds", "busy"),
    [
        # the fraction is of max_num_batched_tokens (8192): exactly at it is not over it
        (0, 4096, 1000, {"prefill_tokens_threshold_frac": 0.5}, False),
        (0, 4097, 1000, {"prefill_tokens_threshold_frac": 0.5}, True),
        # a worker whose KV size is unknown (0 blocks) is never busy by decode blocks, and no error
        (50, 0, 0, {"decode_blocks_threshold": 0.8}, False),
        # a worker with one block: one active block fills it
        (1, 0, 1, {"decode_blocks_threshold": 0.5}, True),
        (0.4, 0, 1, {"decode_blocks_threshold": 0.5}, False),
    ],
)
def test_busy_filter_boundaries(decode, prefill, total_blocks, thresholds, busy):
    args = {
        "decode_blocks_threshold": None,
        "prefill_tokens_threshold": None,
        "prefill_tokens_threshold_frac": None,
    }
    args.update(thresholds)
    result = is_busy(
        decode_blocks=decode,
        prefill_tokens=prefill,
        total_blocks=total_blocks,
        max_num_batched_tokens=8192,
        **args,
    )
    assert result is busy


@pytest.mark.parametrize(
    ("decode", "reported", "busy"),
    [
        # a fresh engine report replaces the router's own decode blocks over total_blocks
        (0, 0.9, True),  # the engine says it is fuller than the threshold: busy, whatever we routed
        (0, 0.8, False),  # exactly at the threshold is not over it
        (900, 0.5, False),  # the router's own view (0.9) would say busy: the report wins
    ],
)
def test_a_reported_kv_usage_decides_the_decode_blocks_threshold(decode, reported, busy):
    result = is_busy(
        decode_blocks=decode,
        prefill_tokens=0,
        total_blocks=1000,
        max_num_batched_tokens=8192,
        decode_blocks_threshold=0.8,
        prefill_tokens_threshold=None,
        prefill_tokens_threshold_frac=None,
        reported_kv_usage=reported,
    )
    assert result is busy


def test_sampling_is_not_uniform_when_costs_differ_by_less_than_one():
    # costs are in blocks and can differ by a fraction of one: the normalisation still applies
    probs = softmax_probabilities([0.0, 0.5], temperature=1.0)
    assert probs == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])


def test_sampling_depends_only_on_cost_differences():
    # far from zero (exp(-cost) alone would underflow) the probabilities are those of the differences
    near = softmax_probabilities([0.0, 1.0, 3.0], temperature=1.0)
    assert softmax_probabilities([5000.0, 5001.0, 5003.0], temperature=1.0) == pytest.approx(near)


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        ([18, 10, 11], [0.0, 1.0, 0.0]),
        ([5, 5, 9], [0.5, 0.5, 0.0]),
        ([2, 2, 2], [1 / 3] * 3),
    ],
)
def test_softmax_probabilities_at_temperature_zero_are_the_argmin(costs, expected):
    assert softmax_probabilities(costs, temperature=0.0) == pytest.approx(expected)


def test_a_candidate_of_probability_zero_is_never_drawn():
    # at a tiny temperature the expensive candidate's weight underflows to 0.0: even the lowest
    # possible draw (0.0) must not land on it
    candidates = costs_of(100, 0)
    assert softmax_probabilities([100, 0], temperature=0.001)[0] == 0.0
    assert pick(candidates, 0.001, FixedDraw(0.0)).worker == Worker("w1")


def test_the_highest_draw_takes_the_last_candidate():
    # these probabilities add up (in floating point) to 1 - 2**-53, the largest value random() returns:
    # the draw falls past every partial sum and must land on the last candidate, the likeliest here
    costs = [19, 10, 15, 3]
    top = 1.0 - 2**-53
    partial = 0.0
    for p in softmax_probabilities(costs, 0.1):
        partial += p  # added one by one, as the draw is compared (sum() may compensate)
    assert partial <= top
    assert pick(costs_of(*costs), 0.1, FixedDraw(top)).worker == Worker("w3")
    assert pick(costs_of(*costs), 0.1, FixedDraw(0.5)).worker == Worker("w3")


class NoDraws(random.Random):
    """A Random that fails the test when drawn from."""

    def random(self):
        raise AssertionError("drew a random number")

    def randrange(self, *args, **kwargs):
        raise AssertionError("drew a random number")


def test_a_single_lowest_cost_at_temperature_zero_draws_nothing():
    # a decision without a tie uses no randomness, so a seeded router's later draws do not shift
    assert pick(costs_of(18, 10, 11), 0.0, NoDraws()).worker == Worker("w1")
    assert pick(costs_of(7), 0.0, NoDraws()).worker == Worker("w0")
