"""Fuzz the Inference Extension resources file (`--inference-resources`), read at start and again
whenever it changes while the picker serves.

Promise (extproc/config/inference_extension.py): `parse_resources` returns `InferenceResources` or
raises `ConfigError` naming the problem, whatever the file holds; what it returns is usable: int32
priorities, rules whose targets have weights within the CRD's bounds, a rule for any model name
that is one of the file's, and a target drawn from the rule's own. Documents use the real kinds and
fields with values valid or hostile; some are mutated or not YAML at all.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from extproc.config.inference_extension import INT32, MAX_WEIGHT, InferenceResources, Pool, parse_resources
from extproc.config.options import ConfigError
from extproc.picker.inference_extension import pick_target
from tests.fuzz.gen import chance, json_value, mutate, pick, text
from tests.fuzz.harness import (
    DECODED,
    REJECTED,
    SHRINKING_SHARE,
    Check,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
)

API = "inference.networking.x-k8s.io/v1alpha2"
KINDS = (
    "InferenceObjective",
    "InferenceModelRewrite",
    "InferencePool",
    "InferenceModel",
    "List",
    "ConfigMap",
)
WORDS = ("pool", "other", "m", "a", "b", "Exact", "Prefix", "2026-11-20T10:00:00Z", "-1", "1e3", ".inf")
MODELS = ("m", "a", "b", "base", "")
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _dump(doc: Any) -> str:
    try:
        return yaml.dump(doc, Dumper=_DUMPER)
    except UnicodeEncodeError:  # a lone surrogate: libyaml cannot write it, PyYAML's own emitter escapes it
        return yaml.safe_dump(doc)


class _Resources:
    def __init__(self, r: random.Random, hostility: float) -> None:
        self.r = r
        self.hostility = hostility

    def value(self, good: Any) -> Any:
        if not chance(self.r, self.hostility):
            return good
        return pick(
            self.r, (None, 0, -1, 2**31, True, 1.5, "", "x" * 300, [], {}, json_value(self.r, WORDS, 2))
        )

    def target(self) -> Any:
        target: dict[str, Any] = {"modelRewrite": self.value(pick(self.r, MODELS[:4]))}
        if chance(self.r, 0.6):
            target["weight"] = self.value(self.r.choice((1, 10, 90, MAX_WEIGHT, 0, MAX_WEIGHT + 1)))
        return self.value(target)

    def rule(self) -> Any:
        r, rule = self.r, {}
        if chance(r, 0.7):
            rule["matches"] = self.value(
                [
                    {"model": self.value({"value": self.value(pick(r, MODELS)), "type": self.value("Exact")})}
                    for _ in range(r.randint(0, 2))
                ]
            )
        if chance(r, 0.9):
            rule["targets"] = self.value([self.target() for _ in range(r.randint(0, 3))])
        return self.value(rule)

    def resource(self, i: int) -> Any:
        r = self.r
        kind = pick(r, KINDS) if chance(r, 0.2) else pick(r, KINDS[:2])
        metadata: dict[str, Any] = {
            "name": self.value(pick(r, ("obj", "canary", "a.b", "Bad_Name")) + str(i))
        }
        if chance(r, 0.3):
            metadata["namespace"] = self.value(pick(r, ("default", "team")))
        if chance(r, 0.3):
            metadata["creationTimestamp"] = self.value(
                pick(r, ("2026-11-20T10:00:00Z", "2025-01-01T00:00:00+01:00"))
            )
        spec: dict[str, Any] = {"poolRef": self.value({"name": self.value(pick(r, ("pool", "other")))})}
        if kind == "InferenceObjective":
            spec["priority"] = self.value(r.randint(-5, 20))
        else:
            spec["rules"] = self.value([self.rule() for _ in range(r.randint(0, 3))])
        doc = {
            "apiVersion": self.value(API),
            "kind": kind,
            "metadata": self.value(metadata),
            "spec": self.value(spec),
        }
        if kind == "List":
            return {"apiVersion": "v1", "kind": "List", "items": self.value([self.resource(i + 100)])}
        return doc


def generate(r: random.Random) -> str:
    roll = r.random()
    hostility = pick(r, (0.0, 0.02, 0.1, 0.3))
    docs = [_Resources(r, hostility).resource(i) for i in range(r.randint(0, 5))]
    dumped = "---\n".join(_dump(d) for d in docs)
    if roll < 0.85:
        return dumped
    if roll < 0.95:
        return mutate(r, dumped.encode(), (b":", b"-", b"[", b"{", b"&a", b"*a", b"!", b"\n")).decode(
            errors="replace"
        )
    return text(r)


@contextlib.contextmanager
def session() -> Iterator[Check]:
    def check(source: str) -> Outcome:
        pool = Pool("pool") if len(source) % 2 else Pool()
        try:
            resources = parse_resources(source, pool)
        except ConfigError as exc:
            assert str(exc)
            return REJECTED
        assert isinstance(resources, InferenceResources)
        assert all(INT32[0] <= p <= INT32[1] and type(p) is int for p in resources.priorities.values())
        rng = random.Random(len(source))
        for model in (*MODELS, "unlisted"):
            rule = resources.rewrite_rule(model)
            if rule is None:
                continue
            assert rule in resources.rewrites and (model in rule.models or not rule.models)
            assert all(0 <= t.weight <= MAX_WEIGHT and isinstance(t.model, str) for t in rule.targets)
            if rule.targets:
                assert pick_target(rule, rng) in {t.model for t in rule.targets}
        return DECODED

    yield check


TARGET = Target("inference_resources", generate, session, lambda source: repr(source)[:2000])
check_target = session_fixture(TARGET)


@fuzz_settings(0.5)
@given(seed=st.integers(min_value=0))
def test_resources_parse_or_raise_config_error(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE / 2)
@given(st.randoms(use_true_random=False))
def test_resources_parse_or_raise_config_error_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_files_reach_both_outcomes(check_target: Check) -> None:
    outcomes = [next(iter(check_target(generate(random.Random(i))))) for i in range(200)]
    assert 0.1 < outcomes.count("decoded") / len(outcomes) < 0.9
