"""Validates custom resources against their CRDs offline, the way the API server would on create.

For the served version's `openAPIV3Schema`: defaults are applied first (top down, inside objects
that are present), then every value is checked (types, enum, pattern, bounds, required, list
types), unknown fields are rejected (as `kubectl apply` does with its default strict field
validation) unless the schema preserves them, and the `x-kubernetes-validations` CEL rules are
evaluated with cel-python. Transition rules (`oldSelf`) do not apply to a create and are skipped;
a rule cel-python cannot compile or evaluate (a Kubernetes CEL library function it lacks) is
reported as skipped, never as passed.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import yaml

Obj = dict[str, Any]

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


@dataclass(frozen=True)
class Violation:
    code: str  # crd.unknown-kind | crd.unknown-field | crd.invalid | crd.cel | crd.metadata
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.code} at {self.path or '.'}: {self.message}"


@dataclass
class CrdResult:
    violations: list[Violation] = field(default_factory=list)
    skipped_rules: list[str] = field(default_factory=list)  # "path: rule (why)"
    evaluated_rules: int = 0


@dataclass(frozen=True)
class _Crd:
    scope: str
    schemas: dict[str, Obj]  # served version -> openAPIV3Schema


class CrdSchemas:
    """Every CRD found in a directory of YAML files, by (group, kind)."""

    def __init__(self, directory: Path) -> None:
        self._crds: dict[tuple[str, str], _Crd] = {}
        for path in sorted(Path(directory).glob("*.yaml")):
            for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    spec = doc["spec"]
                    schemas = {
                        v["name"]: v["schema"]["openAPIV3Schema"] for v in spec["versions"] if v.get("served")
                    }
                    self._crds[(spec["group"], spec["names"]["kind"])] = _Crd(spec["scope"], schemas)

    def knows(self, obj: Obj) -> bool:
        group = obj["apiVersion"].rpartition("/")[0]
        return (group, obj["kind"]) in self._crds

    def kinds(self) -> list[tuple[str, str]]:
        return sorted(self._crds)

    def validate(self, obj: Obj) -> CrdResult:
        """Default `obj` in place and validate it; violations and skipped rules in the result."""
        result = CrdResult()
        group, _, version = obj["apiVersion"].rpartition("/")
        crd = self._crds.get((group, obj["kind"]))
        if crd is None:
            result.violations.append(Violation("crd.unknown-kind", "", f"no CRD for {obj['apiVersion']}"))
            return result
        schema = crd.schemas.get(version)
        if schema is None:
            result.violations.append(
                Violation(
                    "crd.unknown-kind", "apiVersion", f"version {version} not served ({sorted(crd.schemas)})"
                )
            )
            return result
        _check_metadata(obj.get("metadata"), crd.scope, result)
        _Walker(result).check(obj, schema, "")
        return result


def _check_metadata(meta: Any, scope: str, result: CrdResult) -> None:
    def bad(path: str, message: str) -> None:
        result.violations.append(Violation("crd.metadata", path, message))

    if not isinstance(meta, dict) or not meta.get("name"):
        bad("metadata.name", "required")
        return
    if len(meta["name"]) > 253 or not DNS1123_SUBDOMAIN.match(meta["name"]):
        bad("metadata.name", f"{meta['name']!r} is not a DNS-1123 subdomain")
    if scope == "Cluster" and meta.get("namespace"):
        bad("metadata.namespace", "cluster-scoped resource with a namespace")
    for key, value in (meta.get("labels") or {}).items():
        name = key.rpartition("/")[2]
        if len(name) > 63 or not LABEL_NAME.match(name):
            bad(f"metadata.labels.{key}", "invalid label key")
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            bad(f"metadata.labels.{key}", f"invalid label value {value!r}")


class _Walker:
    def __init__(self, result: CrdResult) -> None:
        self.result = result

    def bad(self, code: str, path: str, message: str) -> None:
        self.result.violations.append(Violation(code, path, message))

    def check(self, value: Any, schema: Obj, path: str) -> None:
        if value is None:
            if not schema.get("nullable"):
                self.bad("crd.invalid", path, "null is not allowed")
            return
        if not self._type_ok(value, schema, path):
            return
        if "enum" in schema and value not in schema["enum"]:
            self.bad("crd.invalid", path, f"{value!r} is not one of {schema['enum']}")
        if isinstance(value, dict):
            self._object(value, schema, path)
        elif isinstance(value, list):
            self._array(value, schema, path)
        elif isinstance(value, str):
            self._string(value, schema, path)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self._number(value, schema, path)
        for sub in schema.get("allOf", []):
            self.check(value, sub, path)
        if "anyOf" in schema and not any(self._quietly_ok(value, s) for s in schema["anyOf"]):
            self.bad("crd.invalid", path, "matches none of anyOf")
        if "oneOf" in schema and sum(self._quietly_ok(value, s) for s in schema["oneOf"]) != 1:
            self.bad("crd.invalid", path, "does not match exactly one of oneOf")
        if "not" in schema and self._quietly_ok(value, schema["not"]):
            self.bad("crd.invalid", path, "matches a forbidden schema (not)")
        for rule in schema.get("x-kubernetes-validations", []):
            self._cel(value, rule, path)

    def _quietly_ok(self, value: Any, schema: Obj) -> bool:
        probe = _Walker(CrdResult())
        probe.check(copy.deepcopy(value), schema, "")
        return not probe.result.violations

    def _type_ok(self, value: Any, schema: Obj, path: str) -> bool:
        if schema.get("x-kubernetes-int-or-string"):
            ok = isinstance(value, int | str) and not isinstance(value, bool)
            expected = "integer or string"
        else:
            expected = schema.get("type")
            checks = {
                "object": lambda v: isinstance(v, dict),
                "array": lambda v: isinstance(v, list),
                "string": lambda v: isinstance(v, str),
                "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
                "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
                "boolean": lambda v: isinstance(v, bool),
            }
            ok = expected is None or checks[expected](value)
        if not ok:
            self.bad("crd.invalid", path, f"expected {expected}, got {type(value).__name__} {value!r}")
        return ok

    def _object(self, value: Obj, schema: Obj, path: str) -> None:
        properties = schema.get("properties", {})
        for key, sub in properties.items():  # defaulting, as the API server does before validating
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key in properties:
                if path == "" and key == "metadata":
                    continue  # ObjectMeta: checked by _check_metadata
                self.check(item, properties[key], child)
            elif isinstance(extra, dict):
                self.check(item, extra, child)
            elif not (schema.get("x-kubernetes-preserve-unknown-fields") or extra is True):
                self.bad("crd.unknown-field", child, f'unknown field "{key}"')
        for key in schema.get("required", []):
            if key not in value:
                self.bad("crd.invalid", f"{path}.{key}" if path else key, "required value missing")
        if len(value) < schema.get("minProperties", 0):
            self.bad("crd.invalid", path, f"needs at least {schema['minProperties']} properties")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            self.bad("crd.invalid", path, f"at most {schema['maxProperties']} properties")

    def _array(self, value: list[Any], schema: Obj, path: str) -> None:
        if len(value) < schema.get("minItems", 0):
            self.bad("crd.invalid", path, f"needs at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.bad("crd.invalid", path, f"at most {schema['maxItems']} items")
        for i, item in enumerate(value):
            if "items" in schema:
                self.check(item, schema["items"], f"{path}[{i}]")
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set" and len({repr(v) for v in value}) != len(value):
            self.bad("crd.invalid", path, "duplicate entries in a set")
        if list_type == "map":
            keys = [
                tuple(item.get(k) for k in schema.get("x-kubernetes-list-map-keys", [])) for item in value
            ]
            if len(set(keys)) != len(keys):
                self.bad("crd.invalid", path, "duplicate map keys")

    def _string(self, value: str, schema: Obj, path: str) -> None:
        if len(value) < schema.get("minLength", 0):
            self.bad("crd.invalid", path, f"shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            self.bad("crd.invalid", path, f"longer than {schema['maxLength']}")
        if "pattern" in schema and not _regex(schema["pattern"]).search(value):
            self.bad("crd.invalid", path, f"{value!r} does not match {schema['pattern']}")

    def _number(self, value: float, schema: Obj, path: str) -> None:
        low, high = INT_RANGES.get(schema.get("format", ""), (None, None))
        if "minimum" in schema:
            low = schema["minimum"] if low is None else max(low, schema["minimum"])
        if "maximum" in schema:
            high = schema["maximum"] if high is None else min(high, schema["maximum"])
        if low is not None and (value < low or (schema.get("exclusiveMinimum") and value == low)):
            self.bad("crd.invalid", path, f"{value} is below {low}")
        if high is not None and (value > high or (schema.get("exclusiveMaximum") and value == high)):
            self.bad("crd.invalid", path, f"{value} is above {high}")

    def _cel(self, value: Any, rule: Obj, path: str) -> None:
        expression = rule["rule"]
        where = f"{path or '.'}: {expression}"
        if re.search(r"\boldSelf\b", expression):
            return  # a transition rule: not evaluated when an object is created
        program = _program(expression)
        if isinstance(program, str):
            self.result.skipped_rules.append(f"{where} ({program})")
            return
        try:
            outcome = program.evaluate({"self": celpy.json_to_cel(value)})
        except Exception as exc:  # cel-python raises for functions it lacks
            outcome = exc
        if isinstance(outcome, Exception):
            text = str(outcome.args[0] if outcome.args else outcome)
            if "undeclared reference" in text or "no such overload" in text or isinstance(outcome, KeyError):
                self.result.skipped_rules.append(f"{where} (cel-python: {text[:80]})")
                return
            self.bad("crd.cel", path, f"{rule.get('message', expression)} (evaluation error: {text[:120]})")
            return
        self.result.evaluated_rules += 1
        if not bool(outcome):
            self.bad("crd.cel", path, rule.get("message") or f"failed rule: {expression}")


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_ENV = celpy.Environment()


@cache
def _program(expression: str) -> Any:
    """A compiled CEL program, or the reason cel-python cannot compile it."""
    try:
        return _ENV.program(_ENV.compile(expression))
    except Exception as exc:
        return f"cel-python cannot compile it: {type(exc).__name__}"


def validate_all(schemas: CrdSchemas, objects: Iterable[Obj]) -> dict[int, CrdResult]:
    """Results by index of every object a CRD knows (the others are built-in kinds)."""
    return {i: schemas.validate(obj) for i, obj in enumerate(objects) if schemas.knows(obj)}
