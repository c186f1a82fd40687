"""Every overlay in gateway/ renders, and every object in it passes every offline check.

Checks (tests/k8s/checks.py): built-in kinds against Kubernetes' own schemas, custom resources
against ../shared/crds (unknown fields rejected, defaults applied, CEL rules evaluated), and the
cross-object checks (ports, selectors, references, the router config as the picker loads it).
"""

from __future__ import annotations

import pytest

from tests.k8s.builtin import is_builtin, validate_builtin
from tests.k8s.checks import check_manifests
from tests.k8s.conftest import GATEWAY
from tests.k8s.kustomize import render

OVERLAYS = {  # overlay -> whether the model servers are part of it
    "inferencepool": False,
    "envoy-gateway": False,
    "hierarchical": False,
    "demo": True,
}


def test_every_overlay_directory_is_tested():
    found = {p.parent.name for p in GATEWAY.glob("*/kustomization.yaml")} - {"base"}
    assert found == set(OVERLAYS)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_passes_every_check(overlay, crds):
    objects = render(GATEWAY / overlay)
    report = check_manifests(objects, crds, workers_included=OVERLAYS[overlay])
    assert report.problems == [], str(report)
    assert report.cel_rules_evaluated > 0
    assert report.cel_rules_skipped == []  # every CEL rule that applies was evaluated


def test_base_alone_is_valid_kubernetes():
    """The base is not deployable alone (an overlay adds the workers' Service); its objects are valid."""
    objects = render(GATEWAY / "base")
    assert {o["kind"] for o in objects} == {"ServiceAccount", "ConfigMap", "Deployment", "Service"}
    for obj in objects:
        assert is_builtin(obj)
        assert validate_builtin(obj) == [], obj["metadata"]["name"]


def test_crd_defaults_are_applied(crds):
    objects = render(GATEWAY / "inferencepool")
    check_manifests(objects, crds)
    pool = next(o for o in objects if o["kind"] == "InferencePool")
    assert pool["spec"]["appProtocol"] == "http"  # defaulted, as the API server would
    assert pool["spec"]["endpointPickerRef"]["group"] == ""
    route = next(o for o in objects if o["kind"] == "HTTPRoute")
    assert route["spec"]["rules"][0]["backendRefs"][0]["weight"] == 1


def test_picker_pods_are_locked_down():
    deployment = next(o for o in render(GATEWAY / "inferencepool") if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
