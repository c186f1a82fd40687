"""The fuzz target registry: every target module is listed, and a seeded input is reproducible."""

from __future__ import annotations

from pathlib import Path

from tests.fuzz.harness import input_rng
from tests.fuzz.targets import TARGET_MODULES, load


def test_every_fuzz_module_is_registered_under_its_targets_name():
    modules = {f"tests.fuzz.{p.stem}" for p in Path(__file__).parent.glob("test_*_fuzz.py")}
    assert modules == set(TARGET_MODULES.values())
    for name in TARGET_MODULES:
        assert load(name).name == name


def test_an_input_is_the_same_for_the_same_target_seed_and_index():
    target = load("request")
    first = target.generate(input_rng("request", 0, 7))
    assert target.generate(input_rng("request", 0, 7)) == first
    assert target.generate(input_rng("request", 1, 7)) != first
