"""Scheduler core in virtual time: pass building, pricing, prefix hits, block admission, preemption."""

from __future__ import annotations

import pytest

from extproc.sim.engine import Engine, EngineConfig, Pass, RequestTooLarge
from extproc.sim.timing import decode_ms, prefill_ms


def run_until_idle(
    engine: Engine, now_ms: float = 0.0
) -> tuple[list[Pass], dict[str, float], dict[str, int]]:
    """Drive passes back to back; returns the passes, first-token times and emitted-token counts."""
    passes: list[Pass] = []
    first_token_ms: dict[str, float] = {}
    emitted: dict[str, int] = {}
    while (p := engine.next_pass(now_ms)) is not None:
        passes.append(p)
        now_ms = p.end_ms
        for entry in engine.finish_pass(p):
            if entry.emits_token:
                first_token_ms.setdefault(entry.request_id, p.end_ms)
                emitted[entry.request_id] = emitted.get(entry.request_id, 0) + 1
        assert len(passes) < 10_000
    return passes, first_token_ms, emitted


def run_until_idle_after(engine: Engine, p: Pass) -> tuple[list[Pass], dict[str, float], dict[str, int]]:
    engine.finish_pass(p)
    passes, first, emitted = run_until_idle(engine, p.end_ms)
    for entry in p.entries:
        if entry.emits_token:
            first.setdefault(entry.request_id, p.end_ms)
            emitted[entry.request_id] = emitted.get(entry.request_id, 0) + 1
    return passes, first, emitted


def prompt(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def test_cold_40160_token_prompt_is_chunked_and_first_token_lands_at_828_29_ms():
    engine = Engine()
    engine.add_request("a", prompt(40_160), max_tokens=2, now_ms=0.0)
    passes, first, emitted = run_until_idle(engine)
    assert [p.entries[0].new_tokens for p in passes] == [8192] * 4 + [7392, 1]
    assert first["a"] == pytest.approx(828.29, abs=0.005)
    assert all(p.kv_usage is None for p in passes[:5])
    assert passes[5].duration_ms == pytest.approx(decode_ms(40_161 / (16_384 * 64)))
    assert emitted == {"a": 2}


def test_repeated_prompt_hits_the_cache_up_to_the_last_full_block_before_its_last_token():
    engine = Engine()
    engine.add_request("a", prompt(1000), 1, 0.0)
    _, first, _ = run_until_idle(engine)
    engine.add_request("b", prompt(1000), 1, first["a"])
    p = engine.next_pass(first["a"])
    assert p is not None
    assert p.entries[0].cached_tokens == 960
    assert p.prefill_tokens == 40 and p.duration_ms == pytest.approx(prefill_ms(40))
    assert (engine.cache.queried_tokens, engine.cache.hit_tokens) == (2000, 960)


def test_cached_prefix_is_capped_so_one_token_is_always_computed():
    engine = Engine()
    engine.add_request("a", prompt(128), 1, 0.0)
    run_until_idle(engine)
    engine.add_request("b", prompt(128), 1, 100.0)
    p = engine.next_pass(100.0)
    assert p is not None and p.entries[0].cached_tokens == 64


def test_blocks_are_matchable_once_scheduled_even_by_a_later_request_in_the_same_pass():
    engine = Engine()
    engine.add_request("a", prompt(1000), 1, 0.0)
    engine.add_request("b", prompt(1000), 1, 0.0)
    p = engine.next_pass(0.0)
    assert p is not None
    assert [(e.request_id, e.cached_tokens, e.new_tokens) for e in p.entries] == [
        ("a", 0, 1000),
        ("b", 960, 40),
    ]
    # T from per-request means: 2 * (floor((1000 + 1000) / 2) - floor(960 / 2)) = 1040
    assert p.prefill_tokens == 1040


def test_prompts_share_the_batched_token_budget_and_decodes_spend_it_first():
    engine = Engine()
    engine.add_request("a", prompt(6000), 5, 0.0)
    engine.add_request("b", prompt(5000, start=50_000), 5, 0.0)
    p1 = engine.next_pass(0.0)
    assert p1 is not None
    assert [(e.request_id, e.new_tokens, e.emits_token) for e in p1.entries] == [
        ("a", 6000, True),
        ("b", 2192, False),
    ]
    assert p1.prefill_tokens == 8192 and p1.kv_usage is None
    engine.finish_pass(p1)
    p2 = engine.next_pass(p1.end_ms)
    assert p2 is not None
    assert [(e.request_id, e.new_tokens) for e in p2.entries] == [("a", 1), ("b", 2808)]
    assert p2.kv_usage == pytest.approx(6001 / (16_384 * 64))
    assert p2.duration_ms == pytest.approx(prefill_ms(2808) + decode_ms(p2.kv_usage))


def test_running_requests_are_served_before_waiting_ones_are_admitted():
    engine = Engine(EngineConfig(max_num_batched_tokens=100))
    engine.add_request("a", prompt(250), 1, 0.0)
    p1 = engine.next_pass(0.0)
    assert p1 is not None
    engine.add_request("b", prompt(30, start=5000), 1, 1.0)  # arrives during the pass: waits for its end
    with pytest.raises(RuntimeError):
        engine.next_pass(1.0)
    engine.finish_pass(p1)
    p2 = engine.next_pass(p1.end_ms)
    assert p2 is not None and [(e.request_id, e.new_tokens) for e in p2.entries] == [("a", 100)]
    engine.finish_pass(p2)
    p3 = engine.next_pass(p2.end_ms)
    assert p3 is not None and [(e.request_id, e.new_tokens) for e in p3.entries] == [("a", 50), ("b", 30)]


def test_at_most_max_num_seqs_requests_run():
    engine = Engine(EngineConfig(max_num_seqs=2))
    for rid in "abc":
        engine.add_request(rid, prompt(10, start=ord(rid) * 100), 3, 0.0)
    p = engine.next_pass(0.0)
    assert p is not None and [e.request_id for e in p.entries] == ["a", "b"]
    assert (engine.num_running, engine.num_waiting) == (2, 1)
    _, first, emitted = run_until_idle_after(engine, p)
    assert first["c"] > first["b"] and emitted == {"a": 3, "b": 3, "c": 3}


def test_admission_waits_at_the_head_of_the_queue_until_blocks_fit():
    engine = Engine(EngineConfig(block_size=16, num_gpu_blocks=10))
    engine.add_request("a", prompt(144), 2, 0.0)  # 9 blocks, 10 once it decodes
    engine.add_request("b", prompt(48, start=1000), 1, 0.0)  # 3 blocks: does not fit beside a
    engine.add_request("c", prompt(16, start=2000), 1, 0.0)  # would fit, but FIFO: waits behind b
    p = engine.next_pass(0.0)
    assert p is not None and [e.request_id for e in p.entries] == ["a"]
    _, first, _ = run_until_idle_after(engine, p)
    assert first["a"] < first["b"] <= first["c"]
    assert engine.cache.num_active_blocks == 0


def test_a_request_short_of_blocks_preempts_the_newest_running_request_which_later_recomputes():
    engine = Engine(EngineConfig(block_size=4, num_gpu_blocks=4))
    engine.add_request("a", prompt(7), 3, 0.0)
    engine.add_request("b", prompt(7, start=100), 3, 0.0)
    passes, _, emitted = run_until_idle(engine)
    assert [p.preempted for p in passes] == [(), (), ("b",), ()]
    assert engine.num_preemptions == 1
    assert [e.request_id for e in passes[2].entries] == ["a"]
    readmission = passes[3].entries[0]
    assert (readmission.request_id, readmission.cached_tokens, readmission.new_tokens) == ("b", 4, 5)
    assert passes[3].prefill_tokens == 3  # prompt tokens only: its 2 recomputed generated ones are free
    assert readmission.finished
    assert emitted == {"a": 3, "b": 3}  # b keeps the tokens it generated before preemption
    assert engine.cache.num_active_blocks == 0


def test_generated_blocks_stay_cached_under_request_specific_hashes():
    engine = Engine(EngineConfig(block_size=16))
    engine.add_request("a", prompt(64), 40, 0.0)  # finishes holding 64 + 39 tokens: 6 full blocks
    run_until_idle(engine)
    assert engine.cache.num_cached_blocks == 6
    engine.add_request("b", prompt(64) + [0] * 39, 1, 1e6)  # same token ids as a's output
    p = engine.next_pass(1e6)
    assert p is not None and p.entries[0].cached_tokens == 64


def test_cancel_releases_blocks_and_drops_the_request_from_the_pass_in_flight():
    engine = Engine()
    engine.add_request("a", prompt(20_000), 4, 0.0)
    p = engine.next_pass(0.0)
    assert p is not None and engine.cache.num_active_blocks == 128  # blocks come chunk by chunk
    assert engine.cancel("a")
    assert engine.cache.num_active_blocks == 0 and engine.cache.num_cached_blocks == 128
    assert engine.finish_pass(p) == []
    assert engine.next_pass(p.end_ms) is None
    assert not engine.cancel("a")


def test_waiting_request_can_be_cancelled():
    engine = Engine()
    engine.add_request("a", prompt(10), 1, 0.0)
    assert engine.cancel("a") and not engine.has_work


def test_prompt_larger_than_the_pool_is_refused():
    engine = Engine(EngineConfig(block_size=16, num_gpu_blocks=4))
    with pytest.raises(RequestTooLarge) as info:
        engine.add_request("a", prompt(65), 1, 0.0)
    assert (info.value.prompt_blocks, info.value.num_gpu_blocks) == (5, 4)
    engine.add_request("b", prompt(64), 1, 0.0)


@pytest.mark.parametrize(
    "field, value", [("block_size", 0), ("num_gpu_blocks", -1), ("max_num_batched_tokens", 1.5)]
)
def test_config_rejects_non_positive_sizes_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})


def test_duplicate_request_id_is_refused():
    engine = Engine()
    engine.add_request("a", prompt(10), 1, 0.0)
    with pytest.raises(ValueError, match="already"):
        engine.add_request("a", prompt(10), 1, 0.0)


@pytest.mark.parametrize(("first_salt", "second_salt", "cached"), [
    ("tenant-a", "tenant-a", 960), ("tenant-a", "tenant-b", 0), ("tenant-a", None, 0), (None, None, 960),
])  # fmt: skip
def test_a_salted_prompt_reuses_only_blocks_of_its_own_salt(first_salt, second_salt, cached):
    """vLLM's `cache_salt`: blocks are keyed under the salt, so tenants never share a cache entry."""
    engine = Engine()
    engine.add_request("a", prompt(1000), 1, 0.0, cache_salt=first_salt)
    _, first, _ = run_until_idle(engine)
    engine.add_request("b", prompt(1000), 1, first["a"], cache_salt=second_salt)
    p = engine.next_pass(first["a"])
    assert p is not None and p.entries[0].cached_tokens == cached
