"""RouterConfig checks each value when built, naming the field; overrides apply only what they set."""

import math

import pytest

from extproc.router import InvalidConfig, RouterConfig, RouterConfigOverride
from extproc.router.config import PrefillLoadModel, QueuePolicy, RouterMode
from extproc.router.prefill_model import PrefillTiming


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mode", "kv-aware"),
        ("mode", 1),
        ("router_queue_policy", "sjf"),
        ("prefill_load_model", "linear"),
        ("prefill_timing", 3.0),
        ("prefill_timing", "1,2"),
        ("block_size", 0),
        ("overlap_score_weight", -0.5),
        ("overlap_score_weight", math.inf),
        ("overlap_score_weight", math.nan),
        ("overlap_score_weight", "1"),
        ("temperature", -1e-9),
        ("temperature", math.inf),
        ("cuda_to_cpu_ratio", 0.0),
        ("cuda_to_cpu_ratio", math.inf),
        ("router_ttl_secs", 0.0),
        ("router_max_tree_size", 0),
        ("router_prune_target_ratio", 0.0),
        ("router_prune_target_ratio", 1.01),
        ("active_decode_blocks_threshold", -0.01),
        ("active_decode_blocks_threshold", 1.01),
        ("active_decode_blocks_threshold", math.nan),
        ("active_prefill_tokens_threshold", -1),
        ("active_prefill_tokens_threshold", 1.5),
        ("active_prefill_tokens_threshold", True),
        ("active_prefill_tokens_threshold_frac", -0.01),
        ("active_prefill_tokens_threshold_frac", 1.01),
        ("active_prefill_tokens_threshold_frac", math.inf),
        ("router_queue_threshold", -0.1),
    ],
)
def test_an_out_of_range_value_is_refused_naming_its_field(field, value):
    with pytest.raises(InvalidConfig) as caught:
        RouterConfig(**{field: value})
    assert caught.value.name.startswith(field)
    assert caught.value.value is value
    assert f"invalid {caught.value.name}=" in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 1),
        ("overlap_score_weight", 0.0),
        ("overlap_score_weight", 0),
        ("temperature", 0.0),
        ("cuda_to_cpu_ratio", 1e-9),
        ("router_ttl_secs", 1e-9),
        ("router_max_tree_size", 1),
        ("router_prune_target_ratio", 1.0),
        ("router_prune_target_ratio", 1e-9),
        ("active_decode_blocks_threshold", 0.0),
        ("active_decode_blocks_threshold", 1.0),
        ("active_decode_blocks_threshold", None),
        ("active_prefill_tokens_threshold", 0),
        ("active_prefill_tokens_threshold", None),
        ("active_prefill_tokens_threshold_frac", 0.0),
        ("active_prefill_tokens_threshold_frac", 1.0),
        ("active_prefill_tokens_threshold_frac", None),
        ("router_queue_threshold", 0.0),
        ("router_queue_threshold", None),
    ],
)
def test_values_at_the_edge_of_their_range_are_accepted(field, value):
    assert getattr(RouterConfig(**{field: value}), field) == value


def test_names_become_members_and_a_timing_string_is_parsed():
    config = RouterConfig(
        mode="round-robin",
        router_queue_policy="wspt",
        prefill_load_model="timing",
        prefill_timing="1e-7,0.02,10",
    )
    assert config.mode is RouterMode.ROUND_ROBIN
    assert config.router_queue_policy is QueuePolicy.WSPT
    assert config.prefill_load_model is PrefillLoadModel.TIMING
    assert config.prefill_timing == PrefillTiming(
        prefill_quadratic_ms=1e-7, prefill_linear_ms=0.02, prefill_constant_ms=10.0
    )


def test_an_unknown_mode_lists_the_accepted_ones():
    with pytest.raises(InvalidConfig, match="round-robin, random, device-aware-weighted"):
        RouterConfig(mode="fastest")


def test_an_override_applies_only_what_it_sets():
    base = RouterConfig(overlap_score_weight=2.0, temperature=0.5)
    assert base.merged(None) is base
    assert base.merged(RouterConfigOverride()) is base
    only_temperature = base.merged(RouterConfigOverride(temperature=0.0))
    assert (only_temperature.overlap_score_weight, only_temperature.temperature) == (2.0, 0.0)
    both = base.merged(RouterConfigOverride(overlap_score_weight=0.0, temperature=1.0))
    assert (both.overlap_score_weight, both.temperature) == (0.0, 1.0)
    assert (base.overlap_score_weight, base.temperature) == (2.0, 0.5)


def test_an_override_is_checked_like_the_config():
    with pytest.raises(InvalidConfig) as caught:
        RouterConfig().merged(RouterConfigOverride(temperature=-1.0))
    assert caught.value.name == "temperature"
