"""The events section (extproc/config/events.py): event sources, NATS and what needs it."""

import pytest

from extproc.config import ConfigError, load_config


def test_durable_state_and_replica_sync_need_nats():
    for flag in ("--router-durable-kv-events", "--router-replica-sync"):
        with pytest.raises(ConfigError, match="need NATS"):
            load_config([flag], environ={})
