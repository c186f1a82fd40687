"""A rendered manifest set indexed for cross-object checks, and the pickers in it with their config.

A picker is a Deployment container running `extproc serve`; its effective configuration is what
`extproc.config.load_config` makes of the container's arguments and literal environment plus the
config file from the ConfigMap mounted where `--config` points, exactly as in the pod.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc.config import ConfigError, PickerConfig, load_config

Obj = dict[str, Any]


@dataclass(frozen=True)
class Problem:
    code: str  # what kind of mistake: schema.builtin, crd.*, ref, port, selector, probe, config, ...
    where: str  # Kind/name of the object at fault
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.where}: {self.message}"


def where(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def selects(selector: dict[str, str] | None, labels: dict[str, str] | None) -> bool:
    """Whether an equality selector (matchLabels, a Service selector) matches `labels`; {} matches none."""
    return bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


@dataclass
class Picker:
    deployment: Obj
    container: Obj
    config: PickerConfig | None  # None when it does not load (reported as a problem)
    config_mount: Obj | None = None  # the volumeMount holding the config file

    @property
    def name(self) -> str:
        return self.deployment["metadata"]["name"]


@dataclass
class MockWorker:
    deployment: Obj
    args: argparse.Namespace


class Manifests:
    def __init__(self, objects: list[Obj]) -> None:
        self.objects = objects
        self._by_key: dict[tuple[str, str], Obj] = {}
        for obj in objects:
            self._by_key[(obj["kind"], obj["metadata"]["name"])] = obj

    def get(self, kind: str, name: str) -> Obj | None:
        return self._by_key.get((kind, name))

    def of_kind(self, kind: str) -> Iterator[Obj]:
        return (o for o in self.objects if o["kind"] == kind)

    def deployments_selected_by(self, selector: dict[str, str] | None) -> list[Obj]:
        return [d for d in self.of_kind("Deployment") if selects(selector, _template_labels(d))]

    def target_port(self, service_port: Obj, deployment: Obj) -> int | None:
        """The container port a Service port sends to on `deployment`'s pods (None: no such port)."""
        target = service_port.get("targetPort", service_port["port"])
        ports = [p for c in pod_spec(deployment)["containers"] for p in c.get("ports", [])]
        if isinstance(target, int):
            return target if any(p["containerPort"] == target for p in ports) else None
        return next((p["containerPort"] for p in ports if p.get("name") == target), None)


def pod_spec(deployment: Obj) -> Obj:
    return deployment["spec"]["template"]["spec"]


def _template_labels(deployment: Obj) -> dict[str, str]:
    return deployment["spec"]["template"].get("metadata", {}).get("labels", {})


def template_labels(deployment: Obj) -> dict[str, str]:
    return _template_labels(deployment)


def literal_env(container: Obj, manifests: Manifests) -> dict[str, str]:
    """The container's environment as far as the manifests decide it (values, ConfigMap keys)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _expand(str(item["value"]), env)
        elif ref := item.get("valueFrom", {}).get("configMapKeyRef"):
            config_map = manifests.get("ConfigMap", ref["name"]) or {}
            if ref["key"] in config_map.get("data", {}):
                env[item["name"]] = config_map["data"][ref["key"]]
        # fieldRef and secretKeyRef are only known in the running pod
    return env


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args and env values (unknown variables stay as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def container_args(container: Obj, manifests: Manifests) -> list[str]:
    env = literal_env(container, manifests)
    return [_expand(str(a), env) for a in [*container.get("command", []), *container.get("args", [])]]


def find_pickers(manifests: Manifests, problems: list[Problem]) -> list[Picker]:
    pickers = []
    for deployment in manifests.of_kind("Deployment"):
        for container in pod_spec(deployment)["containers"]:
            args = container_args(container, manifests)
            if args[:1] == ["serve"]:
                pickers.append(_load_picker(deployment, container, args[1:], manifests, problems))
    return pickers


def find_mock_workers(manifests: Manifests) -> list[MockWorker]:
    from extproc.sim.mock_worker import add_mock_worker_arguments

    workers = []
    for deployment in manifests.of_kind("Deployment"):
        for container in pod_spec(deployment)["containers"]:
            args = container_args(container, manifests)
            if args[:1] == ["mock-worker"]:
                parser = argparse.ArgumentParser()
                add_mock_worker_arguments(parser)
                workers.append(MockWorker(deployment, parser.parse_args(args[1:])))
    return workers


def _config_path(argv: list[str], env: dict[str, str]) -> tuple[str | None, int | None]:
    """The --config path and its argv index (None for the DYN_CONFIG environment variable)."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1], i + 1
        if arg.startswith("--config="):
            return arg.partition("=")[2], i
    return env.get("DYN_CONFIG"), None


def _load_picker(
    deployment: Obj, container: Obj, argv: list[str], manifests: Manifests, problems: list[Problem]
) -> Picker:
    picker = Picker(deployment, container, None)
    env = literal_env(container, manifests)
    path, index = _config_path(argv, env)
    if path is None:
        problems.append(
            Problem("config", where(deployment), "the picker has no --config (no models, no workers)")
        )
        return picker
    text = _mounted_file(picker, path, manifests, problems)
    if text is None:
        return picker
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "picker.yaml"
        local.write_text(text)
        argv = list(argv)
        if index is None:
            env["DYN_CONFIG"] = str(local)
        elif argv[index].startswith("--config="):
            argv[index] = f"--config={local}"
        else:
            argv[index] = str(local)
        if not _localize_resources(picker, argv, env, manifests, problems, Path(tmp)):
            return picker
        try:
            picker.config = load_config(argv, environ=env)
        except ConfigError as exc:
            problems.append(Problem("config", where(deployment), f"router config does not load: {exc}"))
        except SystemExit:
            problems.append(Problem("config", where(deployment), f"invalid picker arguments {argv}"))
    return picker


def _localize_resources(
    picker: Picker,
    argv: list[str],
    env: dict[str, str],
    manifests: Manifests,
    problems: list[Problem],
    tmp: Path,
) -> bool:
    """Point --inference-resources (flag or DYN_INFERENCE_RESOURCES) at a local copy of the file the
    container would read, so that load_config checks it; False (and a problem) when it is not mounted."""
    index = next((i + 1 for i, arg in enumerate(argv[:-1]) if arg == "--inference-resources"), None)
    path = argv[index] if index is not None else env.get("DYN_INFERENCE_RESOURCES")
    if path is None:
        return True
    text = _mounted_file(picker, path, manifests, problems, config=False)
    if text is None:
        return False
    local = tmp / "inference-resources.yaml"
    local.write_text(text)
    if index is not None:
        argv[index] = str(local)
    else:
        env["DYN_INFERENCE_RESOURCES"] = str(local)
    return True


def _mounted_file(
    picker: Picker, path: str, manifests: Manifests, problems: list[Problem], *, config: bool = True
) -> str | None:
    """The content of `path` as the container sees it, from a ConfigMap volume; None (and a problem).
    `config`: it is the picker's config file (its mount is remembered for the reload checks)."""
    spec = pod_spec(picker.deployment)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in picker.container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if mount.get("subPath"):
            if path != root:
                continue
            key = mount["subPath"]
        elif path.startswith(root + "/") and "/" not in path[len(root) + 1 :]:
            key = path[len(root) + 1 :]
        else:
            continue
        if config:
            picker.config_mount = mount
        source = volumes.get(mount["name"], {}).get("configMap")
        if source is None:
            problems.append(
                Problem("config", where(picker.deployment), f"{path} is not on a ConfigMap volume")
            )
            return None
        config_map = manifests.get("ConfigMap", source["name"])
        if config_map is None or key not in config_map.get("data", {}):
            problems.append(
                Problem(
                    "ref", where(picker.deployment), f"{path}: no key {key!r} in ConfigMap {source['name']}"
                )
            )
            return None
        return config_map["data"][key]
    problems.append(Problem("config", where(picker.deployment), f"nothing is mounted at {path}"))
    return None
