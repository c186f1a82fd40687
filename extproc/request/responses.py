"""The Responses API (`POST /v1/responses`) as the chat request vLLM renders from it.

vLLM 0.33.0 (`vllm/entrypoints/openai/responses/`, models without Harmony) builds the prompt of a
Responses request as a chat: `instructions` become a first system message, a string `input` one user
message, and a list of input items chat messages (`construct_input_messages`); function tools are
handed to the chat template in the chat shape (`construct_tool_dicts`); a last assistant item whose
status is `in_progress` or `incomplete` is continued rather than answered; `reasoning.effort` is the
template's `reasoning_effort`. `to_chat_fields` does the same, so that the chat path
(`extproc.request.tokenizer`) tokenizes the prompt the engine will, and
`tests/request/test_responses.py` compares it with what vLLM's own code built
(`tests/request/engines/vllm-0.33.0/responses.json`).

Item rules (each as vLLM's `_construct_message_from_response_item`):
- a message (`role` user, system, developer or assistant; `content` a string or text parts) is
  kept as it is, except an assistant one, which keeps the text of its first part;
- an output message (`type: message`, `role: assistant`, `id`, `status`, `output_text` parts): the
  text of its first part, as an assistant message;
- `function_call`: a tool call of an assistant message (merged into the assistant message just
  before, as vLLM merges them); `function_call_output`: a tool message;
- `reasoning`: the `reasoning` of an assistant message (its first content text, else its first
  summary text), merged likewise.

What is not rebuilt is routed on load only (still tracked), with the reason: items vLLM renders
through more of its code (images, files, custom and namespaced tools, item references, encrypted
reasoning, which vLLM refuses), and `previous_response_id`, whose history is stored on the worker
that answered it (the picker sends the follow-up there: `extproc.picker.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from extproc.errors import RequestInvalid
from extproc.request.json_type import json_type

RESPONSES_PATH: Final = "/v1/responses"
_MESSAGE_ROLES: Final = frozenset({"user", "system", "developer", "assistant"})
_PARTIAL: Final = ("in_progress", "incomplete")


class NotRebuilt(Exception):
    """The prompt cannot be rebuilt exactly as the engine will: route on load only (the message says why)."""


def to_chat_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`ParsedRequest` fields of a Responses request body (already a JSON object with a model).

    Raises `RequestInvalid` for a body every engine refuses (no `input`, wrong types); a shape whose
    prompt is not rebuilt here gives `messages` None and `load_only_reason`.
    """
    request_input = obj.get("input")
    if request_input is None:
        raise RequestInvalid("responses requests need `input` (a string or a list of input items)")
    if not isinstance(request_input, str | list):
        raise RequestInvalid(
            f"input must be a string or a list of input items, not {json_type(request_input)}"
        )
    instructions = obj.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestInvalid(f"instructions must be a string, not {json_type(instructions)}")
    previous = obj.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise RequestInvalid("previous_response_id must be a non-empty string")
    max_output_tokens = obj.get("max_output_tokens")
    if max_output_tokens is not None and (
        not isinstance(max_output_tokens, int) or isinstance(max_output_tokens, bool) or max_output_tokens < 1
    ):
        raise RequestInvalid("max_output_tokens must be a positive integer")
    kwargs = obj.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RequestInvalid(f"chat_template_kwargs must be an object, not {json_type(kwargs)}")
    fields: dict[str, Any] = {
        "max_tokens": max_output_tokens,
        "previous_response_id": previous,
        "response_id": _request_id(obj),
        "chat_template_kwargs": MappingProxyType(dict(kwargs or {})),
    }
    try:
        fields["reasoning_effort"] = _reasoning_effort(obj.get("reasoning"))
        fields["tools"] = _tools(obj.get("tools"))
        if previous is not None:
            raise NotRebuilt("it continues a stored response, whose history only its worker holds")
        fields["messages"] = tuple(_messages(instructions, request_input))
    except NotRebuilt as why:
        fields["messages"] = None
        fields["load_only_reason"] = f"responses request not rebuilt: {why}"
        return fields
    continued = _continues_final_message(request_input)
    fields["continue_final_message"] = continued
    fields["add_generation_prompt"] = not continued
    return fields


def _request_id(obj: Mapping[str, Any]) -> str | None:
    """vLLM's `request_id` body field: the id its answer will carry (it makes one up without it)."""
    value = obj.get("request_id")
    return value if isinstance(value, str) and value else None


def _reasoning_effort(reasoning: Any) -> str | None:
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise RequestInvalid(f"reasoning must be an object, not {json_type(reasoning)}")
    effort = reasoning.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise RequestInvalid(f"reasoning.effort must be a string, not {json_type(effort)}")
    return effort


def _tools(tools: Any) -> tuple[dict[str, Any], ...] | None:
    """Function tools in the chat shape (`{"type": "function", "function": {...}}`), as vLLM's
    `convert_tool_responses_to_completions_format` makes them; None without any."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestInvalid(f"tools must be a list of tool objects, not {json_type(tools)}")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestInvalid(f"tools[{i}] must be an object, not {json_type(tool)}")
        if tool.get("type") != "function":
            raise NotRebuilt(
                f"tools[{i}] is a {str(tool.get('type'))[:40]!r} tool (only function tools are rebuilt)"
            )
        if not isinstance(tool.get("name"), str):
            raise RequestInvalid(f"tools[{i}].name must be a string")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return tuple(out) or None


def _messages(instructions: str | None, request_input: str | list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(request_input, str):
        messages.append({"role": "user", "content": request_input})
        return messages
    if not request_input:
        raise RequestInvalid("input must not be an empty list")
    for i, item in enumerate(request_input):
        if not isinstance(item, dict):
            raise RequestInvalid(f"input[{i}] must be an object, not {json_type(item)}")
        message = _message(item, messages[-1] if messages else None, f"input[{i}]")
        if message is not None:
            messages.append(message)
    return messages


def _message(item: dict[str, Any], previous: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    """The chat message of one input item, or None when it joined `previous` (an assistant message)."""
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    kind = item.get("type", "message")
    if kind == "function_call":
        call = _tool_call(item, where)
        if assistant is not None:
            calls = assistant.get("tool_calls")
            if calls is None:
                assistant["tool_calls"] = [call]
            else:
                calls.append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "function_call_output":
        output, call_id = item.get("output"), item.get("call_id")
        if not isinstance(output, str) or not isinstance(call_id, str):
            raise NotRebuilt(f"{where} is a function_call_output without a string output and call_id")
        return {"role": "tool", "content": output, "tool_call_id": call_id}
    if kind == "reasoning":
        reasoning = _reasoning_text(item, where)
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind != "message":
        raise NotRebuilt(f"{where} is a {str(kind)[:40]!r} item")
    role = item.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:
        raise NotRebuilt(f"{where} has role {str(role)[:40]!r}")
    content = item.get("content")
    if role != "assistant":
        _check_input_parts(content, where)
        return item
    text = _assistant_text(item, content, where)
    if assistant is not None and assistant.get("content") is None:
        assistant["content"] = text
        return None
    return {"role": "assistant", "content": text}


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    if item.get("namespace") is not None:
        raise NotRebuilt(f"{where} calls a namespaced tool")
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
        raise NotRebuilt(f"{where} is a function_call without string call_id, name and arguments")
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    if item.get("encrypted_content"):
        raise NotRebuilt(f"{where} carries encrypted reasoning (vLLM refuses it)")
    if not isinstance(item.get("summary"), list):
        raise NotRebuilt(f"{where} is a reasoning item without a summary list")
    for key in ("content", "summary"):  # the first content text, else the first summary text
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            text = parts[0].get("text") if isinstance(parts[0], dict) else None
            if not isinstance(text, str):
                raise NotRebuilt(f"{where}.{key}[0] has no string text")
            return text
    return ""


def _assistant_text(item: dict[str, Any], content: Any, where: str) -> str:
    """An assistant message's text as vLLM takes it: the string, or its first part's text. vLLM's
    request model accepts a list of `output_text` parts only in an output message (with an `id` and a
    `status`) and of `input_text` parts only in an input message."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content or not all(isinstance(p, dict) for p in content):
        raise NotRebuilt(f"{where} has assistant content of another shape")
    output_message = isinstance(item.get("id"), str) and item.get("status") in ("completed", *_PARTIAL)
    wanted = "output_text" if output_message else "input_text"
    if any(p.get("type") != wanted or not isinstance(p.get("text"), str) for p in content):
        raise NotRebuilt(f"{where} has assistant parts other than {wanted}")
    text: str = content[0]["text"]
    return text


def _check_input_parts(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if isinstance(content, list) and all(_is_input_text(p) for p in content):
        return
    raise NotRebuilt(f"{where} has content other than text (images and files are not rebuilt)")


def _is_input_text(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "input_text" and isinstance(part.get("text"), str)


def _continues_final_message(request_input: str | list[Any]) -> bool:
    """vLLM's `should_continue_final_message`: the last item is a message or reasoning still in progress."""
    last = request_input[-1] if isinstance(request_input, list) and request_input else None
    return (
        isinstance(last, dict)
        and last.get("type", "message") in ("message", "reasoning")
        and last.get("status") in _PARTIAL
    )
