"""All offline checks of a rendered manifest set: schemas, CRDs (defaults, CEL), cross-object.

`check_manifests` defaults the custom resources in place (as the API server would) and returns
every problem, each with a code saying what kind of mistake it is (see `crossrefs.py`, `crds.py`);
`schema.builtin` marks a built-in object that Kubernetes' own schema rejects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.k8s.builtin import is_builtin, validate_builtin
from tests.k8s.crds import CrdSchemas
from tests.k8s.crossrefs import cross_check
from tests.k8s.manifests import Obj, Problem, where


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    cel_rules_evaluated: int = 0
    cel_rules_skipped: list[str] = field(default_factory=list)

    @property
    def codes(self) -> set[str]:
        return {p.code for p in self.problems}

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems) or "no problem"


def check_manifests(objects: list[Obj], crds: CrdSchemas, *, workers_included: bool = False) -> Report:
    report = Report()
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            report.problems.append(Problem("ref", where(obj), "defined twice"))
        seen.add(key)
        if crds.knows(obj):
            result = crds.validate(obj)
            report.problems += [
                Problem(v.code, where(obj), f"{v.path}: {v.message}") for v in result.violations
            ]
            report.cel_rules_evaluated += result.evaluated_rules
            report.cel_rules_skipped += [f"{where(obj)} {s}" for s in result.skipped_rules]
        elif is_builtin(obj):
            report.problems += [Problem("schema.builtin", where(obj), e) for e in validate_builtin(obj)]
        else:
            report.problems.append(Problem("crd.unknown-kind", where(obj), f"no CRD for {obj['apiVersion']}"))
    if not any(p.code.startswith(("schema.", "crd.")) for p in report.problems):
        report.problems += cross_check(objects, workers_included=workers_included)
    return report
