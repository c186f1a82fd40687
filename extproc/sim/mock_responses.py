"""The mock worker's Responses API: `POST /v1/responses` and `GET /v1/responses/{id}`, shaped as
vLLM 0.33.0 answers them (with `VLLM_ENABLE_RESPONSES_API_STORE=1`).

The prompt is the chat vLLM renders from the request (`extproc.request.responses`); generation runs
on the worker's simulated engine like a chat request. A non-streamed answer is a `ResponsesResponse`
JSON (`id` first); a streamed one sends `response.created` and `response.in_progress` before
generation, one `response.output_text.delta` per token, then `response.completed`, each as
`event: <type>` and `data: <json>`. Each answer is stored in this process's memory: a request with
`previous_response_id` continues its conversation here and gets vLLM's 404 anywhere else, as does
`GET /v1/responses/{id}`. The store keeps the last `MAX_STORED` answers.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from aiohttp import web

from extproc.errors import RequestInvalid
from extproc.request.responses import to_chat_fields


class _Driver(Protocol):
    def submit(
        self, request_id: str, token_ids: Sequence[int], max_tokens: int, cache_salt: str | None = None
    ) -> asyncio.Queue[Any]: ...

    def cancel(self, request_id: str) -> None: ...


class HandlerWorker(Protocol):
    """What the Responses and Messages API handlers (this module, `mock_anthropic`) use of the mock
    worker (`extproc.sim.mock_worker.MockWorker`)."""

    config: Any  # MockWorkerConfig: model, default_max_tokens, max_output_tokens
    tokenizer: Any  # its TokenizerLike (encode_chat)
    metrics: Any  # WorkerMetrics (generation_tokens)

    @property
    def driver(self) -> _Driver: ...

    @property
    def responses(self) -> ResponseStore: ...


MAX_STORED: Final = 10_000
_TOKEN_TEXT: Final = " tok"


class ResponseStore:
    """Answers stored in this worker's memory: id -> (its conversation, its answer JSON)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = OrderedDict()

    def put(self, response_id: str, conversation: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        self._items[response_id] = (conversation, answer)
        while len(self._items) > MAX_STORED:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        return self._items.get(response_id)


def not_found(response_id: str) -> web.Response:
    """vLLM's answer for an id it does not store (`_make_not_found_error`)."""
    error = {
        "message": f"Response with id '{response_id}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    return web.json_response({"error": error}, status=404)


def _bad_request(message: str) -> web.Response:
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return web.json_response({"error": error}, status=400)


async def create(worker: HandlerWorker, request: web.Request) -> web.StreamResponse:
    try:
        body = json.loads(await request.read())
        if not isinstance(body, dict):
            raise RequestInvalid("the body must be a JSON object")
        fields = to_chat_fields({**body, "previous_response_id": None})
    except (ValueError, RequestInvalid) as exc:
        return _bad_request(getattr(exc, "message", str(exc)))
    model = body.get("model", worker.config.model)
    if model != worker.config.model:
        return web.json_response(
            {
                "error": {
                    "message": f"The model `{model}` does not exist.",
                    "type": "NotFoundError",
                    "code": 404,
                }
            },
            status=404,
        )
    messages = fields["messages"]
    if messages is None:
        return _bad_request(fields["load_only_reason"])
    conversation = [dict(m) for m in messages]
    previous = body.get("previous_response_id")
    if previous is not None:
        stored = worker.responses.get(previous)
        if stored is None:
            return not_found(previous)
        history = [m for m in stored[0] if m.get("role") != "system"]  # instructions do not carry over
        instructions = conversation[:1] if body.get("instructions") else []
        conversation = [*instructions, *history, *conversation[len(instructions) :]]
    prompt = worker.tokenizer.encode_chat(
        conversation, tools=fields["tools"], add_generation_prompt=fields.get("add_generation_prompt", True)
    )
    max_tokens = min(
        fields["max_tokens"] or worker.config.default_max_tokens, worker.config.max_output_tokens
    )
    response_id = fields["response_id"] or f"resp_{uuid.uuid4().hex}"
    answer = _response(response_id, worker.config.model, body, "in_progress", "")
    stream = body.get("stream") is True
    queue = worker.driver.submit(response_id, prompt, max_tokens, body.get("cache_salt"))
    response: web.StreamResponse | None = None
    sequence = 0

    async def event(kind: str, data: dict[str, Any]) -> None:
        nonlocal sequence
        assert response is not None
        payload = {**data, "sequence_number": sequence, "type": kind}
        sequence += 1
        await response.write(
            f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
        )

    emitted = 0
    try:
        if stream:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await event("response.created", {"response": answer})
            await event("response.in_progress", {"response": answer})
        while True:
            item = await queue.get()
            if item is None:
                return web.json_response(
                    {"error": {"message": "the simulated engine failed", "code": 500}}, status=500
                )
            entry, _ = item
            if entry.emits_token:
                emitted += 1
                worker.metrics.generation_tokens.inc()
                if response is not None:
                    delta = {"content_index": 0, "delta": _TOKEN_TEXT, "item_id": f"msg_{response_id}",
                             "logprobs": [], "output_index": 0}  # fmt: skip
                    await event("response.output_text.delta", delta)
            if entry.finished:
                break
        done = _response(
            response_id, worker.config.model, body, "completed", _TOKEN_TEXT * emitted, len(prompt)
        )
        worker.responses.put(
            response_id, [*conversation, {"role": "assistant", "content": _TOKEN_TEXT * emitted}], done
        )
        if response is None:
            return web.json_response(done)
        await event("response.completed", {"response": done})
        await response.write_eof()
        return response
    except ConnectionError:
        return response or web.Response(status=499)
    finally:
        worker.driver.cancel(response_id)


async def retrieve(worker: HandlerWorker, request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    stored = worker.responses.get(response_id)
    return web.json_response(stored[1]) if stored is not None else not_found(response_id)


def _response(
    response_id: str, model: str, body: Mapping[str, Any], status: str, text: str, prompt_tokens: int = 0
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if status == "completed":
        content: list[dict[str, Any]] = [
            {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
        ]
        output = [{"id": f"msg_{response_id}", "content": content, "role": "assistant", "status": "completed",
                   "type": "message"}]  # fmt: skip
    output_tokens = len(text) // len(_TOKEN_TEXT)
    return {
        "id": response_id,
        "created_at": int(time.time()),
        "instructions": body.get("instructions"),
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "status": status,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens,
        }
        if status == "completed"
        else None,
    }
