"""The soak test's requests: a fixed mix of kinds, each with the answer it is documented to get,
and the judge that accepts an answer or not given the faults the request overlapped.

The ordinary traffic includes the Responses API (`/v1/responses`) and the Anthropic Messages API
(`/v1/messages`, streamed or not), served 200 by a worker.

Besides the ordinary traffic and the limits, hostile requests (docs/reliability.md, "What a client
cannot send past the picker", and the README's Limits):
- `owned_headers`: a chat request naming its own destination (a port where nothing listens), dp
  rank, prefill endpoint and worker in the headers the picker owns: served 200 by a worker the
  picker chose (a destination honoured would have been Envoy's 503);
- `encoded_path`: a chat request to `/v1/chat/%63ompletions`, `/v1//chat/completions` or
  `/v1/x/../chat/completions`: served 200; `encoded_path_too_long`: the same with a prompt over
  `--max-prompt-tokens`: the picker's 413 `prompt-too-long` (it parsed and limited it as chat);
  `encoded_slash`: `/v1%2Fchat/completions`: 400 `invalid-request` (Envoy's, as the picker's);
- `trailers`: an HTTP/2 (h2c) chat request whose body ends with trailers: served 200;
  `trailers_only`: headers, then trailers, no data: 400 `invalid-request`;
- `big_body`: a 3 MiB chat body, its bulk nested arrays in an ignored field: parsed off the
  picker's event loop (a parse worker process) and routed at once; the mock worker then answers
  with its own 1 MiB body limit (413 without the picker's reason header, with its x-worker-id);
- `session`: a sticky session (body or header id, a few reused, most new, some exactly 256
  characters): served 200; `session_too_long`: an id of 257+ characters: 400 `invalid-request`.
  The picker keeps at most --session-max-pins of them (soak.py checks);
- `colliding_id`: an `x-request-id` from a small pool (`abc`, `abc#1`, `req#2`, ...) shared by
  concurrent requests, some looking like ids the picker makes: served 200, and nothing leaks
  (soak.py's leak checks).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yarl
from soak_stack import ENVOY_MAX_BODY_BYTES, MAX_BODY_BYTES, MAX_PROMPT_TOKENS

from extproc.devstack.stack import MODEL

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.e2e.h2client import h2_request  # noqa: E402  (an h2c client that sends request trailers)

SLACK_S = 1.0  # a fault window is stretched by this much after recovery when judging answers
REQUEST_TIMEOUT_S = 60.0  # a request with no answer by then counts as unanswered
STALL_S = 5.0  # Envoy's message_timeout: an answer slower than this means something held the picker
BIG_BODY_BYTES = 3 * 1024 * 1024
SESSION_ID_MAX = 256  # the picker's --session-id-max-length (its default)

# kind -> share of the requests
MIX: dict[str, float] = {
    "chat": 0.12,
    "chat_stream": 0.18,
    "responses": 0.03,  # POST /v1/responses (the openai client's responses.create)
    "messages": 0.03,  # POST /v1/messages (Anthropic's Messages API: Claude Code)
    "completion": 0.06,
    "cancel_stream": 0.08,
    "cancel_early": 0.04,
    "invalid": 0.065,
    "unknown_model": 0.03,
    "body_too_large": 0.005,
    "prompt_too_long": 0.04,
    "envoy_body_too_large": 0.005,
    "big_body": 0.005,
    "owned_headers": 0.05,
    "encoded_path": 0.05,
    "encoded_path_too_long": 0.02,
    "encoded_slash": 0.02,
    "trailers": 0.03,
    "trailers_only": 0.01,
    "session": 0.07,
    "session_too_long": 0.02,
    "colliding_id": 0.04,
}
WORKER = None  # the answer's reason: a worker's own answer (x-worker-id, no dropped-reason header)
# kind -> the (status, reason) it is documented to get from a healthy stack
EXPECTED: dict[str, tuple[int, str | None]] = {
    "chat": (200, WORKER),
    "chat_stream": (200, WORKER),
    "responses": (200, WORKER),
    "messages": (200, WORKER),
    "completion": (200, WORKER),
    "cancel_stream": (200, WORKER),  # when the client reads an answer before closing
    "cancel_early": (200, WORKER),
    "invalid": (400, "invalid-request"),  # the picker
    "unknown_model": (404, "unknown-model"),  # the picker
    "body_too_large": (413, "body-too-large"),  # the picker: --max-body-bytes
    "prompt_too_long": (413, "prompt-too-long"),  # the picker: --max-prompt-tokens
    "envoy_body_too_large": (413, "body-too-large"),  # Envoy: request_body_buffer_limit
    "big_body": (413, WORKER),  # routed by the picker; the mock worker's own 1 MiB limit
    "owned_headers": (200, WORKER),
    "encoded_path": (200, WORKER),
    "encoded_path_too_long": (413, "prompt-too-long"),
    "encoded_slash": (400, "invalid-request"),  # Envoy (path_with_escaped_slashes_action: REJECT)
    "trailers": (200, WORKER),
    "trailers_only": (400, "invalid-request"),
    "session": (200, WORKER),
    "session_too_long": (400, "invalid-request"),
    "colliding_id": (200, WORKER),
}
# While the picker is bypassed (fail-open) its limits do not apply: the worker answers instead.
PICKER_BYPASSED: dict[str, frozenset[int]] = {
    "invalid": frozenset({400, 200}),  # the worker's own validation; it serves a body with no model
    "unknown_model": frozenset({404}),
    "body_too_large": frozenset({413}),  # over the worker's 1 MiB body limit
    "envoy_body_too_large": frozenset({413}),  # Envoy streams it to the worker: its 1 MiB limit
    "prompt_too_long": frozenset({400}),  # over the worker's max_model_len
    "encoded_path_too_long": frozenset({400}),
    "trailers_only": frozenset({400}),  # a POST without a body
    "session_too_long": frozenset({200}),  # the worker has no sessions
}
# While a worker is down (killed, restarting), requests routed to it get Envoy's own answers: its
# local reply (503 `upstream-unavailable`), or a stream cut after its start.
WORKER_FAULT_STATUSES = frozenset({502, 503})
WORKER_FAULT_REASONS = frozenset({None, "upstream-unavailable"})
SMALL_KINDS = frozenset(MIX) - {"body_too_large", "envoy_body_too_large", "big_body", "cancel_stream"}

SYSTEM_PROMPTS = [
    f"System prompt {k}: you are assistant number {k} of the soak test. "
    + " ".join(f"rule {k}.{j}: answer briefly and stay on topic {j * k}." for j in range(14))
    for k in range(8)
]
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
ENCODED_PATHS = ("/v1/chat/%63ompletions", "/v1//chat/completions", "/v1/x/../chat/completions")
COLLIDING_IDS = ("abc", "abc#1", "abc#2", "req#1", "req#2", "soak", "soak#1")
REUSED_SESSIONS = tuple(f"soak-session-{i}" for i in range(20))


# --- requests --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    index: int
    kind: str
    start_s: float
    end_s: float
    status: int | None  # None: no HTTP status read (a cancel before the answer, a transport error)
    outcome: str  # ok, status, truncated, cancelled, bad-body, error, unanswered
    worker: str | None = None  # x-worker-id of a served answer
    reason: str | None = None  # the picker's (or Envoy's) x-gateway-request-dropped-reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """One request as sent: `path` byte for byte (not normalised by the client), extra headers, and
    for HTTP/2 the trailers that end its body (None: HTTP/1.1)."""

    kind: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    trailers: tuple[tuple[str, str], ...] | None = None


def request_plan(index: int, seed: int, dead_endpoint: str = "127.0.0.1:9") -> Plan:
    """Request `index`: the same for a given seed whatever the timing (the first ones one of each
    kind, then drawn by `MIX`). `dead_endpoint`: where nothing listens (the destination hostile
    headers name)."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    if index < len(MIX):  # every kind at least once, however few the requests
        kind = list(MIX)[index]
    system = rng.choice(SYSTEM_PROMPTS)
    user = f"request {index}: " + " ".join(rng.choices(WORDS, k=rng.randint(3, 60)))
    max_tokens = rng.randint(2, 8)
    chat = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
    }
    too_long = chat | {"messages": [{"role": "user", "content": "y " * (MAX_PROMPT_TOKENS + 500)}]}
    path, headers, trailers = "/v1/chat/completions", {}, None
    if kind in ("chat", "colliding_id", "owned_headers", "trailers"):
        body: Any = chat
    elif kind in ("chat_stream", "cancel_early"):
        body = chat | {"stream": True}
    elif kind == "cancel_stream":
        body = chat | {"stream": True, "max_tokens": 200}  # long enough to be cut mid-stream
    elif kind == "completion":
        path, body = "/v1/completions", {"model": MODEL, "prompt": system + user, "max_tokens": max_tokens}
    elif kind == "responses":
        path = "/v1/responses"
        body = {"model": MODEL, "instructions": system, "input": user, "max_output_tokens": max_tokens}
    elif kind == "messages":
        path = "/v1/messages"
        body = {"model": MODEL, "system": system, "messages": [{"role": "user", "content": user}],
                "max_tokens": max_tokens, "stream": rng.random() < 0.5}  # fmt: skip
    elif kind == "invalid":
        raw = rng.choice([b'{"model": "demo-model", "messages": [', b"not json", b'["a list"]'])
        if rng.random() < 0.3:
            raw = json.dumps({"messages": chat["messages"], "max_tokens": 4}).encode()  # no model
        return Plan(kind, path, raw)
    elif kind == "unknown_model":
        body = chat | {"model": "no-such-model"}
    elif kind == "body_too_large":
        body = chat | {"messages": [{"role": "user", "content": "x" * (MAX_BODY_BYTES + 4096)}]}
    elif kind in ("prompt_too_long", "encoded_path_too_long"):
        body = too_long
    elif kind == "envoy_body_too_large":
        body = chat | {"messages": [{"role": "user", "content": "z" * (ENVOY_MAX_BODY_BYTES + 64 * 1024)}]}
    elif kind == "big_body":
        return Plan(kind, path, big_chat_body(chat, BIG_BODY_BYTES))
    elif kind in ("encoded_path", "encoded_slash"):
        path = rng.choice(ENCODED_PATHS) if kind == "encoded_path" else "/v1%2Fchat/completions"
        body = chat
    elif kind in ("session", "session_too_long"):
        if kind == "session_too_long":
            sid = f"long-{index}-" + "s" * (SESSION_ID_MAX + rng.choice((1, 100, 5000)))
        elif rng.random() < 0.3:
            sid = rng.choice(REUSED_SESSIONS)
        else:  # a new session, some exactly as long as allowed
            sid = f"s-{seed}-{index}" + ("-" * SESSION_ID_MAX if rng.random() < 0.1 else "")
            sid = sid[:SESSION_ID_MAX]
        if rng.random() < 0.5:
            body = chat | {"nvext": {"session_control": {"session_id": sid}}}
        else:
            body, headers = chat, {"x-session-id": sid}
    elif kind == "trailers_only":
        return Plan(kind, path, b"", {"content-type": "application/json"}, (("x-checksum", "none"),))
    else:
        raise ValueError(f"unknown request kind {kind!r}")
    if kind == "colliding_id":
        headers = {"x-request-id": rng.choice(COLLIDING_IDS)}
    elif kind == "owned_headers":
        headers = {
            "x-gateway-destination-endpoint": dead_endpoint,
            "x-gateway-destination-endpoint-served": dead_endpoint,
            "x-data-parallel-rank": str(rng.randint(1, 7)),
            "x-prefill-endpoint": dead_endpoint,
            "x-extproc-worker": "w-elsewhere",
        }
    if kind == "trailers":
        trailers = (("x-checksum", f"{index:08x}"),)
    return Plan(kind, path, json.dumps(body).encode(), headers, trailers)


def big_chat_body(chat: dict[str, Any], size_bytes: int) -> bytes:
    """`chat` of about `size_bytes`: its bulk small nested arrays (20 deep) in a field nobody reads."""
    unit = "[" * 20 + "]" * 20
    junk = "[" + ",".join([unit] * (size_bytes // (len(unit) + 1))) + "]"
    return (json.dumps(chat)[:-1] + ', "soak_metadata": ' + junk + "}").encode()


async def send(
    session: aiohttp.ClientSession,
    base: str,
    index: int,
    seed: int,
    host: str,
    port: int,
    dead_endpoint: str = "127.0.0.1:9",
) -> Result:
    """Send request `index` and classify what came back. Never raises (except cancellation)."""
    plan = request_plan(index, seed, dead_endpoint)
    start = time.monotonic()
    result = Result(index, plan.kind, start, start, None, "error")
    try:
        if plan.kind == "cancel_early":
            delay_s = random.Random(index).uniform(0.0, 0.02)
            await _cancel_before_answer(host, port, plan.path, plan.body, delay_s)
            result.outcome = "cancelled"
        elif plan.trailers is not None:
            await asyncio.wait_for(_exchange_h2(host, port, plan, result), REQUEST_TIMEOUT_S)
        else:
            await asyncio.wait_for(_exchange(session, base, plan, result), REQUEST_TIMEOUT_S)
    except TimeoutError:
        result.outcome, result.detail = "unanswered", f"no answer within {REQUEST_TIMEOUT_S:.0f} s"
    except aiohttp.ClientPayloadError as exc:
        result.outcome, result.detail = "truncated", str(exc)[:200]
    except (aiohttp.ClientError, OSError) as exc:
        result.outcome, result.detail = "error", f"{type(exc).__name__}: {exc}"[:200]
    result.end_s = time.monotonic()
    return result


async def _exchange(session: aiohttp.ClientSession, base: str, plan: Plan, result: Result) -> None:
    headers = {"content-type": "application/json", **plan.headers}
    url = yarl.URL(base + plan.path, encoded=True)  # the path as written: no client normalises it
    async with session.post(url, data=plan.body, headers=headers) as response:
        result.status = response.status
        result.worker = response.headers.get("x-worker-id")
        result.reason = response.headers.get("x-gateway-request-dropped-reason")
        if plan.kind == "cancel_stream" and response.status == 200:
            await response.content.readany()  # the first chunk, then the client goes away
            response.close()
            result.outcome = "cancelled"
            return
        text = (await response.read()).decode(errors="replace")
    _classify(plan.kind, text, result)


async def _exchange_h2(host: str, port: int, plan: Plan, result: Result) -> None:
    """One h2c request whose body (possibly empty) ends with trailers."""
    headers = [("content-type", "application/json"), *plan.headers.items()]
    answer = await h2_request(
        host, port, plan.path, headers=headers, body=plan.body, trailers=plan.trailers or ()
    )
    result.status = answer.status
    result.worker = answer.headers.get("x-worker-id")
    result.reason = answer.headers.get("x-gateway-request-dropped-reason")
    if answer.reset:
        result.outcome, result.detail = "truncated", "the stream was reset"
        return
    _classify(plan.kind, answer.body.decode(errors="replace"), result)


def _classify(kind: str, text: str, result: Result) -> None:
    if result.status != 200:
        result.outcome, result.detail = "status", text[:200]
    elif kind in ("chat_stream", "cancel_stream"):
        complete = text.rstrip().endswith("data: [DONE]")
        result.outcome = "ok" if complete else "bad-body"
        result.detail = "" if complete else f"stream without [DONE]: {text[-200:]!r}"
    elif kind == "messages" and text.startswith("event:"):  # a streamed Anthropic message
        complete = "event: message_stop" in text
        result.outcome = "ok" if complete else "bad-body"
        result.detail = "" if complete else f"stream without message_stop: {text[-200:]!r}"
    else:
        answer_key = {"responses": "output", "messages": "content"}.get(kind, "choices")
        try:
            ok = bool(json.loads(text).get(answer_key))
        except (ValueError, AttributeError):
            ok = False
        result.outcome = "ok" if ok else "bad-body"
        result.detail = "" if ok else text[:200]


async def _cancel_before_answer(host: str, port: int, path: str, body: bytes, delay_s: float) -> None:
    """Write a whole request on a fresh connection, then close it without reading the answer."""
    _reader, writer = await asyncio.open_connection(host, port)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        await asyncio.sleep(delay_s)  # a random moment in the request's life, not a synchronisation
    finally:
        writer.transport.abort()  # RST, as a client that vanishes


# --- fault windows and judging ---------------------------------------------------------------------


@dataclass(slots=True)
class Fault:
    kind: str  # kill, nats, picker
    target: str
    at_request: int  # injected once this many requests have started
    injected_s: float | None = None
    recovered_s: float | None = None  # the process is back (how the picker resynchronised: `recovery`)
    recovery: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def overlaps(self, result: Result, slack_s: float) -> bool:
        if self.injected_s is None:
            return False
        end = (self.recovered_s if self.recovered_s is not None else float("inf")) + slack_s
        return result.start_s <= end and result.end_s >= self.injected_s


def _from_worker(result: Result) -> bool:
    return result.reason is None and result.worker is not None


def judge(result: Result, faults: Sequence[Fault]) -> str | None:
    """Why `result` is an acceptable answer ("expected", "cancelled", "worker-fault",
    "picker-bypassed"), or None when it is not."""
    if result.outcome == "cancelled":
        return "cancelled"
    status, reason = EXPECTED[result.kind]
    answered = result.outcome in ("ok", "status")
    source_ok = _from_worker(result) if reason is WORKER else result.reason == reason
    if answered and result.status == status and source_ok:
        return "expected"
    during = {f.kind for f in faults if f.overlaps(result, SLACK_S)}
    worker_fault = result.status in WORKER_FAULT_STATUSES and result.reason in WORKER_FAULT_REASONS
    if "kill" in during and (worker_fault or result.outcome == "truncated"):
        return "worker-fault"
    if (
        "picker" in during
        and answered
        and _from_worker(result)
        and result.status in PICKER_BYPASSED.get(result.kind, frozenset())
    ):
        return "picker-bypassed"
    return None
