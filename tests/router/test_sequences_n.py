"""A request's `n` (choices generated from one prompt) counts as n decoding sequences: its prompt is
computed once (prefill tokens count once), each sequence holds its own partial last block (every prompt
block without KV reuse) and its own output blocks, and freeing the request gives all of it back once."""

import pytest

from extproc.router import ActiveSequences, Worker

W = Worker("w")
B = 16
KEYS = [11, 12, 13, 14]  # 4 full blocks; isl 70 leaves a partial fifth


def test_n_sequences_share_the_prefill_and_each_holds_its_last_block():
    seqs = ActiveSequences(B)
    seqs.add_request("r", W, KEYS, isl=70, overlap_blocks=1, sequences=3)
    assert seqs.prefill_tokens(W) == 70 - 16  # computed once
    assert seqs.decode_blocks(W) == 4 + 3  # the full blocks shared, one partial block per sequence
    assert seqs.potential(W, KEYS, 70) == (54, 7 + 1)  # a new request's tail on top (its blocks are there)
    assert seqs.mark_prefill_complete("r") and seqs.prefill_tokens(W) == 0
    assert seqs.free("r") and not seqs.free("r")
    assert seqs.decode_blocks(W) == 0 and seqs.is_idle()


def test_without_kv_reuse_every_sequence_holds_every_block():
    seqs = ActiveSequences(B, assume_kv_reuse=False)
    seqs.add_request("r", W, KEYS, isl=70, overlap_blocks=0, sequences=2)
    seqs.add_request("s", W, KEYS, isl=64, overlap_blocks=0)  # one sequence, no tail
    assert seqs.decode_blocks(W) == 2 * (4 + 1) + 4
    assert seqs.prefill_tokens(W) == 70 + 64
    seqs.free("r")
    assert seqs.decode_blocks(W) == 4


@pytest.mark.parametrize("sequences", [0, -2])
def test_fewer_than_one_sequence_counts_one(sequences):
    seqs = ActiveSequences(B)
    seqs.add_request("r", W, KEYS, isl=70, overlap_blocks=0, sequences=sequences)
    assert seqs.decode_blocks(W) == 5


def test_sequences_told_later_only_grow_and_count_without_output_tracking():
    seqs = ActiveSequences(B)  # output blocks not tracked: the sequences' own blocks still count
    changed: list[Worker] = []
    seqs.on_load_change = changed.append
    seqs.add_request("r", W, KEYS, isl=70, overlap_blocks=0)
    changed.clear()
    seqs.add_output_tokens("r", 0, sequences=4)
    assert seqs.decode_blocks(W) == 4 + 4 and changed == [W]
    seqs.add_output_tokens("r", 0, sequences=2)  # never shrinks
    seqs.add_output_tokens("r", 50, sequences=4)  # output not tracked: nothing changes
    assert seqs.decode_blocks(W) == 8 and changed == [W]
    seqs.add_output_tokens("unknown", 5, sequences=9)
    seqs.free("r")
    assert seqs.decode_blocks(W) == 0 and seqs.is_idle()


def test_output_blocks_count_per_sequence_and_leave_once():
    seqs = ActiveSequences(B, track_output_blocks=True)
    seqs.add_request("r", W, KEYS, isl=64, overlap_blocks=0, sequences=2, expected_output_tokens=64)
    assert seqs.decode_blocks(W) == 4  # no partial block: nothing of its own yet
    seqs.add_output_tokens("r", 32, sequences=2)  # 2 blocks each, half way to the expected 64
    assert seqs.decode_blocks(W) == pytest.approx(4 + 2 * 2 * 0.5)
    seqs.add_output_tokens("r", 0, sequences=3)  # a third sequence shows in the response
    assert seqs.decode_blocks(W) == pytest.approx(4 + 3 * 2 * 0.5)
    assert seqs.free("r") and not seqs.free("r")
    assert seqs.decode_blocks(W) == 0


def test_untracked_active_blocks_count_nothing_for_n():
    seqs = ActiveSequences(B, track_active_blocks=False, track_output_blocks=True)
    seqs.add_request("r", W, KEYS, isl=70, overlap_blocks=0, sequences=5)
    seqs.add_output_tokens("r", 40, sequences=6)
    assert seqs.decode_blocks(W) == 0 and seqs.prefill_tokens(W) == 70
