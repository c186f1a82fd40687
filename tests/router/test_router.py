"""KvRouter end to end in memory: the worked example, loads, modes, overrides, pinning, lifecycle."""

import random

import pytest

from extproc.router import (
    AllWorkersBusy,
    BlocksRemoved,
    BlocksStored,
    InvalidConfig,
    KvRouter,
    NoWorkers,
    PinnedWorkerUnavailable,
    RadixTree,
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
    config.setdefault("prefill_load_model", "none")  # Dynamo's cost: these tests pin its formula
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


# --- what each argument and config field reaches (issue 19's surviving mutants) --------------------


def load_of(loads, worker):
    return next(load for load in loads if load.worker == worker)


def test_a_router_without_workers_lists_none_and_answers_no_workers():
    router = KvRouter(RouterConfig(block_size=BS), clock=FakeClock())
    assert router.workers() == [] and router.remove_worker("a") == []
    assert router.has_capacity()
    with pytest.raises(NoWorkers):
        router.best_worker(PROMPT)


def test_workers_are_listed_ints_first_then_strings_by_text_then_rank():
    for specs in (
        [WorkerSpec("1"), WorkerSpec(5, dp_ranks=(1, 0)), WorkerSpec("0")],
        [WorkerSpec("0"), WorkerSpec("1"), WorkerSpec(5, dp_ranks=(0, 1))],
    ):
        router = KvRouter(RouterConfig(block_size=BS), clock=FakeClock(), workers=specs)
        assert router.workers() == [Worker(5, 0), Worker(5, 1), Worker("0"), Worker("1")]


def test_a_spec_update_forgets_the_ranks_it_drops_and_keeps_the_others():
    router = KvRouter(
        RouterConfig(block_size=BS), clock=FakeClock(), workers=[WorkerSpec("a", dp_ranks=(0, 1))]
    )
    r0, r1 = Worker("a", 0), Worker("a", 1)
    cache(router, r0, PROMPT)
    cache(router, r1, PROMPT)
    router.best_worker(PROMPT, request_id="x0", pinned_worker=r0)
    router.best_worker(PROMPT, request_id="x1", pinned_worker=r1)
    router.add_worker(WorkerSpec("a", dp_ranks=(0,)))
    assert router.workers() == [r0]
    assert router.sequences.num_requests(r0) == 1 and router.sequences.num_requests(r1) == 0
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, BS)) == {r0: 8}


def test_removing_a_worker_returns_the_requests_of_every_rank():
    router = KvRouter(
        RouterConfig(block_size=BS), clock=FakeClock(), workers=[WorkerSpec("a", dp_ranks=(0, 1))]
    )
    router.best_worker(PROMPT, request_id="x0", pinned_worker=Worker("a", 0))
    router.best_worker(PROMPT, request_id="x1", pinned_worker=Worker("a", 1))
    assert sorted(router.remove_worker("a")) == ["x0", "x1"]


@pytest.mark.parametrize("how", ["remove", "reset"])
def test_a_worker_removed_or_reset_is_predicted_afresh_when_routed_again(how):
    router = make_router(use_kv_events=False)
    hashes = compute_block_hashes(PROMPT, BS)
    router.best_worker(PROMPT, request_id="r1", pinned_worker=A)
    if how == "remove":
        router.remove_worker("a")
        router.add_worker(WorkerSpec("a"))
    else:
        router.reset_worker_cache(A)
    assert router.indexer.find_matches(hashes) == {}
    router.best_worker(PROMPT, request_id="r2", pinned_worker=A)
    assert router.indexer.find_matches(hashes) == {A: 8}


def test_a_removed_event_fed_worker_comes_back_predicted():
    router = make_router()
    cache(router, A, PROMPT)
    assert router.is_event_fed(A)
    router.remove_worker("a")
    router.add_worker(WorkerSpec("a"))
    assert not router.is_event_fed(A)


def test_events_of_an_incomplete_stream_do_not_make_a_worker_event_fed():
    router = make_router()
    hashes = compute_block_hashes(PROMPT, BS)
    router.apply_event(BlocksStored(A, tuple(StoredBlock(h, h) for h in hashes)), feeds=False)
    assert not router.is_event_fed(A)
    assert router.indexer.find_matches(hashes) == {A: 8}


def test_switching_a_predicted_worker_to_predicted_changes_nothing():
    router = make_router()
    router.best_worker(PROMPT, request_id="r", pinned_worker=A)
    router.set_event_fed(A, False)
    assert not router.is_event_fed(A)
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, BS)) == {A: 8}


def test_dumped_events_keep_real_blocks_behind_stand_ins_and_after_predicted_workers():
    router = make_router()
    hashes = compute_block_hashes(PROMPT, BS)
    router.best_worker(PROMPT, request_id="r", pinned_worker=B)  # b predicted, dumped first
    events = [StoredBlock(100 + i, h) for i, h in enumerate(hashes)]
    router.apply_event(BlocksStored(A, tuple(events)))
    router.apply_event(BlocksRemoved(A, (100,)))  # a keeps blocks 2.. whose parent it lost
    cache(router, C, PROMPT[: 3 * BS])
    rebuilt = RadixTree()
    for event in router.dump_events():
        rebuilt.apply_event(event)
    assert rebuilt.find_matches(hashes) == {C: 3}
    assert rebuilt.num_blocks(A) == 7 and rebuilt.num_blocks(B) == 0


@pytest.mark.parametrize("kwargs", [{"lora_name": "adapter"}, {"cache_salt": "tenant-1"}])
def test_lora_and_cache_salt_reach_the_block_hashes(kwargs):
    router = make_router()
    namespaced = compute_block_hashes(
        PROMPT, BS, lora_name=kwargs.get("lora_name"), namespace=kwargs.get("cache_salt")
    )
    assert router.block_hashes(PROMPT, **kwargs) == namespaced != compute_block_hashes(PROMPT, BS)
    router.apply_event(BlocksStored(B, tuple(StoredBlock(h, h) for h in namespaced)))
    assert router.best_worker(PROMPT, **kwargs).worker == B
    assert router.best_worker(PROMPT, **kwargs).overlap_blocks == 8
    assert load_of(router.get_potential_loads(PROMPT, **kwargs), B).overlap_blocks == 8
    assert router.best_worker(PROMPT).overlap_blocks == 0


def output_blocks_added(track: bool, expected, *, via: str) -> float:
    router = make_router(router_track_output_blocks=track)
    if via == "best_worker":
        router.best_worker(PROMPT, request_id="r", pinned_worker=A, expected_output_tokens=expected)
    else:
        router.add_request(
            "r", A, compute_block_hashes(PROMPT, BS), len(PROMPT), 0, expected_output_tokens=expected
        )
    before = router.sequences.decode_blocks(A)
    router.add_output_tokens("r", 16)
    return router.sequences.decode_blocks(A) - before


@pytest.mark.parametrize("via", ["best_worker", "add_request"])
def test_output_blocks_follow_the_config_and_the_expected_output_length(via):
    assert output_blocks_added(False, None, via=via) == 0
    assert output_blocks_added(True, None, via=via) == 1.0
    assert output_blocks_added(True, 32, via=via) == 0.5


def test_a_request_tracked_for_another_replica_is_predicted_cached_there():
    router = make_router(use_kv_events=False)
    hashes = compute_block_hashes(PROMPT, BS)
    router.add_request("r", B, hashes, len(PROMPT), 0)
    assert router.indexer.find_matches(hashes) == {B: 8}
    router.add_request("r2", Worker("elsewhere"), hashes, len(PROMPT), 0)  # not ours: ignored
    assert "r2" not in router.sequences


def test_without_block_tracking_predictions_still_chain_blocks_by_position():
    # block y's tokens at the start of a prompt and after block x are different blocks
    router = make_router(use_kv_events=False, router_track_active_blocks=False)
    x, y = list(range(BS)), list(range(500, 500 + BS))
    router.best_worker(x + y, request_id="r1", pinned_worker=A)
    router.best_worker(y, request_id="r2", pinned_worker=A)
    assert router.indexer.find_matches(compute_block_hashes(y, BS)) == {A: 1}


def test_active_blocks_are_told_apart_by_position():
    router = make_router()
    x, y = list(range(BS)), list(range(500, 500 + BS))
    router.best_worker(x + y, request_id="r1", pinned_worker=A)
    router.best_worker(y, request_id="r2", pinned_worker=A)
    assert router.sequences.decode_blocks(A) == 3


def test_the_ttl_and_tree_bounds_reach_the_predictions():
    clock = FakeClock()
    router = KvRouter(
        RouterConfig(
            block_size=BS,
            use_kv_events=False,
            router_ttl_secs=10.0,
            router_max_tree_size=10,
            router_prune_target_ratio=0.5,
        ),
        clock=clock,
        workers=[WorkerSpec("a")],
    )
    router.best_worker(PROMPT, request_id="r1")
    router.best_worker([t + 10_000 for t in PROMPT], request_id="r2")  # 16 > 10: pruned to 5
    assert len(router.approx) == 5
    clock.advance(10.0)
    assert router.best_worker(PROMPT).overlap_blocks == 0 and len(router.approx) == 0


def test_no_kv_reuse_counts_every_requests_blocks():
    router = make_router(router_assume_kv_reuse=False)
    router.best_worker(PROMPT, request_id="r1", pinned_worker=A)
    router.best_worker(PROMPT, request_id="r2", pinned_worker=A)
    assert router.sequences.decode_blocks(A) == 16


def test_the_prefill_timing_reaches_the_timing_load_model():
    def prefill(timing):
        router = make_router(prefill_load_model="timing", prefill_timing=timing)
        return load_of(router.get_potential_loads(PROMPT), A).prefill_tokens

    assert prefill("0,0.01,10") != prefill("0,0.01,50")


def test_a_timer_measures_the_lookup_and_the_selection():
    ticks = iter([1_000, 1_150, 1_500])
    router = KvRouter(
        RouterConfig(block_size=BS), clock=FakeClock(), workers=[WorkerSpec("a")], timer=lambda: next(ticks)
    )
    decision = router.best_worker(PROMPT)
    assert (decision.match_ns, decision.select_ns) == (150, 350)
    assert decision.request_blocks == 8
    untimed = make_router().best_worker(PROMPT)
    assert (untimed.match_ns, untimed.select_ns) == (0, 0)


def test_the_best_overlap_is_over_the_allowed_candidates():
    router = make_router()
    cache(router, B, PROMPT)
    assert router.best_worker(PROMPT).best_overlap_blocks == 8
    assert router.best_worker(PROMPT, allowed_workers={"a", "c"}).best_overlap_blocks == 0
    assert router.best_worker(list(range(5000, 5128))).best_overlap_blocks == 0


def test_round_robin_over_two_workers_alternates_and_reports_no_cost():
    router = KvRouter(
        RouterConfig(block_size=BS, mode="round-robin"),
        clock=FakeClock(),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    decisions = [router.best_worker(PROMPT, request_id=f"r{i}") for i in range(3)]
    assert [d.worker for d in decisions] == [A, B, A]
    assert all(d.cost == 0.0 and d.costs == () for d in decisions)
    pinned = router.best_worker(PROMPT, pinned_worker="b")  # one candidate: its cost is reported
    assert [c.worker for c in pinned.costs] == [B] and pinned.cost == pinned.costs[0].cost > 0


def test_random_mode_reports_no_cost():
    decision = make_router(mode="random").best_worker(PROMPT)
    assert decision.cost == 0.0 and decision.costs == ()


def test_kv_mode_ignores_device_classes():
    router = KvRouter(
        RouterConfig(block_size=BS),
        clock=FakeClock(),
        workers=[WorkerSpec("gpu"), WorkerSpec("cpu", device="cpu")],
    )
    cache(router, Worker("cpu"), PROMPT)
    assert router.best_worker(PROMPT).worker == Worker("cpu")


def test_potential_loads_take_the_override_and_the_allowed_workers():
    router = make_router()
    cache(router, B, PROMPT)
    loads = router.get_potential_loads(PROMPT, config_override=RouterConfigOverride(overlap_score_weight=0))
    assert load_of(loads, B).overlap_blocks == 0 and load_of(loads, B).prefill_tokens == len(PROMPT)
    assert [load.worker for load in router.get_potential_loads(PROMPT, allowed_workers={"b"})] == [B]


def test_the_queue_threshold_admits_up_to_its_limit():
    router = KvRouter(
        RouterConfig(block_size=BS, router_queue_threshold=0.5),
        clock=FakeClock(),
        workers=[WorkerSpec("a", max_num_batched_tokens=256)],
    )
    router.best_worker(list(range(128)), request_id="r1")  # 128 = 0.5 x 256: still admitted
    assert router.has_capacity()
    router.best_worker([7], request_id="r2")
    assert not router.has_capacity()


def test_a_fractional_prefill_threshold_alone_excludes_a_busy_worker():
    router = KvRouter(
        RouterConfig(block_size=BS, active_prefill_tokens_threshold_frac=0.5),
        clock=FakeClock(),
        workers=[WorkerSpec("a", max_num_batched_tokens=100), WorkerSpec("b", max_num_batched_tokens=1000)],
    )
    router.best_worker(list(range(60)), request_id="r1", pinned_worker="a")  # 60 > 0.5 x 100
    router.best_worker(list(range(60)), request_id="r2", pinned_worker="b")
    assert router.best_worker(list(range(1000, 1060))).worker == B
    assert router.has_capacity() and not router.has_capacity(pinned_worker="a")


def test_unavailable_workers_are_named_in_the_errors():
    router = make_router(active_prefill_tokens_threshold=10)
    router.best_worker(PROMPT, request_id="r1", pinned_worker=A)
    with pytest.raises(PinnedWorkerUnavailable) as busy:
        router.best_worker(PROMPT, pinned_worker=A)
    assert (busy.value.worker, busy.value.reason) == (A, "busy")
    with pytest.raises(PinnedWorkerUnavailable) as unknown:
        router.best_worker(PROMPT, pinned_worker="zz")
    assert (unknown.value.worker, unknown.value.reason) == ("zz", "unknown or not allowed")
    router.best_worker(PROMPT, request_id="r2", pinned_worker=B)
    router.best_worker(PROMPT, request_id="r3", pinned_worker=C)
    with pytest.raises(AllWorkersBusy) as all_busy:
        router.best_worker(PROMPT, allowed_workers={"a", "b"})
    assert all_busy.value.candidates == 2


def test_an_unknown_threshold_is_refused_with_its_value():
    router = make_router()
    with pytest.raises(InvalidConfig) as caught:
        router.set_thresholds(active_decode_blocks=0.5)
    assert (caught.value.name, caught.value.value) == ("active_decode_blocks", 0.5)
    assert "active_decode_blocks_threshold" in caught.value.accepted


def test_found_overlaps_stand_in_for_the_routers_own_index():
    """A KV indexer's answer (`found`) is what a decision and the potential loads count, not the
    router's own tree; {} means nothing is known cached (a decision by load)."""
    router = make_router()
    cache(router, C, PROMPT)  # the router's own tree says c
    hashes = compute_block_hashes(PROMPT, BS)
    assert router.best_worker_for_hashes(hashes, len(PROMPT)).worker == C
    told = router.best_worker_for_hashes(hashes, len(PROMPT), found={A: 8})
    assert (told.worker, told.overlap_blocks, told.best_overlap_blocks) == (A, 8, 8)
    nothing = router.best_worker_for_hashes(hashes, len(PROMPT), found={})
    assert nothing.overlap_blocks == nothing.best_overlap_blocks == 0
    loads = {load.worker: load.overlap_blocks for load in router.get_potential_loads(PROMPT, found={B: 5})}
    assert loads == {A: 0, B: 5, C: 0}
    tracked = router.best_worker_for_hashes(hashes, len(PROMPT), request_id="r", found={B: 8})
    assert tracked.worker == B and router.sequences.prefill_tokens(B) == 0  # its 8 blocks: all cached
