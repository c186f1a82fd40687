"""Tokenizer backends: HF rendering and encoding, the engine /tokenize client, and the picker's facade."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tokenizers import Tokenizer as RawTokenizer

from extproc.errors import TokenizerUnavailable
from extproc.request.chat_template import ChatTemplate, build_conversation
from extproc.request.parse import ParsedRequest, body_prefixes, parse_openai_body, parse_shared_body
from extproc.request.tokenizer import (
    ByteTokenizer,
    HfTokenizer,
    RemoteTokenizer,
    RequestTokenizer,
    Tokenizer,
    load_tokenizer,
    template_kwargs,
)
from tests.tokenizer_files import BOS, PARTS_TEMPLATE, write_tokenizer_dir

H = "<|start_header_id|>"
E = "<|end_header_id|>"
EOT = "<|eot_id|>"

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "hello"},
            {"type": "image_url", "image_url": {"url": "u"}},
            {"type": "text", "text": "world"},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny é <b>"}]},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

# What transformers renders for CONVERSATION + TOOLS with LLAMA_TEMPLATE, written out by hand: block lines
# vanish (trim_blocks + lstrip_blocks), each expression line keeps its newline, parts join with "\n", the
# image part is dropped ("string" content format), the tool gets vLLM's null description, arguments become an
# object, tojson keeps é and <b>.
EXPECTED_PROMPT = (
    f"{BOS}\n"
    f'{H}system{E}\n\nTools:\n\n{{\n  "type": "function",\n  "function": {{\n    "name": "get_weather",\n'
    f'    "description": null,\n    "parameters": {{\n      "type": "object"\n    }}\n  }}\n}}\n\n{EOT}\n'
    f"{H}system{E}\n\n\nYou are a helpful assistant.\n{EOT}\n"
    f"{H}user{E}\n\n\nhello\nworld\n{EOT}\n"
    f'{H}assistant{E}\n\n\nget_weather({{"city": "Paris"}})\n{EOT}\n'
    f"{H}tool{E}\n\n\nsunny é <b>\n{EOT}\n"
    f"{H}assistant{E}\n\n\n"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_dir(tmp_path_factory.mktemp("tok") / "llama")


@pytest.fixture(scope="module")
def hf(tok_dir: Path) -> HfTokenizer:
    return HfTokenizer(tok_dir)


def raw(tok_dir: Path) -> RawTokenizer:
    return RawTokenizer.from_file(str(tok_dir / "tokenizer.json"))


def parsed(body: dict[str, Any]) -> ParsedRequest:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    return parse_openai_body(json.dumps(body).encode(), path, max_bytes=1 << 20)


# --- HfTokenizer ---------------------------------------------------------------------------------------


def test_render_matches_hand_written_prompt(hf: HfTokenizer):
    assert hf.render_chat(CONVERSATION, tools=TOOLS) == EXPECTED_PROMPT


def test_encode_chat_encodes_rendered_text_without_adding_special_tokens(hf: HfTokenizer, tok_dir: Path):
    ids = hf.encode_chat(CONVERSATION, tools=TOOLS)
    assert ids == raw(tok_dir).encode(EXPECTED_PROMPT, add_special_tokens=False).ids
    bos_id = raw(tok_dir).token_to_id(BOS)
    assert ids[0] == bos_id and ids[1] != bos_id  # the template's BOS, not a second one


def test_encode_text_uses_the_post_processor_like_vllm_completions(hf: HfTokenizer, tok_dir: Path):
    ids = hf.encode_text("hello world")
    assert ids == raw(tok_dir).encode("hello world").ids
    assert ids[0] == raw(tok_dir).token_to_id(BOS)


@pytest.mark.parametrize(
    "kwargs, ending",
    [
        ({}, f"{H}assistant{E}\n\n\n"),
        ({"add_generation_prompt": False}, f"hi\n{EOT}\n"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, f"{H}assistant{E}\n\n\n<think></think>\n"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, f"{H}assistant{E}\n\n\n"),  # param wins
        ({"chat_template_kwargs": {"bos_token": "<BOS>"}}, f"{H}assistant{E}\n\n\n"),
    ],
)
def test_generation_prompt_and_template_kwargs(hf: HfTokenizer, kwargs: dict[str, Any], ending: str):
    text = hf.render_chat([{"role": "user", "content": "hi"}], **kwargs)
    assert text.endswith(ending)
    expected_bos = kwargs.get("chat_template_kwargs", {}).get("bos_token", BOS)
    assert text.startswith(expected_bos + "\n" + H)


def test_continue_final_message_cuts_after_the_final_text(hf: HfTokenizer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is "}]
    text = hf.render_chat(
        messages, add_generation_prompt=False, chat_template_kwargs={"continue_final_message": True}
    )
    assert text.endswith(f"{H}assistant{E}\n\n\nThe answer is")


def test_template_file_overrides_tokenizer_config(tmp_path: Path):
    tok = HfTokenizer(write_tokenizer_dir(tmp_path, template_file="FILE {{ messages | length }}"))
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "FILE 1"


@pytest.mark.parametrize(
    "template_file, extra, expected",
    [
        (None, {"tool_use": "T", "default": "D"}, ["D", "T"]),  # the config's template is not read
        (None, {"tool_use": "T"}, [None, "T"]),  # ...even when that leaves no default
        ("F", {"tool_use": "T"}, ["F", "T"]),
        ("F", {"default": "D"}, ["D", "D"]),  # a default.jinja beats chat_template.jinja
    ],
)
def test_template_files_replace_the_configs_templates_as_transformers_5_loads_them(
    tmp_path: Path, template_file: str | None, extra: dict[str, str], expected: list[str | None]
):
    root = write_tokenizer_dir(tmp_path, chat_template="CONFIG", template_file=template_file)
    (root / "additional_chat_templates").mkdir()
    for name, source in extra.items():
        (root / "additional_chat_templates" / f"{name}.jinja").write_text(source)
    tok = HfTokenizer(root)
    rendered: list[str | None] = []
    for tools in (None, TOOLS):
        try:
            rendered.append(tok.render_chat([{"role": "user", "content": "x"}], tools=tools))
        except TokenizerUnavailable:
            rendered.append(None)
    assert rendered == expected  # what transformers 5.20 and 5.24 render from the same files


def test_list_of_templates_uses_default_or_tool_use_with_tools(tmp_path: Path):
    templates = [
        {"name": "default", "template": "D"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    tok = HfTokenizer(write_tokenizer_dir(tmp_path, chat_template=templates))
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "D"
    assert tok.render_chat([{"role": "user", "content": "x"}], tools=TOOLS) == "T1"


def test_list_without_default_and_no_template_raise(tmp_path: Path):
    tok = HfTokenizer(write_tokenizer_dir(tmp_path / "a", chat_template=[{"name": "rag", "template": "R"}]))
    with pytest.raises(TokenizerUnavailable, match="no default chat template"):
        tok.encode_chat([{"role": "user", "content": "x"}])
    bare = HfTokenizer(write_tokenizer_dir(tmp_path / "b", chat_template=None))
    with pytest.raises(TokenizerUnavailable):
        bare.encode_chat([{"role": "user", "content": "x"}])
    assert bare.encode_text("hello") == tok.encode_text("hello")


SPECIAL_VARS = "".join(f"{{{{ {name}_token }}}}|" for name in ("bos", "pad", "unk", "image", "video", "boi"))


@pytest.mark.parametrize(
    "config, expected",
    [
        ({}, "<s>|<pad>|<unk>|<img>|<vid>|<boi>|"),  # legacy directory: special_tokens_map.json wins
        ({"added_tokens_decoder": {}}, "|<pad>||<img>|<vid>||"),  # current one: the map is not read
    ],
)
def test_template_special_tokens_are_transformers_5s_special_tokens_map(
    tmp_path: Path, config: dict[str, Any], expected: str
):
    """Named tokens, other `*_token` entries, the `extra_special_tokens` dict; no additional_special_tokens.

    The expectations are what transformers 5.20 and 5.24 `apply_chat_template` render from these files.
    """
    root = write_tokenizer_dir(
        tmp_path,
        chat_template=SPECIAL_VARS + "{{ additional_special_tokens is defined }}",
        config={
            "bos_token": None,
            "pad_token": {"__type": "AddedToken", "content": "<pad>", "special": True},
            "image_token": "<img>",
            "add_bos_token": True,
            "additional_special_tokens": ["<x>"],
            "extra_special_tokens": {"video_token": "<vid>"},
            **config,
        },
    )
    (root / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "unk_token": "<unk>", "boi_token": "<boi>"})
    )
    assert HfTokenizer(root).render_chat([{"role": "user", "content": "x"}]) == expected + "False"


def test_parts_template_gets_openai_content_format(tmp_path: Path):
    tok = HfTokenizer(write_tokenizer_dir(tmp_path, chat_template=PARTS_TEMPLATE))
    assert tok.chat_templates["default"].content_format == "openai"
    text = tok.render_chat([*CONVERSATION[:2], {"role": "assistant", "content": "ok"}])
    assert text == "system:[You are a helpful assistant.]\nuser:[hello]<image>[world]\nassistant:[ok]\n"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "string"),
        ("{% for m in messages %}{% for c in m['content'] %}{{ c }}{% endfor %}{% endfor %}", "openai"),
        ("{% for m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}", "openai"),
        (
            "{% set ms = messages[1:] %}{% for m in ms %}{% for c in m.content | list %}{% endfor %}"
            "{% endfor %}",
            "openai",
        ),
        ("{% for c in messages[0]['content'] %}{{ c }}{% endfor %}", "string"),
        (
            "{% for a, b in messages %}{% for c in b.content %}{% endfor %}{% endfor %}",
            "string",
        ),  # vLLM gives up
    ],
)
def test_content_format_detection_follows_vllm(source: str, expected: str):
    assert ChatTemplate(source).content_format == expected


@pytest.mark.parametrize(
    "source, messages, expected",
    [
        ("{{ strftime_now('%Y') | length }}", [], "4"),
        (
            "{% for m in messages %}{{ m.role }}{% if loop.index == 1 %}{% break %}{% endif %}{% endfor %}",
            [{"role": "a"}, {"role": "b"}],
            "a",
        ),
        ("{% generation %}G{{ messages | length }}{% endgeneration %}", [{"role": "u"}], "G1"),
        ("{{ {'k': 'é<&>'} | tojson }}", [], '{"k": "é<&>"}'),
        (
            "{{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':'), sort_keys=true) }}",
            [],
            '{"a":[1,2],"b":1}',
        ),
        ("  {% if true %}\n  x\n  {% endif %}\n", [], "  x\n"),
    ],
)
def test_template_environment_matches_transformers(source: str, messages: list[Any], expected: str):
    assert ChatTemplate(source).render(messages, add_generation_prompt=False) == expected


@pytest.mark.parametrize(
    "source, match",
    [
        ("{{ raise_exception('no system role') }}", "no system role"),
        ("{{ messages[0]['content'] + 1 }}", "TypeError"),
        ("{{ messages.append(1) }}", "SecurityError"),
        ("{{ messages[5].content.strip() }}", "UndefinedError"),
    ],
)
def test_template_failures_are_tokenizer_unavailable(source: str, match: str):
    with pytest.raises(TokenizerUnavailable, match=match):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_unknown_role_raises_through_raise_exception(hf: HfTokenizer):
    with pytest.raises(TokenizerUnavailable, match="unsupported role: robot"):
        hf.encode_chat([{"role": "robot", "content": "beep"}])


def test_syntax_error_and_missing_files_fail_at_load(tmp_path: Path):
    with pytest.raises(TokenizerUnavailable, match="does not compile"):
        HfTokenizer(write_tokenizer_dir(tmp_path / "a", chat_template="{% for %}"))
    with pytest.raises(TokenizerUnavailable, match=r"tokenizer\.json"):
        HfTokenizer(tmp_path / "missing")
    root = write_tokenizer_dir(tmp_path / "c")
    (root / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(TokenizerUnavailable, match="JSON object"):
        HfTokenizer(root)


def test_build_conversation_keeps_what_vllm_keeps():
    messages = [
        {"role": "user", "content": ["plain", {"type": "text", "text": "typed"}], "name": "bob", "extra": 1},
        {"role": "assistant", "content": "", "tool_calls": [], "reasoning": "hmm"},
        {
            "role": "assistant",
            "content": "c",
            "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}],
        },
        {
            "role": "tool",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "tool_call_id": "c1",
        },
    ]
    assert build_conversation(messages, "string") == [
        {"role": "user", "content": "plain\ntyped", "name": "bob"},
        {"role": "assistant", "content": "", "reasoning": "hmm", "reasoning_content": "hmm"},
        {"role": "assistant", "content": "c", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "a\nb", "tool_call_id": "c1"},
    ]
    assert build_conversation(messages[3:], "openai") == [
        {"role": "tool", "content": "a\nb", "tool_call_id": "c1"}
    ]
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == "{oops"  # the request is not mutated
    with pytest.raises(TokenizerUnavailable, match="unsupported chat content part type 'hologram'"):
        build_conversation([{"role": "user", "content": [{"type": "hologram"}]}], "string")


def test_load_tokenizer_and_protocol_conformance(tok_dir: Path):
    default: Tokenizer = load_tokenizer(None)
    local: Tokenizer = load_tokenizer(str(tok_dir))
    assert isinstance(default, ByteTokenizer) and isinstance(local, HfTokenizer)
    assert isinstance(load_tokenizer(""), ByteTokenizer)


# --- what the request goldens found (tests/request/test_tokenizer_conformance.py): vLLM 0.33's own behaviour

TAGGED = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"


def test_tools_reach_the_template_as_vllms_pydantic_models_dump_them():
    tools = [
        {"type": "function", "function": {"parameters": {"type": "object"}, "name": "f", "x": 1}, "y": 2},
        {"type": "function", "function": {"name": "g", "strict": True}, "defer_loading": True},
    ]
    rendered = ChatTemplate("{{ tools | tojson }}").render([], tools=tools, add_generation_prompt=False)
    f = {"name": "f", "description": None, "parameters": {"type": "object"}}
    g = {"name": "g", "description": None, "parameters": None, "strict": True, "defer_loading": True}
    assert json.loads(rendered) == [
        {"type": "function", "function": f},
        {"type": "function", "function": g, "defer_loading": True},
    ]
    assert rendered.startswith('[{"type": "function", "function": {"name": "f", "description": null, ')


@pytest.mark.parametrize("arguments", ["[1, 2]", '"text"', "42", "", None, [1, 2], "{oops"])
def test_tool_call_arguments_that_are_not_a_json_object_become_an_empty_one(arguments: Any):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    (message,) = build_conversation([{"role": "assistant", "content": None, "tool_calls": [call]}], "string")
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": {}}


def test_reasoning_content_is_an_assistant_messages_reasoning_as_vllm_renames_it():
    messages = [
        {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
        {"role": "assistant", "content": "5", "reasoning": "wins", "reasoning_content": "loses"},
    ]
    first, second = build_conversation(messages, "string")
    assert first == {"role": "assistant", "content": "4", "reasoning": "2+2", "reasoning_content": "2+2"}
    assert second["reasoning"] == second["reasoning_content"] == "wins"


def test_a_system_messages_claude_code_billing_header_line_is_dropped_as_vllm_does():
    header = "x-anthropic-billing-header: cc_version=2.1; cch=5e1f2"
    messages = [
        {"role": "system", "content": f"{header}\nYou are Claude Code."},
        {"role": "system", "content": [{"type": "text", "text": header}, "Second."]},
        {"role": "user", "content": f"{header}\nkept"},
    ]
    assert [m["content"] for m in build_conversation(messages, "string")] == [
        "You are Claude Code.",
        "Second.",
        f"{header}\nkept",
    ]


@pytest.mark.parametrize(
    "messages, expected",
    [
        ([("developer", "d"), ("user", "u")], "[system:d][user:u]"),
        ([("system", "s"), ("developer", "d"), ("user", "u")], "[system:s\n\nd][user:u]"),
        ([("user", "u"), ("developer", "d"), ("system", ""), ("user", "v")], "[system:d][user:u][user:v]"),
        ([("system", "s"), ("user", "u"), ("system", "t")], "[system:s][user:u][system:t]"),  # no developer
    ],
)
def test_developer_messages_become_system_ones_for_templates_without_that_role(messages, expected):
    conversation = [{"role": role, "content": content, "tools": []} for role, content in messages]
    assert ChatTemplate(TAGGED).render(conversation, add_generation_prompt=False) == expected
    knows_it = ChatTemplate(TAGGED + "{% if false %}{{ 'developer' }}{% endif %}")
    role, content = messages[0]
    assert knows_it.render(conversation[:1], add_generation_prompt=False) == f"[{role}:{content}]"


def test_a_developer_message_turned_system_loses_its_tools():
    source = "{% for m in messages %}{{ m.role }} {{ m.tools is defined }}{% endfor %}"
    messages = [{"role": "developer", "content": "d", "tools": [{"name": "t"}]}]
    assert ChatTemplate(source).render(messages, add_generation_prompt=False) == "system False"


@pytest.mark.parametrize(
    "final, expected",
    [
        ("  spaced  ", "[user:q][assistant:  spaced  "),  # the template keeps the spaces, so does the cut
        ("Sure", "[user:q][assistant:Sure"),
        ("q", "[user:q][assistant:q"),  # the final text also appears earlier
    ],
)
def test_continue_final_message_cuts_where_transformers_tags_the_final_text(final: str, expected: str):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": final}]
    kwargs = {"continue_final_message": True}
    rendered = ChatTemplate(TAGGED).render(messages, add_generation_prompt=False, chat_template_kwargs=kwargs)
    assert rendered == expected


def test_continue_final_message_with_content_parts_continues_the_last_text_part(tmp_path: Path):
    tok = HfTokenizer(write_tokenizer_dir(tmp_path, chat_template=PARTS_TEMPLATE))
    parts = [{"type": "text", "text": "one "}, {"type": "image_url", "image_url": {"url": "u"}}]
    text = tok.render_chat(
        [{"role": "assistant", "content": parts}],
        add_generation_prompt=False,
        chat_template_kwargs={"continue_final_message": True},
    )
    assert text == "assistant:[one "


def kwargs(**values: Any) -> dict[str, Any]:
    return {"chat_template_kwargs": values}


@pytest.mark.parametrize(
    "fields, ending",
    [
        (kwargs(add_generation_prompt=False), f"hi\n{EOT}\n{H}assistant{E}\n\n\n"),
        ({"add_generation_prompt": False, **kwargs(add_generation_prompt=True)}, f"ok\n{EOT}\n"),
        ({"add_generation_prompt": False, **kwargs(continue_final_message=True)}, f"ok\n{EOT}\n"),
        (kwargs(enable_thinking=False), f"{H}assistant{E}\n\n\n<think></think>\n"),
        (kwargs(enable_thinking=None, bos_token="auto"), f"{H}assistant{E}\n\n\n"),
    ],
)
async def test_request_fields_win_over_chat_template_kwargs_as_vllm_merges_them(
    tok_dir: Path, fields: dict[str, Any], ending: str
):
    messages = [{"role": "user", "content": "hi"}]
    if fields.get("add_generation_prompt") is False:
        messages.append({"role": "assistant", "content": "ok"})
    tokenizer = RequestTokenizer(HfTokenizer(tok_dir), timeout_s=1.0)
    ids = await tokenizer.tokenize(parsed({"model": "m", "messages": messages, **fields}))
    text = raw(tok_dir).decode(ids, skip_special_tokens=False)
    assert text.startswith(f"{BOS}\n{H}user") and text.endswith(ending)  # null and "auto" kwargs are skipped


async def test_chat_template_kwargs_tools_replace_the_requests_tools_unchanged(tok_dir: Path):
    tokenizer = RequestTokenizer(HfTokenizer(tok_dir), timeout_s=1.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    ids = await tokenizer.tokenize(parsed({**body, "chat_template_kwargs": {"tools": [{"name": "raw"}]}}))
    text = raw(tok_dir).decode(ids, skip_special_tokens=False)
    assert f'Tools:\n\n{{\n  "name": "raw"\n}}\n\n{EOT}' in text


@pytest.mark.parametrize(
    "fields, ending",
    [
        ({"reasoning_effort": "none"}, f"{H}assistant{E}\n\n\n<think></think>\n"),
        ({"reasoning_effort": "high"}, f"{H}assistant{E}\n\n\n"),
        ({"reasoning_effort": "none", **kwargs(enable_thinking=True)}, f"{H}assistant{E}\n\n\n"),
    ],
)
async def test_reasoning_effort_reaches_the_template_with_the_enable_thinking_it_implies(
    tok_dir: Path, fields: dict[str, Any], ending: str
):
    tokenizer = RequestTokenizer(HfTokenizer(tok_dir), timeout_s=1.0)
    request = parsed({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})
    assert raw(tok_dir).decode(await tokenizer.tokenize(request), skip_special_tokens=False).endswith(ending)
    effort = ChatTemplate("{{ reasoning_effort }}").render([], chat_template_kwargs=template_kwargs(request))
    assert effort == fields["reasoning_effort"]
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    in_kwargs = parsed({**chat, **kwargs(reasoning_effort="x")})
    assert template_kwargs(in_kwargs)["reasoning_effort"] == "x"  # an unset field leaves the kwargs' value


async def test_add_special_tokens_field_decides_the_post_processors_special_tokens(tok_dir: Path):
    tokenizer = RequestTokenizer(HfTokenizer(tok_dir), timeout_s=1.0)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    plain = await tokenizer.tokenize(parsed(chat))
    bos = raw(tok_dir).token_to_id(BOS)
    assert await tokenizer.tokenize(parsed({**chat, "add_special_tokens": True})) == [bos, *plain]  # 2 BOS
    assert await tokenizer.tokenize(parsed({**chat, "add_special_tokens": False})) == plain
    completion = {"model": "m", "prompt": "hello world"}
    without = raw(tok_dir).encode("hello world", add_special_tokens=False).ids
    assert await tokenizer.tokenize(parsed({**completion, "add_special_tokens": False})) == without
    assert await tokenizer.tokenize(parsed(completion)) == raw(tok_dir).encode("hello world").ids


async def test_a_chat_requests_documents_reach_the_template_unless_null(tmp_path: Path):
    source = "{% for d in documents or [] %}<{{ d.title }}:{{ d.text }}>{% endfor %}{{ documents is none }}"
    backend = HfTokenizer(write_tokenizer_dir(tmp_path, chat_template=source))
    tokenizer = RequestTokenizer(backend, timeout_s=1.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    docs = [{"title": "t", "text": "x"}]
    rendered = await tokenizer.tokenize(parsed({**body, "documents": docs}))
    assert raw(tmp_path).decode(rendered) == "<t:x>False"
    from_kwargs = await tokenizer.tokenize(parsed({**body, "documents": None, **kwargs(documents=docs)}))
    assert raw(tmp_path).decode(from_kwargs) == "<t:x>False"  # a null field leaves the kwargs' documents
    assert raw(tmp_path).decode(await tokenizer.tokenize(parsed(body))) == "True"


async def test_truncate_prompt_tokens_keeps_the_tokens_vllm_keeps(tok_dir: Path):
    tokenizer = RequestTokenizer(HfTokenizer(tok_dir), timeout_s=1.0)
    text = "the quick brown fox jumps over the lazy dog"
    full = raw(tok_dir).encode(text).ids  # BOS first: the post-processor adds it to completions
    bos, words = full[0], full[1:]

    async def ids(**fields: Any) -> list[int]:
        return await tokenizer.tokenize(parsed({"model": "m", "prompt": text, **fields}))

    assert await ids(truncate_prompt_tokens=4) == [bos, *words[-3:]]  # the tokenizer truncates, BOS kept
    assert await ids(truncate_prompt_tokens=4, truncation_side="left") == full[-4:]  # sliced afterwards
    assert await ids(truncate_prompt_tokens=4, truncation_side="right") == full[:4]
    assert await ids(truncate_prompt_tokens=100) == await ids(truncate_prompt_tokens=-1) == full
    chat = {"model": "m", "messages": [{"role": "user", "content": text}]}
    whole = await tokenizer.tokenize(parsed(chat))
    assert await tokenizer.tokenize(parsed({**chat, "truncate_prompt_tokens": 5})) == whole[-5:]
    assert await ids(prompt=[1, 2, 3, 4, 5], truncate_prompt_tokens=2) == [4, 5]  # token prompts too


# --- RemoteTokenizer against a real aiohttp server on 127.0.0.1 ----------------------------------------


class FakeEngine:
    """A vLLM-shaped /tokenize endpoint that records what it receives; `mode` picks its behaviour."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.mode = "ok"
        self.release = asyncio.Event()
        self.url = ""

    async def tokenize(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.requests.append(payload)
        if self.mode == "hang":
            await self.release.wait()
        if self.mode == "error":
            return web.Response(status=500, text="engine exploded")
        if self.mode == "garbage":
            return web.Response(text="{not json", content_type="application/json")
        if self.mode == "shape":
            return web.json_response({"count": 2})
        if self.mode == "huge-id":  # past u32: block hashing could not take it
            return web.json_response({"tokens": [1, 2**40], "count": 2})
        if "prompt" in payload:
            tokens = [ord(c) for c in payload["prompt"]]
        else:
            tokens = [len(payload["messages"]), int(payload["add_generation_prompt"])]
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    app = web.Application()
    app.router.add_post("/tokenize", fake.tokenize)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    try:
        yield fake
    finally:
        fake.release.set()
        await server.close()


@pytest.fixture
async def remote(engine: FakeEngine) -> AsyncIterator[RemoteTokenizer]:
    client = RemoteTokenizer(engine.url, timeout_s=5.0, cache_size=2)
    try:
        yield client
    finally:
        await client.close()


async def test_remote_sends_vllm_tokenize_payloads(engine: FakeEngine, remote: RemoteTokenizer):
    assert await remote.encode_text("hi", model="m") == [104, 105]
    assert await remote.encode_chat(
        [{"role": "user", "content": "x"}],
        model="m",
        tools=TOOLS,
        add_generation_prompt=False,
        chat_template_kwargs={"enable_thinking": False},
    ) == [1, 0]
    assert engine.requests == [
        {"model": "m", "prompt": "hi", "add_special_tokens": True},
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "add_generation_prompt": False,
            "tools": TOOLS,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ]


async def test_remote_cache_answers_repeats_and_evicts_least_recently_used(
    engine: FakeEngine, remote: RemoteTokenizer
):
    for text in ["a", "a", "b", "a", "c", "b", "a"]:  # capacity 2: c evicts b, b evicts a
        assert await remote.encode_text(text, model="m") == [ord(text)]
    assert [r["prompt"] for r in engine.requests] == ["a", "b", "c", "b", "a"]
    uncached = RemoteTokenizer(engine.url, timeout_s=5.0, cache_size=0)
    try:
        await uncached.encode_text("z", model="m")
        await uncached.encode_text("z", model="m")
    finally:
        await uncached.close()
    assert [r["prompt"] for r in engine.requests][-2:] == ["z", "z"]


async def test_remote_timeout_is_quick_tokenizer_unavailable(engine: FakeEngine):
    engine.mode = "hang"
    client = RemoteTokenizer(engine.url, timeout_s=0.05, cache_size=8)
    start = time.monotonic()
    try:
        with pytest.raises(TokenizerUnavailable, match="did not answer within") as info:
            await client.encode_text("slow", model="m")
    finally:
        await client.close()
    assert time.monotonic() - start < 2.0
    assert isinstance(info.value.__cause__, TimeoutError)


@pytest.mark.parametrize(
    "mode, match",
    [
        ("error", "HTTP 500: engine exploded"),
        ("garbage", "invalid JSON"),
        ("shape", "tokens"),
        ("huge-id", "tokens"),
    ],
)
async def test_remote_bad_answers_are_tokenizer_unavailable(
    engine: FakeEngine, remote: RemoteTokenizer, mode: str, match: str
):
    engine.mode = mode
    with pytest.raises(TokenizerUnavailable, match=match):
        await remote.encode_text("x", model="m")
    engine.mode = "ok"
    assert await remote.encode_text("x", model="m") == [120]  # failures are not cached


async def test_remote_connection_refused_is_tokenizer_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = RemoteTokenizer(f"http://127.0.0.1:{port}", timeout_s=2.0, cache_size=1)
    try:
        with pytest.raises(TokenizerUnavailable, match="unreachable") as info:
            await client.encode_text("x", model="m")
    finally:
        await client.close()
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    "url, timeout_s, cache_size", [("localhost:8000", 1.0, 1), ("http://h", 0.0, 1), ("http://h", 1.0, -1)]
)
def test_remote_rejects_bad_settings(url: str, timeout_s: float, cache_size: int):
    with pytest.raises(ValueError):
        RemoteTokenizer(url, timeout_s=timeout_s, cache_size=cache_size)


# --- RequestTokenizer ----------------------------------------------------------------------------------


class RecordingTokenizer:
    """A `Tokenizer` that records the thread it ran on and can block until released."""

    name = "recording"

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.threads: list[int] = []
        self.gate = gate
        self.fail = fail

    def encode_text(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        self.threads.append(threading.get_ident())
        if self.gate is not None:
            self.gate.wait()
        if self.fail:
            raise RuntimeError("backend bug")
        return [len(text)]

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool | None = None,
    ) -> list[int]:
        return [len(messages), len(chat_template_kwargs or {})]


async def test_request_tokenizer_dispatches_on_request_shape():
    tokenizer = RequestTokenizer.from_settings(None, None, "", timeout_s=1.0, cache_size=0)
    assert tokenizer.name == "bytes"
    assert await tokenizer.tokenize(parsed({"model": "m", "prompt": [5, 6, 7]})) == [5, 6, 7]
    assert await tokenizer.tokenize(parsed({"model": "m", "prompt": "hi"})) == [104, 105]
    chat = parsed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert await tokenizer.tokenize(chat) == ByteTokenizer().encode_chat(chat.messages or ())


async def test_request_tokenizer_local_hf_matches_backend(tok_dir: Path):
    tokenizer = RequestTokenizer.from_settings(str(tok_dir), None, "", timeout_s=1.0, cache_size=0)
    body = {"model": "m", "messages": CONVERSATION, "tools": TOOLS}
    assert (
        await tokenizer.tokenize(parsed(body))
        == raw(tok_dir).encode(EXPECTED_PROMPT, add_special_tokens=False).ids
    )
    prefill = parsed(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        }
    )
    expected = (
        raw(tok_dir)
        .encode(f"{BOS}\n{H}user{E}\n\n\nhi\n{EOT}\n{H}assistant{E}\n\n\nSure", add_special_tokens=False)
        .ids
    )
    assert await tokenizer.tokenize(prefill) == expected


async def test_big_prompts_run_in_a_worker_thread_small_ones_inline():
    backend = RecordingTokenizer()
    tokenizer = RequestTokenizer(backend, timeout_s=5.0, inline_max_bytes=100)
    await tokenizer.tokenize(parsed({"model": "m", "prompt": "small"}))
    await tokenizer.tokenize(parsed({"model": "m", "prompt": "x" * 200}))
    assert backend.threads[0] == threading.get_ident()
    assert backend.threads[1] != threading.get_ident()


async def test_slow_local_tokenization_times_out():
    gate = threading.Event()
    tokenizer = RequestTokenizer(RecordingTokenizer(gate), timeout_s=0.05, inline_max_bytes=0)
    try:
        with pytest.raises(TokenizerUnavailable, match=r"took longer than 0\.05s"):
            await tokenizer.tokenize(parsed({"model": "m", "prompt": "stuck"}))
    finally:
        gate.set()


async def test_backend_failures_become_tokenizer_unavailable(tok_dir: Path, caplog: pytest.LogCaptureFixture):
    tokenizer = RequestTokenizer(RecordingTokenizer(fail=True), timeout_s=1.0)
    with pytest.raises(TokenizerUnavailable, match="RuntimeError: backend bug") as info:
        await tokenizer.tokenize(parsed({"model": "m", "prompt": "x"}))
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "tokenizer recording failed" in caplog.text
    hf_tokenizer = RequestTokenizer(HfTokenizer(tok_dir), timeout_s=1.0)
    with pytest.raises(TokenizerUnavailable, match="unsupported role"):
        await hf_tokenizer.tokenize(parsed({"model": "m", "messages": [{"role": "robot", "content": "x"}]}))


async def test_request_tokenizer_remote_sends_configured_or_request_model(engine: FakeEngine):
    named = RequestTokenizer.from_settings(None, engine.url, "served-name", timeout_s=2.0, cache_size=4)
    own = RequestTokenizer.from_settings(None, engine.url + "/", "", timeout_s=2.0, cache_size=4)
    try:
        assert await named.tokenize(parsed({"model": "alias", "prompt": "ab"})) == [97, 98]
        chat = parsed(
            {
                "model": "alias",
                "messages": [{"role": "user", "content": "x"}],
                "chat_template_kwargs": {"k": 1},
            }
        )
        assert await own.tokenize(chat) == [1, 1]
        assert await own.tokenize(parsed({"model": "m", "prompt": [1, 2]})) == [1, 2]  # no call
    finally:
        await named.close()
        await own.close()
    assert [r["model"] for r in engine.requests] == ["served-name", "alias"]
    assert engine.requests[1]["chat_template_kwargs"] == {"k": 1}


def test_from_settings_rejects_two_backends_and_bad_timeouts(tok_dir: Path):
    with pytest.raises(ValueError, match="not both"):
        RequestTokenizer.from_settings(str(tok_dir), "http://h", "", timeout_s=1.0, cache_size=1)
    with pytest.raises(ValueError, match="timeout_s"):
        RequestTokenizer.from_settings(None, None, "", timeout_s=0, cache_size=1)


class _ThreadRecordingHf(HfTokenizer):
    """The real tokenizer, noting the thread each chat was encoded on."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.threads: list[int] = []

    def encode_chat_ids(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().encode_chat_ids(*args, **kwargs)


@pytest.mark.parametrize("piece_cache_bytes", [1 << 20, 0])
async def test_a_chats_next_turn_parsed_from_the_turn_before_is_tokenized_on_the_loop_when_cached(
    tok_dir: Path, piece_cache_bytes: int
):
    """Its earlier turns' pieces come from the cache: a worker thread would cost two wake-ups and
    free the loop of little (rendering and lookups hold the GIL). Without the piece cache the whole
    prompt is encoded again, and that still goes to a thread."""
    backend = _ThreadRecordingHf(tok_dir, piece_cache_bytes=piece_cache_bytes)
    tokenizer = RequestTokenizer(backend, timeout_s=5.0, inline_max_bytes=1000)
    prefixes = body_prefixes()
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 400} for i in range(20)
    ]
    first = json.dumps({"model": "m", "messages": messages}).encode()
    turn = parse_openai_body(first, "/v1/chat/completions", max_bytes=1 << 20, prefixes=prefixes)
    assert turn.new_bytes is None and turn.body_size > 1000
    ids = await tokenizer.token_ids(turn)  # the first turn: a worker thread
    messages += [{"role": "assistant", "content": "more"}, {"role": "user", "content": "and the next"}]
    second = json.dumps({"model": "m", "messages": messages}).encode()
    shared = parse_shared_body(
        second, "/v1/chat/completions", max_bytes=1 << 20, prefixes=prefixes, max_unshared=1000
    )
    assert shared is not None and shared.new_bytes == 1000
    next_ids = await tokenizer.token_ids(shared)
    whole = parse_openai_body(second, "/v1/chat/completions", max_bytes=1 << 20)
    assert list(next_ids) == list(HfTokenizer(tok_dir, piece_cache_bytes=0).encode_chat(whole.messages or []))
    assert len(next_ids) > len(ids)
    loop = threading.get_ident()
    assert backend.threads[0] != loop
    assert (backend.threads[1] == loop) is (piece_cache_bytes > 0)
