"""Group policies: how a top-level picker orders the groups that answered a probe. Pure functions.

Overlap and cost are compared in tokens (blocks x the group's block size) so groups with different
block sizes compare fairly. Exact ties are broken at random (the rng is injected), as Dynamo does
between workers, so idle groups share new conversations.

- `max-overlap` (default): most cached prompt tokens on the group's chosen worker; lower cost breaks
  ties. Near ties are ties: overlaps within `TIE_FRACTION` of the prompt of the best one, and among
  those, costs within the same amount of the lowest (chosen at random). Every chat request shares
  its template's first block or two; counted strictly, that block would make the first group to
  serve any request win every new conversation, and the other groups would idle.
- `min-cost`: lowest cost of the group's chosen worker; more overlap breaks ties.
- `weighted`: highest weight x (overlap fraction + (1 - cost / highest cost)) / 2, a score in
  [0, weight] that blends cache reuse with load and prefers heavier-weighted groups.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping, Sequence

from extproc.groups.types import GroupProbe

TIE_FRACTION = 0.1  # max-overlap: overlaps (then costs) this close to the best, as a share of the prompt, tie


class GroupPolicy(enum.StrEnum):
    MAX_OVERLAP = "max-overlap"
    MIN_COST = "min-cost"
    WEIGHTED = "weighted"


def parse_policy(text: str) -> GroupPolicy:
    """Raises ValueError naming the accepted values."""
    try:
        return GroupPolicy(text)
    except ValueError:
        accepted = ", ".join(p.value for p in GroupPolicy)
        raise ValueError(f"invalid group policy {text!r}: expected one of {accepted}") from None


def cost_tokens(probe: GroupProbe) -> float:
    return probe.choice.cost * probe.block_size


def rank(
    probes: Sequence[GroupProbe],
    policy: GroupPolicy,
    *,
    weights: Mapping[str, float],
    rng: random.Random,
) -> list[GroupProbe]:
    """The probes ordered best first under `policy` (`weights` by group name, default 1)."""
    shuffled = list(probes)
    rng.shuffle(shuffled)  # the stable sort below keeps this order among exact ties
    if policy is GroupPolicy.MAX_OVERLAP:
        return _max_overlap(shuffled)
    key: Callable[[GroupProbe], tuple[float, float]]
    if policy is GroupPolicy.MIN_COST:
        key = lambda p: (cost_tokens(p), -p.overlap_tokens)  # noqa: E731
    else:
        highest = max((cost_tokens(p) for p in probes), default=0.0)

        def key(p: GroupProbe) -> tuple[float, float]:
            return (-weighted_score(p, weights.get(p.group, 1.0), highest), cost_tokens(p))

    return sorted(shuffled, key=key)


def _max_overlap(shuffled: list[GroupProbe]) -> list[GroupProbe]:
    """Near-best overlap and near-lowest cost (random order), the rest of the near-best overlap by
    cost, then everything else by overlap and cost."""
    if not shuffled:
        return []
    slack = TIE_FRACTION * max(p.choice.request_blocks * p.block_size for p in shuffled)
    best = max(p.overlap_tokens for p in shuffled)
    near = [p for p in shuffled if p.overlap_tokens >= best - slack]
    cheapest = min(cost_tokens(p) for p in near)
    even = [p for p in near if cost_tokens(p) <= cheapest + slack]
    rest_of_near = sorted((p for p in near if cost_tokens(p) > cheapest + slack), key=cost_tokens)
    others = sorted(
        (p for p in shuffled if p.overlap_tokens < best - slack),
        key=lambda p: (-p.overlap_tokens, cost_tokens(p)),
    )
    return even + rest_of_near + others


def weighted_score(probe: GroupProbe, weight: float, highest_cost_tokens: float) -> float:
    """weight x (overlap fraction + (1 - cost / highest cost)) / 2; 1 - cost/highest is 1 when all cost 0."""
    relative_cost = cost_tokens(probe) / highest_cost_tokens if highest_cost_tokens > 0 else 0.0
    return weight * (probe.overlap_fraction + 1.0 - relative_cost) / 2.0
