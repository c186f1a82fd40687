"""Records `vllm-0.33.0/responses.json`: what vLLM 0.33.0's own code makes of Responses API requests.

For each request body below, vLLM's `ResponsesRequest` (pydantic) validates it, then its renderer's
steps for a model without Harmony (`OnlineRenderer.render_responses`) run: `construct_tool_dicts`
(the tools the chat template gets), `construct_input_messages` (the chat messages), and
`ResponsesRequest.build_chat_params` (`add_generation_prompt`, `continue_final_message` and the chat
template kwargs). The file keeps, per case, the body and those results, or the error vLLM raises, and under
`answers` the first bytes of vLLM's answers as its api_router writes them (a non-streamed answer,
and a stream's first events).
`tests/request/test_responses.py` checks that `extproc.request.responses` builds the same.

Run from the repository root, in a separate venv holding vLLM's light dependencies (never the
project's; nothing from the wheel is committed, only this script and the data it writes):

    python3 -m venv /tmp/vv && /tmp/vv/bin/pip install torch==2.13.0   # vllm imports torch
    pip download --no-deps vllm==0.33.0 -d /tmp/vllmw
    unzip -q /tmp/vllmw/vllm-0.33.0-*.whl -d /tmp/vllmw/full
    /tmp/vv/bin/pip install -r <(the wheel's unconditional Requires-Dist, without the GPU kernels,
        torch*, numba, outlines_core, mistral_common, mcp, opentelemetry)
    PYTHONPATH=/tmp/vllmw/full /tmp/vv/bin/python tests/request/engines/generate_responses_fixtures.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import vllm
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts

OUT = Path(__file__).resolve().parent / f"vllm-{vllm.__version__}" / "responses.json"

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
BARE_TOOL = {"type": "function", "name": "now", "parameters": None}
STRICT_TOOL = {**WEATHER, "name": "get_time", "strict": True}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
CALL_2 = {**CALL, "call_id": "call_2", "arguments": '{"city": "Rome"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}
OUTPUT_2 = {"type": "function_call_output", "call_id": "call_2", "output": "rain"}
ASSISTANT_ITEM = {
    "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
    "content": [{"type": "output_text", "text": "Paris is sunny.", "annotations": []}],
}  # fmt: skip
REASONING = {
    "type": "reasoning", "id": "rs_1", "summary": [],
    "content": [{"type": "reasoning_text", "text": "The user wants the weather."}],
}  # fmt: skip

CASES: dict[str, dict[str, Any]] = {
    "string_input": {"input": "Tell me a joke."},
    "string_input_with_instructions": {"input": "Tell me a joke.", "instructions": "Answer in French."},
    "empty_instructions_are_dropped": {"input": "hi", "instructions": ""},
    "easy_user_message": {"input": [{"role": "user", "content": "hello"}]},
    "typed_user_message_with_text_parts": {
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "first part"},
                    {"type": "input_text", "text": "second part"},
                ],
            }
        ],
    },
    "system_and_developer_roles": {
        "instructions": "Be brief.",
        "input": [
            {"role": "system", "content": "You are a router test."},
            {"role": "developer", "content": "Use metric units."},
            {"role": "user", "content": "How far is the moon?"},
        ],
    },
    "multi_turn_with_an_output_message_item": {
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            ASSISTANT_ITEM,
            {"role": "user", "content": "And tomorrow?"},
        ],
    },
    "multi_turn_with_an_easy_assistant_message": {
        "input": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me about caches."},
        ],
    },
    "assistant_message_with_text_parts": {
        "input": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "part one"},
                    {"type": "output_text", "text": "part two"},
                ],
            },
            {"role": "user", "content": "go on"},
        ],
    },
    "function_call_and_its_output": {
        "tools": [WEATHER],
        "input": [{"role": "user", "content": "Weather in Paris?"}, CALL, OUTPUT],
    },
    "two_calls_merge_into_one_assistant_message": {
        "tools": [WEATHER],
        "input": [{"role": "user", "content": "Paris and Rome?"}, CALL, CALL_2, OUTPUT, OUTPUT_2],
    },
    "reasoning_then_a_call": {
        "tools": [WEATHER],
        "input": [{"role": "user", "content": "Weather in Paris?"}, REASONING, CALL, OUTPUT],
    },
    "assistant_text_then_a_call": {
        "tools": [WEATHER],
        "input": [{"role": "user", "content": "Weather in Paris?"}, ASSISTANT_ITEM, CALL, OUTPUT],
    },
    "a_call_after_an_easy_assistant_message": {
        "tools": [WEATHER],
        "input": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Let me check."},
            CALL,
            OUTPUT,
        ],
    },
    "reasoning_alone_then_text": {
        "input": [
            {"role": "user", "content": "2+2?"},
            REASONING,
            ASSISTANT_ITEM,
            {"role": "user", "content": "ok"},
        ],
    },
    "partial_assistant_message_is_continued": {
        "input": [
            {"role": "user", "content": "Write a haiku."},
            {
                **ASSISTANT_ITEM,
                "status": "in_progress",
                "content": [{"type": "output_text", "text": "Autumn moon", "annotations": []}],
            },
        ],
    },
    "incomplete_easy_message_is_continued": {
        "input": [
            {"role": "user", "content": "Count to five."},
            {"type": "message", "role": "assistant", "content": "one two", "status": "incomplete"},
        ],
    },
    "tools_of_every_shape": {"tools": [WEATHER, BARE_TOOL, STRICT_TOOL], "input": "What time is it?"},
    "tool_choice_none_keeps_the_tools": {"tools": [WEATHER], "tool_choice": "none", "input": "hi"},
    "reasoning_effort": {"reasoning": {"effort": "low"}, "input": "Think about it."},
    "reasoning_effort_none": {"reasoning": {"effort": "none"}, "input": "Quick answer."},
    "reasoning_effort_with_explicit_thinking_kwarg": {
        "reasoning": {"effort": "high"},
        "chat_template_kwargs": {"enable_thinking": False},
        "input": "hi",
    },
    "chat_template_kwargs": {"chat_template_kwargs": {"custom_flag": True}, "input": "hi"},
    "unicode_and_newlines": {
        "input": [{"role": "user", "content": "naïve café ☕\n\n  indented\tline\r\nend"}]
    },
    "sampling_fields_do_not_change_the_prompt": {
        "input": "hi",
        "max_output_tokens": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "stream": True,
        "store": False,
        "cache_salt": "tenant-a",
        "metadata": {"k": "v"},
        "user": "u1",
        "parallel_tool_calls": False,
    },
    "unsupported_item_type_is_refused": {"input": [{"type": "item_reference", "id": "msg_0"}]},
    "encrypted_reasoning_is_refused": {
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "opaque"},
        ],
    },
}


def record(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "m", **fields}
    out: dict[str, Any] = {"name": name, "body": copy.deepcopy(body)}  # vLLM's steps may change what they get
    try:
        request = ResponsesRequest.model_validate(copy.deepcopy(body))
        tools = construct_tool_dicts(request.tools, request.tool_choice)
        messages = construct_input_messages(
            request_instructions=request.instructions, request_input=request.input
        )
        params = request.build_chat_params(None, "auto", None)
    except Exception as exc:  # vLLM answers 400 (VLLMValidationError, pydantic's ValidationError)
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return out
    out["messages"] = json.loads(json.dumps(messages, default=_dump))
    out["tools"] = json.loads(json.dumps(tools, default=_dump))
    out["chat_template_kwargs"] = json.loads(json.dumps(params.chat_template_kwargs, default=_dump))
    return out


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    raise TypeError(f"cannot dump {type(value).__name__}")


def answers() -> dict[str, str]:
    """The first bytes of vLLM's answers, as its api_router writes them: a non-streamed answer (a
    JSONResponse of the ResponsesResponse) and the start of a stream (`_convert_stream_to_sse_events`)."""
    import asyncio

    from openai.types.responses import (
        ResponseCreatedEvent,
        ResponseInProgressEvent,
        ResponseOutputMessage,
        ResponseOutputText,
        ResponseTextDeltaEvent,
    )  # fmt: skip
    from starlette.responses import JSONResponse
    from vllm import SamplingParams
    from vllm.entrypoints.openai.responses.api_router import _convert_stream_to_sse_events
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse

    request = ResponsesRequest.model_validate({"model": "m", "input": "hi", "request_id": "resp_fixture1"})
    params = SamplingParams(max_tokens=16)
    text = ResponseOutputText(type="output_text", text="Hello!", annotations=[])
    message = ResponseOutputMessage(
        id="msg_1", type="message", role="assistant", status="completed", content=[text]
    )
    done = ResponsesResponse.from_request(request, params, model_name="m", created_time=0, output=[message],
                                          status="completed")  # fmt: skip
    initial = ResponsesResponse.from_request(
        request, params, model_name="m", created_time=0, output=[], status="in_progress"
    ).model_dump(mode="json", by_alias=True)

    async def events():  # type: ignore[no-untyped-def]
        yield ResponseCreatedEvent(type="response.created", sequence_number=0, response=initial)
        yield ResponseInProgressEvent(type="response.in_progress", sequence_number=1, response=initial)
        yield ResponseTextDeltaEvent(
            type="response.output_text.delta", sequence_number=2, item_id="msg_1", output_index=0,
            content_index=0, delta="Hello", logprobs=[],
        )  # fmt: skip

    async def sse() -> list[str]:
        return [chunk async for chunk in _convert_stream_to_sse_events(events())]

    chunks = asyncio.run(sse())
    return {
        "json": JSONResponse(content=done.model_dump(mode="json", by_alias=True)).body.decode(),
        "sse_created": chunks[0],
        "sse_in_progress": chunks[1],
        "sse_first_delta": chunks[2],
        "id": "resp_fixture1",
    }


def main() -> None:
    cases = [record(name, fields) for name, fields in CASES.items()]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "generated_by": "tests/request/engines/generate_responses_fixtures.py",
        "engine": f"vllm {vllm.__version__}",
        "functions": [
            "vllm.entrypoints.openai.responses.protocol.ResponsesRequest.model_validate",
            "vllm.entrypoints.openai.responses.utils.construct_tool_dicts(tools, tool_choice)",
            "vllm.entrypoints.openai.responses.utils.construct_input_messages(instructions, input)",
            "ResponsesRequest.build_chat_params(None, 'auto', None).chat_template_kwargs",
        ],
        "cases": cases,
        "answers": answers(),
    }
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
