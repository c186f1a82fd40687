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


def test_a_kv_indexer_turns_kv_events_on_and_its_url_and_timeout_are_checked():
    config = load_config(["--kv-indexer-url", "http://indexer:8090"], environ={})
    assert config.events.kv_indexer_url == "http://indexer:8090"
    assert config.events.kv_indexer_timeout_s == 0.05
    assert config.router.use_kv_events  # exact overlaps, as from events: nothing predicted from decisions
    env = {"DYN_KV_INDEXER_URL": "https://10.0.0.9:8090/", "DYN_KV_INDEXER_TIMEOUT_MS": "20"}
    assert load_config([], environ=env).events.kv_indexer_timeout_s == 0.02
    for bad in ("indexer:8090", "tcp://indexer:8090", "http://", "http://a b"):
        with pytest.raises(ConfigError, match="kv-indexer-url"):
            load_config(["--kv-indexer-url", bad], environ={})
    for bad in ("0", "-5", "10001"):
        with pytest.raises(ConfigError, match="kv-indexer-timeout-ms"):
            load_config(["--kv-indexer-url", "http://i:1", "--kv-indexer-timeout-ms", bad], environ={})


def test_a_kv_indexer_is_refused_where_it_cannot_stand_for_the_kv_events_and_serves_disaggregation(tmp_path):
    url = ["--kv-indexer-url", "http://indexer:8090"]
    with pytest.raises(ConfigError, match="--no-router-kv-events"):
        load_config([*url, "--no-router-kv-events"], environ={})
    with pytest.raises(ConfigError, match="--router-durable-kv-events"):
        load_config([*url, "--router-durable-kv-events", "--nats-url", "nats://n:4222"], environ={})
    disagg = tmp_path / "disagg.yaml"
    disagg.write_text(
        "workers:\n"
        "  - {id: p0, endpoint: 10.0.0.1:8000, model: m, role: prefill}\n"
        "  - {id: d0, endpoint: 10.0.0.2:8000, model: m, role: decode}\n"
    )
    assert {w.role for w in load_config([*url, "--config", str(disagg)], environ={}).workers} == {
        "prefill",
        "decode",
    }  # the indexer's answer names prefill and decode workers alike: each router reads its own
    dns = ["--discovery-dns", "d.svc", "--discovery-prefill-dns", "p.svc"]
    discovered = load_config([*url, *dns], environ={})
    assert discovered.discovery.prefill_dns_name == "p.svc"
    replicas = load_config([*url, "--router-replica-sync", "--nats-url", "nats://n:4222"], environ={})
    assert replicas.events.replica_sync and replicas.events.kv_indexer_url  # the load is still shared


def test_a_kv_indexer_in_a_mode_without_overlaps_is_said_to_be_unused(caplog):
    config = load_config(["--kv-indexer-url", "http://i:1", "--router-mode", "round-robin"], environ={})
    assert any("not queried in --router-mode round-robin" in n for n in config.notices)
