"""The soak test's requests: a fixed mix of kinds, each with the answer it is documented to get,
and the judge that accepts an answer or not given the faults the request overlapped."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from soak_stack import ENVOY_MAX_BODY_BYTES, MAX_BODY_BYTES, MAX_PROMPT_TOKENS

from extproc.devstack.stack import MODEL

SLACK_S = 1.0  # a fault window is stretched by this much after recovery when judging answers
REQUEST_TIMEOUT_S = 60.0  # a request with no answer by then counts as unanswered

# kind -> share of the requests
MIX: dict[str, float] = {
    "chat": 0.26,
    "chat_stream": 0.26,
    "completion": 0.08,
    "cancel_stream": 0.10,
    "cancel_early": 0.05,
    "invalid": 0.10,
    "unknown_model": 0.04,
    "body_too_large": 0.04,
    "prompt_too_long": 0.05,
    "envoy_body_too_large": 0.02,
}
# kind -> the status it is documented to get from a healthy stack
EXPECTED: dict[str, int] = {
    "chat": 200,
    "chat_stream": 200,
    "completion": 200,
    "cancel_stream": 200,  # when the client reads an answer before closing
    "cancel_early": 200,
    "invalid": 400,  # the picker: invalid-request
    "unknown_model": 404,  # the picker: unknown-model
    "body_too_large": 413,  # the picker: body-too-large (--max-body-bytes)
    "prompt_too_long": 413,  # the picker: prompt-too-long (--max-prompt-tokens)
    "envoy_body_too_large": 413,  # Envoy: request_body_buffer_limit
}
# While the picker is bypassed (fail-open) its limits do not apply: the worker answers instead.
PICKER_BYPASSED: dict[str, frozenset[int]] = {
    "invalid": frozenset({400, 200}),  # the worker's own validation; it serves a body with no model
    "unknown_model": frozenset({404}),
    "body_too_large": frozenset({400}),  # over the worker's max_model_len
    "prompt_too_long": frozenset({400}),
    "envoy_body_too_large": frozenset({400, 413}),  # streamed to the worker: its 1 MiB body limit
}
# While a worker is down (killed, restarting) requests routed to it get Envoy's own answers.
WORKER_FAULT_STATUSES = frozenset({502, 503})

SYSTEM_PROMPTS = [
    f"System prompt {k}: you are assistant number {k} of the soak test. "
    + " ".join(f"rule {k}.{j}: answer briefly and stay on topic {j * k}." for j in range(14))
    for k in range(8)
]
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]


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
    reason: str | None = None  # the picker's x-gateway-request-dropped-reason
    detail: str = ""


def request_plan(index: int, seed: int) -> tuple[str, str, bytes]:
    """(kind, path, body) of request `index`: the same for a given seed whatever the timing."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    system = rng.choice(SYSTEM_PROMPTS)
    user = f"request {index}: " + " ".join(rng.choices(WORDS, k=rng.randint(3, 60)))
    max_tokens = rng.randint(2, 8)
    chat = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
    }
    path = "/v1/chat/completions"
    if kind == "chat":
        body: Any = chat
    elif kind in ("chat_stream", "cancel_early"):
        body = chat | {"stream": True}
    elif kind == "cancel_stream":
        body = chat | {"stream": True, "max_tokens": 200}  # long enough to be cut mid-stream
    elif kind == "completion":
        path, body = "/v1/completions", {"model": MODEL, "prompt": system + user, "max_tokens": max_tokens}
    elif kind == "invalid":
        raw = rng.choice([b'{"model": "demo-model", "messages": [', b"not json", b'["a list"]'])
        if rng.random() < 0.3:
            raw = json.dumps({"messages": chat["messages"], "max_tokens": 4}).encode()  # no model
        return kind, path, raw
    elif kind == "unknown_model":
        body = chat | {"model": "no-such-model"}
    elif kind == "body_too_large":
        body = chat | {"messages": [{"role": "user", "content": "x" * (MAX_BODY_BYTES + 4096)}]}
    elif kind == "prompt_too_long":
        body = chat | {"messages": [{"role": "user", "content": "y " * (MAX_PROMPT_TOKENS + 500)}]}
    elif kind == "envoy_body_too_large":
        body = chat | {"messages": [{"role": "user", "content": "z" * (ENVOY_MAX_BODY_BYTES + 64 * 1024)}]}
    else:
        raise ValueError(f"unknown request kind {kind!r}")
    return kind, path, json.dumps(body).encode()


async def send(
    session: aiohttp.ClientSession, base: str, index: int, seed: int, host: str, port: int
) -> Result:
    """Send request `index` and classify what came back. Never raises (except cancellation)."""
    kind, path, body = request_plan(index, seed)
    start = time.monotonic()
    result = Result(index, kind, start, start, None, "error")
    try:
        if kind == "cancel_early":
            await _cancel_before_answer(host, port, path, body, random.Random(index).uniform(0.0, 0.02))
            result.outcome = "cancelled"
        else:
            await asyncio.wait_for(_exchange(session, base + path, kind, body, result), REQUEST_TIMEOUT_S)
    except TimeoutError:
        result.outcome, result.detail = "unanswered", f"no answer within {REQUEST_TIMEOUT_S:.0f} s"
    except aiohttp.ClientPayloadError as exc:
        result.outcome, result.detail = "truncated", str(exc)[:200]
    except (aiohttp.ClientError, OSError) as exc:
        result.outcome, result.detail = "error", f"{type(exc).__name__}: {exc}"[:200]
    result.end_s = time.monotonic()
    return result


async def _exchange(session: aiohttp.ClientSession, url: str, kind: str, body: bytes, result: Result) -> None:
    headers = {"content-type": "application/json"}
    async with session.post(url, data=body, headers=headers) as response:
        result.status = response.status
        result.worker = response.headers.get("x-worker-id")
        result.reason = response.headers.get("x-gateway-request-dropped-reason")
        if kind == "cancel_stream" and response.status == 200:
            await response.content.readany()  # the first chunk, then the client goes away
            response.close()
            result.outcome = "cancelled"
            return
        text = (await response.read()).decode(errors="replace")
    if result.status != 200:
        result.outcome, result.detail = "status", text[:200]
    elif kind in ("chat_stream", "cancel_stream"):
        complete = text.rstrip().endswith("data: [DONE]")
        result.outcome = "ok" if complete else "bad-body"
        result.detail = "" if complete else f"stream without [DONE]: {text[-200:]!r}"
    else:
        try:
            ok = bool(json.loads(text).get("choices"))
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


def judge(result: Result, faults: Sequence[Fault]) -> str | None:
    """Why `result` is an acceptable answer ("expected", "cancelled", "worker-fault",
    "picker-bypassed"), or None when it is not."""
    if result.outcome == "cancelled":
        return "cancelled"
    if result.outcome in ("ok", "status") and result.status == EXPECTED[result.kind]:
        return "expected"
    during = {f.kind for f in faults if f.overlaps(result, SLACK_S)}
    if "kill" in during and (
        (result.status in WORKER_FAULT_STATUSES and result.reason is None) or result.outcome == "truncated"
    ):
        return "worker-fault"
    if (
        "picker" in during
        and result.outcome in ("ok", "status")
        and result.status in PICKER_BYPASSED.get(result.kind, frozenset())
    ):
        return "picker-bypassed"
    return None
