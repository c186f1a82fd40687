"""Records `vllm-0.33.0/anthropic.json`: what vLLM 0.33.0's own code makes of Anthropic Messages requests.

For each request body below, vLLM's `AnthropicMessagesRequest` (pydantic) validates it and
`AnthropicServingMessages.to_chat_completion_request` turns it into the chat request vLLM then
serves (`vllm/entrypoints/anthropic/serving.py`), once with inline system messages kept in place and
once merged into the leading system message (`merge_inline_system`, which vLLM turns on for chat
templates that need the system message first). The file keeps, per case and mode, the chat
messages, the tools as the chat template gets them (`tool.model_dump()`), `reasoning_effort` and
`chat_template_kwargs`, or the error vLLM raises; and, per tokenizer in `../shared/tokenizers/`, what
vLLM's `_detect_merge_inline_system` decides for its chat template. `tests/request/test_anthropic.py`
checks that `extproc.request.anthropic` builds the same.

Run as `generate_responses_fixtures.py` says (the same venv, the same extracted wheel):

    PYTHONPATH=/tmp/vllmw/full /tmp/vv/bin/python tests/request/engines/generate_anthropic_fixtures.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import vllm
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

HERE = Path(__file__).resolve().parent
OUT = HERE / f"vllm-{vllm.__version__}" / "anthropic.json"
TOKENIZERS = HERE.parents[2].parent / "shared" / "tokenizers"

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
READ = {"name": "read_file", "description": "Read a file", "input_schema": SCHEMA}
BILLING = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=4f2a9;"}
USE = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "README.md"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "# extproc\nA picker."}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


CASES: dict[str, dict[str, Any]] = {
    "system_string_and_user_string": {"system": "You are terse.", "messages": [user("Hello")]},
    "no_system": {"messages": [user("Hello")]},
    "claude_code_system_blocks_drop_the_billing_header": {
        "system": [
            BILLING,
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": " Be careful."},
        ],
        "messages": [user("Fix the bug.")],
    },
    "user_text_blocks": {
        "messages": [user([{"type": "text", "text": "first"}, {"type": "text", "text": "second"}])]
    },
    "a_single_text_block_becomes_a_string": {"messages": [user([{"type": "text", "text": "only"}])]},
    "empty_text_blocks_are_dropped": {
        "messages": [user([{"type": "text", "text": ""}, {"type": "text", "text": "kept"}])]
    },
    "multi_turn": {"messages": [user("hi"), assistant("Hello!"), user("How are you?")]},
    "tool_use_and_result": {
        "tools": [READ],
        "messages": [
            user("Read the readme."),
            assistant([{"type": "text", "text": "Reading it."}, USE]),
            user([RESULT]),
            assistant("It says: A picker."),
            user("Thanks"),
        ],
    },
    "tool_result_then_text_in_one_user_turn": {
        "tools": [READ],
        "messages": [
            user("Read it."),
            assistant([USE]),
            user([RESULT, {"type": "text", "text": "and summarise"}]),
        ],
    },
    "tool_result_with_text_parts_and_error": {
        "tools": [READ],
        "messages": [
            user("Read it."),
            assistant([USE]),
            user(
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "no such file"},
                            {"type": "text", "text": "(ENOENT)"},
                        ],
                    }
                ]
            ),
        ],
    },
    "thinking_blocks_become_reasoning": {
        "messages": [
            user("2+2?"),
            assistant(
                [
                    {"type": "thinking", "thinking": "Add them.", "signature": "sig"},
                    {"type": "text", "text": "4"},
                ]
            ),
            user("ok"),
        ],
    },
    "redacted_thinking_alone_leaves_an_empty_assistant_message": {
        "messages": [
            user("q"),
            assistant([{"type": "redacted_thinking", "data": "b3BhcXVl"}]),
            user("again"),
        ],
    },
    "a_tool_result_inside_an_assistant_turn_is_text": {
        "messages": [
            user("q"),
            assistant([{"type": "tool_result", "tool_use_id": "t", "content": "42"}]),
            user("ok"),
        ],
    },
    "inline_system_messages": {
        "system": "Top.",
        "messages": [
            user("hi"),
            {"role": "system", "content": "Reminder: be brief."},
            user("go"),
            {"role": "system", "content": [BILLING, {"type": "text", "text": "Second reminder."}]},
        ],
    },
    "tools_of_every_shape": {
        "tools": [
            READ,
            {"name": "now", "input_schema": {}},
            {**READ, "name": "strict", "strict": True},
            {**READ, "name": "later", "defer_loading": True},
        ],
        "messages": [user("What time is it?")],
    },
    "tool_choice_any": {"tools": [READ], "tool_choice": {"type": "any"}, "messages": [user("read")]},
    "tool_choice_named": {
        "tools": [READ],
        "tool_choice": {"type": "tool", "name": "read_file"},
        "messages": [user("x")],
    },
    "tool_choice_none": {"tools": [READ], "tool_choice": {"type": "none"}, "messages": [user("x")]},
    "thinking_enabled": {
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "max_tokens": 4096,
        "messages": [user("think")],
    },
    "a_thinking_budget_over_max_tokens_is_refused": {
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [user("think")],
    },
    "thinking_disabled": {"thinking": {"type": "disabled"}, "messages": [user("quick")]},
    "output_effort": {"output_config": {"effort": "high"}, "messages": [user("think hard")]},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False}, "messages": [user("x")]},
    "sampling_fields_do_not_change_the_prompt": {
        "messages": [user("x")],
        "stream": True,
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 20,
        "stop_sequences": ["\n\n"],
        "metadata": {"user_id": "u1"},
        "cache_salt": "tenant-a",
    },
    "unicode": {"system": "Réponds en français ☕", "messages": [user("naïve\n\n\tcafé")]},
    "an_image_block": {
        "messages": [
            user(
                [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                    },
                    {"type": "text", "text": "what is this?"},
                ]
            )
        ],
    },
    "missing_max_tokens_is_refused": {"messages": [user("x")], "max_tokens": None},
    "a_bad_role_is_refused": {"messages": [{"role": "tool", "content": "x"}]},
}


def record(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "m", "max_tokens": 64, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    out: dict[str, Any] = {"name": name, "body": copy.deepcopy(body)}
    for mode, merge in (("inline", False), ("merged", True)):
        try:
            request = AnthropicMessagesRequest.model_validate(copy.deepcopy(body))
            chat = AnthropicServingMessages.to_chat_completion_request(request, merge_inline_system=merge)
        except Exception as exc:  # vLLM answers 400
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            return out
        out[mode] = {
            "messages": json.loads(json.dumps(chat.messages, default=_dump)),
            "tools": [t.model_dump() for t in chat.tools] if chat.tools is not None else None,
            "reasoning_effort": chat.reasoning_effort,
            "chat_template_kwargs": chat.chat_template_kwargs,
            "max_tokens": chat.max_tokens,
            "stream": chat.stream,
            "cache_salt": chat.cache_salt,
        }
    return out


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    raise TypeError(f"cannot dump {type(value).__name__}")


def templates() -> dict[str, bool]:
    """vLLM's `_detect_merge_inline_system` on each shared tokenizer's chat template."""
    out = {}
    for config in sorted(TOKENIZERS.glob("*/tokenizer_config.json")):
        template = json.loads(config.read_text()).get("chat_template")
        out[config.parent.name] = AnthropicServingMessages._detect_merge_inline_system(template)
    return out


def main() -> None:
    doc = {
        "generated_by": "tests/request/engines/generate_anthropic_fixtures.py",
        "engine": f"vllm {vllm.__version__}",
        "functions": [
            "vllm.entrypoints.anthropic.protocol.AnthropicMessagesRequest.model_validate",
            "AnthropicServingMessages.to_chat_completion_request(request, merge_inline_system=False | True)",
            "AnthropicServingMessages._detect_merge_inline_system(chat_template)",
        ],
        "merge_inline_system": templates(),
        "cases": [record(name, fields) for name, fields in CASES.items()],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(doc['cases'])} cases to {OUT}")


if __name__ == "__main__":
    main()
