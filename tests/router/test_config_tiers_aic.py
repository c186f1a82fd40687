"""RouterConfig's checks added for issue 23, with the fields their errors carry (what `serve` prints
and the admin API answers): the tier credit weights and aic without prefill-token tracking."""

from __future__ import annotations

import math

import pytest

from extproc.router import InvalidConfig, RouterConfig


@pytest.mark.parametrize("name", ["host_cache_hit_weight", "disk_cache_hit_weight"])
def test_a_tier_weight_is_a_fraction_in_0_to_1(name: str) -> None:
    for ok in (0, 0.5, 1, 1.0):
        assert getattr(RouterConfig(**{name: ok}), name) == ok
    for bad in (-0.01, 1.0001, 2, math.nan, math.inf):
        with pytest.raises(InvalidConfig) as refused:
            RouterConfig(**{name: bad})
        assert refused.value.name == name
        assert refused.value.value is bad or refused.value.value == bad
        assert refused.value.accepted == "a fraction in [0, 1]"


def test_aic_without_prefill_token_tracking_is_refused_naming_the_setting() -> None:
    assert RouterConfig(prefill_load_model="aic").prefill_load_model.value == "aic"
    with pytest.raises(InvalidConfig) as refused:
        RouterConfig(prefill_load_model="aic", router_track_prefill_tokens=False)
    assert (refused.value.name, refused.value.value) == ("prefill_load_model", "aic")
    assert refused.value.accepted.startswith("none or timing without router_track_prefill_tokens")
    for other in ("none", "timing"):  # only aic needs the tracking
        RouterConfig(prefill_load_model=other, router_track_prefill_tokens=False)
