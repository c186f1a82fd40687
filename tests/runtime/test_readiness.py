"""Readiness: workers known and, with KV events, every worker's first sync (or the grace period)."""

from __future__ import annotations

from extproc.events.counters import EventCounters
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker
from extproc.runtime.readiness import Readiness

from ..nats.sync_nodes import Node
from ..nats.test_replica_sync_routes import Homes
from ..picker_fixtures import MODEL, picker_config
from ..router.clock import FakeClock


def make(**router) -> tuple[EndpointPicker, RouterFeed, Readiness, FakeClock]:
    picker = EndpointPicker(picker_config(2, **router))
    counters = EventCounters()
    feed = RouterFeed(picker.routers_by_worker(), counters)
    clock = FakeClock()
    return picker, feed, Readiness(picker, EventSources(feed, counters), sync_grace_s=30, clock=clock), clock


def test_without_kv_events_known_workers_are_enough() -> None:
    _, _, readiness, _ = make()
    assert readiness.check().ready


def test_with_kv_events_every_worker_must_have_synced_once() -> None:
    _, feed, readiness, _ = make(use_kv_events=True)
    report = readiness.check()
    assert not report.ready and sorted(report.unsynced) == ["w0", "w1"]
    feed.stream_state(Worker("w0"), True, "rebuilt from replay")
    assert readiness.check().unsynced == ["w1"]
    feed.stream_state(Worker("w1"), True, "events arriving")
    feed.stream_state(Worker("w1"), False, "connection lost")  # a later outage does not unready
    assert readiness.check().ready


def test_a_silent_engine_holds_readiness_only_for_the_grace_period() -> None:
    _, feed, readiness, clock = make(use_kv_events=True)
    feed.stream_state(Worker("w0"), True, "events arriving")
    clock.advance(29)
    assert not readiness.check().ready
    clock.advance(1)
    report = readiness.check()
    assert report.ready and report.unsynced == ["w1"] and "without KV events" in report.reason


def test_no_workers_or_shutting_down_is_not_ready() -> None:
    picker, _, readiness, _ = make()
    picker.set_workers(MODEL, [])
    assert not readiness.check().ready
    picker.set_workers(MODEL, picker.config.workers)
    assert readiness.check().ready
    readiness.draining = True
    assert readiness.check().reason == "shutting down"


def test_a_replica_just_started_is_not_ready_until_another_hands_it_the_routes() -> None:
    _, _, readiness, _ = make()
    routes = Homes()
    routes.remember_response_home("resp_1", MODEL, Worker("w0"), "127.0.0.1:8000", "local")
    a, b = Node("a", "w0", routes=routes, inbox=True), Node("b", "w0", routes=Homes(), inbox=True)
    readiness.sources.replica_sync = b.sync
    b.sync._started_at = 0.0
    report = readiness.check()
    assert not report.ready and "routes" in report.reason
    b.hears(a)
    b.now = 5.0  # asked, not answered yet
    assert not readiness.check().ready
    b.deliver(a)
    while a.sync._answers:
        a.sync.tick(0.1)
    for _, payload in a.wire.replies:
        b.sync.handle_routes(payload)
    assert readiness.check().ready


def test_a_replica_whose_routes_never_come_is_ready_after_the_grace_period() -> None:
    _, _, readiness, clock = make()
    a, b = Node("a", "w0", routes=Homes(), inbox=True), Node("b", "w0", routes=Homes(), inbox=True)
    readiness.sources.replica_sync = b.sync
    b.sync._started_at = 0.0
    b.hears(a)  # asked; a never answers (it is asked again meanwhile)
    b.now = 100.0
    clock.advance(29.9)
    assert not readiness.check().ready
    clock.advance(0.1)
    assert readiness.check().ready
