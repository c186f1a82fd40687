"""Fault: nats-server killed (by pid) while a worker publishes, then restarted on the same port."""

import asyncio
import os
import signal

from extproc.events.dynamo_json import kv_events_subject
from extproc.events.feed import RouterFeed
from extproc.events.nats_events import NatsEventPublisher, NatsEventSubscriber
from extproc.router import Worker, compute_block_hashes

from .conftest import BLOCK_SIZE, connect, eventually, make_router, matches

SUBJECT = kv_events_subject("test", "backend")
W7 = Worker("7")


class RecordingFeed(RouterFeed):
    """The picker's feed, remembering every stream state change it was told about."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.transitions: list[tuple[Worker, bool]] = []

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        self.transitions.append((worker, up))
        super().stream_state(worker, up, reason)


async def test_killed_and_restarted_server_the_worker_is_resynchronised(nats_server, restart_nats):
    router = make_router()
    feed = RecordingFeed({w.worker_id: router for w in router.workers()})
    sub_link = await connect(nats_server, "router")
    pub_link = await connect(nats_server, "worker-7")
    subscriber = NatsEventSubscriber(sub_link, feed, SUBJECT)
    publisher = NatsEventPublisher(pub_link.nc, SUBJECT, 7)
    await subscriber.start()
    stop = asyncio.Event()
    prompts: list[list[int]] = []
    answers = 0

    async def publish_forever() -> None:
        i = 0
        while not stop.is_set():
            tokens = list(range(i * 8, i * 8 + 8))
            prompts.append(compute_block_hashes(tokens, BLOCK_SIZE))
            publisher.on_stored(None, [2 * i + 1, 2 * i + 2], [tokens[:4], tokens[4:]])
            i += 1
            await asyncio.sleep(0.005)  # pacing, not synchronisation

    async def query_forever() -> None:
        nonlocal answers
        while not stop.is_set():
            for local in prompts[-20:]:
                router.indexer.find_matches(local)
                router.best_worker_for_hashes(local, 8)  # a probe: no state change
                answers += 1
            await asyncio.sleep(0.001)

    tasks = [asyncio.create_task(publish_forever()), asyncio.create_task(query_forever())]
    restarted = None
    try:
        await eventually(lambda: sub_link.counters["nats.event"] >= 20, what="events flowing")
        assert feed.transitions == [(W7, True)]
        # nats-server may drop what is published in the first moments of a subscription
        # (see conftest.prime), so the blocks known before the outage are those seen applied
        known = prompts[-1]
        await eventually(lambda: matches(router, known) == {W7: 2}, what="a stored prompt applied")

        os.kill(nats_server.pid, signal.SIGKILL)
        nats_server.stop()  # reaps it
        await eventually(lambda: (W7, False) in feed.transitions, what="stream reported down")
        assert not router.is_event_fed(W7)
        await eventually(lambda: publisher.counters["nats.publish_dropped"] >= 5, what="events lost")
        answers_while_down = answers

        restarted = restart_nats(nats_server.port)
        await eventually(lambda: feed.transitions[-1] == (W7, True), timeout_s=15, what="stream reported up")
        await eventually(lambda: subscriber.gaps >= 1, what="the gap after the outage")
        assert feed.counters["feed.reset"] == 0  # lost events: the blocks known before stay
        assert sub_link.counters.drops[("nats", "7", "event-id-gap")] >= 5
        assert matches(router, known) == {W7: 2}

        stop.set()
        await asyncio.gather(*tasks)
        await publisher.flush()
        newest = prompts[-1]
        await eventually(lambda: matches(router, newest) == {W7: 2}, what="new events apply")
        assert router.is_event_fed(W7)
        assert answers > answers_while_down > 0  # answered throughout, no exception
        assert [up for _, up in feed.transitions][:3] == [True, False, True]
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await subscriber.stop()
        await publisher.stop()
        await sub_link.close()
        await pub_link.close()
        if restarted is not None:
            restarted.stop()


async def test_closing_a_link_whose_server_is_gone_with_messages_buffered_ends_quietly(nats_server, caplog):
    """nats.py's close first writes what it buffered while disconnected; with the socket gone that
    raised ConnectionResetError out of the picker's shutdown ("stopping an event source failed", a
    traceback) and left every subscription's delivery task running."""
    link = await connect(nats_server, "closing")
    received: list[bytes] = []

    async def on_message(msg) -> None:
        received.append(msg.data)

    await link.nc.subscribe("probe.>", cb=on_message)
    await link.nc.publish("probe.1", b"before")
    await eventually(lambda: received == [b"before"], what="the subscription delivers")
    tasks_before = {t for t in asyncio.all_tasks() if "_wait_for_msgs" in repr(t.get_coro())}
    assert tasks_before, "the subscription has a delivery task"
    os.kill(nats_server.pid, signal.SIGKILL)
    await eventually(lambda: not link.up, what="the link sees the server gone")
    await link.nc.publish("probe.2", b"buffered while disconnected")

    with caplog.at_level("INFO", logger="extproc.events"):
        await link.close()  # raised ConnectionResetError before

    assert link.nc.is_closed
    assert not any(not t.done() for t in tasks_before), "a subscription task outlived close"
    assert "already lost at close" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    await link.close()  # again: nothing to do
