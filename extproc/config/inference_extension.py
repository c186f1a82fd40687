"""The Gateway API Inference Extension's resources a picker reads -> `InferenceExtensionConfig`.
The file section is `inference-extension:`.

Two kinds, both `inference.networking.x-k8s.io/v1alpha2`, the ones the Inference Extension's and
llm-d's endpoint pickers watch:

    InferenceObjective     a request names one in its `x-gateway-inference-objective` header; its
                           `spec.priority` orders the admission queue (`extproc.picker.inference_extension`)
    InferenceModelRewrite  rules that send a request for one model name to others, by weight (a
                           canary, an A/B test, a LoRA adapter's new version): the body's `model` is
                           rewritten before the request is routed

This picker has no Kubernetes client, so it reads them from a file (`--inference-resources`): the
YAML `kubectl apply` takes (documents separated by `---`) or what `kubectl get
inferenceobjectives,inferencemodelrewrites -o yaml` prints (a `List`), mounted from a ConfigMap;
the picker reads it again when it changes. What is checked is what the published CRDs check (their
v1alpha2 schemas, as llm-d ships them):

    apiVersion      inference.networking.x-k8s.io/v1alpha2
    metadata.name   a DNS subdomain (lower case, digits, '-' and '.', at most 253 characters)
    spec.poolRef    required in a spec; name 1-253 characters; group (default
                    inference.networking.k8s.io) and kind (default InferencePool)
    spec.priority   InferenceObjective: an int32, optional (unset: 0, as the pickers take it)
    spec.rules      InferenceModelRewrite: required; each rule's `matches` (each a `model` with a
                    non-empty `value`, `type` Exact), its `targets` (at least one when given, each a
                    `modelRewrite` and an optional `weight` of 1 to 1,000,000)

Fields the CRDs do not know are ignored (a later version may add some); an objective without a
spec, which the CRD accepts, names no pool and is left out. Documents of other kinds are left out
with a line each (one file may hold the pool and the route too); an `InferenceModel`, which the
Inference Extension replaced with `InferenceObjective` in v1.0, is refused with that hint.

With `--pool-name`, only the resources whose `poolRef` names this pool (and its group, and its
namespace when both say one) are kept, as the Inference Extension's picker keeps those of its own
pool. Two kept objectives with one name are refused: the priority a request gets must not depend on
the order of a file. Rewrite rules keep the CRD's precedence: a rule that names the model beats a
rule without matches (every model); between resources the older `creationTimestamp` wins (one
without comes after those with, in file order), and within one the first rule.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.config.options import ConfigError, Option, Reader

SECTION = "inference-extension"
API_VERSION = "inference.networking.x-k8s.io/v1alpha2"
OBJECTIVE = "InferenceObjective"
MODEL_REWRITE = "InferenceModelRewrite"
POOL_GROUP = "inference.networking.k8s.io"
POOL_KIND = "InferencePool"
MAX_FILE_BYTES = 1 << 20  # what one ConfigMap can hold
MAX_NAME = 253
MAX_WEIGHT = 1_000_000
INT32 = (-(2**31), 2**31 - 1)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, when PyYAML has it: 8x faster
_KIND = re.compile(r"[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class Pool:
    """The InferencePool this picker serves, as resources reference it (`spec.poolRef`)."""

    name: str | None = None  # None: keep every resource, whatever pool it names
    namespace: str | None = None
    group: str = POOL_GROUP


@dataclass(frozen=True, slots=True)
class Target:
    model: str  # `modelRewrite`
    weight: int  # 0 when unset: chosen only when no target of its rule has a weight


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """One rule of an InferenceModelRewrite: the models it matches (none: every model) and where it
    sends them (no targets: the model stays as asked)."""

    rewrite: str  # the resource's name (metrics, logs)
    models: frozenset[str]
    targets: tuple[Target, ...]


@dataclass(frozen=True, slots=True)
class InferenceResources:
    """One reading of the file: objective name -> priority, the rewrite rules in precedence order,
    and a line per document left out."""

    priorities: Mapping[str, int] = field(default_factory=dict)
    rewrites: tuple[RewriteRule, ...] = ()
    left_out: tuple[str, ...] = ()

    def rewrite_rule(self, model: str) -> RewriteRule | None:
        """The rule that applies to a request for `model`: the first that names it, else the first
        without matches."""
        generic = None
        for rule in self.rewrites:
            if model in rule.models:
                return rule
            if generic is None and not rule.models:
                generic = rule
        return generic


@dataclass(frozen=True, slots=True)
class InferenceExtensionConfig:
    path: str | None = None  # None: no resources (objectives are counted as "unlisted", nothing more)
    pool: Pool = Pool()
    initial: InferenceResources = InferenceResources()  # the file as read at start


INFERENCE_RESOURCES: Option[str | None] = Option(
    "--inference-resources",
    str,
    None,
    "A YAML file of the Inference Extension's InferenceObjective and InferenceModelRewrite "
    "resources (v1alpha2; documents separated by ---, or a List as kubectl get -o yaml prints it), "
    "e.g. mounted from a ConfigMap; read again when it changes. A request's "
    "x-gateway-inference-objective header names an objective, whose spec.priority orders the "
    "admission queue (--router-queue-threshold) as nvext.agent_hints.priority does: higher first, "
    "below 0 sheddable (429 after the bounded wait). A model rewrite sends requests for one model "
    "name to others by weight, rewriting the body's model.",
)
POOL_NAME: Option[str | None] = Option(
    "--pool-name",
    str,
    None,
    "The InferencePool this picker serves: only resources whose spec.poolRef names it are kept "
    "(the Inference Extension picker's flag). Default: every resource of the file.",
)
POOL_NAMESPACE: Option[str | None] = Option(
    "--pool-namespace",
    str,
    None,
    "The pool's namespace: a resource whose metadata.namespace differs is left out.",
)
POOL_GROUP_OPTION = Option(
    "--pool-group", str, POOL_GROUP, "The pool's API group, as spec.poolRef.group names it."
)

INFERENCE_EXTENSION_OPTIONS: tuple[Option[Any], ...] = (
    INFERENCE_RESOURCES,
    POOL_NAME,
    POOL_NAMESPACE,
    POOL_GROUP_OPTION,
)


def read_inference_extension(reader: Reader) -> InferenceExtensionConfig:
    """The settings, and the file read once. Raises ConfigError."""
    path = reader.read(INFERENCE_RESOURCES)
    pool = Pool(reader.read(POOL_NAME), reader.read(POOL_NAMESPACE), reader.read(POOL_GROUP_OPTION))
    if path is None:
        return InferenceExtensionConfig(pool=pool)
    return InferenceExtensionConfig(path, pool, read_resources(path, pool))


def read_resources(path: str, pool: Pool) -> InferenceResources:
    """Read and check the file. Raises ConfigError naming the file, the document and the field."""
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"inference-resources: cannot read {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"inference-resources: {path} holds more than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"inference-resources: {path} is not UTF-8 ({exc.reason})") from exc
    return parse_resources(text, pool, source=path)


def parse_resources(text: str, pool: Pool, *, source: str = "inference-resources") -> InferenceResources:
    """The resources of `text` that serve `pool`. Raises ConfigError."""
    priorities: dict[str, int] = {}
    declared_in: dict[str, str] = {}
    rewrites: list[tuple[tuple[int, float], list[RewriteRule]]] = []  # (precedence, rules)
    left_out: list[str] = []
    try:
        documents = list(yaml.load_all(text, Loader=_LOADER))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML: {exc}") from exc
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(f"{source}: nested too deeply to be a resource") from None
    except UnicodeEncodeError:  # a lone surrogate: libyaml reads UTF-8 only (a file cannot hold one)
        raise ConfigError(f"{source}: holds text that is not UTF-8") from None
    for where, doc in _resources(documents, source):
        kind = doc.get("kind")
        if kind == "InferenceModel":
            raise ConfigError(
                f"{where}: InferenceModel was replaced by InferenceObjective in the Inference "
                f"Extension's v1.0; this picker reads {OBJECTIVE} ({API_VERSION}): give each objective's "
                "priority there, and name it in the x-gateway-inference-objective header"
            )
        if kind not in (OBJECTIVE, MODEL_REWRITE):
            left_out.append(f"{where}: kind {_shown(kind)} is not {OBJECTIVE} or {MODEL_REWRITE}: left out")
            continue
        name, namespace, created = _metadata(doc, where)
        spec = doc.get("spec")
        if spec is None and kind == OBJECTIVE:
            left_out.append(f"{where}: objective {name!r} has no spec (no pool): left out")
            continue
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: {name!r}: spec is required (a mapping)")
        pool_ref = _pool_ref(spec, where, name)
        if not _serves(pool, namespace, pool_ref):
            left_out.append(f"{where}: {name!r} is for pool {pool_ref[0]!r} (group {pool_ref[1]}): left out")
            continue
        if kind == MODEL_REWRITE:
            rewrites.append((created, _rules(spec, where, name)))
            continue
        if name in priorities:
            raise ConfigError(f"{where}: objective {name!r} is declared twice (also in {declared_in[name]})")
        priorities[name] = _priority(spec, where, name)
        declared_in[name] = where
    ordered = sorted(rewrites, key=lambda pair: pair[0])  # stable: file order among equals
    return InferenceResources(priorities, tuple(r for _, rules in ordered for r in rules), tuple(left_out))


def _resources(documents: list[Any], source: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each resource with where it is: the documents, and the items of a `List` document."""
    for number, doc in enumerate(documents, 1):
        where = f"{source}, document {number}"
        if doc is None:  # an empty document: `---` at the end
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


def _metadata(doc: Mapping[str, Any], where: str) -> tuple[str, str | None, tuple[int, float]]:
    """(name, namespace, precedence: (0, the creation time) or (1, 0) when none), checked."""
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
    created = metadata.get("creationTimestamp")
    if created is None:
        return name, namespace, (1, 0.0)
    if isinstance(created, datetime.datetime):  # YAML read an unquoted timestamp
        created = created.isoformat()
    try:
        when = datetime.datetime.fromisoformat(str(created))  # 3.11 reads RFC 3339's "Z"
    except ValueError:
        raise ConfigError(
            f"{where}: metadata.creationTimestamp {_shown(created)}: expected RFC 3339"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return name, namespace, (0, when.timestamp())


def _pool_ref(spec: Mapping[str, Any], where: str, name: str) -> tuple[str, str, str]:
    ref = spec.get("poolRef")
    if not isinstance(ref, Mapping):
        raise ConfigError(f"{where}: {name!r}: spec.poolRef is required")
    pool_name, group, kind = ref.get("name"), ref.get("group", POOL_GROUP), ref.get("kind", POOL_KIND)
    if not isinstance(pool_name, str) or not 1 <= len(pool_name) <= MAX_NAME:
        raise ConfigError(f"{where}: {name!r}: spec.poolRef.name must be 1-{MAX_NAME} characters")
    if not isinstance(group, str) or not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ConfigError(f"{where}: {name!r}: spec.poolRef.group and kind must be a group name and a kind")
    return pool_name, group, kind


def _priority(spec: Mapping[str, Any], where: str, name: str) -> int:
    priority = spec.get("priority")
    if priority is None:
        return 0
    if isinstance(priority, bool) or not isinstance(priority, int) or not INT32[0] <= priority <= INT32[1]:
        raise ConfigError(f"{where}: objective {name!r}: spec.priority {_shown(priority)}: expected an int32")
    return priority


def _rules(spec: Mapping[str, Any], where: str, name: str) -> list[RewriteRule]:
    rules = spec.get("rules")
    if not isinstance(rules, list):
        raise ConfigError(f"{where}: model rewrite {name!r}: spec.rules is required (a list)")
    checked = []
    for index, rule in enumerate(rules):
        at = f"{where}: model rewrite {name!r}, rule {index}"
        if not isinstance(rule, Mapping):
            raise ConfigError(f"{at}: expected a mapping")
        matches, targets = rule.get("matches") or [], rule.get("targets")
        if not isinstance(matches, list):
            raise ConfigError(f"{at}: matches must be a list")
        models = frozenset(_match(match, f"{at}, match {i}") for i, match in enumerate(matches))
        if targets is not None and (not isinstance(targets, list) or not targets):
            raise ConfigError(f"{at}: targets must be a list of at least one target")
        checked.append(
            RewriteRule(
                name, models, tuple(_target(t, f"{at}, target {i}") for i, t in enumerate(targets or []))
            )
        )
    return checked


def _match(match: object, at: str) -> str:
    model = match.get("model") if isinstance(match, Mapping) else None
    if not isinstance(model, Mapping):
        raise ConfigError(f"{at}: model is required")
    value, kind = model.get("value"), model.get("type", "Exact")
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{at}: model.value must be a non-empty string")
    if kind != "Exact":
        raise ConfigError(f"{at}: model.type {_shown(kind)}: only Exact is defined")
    return value


def _target(target: object, at: str) -> Target:
    if not isinstance(target, Mapping) or not isinstance(target.get("modelRewrite"), str):
        raise ConfigError(f"{at}: modelRewrite is required (a string)")
    weight = target.get("weight")
    if weight is None:
        weight = 0
    elif isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        raise ConfigError(f"{at}: weight {_shown(weight)}: expected an integer from 1 to {MAX_WEIGHT}")
    return Target(target["modelRewrite"], weight)


def _serves(pool: Pool, namespace: str | None, ref: tuple[str, str, str]) -> bool:
    if pool.name is None:
        return True
    if namespace is not None and pool.namespace is not None and namespace != pool.namespace:
        return False
    return ref == (pool.name, pool.group, POOL_KIND)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
