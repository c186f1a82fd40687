"""Replica sync shares the routes clients name: where Responses API answers are stored and where
sticky sessions are pinned, so that what names them reaches the same worker through any replica.

vLLM and SGLang keep a stored response in the memory of the server that made it: a follow-up sent to
any other worker is answered 404. A sticky session's requests belong on one worker (SGLang's
streaming sessions live there). Before, each replica knew only the answers and sessions that passed
through it, so behind several replicas most follow-ups went to a worker chosen on load.

Message by message (`sync_nodes`, no NATS), then two pickers over a real nats-server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest
import pytest_asyncio

from extproc.config import EventsConfig
from extproc.events.replica_wire import (
    MAX_ROUTE_TEXT,
    OP_HOME,
    OP_PIN,
    OP_UNPIN,
    V3,
    VERSION,
    SharedHome,
    SharedPin,
    SharedUnpin,
)
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker
from extproc.runtime.server import RunningPicker

from ..picker_fixtures import MODEL, picker_config
from .conftest import eventually
from .picker_pair import two_pickers
from .sync_nodes import W7, W8, Node, started

HOME = SharedHome(MODEL, W7, "127.0.0.7:8000", "local")


class Homes:
    """A RouteSink that records what it is told (ages too); `fill` keeps what it knows."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[str, Worker, str, str]] = {}
        self.pins: dict[str, tuple[str, Worker, str]] = {}
        self.ages: dict[str, float] = {}

    def remember_response_home(
        self, response_id: str, model: str, worker: Worker, endpoint: str, group: str, *,
        age_s: float = 0.0, fill: bool = False,
    ) -> bool:  # fmt: skip
        if fill and response_id in self.kept:
            return False
        self.kept[response_id] = (model, worker, endpoint, group)
        self.ages[response_id] = age_s
        return True

    def remember_session_pin(
        self,
        session_id: str,
        model: str,
        worker: Worker,
        group: str,
        *,
        age_s: float = 0.0,
        fill: bool = False,
    ) -> bool:
        if fill and session_id in self.pins:
            return False
        self.pins[session_id] = (model, worker, group)
        self.ages[session_id] = age_s
        return True

    def forget_session_pin(self, session_id: str, model: str) -> bool:
        return self.pins.pop(session_id, None) is not None

    def known_response_homes(self) -> Iterator[tuple[str, str, Worker, str, str, float]]:
        return iter([(rid, *home, self.ages.get(rid, 0.0)) for rid, home in self.kept.items()])

    def known_session_pins(self) -> Iterator[tuple[str, str, Worker, str, float]]:
        return iter([(sid, *pin, self.ages.get(sid, 0.0)) for sid, pin in self.pins.items()])


def pair(*, batch_s: float | None = None) -> tuple[Node, Node, Homes]:
    """Replicas a and b, both keeping homes, that heard each other's heartbeats; b's homes."""
    homes_a, homes_b = Homes(), Homes()
    options = {} if batch_s is None else {"batch_s": batch_s}
    a, b = Node("a", "7", "8", routes=homes_a, **options), Node("b", "7", "8", routes=homes_b, **options)
    a.hears(b)
    b.hears(a)
    a.wire.take()
    b.wire.take()
    return a, b, homes_b


def test_a_home_reaches_the_other_replica_in_a_batch_with_the_lifecycle_ops():
    a, b, homes = pair()
    request_id = a.route(W8)
    a.sync.publish_route("resp_1", HOME)
    a.sync.flush_batch()
    (message,) = a.wire.messages()
    assert message["v"] == V3 and [op[0] for op in message["ops"]] == [0, OP_HOME]
    a.deliver(b)
    assert homes.kept == {"resp_1": (MODEL, W7, "127.0.0.7:8000", "local")}
    assert {(origin, rid) for origin, rid, _ in b.sync.remote_requests()} == {("a", request_id)}
    assert b.counters["sync.routes"] == 1 and b.counters["sync.malformed"] == 0


def test_without_batches_a_home_is_a_message_of_its_own():
    a, b, homes = pair(batch_s=0.0)
    a.sync.publish_route("resp_1", HOME)
    (message,) = a.wire.messages()
    assert message["v"] == VERSION and message["op"] == "home"
    a.deliver(b)
    assert homes.kept == {"resp_1": (MODEL, W7, "127.0.0.7:8000", "local")}


@pytest.mark.parametrize("batch_s", [None, 0.0])
def test_a_pin_and_an_unpin_reach_the_other_replica(batch_s):
    a, b, routes = pair(batch_s=batch_s)
    a.sync.publish_route("s1", SharedPin(MODEL, W8, "local"))
    a.sync.flush_batch()
    a.deliver(b)
    assert routes.pins == {"s1": (MODEL, W8, "local")}
    a.sync.publish_route("s1", SharedUnpin(MODEL))
    a.sync.flush_batch()
    sent = a.wire.messages()
    assert [m["op"] for m in sent] == (["batch"] if batch_s is None else ["unpin"])
    a.deliver(b)
    assert routes.pins == {} and b.counters["sync.routes"] == 2


def test_a_batch_carries_each_route_as_its_op():
    a, b, routes = pair()
    a.sync.publish_route("resp_1", HOME)
    a.sync.publish_route("s1", SharedPin(MODEL, W8, "g"))
    a.sync.publish_route("s2", SharedUnpin(MODEL))
    a.sync.flush_batch()
    (message,) = a.wire.messages()
    assert message["ops"] == [
        [OP_HOME, "resp_1", MODEL, "7", 0, "127.0.0.7:8000", "local"],
        [OP_PIN, "s1", MODEL, "8", 0, "g"],
        [OP_UNPIN, "s2", MODEL],
    ]
    a.deliver(b)
    assert routes.kept and routes.pins == {"s1": (MODEL, W8, "g")}


def test_no_home_goes_out_while_a_replica_that_keeps_none_is_known():
    homes_a = Homes()
    a, old = Node("a", "7", routes=homes_a), Node("old", "7")  # old: no sink, so its heartbeat says no homes
    a.hears(old)
    a.wire.take()
    a.route(W7)
    a.sync.publish_route("resp_1", HOME)
    a.sync.flush_batch()
    assert all(op[0] != OP_HOME for m in a.wire.messages() for op in m.get("ops", []))
    assert "home" not in a.wire.ops()
    assert a.counters["sync.routes_unshared"] == 1
    a.deliver(old)
    assert old.counters["sync.malformed"] == 0  # the batch it got holds lifecycle ops only


def test_no_home_goes_out_before_any_replica_is_heard():
    a = Node("a", "7", routes=Homes())
    a.sync.publish_route("resp_1", HOME)
    assert a.wire.sent == [] and a.counters["sync.routes_unshared"] == 1


def test_routes_gathered_before_a_replica_that_keeps_none_appeared_are_not_sent():
    a, _, _ = pair()
    a.sync.publish_route("resp_1", HOME)
    request_id = a.route(W7)
    a.sync.publish_route("s1", SharedPin(MODEL, W7, "g"))
    old = Node("old", "7")
    a.hears(old)  # before the batch leaves
    a.sync.flush_batch()
    (message,) = [m for m in a.wire.messages() if m["op"] == "batch"]
    assert [op[:2] for op in message["ops"]] == [[0, request_id]]  # the request's add still goes
    assert a.counters["sync.routes_unshared"] == 2


class FailingRoutes(Homes):
    def remember_response_home(self, *args: object) -> bool:
        raise RuntimeError("the sink broke")


def test_a_route_that_cannot_be_kept_costs_that_op_only():
    a, b, _ = pair()
    b.sync.routes = FailingRoutes()
    a.sync.publish_route("resp_1", HOME)
    request_id = a.route(W8)
    a.sync.flush_batch()
    a.deliver(b)
    assert b.counters["sync.apply_failed"] == 1  # the home; the add after it is applied
    assert {rid for _, rid, _ in b.sync.remote_requests()} == {request_id}


def test_heartbeats_say_whether_the_replica_keeps_homes():
    keeper, plain = Node("k", "7", routes=Homes()), Node("p", "7")
    keeper.sync.tick(0.0)
    plain.sync.tick(0.0)
    (hb_keeper,) = [m for m in keeper.wire.messages() if m["op"] == "hb"]
    (hb_plain,) = [m for m in plain.wire.messages() if m["op"] == "hb"]
    assert hb_keeper["routes"] == 1 and "routes" not in hb_plain


@pytest.mark.parametrize(
    "fields",
    [
        ["", MODEL, "7", 0, "127.0.0.7:8000", "local"],  # no response id
        ["r" * (MAX_ROUTE_TEXT + 1), MODEL, "7", 0, "127.0.0.7:8000", "local"],  # over the bound
        ["resp_1", MODEL, "7", 0, "e" * (MAX_ROUTE_TEXT + 1), "local"],
        ["resp_1", 5, "7", 0, "127.0.0.7:8000", "local"],  # a model that is not a string
        ["resp_1", MODEL, "7", "0", "127.0.0.7:8000", "local"],  # a dp rank that is not an integer
        ["resp_1", MODEL, 1.5, 0, "127.0.0.7:8000", "local"],  # a worker id neither string nor integer
    ],
)
def test_a_malformed_home_is_dropped_and_counted(fields):
    a, b, homes = pair(batch_s=0.0)
    keys = ("id", "model", "worker", "dp", "endpoint", "group")
    a.sync._publish(VERSION, {"op": "home", **dict(zip(keys, fields, strict=True))})
    a.deliver(b)
    assert homes.kept == {} and b.counters["sync.apply_failed"] == 1
    a.sync._publish(V3, {"op": "batch", "ops": [[OP_HOME, *fields]]})
    a.deliver(b)
    assert homes.kept == {} and b.counters["sync.malformed"] + b.counters["sync.apply_failed"] == 2


def test_routes_take_integer_worker_ids_and_texts_up_to_the_bound():
    """Dynamo's workers have integer ids; every text may be exactly MAX_ROUTE_TEXT characters."""
    a, b, routes = pair()
    long_id, long_text = "r" * MAX_ROUTE_TEXT, "t" * MAX_ROUTE_TEXT
    a.sync.publish_route(long_id, SharedHome(long_text, Worker(7, 1), long_text, long_text))
    a.sync.publish_route("s1", SharedPin(MODEL, Worker(8), "g"))
    a.sync.flush_batch()
    a.deliver(b)
    assert routes.kept == {long_id: (long_text, Worker(7, 1), long_text, long_text)}
    assert routes.pins == {"s1": (MODEL, Worker(8), "g")} and b.counters["sync.apply_failed"] == 0


@pytest.mark.parametrize(
    "op",
    [
        [OP_PIN, "", MODEL, "8", 0, "g"],  # no session id
        [OP_PIN, "s" * (MAX_ROUTE_TEXT + 1), MODEL, "8", 0, "g"],
        [OP_PIN, "s1", MODEL, "8", 0, "g" * (MAX_ROUTE_TEXT + 1)],
        [OP_PIN, "s1", MODEL, None, 0, "g"],
        [OP_PIN, "s1", MODEL, "8", 0],  # a field short
        [OP_UNPIN, "s1"],
        [OP_UNPIN, "s1", None],
        [OP_UNPIN, "s1", MODEL, "extra"],
    ],
)
def test_a_malformed_pin_or_unpin_is_dropped_and_counted(op):
    a, b, routes = pair()
    a.sync._publish(V3, {"op": "batch", "ops": [op]})
    a.deliver(b)
    assert routes.pins == {} and b.counters["sync.apply_failed"] == 1  # the whole batch: none applied
    single = {"op": "pin" if op[0] == OP_PIN else "unpin", "id": op[1]}
    a.sync._publish(VERSION, single)  # fields missing: a KeyError, counted as any failed message
    a.deliver(b)
    assert routes.pins == {} and b.counters["sync.apply_failed"] == 2


def test_a_replica_that_keeps_no_homes_ignores_one_sent_anyway():
    a, b = started("a", "b")
    a.sync.routes = Homes()
    for entry in a.sync._origins.values():
        entry.routes = True  # as if b had said so
    a.sync.publish_route("resp_1", HOME)
    a.sync.flush_batch()
    a.deliver(b)
    assert b.counters["sync.routes"] == 0 and b.counters["sync.malformed"] == 0


# --- two pickers over a real nats-server ---------------------------------------------------------


def config(nats_url: str, router_id: str):
    base = picker_config(4)
    return replace(
        base,
        port=0,
        health_port=0,
        events=EventsConfig(nats_url=nats_url, namespace="test", replica_sync=True, router_id=router_id),
    )


def responses_body(text: str, **fields) -> bytes:
    return json.dumps({"model": MODEL, "input": text, **fields}).encode()


async def pick(picker: EndpointPicker, request_id: str, body: bytes, session: str | None = None):
    headers = {"x-session-id": session} if session else {}
    return await picker.pick(
        body=body, path="/v1/responses", headers=headers, subset=None, client_request_id=request_id
    )


def pinned(picker: EndpointPicker, session_id: str) -> bool:
    return picker._sessions[MODEL].get_pin(session_id, picker._clock()) is not None


def counter(picker: RunningPicker, key: str) -> int:
    assert picker.sources.replica_sync is not None
    return picker.sources.replica_sync.counters[key]


@pytest_asyncio.fixture
async def running(nats_server) -> AsyncIterator[tuple[RunningPicker, RunningPicker]]:
    configs = [config(nats_server.url, name) for name in ("a", "b")]
    async with two_pickers(
        configs, lambda a, i: pick(a, f"probe-{i}", responses_body(f"probe {i} " * 20))
    ) as (a, b):
        syncs = [a.sources.replica_sync, b.sources.replica_sync]
        # routes go out once each has heard the other's heartbeat
        await eventually(lambda: all(s is not None and s.shares_routes() for s in syncs), 5.0, "heartbeats")
        # and each was handed the other's routes (none yet), so that what the tests route is told live
        # (an answer lost on a new subscription is asked again after a lease: 5 s)
        await eventually(
            lambda: not any(s is not None and s.awaiting_routes() for s in syncs), 15.0, "handover"
        )
        yield a, b


@pytest.fixture
def pickers(running: tuple[RunningPicker, RunningPicker]) -> tuple[EndpointPicker, EndpointPicker]:
    return running[0].picker, running[1].picker


async def test_a_follow_up_through_the_other_replica_reaches_the_worker_storing_the_answer(pickers):
    a, b = pickers
    first = await pick(a, "r1", responses_body("the first turn of a conversation " * 20))
    a.response_stored(first, "resp_first")  # the answer's id, as the ext_proc stream reads it
    # a's request still decodes there: on load alone, b would send the follow-up to another worker
    await eventually(lambda: len(b.response_homes) == 1, 5.0, "b learns the home")
    follow_up = await pick(b, "r2", responses_body("and then?", previous_response_id="resp_first"))
    assert follow_up.worker == first.worker and follow_up.endpoint == first.endpoint
    b.finish(follow_up, "complete")
    a.finish(first, "complete")


async def test_a_follow_up_sent_the_instant_the_answer_was_read_waits_for_the_other_replicas_word(pickers):
    """No wait here for b to learn the home: the follow-up reaches b while a's word is still in its
    batch. b waits for it (`HomeWaits`, bounded) instead of routing on load to a worker's 404."""
    a, b = pickers
    first = await pick(a, "r1", responses_body("the first turn of a conversation " * 20))
    a.response_stored(first, "resp_first")
    follow_up = await pick(b, "r2", responses_body("and then?", previous_response_id="resp_first"))
    assert (follow_up.worker, follow_up.endpoint) == (first.worker, first.endpoint)
    assert (b.home_waits.arrived, b.home_waits.timed_out) == (1, 0)
    retrieval = await b.pick(
        body=None, path="/v1/responses/resp_first", headers={}, subset=None, client_request_id="r3"
    )
    assert retrieval.worker == first.worker and b.home_waits.arrived == 1  # known now: no wait
    b.finish(follow_up, "complete")
    a.finish(first, "complete")


async def test_a_session_pinned_through_one_replica_stays_on_its_worker_through_the_other(running):
    a, b = (r.picker for r in running)
    first = await pick(a, "r1", responses_body("a long session starts here " * 20), session="s1")
    a.answered(first, 200)  # pinned as the worker answers
    # a's request still decodes there: on load alone, b would send the session elsewhere
    await eventually(lambda: pinned(b, "s1"), 5.0, "b learns the pin")
    second = await pick(b, "r2", responses_body("short", stream=True), session="s1")
    assert second.worker == first.worker
    b.answered(second, 200)  # a use within a quarter of the TTL since the pin was told: not told again
    third = await pick(a, "r3", responses_body("shorter"), session="s1")
    a.answered(third, 200)
    assert counter(running[0], "sync.routes") == 0 and counter(running[1], "sync.routes") == 1
    for p, picker in ((first, a), (second, b), (third, a)):
        picker.finish(p, "complete")


async def test_a_session_closed_through_one_replica_is_unpinned_on_the_other(running):
    a, b = (r.picker for r in running)
    first = await pick(a, "r1", responses_body("a session " * 20), session="s1")
    a.answered(first, 200)
    await eventually(lambda: pinned(b, "s1"), 5.0, "b learns the pin")
    closing = {
        "model": MODEL,
        "input": "bye",
        "nvext": {"session_control": {"session_id": "s1", "action": "close"}},
    }
    close = await pick(b, "r2", json.dumps(closing).encode())
    await eventually(lambda: not pinned(a, "s1"), 5.0, "a forgets the pin")
    for p, picker in ((first, a), (close, b)):
        picker.finish(p, "complete")


async def test_a_pin_used_past_a_quarter_of_its_ttl_is_told_again(running):
    a = running[0].picker
    now = [1000.0]
    a._clock = lambda: now[0]  # a's pins age by this clock alone
    first = await pick(a, "r1", responses_body("a session " * 20), session="s1")
    a.answered(first, 200)
    await eventually(lambda: counter(running[1], "sync.routes") == 1, 5.0, "b hears the pin")
    now[0] += a.config.session_ttl_s / 4 + 1
    again = await pick(a, "r2", responses_body("later"), session="s1")
    a.answered(again, 200)
    await eventually(
        lambda: counter(running[1], "sync.routes") == 2, 5.0, "b hears it again: its TTL restarts"
    )
    for p in (first, again):
        a.finish(p, "complete")
