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
