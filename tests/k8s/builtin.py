"""Validates built-in kinds against Kubernetes' own OpenAPI schemas (as JSON schema, strict).

The schemas are the ones `kubernetes-validate` ships per Kubernetes release ("-strict": unknown
fields rejected). Loaded once per (release, kind) instead of once per object, which is what makes
validating every rendered overlay affordable.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from functools import cache
from typing import Any

import jsonschema
import referencing
from packaging.version import Version

Obj = dict[str, Any]

MIN_KUBERNETES = "1.29"  # gRPC probes are GA since 1.27; the oldest release we claim to support


@cache
def releases() -> list[str]:
    """Two releases to validate against: MIN_KUBERNETES (or the oldest shipped after it) and the newest."""
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    shipped = sorted(
        {m.group(1) for p in root.iterdir() if (m := re.match(r"^v(\d+\.\d+)\.\d+-local-strict$", p.name))},
        key=Version,
    )
    oldest = next((v for v in shipped if Version(v) >= Version(MIN_KUBERNETES)), shipped[-1])
    return sorted({oldest, shipped[-1]}, key=Version)


@cache
def _directory(release: str) -> Any:
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    return root / f"v{release}.0-local-strict"


@cache
def _registry(release: str) -> referencing.Registry:
    definitions = json.loads((_directory(release) / "_definitions.json").read_text())
    return referencing.Resource.from_contents(definitions) @ referencing.Registry()


@cache
def _validator(release: str, kind: str, api_version: str) -> jsonschema.Draft202012Validator | None:
    group_version = re.sub(
        r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version
    )  # rbac.authorization.k8s.io/v1 -> rbac-v1
    path = _directory(release) / f"{kind.lower()}-{group_version}.json"
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_registry(release))


def is_builtin(obj: Obj) -> bool:
    """Whether Kubernetes itself defines this kind (in the newest release shipped)."""
    return _validator(releases()[-1], obj["kind"], obj["apiVersion"]) is not None


def validate_builtin(obj: Obj) -> list[str]:
    """Error messages (empty when valid) for `obj` under every release of `releases()`."""
    errors: list[str] = []
    for release in releases():
        validator = _validator(release, obj["kind"], obj["apiVersion"])
        if validator is None:
            errors.append(f"Kubernetes {release} has no {obj['kind']} in {obj['apiVersion']}")
            continue
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in error.absolute_path) or "."
            errors.append(f"Kubernetes {release}: {where}: {error.message[:200]}")
    return errors
