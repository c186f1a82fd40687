"""The mock worker's Anthropic Messages API: `POST /v1/messages`, shaped as vLLM 0.33.0 answers it.

The prompt is the chat vLLM serves from the request (`extproc.request.anthropic`; inline system
messages merged into the first one, as vLLM does for a worker without a chat template, which the
byte tokenizer is); generation runs on the worker's simulated engine like a chat request. A
non-streamed answer is a `message` JSON; a streamed one sends `message_start` at the first token,
one `content_block_delta` per token, then `content_block_stop`, `message_delta` (with the usage) and
`message_stop`, each as `event: <type>` and `data: <json>`, as Anthropic's API does. The cached
prefix is in `x-prefix-cache-hit-tokens`, as for chat.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

from aiohttp import web

from extproc.errors import RequestInvalid
from extproc.request import anthropic
from extproc.sim.mock_responses import HandlerWorker

_TOKEN_TEXT: Final = " tok"


def _error(status: int, kind: str, message: str) -> web.Response:
    """Anthropic's error shape, as vLLM's `translate_error_response` writes it."""
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


async def create(worker: HandlerWorker, request: web.Request) -> web.StreamResponse:
    try:
        body = json.loads(await request.read())
        if not isinstance(body, dict):
            raise RequestInvalid("the body must be a JSON object")
        fields = anthropic.to_chat_fields(body)
    except (ValueError, RequestInvalid) as exc:
        return _error(400, "invalid_request_error", getattr(exc, "message", str(exc)))
    model = body.get("model", worker.config.model)
    if model != worker.config.model:
        return _error(404, "not_found_error", f"The model `{model}` does not exist.")
    messages = fields["system_merged"] or fields["messages"]
    if messages is None:
        return _error(400, "invalid_request_error", fields["load_only_reason"])
    prompt = worker.tokenizer.encode_chat(list(messages), tools=fields["tools"])
    max_tokens = min(fields["max_tokens"], worker.config.max_output_tokens)
    message_id = f"msg_{uuid.uuid4().hex}"
    queue = worker.driver.submit(message_id, prompt, max_tokens, body.get("cache_salt"))
    response: web.StreamResponse | None = None

    async def event(kind: str, data: dict[str, Any]) -> None:
        assert response is not None
        payload = json.dumps({"type": kind, **data}, separators=(",", ":"))
        await response.write(f"event: {kind}\ndata: {payload}\n\n".encode())

    emitted = 0
    cached = 0
    try:
        while True:
            item = await queue.get()
            if item is None:
                return _error(500, "api_error", "the simulated engine failed")
            entry, _ = item
            if entry.emits_token:
                emitted += 1
                worker.metrics.generation_tokens.inc()
                if emitted == 1:
                    cached = entry.cached_tokens or 0
                    if body.get("stream") is True:
                        headers = {
                            "Content-Type": "text/event-stream",
                            "x-prefix-cache-hit-tokens": str(cached),
                        }
                        response = web.StreamResponse(headers=headers)
                        await response.prepare(request)
                        start = _message(message_id, model, "", len(prompt), 0, None)
                        await event("message_start", {"message": start})
                        block = {"type": "text", "text": ""}
                        await event("content_block_start", {"index": 0, "content_block": block})
                if response is not None:
                    text_delta = {"type": "text_delta", "text": _TOKEN_TEXT}
                    await event("content_block_delta", {"index": 0, "delta": text_delta})
            if entry.finished:
                break
        if response is None:
            answer = _message(message_id, model, _TOKEN_TEXT * emitted, len(prompt), emitted, "max_tokens")
            return web.json_response(answer, headers={"x-prefix-cache-hit-tokens": str(cached)})
        await event("content_block_stop", {"index": 0})
        delta: dict[str, Any] = {"stop_reason": "max_tokens", "stop_sequence": None}
        await event("message_delta", {"delta": delta, "usage": {"output_tokens": emitted}})
        await event("message_stop", {})
        await response.write_eof()
        return response
    except ConnectionError:
        return response or web.Response(status=499)
    finally:
        worker.driver.cancel(message_id)


def _message(
    message_id: str, model: str, text: str, input_tokens: int, output_tokens: int, stop: str | None
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}] if text else [],
        "model": model,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
