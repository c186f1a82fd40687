"""Held NATS reads (`--nats-read-delay-ms`, extproc/events/nats_reads.py) against a real nats-server.

The subscriber runs on the picker's own event loop (`extproc.runtime.wakeups.run`); the events come
from another thread with its own loop and connection, so they arrive while the picker's loop sleeps,
as a worker's would. Every event must be applied, in order and without a gap, a request/reply and
a flush must still complete, and the holding must survive nats.py reconnecting after the server
was killed and restarted on the same port.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.request

import nats

from extproc.devstack.procs import ManagedProcess
from extproc.events.dynamo_json import encode_event, kv_events_subject
from extproc.events.nats_events import NatsEventSubscriber, NatsLink
from extproc.events.nats_reads import catch_up, defer_reads
from extproc.events.replica_sync import ReplicaSync, active_sequences_subject
from extproc.router import KvRouter, Worker, compute_block_hashes
from extproc.router.types import BlocksStored, StoredBlock
from extproc.runtime.wakeups import bytes_waiting, deferring_selector, run

from .conftest import BLOCK_SIZE, eventually, make_feed, make_router, matches, prime_events

SUBJECT = kv_events_subject("dynamo", "backend")
W7 = Worker("7")
BOUND_S = 20.0


def _stored_events(first_id: int, count: int, seed: int) -> tuple[list[bytes], list[int]]:
    """`count` stored events of worker 7, one block each, chained: (payloads, the chain's hashes)."""
    rng = random.Random(seed)
    tokens = [rng.randrange(1, 50_000) for _ in range(BLOCK_SIZE * count)]
    hashes = compute_block_hashes(tokens, BLOCK_SIZE)
    payloads = []
    for i, h in enumerate(hashes):
        parent = hashes[i - 1] if i else None
        event = BlocksStored(W7, (StoredBlock(h, h),), parent)
        payloads.append(encode_event(7, event, first_id + i, 0))
    return payloads, hashes


class Publisher(threading.Thread):
    """Publishes payloads from its own loop and connection, in bursts of 1-8 a few ms apart."""

    def __init__(self, url: str, payloads: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.payloads = payloads
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._publish())
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _publish(self) -> None:
        nc = await nats.connect(self.url)
        rng = random.Random(1)
        i = 0
        while i < len(self.payloads):
            burst = rng.randint(1, 8)
            for payload in self.payloads[i : i + burst]:
                await nc.publish(SUBJECT, payload)
            await nc.flush()
            i += burst
            await asyncio.sleep(rng.uniform(0.0, 0.01))  # the pace of a worker, not a synchronisation
        await nc.close()


async def _subscribed(url: str, delay_s: float) -> tuple[NatsLink, NatsEventSubscriber, KvRouter]:
    router = make_router()
    link = await NatsLink.connect(url, name="held-reads")
    assert defer_reads(link.nc, delay_s) is None
    subscriber = NatsEventSubscriber(link, make_feed(router), SUBJECT)
    await subscriber.start()
    return link, subscriber, router


def test_held_reads_apply_every_event_in_order_and_replies_still_arrive(nats_server) -> None:
    payloads, hashes = _stored_events(1, 400, seed=3)

    async def main() -> None:
        link, subscriber, router = await _subscribed(nats_server.url, 0.02)
        primer = await nats.connect(nats_server.url)
        try:
            await prime_events(primer, SUBJECT, lambda: subscriber.counters["nats.event"] > 0)
            publisher = Publisher(nats_server.url, payloads)
            publisher.start()
            await eventually(lambda: matches(router, hashes).get(W7) == len(hashes), 20.0,
                             lambda: f"all 400 blocks applied (have {matches(router, hashes)})")  # fmt: skip
            publisher.join(10.0)
            assert publisher.error is None
            assert subscriber.counters["nats.gap"] == 0
            selector = deferring_selector()
            assert selector is not None and selector.stats.held > 0

            async def answer(msg: nats.aio.msg.Msg) -> None:
                await msg.respond(b"pong")

            await primer.subscribe("held.ping", cb=answer)
            await primer.flush()
            await link.nc.flush(timeout=5)  # a PING answered through the held socket
            reply = await link.nc.request("held.ping", b"ping", timeout=5)
            assert reply.data == b"pong"
        finally:
            await primer.close()
            await subscriber.stop()
            await link.close()

    run(main())


def test_held_reads_go_on_after_nats_py_reconnects(nats_server, restart_nats) -> None:
    before, _ = _stored_events(1, 20, seed=4)
    after, hashes_after = _stored_events(21, 20, seed=5)

    async def main() -> None:
        link, subscriber, router = await _subscribed(nats_server.url, 0.02)
        primer = await nats.connect(nats_server.url)
        await prime_events(primer, SUBJECT, lambda: subscriber.counters["nats.event"] > 0)
        for payload in before:
            await primer.publish(SUBJECT, payload)
        await primer.close()
        await eventually(lambda: subscriber.counters["nats.event"] > len(before) - 1, 10.0, "events before")
        os.kill(nats_server.pid, signal.SIGKILL)
        nats_server.stop()
        restarted = restart_nats(nats_server.port)
        try:
            await eventually(lambda: link.nc.is_connected, 20.0, "nats.py reconnected")
            selector = deferring_selector()
            assert selector is not None
            held = selector.stats.held
            primer = await nats.connect(restarted.url)
            try:
                seen = subscriber.counters["nats.event"]
                await prime_events(primer, SUBJECT, lambda: subscriber.counters["nats.event"] > seen)
                # the engine's next events, in order after the ones before the outage
                for payload in after:
                    await primer.publish(SUBJECT, payload)
                await primer.flush()
                await eventually(lambda: matches(router, hashes_after).get(W7, 0) > 0, 10.0,
                                 "events after the reconnect applied")  # fmt: skip
            finally:
                await primer.close()
            assert selector.stats.held > held  # the reconnected socket is held too
        finally:
            await subscriber.stop()
            await link.close()

    run(main())


def test_reads_are_not_held_with_no_delay_or_off_the_pickers_loop(nats_server) -> None:
    async def main() -> tuple[str | None, str | None]:
        nc = await nats.connect(nats_server.url)
        try:
            return defer_reads(nc, 0.0), defer_reads(nc, 0.02)
        finally:
            await nc.close()

    off, other_loop = asyncio.run(main())
    assert off is not None and "0" in off
    assert other_loop is not None and "event loop" in other_loop
    assert run(main())[1] is None  # on the picker's loop it holds


def test_extproc_serve_runs_on_the_loop_that_holds_nats_reads(nats_server, tmp_path) -> None:
    config = tmp_path / "picker.yaml"
    config.write_text("models: [{name: m}]\nworkers:\n  - {id: '7', endpoint: '127.0.0.1:1', model: m}\n")
    ports_file = tmp_path / "ports.json"
    argv = [
        sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", "0",
        "--health-port", "0", "--admin-port", "0", "--ports-file", str(ports_file),
        "--nats-url", nats_server.url, "--router-kv-events", "--nats-read-delay-ms", "15",
    ]  # fmt: skip
    log_path = tmp_path / "serve.log"
    with ManagedProcess(argv, log_path=log_path, ports_file=ports_file) as serve:
        admin = serve.ports(30.0)["admin_port"]  # listening: NATS was connected before
        text = log_path.read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    assert "messages read with the picker's next wake-up, within 15 ms" in text, text[-2000:]
    for reason in ("on_wake", "waiting", "deadline", "closed"):
        assert f'extproc_held_reads_total{{released="{reason}"}}' in metrics
    sleeps = re.search(r"^extproc_event_loop_sleeps_total (\S+)$", metrics, re.M)
    lazy = re.search(r"^extproc_lazy_timers_total (\S+)$", metrics, re.M)
    assert sleeps is not None and float(sleeps.group(1)) > 0  # it waited for its first connections
    assert lazy is not None  # (readiness, scrapes: lazy timers, fired or not by now)


def _publish_from_another_loop(url: str, subject: str, payloads: list[bytes]) -> None:
    """Publishes and flushes from a thread of its own (this test's loop is blocked meanwhile)."""

    async def publish() -> None:
        nc = await nats.connect(url)
        for payload in payloads:
            await nc.publish(subject, payload)
        await nc.flush()
        await nc.close()

    thread = threading.Thread(target=asyncio.run, args=(publish(),), daemon=True)
    thread.start()
    thread.join(30.0)
    assert not thread.is_alive()


def test_a_replica_about_to_decide_applies_what_already_waits_in_its_held_socket(nats_server) -> None:
    """Bytes that reached a held socket are read with the next wake-up, a few loop turns after the
    ext_proc message that woke it: too late for the decision it asks for. `catch_up` reads them
    before (EndpointPicker.before_decision with replica sync)."""
    subject = active_sequences_subject("test", "backend")
    other = ReplicaSync(None, make_router(), "a", subject, batch_s=0.0)  # type: ignore[arg-type]
    wire: list[bytes] = []
    other._sender = type("Wire", (), {"submit": lambda self, s, p: wire.append(p)})()  # type: ignore[assignment]
    other.publish_added("r1", W7, [11, 12], 32, 0, 8)

    async def main() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            # held after each read, for at most 2 s: a PONG that lands just after the loop's last
            # look before sleeping waits out the delay (with an hour, the flush below timed out)
            assert defer_reads(nc, 2.0) is None
            sync = ReplicaSync(nc, make_router(), "b", subject)
            await sync.start()
            await sync.flush()  # its last read (the PONG) holds the socket
            selector = deferring_selector()
            assert selector is not None and selector.holding == 1
            fd = nc._transport._io_writer.get_extra_info("socket").fileno()  # type: ignore[union-attr]
            _publish_from_another_loop(nats_server.url, subject, wire)
            deadline = time.monotonic() + BOUND_S
            while not bytes_waiting(fd) and time.monotonic() < deadline:
                time.sleep(0.005)  # the loop is blocked on purpose: nothing may read the socket
            assert bytes_waiting(fd) and sync.tracked_remote() == {}
            await sync.catch_up()
            assert sync.tracked_remote() == {"a": 1}  # applied before going on, not a wake-up later
            counts = sync.counters.snapshot()
            assert counts.get("sync.catch_up") == 1 and 1 <= counts.get("sync.catch_up_turns", 0) < 8
            await sync.catch_up()  # nothing waits: nothing to do
            assert sync.counters.snapshot().get("sync.catch_up") == 1
            await sync.stop()
        finally:
            await nc.close()
        assert await catch_up(nc, lambda: 0) == 0  # a closed connection (its fd is -1): nothing

    run(main())
