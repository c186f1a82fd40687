"""Sticky sessions through the picker: every turn on one worker, TTL, close, worker gone or busy."""

from __future__ import annotations

from dataclasses import replace

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


async def turn(picker, text: str, session_id: str, rid: str, action: str | None = None):
    chosen = await pick(picker, chat_body(text, **session(session_id, action)), request_id=rid)
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
