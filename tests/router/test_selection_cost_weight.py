"""selection.cost_weight: under the timing model a weight of 0 keeps the cost the predicted time to
first token (no cache credit), the same number a weight of 1 gives a prompt nobody caches."""

from __future__ import annotations

import random

import pytest

from extproc.router import KvRouter, RouterConfig, WorkerSpec

from .clock import FakeClock


def _cost(weight: float, model: str) -> float:
    r = KvRouter(
        RouterConfig(block_size=16, overlap_score_weight=weight, prefill_load_model=model),
        clock=FakeClock(),
        rng=random.Random(0),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    r.best_worker(list(range(3000)), request_id="load", pinned_worker="a")
    return r.best_worker(list(range(10_000, 12_000)), request_id="new").cost


def test_weight_zero_under_the_timing_model_costs_the_predicted_time():
    assert _cost(0.0, "timing") == pytest.approx(_cost(1.0, "timing"), rel=1e-12)
    assert _cost(1.0, "timing") > 0


def test_weight_zero_under_dynamos_cost_drops_the_prefill_term():
    assert _cost(0.0, "none") < _cost(1.0, "none")
