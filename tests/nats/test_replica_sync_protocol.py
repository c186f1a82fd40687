"""Replica sync's self-healing, message by message (extproc/events/replica_sync.py), without NATS.

Each replica's outgoing messages land on a `Wire` the test delivers by hand (or loses), and time
is a number passed to `handle` and `tick` (`sync_nodes`): sequence gaps, digests, state parts,
leases and the reconnect are checked exactly, with no sleep. The same behaviour over a real
nats-server is in test_replica_sync_faults.py.
"""

from __future__ import annotations

import logging

import msgpack
import pytest

from extproc.events.replica_sync import MAX_ORIGINS
from extproc.events.replica_wire import V1, VERSION, InFlight, Record, id_hash

from .sync_nodes import HEARTBEAT_S, LEASE_S, W7, W8, Node, exchange, started


def test_a_lost_free_is_noticed_at_the_next_heartbeat_and_the_state_replaces_the_phantom():
    a, b = started("a", "b")
    kept, lost = a.route(), a.route()
    a.deliver(b)
    assert b.sync.tracked_remote() == {"a": 2}
    a.finish(lost)
    a.deliver(b, lose={0})  # the free is lost (an outage, a full queue)
    assert b.sync.tracked_remote() == {"a": 2}  # a phantom, for now
    a.sync.tick(1.0)  # heartbeat: b sees the gap, asks, a answers with its state
    exchange(a, b, now=1.0)
    a.sync.tick(1.5)  # a answers wants on its tick
    exchange(a, b, now=1.5)
    assert b.sync.tracked_remote() == {"a": 1}
    assert b.load() == a.load() and kept
    assert b.counters["sync.gap"] == 1 and b.counters["sync.missed"] == 1
    assert b.counters["sync.resync"] >= 1 and a.counters["sync.state_sent"] >= 2


def test_a_replica_that_joins_late_asks_at_once_and_gets_what_is_in_flight():
    a, b = started("a", "b")
    for _ in range(3):
        a.route()
    a.deliver(b)
    late = Node("late", boot=9)
    a.sync.tick(1.0)
    a.deliver(b, late, now=1.0)  # a heartbeat numbered past 1: late missed a's history
    assert late.wire.ops() == ["want"] and late.counters["sync.want"] == 1
    late.deliver(a, b, now=1.0)
    a.sync.tick(1.5)
    a.deliver(b, late, now=1.5)
    assert late.sync.tracked_remote() == {"a": 3} and late.load() == a.load() == b.load()


def test_a_heartbeat_whose_digest_differs_asks_for_the_state():
    a, b = started("a", "b")
    a.route()
    a.deliver(b)
    b.sync._origins["a"].in_flight.pop("req-1")  # b lost track without a gap (it should not happen)
    b.router.free("a:req-1")
    a.sync.tick(1.0)
    a.deliver(b, now=1.0)
    assert b.counters["sync.digest_mismatch"] == 1 and b.wire.ops() == ["want"]
    b.deliver(a, now=1.0)
    a.sync.tick(1.5)
    a.deliver(b, now=1.5)
    assert b.sync.tracked_remote() == {"a": 1} and b.load() == a.load()


def test_a_silent_replica_expires_after_its_lease_and_is_logged(caplog):
    a, b = started("a", "b")
    for _ in range(3):
        a.route()
    a.sync.tick(0.0)
    a.deliver(b, now=0.0)
    b.sync.tick(LEASE_S - 0.1)
    assert b.sync.tracked_remote() == {"a": 3}
    with caplog.at_level(logging.WARNING, "extproc.events.replica_sync"):
        b.sync.tick(LEASE_S + 0.1)  # a was SIGKILLed: no bye, no heartbeat
    assert b.sync.tracked_remote() == {} and b.router.is_idle()
    assert b.counters["sync.lease_expired"] == 1
    assert "a silent for 5.1 s (lease 5.0 s): forgot its 3 requests" in caplog.text


def test_heartbeats_renew_the_lease():
    a, b = started("a", "b")
    a.route()
    for t in range(0, 20):
        a.sync.tick(float(t))
        a.deliver(b, now=float(t))
        b.sync.tick(float(t) + 0.5)
    assert b.sync.tracked_remote() == {"a": 1} and b.counters["sync.lease_expired"] == 0


def test_leases_wait_while_our_own_connection_is_down_and_restart_when_it_is_back():
    a, b = started("a", "b")
    a.route()
    a.deliver(b, now=0.0)
    b.sync.connection_changed(False, "NATS connection lost")
    b.sync.tick(3 * LEASE_S)
    assert b.sync.tracked_remote() == {"a": 1}  # b hears nobody: a's silence says nothing
    b.wire.take()
    b.now = 3 * LEASE_S
    b.sync.connection_changed(True, "NATS reconnected")
    assert b.wire.ops()[-1] == "want" and "state" in b.wire.ops()  # its state out, theirs asked for
    b.sync.tick(4 * LEASE_S - 0.1)
    assert b.sync.tracked_remote() == {"a": 1}
    b.sync.tick(4 * LEASE_S + 0.1)
    assert b.sync.tracked_remote() == {} and b.counters["sync.lease_expired"] == 1


def test_a_replica_restarted_under_the_same_id_loses_its_previous_requests():
    a, b = started("a", "b")
    a.route()
    a.route()
    a.deliver(b)
    again = Node("a", boot=2)
    again.sync._want_all("restart")
    again.deliver(b)
    assert b.sync.tracked_remote() == {} and b.router.is_idle()
    assert b.counters["sync.restarted"] == 1


def test_a_large_state_comes_in_parts_and_a_lost_part_is_asked_for_again():
    a, b = started("a", "b")
    for _ in range(40):
        a.route(n_tokens=4 * 4000)  # 4,000 block hashes each: several parts
    a.wire.take()  # b missed every add
    a.sync.tick(1.0)
    a.deliver(b, now=1.0)
    b.deliver(a, now=1.0)
    a.sync.tick(1.5)
    parts = [msgpack.unpackb(p) for p in a.wire.sent if msgpack.unpackb(p)["op"] == "state"]
    assert len(parts) > 1 and {p["parts"] for p in parts} == {len(parts)}
    a.deliver(b, now=1.5, lose={1})  # the second part is lost
    assert b.sync.tracked_remote() == {}
    b.sync.tick(1.5 + 2 * HEARTBEAT_S)  # no state came: b asks again
    b.deliver(a, now=3.5)
    a.sync.tick(3.5)
    a.deliver(b, now=3.5)
    assert b.sync.tracked_remote() == {"a": 40} and b.load() == a.load()


def test_requests_on_a_worker_this_replica_does_not_know_count_once_it_comes_back():
    a = Node("a", "7", "8")
    b = Node("b", "7")  # its discovery does not (yet) see worker 8
    for node in (a, b):
        node.sync._want_all("start")
    exchange(a, b)
    on_8 = [a.route(W8), a.route(W8)]
    a.route(W7)
    a.deliver(b)
    assert b.router.sequences.num_requests(W7) == 1 and b.sync.tracked_remote() == {"a": 3}
    b.router.add_worker(a.router.spec("8"))  # worker 8 appears in b's discovery
    assert b.sync.workers_added({"8"}) == 2
    assert b.load() == a.load()
    for request_id in on_8:
        a.finish(request_id)
    a.deliver(b)
    assert b.router.sequences.num_requests(W8) == 0 and b.load() == a.load()


def test_version_1_messages_are_applied_and_never_expire():
    b = Node("b")

    def v1(op: str, **fields) -> bytes:
        return msgpack.packb({"v": V1, "router": "old", "op": op, **fields})

    b.sync.handle(v1("add", id="x", worker="7", dp=0, hashes=[1, 2], isl=8, overlap=0, eot=None), now=0)
    assert b.sync.tracked_remote() == {"old": 1} and b.sync.counters["sync.applied"] == 1
    b.sync.tick(10 * LEASE_S)
    assert b.sync.tracked_remote() == {"old": 1}
    b.sync.handle(v1("free", id="x"), now=0)
    assert b.router.is_idle()


def test_a_format_2_message_needs_its_sequence():
    b = Node("b")
    b.sync.handle(msgpack.packb({"v": VERSION, "router": "x", "op": "hb", "n": 0, "digest": 0}))
    b.sync.handle(msgpack.packb({"v": VERSION, "router": "x", "op": "hb", "boot": 1, "seq": 0}))
    assert b.counters["sync.malformed"] == 2 and b.sync.tracked_remote() == {}


def test_other_replicas_are_bounded():
    b = Node("b")
    for i in range(MAX_ORIGINS + 5):
        b.sync.handle(msgpack.packb({"v": VERSION, "router": f"r{i}", "boot": 1, "seq": 1, "op": "hb",
                                     "n": 0, "digest": 0}), now=0)  # fmt: skip
    assert len(b.sync._origins) == MAX_ORIGINS and b.counters["sync.origins_full"] == 5


@pytest.mark.parametrize("ids", [["a", "b", "c"], ["c", "a", "b"]])
def test_the_digest_ignores_order_and_follows_prefill(ids):
    s = InFlight()
    for request_id in ids:
        s.put(request_id, Record(W7, (1,), 4, 0, None))
    assert s.summary() == (3, sum(id_hash(i, False) for i in ids) % 2**64)
    s.mark_prefilled("a")
    assert s.digest == (id_hash("a", True) + id_hash("b", False) + id_hash("c", False)) % 2**64
    s.pop("a")
    s.pop("b")
    s.pop("c")
    assert s.summary() == (0, 0)
