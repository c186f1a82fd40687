"""Replica sync at its edges (extproc/events/replica_sync.py), message by message, without NATS.

What another replica (or anything else publishing on the subject) may send, checked at the limits
the module sets; the exact times of heartbeats, re-asked wants, answers and leases; where a batch
or a state is cut; and what a resynchronisation changes, counts and logs. Counters are checked
whole where a scenario ends (`counts`): they are what an operator sees. The same behaviour over a
real nats-server is in test_replica_sync.py, test_replica_sync_faults.py and test_backpressure.py.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from nats.aio.msg import Msg

from extproc.events import replica_sync
from extproc.events.replica_sync import (
    BATCH_BYTES,
    MAX_LEASE_S,
    MAX_STATE_PARTS,
    MIN_LEASE_S,
    STATE_PART_BYTES,
    ReplicaSync,
)
from extproc.events.replica_wire import (
    MAX_BATCH_OPS,
    MAX_HASHES,
    MAX_TOKENS,
    V1,
    V3,
    VERSION,
    InFlight,
    Record,
    id_hash,
)
from extproc.router import Worker
from extproc.runtime import wakeups
from extproc.tasks import cancel_and_wait

from ..replica_helpers import until
from .conftest import make_router
from .sync_nodes import HEARTBEAT_S, LEASE_S, SUBJECT, W7, W8, Node, started


def packed(
    origin: str, op: str, seq: int | None = 1, *, boot: Any = 1, v: int = VERSION, **fields: Any
) -> bytes:
    """A replica sync message as another replica would publish it."""
    head: dict[str, Any] = {"v": v, "router": origin, "op": op}
    if seq is not None:
        head["seq"] = seq
    if boot is not None:
        head["boot"] = boot
    return msgpack.packb({**head, **fields}, use_bin_type=True)


def heartbeat(origin: str = "a", seq: int = 1, n: int = 0, digest: int = 0, **fields: Any) -> bytes:
    return packed(origin, "hb", seq, n=n, digest=digest, **fields)


def add(origin: str, seq: int | None, request_id: str, *, boot: Any = 1, **fields: Any) -> bytes:
    """A format-1 add (as a replica that does not batch sends it); without `seq`, as a version-1
    replica sends it (no sequence, no incarnation)."""
    record = {"worker": "7", "dp": 0, "hashes": [1, 2], "isl": 8, "overlap": 0, "eot": None, **fields}
    return packed(origin, "add", seq, boot=boot if seq is not None else None, v=V1, id=request_id, **record)


def counts(node: Node) -> dict[str, int]:
    """The node's counters, without `sync.applied` (every test's traffic moves it)."""
    return {k: v for k, v in node.counters.snapshot().items() if k != "sync.applied"}


# --- values from the wire ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "boot, ok",
    [
        ((1 << 64) - 1, True),  # the largest msgpack carries
        (-(1 << 63), True),  # the smallest
        (-1, True),
        (True, False),
        (1.0, False),
        ("1", False),
    ],
)
def test_a_sequence_head_takes_64_bit_integers_and_nothing_else(boot, ok):
    b = Node("b")
    b.sync.handle(heartbeat("a", 1, boot=boot))
    assert counts(b) == ({} if ok else {"sync.malformed": 1})
    assert ("a" in b.sync._origins) is ok


def test_a_sequence_number_must_be_an_integer_too():
    b = Node("b")
    b.sync.handle(heartbeat("a", 1.0))  # type: ignore[arg-type]
    b.sync.handle(add("a", 1, "x", boot=None))  # a sequence number without an incarnation
    assert counts(b) == {"sync.malformed": 2} and b.sync._origins == {}


@pytest.mark.parametrize(
    "message",
    [
        {"v": 4, "router": "a", "op": "hb"},  # a format this version does not know
        {"v": VERSION, "router": 5, "op": "hb"},  # a router id that is no string
        {"v": VERSION, "router": "a", "op": 5},
        {"v": VERSION, "router": "a"},
    ],
)
def test_a_message_without_a_known_format_a_router_id_and_an_op_is_malformed(message):
    b = Node("b")
    b.sync.handle(msgpack.packb({**message, "boot": 1, "seq": 1, "n": 0, "digest": 0}))
    assert counts(b) == {"sync.malformed": 1} and b.sync._origins == {}


@pytest.mark.parametrize(
    "hashes, ok",
    [
        ([(1 << 64) - 1, 0], True),  # local hashes are u64
        ([-(1 << 63)], True),  # the wire also carries the signed form
        ([1.5], False),
        ([1, "2"], False),
        ([True], False),
        ({}, False),  # no list at all, even an empty map
        ("", False),
        (b"\x00" * 7, False),  # packed: 8 bytes per hash
        (b"\x01" * 16, True),
    ],
)
def test_an_adds_hashes_are_integers_as_a_list_or_packed(hashes, ok):
    b = Node("b")
    b.sync.handle(add("a", None, "x", hashes=hashes))
    assert counts(b) == ({} if ok else {"sync.apply_failed": 1})
    assert b.sync.tracked_remote() == ({"a": 1} if ok else {})


def test_signed_hashes_are_the_same_u64_hashes():
    """A hash in its signed form (i64, as some encoders write u64s) is the same 64-bit hash: the
    router is given the u64 (until 2026-11-27 it was given the negative number, which matched no
    block, and a later negative hash failed the whole add)."""
    b = Node("b")
    b.sync.handle(add("a", None, "x", hashes=[-1, 5, -(1 << 63)]))
    assert counts(b) == {}
    [(_, _, record)] = b.sync.remote_requests()
    assert record.hashes == ((1 << 64) - 1, 5, 1 << 63)


@pytest.mark.parametrize("form", ["list", "packed"])
def test_an_add_carries_at_most_max_hashes(form):
    b = Node("b")
    for request_id, n in (("most", MAX_HASHES), ("more", MAX_HASHES + 1)):
        hashes: Any = list(range(n)) if form == "list" else struct.pack(f"<{n}Q", *range(n))
        b.sync.handle(add("a", None, request_id, hashes=hashes, isl=4 * n))
    assert {r for _, r, _ in b.sync.remote_requests()} == {"most"}
    assert counts(b) == {"sync.apply_failed": 1}


@pytest.mark.parametrize(
    "worker, dp, expected",
    [
        (7, 1, Worker(7, 1)),  # Dynamo's u64 worker ids
        ("7", 2, Worker("7", 2)),
        (1.5, 0, None),
        ("7", "0", None),
        ("7", None, None),
    ],
)
def test_an_adds_worker_is_a_string_or_an_integer_with_its_dp_rank(worker, dp, expected):
    b = Node("b")
    b.sync.handle(add("a", None, "x", worker=worker, dp=dp))
    assert [r.worker for _, _, r in b.sync.remote_requests()] == ([expected] if expected else [])


@pytest.mark.parametrize("field, value", [("eot", "8"), ("isl", None), ("overlap", 1.5), ("id", 7)])
def test_an_add_with_a_field_of_the_wrong_type_is_not_applied(field, value):
    b = Node("b")
    message = msgpack.unpackb(add("a", None, "x"))
    message[field] = value
    b.sync.handle(msgpack.packb(message))
    assert b.sync.tracked_remote() == {} and counts(b) == {"sync.apply_failed": 1}


def batch(origin: str, seq: int, ops: Any) -> bytes:
    return packed(origin, "batch", seq, v=V3, ops=ops)


COUNTS = [  # (isl, overlap, eot) of an add with two hashes; in range?
    ((0, 0, None), True),
    ((MAX_TOKENS, 2, MAX_TOKENS), True),
    ((8, 0, 0), True),
    ((-1, 0, None), False),
    ((MAX_TOKENS + 1, 0, None), False),
    ((8, -1, None), False),
    ((8, 3, None), False),  # more cached blocks than the prompt has
    ((8, 0, -1), False),
    ((8, 0, MAX_TOKENS + 1), False),
]


@pytest.mark.parametrize("form", ["add", "batch", "state"])
@pytest.mark.parametrize("values, ok", COUNTS)
def test_an_adds_counts_out_of_range_are_refused_in_every_form(form, values, ok):
    """A negative prompt or output, or an overlap beyond the prompt's blocks, would make the worker
    look less loaded (or more) than it is until the request ended: refused like a wrong type."""
    isl, overlap, eot = values
    b = Node("b")
    if form == "add":
        b.sync.handle(add("a", None, "x", isl=isl, overlap=overlap, eot=eot))
    elif form == "batch":
        b.sync.handle(batch("a", 1, [[0, "x", "7", 0, [1, 2], isl, overlap, eot]]))
    else:
        reqs = [["x", "7", 0, [1, 2], isl, overlap, eot, False]]
        b.sync.handle(packed("a", "state", 1, part=0, parts=1, reqs=reqs), now=0.0)
    tracked = [(r.isl, r.overlap, r.eot) for _, _, r in b.sync.remote_requests()]
    assert tracked == ([values] if ok else [])
    assert b.router.sequences.num_requests(W7) == (1 if ok else 0)
    assert ("sync.apply_failed" in counts(b)) is not ok


@pytest.mark.parametrize(
    "op",
    [
        [1, "r1", "7", 0, b"", 4, 0, None],  # a first token's code with an add's fields
        [0.0, "r1", "7", 0, b"", 4, 0, None],  # an add's code, as a float
        [True, "r1"],  # a first token's code, as a bool
        [0, "r1"],  # an add without its fields
        [2, "r1", "x"],
        [],
        "r1",
    ],
)
def test_a_batch_op_needs_its_integer_code_and_exactly_its_fields(op):
    b = Node("b")
    b.sync.handle(batch("a", 1, [[0, "r0", "7", 0, b"", 4, 0, None], op]))
    assert b.sync.tracked_remote() == {}  # nothing of a batch with a malformed op is applied
    assert counts(b) == {"sync.apply_failed": 1}


FREES = [[2, f"r{i}"] for i in range(MAX_BATCH_OPS + 1)]


def test_a_batch_op_the_router_refuses_is_counted_and_the_others_are_applied(monkeypatch):
    """No op that passes the wire's checks is refused by today's router (a signed hash was, until
    2026-11-27), so the router is made to refuse one: the batch goes on with the next op."""
    b = Node("b")
    add_request = b.router.add_request

    def refusing(key, *args, **kwargs):
        if key.endswith(":r1"):
            raise ValueError("refused")
        return add_request(key, *args, **kwargs)

    monkeypatch.setattr(b.router, "add_request", refusing)
    refused = [0, "r1", "7", 0, [1, 2], 8, 0, None]
    b.sync.handle(batch("a", 1, [refused, [0, "r2", "7", 0, [1, 2], 8, 0, None]]))
    assert {r for _, r, _ in b.sync.remote_requests()} == {"r1", "r2"}  # tracked as the sender has them
    assert b.router.sequences.num_requests(W7) == 1
    assert counts(b) == {"sync.apply_failed": 1, "sync.batch_ops": 2}


@pytest.mark.parametrize("ops, ok", [({}, False), ("", False), (FREES[:-1], True), (FREES, False)])
def test_a_batch_is_a_list_of_at_most_max_batch_ops(ops, ok):
    b = Node("b")
    b.sync.handle(batch("a", 1, ops))
    assert counts(b) == ({"sync.batch_ops": MAX_BATCH_OPS} if ok else {"sync.apply_failed": 1})


def test_the_digest_of_a_request_is_the_documented_blake2b_so_replicas_of_other_versions_agree():
    # the first 8 bytes, little endian, of BLAKE2b(id, NUL, "1" or "0"): fixed values, not recomputed
    assert id_hash("req-1", False) == 4601449748027970524
    assert id_hash("req-1", True) == 17513454227528330157
    assert id_hash("\ud800", False) == 13512747147462347599  # an id no UTF-8 encoder takes as is


def test_the_digest_counts_a_first_token_once_and_a_state_record_as_it_says():
    s = InFlight()
    s.put("a", Record(W7, (1,), 4, 0, None))
    assert not s.mark_prefilled("nobody")
    assert s.mark_prefilled("a") and not s.mark_prefilled("a")
    assert s.summary() == (1, id_hash("a", True))
    t = InFlight()
    t.put("a", Record(W7, (1,), 4, 0, None, prefilled=True))  # as a state carries it
    assert t.summary() == s.summary()
    t.pop("a")
    assert t.summary() == (0, 0)


def test_a_first_token_of_a_request_this_replica_never_published_is_sent_harmlessly():
    a = Node("a", batch_s=0.0)
    a.sync.publish_prefill_complete("unknown")
    a.sync.publish_freed("unknown")
    assert a.wire.ops() == ["prefill", "free"] and a.sync.own_summary() == (0, 0)


def test_after_a_state_with_first_tokens_the_heartbeats_agree():
    a, b = started("a", "b")
    for request_id in (a.route(), a.route()):
        a.router.mark_prefill_complete(request_id)
        a.sync.publish_prefill_complete(request_id)
    a.wire.take()  # b missed all of it
    asked_for_state(a, b)
    assert b.sync.tracked_remote() == {"a": 2}
    a.sync.tick(5.0)
    a.deliver(b, now=5.0)
    assert b.counters["sync.digest_mismatch"] == 0 and b.wire.sent == []


@pytest.mark.parametrize(
    "kwargs, ok",
    [
        ({"queue_size": 1}, True),
        ({"queue_size": 0}, False),
        ({"heartbeat_s": 0.0}, False),
        ({"heartbeat_s": 2.0, "lease_s": 2.0}, False),
        ({"heartbeat_s": 1.0, "lease_s": 2.0, "batch_s": 1.0}, False),
        ({"batch_s": 0.0}, True),
        ({"router_id": ""}, False),
    ],
)
def test_a_replica_sync_needs_a_router_id_a_queue_and_a_heartbeat_shorter_than_its_lease(kwargs, ok):
    args = {"router_id": "a", **kwargs}
    router_id = args.pop("router_id")
    if ok:
        ReplicaSync(None, make_router(), router_id, SUBJECT, **args)  # type: ignore[arg-type]
    else:
        with pytest.raises(ValueError):
            ReplicaSync(None, make_router(), router_id, SUBJECT, **args)  # type: ignore[arg-type]


def test_a_replica_publishes_under_the_incarnation_it_is_given_and_only_its_heartbeat_at_first():
    a = Node("a", boot=77)
    a.sync.tick(0.0)
    assert [(m["op"], m["boot"], m["seq"]) for m in a.wire.messages()] == [("hb", 77, 1)]


# --- who is who ------------------------------------------------------------------------------------


def test_our_own_messages_are_skipped_and_only_another_incarnation_under_our_id_is_a_clash():
    b = Node("b", boot=5)
    b.sync.handle(heartbeat("b", 1, boot=5))  # our own message, back from NATS
    b.sync.handle(add("b", None, "x"))  # a format-1 one: no incarnation to compare
    assert counts(b) == {} and b.sync._origins == {}
    b.sync.handle(heartbeat("b", 1, boot=6))
    assert counts(b) == {"sync.id_clash": 1} and b.sync._origins == {}


def test_a_restarted_replica_is_tracked_afresh_from_its_first_message():
    a, b = started("a", "b")
    a.route()
    a.deliver(b)
    again = Node("a", boot=2, batch_s=0.0)
    again.route(W8)  # its first message: seq 1 of a new incarnation
    again.deliver(b)
    assert [(r, rec.worker) for _, r, rec in b.sync.remote_requests()] == [("req-1", W8)]
    assert b.load()[W7] == (0, 0) and b.counters["sync.restarted"] == 1
    assert "sync.apply_failed" not in counts(b)


def test_bye_from_a_replica_never_heard_of_changes_nothing():
    b = Node("b")
    b.sync.handle(packed("ghost", "bye", 1))
    assert counts(b) == {} and b.sync.forget_replica("nobody") == 0


def test_forgetting_a_replica_frees_its_requests_and_says_how_many():
    a, b = started("a", "b")
    a.route()
    a.route(W8)
    a.deliver(b)
    assert b.sync.forget_replica("a") == 2
    assert b.router.is_idle() and b.sync.tracked_remote() == {}


def test_the_origins_bound_drops_newcomers_quietly_after_counting():
    b = Node("b")
    b.sync.handle(heartbeat("first"))
    replica_sync_max = replica_sync.MAX_ORIGINS
    for i in range(replica_sync_max):
        b.sync.handle(heartbeat(f"r{i}"))
    assert len(b.sync._origins) == replica_sync_max
    assert counts(b) == {"sync.origins_full": 1}  # one over: counted, nothing failed


# --- sequences and wants ------------------------------------------------------------------------------


def test_missed_messages_are_counted_by_number_and_a_repeated_one_counts_none():
    b = Node("b")
    b.sync.handle(heartbeat("a", 1))
    b.sync.handle(heartbeat("a", 4))  # 2 and 3 missed
    assert b.counters["sync.missed"] == 2 and b.counters["sync.gap"] == 1
    b.sync.handle(heartbeat("a", 4))  # the same again (a duplicate): a gap, nothing missed
    assert b.counters["sync.missed"] == 2 and b.counters["sync.gap"] == 2
    b.sync.handle(heartbeat("a", 5 + (1 << 21)))  # an implausible jump is counted at most 2**20
    assert b.counters["sync.missed"] == 2 + (1 << 20)


def test_a_replica_first_heard_at_the_start_of_its_state_needs_no_want():
    a, b = started("a", "b")
    for _ in range(3):
        a.route()
    a.wire.take()
    late = Node("late")
    a.sync._publish_state()  # an answer to someone else's want: late hears it first
    a.deliver(late, b)
    assert late.wire.sent == [] and late.sync.tracked_remote() == {"a": 3}
    assert counts(late) == {"sync.resync": 1}
    # b missed the adds: a gap, which the state heals with no want
    assert b.sync.tracked_remote() == {"a": 3} and b.wire.sent == [] and b.counters["sync.gap"] == 1


def test_a_state_part_other_than_the_first_is_a_gap_and_asks():
    a, b = started("a", "b")
    for _ in range(40):
        a.route(n_tokens=4 * 4000)  # several parts
    a.wire.take()
    a.sync._publish_state()
    a.deliver(b, lose={0})
    assert b.counters["sync.gap"] == 1 and b.wire.ops() == ["want"]


def test_an_unanswered_want_is_asked_again_two_heartbeats_later_exactly_once_each_time():
    b = Node("b", heartbeat_s=0.5)
    b.sync.handle(heartbeat("a", 7), now=10.0)  # first heard past its first message: b asks
    assert b.wire.ops() == ["want"] and b.wire.messages()[0]["from"] == "a"
    b.wire.take()
    b.sync._next_heartbeat = 100.0  # only wants on this wire
    ticks = ((10.99, False), (11.0, True), (11.1, False), (11.99, False), (12.0, True))
    for seq, (now, asked) in enumerate(ticks):
        b.sync.tick(now)
        assert [m["from"] for m in b.wire.messages()] == (["a"] if asked else []), now
        b.wire.take()
        b.sync.handle(heartbeat("a", 8 + seq), now=now)  # a is alive, but sends no state


def test_a_want_that_is_answered_stops_the_asking():
    a, b = started("a", "b")
    a.route()
    b.sync.handle(heartbeat("a", 50), now=0.0)  # a gap: b asks a
    b.wire.take()
    a.wire.take()
    a.sync._seq = 50
    a.sync._publish_state()
    a.deliver(b)
    b.sync._next_heartbeat = 100.0
    b.sync.tick(2 * HEARTBEAT_S + 1)
    assert b.wire.sent == [] and b.sync.tracked_remote() == {"a": 1}


def test_a_want_for_everybody_or_for_us_is_answered_with_our_state_a_want_for_another_is_not():
    a = Node("a", batch_s=0.0)
    a.route()
    a.wire.take()
    a.sync._next_heartbeat = 100.0
    a.sync.handle(packed("c", "want", 1, **{"from": "someone-else"}), now=0.0)
    a.sync.tick(1.0)
    assert a.wire.sent == [] and a.counters["sync.wanted"] == 0
    for seq, wanted in ((2, "*"), (3, "a")):
        a.sync.handle(packed("c", "want", seq, **{"from": wanted}), now=1.0)
        a.sync.tick(1.0 + seq)
        assert a.wire.ops() == ["state"], wanted
        a.wire.take()
    assert a.counters["sync.wanted"] == 2 and a.counters["sync.state_sent"] == 2


def test_states_answering_wants_go_out_at_most_every_half_heartbeat():
    a = Node("a", heartbeat_s=0.3)  # half a heartbeat (0.15 s) is below the 0.25 s bound
    a.sync._next_heartbeat = 100.0
    a.sync._publish_state()  # at 0.0
    a.wire.take()
    a.sync.handle(packed("c", "want", 1, **{"from": "*"}), now=0.0)
    assert a.sync._next_tick(0.1) == (pytest.approx(0.05), 0.0)
    a.sync.tick(0.149)
    assert a.wire.sent == []
    a.sync.tick(0.15)
    assert a.wire.ops() == ["state"]


def test_the_next_tick_follows_the_heartbeat_period_not_a_fixed_quarter_second():
    a = Node("a", heartbeat_s=0.3)
    a.sync._dump_wanted = True
    a.sync._last_dump = 10.0
    assert a.sync._next_tick(10.1) == (pytest.approx(0.05), 0.0)
    a.sync._dump_wanted = False
    a.sync.connection_changed(False, "test")
    assert a.sync._next_tick(10.1) == (pytest.approx(0.075), 0.0)


def test_a_digest_mismatch_asks_once_and_again_only_when_no_state_came():
    a, b = started("a", "b")
    a.route()
    a.deliver(b)
    b.sync._origins["a"].in_flight.pop("req-1")  # b lost track without a gap
    b.router.free("a:req-1")
    b.sync._next_heartbeat = 100.0
    for t in (1.0, 1.5):
        a.sync.tick(t)
        a.deliver(b, now=t)
    assert b.counters["sync.digest_mismatch"] == 1 and b.wire.ops() == ["want"]
    b.wire.take()
    b.sync.tick(1.0 + 2 * HEARTBEAT_S)
    assert b.wire.ops() == ["want"]


def test_after_a_reconnect_every_replica_is_asked_again_until_it_answers():
    _, b = started("a", "b")
    b.sync.connection_changed(False, "lost")
    b.now = 1.0
    b.sync.connection_changed(True, "back")
    b.wire.take()
    b.sync._next_heartbeat = 100.0
    b.sync.tick(1.0 + 2 * HEARTBEAT_S)  # a never answered
    assert [m["from"] for m in b.wire.messages()] == ["a"]


def test_a_quiet_replica_that_is_in_sync_is_not_asked():
    _, b = started("a", "b")
    b.sync._next_heartbeat = 100.0
    b.sync.tick(4.0)
    assert b.wire.sent == [] and "a" in b.sync._origins


# --- leases -----------------------------------------------------------------------------------------


def test_a_lease_runs_out_only_after_its_length():
    a, b = started("a", "b")
    a.route()
    a.sync.tick(0.0)
    a.deliver(b, now=0.0)
    b.sync.tick(LEASE_S)
    assert b.sync.tracked_remote() == {"a": 1}
    b.sync.tick(LEASE_S + 0.001)
    assert b.sync.tracked_remote() == {}


def test_a_heartbeat_sets_its_senders_lease_within_bounds_and_ignores_one_that_is_no_number():
    b = Node("b")
    cases = {"short": 2.0, "tiny": 0.001, "huge": 1e9, "nan": float("nan"), "bool": True, "text": "2"}
    for origin, lease in cases.items():
        b.sync.handle(heartbeat(origin, lease_s=lease), now=0.0)
    leases = {origin: b.sync._origins[origin].lease_s for origin in cases}
    assert leases == {"short": 2.0, "tiny": MIN_LEASE_S, "huge": MAX_LEASE_S, "nan": LEASE_S,
                      "bool": LEASE_S, "text": LEASE_S}  # fmt: skip
    assert counts(b) == {}


def test_a_replica_announcing_a_short_lease_expires_after_it():
    a = Node("a", heartbeat_s=0.5, lease_s=2.0)
    b = Node("b")
    a.route()
    a.sync.tick(0.0)
    a.deliver(b, now=0.0)
    b.sync.tick(2.1)
    assert b.sync.tracked_remote() == {} and b.counters["sync.lease_expired"] == 1


def test_leases_of_newer_replicas_run_out_behind_a_version_1_replica():
    b = Node("b")
    b.sync.handle(add("old", None, "x"), now=0.0)  # format 1: no lease
    b.sync.handle(add("a", 1, "y"), now=0.0)
    b.sync.tick(LEASE_S + 1)
    assert b.sync.tracked_remote() == {"old": 1}


def test_handle_without_a_time_reads_the_clock():
    b = Node("b")
    b.now = 100.0
    b.sync.handle(add("a", 1, "y"))
    b.sync.tick(100.0 + LEASE_S)
    assert b.sync.tracked_remote() == {"a": 1}
    b.sync.tick(100.1 + LEASE_S)
    assert b.sync.tracked_remote() == {}


# --- bounds ------------------------------------------------------------------------------------------


def test_an_origin_holds_at_most_its_bound_of_requests_and_a_known_id_may_still_be_added_again(monkeypatch):
    monkeypatch.setattr(replica_sync, "MAX_REQUESTS_PER_ORIGIN", 3)
    b = Node("b")
    for i in range(4):
        b.sync.handle(add("a", i + 1, f"r{i}"), now=0.0)
    assert {r for _, r, _ in b.sync.remote_requests()} == {"r0", "r1", "r2"}
    b.sync.handle(add("a", 5, "r2", worker="8"), now=0.0)  # again, elsewhere: replaces
    assert b.router.sequences.num_requests(W8) == 1 and b.router.sequences.num_requests(W7) == 2
    assert counts(b) == {"sync.requests_full": 1}


def test_a_state_holds_at_most_the_bound_of_requests(monkeypatch):
    monkeypatch.setattr(replica_sync, "MAX_REQUESTS_PER_ORIGIN", 3)
    b = Node("b")

    def state(seq: int, n: int) -> bytes:
        reqs = [[f"r{i}", "7", 0, [i], 4, 0, None, False] for i in range(n)]
        return packed("a", "state", seq, part=0, parts=1, reqs=reqs)

    b.sync.handle(state(1, 3), now=0.0)
    assert b.sync.tracked_remote() == {"a": 3}
    b.sync.handle(state(2, 4), now=0.0)
    assert b.sync.tracked_remote() == {"a": 3} and counts(b) == {"sync.resync": 1, "sync.requests_full": 1}


@pytest.mark.parametrize("reqs", [{}, "", None])
def test_a_state_whose_requests_are_no_list_changes_nothing(reqs):
    a, b = started("a", "b")
    a.route()
    a.deliver(b)
    b.sync.handle(packed("a", "state", 3, part=0, parts=1, reqs=reqs))
    assert b.sync.tracked_remote() == {"a": 1}


def test_a_state_of_max_parts_is_accepted_and_a_part_that_does_not_follow_is_dropped():
    b = Node("b")
    b.sync.handle(packed("a", "state", 1, part=0, parts=MAX_STATE_PARTS, reqs=[]), now=0.0)
    assert b.sync._origins["a"].parts == [] and counts(b) == {}
    b.sync.handle(packed("a", "state", 2, part=1, parts=MAX_STATE_PARTS + 1, reqs=[]), now=0.0)
    assert b.sync._origins["a"].parts == [] and counts(b) == {"sync.apply_failed": 1}  # too many
    b.sync.handle(packed("a", "state", 3, part=1, parts=2, reqs=[]), now=0.0)
    assert b.sync._origins["a"].parts is None  # another total: another state
    b.sync.handle(packed("a", "state", 4, part=1, parts=MAX_STATE_PARTS, reqs=[]), now=0.0)
    assert b.sync._origins["a"].parts is None and counts(b) == {"sync.apply_failed": 1}  # no start: dropped


def test_a_state_part_delivered_twice_drops_that_state_quietly_and_asks_again():
    a, b = started("a", "b")
    for _ in range(40):
        a.route(n_tokens=4 * 4000)  # several parts
    a.wire.take()  # b missed every add
    a.sync._publish_state()
    assert a.wire.ops().count("state") >= 3
    a.deliver(b, twice={1})
    assert b.sync.tracked_remote() == {} and b.wire.ops() == ["want"]
    assert "sync.apply_failed" not in counts(b)


def test_a_state_part_announcing_a_different_total_is_a_different_state():
    b = Node("b")
    item = ["r1", "7", 0, [1], 4, 0, None, False]
    b.sync.handle(packed("a", "state", 1, part=0, parts=2, reqs=[item]), now=0.0)
    b.sync.handle(packed("a", "state", 2, part=1, parts=3, reqs=[]), now=0.0)
    b.sync.handle(packed("a", "state", 3, part=2, parts=3, reqs=[]), now=0.0)
    assert b.sync.tracked_remote() == {} and counts(b) == {}


# --- what a state changes --------------------------------------------------------------------------


def resynced(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if "resynchronised" in r.getMessage()]


def test_an_asked_for_state_that_changes_nothing_is_counted_and_logged_quietly(caplog):
    a, b = started("a", "b")
    a.route()
    a.deliver(b)
    before = b.load()
    b.sync.handle(heartbeat("a", 99), now=0.0)  # a gap: b asks
    a.sync._seq = 99
    with caplog.at_level(logging.INFO, "extproc.events.replica_sync"):
        a.sync._publish_state()
        a.deliver(b)
    assert b.load() == before and b.counters["sync.resync"] == 1
    assert resynced(caplog) == [(logging.INFO, "replica sync: resynchronised a: 1 requests in flight "
                                               "(0 added, 0 forgotten)")]  # fmt: skip


def test_an_unasked_state_is_applied_only_where_it_differs(caplog):
    a, b = started("a", "b")
    a.route()
    a.deliver(b)
    with caplog.at_level(logging.INFO, "extproc.events.replica_sync"):
        a.sync._publish_state()  # someone else asked: b gets it too, and it agrees
        a.deliver(b)
        assert resynced(caplog) == [] and b.counters["sync.resync"] == 0
        a.sync._own.put("req-9", Record(W8, (5,), 4, 0, None))  # b missed this add
        a.sync._publish_state()
        a.deliver(b)
    assert b.sync.tracked_remote() == {"a": 2} and b.router.sequences.num_requests(W8) == 1
    assert resynced(caplog) == [(logging.WARNING, "replica sync: resynchronised a: 2 requests in flight "
                                                  "(1 added, 0 forgotten)")]  # fmt: skip


def asked_for_state(a: Node, b: Node) -> None:
    """b notices a gap in a's messages, asks, and a's state answers."""
    a.wire.take()
    a.sync._seq += 1  # a message b missed
    a.sync._publish_heartbeat()
    a.deliver(b)
    assert b.wire.ops() == ["want"]
    b.deliver(a)
    a.sync.tick(a.sync._last_dump + 1.0)
    a.deliver(b)


def test_a_state_moves_a_request_to_the_worker_it_names_and_marks_its_first_token():
    a, b = started("a", "b")
    moved, prefilled = a.route(W7), a.route(W7)
    a.deliver(b)
    assert b.load()[W7][0] == 18 and b.load()[W8] == (0, 0)
    record = a.sync._own.requests[moved]
    a.sync._own.put(moved, Record(W8, record.hashes, record.isl, 0, 8))  # b missed it
    a.sync._own.mark_prefilled(prefilled)  # and this first token
    asked_for_state(a, b)
    seqs = b.router.sequences
    assert seqs.num_requests(W7) == 1 and seqs.num_requests(W8) == 1
    assert b.load()[W7][0] == 0 and b.load()[W8][0] == 9  # the prefilled one counts no prompt
    assert counts(b)["sync.resync"] == 1


def test_a_state_forgets_a_request_whose_hashes_changed_and_tracks_the_new_one():
    a, b = started("a", "b")
    request_id = a.route(W7)
    a.deliver(b)
    record = a.sync._own.requests[request_id]
    a.sync._own.put(request_id, Record(W7, (*record.hashes, 123), record.isl + 4, 0, 8))
    asked_for_state(a, b)
    assert b.load()[W7][0] == record.isl + 4 and b.router.sequences.num_requests(W7) == 1


# --- publishing ------------------------------------------------------------------------------------


def test_a_message_that_cannot_be_encoded_is_counted_and_its_number_skipped_so_receivers_heal():
    a, b = started("a", "b")
    a.sync.batch_s = 0.0
    a.sync.publish_added("\ud800", W7, [1, 2], 8, 0, None)  # a lone surrogate: msgpack refuses it
    assert a.wire.sent == [] and a.counters["sync.publish_failed"] == 1
    a.route()
    a.deliver(b)
    assert b.counters["sync.gap"] == 1 and b.wire.ops() == ["want"]


def test_a_heartbeat_carries_the_senders_lease():
    a = Node("a", heartbeat_s=0.5, lease_s=2.5)
    a.sync.tick(0.0)
    assert [(m["op"], m["lease_s"], m["batch"]) for m in a.wire.messages()] == [("hb", 2.5, 1)]


def test_a_published_add_carries_what_the_router_needs():
    a = Node("a")
    a.sync.batch_s = 0.0
    a.sync.publish_added("r1", Worker(7, 2), [(1 << 64) - 1, 3], 9, 1, 8)
    message = a.wire.messages()[0]
    assert {k: message[k] for k in ("op", "id", "worker", "dp", "hashes", "isl", "overlap", "eot")} == {
        "op": "add", "id": "r1", "worker": 7, "dp": 2, "hashes": [(1 << 64) - 1, 3], "isl": 9,
        "overlap": 1, "eot": 8}  # fmt: skip


def batching_pair() -> tuple[Node, Node]:
    """a batches what it sends to b."""
    a, b = Node("a"), Node("b")
    a.hears(b)
    a.sync._next_heartbeat = 100.0
    assert a.sync.batching()
    a.wire.take()
    return a, b


def add_of_size(node: Node, request_id: str, size: int) -> None:
    """An add whose estimated size (48 + id + 8 per hash) is `size`."""
    hashes, rest = divmod(size - 48 - len(request_id), 8)
    assert rest == 0 and hashes >= 0
    node.sync.publish_added(request_id, W7, list(range(hashes)), 4 * hashes, 0, None)


def test_a_batch_leaves_once_its_estimated_size_reaches_batch_bytes():
    half = BATCH_BYTES // 2
    a, _ = batching_pair()
    add_of_size(a, "r" * 16, half)
    add_of_size(a, "s" * 24, half - 16)
    assert a.wire.sent == []
    a.sync.publish_freed("t" * 8)  # 16 bytes: exactly BATCH_BYTES
    assert a.wire.ops() == ["batch"]
    a.wire.take()
    add_of_size(a, "r" * 16, half)  # the next batch: its size counted from 0 again
    add_of_size(a, "s" * 24, half - 16)
    a.sync.publish_freed("t" * 7)  # 15 bytes: one short
    assert a.wire.sent == []
    a.sync.publish_freed("u")
    assert a.wire.ops() == ["batch"]


@pytest.mark.parametrize("op", ["free", "prefill"])
def test_a_first_token_or_a_free_counts_8_bytes_and_its_id(op):
    a, _ = batching_pair()
    publish = a.sync.publish_freed if op == "free" else a.sync.publish_prefill_complete
    add_of_size(a, "r" * 7, BATCH_BYTES - 25)
    publish("x" * 16)  # 24 bytes: one short
    assert a.wire.sent == []
    publish("y" * 16)
    assert a.wire.ops() == ["batch"]


def test_an_add_counts_48_bytes_its_id_and_8_per_hash():
    a, _ = batching_pair()
    add_of_size(a, "r" * 16, BATCH_BYTES - 56)
    add_of_size(a, "s" * 7, 55)  # 48 + 7: still one byte short
    assert a.wire.sent == []
    add_of_size(a, "", 48)
    assert a.wire.ops() == ["batch"]


def state_parts(node: Node) -> list[list[str]]:
    node.wire.take()
    node.sync._publish_state()
    return [[item[0] for item in m["reqs"]] for m in node.wire.messages() if m["op"] == "state"]


@pytest.mark.parametrize("id_length, per_part", [(9, 2), (10, 1)])
def test_a_state_part_holds_what_fits_in_state_part_bytes_by_its_estimate(id_length, per_part):
    # 32 + id + 9 per hash: with 14,559 hashes an id of 9 characters makes 131,072 bytes, two of
    # which fill a part exactly; one more character and each part holds one
    a = Node("a")
    for i in range(4):
        a.sync.publish_added(f"{i}".rjust(id_length, "r"), W7, list(range(14_559)), 4, 0, None)
    assert STATE_PART_BYTES == 2 * (32 + 9 + 9 * 14_559)
    parts = state_parts(a)
    assert [len(p) for p in parts] == [per_part] * (4 // per_part)


def test_a_request_larger_than_a_part_is_a_part_of_its_own():
    a = Node("a")
    a.sync.publish_added("big", W7, list(range(STATE_PART_BYTES // 9 + 1)), 4, 0, None)
    a.sync.publish_added("small", W7, [1], 4, 0, None)
    assert state_parts(a) == [["big"], ["small"]]


# --- overflow and catch-up ---------------------------------------------------------------------------


def test_after_an_overflow_the_queued_messages_are_applied_before_every_replica_is_asked():
    b = Node("b")
    b.sync.handle(add("old", None, "x"), now=0.0)  # a version-1 replica: no state to ask
    b.sync.handle(add("a", 1, "y"), now=0.0)

    async def deliver(payload: bytes) -> None:
        await b.sync._on_message(Msg(None, SUBJECT, data=payload))  # type: ignore[arg-type]

    asyncio.run(deliver(add("a", 2, "u")))
    b.sync._sub = SimpleNamespace(pending_msgs=2)  # nats.py's count of messages queued at the drop
    b.wire.take()
    b.sync.overflowed()
    assert b.counters.drops[("sync", "*", "queue-full")] == 1 and b.wire.sent == []
    asyncio.run(deliver(add("a", 3, "z")))
    assert b.wire.sent == []
    asyncio.run(deliver(add("a", 4, "w")))  # the last one queued before the drop
    assert b.wire.ops() == ["state", "want"] and b.wire.messages()[1]["from"] == "*"
    assert b.sync.tracked_remote() == {"a": 4}  # the version-1 replica's requests are forgotten
    assert counts(b) == {"sync.queue_full": 1, "sync.dropped": 1, "sync.resync": 1, "sync.state_sent": 1,
                         "sync.want": 1}  # fmt: skip
    asyncio.run(deliver(add("a", 5, "v")))  # once
    assert b.wire.ops() == ["state", "want"]


def test_a_catch_up_that_fails_is_counted_and_the_decision_goes_on(monkeypatch):
    async def broken(nc: Any, pending: Any) -> int:
        raise OSError("the socket is gone")

    monkeypatch.setattr(replica_sync, "catch_up", broken)
    b = Node("b")
    b.sync.nc = SimpleNamespace()  # type: ignore[assignment]
    b.sync._sub = SimpleNamespace(pending_msgs=1)
    asyncio.run(b.sync.catch_up())
    assert counts(b) == {"sync.catch_up_error": 1}


def test_a_catch_up_counts_the_loop_turns_it_took(monkeypatch):
    async def three_turns(nc: Any, pending: Any) -> int:
        return 3

    monkeypatch.setattr(replica_sync, "catch_up", three_turns)
    b = Node("b")
    b.sync.nc = SimpleNamespace()  # type: ignore[assignment]
    b.sync._sub = SimpleNamespace(pending_msgs=1)
    asyncio.run(b.sync.catch_up())
    assert counts(b) == {"sync.catch_up": 1, "sync.catch_up_turns": 3}


def test_the_queue_size_bounds_what_waits_to_be_sent_too():
    sync = ReplicaSync(None, make_router(), "a", SUBJECT, queue_size=3)  # type: ignore[arg-type]
    assert sync._sender._queue.maxsize == 3


def test_a_catch_up_before_start_does_nothing():
    b = Node("b")
    b.sync.nc = SimpleNamespace()  # type: ignore[assignment]
    asyncio.run(b.sync.catch_up())
    assert counts(b) == {}


def test_the_tick_loop_waits_a_heartbeat_between_ticks_on_serves_own_loop():
    """On serve's own loop, where sleeps are lazy (`wakeups`), the tick loop still sleeps about a
    heartbeat between ticks: a few ticks in 0.3 s at 50 ms, never a spin."""
    node = Node("a", heartbeat_s=0.05, lease_s=1.0)
    ticks: list[float] = []
    tick = node.sync.tick

    def counted(now: float) -> None:
        ticks.append(now)
        tick(now)

    node.sync.tick = counted  # type: ignore[method-assign]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = loop.create_task(node.sync._run())
        try:
            await until(lambda: len(ticks) >= 3, 5.0, "three ticks")
            seen, started = len(ticks), loop.time()
            await until(lambda: loop.time() - started >= 0.3, 5.0, "0.3 s")
            assert len(ticks) - seen <= 0.3 / 0.05 + 5
        finally:
            await cancel_and_wait(task)

    wakeups.run(main())


async def test_stop_says_bye_and_stops_its_queue_when_nats_cannot_flush():
    """The connection is gone as the picker stops: the flush fails, stop still ends the queue."""
    node = Node("a")

    class Gone:
        def __init__(self) -> None:
            self.sent: list[bytes] = []
            self.stopped = False

        def submit(self, subject: str, payload: bytes) -> None:
            self.sent.append(payload)

        async def flush(self, timeout_s: float) -> None:
            raise ConnectionError("nats: connection closed")

        async def stop(self) -> None:
            self.stopped = True

    gone = Gone()
    node.sync._sender = gone  # type: ignore[assignment]
    await node.sync.stop()
    assert gone.stopped and [msgpack.unpackb(p)["op"] for p in gone.sent] == ["bye"]
