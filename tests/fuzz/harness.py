"""What a fuzz target is, and how the CI tests and `benchmarks/fuzz.py` run one.

A target promises: whatever `generate` makes, `check` either reports what happened (a mapping of
outcome -> count, e.g. {"decoded": 1} or {"rejected": 2}) or raises. An `AssertionError` is a
broken promise the check saw (a wrong error class, a leaked request, a tree that does not rebuild
from its dump); any other exception escaped the code under test. Both are bugs.

`session()` opens what the checks need (an event loop, a picker, a server) once per run; the
checks of one session share it, so state leaked by one input shows up in the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

Outcome = Mapping[str, int]
Check = Callable[[Any], Outcome]
DECODED: Outcome = {"decoded": 1}
REJECTED: Outcome = {"rejected": 1}

EXAMPLES_ENV = "EXTPROC_FUZZ_EXAMPLES"
CI_EXAMPLES = 300
SHRINKING_SHARE = 0.2  # of the CI examples, those drawn through hypothesis's shrinkable random


@dataclass(frozen=True)
class Target:
    """One decoder under fuzz: how to make an input and how to check what it does with it."""

    name: str
    generate: Callable[[random.Random], Any]
    session: Callable[[], contextlib.AbstractContextManager[Check]]
    describe: Callable[[Any], str] = repr


def sync_session(check: Check) -> Callable[[], contextlib.AbstractContextManager[Check]]:
    """A session for a check that needs nothing set up."""

    @contextlib.contextmanager
    def session() -> Iterator[Check]:
        yield check

    return session


def tally(outcomes: list[str]) -> Outcome:
    return Counter(outcomes)


def examples() -> int:
    """Inputs per target in the CI tests: `EXTPROC_FUZZ_EXAMPLES`, default `CI_EXAMPLES`."""
    return int(os.environ.get(EXAMPLES_ENV, CI_EXAMPLES))


def fuzz_settings(share: float = 1.0) -> settings:
    """Hypothesis settings of the CI fuzz tests: derandomized (the same inputs every run), no database.

    Each target has two tests: one draws seeds for `random.Random` (fast: hundreds of inputs in a
    second; a failure names its seed), one passes `st.randoms(use_true_random=False)`, slower by
    each random call but shrinkable to a small failing input; it runs `share` of the examples.
    """
    return settings(
        max_examples=max(1, int(examples() * share)),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def input_rng(target: str, seed: int, index: int) -> random.Random:
    """The generator of input `index` of a run: the same input for the same (target, seed, index)."""
    return random.Random(f"{target}:{seed}:{index}")


def session_fixture(target: Target) -> Any:
    """A module-scoped pytest fixture `check`: the target's session, opened once for its tests."""

    @pytest.fixture(scope="module")
    def check() -> Iterator[Check]:
        with target.session() as check:
            yield check

    return check


class LoopRunner:
    """One event loop for a session of async checks (hypothesis calls checks synchronously)."""

    def __init__(self) -> None:
        self._runner = asyncio.Runner()

    def run(self, coro: Any) -> Any:
        return self._runner.run(coro)

    def close(self) -> None:
        self._runner.close()
