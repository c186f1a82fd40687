"""The x-gateway-inference-objective header: an InferenceObjective's priority orders the admission
queue and decides between 429 and 503 when the wait ends; the file is read again when it changes;
the header's values never grow a structure. (`tests/e2e/test_objectives_e2e.py`: through Envoy.)"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from extproc.config.objectives import ObjectivesConfig, Pool, read_objectives
from extproc.epp import answers as epp
from extproc.picker.objectives import OBJECTIVE_HEADER, ObjectiveFile, queue_entry
from extproc.picker.pipeline import EndpointPicker
from extproc.router import QueueTimeout

from ..config.test_objectives import objective
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


def objectives_config(tmp_path: Path, text: str = OBJECTIVES) -> ObjectivesConfig:
    path = tmp_path / "objectives.yaml"
    path.write_text(text)
    return ObjectivesConfig(str(path), Pool(), read_objectives(str(path), Pool()))


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
    picker = queued_picker(make_picker, clock=clock, objectives=objectives_config(tmp_path))
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
    picker = queued_picker(make_picker, queue_max_wait_s=0.05, objectives=objectives_config(tmp_path))
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
    picker = make_picker(replace(picker_config(1), objectives=objectives_config(tmp_path)))
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
    config = objectives_config(tmp_path)
    path = Path(config.path or "")
    clock = FakeClock(0.0)
    objectives = ObjectiveFile(config.path or "", Pool(), config.initial, clock=clock)
    assert objectives.priority("interactive") == 10
    path.write_text(objective("interactive", 20) + "---\n" + objective("new-one", 3))
    assert objectives.priority("interactive") == 10  # looked at once a second at most
    clock.advance(1.0)
    assert (objectives.priority("interactive"), objectives.priority("new-one")) == (20, 3)
    assert objectives.priority("batch") is None and objectives.readings == 2
    caplog.set_level(logging.WARNING, logger="extproc.objectives")
    path.write_text(objective("interactive", "urgent"))
    clock.advance(1.0)
    assert objectives.priority("interactive") == 20  # the last good reading stays
    clock.advance(1.0)
    objectives.priority("interactive")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "spec.priority 'urgent'" in warnings[0] and "2 objectives" in warnings[0]
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
