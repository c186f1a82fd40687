"""RoutingClient: the KV-aware router from Python, without Envoy. Routes, sends, streams, frees.

For applications that call their workers themselves. Each request goes through the same embedded
`EndpointPicker` the ext_proc service uses (parse, tokenize, hash, route), is sent to the chosen
worker's OpenAI endpoint with the pick's headers (`x-data-parallel-rank`, the disaggregation
header, ...), and its lifecycle is driven as Envoy's would be: prefill complete on the first chunk,
freed exactly once at the end, on error or when the caller stops reading.

    async with RoutingClient.from_workers("demo-model", ["127.0.0.1:8001", "127.0.0.1:8002"]) as client:
        async with client.generate(model="demo-model", messages=[...], max_tokens=64) as stream:
            print("routed to", stream.endpoint, "with", stream.pick.overlap_blocks, "blocks cached")
            async for chunk in stream:                       # parsed SSE chunks (dicts)
                print(chunk["choices"][0]["delta"].get("content", ""), end="")
        answer = await client.complete(model="demo-model", prompt="Hello", max_tokens=16)

`generate` returns a `Generation`, both an async context manager and an async iterator; the route
is an attribute of it rather than an item of the stream, so every item is an OpenAI chunk and
callers never branch on types. `async with` (or `Generation.aclose`) frees the request the moment
the block is left; a bare `async for ... break` frees it when the iterator is finalized (at once in
CPython, through asyncio's async-generator hooks). A cancelled task frees it as the cancellation
passes through. `router_override` takes a `RouterConfigOverride` (overlap weight, routing
temperature), so it never collides with OpenAI's sampling `temperature`, which is passed through.

KV event sources (ZMQ or NATS, as the config names them) start with the client, so routing follows
the workers' real caches; without any, the router predicts caches from its own decisions.

Errors (`status` is an HTTP status in every case):

    RoutingClientError
    ├── RequestRejected   the router refused: 400 invalid, 404 unknown model, 413 too long,
    │                     429 shed, 503 no worker or saturated (`reason`: the dropped-reason)
    └── WorkerFailed      the worker answered non-2xx (its status and error body), could not be
                          reached, or broke the stream off before `[DONE]` (502)

Does not retry on another worker and does not speak the ext_proc protocol.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.epp import answers as epp
from extproc.errors import PickerError
from extproc.events.sources import EventSources, start_event_sources
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.router import RouterConfig, RouterConfigOverride, RouterError

__all__ = [
    "Generation",
    "RequestRejected",
    "RouterConfigOverride",
    "RoutingClient",
    "RoutingClientError",
    "WorkerFailed",
]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
BAD_GATEWAY = 502  # no HTTP answer from the worker, or a broken stream
MAX_ERROR_BODY_BYTES = 64 * 1024


class RoutingClientError(Exception):
    """Base of the client's errors: `status` (HTTP) and a `message` fit to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class RequestRejected(RoutingClientError):
    """The router refused the request before any worker saw it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(status, message)
        self.reason = reason  # the dropped-reason Envoy users see, e.g. "unknown-model"


class WorkerFailed(RoutingClientError):
    """The chosen worker failed the request; `body` is its error answer (parsed JSON, text or None)."""

    def __init__(self, status: int, message: str, *, endpoint: str, body: Any = None) -> None:
        super().__init__(status, message)
        self.endpoint = endpoint
        self.body = body


class RoutingClient:
    """Routes OpenAI requests with an embedded picker and sends them to the chosen workers.

    Use as `async with`, or call `start()` and `close()`. One instance serves many concurrent
    requests; the picker (`client.picker`) is its own, with its own metrics and load picture.
    """

    def __init__(
        self,
        config: PickerConfig,
        *,
        kv_events: bool = True,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> None:
        """`kv_events`: start the KV event sources `config` names (none named: nothing starts).
        `timeout`: for worker requests; by default only connecting is bounded (10 s), since a
        generation may legitimately stream for minutes."""
        self.config = config
        self.picker = EndpointPicker(config)
        self._kv_events = kv_events
        self._timeout = timeout or aiohttp.ClientTimeout(total=None, sock_connect=10.0)
        self._session: aiohttp.ClientSession | None = None
        self._sources: EventSources | None = None
        self._closed = False  # the picker is closed for good: a client is not restarted

    @classmethod
    def from_workers(
        cls,
        model: str,
        workers: Sequence[str | WorkerConfig],
        *,
        tokenizer: str | None = None,
        lora_adapters: Sequence[str] = (),
        aliases: Sequence[str] = (),
        seed: int | None = None,
        kv_events: bool = True,
        timeout: aiohttp.ClientTimeout | None = None,
        **router_settings: Any,
    ) -> RoutingClient:
        """A client for one model's workers, given as `"ip:port"` (the endpoint is also the worker
        id) or as `WorkerConfig` (ids, dp ranks, roles, `kv_events` ZMQ endpoints).

        `tokenizer`: a Hugging Face tokenizer directory (default: UTF-8 bytes, as the mock worker).
        `lora_adapters`: names of LoRA adapters the workers serve as models (vLLM's `--lora-modules`).
        `aliases`: other names the workers serve the model as (vLLM's further `--served-model-name`s).
        `router_settings`: `RouterConfig` fields (`block_size=16`, `overlap_score_weight=2.0`,
        ...); `use_kv_events` defaults to whether any worker names a ZMQ event endpoint.
        Raises ValueError (`InvalidConfig`) for a bad setting or a worker of another model.
        """
        configs = tuple(WorkerConfig(w, w, model) if isinstance(w, str) else w for w in workers)
        others = sorted({w.model for w in configs if w.model != model})
        if others:
            raise ValueError(f"every worker must serve {model!r}; got workers of {', '.join(others)}")
        router_settings.setdefault("use_kv_events", any(w.kv_events for w in configs))
        config = PickerConfig(
            router=RouterConfig(**router_settings),
            workers=configs,
            models=(
                ModelConfig(
                    model, tokenizer=tokenizer, lora_adapters=tuple(lora_adapters), aliases=tuple(aliases)
                ),
            ),
            seed=seed,
        )
        return cls(config, kv_events=kv_events, timeout=timeout)

    async def start(self) -> None:
        """Open the HTTP session and start the KV event sources (idempotent until `close`)."""
        if self._closed:
            raise RuntimeError("this RoutingClient is closed; make a new one")
        if self._session is not None:
            return
        # limit=0: no client-side connection cap, which would queue requests the router counts as running
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=aiohttp.TCPConnector(limit=0))
        if self._kv_events:
            try:
                self._sources = await start_event_sources(self.config, self.picker)
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        """Stop the event sources, the HTTP session and the picker (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._sources is not None:
            sources, self._sources = self._sources, None
            await sources.stop()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        await self.picker.close()

    async def __aenter__(self) -> RoutingClient:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def generate(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        prompt: str | Sequence[Any] | None = None,
        router_override: RouterConfigOverride | None = None,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> Generation:
        """A streamed generation: chat with `messages`, a completion with `prompt` (exactly one).

        `fields` are further OpenAI fields, sent as given (`max_tokens`, `temperature`,
        `stream_options`, `nvext`, ...); `stream` is always true here. Nothing is sent until the
        `Generation` is entered or iterated. Raises ValueError for a malformed call at once.
        """
        path, body = _openai_body(model, messages, prompt, fields, stream=True)
        return Generation(self, path, body, _Call(router_override, request_id, headers))

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        prompt: str | Sequence[Any] | None = None,
        router_override: RouterConfigOverride | None = None,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """One non-streamed answer (the worker's JSON response); arguments as `generate`.

        Raises RequestRejected or WorkerFailed; the request is freed however it ends.
        """
        path, body = _openai_body(model, messages, prompt, fields, stream=False)
        call = _Call(router_override, request_id, headers)
        pick, response = await self._route_and_send(path, body, call)
        # the answer is whole: the prompt is long prefilled, and now is not the first token's time
        self.picker.first_token(pick, at_first_token=False)
        cause = "cancelled"
        try:
            raw = await response.read()
            answer = _json_object(raw, pick.endpoint)
            cause = "complete"
            return answer
        except WorkerFailed:
            cause = "error"
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            cause = "error"
            raise _transport_failed(pick, exc) from exc
        finally:
            if cause == "complete":
                response.release()
            else:
                response.close()
            self.picker.finish(pick, cause)

    # --- internals ---------------------------------------------------------------------------

    async def _route_and_send(
        self, path: str, body: bytes, call: _Call
    ) -> tuple[Pick, aiohttp.ClientResponse]:
        """Route, then send; a 2xx response is returned open, anything else frees the request and raises."""
        if self._session is None:
            raise RuntimeError("RoutingClient is not started: use `async with` or call start()")
        try:
            pick = await self.picker.pick(
                body=body,
                path=path,
                headers=call.picker_headers,
                subset=None,
                client_request_id=call.request_id,
                override=call.router_override,
            )
        except (PickerError, RouterError) as exc:
            status, reason = epp.status_of(exc)
            self.picker.rejected(status, reason)
            raise RequestRejected(status, reason, getattr(exc, "message", None) or str(exc)) from exc
        send_headers = {**call.headers, "content-type": "application/json", **pick.headers}
        try:
            response = await self._session.post(
                f"http://{pick.endpoint}{path}", data=body, headers=send_headers
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.picker.answered(pick, 502)  # no answer at all: counts like Envoy's 503 (ejection)
            self.picker.finish(pick, "error")
            raise _transport_failed(pick, exc) from exc
        except BaseException:
            self.picker.finish(pick, "cancelled")
            raise
        self.picker.answered(pick, response.status)
        if 200 <= response.status < 300:
            return pick, response
        try:
            error_body = await _error_body(response)
        finally:
            response.close()
            self.picker.finish(pick, f"upstream_status_{response.status}")
        message = f"{_worker_at(pick)} answered {response.status}"
        raise WorkerFailed(
            response.status,
            f"{message}: {_error_message(error_body)}",
            endpoint=pick.endpoint,
            body=error_body,
        )


class _Call:
    """One call's routing inputs: override, request id and the headers for picker and worker."""

    __slots__ = ("headers", "picker_headers", "request_id", "router_override")

    def __init__(
        self,
        router_override: RouterConfigOverride | None,
        request_id: str | None,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.router_override = router_override
        self.picker_headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.request_id = request_id or self.picker_headers.get("x-request-id") or uuid.uuid4().hex
        self.headers = dict(headers or {})
        if "x-request-id" not in self.picker_headers:
            self.headers["x-request-id"] = self.request_id


class Generation:
    """One streamed generation: an async context manager and an async iterator of chunk dicts.

    `pick` (the routing decision: worker, endpoint, overlap blocks, headers sent) and
    `response_headers` are set once the request is sent, on entering or on the first iteration.
    Can be iterated once.
    """

    def __init__(self, client: RoutingClient, path: str, body: bytes, call: _Call) -> None:
        self._client = client
        self._path = path
        self._body = body
        self._call = call
        self.pick: Pick | None = None
        self._response: aiohttp.ClientResponse | None = None
        self._iterated = False
        self._closed = False

    @property
    def request_id(self) -> str:
        """The id given (or made) for this request; sent to the worker as `x-request-id`."""
        return self._call.request_id

    @property
    def endpoint(self) -> str | None:
        """The chosen worker's `ip:port`, once routed."""
        return self.pick.endpoint if self.pick is not None else None

    @property
    def response_headers(self) -> CIMultiDictProxy[str] | None:
        """The worker's response headers, once it answered."""
        return self._response.headers if self._response is not None else None

    async def __aenter__(self) -> Generation:
        await self._send()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        if self._iterated:
            raise RuntimeError("a Generation can be iterated only once")
        self._iterated = True
        return self._chunks()

    async def aclose(self) -> None:
        """Stop: close the worker connection and free the request if it is still running."""
        self._end("cancelled")

    async def _send(self) -> None:
        if self._closed:
            raise RuntimeError("this Generation is closed")
        if self.pick is None:
            self.pick, self._response = await self._client._route_and_send(self._path, self._body, self._call)

    async def _chunks(self) -> AsyncIterator[dict[str, Any]]:
        cause = "cancelled"  # a consumer that stops reading, or a cancelled task
        try:
            await self._send()
            assert self.pick is not None and self._response is not None
            pick, first = self.pick, True
            async for payload in _sse_payloads(self._response):
                if payload == "[DONE]":
                    cause = "complete"
                    return
                chunk = _chunk(payload, pick.endpoint)
                if first:
                    first = False
                    self._client.picker.first_token(pick)
                yield chunk
            raise WorkerFailed(
                BAD_GATEWAY,
                f"{_worker_at(pick)} ended the stream before [DONE]",
                endpoint=pick.endpoint,
            )
        except WorkerFailed:
            cause = "error"
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            cause = "error"
            assert self.pick is not None
            raise _transport_failed(self.pick, exc) from exc
        finally:
            self._end(cause)

    def _end(self, cause: str) -> None:
        """Free the request once (no-op after the first call) and release the connection."""
        if self._closed:
            return
        self._closed = True
        if self._response is not None:
            if cause == "complete":
                self._response.release()
            else:
                self._response.close()  # the worker sees the disconnect and stops generating
        if self.pick is not None:
            self._client.picker.finish(self.pick, cause)


def _openai_body(
    model: str,
    messages: Sequence[Mapping[str, Any]] | None,
    prompt: str | Sequence[Any] | None,
    fields: Mapping[str, Any],
    *,
    stream: bool,
) -> tuple[str, bytes]:
    if (messages is None) == (prompt is None):
        raise ValueError("pass exactly one of messages= (chat) or prompt= (completions)")
    if "stream" in fields:
        raise ValueError("stream is set by the call: generate() streams, complete() does not")
    body: dict[str, Any] = {"model": model, **fields}
    if messages is not None:
        path, body["messages"] = CHAT_PATH, list(messages)
    else:
        path, body["prompt"] = COMPLETIONS_PATH, prompt if isinstance(prompt, str) else list(prompt or ())
    if stream:
        body["stream"] = True
    return path, json.dumps(body).encode()


class _SseDecoder:
    """Server-sent events from bytes: the `data` of each event (multi-line data joined with \\n).

    Other fields (`event:`, `id:`) and comments are skipped; lines may end in \\n or \\r\\n.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        if b"\n" not in chunk:
            return []
        *lines, self._buffer = self._buffer.split(b"\n")
        return [event for line in lines if (event := self._line(line)) is not None]

    def close(self) -> list[str]:
        """The end of the stream: an event left without its blank line still counts."""
        events = [event] if (event := self._line(self._buffer)) is not None else []
        self._buffer = b""
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, raw: bytes) -> str | None:
        line = raw.rstrip(b"\r").decode("utf-8", "replace")
        if not line:
            event = "\n".join(self._data) if self._data else None
            self._data = []
            return event
        if line.startswith("data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


async def _sse_payloads(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    decoder = _SseDecoder()
    async for data in response.content.iter_any():
        for payload in decoder.feed(data):
            yield payload
    for payload in decoder.close():
        yield payload


def _chunk(payload: str, endpoint: str) -> dict[str, Any]:
    """One SSE data payload as a chunk; an error event (vLLM sends one mid-stream) raises."""
    chunk = _json_object(payload.encode(), endpoint)
    error = chunk.get("error")
    if isinstance(error, dict) and "choices" not in chunk:
        code = error.get("code")
        status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        message = f"worker at {endpoint} failed mid-stream: {_error_message(chunk)}"
        raise WorkerFailed(status, message, endpoint=endpoint, body=chunk)
    return chunk


def _json_object(raw: bytes, endpoint: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        text = raw[:MAX_ERROR_BODY_BYTES].decode("utf-8", "replace")
        message = f"worker at {endpoint} sent invalid JSON: {exc}"
        raise WorkerFailed(BAD_GATEWAY, message, endpoint=endpoint, body=text) from exc
    if not isinstance(value, dict):
        message = f"worker at {endpoint} sent JSON that is not an object"
        raise WorkerFailed(BAD_GATEWAY, message, endpoint=endpoint, body=value)
    return value


async def _error_body(response: aiohttp.ClientResponse) -> Any:
    """The worker's error answer: parsed JSON when it is JSON, else text; None if unreadable."""
    raw = bytearray()
    try:
        while len(raw) < MAX_ERROR_BODY_BYTES:
            part = await response.content.read(MAX_ERROR_BODY_BYTES - len(raw))
            if not part:
                break
            raw += part
    except (aiohttp.ClientError, TimeoutError):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _error_message(body: Any) -> str:
    """The message of an OpenAI error body (`{"error": {"message": ...}}`), else the body itself."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    text = body if isinstance(body, str) else "" if body is None else json.dumps(body)
    return text[:500] or "(empty body)"


def _transport_failed(pick: Pick, exc: BaseException) -> WorkerFailed:
    detail = str(exc) or type(exc).__name__
    return WorkerFailed(BAD_GATEWAY, f"{_worker_at(pick)} failed: {detail}", endpoint=pick.endpoint)


def _worker_at(pick: Pick) -> str:
    worker = str(pick.worker)
    return f"worker at {pick.endpoint}" if worker == pick.endpoint else f"worker {worker} at {pick.endpoint}"
