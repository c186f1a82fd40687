"""The aic prefill load model (Dynamo's): only the oldest active prefill on each worker decays, linearly
over the duration predicted for it at admission, computed lazily from the clock. Loads hand-computed."""

import random

import pytest

from extproc.router import ActiveSequences, KvRouter, RouterConfig, Worker, WorkerSpec
from extproc.router.aic import OldestPrefillDecay, admission_estimate, decayed_tokens, expected_prefill_ms
from extproc.router.errors import InvalidConfig
from extproc.router.prefill_model import PrefillTiming

from .clock import FakeClock

W, V = Worker("w"), Worker("v")
B = 16
# 0.1 ms per uncached token, nothing else: a prompt of n uncached tokens is expected to take n / 10 ms
LINEAR = PrefillTiming(prefill_quadratic_ms=0.0, prefill_linear_ms=0.1, prefill_constant_ms=0.0)


# --- one worker's decay, as Dynamo's PrefillLoadTracker tests state it ------------------------------


def test_only_the_oldest_prefill_decays():
    decay = OldestPrefillDecay()
    decay.add("r1", 100, 10_000.0, now_ms=0.0)
    decay.add("r2", 60, 6_000.0, now_ms=2_000.0)  # admitted later: held in full
    assert decay.active_tokens(2_000.0) == 80 + 60
    assert decay.active_tokens(5_000.0) == 50 + 60
    assert decay.active_tokens(10_000.0) == 0 + 60  # the oldest done as predicted; r2 still waits
    assert decay.active_tokens(60_000.0) == 60  # clamped at 0, never below
    assert decay.full_tokens == 160 and len(decay) == 2 and "r2" in decay


def test_removing_the_oldest_anchors_the_next_at_that_moment():
    decay = OldestPrefillDecay()
    decay.add("r1", 100, 10_000.0, now_ms=0.0)
    decay.add("r2", 40, 8_000.0, now_ms=0.0)
    assert decay.remove("r1", now_ms=3_000.0)
    assert decay.active_tokens(3_000.0) == 40  # r2 starts decaying only now
    assert decay.active_tokens(5_000.0) == 30  # 40 * (1 - 2/8)


def test_removing_another_keeps_the_anchor_and_the_load_rounds_up():
    decay = OldestPrefillDecay()
    decay.add("r1", 30, 6_000.0, now_ms=0.0)
    decay.add("r2", 20, 4_000.0, now_ms=0.0)
    assert decay.remove("r2", now_ms=2_000.0)
    assert decay.anchor_ms == 0.0
    assert decay.active_tokens(2_000.0) == 21  # ceil(30 * (1 - 1/3)): 1 - 1/3 rounds up, as Dynamo's


def test_the_decay_is_computed_when_read():
    decay = OldestPrefillDecay()
    decay.add("r1", 1000, 100.0, now_ms=50.0)
    assert [decay.active_tokens(t) for t in (50.0, 75.0, 100.0, 125.0, 150.0)] == [1000, 750, 500, 250, 0]
    assert decay.active_tokens(75.0) == 750  # reading earlier again: nothing was consumed
    assert decay.active_tokens(10.0) == 1000  # a clock that went back counts no time elapsed


def test_a_zero_duration_counts_nothing_and_empty_counts_zero():
    assert decayed_tokens(100, 0.0, 0.0) == 0
    assert decayed_tokens(100, -1.0, 0.0) == 0
    assert decayed_tokens(100, 10.0, 2.5) == 75
    decay = OldestPrefillDecay()
    assert decay.active_tokens(0.0) == 0 and decay.remaining_ms(0.0) == 0.0
    assert not decay.add("r0", 0, 5.0, now_ms=0.0)  # a fully cached prompt adds no prefill
    assert not decay.remove("r0", now_ms=0.0)
    assert decay.add("r1", 10, 5.0, now_ms=0.0)
    assert not decay.add("r1", 99, 5.0, now_ms=1.0)  # a known id: unchanged
    assert decay.active_tokens(0.0) == 10


def test_remaining_time_is_every_duration_less_the_anchors_elapsed_time():
    decay = OldestPrefillDecay()
    decay.add("r1", 100, 10.0, now_ms=0.0)
    decay.add("r2", 100, 30.0, now_ms=5.0)
    assert decay.remaining_ms(4.0) == 36.0
    assert decay.remaining_ms(15.0) == 25.0  # past the oldest's duration: eats into the next one's
    assert decay.remaining_ms(-3.0) == 40.0
    guess = admission_estimate(decay, own_ms=7.0, tokens=70, now_ms=50.0)  # modeled wait below 0: 0
    assert (guess.ttft_ms, guess.prefill_ms, guess.uncached_tokens, guess.wait_ms) == (7.0, 7.0, 70, 0.0)
    assert admission_estimate(None, 7.0, 70, 0.0).ttft_ms == 7.0


def test_the_expected_duration_is_the_prompt_alone_on_the_pass_time_model():
    assert expected_prefill_ms(LINEAR, 1000) == pytest.approx(100.0)
    default = PrefillTiming()
    assert expected_prefill_ms(default, 20_000) == default.prompt_ms(20_000)  # chunked, no decode part


# --- through ActiveSequences: the uncached tokens, the worker's own queue, first tokens, frees -----------


def aic_sequences(clock: FakeClock, **kwargs) -> ActiveSequences:
    kwargs.setdefault("learn_prefill_timing", False)
    return ActiveSequences(B, prefill_load_model="aic", prefill_timing=LINEAR, clock=clock, **kwargs)


def test_sequences_decay_the_oldest_uncached_prompt_per_worker():
    clock = FakeClock()
    seqs = aic_sequences(clock)
    seqs.add_request("a", W, [1, 2, 3, 4], isl=1032, overlap_blocks=2)  # 1000 uncached: 100 ms
    clock.advance(0.02)
    seqs.add_request("b", W, [5], isl=400, overlap_blocks=0)  # 40 ms, held in full behind a
    seqs.add_request("c", V, [6], isl=500, overlap_blocks=0)  # another worker: its own oldest
    assert seqs.prefill_tokens(W) == 800 + 400
    assert seqs.prefill_tokens(V) == 500
    clock.advance(0.03)  # t = 50 ms
    assert seqs.prefill_tokens(W) == 500 + 400
    assert seqs.prefill_tokens(V) == 200  # 500 * (1 - 30/50): admitted at 20 ms
    # Dynamo's potential load: the decayed active tokens plus the request's own uncached tokens
    load = seqs.potential_load(W, [9, 8], isl=64, overlap_blocks=1)
    assert load.prefill_tokens == 900 + 48
    assert load.decode_blocks == seqs.decode_blocks(W) + 2
    assert seqs.mark_prefill_complete("a")  # a's first token: b becomes the oldest, anchored now
    assert seqs.prefill_tokens(W) == 400
    clock.advance(0.01)
    assert seqs.prefill_tokens(W) == 300  # 400 * (1 - 10/40)
    assert seqs.free("b")  # freed before its first token: it leaves
    assert seqs.prefill_tokens(W) == 0
    assert seqs.loads_follow_clock and not seqs.timed


def test_freeing_a_younger_prefill_keeps_the_oldest_decaying():
    clock = FakeClock()
    seqs = aic_sequences(clock)
    seqs.add_request("a", W, [], isl=1000, overlap_blocks=0)
    seqs.add_request("b", W, [], isl=200, overlap_blocks=0)
    seqs.add_request("cached", W, [1, 2], isl=32, overlap_blocks=2)  # nothing to compute: no prefill
    clock.advance(0.025)
    assert seqs.free("b") and seqs.free("cached")
    assert seqs.prefill_tokens(W) == 750
    assert seqs.mark_prefill_complete("a") and not seqs.mark_prefill_complete("a")
    assert seqs.prefill_tokens(W) == 0
    assert seqs.free("a") and seqs.is_idle()


def test_without_prefill_token_tracking_aic_is_refused_and_sequences_count_none():
    with pytest.raises(InvalidConfig, match="aic requires router_track_prefill_tokens=true"):
        RouterConfig(prefill_load_model="aic", router_track_prefill_tokens=False)
    seqs = ActiveSequences(B, prefill_load_model="aic", track_prefill_tokens=False)  # no clock needed
    seqs.add_request("a", W, [], isl=100, overlap_blocks=0)
    assert seqs.prefill_tokens(W) == 0 and not seqs.loads_follow_clock
    with pytest.raises(ValueError, match="the aic prefill load model needs a clock"):
        ActiveSequences(B, prefill_load_model="aic")


def test_a_slow_worker_learned_from_its_first_tokens_gets_longer_durations():
    clock = FakeClock()
    seqs = aic_sequences(clock, learn_prefill_timing=True)
    for i in range(12):  # alone each time, the first token 4x later than the 100 ms predicted
        seqs.add_request(f"r{i}", W, [], isl=1000, overlap_blocks=0)
        clock.advance(0.4)
        seqs.mark_prefill_complete(f"r{i}")
        seqs.free(f"r{i}")
    scale = seqs.timing(W).prefill_linear_ms / LINEAR.prefill_linear_ms
    assert scale > 2.0
    seqs.add_request("next", W, [], isl=1000, overlap_blocks=0)
    clock.advance(0.05)  # half the configured duration: a slower worker has done less
    assert seqs.prefill_tokens(W) == pytest.approx(1000 * (1 - 0.5 / scale), abs=1)
    seqs.add_request("remote", V, [], isl=1000, overlap_blocks=0, learn=False)
    clock.advance(0.4)
    seqs.mark_prefill_complete("remote")  # another replica's: nothing learned of V
    assert seqs.learned_pass_time(V) is None


# --- through the router: the choice follows the decayed loads --------------------------------------------


def aic_router(clock: FakeClock, n: int = 2, **config) -> KvRouter:
    config = {"block_size": B, "prefill_load_model": "aic", "prefill_timing": LINEAR,
              "learn_prefill_timing": False, **config}  # fmt: skip
    workers = [WorkerSpec("w"), WorkerSpec("v")] + [WorkerSpec(f"x{i}") for i in range(n - 2)]
    return KvRouter(RouterConfig(**config), clock=clock, rng=random.Random(1), workers=workers)


def prompt(seed: int, n: int) -> list[int]:
    return [seed * 100_000 + i for i in range(n)]


@pytest.mark.parametrize("workers", [2, 40])  # 40: past the load order's fleet size (a full scan)
def test_the_router_sends_a_request_where_the_decayed_load_is_lowest(workers):
    clock = FakeClock()
    router = aic_router(clock, workers, router_track_active_blocks=False)  # the prefill term alone
    for i in range(2, workers):  # the other workers carry far more
        router.best_worker(prompt(99 + i, 4000), request_id=f"bg{i}", pinned_worker=f"x{i - 2}")
    router.best_worker(prompt(1, 1000), request_id="w1", pinned_worker="w")  # 100 ms
    router.best_worker(prompt(2, 10), request_id="v1", pinned_worker="v")  # 1 ms, the oldest on v
    router.best_worker(prompt(3, 600), request_id="v2", pinned_worker="v")  # held in full behind it
    assert router.best_worker(prompt(4, 160)).worker == V  # t = 0: w 1000, v 610
    clock.advance(0.05)
    # t = 50 ms: w 500; v 600 (v1 decayed to 0 but is still the oldest: v2 has not started)
    decision = router.best_worker(prompt(5, 160))
    assert decision.worker == W
    costs = {c.worker: c.cost for c in decision.costs}
    assert costs[W] == pytest.approx((500 + 160) / B)
    assert costs[V] == pytest.approx((600 + 160) / B)
    none = KvRouter(RouterConfig(block_size=B, prefill_load_model="none"), clock=clock, workers=[])
    assert none.config.prefill_load_model == "none"


def test_potential_loads_read_the_decay_at_the_clock():
    clock = FakeClock()
    router = aic_router(clock)
    router.best_worker(prompt(1, 800), request_id="w1", pinned_worker="w")
    clock.advance(0.02)
    loads = {load.worker: load for load in router.get_potential_loads(prompt(2, 100))}
    assert loads[W].prefill_tokens == 600 + 100 and loads[V].prefill_tokens == 100
    assert router.sequences.prefill_tokens(W) == 600
    router.mark_prefill_complete("w1")
    assert router.get_potential_loads(prompt(2, 100))[0].prefill_tokens == 100
