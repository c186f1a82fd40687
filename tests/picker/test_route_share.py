"""What the picker tells other replicas (its `route_share`, replica sync's sink) and what it takes from
them: a stored answer's home, a sticky session's pin (new, moved, and used again at most once a
quarter of the TTL) and its close, each with the worker, endpoint, group and model it names."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker
from extproc.router.types import Worker

from ..epp.test_service_responses import answer_of, body, respond
from ..picker_fixtures import MODEL, chat_body, picker_config
from ..replica_helpers import until
from ..router.clock import FakeClock
from .test_sessions import pick, session, turn


class Told:
    """A RouteShare that records what it is told, in order."""

    def __init__(self) -> None:
        self.said: list[tuple] = []
        self.sharing = False  # other replicas share routes (an unknown answer's id is waited for)

    def response_home(self, response_id: str, model: str, worker: Worker, endpoint: str, group: str) -> None:
        self.said.append(("home", response_id, model, worker, endpoint, group))

    def session_pinned(self, session_id: str, model: str, worker: Worker, group: str) -> None:
        self.said.append(("pin", session_id, model, worker, group))

    def session_closed(self, session_id: str, model: str) -> None:
        self.said.append(("close", session_id, model))

    def shared(self) -> bool:
        return self.sharing


def make(ttl_s: float = 60.0) -> tuple[EndpointPicker, FakeClock, Told]:
    clock = FakeClock(1000.0)
    picker = EndpointPicker(replace(picker_config(4), session_ttl_s=ttl_s), clock=clock)
    told = Told()
    picker.route_share = told
    return picker, clock, told


async def test_a_stored_answer_is_told_with_its_worker_endpoint_and_group():
    picker, _, told = make()
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    endpoint = await respond(service, body(input="question"), answer_of("resp_1"))
    home = picker.response_homes.get("resp_1", 1000.0)
    assert home is not None and home.endpoint == endpoint
    assert told.said == [("home", "resp_1", MODEL, home.worker, endpoint, "local")]


async def test_an_answer_outside_the_responses_api_is_not_told():
    picker, _, told = make()
    await turn(picker, "hello " * 20, "", "r0")
    assert told.said == []


async def test_a_new_pin_is_told_at_once_a_use_once_a_quarter_of_the_ttl():
    picker, clock, told = make(ttl_s=60.0)
    worker = await turn(picker, "hello " * 30, "s", "r0")
    assert told.said == [("pin", "s", MODEL, worker, "local")]
    clock.advance(14.9)  # a use before a quarter of the TTL: the others' TTL has time enough
    assert await turn(picker, "more " * 30, "s", "r1") == worker
    assert len(told.said) == 1
    clock.advance(0.1)  # 15 s since it was told: told again, so the others' TTL restarts
    await turn(picker, "again " * 30, "s", "r2")
    assert told.said[1:] == [("pin", "s", MODEL, worker, "local")]
    clock.advance(14.9)
    await turn(picker, "once more " * 30, "s", "r3")
    assert len(told.said) == 2


async def test_a_pin_that_moves_is_told_at_once():
    picker, clock, told = make()
    first = await turn(picker, "hello " * 30, "s", "r0")
    other = next(w for w in picker.config.workers if w.id != first.worker_id)
    clock.advance(0.5)  # well within a quarter of the TTL (and of a second): only a move is told now
    moved = await picker.pick(
        body=chat_body("next " * 30, **session("s")), path="/v1/chat/completions", headers={},
        subset=[other.endpoint], client_request_id="r1",
    )  # fmt: skip
    picker.answered(moved, 200)
    picker.finish(moved, "complete")
    assert str(moved.worker.worker_id) == other.id
    assert told.said == [("pin", "s", MODEL, first, "local"), ("pin", "s", MODEL, moved.worker, "local")]


async def test_a_close_is_told_with_its_model():
    picker, _, told = make()
    await turn(picker, "hello " * 30, "s", "r0")
    told.said.clear()
    chosen = await pick(picker, chat_body("bye " * 30, **session("s", "close")), request_id="r1")
    picker.answered(chosen, 200)
    picker.finish(chosen, "complete")
    assert told.said == [("close", "s", MODEL)]
    assert "s" not in picker.sessions(MODEL)


async def test_a_pin_heard_from_another_replica_is_kept_and_not_echoed():
    picker, clock, told = make()
    assert not picker.remember_session_pin("s", "no-such-model", Worker("w2"), "local")
    assert picker.remember_session_pin("s", MODEL, Worker("w2"), "local")
    pin = picker.sessions(MODEL).get_pin("s", clock())
    assert pin is not None and (pin.worker, pin.group) == (Worker("w2"), "local")
    clock.advance(1.0)
    assert await turn(picker, "hello " * 30, "s", "r0") == Worker("w2")
    assert told.said == []  # the others were told by the replica that pinned it


async def test_a_close_heard_from_another_replica_unpins_here():
    picker, _, told = make()
    assert not picker.forget_session_pin("s", MODEL)
    assert not picker.forget_session_pin("s", "no-such-model")
    picker.remember_session_pin("s", MODEL, Worker("w2"), "local")
    assert picker.forget_session_pin("s", MODEL)
    assert "s" not in picker.sessions(MODEL) and told.said == []


async def test_an_answer_heard_from_another_replica_routes_its_follow_up():
    picker, _, told = make()
    service = ExtProcService(picker, max_body_bytes=1 << 20)
    w3 = next(w for w in picker.config.workers if w.id == "w3")
    assert not picker.remember_response_home("", MODEL, Worker("w3"), w3.endpoint, "local")
    assert picker.remember_response_home("resp_x", MODEL, Worker("w3"), w3.endpoint, "local")
    follow_up = body(input="and then?", previous_response_id="resp_x")
    assert await respond(service, follow_up, answer_of("resp_y")) == w3.endpoint
    assert [said[:2] for said in told.said] == [("home", "resp_y")]


# --- routes handed over to a replica that started late (`extproc.events.route_catchup`) ----------


def test_a_handed_over_home_fills_in_never_replaces_and_lapses_on_time():
    picker, clock, _ = make()
    homes = picker.response_homes
    assert picker.remember_response_home("resp_live", MODEL, Worker("w1"), "e1", "local")
    assert not picker.remember_response_home("resp_live", MODEL, Worker("w2"), "e2", "local", fill=True)
    assert homes.get("resp_live", clock()).worker == Worker("w1")  # learned later than the answer's
    assert picker.remember_response_home(
        "resp_old", MODEL, Worker("w2"), "e2", "local", age_s=3590.0, fill=True
    )
    assert not picker.remember_response_home("resp_gone", MODEL, Worker("w2"), "e2", "local", age_s=3600.0)
    assert "resp_gone" not in homes
    clock.advance(9.9)
    assert [rid for rid, _ in homes.homes(clock())] == ["resp_live", "resp_old"]
    clock.advance(0.1)  # an hour after its last use on the replica that handed it over
    assert [rid for rid, _ in homes.homes(clock())] == ["resp_live"]
    assert homes.get("resp_old", clock()) is None and homes.get("resp_live", clock()) is not None
    assert homes.expired == 1


def test_a_handed_over_pin_fills_in_never_replaces_and_lapses_on_time():
    picker, clock, told = make(ttl_s=60.0)
    sessions = picker.sessions(MODEL)
    assert picker.remember_session_pin("s_live", MODEL, Worker("w1"), "local")
    assert not picker.remember_session_pin("s_live", MODEL, Worker("w2"), "local", fill=True)
    assert sessions.get("s_live", clock()) == Worker("w1")
    assert not picker.remember_session_pin("s_any", "no-such-model", Worker("w2"), "local", fill=True)
    assert picker.remember_session_pin("s_old", MODEL, Worker("w2"), "local", age_s=50.0, fill=True)
    assert not picker.remember_session_pin("s_gone", MODEL, Worker("w2"), "local", age_s=60.0, fill=True)
    assert "s_gone" not in sessions
    clock.advance(9.9)
    assert sessions.get("s_old", clock()) == Worker("w2")
    clock.advance(0.1)  # its TTL after its last use, there
    assert sessions.get("s_old", clock()) is None and told.said == []


def test_the_routes_kept_here_are_listed_with_their_ages_least_recently_used_first():
    picker, clock, _ = make(ttl_s=60.0)
    picker.remember_response_home("resp_a", MODEL, Worker("w1"), "e1", "local", age_s=5.0)
    picker.remember_session_pin("s_gone", MODEL, Worker("w3"), "local", age_s=59.0)
    clock.advance(2.0)
    picker.remember_response_home("resp_b", MODEL, Worker("w2"), "e2", "g2")
    picker.remember_session_pin("s_b", MODEL, Worker("w2"), "g2")
    assert list(picker.known_response_homes()) == [
        ("resp_a", MODEL, Worker("w1"), "e1", "local", 7.0),
        ("resp_b", MODEL, Worker("w2"), "e2", "g2", 0.0),
    ]
    assert list(picker.known_session_pins()) == [("s_b", MODEL, Worker("w2"), "g2", 0.0)]  # s_gone lapsed


async def test_a_pin_heard_restarts_the_quarter_ttl_after_which_a_use_here_is_told():
    picker, clock, told = make(ttl_s=60.0)
    worker = await turn(picker, "hello " * 30, "s", "r0")  # told at 1000
    clock.advance(0.5)
    assert picker.remember_session_pin("s", MODEL, worker, "local")  # the others were told at 1000.5
    clock.advance(14.9)  # 15.4 s since this replica told it, 14.9 since the others were
    await turn(picker, "more " * 30, "s", "r1")
    assert told.said == [("pin", "s", MODEL, worker, "local")]


def test_what_another_replica_tells_replaces_what_is_known_here():
    picker, clock, _ = make()
    picker.remember_response_home("resp_1", MODEL, Worker("w1"), "e1", "local")
    assert picker.remember_response_home("resp_1", MODEL, Worker("w2"), "e2", "local")
    assert picker.response_homes.get("resp_1", clock()).worker == Worker("w2")
    picker.remember_session_pin("s", MODEL, Worker("w1"), "local")
    assert picker.remember_session_pin("s", MODEL, Worker("w2"), "local")  # a move there
    assert picker.sessions(MODEL).get("s", clock()) == Worker("w2")


# --- heard before the turn it routes ---------------------------------------------------------------


def sharing_just_before(worker: Worker, endpoint: str) -> EndpointPicker:
    """A picker to which another replica's pin of `s` and home of `resp_x` on `worker` come with its
    first catch-up (`before_decision`), as replica sync applies a message held in the NATS socket."""
    picker, _, _ = make()

    async def catch_up() -> None:
        picker.remember_response_home("resp_x", MODEL, worker, endpoint, "local")
        picker.remember_session_pin("s", MODEL, worker, "local")

    picker.before_decision = catch_up
    return picker


@pytest.mark.parametrize("kind", ["follow-up", "session turn", "retrieval"])
async def test_a_route_shared_just_before_the_next_turn_is_heard_before_that_turn_is_routed(kind):
    """Another replica's pin or answer's worker can reach this one in the same instant as the client's
    next turn: held in the NATS socket until replica sync's catch-up reads it. The follow-up, the
    session's turn and the retrieval each look their route up after that catch-up (before, they were
    routed on load: a follow-up or a retrieval then met the engine's 404)."""
    for listed in picker_config(4).workers:  # on load the turn would go elsewhere for most of them
        worker = Worker(listed.id)
        picker = sharing_just_before(worker, listed.endpoint)
        if kind == "session turn":
            assert await turn(picker, "hello " * 30, "s", "r1") == worker
            continue
        path, payload = "/v1/responses", body(input="and then?", previous_response_id="resp_x")
        if kind == "retrieval":
            path, payload = "/v1/responses/resp_x", None
        chosen = await picker.pick(body=payload, path=path, headers={}, subset=None, client_request_id="r1")
        picker.finish(chosen, "complete")
        assert (chosen.worker, chosen.endpoint, chosen.tracked) == (
            worker,
            listed.endpoint,
            kind == "follow-up",
        )


@pytest.mark.parametrize("kind", ["follow-up", "retrieval"])
async def test_an_unknown_answer_is_waited_for_while_other_replicas_share_routes(kind):
    """The other replica's word can still be on its way (its batch, NATS) when the client's next
    request arrives: the request waits for it, bounded, and goes where it says the moment it comes."""
    picker, _, told = make()
    told.sharing = True
    w3 = next(w for w in picker.config.workers if w.id == "w3")
    path, payload = "/v1/responses", body(input="and then?", previous_response_id="resp_x")
    if kind == "retrieval":
        path, payload = "/v1/responses/resp_x", None
    request = asyncio.ensure_future(
        picker.pick(body=payload, path=path, headers={}, subset=None, client_request_id="r1")
    )
    await until(lambda: len(picker.home_waits) == 1, 5.0, "the request waits")
    assert picker.remember_response_home("resp_x", MODEL, Worker("w3"), w3.endpoint, "local")
    chosen = await request
    picker.finish(chosen, "complete")
    assert (chosen.worker, chosen.endpoint) == (Worker("w3"), w3.endpoint)
    assert (picker.home_waits.arrived, len(picker.home_waits)) == (1, 0)
    exported = generate_latest(picker.metrics.registry).decode()
    assert 'extproc_response_home_waits_total{outcome="arrived"} 1.0' in exported


@pytest.mark.parametrize("sharing", [True, False])
async def test_an_answer_nobody_shares_is_routed_on_load_after_the_wait_or_at_once_alone(sharing):
    picker, _, told = make()
    told.sharing = sharing
    chosen = await picker.pick(
        body=body(input="and then?", previous_response_id="resp_lapsed"), path="/v1/responses",
        headers={}, subset=None, client_request_id="r1",
    )  # fmt: skip
    picker.finish(chosen, "complete")
    assert chosen.tracked and picker.home_waits.timed_out == int(sharing)
    exported = generate_latest(picker.metrics.registry).decode()
    assert f'extproc_response_home_waits_total{{outcome="timed_out"}} {float(sharing)}' in exported
    await picker.pick(body=None, path="/v1/responses/", headers={}, subset=None, client_request_id="r2")
    assert picker.home_waits.timed_out == int(sharing)  # no id: nothing to wait for
    picker.route_share = None  # no replica sync at all: nothing to wait for
    await picker.pick(
        body=None, path="/v1/responses/resp_lapsed", headers={}, subset=None, client_request_id="r2"
    )
    assert picker.home_waits.timed_out == int(sharing)
