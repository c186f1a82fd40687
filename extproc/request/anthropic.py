"""The Anthropic Messages API (`POST /v1/messages`) as the chat request vLLM serves from it.

vLLM 0.33.0 (and SGLang) serve Anthropic's Messages API, which Claude Code and the `anthropic` SDK
speak; vLLM turns each request into a chat completion request
(`AnthropicServingMessages.to_chat_completion_request`, `vllm/entrypoints/anthropic/serving.py`) and
renders that as any chat. `to_chat_fields` does the same, so that the chat path tokenizes the prompt
the engine will; `tests/request/test_anthropic.py` compares it with what vLLM's own code built
(`tests/request/engines/vllm-0.33.0/anthropic.json`).

The rules, as vLLM's:
- `system` (a string, or text blocks joined with no separator) is the first message; a text block
  starting `x-anthropic-billing-header` (Claude Code's per-request hash) is dropped, so it does not
  defeat the prefix cache.
- A message's text blocks are its content (one block: a string; several: text parts); `thinking`
  blocks its `reasoning`; `tool_use` blocks its tool calls (arguments `json.dumps` of the input);
  a user's `tool_result` blocks become tool messages placed before it (their text parts joined by
  newlines), an assistant's become text `Tool result: ...`; `redacted_thinking` and `tool_reference`
  blocks add nothing. A user message left with no content is not sent.
- Inline `system` messages stay in place, unless the chat template needs the system message first
  (vLLM renders [system, user, system, user] to find out: `needs_system_first`); then their text is
  appended to the leading one. Both forms are kept (`messages`, `system_merged`): the tokenizer
  chooses (`extproc.request.tokenizer.RequestTokenizer.merges_inline_system`).
- Tools: `{"type": "function", "function": {name, description, parameters: input_schema (with
  `type: object` when missing), strict, defer_loading}}`. `output_config.effort` is the template's
  `reasoning_effort`; `thinking: {"type": "disabled"}` sets `none`, which vLLM uses unless the template
  ignores it (it then uses `low`: the rendered prompt is the same either way for such templates).

Routed on load (tracked), with the reason: images, `tool_addition` / `tool_removal` blocks, tool
results with images, and shapes vLLM's request model refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import jinja2
import jinja2.ext
import jinja2.sandbox

from extproc.errors import RequestInvalid

MESSAGES_PATH: Final = "/v1/messages"
_BILLING_HEADER: Final = "x-anthropic-billing-header"
_ROLES: Final = frozenset({"user", "assistant", "system"})
_SKIPPED_BLOCKS: Final = frozenset({"redacted_thinking", "tool_reference"})
_PROBE: Final = (
    {"role": "system", "content": "t"},
    {"role": "user", "content": "t"},
    {"role": "system", "content": "t"},
    {"role": "user", "content": "t"},
)


class NotRebuilt(Exception):
    """The prompt cannot be rebuilt exactly as the engine will: route on load only (the message says why)."""


def needs_system_first(chat_template: str | None) -> bool:
    """vLLM's `_detect_merge_inline_system`: whether the template refuses a system message after a user
    one (rendering [system, user, system, user] fails), or there is no template."""
    if not chat_template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    try:
        env.from_string(chat_template).render(messages=list(_PROBE), add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def to_chat_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`ParsedRequest` fields of a Messages API body (already a JSON object with a model).

    Raises `RequestInvalid` for a body vLLM refuses (no `max_tokens`, no `messages`, wrong types); a
    shape whose prompt is not rebuilt here gives `messages` None and `load_only_reason`.
    """
    messages = obj.get("messages")
    if not isinstance(messages, list):
        raise RequestInvalid("messages requests need `messages` (a list of message objects)")
    max_tokens = obj.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:  # a bool or a string: the common fields' 400
        raise RequestInvalid("max_tokens is required: a positive integer")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestInvalid(f"messages[{i}] must be an object")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role not in _ROLES:
            raise RequestInvalid(f"messages[{i}].role must be user, assistant or system")
        if not isinstance(content, str | list):
            raise RequestInvalid(f"messages[{i}].content must be a string or a list of content blocks")
        if isinstance(content, list) and not all(isinstance(b, dict) for b in content):
            raise RequestInvalid(f"messages[{i}].content must be a list of content blocks")
    thinking = obj.get("thinking")
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if isinstance(budget, int) and budget >= max_tokens:
        raise RequestInvalid("thinking.budget_tokens must be less than max_tokens")
    kwargs = obj.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RequestInvalid("chat_template_kwargs must be an object")
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "chat_template_kwargs": MappingProxyType(dict(kwargs or {})),
        "reasoning_effort": _reasoning_effort(obj),
    }
    try:
        fields["tools"] = _tools(obj.get("tools"))
        system = _system_text(obj.get("system"))
        inline = _messages(system, messages, merge=False)
        merged = _messages(system, messages, merge=True)
    except NotRebuilt as why:
        fields["messages"] = None
        fields["load_only_reason"] = f"messages request not rebuilt: {why}"
        return fields
    fields["messages"] = tuple(inline)
    fields["system_merged"] = tuple(merged) if merged != inline else None
    return fields


def _reasoning_effort(obj: Mapping[str, Any]) -> str | None:
    """`output_config.effort`, then `thinking: disabled` over it (vLLM's order)."""
    config, thinking = obj.get("output_config"), obj.get("thinking")
    effort = config.get("effort") if isinstance(config, dict) else None
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        effort = "none"
    return effort if isinstance(effort, str) else None


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if not isinstance(system, list) or not all(isinstance(b, dict) for b in system):
        raise RequestInvalid("system must be a string or a list of text blocks")
    return "".join(_text_blocks(system))


def _text_blocks(blocks: list[dict[str, Any]]) -> list[str]:
    """The texts of `blocks`' non-empty text blocks, Claude Code's billing header left out."""
    out = []
    for block in blocks:
        text = block.get("text")
        if (
            block.get("type") == "text"
            and isinstance(text, str)
            and text
            and not text.startswith(_BILLING_HEADER)
        ):
            out.append(text)
    return out


def _messages(system: str, messages: list[dict[str, Any]], *, merge: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if merge:  # inline system messages join the leading one
        system += "".join(_inline_system(m) or "" for m in messages if m["role"] == "system")
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            text = _inline_system(message)
            if not merge and text:
                out.append({"role": "system", "content": text})
            continue
        converted: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            converted["content"] = content
        else:
            _blocks(role, content, converted, out)
        if not (role == "user" and "content" not in converted):
            out.append(converted)
    return out


def _inline_system(message: dict[str, Any]) -> str | None:
    content = message["content"]
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    return "".join(_text_blocks(content)) or None


def _blocks(
    role: str, blocks: list[dict[str, Any]], converted: dict[str, Any], out: list[dict[str, Any]]
) -> None:
    """A message's content blocks into `converted` (tool messages of a user's results go to `out`)."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                parts.append({"type": "text", "text": text})
            elif text is not None and not isinstance(text, str):
                raise NotRebuilt("a text block's text is not a string")
        elif kind == "thinking":
            thinking = block.get("thinking")
            if isinstance(thinking, str):
                reasoning.append(thinking)
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind == "tool_result":
            if role == "user":
                out.append(_tool_message(block))
            else:
                result = block.get("content")
                if result is not None and not isinstance(result, str):
                    raise NotRebuilt("an assistant's tool_result has content other than a string")
                parts.append({"type": "text", "text": f"Tool result: {result or ''}"})
        elif kind not in _SKIPPED_BLOCKS:
            raise NotRebuilt(f"a {str(kind)[:40]!r} content block")
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if calls:
        converted["tool_calls"] = calls
    if parts:
        converted["content"] = parts[0]["text"] if len(parts) == 1 else parts


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise NotRebuilt("a tool_use block without an id (vLLM makes one up from the clock)")
    if name is not None and not isinstance(name, str):
        raise NotRebuilt("a tool_use block whose name is not a string")
    if arguments is not None and not isinstance(arguments, dict):
        raise NotRebuilt("a tool_use block whose input is not an object")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name or "", "arguments": json.dumps(arguments or {})},
    }


def _tool_message(block: dict[str, Any]) -> dict[str, Any]:
    content, call_id = block.get("content"), block.get("tool_use_id")
    if call_id is not None and not isinstance(call_id, str):
        raise NotRebuilt("a tool_result whose tool_use_id is not a string")
    if isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                text = item.get("text", "")
                if not isinstance(text, str):
                    raise NotRebuilt("a tool_result text part whose text is not a string")
                texts.append(text)
            elif item.get("type") in ("image", "tool_reference"):
                raise NotRebuilt(f"a tool_result with a {item.get('type')} part")
        content = "\n".join(texts)
    elif content is not None and not isinstance(content, str):
        raise NotRebuilt("a tool_result whose content is neither a string nor a list")
    return {"role": "tool", "tool_call_id": call_id or "", "content": content or ""}


def _tools(tools: Any) -> tuple[dict[str, Any], ...] | None:
    """Tools in the chat shape vLLM builds (`ChatCompletionToolsParam`); None without a tools field."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestInvalid("tools must be a list of tool objects")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise RequestInvalid(f"tools[{i}] must be an object with a string name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise RequestInvalid(f"tools[{i}].input_schema must be an object")
        if tool.get("type") not in (None, "custom"):
            raise NotRebuilt(
                f"tools[{i}] is a {str(tool.get('type'))[:40]!r} tool (server tools are not rebuilt)"
            )
        function = {
            "name": tool["name"],
            "description": tool.get("description"),
            "parameters": schema if "type" in schema else {**schema, "type": "object"},
            "strict": tool.get("strict"),
            "defer_loading": tool.get("defer_loading"),
        }
        out.append({"type": "function", "function": function})
    return tuple(out)
