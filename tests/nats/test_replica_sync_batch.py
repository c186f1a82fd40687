"""Replica sync batches (extproc/events/replica_sync.py, format 3), message by message without NATS.

A batch must change nothing but the number of messages: what a receiver tracks and the load its
router counts after a batch equal what the same lifecycle ops sent one by one give, also when the
batch is lost or delivered twice (both healed as for single messages: the sequence gap asks for
the sender's state). A replica sends batches only to replicas whose heartbeat said they read them.
"""

from __future__ import annotations

import asyncio
import random

import msgpack
import pytest

from extproc.events.replica_wire import MAX_BATCH_OPS, VERSION
from extproc.router import Worker
from extproc.runtime import wakeups

from . import sync_nodes
from .sync_nodes import HEARTBEAT_S, W7, W8

BATCH_S = 0.02


class Node(sync_nodes.Node):
    """A replica whose lifecycle messages are gathered for `BATCH_S` unless told otherwise."""

    def __init__(self, name: str, *, batch_s: float = BATCH_S, boot: int = 1) -> None:
        super().__init__(name, batch_s=batch_s, boot=boot)


def script(seed: int, n: int = 60) -> list[tuple[str, str, Worker, list[int]]]:
    """A random lifecycle: adds (some ids added again), first tokens and frees, in an order a
    replica could publish them; hashes include values that do not fit a signed 64-bit int, and
    some adds a negative one (sent as a list of integers, not packed)."""
    rng = random.Random(seed)
    ops: list[tuple[str, str, Worker, list[int]]] = []
    live: list[str] = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.45 or not live:
            request_id = rng.choice(live) if live and rng.random() < 0.1 else f"req-{i}"
            hashes = [rng.getrandbits(64) for _ in range(rng.randint(0, 40))] + [(1 << 64) - 1]
            if rng.random() < 0.2:
                hashes.append(-1)
            ops.append(("add", request_id, rng.choice((W7, W8)), hashes))
            if request_id not in live:
                live.append(request_id)
        elif roll < 0.7:
            ops.append(("prefill", rng.choice(live), W7, []))
        else:
            request_id = live.pop(rng.randrange(len(live)))
            ops.append(("free", request_id, W7, []))
    return ops


def play(sender: Node, ops: list[tuple[str, str, Worker, list[int]]]) -> None:
    for op, request_id, worker, hashes in ops:
        if op == "add":
            sender.sync.publish_added(request_id, worker, hashes, 16 * len(hashes), 1, 8)
        elif op == "prefill":
            sender.sync.publish_prefill_complete(request_id)
        else:
            sender.sync.publish_freed(request_id)


def pair(batch_s: float) -> tuple[Node, Node]:
    a, b = Node("a", batch_s=batch_s), Node("b")
    a.hears(b)
    b.hears(a)
    a.wire.take()
    return a, b


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_applied_equals_the_single_messages_applied(seed):
    ops = script(seed)
    singles_a, singles_b = pair(batch_s=0.0)
    batch_a, batch_b = pair(batch_s=BATCH_S)
    assert batch_a.sync.batching() and not singles_a.sync.batching()
    play(singles_a, ops)
    play(batch_a, ops)
    assert batch_a.wire.sent == []  # gathered, not sent yet
    batch_a.sync.flush_batch()
    assert batch_a.wire.ops() == ["batch"] and len(singles_a.wire.sent) == len(ops)
    applied = batch_b.counters["sync.applied"]
    singles_a.deliver(singles_b)
    batch_a.deliver(batch_b)
    assert batch_b.view() == singles_b.view()
    assert batch_b.counters["sync.batch_ops"] == len(ops) and batch_b.counters["sync.applied"] == applied + 1
    assert batch_a.sync.own_summary() == singles_a.sync.own_summary()


def test_a_lost_batch_is_healed_as_a_lost_message_is():
    ops = script(7)
    a, b = pair(batch_s=BATCH_S)
    play(a, ops[:30])
    a.sync.flush_batch()
    a.deliver(b, lose={0})
    play(a, ops[30:])
    a.sync.tick(0.0)  # the second batch, then a heartbeat: b sees the gap and asks for the state
    a.deliver(b)
    assert b.counters["sync.gap"] == 1 and b.wire.ops() == ["want"]
    b.deliver(a)
    a.sync.tick(0.5)  # a answers on its tick
    a.deliver(b)
    singles_a, singles_b = pair(batch_s=0.0)
    play(singles_a, ops)
    singles_a.deliver(singles_b)
    assert b.view() == singles_b.view()


def test_a_batch_delivered_twice_is_handled_as_a_message_delivered_twice():
    ops = script(11)
    results = []
    for batch_s in (0.0, BATCH_S):
        a, b = pair(batch_s)
        play(a, ops)
        a.sync.flush_batch()
        a.deliver(b, twice=set(range(len(a.wire.sent))))  # every message (or the batch) twice
        asked = b.wire.ops()
        b.deliver(a)
        a.sync.tick(0.5)
        a.deliver(b)
        results.append((b.view(), asked[:1], b.counters["sync.gap"]))
    assert results[0][0] == results[1][0] and results[0][1] == results[1][1] == ["want"]
    assert results[0][2] >= 1 and results[1][2] == 1


def test_gathered_ops_go_before_any_other_message_and_the_heartbeat_digest_agrees():
    a, b = pair(batch_s=BATCH_S)
    play(a, script(3, n=10))
    a.sync.tick(0.0)  # a heartbeat is due: the batch goes first
    assert a.wire.ops() == ["batch", "hb"]
    a.deliver(b)
    assert b.counters["sync.digest_mismatch"] == 0 and b.counters["sync.gap"] == 0


def test_a_batch_is_sent_when_its_time_is_up_or_it_is_full():
    a, _ = pair(batch_s=BATCH_S)
    a.sync._next_heartbeat = 10.0
    a.sync.publish_freed("x")
    a.sync.tick(BATCH_S / 2)
    assert a.wire.sent == []
    a.sync.tick(BATCH_S)
    assert a.wire.ops() == ["batch"]
    a.wire.take()
    for i in range(MAX_BATCH_OPS + 1):
        a.sync.publish_freed(f"r{i}")
    assert a.wire.ops() == ["batch"] and len(msgpack.unpackb(a.wire.sent[0])["ops"]) == MAX_BATCH_OPS


def test_replicas_that_do_not_say_they_read_batches_get_single_messages():
    a = Node("a")
    old = Node("old")
    assert a.sync.batching()  # nobody heard yet
    a.sync.handle(msgpack.packb({"v": VERSION, "router": "old", "boot": 3, "seq": 1, "op": "hb", "n": 0,
                                 "digest": 0, "lease_s": 5.0}), now=0.0)  # fmt: skip
    assert not a.sync.batching()
    a.sync.publish_added("r1", W7, [1, 2], 8, 0, None)
    assert a.wire.ops() == ["add"]
    a.deliver(old)
    assert old.sync.tracked_remote() == {"a": 1}


def test_ops_gathered_before_an_old_replica_appeared_go_out_one_by_one():
    a, _ = pair(batch_s=BATCH_S)
    a.sync.publish_added("r1", W7, [1, 2], 8, 0, None)
    a.sync.publish_freed("r0")
    a.sync.handle(msgpack.packb({"v": VERSION, "router": "old", "boot": 3, "seq": 1, "op": "want",
                                 "from": "*"}), now=0.0)  # fmt: skip
    a.sync.flush_batch()
    assert a.wire.ops() == ["add", "free"]
    old = Node("old")
    a.deliver(old)
    assert old.sync.tracked_remote() == {"a": 1} and old.counters["sync.apply_failed"] == 0


def test_a_malformed_batch_is_not_applied_at_all():
    b = Node("b")
    good, short = [0, "r1", "7", 0, b"\x01" * 8, 8, 0, None], [0, "r2", "7", 0, b"\x01" * 7, 8, 0, None]
    message = {"v": 3, "router": "a", "boot": 1, "seq": 1, "op": "batch", "ops": [good, short]}
    b.sync.handle(msgpack.packb(message, use_bin_type=True), now=0.0)
    assert b.counters["sync.apply_failed"] == 1 and b.sync.tracked_remote() == {} and b.router.is_idle()
    message["ops"] = [[9, "r1"]]
    message["seq"] = 2
    b.sync.handle(msgpack.packb(message, use_bin_type=True), now=0.0)
    assert b.counters["sync.apply_failed"] == 2


@pytest.mark.asyncio
async def test_on_an_event_loop_a_batch_leaves_after_its_window():
    a, b = pair(batch_s=BATCH_S)
    a.sync.publish_added("r1", W7, [1, 2], 8, 0, None)
    a.sync.publish_freed("r0")
    assert a.wire.sent == []
    deadline = asyncio.get_running_loop().time() + 2.0
    while not a.wire.sent:
        assert asyncio.get_running_loop().time() < deadline, "the batch never left"
        await asyncio.sleep(0.005)  # polling the wire
    assert a.wire.ops() == ["batch"]
    a.deliver(b)
    assert b.sync.tracked_remote() == {"a": 1}


def test_on_the_pickers_loop_a_batch_leaves_when_the_wake_up_that_filled_it_ends():
    async def main() -> None:
        a, b = pair(batch_s=0.9)  # a window far longer than this test waits
        a.sync.publish_added("r1", W7, [1, 2], 8, 0, None)
        for _ in range(3):
            await asyncio.sleep(0)  # the loop is still busy: more ops may come
            assert a.wire.sent == []
        a.sync.publish_prefill_complete("r1")
        await asyncio.sleep(0.001)  # the loop has nothing left to run: the batch goes before it sleeps
        assert a.wire.ops() == ["batch"]
        a.deliver(b)
        assert b.sync.tracked_remote() == {"a": 1}
        a.sync.publish_freed("r1")  # the next batch: its own wake-up
        await asyncio.sleep(0.001)  # as above: the loop idles, the batch goes before it sleeps (0.9 s window)
        assert a.wire.ops() == ["batch"]
        a.deliver(b)
        assert b.sync.tracked_remote() == {}

    wakeups.run(main())


def test_the_background_tick_comes_with_the_heartbeat_unless_a_state_is_wanted_or_the_link_is_down():
    a = Node("a")
    a.sync.tick(0.0)  # heartbeats; the next is due a period later
    assert a.sync._next_tick(0.0) == (HEARTBEAT_S, HEARTBEAT_S / 4)  # up to a quarter late
    assert a.sync._next_tick(0.6) == (pytest.approx(0.4), HEARTBEAT_S / 4)
    a.sync._dump_wanted = True  # another replica asked for this one's state: soon, exactly
    assert a.sync._next_tick(0.6) == (0.0, 0.0)
    a.sync._dump_wanted = False
    a.sync.connection_changed(False, "test")  # no heartbeats go out: look again often, as before
    assert a.sync._next_tick(0.6) == (HEARTBEAT_S / 4, 0.0)
