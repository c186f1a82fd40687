"""KvRouter end to end in memory: the worked example, loads, modes, overrides, pinning, lifecycle."""

import random

import pytest

from extproc.router import (
    AllWorkersBusy,
    BlocksStored,
    KvRouter,
    NoWorkers,
    PinnedWorkerUnavailable,
    RouterConfig,
    RouterConfigOverride,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
    compute_costs,
)

from .clock import FakeClock

BS = 16
A, B, C = Worker("a"), Worker("b"), Worker("c")
PROMPT = list(range(1000, 1128))  # 8 full blocks


def make_router(**config) -> KvRouter:
    config.setdefault("block_size", BS)
    return KvRouter(
        RouterConfig(**config),
        clock=FakeClock(),
        rng=random.Random(7),
        workers=[WorkerSpec("a"), WorkerSpec("b"), WorkerSpec("c")],
    )


def cache(router: KvRouter, worker: Worker, tokens: list[int]) -> None:
    hashes = compute_block_hashes(tokens, BS)
    router.apply_event(BlocksStored(worker, tuple(StoredBlock(h ^ 0xABC, h) for h in hashes)))


def busy_with(router: KvRouter, worker: Worker, request_id: str, tokens: list[int]) -> None:
    router.best_worker(tokens, request_id=request_id, pinned_worker=worker)
    router.mark_prefill_complete(request_id)


def worked_example() -> KvRouter:
    """Costs 18, 10, 11 (weight 1): a cold but lightly loaded, b fully cached, c half cached."""
    router = make_router()
    busy_with(router, A, "a-bg", list(range(32)))  # 2 decode blocks
    cache(router, B, PROMPT)
    busy_with(router, B, "b-same", PROMPT)  # the prompt's 8 blocks already active on b
    busy_with(router, B, "b-bg", list(range(50, 82)))  # +2 decode blocks
    cache(router, C, PROMPT[: 5 * BS])
    return router


def test_worked_example_picks_the_second_worker():
    router = worked_example()
    decision = router.best_worker(PROMPT)
    assert {c.worker: c.cost for c in decision.costs} == {A: 18.0, B: 10.0, C: 11.0}
    assert (decision.worker, decision.overlap_blocks, decision.cost) == (B, 8, 10.0)
    assert tuple(decision) == ("b", 0, 8)


def test_a_probe_without_request_id_changes_no_state():
    router = worked_example()
    before = [(router.sequences.prefill_tokens(w), router.sequences.decode_blocks(w)) for w in (A, B, C)]
    for _ in range(3):
        router.best_worker(PROMPT)
    after = [(router.sequences.prefill_tokens(w), router.sequences.decode_blocks(w)) for w in (A, B, C)]
    assert before == after and len(router.sequences) == 3


def test_potential_loads_agree_with_the_decision():
    router = worked_example()
    loads = router.get_potential_loads(PROMPT)
    decision = router.best_worker(PROMPT)
    from_loads = {c.worker: c.cost for c in compute_costs(loads, BS, 1.0)}
    assert from_loads == {c.worker: c.cost for c in decision.costs}
    assert {ld.worker: ld.overlap_blocks for ld in loads} == {A: 0, B: 8, C: 5}
    assert min(from_loads, key=from_loads.get) == decision.worker


def test_formula_lines_are_logged_per_worker(caplog):
    router = make_router(log_formula=True)
    with caplog.at_level("INFO", logger="extproc.router"):
        router.best_worker(PROMPT)
    lines = [r.getMessage() for r in caplog.records]
    assert "Formula for worker_a: 16.0 = 1.0 * 8.0 + 8.0 (cached_blocks: 0)" in lines
    assert len(lines) == 3


def test_overrides_change_weight_and_temperature_for_one_request_only():
    router = worked_example()
    decision = router.best_worker(PROMPT, config_override=RouterConfigOverride(overlap_score_weight=0.0))
    assert {c.worker: c.cost for c in decision.costs} == {A: 10.0, B: 10.0, C: 8.0}
    assert decision.worker == C
    assert router.config.overlap_score_weight == 1.0
    seen = {
        router.best_worker(PROMPT, config_override=RouterConfigOverride(temperature=10.0)).worker
        for _ in range(200)
    }
    assert seen == {A, B, C}


def test_weight_zero_balances_load_without_looking_up_the_indexer():
    router = make_router(overlap_score_weight=0.0)
    cache(router, A, PROMPT)

    def fail(_):
        raise AssertionError("indexer consulted")

    router.indexer.find_matches = fail
    picks = set()
    for i in range(3):
        d = router.best_worker([t + i for t in PROMPT], request_id=f"r{i}")
        assert d.overlap_blocks == 0
        picks.add(d.worker)
    assert picks == {A, B, C}  # each new request avoids the loaded workers


def test_round_robin_and_random_modes():
    router = make_router(mode="round-robin")
    assert [router.best_worker(PROMPT, request_id=f"r{i}").worker for i in range(4)] == [A, B, C, A]
    assert router.best_worker(PROMPT).worker == B  # a probe does not advance the cursor
    router = make_router(mode="random")
    assert {router.best_worker(PROMPT).worker for _ in range(100)} == {A, B, C}


def test_busy_thresholds_exclude_workers_in_every_mode():
    for mode in ("kv", "round-robin", "random"):
        router = make_router(mode=mode, active_prefill_tokens_threshold=100)
        router.best_worker(PROMPT, request_id="x", pinned_worker=A)  # 128 prefill tokens > 100
        assert all(router.best_worker(PROMPT).worker != A for _ in range(20))
        router.best_worker(PROMPT, request_id="y", pinned_worker=B)
        router.best_worker(PROMPT, request_id="z", pinned_worker=C)
        with pytest.raises(AllWorkersBusy):
            router.best_worker(PROMPT)
        router.mark_prefill_complete("x")
        assert router.best_worker(PROMPT).worker == A


def test_pinned_worker_is_honoured_unless_busy_or_unknown():
    router = make_router(active_prefill_tokens_threshold=100)
    cache(router, B, PROMPT)
    assert router.best_worker(PROMPT, pinned_worker="a").worker == A
    router.best_worker(PROMPT, request_id="x", pinned_worker=A)
    with pytest.raises(PinnedWorkerUnavailable):
        router.best_worker(PROMPT, pinned_worker=A)
    with pytest.raises(PinnedWorkerUnavailable):
        router.best_worker(PROMPT, pinned_worker="nope")


def test_allowed_workers_restrict_the_candidates():
    router = make_router()
    cache(router, A, PROMPT)
    assert router.best_worker(PROMPT, allowed_workers={"b", "c"}).worker in {B, C}
    with pytest.raises(NoWorkers):
        router.best_worker(PROMPT, allowed_workers={"zzz"})
    with pytest.raises(NoWorkers):
        KvRouter(clock=FakeClock()).best_worker(PROMPT)


def test_lifecycle_returns_active_load_exactly_to_zero():
    router = make_router(router_track_output_blocks=True)
    rng = random.Random(3)
    ids = []
    for i in range(50):
        tokens = [rng.randrange(50) for _ in range(rng.randrange(1, 200))]
        router.best_worker(tokens, request_id=f"r{i}", expected_output_tokens=rng.choice([None, 30]))
        ids.append(f"r{i}")
        if rng.random() < 0.5:
            router.mark_prefill_complete(f"r{i}")
            router.add_output_tokens(f"r{i}", rng.randrange(100))
    rng.shuffle(ids)
    for rid in ids:
        assert router.free(rid)
        assert not router.free(rid)
    assert router.is_idle()
    assert all(
        router.sequences.decode_blocks(w) == 0 and router.sequences.prefill_tokens(w) == 0 for w in (A, B, C)
    )


def test_removing_a_worker_forgets_its_blocks_and_requests():
    router = make_router()
    cache(router, A, PROMPT)
    router.best_worker(PROMPT, request_id="x", pinned_worker=A)
    assert router.remove_worker("a") == ["x"]
    assert router.best_worker(PROMPT).worker in {B, C}
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, BS)) == {}
    assert router.is_idle()


def test_dp_ranks_are_routed_separately():
    router = KvRouter(
        RouterConfig(block_size=BS), clock=FakeClock(), workers=[WorkerSpec("x", dp_ranks=(0, 1))]
    )
    cache(router, Worker("x", 1), PROMPT)
    assert tuple(router.best_worker(PROMPT)) == ("x", 1, 8)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1),
        ("block_size", 0),
        ("mode", "fastest"),
        ("active_prefill_tokens_threshold_frac", 1.5),
        ("active_decode_blocks_threshold", 1.2),
        ("active_prefill_tokens_threshold", -1),
        ("active_prefill_tokens_threshold", 2.5),
    ],
)
def test_invalid_config_names_the_field_and_what_is_accepted(field, value):
    with pytest.raises(ValueError, match=f"invalid {field}=.*expected"):
        RouterConfig(**{field: value})


def test_a_request_added_from_another_replica_loads_the_worker_like_a_local_decision():
    local, remote = make_router(), make_router()
    hashes = compute_block_hashes(PROMPT, BS)
    decision = local.best_worker(PROMPT, request_id="r1", pinned_worker=B)
    remote.add_request("r1", B, hashes, len(PROMPT), decision.overlap_blocks)
    for router in (local, remote):
        assert router.sequences.prefill_tokens(B) == len(PROMPT)
        assert router.sequences.decode_blocks(B) == 8
    remote.add_request("r2", Worker("unknown"), hashes, len(PROMPT), 0)  # not ours: ignored
    for router in (local, remote):
        router.mark_prefill_complete("r1")
        assert router.sequences.prefill_tokens(B) == 0
        router.free("r1")
        assert router.is_idle()


def test_queue_capacity_follows_active_prefill_tokens_of_the_freshest_load():
    # threshold 0.01 of 8192 batched tokens = 81.92 tokens: one 128-token prompt saturates a worker
    router = make_router(router_queue_threshold=0.01)
    assert router.has_capacity()
    for worker, rid in ((A, "x"), (B, "y"), (C, "z")):
        router.best_worker(PROMPT, request_id=rid, pinned_worker=worker)
    assert not router.has_capacity()
    assert not router.has_capacity(allowed_workers={"a", "b"})
    router.mark_prefill_complete("y")  # b's prompt is prefilled: b has room again
    assert router.has_capacity()
    assert router.has_capacity(allowed_workers={"b"})
    assert not router.has_capacity(allowed_workers={"a", "c"})
    assert not router.has_capacity(pinned_worker="a")


def test_capacity_without_a_queue_threshold_means_some_worker_is_not_busy():
    router = make_router(active_prefill_tokens_threshold=100)
    assert router.has_capacity()
    for worker, rid in ((A, "x"), (B, "y"), (C, "z")):
        router.best_worker(PROMPT, request_id=rid, pinned_worker=worker)
    assert not router.has_capacity()
    router.free("z")
    assert router.has_capacity()


def test_thresholds_change_at_run_time_and_change_routing():
    router = make_router()
    assert router.thresholds() == {
        "active_decode_blocks_threshold": None,
        "active_prefill_tokens_threshold": None,
        "active_prefill_tokens_threshold_frac": None,
    }
    router.best_worker(PROMPT, request_id="x", pinned_worker=A)
    record = router.set_thresholds(active_prefill_tokens_threshold=100)
    assert record["active_prefill_tokens_threshold"] == 100
    assert all(router.best_worker(PROMPT).worker != A for _ in range(20))
    router.set_thresholds(active_decode_blocks_threshold=0.5)  # the other value stays
    assert router.thresholds()["active_prefill_tokens_threshold"] == 100
    router.set_thresholds(active_prefill_tokens_threshold=None)
    assert A in {router.best_worker(PROMPT).worker for _ in range(50)}


def test_invalid_threshold_changes_are_refused_and_change_nothing():
    router = make_router(active_prefill_tokens_threshold_frac=0.5)
    with pytest.raises(ValueError, match="active_prefill_tokens_threshold_frac"):
        router.set_thresholds(active_prefill_tokens_threshold_frac=2.0)
    with pytest.raises(ValueError, match="temperature"):
        router.set_thresholds(temperature=1.0)
    assert router.thresholds()["active_prefill_tokens_threshold_frac"] == 0.5


def test_decision_reports_the_best_overlap_available():
    router = make_router()
    cache(router, B, PROMPT)
    decision = router.best_worker(PROMPT, pinned_worker=A)
    assert (decision.overlap_blocks, decision.best_overlap_blocks) == (0, 8)


def test_a_preferred_worker_takes_the_request_when_eligible_and_is_replaced_otherwise():
    router = make_router(active_prefill_tokens_threshold=100)
    cache(router, B, PROMPT)
    assert router.best_worker(PROMPT, preferred_worker="a").worker == A  # over b's better overlap
    assert router.best_worker(PROMPT, preferred_worker="nope").worker == B  # unknown: usual choice
    assert router.best_worker(PROMPT, preferred_worker=A, allowed_workers={"b", "c"}).worker == B
    router.best_worker(PROMPT, request_id="x", pinned_worker=A)  # a is now busy
    assert router.best_worker(PROMPT, preferred_worker=A).worker == B
