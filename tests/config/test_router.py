"""The router section (config/router.py): Dynamo's flag names and aliases, KV events on or off, timing."""

import pytest

from extproc.config import ConfigError, load_config


def test_boolean_flags_and_dynamo_aliases():
    config = load_config(["--no-router-kv-events", "--no-router-assume-kv-reuse"], environ={})
    assert not config.router.use_kv_events and not config.router.router_assume_kv_reuse
    assert not load_config(["--no-kv-events"], environ={}).router.use_kv_events
    assert not load_config(
        [], environ={"DYN_ROUTER_TRACK_ACTIVE_BLOCKS": "false"}
    ).router.router_track_active_blocks
    assert load_config(["--kv-overlap-score-weight", "0"], environ={}).router.overlap_score_weight == 0.0


def test_without_an_event_source_the_router_predicts_from_decisions():
    assert load_config([], environ={}).router.use_kv_events is False


def test_an_event_source_turns_kv_events_on_unless_told_otherwise(tmp_path):
    zmq = load_config(["--kv-events-port", "5557", "--kv-replay-port", "5558"], environ={})
    assert (
        zmq.router.use_kv_events and zmq.events.kv_events_port == 5557 and zmq.events.kv_replay_port == 5558
    )
    nats = load_config([], environ={"NATS_SERVER": "nats://127.0.0.1:4222"})
    assert nats.router.use_kv_events and nats.events.nats_url == "nats://127.0.0.1:4222"
    assert not load_config(["--kv-events-port", "5557", "--no-kv-events"], environ={}).router.use_kv_events
    path = tmp_path / "w.yaml"
    path.write_text(
        "workers: [{id: w0, endpoint: '10.0.0.5:8000', model: m, kv-events: 'tcp://10.0.0.5:6000',"
        " kv-replay: 'tcp://10.0.0.5:6001'}]\n"
        "events: {namespace: prod, router-replica-sync: true, nats-url: 'nats://127.0.0.1:4222'}\n"
    )
    config = load_config(["--config", str(path)], environ={})
    assert config.router.use_kv_events
    assert config.workers[0].kv_events == "tcp://10.0.0.5:6000" and config.workers[0].host == "10.0.0.5"
    assert config.events.namespace == "prod" and config.events.replica_sync


def test_the_timing_prefill_model_takes_the_engines_pass_time_polynomials():
    config = load_config(
        ["--router-prefill-load-model", "timing", "--router-prefill-timing", "1e-7,0.02,10"], environ={}
    )
    assert config.router.prefill_load_model == "timing"
    assert config.router.prefill_timing.prefill_linear_ms == 0.02
    default = load_config([], environ={"DYN_ROUTER_PREFILL_LOAD_MODEL": "timing"}).router
    assert default.prefill_timing.prefill_constant_ms == pytest.approx(16.50142)
    with pytest.raises(ConfigError, match="3 or 6 comma-separated numbers"):
        load_config(["--router-prefill-timing", "fast"], environ={})
