"""The time to first token a router predicted for each request when it added it (the timing and aic
prefill models), kept for the picker's `inference_objective_request_predicted_ttft_seconds`: what
was predicted, learned from or not, for as long as the request is tracked."""

from __future__ import annotations

import pytest

from extproc.router.prefill_model import estimate
from extproc.router.sequences import ActiveSequences

from .clock import FakeClock
from .test_aic import aic_sequences
from .test_sequences import B, T, W, timed


def test_the_timing_model_keeps_each_requests_prediction_waits_included() -> None:
    seqs, clock = timed()
    seqs.add_request("a", W, [], isl=1000, overlap_blocks=0)
    alone = estimate(T, None, 1000, decoding=False, kv_usage=0.0, now_ms=0.0).ttft_ms
    assert seqs.predicted_ttft_ms("a") == pytest.approx(alone)
    seqs.add_request("b", W, [], isl=1000, overlap_blocks=0)  # behind a's prompt on the same worker
    behind = seqs.predicted_ttft_ms("b")
    assert behind is not None and behind > alone
    clock.advance(1.0)
    assert seqs.predicted_ttft_ms("a") == pytest.approx(alone)  # as predicted then, not now
    assert seqs.mark_prefill_complete("a") and seqs.predicted_ttft_ms("a") == pytest.approx(alone)
    assert seqs.free("a")
    assert seqs.predicted_ttft_ms("a") is None and seqs.predicted_ttft_ms("never-added") is None


def test_a_prediction_is_kept_whether_or_not_it_is_learned_from() -> None:
    seqs, _ = timed(learn_prefill_timing=True)
    seqs.add_request("mine", W, [], isl=1000, overlap_blocks=0)
    seqs.add_request("another-replicas", W, [], isl=1000, overlap_blocks=0, learn=False)
    assert seqs.predicted_ttft_ms("mine") is not None
    assert seqs.predicted_ttft_ms("another-replicas") is not None


def test_the_aic_model_predicts_its_decayed_queue_and_dynamos_static_count_nothing() -> None:
    clock = FakeClock()
    seqs = aic_sequences(clock)
    seqs.add_request("a", W, [], isl=1000, overlap_blocks=0)  # 1000 uncached tokens: 100 ms
    seqs.add_request("b", W, [], isl=400, overlap_blocks=0)  # 40 ms, behind a
    assert seqs.predicted_ttft_ms("a") == pytest.approx(100.0)
    assert seqs.predicted_ttft_ms("b") == pytest.approx(140.0)
    static = ActiveSequences(B, prefill_load_model="none")
    static.add_request("a", W, [], isl=1000, overlap_blocks=0)
    assert static.predicted_ttft_ms("a") is None


def test_aic_predicts_only_a_prompt_with_tokens_to_compute() -> None:
    seqs = aic_sequences(FakeClock())
    seqs.add_request("cached", W, [1, 2], isl=32, overlap_blocks=2)  # nothing to compute: no prefill
    seqs.add_request("one-token", W, [1, 2], isl=33, overlap_blocks=2)  # its last token to compute
    assert seqs.predicted_ttft_ms("cached") is None
    assert seqs.predicted_ttft_ms("one-token") is not None
