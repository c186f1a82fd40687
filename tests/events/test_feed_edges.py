"""RouterFeed's less travelled paths: what each worker's cache source says and why (the reason an
operator reads in /debug/workers and the logs), losses counted and ended, a worker that left the
router and came back, workers another process is fed for, and what is logged at which level."""

import logging

from extproc.events.feed import EVENT_FED, PREDICTED, STALE, RouterFeed
from extproc.router import KvRouter, RouterConfig, Worker, WorkerSpec, compute_block_hashes
from extproc.router.types import AllBlocksCleared

from ..router.clock import FakeClock
from .test_feed import PROMPT, A, B, make, stored, stored_after

ORPHAN_WHY = (
    "a stored block's parent 999999 is unknown: blocks the engine holds were lost to the picker; "
    "predicting on top until resynchronised"
)


def messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def lose(feed: RouterFeed, worker: Worker = A, first_id: int = 2000) -> None:
    """A store of `worker` under a block the picker never saw: its view is lost."""
    feed.apply_events([stored_after(worker, 999_999, list(range(500, 532)), first_id)])


def test_a_worker_with_no_event_yet_says_so():
    _, feed = make()
    assert feed.reason(A) == "no KV events yet" and feed.state(A) == PREDICTED


def test_a_stream_down_before_any_event_keeps_the_worker_predicted_with_the_reason():
    _, feed = make()
    feed.stream_state(A, False, "no answer from tcp://10.0.0.1:5557")
    assert feed.states()[A] == PREDICTED and feed.reason(A) == "no answer from tcp://10.0.0.1:5557"


def test_what_is_logged_at_each_change_and_at_which_level(caplog):
    router, feed = make()
    with caplog.at_level(logging.INFO, "extproc.events"):
        feed.stream_state(A, True, "first event")
        lose(feed)
        feed.apply_events([AllBlocksCleared(A)])
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "worker a: cache state predicted -> event-fed (first event)"),
        (logging.WARNING, f"worker a: cache state event-fed -> stale ({ORPHAN_WHY})"),
        (
            logging.INFO,
            "worker a: its cache view is whole again (the engine cleared its cache; 1 orphaned stores)",
        ),
        (logging.INFO, "worker a: cache state stale -> event-fed (the engine cleared its cache)"),
    ]
    assert feed.reason(A) == "the engine cleared its cache" and router.is_event_fed(A)


def test_a_loss_counts_its_orphans_and_says_why_with_what_the_stream_said_after_it(caplog):
    _, feed = make()
    asked: list[str] = []
    feed.set_resync(A, asked.append)
    feed.stream_state(A, True, "first event")
    lose(feed)
    assert feed.reason(A) == ORPHAN_WHY and asked == ["a stored block's parent 999999 is unknown"]
    lose(feed, first_id=3000)
    lose(feed, first_id=4000)
    feed.stream_state(A, False, "no answer")
    assert feed.state(A) == STALE and feed.reason(A) == f"{ORPHAN_WHY}; stream: no answer"
    caplog.clear()
    with caplog.at_level(logging.INFO, "extproc.events"):
        feed.reset_worker(A, "publisher restarted")
    assert messages(caplog) == [
        "worker a: forgetting its cached blocks (publisher restarted)",
        "worker a: its cache view is whole again (reset (publisher restarted); 3 orphaned stores)",
    ]  # still stale: its stream is down
    assert feed.state(A) == STALE and feed.reason(A) == "reset (publisher restarted)"
    assert feed.counters["feed.reset"] == 1


def test_an_orphan_within_a_run_of_good_stores_starts_the_run_over():
    router, _ = make()
    feed = RouterFeed({"a": router, "b": router}, recover_after_stores=2)
    feed.stream_state(A, True, "first event")
    feed.apply_events([stored(A, PROMPT)])
    lose(feed)
    known = 1003  # PROMPT's last block: stores under it hang under known blocks
    feed.apply_events([stored_after(A, known, list(range(900, 916)), 6000)])
    lose(feed, first_id=3000)
    feed.apply_events([stored_after(A, 6000, list(range(916, 932)), 6001)])
    assert feed.lost(A)  # one good store since the last orphan
    feed.apply_events([stored_after(A, 6001, list(range(932, 948)), 6002)])
    assert not feed.lost(A) and feed.reason(A) == "2 stores in a row under known blocks"


def test_a_loss_ends_after_a_hundred_good_stores_by_default():
    router, feed = make()
    feed.stream_state(A, True, "first event")
    feed.apply_events([stored(A, PROMPT)])
    lose(feed)
    parent = 1003
    for i in range(99):
        feed.apply_events([stored_after(A, parent, list(range(10_000 + 16 * i, 10_016 + 16 * i)), 7000 + i)])
        parent = 7000 + i
    assert feed.lost(A)
    feed.apply_events([stored_after(A, parent, list(range(20_000, 20_016)), 8000)])
    assert not feed.lost(A) and router.is_event_fed(A)


def test_an_orphan_in_a_batch_does_not_stop_the_rest_of_it():
    router, feed = make()
    feed.stream_state(A, True, "first event")
    feed.stream_state(B, True, "first event")
    feed.apply_events(
        [
            stored_after(A, 999_999, PROMPT, 2000),
            stored(B, PROMPT),
            stored(A, PROMPT[:16]),
            AllBlocksCleared(B),
        ]
    )
    assert feed.counters["feed.events"] == 3 and feed.counters["feed.orphaned"] == 1
    assert router.indexer.find_matches(compute_block_hashes(PROMPT, 16)) == {A: 1}


def test_a_resync_taken_back_is_not_asked():
    _, feed = make()
    asked: list[str] = []
    feed.set_resync(A, asked.append)
    feed.set_resync(A, None)
    feed.set_resync(B, None)  # none registered: nothing to take back
    feed.stream_state(A, True, "first event")
    lose(feed)
    assert asked == []


def test_a_clear_on_a_whole_worker_says_so_and_a_reset_of_one_changes_nothing_it_says():
    _, feed = make()
    feed.stream_state(A, True, "first event")
    feed.apply_events([stored(A, PROMPT)])
    feed.reset_worker(A, "rebuilding from replay")
    assert feed.reason(A) == "first event" and feed.state(A) == EVENT_FED  # nothing was wrong
    feed.apply_events([AllBlocksCleared(A)])
    assert feed.reason(A) == "the engine cleared its cache" and feed.state(A) == EVENT_FED


def test_a_reset_worker_is_event_fed_as_soon_as_its_stream_is_up():
    """Its view is rebuilt from the engine's own state (a replay, a snapshot): no prediction of the
    router's is kept, even before its next event."""
    router, feed = make()
    feed.reset_worker(A, "replaying")
    feed.stream_state(A, True, "replayed")
    assert router.is_event_fed(A) and feed.state(A) == EVENT_FED


def test_a_worker_that_left_the_router_and_came_back_is_event_fed_again_by_its_next_event():
    """Discovery dropped the worker and brought it back: the router forgot it was event-fed, the
    feed still knows its stream is up."""
    router, feed = make()
    feed.stream_state(A, True, "first event")
    feed.apply_events([stored(A, PROMPT)])
    router.remove_worker("a")
    router.add_worker(WorkerSpec("a"))
    assert not router.is_event_fed(A)
    feed.apply_events([stored(A, PROMPT[:32])])
    assert router.is_event_fed(A)


def test_a_worker_fed_elsewhere_is_event_fed_with_the_reason():
    router, feed = make()
    feed.fed_elsewhere(A, "the KV indexer at http://10.0.0.9:8090 consumes its events")
    assert router.is_event_fed(A) and not router.is_event_fed(B)
    assert (
        feed.state(A) == EVENT_FED
        and feed.reason(A) == "the KV indexer at http://10.0.0.9:8090 consumes its events"
    )
    assert feed.synced(A)
    feed.fed_elsewhere(Worker("ghost"), "not routed here")  # no router: nothing to switch, no error


def test_events_of_unknown_workers_and_dp_ranks_are_logged_with_who(caplog):
    router = KvRouter(
        RouterConfig(block_size=16, use_kv_events=True),
        clock=FakeClock(),
        workers=[WorkerSpec("a", dp_ranks=(0, 1))],
    )
    feed = RouterFeed({"a": router})
    with caplog.at_level(logging.WARNING, "extproc.events"):
        feed.apply_events([stored(Worker("ghost"), PROMPT), stored(Worker("a", 5), PROMPT)])
    assert messages(caplog) == [
        "KV event for worker ghost, which is not in the worker list: ignored",
        "KV event for a/dp5: worker a has no dp rank 5: ignored",
    ]
