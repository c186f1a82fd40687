"""ActiveSequences: prefill tokens until prefill completes, decode blocks with and without reuse."""

import pytest

from extproc.router import ActiveSequences, Worker
from extproc.router.pass_time import WINDOW_SAMPLES
from extproc.router.prefill_model import PrefillTiming, estimate

from .clock import FakeClock

W = Worker("w")
B = 16


def test_prefill_tokens_count_uncached_tokens_until_prefill_completes():
    seqs = ActiveSequences(B)
    seqs.add_request("r1", W, [1, 2, 3, 4], isl=70, overlap_blocks=2)
    assert seqs.prefill_tokens(W) == 70 - 2 * B
    assert seqs.mark_prefill_complete("r1")
    assert seqs.prefill_tokens(W) == 0
    assert not seqs.mark_prefill_complete("r1")  # idempotent
    assert seqs.decode_blocks(W) == 5  # 4 full blocks + the partial tail


@pytest.mark.parametrize(("assume_kv_reuse", "expected"), [(True, 4 + 1), (False, 4 + 4)])
def test_shared_blocks_count_once_only_when_kv_reuse_is_assumed(assume_kv_reuse, expected):
    seqs = ActiveSequences(B, assume_kv_reuse=assume_kv_reuse)
    seqs.add_request("a", W, [1, 2, 3, 4], isl=64, overlap_blocks=0)
    assert seqs.new_blocks(W, [1, 2, 3, 4, 5], isl=80) == (1 if assume_kv_reuse else 5)
    seqs.add_request("b", W, [1, 2, 3, 4, 5], isl=80, overlap_blocks=4)
    assert seqs.decode_blocks(W) == expected + (0 if assume_kv_reuse else 1)
    seqs.free("a")
    assert seqs.decode_blocks(W) == 5


def test_free_is_idempotent_and_returns_every_counter_to_zero():
    seqs = ActiveSequences(B, track_output_blocks=True)
    seqs.add_request("a", W, [1, 2], isl=40, overlap_blocks=1, expected_output_tokens=100)
    seqs.add_request("b", W, [1, 2, 3], isl=50, overlap_blocks=0)
    assert not seqs.add_request("a", W, [9], isl=16, overlap_blocks=0)  # duplicate id ignored
    seqs.add_output_tokens("a", 40)
    seqs.mark_prefill_complete("b")
    assert seqs.free("a") and seqs.free("b")
    assert not seqs.free("a")
    assert seqs.is_idle()
    assert seqs.prefill_tokens(W) == 0 and seqs.decode_blocks(W) == 0


def test_output_blocks_grow_with_output_and_decay_toward_the_expected_length():
    seqs = ActiveSequences(B, track_output_blocks=True)
    seqs.add_request("a", W, [1], isl=16, overlap_blocks=0, expected_output_tokens=64)
    seqs.add_output_tokens("a", 16)  # one placeholder block, progress 1/4
    assert seqs.decode_blocks(W) == pytest.approx(1 + 1 * 0.75)
    seqs.add_output_tokens("a", 32)  # three blocks, progress 3/4
    assert seqs.decode_blocks(W) == pytest.approx(1 + 3 * 0.25)
    seqs.add_output_tokens("a", 16)  # done: weight 0
    assert seqs.decode_blocks(W) == pytest.approx(1)


def test_output_blocks_are_ignored_unless_tracked():
    seqs = ActiveSequences(B)
    seqs.add_request("a", W, [1], isl=16, overlap_blocks=0)
    seqs.add_output_tokens("a", 64)
    assert seqs.decode_blocks(W) == 1


def test_switches_turn_off_block_and_prefill_tracking():
    seqs = ActiveSequences(B, track_active_blocks=False, track_prefill_tokens=False)
    seqs.add_request("a", W, [1, 2, 3], isl=50, overlap_blocks=0)
    assert seqs.decode_blocks(W) == 0
    assert seqs.prefill_tokens(W) == 0
    assert seqs.new_blocks(W, [1, 2, 3], 50) == 0
    assert seqs.num_requests(W) == 1


def test_new_blocks_finds_the_active_prefix_of_a_request_across_several_requests():
    seqs = ActiveSequences(B)
    seqs.add_request("a", W, [1, 2, 3], isl=48, overlap_blocks=0)
    seqs.add_request("b", W, [1, 2, 9], isl=48, overlap_blocks=0)
    assert seqs.new_blocks(W, [1, 2, 9, 10], isl=64) == 1
    assert seqs.new_blocks(W, [1, 2, 3, 4, 5], isl=80) == 2
    assert seqs.new_blocks(W, [7, 8], isl=40) == 3  # 2 full blocks + the partial tail
    seqs.free("b")
    assert seqs.new_blocks(W, [1, 2, 9, 10], isl=64) == 2


# --- what the counters must say after each kind of event (issue 19's surviving mutants) ----------


def test_a_tracked_request_is_known_with_its_worker_until_freed():
    seqs = ActiveSequences(B)
    assert "r" not in seqs and seqs.worker_of("r") is None
    assert seqs.add_request("r", W, [1], isl=20, overlap_blocks=0) is True
    assert "r" in seqs and seqs.worker_of("r") == W and len(seqs) == 1
    seqs.free("r")
    assert "r" not in seqs and seqs.worker_of("r") is None


def test_prefill_tokens_of_several_requests_add_up_and_leave_with_each():
    seqs = ActiveSequences(B)
    seqs.add_request("a", W, [1, 2], isl=40, overlap_blocks=0)  # 40 uncached
    seqs.add_request("b", W, [3], isl=20, overlap_blocks=0)  # 20
    seqs.add_request("c", W, [4, 5, 6], isl=50, overlap_blocks=1)  # 34
    assert seqs.prefill_tokens(W) == 94
    seqs.free("b")
    assert seqs.prefill_tokens(W) == 74
    assert seqs.mark_prefill_complete("a")
    assert seqs.prefill_tokens(W) == 34
    seqs.free("a")  # prefilled already: nothing more leaves
    assert seqs.prefill_tokens(W) == 34


def test_a_fully_cached_prompt_adds_no_prefill_tokens():
    seqs = ActiveSequences(B)
    seqs.add_request("a", W, [1, 2], isl=32, overlap_blocks=2)
    assert seqs.prefill_tokens(W) == 0 and seqs.num_requests(W) == 1


def test_an_idle_worker_takes_every_block_of_a_request_and_its_partial_tail():
    seqs = ActiveSequences(B)
    assert seqs.new_blocks(W, [1, 2, 3, 4], isl=69) == 5
    assert seqs.potential(W, [1, 2, 3, 4], isl=69) == (0, 5.0)
    assert seqs.new_blocks(W, [1, 2, 3, 4], isl=64) == 4


def test_shared_blocks_stay_until_their_last_request_leaves():
    seqs = ActiveSequences(B)
    seqs.add_request("a", W, [1, 2, 3], isl=48, overlap_blocks=0)
    seqs.add_request("b", W, [1, 2, 3], isl=48, overlap_blocks=0)
    seqs.add_request("c", W, [1, 2, 3], isl=48, overlap_blocks=0)
    seqs.add_request("d", W, [7], isl=16, overlap_blocks=0)
    assert seqs.decode_blocks(W) == 4
    seqs.free("a")
    seqs.free("b")
    assert seqs.decode_blocks(W) == 4  # c still holds 1, 2, 3
    seqs.free("c")
    assert seqs.decode_blocks(W) == 1
    assert seqs.new_blocks(W, [1, 2, 3], isl=48) == 3


def test_output_blocks_count_whole_blocks_only_even_token_by_token():
    seqs = ActiveSequences(B, track_output_blocks=True)
    seqs.add_request("a", W, [], isl=10, overlap_blocks=0)  # one partial block
    seqs.add_request("b", W, [5], isl=16, overlap_blocks=0)
    assert seqs.decode_blocks(W) == 2
    for _ in range(5):  # 15 tokens: the first block is not full yet
        seqs.add_output_tokens("a", 1)
    assert seqs.decode_blocks(W) == 2
    seqs.add_output_tokens("a", 1)  # 16: a placeholder block
    assert seqs.decode_blocks(W) == 3
    seqs.add_output_tokens("a", 0)
    seqs.add_output_tokens("a", -7)  # nothing negative ever counts
    assert seqs.decode_blocks(W) == 3
    seqs.free("a")  # its tail and its output block leave, b's block stays
    assert seqs.decode_blocks(W) == 1


def test_prefill_tokens_stay_exact_when_a_prefilled_request_leaves_after_others_came():
    seqs = ActiveSequences(B)
    seqs.add_request("a", W, [1], isl=20, overlap_blocks=0)
    seqs.add_request("b", W, [2], isl=30, overlap_blocks=0)
    seqs.mark_prefill_complete("a")
    seqs.free("a")
    assert seqs.prefill_tokens(W) == 30
    seqs.free("b")
    assert seqs.prefill_tokens(W) == 0 and seqs.is_idle()


# --- the timing prefill load model: what it is given -------------------------------------------

T = PrefillTiming(kv_capacity_tokens=16_000)  # small, so that decode blocks move the KV usage


def timed(**kwargs):
    """The timing model with the configured pass time (learning it is tests/router/test_pass_time.py's)."""
    kwargs.setdefault("learn_prefill_timing", False)
    clock = FakeClock()
    return ActiveSequences(B, prefill_load_model="timing", prefill_timing=T, clock=clock, **kwargs), clock


def tokens_of(ms: float) -> int:
    """A predicted time to first token as `potential_load` reports it."""
    return round(ms / T.ms_per_token)


def idle_ttft(seqs: ActiveSequences, uncached: int, *, decoding: bool) -> int:
    """What a worker without prompt work predicts, decoding or not, at its current KV usage."""
    usage = seqs.decode_blocks(W) * B / T.kv_capacity_tokens
    return tokens_of(estimate(T, None, uncached, decoding=decoding, kv_usage=usage, now_ms=0.0).ttft_ms)


FRESH = [900, 901, 902, 903]  # blocks no request holds: 64 uncached tokens


def test_timing_a_fully_cached_prompt_still_computes_its_last_block_or_token():
    seqs, _ = timed()
    one_block = seqs.potential_load(W, [1], isl=16, overlap_blocks=1)
    assert one_block.prefill_tokens == tokens_of(T.prompt_ms(16))
    assert one_block.overlap_blocks == 1
    six_blocks = seqs.potential_load(W, [1, 2, 3, 4, 5, 6], isl=96, overlap_blocks=6)
    assert six_blocks.prefill_tokens == tokens_of(T.prompt_ms(16))
    and_a_token = seqs.potential_load(W, [1, 2, 3, 4, 5, 6], isl=97, overlap_blocks=6)
    assert and_a_token.prefill_tokens == tokens_of(T.prompt_ms(1))


def test_timing_without_block_tracking_nothing_counts_as_cached_in_flight():
    seqs, _ = timed(track_active_blocks=False)
    load = seqs.potential_load(W, [1, 2, 3, 4, 5], isl=80, overlap_blocks=0)
    assert load.prefill_tokens == tokens_of(T.prompt_ms(80))


def test_timing_blocks_in_flight_count_as_cached_as_far_as_they_reach():
    seqs, _ = timed()
    seqs.add_request("a", W, [1, 2], isl=32, overlap_blocks=0)
    # 2 of the 4 full blocks are in flight, the tail is new: 69 - 32 = 37 tokens after a's pass
    load = seqs.potential_load(W, [1, 2, 3, 4], isl=69, overlap_blocks=0)
    assert load.prefill_tokens == tokens_of(T.prefill_ms(32) + T.prefill_ms(37))


def test_timing_requests_on_one_worker_queue_in_one_stream():
    seqs, _ = timed()
    seqs.add_request("a", W, [1, 2, 3, 4], isl=64, overlap_blocks=0)
    seqs.add_request("b", W, [1, 2, 3, 4, 5], isl=80, overlap_blocks=0)  # a's 4 blocks in flight
    assert seqs.prefill_tokens(W) == 64 + 16
    seqs.add_request("c", W, [50], isl=16, overlap_blocks=0)
    assert seqs.prefill_tokens(W) == 96


def test_timing_a_first_token_ends_the_requests_before_it_and_keeps_those_after():
    seqs, clock = timed()
    for rid, key in (("a", 1), ("b", 2), ("c", 3)):
        seqs.add_request(rid, W, [key], isl=1000, overlap_blocks=0)
    clock.advance(0.001)
    assert seqs.mark_prefill_complete("b")  # FIFO: a's prompt was done before b's
    assert seqs.prefill_tokens(W) == 1000  # c's, re-anchored now
    assert seqs.free("c")  # cancelled before its first token: its tokens leave
    assert seqs.prefill_tokens(W) == 0
    assert seqs.potential_load(W, FRESH, isl=64, overlap_blocks=0).prefill_tokens == idle_ttft(
        seqs, 64, decoding=True
    )


def test_timing_cancelling_a_request_leaves_the_ones_before_it_queued():
    seqs, _ = timed()
    seqs.add_request("a", W, [1], isl=1000, overlap_blocks=0)
    seqs.add_request("b", W, [2], isl=500, overlap_blocks=0)
    assert seqs.free("b")
    assert seqs.prefill_tokens(W) == 1000
    assert seqs.potential_load(W, FRESH, isl=64, overlap_blocks=0).prefill_tokens == tokens_of(
        T.prefill_ms(1000) + T.prefill_ms(64)
    )


def test_timing_a_worker_pays_the_decode_part_exactly_while_it_decodes():
    seqs, clock = timed()
    keys = list(range(100, 164))  # 64 blocks
    seqs.add_request("a", W, keys, isl=1024, overlap_blocks=0)
    clock.advance(1.0)  # a's prompt is done as predicted, its first token not back: not decoding
    assert seqs.prefill_tokens(W) == 0
    load = seqs.potential_load(W, FRESH, isl=64, overlap_blocks=0)
    assert load.prefill_tokens == idle_ttft(seqs, 64, decoding=False)
    seqs.mark_prefill_complete("a")  # decoding now, at a's KV usage (64 x 16 of 16,000 tokens)
    assert seqs.potential_load(W, FRESH, isl=64, overlap_blocks=0).prefill_tokens == idle_ttft(
        seqs, 64, decoding=True
    )
    # b routed now pays the decode part in each pass of its stream, after half a pass on average
    seqs.add_request("b", W, [200], isl=64, overlap_blocks=0)
    d = T.decode_ms(64 * B / T.kv_capacity_tokens)
    assert seqs.potential_load(W, FRESH, isl=64, overlap_blocks=0).prefill_tokens == tokens_of(
        d / 2 + T.prompt_ms(128, d)
    )
    clock.advance(1.0)
    seqs.free("a")  # b has not decoded yet: the worker does not decode any more
    assert seqs.potential_load(W, FRESH, isl=64, overlap_blocks=0).prefill_tokens == idle_ttft(
        seqs, 64, decoding=False
    )
    seqs.mark_prefill_complete("b")
    seqs.add_request("c", W, [300], isl=64, overlap_blocks=0)
    seqs.mark_prefill_complete("c")
    seqs.free("b")  # c still decodes
    assert seqs.potential_load(W, FRESH, isl=64, overlap_blocks=0).prefill_tokens == idle_ttft(
        seqs, 64, decoding=True
    )
    seqs.free("c")
    assert seqs.is_idle()


# --- the timing model's reads and what it learned -----------------------------------------------


def test_without_block_tracking_a_request_adds_no_blocks():
    seqs = ActiveSequences(B, track_active_blocks=False)
    assert seqs.new_blocks(W, [1, 2, 3], isl=40) == 0
    seqs.add_request("a", W, [1, 2, 3], isl=40, overlap_blocks=0)
    assert seqs.potential(W, [4, 5], isl=32) == (40, 0.0)


def test_timed_potential_reads_the_prefill_tokens_left_now():
    seqs, clock = timed()
    seqs.add_request("a", W, [1], isl=1000, overlap_blocks=0)
    clock.advance(T.prompt_ms(1000) / 2000.0)  # about half of its prompt computed
    left = seqs.prefill_tokens(W)
    assert 0 < left < 1000
    assert seqs.potential(W, FRESH, isl=64)[0] == left


def learned_twice_as_slow(seqs: ActiveSequences, clock: FakeClock) -> None:
    """One prompt at a time on an idle worker, each taking twice the configured model's time."""
    for i in range(48):
        seqs.add_request(f"l{i}", W, [], isl=4000, overlap_blocks=0)
        clock.advance(2 * seqs.prefill_timing.prompt_ms(4000) / 1000.0)
        seqs.mark_prefill_complete(f"l{i}")
        seqs.free(f"l{i}")
        clock.advance(1.0)


def test_a_new_stream_is_predicted_at_the_workers_learned_speed():
    seqs, clock = timed(learn_prefill_timing=True)
    learned_twice_as_slow(seqs, clock)
    seqs.add_request("a", W, [], isl=4000, overlap_blocks=0)
    clock.advance(seqs.prefill_timing.prompt_ms(4000) / 1000.0)  # the configured model's whole prompt
    assert seqs.prefill_tokens(W) > 1000  # at half speed about half is left


def test_a_first_token_retimes_the_prompts_still_queued():
    """The first token that makes the worker's slowness significant (the ones before it were
    within the noise the configured model allows) retimes the prompt queued behind it."""

    def warm(seqs: ActiveSequences, clock: FakeClock, n: int) -> None:  # n first tokens, twice as slow
        for k in range(n):
            seqs.add_request(f"warm{k}", W, [100 + k], isl=4000, overlap_blocks=0)
            clock.advance(2 * T.prompt_ms(4000) / 1000.0)
            seqs.mark_prefill_complete(f"warm{k}")
            seqs.free(f"warm{k}")

    probe, probe_clock = timed(learn_prefill_timing=True)

    def moves() -> bool:  # one more slow first token: does the model move now?
        warm(probe, probe_clock, 1)
        return probe.learned_pass_time(W).scale != 1.0  # type: ignore[union-attr]

    quiet = next((n for n in range(WINDOW_SAMPLES) if moves()), None)  # first tokens absorbed
    assert quiet is not None, f"{WINDOW_SAMPLES} first tokens twice as slow never moved the model"

    def left_of_b(learn: bool) -> int:
        seqs, clock = timed(learn_prefill_timing=learn)
        warm(seqs, clock, quiet)
        assert learn is False or seqs.learned_pass_time(W).scale == 1.0  # type: ignore[union-attr]
        seqs.add_request("a", W, [1], isl=4000, overlap_blocks=0)
        seqs.add_request("b", W, [2], isl=4000, overlap_blocks=0)
        clock.advance(2 * T.prompt_ms(4000) / 1000.0)  # a took twice the predicted time
        assert seqs.mark_prefill_complete("a")
        clock.advance(0.8 * T.prompt_ms(4000) / 1000.0)
        return seqs.prefill_tokens(W)

    assert left_of_b(True) > left_of_b(False) > 0


def test_a_first_token_at_the_routing_instant_teaches_nothing_and_breaks_nothing():
    seqs, _ = timed(learn_prefill_timing=True)
    seqs.add_request("a", W, [1], isl=1000, overlap_blocks=0)
    seqs.add_request("b", W, [2], isl=1000, overlap_blocks=0)
    assert seqs.mark_prefill_complete("a")  # no time passed: not a measurement
    assert seqs.learned_pass_time(W) is None
    assert seqs.prefill_tokens(W) == 1000


def test_without_learning_a_timed_first_token_still_ends_the_prompt():
    seqs, clock = timed(learn_prefill_timing=False)
    seqs.add_request("a", W, [1], isl=1000, overlap_blocks=0)
    clock.advance(0.01)
    assert seqs.mark_prefill_complete("a") and seqs.prefill_tokens(W) == 0
