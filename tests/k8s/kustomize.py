"""Renders a kustomization: `kubectl kustomize` when kubectl is installed, else a small Python renderer.

The Python renderer implements exactly the subset `gateway/` and the broken fixtures use, in
kustomize's order (resources, generators, patches, namespace, name prefix/suffix with name
references, labels), and refuses anything else, so it cannot silently differ from kustomize.
`test_renderer.py` compares the two wherever kubectl exists.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "namePrefix",
    "nameSuffix",
    "labels",
    "configMapGenerator",
    "generatorOptions",
    "patches",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "GatewayClass",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
}


class KustomizeError(Exception):
    """The kustomization cannot be rendered (or uses something the Python renderer does not do)."""


def kubectl() -> str | None:
    """The kubectl binary ($KUBECTL, else on PATH), or None."""
    found = os.environ.get("KUBECTL") or shutil.which("kubectl")
    return found if found and Path(found).exists() else None


def render(path: Path) -> list[Obj]:
    """The objects `kubectl kustomize path` prints; the Python renderer when kubectl is missing."""
    binary = kubectl()
    return render_with_kubectl(path, binary) if binary else render_with_python(path)


def render_with_kubectl(path: Path, binary: str) -> list[Obj]:
    done = subprocess.run(
        [binary, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise KustomizeError(f"kubectl kustomize {path} failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_with_python(path: Path) -> list[Obj]:
    return [r.obj for r in _build(Path(path).resolve())]


@dataclass
class _Resource:
    obj: Obj
    original_name: str  # kustomize matches generator merges against the name before prefix/suffix

    @property
    def kind(self) -> str:
        return self.obj["kind"]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]


def _build(root: Path) -> list[_Resource]:
    kustomization = _load_kustomization(root)
    resources: list[_Resource] = []
    for entry in kustomization.get("resources", []):
        target = (root / entry).resolve()
        if target.is_dir():
            resources += _build(target)
        else:
            docs = yaml.safe_load_all(target.read_text())
            resources += [_Resource(doc, doc["metadata"]["name"]) for doc in docs if doc]
    _generate(root, kustomization, resources)
    for patch in kustomization.get("patches", []):
        _patch(resources, patch, root)
    if "namespace" in kustomization:
        for r in resources:
            if r.kind not in CLUSTER_SCOPED:
                r.obj["metadata"]["namespace"] = kustomization["namespace"]
    if "namePrefix" in kustomization or "nameSuffix" in kustomization:
        _rename(resources, kustomization.get("namePrefix", ""), kustomization.get("nameSuffix", ""))
    for labels in kustomization.get("labels", []):
        _label(resources, labels)
    return resources


def _load_kustomization(root: Path) -> Obj:
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if (root / name).exists():
            document = yaml.safe_load((root / name).read_text()) or {}
            unknown = set(document) - KUSTOMIZATION_KEYS
            if unknown:
                raise KustomizeError(f"{root}: the Python renderer does not support {sorted(unknown)}")
            return document
    raise KustomizeError(f"no kustomization in {root}")


def _generate(root: Path, kustomization: Obj, resources: list[_Resource]) -> None:
    options = kustomization.get("generatorOptions", {})
    hashed = set(options) - {"disableNameSuffixHash"} or not options.get("disableNameSuffixHash")
    for generator in kustomization.get("configMapGenerator", []):
        if hashed and generator.get("behavior", "create") == "create":  # merges keep the base's name
            raise KustomizeError(f"{root}: only generators with disableNameSuffixHash: true are supported")
        if set(generator) - {"name", "files", "behavior"}:
            raise KustomizeError(f"{root}: unsupported configMapGenerator keys {sorted(generator)}")
        data: dict[str, str] = {}
        for entry in generator.get("files", []):
            key, _, file = entry.rpartition("=")
            source = (root / file).resolve()
            if root not in source.parents:
                raise KustomizeError(f"{root}: generator file {file} is outside the kustomization")
            data[key or source.name] = source.read_text()
        behavior = generator.get("behavior", "create")
        if behavior == "create":
            config_map: Obj = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"]},
            }
            if data:
                config_map["data"] = data
            resources.append(_Resource(config_map, generator["name"]))
            continue
        matches = [r for r in resources if r.kind == "ConfigMap" and r.original_name == generator["name"]]
        if len(matches) != 1:
            raise KustomizeError(
                f"{root}: {behavior} of ConfigMap {generator['name']} matches {len(matches)} objects"
            )
        target = matches[0].obj
        if behavior == "replace":
            target.pop("data", None)
        elif behavior != "merge":
            raise KustomizeError(f"{root}: unknown generator behavior {behavior!r}")
        if data:
            target.setdefault("data", {}).update(data)


def _patch(resources: list[_Resource], patch: Obj, root: Path) -> None:
    target, text = patch.get("target", {}), patch.get("patch")
    if set(patch) - {"target", "patch"} or set(target) - {"kind", "name"} or text is None:
        raise KustomizeError(f"{root}: only inline JSON6902 patches with a kind/name target are supported")
    operations = yaml.safe_load(text)
    if not isinstance(operations, list):
        raise KustomizeError(f"{root}: only JSON6902 (a list of operations) patches are supported")
    for r in resources:
        if r.kind == target.get("kind", r.kind) and r.name == target.get("name", r.name):
            for op in operations:
                apply_json_patch(r.obj, op)


def apply_json_patch(document: Obj, op: Obj) -> None:
    """One RFC 6902 operation (add, replace, remove) applied in place. Raises KustomizeError."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
    parent: Any = document
    for token in tokens[:-1]:
        parent = parent[int(token)] if isinstance(parent, list) else parent[token]
    last, kind = tokens[-1], op["op"]
    value = copy.deepcopy(op.get("value"))
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, value)
        elif kind == "replace":
            parent[index] = value
        elif kind == "remove":
            del parent[index]
        else:
            raise KustomizeError(f"unsupported JSON patch op {kind!r}")
    elif kind == "add":
        parent[last] = value
    elif kind in ("replace", "remove"):
        if last not in parent:
            raise KustomizeError(f"JSON patch {kind} of missing {op['path']}")
        if kind == "replace":
            parent[last] = value
        else:
            del parent[last]
    else:
        raise KustomizeError(f"unsupported JSON patch op {kind!r}")


# Built-in kinds whose name references kustomize updates but this renderer does not.
_UNHANDLED_REFERRERS = {
    "Pod",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "RoleBinding",
    "ClusterRoleBinding",
    "Ingress",
    "HorizontalPodAutoscaler",
}


def _rename(resources: list[_Resource], prefix: str, suffix: str) -> None:
    """Prefix/suffix every name, then follow kustomize's name references (pod specs only here)."""
    renamed: dict[tuple[str, str], str] = {}
    for r in resources:
        if r.kind in CLUSTER_SCOPED or r.kind in _UNHANDLED_REFERRERS:
            raise KustomizeError(f"the Python renderer does not rename {r.kind}")
        new = f"{prefix}{r.name}{suffix}"
        renamed[(r.kind, r.name)] = new
        r.obj["metadata"]["name"] = new
    for r in resources:
        if r.kind == "Deployment":
            _rename_pod_references(r.obj["spec"]["template"]["spec"], renamed)


def _rename_pod_references(pod: Obj, renamed: dict[tuple[str, str], str]) -> None:
    def new(kind: str, name: str) -> str:
        return renamed.get((kind, name), name)

    if "serviceAccountName" in pod:
        pod["serviceAccountName"] = new("ServiceAccount", pod["serviceAccountName"])
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["name"] = new("ConfigMap", volume["configMap"]["name"])
        if "secret" in volume:
            volume["secret"]["secretName"] = new("Secret", volume["secret"]["secretName"])
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "configMapKeyRef" in source:
                source["configMapKeyRef"]["name"] = new("ConfigMap", source["configMapKeyRef"]["name"])
            if "secretKeyRef" in source:
                source["secretKeyRef"]["name"] = new("Secret", source["secretKeyRef"]["name"])
        for env_from in container.get("envFrom", []):
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in env_from:
                    env_from[key]["name"] = new(kind, env_from[key]["name"])


def _label(resources: list[_Resource], entry: Obj) -> None:
    if set(entry) - {"pairs", "includeSelectors"}:
        raise KustomizeError(f"unsupported labels keys {sorted(entry)}")
    pairs, selectors = entry["pairs"], entry.get("includeSelectors", False)
    for r in resources:
        r.obj["metadata"].setdefault("labels", {}).update(pairs)
        if not selectors:
            continue
        if r.kind == "Service":
            r.obj["spec"].setdefault("selector", {}).update(pairs)
        elif r.kind == "Deployment":
            r.obj["spec"].setdefault("selector", {}).setdefault("matchLabels", {}).update(pairs)
            r.obj["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
        elif r.kind in {"StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "PodDisruptionBudget"}:
            raise KustomizeError(f"the Python renderer does not label the selectors of {r.kind}")


def object_key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
