"""The ZMQ subscriber's gaps, exactly: how many batches are counted lost, which are asked of the
replay socket, what is applied in which order, what the stream state and the worker's reset say,
and the silence probe. Against the scripted engine on loopback (`zmq_fakes.FakeEngine`); the engines'
own replay bytes are replayed in `test_engine_fixtures.py` and `test_engine_releases.py`.

(Found by mutation testing `extproc/events/zmq_subscriber.py`: these paths ran in the suite, but no
test read their numbers.)
"""

from __future__ import annotations

import contextlib
import logging

import pytest

from extproc.events.vllm import encode_seq
from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscriber, offset_port
from tests.events.test_zmq import wait_until
from tests.events.test_zmq_state import END_CURRENT, W0, Harness, current, held, store
from tests.events.zmq_fakes import FakeEngine


def live(seq: int, first_token: int) -> list[bytes]:
    """A live batch: seq `seq` stores one block of tokens first_token.. (block id = first_token)."""
    return [b"", encode_seq(seq), store(first_token, first_token)]


def with_timings(engine: FakeEngine, silence_s: float) -> Harness:
    """A harness whose subscriber probes after `silence_s` and waits 0.2 s for each replay message."""
    h = Harness(engine)
    timings = SubscriberTimings(
        silence_s=silence_s,
        replay_timeout_s=0.2,
        backoff_min_s=0.05,
        backoff_max_s=0.1,
        min_resync_interval_s=0.5,
    )
    endpoint = ZmqEndpoint(W0, engine.pub_endpoint, engine.replay_endpoint)
    h.sub = ZmqEventSubscriber(endpoint, h.sink, block_size=4, counters=h.counters, timings=timings)
    return h


def dropped(h: Harness) -> int:
    return h.counters.drops[("zmq", "w0", "seq-gap")]


async def test_a_gap_without_a_replay_socket_is_counted_exactly_and_the_view_starts_over(engine, caplog):
    h = Harness(engine, replay=False)
    await h.sub.start()
    try:
        await engine.wait_subscribed()
        await engine.publish(live(0, 10))
        await wait_until(lambda: h.sub.status.up, what="up on a decoded batch")
        with caplog.at_level(logging.INFO, "extproc.events.zmq_subscriber"):
            await engine.publish(live(3, 30))
            await wait_until(lambda: held(h.router, 30) == 1, what="the batch after the gap applied")
        assert dropped(h) == 2 and h.counters["zmq.gap"] == 1 and h.counters["zmq.unfilled_gap"] == 1
        assert held(h.router, 10) == 0  # reset: what came before the gap may be stale
        assert h.sink.resets[-1] == (W0, "gap 1..2 not replayable: no replay socket")
        assert h.sub.status.up and not h.sub.status.complete
        assert h.sub.status.reason == "incomplete since gap 1..2 (no replay socket)"
        assert h.sink.states[-1] == (W0, True, "incomplete since gap 1..2 (no replay socket)")
        messages = [r.getMessage() for r in caplog.records]
        assert (
            "KV events 1..2 of w0 are lost (no replay socket): cache view reset, continuing from 3"
            in messages
        )
    finally:
        await h.sub.stop()


async def test_a_gap_of_one_batch_is_filled_from_the_replay_socket(engine, harness):
    buffer: list[bytes] = []
    engine.script = lambda start: current(buffer, start)
    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="rebuilt (empty)")
    await engine.wait_subscribed()
    buffer.extend([store(10, 10), store(20, 20), store(30, 30)])
    await engine.publish(live(0, 10))
    await engine.publish(live(2, 30))  # 1 was dropped
    await wait_until(lambda: held(harness.router, 30) == 1, what="the live batch after the gap")
    assert held(harness.router, 20) == 1 and held(harness.router, 10) == 1
    assert dropped(harness) == 1 and harness.counters["zmq.unfilled_gap"] == 0
    assert [r for r in engine.requests if r != [b"", encode_seq(0)]] == [[b"", encode_seq(1)]]
    assert harness.sub.status.up and harness.sub.status.complete
    assert harness.sub._s.last_applied == 2 and harness.counters["zmq.duplicate"] == 0


async def test_a_replay_that_skips_a_batch_inside_a_gap_counts_that_one_lost(engine, harness):
    buffer = [store(10, 10), store(20, 20), store(30, 30), store(40, 40)]

    engine.script = lambda start: (
        current([], start) if start == 0 else [r for r in current(buffer, start) if r[2] != encode_seq(2)]
    )
    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="rebuilt (empty)")
    await engine.wait_subscribed()
    await engine.publish(live(0, 10))
    await engine.publish(live(4, 50))  # 1..3 dropped; the replay holds 1 and 3, not 2
    await wait_until(lambda: held(harness.router, 50) == 1, what="the live batch after the gap")
    assert held(harness.router, 20) == 0 and held(harness.router, 40) == 1  # reset at the hole, then 3
    assert harness.counters["zmq.unfilled_gap"] == 1
    assert harness.sink.resets[-1] == (W0, "gap 2..2 not replayable: the replay skipped it")
    assert harness.sub.status.reason == "incomplete since gap 2..2 (the replay skipped it)"
    assert harness.sub.status.up and not harness.sub.status.complete


async def test_a_gap_the_replay_socket_does_not_answer_resets_and_rebuilds_while_live_batches_apply(engine):
    answers = {"on": True}
    buffer = [store(10, 10)]
    engine.script = lambda start: current(buffer, start) if answers["on"] else []
    h = with_timings(engine, silence_s=30.0)
    await h.sub.start()
    try:
        await wait_until(lambda: h.sub.status.up, what="rebuilt")
        await engine.wait_subscribed()
        await engine.publish(live(1, 20))
        await wait_until(lambda: held(h.router, 20) == 1, what="seq 1 applied")
        answers["on"] = False
        heard = len(h.sink.states)
        await engine.publish(live(4, 50))  # 2..3 dropped, and the replay socket is silent
        await wait_until(lambda: not h.sub.status.up, what="down")
        assert [up for _, up, _ in h.sink.states[heard:]] == [False]  # straight down, no "incomplete" first
        assert h.sub.status.reason.startswith("gap 2..3 not replayed: ")
        assert h.sink.resets[-1] == (W0, "gap 2..3 not replayable: " + h.sub.status.reason.split(": ", 1)[1])
        assert held(h.router, 20) == 0 and dropped(h) == 2
        await engine.publish(live(5, 60))
        await wait_until(lambda: held(h.router, 60) == 1, what="live batches apply while down")
        buffer.extend([store(20, 20), store(30, 30), store(40, 40), store(50, 50), store(60, 60)])
        answers["on"] = True
        await wait_until(lambda: h.sub.status.up, timeout_s=5.0, what="rebuilt once the replay answers")
        assert all(held(h.router, t) == 1 for t in (10, 20, 30, 40, 50, 60))
        assert h.sub.status.complete
    finally:
        await h.sub.stop()


async def test_the_silence_probe_asks_for_what_follows_the_last_batch_and_reports_no_answer(engine):
    answers = {"on": True}
    buffer = [store(10, 10), store(20, 20)]
    engine.script = lambda start: current(buffer, start) if answers["on"] else []
    h = with_timings(engine, silence_s=0.3)
    await h.sub.start()
    try:
        await wait_until(lambda: h.sub.status.up, what="rebuilt")
        await wait_until(lambda: h.counters["zmq.probe"] >= 1, what="a probe after silence")
        assert [b"", encode_seq(2)] in engine.requests  # everything after seq 1
        buffer.append(store(30, 30))  # a batch the SUB socket missed: the probe catches up
        await wait_until(lambda: held(h.router, 30) == 1, what="caught up by a probe")
        assert h.sub.status.up
        answers["on"] = False
        await wait_until(lambda: h.counters["zmq.probe_failed"] >= 1, what="a probe unanswered")
        await wait_until(lambda: not h.sub.status.up, what="down")
        assert h.sub.status.reason.startswith("no events for 0.3 s and ")
        assert held(h.router, 30) == 1  # the view is kept until the replay answers again
    finally:
        await h.sub.stop()


async def test_a_probe_after_an_empty_rebuild_asks_from_seq_zero():
    engine = FakeEngine()
    engine.start()
    engine.script = lambda start: [END_CURRENT]
    h = with_timings(engine, silence_s=0.2)
    try:
        await h.sub.start()
        await wait_until(lambda: h.counters["zmq.probe"] >= 1, what="a probe")
        assert engine.requests[-1] == [b"", encode_seq(0)]
    finally:
        await h.sub.stop()
        await engine.close()


# --- endpoints, restarts and requested rebuilds ----------------------------------------------------------


def test_an_endpoint_that_cannot_be_offset_by_dp_rank_is_refused_with_what_it_got():
    for endpoint in ("ipc:///tmp/kv:1", "tcp://10.0.0.1", "tcp://10.0.0.1:kv"):
        refused = rf"^endpoint must be tcp://host:port to offset by dp rank, got '{endpoint}'$"
        with pytest.raises(ValueError, match=refused):
            offset_port(endpoint, 1)
    assert offset_port("ipc:///tmp/kv", 0) == "ipc:///tmp/kv"  # rank 0 keeps the endpoint as given


def test_dp_rank_endpoints_keep_the_topic_and_name_the_overlap(caplog):
    assert {e.topic for e in ZmqEndpoint.for_dp_ranks("w1", "tcp://h:5557", None, (0, 1))} == {""}
    assert {e.topic for e in ZmqEndpoint.for_dp_ranks("w1", "tcp://h:5557", None, (0, 1), topic="kv")} == {
        "kv"
    }
    ZmqEndpoint.for_dp_ranks("w1", "tcp://h:5557", "tcp://h:5558", (0, 1, 2))
    assert [r.getMessage() for r in caplog.records] == [
        "worker w1: its dp ranks' KV event ports and replay ports overlap at tcp://h:5558, tcp://h:5559: "
        "the engine binds both at port + dp rank and cannot start so; give the replay port at least the "
        "event port + the dp size"
    ]


async def test_a_subscriber_stopped_can_be_started_again(engine, harness):
    engine.script = lambda start: [END_CURRENT]
    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="rebuilt")
    await harness.sub.stop()
    await harness.sub.start()
    await wait_until(lambda: harness.counters["zmq.rebuild"] == 2, what="rebuilt again")
    for _ in range(60):  # the engine's XPUB may not know the new socket yet: the batch again until heard
        await engine.publish(live(0, 10))
        with contextlib.suppress(AssertionError):
            await wait_until(lambda: held(harness.router, 10) == 1, timeout_s=0.05, what="heard")
            break
    assert held(harness.router, 10) == 1


async def test_a_requested_rebuild_keeps_the_view_and_applies_live_batches_until_it_runs(engine, caplog):
    buffer = [store(10, 10)]
    engine.script = lambda start: current(buffer, start)
    h = Harness(engine)  # min_resync_interval_s 0.5: the request right after the start rebuild waits
    await h.sub.start()
    try:
        await wait_until(lambda: h.sub.status.up, what="rebuilt")
        await engine.wait_subscribed()
        with caplog.at_level(logging.INFO, "extproc.events.zmq_subscriber"):
            h.sub.request_resync("a stored block's parent 7 is unknown")
        assert not h.sub.status.complete and h.counters["zmq.resync_deferred"] == 1
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and said[0].startswith("KV events of w0: rebuild from replay in 0.")
        assert said[0].endswith(" s (a stored block's parent 7 is unknown)")
        await engine.publish(live(1, 20))
        await wait_until(lambda: held(h.router, 20) == 1, what="a live batch applied while the rebuild waits")
        assert held(h.router, 10) == 1  # the view kept
        buffer.append(store(20, 20))
        await wait_until(lambda: h.counters["zmq.rebuild"] == 2, what="the requested rebuild")
        assert h.sub.status.complete and h.sub.status.up
    finally:
        await h.sub.stop()


async def test_a_requested_rebuild_right_away_is_not_counted_deferred(engine):
    engine.script = lambda start: [END_CURRENT]
    h = Harness(engine)
    await h.sub.start()
    try:
        await wait_until(lambda: h.sub.status.up, what="rebuilt")
        h.sub._last_rebuild_at = None  # as if no rebuild had run: the request's time is now
        h.sub.request_resync("asked")
        assert h.counters["zmq.resync_deferred"] == 0
        await wait_until(lambda: h.counters["zmq.rebuild"] == 2, what="rebuilt at once")
    finally:
        await h.sub.stop()
