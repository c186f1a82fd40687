"""aic's decay at its edges (issue 19's mutation testing of router/aic.py and sequences.py): a
one-token prefill, a duration under a millisecond, an anchor later than time 0, the wait a new prefill
is predicted; and what aic learns per worker from first tokens."""

from __future__ import annotations

import pytest

from extproc.router import ActiveSequences, Worker
from extproc.router.aic import OldestPrefillDecay, admission_estimate, decayed_tokens
from extproc.router.prefill_model import PrefillTiming

from .clock import FakeClock


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


# --- aic learns each worker's pass time from its own first tokens ---------------------------------

T = PrefillTiming(kv_capacity_tokens=16_000)
SLOW, FAST = Worker("slow"), Worker("fast")


def aic_sequences() -> tuple[ActiveSequences, FakeClock]:
    clock = FakeClock(5.0)  # routed after time 0: an observed time is the first token's less the routing's
    seqs = ActiveSequences(
        16, prefill_load_model="aic", prefill_timing=T, clock=clock, learn_prefill_timing=True
    )
    return seqs, clock


def test_each_worker_learns_from_its_own_first_token_measured_from_its_routing() -> None:
    seqs, clock = aic_sequences()
    own_s = T.prompt_ms(4000) / 1000.0
    seqs.add_request("s", SLOW, [], isl=4000, overlap_blocks=0)
    seqs.add_request("f", FAST, [], isl=4000, overlap_blocks=0)
    clock.advance(own_s)
    assert seqs.mark_prefill_complete("f")  # as predicted
    clock.advance(own_s)
    assert seqs.mark_prefill_complete("s")  # twice the predicted time
    slow, fast = seqs.learned_pass_time(SLOW), seqs.learned_pass_time(FAST)
    assert slow is not None and fast is not None
    assert slow.samples == fast.samples == 1
    assert slow.last_ratio == pytest.approx(2.0) and fast.last_ratio == pytest.approx(1.0)


def test_a_prefill_admitted_behind_another_is_predicted_to_wait_for_it() -> None:
    seqs, clock = aic_sequences()
    own_s = T.prompt_ms(4000) / 1000.0
    seqs.add_request("a", SLOW, [], isl=4000, overlap_blocks=0)
    seqs.add_request("b", SLOW, [], isl=4000, overlap_blocks=0)  # predicted: a's time ahead, then its own
    clock.advance(own_s)
    seqs.mark_prefill_complete("a")
    clock.advance(own_s)
    seqs.mark_prefill_complete("b")
    learned = seqs.learned_pass_time(SLOW)
    assert learned is not None and learned.samples == 2
    assert learned.last_ratio == pytest.approx(1.0)  # b came when predicted: after a, then its own prompt


def test_a_worker_learned_slow_decays_its_new_prefills_more_slowly_than_a_fast_one() -> None:
    seqs, clock = aic_sequences()
    own_s = T.prompt_ms(4000) / 1000.0
    for i in range(24):
        seqs.add_request(f"s{i}", SLOW, [], isl=4000, overlap_blocks=0)
        seqs.add_request(f"f{i}", FAST, [], isl=4000, overlap_blocks=0)
        clock.advance(own_s)
        seqs.mark_prefill_complete(f"f{i}")
        clock.advance(own_s)
        seqs.mark_prefill_complete(f"s{i}")
        seqs.free(f"s{i}")
        seqs.free(f"f{i}")
        clock.advance(1.0)
    seqs.add_request("s", SLOW, [], isl=4000, overlap_blocks=0)
    seqs.add_request("f", FAST, [], isl=4000, overlap_blocks=0)
    clock.advance(0.9 * own_s)
    assert seqs.prefill_tokens(FAST) < 1000 < seqs.prefill_tokens(SLOW)
