"""Sticky sessions through the picker: every turn on one worker, TTL, close, worker gone or busy;
pinned only once the worker answered 2xx; bounded in id length and number; swept on a timer."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from extproc.epp import answers as epp
from extproc.errors import RequestInvalid
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import MODEL, chat_body, picker_config
from ..router.clock import FakeClock


async def pick(picker, body, *, headers=None, request_id="r"):
    return await picker.pick(
        body=body,
        path="/v1/chat/completions",
        headers=headers or {},
        subset=None,
        client_request_id=request_id,
    )


def session(session_id: str, action: str | None = None) -> dict:
    control = {"session_id": session_id, **({"action": action} if action else {})}
    return {"nvext": {"session_control": control}}


def make(n_workers: int = 4, ttl_s: float = 60.0, **router) -> tuple[EndpointPicker, FakeClock]:
    clock = FakeClock(1000.0)
    config = replace(picker_config(n_workers, **router), session_ttl_s=ttl_s)
    return EndpointPicker(config, clock=clock), clock


async def turn(picker, text: str, session_id: str, rid: str, action: str | None = None, status: int = 200):
    chosen = await pick(picker, chat_body(text, **session(session_id, action)), request_id=rid)
    picker.answered(chosen, status)
    picker.first_token(chosen)
    picker.finish(chosen, "complete")
    return chosen.worker


async def test_every_turn_of_a_session_goes_to_its_first_worker() -> None:
    picker, _ = make()
    # different prompts that would spread over the workers by load; the session keeps them together
    workers = {await turn(picker, f"topic {i} " * (5 + 7 * i), "s1", f"r{i}") for i in range(12)}
    assert len(workers) == 1
    assert len(picker.sessions(MODEL)) == 1
    assert picker.is_idle()


async def test_the_x_session_id_header_pins_too_and_sessions_are_independent() -> None:
    picker, _ = make()
    seen: dict[str, set] = {"a": set(), "b": set()}
    for i in range(8):
        for sid in seen:
            chosen = await pick(
                picker, chat_body(f"{sid} {i} " * 20), headers={"x-session-id": sid}, request_id=f"{sid}{i}"
            )
            seen[sid].add(chosen.worker)
            picker.answered(chosen, 200)
            picker.finish(chosen, "complete")
    assert all(len(w) == 1 for w in seen.values())


async def test_a_pin_lapses_after_the_ttl_without_use() -> None:
    picker, clock = make(ttl_s=10.0)
    first = await turn(picker, "hello " * 30, "s", "r0")
    clock.advance(9.0)
    assert await turn(picker, "other " * 30, "s", "r1") == first  # within the TTL, which slides
    clock.advance(9.0)
    assert "s" in picker.sessions(MODEL)
    clock.advance(10.0)
    sessions = picker.sessions(MODEL)
    assert sessions.get("s", clock()) is None  # lapsed: the next turn is routed afresh


async def test_close_drops_the_pin_after_routing_the_closing_turn() -> None:
    picker, _ = make()
    first = await turn(picker, "hello " * 30, "s", "r0")
    assert await turn(picker, "bye " * 30, "s", "r1", action="close") == first
    assert "s" not in picker.sessions(MODEL)


async def test_a_worker_that_leaves_is_replaced_and_the_session_re_pinned() -> None:
    picker, _ = make()
    first = await turn(picker, "hello " * 30, "s", "r0")
    remaining = [w for w in picker.config.workers if w.id != first.worker_id]
    picker.set_workers(MODEL, remaining)
    second = await turn(picker, "again " * 30, "s", "r1")
    assert second != first
    assert await turn(picker, "third " * 30, "s", "r2") == second


async def test_a_busy_pinned_worker_is_replaced() -> None:
    picker, _ = make(active_prefill_tokens_threshold=50)
    first = await turn(picker, "hello " * 30, "s", "r0")
    # load the pinned worker with a prompt still in prefill: over the 50-token threshold
    hog = await pick(picker, chat_body("x " * 200, **session("s")), request_id="hog")
    assert hog.worker == first
    moved = await pick(picker, chat_body("y " * 30, **session("s")), request_id="r1")
    assert moved.worker != first
    picker.answered(moved, 200)
    assert picker.sessions(MODEL).get("s", 1000.0) == moved.worker
    assert picker.metrics.sessions.labels(MODEL, "moved")._value.get() == 1
    for p in (hog, moved):
        picker.finish(p, "complete")
    assert picker.is_idle()


async def test_a_pinned_worker_outside_the_allowed_subset_is_not_used() -> None:
    picker, _ = make(2)
    first = await turn(picker, "hello " * 30, "s", "r0")
    other = next(w for w in picker.config.workers if w.id != first.worker_id)
    chosen = await picker.pick(
        body=chat_body("next " * 30, **session("s")),
        path="/v1/chat/completions",
        headers={},
        subset=[other.endpoint],
        client_request_id="r1",
    )
    assert str(chosen.worker.worker_id) == other.id
    picker.finish(chosen, "complete")


async def test_a_session_is_pinned_only_once_its_worker_answered_2xx() -> None:
    """Issue 19: the pin was made before the worker answered, so a failed or abandoned first turn
    pinned a worker that had never served the session."""
    picker, clock = make()
    sessions = picker.sessions(MODEL)
    unanswered = await pick(picker, chat_body("a " * 30, **session("s")), request_id="r0")
    picker.finish(unanswered, "cancelled")  # the client left before any answer
    assert "s" not in sessions
    failed = await pick(picker, chat_body("b " * 30, **session("s")), request_id="r1")
    picker.answered(failed, 503)
    picker.finish(failed, "upstream_status_503")
    assert "s" not in sessions
    served = await pick(picker, chat_body("c " * 30, **session("s")), request_id="r2")
    picker.answered(served, 200)
    picker.finish(served, "complete")
    assert sessions.get("s", clock()) == served.worker
    assert picker.metrics.sessions.labels(MODEL, "pinned")._value.get() == 1


async def test_a_failed_answer_neither_refreshes_nor_moves_a_pin() -> None:
    picker, clock = make(ttl_s=10.0)
    first = await turn(picker, "hello " * 30, "s", "r0")
    clock.advance(8.0)
    await turn(picker, "again " * 30, "s", "r1", status=500)
    clock.advance(3.0)  # 11 s after the last 2xx: lapsed though a request came 3 s ago
    assert picker.sessions(MODEL).get("s", clock()) is None and first is not None


async def test_a_session_id_over_the_length_limit_is_a_400() -> None:
    picker, _ = make()
    picker_limit = picker.config.session_id_max_length
    assert picker_limit == 256
    long_id = "s" * (picker_limit + 1)
    with pytest.raises(RequestInvalid) as in_body:
        await pick(picker, chat_body("x", **session(long_id)))
    assert epp.status_of(in_body.value) == (400, "invalid-request")
    assert "session_id is 257 characters long; the limit is 256" in in_body.value.message
    with pytest.raises(RequestInvalid, match="x-session-id is 257 characters"):
        await pick(picker, chat_body("x"), headers={"x-session-id": long_id})
    assert picker.is_idle() and len(picker.sessions(MODEL)) == 0
    await turn(picker, "ok " * 30, "s" * picker_limit, "r")  # at the limit: accepted
    assert len(picker.sessions(MODEL)) == 1


async def test_beyond_the_pin_limit_the_least_recently_used_session_is_evicted_and_counted() -> None:
    clock = FakeClock(1000.0)
    picker = EndpointPicker(replace(picker_config(2), session_max_pins=3), clock=clock)
    for i in range(10):
        await turn(picker, f"turn {i} " * 20, f"s{i}", f"r{i}")
        clock.advance(1.0)
    sessions = picker.sessions(MODEL)
    assert len(sessions) == 3 and sessions.evicted == 7
    assert [f"s{i}" in sessions for i in range(10)] == [False] * 7 + [True] * 3
    await picker.close()


async def test_lapsed_pins_are_swept_without_waiting_for_a_request() -> None:
    """Issue 19: expired pins stayed until the next session request. A timer sweeps them now."""
    picker = EndpointPicker(replace(picker_config(2), session_ttl_s=0.2))
    try:
        await turn(picker, "hello " * 30, "s", "r0")
        sessions = picker.sessions(MODEL)
        assert len(sessions) == 1
        deadline = time.monotonic() + 5.0
        while len(sessions):  # no request is made: only the sweeper can drop it
            assert time.monotonic() < deadline, "the lapsed pin was never swept"
            await asyncio.sleep(0.02)
        assert sessions.expired == 1
    finally:
        await picker.close()


async def test_session_and_request_ids_are_logged_escaped_and_cut(caplog) -> None:
    """Issue 19: a session id with a newline forged a log line."""
    picker, _ = make()
    forged = "s\n2026-01-01 INFO extproc.picker: routed admin to w0" + "x" * 200
    with caplog.at_level("INFO", logger="extproc.picker"):
        chosen = await pick(picker, chat_body("x " * 30, **session(forged)), request_id="rid\nforged")
        picker.answered(chosen, 200)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("\n" not in line for line in lines)
    routed = next(line for line in lines if line.startswith("routed "))
    assert "rid\\nforged" in routed and "session=s\\n2026-01-01 INFO" in routed and "chars)" in routed
    assert len(routed) < 400
