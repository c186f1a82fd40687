"""vLLM's message preparation in `chat_template`: content parts, kept keys, tool calls, merged systems."""

from __future__ import annotations

from typing import Any

import pytest

from extproc.errors import TokenizerUnavailable
from extproc.request.chat_template import ChatTemplate, build_conversation

# loops over a message's content, so the template gets the "openai" content format
OPENAI = (
    "{% for m in messages %}[{{ m.role }}:"
    "{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for c in m.content %}<{{ c.type }}{% if c.text is defined %} {{ c.text }}{% endif %}>{% endfor %}"
    "{% endif %}]{% endfor %}"
)


def _user(content: Any, content_format: Any) -> Any:
    (message,) = build_conversation([{"role": "user", "content": content}], content_format)
    return message["content"]


def test_a_bare_string_part_becomes_a_typed_text_item_in_the_openai_format():
    assert ChatTemplate(OPENAI).content_format == "openai"
    assert _user(["hi", {"type": "text", "text": "there"}], "openai") == [
        {"type": "text", "text": "hi"},
        {"type": "text", "text": "there"},
    ]
    rendered = ChatTemplate(OPENAI).render([{"role": "user", "content": ["hi"]}], add_generation_prompt=False)
    assert rendered == "[user:<text hi>]"


def test_a_bare_string_part_stays_text_in_the_string_format():
    assert _user(["hi", {"type": "text", "text": "there"}], "string") == "hi\nthere"


@pytest.mark.parametrize(
    "part, item",
    [
        ({"image_url": {"url": "u"}}, {"type": "image"}),
        ({"image_embeds": "e"}, {"type": "image"}),
        ({"type": "image_url", "image_url": {"url": "u"}, "uuid": "id"}, {"type": "image"}),
        ({"audio_url": {"url": "u"}}, {"type": "audio"}),
        ({"video_url": {"url": "u"}}, {"type": "video"}),
    ],
)
def test_an_untyped_part_takes_its_type_from_its_media_field(part: dict[str, Any], item: dict[str, Any]):
    assert _user([part, "t"], "openai") == [item, {"type": "text", "text": "t"}]
    assert _user([part, "t"], "string") == "t"  # media placeholders are dropped in the string format


@pytest.mark.parametrize(
    "part",
    [
        {"foo": 1},
        {},
        {"type": None, "text": "t"},
        {"input_image": "u"},  # a field vLLM reads only under its type
        {"type": "text", "text": "t", "uuid": "id"},  # a uuid makes vLLM look for a media field
    ],
)
def test_an_untyped_part_without_a_media_field_is_rejected(part: dict[str, Any]):
    for content_format in ("openai", "string"):
        with pytest.raises(TokenizerUnavailable, match="unsupported chat content part type None"):
            _user([part], content_format)


@pytest.mark.parametrize("part_type", [["text"], {"t": 1}, 5])
def test_a_part_type_that_is_not_a_string_is_rejected(part_type: Any):
    with pytest.raises(TokenizerUnavailable, match="content part type must be a string"):
        _user([{"type": part_type, "text": "t"}], "openai")


# vLLM 0.33's `_collect_extra_fields`: an "openai"-format item keeps the part's keys that no content-part type
# declares (Anthropic's `cache_control`, a thinking block's `signature`); declared ones (`name`, `uuid`) go.
@pytest.mark.parametrize(
    "part, item",
    [
        (
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        ),
        (
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "text", "text": "t", "signature": "s"},
        ),
        ({"type": "refusal", "refusal": "r", "extra": 1}, {"type": "text", "text": "r", "extra": 1}),
        ({"type": "text", "text": "a", "name": "n", "uuid": None}, {"type": "text", "text": "a"}),
        (
            {"type": "image_url", "image_url": {"url": "u"}, "detail": "low"},
            {"type": "image", "detail": "low"},
        ),
    ],
)
def test_an_openai_format_item_keeps_the_parts_undeclared_keys(part: dict[str, Any], item: dict[str, Any]):
    assert _user([part], "openai") == [item]


def test_undeclared_part_keys_reach_a_template_that_dumps_the_content():
    source = "{% for m in messages %}{% for c in m.content %}{{ c | tojson }}{% endfor %}{% endfor %}"
    part = {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
    rendered = ChatTemplate(source).render([{"role": "user", "content": [part]}], add_generation_prompt=False)
    assert rendered == '{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}'


def test_undeclared_part_keys_do_not_change_the_string_format():
    part = {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
    assert _user([part, "b"], "string") == "a\nb"


def test_a_tool_reference_part_is_a_typed_item_in_the_openai_format():
    assert _user([{"type": "tool_reference", "name": "grep"}], "openai") == [
        {"type": "tool_reference", "name": "grep"}
    ]


def test_a_tool_reference_part_renders_as_its_name_in_the_string_format():
    content = ["a", {"type": "tool_reference", "name": "grep"}, "b"]
    assert _user(content, "string") == "a\ngrep\nb"
    rendered = ChatTemplate("{{ messages[0].content }}").render(
        [{"role": "user", "content": content}], add_generation_prompt=False
    )
    assert rendered == "a\ngrep\nb"


def test_a_task_key_that_is_a_string_reaches_the_template():
    messages = [
        {"role": "user", "content": "hi", "task": "summarise", "name": "bob"},
        {"role": "user", "content": "hi", "task": 3},
    ]
    assert build_conversation(messages, "string") == [
        {"role": "user", "content": "hi", "name": "bob", "task": "summarise"},
        {"role": "user", "content": "hi"},
    ]


def test_a_developer_message_keeps_its_tools_for_a_template_that_knows_that_role():
    tools = [{"type": "function", "function": {"name": "t"}}]
    messages = [{"role": "developer", "content": "d", "tools": tools}, {"role": "developer", "content": "e"}]
    assert build_conversation(messages, "string") == [
        {"role": "developer", "content": "d", "tools": tools},
        {"role": "developer", "content": "e", "tools": None},
    ]
    source = (
        "{% for m in messages %}{% if m.role == 'developer' %}{{ m.tools | tojson }};{% endif %}{% endfor %}"
    )
    assert ChatTemplate(source).render(messages, add_generation_prompt=False) == (
        '[{"type": "function", "function": {"name": "t"}}];null;'
    )


@pytest.mark.parametrize("tool_calls", [["call"], [{"function": "f"}], [{"id": "c1"}], [None]])
def test_a_tool_call_without_a_function_object_is_rejected(tool_calls: list[Any]):
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    with pytest.raises(TokenizerUnavailable, match="each tool call needs a `function` object"):
        build_conversation([message], "string")


def test_system_texts_merged_in_the_openai_format_join_their_text_parts_with_newlines():
    messages = [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image_url", "image_url": {"url": "u"}},
                "two",
            ],
        },
        {"role": "user", "content": "u"},
        {"role": "developer", "content": [{"type": "text", "text": "three"}]},
    ]
    rendered = ChatTemplate(OPENAI).render(messages, add_generation_prompt=False)
    assert rendered == "[system:one\ntwo\n\nthree][user:<text u>]"


def test_a_merged_system_message_of_only_media_parts_adds_no_text():
    messages = [
        {"role": "user", "content": "u"},
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
        {"role": "developer", "content": "d"},
    ]
    rendered = ChatTemplate(OPENAI).render(messages, add_generation_prompt=False)
    assert rendered == "[system:d][user:<text u>]"
