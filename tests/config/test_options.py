"""The option declarations (extproc/config/options.py and each section's table): one reading rule, every
option documented, no spelling claimed twice, every alias spelling the loader has always accepted."""

import argparse
import dataclasses

import pytest

from extproc.config import FILE_SECTIONS, HELP_GROUPS, PickerConfig, load_config
from extproc.config.options import ConfigError, Option, Reader

ALL_OPTIONS = [opt for _, options in HELP_GROUPS for opt in options]


def test_every_option_has_help_text():
    for opt in ALL_OPTIONS:
        assert opt.help.strip() and opt.help == opt.help.strip(), opt.flag


def test_no_two_options_share_a_flag_a_dest_or_an_environment_variable():
    flags = ["--config"]
    for opt in ALL_OPTIONS:
        spellings = (*opt.flags, *opt.cli_aliases)
        flags += [*spellings, *("--no-" + f[2:] for f in spellings if opt.is_switch)]
    envs = ["DYN_CONFIG", *(env for opt in ALL_OPTIONS for env in opt.env_names)]
    dests = [opt.dest for opt in ALL_OPTIONS]
    for names in (flags, envs, dests):
        assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def test_no_two_options_of_a_file_section_share_a_key():
    for section, options in FILE_SECTIONS.items():
        keys = [key for opt in options for key in dict.fromkeys(opt.file_keys)]
        assert len(keys) == len(set(keys)), section


def test_help_and_the_file_sections_list_every_option_once():
    in_files = [opt.dest for options in FILE_SECTIONS.values() for opt in options]
    assert sorted(in_files) == sorted(opt.dest for opt in ALL_OPTIONS)
    assert len(set(in_files)) == len(in_files)


def test_every_default_is_a_value_the_option_accepts():
    for opt in ALL_OPTIONS:
        assert opt.choices is None or opt.default in opt.choices, opt.flag


def test_a_hand_built_picker_config_has_the_defaults_the_flags_have():
    loaded = load_config([], environ={})
    built = PickerConfig(router=loaded.router, workers=(), models=())
    for f in dataclasses.fields(PickerConfig):
        assert getattr(built, f.name) == getattr(loaded, f.name), f.name


SWITCH = Option("--some-switch", bool, None, "A switch.", cli_aliases=("--switch",), env_aliases=("SWITCH",))
NUMBER = Option("--a-number", float, 1.0, "A number.", aliases=("--number",), env_aliases=("NUMBER",))


def _reader(args=None, environ=None, section=None):
    return Reader(argparse.Namespace(**(args or {})), environ or {}, section or {})


@pytest.mark.parametrize(
    ("args", "environ", "section", "expected"),
    [
        ({}, {}, {}, 1.0),
        ({}, {}, {"number": 5}, 5.0),
        ({}, {}, {"a_number": 4, "number": 5}, 4.0),  # the flag's own spelling first, kebab before snake
        ({}, {}, {"a-number": 3, "a_number": 4}, 3.0),
        ({}, {"NUMBER": "6"}, {"a-number": 3}, 6.0),
        ({}, {"DYN_NUMBER": "7", "NUMBER": "6"}, {}, 7.0),
        ({}, {"DYN_A_NUMBER": "8", "DYN_NUMBER": "7"}, {}, 8.0),
        ({"a_number": 9.0}, {"DYN_A_NUMBER": "8"}, {"a-number": 3}, 9.0),
        ({"a_number": None}, {"DYN_A_NUMBER": "8"}, {}, 8.0),  # a flag left at None was not given
        ({}, {}, {"a-number": None}, 1.0),  # null in the file: unset
    ],
)
def test_flag_beats_environment_beats_file_beats_default(args, environ, section, expected):
    assert _reader(args, environ, section).read(NUMBER) == expected


def test_a_switch_reads_words_and_its_cli_alias_is_a_flag_only():
    assert SWITCH.flags == ("--some-switch",) and SWITCH.file_keys == ("some-switch", "some_switch")
    assert SWITCH.env_names == ("DYN_SOME_SWITCH", "SWITCH")
    assert _reader(environ={"SWITCH": "off"}).read(SWITCH) is False
    assert _reader(section={"some_switch": "yes"}).read(SWITCH) is True
    assert _reader().read(SWITCH) is None
    with pytest.raises(ConfigError, match="invalid SWITCH='maybe': expected true or false"):
        _reader(environ={"SWITCH": "maybe"}).read(SWITCH)


@pytest.mark.parametrize(
    ("argv", "environ", "document", "field", "expected"),
    [  # every spelling other than the flag's own that the loader accepts
        (["--kv-overlap-score-weight", "2"], {}, "", "router.overlap_score_weight", 2.0),
        ([], {"DYN_KV_OVERLAP_SCORE_WEIGHT": "3"}, "", "router.overlap_score_weight", 3.0),
        ([], {}, "router: {kv_overlap_score_weight: 4}", "router.overlap_score_weight", 4.0),
        (["--no-kv-events", "--kv-events-port", "5557"], {}, "", "router.use_kv_events", False),
        (["--kv-events"], {}, "", "router.use_kv_events", True),
        ([], {"DYN_ROUTER_USE_KV_EVENTS": "true"}, "", "router.use_kv_events", True),
        ([], {"DYN_KV_EVENTS": "true"}, "", "router.use_kv_events", True),
        ([], {"DYN_ENCODER_CUDA_TO_CPU_RATIO": "4"}, "", "router.cuda_to_cpu_ratio", 4.0),
        (["--nats-server", "nats://a:4222"], {}, "", "events.nats_url", "nats://a:4222"),
        ([], {"NATS_SERVER": "nats://b:4222"}, "", "events.nats_url", "nats://b:4222"),
        ([], {"DYN_NATS_SERVER": "nats://c:4222"}, "", "events.nats_url", "nats://c:4222"),
        ([], {}, "events: {nats_server: 'nats://d:4222'}", "events.nats_url", "nats://d:4222"),
        ([], {"NATS_AUTH_TOKEN": "t"}, "", "events.nats_token", "t"),
        ([], {"NATS_AUTH_USERNAME": "u", "NATS_AUTH_PASSWORD": "p"}, "", "events.nats_user", "u"),
        ([], {"DYN_ADMIN_TOKEN": "secret"}, "", "admin_token", "secret"),
    ],
)
def test_alias_spellings(tmp_path, argv, environ, document, field, expected):
    path = tmp_path / "picker.yaml"
    path.write_text(document)
    value = load_config([*argv, "--config", str(path)], environ=environ)
    for part in field.split("."):
        value = getattr(value, part)
    assert value == expected


def test_kv_events_is_a_flag_but_not_a_file_key(tmp_path):
    path = tmp_path / "picker.yaml"
    path.write_text("router: {kv-events: true}\n")
    assert load_config(["--config", str(path)], environ={}).router.use_kv_events is False
