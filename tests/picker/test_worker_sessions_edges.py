"""Worker-side session calls at their edges (extproc/picker/worker_sessions.py).

What each HTTP answer of a worker counts as, redirects and compressed answers refused, the error
text read from SGLang's and FastAPI's answer shapes, the client's timeout bounds, the logging that
says a worker's state once per change, and the `extproc_worker_session_calls_total` family.

vLLM and SGLang serve HTTP with FastAPI: a vLLM worker (no session routes) is a real FastAPI app
on uvicorn here, so its 404 and 405 answers are FastAPI's own (`{"detail": "Not Found"}`); the
other answers come from an aiohttp server told what to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
from collections.abc import AsyncIterator

import pytest
import uvicorn
from aiohttp import web
from aiohttp.test_utils import TestServer
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from extproc.picker import worker_sessions
from extproc.picker.worker_sessions import (
    DEFAULT_TIMEOUT_S,
    OUTCOMES,
    WorkerSessionCollector,
    WorkerSessions,
    _error_message,
    session_timeout,
)

from .test_worker_sessions import make, turn

STILL_OPEN = "Session with the same id is still open."


class Answers:
    """A worker that answers each session call as told, and records what reached it."""

    def __init__(self, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}
        self.calls: list[str] = []

    def app(self) -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            self.calls.append(request.path)
            return web.Response(status=self.status, body=self.body, headers=self.headers)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        return app


@contextlib.asynccontextmanager
async def serving(answers: Answers) -> AsyncIterator[str]:
    server = TestServer(answers.app(), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def client(timeout_s: float = 5.0) -> AsyncIterator[WorkerSessions]:
    """A WorkerSessions client, closed on exit."""
    sessions = WorkerSessions(timeout_s=timeout_s)
    try:
        yield sessions
    finally:
        await sessions.close()


@contextlib.asynccontextmanager
async def fastapi_worker(app: FastAPI) -> AsyncIterator[str]:
    """`app` on uvicorn at 127.0.0.1 on a free port, stopped on exit."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(1000):  # until it listens (bounded)
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def vllm_like() -> FastAPI:
    """vLLM's server has no session routes; one POST route and one GET route stand for the rest."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {}

    @app.get("/open_session")  # a GET-only route where SGLang's POST is: FastAPI answers 405
    async def get_only() -> dict[str, str]:
        return {}

    return app


# --- what an answer counts as -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action, status, body, outcome",
    [
        ("open", 200, b'"s"', "ok"),
        ("close", 204, b"", "ok"),
        ("open", 299, b"", "ok"),
        ("open", 300, b"", "failed"),
        ("open", 404, b"", "unsupported"),
        ("close", 405, b"", "unsupported"),
        ("open", 406, b"", "refused"),
        ("open", 400, json.dumps({"error": {"message": STILL_OPEN}}).encode(), "already_open"),
        ("close", 400, json.dumps({"error": {"message": STILL_OPEN}}).encode(), "refused"),
        (
            "open",
            400,
            json.dumps({"error": {"message": "streaming sessions are disabled"}}).encode(),
            "refused",
        ),
        ("open", 499, b"", "refused"),
        ("open", 500, b"", "failed"),
        ("close", 503, b"", "failed"),
    ],
)
async def test_each_answer_counts_as_its_outcome(action: str, status: int, body: bytes, outcome: str) -> None:
    answers = Answers(status, body)
    async with client() as sessions:
        async with serving(answers) as endpoint:
            if action == "open":
                assert await sessions.open(endpoint, "s", 60) == outcome
            else:
                sessions.close_later(endpoint, "s")
                await sessions.drain()
        assert answers.calls == [f"/{action}_session"]
        assert sessions.calls == {(action, outcome): 1}


async def test_a_vllm_worker_answers_fastapis_404_and_405_which_count_as_unsupported() -> None:
    async with client() as sessions:
        async with fastapi_worker(vllm_like()) as endpoint:
            assert await sessions.open(endpoint, "s", 60) == "unsupported"  # 405: POST on a GET route
            sessions.close_later(endpoint, "s")  # 404 {"detail": "Not Found"}
            await sessions.drain()
        assert sessions.calls == {("open", "unsupported"): 1, ("close", "unsupported"): 1}


async def test_a_picker_in_front_of_vllm_workers_routes_session_opens_all_the_same() -> None:
    async with fastapi_worker(vllm_like()) as endpoint:
        picker, _ = make([endpoint])
        try:
            chosen = await turn(picker, "r0", "agent", "open")
            assert chosen.endpoint == endpoint and chosen.session_opened_on is None
            assert picker.worker_sessions is not None
            assert picker.worker_sessions.calls == {("open", "unsupported"): 1}
            picker.finish(chosen, "complete")
            assert picker.is_idle()
        finally:
            await picker.close()


async def test_a_refused_connection_counts_as_failed() -> None:
    async with serving(Answers()) as endpoint:
        pass  # closed: nothing listens there now
    async with client() as sessions:
        assert await sessions.open(endpoint, "s", 60) == "failed"
        assert sessions.calls == {("open", "failed"): 1}


async def test_a_silent_worker_fails_within_the_timeout_given() -> None:
    release = asyncio.Event()

    async def silent(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    app = web.Application()
    app.router.add_post("/open_session", silent)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    sessions = WorkerSessions(timeout_s=0.1)
    try:
        assert await sessions.open(f"127.0.0.1:{server.port}", "s", 60) == "failed"
    finally:
        release.set()
        await sessions.close()
        await server.close()


async def test_a_redirect_is_not_followed() -> None:
    elsewhere = Answers(200)
    async with serving(elsewhere) as target:
        redirect = Answers(307, headers={"Location": f"http://{target}/open_session"})
        async with client() as sessions, serving(redirect) as endpoint:
            assert await sessions.open(endpoint, "s", 60) == "failed"
    assert redirect.calls == ["/open_session"] and elsewhere.calls == []


async def test_a_compressed_answer_is_read_as_sent_never_inflated() -> None:
    body = gzip.compress(json.dumps({"error": {"message": STILL_OPEN}}).encode())
    answers = Answers(400, body, {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    async with client() as sessions, serving(answers) as endpoint:
        # the message is not read through the compression: refused, not already open
        assert await sessions.open(endpoint, "s", 60) == "refused"


async def test_calls_work_again_after_close() -> None:
    async with client() as sessions, serving(Answers(200)) as endpoint:
        assert await sessions.open(endpoint, "a", 60) == "ok"
        await sessions.close()
        assert await sessions.open(endpoint, "b", 60) == "ok"


def test_a_close_without_an_event_loop_is_dropped_and_counted() -> None:
    sessions = WorkerSessions()
    sessions.close_later("127.0.0.1:9", "s")
    assert sessions.calls == {("close", "dropped"): 1}


# --- the error text -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, message",
    [
        (json.dumps({"error": {"message": "no such session"}}).encode(), "no such session"),  # SGLang's
        (json.dumps({"error": {"message": "x" * 600}}).encode(), "x" * 500),
        (b'{"detail":"Not Found"}', '{"detail":"Not Found"}'),  # FastAPI's
        (b'{"error": "flat"}', '{"error": "flat"}'),
        (b'{"error": {"message": 7}}', '{"error": {"message": 7}}'),
        (b'{"error": null}', '{"error": null}'),
        (b'["error"]', '["error"]'),
        (b'"error"', '"error"'),
        (b"null", "null"),
        (b"Internal Server Error", "Internal Server Error"),
        (b"y" * 300, "y" * 200),
        (b"bad \xff byte", "bad \ufffd byte"),
    ],
)
def test_the_error_text_is_sglangs_message_or_the_answers_start(answer: bytes, message: str) -> None:
    assert _error_message(answer) == message


# --- the client's timeout -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nvext, timeout",
    [
        ({}, DEFAULT_TIMEOUT_S),
        ({"session_control": "open"}, DEFAULT_TIMEOUT_S),  # no object: no timeout given
        ({"session_control": {"session_id": "s"}}, DEFAULT_TIMEOUT_S),
        ({"session_control": {"timeout": 1}}, 1),
        ({"session_control": {"timeout": 10**9}}, 10**9),
        ({"session_control": {"timeout": 10**9 + 1}}, None),
        ({"session_control": {"timeout": 0}}, None),
        ({"session_control": {"timeout": 2.0}}, None),
        ({"session_control": {"timeout": False}}, None),
    ],
)
def test_a_session_timeout_is_a_positive_integer_up_to_a_billion_seconds(
    nvext: dict, timeout: int | None
) -> None:
    assert session_timeout(nvext) == timeout


# --- logging once per change ------------------------------------------------------------------------


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_each_workers_failures_are_logged_once_per_change_and_its_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down, up = Answers(500), Answers(500)
    async with client() as sessions, serving(down) as a, serving(up) as b:
        with caplog.at_level(logging.DEBUG, logger="extproc.worker_sessions"):
            for endpoint in (a, b, a, b):  # two failing workers, alternately
                await sessions.open(endpoint, "s", 60)
            assert len(warnings(caplog)) == 2
            up.status = 200
            for _ in range(2):  # said at the first success, not again
                assert await sessions.open(b, "s", 60) == "ok"
                again = [r for r in caplog.records if "works again" in r.getMessage()]
                assert [(r.levelno, r.getMessage()) for r in again] == [
                    (logging.INFO, f"worker sessions at {b}: open_session works again")
                ]
            assert len(warnings(caplog)) == 2  # success is no warning
            up.status = 500
            await sessions.open(b, "s", 60)
            assert len(warnings(caplog)) == 3  # failing again is a change


async def test_a_session_already_open_is_no_failure_to_log(caplog: pytest.LogCaptureFixture) -> None:
    answers = Answers(400, json.dumps({"error": {"message": STILL_OPEN}}).encode())
    async with client() as sessions:
        async with serving(answers) as endpoint:
            with caplog.at_level(logging.INFO, logger="extproc.worker_sessions"):
                assert await sessions.open(endpoint, "s", 60) == "already_open"
                answers.status, answers.body = 200, b'"s"'
                assert await sessions.open(endpoint, "s", 60) == "ok"
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


async def test_the_memory_of_workers_outcomes_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_sessions, "MAX_REMEMBERED_ENDPOINTS", 3)
    sessions = WorkerSessions()
    for i in range(3):
        sessions._count("open", f"10.0.0.{i}:8000", "s", "ok", "")
    assert len(sessions._last) == 3
    sessions._count("open", "10.0.0.1:8000", "s", "failed", "")  # a known one: kept
    assert len(sessions._last) == 3
    sessions._count("open", "10.0.0.9:8000", "s", "failed", "")  # a fourth: the memory starts again
    assert sessions._last == {"10.0.0.9:8000": "failed"}


# --- the metric -----------------------------------------------------------------------------------------


def test_the_calls_are_exported_by_action_and_outcome_every_pair_present() -> None:
    sessions = WorkerSessions()
    sessions.calls[("open", "ok")] = 3
    sessions.calls[("close", "dropped")] = 2
    registry = CollectorRegistry()
    registry.register(WorkerSessionCollector(sessions))
    samples = {
        (s.labels["action"], s.labels["outcome"]): s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == "extproc_worker_session_calls_total"
    }
    expected = {(action, outcome): 0.0 for action in ("open", "close") for outcome in OUTCOMES}
    assert samples == {**expected, ("open", "ok"): 3.0, ("close", "dropped"): 2.0}
