"""The timing prefill load model: pass-time model, per-worker prompt stream, and routing in time."""

import random

import pytest

from extproc.router import (
    ActiveSequences,
    BlocksStored,
    InvalidConfig,
    KvRouter,
    RouterConfig,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
)
from extproc.router.prefill_model import PrefillTimeline, PrefillTiming, estimate
from extproc.sim import timing as engine_timing

from .clock import FakeClock

T = PrefillTiming()
W = Worker("w")


def p(tokens: int) -> float:
    return T.prefill_ms(tokens)


@pytest.mark.parametrize("tokens", [1, 64, 1000, 8192])
def test_default_prefill_polynomial_is_the_simulated_engines(tokens):
    assert T.prefill_ms(tokens) == pytest.approx(engine_timing.prefill_ms(tokens), rel=1e-12)


@pytest.mark.parametrize("usage", [0.0, 0.01, 0.5, 1.0])
def test_default_decode_polynomial_is_the_simulated_engines(usage):
    assert T.decode_ms(usage) == pytest.approx(engine_timing.decode_ms(usage), rel=1e-12)


def test_a_cold_40160_token_prompt_takes_828_29_ms_in_five_chunks():
    assert T.prompt_ms(40_160) == pytest.approx(828.29, abs=0.005)
    assert T.prompt_ms(40_160, decode_part_ms=7.0) == pytest.approx(828.29 + 5 * 7.0, abs=0.005)


def test_parse_takes_three_or_six_coefficients_and_names_bad_input():
    assert PrefillTiming.parse("1e-7,0.02,10") == PrefillTiming(1e-7, 0.02, 10.0)
    six = PrefillTiming.parse("0,0.01,5,-1,20,3")
    assert (six.decode_quadratic_ms, six.decode_linear_ms, six.decode_constant_ms) == (-1.0, 20.0, 3.0)
    for bad in ("1,2", "a,b,c", "1,2,3,4"):
        with pytest.raises(InvalidConfig, match="prefill_timing"):
            PrefillTiming.parse(bad)
    with pytest.raises(InvalidConfig, match="prefill_linear_ms"):
        PrefillTiming(prefill_linear_ms=0.0)
    with pytest.raises(InvalidConfig, match="max_num_batched_tokens"):
        PrefillTiming(max_num_batched_tokens=0)
    assert RouterConfig(prefill_timing="1e-7,0.02,10").prefill_timing.prefill_linear_ms == 0.02


def test_an_idle_worker_predicts_the_prompt_alone_and_half_a_pass_more_while_decoding():
    assert estimate(T, None, 5000, decoding=False, kv_usage=0.0, now_ms=0.0).ttft_ms == pytest.approx(p(5000))
    busy = estimate(T, None, 5000, decoding=True, kv_usage=0.1, now_ms=0.0)
    d = T.decode_ms(0.1)
    assert busy.ttft_ms == pytest.approx(d / 2 + p(5000) + d)
    assert busy.wait_ms == pytest.approx(d / 2)


def test_queued_prompts_share_passes_with_a_new_one():
    line = PrefillTimeline(T)
    line.add("a", 20_000, now_ms=0.0, decode_ms=0.0)
    # pass 1 (8,192 tokens) is in progress; b's 1,000 tokens pack behind a's other 11,808
    assert line.ttft_ms(1000, 0.0, 0.0) == pytest.approx(T.prompt_ms(21_000))
    assert line.remaining_tokens(0.0) == 20_000
    assert line.remaining_tokens(p(8192)) == 20_000 - 8192
    assert line.remaining_tokens(T.prompt_ms(20_000)) == 0  # done, as predicted


def test_a_request_arriving_mid_pass_waits_for_the_pass_end():
    line = PrefillTimeline(T)
    line.add("a", 1000, now_ms=0.0, decode_ms=0.0)
    half = p(1000) / 2
    assert line.ttft_ms(1000, half, 0.0) == pytest.approx(p(1000) - half + p(1000))
    assert 0 < line.remaining_tokens(half) < 1000


def test_a_first_token_reanchors_the_rest_of_the_stream():
    line = PrefillTimeline(T)
    line.add("a", 8192, now_ms=0.0, decode_ms=0.0)
    line.add("b", 4000, now_ms=0.0, decode_ms=0.0)
    late = p(8192) + 50.0  # a took longer than predicted
    assert line.complete("a", late)
    assert line.ttft_ms(100, late, 0.0) == pytest.approx(p(4000) + p(100))  # b's pass is in progress
    assert not line.complete("a", late)
    assert line.drop("b") and not line.drop("b")
    assert len(line) == 0 and line.remaining_tokens(late) == 0


def test_timing_model_needs_a_clock():
    with pytest.raises(ValueError, match="clock"):
        ActiveSequences(64, prefill_load_model="timing")


def test_prefill_tokens_decay_as_predicted_time_passes_and_drop_at_the_first_token():
    clock = FakeClock()
    seqs = ActiveSequences(64, prefill_load_model="timing", clock=clock)
    seqs.add_request("a", W, list(range(200)), isl=200 * 64, overlap_blocks=0)
    assert seqs.prefill_tokens(W) == 12_800
    clock.advance(p(8192) / 1000)  # one full pass later
    assert seqs.prefill_tokens(W) == 12_800 - 8192
    static = ActiveSequences(64)
    static.add_request("a", W, list(range(200)), isl=200 * 64, overlap_blocks=0)
    assert static.prefill_tokens(W) == 12_800  # `none`: static until the first token
    assert seqs.mark_prefill_complete("a") and seqs.prefill_tokens(W) == 0
    assert seqs.free("a") and seqs.is_idle()


def test_none_model_reports_dynamos_potential_load():
    seqs = ActiveSequences(16)
    seqs.add_request("bg", W, [1, 2], isl=40, overlap_blocks=0)
    load = seqs.potential_load(W, [1, 2, 3, 4], isl=70, overlap_blocks=1)
    assert (load.prefill_tokens, load.decode_blocks) == (40 + 70 - 16, 3 + 3)


def test_blocks_in_flight_on_a_worker_count_as_cached_in_time():
    clock = FakeClock()
    seqs = ActiveSequences(64, prefill_load_model="timing", clock=clock)
    keys = list(range(100))
    seqs.add_request("a", W, keys, isl=6400, overlap_blocks=0)
    other = Worker("other")
    same = seqs.potential_load(W, [*keys, 500], isl=6464, overlap_blocks=0)
    cold = seqs.potential_load(other, [*keys, 500], isl=6464, overlap_blocks=0)
    assert same.decode_blocks == cold.decode_blocks == 0.0  # decode enters through pass time
    # on W a's 100 blocks are in flight: after a's pass it computes only its 64 new tokens
    assert same.prefill_tokens == round((p(6400) + p(64)) / T.ms_per_token)
    assert cold.prefill_tokens == round(p(6464) / T.ms_per_token)


BS = 64
A, B = Worker("a"), Worker("b")


def routers() -> tuple[KvRouter, FakeClock]:
    clock = FakeClock()
    router = KvRouter(
        RouterConfig(block_size=BS, prefill_load_model="timing"),
        clock=clock,
        rng=random.Random(1),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    return router, clock


def test_the_cached_worker_wins_until_its_predicted_queue_outweighs_the_hit_and_again_once_it_drains():
    router, clock = routers()
    prompt = [7] * (BS * 100)  # 6,400 tokens
    hashes = compute_block_hashes(prompt, BS)
    router.apply_event(BlocksStored(A, tuple(StoredBlock(i + 1, h) for i, h in enumerate(hashes))))
    assert router.best_worker([*prompt, 1]).worker == A  # cached: 1 token to compute
    # a cold 40k-token prompt lands on a: about 828 ms of prefill queued there
    router.best_worker(list(range(10_000, 50_160)), request_id="big", pinned_worker=A)
    assert router.best_worker([*prompt, 1]).worker == B  # 828 ms wait > ~110 ms to compute it on b
    clock.advance(0.75)  # most of the big prompt is done, as predicted
    assert router.best_worker([*prompt, 1]).worker == A
    router.mark_prefill_complete("big")
    assert router.sequences.prefill_tokens(A) == 0


# --- edges of the model, on round numbers ----------------------------------------------------------

# a pass of t prompt tokens takes t + 10 ms; 100 tokens a pass; decoding adds 5 ms (at any usage)
S = PrefillTiming(0.0, 1.0, 10.0, 0.0, 0.0, 5.0, 1.0, max_num_batched_tokens=100, kv_capacity_tokens=1000)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prefill_constant_ms", float("nan")),
        ("prefill_quadratic_ms", float("inf")),
        ("decode_min_ms", True),
        ("decode_linear_ms", "1"),
        ("prefill_linear_ms", 0.0),
        ("prefill_linear_ms", -1.0),
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", 1.5),
        ("kv_capacity_tokens", True),
    ],
)
def test_a_bad_coefficient_or_size_is_refused_naming_it(field, value):
    with pytest.raises(InvalidConfig) as caught:
        PrefillTiming(**{field: value})
    assert (caught.value.name, caught.value.value) == (f"prefill_timing.{field}", value)


def test_the_smallest_sizes_are_accepted():
    timing = PrefillTiming(max_num_batched_tokens=1, kv_capacity_tokens=1)
    assert timing.prompt_ms(3) == pytest.approx(3 * timing.prefill_ms(1))


def test_parse_names_the_bad_text():
    for bad in ("1,2", "a,b,c"):
        with pytest.raises(InvalidConfig) as caught:
            PrefillTiming.parse(bad)
        assert (caught.value.name, caught.value.value) == ("prefill_timing", bad)


def test_six_coefficients_set_the_prefill_polynomial_too():
    assert PrefillTiming.parse("1e-7,0.02,10,-1,20,3") == PrefillTiming(1e-7, 0.02, 10.0, -1.0, 20.0, 3.0)


def test_kv_usage_beyond_the_cache_counts_as_full():
    assert T.decode_ms(1.5) == T.decode_ms(1.0) and T.decode_ms(-0.5) == T.decode_ms(0.0)


def test_an_empty_or_one_token_prompt_is_one_pass_of_one_token():
    assert S.prompt_ms(0) == S.prompt_ms(1) == 11.0
    assert S.prompt_ms(2) == 12.0


def stream(tokens: int) -> PrefillTimeline:
    """A worker decoding (4 ms a pass) given `tokens` at 0 ms: it starts at 2 ms (half a decode pass),
    passes of 100 tokens take 114 ms (2-116, 116-230, ...)."""
    timeline = PrefillTimeline(S)
    timeline.add("a", tokens, now_ms=0.0, decode_ms=4.0)
    assert "a" in timeline and "b" not in timeline
    return timeline


def idle_ttft(uncached: int) -> float:
    return 2.0 + S.prompt_ms(uncached, 4.0)


def test_the_stream_is_computed_pass_by_pass_pro_rata():
    timeline = stream(250)  # passes end at 116, 230 and 230 + 50 + 10 + 4 = 294 ms
    assert timeline.remaining_tokens(1.0) == 250  # before its first pass
    assert timeline.remaining_tokens(59.0) == 200  # half of the first pass
    assert timeline.remaining_tokens(173.0) == 100  # half of the second
    assert timeline.remaining_tokens(262.0) == 25  # half of the last, of 50 tokens
    assert timeline.remaining_tokens(294.0) == 0
    # a new request waits for the pass in progress, then shares the stream's passes
    assert timeline.ttft_ms(64, 59.0, 0.0) == (116 - 59) + S.prompt_ms(150 + 64, 4.0)
    # once the last pass ended (exactly, or a little before) the worker is idle again
    assert timeline.ttft_ms(64, 294.0, 4.0) == idle_ttft(64)
    assert timeline.ttft_ms(64, 300.0, 4.0) == idle_ttft(64)


def test_a_pass_of_one_token_is_one_token():
    timeline = stream(101)  # the second pass holds 1 token: 116 to 116 + 1 + 10 + 4 = 131 ms
    assert timeline.remaining_tokens(59.0) == 51
    assert timeline.remaining_tokens(123.0) == 1  # half of that one token, rounded
    assert timeline.remaining_tokens(124.0) == 0
    one = PrefillTimeline(S)
    one.add("a", 1, now_ms=0.0, decode_ms=0.0)
    assert one.remaining_tokens(0.0) == 1


def test_a_stream_of_whole_passes_ends_with_its_last_pass():
    timeline = stream(200)  # passes end at 116 and 230 ms: nothing after
    assert timeline.remaining_tokens(229.0) > 0
    assert timeline.ttft_ms(64, 240.0, 4.0) == idle_ttft(64)


def test_each_uncached_token_of_a_queued_request_counts_at_least_one():
    timeline = stream(250)
    ttft = [timeline.ttft_ms(u, 59.0, 4.0) for u in (0, 1, 2)]
    assert ttft[0] == ttft[1] < ttft[2]


def test_an_idle_timeline_predicts_as_no_timeline():
    for decoding in (False, True):
        alone = estimate(S, None, 64, decoding=decoding, kv_usage=0.5, now_ms=10.0)
        idle = estimate(S, PrefillTimeline(S), 64, decoding=decoding, kv_usage=0.5, now_ms=10.0)
        assert idle == alone
    assert alone.ttft_ms == 2.5 + S.prompt_ms(64, 5.0)


def test_an_estimate_says_its_own_prefill_and_the_decode_part():
    guess = estimate(S, stream(250), 64, decoding=True, kv_usage=0.5, now_ms=59.0)
    assert (guess.prefill_ms, guess.decode_ms, guess.uncached_tokens) == (S.prompt_ms(64, 5.0), 5.0, 64)
    assert guess.wait_ms == pytest.approx(guess.ttft_ms - S.prompt_ms(64, 5.0))
    assert guess.wait_ms > 0


def test_a_busy_stream_is_not_done_at_a_pass_boundary_that_floating_point_blurs():
    # passes of 0.1 ms: at 1.0 ms ten passes have ended (1.0 // 0.1 is 9.0 in floating point)
    tiny = PrefillTiming(
        0.0, 0.001, 0.0, 0.0, 0.0, 5.0, 1.0, max_num_batched_tokens=100, kv_capacity_tokens=1000
    )
    assert tiny.prefill_ms(100) == 0.1
    timeline = PrefillTimeline(tiny)
    timeline.add("a", 2000, now_ms=0.0, decode_ms=0.0)
    assert timeline.remaining_tokens(1.0) == 1000
    timeline.add("b", 50, now_ms=1.0, decode_ms=0.0)  # joins the stream, which goes on
    assert len(timeline) == 2 and timeline.remaining_tokens(1.0) == 1050


def test_a_scaled_model_takes_factor_times_as_long_for_the_same_work():
    double = S.scaled(2.0)
    assert double.prefill_ms(64) == 2 * S.prefill_ms(64)
    assert double.decode_ms(0.3) == 2 * S.decode_ms(0.3)
    assert double.decode_min_ms == 2 * S.decode_min_ms
    assert (double.max_num_batched_tokens, double.kv_capacity_tokens) == (100, 1000)


def test_a_retimed_stream_runs_its_passes_and_decode_part_at_the_new_speed():
    # linear 0.5 ms a token: passes of 100 tokens take 60 ms, decoding adds 4; twice as slow after
    base = PrefillTiming(
        0.0, 0.5, 10.0, 0.0, 0.0, 5.0, 1.0, max_num_batched_tokens=100, kv_capacity_tokens=1000
    )
    timeline = PrefillTimeline(base)
    timeline.add("a", 250, now_ms=0.0, decode_ms=4.0)  # starts at 2 ms
    timeline.retime(base.scaled(2.0))  # passes of 2 x 60 + 8 = 128 ms
    assert timeline.remaining_tokens(2.0 + 64.0) == 200  # half of the first pass


def test_an_empty_timeline_can_be_retimed_and_then_used():
    timeline = PrefillTimeline(S)
    timeline.retime(S.scaled(2.0))
    assert timeline.remaining_tokens(0.0) == 0 and len(timeline) == 0
    timeline.add("a", 100, now_ms=0.0, decode_ms=0.0)  # one pass of 2 x 110 ms
    assert timeline.remaining_tokens(110.0) == 50
