"""ChatTemplate rendering details that vLLM 0.33 + transformers 5.20 pin down: tool dumps, the sandbox's
`tojson`, continue_final_message's tag and cut, developer messages, the billing header, content-format
detection. Small inline templates; the reference behaviour is quoted from the module docstring,
transformers' `render_jinja_template` and vLLM's `_detect_content_format`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.errors import TokenizerUnavailable
from extproc.request.chat_template import ChatTemplate, build_conversation, vllm_tool

TAGGED = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
CONTINUE = {"continue_final_message": True}
HEADER = "x-anthropic-billing-header: cc_version=2.1; cch=5e1f2"


def render_continued(source: str, messages: list[dict[str, Any]]) -> str:
    return ChatTemplate(source).render(messages, add_generation_prompt=False, chat_template_kwargs=CONTINUE)


# --- tools as vLLM's pydantic models dump them


def test_a_tool_without_type_is_dumped_as_a_function_tool():
    assert vllm_tool({"function": {"name": "f"}}) == {
        "type": "function",
        "function": {"name": "f", "description": None, "parameters": None},
    }


def test_a_functions_own_defer_loading_is_kept_without_a_tool_level_one():
    tool = {"type": "function", "function": {"name": "f", "defer_loading": True}}
    assert vllm_tool(tool) == {
        "type": "function",
        "function": {"name": "f", "description": None, "parameters": None, "defer_loading": True},
    }


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "function", "function": {"description": "no name"}},
        {"type": "function", "function": {"name": 5}},
        {"type": "function", "function": None},
        {"type": "function"},
    ],
)
def test_a_tool_without_a_function_name_string_is_refused(tool: dict[str, Any]):
    with pytest.raises(TokenizerUnavailable, match="string `name`"):
        ChatTemplate("{{ tools | tojson }}").render([], tools=[tool])


# --- the sandbox


def test_generation_prompt_is_requested_by_default():
    assert ChatTemplate("{{ add_generation_prompt }}").render([]) == "True"


def test_tojson_escapes_non_ascii_when_the_template_asks_for_it():
    source = "{{ 'é' | tojson(ensure_ascii=true) }}|{{ 'é' | tojson }}"
    assert ChatTemplate(source).render([], add_generation_prompt=False) == '"\\u00e9"|"é"'


# --- developer messages


def test_a_template_naming_developer_in_double_quotes_keeps_developer_messages():
    source = TAGGED + '{% if false %}{{ "developer" }}{% endif %}'
    messages = [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]
    assert ChatTemplate(source).render(messages, add_generation_prompt=False) == "[developer:d][user:u]"


NAMED = "{% for m in messages %}[{{ m.role }}:{{ m.content }}:{{ m.name }}]{% endfor %}"


def test_a_leading_developer_message_becomes_system_in_place_keeping_its_name():
    messages = [{"role": "developer", "content": "d", "name": "n"}, {"role": "user", "content": "u"}]
    assert ChatTemplate(NAMED).render(messages, add_generation_prompt=False) == "[system:d:n][user:u:]"


def test_a_developer_message_after_a_user_one_moves_to_the_front_as_system():
    messages = [{"role": "user", "content": "u"}, {"role": "developer", "content": "d"}]
    assert ChatTemplate(TAGGED).render(messages, add_generation_prompt=False) == "[system:d][user:u]"


# --- the billing header


def test_a_billing_header_in_a_plain_string_part_is_dropped_too():
    messages = [{"role": "system", "content": [f"{HEADER}\nYou are Claude Code.", "Second."]}]
    (message,) = build_conversation(messages, "string")
    assert message["content"] == "You are Claude Code.\nSecond."
    (message,) = build_conversation(messages, "openai")
    assert message["content"] == [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Second."},
    ]


def test_only_text_parts_are_checked_for_the_billing_header():
    refusal = {"type": "refusal", "refusal": "r", "text": HEADER}
    (message,) = build_conversation([{"role": "system", "content": [refusal]}], "string")
    assert message["content"] == "r"
    with pytest.raises(TokenizerUnavailable, match="content part of type int"):
        build_conversation([{"role": "system", "content": [5]}], "string")


# --- continue_final_message


def test_continue_final_message_cuts_at_the_last_place_the_final_text_lands():
    source = "{% for m in messages %}<{{ m.content }}>{% endfor %}{{ messages[-1].content }}"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure"}]
    # transformers cuts at the tag's last occurrence (rindex); the earlier copy keeps its tag
    assert render_continued(source, messages) == "<q><SureCONTINUE_FINAL_MESSAGE_TAG >Sure"


@pytest.mark.parametrize(
    "source, match",
    [
        ("{% for m in messages %}{{ m.content[:4] }}{% endfor %}", "dropped the final message"),
        ("{% for m in messages %}{{ m.content | replace('Sure', 'Nope') }}{% endfor %}", "dropped"),
    ],
)
def test_continue_final_message_refuses_a_template_that_drops_the_text_or_its_tag(source: str, match: str):
    with pytest.raises(TokenizerUnavailable, match=match):
        render_continued(source, [{"role": "assistant", "content": "Sure"}])


@pytest.mark.parametrize(
    "source, messages",
    [
        ("{% for m in messages %}{% for v in m.values() %}{{ v }}{% endfor %}{% endfor %}", "Sure"),
        (TAGGED, None),  # no messages at all
    ],
)
def test_continue_final_message_needs_final_content_and_a_template_naming_it(source: str, messages: Any):
    conversation = [] if messages is None else [{"role": "assistant", "content": messages}]
    with pytest.raises(TokenizerUnavailable, match="no final message content"):
        render_continued(source, conversation)


# --- content-format detection (vLLM's `_detect_content_format`)


@pytest.mark.parametrize(
    "source, expected",
    [
        # a variable filtered from something other than `messages` is not a messages alias
        (
            "{% set xs = tools | list %}{% for m in xs %}{% for c in m.content %}{% endfor %}{% endfor %}",
            "string",
        ),
        ("{% for m in messages %}{% for c in m.tool_calls | list %}{% endfor %}{% endfor %}", "string"),
        # a slice of the content is still the content
        ("{% for m in messages %}{% for c in m['content'][1:] %}{% endfor %}{% endfor %}", "openai"),
        ("{% for m in messages %}{% for c in m.content[:] %}{% endfor %}{% endfor %}", "openai"),
        # another key of the message, or the content of something else, is not
        ("{% for m in messages %}{% for c in m['role'] %}{% endfor %}{% endfor %}", "string"),
        ("{% for m in messages %}{% for c in other['content'] %}{% endfor %}{% endfor %}", "string"),
        # aliases are followed transitively
        (
            "{% set a = messages %}{% set b = a | list %}{% for m in b %}{% for c in m.content %}{% endfor %}"
            "{% endfor %}",
            "openai",
        ),
    ],
)
def test_content_format_detection_follows_vllms_ast_walk(source: str, expected: str):
    assert ChatTemplate(source).content_format == expected


# vLLM 0.33 also follows namespace aliases, macros handed a message's content and a bare `content` loop
# (`vllm/renderers/hf.py` `_iter_nodes_assign_var_or_elems`, `_iter_nodes_assign_content_item`).
LOOP_CONTENT = "{% for m in ns.rest %}{% for c in m.content %}{% endfor %}{% endfor %}"
RENDER_MACRO = (
    "{% macro render(parts, prefix='') %}{% for p in parts %}{{ p.text }}{% endfor %}{% endmacro %}"
)


@pytest.mark.parametrize(
    "source",
    [
        "{% set ns = namespace(rest=messages) %}" + LOOP_CONTENT,
        "{% set ns = namespace(rest=messages[1:], other=1) %}" + LOOP_CONTENT,
        "{% set ns = namespace(rest=[]) %}{% set ns.rest = messages %}" + LOOP_CONTENT,
        "{% set a = messages | list %}{% set ns = namespace(rest=a) %}" + LOOP_CONTENT,
        "{% set ns = namespace(x=messages) %}{% set b = ns.x %}"
        "{% for m in b %}{% for c in m['content'] %}{% endfor %}{% endfor %}",
    ],
)
def test_a_namespace_attribute_set_from_messages_is_a_messages_alias(source: str):
    assert ChatTemplate(source).content_format == "openai"


def test_a_namespace_attribute_set_from_something_else_is_not():
    source = "{% set ns = namespace(rest=tools) %}{% set ns.other = messages %}" + LOOP_CONTENT
    assert ChatTemplate(source).content_format == "string"


def test_an_assignment_to_a_tuple_is_no_alias_and_no_reason_to_give_up():
    source = (
        "{% set first, second = messages %}"
        "{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}"
    )
    assert ChatTemplate(source).content_format == "openai"


@pytest.mark.parametrize(
    "call",
    ["render(m.content)", "render(m['content'] | list)", "render(prefix='x', parts=m.content)"],
)
def test_a_macro_looping_over_a_parameter_given_message_content_means_openai(call: str):
    source = RENDER_MACRO + "{% for m in messages %}{{ " + call + " }}{% endfor %}"
    assert ChatTemplate(source).content_format == "openai"


@pytest.mark.parametrize(
    "macros, call",
    [
        (RENDER_MACRO, "render(m.role)"),  # another key of the message
        (RENDER_MACRO, "render(tools)"),
        (RENDER_MACRO, "render(other.content)"),  # the content of something that is no message
        (RENDER_MACRO, "render(m.role, content=m.content)"),  # a keyword that names no parameter
        ("{% macro other(parts) %}{{ parts }}{% endmacro %}", "other(m.content)"),  # no loop in the macro
    ],
)
def test_a_macro_loop_over_anything_else_means_string(macros: str, call: str):
    source = macros + "{% for m in messages %}{{ " + call + " }}{% endfor %}"
    assert ChatTemplate(source).content_format == "string"


def test_every_call_of_a_macro_counts_and_calls_of_other_names_do_not():
    # the call that hands it the content comes first; a later call with something else keeps it
    both = RENDER_MACRO + "{% for m in messages %}{{ render(m.content) }}{{ render(m.role) }}{% endfor %}"
    # a call of another name handing message content does not make `render`'s parameter content
    other = RENDER_MACRO + "{% for m in messages %}{{ render(m.role) }}{{ shout(m.content) }}{% endfor %}"
    assert ChatTemplate(both).content_format == "openai"
    assert ChatTemplate(other).content_format == "string"


def test_a_loop_over_a_variable_named_content_means_openai_outside_macros_only():
    outside = (
        "{% for m in messages %}{% set content = m.content %}{% for c in content %}{% endfor %}{% endfor %}"
    )
    inside = "{% macro f(content) %}{% for c in content %}{% endfor %}{% endmacro %}{{ f(tools) }}"
    assert ChatTemplate(outside).content_format == "openai"
    assert ChatTemplate(inside).content_format == "string"


def test_the_first_content_loop_decides_when_its_target_is_a_tuple():
    tuple_first = (
        "{% for m in messages %}{% for k, v in m.content %}{% endfor %}{% for c in m.content %}{% endfor %}"
    )
    name_first = (
        "{% for m in messages %}{% for c in m.content %}{% endfor %}{% for k, v in m.content %}{% endfor %}"
    )
    assert ChatTemplate(tuple_first + "{% endfor %}").content_format == "string"  # vLLM's assertion fails
    assert ChatTemplate(name_first + "{% endfor %}").content_format == "openai"


def test_a_macro_handed_message_content_renders_its_parts():
    source = (
        RENDER_MACRO
        + "{% set ns = namespace(rest=messages) %}{% for m in ns.rest %}{{ render(m.content) }}{% endfor %}"
    )
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]
    assert ChatTemplate(source).render(messages, add_generation_prompt=False) == "ab"


@pytest.mark.timeout(10)
def test_content_format_detection_terminates_on_aliases_set_from_each_other():
    source = (
        "{% set a = messages %}{% set b = a %}{% set a = b %}{% set messages = messages | list %}"
        "{% for m in a %}{% for c in m.content %}{% endfor %}{% endfor %}"
    )
    assert ChatTemplate(source).content_format == "openai"


def test_openai_format_reaches_the_template_as_parts():
    source = (
        "{% set a = messages %}{% set b = a %}"
        "{% for m in b %}{% for c in m.content %}({{ c.type }}:{{ c.text }}){% endfor %}{% endfor %}"
    )
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url"}]}]
    rendered = ChatTemplate(source).render(messages, add_generation_prompt=False)
    assert rendered == "(text:x)(image:)"


def test_tools_reach_the_template_with_a_default_type():
    rendered = ChatTemplate("{{ tools | tojson }}").render([], tools=[{"function": {"name": "f"}}])
    assert json.loads(rendered)[0]["type"] == "function"
