"""KvRouter behaviours that mutation testing found unpinned (issue 19): the engines' reported loads,
dumps around predicted blocks, and the fleet-sized decision's visits and ties."""

from __future__ import annotations

import random

import pytest

from extproc.router import (
    AllWorkersBusy,
    BlocksRemoved,
    BlocksStored,
    KvRouter,
    RadixTree,
    RouterConfig,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
)
from extproc.router.approx import is_predicted_id
from extproc.router.reported import ReportedLoad

from .clock import FakeClock

BS = 4
A, B = Worker("a"), Worker("b")


def two_workers(**config: object) -> tuple[KvRouter, FakeClock]:
    clock = FakeClock(50.0)
    router = KvRouter(
        RouterConfig(block_size=BS, prefill_load_model="none", **config),  # type: ignore[arg-type]
        clock=clock,
        rng=random.Random(1),
        workers=[WorkerSpec("a", total_blocks=100), WorkerSpec("b", total_blocks=100)],
    )
    return router, clock


# --- reported loads ---------------------------------------------------------------------------------


def test_a_report_is_kept_as_given_and_returned() -> None:
    router, _ = two_workers()
    got = router.set_reported_load(A, kv_usage=0.25, running=3, waiting=2, max_age_s=4.0, at=45.0)
    assert got == ReportedLoad(0.25, 3, 2, 45.0, 4.0)
    assert router.reported.get(A) == got
    stamped = router.set_reported_load(B, kv_usage=0.5, max_age_s=2.0)  # stamped with the clock
    assert stamped == ReportedLoad(0.5, None, None, 50.0, 2.0)


def test_reports_for_unknown_workers_or_ranks_are_refused_and_kept_nowhere() -> None:
    router, _ = two_workers()
    assert router.set_reported_load(Worker("zz"), kv_usage=1.0, max_age_s=5.0) is None
    assert router.set_reported_load(Worker("a", 1), kv_usage=1.0, max_age_s=5.0) is None
    assert len(router.reported) == 0


def test_a_fresh_full_report_makes_a_worker_busy_until_it_goes_stale() -> None:
    router, clock = two_workers(active_decode_blocks_threshold=0.5)
    router.set_reported_load(A, kv_usage=0.9, max_age_s=2.0)
    assert {router.best_worker([1, 2, 3, 4, 5]).worker for _ in range(20)} == {B}
    router.set_reported_load(B, kv_usage=0.95, max_age_s=2.0)
    with pytest.raises(AllWorkersBusy):
        router.best_worker([1, 2, 3, 4, 5])
    clock.advance(2.5)  # both reports stale: the router's own view (nothing in flight) decides
    assert {router.best_worker([1, 2, 3, 4, 5]).worker for _ in range(40)} == {A, B}


def test_a_report_dated_in_the_past_is_stale_from_its_date() -> None:
    router, _ = two_workers(active_decode_blocks_threshold=0.5)
    router.set_reported_load(A, kv_usage=1.0, max_age_s=2.0, at=47.0)  # 3 s old already
    router.set_reported_load(B, kv_usage=1.0, max_age_s=2.0, at=49.0)  # 1 s old: fresh
    assert {router.best_worker([1, 2, 3, 4, 5]).worker for _ in range(20)} == {A}


def test_a_removed_worker_comes_back_without_its_old_report() -> None:
    router, _ = two_workers(active_decode_blocks_threshold=0.5)
    router.set_reported_load(A, kv_usage=1.0, max_age_s=60.0)
    router.remove_worker("a")
    assert router.reported.get(A) is None
    router.add_worker(WorkerSpec("a", total_blocks=100))
    router.set_reported_load(B, kv_usage=1.0, max_age_s=60.0)
    assert router.best_worker([1, 2, 3, 4, 5]).worker == A


def test_a_dropped_rank_forgets_its_report() -> None:
    router, _ = two_workers()
    router.add_worker(WorkerSpec("a", dp_ranks=(0, 1), total_blocks=100))
    router.set_reported_load(Worker("a", 1), kv_usage=0.5, max_age_s=60.0)
    router.set_reported_load(A, kv_usage=0.5, max_age_s=60.0)
    router.add_worker(WorkerSpec("a", dp_ranks=(0,), total_blocks=100))
    assert router.reported.get(Worker("a", 1)) is None
    assert router.reported.get(A) is not None


# --- dumps ------------------------------------------------------------------------------------------


def rebuilt_from(events: list) -> tuple[RadixTree, list[bool]]:
    tree = RadixTree()
    return tree, [tree.apply_event(e) for e in events]


def test_a_dump_without_predictions_keeps_every_later_worker_after_a_dropped_stand_in_store() -> None:
    """A predicted run behind stand-ins (a predicted worker that lost a block) is dropped with its
    stand-ins' removal; the workers dumped after it are still in the dump."""
    router, _ = two_workers(use_kv_events=True)
    tokens = list(range(100, 100 + 6 * BS))
    hashes = compute_block_hashes(tokens, BS)
    router.best_worker(tokens, request_id="r", pinned_worker=A)  # a: 6 predicted blocks
    router.apply_event(BlocksStored(B, tuple(StoredBlock(900 + i, h) for i, h in enumerate(hashes[:2]))))
    router.set_event_fed(B, True)
    # a's first predicted block goes: its other blocks need stand-ins to be re-stored
    first = next(eid for w, eid, _ in router.indexer.entries() if w == A and is_predicted_id(eid))
    router.apply_event(BlocksRemoved(A, (first,)), feeds=False)
    everything = router.dump_events(include_predicted=True)
    assert any(isinstance(e, BlocksRemoved) for e in everything)  # stand-ins were needed
    events = router.dump_events()
    assert all(e.worker == B for e in events)
    tree, applied = rebuilt_from(events)
    assert all(applied)
    assert tree.find_matches(hashes) == {B: 2}
    for e in events:
        if isinstance(e, BlocksStored):
            assert not is_predicted_id(e.parent_hash)
            assert not any(is_predicted_id(b.engine_hash) for b in e.blocks)


def test_a_dump_keeps_the_reported_blocks_that_predictions_extend() -> None:
    """A worker whose event stream is incomplete keeps being predicted on top of the blocks it
    reported: the dump without predictions still holds those blocks (snapshots and replicas
    rebuild from it)."""
    router, _ = two_workers(use_kv_events=True)
    tokens = list(range(100, 100 + 4 * BS))
    hashes = compute_block_hashes(tokens, BS)
    reported = tuple(StoredBlock(900 + i, h) for i, h in enumerate(hashes[:2]))
    router.apply_event(BlocksStored(A, reported), feeds=False)
    router.best_worker(tokens, request_id="r", pinned_worker=A)  # predicted blocks 3 and 4 on top
    assert router.indexer.find_matches(hashes) == {A: 4}
    assert router.dump_events() == [BlocksStored(A, reported)]
    tree, applied = rebuilt_from(router.dump_events(include_predicted=True))
    assert all(applied) and tree.find_matches(hashes) == {A: 4}


PREDICTED = -(1 << 64) - 5  # an id in the router's predicted range


def test_a_dump_keeps_a_reported_run_behind_stand_ins_up_to_its_first_prediction() -> None:
    router, _ = two_workers(use_kv_events=True)
    hashes = compute_block_hashes(list(range(5 * BS)), BS)
    blocks = (*(StoredBlock(1 + i, h) for i, h in enumerate(hashes[:3])), StoredBlock(PREDICTED, hashes[3]))
    router.apply_event(BlocksStored(A, blocks), feeds=False)
    router.apply_event(BlocksRemoved(A, (1,)), feeds=False)  # the head goes: a stand-in replaces it
    router.apply_event(BlocksStored(B, (StoredBlock(7, hashes[0]),)))
    events = router.dump_events()
    tree, applied = rebuilt_from(events)
    assert all(applied)
    assert sorted((w.worker_id, eid) for w, eid, _ in tree.entries()) == [("a", 2), ("a", 3), ("b", 7)]
    assert tree.find_matches(hashes) == {B: 1}
    assert [type(e) for e in events] == [BlocksStored, BlocksRemoved, BlocksStored]
    assert events[-1] == BlocksStored(B, (StoredBlock(7, hashes[0]),))


def test_a_dump_drops_stores_under_a_predicted_parent() -> None:
    router, _ = two_workers(use_kv_events=True)
    hashes = compute_block_hashes(list(range(3 * BS)), BS)
    router.apply_event(BlocksStored(A, (StoredBlock(PREDICTED, hashes[0]),)), feeds=False)
    router.apply_event(BlocksStored(A, (StoredBlock(5, hashes[1]), StoredBlock(6, hashes[2])), PREDICTED))
    router.apply_event(BlocksStored(B, (StoredBlock(8, hashes[0]),)))
    other = compute_block_hashes(list(range(2 * BS)) + [77] * BS, BS)[2]
    b_blocks = (StoredBlock(9, hashes[1]), StoredBlock(10, other))
    router.apply_event(BlocksStored(B, b_blocks, 8))  # a's run splits: [P, 5], then [6]
    assert len(router.dump_events(include_predicted=True)) == 4
    # 5 follows a prediction: cut with it, and 6, whose parent is 5, too (it would be an orphan)
    assert router.dump_events() == [
        BlocksStored(B, (StoredBlock(8, hashes[0]), StoredBlock(9, hashes[1]))),
        BlocksStored(B, (StoredBlock(10, other),), 9),
    ]


# --- lifecycle --------------------------------------------------------------------------------------


def test_output_tokens_of_several_sequences_load_the_worker_for_each() -> None:
    def decode_blocks(sequences: int) -> float:
        router, _ = two_workers(router_track_output_blocks=True)
        router.best_worker(list(range(2 * BS)), request_id="r", pinned_worker=A)
        router.mark_prefill_complete("r")
        router.add_output_tokens("r", 3 * BS, sequences=sequences)
        return router.sequences.decode_blocks(A)

    one, two = decode_blocks(1), decode_blocks(2)
    assert one == 2 + 3  # the prompt's blocks and the output's
    assert two == 2 + 2 * 3  # the prompt is shared, each sequence writes its own output


def test_a_dump_ending_with_a_dropped_stand_in_store_ends_with_the_reported_blocks() -> None:
    router, _ = two_workers(use_kv_events=True)
    tokens = list(range(100, 100 + 6 * BS))
    hashes = compute_block_hashes(tokens, BS)
    reported = BlocksStored(B, (StoredBlock(900, hashes[0]),))
    router.apply_event(reported, feeds=False)  # b's slot comes first in the dump
    router.best_worker(tokens, request_id="r", pinned_worker=A)
    first = next(eid for w, eid, _ in router.indexer.entries() if w == A and is_predicted_id(eid))
    router.apply_event(BlocksRemoved(A, (first,)), feeds=False)  # a's predictions: behind a stand-in
    assert isinstance(router.dump_events(include_predicted=True)[-1], BlocksRemoved)
    assert router.dump_events() == [reported]


@pytest.mark.parametrize("option", ["router_assume_kv_reuse", "router_track_active_blocks"])
def test_predicted_blocks_are_named_by_their_chained_hashes_whatever_is_tracked_in_flight(option) -> None:
    """Approximate mode names each predicted block by its chained (sequence) hash, also when the
    in-flight tracking keys requests by local hashes: blocks of equal content at different places
    of a prompt are different blocks, predicted as many times as they occur."""
    router, _ = two_workers(use_kv_events=False, **{option: False})
    tokens = [7] * (4 * BS)  # four blocks of the same content: one local hash, four chained hashes
    router.best_worker(tokens, request_id="r", pinned_worker=A)
    local = compute_block_hashes(tokens, BS)
    assert len(set(local)) == 1
    assert router.indexer.find_matches(local) == {A: 4}
    predicted = sorted(eid for w, eid, _ in router.indexer.entries() if w == A)
    assert len(predicted) == 4


def test_the_best_overlap_counts_registered_workers_only() -> None:
    """Blocks of a worker that is not (or no longer) registered are in the index but are nobody's
    best overlap: the decision reports 0 when only such a worker caches the prompt."""
    router, _ = two_workers(use_kv_events=True)
    tokens = list(range(300, 300 + 3 * BS))
    hashes = compute_block_hashes(tokens, BS)
    ghost = Worker("ghost")
    router.apply_event(BlocksStored(ghost, tuple(StoredBlock(500 + i, h) for i, h in enumerate(hashes))))
    assert router.indexer.find_matches(hashes) == {ghost: 3}
    decision = router.best_worker(tokens)
    assert (decision.overlap_blocks, decision.best_overlap_blocks) == (0, 0)


def test_the_best_overlap_among_allowed_workers_is_theirs() -> None:
    router, _ = two_workers(use_kv_events=True)
    tokens = list(range(300, 300 + 3 * BS))
    hashes = compute_block_hashes(tokens, BS)
    router.apply_event(BlocksStored(A, tuple(StoredBlock(500 + i, h) for i, h in enumerate(hashes[:2]))))
    router.apply_event(BlocksStored(B, tuple(StoredBlock(600 + i, h) for i, h in enumerate(hashes))))
    only_a = router.best_worker(tokens, allowed_workers=["a"])
    assert (only_a.worker, only_a.overlap_blocks, only_a.best_overlap_blocks) == (A, 2, 2)
    both = router.best_worker(tokens, allowed_workers=["a", "b"])
    assert (both.worker, both.best_overlap_blocks) == (B, 3)


def test_a_router_configured_not_to_learn_pass_times_learns_nothing() -> None:
    clock = FakeClock(50.0)
    config = RouterConfig(block_size=BS, prefill_load_model="timing", learn_prefill_timing=False)
    router = KvRouter(config, clock=clock, workers=[WorkerSpec("a")])
    router.best_worker([1] * 4000, request_id="r")
    clock.advance(5.0)  # far slower than predicted
    router.mark_prefill_complete("r")
    assert router.sequences.learned_pass_time(A) is None
