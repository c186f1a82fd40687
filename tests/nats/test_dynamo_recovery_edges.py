"""Edges of the recovery of Dynamo workers from their local indexers (extproc.events.dynamo_recovery)
that tests/nats/test_dynamo_recovery*.py leave out: a response stream broken in each way the request
plane allows, what the recovery logs, counts and tells the router at each step, and the file store's
less common entries. The wire cases play the worker side as `test_dynamo_recovery_wire` does (read
from Dynamo 1.6.1's codec); `test_dynamo_recovery` runs the same queries against Dynamo's own worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from extproc.config.events import EventsConfig
from extproc.events.counters import EventCounters
from extproc.events.dynamo_recovery import (
    FAILED,
    MAX_FRAME,
    TOO_NEW,
    TREE_DUMP,
    IndexerAnswer,
    LocalIndexerRecovery,
    QueryTarget,
    RecoveryError,
    query_local_indexer,
    read_file_sources,
    start_recovery,
)
from extproc.router.types import BlocksStored, KvEvent, StoredBlock, Worker

from . import test_dynamo_recovery_wire as wire
from .conftest import make_feed, make_router
from .test_dynamo_recovery_merge import TARGET, W8, Worker8, dump, events, live, raw, recovery_of

played = wire.played  # the scripted worker's request plane server (a fixture)

PROLOGUE = wire.two_part(b'{"error":null}')
SENTINEL = wire.two_part(b'"sentinel"')
A_DUMP = {"TreeDump": {"events": [], "last_event_id": 4}}


def data(answer: Any, *, final: bool = False) -> bytes:
    return wire.two_part(b"", msgpack.packb({"data": answer, "complete_final": final}))


class Responder:
    """A worker's reply: acknowledge, then open the response stream and send `handshake` (the right
    one by default) and `frames`; with `hold`, keep that stream open until the test ends it."""

    def __init__(self, *frames: bytes, handshake: bytes | None = None, hold: bool = False) -> None:
        self.frames, self.handshake = frames, handshake
        self.released = asyncio.Event()
        if not hold:
            self.released.set()
        self.closed = asyncio.Event()  # the worker's end of the response stream is closed
        self.eof_seen = False  # the picker closed its end first

    async def __call__(self, control: dict[str, Any], request: Any, writer: asyncio.StreamWriter) -> None:
        writer.write(wire.ACK)
        info = json.loads(control["connection_info"]["info"])
        host, port = info["address"].rsplit(":", 1)
        reader, back = await asyncio.open_connection(host.strip("[]"), int(port))
        try:
            handshake = self.handshake
            if handshake is None:
                subject = {"subject": info["subject"], "stream_type": "response"}
                handshake = wire.two_part(json.dumps(subject).encode())
            back.write(handshake + b"".join(self.frames))
            await back.drain()
            waiting = asyncio.ensure_future(self.released.wait())
            eof = asyncio.ensure_future(reader.read())
            await asyncio.wait([waiting, eof], return_when=asyncio.FIRST_COMPLETED)
            self.eof_seen = eof.done()
            for task in (waiting, eof):
                task.cancel()
        finally:
            back.close()
            self.closed.set()

    async def end(self) -> None:
        self.released.set()
        await asyncio.wait_for(self.closed.wait(), 5)


# --- the response stream -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handshake", "frames", "message"),
    [
        (b"", (), "^the response stream closed before its handshake$"),
        (wire.two_part(b""), (), "unexpected response handshake None"),
        (wire.two_part(b"[1]"), (), r"unexpected response handshake \[1\]"),
        (wire.two_part(b'{"subject":"another query"}'), (), "unexpected response handshake {'subject'"),
        (None, (PROLOGUE, wire.two_part(b'{"x":1}')), "unexpected control frame {'x': 1}"),
        (None, (PROLOGUE, wire.two_part(b'["error"]')), r"unexpected control frame \['error'\]"),
        (None, (PROLOGUE, SENTINEL), "expected one answer after the prologue, got 0"),
        (None, (data(A_DUMP, final=True),), "expected one answer after the prologue, got 1"),
        (None, (PROLOGUE, data(A_DUMP), data(A_DUMP), SENTINEL), "expected one answer .* got 2"),
        (None, (PROLOGUE, struct.pack(">QQQ", 0, MAX_FRAME + 1, 0)), f"a response frame of {MAX_FRAME + 1} "),
        (None, (PROLOGUE, struct.pack(">QQQ", 1 << 63, 0, 0)), f"a response frame of {1 << 63} bytes"),
        (None, (PROLOGUE, data({"TreeDump": {"events": []}}, final=True)), "without its last_event_id: None"),
        (None, (PROLOGUE, data({"Events": {"events": [], "last_event_id": "7"}})), "last_event_id: '7'"),
        (None, (PROLOGUE, data({**A_DUMP, "Events": {}}, final=True)), "unexpected answer"),
    ],
    ids=[
        "closed-before-handshake", "empty-handshake", "list-handshake", "another-subject",
        "unknown-control", "list-control", "sentinel-first", "no-prologue", "two-answers",
        "oversized-frame", "u64-length", "dump-without-last-id", "last-id-not-a-number", "two-tags",
    ],
)  # fmt: skip
async def test_a_broken_response_stream_fails_the_query_and_says_how(played, handshake, frames, message):
    played.reply = Responder(*frames, handshake=handshake)
    with pytest.raises(RecoveryError, match=message):
        await query_local_indexer(played.target(), None, timeout_s=10)


async def test_a_frame_of_the_largest_size_allowed_is_waited_for(played):
    held = Responder(PROLOGUE, struct.pack(">QQQ", 0, MAX_FRAME, 0), hold=True)
    played.reply = held
    try:
        with pytest.raises(TimeoutError):  # not refused: its bytes would come
            await query_local_indexer(played.target(), None, timeout_s=0.5)
    finally:
        await held.end()


async def test_the_final_answer_ends_the_query_without_waiting_for_the_sentinel(played):
    held = Responder(PROLOGUE, wire.two_part(b"", msgpack.packb([1])), data(A_DUMP, final=True), hold=True)
    played.reply = held
    try:
        answer = await query_local_indexer(played.target(), None, timeout_s=5)
        assert (answer.kind, answer.last_event_id) == (TREE_DUMP, 4)  # a body not a map was skipped
        # and its response stream is closed by then, from the picker's side
        assert not [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "on_stream"]  # type: ignore[union-attr]
        await asyncio.wait_for(held.closed.wait(), 5)
        assert held.eof_seen
    finally:
        await held.end()


@pytest.mark.parametrize(
    ("answer", "kind", "detail"),
    [
        ({"TooNew": {"requested_start": 9, "newest_available": 3}}, TOO_NEW,
         '{"requested_start": 9, "newest_available": 3}'),
        ({"InvalidRange": {"start": 9, "end": 2}}, FAILED, "InvalidRange: {'start': 9, 'end': 2}"),
        ({"Events": ["not", "a", "map"]}, FAILED, "Events: ['not', 'a', 'map']"),
        ({"Error": "the tree dump failed"}, FAILED, "Error: 'the tree dump failed'"),
        ({"TooNew": {"newest_available": b"\x01"}}, TOO_NEW, '{"newest_available": "b\'\\\\x01\'"}'),
    ],
)  # fmt: skip
async def test_an_answer_that_is_not_events_comes_back_with_its_detail(played, answer, kind, detail):
    played.reply = Responder(PROLOGUE, data(answer, final=True))
    got = await query_local_indexer(played.target(), 5, timeout_s=5)
    assert (got.kind, got.events, got.last_event_id, got.detail) == (kind, [], None, detail)


async def test_a_refusal_in_bytes_that_are_not_utf8_is_reported_readably(played):
    async def refuse(control: dict[str, Any], request: Any, writer: asyncio.StreamWriter) -> None:
        text = b"Server unavailable: \xff busy"
        writer.write(struct.pack(">I", len(text)) + text)

    played.reply = refuse
    with pytest.raises(RecoveryError, match="refused the query: Server unavailable: \ufffd busy"):
        await query_local_indexer(played.target(), None, timeout_s=5)


async def test_a_worker_that_closes_before_its_acknowledgement_fails_the_query_as_a_recovery_error(played):
    async def close(control: dict[str, Any], request: Any, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x00\x00")  # half a length, then the connection closes

    played.reply = close
    with pytest.raises(
        RecoveryError, match=r"^the worker closed the connection before acknowledging the query$"
    ):
        await query_local_indexer(played.target(), None, timeout_s=5)


async def test_a_worker_that_keeps_closing_before_its_acknowledgement_is_given_back_not_held_forever(played):
    async def close(control: dict[str, Any], request: Any, writer: asyncio.StreamWriter) -> None:
        pass  # the connection closes without an answer (a worker that crashed meanwhile)

    played.reply = close
    sink = Sink()
    recovery = LocalIndexerRecovery(sink, lambda: [played.target()], retries=1, backoff_s=0.0)
    await recovery.start()
    assert recovery.take(Worker("8", 1), 1, None)  # held while the worker is asked
    await asyncio.wait_for(recovery.wait_idle(), 10)
    assert not recovery.owns(Worker("8", 1)) and len(played.requests) == 2


async def test_each_query_has_its_own_ids_and_sends_its_range_and_a_long_path_whole(played):
    played.reply = Responder(PROLOGUE, data(A_DUMP, final=True))
    long_path = "e607/ns1/backend/" + "q" * 40_000  # over 32 KiB: its length is a u16
    target = QueryTarget(8, 1, 0x2ABC, "127.0.0.1", played.target().port, long_path)
    await query_local_indexer(target, 3, 9, timeout_s=5)
    await query_local_indexer(target, None, timeout_s=5)
    (path, _, first, request), (_, _, second, _) = played.requests
    assert path == long_path and request["start_event_id"] == 3 and request["end_event_id"] == 9
    ids = {first["id"], second["id"]}
    subjects = {json.loads(c["connection_info"]["info"])["subject"] for c in (first, second)}
    assert len(ids) == 2 and len(subjects) == 2 and "None" not in ids | subjects


@pytest.mark.parametrize(("host", "address"), [("::1", "[::1]:"), ("127.0.0.2", "127.0.0.")])
async def test_the_query_goes_to_the_advertised_host_and_names_an_address_the_worker_can_dial(host, address):
    worker = wire.PlayedWorker()
    worker.server = await asyncio.start_server(worker.handle, host, 0)
    try:
        worker.reply = Responder(PROLOGUE, data(A_DUMP, final=True))
        port = worker.server.sockets[0].getsockname()[1]
        answer = await query_local_indexer(QueryTarget(8, 0, 1, host, port, "p"), None, timeout_s=5)
        assert answer.kind == TREE_DUMP
        ((_, _, control, _),) = worker.requests
        assert json.loads(control["connection_info"]["info"])["address"].startswith(address)
    finally:
        worker.server.close()
        await worker.server.wait_closed()


# --- what the recovery logs, counts and tells the router -----------------------------------------


class Sink:
    """The router's side: what was applied, and each reset and stream state with its reason."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any, str]] = []

    def apply_events(self, events: Iterable[KvEvent]) -> None:
        self.log += [("apply", e.event_id, "") for e in events]

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.log.append(("reset", worker, reason))

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        self.log.append(("up" if up else "down", worker, reason))


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("extproc.events")]


async def test_each_step_of_a_workers_recovery_is_logged_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="extproc.events")
    counters = EventCounters()
    worker = Worker8(dump(3, 101, 102), events(4, 5), dump(1, 201), dump(2, 202), dump(3, 203))
    sink = Sink()
    recovery = recovery_of(worker, sink, counters=counters)
    assert await recovery.start() == 1
    await recovery.wait_idle()
    assert sink.log[:2] == [
        ("up", W8, "rebuilt from its local indexer"),
        ("reset", W8, "rebuilt from its local indexer (up to event 3)"),
    ]
    assert recovery.take(W8, 6, live(6))  # 4 and 5 were lost: held, and asked for
    await recovery.wait_idle()
    assert recovery.take(W8, 1, live(1))  # an id going back: the publisher restarted
    await recovery.wait_idle()
    assert recovery.restarted(W8)  # told so by the event plane
    await recovery.wait_idle()
    recovery.resync(W8, "a stored block's parent 77 is unknown")
    await recovery.wait_idle()
    assert messages(caplog) == [
        "recovering 1 Dynamo workers from their local indexers",
        "8: rebuilt from its local indexer: 2 events up to event 3",
        "8: events 4..5 missing; asking its local indexer",
        "8: event 1 after 6: its publisher restarted; rebuilding it",
        "8: rebuilt from its local indexer: 1 events up to event 1",
        "8: its publisher restarted; rebuilding it",
        "8: rebuilt from its local indexer: 1 events up to event 2",
        "8: rebuilding it from its local indexer (a stored block's parent 77 is unknown)",
        "8: rebuilt from its local indexer: 1 events up to event 3",
    ]
    assert {k: n for k, n in counters.snapshot().items() if k.startswith("recovery.")} == {
        "recovery.dump": 4,
        "recovery.catch_up": 1,
        "recovery.gap": 1,
        "recovery.restart": 2,
        "recovery.resync": 1,
    }
    assert worker.starts == [None, 4, None, None, None] and recovery.cursor(W8) == 3


async def test_a_worker_given_back_is_logged_with_why_and_for_how_long(caplog):
    caplog.set_level(logging.INFO, logger="extproc.events")
    counters = EventCounters()
    recovery = recovery_of(Worker8(OSError("refused"), RecoveryError()), Sink(), counters=counters, retries=1)
    await recovery.start()
    await recovery.wait_idle()
    assert messages(caplog)[1:] == [
        "querying 8's local indexer failed (1 of 2): refused",
        "querying 8's local indexer failed (2 of 2): RecoveryError",  # no text: its type
        "8: its local indexer could not be queried (RecoveryError); its events are applied as they "
        "come, without recovery, for 30 s",
    ]
    assert not recovery.owns(W8)


async def test_retries_back_off_doubling_from_the_first_delay():
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    worker = Worker8(OSError("1"), OSError("2"), OSError("3"), dump(1, 101), OSError("4"), dump(2, 102))
    recovery = LocalIndexerRecovery(
        Sink(), lambda: [TARGET], query=worker.query, backoff_s=0.5, retries=3, sleep=sleep
    )
    await recovery.start()
    await recovery.wait_idle()
    assert slept == [0.5, 1.0, 2.0] and recovery.owns(W8)
    recovery.resync(W8, "again")  # each recovery counts its own failures
    await recovery.wait_idle()
    assert slept == [0.5, 1.0, 2.0, 0.5] and recovery.cursor(W8) == 2


async def test_an_answer_within_a_recovery_starts_its_failure_count_over():
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    too_new = IndexerAnswer(TOO_NEW, detail="newest 2")  # an answer: then a dump, in the same recovery
    worker = Worker8(dump(5), OSError("1"), OSError("2"), too_new, OSError("3"), OSError("4"), dump(7, 102))
    recovery = LocalIndexerRecovery(
        Sink(), lambda: [TARGET], query=worker.query, backoff_s=0.5, retries=2, sleep=sleep
    )
    await recovery.start()
    await recovery.wait_idle()
    assert recovery.take(W8, 7, live(7))  # 6 missing
    await recovery.wait_idle()
    assert worker.starts == [None, 6, 6, 6, None, None, None]
    assert slept == [0.5, 1.0, 0.5, 1.0] and recovery.cursor(W8) == 7 and recovery.owns(W8)


async def test_a_failed_answer_is_retried_and_its_detail_reported(caplog):
    caplog.set_level(logging.WARNING, logger="extproc.events")
    failed = IndexerAnswer(FAILED, detail="InvalidRange: {'start': 9}")
    recovery = recovery_of(Worker8(failed, dump(1, 101)), Sink())
    await recovery.start()
    await recovery.wait_idle()
    assert messages(caplog) == ["querying 8's local indexer failed (1 of 9): InvalidRange: {'start': 9}"]
    assert recovery.cursor(W8) == 1


async def test_an_unexpected_failure_gives_the_worker_back_with_its_held_events_applied(caplog):
    worker, sink = Worker8(RuntimeError("a bug"), dump(1, 101)), Sink()
    worker.released.clear()
    recovery = recovery_of(worker, sink)
    await recovery.start()
    assert recovery.take(W8, 1, live(1))
    worker.released.set()
    await recovery.wait_idle()
    assert not recovery.owns(W8) and [x for kind, x, _ in sink.log if kind == "apply"] == [1]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["8: its recovery from its local indexer failed"]
    assert "8: its local indexer could not be queried (RuntimeError: a bug)" in messages(caplog)[-1]


async def test_a_released_worker_is_not_taken_again_until_its_time_is_up():
    now = [100.0]
    worker, sink = Worker8(OSError("down"), dump(2, 101)), Sink()
    recovery = recovery_of(worker, sink, retries=0, clock=lambda: now[0])
    await recovery.start()
    await recovery.wait_idle()
    now[0] += 29.0
    assert not recovery.take(W8, 1, live(1))  # still given back: applied by the subscriber
    await recovery.wait_idle()
    assert worker.starts == [None] and not recovery.owns(W8)
    now[0] += 1.0
    assert not recovery.take(W8, 2, live(2))  # time is up: its source is looked for again
    await recovery.wait_idle()
    assert worker.starts == [None, None] and recovery.cursor(W8) == 2


async def test_an_events_answer_to_a_first_query_applies_every_event_it_has():
    worker, sink = Worker8(events(0, 2)), Sink()
    recovery = recovery_of(worker, sink)
    await recovery.start()
    await recovery.wait_idle()
    assert [x for kind, x, _ in sink.log if kind == "apply"] == [0, 1, 2] and recovery.cursor(W8) == 2


async def test_events_of_another_worker_in_an_answer_are_not_applied_to_this_one():
    other = {**raw(2, 2), "worker_id": 9}
    worker, sink = Worker8(IndexerAnswer(TREE_DUMP, [raw(0, 101), other], 2)), Sink()
    recovery = recovery_of(worker, sink)
    await recovery.start()
    await recovery.wait_idle()
    assert [x for kind, x, _ in sink.log if kind == "apply"] == [0]


async def test_restarted_leaves_a_worker_it_does_not_own_to_the_subscriber_and_waits_while_in_flight():
    worker, sink = Worker8(dump(3, 101), dump(1, 201)), Sink()
    recovery = recovery_of(worker, sink)
    assert not recovery.restarted(W8)  # not owned
    worker.released.clear()
    await recovery.start()
    assert recovery.restarted(W8)  # owned, in flight: the held events ask again once it is done
    worker.released.set()
    await recovery.wait_idle()
    assert worker.starts == [None]
    assert recovery.restarted(W8)  # owned, idle: dumped now
    await recovery.wait_idle()
    assert worker.starts == [None, None] and recovery.cursor(W8) == 1


async def test_a_failure_inside_take_is_logged_and_leaves_the_event_to_the_subscriber(caplog):
    def wanted(worker: Worker) -> bool:
        raise RuntimeError("broken predicate")

    recovery = LocalIndexerRecovery(Sink(), lambda: [], wanted=wanted)
    assert not recovery.take(W8, 3, live(3))
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "local-indexer recovery failed on event 3 of 8" and record.exc_info


async def test_rescan_takes_only_wanted_workers_and_forgets_their_release():
    now = [0.0]
    nine = QueryTarget(wire_worker=9, dp_rank=0, publisher_id=2, host="127.0.0.1", port=1, path="p")
    worker = Worker8(OSError("down"), dump(1, 101))
    recovery = LocalIndexerRecovery(
        Sink(),
        lambda: [TARGET, nine],
        query=worker.query,
        retries=0,
        backoff_s=0.0,
        wanted=lambda w: w == W8,
        clock=lambda: now[0],
    )
    await recovery.start()
    await recovery.wait_idle()
    assert not recovery.owns(W8)  # given back for 30 s ...
    recovery.rescan()  # ... but added again to the picker's list: taken at once
    await recovery.wait_idle()
    assert recovery.cursor(W8) == 1 and not recovery.owns(Worker("9")) and worker.starts == [None, None]


class Listings:
    """The sources the store lists, one list per call (the last one repeated)."""

    def __init__(self, *listings: list[QueryTarget]) -> None:
        self.listings = list(listings)

    def __call__(self) -> list[QueryTarget]:
        return self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]


MOVED = QueryTarget(wire_worker=8, dp_rank=0, publisher_id=5, host="127.0.0.1", port=2, path="q")


async def test_a_dump_asks_the_newest_source_and_the_last_one_known_when_none_is_listed():
    asked: list[QueryTarget] = []

    async def query(target: QueryTarget, start: int | None) -> IndexerAnswer:
        asked.append(target)
        return dump(len(asked), 100 + len(asked))

    # start lists TARGET; its dump finds nothing listed; then MOVED, then nothing again
    recovery = LocalIndexerRecovery(Sink(), Listings([TARGET], [], [MOVED], []), query=query)
    assert await recovery.start() == 1
    await recovery.wait_idle()
    recovery.resync(W8, "a restart")
    await recovery.wait_idle()
    recovery.resync(W8, "gone from the store")
    await recovery.wait_idle()
    assert asked == [TARGET, MOVED, MOVED]


async def test_workers_found_by_a_later_listing_are_asked_where_that_listing_said(caplog):
    caplog.set_level(logging.INFO, logger="extproc.events")
    asked: list[QueryTarget] = []

    async def query(target: QueryTarget, start: int | None) -> IndexerAnswer:
        asked.append(target)
        return dump(1, 101)

    now = [0.0]
    seen = LocalIndexerRecovery(Sink(), Listings([TARGET], []), query=query, clock=lambda: now[0])
    assert not seen.take(W8, 1, live(1))  # looked for: the listing has it, the dump's listing not
    await seen.wait_idle()
    added = LocalIndexerRecovery(Sink(), Listings([], [MOVED], []), query=query)
    assert await added.start() == 0
    added.rescan()
    await added.wait_idle()
    assert asked == [TARGET, MOVED] and seen.cursor(W8) == added.cursor(W8) == 1
    assert [m for m in messages(caplog) if "rebuilt" not in m] == [
        "8: its source advertises a local indexer; rebuilding it from there",
        "recovering 0 Dynamo workers from their local indexers",
        "8: added; rebuilding it from its local indexer",
    ]


async def test_a_listing_still_running_after_a_second_is_not_started_again():
    now = [0.0]
    listings: list[int] = []
    go_on = threading.Event()

    def sources() -> list[QueryTarget]:
        listings.append(1)
        assert go_on.wait(10)
        return []

    recovery = LocalIndexerRecovery(Sink(), sources, clock=lambda: now[0])
    recovery.take(Worker("9"), 1, None)
    now[0] = 2.0
    recovery.take(Worker("10"), 1, None)  # the first listing has not come back
    go_on.set()
    await recovery.wait_idle()
    assert len(listings) == 1


async def test_start_counts_every_worker_it_recovers():
    nine = QueryTarget(wire_worker=9, dp_rank=0, publisher_id=2, host="127.0.0.1", port=1, path="p")
    ten = QueryTarget(wire_worker=10, dp_rank=1, publisher_id=3, host="127.0.0.1", port=1, path="p")

    async def query(target: QueryTarget, start: int | None) -> IndexerAnswer:
        return IndexerAnswer(TREE_DUMP, [], 0)

    recovery = LocalIndexerRecovery(Sink(), lambda: [TARGET, nine, ten], query=query)
    assert await recovery.start() == 3
    await recovery.wait_idle()


async def test_an_event_at_the_cursor_means_a_restart_and_an_answer_repeating_the_cursor_applies_once():
    worker, sink = Worker8(dump(3, 101), dump(3, 201), events(3, 5)), Sink()
    recovery = recovery_of(worker, sink)
    await recovery.start()
    await recovery.wait_idle()
    assert recovery.take(W8, 3, live(3))  # a new publisher that reached 3 again: dumped
    await recovery.wait_idle()
    assert worker.starts == [None, None]
    sink.log.clear()
    assert recovery.take(W8, 6, live(6))  # 4 and 5 missing; the answer starts at 3
    await recovery.wait_idle()
    assert worker.starts == [None, None, 4]
    assert [x for kind, x, _ in sink.log if kind == "apply"] == [4, 5, 6]


async def test_stop_cancels_the_recoveries_in_flight():
    worker = Worker8(dump(1, 101))
    worker.released.clear()
    recovery = recovery_of(worker, Sink())
    await recovery.start()
    running = set(recovery._tasks)
    await recovery.stop()
    assert running and all(task.cancelled() for task in running)
    assert not recovery._tasks and recovery.cursor(W8) is None


async def test_workers_seen_within_a_second_of_a_listing_wait_for_the_next_one():
    now = [0.0]
    listings: list[float] = []

    def sources() -> list[QueryTarget]:
        listings.append(now[0])
        return []

    recovery = LocalIndexerRecovery(Sink(), sources, clock=lambda: now[0])
    recovery.take(Worker("9"), 1, None)
    recovery.take(Worker("10"), 1, None)  # while the first listing runs: no second one
    await recovery.wait_idle()
    now[0] = 0.5
    recovery.take(Worker("11"), 1, None)  # within a second of it
    await recovery.wait_idle()
    now[0] = 1.0
    recovery.take(Worker("11"), 2, None)
    await recovery.wait_idle()
    now[0] = 29.0
    recovery.take(Worker("9"), 2, None)  # not advertised at 0 s: not looked for until 30 s
    await recovery.wait_idle()
    now[0] = 30.0
    recovery.take(Worker("9"), 3, None)
    await recovery.wait_idle()
    assert listings == [0.0, 1.0, 30.0]


async def test_a_listing_that_fails_is_retried_at_the_next_event_a_second_later():
    now = [0.0]
    calls: list[float] = []

    def sources() -> list[QueryTarget]:
        calls.append(now[0])
        if len(calls) == 1:
            raise OSError("the store is unreadable")
        return [TARGET]

    recovery = LocalIndexerRecovery(Sink(), sources, query=Worker8(dump(1, 101)).query, clock=lambda: now[0])
    assert not recovery.take(W8, 1, live(1))
    await recovery.wait_idle()  # the failed listing ended it: nothing waits on it
    now[0] = 1.0
    assert not recovery.take(W8, 2, live(2))
    await recovery.wait_idle()
    assert recovery.cursor(W8) == 1 and calls == [0.0, 1.0, 1.0]


# --- the file store -----------------------------------------------------------------------------


def scope(namespace: str, component: str, name: str) -> dict[str, Any]:
    return {"kind": "endpoint", "endpoint": {"namespace": namespace, "component": component, "name": name}}


def source(root: Path, key: str, metadata: dict[str, Any], **document: Any) -> Path:
    """An event source in Dynamo 1.6.1's file discovery layout, its fields given by the test."""
    entry = {
        "type": "EventSource",
        "scope": scope("ns1", "backend", "gen"),
        "topic": "kv-events",
        "metadata": metadata,
        **document,
    }
    path = root / "v1" / "event_sources" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry))
    return path


def recovery_target(tcp: str, **extra: Any) -> dict[str, Any]:
    return {"endpoint": "worker_kv_query_source_1", "transport": {"tcp": tcp}, **extra}


def test_a_source_names_its_codec_address_rank_and_publisher_or_takes_dynamos_defaults(tmp_path):
    full = source(
        tmp_path,
        "a",
        {
            "worker": {"worker_id": 7, "dp_rank": 2},
            "publisher_id": 11,
            "recovery_target": recovery_target("[::1]:4000/a/b", request_plane_codec="json"),
        },
        publisher_id=99,
    )
    source(
        tmp_path,
        "b",
        {
            "worker": {"worker_id": 8},
            "recovery_target": recovery_target("XBOX:5/c"),  # a host name's Xs are its own
        },
        publisher_id=12,
    )
    source(tmp_path, "c", {"worker": {"worker_id": 9}, "recovery_target": recovery_target("h:6/d")})
    seven, eight, nine = read_file_sources(str(tmp_path), "ns1", "backend", "gen")
    assert seven == QueryTarget(7, 2, 11, "::1", 4000, "a/b", "json", os.stat(full).st_mtime)
    assert (eight.dp_rank, eight.publisher_id, eight.codec) == (0, 12, "msgpack")
    assert (eight.host, eight.port) == ("XBOX", 5)
    assert (nine.publisher_id, nine.path) == (0, "d")


@pytest.mark.parametrize(
    "change",
    [
        {"topic": "other-events"},
        {"scope": scope("ns2", "backend", "gen")},
        {"scope": scope("ns1", "prefill", "gen")},
        {"scope": scope("ns1", "backend", "x")},
        {"metadata": {"worker": {"worker_id": 7}}},
        {"metadata": {"worker": {"worker_id": 7}, "recovery_target": recovery_target("no-port/p")}},
        {"metadata": {"worker": {"worker_id": 7}, "recovery_target": recovery_target("h:port/p")}},
        {"metadata": {"worker": {"worker_id": "seven"}, "recovery_target": recovery_target("h:1/p")}},
        {"metadata": []},
    ],
    ids=[
        "topic", "namespace", "component", "endpoint", "no-target", "no-port", "bad-port", "bad-id",
        "metadata",
    ],
)  # fmt: skip
def test_a_source_of_another_scope_or_without_a_usable_target_is_skipped(tmp_path, change):
    usable = {"worker": {"worker_id": 7}, "recovery_target": recovery_target("h:1/p")}
    source(tmp_path, "s", usable, **{k: v for k, v in change.items() if k != "metadata"})
    if "metadata" in change:
        source(tmp_path, "s", change["metadata"])
    assert read_file_sources(str(tmp_path), "ns1", "backend", "gen") == []


# --- start_recovery: the picker's wiring ---------------------------------------------------------


class Intake:
    gate: Any = None
    restarted: Any = None


async def test_start_recovery_gates_every_intake_and_lets_the_feed_ask_for_a_dump(played, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="extproc.events")
    port = played.target().port
    source(
        tmp_path,
        "w8",
        {"worker": {"worker_id": 8}, "recovery_target": recovery_target(f"127.0.0.1:{port}/q")},
    )
    source(
        tmp_path,
        "w9",
        {"worker": {"worker_id": 9}, "recovery_target": recovery_target(f"127.0.0.1:{port}/q")},
    )
    played.reply = Responder(PROLOGUE, data({"TreeDump": {"events": [], "last_event_id": 0}}, final=True))
    feed = make_feed(make_router("8"))
    config = EventsConfig(
        namespace="ns1", component="backend", dynamo_endpoint="gen", dynamo_file_kv=str(tmp_path)
    )
    intakes = [Intake(), Intake()]
    recovery = await start_recovery(config, intakes, feed, str)  # type: ignore[arg-type]
    try:
        await recovery.wait_idle()
        assert all(i.gate == recovery.take and i.restarted == recovery.restarted for i in intakes)
        assert recovery.owns(W8) and not recovery.owns(Worker("9"))  # 9 is not the picker's
        assert f"local-indexer recovery from Dynamo's file discovery at {tmp_path}: 1 workers found" in (
            messages(caplog)
        )
        played.reply = Responder(PROLOGUE, data({"TreeDump": {"events": [], "last_event_id": 5}}, final=True))
        feed.apply_events([BlocksStored(W8, (StoredBlock(5, 5),), 77, 6)])  # under a parent never seen
        await recovery.wait_idle()
        assert recovery.cursor(W8) == 5 and len(played.requests) == 2
    finally:
        await recovery.stop()
