"""The mock worker: an OpenAI-compatible HTTP server in vLLM's wire format over the simulated engine.

Owns the async edge only: it parses requests, tokenizes them, feeds `extproc.sim.engine.Engine`,
and runs passes in real time (sleeping a pass's duration divided by `speedup` IS the simulated GPU
time), then encodes tokens as vLLM does (JSON or SSE) and exposes vLLM's Prometheus metric names.
Every response carries `x-worker-id`; generation responses also `x-prefix-cache-hit-tokens`, the
request's cached prefix in tokens. A client disconnect cancels the request and frees its blocks.
Disaggregated prefill/decode roles (`--role`, the prefill header, the KV transfer): `disagg.py`.
The Responses API (`/v1/responses`, answers stored in memory) and the Anthropic Messages API
(`/v1/messages`): `mock_responses.py`, `mock_anthropic.py`.

    python -m extproc mock-worker --port 8001 --worker-id w0 --model demo-model --speedup 10

Sections, top to bottom: config, wire format (parsing and vLLM response shapes, `ApiError`), the
real-time `EngineDriver`, `WorkerMetrics`, the HTTP handlers and `make_app`, the CLI. Longer than
our ~300-line habit only because it had to stay one file for now; the wire format and the metrics
are the natural cuts (`openai_wire.py`, `worker_metrics.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import math
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from extproc.runtime.ports_file import write_ports_file
from extproc.sim import mock_anthropic, mock_responses
from extproc.sim.disagg import (
    PREFILL_SOURCE_HEADER,
    Disaggregation,
    DisaggWorkerConfig,
    add_disagg_arguments,
    disagg_config_from_args,
    wants_remote_decode,
)
from extproc.sim.engine import Engine, EngineConfig, PassEntry
from extproc.sim.kv_events import (
    KV_EVENT_TRANSPORTS,
    KV_EVENTS_OFF,
    KvEventsConfig,
    ZmqKvEvents,
    make_kv_event_publisher,
)
from extproc.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class TokenizerLike(Protocol):
    """What the mock worker needs from a tokenizer (`extproc.tokenizer.ByteTokenizer` fits)."""

    def encode_text(self, text: str) -> list[int]: ...

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Any = None, add_generation_prompt: bool = True
    ) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class MockWorkerConfig:
    """One simulated worker: identity, served model, engine shape and real-time pacing."""

    worker_id: str = "w0"
    model: str = "demo-model"
    engine: EngineConfig = field(default_factory=EngineConfig)
    speedup: float = 1.0  # simulated ms per real ms
    default_max_tokens: int = 16  # output tokens when the request names no limit
    max_output_tokens: int = 4096  # cap on any request's output tokens
    max_model_len: int | None = None  # prompt + output limit; None = the pool's capacity in tokens
    kv_events: KvEventsConfig = field(default_factory=KvEventsConfig)  # off unless asked (the CLI: zmq)
    disagg: DisaggWorkerConfig = field(default_factory=DisaggWorkerConfig)  # role: both (aggregated)

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup must be positive, got {self.speedup!r}")
        if self.default_max_tokens < 1 or self.max_output_tokens < 1:
            raise ValueError("default_max_tokens and max_output_tokens must be at least 1")
        capacity = self.engine.capacity_tokens
        if self.max_model_len is not None and not 2 <= self.max_model_len <= capacity:
            # longer sequences could outgrow the pool and never be re-admitted after preemption
            raise ValueError(
                f"max_model_len must be in [2, {capacity}] (the pool's tokens), got {self.max_model_len}"
            )

    @property
    def effective_max_model_len(self) -> int:
        return self.max_model_len or self.engine.capacity_tokens


class ApiError(Exception):
    """A request answered with vLLM's error JSON: `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, err_type: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.err_type, self.message, self.param = status, err_type, message, param

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}
        return {"error": error}


def _bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


FILLER_TEXT = " tok"  # the text of every generated token


@dataclass(frozen=True, slots=True)
class WireRequest:
    """One parsed generation request and its encoders to vLLM's OpenAI response shapes."""

    chat: bool  # /v1/chat/completions, else /v1/completions
    request_id: str
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    finish_reason: str  # "length" when the client set the limit, else "stop" (as if at end of sequence)
    stream: bool
    include_usage: bool
    cache_salt: str | None = None  # vLLM's per-tenant prefix-cache isolation (its blocks hash under it)
    created: int = field(default_factory=lambda: int(time.time()))

    def _usage(self, emitted: int) -> dict[str, int]:
        n = len(self.prompt_token_ids)
        return {"prompt_tokens": n, "total_tokens": n + emitted, "completion_tokens": emitted}

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def full_response(self, emitted: int) -> dict[str, Any]:
        text = FILLER_TEXT * emitted
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
            }
        else:
            choice = {"index": 0, "text": text}
        choice |= {"logprobs": None, "finish_reason": self.finish_reason, "stop_reason": None}
        return self._envelope([choice], chunk=False) | {"usage": self._usage(emitted)}

    def stream_head(self) -> bytes:
        """Chat streams open with an empty assistant delta; completion streams start with the first token."""
        if not self.chat:
            return b""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        return _sse(self._envelope([choice | {"finish_reason": None}], chunk=True))

    def token_chunk(self, finished: bool) -> bytes:
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"content": FILLER_TEXT}}
            if self.chat
            else {"index": 0, "text": FILLER_TEXT}
        )
        choice |= {"logprobs": None, "finish_reason": self.finish_reason if finished else None}
        if finished:
            choice["stop_reason"] = None
        return _sse(self._envelope([choice], chunk=True))

    def stream_tail(self, emitted: int) -> bytes:
        if not self.include_usage:
            return b"data: [DONE]\n\n"
        return _sse(self._envelope([], chunk=True) | {"usage": self._usage(emitted)}) + b"data: [DONE]\n\n"


def _sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _read_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad_request(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _bad_request("request body must be a JSON object")
    return body


def _max_tokens(body: Mapping[str, Any], keys: Sequence[str], config: MockWorkerConfig) -> tuple[int, str]:
    """Output tokens to generate and the finish reason that ends them."""
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _bad_request(f"{key} must be an integer of at least 1, got {value!r}", key)
        return min(value, config.max_output_tokens), "length"
    return min(config.default_max_tokens, config.max_output_tokens), "stop"


def _completion_prompt(prompt: Any, tokenizer: TokenizerLike) -> list[int]:
    """A completions `prompt`: a string, a list of token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode_text(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in prompt)
    ):
        return list(prompt)
    raise _bad_request(
        "prompt must be a string, a list of token ids, or a list holding one of those", "prompt"
    )


def _chat_prompt(body: Mapping[str, Any], tokenizer: TokenizerLike) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _bad_request("messages must be a non-empty list of message objects", "messages")
    try:
        return tokenizer.encode_chat(
            messages,
            tools=body.get("tools"),
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
        )
    except (ValueError, TypeError) as exc:
        raise _bad_request(f"cannot render the conversation: {exc}", "messages") from exc


class EngineDriver:
    """Runs the engine's passes in real time; one queue of pass entries per request."""

    def __init__(self, engine: Engine, speedup: float) -> None:
        self.engine = engine
        self.speedup = speedup
        self._queues: dict[str, asyncio.Queue[tuple[PassEntry, float] | None]] = {}
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()

    def now_ms(self) -> float:
        """Simulated time: real time since start, times `speedup`."""
        return (time.monotonic() - self._t0) * 1000.0 * self.speedup

    def submit(
        self, request_id: str, token_ids: Sequence[int], max_tokens: int, cache_salt: str | None = None
    ) -> asyncio.Queue:
        """Queue a request; its queue yields (entry, pass end in simulated ms), None if the engine failed."""
        self.engine.add_request(request_id, token_ids, max_tokens, self.now_ms(), cache_salt=cache_salt)
        queue: asyncio.Queue[tuple[PassEntry, float] | None] = asyncio.Queue()
        self._queues[request_id] = queue
        self._wake.set()
        return queue

    def cancel(self, request_id: str) -> None:
        """Forget a request (finished, failed or abandoned); frees its blocks if it is still running."""
        self._queues.pop(request_id, None)
        if self.engine.cancel(request_id):
            self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                p = self.engine.next_pass(self.now_ms())
                if p is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await asyncio.sleep(p.duration_ms / 1000.0 / self.speedup)
                for entry in self.engine.finish_pass(p):
                    queue = self._queues.get(entry.request_id)
                    if queue is not None:
                        queue.put_nowait((entry, p.end_ms))
            except Exception:
                log.exception(
                    "engine pass failed; failing %d requests and resetting the engine", len(self._queues)
                )
                for queue in self._queues.values():
                    queue.put_nowait(None)
                self._queues.clear()
                listener = self.engine.cache.listener
                self.engine = Engine(self.engine.config, listener)
                if listener is not None:
                    listener.on_cleared()  # the new engine starts with an empty cache


# vLLM's histogram buckets, in seconds
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class WorkerMetrics:
    """vLLM's metric names, labelled `model_name`, in a registry of this worker's own.

    Request latencies are observed at this edge in real seconds (what clients see); engine state
    (queues, KV usage, prefix-cache counters in tokens) is read from the engine at scrape time.
    """

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, model: str, engine: Callable[[], Engine]) -> None:
        self.model = model
        self.registry = CollectorRegistry()
        labels, r = ["model_name"], self.registry
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r
        ).labels(model)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", labels, registry=r
        ).labels(model)
        self._success = Counter(
            "vllm:request_success",
            "Successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS_S,
            registry=r,
        ).labels(model)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            labels,
            buckets=E2E_BUCKETS_S,
            registry=r,
        ).labels(model)
        r.register(_EngineCollector(model, engine))

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self._ttft.observe(ttft_s)

    def finished(self, e2e_s: float, finish_reason: str) -> None:
        self._e2e.observe(e2e_s)
        self._success.labels(self.model, finish_reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Engine state as vLLM's gauges and prefix-cache counters, read at scrape time."""

    def __init__(self, model: str, engine: Callable[[], Engine]) -> None:
        self._model = model
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self._engine()
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in model execution batches.", e.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", e.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.cache.usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric([self._model], value)
            yield gauge
        for name, doc, value in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens.", e.cache.queried_tokens),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens.", e.cache.hit_tokens),
            ("vllm:num_preemptions", "Cumulative number of preemptions.", e.num_preemptions),
        ):
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric([self._model], value)
            yield counter


class MockWorker:
    """HTTP handlers of one worker; state lives in its `EngineDriver`."""

    def __init__(self, config: MockWorkerConfig, tokenizer: TokenizerLike) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.kv_events = make_kv_event_publisher(config.kv_events, config.engine.block_size)
        listener = self.kv_events.listener if self.kv_events is not None else None
        self.driver = EngineDriver(Engine(config.engine, listener), config.speedup)
        self.metrics = WorkerMetrics(config.model, lambda: self.driver.engine)
        self.responses = mock_responses.ResponseStore()  # Responses API answers stored here
        self.disagg = Disaggregation(
            config.disagg,
            worker_id=config.worker_id,
            model=config.model,
            block_size=config.engine.block_size,
            registry=self.metrics.registry,
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = _read_json(await request.read())
        return await self._generate(request, self._wire_request(body, chat=True), body)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = _read_json(await request.read())
        return await self._generate(request, self._wire_request(body, chat=False), body)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = _read_json(await request.read())
        self._check_model(body)
        if "messages" in body:
            tokens = _chat_prompt(body, self.tokenizer)
        elif isinstance(body.get("prompt"), str):
            tokens = self.tokenizer.encode_text(body["prompt"])
        else:
            raise _bad_request("tokenize needs a string prompt or a messages list")
        max_len = self.config.effective_max_model_len
        return web.json_response(
            {"count": len(tokens), "max_model_len": max_len, "tokens": tokens, "token_strs": None}
        )

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.effective_max_model_len,
            "role": self.config.disagg.role,  # not vLLM's: prefill, decode or both (aggregated)
        }
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": self.metrics.content_type}
        )

    def _check_model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model", self.config.model)
        if not isinstance(model, str):
            raise _bad_request("model must be a string", "model")
        if model != self.config.model:
            raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
        return model

    def _wire_request(self, body: Mapping[str, Any], *, chat: bool) -> WireRequest:
        model = self._check_model(body)
        if chat:
            prompt = _chat_prompt(body, self.tokenizer)
            max_tokens, finish_reason = _max_tokens(
                body, ("max_completion_tokens", "max_tokens"), self.config
            )
        else:
            prompt = _completion_prompt(body.get("prompt"), self.tokenizer)
            max_tokens, finish_reason = _max_tokens(body, ("max_tokens",), self.config)
        if body.get("n", 1) != 1:
            raise _bad_request("the mock worker generates one choice per request (n=1)", "n")
        stream, options = body.get("stream", False), body.get("stream_options")
        if not isinstance(stream, bool):
            raise _bad_request("stream must be a boolean", "stream")
        if options is not None and not (stream and isinstance(options, dict)):
            raise _bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        limit = self.config.effective_max_model_len
        if len(prompt) + max_tokens > limit:
            raise _bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                f"{max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
                "messages" if chat else "prompt",
            )
        salt = body.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise _bad_request("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        include_usage = bool(options and options.get("include_usage"))
        return WireRequest(
            chat, request_id, model, prompt, max_tokens, finish_reason, stream, include_usage, salt
        )

    async def _generate(
        self, request: web.Request, wire: WireRequest, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        """Prefill (maybe remotely), submit, relay pass entries until the last token, answer; the
        request is freed however it ends."""
        progress = _Progress(time.monotonic(), self.driver.now_ms())
        progress.prefill_source = await self.disagg.prefill(request, body, wire.prompt_token_ids, self.driver)
        try:
            queue = self.driver.submit(
                wire.request_id, wire.prompt_token_ids, wire.max_tokens, wire.cache_salt
            )
        except ValueError as exc:  # an empty prompt, or RequestTooLarge
            raise _bad_request(str(exc)) from exc
        response: web.StreamResponse | None = None
        try:
            while True:
                item = await queue.get()
                if item is None:
                    progress.outcome = "engine-failed"
                    if response is not None:
                        return response  # headers are out: the stream just ends, without [DONE]
                    raise ApiError(500, "InternalServerError", "the simulated engine failed")
                entry, end_ms = item
                if progress.cached_tokens is None:
                    progress.cached_tokens = entry.cached_tokens or 0
                    if wire.stream:
                        response = await self._start_stream(request, wire, progress)
                if entry.emits_token:
                    self._count_token(wire, progress, end_ms)
                    if response is not None:
                        await response.write(wire.token_chunk(entry.finished))
                if entry.finished:
                    break
            progress.outcome = wire.finish_reason
            self.metrics.finished(time.monotonic() - progress.start_s, wire.finish_reason)
            if response is None:
                answer = wire.full_response(progress.emitted)
                if wants_remote_decode(body):
                    answer["kv_transfer_params"] = self.disagg.prefill_answer_params(
                        request, wire.prompt_token_ids
                    )
                return web.json_response(answer, headers=_progress_headers(progress))
            await response.write(wire.stream_tail(progress.emitted))
            await response.write_eof()
            return response
        except ConnectionError:
            progress.outcome = "client-disconnected"
            return response or web.Response(status=499)
        finally:
            self.driver.cancel(wire.request_id)
            log.info(
                "request %s %s prompt_tokens=%d prefill=%s cached_tokens=%s ttft_ms=%.1f "
                "sim_ttft_ms=%.1f output_tokens=%d",
                wire.request_id,
                progress.outcome,
                len(wire.prompt_token_ids),
                progress.prefill_source,
                progress.cached_tokens,
                progress.ttft_s * 1000.0,
                progress.sim_ttft_ms,
                progress.emitted,
            )

    def _count_token(self, wire: WireRequest, progress: _Progress, pass_end_ms: float) -> None:
        progress.emitted += 1
        self.metrics.generation_tokens.inc()
        if progress.emitted == 1:
            progress.ttft_s = time.monotonic() - progress.start_s
            progress.sim_ttft_ms = pass_end_ms - progress.arrival_ms
            self.metrics.first_token(len(wire.prompt_token_ids), progress.ttft_s)

    async def _start_stream(
        self, request: web.Request, wire: WireRequest, progress: _Progress
    ) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        response = web.StreamResponse(headers=headers | _progress_headers(progress))
        await response.prepare(request)
        head = wire.stream_head()
        if head:
            await response.write(head)
        return response


WORKER = web.AppKey("mock_worker", MockWorker)


@dataclass(slots=True)
class _Progress:
    """What one request has got so far, for its answer and its log line (NaN: no first token yet)."""

    start_s: float  # monotonic, real
    arrival_ms: float  # simulated
    cached_tokens: int | None = None  # set when first admitted
    emitted: int = 0
    ttft_s: float = math.nan
    sim_ttft_ms: float = math.nan
    outcome: str = "cancelled"
    prefill_source: str = ""  # remote, local or local-fallback: see disagg.py


def _progress_headers(progress: _Progress) -> dict[str, str]:
    """The cached prefix (received KV blocks included) and where the prompt was prefilled."""
    return {
        "x-prefix-cache-hit-tokens": str(progress.cached_tokens or 0),
        PREFILL_SOURCE_HEADER: progress.prefill_source,
    }


@web.middleware
async def _api_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """The one place ApiError becomes vLLM's error JSON."""
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status)


def make_app(config: MockWorkerConfig, *, tokenizer: TokenizerLike | None = None) -> web.Application:
    """The worker as an aiohttp application (the engine loop starts and stops with it)."""
    if tokenizer is None:
        from extproc.request.tokenizer import ByteTokenizer

        tokenizer = ByteTokenizer()
    worker = MockWorker(config, tokenizer)
    app = web.Application(middlewares=[_api_errors])
    app[WORKER] = worker

    async def add_worker_id(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-worker-id"] = config.worker_id

    async def kv_events(app: web.Application) -> AsyncIterator[None]:
        if worker.kv_events is None:
            yield
            return
        await worker.kv_events.start()
        try:
            yield
        finally:
            await worker.kv_events.stop()

    async def engine_loop(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(worker.driver.run(), name=f"engine-{config.worker_id}")
        yield
        await cancel_and_wait(task)

    async def close_disagg(app: web.Application) -> None:
        await worker.disagg.close()

    app.on_response_prepare.append(add_worker_id)
    app.on_cleanup.append(close_disagg)
    app.cleanup_ctx.append(kv_events)  # before the engine loop, so it stops after it
    app.cleanup_ctx.append(engine_loop)
    app.router.add_post("/v1/chat/completions", worker.chat_completions)
    app.router.add_post("/v1/completions", worker.completions)
    app.router.add_post("/v1/responses", functools.partial(mock_responses.create, worker))
    app.router.add_get("/v1/responses/{response_id}", functools.partial(mock_responses.retrieve, worker))
    app.router.add_post("/v1/messages", functools.partial(mock_anthropic.create, worker))
    app.router.add_post("/tokenize", worker.tokenize)
    app.router.add_get("/v1/models", worker.models)
    app.router.add_get("/health", worker.health)
    app.router.add_get("/metrics", worker.prometheus)
    return app


def add_mock_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The `mock-worker` flags; engine defaults are Dynamo's mocker defaults."""
    d, e = MockWorkerConfig(), EngineConfig()
    flags: list[tuple[str, type, object, str]] = [
        ("--host", str, "127.0.0.1", "address to bind (default: %(default)s, loopback only)"),
        ("--port", int, 8000, "TCP port to listen on; 0 picks a free one (default: %(default)s)"),
        ("--worker-id", str, d.worker_id, "sent back in the x-worker-id header (default: %(default)s)"),
        ("--model", str, d.model, "the one model name served (default: %(default)s)"),
        ("--tokenizer", str, None, "Hugging Face tokenizer path; default: UTF-8 bytes as token ids"),
        ("--block-size", int, e.block_size, "tokens per KV block (default: %(default)s)"),
        ("--num-gpu-blocks", int, e.num_gpu_blocks, "KV blocks, active or cached (default: %(default)s)"),
        ("--num-host-blocks", int, e.num_host_blocks, "host-memory tier for evicted blocks, published with "
         "--kv-events zmq as vLLM's CPU offloading does (medium CPU); 0: none (default: %(default)s)"),
        ("--max-num-batched-tokens", int, e.max_num_batched_tokens,
         "token budget of one pass: prefill chunks plus decodes (default: %(default)s)"),
        ("--max-num-seqs", int, e.max_num_seqs, "most running requests (default: %(default)s)"),
        ("--max-model-len", int, None, "largest prompt + output tokens (default: the pool's capacity)"),
        ("--max-output-tokens", int, d.max_output_tokens, "cap on generated tokens (default: %(default)s)"),
        ("--default-max-tokens", int, d.default_max_tokens,
         "generated tokens when a request sets no max_tokens (default: %(default)s)"),
        ("--speedup", float, d.speedup, "simulated time runs this many times faster (default: %(default)s)"),
    ]  # fmt: skip
    for flag, kind, default, help_text in flags:
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    parser.add_argument(
        "--kv-events",
        choices=[KV_EVENTS_OFF, *KV_EVENT_TRANSPORTS],
        default="zmq",
        help="publish the prefix cache's KV events (zmq: vLLM's PUB + replay sockets; nats: Dynamo-style "
        "JSON on NATS core; default: %(default)s)",
    )
    parser.add_argument("--kv-events-host", default="127.0.0.1", help="address the KV event sockets bind")
    parser.add_argument(
        "--kv-events-port",
        type=int,
        default=None,
        help="KV event PUB port; 0 picks a free one (default: 5557, or a free port when 5557 is taken)",
    )
    parser.add_argument(
        "--kv-replay-port",
        type=int,
        default=None,
        help="KV event replay (ROUTER) port; 0 picks a free one (default: 5558, or a free port when taken)",
    )
    parser.add_argument(
        "--nats-url",
        default="nats://127.0.0.1:4222",
        help="--kv-events nats: the NATS server (default: %(default)s)",
    )
    parser.add_argument(
        "--instance-id", type=int, default=0, help="--kv-events nats: this worker's u64 id in the events"
    )
    parser.add_argument("--namespace", default="dynamo", help="--kv-events nats: subject namespace")
    parser.add_argument("--component", default="backend", help="--kv-events nats: subject component")
    parser.add_argument(
        "--ports-file",
        metavar="PATH",
        help="once listening, write the bound ports as JSON here (port, kv_events_port, kv_replay_port): "
        "start with port 0 and read the ports back, no port chosen in advance",
    )
    add_disagg_arguments(parser)


def config_from_args(args: argparse.Namespace) -> MockWorkerConfig:
    """Build and validate the worker config from parsed flags. Raises ValueError naming the flag."""
    engine = EngineConfig(
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        num_host_blocks=args.num_host_blocks,
    )
    return MockWorkerConfig(
        worker_id=args.worker_id,
        model=args.model,
        engine=engine,
        speedup=args.speedup,
        default_max_tokens=args.default_max_tokens,
        max_output_tokens=args.max_output_tokens,
        max_model_len=args.max_model_len,
        kv_events=KvEventsConfig(
            transport=args.kv_events,
            host=args.kv_events_host,
            port=args.kv_events_port,
            replay_port=args.kv_replay_port,
            nats_url=args.nats_url,
            instance_id=args.instance_id,
            namespace=args.namespace,
            component=args.component,
        ),
        disagg=disagg_config_from_args(args),
    )


def load_worker_tokenizer(path: str | None) -> TokenizerLike:
    """ByteTokenizer by default; a Hugging Face tokenizer (imported lazily) when a path is given."""
    if path is None:
        from extproc.request.tokenizer import ByteTokenizer

        return ByteTokenizer()
    from extproc.request.tokenizer import load_tokenizer

    return load_tokenizer(path)


async def run_mock_worker(args: argparse.Namespace) -> None:
    """Serve until cancelled or SIGTERM/SIGINT."""
    config = config_from_args(args)
    app = make_app(config, tokenizer=load_worker_tokenizer(args.tokenizer))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        if args.ports_file:
            write_ports_file(args.ports_file, _bound_ports(runner, app[WORKER]))
        log.info(
            "mock worker %s (role %s) serving %s on %s (block_size=%d blocks=%d speedup=%g)",
            config.worker_id,
            config.disagg.role,
            config.model,
            ", ".join(str(a) for a in runner.addresses),
            config.engine.block_size,
            config.engine.num_gpu_blocks,
            config.speedup,
        )
        await stop.wait()
    finally:
        await runner.cleanup()


def _bound_ports(runner: web.AppRunner, worker: MockWorker) -> dict[str, int | None]:
    """The HTTP port and, with ZMQ KV events, the PUB and replay ports (for --ports-file)."""
    ports: dict[str, int | None] = {"port": int(runner.addresses[0][1])}
    if isinstance(worker.kv_events, ZmqKvEvents):
        ports["kv_events_port"] = worker.kv_events.publisher.port
        ports["kv_replay_port"] = worker.kv_events.publisher.replay_port
    return ports


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m extproc mock-worker` entry point."""
    parser = argparse.ArgumentParser(prog="extproc mock-worker", description=__doc__.splitlines()[0])
    add_mock_worker_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(run_mock_worker(args))
    return 0
