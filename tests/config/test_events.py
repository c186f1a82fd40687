"""The events section (extproc/config/events.py): event sources, NATS and what needs it."""

import pytest

from extproc.config import ConfigError, load_config


def test_durable_state_and_replica_sync_need_nats():
    for flag in ("--router-durable-kv-events", "--router-replica-sync"):
        with pytest.raises(ConfigError, match="need NATS"):
            load_config([flag], environ={})


def test_nats_read_delay_is_200_ms_by_default_50_with_durable_events_settable_and_bounded():
    assert load_config([], environ={}).events.nats_read_delay_s == 0.2
    durable = ["--router-durable-kv-events", "--nats-url", "nats://127.0.0.1:4222"]
    assert load_config(durable, environ={}).events.nats_read_delay_s == 0.05
    assert load_config([*durable, "--nats-read-delay-ms", "300"], environ={}).events.nats_read_delay_s == 0.3
    assert load_config(["--nats-read-delay-ms", "0"], environ={}).events.nats_read_delay_s == 0.0
    assert load_config([], environ={"DYN_NATS_READ_DELAY_MS": "5"}).events.nats_read_delay_s == 0.005
    for bad in ("-1", "1001", "nan"):
        with pytest.raises(ConfigError, match="nats-read-delay-ms"):
            load_config(["--nats-read-delay-ms", bad], environ={})
