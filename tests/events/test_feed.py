"""RouterFeed: events reach the router of their worker's model; per-worker cache source states."""

import logging
import random

from extproc.events.counters import EventCounters
from extproc.events.feed import EVENT_FED, PREDICTED, STALE, RouterFeed
from extproc.router import KvRouter, RouterConfig, Worker, WorkerSpec, compute_block_hashes
from extproc.router.types import BlocksStored, StoredBlock

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
    feed.apply_events([stored(A, PROMPT)])
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
    feed.apply_events([stored(A, PROMPT), stored(B, PROMPT[:32])])
    hashes = compute_block_hashes(PROMPT, 16)
    assert first.indexer.find_matches(hashes) == {A: 4}
    assert second.indexer.find_matches(hashes) == {B: 2}
    assert feed.states() == {A: EVENT_FED, B: EVENT_FED}
