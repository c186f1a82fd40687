"""--inference-resources: InferenceObjective resources (the Inference Extension's, v1alpha2) read as
`kubectl` writes them, checked as the published CRD checks them, and kept for this picker's pool.

The manifests below have the shape of llm-d's `config/manifests/inferenceobjective.yaml` and of
`kubectl get inferenceobjectives -o yaml` (a `List` with server-set metadata and status)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from extproc.config import load_config
from extproc.config.inference_extension import InferenceResources, Pool, parse_resources, read_resources
from extproc.config.options import ConfigError


def objective(name: str, priority: object = None, pool: str = "vllm-qwen3-32b", **extra: str) -> str:
    lines = [
        "apiVersion: inference.networking.x-k8s.io/v1alpha2",
        "kind: InferenceObjective",
        "metadata:",
        f"  name: {name}",
        *(f"  {k}: {v}" for k, v in extra.items()),
        "spec:",
        *([f"  priority: {priority}"] if priority is not None else []),
        "  poolRef:",
        "    group: inference.networking.k8s.io",
        f"    name: {pool}",
    ]
    return "\n".join(lines) + "\n"


APPLIED = "---\n".join(
    [objective("small-segment-lora", 1), objective("base-model", 2), objective("batch", -1)]
)

LISTED = textwrap.dedent(
    """\
    apiVersion: v1
    kind: List
    metadata:
      resourceVersion: ""
    items:
    - apiVersion: inference.networking.x-k8s.io/v1alpha2
      kind: InferenceObjective
      metadata:
        creationTimestamp: "2026-11-20T10:00:00Z"
        generation: 1
        name: interactive
        namespace: default
        resourceVersion: "4242"
        uid: 0b6f1c9e-1c1d-4d7e-9a36-0d6c2f3f1a11
      spec:
        poolRef:
          group: inference.networking.k8s.io
          kind: InferencePool
          name: vllm-qwen3-32b
        priority: 10
      status:
        conditions:
        - lastTransitionTime: "1970-01-01T00:00:00Z"
          message: Waiting for controller
          reason: Pending
          status: Unknown
          type: Ready
    - apiVersion: inference.networking.x-k8s.io/v1alpha2
      kind: InferenceObjective
      metadata:
        name: default-objective
        namespace: default
      spec:
        poolRef:
          name: vllm-qwen3-32b
    """
)


def test_applied_documents_give_each_objective_its_priority() -> None:
    assert parse_resources(APPLIED, Pool()) == InferenceResources(
        {"small-segment-lora": 1, "base-model": 2, "batch": -1}
    )


def test_a_list_as_kubectl_prints_it_and_an_unset_priority_is_0() -> None:
    read = parse_resources(LISTED, Pool())
    assert read.priorities == {"interactive": 10, "default-objective": 0}


def test_other_kinds_in_the_file_are_left_out_with_a_line_each() -> None:
    pool = "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata:\n  name: p\n"
    read = parse_resources("---\n" + pool + "---\n" + objective("a", 3) + "---\n", Pool(), source="f.yaml")
    assert read.priorities == {"a": 3}
    assert read.left_out == (
        "f.yaml, document 1: kind 'InferencePool' is not InferenceObjective or InferenceModelRewrite: "
        "left out",
    )


def test_an_objective_without_a_spec_names_no_pool_and_is_left_out() -> None:
    read = parse_resources(objective("a", 1).split("spec:")[0] + "---\n" + objective("b", 2), Pool())
    assert read.priorities == {"b": 2}
    assert read.left_out == (
        "inference-resources, document 1: objective 'a' has no spec (no pool): left out",
    )


def test_with_a_pool_name_only_that_pools_objectives_are_kept() -> None:
    text = "---\n".join(
        [
            objective("mine", 5),
            objective("theirs", 7, pool="other-pool"),
            objective("elsewhere", 9, namespace="team-b"),
        ]
    )
    read = parse_resources(text, Pool("vllm-qwen3-32b", namespace="team-a"))
    assert read.priorities == {"mine": 5}
    assert len(read.left_out) == 2 and "'theirs' is for pool 'other-pool'" in read.left_out[0]
    # a pool of another API group is another pool
    other_group = parse_resources(objective("mine", 5), Pool("vllm-qwen3-32b", group="example.com"))
    assert other_group.priorities == {}
    # without --pool-name every objective is kept, whatever pool it names
    assert parse_resources(text, Pool()).priorities == {"mine": 5, "theirs": 7, "elsewhere": 9}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (objective("Not_A_Name", 1), "metadata.name 'Not_A_Name': expected a DNS subdomain"),
        (objective("x" * 254, 1), "at most 253 characters"),
        (objective("a", "high"), "spec.priority 'high': expected an int32"),
        (objective("a", 2**31), "spec.priority 2147483648: expected an int32"),
        (objective("a", "true"), "spec.priority True: expected an int32"),
        (objective("a", 1.5), "spec.priority 1.5"),
        (
            objective("a", 1).replace("v1alpha2", "v1alpha1"),
            "apiVersion 'inference.networking.x-k8s.io/v1alpha1': "
            "expected inference.networking.x-k8s.io/v1alpha2",
        ),
        (objective("a", 1).split("  poolRef:")[0], "'a': spec.poolRef is required"),
        (objective("a", 1) + "    kind: ''\n", "spec.poolRef.group and kind must be a group name and a kind"),
        (objective("a", 1, pool="''"), "spec.poolRef.name must be 1-253 characters"),
        (
            objective("a", 1) + "---\n" + objective("a", 2),
            "objective 'a' is declared twice (also in f, document 1)",
        ),
        ("- just\n- a list\n", "document 1: expected a resource (a mapping), got list"),
        ("kind: List\nitems: 3\n", "items must be a list"),
        ("key: [unclosed\n", "f: not YAML"),
        ("[" * 20_000 + "]" * 20_000, "nest"),  # libyaml's depth limit, or PyYAML's recursion
        ("kind: '\ud800'\n", "f: holds text that is not UTF-8"),  # found by fuzzing (libyaml)
        (
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: m}\n",
            "InferenceModel was replaced by InferenceObjective in the Inference Extension's v1.0",
        ),
    ],
)
def test_what_the_crd_refuses_is_refused_naming_the_document_and_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_resources(text, Pool(), source="f")
    assert message in str(caught.value)


def test_the_file_is_bounded_and_must_be_utf8(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1 << 20) + b"\n")
    with pytest.raises(ConfigError, match="holds more than 1048576 bytes"):
        read_resources(str(big), Pool())
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError, match="is not UTF-8"):
        read_resources(str(latin), Pool())
    with pytest.raises(ConfigError, match="cannot read"):
        read_resources(str(tmp_path / "missing.yaml"), Pool())


def test_serve_reads_the_file_at_start_and_says_when_no_queue_uses_the_priorities(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(APPLIED)
    config = load_config(["--inference-resources", str(path), "--pool-name", "vllm-qwen3-32b"], environ={})
    assert config.inference_extension.initial.priorities == {
        "small-segment-lora": 1,
        "base-model": 2,
        "batch": -1,
    }
    assert config.inference_extension.pool == Pool("vllm-qwen3-32b")
    assert any("admission queue, which is off" in n for n in config.notices)
    queued = load_config(["--inference-resources", str(path), "--router-queue-threshold", "0.5"], environ={})
    assert not any("inference-resources" in n for n in queued.notices)
    path.write_text(objective("a", "high"))
    with pytest.raises(ConfigError, match=r"spec\.priority 'high'"):
        load_config(["--inference-resources", str(path)], environ={})


def test_the_file_section_and_the_environment_name_it_too(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(objective("a", 4))
    picker_yaml = tmp_path / "picker.yaml"
    picker_yaml.write_text(
        f"inference-extension:\n  inference-resources: {path}\n  pool-name: vllm-qwen3-32b\n"
    )
    assert load_config(["--config", str(picker_yaml)], environ={}).inference_extension.initial.priorities == {
        "a": 4
    }
    from_env = load_config([], environ={"DYN_INFERENCE_RESOURCES": str(path)})
    assert from_env.inference_extension.path == str(path)


# --- InferenceModelRewrite ----------------------------------------------------------------------


def rewrite(name: str, rules: str, created: str | None = None, pool: str = "vllm-qwen3-32b") -> str:
    """An InferenceModelRewrite; `rules` is the YAML of spec.rules, indented by two spaces."""
    stamp = f'  creationTimestamp: "{created}"\n' if created else ""
    return (
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModelRewrite\n"
        f"metadata:\n  name: {name}\n{stamp}spec:\n  poolRef:\n    name: {pool}\n  rules:\n{rules}"
    )


CANARY = """\
  - matches:
    - model:
        type: Exact
        value: "foodreview"
    targets:
    - modelRewrite: "foodreview-v1"
      weight: 10
    - modelRewrite: "foodreview-v2"
      weight: 90
"""
EVERY_MODEL = """\
  - targets:
    - modelRewrite: base
"""


def test_a_canary_rewrite_reads_its_rule_and_weights() -> None:
    read = parse_resources(rewrite("canary", CANARY), Pool())
    (rule,) = read.rewrites
    assert rule.rewrite == "canary" and rule.models == frozenset({"foodreview"})
    assert [(t.model, t.weight) for t in rule.targets] == [("foodreview-v1", 10), ("foodreview-v2", 90)]
    assert read.rewrite_rule("foodreview") is rule and read.rewrite_rule("other") is None


def test_a_rule_naming_the_model_beats_one_for_every_model_then_the_older_resource_wins() -> None:
    exact = "  - matches:\n    - model: {value: m}\n    targets:\n    - modelRewrite: %s\n"
    text = "---\n".join(
        [
            rewrite("every-model", EVERY_MODEL, created="2026-01-01T00:00:00Z"),
            rewrite("newer", exact % "from-newer", created="2026-06-01T00:00:00Z"),
            rewrite("older", exact % "from-older", created="2026-03-01T00:00:00Z"),
            rewrite("no-timestamp", exact % "from-undated"),
        ]
    )
    read = parse_resources(text, Pool())
    assert read.rewrite_rule("m").rewrite == "older"  # type: ignore[union-attr]
    assert read.rewrite_rule("anything-else").rewrite == "every-model"  # type: ignore[union-attr]
    undated_first = parse_resources(rewrite("a", exact % "x") + "---\n" + rewrite("b", exact % "y"), Pool())
    assert undated_first.rewrite_rule("m").rewrite == "a"  # type: ignore[union-attr]  # file order
    two_rules = rewrite("two", (exact % "first") + (exact % "second"))
    assert parse_resources(two_rules, Pool()).rewrite_rule("m").targets[0].model == "first"  # type: ignore[union-attr]


def test_a_rewrite_for_another_pool_is_left_out() -> None:
    read = parse_resources(rewrite("canary", CANARY, pool="other"), Pool("vllm-qwen3-32b"))
    assert read.rewrites == () and "'canary' is for pool 'other'" in read.left_out[0]


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("  - {}\n", None),  # a rule with no matches and no targets: every model stays as asked
        ("  - targets: []\n", "targets must be a list of at least one target"),
        ("  - targets:\n    - weight: 3\n", "target 0: modelRewrite is required"),
        (
            "  - targets:\n    - {modelRewrite: a, weight: 0}\n",
            "weight 0: expected an integer from 1",
        ),
        ("  - targets:\n    - {modelRewrite: a, weight: 1000001}\n", "weight 1000001"),
        ("  - targets:\n    - {modelRewrite: a, weight: true}\n", "weight True"),
        ("  - matches:\n    - {}\n", "match 0: model is required"),
        ("  - matches:\n    - model: {value: ''}\n", "model.value must be a non-empty string"),
        (
            "  - matches:\n    - model: {value: m, type: Prefix}\n",
            "model.type 'Prefix': only Exact",
        ),
    ],
)
def test_what_the_rewrite_crd_refuses_is_refused(rules: str, message: str | None) -> None:
    text = rewrite("r", rules)
    if message is None:
        (rule,) = parse_resources(text, Pool()).rewrites
        assert rule.models == frozenset() and rule.targets == ()
        return
    with pytest.raises(ConfigError) as caught:
        parse_resources(text, Pool(), source="f")
    assert "f, document 1: model rewrite 'r', rule 0" in str(caught.value) and message in str(caught.value)


def test_a_rewrite_without_rules_or_with_a_bad_timestamp_is_refused() -> None:
    no_rules = rewrite("r", "").replace("  rules:\n", "")
    with pytest.raises(ConfigError, match=r"spec\.rules is required"):
        parse_resources(no_rules, Pool())
    with pytest.raises(ConfigError, match="expected RFC 3339"):
        parse_resources(rewrite("r", CANARY, created="yesterday"), Pool())
