"""Micro traces through the replayer, one per engine rule of REFERENCE section 6, in virtual time.

Expected times come from the pass-time formulas (`extproc.sim.timing`); the last test pins a
micro trace, with a tiny pool so that evictions and LIFO preemptions happen, to the per-request
results of Dynamo 1.6.1's mocker (`run_mocker_trace_replay`, round robin).
"""

import pytest

from extproc.sim.engine import EngineConfig
from extproc.sim.replay_metrics import percentile, summarize
from extproc.sim.timing import decode_ms, prefill_ms

from .replay_helpers import replay, replayer

CAPACITY = 16_384 * 64


def ids(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def ttfts(result):
    return [r.ttft_ms for r in result.records]


def test_a_cold_40160_token_prompt_has_a_ttft_of_828_29_ms(tmp_path):
    result = replay(tmp_path, [(0, 40_160, 2, ids(0, 79))], trace_block_size=512)
    assert result.records[0].ttft_ms == pytest.approx(828.29, abs=0.005)


def test_idle_worker_starts_at_arrival_equal_timestamps_share_a_pass_and_a_busy_one_makes_you_wait(tmp_path):
    rows = [
        (0, 1000, 1, ids(1, 16)),
        (0, 1000, 1, ids(101, 16)),  # same instant: same pass, T = 2,000
        (10, 500, 1, ids(201, 8)),  # arrives during that pass: waits for its end
        (5000, 300, 1, ids(301, 5)),  # the worker is idle again: starts at once
    ]
    first, second, third, fourth = ttfts(replay(tmp_path, rows))
    assert first == second == pytest.approx(prefill_ms(2000))
    assert third == pytest.approx(prefill_ms(2000) - 10 + prefill_ms(500))
    assert fourth == pytest.approx(prefill_ms(300))


def test_running_requests_go_first_and_waiting_ones_fill_the_budget_left(tmp_path):
    rows = [(0, 6000, 3, ids(1, 94)), (0, 5000, 3, ids(1001, 79))]
    a, b = ttfts(replay(tmp_path, rows))
    assert a == pytest.approx(prefill_ms(8192))  # a's 6,000 tokens + b's first 2,192
    # next pass: a's decode (1 token, decode part charged) then b's other 2,808 tokens
    assert b == pytest.approx(prefill_ms(8192) + prefill_ms(2808) + decode_ms(6001 / CAPACITY))


def test_blocks_are_matchable_once_scheduled_and_t_is_priced_from_per_request_means(tmp_path):
    result = replay(tmp_path, [(0, 1000, 1, ids(1, 16)), (0, 1000, 1, ids(1, 16))])
    # b hits a's 15 full blocks in the same pass: T = 2 * (1000 - 480) = 1,040
    assert ttfts(result) == [pytest.approx(prefill_ms(1040))] * 2
    assert [r.cached_tokens for r in result.records] == [0, 960]


def test_the_cached_prefix_leaves_at_least_one_token_to_compute(tmp_path):
    result = replay(tmp_path, [(0, 128, 1, [1, 2]), (1000, 128, 1, [1, 2])])
    assert result.records[1].cached_tokens == 64
    assert result.records[1].ttft_ms == pytest.approx(prefill_ms(64))


def test_released_blocks_are_evicted_least_recent_first_and_tail_first(tmp_path):
    rows = [
        (0, 256, 1, [1, 2, 3, 4]),  # a: 4 blocks, released tail first
        (1000, 256, 1, [5, 6, 7, 8]),  # b: the pool (8 blocks) is now full of cached blocks
        (2000, 128, 1, [9, 10]),  # c takes 2 slots: evicts a's blocks 4 and 3
        (3000, 320, 1, [1, 2, 3, 4, 11]),  # a's head survived
    ]
    result = replay(tmp_path, rows, engine=EngineConfig(num_gpu_blocks=8))
    assert [r.cached_tokens for r in result.records] == [0, 0, 0, 128]
    assert result.records[3].ttft_ms == pytest.approx(prefill_ms(320 - 128))


def test_admission_waits_until_the_whole_prompt_fits_in_the_pool(tmp_path):
    rows = [(0, 384, 20, ids(1, 6)), (10, 256, 1, ids(11, 4))]  # 6 (then 7) + 4 blocks > 8
    a, b = replay(tmp_path, rows, engine=EngineConfig(num_gpu_blocks=8)).records
    assert b.first_token_ms == pytest.approx(a.end_ms + prefill_ms(256))


def test_a_prompt_larger_than_the_pool_is_rejected_and_left_out_of_every_figure(tmp_path):
    run = replayer(
        tmp_path, [(0, 600, 1, ids(1, 10)), (5, 100, 1, [50, 51])], engine=EngineConfig(num_gpu_blocks=8)
    )
    result = run.run()
    assert [r.rejected for r in result.records] == [True, False]
    summary = summarize(result)
    assert (summary["rejected"], summary["completed"]) == (1, 1)
    assert summary["ttft_ms"]["mean"] == pytest.approx(prefill_ms(100))
    assert summary["reuse"] == 0.0
    assert run.router.router.is_idle()  # the refused request was freed in the router too


def test_lifo_preemption_readmits_the_newest_request_which_keeps_its_best_cached_prefix(tmp_path):
    rows = [(0, 7, 3, [1, 2]), (0, 7, 3, [100, 101])]
    a, b = replay(tmp_path, rows, engine=EngineConfig(block_size=4, num_gpu_blocks=4)).records
    assert (a.admissions, b.admissions) == (1, 2)
    assert b.cached_tokens == 4  # 0 at its first admission, 4 when readmitted
    assert b.end_ms > a.end_ms


def test_percentiles_round_half_up_so_an_even_count_takes_the_upper_middle():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0
    assert percentile([float(i) for i in range(101)], 0.99) == 99.0


# Dynamo 1.6.1's mocker on this trace (block size 16, 60 blocks, 64-token budget, 16-token trace
# blocks, round robin on one worker): (arrival ms, input, TTFT ms, E2E ms, reused tokens, admissions).
GOLDEN_ROWS = [
    (5, 20, 31, [508, 844]),
    (5, 58, 25, [657, 70395, 36269, 69607]),
    (55, 58, 19, [657, 188, 29599, 23160]),
    (75, 125, 20, [25, 266, 354, 29470, 75951, 61132, 49156, 67572]),
    (75, 99, 33, [487, 19, 386, 110, 72484, 46238, 12808]),
    (77, 105, 32, [25, 266, 354, 3233, 73220, 21351, 60463]),
    (79, 107, 30, [657, 188, 83720, 10963, 36967, 54528, 30564]),
    (79, 96, 37, [25, 266, 354, 932, 92442, 63552]),
    (129, 159, 9, [508, 844, 153, 475, 433, 44212, 85369, 63831, 93989, 97142]),
    (139, 73, 14, [508, 844, 72155, 23044, 65785]),
    (141, 73, 30, [25, 94764, 81684, 30477, 54064]),
    (146, 55, 13, [508, 844, 153, 475]),
    (148, 69, 33, [657, 188, 15861, 24080, 18854]),
    (148, 94, 16, [508, 844, 153, 475, 433, 97532]),
    (158, 148, 6, [508, 844, 153, 475, 433, 10486, 44289, 26294, 64699, 20639]),
    (159, 107, 28, [25, 266, 354, 932, 719, 96148, 77981]),
]
GOLDEN = {
    (0.0, 20): (17.4749, 1183.516, 0, 1),
    (0.0, 58): (41.0981, 962.5282, 0, 1),
    (50.0, 58): (28.569, 742.5822, 16, 1),
    (70.0, 99): (137.7376, 1415.9484, 0, 1),
    (70.0, 125): (101.0611, 892.5282, 0, 1),
    (72.0, 105): (176.3423, 1413.9484, 48, 1),
    (74.0, 96): (265.4173, 1584.0571, 48, 1),
    (74.0, 107): (218.4426, 1380.6683, 32, 1),
    (124.0, 159): (362.779, 668.5822, 16, 1),
    (134.0, 73): (403.8285, 930.939, 32, 1),
    (136.0, 73): (452.5222, 1500.0841, 64, 2),
    (141.0, 55): (447.5222, 1144.5378, 48, 2),
    (143.0, 69): (751.5082, 1668.6977, 32, 1),
    (143.0, 94): (751.5082, 1311.6683, 80, 1),
    (153.0, 148): (911.939, 1098.536, 80, 1),
    (154.0, 107): (961.496, 1657.6977, 64, 1),
}


def test_a_micro_trace_with_evictions_and_preemptions_matches_dynamos_mocker_request_by_request(tmp_path):
    engine = EngineConfig(block_size=16, num_gpu_blocks=60, max_num_batched_tokens=64)
    result = replay(tmp_path, GOLDEN_ROWS, engine=engine)
    assert result.preemptions == 2
    got = {
        (r.arrival_ms, r.input_tokens): (
            round(r.ttft_ms, 4),
            round(r.e2e_ms, 4),
            r.cached_tokens,
            r.admissions,
        )
        for r in result.records
    }
    assert got == GOLDEN
