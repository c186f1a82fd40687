"""The Responses API conversion's edges, one behaviour per test (what mutation testing found untested)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.errors import RequestInvalid
from extproc.request.parse import ParsedRequest, parse_openai_body
from extproc.request.responses import RESPONSES_PATH

USER = {"role": "user", "content": "hi"}
OUT = {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
       "content": [{"type": "output_text", "text": "first", "annotations": []},
                   {"type": "output_text", "text": "second", "annotations": []}]}  # fmt: skip
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
TEXT_ONLY = "input[1] has content other than text (images and files are not rebuilt)"


def parse(**fields: Any) -> ParsedRequest:
    return parse_openai_body(json.dumps({"model": "m", **fields}).encode(), RESPONSES_PATH, max_bytes=1 << 20)


def messages(*items: Any) -> list[dict[str, Any]]:
    request = parse(input=list(items))
    assert request.messages is not None, request.load_only_reason
    return [dict(m) for m in request.messages]


def reason(*items: Any) -> str:
    request = parse(input=list(items))
    assert request.messages is None and request.load_only_reason is not None
    return request.load_only_reason


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "responses requests need `input` (a string or a list of input items)"),
        ({"input": None}, "responses requests need `input` (a string or a list of input items)"),
        ({"input": 3}, "input must be a string or a list of input items, not the number 3"),
        ({"input": True}, "input must be a string or a list of input items, not a boolean"),
        ({"input": {}}, "input must be a string or a list of input items, not an object"),
        ({"input": []}, "input must not be an empty list"),
        ({"input": ["x"]}, "input[0] must be an object, not a string"),
        ({"input": [USER, None]}, "input[1] must be an object, not null"),
        ({"input": "x", "instructions": []}, "instructions must be a string, not an array"),
        ({"input": "x", "previous_response_id": ""}, "previous_response_id must be a non-empty string"),
        ({"input": "x", "previous_response_id": 3}, "previous_response_id must be a non-empty string"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens must be a positive integer"),
        ({"input": "x", "max_output_tokens": True}, "max_output_tokens must be a positive integer"),
        ({"input": "x", "max_output_tokens": "5"}, "max_output_tokens must be a positive integer"),
        ({"input": "x", "chat_template_kwargs": "k"}, "chat_template_kwargs must be an object, not a string"),
        ({"input": "x", "reasoning": 1.5}, "reasoning must be an object, not the number 1.5"),
        ({"input": "x", "reasoning": {"effort": 2}}, "reasoning.effort must be a string, not the number 2"),
        ({"input": "x", "tools": "t"}, "tools must be a list of tool objects, not a string"),
        ({"input": "x", "tools": [[]]}, "tools[0] must be an object, not an array"),
        ({"input": "x", "tools": [{"type": "function", "name": 3}]}, "tools[0].name must be a string"),
    ],
)
def test_each_refusal_says_exactly_what_to_fix(fields, message):
    with pytest.raises(RequestInvalid) as caught:
        parse(**fields)
    assert caught.value.message == message


def test_the_smallest_output_budget_and_the_effort_are_read():
    request = parse(input="x", max_output_tokens=1, reasoning={"effort": "low"})
    assert (request.max_tokens, request.reasoning_effort) == (1, "low")
    assert parse(input="x", reasoning={}).reasoning_effort is None


@pytest.mark.parametrize(("value", "expected"), [("resp_a", "resp_a"), ("", None), (5, None), (None, None)])
def test_only_a_non_empty_string_request_id_names_the_answer(value, expected):
    assert parse(input="x", request_id=value).response_id == expected


def test_a_function_tool_keeps_every_field_but_its_type_in_the_chat_shape():
    tool = {
        "type": "function",
        "name": "f",
        "description": "d",
        "parameters": {"type": "object"},
        "strict": True,
    }
    assert parse(input="x", tools=[tool]).tools == (
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True},
        },
    )
    assert parse(input="x", tools=[]).tools is None


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"type": "web"}, "input[1] is a 'web' item"),
        ({"type": "x" * 60}, f"input[1] is a {'x' * 40!r} item"),
        ({"role": "r" * 60, "content": "x"}, f"input[1] has role {'r' * 40!r}"),
        ({"role": "user", "content": [{"type": "input_text", "text": 3}]}, TEXT_ONLY),
        ({"role": "user", "content": None}, TEXT_ONLY),
        ({"role": "assistant", "content": []}, "input[1] has assistant content of another shape"),
        ({"role": "assistant", "content": ["x"]}, "input[1] has assistant content of another shape"),
        ({"role": "assistant", "content": None}, "input[1] has assistant content of another shape"),
        # output_text parts belong to an output message (an id and a status), input_text to an input one
        ({"role": "assistant", "id": "m", "content": [{"type": "output_text", "text": "x"}]},
         "input[1] has assistant parts other than input_text"),
        ({"role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "x"}]},
         "input[1] has assistant parts other than input_text"),
        ({**OUT, "content": [{"type": "input_text", "text": "x"}]},
         "input[1] has assistant parts other than output_text"),
        ({**CALL, "name": None}, "input[1] is a function_call without string call_id, name and arguments"),
        ({**CALL, "call_id": None}, "input[1] is a function_call without string call_id, name and arguments"),
        ({**CALL, "arguments": {}}, "input[1] is a function_call without string call_id, name and arguments"),
        ({"type": "function_call_output", "call_id": 1, "output": "x"},
         "input[1] is a function_call_output without a string output and call_id"),
        ({"type": "reasoning", "summary": [], "encrypted_content": "e"},
         "input[1] carries encrypted reasoning (vLLM refuses it)"),
        ({"type": "reasoning", "content": []}, "input[1] is a reasoning item without a summary list"),
        ({"type": "reasoning", "summary": ["s"]}, "input[1].summary[0] has no string text"),
        ({"type": "reasoning", "summary": [], "content": [{"text": 1}]},
         "input[1].content[0] has no string text"),
    ],
)  # fmt: skip
def test_each_shape_not_rebuilt_says_where_and_why(item, expected):
    assert reason(USER, item) == f"responses request not rebuilt: {expected}"


def test_a_tool_that_is_not_a_function_is_named():
    request = parse(input="x", tools=[{"type": "w" * 60}])
    assert (
        request.load_only_reason
        == f"responses request not rebuilt: tools[0] is a {'w' * 40!r} tool (only function tools are rebuilt)"
    )


def test_a_follow_up_says_why_it_is_routed_on_load():
    request = parse(input="x", previous_response_id="r")
    assert request.load_only_reason == (
        "responses request not rebuilt: it continues a stored response, whose history only its worker holds"
    )


def test_an_output_message_and_an_input_one_give_their_first_text():
    assert messages(USER, OUT)[1] == {"role": "assistant", "content": "first"}
    easy = {
        "role": "assistant",
        "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
    }
    assert messages(USER, easy)[1] == {"role": "assistant", "content": "a"}


def test_assistant_messages_merge_only_into_what_is_missing():
    two_texts = messages(USER, OUT, {"role": "assistant", "content": "again"})
    assert two_texts[1:] == [
        {"role": "assistant", "content": "first"},
        {"role": "assistant", "content": "again"},
    ]
    thought = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]}
    assert messages(USER, OUT, thought)[1:] == [{"role": "assistant", "content": "first", "reasoning": "t"}]
    assert messages(USER, thought, thought)[1:] == [{"role": "assistant", "reasoning": "t"}] * 2
    assert messages(USER, thought, OUT)[1:] == [{"role": "assistant", "reasoning": "t", "content": "first"}]
    assert (
        messages(USER, CALL, CALL)[1]["tool_calls"]
        == [{"id": "c1", "function": {"name": "f", "arguments": "{}"}, "type": "function"}] * 2
    )


@pytest.mark.parametrize(
    ("item", "text"),
    [
        ({"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}, "s"),
        ({"type": "reasoning", "summary": [{"text": "s"}], "content": []}, "s"),
        ({"type": "reasoning", "summary": [{"text": "s"}], "content": "not a list"}, "s"),
        ({"type": "reasoning", "summary": []}, ""),
    ],
)
def test_reasoning_is_its_first_content_text_else_its_first_summary_text(item, text):
    assert messages(USER, item)[1] == {"role": "assistant", "reasoning": text}


@pytest.mark.parametrize(
    ("last", "continued"),
    [
        ({"role": "assistant", "content": "x", "status": "in_progress"}, True),  # a message without a type
        ({"type": "reasoning", "summary": [], "status": "incomplete"}, True),
        ({"type": "reasoning", "summary": [], "status": "completed"}, False),
        ({**CALL, "status": "in_progress"}, False),
        ({"role": "assistant", "content": "x"}, False),
    ],
)
def test_only_a_last_message_or_reasoning_in_progress_is_continued(last, continued):
    request = parse(input=[USER, last])
    assert (request.continue_final_message, request.add_generation_prompt) == (continued, not continued)
    assert not parse(input="in_progress").continue_final_message
