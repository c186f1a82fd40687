"""extproc/router/arrivals.py and its use: on a fleet of mixed speeds a worker's cost adds the delay
the request's prompt imposes on the requests that arrive at that worker after it."""

from __future__ import annotations

import math

import pytest

from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.arrivals import ArrivalRates, delay_behind_ms
from extproc.router.pass_time import WINDOW_SAMPLES
from extproc.router.prefill_model import PrefillTiming
from extproc.router.sequences import ActiveSequences
from extproc.router.types import Worker

from .clock import FakeClock

W = Worker("w")
BASE = PrefillTiming()


def test_a_rate_is_an_exponential_average_of_the_arrivals():
    rates: ArrivalRates[Worker] = ArrivalRates(window_ms=1000.0)
    assert rates.per_ms(W, 0.0) == 0.0
    rates.add(W, 0.0)
    rates.add(W, 0.0)
    assert rates.per_ms(W, 0.0) == pytest.approx(2 / 1000)
    assert rates.per_ms(W, 1000.0) == pytest.approx(2 / 1000 * math.exp(-1))
    rates.add(W, 1000.0)
    assert rates.per_ms(W, 1000.0) == pytest.approx((2 * math.exp(-1) + 1) / 1000)
    assert rates.per_ms(Worker("other"), 1000.0) == 0.0


def test_a_steady_stream_reads_as_its_rate():
    rates: ArrivalRates[Worker] = ArrivalRates(window_ms=60_000.0)
    now = 0.0
    for _ in range(2000):  # one every 250 ms for 500 s
        rates.add(W, now)
        now += 250.0
    assert rates.per_ms(W, now) == pytest.approx(1 / 250, rel=0.01)


def test_a_clock_read_before_the_last_arrival_counts_no_growth():
    rates: ArrivalRates[Worker] = ArrivalRates(window_ms=1000.0)
    rates.add(W, 5000.0)
    assert rates.per_ms(W, 4000.0) == rates.per_ms(W, 5000.0) == pytest.approx(1 / 1000)


def test_a_forgotten_worker_has_no_arrivals():
    rates: ArrivalRates[Worker] = ArrivalRates()
    rates.add(W, 0.0)
    rates.forget(W)
    rates.forget(W)
    assert rates.per_ms(W, 0.0) == 0.0


@pytest.mark.parametrize("window_ms", [0.0, -1.0, math.nan])
def test_the_window_must_be_positive(window_ms):
    with pytest.raises(ValueError, match="window_ms"):
        ArrivalRates(window_ms=window_ms)
    assert ArrivalRates(window_ms=0.5).window_ms == 0.5  # any positive window


def test_the_delay_behind_a_prompt():
    assert delay_behind_ms(0.002, 100.0, 50.0) == pytest.approx(0.002 * 100.0 * 150.0)
    assert delay_behind_ms(0.0, 100.0, 50.0) == 0.0
    assert delay_behind_ms(0.002, 100.0, 0.0) == pytest.approx(0.002 * 100.0 * 100.0)


def mixed_sequences(clock: FakeClock, slow_scale: float) -> tuple[ActiveSequences, Worker, Worker]:
    """Two workers, `slow` taught (one prompt at a time, first tokens as its speed says) to be
    `slow_scale` times slower than `fast`."""
    seqs = ActiveSequences(16, prefill_load_model="timing", clock=clock)
    fast, slow = Worker("fast"), Worker("slow")
    for i in range(4 * WINDOW_SAMPLES):
        for worker, scale in ((fast, 1.0), (slow, slow_scale)):
            rid = f"{worker.worker_id}{i}"
            seqs.add_request(rid, worker, [], 4000, 0)
            clock.advance(scale * BASE.prompt_ms(4000) / 1000.0)
            seqs.mark_prefill_complete(rid)
            seqs.free(rid)
    clock.advance(600.0)  # ten windows: what taught them has no rate left
    return seqs, fast, slow


def cost_ms(seqs: ActiveSequences, worker: Worker, isl: int = 4000) -> float:
    return seqs.potential_load(worker, [], isl, 0).prefill_tokens * seqs.prefill_timing.ms_per_token


def test_on_a_mixed_fleet_a_workers_cost_adds_the_delay_its_prompt_imposes_on_later_arrivals():
    clock = FakeClock()
    seqs, fast, slow = mixed_sequences(clock, 2.0)
    assert seqs.counts_delay_behind
    idle_cost = cost_ms(seqs, fast)
    own = seqs.timing(fast).prompt_ms(4000)
    assert idle_cost == pytest.approx(own, abs=1.0)  # no arrivals yet: the time to first token alone
    for i in range(30):  # 30 arrivals in one second, each done at once
        seqs.add_request(f"a{i}", fast, [], 16, 0)
        seqs.mark_prefill_complete(f"a{i}")
        seqs.free(f"a{i}")
        clock.advance(1 / 30)
    rate = 30 * math.exp(-0.5 / 60) / 60_000  # about 30 arrivals over the 60 s window, per ms
    assert seqs.arrivals_per_s(fast) == pytest.approx(rate * 1000, rel=0.02)
    assert cost_ms(seqs, fast) == pytest.approx(own + rate * own * own, rel=0.02)
    assert cost_ms(seqs, slow) == pytest.approx(seqs.timing(slow).prompt_ms(4000), abs=1.0)


def arrivals(seqs: ActiveSequences, clock: FakeClock, worker: Worker, count: int, over_s: float) -> None:
    """`count` short requests at `worker` over `over_s` seconds, each done at once."""
    for i in range(count):
        seqs.add_request(f"{worker.worker_id}-a{i}", worker, [], 16, 0)
        seqs.mark_prefill_complete(f"{worker.worker_id}-a{i}")
        seqs.free(f"{worker.worker_id}-a{i}")
        clock.advance(over_s / count)


@pytest.mark.parametrize("scale", [1.0, 1.15])
def test_identical_workers_and_speeds_apart_by_less_than_a_quarter_count_no_delay_behind(scale):
    clock = FakeClock()
    seqs, fast, _ = mixed_sequences(clock, scale)
    assert not seqs.counts_delay_behind
    before = cost_ms(seqs, fast)
    arrivals(seqs, clock, fast, 300, 1.0)
    assert cost_ms(seqs, fast) == before


def test_without_learning_there_is_no_delay_behind():
    clock = FakeClock()
    seqs = ActiveSequences(16, prefill_load_model="timing", learn_prefill_timing=False, clock=clock)
    arrivals(seqs, clock, W, 300, 1.0)
    assert not seqs.counts_delay_behind and seqs.arrivals_per_s(W) == 0.0


def test_forgetting_the_slow_worker_makes_the_fleet_uniform_again():
    clock = FakeClock()
    seqs, _, slow = mixed_sequences(clock, 2.0)
    arrivals(seqs, clock, slow, 10, 1.0)
    assert seqs.arrivals_per_s(slow) > 0
    seqs.remove_worker(slow)
    assert not seqs.counts_delay_behind and seqs.arrivals_per_s(slow) == 0.0


@pytest.mark.parametrize("busy", [True, False])
def test_a_new_prompt_goes_to_an_idle_slow_worker_while_a_stream_of_arrivals_keeps_the_fast_one_busy(busy):
    """The point of it (issue 24): on a mixed fleet the slow workers take new prompts when the fast
    ones have a stream of arrivals, instead of idling while everything queues on the fast ones;
    without that stream the fast worker, where the first token comes sooner, takes it."""
    clock = FakeClock()
    router = KvRouter(
        RouterConfig(block_size=16, prefill_load_model="timing"),
        clock=clock,
        workers=[WorkerSpec("fast"), WorkerSpec("slow")],
    )
    seqs = router.sequences
    fast, slow = sorted(router.workers(), key=lambda w: w.worker_id)
    for i in range(4 * WINDOW_SAMPLES):  # the slow worker's first tokens come twice as late
        for worker, scale in ((fast, 1.0), (slow, 2.0)):
            seqs.add_request(f"{worker.worker_id}{i}", worker, [], 4000, 0)
            clock.advance(scale * BASE.prompt_ms(4000) / 1000.0)
            seqs.mark_prefill_complete(f"{worker.worker_id}{i}")
            seqs.free(f"{worker.worker_id}{i}")
    clock.advance(600.0)
    assert seqs.counts_delay_behind
    own = seqs.timing(fast).prompt_ms(4000)
    if busy:
        arrivals(seqs, clock, fast, round(3 * 60_000 / own), 60.0)  # three per own prefill time
    decision = router.best_worker([7] * 4000, request_id="new")
    assert decision.worker == (slow if busy else fast)


def test_a_workers_arrivals_read_per_second():
    clock = FakeClock(100.0)
    seqs = ActiveSequences(16, prefill_load_model="timing", clock=clock)
    seqs.add_request("a", W, [], 16, 0)
    assert seqs.arrivals_per_s(W) == pytest.approx(1 / 60, rel=1e-9)  # one arrival, a 60 s window
