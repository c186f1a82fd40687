"""Worker-side sessions: SGLang's streaming sessions opened and closed on the worker a session uses.

A request whose `nvext.session_control` carries `action: "open"` asks Dynamo's router to open a session
on the worker it picks, before the request goes there; `action: "close"` asks it to close the session
once that request has finished; and the router closes a session whose affinity lapsed (Dynamo's
AgentController, which calls the worker's `session_control` endpoint; its SGLang worker turns the call
into SGLang's `open_session` / `close_session`). An ext_proc picker reaches the engine itself, over
the HTTP port Envoy forwards to, where SGLang serves the same two calls (checked against SGLang 0.5.23's
own code: tests/picker/worker_sessions/sglang-0.5.23.json):

    POST /open_session   {"capacity_of_str_len": int, "session_id": str, "streaming": bool,
                          "timeout": float}
                         200 and the session id as a JSON string; 400 {"error": {"message": ...}} when
                         it cannot (a session with that id is still open, streaming sessions disabled:
                         SGLang needs --enable-streaming-session, as Dynamo's session control does)
    POST /close_session  {"session_id": str}: 200

What is sent is what Dynamo sends: capacity 65,536 characters, streaming, and the client's timeout
(`nvext.session_control.timeout`, default 300 s) plus 30 s, so that the picker's own pin lapses, and
closes the session, first.

Best effort, unlike Dynamo (which fails a request whose open fails): the request is routed whatever
the worker answered, and every call is counted by outcome (`extproc_worker_session_calls_total`):

    ok            the worker did it
    already_open  open: SGLang says a session with that id is still open (it serves it: as Dynamo)
    unsupported   404 or 405: the worker serves no session calls (vLLM, or SGLang behind a proxy)
    refused       another 4xx (e.g. SGLang without --enable-streaming-session)
    failed        no answer within the timeout, a refused connection, a 5xx
    dropped       close: more than MAX_PENDING_CLOSES closes were waiting; SGLang's own timeout
                  reaps that session

Bounds: at most MAX_CONCURRENT_CALLS calls at once (an open waits for a slot within its timeout),
at most MAX_PENDING_CLOSES closes waiting, each call within `timeout_s`, answers read up to 64 KiB,
no redirects. A worker's failures are logged when its outcome changes, not once per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import aiohttp
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.picker.client_ids import loggable

log = logging.getLogger("extproc.worker_sessions")

Outcome = Literal["ok", "already_open", "unsupported", "refused", "failed", "dropped"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "already_open", "unsupported", "refused", "failed", "dropped")
MODES = ("sglang", "off")

SESSION_CAPACITY_CHARS = 65_536  # Dynamo's DEFAULT_SESSION_CAPACITY
DEFAULT_TIMEOUT_S = 300  # nvext.session_control.timeout when the client gives none (Dynamo's default)
WORKER_TIMEOUT_BUFFER_S = 30  # the worker's session outlives the picker's pin by this much
MAX_CONCURRENT_CALLS = 64
MAX_PENDING_CLOSES = 1024
MAX_ANSWER_BYTES = 64 * 1024
MAX_REMEMBERED_ENDPOINTS = 4096
_STILL_OPEN = "still open"  # SGLang's message for an id already open: "... with the same id is still open."


class WorkerSessions:
    """Opens and closes SGLang sessions on workers; counts every call in `calls[(action, outcome)]`."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self.calls: Counter[tuple[str, Outcome]] = Counter()
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        self._closing: set[asyncio.Task[Outcome]] = set()
        self._last: dict[str, Outcome] = {}  # endpoint -> its last outcome (logging on change only)

    async def open(self, endpoint: str, session_id: str, timeout_s: int) -> Outcome:
        """Open `session_id` on the worker at `endpoint` (ip:port) for `timeout_s` of inactivity (the
        client's timeout; the buffer is added here). Never raises: the outcome says what happened."""
        body = {
            "capacity_of_str_len": SESSION_CAPACITY_CHARS,
            "session_id": session_id,
            "streaming": True,
            "timeout": float(timeout_s + WORKER_TIMEOUT_BUFFER_S),
        }
        return await self._call("open", endpoint, session_id, body)

    def close_later(self, endpoint: str, session_id: str) -> None:
        """Close `session_id` on the worker at `endpoint` in the background (bounded, counted)."""
        if len(self._closing) >= MAX_PENDING_CLOSES:
            self._count("close", endpoint, session_id, "dropped", f"{MAX_PENDING_CLOSES} closes pending")
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller, a test): nothing can be sent
            self._count("close", endpoint, session_id, "dropped", "no event loop")
            return
        task = loop.create_task(self._call("close", endpoint, session_id, {"session_id": session_id}))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def drain(self) -> None:
        """Wait for the closes in flight (tests, and shutdown before `close`)."""
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    async def close(self) -> None:
        """Finish the pending closes (each within its timeout), then release the HTTP client."""
        await self.drain()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, action: str, endpoint: str, session_id: str, body: Mapping[str, Any]) -> Outcome:
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._slots:
                    status, answer = await self._post(f"http://{endpoint}/{action}_session", body)
        except TimeoutError:
            return self._count(
                action, endpoint, session_id, "failed", f"no answer within {self.timeout_s:g} s"
            )
        except (aiohttp.ClientError, OSError) as exc:
            return self._count(action, endpoint, session_id, "failed", f"{type(exc).__name__}: {exc}")
        if 200 <= status < 300:
            return self._count(action, endpoint, session_id, "ok", "")
        message = _error_message(answer)
        if status in (404, 405):
            return self._count(action, endpoint, session_id, "unsupported", f"HTTP {status}")
        if action == "open" and status == 400 and _STILL_OPEN in message:
            return self._count(action, endpoint, session_id, "already_open", message)
        outcome: Outcome = "refused" if 400 <= status < 500 else "failed"
        return self._count(action, endpoint, session_id, outcome, f"HTTP {status}: {message}")

    async def _post(self, url: str, body: Mapping[str, Any]) -> tuple[int, bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False, connector=aiohttp.TCPConnector(limit=MAX_CONCURRENT_CALLS)
            )
        async with self._session.post(url, json=body, allow_redirects=False) as response:
            answer = await response.content.read(MAX_ANSWER_BYTES)
            return response.status, answer

    def _count(self, action: str, endpoint: str, session_id: str, outcome: Outcome, detail: str) -> Outcome:
        self.calls[(action, outcome)] += 1
        previous = self._last.get(endpoint)
        if previous is None and len(self._last) >= MAX_REMEMBERED_ENDPOINTS:
            self._last.clear()  # workers come and go (discovery): a long-lived picker forgets old ones
        if outcome in ("ok", "already_open"):
            self._last[endpoint] = outcome
            if previous not in (None, "ok", "already_open"):
                log.info("worker sessions at %s: %s_session works again", endpoint, action)
            log.debug("%s_session %s at %s: %s", action, loggable(session_id), endpoint, outcome)
            return outcome
        self._last[endpoint] = outcome
        if previous != outcome:  # said once per change, not once per call
            log.warning(
                "%s_session %s at %s: %s (%s); the request is routed all the same",
                action, loggable(session_id), endpoint, outcome, detail,
            )  # fmt: skip
        return outcome


def _error_message(answer: bytes) -> str:
    """SGLang's `{"error": {"message": ...}}`, else the answer's first 200 characters (e.g. FastAPI's
    `{"detail": "Not Found"}`, a vLLM worker's answer: no "error" key)."""
    with contextlib.suppress(ValueError, LookupError, TypeError):  # not JSON, no such key, not a map
        message = json.loads(answer)["error"]["message"]
        if isinstance(message, str):
            return message[:500]
    return answer[:200].decode("utf-8", "replace")


def session_timeout(nvext: Mapping[str, Any]) -> int | None:
    """`nvext.session_control.timeout` in seconds (DEFAULT_TIMEOUT_S when absent), or None when it
    is not a positive integer (the caller answers 400, as Dynamo's u64 field refuses it)."""
    control = nvext.get("session_control")
    value = control.get("timeout") if isinstance(control, Mapping) else None
    if value is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 10**9:
        return None
    return value


class WorkerSessionCollector(Collector):
    """`extproc_worker_session_calls_total{action, outcome}`, read from `WorkerSessions.calls`."""

    def __init__(self, sessions: WorkerSessions) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "extproc_worker_session_calls",
            "SGLang session calls made to workers (nvext.session_control actions, lapsed pins), by outcome.",
            labels=["action", "outcome"],
        )
        for action in ("open", "close"):
            for outcome in OUTCOMES:
                calls.add_metric([action, outcome], self._sessions.calls[(action, outcome)])
        yield calls
