"""RouterFeed: events reach the router of their worker's model; per-worker cache source states."""

import logging
import random

from extproc.events.counters import EventCounters
from extproc.events.feed import EVENT_FED, PREDICTED, STALE, RouterFeed
from extproc.router import KvRouter, RouterConfig, Worker, WorkerSpec, compute_block_hashes
from extproc.router.types import AllBlocksCleared, BlocksStored, StoredBlock

from ..router.clock import FakeClock

A, B = Worker("a"), Worker("b")
PROMPT = list(range(64))


def make() -> tuple[KvRouter, RouterFeed]:
    router = KvRouter(
        RouterConfig(block_size=16, use_kv_events=True),
        clock=FakeClock(),
        rng=random.Random(0),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    return router, RouterFeed({"a": router, "b": router}, EventCounters())


def stored(worker: Worker, tokens: list[int]) -> BlocksStored:
    hashes = compute_block_hashes(tokens, 16)
    return BlocksStored(worker, tuple(StoredBlock(1000 + i, h) for i, h in enumerate(hashes)))


def test_events_make_a_worker_event_fed_and_a_lost_stream_makes_it_stale(caplog):
    router, feed = make()
    assert feed.states() == {A: PREDICTED, B: PREDICTED}
    feed.apply_events([stored(A, PROMPT)])  # applied, but the transport has not said the stream is up
    assert feed.state(A) == PREDICTED and not router.is_event_fed(A)
    feed.stream_state(A, True, "rebuilt from replay")
    assert feed.state(A) == EVENT_FED and router.is_event_fed(A)
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, 16)) == {A: 4}
    with caplog.at_level(logging.INFO, logger="extproc.events"):
        feed.stream_state(A, False, "no answer from tcp://10.0.0.1:5557")
    assert feed.state(A) == STALE and not router.is_event_fed(A)
    assert "cache state event-fed -> stale (no answer from tcp://10.0.0.1:5557)" in caplog.text
    # the blocks it last knew stay usable while stale
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, 16)) == {A: 4}
    feed.reset_worker(A, "publisher restarted")
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, 16)) == {}
    feed.stream_state(A, True, "replayed")
    assert feed.state(A) == EVENT_FED and router.is_event_fed(A)


def test_events_for_unknown_workers_are_counted_not_applied():
    router, feed = make()
    feed.apply_events([stored(Worker("ghost"), PROMPT), stored(B, PROMPT)])
    assert feed.counters["feed.unknown_worker"] == 1 and feed.counters["feed.events"] == 1
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, 16)) == {B: 4}


def test_each_worker_feeds_the_router_of_its_model():
    clock = FakeClock()
    first = KvRouter(RouterConfig(block_size=16, use_kv_events=True), clock=clock, workers=[WorkerSpec("a")])
    second = KvRouter(RouterConfig(block_size=16, use_kv_events=True), clock=clock, workers=[WorkerSpec("b")])
    feed = RouterFeed({"a": first, "b": second})
    feed.stream_state(A, True, "first event")
    feed.stream_state(B, True, "first event")
    feed.apply_events([stored(A, PROMPT), stored(B, PROMPT[:32])])
    hashes = compute_block_hashes(PROMPT, 16)
    assert first.indexer.find_matches(hashes) == {A: 4}
    assert second.indexer.find_matches(hashes) == {B: 2}
    assert feed.states() == {A: EVENT_FED, B: EVENT_FED}


def stored_after(worker: Worker, parent: int, tokens: list[int], first_id: int) -> BlocksStored:
    hashes = compute_block_hashes(tokens, 16)
    return BlocksStored(worker, tuple(StoredBlock(first_id + i, h) for i, h in enumerate(hashes)), parent)


def test_a_store_under_an_unknown_block_makes_the_worker_stale_and_asks_for_a_resync(caplog):
    """The picker lost the worker's first blocks (a new picker, an event gap, a lost snapshot): the
    engine's next stores hang under blocks it never saw. The worker is not reported whole, the
    router predicts on top so new prompts are learned again, and its transport is asked to
    rebuild it."""
    router, feed = make()
    asked: list[str] = []
    feed.set_resync(A, asked.append)
    feed.stream_state(A, True, "first event")
    template, turn = PROMPT[:32], list(range(500, 532))
    with caplog.at_level(logging.WARNING, logger="extproc.events"):
        feed.apply_events([stored_after(A, 999_999, turn, 2000)])  # its parent 999999 was never seen
    assert feed.state(A) == STALE and feed.lost(A) and not router.is_event_fed(A)
    assert "parent 999999 is unknown" in feed.reason(A) and "event-fed -> stale" in caplog.text
    assert len(asked) == 1 and feed.counters["feed.orphaned"] == 1
    assert feed.counters.drops[("feed", "a", "unknown-parent")] == 1
    feed.apply_events([stored_after(A, 999_998, turn, 3000)])
    assert len(asked) == 1 and feed.counters["feed.orphaned"] == 2  # asked once per loss

    # new prompts are learned again: the router predicts what it routes to a stale worker
    fresh = template + list(range(700, 764))
    decision = router.best_worker(fresh, request_id="r1", allowed_workers=[A])
    assert decision.worker == A
    assert router.indexer.find_matches(compute_block_hashes(fresh, 16)).get(A) == 6
    assert feed.lossy() == [A]


def test_a_lost_view_is_whole_again_after_a_run_of_stores_under_known_blocks():
    router, feed = make()
    feed.recover_after_stores = 3
    feed.stream_state(A, True, "first event")
    feed.apply_events([stored(A, PROMPT)])
    feed.apply_events([stored_after(A, 424242, PROMPT, 5000)])
    assert feed.state(A) == STALE
    for i in range(2):
        feed.apply_events([stored_after(A, 1003 if i == 0 else 6000, list(range(900 + 16 * i, 916 + 16 * i)),
                                        6000 + i)])  # fmt: skip
        assert feed.state(A) == STALE
    feed.apply_events([stored_after(A, 6001, list(range(990, 1006)), 6002)])
    assert feed.state(A) == EVENT_FED and not feed.lost(A) and router.is_event_fed(A)


def test_an_engine_clear_or_a_reset_ends_the_loss():
    _, feed = make()
    feed.stream_state(A, True, "first event")
    feed.apply_events([stored_after(A, 1, PROMPT, 100)])
    assert feed.lost(A)
    feed.apply_events([AllBlocksCleared(A)])
    assert not feed.lost(A) and feed.state(A) == EVENT_FED
    feed.apply_events([stored_after(A, 1, PROMPT, 100)])
    assert feed.lost(A)
    feed.reset_worker(A, "rebuilding from replay")
    assert not feed.lost(A) and feed.state(A) == EVENT_FED
    assert feed.synced(A)


def test_a_worker_lost_from_its_first_event_is_never_reported_synced():
    _, feed = make()
    feed.stream_state(A, True, "first event")
    assert feed.synced(A)  # an empty view with a live stream: nothing known is wrong yet
    _, feed = make()
    feed.apply_events([stored_after(A, 77, PROMPT, 100)])  # orphan before the stream is up
    feed.stream_state(A, True, "first event")
    assert feed.state(A) == STALE and not feed.synced(A)


def test_what_was_predicted_before_a_workers_first_event_stays_if_that_event_is_an_orphan():
    """A picker started after the engines stored their template (or that lost it with a snapshot)
    predicts what it routes until it hears them. Its transport says the stream is up just before
    it applies the first event; if that event hangs under a block the picker never saw, what it
    predicted is all it knows of the prompts it routed: it stays. A first event that applies ends
    the predictions as before."""
    fresh = PROMPT[:32] + list(range(700, 764))
    for first_event, predictions_stay in ((stored_after(A, 999_999, fresh[32:], 2000), True),
                                          (stored(A, PROMPT), False)):  # fmt: skip
        router, feed = make()
        router.best_worker(fresh, request_id="r1", allowed_workers=[A])  # predicted: no event yet
        feed.stream_state(A, True, "first event on the subject")
        assert router.indexer.find_matches(compute_block_hashes(fresh, 16)) == {A: 6}
        feed.apply_events([first_event])
        assert feed.lost(A) == predictions_stay and router.is_event_fed(A) != predictions_stay
        overlap = router.indexer.find_matches(compute_block_hashes(fresh, 16))
        assert overlap == ({A: 6} if predictions_stay else {A: 2})  # else only the real PROMPT blocks


def test_events_of_a_dp_rank_the_worker_does_not_have_are_dropped_so_its_reset_leaves_nothing():
    """A worker with dp ranks 0 and 1: an event naming rank 5 (a crafted or misrouted batch, or a
    NATS event with another dp_rank) is counted and ignored, as are stream states and resets naming
    it; before, it was indexed under a (worker, rank) that no reset of the worker ever cleared."""
    router = KvRouter(
        RouterConfig(block_size=16, use_kv_events=True),
        clock=FakeClock(),
        workers=[WorkerSpec("a", dp_ranks=(0, 1))],
    )
    feed = RouterFeed({"a": router}, EventCounters())
    ghost, rank0, rank1 = Worker("a", 5), Worker("a", 0), Worker("a", 1)
    feed.stream_state(ghost, True, "first event on the subject")
    feed.apply_events([stored(ghost, PROMPT), stored(rank1, PROMPT[:32])])
    hashes = compute_block_hashes(PROMPT, 16)
    assert router.indexer.find_matches(hashes) == {rank1: 2}
    assert feed.counters["feed.unknown_dp_rank"] == 1 and feed.counters["feed.events"] == 1
    assert feed.counters.drops[("feed", str(ghost), "unknown-dp-rank")] == 1
    assert feed.counters["feed.unknown_worker"] == 0
    feed.reset_worker(ghost, "publisher restarted")
    assert ghost not in feed.states() and feed.state(ghost) == PREDICTED and not router.is_event_fed(ghost)
    for worker in (rank0, rank1):
        feed.reset_worker(worker, "publisher restarted")
    assert router.indexer.find_matches(hashes) == {} and router.indexer.num_blocks() == 0
