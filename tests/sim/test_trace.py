"""Mooncake trace loading: token expansion, clamping, time origin, speed-up, several files, errors."""

import pytest

from extproc.sim.trace import TraceError, jitter_arrivals, load_mooncake, write_mooncake


def test_hash_ids_become_runs_of_identical_tokens_cut_at_the_input_length(tmp_path):
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [(0, 5, 2, [7, 9])])
    (req,) = load_mooncake([path], trace_block_size=4)
    assert req.token_ids() == [7, 7, 7, 7, 9]
    assert (req.input_tokens, req.output_tokens, req.hash_ids) == (5, 2, (7, 9))


def test_input_is_clamped_to_the_hash_ids(tmp_path):
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [(0, 100, 1, [1, 2])])
    (req,) = load_mooncake([path], trace_block_size=4)
    assert req.input_tokens == 8 and len(req.token_ids()) == 8


def test_times_start_at_the_first_request_and_shrink_with_the_speedup(tmp_path):
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [(100, 1, 1, [1]), (50, 1, 1, [2]), (150, 1, 1, [3])])
    reqs = load_mooncake([path], trace_block_size=1, speedup=2.0)
    assert [(r.index, r.arrival_ms) for r in reqs] == [(1, 0.0), (0, 25.0), (2, 50.0)]


def test_several_files_follow_each_other_in_time(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_mooncake(a, [(0, 1, 1, [1]), (40, 1, 1, [2])])
    write_mooncake(b, [(0, 1, 1, [3]), (10, 1, 1, [4])])
    assert [r.arrival_ms for r in load_mooncake([a, b], trace_block_size=1)] == [0, 40, 40, 50]


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{", "not JSON"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}', "missing key 'hash_ids'"),
        ('{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "timestamp"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}', "input_length"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}', "hash_ids"),
    ],
)
def test_bad_lines_name_the_file_the_line_and_the_problem(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n\n' + line + "\n"
    )
    with pytest.raises(TraceError, match=problem) as info:
        load_mooncake([path])
    assert info.value.line == 3 and str(path) in str(info.value)


def test_jittered_arrivals_are_the_same_requests_a_little_later_and_the_same_for_a_seed(tmp_path):
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [(t, 2, 1, [t % 7, 9]) for t in range(0, 50, 1)])
    reqs = load_mooncake([path], trace_block_size=1)
    once = jitter_arrivals(reqs, 5.0, seed=3)
    assert once == jitter_arrivals(reqs, 5.0, seed=3)  # each policy compared replays the same trace
    assert once != jitter_arrivals(reqs, 5.0, seed=4)
    by_index = {r.index: r for r in reqs}
    for r in once:
        original = by_index[r.index]
        assert original.arrival_ms <= r.arrival_ms < original.arrival_ms + 5.0
        assert r.hash_ids == original.hash_ids and r.input_tokens == original.input_tokens
    assert sorted(r.index for r in once) == list(range(50))
    assert [r.arrival_ms for r in once] == sorted(r.arrival_ms for r in once)
    assert [r.index for r in once] != list(range(50))  # 5 ms over 1 ms gaps reorders some


def test_no_jitter_keeps_the_trace_and_a_negative_one_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [(0, 1, 1, [1]), (10, 1, 1, [2])])
    reqs = load_mooncake([path], trace_block_size=1)
    assert jitter_arrivals(reqs, 0.0, seed=1) == reqs
    with pytest.raises(ValueError, match="max_ms"):
        jitter_arrivals(reqs, -1.0, seed=1)
