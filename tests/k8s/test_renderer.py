"""The Python kustomize renderer (used where kubectl is missing) renders what kubectl renders.

Compared on every overlay and every broken fixture when kubectl is installed; the renderer's own
pieces are tested without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.k8s.conftest import BROKEN, GATEWAY
from tests.k8s.kustomize import (
    KustomizeError,
    apply_json_patch,
    kubectl,
    object_key,
    render_with_kubectl,
    render_with_python,
)

KUSTOMIZATIONS = sorted(
    [p.parent for p in GATEWAY.glob("*/kustomization.yaml")] + [p for p in BROKEN.iterdir() if p.is_dir()]
)


@pytest.mark.skipif(kubectl() is None, reason="kubectl is not installed")
@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_python_renderer_matches_kubectl(path: Path):
    binary = kubectl()
    assert binary is not None
    ours = {object_key(o): o for o in render_with_python(path)}
    theirs = {object_key(o): o for o in render_with_kubectl(path, binary)}
    assert ours.keys() == theirs.keys()
    for key, obj in theirs.items():
        assert ours[key] == obj, key


def test_json_patch_operations():
    doc = {"a": {"b/c": [1, 2]}, "d": 1}
    apply_json_patch(doc, {"op": "add", "path": "/a/b~1c/-", "value": 3})
    apply_json_patch(doc, {"op": "add", "path": "/a/b~1c/0", "value": 0})
    apply_json_patch(doc, {"op": "replace", "path": "/d", "value": {"e": 2}})
    apply_json_patch(doc, {"op": "remove", "path": "/a/b~1c/1"})
    assert doc == {"a": {"b/c": [0, 2, 3]}, "d": {"e": 2}}
    with pytest.raises(KustomizeError):
        apply_json_patch(doc, {"op": "replace", "path": "/missing", "value": 1})


def test_unsupported_kustomize_features_are_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nimages:\n- name: extproc\n  newTag: v2\n")
    with pytest.raises(KustomizeError, match="images"):
        render_with_python(tmp_path)
