"""The ZMQ subscriber's honest stream state, replay layouts and requested rebuilds, against a scripted
engine on loopback (`zmq_fakes.FakeEngine`). The engines' own replay bytes are replayed in
`test_engine_fixtures.py`; here the cases no healthy engine produces.

Contract (extproc/events/zmq_subscriber.py): up only once a replay rebuilt the worker, or without a
replay socket once a batch decoded; down, with the cause as reason, while a rebuild is pending or
failing or every batch is undecodable; live batches are applied meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from extproc.events.counters import MAX_DROPPED_AT_ONCE, EventCounters
from extproc.events.vllm import END_SEQ, WireBlockStored, encode_batch, encode_seq
from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscriber
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import Worker
from tests.events.test_zmq import RouterSink, wait_until
from tests.events.zmq_fakes import FakeEngine, Reply

BS = 4
W0 = Worker("w0")
TIMINGS = SubscriberTimings(
    silence_s=30.0, replay_timeout_s=0.3, backoff_min_s=0.02, backoff_max_s=0.1, min_resync_interval_s=0.5
)
END_CURRENT: Reply = [b"", b"", encode_seq(END_SEQ), b""]  # vLLM 0.33 / SGLang 0.5.23
END_OLD: Reply = [b"", encode_seq(END_SEQ), b""]  # older vLLM


def store(first_token: int, block_id: int, salt: str | None = None) -> bytes:
    """One batch storing one block of tokens first_token.. (salted in vLLM's way when asked)."""
    keys = [(salt,)] if salt else None
    event = WireBlockStored([block_id], None, list(range(first_token, first_token + BS)), BS, extra_keys=keys)
    return encode_batch([event], ts=1.0, dp_rank=0)


def held(router: KvRouter, first_token: int, salt: str | None = None) -> int:
    tokens = list(range(first_token, first_token + BS))
    return router.indexer.find_matches(compute_block_hashes(tokens, BS, namespace=salt)).get(W0, 0)


def current(batches: list[bytes], start: int) -> list[Reply]:
    return [[b"", b"", encode_seq(i), p] for i, p in enumerate(batches) if i >= start] + [END_CURRENT]


class TimedSink(RouterSink):
    """Also notes when each reset happened (a rebuild resets the view once the replay answered)."""

    def __init__(self, router: KvRouter) -> None:
        super().__init__(router)
        self.reset_at: list[float] = []

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.reset_at.append(asyncio.get_running_loop().time())
        super().reset_worker(worker, reason)


class Harness:
    def __init__(self, engine: FakeEngine, *, replay: bool = True) -> None:
        self.engine = engine
        self.router = KvRouter(RouterConfig(block_size=BS, use_kv_events=True), clock=lambda: 0.0)
        self.sink = TimedSink(self.router)
        self.counters = EventCounters()
        endpoint = ZmqEndpoint(W0, engine.pub_endpoint, engine.replay_endpoint if replay else None)
        self.sub = ZmqEventSubscriber(
            endpoint, self.sink, block_size=BS, counters=self.counters, timings=TIMINGS
        )

    @property
    def ups(self) -> list[bool]:
        return [up for _, up, _ in self.sink.states]


async def test_older_vllms_replay_layout_rebuilds_the_worker_too(engine, harness):
    batches = [store(10, 1), store(20, 2)]
    engine.script = lambda start: [[b"", encode_seq(i), p] for i, p in enumerate(batches)] + [END_OLD]
    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="rebuilt")
    assert harness.sub.status.reason == "rebuilt from replay (2 batches)" and harness.sub.status.complete
    assert held(harness.router, 10) == held(harness.router, 20) == 1
    assert engine.requests[0] == [b"", encode_seq(0)]
    assert harness.counters["zmq.replay_malformed"] == 0


@pytest.mark.parametrize("with_end_marker", [True, False])
async def test_a_replay_of_only_malformed_replies_keeps_the_worker_down_with_the_cause(
    engine, harness, with_end_marker
):
    garbage: list[Reply] = [[b"", b"kv", b"\x00\x01", store(10, 1)], [b"", b"only-one-frame"]]
    engine.script = lambda start: garbage + ([END_CURRENT] if with_end_marker else [])
    await harness.sub.start()
    await wait_until(lambda: harness.counters["zmq.replay_failed"] >= 2, what="retried")
    assert not harness.sub.status.up and not any(harness.ups)
    assert harness.sub.status.reason.endswith("answered 2 malformed replies")
    assert harness.counters["zmq.replay_malformed"] >= 4
    assert harness.sink.states[-1][2].endswith("answered 2 malformed replies")  # the sink heard the cause
    # live batches still reach the partial view, the stream stays down
    await engine.wait_subscribed()
    await engine.publish([b"", encode_seq(0), store(30, 3)])
    await wait_until(lambda: held(harness.router, 30) == 1, what="live batch applied")
    assert not harness.sub.status.up


async def test_a_rebuild_from_undecodable_batches_only_is_not_up(engine, harness):
    engine.script = lambda start: current([b"\xc1", b"not msgpack"], start)
    await harness.sub.start()
    await wait_until(lambda: harness.counters["zmq.rebuild"] == 1, what="replayed")
    assert not harness.sub.status.up and not any(harness.ups)
    assert harness.sub.status.reason == "all 2 batches undecodable"
    await engine.wait_subscribed()
    await engine.publish([b"", encode_seq(2), store(10, 1)])  # a batch that decodes: up, incomplete
    await wait_until(lambda: harness.sub.status.up, what="up once a batch decodes")
    assert not harness.sub.status.complete and "undecodable ones are lost" in harness.sub.status.reason


async def test_without_a_replay_socket_up_means_a_batch_decoded_and_says_what_is_unknown(engine):
    h = Harness(engine, replay=False)
    await h.sub.start()
    try:
        await engine.wait_subscribed()
        await engine.publish([b"", encode_seq(0), b"\xc1"])
        await engine.publish([b"", encode_seq(1), b"garbage"])
        await wait_until(lambda: h.counters["zmq.undecodable"] == 2, what="undecodable batches")
        assert not h.sub.status.up and h.sub.status.reason == "all 2 batches undecodable"
        await engine.publish([b"", encode_seq(2), store(10, 1)])
        await wait_until(lambda: h.sub.status.up, what="up")
        assert "blocks cached before connecting are unknown" in h.sub.status.reason
        assert held(h.router, 10) == 1
        assert [(up, reason.split(";")[-1].strip()) for _, up, reason in h.sink.states] == [
            (False, "no replay socket: waiting for live batches"),
            (False, "all 1 batches undecodable"),  # the sink hears each change once
            (True, h.sub.status.reason),
        ]
        h.sub.request_resync("a parent is unknown")  # nothing to rebuild from: counted
        assert h.counters["zmq.resync_unavailable"] == 1
    finally:
        await h.sub.stop()


async def test_request_resync_rebuilds_from_replay_at_most_once_per_interval(engine, harness):
    buffer = [store(10, 1)]
    engine.script = lambda start: current(buffer, start)
    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="start rebuild")
    buffer.append(store(20, 2))  # the engine holds more than the view (its batch never arrived)
    harness.sub.request_resync("a stored block's parent 2 is unknown")
    harness.sub.request_resync("again")  # absorbed by the pending one
    assert harness.counters["zmq.resync_deferred"] == 1  # the start rebuild was just now
    assert held(harness.router, 10) == 1 and harness.sub.status.up  # the view is kept meanwhile
    await wait_until(lambda: held(harness.router, 20) == 1, what="requested rebuild")
    reason = "resync requested: a stored block's parent 2 is unknown; rebuilding from replay"
    assert harness.sink.resets[-1] == (W0, reason)
    assert held(harness.router, 10) == 1 and harness.sub.status.up and harness.sub.status.complete
    assert harness.counters["zmq.rebuild"] == 2 and harness.counters["zmq.resync_requested"] == 2
    # a worker asked again and again (orphans keep coming): one rebuild per interval
    for _ in range(3):
        harness.sub.request_resync("still unknown")
        await wait_until(
            lambda n=harness.counters["zmq.rebuild"]: harness.counters["zmq.rebuild"] == n + 1, what="rebuild"
        )
    resets = harness.sink.reset_at  # the start, then one per rebuild
    assert len(resets) == 5
    assert all(b - a >= TIMINGS.min_resync_interval_s for a, b in itertools.pairwise(resets))


async def test_a_worker_reset_forgets_the_decoders_salts(engine, harness):
    engine.script = lambda start: [END_CURRENT]  # an engine whose buffer is empty
    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="rebuilt")
    await engine.wait_subscribed()
    await engine.publish([b"", encode_seq(0), store(10, 1, salt="salt-A")])
    await wait_until(lambda: held(harness.router, 10, "salt-A") == 1, what="salted block")
    assert harness.sub.decoder.tracked == (1, 0)
    await engine.publish([b"", encode_seq(0), store(20, 2)])  # seq 0 again: the engine restarted
    await wait_until(lambda: harness.counters["zmq.restart"] == 1, what="restart")
    assert harness.sub.decoder.tracked == (0, 0)
    assert held(harness.router, 10, "salt-A") == 0


class OrphanSink(TimedSink):
    """A feed on a worker whose replay buffer no longer reaches seq 0: every store it is given hangs
    under a lost parent, so it asks for a resync each time (the subscriber is attached later)."""

    sub: ZmqEventSubscriber | None = None

    def apply_events(self, events) -> None:
        super().apply_events(events)
        if self.sub is not None:
            self.sub.request_resync("a stored block's parent is unknown")


async def test_orphans_in_the_replayed_batches_do_not_start_a_replay_loop(engine):
    """A buffer that no longer reaches seq 0 holds stores under parents older than it: a rebuild
    cannot bring those back, so the requests they cause start no further rebuild (the feed keeps
    the worker stale and predicted instead)."""
    engine.script = lambda start: (
        [[b"", b"", encode_seq(i), store(10 * i, i)] for i in (5, 6)] + [END_CURRENT]
    )
    h = Harness(engine)
    sink = OrphanSink(h.router)
    h.sub.sink = sink
    sink.sub = h.sub
    await h.sub.start()
    try:
        await wait_until(lambda: h.counters["zmq.resync_futile"] >= 2, timeout_s=5.0, what="futile requests")
        assert h.counters["zmq.rebuild"] == 1
        assert h.sub.status.reason.startswith("rebuilt from replay (2 batches); incomplete")
        assert not h.sub.status.complete and len(sink.reset_at) == 1
    finally:
        await h.sub.stop()


async def test_a_batch_naming_another_dp_rank_is_dropped_so_the_workers_reset_leaves_nothing(engine, harness):
    """The socket is dp rank 0's (the engine binds rank r's at the event port + r); a batch stamped
    with rank 3 is dropped undecoded, counted and logged. Before, its blocks were indexed under
    (w0, rank 3), which no reset of w0's stream ever cleared."""
    engine.script = lambda start: [END_CURRENT]  # an engine whose buffer is empty
    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="rebuilt")
    await engine.wait_subscribed()
    other = WireBlockStored([7], None, list(range(50, 50 + BS)), BS, extra_keys=[("salt-B",)])
    await engine.publish([b"", encode_seq(0), encode_batch([other], ts=1.0, dp_rank=3)])
    await engine.publish([b"", encode_seq(1), store(10, 1)])
    await wait_until(lambda: harness.sub.status.last_seq == 1, what="both batches")
    tokens = list(range(50, 50 + BS))
    assert harness.router.indexer.find_matches(compute_block_hashes(tokens, BS, namespace="salt-B")) == {}
    assert held(harness.router, 10) == 1 and harness.router.indexer.workers() == [W0]
    assert harness.counters["zmq.dp_rank_mismatch"] == 1 and harness.counters["vllm.other_dp_rank"] == 1
    assert harness.counters.drops[("zmq", str(W0), "other-dp-rank")] == 1
    assert harness.sub.decoder.tracked == (0, 0)  # the foreign batch taught the decoder nothing
    await engine.publish([b"", encode_seq(0), store(20, 2)])  # seq 0 again: the engine restarted
    await wait_until(lambda: harness.counters["zmq.restart"] == 1, what="restart")
    await wait_until(lambda: harness.router.indexer.num_blocks() == 0, what="the reset")


async def test_a_crafted_seq_adds_at_most_the_bound_to_the_dropped_counter(engine, harness):
    """A live seq far ahead is a gap the replay cannot fill: the view is reset and carries on, and
    the gap is counted as at most MAX_DROPPED_AT_ONCE batches (before: 2**64 - 3 from one message).
    The replay's end marker as a live seq is a malformed frame, not a seq to continue from."""
    buffer: list[bytes] = []  # the engine's own batches, seq = index
    engine.script = lambda start: current(buffer, start)

    async def publish(payload: bytes) -> None:
        buffer.append(payload)
        await engine.publish([b"", encode_seq(len(buffer) - 1), payload])

    await harness.sub.start()
    await wait_until(lambda: harness.sub.status.up, what="rebuilt")
    await engine.wait_subscribed()
    await publish(store(10, 1))
    crafted = 2**64 - 2
    await engine.publish([b"", encode_seq(crafted), store(20, 2)])
    await wait_until(lambda: harness.sub.status.last_seq == crafted, what="the crafted batch")
    assert harness.counters["zmq.gap"] == 1 and harness.counters["zmq.gap_clamped"] == 1
    assert harness.counters["zmq.dropped"] == MAX_DROPPED_AT_ONCE
    assert harness.counters.drops[("zmq", str(W0), "seq-gap")] == MAX_DROPPED_AT_ONCE
    await engine.publish([b"", (2**64 - 1).to_bytes(8, "big"), store(30, 3)])
    await publish(store(40, 4))  # the engine's own next batch, seq 1
    await wait_until(lambda: harness.counters["zmq.restart"] == 1, what="seq back: a restart")
    await wait_until(lambda: harness.sub.status.up and held(harness.router, 40) == 1, what="rebuilt again")
    assert harness.counters["vllm.malformed_frames"] == 1
    assert held(harness.router, 10) == 1 and held(harness.router, 20) == held(harness.router, 30) == 0
    assert harness.counters["zmq.reconnect"] == 0  # no exception restarted the session
    assert harness.counters["zmq.dropped"] == MAX_DROPPED_AT_ONCE


async def test_a_replay_that_goes_back_cannot_lower_the_dropped_counter(engine):
    """The silence probe asks for everything after the last seq; an answer below it (a crafted or
    confused replay socket) counts nothing: before, it subtracted from the dropped counter."""
    probed: list[int] = []

    def script(start: int) -> list[Reply]:
        probed.append(start)
        return [[b"", b"", encode_seq(0), store(10, 1)], END_CURRENT] if start > 0 else [END_CURRENT]

    engine.script = script
    h = Harness(engine)
    h.sub.timings = SubscriberTimings(
        silence_s=0.2, replay_timeout_s=0.3, backoff_min_s=0.02, backoff_max_s=0.1
    )
    await h.sub.start()
    try:
        await wait_until(lambda: h.sub.status.up, what="rebuilt")
        await engine.wait_subscribed()
        for seq in range(5):
            await engine.publish([b"", encode_seq(seq), store(20 + seq, 2 + seq)])
        await wait_until(lambda: 5 in probed, what="a probe after seq 4")
        # the engine saw the probe before the subscriber read its answer: wait for the answer's effect
        await wait_until(lambda: h.counters["zmq.gap_clamped"] >= 1, what="the answer read")
        assert h.counters["zmq.dropped"] == 0
    finally:
        await h.sub.stop()
