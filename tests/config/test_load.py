"""Loading: flag > DYN_* env > file > default, the file's shape, and messages naming the setting and value."""

import re

import pytest

from extproc.config import ConfigError, load_config
from extproc.router import RouterMode

CONFIG = """
router:
  router-mode: random
  kv-cache-block-size: 32
  router_temperature: 0.25
workers:
  - {id: w0, endpoint: "127.0.0.1:8000", model: m}
  - {id: w1, endpoint: "127.0.0.1:8001", model: m, dp-size: 2, total-blocks: 100}
models:
  - {name: m, tokenizer: /tmp/tok}
"""


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "picker.yaml"
    path.write_text(CONFIG)
    return str(path)


def test_file_values_apply_when_no_flag_or_env_is_given(config_file):
    config = load_config(["--config", config_file], environ={})
    assert config.router.mode is RouterMode.RANDOM
    assert config.router.block_size == 32
    assert config.router.temperature == 0.25
    assert [w.id for w in config.workers] == ["w0", "w1"]
    assert config.workers[1].dp_ranks == (0, 1) and config.workers[1].total_blocks == 100
    assert config.models[0].tokenizer == "/tmp/tok"


def test_env_beats_file_and_flags_beat_env(config_file):
    env = {
        "DYN_ROUTER_MODE": "round-robin",
        "DYN_ROUTER_TEMPERATURE": "0.5",
        "DYN_KV_OVERLAP_SCORE_WEIGHT": "2",
    }
    config = load_config(["--config", config_file], environ=env)
    assert config.router.mode is RouterMode.ROUND_ROBIN
    assert config.router.temperature == 0.5
    assert config.router.overlap_score_weight == 2.0
    config = load_config(
        ["--config", config_file, "--router-mode", "kv", "--router-temperature", "0"], environ=env
    )
    assert config.router.mode is RouterMode.KV and config.router.temperature == 0.0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            [],
            {"DYN_ROUTER_MODE": "fastest"},
            "DYN_ROUTER_MODE='fastest': expected one of kv, round-robin, random",
        ),
        ([], {"DYN_ROUTER_TEMPERATURE": "warm"}, "DYN_ROUTER_TEMPERATURE='warm'"),
        (["--router-temperature", "-1"], {}, "temperature=-1.0: expected a number >= 0"),
        ([], {"DYN_ROUTER_TRACK_ACTIVE_BLOCKS": "maybe"}, "expected true or false"),
        (["--active-prefill-tokens-threshold-frac", "2"], {}, "fraction in [0, 1]"),
        (["--group-lease-secs", "0"], {}, "group-lease-secs=0.0: expected > 0"),
        (["--shutdown-delay-secs", "-1"], {}, "shutdown-delay-secs=-1.0: expected a finite number >= 0"),
        ([], {"DYN_SHUTDOWN_DELAY_SECS": "nan"}, "shutdown-delay-secs=nan: expected a finite number"),
        (["--shutdown-delay-secs", "inf"], {}, "shutdown-delay-secs=inf: expected a finite number"),
    ],
)
def test_bad_values_name_the_setting_value_and_what_is_accepted(argv, env, message):
    with pytest.raises(ConfigError) as info:
        load_config(argv, environ=env)
    assert message in str(info.value)


W0 = b"workers: [{id: w0, endpoint: '1.1.1.1:1', model: m, "


@pytest.mark.parametrize(
    ("document", "message"),
    [  # fuzz-found: each raised something other than ConfigError (MemoryError for the huge dp_size)
        (W0 + b"dp_size: many}]", "invalid workers[0]"),
        (W0 + b"dp_size: [0, 1]}]", "invalid workers[0]"),
        (W0 + b"dp_size: 9007199254740992}]", "dp_size=9007199254740992 is not in [1, 1024]"),
        (W0 + b"total_blocks: .inf}]", "invalid workers[0]"),
        (b"picker: {max-body-bytes: .inf}", "max-body-bytes=inf"),
        (b"router: {router-temperature: 1" + b"0" * 400 + b"}", "router-temperature="),
        (b"\xff\xfe", "cannot read config file"),
        (b'a: "\\U1010FFFF"', "cannot read config file"),
        (b'picker: {group-tls-ca-file: "\\uDC00x"}', "file not found"),
        (b'picker: {group-tls-ca-file: "a\\0b"}', "file not found"),
    ],
)
def test_any_bad_config_file_is_a_config_error(tmp_path, document, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(document)
    with pytest.raises(ConfigError) as info:
        load_config(["--config", str(path)], environ={})
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("document", "message"),
    [  # each raised OverflowError or TypeError, not ConfigError
        ("groups: [{name: a, local: true, weight: 1" + "0" * 400 + "}]", "invalid groups[0].weight="),
        ("models: 5", "invalid models: expected a list"),
        ("models: true", "invalid models: expected a list"),
        ("models: {m: {tokenizer: /tok}}", "invalid models: expected a list"),
    ],
)
def test_a_list_that_is_not_one_or_a_huge_number_is_a_config_error(tmp_path, document, message):
    path = tmp_path / "bad.yaml"
    path.write_text(document)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(["--config", str(path)], environ={})


def test_null_in_the_config_file_means_unset(tmp_path):
    path = tmp_path / "nulls.yaml"
    path.write_text("disagg: {disagg-min-remote-prefill-tokens: null}\nrouter: {router-temperature: null}\n")
    config = load_config(["--config", str(path)], environ={})
    default = load_config([], environ={})
    assert config.disagg == default.disagg and config.router.temperature == default.router.temperature


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(["--config", str(tmp_path / "nope.yaml")], environ={})


def test_plain_yaml_numbers_work_for_optional_numeric_settings(tmp_path):
    path = tmp_path / "numbers.yaml"
    path.write_text(
        "router: {active-prefill-tokens-threshold: 1000, active-decode-blocks-threshold: 0.8,"
        " router-queue-threshold: 1}\n"
        "picker: {admin-port: 9090, seed: 7}\n"
        "events: {kv-events-port: 5557}\n"
        "workers: [{id: w0, endpoint: '10.0.0.5:8000', model: m}]\n"
    )
    config = load_config(["--config", str(path)], environ={})
    assert config.router.active_prefill_tokens_threshold == 1000
    assert config.router.active_decode_blocks_threshold == 0.8
    assert config.router.router_queue_threshold == 1.0
    assert (config.admin_port, config.seed, config.events.kv_events_port) == (9090, 7, 5557)
    path.write_text("picker: {admin-port: 90.5}\n")
    with pytest.raises(ConfigError, match=r"admin-port=90\.5"):
        load_config(["--config", str(path)], environ={})


def test_the_shutdown_delay_is_off_unless_set():
    assert load_config([], environ={}).shutdown_delay_s == 0.0
    assert load_config(["--shutdown-delay-secs", "3"], environ={}).shutdown_delay_s == 3.0
    assert load_config([], environ={"DYN_SHUTDOWN_DELAY_SECS": "1.5"}).shutdown_delay_s == 1.5


def test_the_group_lease_reaches_the_groups_config():
    assert load_config([]).groups.lease_s == 10.0
    assert load_config(["--group-lease-secs", "2.5"]).groups.lease_s == 2.5
    assert load_config([], environ={"DYN_GROUP_LEASE_SECS": "4"}).groups.lease_s == 4.0
