"""aic's decay at its edges (issue 19's mutation testing of router/aic.py): a one-token prefill, a
duration under a millisecond, an anchor later than time 0, the wait a new prefill is predicted."""

from __future__ import annotations

from extproc.router.aic import OldestPrefillDecay, admission_estimate, decayed_tokens


def test_a_one_token_prefill_is_active_and_decays() -> None:
    decay = OldestPrefillDecay()
    assert decay.add("r", 1, 10.0, now_ms=0.0)
    assert decay.active_tokens(0.0) == 1 and decay.full_tokens == 1
    assert decay.active_tokens(10.0) == 0


def test_a_duration_under_a_millisecond_still_decays_from_the_full_prompt() -> None:
    assert decayed_tokens(100, 0.5, 0.0) == 100
    assert decayed_tokens(100, 0.5, 0.25) == 50
    assert decayed_tokens(100, 0.5, 0.5) == 0
    assert decayed_tokens(100, 0.0, 0.0) == 0


def test_time_ahead_counts_from_the_anchor_not_from_zero() -> None:
    decay = OldestPrefillDecay()
    decay.add("a", 100, 40.0, now_ms=1000.0)
    decay.add("b", 100, 60.0, now_ms=1005.0)
    assert decay.remaining_ms(1000.0) == 100.0
    assert decay.remaining_ms(1030.0) == 70.0
    assert decay.active_tokens(1030.0) == 100 + 25  # the oldest a quarter left, the other in full


def test_a_new_prefill_is_predicted_to_wait_for_the_time_ahead_of_it() -> None:
    decay = OldestPrefillDecay()
    decay.add("a", 100, 40.0, now_ms=0.0)
    guess = admission_estimate(decay, own_ms=25.0, tokens=50, now_ms=10.0)
    assert (guess.ttft_ms, guess.prefill_ms, guess.uncached_tokens) == (55.0, 25.0, 50)
    assert guess.wait_ms == 30.0
    alone = admission_estimate(None, own_ms=25.0, tokens=50, now_ms=10.0)
    assert alone.ttft_ms == 25.0 and alone.wait_ms == 0.0
    late = admission_estimate(decay, own_ms=25.0, tokens=50, now_ms=100.0)  # the time ahead ran out
    assert late.ttft_ms == 25.0
