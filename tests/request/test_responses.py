"""The Responses API request as the chat vLLM renders: checked against vLLM 0.33.0's own code.

`tests/request/engines/vllm-0.33.0/responses.json` holds, per request body, the chat messages, the
template's tools and its kwargs that vLLM's `construct_input_messages`, `construct_tool_dicts` and
`build_chat_params` built (`generate_responses_fixtures.py`), or the error vLLM raised.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from extproc.errors import RequestInvalid
from extproc.request.chat_template import vllm_tool
from extproc.request.parse import ParsedRequest, parse_openai_body
from extproc.request.responses import RESPONSES_PATH
from extproc.request.tokenizer import template_kwargs

FIXTURES = json.loads((Path(__file__).parent / "engines" / "vllm-0.33.0" / "responses.json").read_text())
CASES = {case["name"]: case for case in FIXTURES["cases"]}


def parse(body: dict[str, Any]) -> ParsedRequest:
    return parse_openai_body(json.dumps(body).encode(), RESPONSES_PATH, max_bytes=1 << 20)


def test_the_fixtures_come_from_vllms_code():
    assert FIXTURES["engine"] == "vllm 0.33.0"
    assert len(CASES) >= 25 and sum("error" in c for c in CASES.values()) >= 3


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "error" not in c])
def test_the_chat_is_the_one_vllm_renders(name):
    case = CASES[name]
    request = parse(case["body"])
    assert request.responses_api and request.kind == "chat" and request.load_only_reason is None
    assert [dict(m) for m in request.messages] == case["messages"]
    tools = [vllm_tool(t) for t in request.tools] if request.tools is not None else None
    assert tools == case["tools"]
    assert template_kwargs(request) == case["chat_template_kwargs"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "error" in c])
def test_what_vllm_refuses_is_not_rebuilt(name):
    """vLLM answers these 400; the picker does not guess a prompt for them (it routes on load, and the
    engine's answer reaches the client) or refuses them itself."""
    try:
        request = parse(CASES[name]["body"])
    except RequestInvalid:
        return
    assert request.messages is None and request.load_only_reason


def test_sampling_fields_map_to_what_routing_reads():
    request = parse(CASES["sampling_fields_do_not_change_the_prompt"]["body"])
    assert (request.max_tokens, request.stream, request.cache_salt) == (64, True, "tenant-a")


def test_a_follow_up_of_a_stored_response_is_routed_on_load_and_names_it():
    request = parse({"model": "m", "input": "and then?", "previous_response_id": "resp_1"})
    assert request.previous_response_id == "resp_1"
    assert request.messages is None and "history" in request.load_only_reason


def test_vllms_request_id_field_is_the_answers_id():
    assert parse({"model": "m", "input": "hi", "request_id": "resp_mine"}).response_id == "resp_mine"
    assert parse({"model": "m", "input": "hi"}).response_id is None


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}, "images"),
        ({"type": "custom_tool_call", "call_id": "c", "name": "x", "input": "y"}, "custom_tool_call"),
        (
            {"type": "function_call", "call_id": "c", "name": "x", "arguments": "{}", "namespace": "ns"},
            "namespaced",
        ),
        ({"role": "tool", "content": "x"}, "role"),
        ({"type": "message", "role": [], "content": "x"}, "role"),  # found by benchmarks/fuzz.py
        (
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "x"}]},
            "output",
        ),
    ],
)
def test_items_outside_the_rebuilt_shapes_are_routed_on_load(item, reason):
    request = parse({"model": "m", "input": [{"role": "user", "content": "hi"}, item]})
    assert request.messages is None and reason in request.load_only_reason


def test_a_tool_other_than_a_function_is_routed_on_load():
    request = parse({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    assert request.messages is None and "web_search" in request.load_only_reason


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m"}, "need `input`"),
        ({"model": "m", "input": 3}, "input must be a string or a list"),
        ({"model": "m", "input": []}, "empty"),
        ({"model": "m", "input": ["hi"]}, "input[0] must be an object"),
        ({"model": "m", "input": "hi", "instructions": 1}, "instructions must be a string"),
        ({"model": "m", "input": "hi", "previous_response_id": ""}, "previous_response_id"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "tools": {}}, "tools must be a list"),
        ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "m", "input": "hi", "reasoning": "high"}, "reasoning must be an object"),
        ({"model": "m", "input": "hi", "chat_template_kwargs": []}, "chat_template_kwargs"),
    ],
)
def test_malformed_bodies_are_a_400_naming_the_field(body, message):
    with pytest.raises(RequestInvalid, match=re.escape(message)):
        parse(body)
