"""The Anthropic Messages API request as the chat vLLM serves: checked against vLLM 0.33.0's own code.

`tests/request/engines/vllm-0.33.0/anthropic.json` holds, per request body, the chat vLLM's
`to_chat_completion_request` built with inline system messages kept and merged, and vLLM's
`_detect_merge_inline_system` on the shared tokenizers' chat templates
(`generate_anthropic_fixtures.py`). The real tokenizers then check the prompt end to end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from extproc.errors import RequestInvalid
from extproc.request.anthropic import MESSAGES_PATH, needs_system_first
from extproc.request.chat_template import vllm_tool
from extproc.request.parse import ParsedRequest, parse_openai_body
from extproc.request.tokenizer import ByteTokenizer, HfTokenizer, RequestTokenizer

FIXTURES = json.loads((Path(__file__).parent / "engines" / "vllm-0.33.0" / "anthropic.json").read_text())
CASES = {case["name"]: case for case in FIXTURES["cases"]}
# ../shared/tokenizers beside the checkout (looked for upwards: mutation runs copy the tests deeper)
TOKENIZERS = next(
    (
        p / "shared" / "tokenizers"
        for p in Path(__file__).resolve().parents
        if (p / "shared" / "tokenizers").is_dir()
    ),
    Path("/nonexistent/shared/tokenizers"),
)
NOT_REBUILT = {"an_image_block"}  # vLLM renders images; the picker routes such a request on load


def parse(body: dict[str, Any]) -> ParsedRequest:
    return parse_openai_body(json.dumps(body).encode(), MESSAGES_PATH, max_bytes=1 << 20)


def plain(messages) -> list[dict[str, Any]]:
    return [dict(m) for m in messages]


def test_the_fixtures_come_from_vllms_code():
    assert FIXTURES["engine"] == "vllm 0.33.0" and len(CASES) >= 25
    assert FIXTURES["merge_inline_system"] == {"llama3_1": True, "qwen3": False}


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "error" not in c and n not in NOT_REBUILT])
def test_the_chat_is_the_one_vllm_serves(name):
    case = CASES[name]
    request = parse(case["body"])
    assert request.kind == "chat" and request.load_only_reason is None
    inline, merged = case["inline"], case["merged"]
    assert plain(request.messages) == inline["messages"]
    assert plain(request.system_merged or request.messages) == merged["messages"]
    tools = [vllm_tool(t) for t in request.tools] if request.tools is not None else None
    assert tools == inline["tools"]
    assert request.reasoning_effort == inline["reasoning_effort"]
    assert dict(request.chat_template_kwargs) == (inline["chat_template_kwargs"] or {})
    assert (request.max_tokens, request.stream, request.cache_salt) == (
        inline["max_tokens"], bool(inline["stream"]), inline["cache_salt"],
    )  # fmt: skip


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "error" in c or n in NOT_REBUILT])
def test_what_vllm_refuses_or_renders_otherwise_is_not_rebuilt(name):
    try:
        request = parse(CASES[name]["body"])
    except RequestInvalid:
        assert "error" in CASES[name]
        return
    assert request.messages is None and request.load_only_reason


@pytest.mark.parametrize("tokenizer", sorted(FIXTURES["merge_inline_system"]))
def test_the_system_first_probe_decides_as_vllm_for_the_shared_tokenizers(tokenizer):
    config = json.loads((TOKENIZERS / tokenizer / "tokenizer_config.json").read_text())
    expected = FIXTURES["merge_inline_system"][tokenizer]
    assert needs_system_first(config["chat_template"]) is expected
    assert RequestTokenizer(HfTokenizer(TOKENIZERS / tokenizer), timeout_s=5).merges_inline_system is expected


def test_without_a_template_inline_system_messages_are_merged():
    assert needs_system_first(None) and needs_system_first("")
    assert RequestTokenizer(ByteTokenizer(), timeout_s=5).merges_inline_system


@pytest.mark.parametrize("tokenizer", sorted(FIXTURES["merge_inline_system"]))
@pytest.mark.parametrize(
    "name",
    ["inline_system_messages", "tool_use_and_result", "claude_code_system_blocks_drop_the_billing_header"],
)
async def test_the_prompt_is_the_one_vllm_renders_with_a_real_tokenizer(tokenizer, name):
    """What the pipeline tokenizes (merged or not, as the template needs) against vLLM's own chat."""
    case = CASES[name]
    backend = RequestTokenizer(HfTokenizer(TOKENIZERS / tokenizer), timeout_s=30)
    request = parse(case["body"])
    if request.system_merged is not None and backend.merges_inline_system:
        request = request.__class__(**{**_fields(request), "messages": request.system_merged})
    vllm = case["merged" if FIXTURES["merge_inline_system"][tokenizer] else "inline"]
    chat = json.dumps({"model": "m", "messages": vllm["messages"], "tools": vllm["tools"]}).encode()
    expected = parse_openai_body(chat, "/v1/chat/completions", max_bytes=1 << 20)
    assert await backend.tokenize(request) == await backend.tokenize(expected)


def _fields(request: ParsedRequest) -> dict[str, Any]:
    return {f: getattr(request, f) for f in request.__dataclass_fields__}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m", "max_tokens": 8}, "need `messages`"),
        ({"model": "m", "messages": []}, "max_tokens is required"),
        ({"model": "m", "max_tokens": 0, "messages": []}, "max_tokens is required"),
        ({"model": "m", "max_tokens": 8, "messages": ["hi"]}, "messages[0] must be an object"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
        ),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [3]}]}, "content blocks"),
        ({"model": "m", "max_tokens": 8, "messages": [], "system": 3}, "system must be"),
        ({"model": "m", "max_tokens": 8, "messages": [], "tools": [{"name": "x"}]}, "input_schema"),
        ({"model": "m", "max_tokens": 8, "messages": [], "chat_template_kwargs": []}, "chat_template_kwargs"),
    ],
)
def test_malformed_bodies_are_a_400_naming_the_field(body, message):
    with pytest.raises(RequestInvalid, match=re.escape(message)):
        parse(body)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ([{"type": "tool_addition", "tool": {"name": "x"}}], "tool_addition"),
        ([{"type": "tool_use", "name": "x", "input": {}}], "without an id"),
        (
            [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
            "image",
        ),
    ],
)
def test_blocks_outside_the_rebuilt_shapes_are_routed_on_load(content, reason):
    request = parse({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]})
    assert request.messages is None and reason in request.load_only_reason
