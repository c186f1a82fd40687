"""Inference objectives: the Gateway API Inference Extension's request priorities -> `ObjectivesConfig`.
The file section is `objectives:`.

A request names its objective in the `x-gateway-inference-objective` header (its client, or its
HTTPRoute with a RequestHeaderModifier filter); an `InferenceObjective` resource
(`inference.networking.x-k8s.io/v1alpha2`, the one the Inference Extension's and llm-d's endpoint
pickers watch) gives that objective's priority. This picker has no Kubernetes client, so it reads
the resources from a file (`--inference-objectives`): the YAML `kubectl apply` takes (documents
separated by `---`) or what `kubectl get inferenceobjectives -o yaml` prints (a `List`), mounted
from a ConfigMap. `extproc.picker.objectives` reads it again when it changes.

What is checked is what the published CRD checks (v1alpha2's schema, as llm-d ships it):

    apiVersion      inference.networking.x-k8s.io/v1alpha2
    metadata.name   a DNS subdomain (lower case, digits, '-' and '.', at most 253 characters)
    spec.poolRef    required in a spec; name 1-253 characters; group (default
                    inference.networking.k8s.io) and kind (default InferencePool)
    spec.priority   an int32, optional (unset: 0, as the pickers that read it take it)

Fields the CRD does not know are ignored (a later version may add some); an objective without a
spec, which the CRD accepts, names no pool and is left out. Documents of other kinds are left out
with a line each (one file may hold the pool and the route too); an `InferenceModel`, which the
Inference Extension replaced with `InferenceObjective` in v1.0, is refused with that hint.

With `--pool-name`, only the objectives whose `poolRef` names this pool (and its group, and its
namespace when both say one) are kept, as the Inference Extension's picker keeps those of its own
pool. Two kept objectives with one name are refused: the priority a request gets must not depend on
the order of a file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.config.options import ConfigError, Option, Reader

SECTION = "objectives"
API_VERSION = "inference.networking.x-k8s.io/v1alpha2"
KIND = "InferenceObjective"
POOL_GROUP = "inference.networking.k8s.io"
POOL_KIND = "InferencePool"
MAX_FILE_BYTES = 1 << 20  # what one ConfigMap can hold
MAX_NAME = 253
INT32 = (-(2**31), 2**31 - 1)
_KIND = re.compile(r"[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class Pool:
    """The InferencePool this picker serves, as objectives reference it (`spec.poolRef`)."""

    name: str | None = None  # None: keep every objective, whatever pool it names
    namespace: str | None = None
    group: str = POOL_GROUP


@dataclass(frozen=True, slots=True)
class Objectives:
    """One reading of the file: objective name -> priority, and a line per document left out."""

    priorities: Mapping[str, int] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ObjectivesConfig:
    path: str | None = None  # None: no objectives (the header is counted as "unlisted", nothing more)
    pool: Pool = Pool()
    initial: Objectives = Objectives()  # the file as read at start


INFERENCE_OBJECTIVES: Option[str | None] = Option(
    "--inference-objectives",
    str,
    None,
    "A YAML file of the Inference Extension's InferenceObjective resources (v1alpha2; documents "
    "separated by ---, or a List as kubectl get -o yaml prints it), e.g. mounted from a ConfigMap. "
    "A request's x-gateway-inference-objective header names one; its spec.priority orders the "
    "admission queue (--router-queue-threshold) as nvext.agent_hints.priority does: higher first, "
    "below 0 sheddable (429 after the bounded wait). Read again when it changes.",
)
POOL_NAME: Option[str | None] = Option(
    "--pool-name",
    str,
    None,
    "The InferencePool this picker serves: only objectives whose spec.poolRef names it are kept "
    "(the Inference Extension picker's flag). Default: every objective of the file.",
)
POOL_NAMESPACE: Option[str | None] = Option(
    "--pool-namespace",
    str,
    None,
    "The pool's namespace: an objective whose metadata.namespace differs is left out.",
)
POOL_GROUP_OPTION = Option(
    "--pool-group", str, POOL_GROUP, "The pool's API group, as spec.poolRef.group names it."
)

OBJECTIVES_OPTIONS: tuple[Option[Any], ...] = (
    INFERENCE_OBJECTIVES,
    POOL_NAME,
    POOL_NAMESPACE,
    POOL_GROUP_OPTION,
)


def read_objectives_config(reader: Reader) -> ObjectivesConfig:
    """The objectives' settings, and the file read once. Raises ConfigError."""
    path = reader.read(INFERENCE_OBJECTIVES)
    pool = Pool(reader.read(POOL_NAME), reader.read(POOL_NAMESPACE), reader.read(POOL_GROUP_OPTION))
    if path is None:
        return ObjectivesConfig(pool=pool)
    return ObjectivesConfig(path, pool, read_objectives(path, pool))


def read_objectives(path: str, pool: Pool) -> Objectives:
    """Read and check the file. Raises ConfigError naming the file, the document and the field."""
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"inference-objectives: cannot read {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"inference-objectives: {path} holds more than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"inference-objectives: {path} is not UTF-8 ({exc.reason})") from exc
    return parse_objectives(text, pool, source=path)


def parse_objectives(text: str, pool: Pool, *, source: str = "inference-objectives") -> Objectives:
    """The objectives of `text` that serve `pool`. Raises ConfigError."""
    priorities: dict[str, int] = {}
    declared_in: dict[str, str] = {}
    left_out: list[str] = []
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML: {exc}") from exc
    for where, doc in _resources(documents, source):
        kind = doc.get("kind")
        if kind == "InferenceModel":
            raise ConfigError(
                f"{where}: InferenceModel was replaced by InferenceObjective in the Inference "
                f"Extension's v1.0; this picker reads {KIND} ({API_VERSION}): give each objective's "
                "priority there, and name it in the x-gateway-inference-objective header"
            )
        if kind != KIND:
            left_out.append(f"{where}: kind {_shown(kind)} is not {KIND}: left out")
            continue
        name, namespace, pool_ref, priority = _objective(doc, where)
        if pool_ref is None:
            left_out.append(f"{where}: objective {name!r} has no spec (no pool): left out")
            continue
        if not _serves(pool, namespace, pool_ref):
            left_out.append(
                f"{where}: objective {name!r} is for pool {pool_ref[0]!r} (group {pool_ref[1]}): left out"
            )
            continue
        if name in priorities:
            raise ConfigError(f"{where}: objective {name!r} is declared twice (also in {declared_in[name]})")
        priorities[name] = priority
        declared_in[name] = where
    return Objectives(priorities, tuple(left_out))


def _resources(documents: list[Any], source: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each resource with where it is: the documents, and the items of a `List` document."""
    for number, doc in enumerate(documents, 1):
        where = f"{source}, document {number}"
        if doc is None:  # an empty document: `---` at the start or the end
            continue
        if not isinstance(doc, Mapping):
            raise ConfigError(f"{where}: expected a resource (a mapping), got {type(doc).__name__}")
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
            items = doc["items"]
            if not isinstance(items, list):
                raise ConfigError(f"{where}: items must be a list")
            for index, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise ConfigError(f"{where}, item {index}: expected a resource (a mapping)")
                yield f"{where}, item {index}", item
        else:
            yield where, doc


def _objective(
    doc: Mapping[str, Any], where: str
) -> tuple[str, str | None, tuple[str, str, str] | None, int]:
    """(name, namespace, (pool name, group, kind), priority) of one InferenceObjective, checked;
    no pool when it has no spec (which the CRD allows, and which no picker's pool then names)."""
    if doc.get("apiVersion") != API_VERSION:
        raise ConfigError(f"{where}: apiVersion {_shown(doc.get('apiVersion'))}: expected {API_VERSION}")
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping):
        raise ConfigError(f"{where}: metadata is required (a mapping with a name)")
    name = metadata.get("name")
    if not isinstance(name, str) or len(name) > MAX_NAME or not _SUBDOMAIN.fullmatch(name):
        raise ConfigError(
            f"{where}: metadata.name {_shown(name)}: expected a DNS subdomain (lower case letters, "
            f"digits, '-' and '.', at most {MAX_NAME} characters)"
        )
    namespace = metadata.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise ConfigError(f"{where}: metadata.namespace must be a string")
    spec = doc.get("spec")
    if spec is None:
        return name, namespace, None, 0
    if not isinstance(spec, Mapping) or not isinstance(spec.get("poolRef"), Mapping):
        raise ConfigError(f"{where}: objective {name!r}: spec.poolRef is required")
    ref = spec["poolRef"]
    pool_name, group, kind = ref.get("name"), ref.get("group", POOL_GROUP), ref.get("kind", POOL_KIND)
    if not isinstance(pool_name, str) or not 1 <= len(pool_name) <= MAX_NAME:
        raise ConfigError(f"{where}: objective {name!r}: spec.poolRef.name must be 1-{MAX_NAME} characters")
    if not isinstance(group, str) or not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ConfigError(
            f"{where}: objective {name!r}: spec.poolRef.group and kind must be a group name and a kind"
        )
    priority = spec.get("priority")
    if priority is None:
        priority = 0
    elif isinstance(priority, bool) or not isinstance(priority, int) or not INT32[0] <= priority <= INT32[1]:
        raise ConfigError(f"{where}: objective {name!r}: spec.priority {_shown(priority)}: expected an int32")
    return name, namespace, (pool_name, group, kind), priority


def _serves(pool: Pool, namespace: str | None, ref: tuple[str, str, str]) -> bool:
    if pool.name is None:
        return True
    if namespace is not None and pool.namespace is not None and namespace != pool.namespace:
        return False
    return ref == (pool.name, pool.group, POOL_KIND)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
