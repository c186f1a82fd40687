"""ActiveSequences: prefill tokens until prefill completes, decode blocks with and without reuse."""

import pytest

from extproc.router import ActiveSequences, Worker

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
