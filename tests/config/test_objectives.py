"""--inference-objectives: InferenceObjective resources (the Inference Extension's, v1alpha2) read as
`kubectl` writes them, checked as the published CRD checks them, and kept for this picker's pool.

The manifests below have the shape of llm-d's `config/manifests/inferenceobjective.yaml` and of
`kubectl get inferenceobjectives -o yaml` (a `List` with server-set metadata and status)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from extproc.config import load_config
from extproc.config.objectives import Objectives, Pool, parse_objectives, read_objectives
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
    assert parse_objectives(APPLIED, Pool()) == Objectives(
        {"small-segment-lora": 1, "base-model": 2, "batch": -1}
    )


def test_a_list_as_kubectl_prints_it_and_an_unset_priority_is_0() -> None:
    read = parse_objectives(LISTED, Pool())
    assert read.priorities == {"interactive": 10, "default-objective": 0}


def test_other_kinds_in_the_file_are_left_out_with_a_line_each() -> None:
    pool = "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata:\n  name: p\n"
    read = parse_objectives("---\n" + pool + "---\n" + objective("a", 3) + "---\n", Pool(), source="f.yaml")
    assert read.priorities == {"a": 3}
    assert read.left_out == ("f.yaml, document 1: kind 'InferencePool' is not InferenceObjective: left out",)


def test_an_objective_without_a_spec_names_no_pool_and_is_left_out() -> None:
    read = parse_objectives(objective("a", 1).split("spec:")[0] + "---\n" + objective("b", 2), Pool())
    assert read.priorities == {"b": 2}
    assert read.left_out == (
        "inference-objectives, document 1: objective 'a' has no spec (no pool): left out",
    )


def test_with_a_pool_name_only_that_pools_objectives_are_kept() -> None:
    text = "---\n".join(
        [
            objective("mine", 5),
            objective("theirs", 7, pool="other-pool"),
            objective("elsewhere", 9, namespace="team-b"),
        ]
    )
    read = parse_objectives(text, Pool("vllm-qwen3-32b", namespace="team-a"))
    assert read.priorities == {"mine": 5}
    assert len(read.left_out) == 2 and "'theirs' is for pool 'other-pool'" in read.left_out[0]
    # a pool of another API group is another pool
    other_group = parse_objectives(objective("mine", 5), Pool("vllm-qwen3-32b", group="example.com"))
    assert other_group.priorities == {}
    # without --pool-name every objective is kept, whatever pool it names
    assert parse_objectives(text, Pool()).priorities == {"mine": 5, "theirs": 7, "elsewhere": 9}


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
        (objective("a", 1).split("  poolRef:")[0], "objective 'a': spec.poolRef is required"),
        (objective("a", 1) + "    kind: ''\n", "spec.poolRef.group and kind must be a group name and a kind"),
        (objective("a", 1, pool="''"), "spec.poolRef.name must be 1-253 characters"),
        (
            objective("a", 1) + "---\n" + objective("a", 2),
            "objective 'a' is declared twice (also in f, document 1)",
        ),
        ("- just\n- a list\n", "document 1: expected a resource (a mapping), got list"),
        ("kind: List\nitems: 3\n", "items must be a list"),
        ("key: [unclosed\n", "f: not YAML"),
        (
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: m}\n",
            "InferenceModel was replaced by InferenceObjective in the Inference Extension's v1.0",
        ),
    ],
)
def test_what_the_crd_refuses_is_refused_naming_the_document_and_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_objectives(text, Pool(), source="f")
    assert message in str(caught.value)


def test_the_file_is_bounded_and_must_be_utf8(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1 << 20) + b"\n")
    with pytest.raises(ConfigError, match="holds more than 1048576 bytes"):
        read_objectives(str(big), Pool())
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError, match="is not UTF-8"):
        read_objectives(str(latin), Pool())
    with pytest.raises(ConfigError, match="cannot read"):
        read_objectives(str(tmp_path / "missing.yaml"), Pool())


def test_serve_reads_the_file_at_start_and_says_when_no_queue_uses_the_priorities(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(APPLIED)
    config = load_config(["--inference-objectives", str(path), "--pool-name", "vllm-qwen3-32b"], environ={})
    assert config.objectives.initial.priorities == {"small-segment-lora": 1, "base-model": 2, "batch": -1}
    assert config.objectives.pool == Pool("vllm-qwen3-32b")
    assert any("admission queue, which is off" in n for n in config.notices)
    queued = load_config(["--inference-objectives", str(path), "--router-queue-threshold", "0.5"], environ={})
    assert not any("inference-objectives" in n for n in queued.notices)
    path.write_text(objective("a", "high"))
    with pytest.raises(ConfigError, match=r"spec\.priority 'high'"):
        load_config(["--inference-objectives", str(path)], environ={})


def test_the_file_section_and_the_environment_name_it_too(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(objective("a", 4))
    picker_yaml = tmp_path / "picker.yaml"
    picker_yaml.write_text(f"objectives:\n  inference-objectives: {path}\n  pool-name: vllm-qwen3-32b\n")
    assert load_config(["--config", str(picker_yaml)], environ={}).objectives.initial.priorities == {"a": 4}
    from_env = load_config([], environ={"DYN_INFERENCE_OBJECTIVES": str(path)})
    assert from_env.objectives.path == str(path)
