"""The per-request histograms' arithmetic (`PickMetrics`): what is observed, and when nothing is.
End to end through Envoy: tests/e2e/test_output_blocks_e2e.py."""

from __future__ import annotations

import pytest

from extproc.picker.metrics import PickMetrics

M = "m"


def observed(metrics: PickMetrics, name: str) -> tuple[int, float]:
    counts, total = getattr(metrics, name).series.get((M,), ([], [0.0]))
    return sum(counts), total[0]


def test_a_routed_request_with_tokens_gives_its_length_and_its_hit_rate():
    metrics = PickMetrics()
    metrics.routed(M, overlap=3, best=4, prompt_tokens=70, blocks=4)
    assert observed(metrics, "input_tokens") == (1, 70)
    assert observed(metrics, "kv_hit_rate") == (1, 0.75)


def test_a_request_routed_on_load_only_gives_neither():
    metrics = PickMetrics()
    metrics.routed(M, overlap=0, best=0)
    assert observed(metrics, "input_tokens") == (0, 0) and observed(metrics, "kv_hit_rate") == (0, 0)


@pytest.mark.parametrize(
    ("tokens", "decode_s", "itl"),
    [(11, 0.5, (1, 0.05)), (1, 0.5, (0, 0)), (0, None, (0, 0)), (40, None, (0, 0))],
)
def test_an_answers_gaps_are_its_decode_time_over_the_tokens_after_the_first(tokens, decode_s, itl):
    metrics = PickMetrics()
    metrics.answered(M, tokens, decode_s)
    assert observed(metrics, "output_tokens") == (1, tokens)
    count, total = observed(metrics, "itl")
    assert (count, pytest.approx(total)) == itl
