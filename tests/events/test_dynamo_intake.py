"""What happens to Dynamo's KV events once received (`extproc.events.dynamo_intake`), whichever
transport heard them: the event-id check, a worker's new publisher taken as its restart, the gate and
its restart hook, a failing sink. Envelopes are Dynamo 1.6.1's own (tests/nats/fixtures/dynamo-1.6.1/),
their publisher ids changed where a restart is wanted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import msgpack
import pytest

from extproc.events.counters import EventCounters
from extproc.events.dynamo_intake import DynamoEventIntake
from extproc.router.types import KvEvent, Worker

FIXTURES = Path(__file__).resolve().parents[1] / "nats" / "fixtures" / "dynamo-1.6.1"
W7 = Worker("7")


class Recorder:
    """An EventSink that records its calls; `fail` makes the named method raise."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def _call(self, name: str, *args: object) -> None:
        self.calls.append((name, *args))
        if name == self.fail:
            raise RuntimeError(f"{name} failed")

    def apply_events(self, events: Iterable[KvEvent]) -> None:
        self._call("apply_events", *events)

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self._call("reset_worker", worker, reason)

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        self._call("stream_state", worker, up, reason)


class ZmqIntake(DynamoEventIntake):
    source = "zmq_plane"


def envelope(name: str, publisher: int | None = None, event_id: int | None = None) -> bytes:
    data = msgpack.unpackb((FIXTURES / f"{name}.msgpack").read_bytes())
    if publisher is not None:
        data["publisher_id"] = publisher
    if event_id is not None:
        events = msgpack.unpackb(data["payload"])
        data["payload"] = msgpack.packb(
            [{**e, "event": {**e["event"], "event_id": event_id}} for e in events]
        )
    return msgpack.packb(data)


def names(sink: Recorder) -> list[str]:
    return [call[0] for call in sink.calls]


def test_only_a_workers_first_event_says_its_stream_is_up():
    sink = Recorder()
    intake = DynamoEventIntake(sink, EventCounters())
    intake.handle_event_plane(envelope("stored-root", event_id=1), "here")
    intake.handle_event_plane(envelope("stored-child", event_id=2), "here")
    assert names(sink) == ["stream_state", "apply_events", "apply_events"]
    assert sink.calls[0] == ("stream_state", W7, True, "first event on here")


def test_a_gap_is_logged_with_the_worker_and_counted_under_the_transports_source(caplog):
    counters = EventCounters()
    intake = ZmqIntake(Recorder(), counters)
    intake.handle_event_plane(envelope("stored-root", event_id=1), "there")
    with caplog.at_level(logging.WARNING):
        intake.handle_event_plane(envelope("stored-child", event_id=5), "there")
    assert "KV event gap from 7: expected event 2, got 5" in caplog.text
    assert counters["zmq_plane.gap"] == 1 and intake.gaps == 1
    assert counters.drops[("zmq_plane", "7", "event-id-gap")] == 3


def test_a_new_publisher_resets_the_worker_and_says_so(caplog):
    sink = Recorder()
    intake = ZmqIntake(sink, EventCounters())
    intake.handle_event_plane(envelope("stored-root", publisher=0xA1, event_id=1), "the plane")
    with caplog.at_level(logging.INFO, logger="extproc.events.dynamo"):
        intake.handle_event_plane(envelope("stored-child", publisher=0xB2, event_id=2), "the plane")
    assert ("reset_worker", W7, "its publisher restarted on the plane (a new publisher id)") in sink.calls
    assert "7: a new publisher (b2, was a1) on the plane: it restarted" in caplog.text
    assert intake.counters["zmq_plane.new_publisher"] == 1 and intake.gaps == 0


def test_a_new_publisher_of_a_worker_the_recovery_owns_is_left_to_it():
    sink = Recorder()
    intake = DynamoEventIntake(sink, EventCounters())
    told: list[Worker] = []
    intake.restarted = lambda worker: told.append(worker) or True
    intake.handle_event_plane(envelope("stored-root", publisher=1, event_id=1), "p")
    intake.handle_event_plane(envelope("stored-child", publisher=2, event_id=2), "p")
    assert told == [W7] and "reset_worker" not in names(sink)


def test_a_sink_that_fails_on_a_restart_is_counted_and_logged_and_the_event_still_applied(caplog):
    sink = Recorder(fail="reset_worker")
    intake = DynamoEventIntake(sink, EventCounters())
    intake.handle_event_plane(envelope("stored-root", publisher=1, event_id=1), "p")
    with caplog.at_level(logging.WARNING):
        intake.handle_event_plane(envelope("stored-child", publisher=2, event_id=2), "p")
    assert intake.counters["nats.sink_error"] == 1
    assert "resetting 7 after its restart failed" in caplog.text
    failed = [r for r in caplog.records if r.getMessage() == "event sink failed"]
    assert failed and failed[0].exc_info is not None
    assert names(sink)[-1] == "apply_events"


def test_a_sink_that_fails_on_an_event_is_counted_and_logged(caplog):
    intake = DynamoEventIntake(Recorder(fail="apply_events"), EventCounters())
    with caplog.at_level(logging.WARNING):
        intake.handle_event_plane(envelope("stored-root", event_id=1), "p")
    assert intake.counters["nats.sink_error"] == 1 and intake.counters["nats.event"] == 0
    assert "applying KV event 1 from 7 failed" in caplog.text
    failed = [r for r in caplog.records if r.getMessage() == "event sink failed"]
    assert failed and failed[0].exc_info is not None


@pytest.mark.parametrize("up", [True, False])
def test_the_link_state_is_reported_for_every_worker_heard(up):
    sink = Recorder()
    intake = DynamoEventIntake(sink, EventCounters())
    intake.handle_event_plane(envelope("stored-root", event_id=1), "p")
    intake.handle_event_plane(envelope("stored-dp1", event_id=1), "p")
    sink.calls.clear()
    intake.report_state(up, "the link")
    assert sink.calls == [
        ("stream_state", W7, up, "the link"),
        ("stream_state", Worker("7", 1), up, "the link"),
    ]
