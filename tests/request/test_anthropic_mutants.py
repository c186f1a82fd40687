"""The Messages API conversion's edges, one behaviour per test (what mutation testing found untested)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.errors import RequestInvalid
from extproc.request.anthropic import MESSAGES_PATH, needs_system_first
from extproc.request.parse import ParsedRequest, parse_openai_body

USER = {"role": "user", "content": "hi"}
SCHEMA = {"type": "object"}
NOT_REBUILT = "messages request not rebuilt: "
NO_ID = "a tool_use block without an id (vLLM makes one up from the clock)"


def parse(**fields: Any) -> ParsedRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [USER], **fields}
    return parse_openai_body(json.dumps(body).encode(), MESSAGES_PATH, max_bytes=1 << 20)


def chat(*messages: Any, **fields: Any) -> list[dict[str, Any]]:
    request = parse(messages=list(messages), **fields)
    assert request.messages is not None, request.load_only_reason
    return [dict(m) for m in request.messages]


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"messages": None}, "messages requests need `messages` (a list of message objects)"),
        ({"messages": "hi"}, "messages requests need `messages` (a list of message objects)"),
        ({"max_tokens": 0}, "max_tokens is required: a positive integer"),
        ({"max_tokens": None}, "max_tokens is required: a positive integer"),
        ({"max_tokens": "5"}, "max_tokens must be an integer >= 0, not a string"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 8}},
            "thinking.budget_tokens must be less than max_tokens",
        ),
        ({"chat_template_kwargs": "x"}, "chat_template_kwargs must be an object"),
        ({"system": 3}, "system must be a string or a list of text blocks"),
        ({"system": ["x"]}, "system must be a string or a list of text blocks"),
        ({"tools": "t"}, "tools must be a list of tool objects"),
        ({"tools": [[]]}, "tools[0] must be an object with a string name"),
        ({"tools": [{"name": 1, "input_schema": SCHEMA}]}, "tools[0] must be an object with a string name"),
        ({"tools": [{"name": "f", "input_schema": []}]}, "tools[0].input_schema must be an object"),
    ],
)
def test_each_refusal_says_exactly_what_to_fix(fields, message):
    with pytest.raises(RequestInvalid) as caught:
        parse(**fields)
    assert caught.value.message == message


def test_the_smallest_budgets_are_accepted():
    assert parse(max_tokens=1).max_tokens == 1
    assert parse(thinking={"type": "enabled", "budget_tokens": 7}).messages is not None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ([{"type": "text", "text": 3}], "a text block's text is not a string"),
        ([{"type": "tool_use", "name": "f"}], NO_ID),
        ([{"type": "tool_use", "id": "", "name": "f"}], NO_ID),
        ([{"type": "tool_use", "id": "t", "name": 3}], "a tool_use block whose name is not a string"),
        ([{"type": "tool_use", "id": "t", "input": []}], "a tool_use block whose input is not an object"),
        ([{"type": "tool_result", "tool_use_id": 3}], "a tool_result whose tool_use_id is not a string"),
        ([{"type": "tool_result", "content": 3}],
         "a tool_result whose content is neither a string nor a list"),
        ([{"type": "tool_result", "content": [{"type": "text", "text": 3}]}],
         "a tool_result text part whose text is not a string"),
        ([{"type": "tool_result", "content": [{"type": "image"}]}], "a tool_result with a image part"),
        ([{"type": "tool_result", "content": [{"type": "tool_reference"}]}],
         "a tool_result with a tool_reference part"),
        ([{"type": "x" * 60}], f"a {'x' * 40!r} content block"),
    ],
)  # fmt: skip
def test_each_block_not_rebuilt_says_why(content, why):
    request = parse(messages=[user(content)])
    assert request.messages is None and request.load_only_reason == NOT_REBUILT + why


def test_an_assistants_tool_result_must_be_text():
    request = parse(
        messages=[USER, assistant([{"type": "tool_result", "content": [{"type": "text", "text": "x"}]}])]
    )
    assert (
        request.load_only_reason == NOT_REBUILT + "an assistant's tool_result has content other than a string"
    )


def test_a_server_tool_is_named():
    request = parse(tools=[{"type": "w" * 60, "name": "s", "input_schema": SCHEMA}])
    assert (
        request.load_only_reason
        == NOT_REBUILT + f"tools[0] is a {'w' * 40!r} tool (server tools are not rebuilt)"
    )


def test_blocks_convert_as_vllm_converts_them():
    assert chat(USER, assistant([{"type": "tool_result"}])) == [
        USER,
        {"role": "assistant", "content": "Tool result: "},
    ]
    texts = [{"type": "text", "text": None}, {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert chat(user(texts))[0] == {"role": "user", "content": texts[1:]}
    thoughts = [
        {"type": "thinking", "thinking": "a"},
        {"type": "thinking", "thinking": "b"},
        {"type": "thinking"},
    ]
    assert chat(USER, assistant(thoughts))[1] == {"role": "assistant", "reasoning": "ab"}
    use = chat(USER, assistant([{"type": "tool_use", "id": "t"}]))[1]
    assert use == {
        "role": "assistant",
        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "", "arguments": "{}"}}],
    }
    result = [
        {
            "type": "tool_result",
            "content": ["skipped", {"type": "text"}, {"type": "text", "text": "x"}, {"type": "doc"}],
        }
    ]
    assert chat(USER, user(result)) == [USER, {"role": "tool", "tool_call_id": "", "content": "\nx"}]
    assert chat(USER, user([{"type": "tool_result"}])) == [
        USER,
        {"role": "tool", "tool_call_id": "", "content": ""},
    ]


def test_system_text_and_inline_system_messages():
    billing = "x-anthropic-billing-header: cch=1;"
    request = parse(system="", messages=[USER])
    assert [dict(m) for m in request.messages] == [USER] and request.system_merged is None
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    inline = [USER, {"role": "system", "content": billing}, {"role": "system", "content": parts}]
    request = parse(system="S", messages=[*inline, {"role": "system", "content": "c"}])
    system = [{"role": "system", "content": "ab"}, {"role": "system", "content": "c"}]
    assert [dict(m) for m in request.messages] == [{"role": "system", "content": "S"}, USER, *system]
    assert [dict(m) for m in request.system_merged] == [{"role": "system", "content": "Sabc"}, USER]
    only_billing = parse(
        messages=[USER, {"role": "system", "content": billing}, {"role": "system", "content": []}]
    )
    assert [dict(m) for m in only_billing.messages] == [USER] and only_billing.system_merged is None


@pytest.mark.parametrize(
    ("fields", "effort"),
    [
        ({"output_config": {"effort": "high"}, "thinking": {"type": "enabled", "budget_tokens": 4}}, "high"),
        ({"output_config": {"effort": 3}}, None),
        ({"output_config": {"effort": "high"}, "thinking": {"type": "disabled"}}, "none"),
        ({"output_config": "high"}, None),
    ],
)
def test_the_effort_is_the_output_configs_unless_thinking_is_disabled(fields, effort):
    assert parse(**fields).reasoning_effort == effort


def test_tools_take_the_chat_shape_with_an_object_schema():
    tools = [
        {"name": "a", "input_schema": {"properties": {}}},
        {"type": "custom", "name": "b", "input_schema": SCHEMA},
    ]
    unset = {"description": None, "strict": None, "defer_loading": None}
    assert parse(tools=tools).tools == (
        {
            "type": "function",
            "function": {"name": "a", "parameters": {"properties": {}, "type": "object"}, **unset},
        },
        {"type": "function", "function": {"name": "b", "parameters": SCHEMA, **unset}},
    )
    with_type = {"name": "c", "input_schema": {"type": "string"}}
    assert parse(tools=[with_type]).tools[0]["function"]["parameters"] == {"type": "string"}


def test_the_probe_renders_without_the_generation_prompt():
    refuses_generation = (
        "{% if add_generation_prompt %}{{ raise_exception('no') }}{% endif %}{{ messages[0].content }}"
    )
    assert not needs_system_first(refuses_generation)
    system_first = (
        "{% for m in messages %}{{ m.content }}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('system first') }}{% endif %}{% endfor %}"
    )
    assert needs_system_first(system_first)


def test_a_tool_result_beside_text_in_an_assistant_turn_is_a_text_part():
    blocks = [{"type": "text", "text": "a"}, {"type": "tool_result", "content": "42"}]
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "Tool result: 42"}]
    assert chat(USER, assistant(blocks))[1] == {"role": "assistant", "content": parts}


def test_the_probe_knows_jinjas_loop_controls_as_vllm_does():
    assert not needs_system_first(
        "{% for m in messages %}{% if loop.index > 9 %}{% break %}{% endif %}{% endfor %}"
    )
