"""Tiered KV flags (Dynamo's --router-host-cache-hit-weight / --router-disk-cache-hit-weight)."""

import pytest

from extproc.config import ConfigError, load_config

ZMQ = ("--kv-events-port", "5557")


def test_the_credits_default_to_dynamos():
    router = load_config(list(ZMQ), environ={}).router
    assert (router.host_cache_hit_weight, router.disk_cache_hit_weight) == (0.75, 0.25)


def test_flags_and_dynamo_variables_set_the_credits():
    argv = [*ZMQ, "--router-host-cache-hit-weight", "1", "--router-disk-cache-hit-weight", "0"]
    config = load_config(argv, environ={})
    assert (config.router.host_cache_hit_weight, config.router.disk_cache_hit_weight) == (1.0, 0.0)
    assert config.notices == ()
    env = {"DYN_ROUTER_HOST_CACHE_HIT_WEIGHT": "0.5", "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT": "0.1"}
    router = load_config(list(ZMQ), environ=env).router
    assert (router.host_cache_hit_weight, router.disk_cache_hit_weight) == (0.5, 0.1)


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan"])
def test_a_credit_outside_0_to_1_stops_startup_naming_the_field(value):
    with pytest.raises(ConfigError, match="host_cache_hit_weight"):
        load_config([*ZMQ, "--router-host-cache-hit-weight", value], environ={})


def test_without_kv_events_the_credits_are_named_once_at_startup():
    approx = load_config(["--router-host-cache-hit-weight", "0.9"], environ={})
    assert approx.notices == (
        "--router-host-cache-hit-weight: no effect without KV events (approximate mode): offloaded KV "
        "(host memory, disk) is known only from the engines' KV events, so no tier is credited",
    )
    off = load_config([*ZMQ, "--no-router-kv-events"], environ={"DYN_ROUTER_DISK_CACHE_HIT_WEIGHT": "0.5"})
    assert len(off.notices) == 1 and off.notices[0].startswith("DYN_ROUTER_DISK_CACHE_HIT_WEIGHT: no effect")
    assert load_config(["--no-router-kv-events"], environ={}).notices == ()  # nothing asked, nothing said
