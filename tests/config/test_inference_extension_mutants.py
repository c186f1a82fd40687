"""The resources file's edges, found by mutation testing (`benchmarks/mutation.py
config/inference_extension.py`): every bound the CRDs set, accepted at the bound and refused past
it; every refusal's message naming its document, field and value; precedence across time zones."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from extproc.config import inference_extension, load_config
from extproc.config.inference_extension import MAX_FILE_BYTES, Pool, parse_resources, read_resources
from extproc.config.options import ConfigError

from .test_inference_extension import objective, rewrite


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_resources(text, Pool(), source="f")
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "priorities"),
    [
        (objective("a" * 253, 1), {"a" * 253: 1}),  # the longest name
        (objective("a", 1, pool="p"), {"a": 1}),  # a one-letter pool
        (objective("a", 1, pool="p" * 253), {"a": 1}),
        (objective("a", -(2**31)), {"a": -(2**31)}),  # int32's ends
        (objective("a", 2**31 - 1), {"a": 2**31 - 1}),
    ],
)
def test_the_crds_bounds_are_accepted_at_the_bound(text: str, priorities: dict[str, int]) -> None:
    assert parse_resources(text, Pool()).priorities == priorities


def test_past_the_bounds_and_wrong_shapes_are_refused_with_where_and_what() -> None:
    assert "f, document 1: objective 'a': spec.priority -2147483649: expected an int32" in refused(
        objective("a", -(2**31) - 1)
    )
    assert "f, document 1: 'a': spec.poolRef.name must be 1-253 characters" in refused(
        objective("a", 1, pool="p" * 254)
    )
    no_metadata = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: 3\n"
    )
    assert refused(no_metadata) == "f, document 1: metadata is required (a mapping with a name)"
    assert refused(objective("a", 1, namespace="[1]")) == "f, document 1: metadata.namespace must be a string"
    no_spec = rewrite("r", "").replace("spec:\n  poolRef:\n    name: vllm-qwen3-32b\n  rules:\n", "spec: 5\n")
    assert refused(no_spec) == "f, document 1: 'r': spec is required (a mapping)"
    assert refused("kind: List\nitems: [3]\n") == "f, document 1, item 0: expected a resource (a mapping)"
    assert refused(rewrite("r", "  - 7\n")) == "f, document 1: model rewrite 'r', rule 0: expected a mapping"
    assert (
        refused(rewrite("r", "  - matches: 7\n"))
        == "f, document 1: model rewrite 'r', rule 0: matches must be a list"
    )
    assert refused(rewrite("r", "  - matches: [m]\n")) == (
        "f, document 1: model rewrite 'r', rule 0, match 0: model is required"
    )
    weights = "  - targets:\n    - {modelRewrite: a, weight: 1}\n    - {modelRewrite: b, weight: 1000000}\n"
    (rule,) = parse_resources(rewrite("r", weights), Pool()).rewrites
    assert [t.weight for t in rule.targets] == [1, 1_000_000]
    (unweighted,) = parse_resources(rewrite("r", "  - targets:\n    - {modelRewrite: a}\n"), Pool()).rewrites
    assert unweighted.targets[0].weight == 0


def test_the_inference_model_hint_in_full() -> None:
    message = refused(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: m}\n"
    )
    assert message == (
        "f, document 1: InferenceModel was replaced by InferenceObjective in the Inference Extension's "
        "v1.0; this picker reads InferenceObjective (inference.networking.x-k8s.io/v1alpha2): give each "
        "objective's priority there, and name it in the x-gateway-inference-objective header"
    )


def test_long_values_are_cut_in_messages_and_short_ones_shown_whole() -> None:
    long_name = "N" * 100
    assert f"metadata.name '{'N' * 76}...: expected" in refused(objective(long_name, 1))
    fits = "N" * 78  # its repr is 80 characters: shown whole
    assert f"metadata.name '{fits}': expected" in refused(objective(fits, 1))


def test_a_pool_in_another_group_and_the_left_out_line_name_the_group() -> None:
    other_group = objective("a", 1).replace("group: inference.networking.k8s.io", "group: example.com")
    assert parse_resources(other_group, Pool("vllm-qwen3-32b", group="example.com")).priorities == {"a": 1}
    read = parse_resources(other_group, Pool("vllm-qwen3-32b"))
    assert read.left_out == (
        "inference-resources, document 1: 'a' is for pool 'vllm-qwen3-32b' (group example.com): left out",
    )


def test_an_empty_document_between_two_does_not_end_the_file_and_items_belong_to_lists_only() -> None:
    text = objective("a", 1) + "---\n---\n" + objective("b", 2)
    assert parse_resources(text, Pool()).priorities == {"a": 1, "b": 2}
    with_items = objective("c", 3) + "items: [1, 2]\n"  # not a List: its items field means nothing
    assert parse_resources(with_items, Pool()).priorities == {"c": 3}


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("2026-11-20T10:00:00Z", "2026-11-20T10:30:00Z"),
        ("2026-11-20T10:00:00+01:00", "2026-11-20T09:30:00Z"),  # 09:00 UTC, before 09:30 UTC
        ("2026-11-20T09:00:00", "2026-11-20T09:30:00+00:00"),  # no offset: UTC
    ],
)
def test_the_older_rewrite_wins_across_time_zones(older: str, newer: str) -> None:
    rules = "  - matches:\n    - model: {value: m}\n    targets:\n    - modelRewrite: %s\n"
    text = (
        rewrite("newer", rules % "n", created=newer) + "---\n" + rewrite("older", rules % "o", created=older)
    )
    assert parse_resources(text, Pool()).rewrite_rule("m").rewrite == "older"  # type: ignore[union-attr]
    message = refused(rewrite("r", rules % "x", created="yesterday"))
    assert message == "f, document 1: metadata.creationTimestamp 'yesterday': expected RFC 3339"


def test_too_deep_for_pythons_reader_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inference_extension, "_LOADER", yaml.SafeLoader)  # libyaml stops at 1,000 levels
    assert refused("[" * 5_000 + "]" * 5_000) == "f: nested too deeply to be a resource"


def test_a_file_at_the_size_bound_is_read_and_errors_name_the_file(tmp_path: Path) -> None:
    at_bound = tmp_path / "full.yaml"
    head = objective("a", 1)
    at_bound.write_text(head + "#" * (MAX_FILE_BYTES - len(head) - 1) + "\n")
    assert at_bound.stat().st_size == MAX_FILE_BYTES
    assert read_resources(str(at_bound), Pool()).priorities == {"a": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(objective("a", "x"))
    with pytest.raises(ConfigError, match=f"^{bad}, document 1: objective 'a'"):
        read_resources(str(bad), Pool())
    with pytest.raises(ConfigError, match="No such file or directory"):
        read_resources(str(tmp_path / "missing.yaml"), Pool())


def test_the_pool_flags_reach_the_config_with_or_without_a_file() -> None:
    flags = ["--pool-name", "p", "--pool-namespace", "team", "--pool-group", "example.com"]
    assert load_config(flags, environ={}).inference_extension.pool == Pool("p", "team", "example.com")


def test_an_unquoted_timestamp_yaml_reads_as_a_date_orders_as_well() -> None:
    rules = "  - matches:\n    - model: {value: m}\n    targets:\n    - modelRewrite: %s\n"
    newer = rewrite("newer", rules % "n").replace(
        "metadata:\n", "metadata:\n  creationTimestamp: 2026-11-21T00:00:00Z\n"
    )
    older = rewrite("older", rules % "o").replace(
        "metadata:\n", "metadata:\n  creationTimestamp: 2026-11-20T00:00:00Z\n"
    )
    assert parse_resources(newer + "---\n" + older, Pool()).rewrite_rule("m").rewrite == "older"  # type: ignore[union-attr]


def test_a_timestamp_without_an_offset_is_utc_whatever_the_hosts_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9: read as local time, 09:00 would come first
    time.tzset()
    try:
        rules = "  - matches:\n    - model: {value: m}\n    targets:\n    - modelRewrite: %s\n"
        text = rewrite("naive", rules % "n", created="2026-11-20T09:00:00") + "---\n"
        text += rewrite("utc", rules % "u", created="2026-11-20T08:00:00Z")
        assert parse_resources(text, Pool()).rewrite_rule("m").rewrite == "utc"  # type: ignore[union-attr]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_group_that_is_not_text_is_refused_and_an_81_character_value_is_cut() -> None:
    assert refused(objective("a", 1).replace("group: inference.networking.k8s.io", "group: 5")) == (
        "f, document 1: 'a': spec.poolRef.group and kind must be a group name and a kind"
    )
    eighty_one = "N" * 79  # its repr: 81 characters
    assert f"metadata.name '{'N' * 76}...: expected" in refused(objective(eighty_one, 1))


def test_a_missing_file_says_the_systems_words(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as caught:
        read_resources(str(missing), Pool())
    assert str(caught.value) == f"inference-resources: cannot read {missing}: No such file or directory"
