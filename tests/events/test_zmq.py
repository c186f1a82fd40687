"""KV events over real ZMQ on loopback: publisher -> subscriber -> a real KvRouter.

The truth is the publisher's `PrefixCache` (or the mock worker's engine): after every scenario the
router's tree must match it exactly. Conditions are polled with a deadline, never slept for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import aiohttp
import pytest

from extproc.devstack.procs import ManagedProcess, wait_http_ok
from extproc.events.counters import EventCounters
from extproc.events.sink import EventSink
from extproc.events.vllm import END_SEQ, WireBlockStored, encode_batch, encode_seq
from extproc.events.zmq_publisher import VllmEventListener, ZmqEventPublisher
from extproc.events.zmq_subscriber import (
    SubscriberTimings,
    ZmqEndpoint,
    ZmqEventSubscriber,
    ZmqEventSubscribers,
    offset_port,
)
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.router.types import KvEvent, Worker
from extproc.sim.kv_events import KvEventsConfig, ZmqKvEvents
from extproc.sim.mock_worker import MockWorker, MockWorkerConfig, config_from_args
from extproc.sim.prefix_cache import BlockTable, PrefixCache

BS = 4
W0 = Worker("w0")
FAST = SubscriberTimings(silence_s=0.3, replay_timeout_s=0.3, backoff_min_s=0.02, backoff_max_s=0.2)


class RouterSink:
    """The EventSink a picker would be, reduced to the router calls."""

    def __init__(self, router: KvRouter) -> None:
        self.router = router
        self.resets: list[tuple[Worker, str]] = []
        self.states: list[tuple[Worker, bool, str]] = []

    def apply_events(self, events: Sequence[KvEvent]) -> None:
        for event in events:
            self.router.apply_event(event)

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.resets.append((worker, reason))
        self.router.indexer.clear_worker(worker)

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        self.states.append((worker, up, reason))


def _sink_fits_protocol(sink: RouterSink) -> EventSink:
    return sink  # the type checker verifies RouterSink against EventSink


async def wait_until(condition: Callable[[], bool], timeout_s: float = 3.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.01)


class Engine:
    """The publisher's truth: a small prefix cache whose changes go out as KV events."""

    def __init__(self, publisher: ZmqEventPublisher, num_blocks: int = 24) -> None:
        self.listener = VllmEventListener(publisher.publish, BS)
        self.cache = PrefixCache(num_blocks, BS, self.listener)
        self.prompts: list[list[int]] = []

    def run(self, tokens: list[int]) -> None:
        """Admit and finish one request, then send its events as one batch."""
        hashes = compute_sequence_hashes(compute_block_hashes(tokens, BS))
        table = BlockTable()
        assert self.cache.allocate(table, hashes, len(tokens), tokens)
        self.cache.release(table)
        self.listener.flush()
        self.prompts.append(tokens)

    def matches(self, router: KvRouter, worker: Worker = W0) -> bool:
        """The router's tree is exactly this cache: same block count, same prefix for every prompt."""
        if router.indexer.num_blocks(worker) != self.cache.num_cached_blocks:
            return False
        for tokens in self.prompts:
            seq = compute_sequence_hashes(compute_block_hashes(tokens, BS))
            expected = self.cache.match_prefix(seq)
            got = router.indexer.find_matches(compute_block_hashes(tokens, BS)).get(worker, 0)
            if got != expected:
                return False
        return True


def random_prompts(seed: int, count: int) -> list[list[int]]:
    """Prompts sharing a few prefixes, whole blocks only, so released blocks are all cached."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1000) for _ in range(BS * rng.randint(1, 3))] for _ in range(3)]
    return [
        rng.choice(heads) + [rng.randrange(1000) for _ in range(BS * rng.randint(0, 3))] for _ in range(count)
    ]


@pytest.fixture
async def publisher() -> AsyncIterator[ZmqEventPublisher]:
    pub = ZmqEventPublisher(port=0, replay_port=0)
    await pub.start()
    yield pub
    await pub.stop()


def make_router() -> KvRouter:
    return KvRouter(RouterConfig(block_size=BS, use_kv_events=True), clock=lambda: 0.0)


async def subscribe(
    pub: ZmqEventPublisher, sink: RouterSink, counters: EventCounters, **timings: float
) -> ZmqEventSubscriber:
    endpoint = ZmqEndpoint(W0, pub.endpoint, pub.replay_endpoint)
    t = dataclasses.replace(FAST, **timings)
    sub = ZmqEventSubscriber(endpoint, sink, block_size=BS, counters=counters, timings=t)
    await sub.start()
    return sub


async def test_router_tree_follows_the_publishers_cache(publisher):
    router, counters = make_router(), EventCounters()
    sink = RouterSink(router)
    engine = Engine(publisher)
    engine.run([1, 2, 3, 4, 5, 6, 7, 8])  # before the subscriber: it arrives through the start replay
    sub = await subscribe(publisher, sink, counters)
    try:
        await wait_until(lambda: engine.matches(router), what="initial rebuild")
        for tokens in random_prompts(1, 40):  # the pool of 24 blocks evicts: removals flow too
            engine.run(tokens)
        await wait_until(lambda: engine.matches(router), what="tree == cache")
        assert counters["vllm.removed_event"] > 0
        assert sink.resets == [(W0, "subscriber started")]
        assert [state[:2] for state in sink.states] == [(W0, False), (W0, True)]  # rebuilding, rebuilt
        assert sink.states[1][2].startswith("rebuilt from replay")
        assert sub.status.complete and sub.status.up
        assert counters["zmq.unfilled_gap"] == 0
    finally:
        await sub.stop()


async def test_a_sequence_gap_is_filled_from_the_replay_socket(publisher):
    router, counters = make_router(), EventCounters()
    engine = Engine(publisher)
    sub = await subscribe(publisher, RouterSink(router), counters, silence_s=30.0)  # no probe catches up
    try:
        engine.run([1, 2, 3, 4])
        await wait_until(lambda: engine.matches(router) and sub.status.last_seq == 0, what="first batch")
        publisher.withhold(3)  # these three reach only the replay buffer
        for tokens in random_prompts(2, 3):
            engine.run(tokens)
        assert not engine.matches(router)
        engine.run([9, 9, 9, 9, 8, 8, 8, 8])  # seq 4 reveals the gap 1..3
        await wait_until(lambda: sub.status.last_seq == 4, what="gap filled")
        assert engine.matches(router)
        assert counters["zmq.gap"] == 1
        assert counters["zmq.unfilled_gap"] == 0
        assert sub.status.complete
    finally:
        await sub.stop()


async def test_a_gap_the_replay_buffer_no_longer_holds_resets_the_worker():
    pub = ZmqEventPublisher(port=0, replay_port=0, buffer_steps=2)
    await pub.start()
    router, counters = make_router(), EventCounters()
    sink = RouterSink(router)
    engine = Engine(pub, num_blocks=64)
    sub = await subscribe(pub, sink, counters, silence_s=30.0)
    try:
        engine.run([1, 2, 3, 4])
        await wait_until(lambda: sub.status.last_seq == 0, what="first batch")
        pub.withhold(4)  # seqs 1..4; the buffer keeps only the last two of them by the time 5 goes out
        for i in range(4):
            engine.run([50 + i] * BS)
        engine.run([70] * BS)  # seq 5
        await wait_until(lambda: sub.status.last_seq == 5, what="resumed after the gap")
        assert counters["zmq.unfilled_gap"] == 1
        assert not sub.status.complete
        assert any("not replayable" in reason for _, reason in sink.resets)
        # the view was reset, then rebuilt from what could still be had: seq 4 (replayed) and 5
        held = {
            tokens[0]
            for tokens in engine.prompts
            if router.indexer.find_matches(compute_block_hashes(tokens, BS))
        }
        assert held == {53, 70}
    finally:
        await sub.stop()
        await pub.stop()


async def test_a_restarted_publisher_resets_and_resynchronises_the_worker(publisher):
    router, counters = make_router(), EventCounters()
    sink = RouterSink(router)
    old = Engine(publisher)
    for tokens in random_prompts(3, 10):
        old.run(tokens)
    sub = await subscribe(publisher, sink, counters)
    try:
        await wait_until(lambda: old.matches(router), what="old publisher's cache")
        await publisher.stop()
        restarted = ZmqEventPublisher(port=publisher.port, replay_port=publisher.replay_port)
        await restarted.start()
        try:
            new = Engine(restarted)  # an empty cache, seq from 0 again
            for tokens in random_prompts(4, 5):
                new.run(tokens)
            await wait_until(lambda: new.matches(router), what="new publisher's cache")
            assert not any(router.indexer.find_matches(compute_block_hashes(t, BS)) for t in old.prompts)
            assert len(sink.resets) >= 2
            assert sub.status.complete
            assert (W0, False) in [s[:2] for s in sink.states]  # the drop was reported
            assert sink.states[-1][:2] == (W0, True)
        finally:
            await restarted.stop()
    finally:
        await sub.stop()


async def test_a_seq_going_back_on_the_same_connection_is_a_restart(publisher):
    """A publisher whose numbering restarts without dropping the connection (the TCP drop is the
    usual signal; this is the fallback): reset and rebuild from its new buffer."""
    router, counters = make_router(), EventCounters()
    sink = RouterSink(router)
    old = Engine(publisher)
    sub = await subscribe(publisher, sink, counters, silence_s=30.0)
    try:
        for tokens in random_prompts(5, 4):
            old.run(tokens)
        await wait_until(lambda: old.matches(router) and sub.status.last_seq == 3, what="old stream")
        publisher._seq = itertools.count()  # the publisher's state, as a fresh one in the same place
        publisher._buffer.clear()
        new = Engine(publisher)
        new.run([42] * BS)
        await wait_until(lambda: new.matches(router), what="rebuilt from the new numbering")
        assert counters["zmq.restart"] == 1
        assert not any(router.indexer.find_matches(compute_block_hashes(t, BS)) for t in old.prompts)
    finally:
        await sub.stop()


async def test_a_replay_socket_that_does_not_answer_keeps_the_stream_down_while_live_batches_apply(
    publisher, refusing_port
):
    router, counters = make_router(), EventCounters()
    sink = RouterSink(router)
    # a replay endpoint nobody serves: the start rebuild goes unanswered, again and again
    endpoint = ZmqEndpoint(W0, publisher.endpoint, f"tcp://127.0.0.1:{refusing_port()}")
    sub = ZmqEventSubscriber(endpoint, sink, block_size=BS, counters=counters, timings=FAST)
    await sub.start()
    try:
        await wait_until(lambda: counters["zmq.replay_failed"] >= 1, what="start replay unanswered")

        def publish_until_applied() -> bool:  # the first batches may go out before SUB has subscribed
            publisher.publish([WireBlockStored([1], None, [1, 2, 3, 4], BS)])
            return counters["zmq.batch"] > 0

        await wait_until(publish_until_applied, what="live batches applied meanwhile (a partial view)")
        assert router.indexer.find_matches(compute_block_hashes([1, 2, 3, 4], BS)) == {W0: 1}
        await wait_until(lambda: counters["zmq.replay_failed"] >= 3, what="retried with backoff")
        assert not sub.status.up and not sub.status.complete
        assert "does not answer" in sub.status.reason
        assert [state[:2] for state in sink.states] == [(W0, False), (W0, False)]  # rebuilding, no answer
        assert "does not answer" in sink.states[-1][2]
    finally:
        await sub.stop()


async def test_manager_runs_one_subscriber_per_dp_rank():
    pubs = [ZmqEventPublisher(port=0, replay_port=0, dp_rank=r) for r in (0, 1)]
    for p in pubs:
        await p.start()
    router, counters = make_router(), EventCounters()
    endpoints = [ZmqEndpoint(Worker("w0", i), p.endpoint, p.replay_endpoint) for i, p in enumerate(pubs)]
    manager = ZmqEventSubscribers(
        endpoints, RouterSink(router), block_size=BS, counters=counters, timings=FAST
    )
    await manager.start()
    try:
        engines = [Engine(p) for p in pubs]
        engines[0].run([1, 2, 3, 4])
        engines[1].run([5, 6, 7, 8, 9, 10, 11, 12])
        await wait_until(
            lambda: all(e.matches(router, Worker("w0", r)) for r, e in enumerate(engines)), what="both ranks"
        )
        assert set(manager.status()) == {Worker("w0", 0), Worker("w0", 1)}
    finally:
        await manager.stop()
        for p in pubs:
            await p.stop()


def test_dp_rank_endpoints_offset_ports_like_vllm(caplog):
    eps = ZmqEndpoint.for_dp_ranks("w1", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5560", (0, 1, 3))
    assert [(e.worker, e.pub, e.replay) for e in eps] == [
        (Worker("w1", 0), "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5560"),
        (Worker("w1", 1), "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5561"),
        (Worker("w1", 3), "tcp://10.0.0.1:5560", "tcp://10.0.0.1:5563"),
    ]
    assert "overlap" in caplog.text  # rank 3's events and rank 0's replay share 5560
    caplog.clear()
    ZmqEndpoint.for_dp_ranks("w1", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5559", (0, 1))
    assert not caplog.text  # 5557-5558 and 5559-5560: what vLLM can bind
    ZmqEndpoint.for_dp_ranks("w1", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", (0, 1))
    assert "tcp://10.0.0.1:5558" in caplog.text and "cannot start" in caplog.text
    with pytest.raises(ValueError):
        offset_port("ipc:///tmp/x", 1)


async def test_replay_socket_speaks_vllm_0_33s_framing():
    """What vLLM 0.33's `_service_replay` sends (tests/events/test_engine_fixtures.py holds theirs)."""
    import zmq
    import zmq.asyncio

    publisher = ZmqEventPublisher(port=0, replay_port=0, topic="kv")
    await publisher.start()
    payloads = [encode_batch([], ts=float(i), dp_rank=0) for i in range(3)]
    for payload in payloads:
        publisher.publish_payload(payload)
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(publisher.replay_endpoint)
    try:
        await dealer.send_multipart([b"", encode_seq(1)])
        replies = [await asyncio.wait_for(dealer.recv_multipart(), 2.0) for _ in range(3)]
        assert replies == [
            [b"", b"kv", encode_seq(1), payloads[1]],
            [b"", b"kv", encode_seq(2), payloads[2]],
            [b"", b"", encode_seq(END_SEQ), b""],
        ]
    finally:
        dealer.close(linger=0)
        ctx.term()
        await publisher.stop()


# --- the mock worker ---------------------------------------------------------------------------


def test_mock_worker_publishes_over_zmq_by_default_but_make_app_does_not():
    import argparse

    from extproc.sim.mock_worker import add_mock_worker_arguments

    parser = argparse.ArgumentParser()
    add_mock_worker_arguments(parser)
    config = config_from_args(parser.parse_args([]))
    assert config.kv_events == KvEventsConfig("zmq", "127.0.0.1", None, None)
    off = config_from_args(parser.parse_args(["--kv-events", "off"]))
    assert MockWorker(off, tokenizer=None).kv_events is None  # type: ignore[arg-type]
    assert MockWorker(MockWorkerConfig(), tokenizer=None).kv_events is None  # type: ignore[arg-type]


async def test_default_ports_fall_back_to_free_ones_when_taken():
    first, second = ZmqKvEvents(KvEventsConfig("zmq"), BS), ZmqKvEvents(KvEventsConfig("zmq"), BS)
    await first.start()
    try:
        await second.start()
        try:
            ports = {first.publisher.port, first.publisher.replay_port}
            assert not ports & {second.publisher.port, second.publisher.replay_port}
        finally:
            await second.stop()
    finally:
        await first.stop()


async def test_mock_worker_process_events_rebuild_its_cache_in_the_router(tmp_path: Path):
    ports_file = tmp_path / "worker.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "mock-worker", "--port", "0", "--worker-id", "w0",
        "--block-size", str(BS), "--num-gpu-blocks", "256", "--speedup", "100",
        "--kv-events-port", "0", "--kv-replay-port", "0", "--ports-file", str(ports_file),
    ]  # fmt: skip
    router, counters = make_router(), EventCounters()
    with ManagedProcess(argv, log_path=tmp_path / "worker.log", ports_file=ports_file) as worker:
        ports = await asyncio.to_thread(worker.ports, 20.0)  # what the worker bound: HTTP, PUB, replay
        port = ports["port"]
        endpoint = ZmqEndpoint(
            W0, f"tcp://127.0.0.1:{ports['kv_events_port']}", f"tcp://127.0.0.1:{ports['kv_replay_port']}"
        )
        await asyncio.to_thread(wait_http_ok, f"http://127.0.0.1:{port}/health", 20.0, process=worker)
        sub = ZmqEventSubscriber(endpoint, RouterSink(router), block_size=BS, counters=counters, timings=FAST)
        await sub.start()
        try:
            prompts = [
                [7] * (BS * 3) + [1],
                [7] * (BS * 3) + [2] * (BS * 2) + [1],
                list(range(1, 4 * BS + 2)),
            ]
            url = f"http://127.0.0.1:{port}/v1/completions"
            async with aiohttp.ClientSession() as http:
                for tokens in prompts:
                    async with http.post(url, json={"prompt": tokens, "max_tokens": 2}) as r:
                        assert r.status == 200
                await wait_until(lambda: sub.status.up and counters["zmq.batch"] > 0, what="events")
                for tokens in prompts:
                    full = len(tokens) // BS
                    await wait_until(
                        lambda t=tokens, n=full: (
                            router.indexer.find_matches(compute_block_hashes(t, BS)).get(W0) == n
                        ),
                        what=f"{full} blocks of a {len(tokens)}-token prompt",
                    )
                    # the worker agrees: the same prompt again is served from exactly that prefix
                    async with http.post(url, json={"prompt": tokens, "max_tokens": 1}) as r:
                        assert int(r.headers["x-prefix-cache-hit-tokens"]) == full * BS
            assert counters["zmq.unfilled_gap"] == 0
            assert counters["vllm.malformed_event"] == counters["vllm.block_size_mismatch"] == 0
        finally:
            await sub.stop()
    assert worker.returncode is not None
