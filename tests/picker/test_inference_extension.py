"""The x-gateway-inference-objective header: an InferenceObjective's priority orders the admission
queue and decides between 429 and 503 when the wait ends; the file is read again when it changes;
the header's values never grow a structure. (`tests/e2e/test_objectives_e2e.py`: through Envoy.)"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from extproc.config import ModelConfig
from extproc.config.inference_extension import (
    InferenceExtensionConfig,
    Pool,
    RewriteRule,
    Target,
    read_resources,
)
from extproc.epp import answers as epp
from extproc.errors import UnknownModel
from extproc.picker.inference_extension import (
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    InferenceExtension,
    ResourceFile,
    pick_target,
    queue_entry,
)
from extproc.picker.metrics import PickMetrics
from extproc.picker.parse_worker import with_model
from extproc.picker.pipeline import EndpointPicker
from extproc.router import QueueTimeout

from ..config.test_inference_extension import CANARY, objective, rewrite
from ..groups.builders import prompt
from ..picker_fixtures import MODEL, picker_config
from ..replica_helpers import until
from ..router.clock import FakeClock
from .test_pipeline_requests import (
    PickerFactory,
    agent_hints,
    completion,
    listen,
    make_picker,  # noqa: F401 (a fixture)
    pick,
    queued,
    queued_picker,
    start,
)

OBJECTIVES = "---\n".join([objective("interactive", 10), objective("batch", -1), objective("plain")])


def resources_config(tmp_path: Path, text: str = OBJECTIVES) -> InferenceExtensionConfig:
    path = tmp_path / "resources.yaml"
    path.write_text(text)
    return InferenceExtensionConfig(str(path), Pool(), read_resources(str(path), Pool()))


def counted(picker: EndpointPicker, name: str) -> float:
    sample = picker.metrics.registry.get_sample_value(
        "extproc_objective_requests_total", {"model": MODEL, "objective": name}
    )
    return sample or 0.0


@pytest.mark.parametrize(
    ("objective_name", "hints", "first"),
    [
        (None, {}, "early"),
        ("interactive", {}, "late"),  # priority 10: a strict class above the default 0
        ("plain", {"priority": 1}, "early"),  # a listed objective's priority (unset: 0) wins over the hint
        ("not-listed", {"priority": 1}, "late"),  # a name the file does not list: the hint's
        ("batch", {"latency_sensitivity": 5.0}, "early"),  # below 0: a jump within its class is not enough
    ],
    ids=["no-header", "listed", "objective-wins", "unlisted-falls-back", "negative"],
)
async def test_the_objectives_priority_orders_the_queue(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
    objective_name: str | None,
    hints: dict[str, Any],
    first: str,
) -> None:
    clock = FakeClock(100.0)
    picker = queued_picker(make_picker, clock=clock, inference_extension=resources_config(tmp_path))
    listener = listen(picker)
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    early = start(picker, completion(prompt(2, 64)), "early")
    await queued(picker, 1)
    clock.advance(1.0)
    headers = {OBJECTIVE_HEADER: objective_name} if objective_name is not None else {}
    late = start(picker, completion(prompt(3, 64), **agent_hints(**hints)), "late", headers=headers)
    await queued(picker, 2)
    picker.first_token(busy)  # room for one: the next request prefills, the worker is saturated again
    await until(lambda: len(listener.routed) == 2, 5.0, "a queued request routed")
    assert listener.ids()[1] == first
    picker.first_token(await (early if first == "early" else late))
    for done in [busy, await early, await late]:
        picker.finish(done, "complete")
    assert picker.is_idle()


@pytest.mark.parametrize(
    ("objective_name", "hints", "status"),
    [
        ("batch", {}, (429, "shed-queue-timeout")),  # priority -1: sheddable, as in the Inference Extension
        ("interactive", {"priority": -1}, (503, "rejected-queue-timeout")),  # the objective's 10 wins
        ("interactive", {"sheddable": True}, (429, "shed-queue-timeout")),  # the hint still marks it
        ("not-listed", {"priority": -1}, (429, "shed-queue-timeout")),
    ],
    ids=["negative-objective", "objective-over-hint", "sheddable-hint", "unlisted"],
)
async def test_a_negative_priority_is_shed_429_when_the_wait_ends(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
    objective_name: str,
    hints: dict[str, Any],
    status: tuple[int, str],
) -> None:
    picker = queued_picker(make_picker, queue_max_wait_s=0.05, inference_extension=resources_config(tmp_path))
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    with pytest.raises(QueueTimeout) as refused:
        body = completion(prompt(2, 64), **agent_hints(**hints))
        await pick(picker, body, request_id="waits", headers={OBJECTIVE_HEADER: objective_name})
    assert epp.status_of(refused.value) == status
    picker.finish(busy, "complete")
    assert picker.is_idle()


async def test_requests_are_counted_per_listed_objective_and_any_other_name_as_unlisted(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    picker = make_picker(replace(picker_config(1), inference_extension=resources_config(tmp_path)))
    names = ["interactive", "interactive", "batch", *(f"client-text-{i}" for i in range(50)), "x" * 10_000]
    for i, name in enumerate(names):
        body = completion(prompt(i, 64))
        picker.finish(
            await pick(picker, body, request_id=f"r{i}", headers={OBJECTIVE_HEADER: name}), "complete"
        )
    picker.finish(await pick(picker, completion(prompt(99, 64)), request_id="no-header"), "complete")
    labels = {
        sample.labels["objective"]: sample.value
        for metric in picker.metrics.registry.collect()
        if metric.name == "extproc_objective_requests"
        for sample in metric.samples
        if sample.name.endswith("_total")
    }
    assert labels == {"interactive": 2, "batch": 1, "unlisted": 51}


async def test_without_a_file_every_named_objective_is_unlisted_and_the_hints_decide(
    make_picker: PickerFactory,  # noqa: F811
) -> None:
    picker = queued_picker(make_picker, queue_max_wait_s=0.05)
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    with pytest.raises(QueueTimeout) as refused:
        await pick(picker, completion(prompt(2, 64)), request_id="w", headers={OBJECTIVE_HEADER: "batch"})
    assert epp.status_of(refused.value) == (503, "rejected-queue-timeout")
    assert counted(picker, "unlisted") == 1
    picker.finish(busy, "complete")


def test_the_file_is_read_again_when_it_changes_and_a_bad_change_keeps_the_last_good_reading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = resources_config(tmp_path)
    path = Path(config.path or "")
    clock = FakeClock(0.0)
    objectives = ResourceFile(config.path or "", Pool(), config.initial, clock=clock)
    assert objectives.priority("interactive") == 10
    path.write_text(objective("interactive", 20) + "---\n" + objective("new-one", 3))
    assert objectives.priority("interactive") == 10  # looked at once a second at most
    clock.advance(1.0)
    assert (objectives.priority("interactive"), objectives.priority("new-one")) == (20, 3)
    assert objectives.priority("batch") is None and objectives.readings == 2
    caplog.set_level(logging.WARNING, logger="extproc.inference_extension")
    path.write_text(objective("interactive", "urgent"))
    clock.advance(1.0)
    assert objectives.priority("interactive") == 20  # the last good reading stays
    clock.advance(1.0)
    objectives.priority("interactive")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        len(warnings) == 1
        and "spec.priority 'urgent'" in warnings[0]
        and "2 objectives and 0 rewrite" in warnings[0]
    )
    path.unlink()  # a ConfigMap being swapped, or removed: nothing changes
    clock.advance(1.0)
    assert objectives.priority("interactive") == 20
    path.write_text(objective("interactive", 30))
    clock.advance(1.0)
    assert objectives.priority("interactive") == 30 and objectives.priority("new-one") is None


@pytest.mark.parametrize(
    ("hints", "objective_priority", "expected"),
    [
        ({}, None, (0, 0.0, False)),
        ({"priority": True, "latency_sensitivity": float("inf")}, None, (0, 0.0, False)),  # not numbers
        ({"priority": 2, "latency_sensitivity": 0.5}, None, (2, 0.5, False)),
        ({"priority": 2, "latency_sensitivity": -1}, -3, (-3, 0.0, True)),
        ({"sheddable": True}, 7, (7, 0.0, True)),
    ],
)
def test_a_queue_entry_takes_the_objectives_priority_and_the_hints_jump(
    hints: dict[str, Any], objective_priority: int | None, expected: tuple[int, float, bool]
) -> None:
    entry = queue_entry("r", 1.0, 8, hints, objective_priority)
    assert (entry.priority, entry.latency_sensitivity, entry.sheddable) == expected


# --- InferenceModelRewrite ----------------------------------------------------------------------

ADAPTERS = ("foodreview-v1", "foodreview-v2")


def rewriting_picker(make: PickerFactory, tmp_path: Path, rules: str = CANARY) -> EndpointPicker:
    """A picker whose model serves both canary targets as LoRA adapters, and the canary rewrite."""
    config = picker_config(2)
    tmp_path.mkdir(exist_ok=True)
    return make(
        replace(
            config,
            models=(ModelConfig(MODEL, lora_adapters=ADAPTERS),),
            inference_extension=resources_config(tmp_path, rewrite("canary", rules)),
        )
    )


def chat(model: str, text: str = "a review of the soup") -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 7, "temperature": 0.5}
    ).encode()


async def test_a_rewritten_request_is_routed_and_sent_as_its_target(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    picker = rewriting_picker(make_picker, tmp_path)
    chosen = await pick(picker, chat("foodreview"), path="/v1/chat/completions")
    assert chosen.body is not None
    sent = json.loads(chosen.body)
    assert sent["model"] in ADAPTERS  # the adapter's blocks, its tokenizer, its workers
    assert {k: v for k, v in sent.items() if k != "model"} == {
        k: v for k, v in json.loads(chat("foodreview")).items() if k != "model"
    }
    assert chosen.model == MODEL  # the adapters' base model's pool
    assert chosen.renamed == (sent["model"], "foodreview")  # for the answer
    counts = picker.metrics.model_rewrites.values
    assert sum(counts.values()) == 1 and ("canary", "foodreview", sent["model"]) in counts
    picker.finish(chosen, "complete")
    untouched = await pick(picker, chat(MODEL), path="/v1/chat/completions", request_id="base")
    assert untouched.body is None  # no rule names the base model: its body goes as it came
    assert untouched.renamed is None
    picker.finish(untouched, "complete")


async def test_the_rewrite_header_names_the_model_sent_unless_a_rule_applies(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    picker = rewriting_picker(make_picker, tmp_path)
    header = {MODEL_REWRITE_HEADER: "foodreview-v1"}
    chosen = await pick(picker, chat(MODEL), path="/v1/chat/completions", headers=header)
    assert chosen.body is not None and json.loads(chosen.body)["model"] == "foodreview-v1"
    assert chosen.renamed == ("foodreview-v1", MODEL)
    assert picker.metrics.model_rewrites.values == {}  # no rule: counted by the adapter's requests only
    picker.finish(chosen, "complete")
    header = {MODEL_REWRITE_HEADER: MODEL}
    ruled = await pick(
        picker, chat("foodreview"), path="/v1/chat/completions", headers=header, request_id="2"
    )
    assert ruled.renamed is not None and ruled.renamed[0] in ADAPTERS  # the rule wins over the header
    picker.finish(ruled, "complete")
    same = await pick(picker, chat(MODEL), path="/v1/chat/completions", headers=header, request_id="3")
    assert same.body is None and same.renamed is None  # as asked
    picker.finish(same, "complete")


def test_without_a_file_the_header_alone_decides() -> None:
    extension = InferenceExtension(None, PickMetrics(), random.Random(0))
    assert extension.model_for("m", {MODEL_REWRITE_HEADER: "lora"}) == "lora"
    assert extension.model_for("m", {MODEL_REWRITE_HEADER: ""}) is None and extension.model_for("m") is None
    assert extension.model_for("m", {MODEL_REWRITE_HEADER: "m"}) is None  # as asked


async def test_targets_are_drawn_by_weight(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    picker = rewriting_picker(make_picker, tmp_path)
    for i in range(400):
        chosen = await pick(
            picker, chat("foodreview", f"review {i}"), path="/v1/chat/completions", request_id=f"r{i}"
        )
        picker.finish(chosen, "complete")
    counts = picker.metrics.model_rewrites.values
    v1, v2 = (
        counts[("canary", "foodreview", "foodreview-v1")],
        counts[("canary", "foodreview", "foodreview-v2")],
    )
    assert v1 + v2 == 400 and 20 <= v1 <= 60  # 10 %: 40 expected; binomial sd 6


def test_a_rule_without_weights_splits_evenly_and_a_weighted_target_beats_unweighted_ones() -> None:
    rng = random.Random(3)
    even = RewriteRule("r", frozenset(), (Target("a", 0), Target("b", 0)))
    drawn = [pick_target(even, rng) for _ in range(1000)]
    assert 430 <= drawn.count("a") <= 570
    mixed = RewriteRule("r", frozenset(), (Target("a", 0), Target("b", 5)))
    assert {pick_target(mixed, rng) for _ in range(200)} == {"b"}  # llm-d's rule: unset weighs 0


async def test_a_rule_without_targets_leaves_the_model_and_an_unknown_target_is_a_404(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    no_targets = "  - matches:\n    - model: {value: foodreview-v1}\n"
    picker = rewriting_picker(make_picker, tmp_path / "a", no_targets)
    chosen = await pick(picker, chat("foodreview-v1"), path="/v1/chat/completions")
    assert chosen.body is None and picker.metrics.model_rewrites.values == {}
    picker.finish(chosen, "complete")
    nowhere = "  - targets:\n    - modelRewrite: not-served\n"  # every model, to a model nobody serves
    lost = rewriting_picker(make_picker, tmp_path / "b", nowhere)
    with pytest.raises(UnknownModel):
        await pick(lost, chat(MODEL), path="/v1/chat/completions")
    assert lost.is_idle()


def test_with_model_changes_only_the_model() -> None:
    body = b'{"messages":[{"role":"user","content":"caf\\u00e9 \\ud83d\\ude00"}],"model":"a","n":1,"x":1.5e3}'
    assert json.loads(with_model(body, "b")) == {**json.loads(body), "model": "b"}


async def test_a_large_body_is_rewritten_off_the_event_loop(
    make_picker: PickerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    picker = rewriting_picker(make_picker, tmp_path)
    body = chat("foodreview", "a long review " * 4000)  # 56 KB: over the 16 KiB parsed on the loop
    before = picker.bodies.stats.in_worker
    chosen = await pick(picker, body, path="/v1/chat/completions")
    assert picker.bodies.stats.in_worker == before + 2  # the parse, then the rewrite
    assert chosen.body is not None
    assert json.loads(chosen.body) == {**json.loads(body), "model": json.loads(chosen.body)["model"]}
    assert json.loads(chosen.body)["model"] in ADAPTERS
    picker.finish(chosen, "complete")


async def test_in_a_running_picker_the_file_is_read_in_a_thread_and_the_last_reading_serves_meanwhile(
    tmp_path: Path,
) -> None:
    config = resources_config(tmp_path)
    path = Path(config.path or "")
    clock = FakeClock(0.0)
    objectives = ResourceFile(config.path or "", Pool(), config.initial, clock=clock)
    path.write_text(objective("interactive", 30))
    clock.advance(1.0)
    assert objectives.priority("interactive") == 10  # the read has started, not finished
    await until(lambda: objectives.readings == 2, 5.0, "the new file read")
    assert objectives.priority("interactive") == 30
