"""A replica that was not listening when routes were shared is handed them by another replica.

Before, a replica that started late (a rolling restart of the pickers, a scale-up) or came back from
a NATS outage knew only the routes learned after it came: a follow-up of an older stored answer sent
through it went to a worker chosen on load and met the engine's 404. Now it asks one replica that
keeps routes (`want_routes`) and fills in what it does not know (`extproc.events.route_catchup`).

Message by message (`sync_nodes`, no NATS), then two pickers over a real nats-server.
"""

from __future__ import annotations

import asyncio
import gc
import json
from dataclasses import replace

import msgpack
import pytest

from extproc.config import EventsConfig
from extproc.events import route_catchup
from extproc.events.replica_sync import ReplicaSync
from extproc.events.replica_wire import MAX_ROUTE_TEXT, OP_HOME, OP_PIN, OP_UNPIN, VERSION
from extproc.events.route_catchup import MAX_PENDING_ANSWERS, PART_BYTES, answer_message, answer_stream
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker
from extproc.runtime.server import start_picker

from ..conftest import grow
from ..picker_fixtures import MODEL, picker_config
from .conftest import connect, eventually, make_router, prime
from .sync_nodes import LEASE_S, SUBJECT, W7, W8, Node
from .test_replica_sync_routes import Homes

ENDPOINT = "127.0.0.7:8000"
ENDPOINT_16 = "127.0.0.17:80000"  # 16 characters


def keeper(name: str, routes: Homes | None = None) -> Node:
    """A replica that keeps routes, hands them over, and asks for them (its inbox: _INBOX.<name>)."""
    return Node(name, "7", "8", routes=routes if routes is not None else Homes(), inbox=True)


def full_keeper() -> tuple[Node, Homes]:
    routes = Homes()
    routes.remember_response_home("resp_1", MODEL, W7, ENDPOINT, "local", age_s=12.5)
    routes.remember_session_pin("s1", MODEL, W8, "local", age_s=3.0)
    return keeper("a", routes), routes


def wants(node: Node) -> list[dict]:
    return [m for m in node.wire.messages() if m["op"] == "want_routes"]


def answer(asked: Node, asker: Node, now: float = 0.1) -> list[bytes]:
    """Hand what `asker` sent to `asked`, let `asked` tick, return the answer's parts to `asker`."""
    asker.deliver(asked, now=now)
    for _ in range(10_000):  # one part per tick
        asked.sync.tick(now)
        if not asked.sync._answers:
            break
    replies, asked.wire.replies = asked.wire.replies, []
    assert {subject for subject, _ in replies} <= {f"_INBOX.{asker.name}"}
    return [payload for _, payload in replies]


def test_a_replica_that_started_late_is_handed_every_route_with_its_age():
    a, routes_a = full_keeper()
    routes_b = Homes()
    b, bystander = keeper("b", routes_b), keeper("c")
    b.hears(a)  # a's heartbeat says it keeps routes and hands them over: b asks it, once
    (want,) = wants(b)
    assert (want["from"], want["reply"]) == ("a", "_INBOX.b")
    b.deliver(a, bystander)
    bystander.sync.tick(0.1)
    assert bystander.wire.replies == []  # only the replica named answers
    for payload in answer(a, b):
        b.sync.handle_routes(payload, now=0.2)
    assert routes_b.kept == routes_a.kept and routes_b.pins == routes_a.pins
    assert routes_b.ages == {"resp_1": 12.5, "s1": 3.0}  # each lapses on time there too
    assert (a.counters["sync.routes_parts_sent"], b.counters["sync.routes_learned"]) == (1, 2)
    assert b.counters["sync.routes_want"] == 1
    b.wire.take()
    b.hears(a)
    assert wants(b) == []  # nothing missed any more


def test_ages_under_a_second_arrive_as_they_are_and_a_use_after_the_listing_counts_as_now():
    routes_a = Homes()
    routes_a.remember_response_home("resp_1", MODEL, W7, ENDPOINT, "local", age_s=0.123456)
    routes_a.remember_session_pin("s1", MODEL, W8, "local", age_s=-0.5)  # used since it was listed
    a, routes_b = keeper("a", routes_a), Homes()
    b = keeper("b", routes_b)
    b.hears(a)
    for payload in answer(a, b):
        b.sync.handle_routes(payload)
    assert routes_b.ages == {"resp_1": 0.123456, "s1": 0.0}


def test_parts_are_cut_at_their_estimated_size():
    """An item's estimate is 48 bytes plus its texts' lengths: here 100 each, so 3 to a 300-byte part."""
    routes = Homes()
    for i in range(7):  # 48 + 10 + 10 + 16 + 16 = 100
        routes.remember_response_home(f"resp_{i:05d}", "model-abcd", W7, ENDPOINT_16, "group-0123456789")
    parts = [msgpack.unpackb(p) for p in answer_stream(routes, "a", 1, part_bytes=300)]
    assert [len(p["routes"]) for p in parts] == [3, 3, 1] and [p["part"] for p in parts] == [0, 1, 2]
    pins = Homes()
    for i in range(4):  # 48 + 24 + 10 + 18 = 100
        pins.remember_session_pin(f"session-{i:016d}", "model-abcd", W8, "group-0123456789ab")
    assert [len(msgpack.unpackb(p)["routes"]) for p in answer_stream(pins, "a", 1, part_bytes=200)] == [2, 2]


def test_parts_stay_under_their_size_with_long_texts():
    routes = Homes()
    for i in range(400):
        routes.remember_response_home(f"{i:0200d}", "m" * 100, W7, "e" * 100, "g" * 100)
        routes.remember_session_pin(f"s{i:0199d}", "m" * 100, W8, "g" * 100)
    parts = list(answer_stream(routes, "a", 1))
    assert all(len(p) <= PART_BYTES for p in parts) and all(len(p) > PART_BYTES / 2 for p in parts[:-1])


def test_an_answer_stops_at_the_bound_on_parts_with_its_oldest_routes(monkeypatch):
    monkeypatch.setattr(route_catchup, "MAX_PARTS", 3)
    routes = Homes()
    for i in range(10):
        routes.remember_response_home(f"resp_{i:05d}", "model-abcd", W7, ENDPOINT_16, "group-0123456789")
    parts = [msgpack.unpackb(p) for p in answer_stream(routes, "a", 1, part_bytes=200)]
    assert [p["last"] for p in parts] == [False, False, True]
    assert [r[2] for p in parts for r in p["routes"]] == [f"resp_{i:05d}" for i in range(6)]


def test_a_part_beyond_the_bound_is_refused(monkeypatch):
    monkeypatch.setattr(route_catchup, "MAX_PARTS", 2)
    b = keeper("b")
    b.hears(keeper("a"))
    b.sync.handle_routes(answer_message("a", 1, 0, False, []))
    b.sync.handle_routes(answer_message("a", 1, 1, False, []))
    assert b.counters["sync.malformed"] == 0
    b.sync.handle_routes(answer_message("a", 1, 2, True, []))
    assert b.counters["sync.malformed"] == 1 and b.sync._routes_wanted.pending is None


def test_a_part_taken_on_the_replica_s_own_clock_restarts_the_silence():
    a, b = keeper("a"), keeper("b")
    a.sync.tick(0.0)
    a.deliver(b)  # its heartbeat: b asks at 0
    b.now = 3.0
    b.sync.handle_routes(answer_message("a", 1, 0, False, []))  # as its inbox does: no time given
    b.sync.tick(3.0 + LEASE_S)
    assert b.counters["sync.routes_want_timeout"] == 0
    b.sync.tick(3.0 + LEASE_S + 0.01)
    assert b.counters["sync.routes_want_timeout"] == 1


def test_each_part_restarts_the_silence_after_which_the_ask_is_dropped():
    a, b = keeper("a"), keeper("b")
    a.sync.tick(1.0)
    a.deliver(b, now=1.0)  # its heartbeat: b asks at 1.0
    b.sync.tick(1.0 + LEASE_S)  # exactly a lease since the ask: not yet
    assert b.counters["sync.routes_want_timeout"] == 0
    b.sync.handle_routes(answer_message("a", 1, 0, False, []), now=4.0)
    b.sync.tick(4.0 + LEASE_S)
    assert b.counters["sync.routes_want_timeout"] == 0
    b.sync.tick(4.0 + LEASE_S + 0.01)
    assert b.counters["sync.routes_want_timeout"] == 1


def test_an_answer_larger_than_a_part_comes_in_parts_in_order():
    routes_a = Homes()
    for i in range(6000):  # about 0.9 MB of routes
        routes_a.remember_response_home(f"resp_{i:076d}", MODEL, W7, ENDPOINT, "local", age_s=i / 10)
    a, routes_b = keeper("a", routes_a), Homes()
    b = keeper("b", routes_b)
    b.hears(a)
    parts = answer(a, b)
    assert len(parts) >= 3 and all(len(p) < 1 << 20 for p in parts)  # under NATS's max_payload
    for payload in parts:
        b.sync.handle_routes(payload)
    assert routes_b.kept == routes_a.kept and b.counters["sync.routes_learned"] == 6000


def test_the_answer_goes_one_part_per_tick_and_the_next_tick_comes_at_once():
    routes_a = Homes()
    for i in range(3000):
        routes_a.remember_response_home(f"resp_{i:076d}", MODEL, W7, ENDPOINT, "local")
    a, b = keeper("a", routes_a), keeper("b")
    b.hears(a)
    b.deliver(a)
    a.wire.take()
    for n in range(1, 4):  # one part per tick: the loop turns between them
        a.sync.tick(0.1)
        assert len(a.wire.replies) == n and a.sync._next_tick(0.1) == (0.0, 0.0)
    while a.sync._answers:
        a.sync.tick(0.1)
    parts = [msgpack.unpackb(payload) for _, payload in a.wire.replies]
    assert [p["part"] for p in parts] == list(range(len(parts))) and len(parts) > 4
    assert [p["last"] for p in parts] == [False] * (len(parts) - 1) + [True]
    assert sum(len(p["routes"]) for p in parts) == 3000 and a.sync._next_tick(0.1)[0] > 0


def test_a_part_lost_drops_the_ask_and_the_next_heartbeat_asks_again():
    routes_a = Homes()
    for i in range(6000):
        routes_a.remember_response_home(f"resp_{i:076d}", MODEL, W7, ENDPOINT, "local")
    a, routes_b = keeper("a", routes_a), Homes()
    b = keeper("b", routes_b)
    b.hears(a)
    first = answer(a, b)
    b.sync.handle_routes(first[0])
    b.sync.handle_routes(first[2])  # the second part was lost
    assert b.counters["sync.malformed"] == 1 and b.sync._routes_wanted.pending is None
    b.sync.handle_routes(first[1])  # late: an answer to an ask given up
    assert b.counters["sync.routes_late"] == 1
    b.wire.take()
    b.hears(a)
    (want,) = wants(b)
    assert want["ask"] == 2
    for payload in answer(a, b):
        b.sync.handle_routes(payload)
    assert routes_b.kept == routes_a.kept


def test_no_full_collection_stops_the_loop_while_an_answer_comes_and_its_routes_are_frozen_after(
    full_collections,
):
    """A new replica's tables grow by 200,000 routes from a full answer: Python's full collections
    of them cost up to 245 ms of its loop each (`benchmarks/bench_route_handover.py`)."""
    routes_a = Homes()
    for i in range(3000):
        routes_a.remember_response_home(f"resp_{i:076d}", MODEL, W7, ENDPOINT, "local")
    a, b = keeper("a", routes_a), keeper("b")
    b.hears(a)
    first, *rest = answer(a, b)
    b.sync.handle_routes(first)
    kept: list[object] = []
    grow(kept, 300_000)  # what the growing tables do to the heap (the same grows with full collections)
    assert full_collections[0] == 0
    frozen = gc.get_freeze_count()
    for payload in rest:
        b.sync.handle_routes(payload)
    assert b.counters["sync.routes_learned"] == 3000 and full_collections[0] == 0
    assert gc.get_freeze_count() >= frozen + 300_000 * 2 and gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("end", ["malformed part", "silence", "stop"])
def test_an_answer_cut_short_ends_its_hold_on_full_collections(full_collections, end):
    a, b = keeper("a"), keeper("b")
    b.hears(a)
    b.sync.handle_routes(answer_message("a", 1, 0, False, []))
    assert gc.get_threshold()[2] > 10**6
    if end == "malformed part":
        b.sync.handle_routes(answer_message("a", 1, 2, False, []))
    elif end == "silence":
        b.sync.tick(LEASE_S + 0.1)
    else:
        asyncio.run(b.sync.stop())
    assert b.sync._routes_wanted.pending is None and gc.get_threshold() == (700, 10, 10)


def test_a_replica_that_never_answers_is_given_up_and_another_one_asked():
    a, _ = full_keeper()
    c_routes = Homes()
    c_routes.remember_response_home("resp_c", MODEL, W8, ENDPOINT, "local")
    b, c = keeper("b"), keeper("c", c_routes)
    b.hears(a)  # asked a, which dies before it answers
    b.wire.take()
    b.hears(c)
    assert wants(b) == []  # one ask at a time
    b.sync.tick(LEASE_S - 0.1)
    assert b.counters["sync.routes_want_timeout"] == 0
    b.sync.tick(LEASE_S + 0.1)
    assert b.counters["sync.routes_want_timeout"] == 1
    b.wire.take()
    b.hears(c)
    assert [w["from"] for w in wants(b)] == ["c"]


def test_no_ask_goes_to_a_replica_of_the_version_before():
    a, b = Node("a", "7"), keeper("b")
    a.sync._publish(VERSION, {"op": "hb", "n": 0, "digest": 0, "lease_s": LEASE_S, "batch": 1, "routes": 1})
    a.deliver(b)
    assert wants(b) == []  # it keeps routes but would drop want_routes as an unknown op


def test_a_replica_that_keeps_no_routes_neither_asks_nor_answers():
    a, _ = full_keeper()
    plain = Node("p", "7", "8", inbox=True)
    plain.hears(a)
    assert wants(plain) == []
    b = keeper("b")
    b.hears(plain)  # its heartbeat says nothing of routes
    assert wants(b) == []
    b.sync._publish(VERSION, {"op": "want_routes", "from": "p", "reply": "_INBOX.b", "ask": 1})
    b.deliver(plain)
    plain.sync.tick(0.1)
    assert plain.wire.replies == [] and plain.counters["sync.apply_failed"] == 0


def test_a_replica_back_from_an_outage_asks_again():
    a, _ = full_keeper()
    b = keeper("b")
    b.hears(a)
    for payload in answer(a, b):
        b.sync.handle_routes(payload)
    b.sync.connection_changed(False, "test")
    b.sync.connection_changed(True, "test")
    b.wire.take()
    b.hears(a)
    assert [w["from"] for w in wants(b)] == ["a"]


def test_a_replica_that_dropped_messages_is_not_handed_every_route_on_top():
    a, _ = full_keeper()
    b = keeper("b")
    b.hears(a)
    for payload in answer(a, b):
        b.sync.handle_routes(payload)
    b.sync.overflowed()  # its queue was full: it asks for the states, not for the routes
    assert "want" in b.wire.ops()
    b.wire.take()
    b.hears(a)
    assert wants(b) == []


def test_a_replica_just_started_awaits_the_routes_until_answered_or_none_is_heard():
    a, _ = full_keeper()
    b = keeper("b")
    assert not b.sync.awaiting_routes()  # not started
    b.sync._started_at = b.now = 0.0
    assert b.sync.awaiting_routes()  # a replica that hands routes over may yet be heard
    b.hears(a)
    b.now = 10.0
    assert b.sync.awaiting_routes()  # asked, not answered
    for payload in answer(a, b):
        b.sync.handle_routes(payload)
    assert not b.sync.awaiting_routes()
    b.sync.connection_changed(False, "test")
    b.sync.connection_changed(True, "test")
    b.hears(a)  # asked again: but a NATS blip must not make every replica unready
    assert b.sync._routes_wanted.pending is not None and not b.sync.awaiting_routes()
    alone = Node("c", "7", routes=Homes(), inbox=True, heartbeat_s=0.5)
    alone.sync._started_at = 100.0
    alone.now = 100.99
    assert alone.sync.awaiting_routes()
    alone.now = 101.0  # two heartbeats and nobody to ask
    assert not alone.sync.awaiting_routes() and not Node("p", "7").sync.awaiting_routes()


@pytest.mark.parametrize("known", ["home", "pin"])
def test_routes_known_here_are_kept(known):
    a, _ = full_keeper()
    routes_b = Homes()
    if known == "pin":  # learned live while the answer was on its way
        routes_b.remember_session_pin("s1", MODEL, W7, "local")
    else:
        routes_b.remember_response_home("resp_1", MODEL, W8, "127.0.0.8:8000", "local")
    b = keeper("b", routes_b)
    b.hears(a)
    for payload in answer(a, b):
        b.sync.handle_routes(payload)
    assert routes_b.pins.get("s1") == (MODEL, W8 if known == "home" else W7, "local")
    assert routes_b.kept["resp_1"][1] == (W8 if known == "home" else W7)
    assert b.counters["sync.routes_learned"] == 1


def test_an_answer_takes_integer_worker_ids_and_texts_up_to_the_bound():
    b, routes_b = keeper("b"), Homes()
    b.sync.routes = routes_b
    b.hears(keeper("a"))
    long_id, long_text = "r" * MAX_ROUTE_TEXT, "t" * MAX_ROUTE_TEXT
    items = [[0, OP_HOME, long_id, long_text, 7, 1, long_text, long_text], [2, OP_PIN, "s1", MODEL, 8, 0, ""]]
    b.sync.handle_routes(answer_message("a", 1, 0, True, items))
    assert routes_b.kept == {long_id: (long_text, Worker(7, 1), long_text, long_text)}
    assert routes_b.pins == {"s1": (MODEL, Worker(8), "")} and routes_b.ages == {long_id: 0.0, "s1": 2.0}
    assert b.counters["sync.malformed"] == 0


@pytest.mark.parametrize(
    "item",
    [
        [-1.0, OP_HOME, "resp_x", MODEL, "7", 0, ENDPOINT, "local"],  # a negative age
        [float("inf"), OP_HOME, "resp_x", MODEL, "7", 0, ENDPOINT, "local"],
        [True, OP_HOME, "resp_x", MODEL, "7", 0, ENDPOINT, "local"],
        ["1", OP_HOME, "resp_x", MODEL, "7", 0, ENDPOINT, "local"],
        [1.0, OP_UNPIN, "s9", MODEL],  # an answer holds homes and pins only
        [1.0, float(OP_PIN), "s9", MODEL, "7", 0, "local"],
        [1.0, OP_HOME, "", MODEL, "7", 0, ENDPOINT, "local"],  # no id
        [1.0, OP_HOME, "r" * (MAX_ROUTE_TEXT + 1), MODEL, "7", 0, ENDPOINT, "local"],  # over the bound
        [1.0, OP_HOME, "resp_x", MODEL, "7", 0, "e" * (MAX_ROUTE_TEXT + 1), "local"],
        [1.0, OP_PIN, "s9", MODEL, "7", 0, "g" * (MAX_ROUTE_TEXT + 1)],
        [1.0, OP_HOME, "resp_x", 5, "7", 0, ENDPOINT, "local"],  # a model that is not a string
        [1.0, OP_HOME, "resp_x", MODEL, 1.5, 0, ENDPOINT, "local"],  # a worker id neither str nor int
        [1.0, OP_PIN, "s9", MODEL, "7", "0", "local"],  # a dp rank that is not an integer
        [1.0, OP_PIN, "s9", MODEL, "7", 0, "local", "extra"],  # a pin with an item too many
        [1.0, OP_HOME, "resp_x", MODEL, "7", 0, ENDPOINT, 7],  # a group that is not a string
        [1.0, OP_PIN, 9, MODEL, "7", 0, "local"],  # a session id that is not a string
        [1.0, OP_PIN, "s" * (MAX_ROUTE_TEXT + 1), MODEL, "7", 0, "local"],
        [1.0, OP_PIN, "s9", 5, "7", 0, "local"],  # a model that is not a string
        [1.0, OP_PIN, "s9", MODEL, "7", 0],  # a field short
        [1.0],
        "resp_x",
    ],
)
def test_a_malformed_route_in_an_answer_costs_that_route_only(item):
    b, routes_b = keeper("b"), Homes()
    b.sync.routes = routes_b
    b.hears(keeper("a"))
    good = [0.5, OP_PIN, "s1", MODEL, "8", 0, "local"]
    payload = answer_message("a", 1, 0, True, [item, good])
    b.sync.handle_routes(payload)
    assert routes_b.kept == {} and routes_b.pins == {"s1": (MODEL, W8, "local")}
    assert b.counters["sync.malformed"] == 1 and b.counters["sync.routes_learned"] == 1


def answer_of(**fields) -> bytes:
    return msgpack.packb({"v": VERSION, "router": "a", "op": "routes", "ask": 1, "part": 0, "last": True,
                          "routes": [], **fields})  # fmt: skip


@pytest.mark.parametrize(
    "message",
    [b"\xc1", msgpack.packb([1, 2]), answer_of(v=1), answer_of(op="state")],  # not msgpack, ...
)
def test_a_message_that_is_no_answer_is_dropped_and_the_answer_still_awaited(message):
    b = keeper("b")
    b.hears(keeper("a"))
    b.sync.handle_routes(message)
    assert b.counters["sync.malformed"] == 1 and b.sync._routes_wanted.pending is not None
    b.sync.handle_routes(answer_of())
    assert b.counters["sync.routes_learned"] == 0 and not b.sync._routes_wanted.missed  # done


@pytest.mark.parametrize(
    "fields",
    [{"part": 1}, {"part": -1}, {"part": 0.0}, {"last": 1}, {"last": None}, {"routes": {}}, {"routes": None}],
)
def test_a_malformed_answer_is_dropped_and_asked_again(fields):
    b = keeper("b")
    b.hears(keeper("a"))
    b.sync.handle_routes(answer_of(**fields))
    assert b.counters["sync.malformed"] == 1 and b.sync._routes_wanted.pending is None
    b.wire.take()
    b.hears(keeper("a"))
    assert [w["ask"] for w in wants(b)] == [2]


def test_an_answer_without_its_routes_is_dropped_and_asked_again():
    b = keeper("b")
    b.hears(keeper("a"))
    message = msgpack.unpackb(answer_of())
    del message["routes"]
    b.sync.handle_routes(msgpack.packb(message))
    assert b.counters["sync.malformed"] == 1 and b.sync._routes_wanted.pending is None


def test_an_answer_from_another_replica_or_to_another_ask_is_ignored():
    b = keeper("b")
    b.hears(keeper("a"))
    b.sync.handle_routes(answer_of(router="c"))
    b.sync.handle_routes(answer_of(ask=2))
    b.sync.handle_routes(answer_of(ask="1"))
    assert b.counters["sync.routes_late"] == 3 and b.sync._routes_wanted.pending is not None


@pytest.mark.parametrize(
    "reply", ["", "_INBOX.*", "_INBOX.>", "_INBOX b", ".x", "x.", "ab.", "a..b", "r" * 257, 7]
)
def test_a_want_with_a_reply_that_is_no_plain_subject_is_not_answered(reply):
    a = asked_to_reply_to(reply)
    assert a.wire.replies == [] and a.counters["sync.apply_failed"] == 1


@pytest.mark.parametrize("reply", ["x", "a.b", "r" * 256])
def test_a_want_with_a_plain_subject_is_answered_there(reply):
    a = asked_to_reply_to(reply)
    assert [subject for subject, _ in a.wire.replies] == [reply]


def asked_to_reply_to(reply: object) -> Node:
    """A replica keeping routes, asked by b for them with `reply` as the reply subject, one tick on."""
    a, _ = full_keeper()
    b = Node("b", "7")
    b.sync._publish(VERSION, {"op": "want_routes", "from": "a", "reply": reply, "ask": 1})
    b.deliver(a)
    a.sync.tick(0.1)
    return a


def test_at_most_so_many_replicas_wait_for_an_answer_at_once():
    a, _ = full_keeper()
    askers = [Node(f"n{i}", "7") for i in range(MAX_PENDING_ANSWERS + 1)]
    for i, asker in enumerate(askers):
        asker.sync._publish(VERSION, {"op": "want_routes", "from": "a", "reply": f"_INBOX.n{i}", "ask": 1})
        asker.deliver(a)
    assert a.counters["sync.routes_want_dropped"] == 1
    a.sync.tick(0.1)
    assert len({subject for subject, _ in a.wire.replies}) == MAX_PENDING_ANSWERS


# --- two pickers over a real nats-server ---------------------------------------------------------


def config(nats_url: str, router_id: str):
    return replace(
        picker_config(4),
        port=0,
        health_port=0,
        events=EventsConfig(nats_url=nats_url, namespace="test", replica_sync=True, router_id=router_id),
    )


async def pick(picker: EndpointPicker, request_id: str, text: str, session: str | None = None, **fields):
    body = json.dumps({"model": MODEL, "input": text, **fields}).encode()
    headers = {"x-session-id": session} if session else {}
    return await picker.pick(
        body=body, path="/v1/responses", headers=headers, subset=None, client_request_id=request_id
    )


async def test_a_picker_started_later_routes_what_names_an_older_answer_or_session(nats_server):
    a = await start_picker(config(nats_server.url, "a"))
    b = None
    try:
        homes, firsts = {}, []
        for i in range(6):  # answers and sessions spread over a's workers (by load) before b exists
            first = await pick(a.picker, f"r{i}", f"conversation {i} starts " * (10 + i), session=f"s{i}")
            a.picker.answered(first, 200)
            a.picker.response_stored(first, f"resp_{i}")
            homes[i] = first.worker
            firsts.append(first)
        for first in firsts:
            a.picker.finish(first, "complete")
        assert len(set(homes.values())) > 1
        b = await start_picker(config(nats_server.url, "b"))
        sync_b = b.sources.replica_sync
        assert sync_b is not None
        await eventually(lambda: sync_b.counters["sync.routes_learned"] == 12, 20.0, "b is handed a's routes")
        for i, worker in homes.items():
            follow_up = await pick(b.picker, f"f{i}", "and then?", previous_response_id=f"resp_{i}")
            turn = await pick(b.picker, f"t{i}", "next turn", session=f"s{i}")
            assert follow_up.worker == worker and turn.worker == worker
            b.picker.finish(follow_up, "complete")
            b.picker.finish(turn, "complete")
    finally:
        for running in (b, a):
            if running is not None:
                await running.stop(0)


async def test_a_replica_alone_on_nats_awaits_routes_from_its_start(nats_server):
    now = [0.0]
    link = await connect(nats_server, "alone")
    sync = ReplicaSync(link.nc, make_router(), "alone", SUBJECT, routes=Homes(), clock=lambda: now[0])
    try:
        assert not sync.awaiting_routes()  # not started
        await sync.start()
        assert sync.awaiting_routes()  # nobody heard yet: one may answer
        now[0] = 2 * sync.heartbeat_s
        assert not sync.awaiting_routes()  # nobody to ask
    finally:
        await sync.stop()
        await link.close()


async def test_a_stopped_replica_hears_nothing_more_on_its_subject_or_its_inbox(nats_server):
    link, other = await connect(nats_server, "a"), await connect(nats_server, "b")
    sync = ReplicaSync(link.nc, make_router(), "a", SUBJECT, routes=Homes())
    try:
        await sync.start()
        inbox = sync._inbox
        assert inbox is not None
        await sync.stop()
        before = sync.counters.snapshot()
        sentinel: asyncio.Queue[bytes] = asyncio.Queue()

        async def arrived(msg) -> None:
            await sentinel.put(msg.data)

        await link.nc.subscribe("test.sentinel", cb=arrived)
        await link.nc.flush()

        async def probe(n: int) -> None:
            await other.nc.publish("test.sentinel", b"probe %d" % n)
            await other.nc.flush()

        # A fresh subscription may miss the first messages (see `prime`): until one probe arrives,
        # a lost "after" would read as a timeout, not as the stopped replica's silence.
        await prime(probe, lambda: not sentinel.empty())
        heartbeat = {"v": VERSION, "router": "b", "boot": 1, "seq": 1, "op": "hb", "n": 0, "digest": 0}
        await other.nc.publish(SUBJECT, msgpack.packb(heartbeat))
        await other.nc.publish(inbox, answer_message("b", 1, 0, True, []))
        await other.nc.publish("test.sentinel", b"after")  # the same publisher: it comes after them
        await other.nc.flush()
        while (data := await asyncio.wait_for(sentinel.get(), 5.0)) != b"after":
            assert data.startswith(b"probe ")
        assert sync.counters.snapshot() == before
    finally:
        await other.close()
        await link.close()
