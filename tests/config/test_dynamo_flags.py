"""Dynamo's router guides, knob by knob (issue 23): every flag, variable and value of every revision
(../shared/dynamo-docs/) is accepted by serve's config reader and sets what the guide says, or is named
in one startup notice (config.notices), or is refused with a message naming what is accepted.

The guides are read here, so a new revision's new flag fails `test_every_flag_of_the_guides_has_a_row`
until it has a row in KNOBS. Without ../shared the rows are still tested.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from extproc import cli
from extproc.config import ConfigError, PickerConfig, load_config

REPO = Path(__file__).resolve().parents[2]
GUIDES = REPO.parent / "shared" / "dynamo-docs"
GUIDE_TEXT = "\n".join(p.read_text() for p in sorted(GUIDES.glob("*.txt"))) if GUIDES.is_dir() else ""
needs_guides = pytest.mark.skipif(not GUIDE_TEXT, reason=f"no Dynamo router guides at {GUIDES}")

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")  # not the prefixes `--router-*`
VARIABLE = re.compile(r"\b(?:DYN|NATS)_[A-Z0-9_]*[A-Z0-9]\b")
NATS = ("--nats-url", "nats://127.0.0.1:4222")
ZMQ = ("--kv-events-port", "5557")  # an event source, so that turning events off shows


@dataclass(frozen=True)
class Knob:
    """One guide knob: a command line (or environment) using it and what it must give."""

    argv: tuple[str, ...] = ()
    environ: tuple[tuple[str, str], ...] = ()
    field: str | None = None  # dotted path into PickerConfig
    value: Any = None
    notice: str | None = None  # a piece of the one startup line naming it


def _env(**variables: str) -> tuple[tuple[str, str], ...]:
    return tuple(variables.items())


KNOBS: dict[str, Knob] = {
    "--active-decode-blocks-threshold": Knob(
        ("--active-decode-blocks-threshold", "0.85"),
        field="router.active_decode_blocks_threshold",
        value=0.85,
    ),
    "--active-prefill-tokens-threshold": Knob(
        ("--active-prefill-tokens-threshold", "1000"),
        field="router.active_prefill_tokens_threshold",
        value=1000,
    ),
    "--active-prefill-tokens-threshold-frac": Knob(
        ("--active-prefill-tokens-threshold-frac", "0.8"),
        field="router.active_prefill_tokens_threshold_frac",
        value=0.8,
    ),
    # the older guides' single threshold: "active blocks exceed this percentage of total blocks"
    "--busy-threshold": Knob(
        ("--busy-threshold", "0.9"), field="router.active_decode_blocks_threshold", value=0.9
    ),
    "--discovery-backend": Knob(("--discovery-backend", "file"), notice="Dynamo's discovery"),
    "--enable-local-indexer": Knob(("--enable-local-indexer",), notice="local indexers"),
    "--enable-streaming-session": Knob(("--enable-streaming-session",), notice="open_session"),
    "--event-plane": Knob(
        ("--event-plane", "nats"), field="events.nats_url", value="nats://localhost:4222", notice="localhost"
    ),
    "--help": Knob(("--help",)),  # test_help_is_the_parsers_own
    "--http-port": Knob(("--http-port", "8000"), notice="--admin-port"),
    "--kv-cache-block-size": Knob(("--kv-cache-block-size", "32"), field="router.block_size", value=32),
    "--kv-events-config": Knob(
        (
            "--kv-events-config",
            '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": '
            '"tcp://*:5557", "replay_endpoint": "tcp://*:5600"}',
        ),
        notice="--kv-events-port 5557 --kv-replay-port 5600",
    ),
    "--kv-overlap-score-weight": Knob(
        ("--kv-overlap-score-weight", "2"), field="router.overlap_score_weight", value=2.0
    ),
    "--model": Knob(("--model", "meta-llama/Llama-2-7b-hf"), notice="models:"),
    "--no-assume-kv-reuse": Knob(
        ("--no-assume-kv-reuse",), field="router.router_assume_kv_reuse", value=False
    ),
    "--no-kv-events": Knob((*ZMQ, "--no-kv-events"), field="router.use_kv_events", value=False),
    "--no-router-assume-kv-reuse": Knob(
        ("--no-router-assume-kv-reuse",), field="router.router_assume_kv_reuse", value=False
    ),
    "--no-router-kv-events": Knob((*ZMQ, "--no-router-kv-events"), field="router.use_kv_events", value=False),
    "--no-router-track-active-blocks": Knob(
        ("--no-router-track-active-blocks",), field="router.router_track_active_blocks", value=False
    ),
    "--no-router-track-prefill-tokens": Knob(
        ("--no-router-track-prefill-tokens",), field="router.router_track_prefill_tokens", value=False
    ),
    "--no-track-active-blocks": Knob(
        ("--no-track-active-blocks",), field="router.router_track_active_blocks", value=False
    ),
    "--port": Knob(("--port", "8001"), field="port", value=8001),  # ours: the ext_proc port (README)
    "--publish-events-and-metrics": Knob(("--publish-events-and-metrics",), notice="TensorRT-LLM"),
    "--request-plane": Knob(("--request-plane", "tcp"), notice="Envoy over HTTP"),
    "--router-block-size": Knob(("--router-block-size", "64"), field="router.block_size", value=64),
    "--router-durable-kv-events": Knob(
        (*NATS, "--router-durable-kv-events"), field="events.durable_kv_events", value=True
    ),
    "--router-event-threads": Knob(("--router-event-threads", "4"), notice="single-threaded"),
    "--router-kv-events": Knob(("--router-kv-events",), field="router.use_kv_events", value=True),
    "--router-kv-overlap-score-weight": Knob(
        ("--router-kv-overlap-score-weight", "0"), field="router.overlap_score_weight", value=0.0
    ),
    "--router-max-tree-size": Knob(
        ("--router-max-tree-size", "1048576"), field="router.router_max_tree_size", value=2**20
    ),
    "--router-mode": Knob(("--router-mode", "kv"), field="router.mode", value="kv"),
    "--router-prefill-load-model": Knob(
        ("--router-prefill-load-model", "none"), field="router.prefill_load_model", value="none"
    ),
    "--router-prune-target-ratio": Knob(
        ("--router-prune-target-ratio", "0.5"), field="router.router_prune_target_ratio", value=0.5
    ),
    "--router-queue-policy": Knob(
        ("--router-queue-policy", "wspt"), field="router.router_queue_policy", value="wspt"
    ),
    "--router-queue-threshold": Knob(
        ("--router-queue-threshold", "4.0"), field="router.router_queue_threshold", value=4.0
    ),
    "--router-replica-sync": Knob((*NATS, "--router-replica-sync"), field="events.replica_sync", value=True),
    "--router-reset-states": Knob(
        (*NATS, "--router-durable-kv-events", "--router-reset-states"),
        field="events.reset_states",
        value=True,
    ),
    "--router-snapshot-threshold": Knob(
        (*NATS, "--router-durable-kv-events", "--router-snapshot-threshold", "1000000"),
        field="events.snapshot_threshold",
        value=1_000_000,
    ),
    "--router-temperature": Knob(("--router-temperature", "0.5"), field="router.temperature", value=0.5),
    "--router-track-output-blocks": Knob(
        ("--router-track-output-blocks",),
        field="router.router_track_output_blocks",
        value=True,
    ),
    "--router-track-prefill-tokens": Knob(
        ("--router-track-prefill-tokens",), field="router.router_track_prefill_tokens", value=True
    ),
    "--router-ttl": Knob(("--router-ttl", "30"), field="router.router_ttl_secs", value=30.0),
    "--router-ttl-secs": Knob(("--router-ttl-secs", "30"), field="router.router_ttl_secs", value=30.0),
    "--zmq-broker-url": Knob(
        ("--event-plane", "zmq", "--zmq-broker-url", "xsub=tcp://10.0.0.5:5555 , xpub=tcp://10.0.0.5:5556"),
        field="events.zmq_brokers",
        value=("tcp://10.0.0.5:5556",),
        notice="through the brokers at tcp://10.0.0.5:5556",
    ),
    "--zmq-broker-enabled": Knob(("--zmq-broker-enabled",), notice="name them with --zmq-broker-url"),
    "--static-endpoint": Knob(("--static-endpoint", "dynamo.backend.generate"), notice="KV routing works"),
    # the --aic-* flags the aic model takes (the guides name them `--aic-*`; Dynamo's frontend has these)
    **{
        flag: Knob((flag, value), notice="aic prefill load model")
        for flag, value in (
            ("--aic-backend", "vllm"),
            ("--aic-system", "h200_sxm"),
            ("--aic-model-path", "nvidia/Llama-3.1-8B-Instruct-FP8"),
            ("--aic-backend-version", "0.12.0"),
            ("--aic-tp-size", "1"),
            ("--aic-moe-tp-size", "1"),
            ("--aic-moe-ep-size", "1"),
            ("--aic-attention-dp-size", "1"),
        )
    },
    # environment variables
    "DYN_ENCODER_CUDA_TO_CPU_RATIO": Knob(
        environ=_env(DYN_ENCODER_CUDA_TO_CPU_RATIO="4"), field="router.cuda_to_cpu_ratio", value=4.0
    ),
    "DYN_KV_CACHE_BLOCK_SIZE": Knob(
        environ=_env(DYN_KV_CACHE_BLOCK_SIZE="32"), field="router.block_size", value=32
    ),
    "DYN_REQUEST_PLANE": Knob(environ=_env(DYN_REQUEST_PLANE="tcp"), notice="DYN_REQUEST_PLANE: accepted"),
    "DYN_ROUTER_EVENT_THREADS": Knob(
        environ=_env(DYN_ROUTER_EVENT_THREADS="4"),
        notice="DYN_ROUTER_EVENT_THREADS=4: the picker's KV indexer",
    ),
    "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT": Knob(
        environ=_env(DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT="2"), field="router.overlap_score_weight", value=2.0
    ),
    "DYN_ROUTER_MODE": Knob(
        environ=_env(DYN_ROUTER_MODE="round_robin"), field="router.mode", value="round-robin"
    ),
    "DYN_ROUTER_TEMPERATURE": Knob(
        environ=_env(DYN_ROUTER_TEMPERATURE="0.5"), field="router.temperature", value=0.5
    ),
    "DYN_ROUTER_USE_KV_EVENTS": Knob(
        ZMQ, environ=_env(DYN_ROUTER_USE_KV_EVENTS="false"), field="router.use_kv_events", value=False
    ),
    "DYN_SYSTEM_PORT": Knob(environ=_env(DYN_SYSTEM_PORT="9090"), field="admin_port", value=9090),
    "NATS_SERVER": Knob(
        environ=_env(NATS_SERVER="nats://10.0.0.2:4222"),
        field="events.nats_url",
        value="nats://10.0.0.2:4222",
    ),
}

# Values the guides give a flag (beside the one its row uses), each with what it sets or says.
VALUES: dict[tuple[str, ...], Knob] = {
    ("--router-mode", "round-robin"): Knob(field="router.mode", value="round-robin"),
    ("--router-mode", "round_robin"): Knob(field="router.mode", value="round-robin"),  # 003's default column
    ("--router-mode", "random"): Knob(field="router.mode", value="random"),
    ("--router-mode", "device-aware-weighted"): Knob(field="router.mode", value="device-aware-weighted"),
    ("--router-queue-policy", "fcfs"): Knob(field="router.router_queue_policy", value="fcfs"),
    ("--router-queue-policy", "lcfs"): Knob(field="router.router_queue_policy", value="lcfs"),
    ("--router-prefill-load-model", "aic"): Knob(
        field="router.prefill_load_model", value="aic", notice="not from AIConfigurator's database"
    ),
    ("--router-prefill-load-model", "none"): Knob(field="router.prefill_load_model", value="none"),
    ("--router-queue-threshold", "None"): Knob(field="router.router_queue_threshold", value=None),
    ("--event-plane", "zmq"): Knob(notice="ZMQ event plane cannot be heard"),  # no discovery it can read
    ("--discovery-backend", "mem"): Knob(notice="Dynamo's discovery"),
    # the brokers without the ZMQ plane: Dynamo's workers would not use them either
    ("--zmq-broker-url", "xsub=tcp://10.0.0.5:5555 , xpub=tcp://10.0.0.5:5556"): Knob(
        field="events.zmq_brokers", value=(), notice="used only with --event-plane zmq"
    ),
    ("--event-plane", "nats", *NATS): Knob(
        field="events.nats_url", value=NATS[1]
    ),  # a server named: no notice
}

# Refused at startup (exit 2), the message naming what is accepted.
REFUSED: dict[tuple[str, ...], str] = {
    ("--router-prefill-load-model", "aic", "--no-router-track-prefill-tokens"): (
        "aic' with --no-router-track-prefill-tokens: .*requires router_track_prefill_tokens=true"
    ),
    ("--router-queue-threshold", "0"): r"router-queue-threshold=0.0: expected > 0 \(as Dynamo requires\)",
    ("--router-queue-threshold", "-1"): "expected > 0",
    ("--router-event-threads", "0"): "router-event-threads=0: expected > 0",
    (
        "--event-plane",
        "zmq",
        "--zmq-broker-url",
        "tcp://10.0.0.5:5556",
    ): "invalid zmq-broker-url: expected 'xsub",
    (
        "--event-plane",
        "zmq",
        "--zmq-broker-url",
        "xsub=tcp://b:5555 , xpub=",
    ): "at least one xsub and one xpub",
    (
        "--event-plane",
        "zmq",
        "--zmq-broker-url",
        "xsub=tcp://b:5555 , xpub=ipc:///x",
    ): "expected tcp://host:port",
}


def _field(config: PickerConfig, path: str) -> Any:
    value: Any = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


def _check(knob: Knob, config: PickerConfig) -> None:
    if knob.field is not None:
        assert _field(config, knob.field) == knob.value
    if knob.notice is None:
        assert config.notices == (), "a knob that does what the guide says needs no notice"
    else:
        assert [line for line in config.notices if knob.notice in line], config.notices
        assert len(config.notices) == 1, "one line per knob"


@needs_guides
@pytest.mark.parametrize("name", sorted({*FLAG.findall(GUIDE_TEXT), *VARIABLE.findall(GUIDE_TEXT)}))
def test_every_flag_and_variable_of_the_guides_has_a_row(name):
    assert name in KNOBS, f"{name} appears in Dynamo's router guides: give it a row in KNOBS (and the README)"


@needs_guides
def test_every_value_the_guides_give_a_flag_has_a_row():
    given = {("--router-mode", "round_robin")} if "round_robin" in GUIDE_TEXT else set()
    for flag in ("--router-mode", "--router-queue-policy", "--router-prefill-load-model", "--event-plane",
                 "--discovery-backend"):  # fmt: skip
        for words in re.findall(re.escape(flag) + r"[ =]+`?([a-z][a-z_|-]*)", GUIDE_TEXT):
            given |= {(flag, word) for word in words.split("|")}
    tested = {knob.argv for knob in KNOBS.values()} | set(VALUES) | set(REFUSED)
    assert sorted(given - tested) == []


@pytest.mark.parametrize("name", sorted(set(KNOBS) - {"--help"}))
def test_each_knob_sets_what_the_guide_says_or_is_named_at_startup(name):
    knob = KNOBS[name]
    _check(knob, load_config(list(knob.argv), environ=dict(knob.environ)))


@pytest.mark.parametrize("argv", sorted(VALUES))
def test_each_value_of_the_guides(argv):
    _check(VALUES[argv], load_config(list(argv), environ={}))


@pytest.mark.parametrize("name", sorted(n for n in KNOBS if n.startswith("--") and n != "--help"))
def test_each_flag_is_also_read_from_its_dyn_variable(name):
    """What a flag sets, DYN_<FLAG> sets too (the guide: "All CLI arguments can be configured via
    environment variables using the DYN_ prefix"); a --no- switch is DYN_<FLAG>=false."""
    knob = KNOBS[name]
    at = knob.argv.index(name)
    before, rest = list(knob.argv[:at]), knob.argv[at + 1 :]
    off = name.startswith("--no-")
    variable = "DYN_" + name.removeprefix("--no-" if off else "--").upper().replace("-", "_")
    value = "false" if off else (rest[0] if rest else "true")
    _check(knob, load_config(before, environ={variable: value}))


@pytest.mark.parametrize("argv", sorted(REFUSED))
def test_values_dynamo_refuses_or_the_picker_cannot_honour_stop_startup_with_a_message(argv):
    with pytest.raises(ConfigError, match=REFUSED[argv]):
        load_config(list(argv), environ={})


def test_the_aic_flags_are_one_line_with_or_without_aic(capsys):
    config = load_config(["--aic-backend", "vllm", "--aic-system", "h200_sxm"], environ={})
    assert config.notices == (
        "--aic-backend, --aic-system: accepted from Dynamo, no effect here: they configure the aic prefill "
        "load model (--router-prefill-load-model is timing)",
    )
    config = load_config(
        ["--router-prefill-load-model", "aic", "--aic-backend", "vllm", "--aic-tp-size", "2"], environ={}
    )
    assert config.router.prefill_load_model == "aic"
    assert config.notices == (
        "--router-prefill-load-model aic: each prefill's expected duration comes from the pass-time model "
        "(--router-prefill-timing, scaled per worker as learned), not from AIConfigurator's database, which "
        "cannot run here (the --aic-* flags choose it); --aic-backend, --aic-tp-size: accepted from Dynamo, "
        "no meaning here",
    )
    argv = ["--router-prefill-load-model", "aic", "--no-router-learn-prefill-timing"]
    config = load_config(argv, environ={})
    assert config.notices == (
        "--router-prefill-load-model aic: each prefill's expected duration comes from the pass-time model "
        "(--router-prefill-timing), not from AIConfigurator's database, which cannot run here (the --aic-* "
        "flags choose it)",
    )
    with pytest.raises(SystemExit):
        load_config(["--router-prefill-load-model", "aic", "--aic-tp-size", "two"], environ={})


def test_aic_without_prefill_token_tracking_exits_2_in_one_line(capsys):
    assert cli.main(["serve", "--router-prefill-load-model", "aic", "--no-router-track-prefill-tokens"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "requires router_track_prefill_tokens=true" in err


def test_a_prefix_of_a_flag_is_not_that_flag():
    """argparse's abbreviations are off: --router-ttl is an alias of its own, and a prefix such as
    --router-ttl-se or --busy no longer maps silently to whatever flag it begins."""
    with pytest.raises(SystemExit):
        load_config(["--router-ttl-se", "5"], environ={})
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--router-temp", "0.5"])
    assert cli.build_parser().parse_args(["serve", "--router-ttl", "5"]).router_ttl_secs == 5.0


def test_help_is_the_parsers_own(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["serve", "--help"])
    assert exit_.value.code == 0 and "--busy-threshold" in capsys.readouterr().out


def test_the_kv_events_config_notice_follows_the_engines_json():
    off = load_config(["--kv-events-config", '{"enable_kv_cache_events": false}'], environ={})
    assert "--no-router-kv-events" in off.notices[0]
    odd = load_config(["--kv-events-config", "not json"], environ={})
    assert odd.notices[0].endswith("the picker subscribes with --kv-events-port and --kv-replay-port")


def test_event_threads_of_one_is_dynamos_single_threaded_indexer_and_says_nothing():
    assert load_config(["--router-event-threads", "1"], environ={}).notices == ()


def test_a_dynamo_command_line_starts_the_picker_with_one_line_per_knob_not_applied(monkeypatch, caplog):
    """serve logs each notice once, as a warning, before it starts; the values reach the config."""
    started: list[PickerConfig] = []

    async def serve(config: PickerConfig, *, ports_file: str | None = None) -> None:
        started.append(config)

    monkeypatch.setattr("extproc.runtime.server.serve", serve)
    argv = ["serve", "--router-mode", "round_robin", "--busy-threshold", "0.9", "--no-track-active-blocks",
            "--router-event-threads", "4", "--router-track-output-blocks", "--http-port", "8000"]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="extproc.config"):
        assert cli.main(argv) == 0
    (config,) = started
    assert config.router.mode == "round-robin" and config.router.active_decode_blocks_threshold == 0.9
    lines = [r.getMessage() for r in caplog.records if r.name == "extproc.config"]
    assert lines == list(config.notices) and len(lines) == 2


def test_the_readme_table_has_every_knob():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Coming from Dynamo") :].split("\n## ", 1)[0]
    for name in KNOBS:
        base = name.removeprefix("--no-").removeprefix("--")
        spellings = (name, f"--{base}", f"--[no-]{base}") if name.startswith("--") else (name,)
        assert any(f"`{s}" in section for s in spellings), f"{name}: no row in README's Coming from Dynamo"
