"""Worker-side sessions (issue 23): nvext.session_control "open" / "close" become SGLang's
/open_session and /close_session calls on the chosen worker, as Dynamo's AgentController makes them.

SGLang cannot run here (it needs torch and a GPU), so each worker is an HTTP server that serves SGLang
0.5.23's two session routes as its code does: the routes, body classes, duplicate-id message and error
shape come from worker_sessions/sglang-0.5.23.json (generate_fixture.py reads them from SGLang's
wheel), and bodies are validated with pydantic in lax mode, extra keys ignored, which is what SGLang's
`msgspec_struct_pydantic_core_schema` gives FastAPI (a body it refuses is answered 422).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NotRequired, Optional, Required

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one's on Python < 3.12

from extproc.config import WorkerConfig
from extproc.errors import RequestInvalid
from extproc.picker.pipeline import EndpointPicker
from extproc.picker.worker_sessions import MAX_PENDING_CLOSES, WorkerSessions

from ..picker_fixtures import MODEL, chat_body, picker_config
from ..router.clock import FakeClock

SPEC = json.loads((Path(__file__).parent / "worker_sessions" / "sglang-0.5.23.json").read_text())


def sglang_body_type(class_name: str) -> TypeAdapter[Any]:
    """The body SGLang's FastAPI route accepts for `class_name` (its fields and BaseReq's)."""
    classes = SPEC["classes"]
    spec = classes[class_name]
    fields = [*(classes["BaseReq"]["fields"] if "BaseReq" in spec["bases"] else []), *spec["fields"]]
    types = {"Optional": Optional, "int": int, "str": str, "bool": bool, "float": float}
    annotations = {  # SGLang's own annotation text (e.g. "Optional[float]"), read as a type
        f["name"]: (Required if f["required"] else NotRequired)[eval(f["annotation"], types)] for f in fields
    }
    return TypeAdapter(TypedDict(class_name, annotations))  # type: ignore[operator]


@dataclass
class SGLangSessions:
    """One worker's SGLang session routes, with what it was asked."""

    open_sessions: set[str] = field(default_factory=set)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    hold_open: asyncio.Event | None = None  # set: /open_session waits for it

    def app(self) -> web.Application:
        app = web.Application()
        for path, route in SPEC["routes"].items():
            handler = self._open if route["function"] == "open_session" else self._close
            body = sglang_body_type(route["body"])
            for method in route["methods"]:
                app.router.add_route(method, path, self._validated(handler, body))
        return app

    def _validated(self, handler, body_type: TypeAdapter[Any]):
        async def route(request: web.Request) -> web.StreamResponse:
            try:
                body = body_type.validate_python(await request.json())
            except (ValidationError, ValueError) as exc:
                return web.json_response({"detail": str(exc)}, status=422)  # FastAPI's answer
            self.calls.append((request.path, dict(body)))
            return await handler(body)

        return route

    async def _open(self, body: dict[str, Any]) -> web.StreamResponse:
        if self.hold_open is not None:
            await self.hold_open.wait()
        session_id = body["session_id"]
        if session_id in self.open_sessions:  # SGLang: open_session returns None, the route raises
            return web.json_response({"error": {"message": SPEC["open_duplicate_message"]}}, status=400)
        self.open_sessions.add(session_id)
        return web.json_response(session_id)

    async def _close(self, body: dict[str, Any]) -> web.StreamResponse:
        self.open_sessions.discard(body["session_id"])
        return web.Response(status=200)


@pytest.fixture
async def workers() -> AsyncIterator[list[tuple[SGLangSessions, str]]]:
    served: list[tuple[SGLangSessions, TestServer]] = []
    for _ in range(3):
        sessions = SGLangSessions()
        server = TestServer(sessions.app(), host="127.0.0.1", port=0)
        await server.start_server()
        served.append((sessions, server))
    yield [(s, f"127.0.0.1:{server.port}") for s, server in served]
    for _, server in served:
        await server.close()


def make(endpoints: list[str], ttl_s: float = 60.0) -> tuple[EndpointPicker, FakeClock]:
    clock = FakeClock(1000.0)
    config = picker_config(len(endpoints))
    workers = tuple(WorkerConfig(f"w{i}", e, MODEL) for i, e in enumerate(endpoints))
    config = replace(config, workers=workers, session_ttl_s=ttl_s, worker_session_control="sglang")
    return EndpointPicker(config, clock=clock), clock


def control(session_id: str, action: str | None = None, **extra: Any) -> dict[str, Any]:
    session = {"session_id": session_id, **({"action": action} if action else {}), **extra}
    return {"nvext": {"session_control": session}}


async def turn(picker: EndpointPicker, rid: str, session_id: str, action: str | None = None, **extra: Any):
    chosen = await picker.pick(
        body=chat_body(f"turn {rid} " * 20, **control(session_id, action, **extra)),
        path="/v1/chat/completions", headers={}, subset=None, client_request_id=rid,
    )  # fmt: skip
    picker.answered(chosen, 200)
    picker.first_token(chosen)
    return chosen


def served_by(workers, endpoint: str) -> SGLangSessions:
    return next(s for s, e in workers if e == endpoint)


async def test_open_reaches_the_chosen_worker_before_the_request_and_close_after_it_ends(workers) -> None:
    picker, _ = make([e for _, e in workers])
    try:
        first = await turn(picker, "r0", "agent-1", "open", timeout=120)
        sglang = served_by(workers, first.endpoint)
        # opened on the worker the request goes to, with what Dynamo sends, before pick() returned
        assert sglang.calls == [
            ("/open_session", {"capacity_of_str_len": 65536, "session_id": "agent-1", "streaming": True,
                               "timeout": 150.0}),
        ]  # fmt: skip
        assert all(not s.calls for s, e in workers if e != first.endpoint)
        picker.finish(first, "complete")
        middle = await turn(picker, "r1", "agent-1")  # no action: sticky only, no call
        assert middle.endpoint == first.endpoint and len(sglang.calls) == 1
        picker.finish(middle, "complete")
        last = await turn(picker, "r2", "agent-1", "close")
        assert last.endpoint == first.endpoint
        assert "agent-1" not in picker.sessions(MODEL)  # the pin goes at once
        await picker.worker_sessions.drain()
        assert len(sglang.calls) == 1  # ... the worker's session only once the request has finished
        picker.finish(last, "complete")
        await picker.worker_sessions.drain()
        assert sglang.calls[-1] == ("/close_session", {"session_id": "agent-1"})
        assert sglang.open_sessions == set()
        assert picker.worker_sessions.calls == {("open", "ok"): 1, ("close", "ok"): 1}
        assert picker.is_idle()
    finally:
        await picker.close()


async def test_a_lapsed_pin_closes_its_worker_session(workers) -> None:
    picker, clock = make([e for _, e in workers], ttl_s=10.0)
    try:
        chosen = await turn(picker, "r0", "s", "open")
        picker.finish(chosen, "complete")
        sglang = served_by(workers, chosen.endpoint)
        assert sglang.calls[0][1]["timeout"] == 330.0  # Dynamo's default 300 s, plus 30
        clock.advance(11.0)
        assert picker.sessions(MODEL).expire(clock()) == 1
        await picker.worker_sessions.drain()
        assert sglang.calls[-1] == ("/close_session", {"session_id": "s"})
        assert sglang.open_sessions == set()
    finally:
        await picker.close()


async def test_a_session_that_moves_is_closed_on_the_worker_it_leaves(workers) -> None:
    picker, _ = make([e for _, e in workers])
    try:
        chosen = await turn(picker, "r0", "s", "open")
        picker.finish(chosen, "complete")
        left = served_by(workers, chosen.endpoint)
        picker.set_workers(MODEL, [w for w in picker.config.workers if w.endpoint != chosen.endpoint])
        await picker.worker_sessions.drain()
        assert left.calls[-1] == ("/close_session", {"session_id": "s"})
        again = await turn(picker, "r1", "s")
        assert again.endpoint != chosen.endpoint
        picker.finish(again, "complete")
    finally:
        await picker.close()


async def test_a_second_open_of_a_live_session_is_already_open_and_still_pinned(workers) -> None:
    picker, _ = make([e for _, e in workers])
    try:
        for rid in ("r0", "r1"):
            picker.finish(await turn(picker, rid, "s", "open"), "complete")
        assert picker.worker_sessions.calls == {("open", "ok"): 1, ("open", "already_open"): 1}
        assert len(picker.sessions(MODEL)) == 1
    finally:
        await picker.close()


async def test_a_worker_without_session_routes_is_counted_logged_once_and_still_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = TestServer(web.Application(), host="127.0.0.1", port=0)  # vLLM: no such routes (404)
    await server.start_server()
    picker, _ = make([f"127.0.0.1:{server.port}"])
    try:
        with caplog.at_level(logging.WARNING, logger="extproc.worker_sessions"):
            for i in range(3):
                picker.finish(await turn(picker, f"r{i}", f"s{i}", "open"), "complete")
        assert picker.worker_sessions.calls == {("open", "unsupported"): 3}
        assert len([r for r in caplog.records if "unsupported" in r.getMessage()]) == 1
        assert len(picker.sessions(MODEL)) == 3  # pins work all the same
        assert picker.is_idle()
    finally:
        await picker.close()
        await server.close()


async def test_a_worker_that_does_not_answer_costs_the_timeout_once_and_routes_anyway(workers) -> None:
    sglang, endpoint = workers[0]
    sglang.hold_open = asyncio.Event()  # never set
    picker, _ = make([endpoint])
    picker.worker_sessions.timeout_s = 0.2
    try:
        chosen = await turn(picker, "r0", "s", "open")
        assert chosen.endpoint == endpoint and chosen.session_opened_on is None
        assert picker.worker_sessions.calls == {("open", "failed"): 1}
        picker.finish(chosen, "complete")
        assert picker.is_idle()
    finally:
        sglang.hold_open.set()
        await picker.close()


async def test_a_client_that_leaves_while_its_session_opens_leaks_no_load(workers) -> None:
    sglang, endpoint = workers[0]
    sglang.hold_open = asyncio.Event()
    picker, _ = make([endpoint])
    try:
        task = asyncio.create_task(turn(picker, "r0", "s", "open"))
        for _ in range(500):  # until the open call is waiting at the worker
            if not picker.is_idle():
                break
            await asyncio.sleep(0.01)
        assert not picker.is_idle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert picker.is_idle()
    finally:
        sglang.hold_open.set()
        await picker.close()


async def test_a_bad_timeout_is_answered_400_before_any_load_is_counted(workers) -> None:
    picker, _ = make([e for _, e in workers])
    try:
        for bad in (-1, 0, "300", 1.5, True):
            with pytest.raises(RequestInvalid, match="timeout"):
                await turn(picker, "r0", "s", "open", timeout=bad)
        assert picker.is_idle()
        assert not any(s.calls for s, _ in workers)
    finally:
        await picker.close()


async def test_off_makes_no_call(workers) -> None:
    picker, _ = make([e for _, e in workers])
    await picker.close()
    config = replace(picker.config, worker_session_control="off")
    picker = EndpointPicker(config, clock=FakeClock(1000.0))
    try:
        picker.finish(await turn(picker, "r0", "s", "open"), "complete")
        picker.finish(await turn(picker, "r1", "s", "close"), "complete")
        assert picker.worker_sessions is None
        assert not any(s.calls for s, _ in workers)
    finally:
        await picker.close()


async def test_closes_beyond_the_bound_are_dropped_and_counted() -> None:
    sessions = WorkerSessions(timeout_s=0.05)
    try:
        for i in range(MAX_PENDING_CLOSES + 5):
            sessions.close_later("127.0.0.1:9", f"s{i}")  # the discard port: refused or silent
        assert sessions.calls[("close", "dropped")] == 5
    finally:
        await sessions.close()
    assert sum(sessions.calls.values()) == MAX_PENDING_CLOSES + 5
