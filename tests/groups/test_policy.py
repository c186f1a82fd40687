"""policy.py: how the answering groups are ordered (tables), ties broken at random."""

from __future__ import annotations

import random

import pytest

from extproc.groups.policy import GroupPolicy, parse_policy, rank, weighted_score
from extproc.groups.types import GroupChoice, GroupLoad, GroupProbe
from extproc.router import Worker


def probe(group: str, overlap: int, cost: float, *, blocks: int = 10, block_size: int = 16) -> GroupProbe:
    return GroupProbe(
        group, GroupChoice(Worker(f"{group}-w"), "", {}, overlap, blocks, cost), GroupLoad(), block_size
    )


def order(probes, policy, weights=None, seed=0):
    return [p.group for p in rank(probes, policy, weights=weights or {}, rng=random.Random(seed))]


@pytest.mark.parametrize(
    "probes, policy, expected",
    [
        # max-overlap: most cached tokens first, cost breaks ties
        (
            [probe("a", 2, 5.0), probe("b", 8, 30.0), probe("c", 8, 20.0)],
            GroupPolicy.MAX_OVERLAP,
            ["c", "b", "a"],
        ),
        # overlap is compared in tokens: 2 blocks of 64 beat 5 blocks of 16
        (
            [probe("a", 5, 1.0), probe("b", 2, 1.0, blocks=2, block_size=64)],
            GroupPolicy.MAX_OVERLAP,
            ["b", "a"],
        ),
        # overlaps within 10 % of the prompt of the best tie (a shared template block): cost decides
        (
            [probe("a", 1, 40.0, blocks=100), probe("b", 0, 20.0, blocks=100)],
            GroupPolicy.MAX_OVERLAP,
            ["b", "a"],
        ),
        (
            [probe("a", 10, 30.0), probe("b", 9, 20.0), probe("c", 8, 1.0)],
            GroupPolicy.MAX_OVERLAP,
            ["b", "a", "c"],
        ),
        # min-cost: cheapest first (cost in tokens), overlap breaks ties
        (
            [probe("a", 2, 5.0), probe("b", 8, 30.0), probe("c", 0, 5.0)],
            GroupPolicy.MIN_COST,
            ["a", "c", "b"],
        ),
        ([probe("a", 0, 2.0, block_size=64), probe("b", 0, 5.0)], GroupPolicy.MIN_COST, ["b", "a"]),
        # weighted: (overlap fraction + 1 - cost / highest cost) / 2 x weight
        ([probe("a", 10, 40.0), probe("b", 0, 10.0)], GroupPolicy.WEIGHTED, ["a", "b"]),  # 0.5 vs 0.375
    ],
)
def test_ranking(probes, policy, expected):
    assert order(probes, policy) == expected


def test_weights_scale_the_weighted_score():
    probes = [probe("a", 10, 40.0), probe("b", 0, 10.0)]
    assert order(probes, GroupPolicy.WEIGHTED, {"b": 2.0}) == ["b", "a"]  # 0.5 vs 0.75
    assert weighted_score(probes[0], 1.0, 40.0 * 16) == pytest.approx(0.5)
    assert weighted_score(probes[1], 2.0, 40.0 * 16) == pytest.approx(0.75)


def test_near_ties_under_max_overlap_are_broken_at_random():
    # one shared block of 125 and costs one block apart: an idle fleet, nothing to tell them apart
    probes = [probe("a", 1, 249.0, blocks=125), probe("b", 0, 250.0, blocks=125)]
    assert {order(probes, GroupPolicy.MAX_OVERLAP, seed=s)[0] for s in range(20)} == {"a", "b"}


def test_exact_ties_are_broken_at_random():
    probes = [probe(g, 0, 10.0) for g in "abcd"]
    firsts = {order(probes, GroupPolicy.MAX_OVERLAP, seed=s)[0] for s in range(40)}
    assert firsts == set("abcd")


def test_an_unknown_policy_names_the_accepted_ones():
    assert parse_policy("min-cost") is GroupPolicy.MIN_COST
    with pytest.raises(ValueError, match="max-overlap, min-cost, weighted"):
        parse_policy("cheapest")


def test_max_overlap_orders_the_near_best_by_cost_after_the_even_and_the_rest_by_overlap_then_cost():
    """Prompts of 160 tokens: overlaps and costs within 16 tokens of the best tie."""
    near = [probe("b", 10, 30.0), probe("a", 10, 1.0), probe("d", 10, 20.0), probe("c", 10, 10.0)]
    others = [probe("x", 2, 5.0), probe("y", 5, 9.0), probe("z", 5, 3.0)]
    for seed in range(8):
        assert order(near + others, GroupPolicy.MAX_OVERLAP, seed=seed) == ["a", "c", "d", "b", "z", "y", "x"]


def test_a_cost_exactly_at_the_slack_ties_with_the_cheapest():
    """16 and 32 tokens of cost, a slack of 16: both are even, drawn in random order, each once."""
    orders = {
        tuple(order([probe("a", 10, 1.0), probe("b", 10, 2.0)], GroupPolicy.MAX_OVERLAP, seed=s))
        for s in range(16)
    }
    assert orders == {("a", "b"), ("b", "a")}


def test_weighted_scores_at_the_edges_of_the_highest_cost():
    free = probe("a", 5, 0.0)  # half the prompt cached
    assert weighted_score(free, 2.0, 0.0) == 2.0 * (0.5 + 1.0) / 2  # every group costs nothing: no cost term
    one_token = probe("b", 5, 1 / 16)  # costs one token, the highest
    assert weighted_score(one_token, 1.0, 1.0) == (0.5 + 1.0 - 1.0) / 2
    assert order([probe("a", 2, 0.0), probe("b", 8, 0.0)], GroupPolicy.WEIGHTED) == ["b", "a"]
