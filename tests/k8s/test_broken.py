"""Deliberately broken manifest sets fail the checks, each for the reason it was broken for.

Each directory in fixtures/broken/ is a kustomization that breaks one thing of a good overlay;
its expected.yaml names the problem code and a piece of the message. Every problem found must be
that one: a check that fires for the wrong reason (or also for other reasons) fails the test.
"""

from __future__ import annotations

import pytest
import yaml

from tests.k8s.checks import check_manifests
from tests.k8s.conftest import BROKEN
from tests.k8s.kustomize import render

CASES = sorted(p.name for p in BROKEN.iterdir() if (p / "expected.yaml").exists())


def test_there_are_broken_cases_for_every_kind_of_check():
    codes = {yaml.safe_load((BROKEN / c / "expected.yaml").read_text())["code"] for c in CASES}
    assert codes >= {
        "schema.builtin",
        "crd.unknown-field",
        "crd.invalid",
        "crd.cel",
        "ref",
        "port",
        "selector",
        "probe",
        "config",
        "envoy",
        "rbac",
    }


@pytest.mark.parametrize("case", CASES)
def test_broken_manifests_fail_for_the_intended_reason(case, crds):
    expected = yaml.safe_load((BROKEN / case / "expected.yaml").read_text())
    report = check_manifests(render(BROKEN / case), crds, workers_included=expected["workers_included"])
    assert report.problems, f"{case}: nothing found"
    wrong = [p for p in report.problems if p.code != expected["code"]]
    assert not wrong, f"{case}: problems of another kind:\n{report}"
    assert any(expected["message"] in p.message for p in report.problems), f"{case}:\n{report}"
