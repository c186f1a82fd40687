"""The request parser's behaviour that its mutants showed unasserted (benchmarks/mutation.py).

A 400's message is what the client reads to fix its request: it names the field, what is accepted
and what was sent, so the whole message is asserted. Then the fields that reach the engine's
tokenizer (special tokens, truncation, documents, reasoning effort) and the path edge cases.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.epp import answers as epp
from extproc.errors import RequestInvalid
from extproc.request.parse import normalize_path, parse_openai_body

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


def parse(body: Any, path: str = CHAT):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_openai_body(raw, path, max_bytes=1 << 20)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


def message_of(body: Any, path: str = CHAT) -> str:
    with pytest.raises(RequestInvalid) as caught:
        parse(body, path)
    return caught.value.message


def tool_call(function: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{"function": function}]}


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        (b"", CHAT, "request body is empty; send the request as a JSON object"),
        (b"[" * 100_000, CHAT, "request body is nested too deeply"),
        (b'{"model": "\\ud800"}', CHAT, "request body contains an unpaired UTF-16 surrogate escape"),
        (
            chat(),
            "/v1/embeddings",
            "path '/v1/embeddings' is not routable; supported paths: "
            "/v1/chat/completions, /v1/completions, /v1/messages, /v1/responses",
        ),
        ({"model": "m"}, CHAT, "chat requests need `messages`"),
        (chat(messages=[]), CHAT, "messages must not be empty"),
        (chat(messages=[{"role": 1}]), CHAT, "messages[0].role must be a string, not the number 1"),
        (chat(messages=[{"content": "x"}]), CHAT, "messages[0].role must be a string, not null"),
        (
            chat(messages=[{"role": "user", "content": 5}]),
            CHAT,
            "messages[0].content must be a string, a list of content parts or null, not the number 5",
        ),
        (
            chat(messages=[{"role": "user", "content": [7]}]),
            CHAT,
            "messages[0].content[0] must be a content part object or a string, not the number 7",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": 3}]}]),
            CHAT,
            "messages[0].content[0].type must be a string, not the number 3",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": [1]}]}]),
            CHAT,
            "messages[0].content[0].text must be a string, not an array",
        ),
        (
            chat(messages=[{"role": "assistant", "tool_calls": {}}]),
            CHAT,
            "messages[0].tool_calls must be a list of tool calls, not an object",
        ),
        (
            chat(messages=[{"role": "assistant", "tool_calls": ["f"]}]),
            CHAT,
            "messages[0].tool_calls[0] must be an object, not a string",
        ),
        (
            chat(messages=[tool_call("f")]),
            CHAT,
            "messages[0].tool_calls[0].function must be an object, not a string",
        ),
        (
            chat(messages=[tool_call({"name": 2})]),
            CHAT,
            "messages[0].tool_calls[0].function.name must be a string, not the number 2",
        ),
        (
            chat(messages=[tool_call({"name": "f", "arguments": [1]})]),
            CHAT,
            "messages[0].tool_calls[0].function.arguments must be a string or an object, not an array",
        ),
        (chat(tools={}), CHAT, "tools must be a list of tool objects, not an object"),
        (chat(tools=["x"]), CHAT, "tools[0] must be an object, not a string"),
        (chat(documents={}), CHAT, "documents must be a list of document objects, not an object"),
        (chat(continue_final_message=1), CHAT, "continue_final_message must be a boolean, not the number 1"),
        (
            chat(continue_final_message=True),
            CHAT,
            "add_generation_prompt and continue_final_message cannot both be true",
        ),
        (chat(reasoning_effort=1), CHAT, "reasoning_effort must be a string, not the number 1"),
        (chat(nvext=[]), CHAT, "nvext must be an object, not an array"),
        (
            chat(nvext={"agent_hints": {"latency_sensitivity": "x"}}),
            CHAT,
            "nvext.agent_hints.latency_sensitivity must be a finite number, not a string",
        ),
        (chat(cache_salt=""), CHAT, "cache_salt must be a non-empty string when given"),
        (chat(add_special_tokens="yes"), CHAT, "add_special_tokens must be a boolean, not a string"),
        (chat(truncation_side=1), CHAT, "truncation_side must be a string, not the number 1"),
        (chat(truncation_side="middle"), CHAT, 'truncation_side must be "left" or "right"'),
        (
            chat(truncate_prompt_tokens=-2),
            CHAT,
            "truncate_prompt_tokens must be an integer >= -1, not the number -2",
        ),
        ({"model": "m"}, COMPLETIONS, "completion requests need `prompt`"),
        (
            {"model": "m", "prompt_embeds": "abc"},
            COMPLETIONS,
            "prompt_embeds requests cannot be routed on tokens; send `prompt`",
        ),
        (
            completion(prompt=5),
            COMPLETIONS,
            "prompt must be a string, a list of token ids, or a list holding one string or one token-id "
            "list, not the number 5",
        ),
        (completion(prompt=[]), COMPLETIONS, "prompt must not be an empty list"),
        (
            completion(prompt=["a", "b"]),
            COMPLETIONS,
            "prompt is a batch of 2 prompts, which cannot be routed as one request; "
            "send one prompt per request",
        ),
        (
            completion(prompt=[{}, "b"]),
            COMPLETIONS,
            "prompt must be a string, a list of token ids, or a list holding one string or one token-id "
            "list, not an array",
        ),
        (
            completion(prompt=[{}]),
            COMPLETIONS,
            "prompt[0] must be a string or a list of token ids, not an object",
        ),
        (
            completion(prompt=[1, -1]),
            COMPLETIONS,
            "prompt[1] must be a token id in [0, 4294967295], not the number -1",
        ),
        (
            completion(prompt=[1, 10**15]),
            COMPLETIONS,
            "prompt[1] must be a token id in [0, 4294967295], not a number",
        ),
        (
            completion(prompt=[1, 10**15 - 1]),
            COMPLETIONS,
            "prompt[1] must be a token id in [0, 4294967295], not the number 999999999999999",
        ),
    ],
)
def test_a_rejection_tells_the_client_what_to_fix(body, path, message):
    assert message_of(body, path) == message


def test_a_long_path_is_quoted_to_200_characters():
    long = "/" + "a" * 299
    assert message_of(chat(), long).startswith(f"path {long[:200]!r} is not routable")
    with pytest.raises(RequestInvalid) as fragment:
        normalize_path(long + "#x")
    assert (
        fragment.value.message
        == f"path {(long + '#x')[:200]!r} contains a fragment (#), which is not accepted"
    )
    with pytest.raises(RequestInvalid) as slash:
        normalize_path(long + "%2F")
    assert slash.value.message == (
        f"path {(long + '%2F')[:200]!r} contains '%2F' (an encoded slash, backslash or NUL), "
        "which is not accepted"
    )


@pytest.mark.parametrize(
    ("path", "normalised"),
    [
        ("/v1/chat/.", "/v1/chat/"),
        ("/v1/chat/..", "/v1/"),
        ("/v1/./chat/completions", "/v1/chat/completions"),
        ("/v1/x/../chat/completions", "/v1/chat/completions"),
        ("/..", "/"),
        ("/.", "/"),
        ("/a/b/../../..", "/"),
        ("/a/.b/..c", "/a/.b/..c"),
    ],
)
def test_dot_segments_resolve_and_a_last_one_keeps_its_slash(path, normalised):
    assert normalize_path(path) == normalised


@pytest.mark.parametrize(
    ("fields", "attribute", "expected"),
    [
        ({"add_special_tokens": True}, "add_special_tokens", True),
        ({"add_special_tokens": False}, "add_special_tokens", False),
        ({}, "add_special_tokens", None),
        ({"truncation_side": "left"}, "truncation_side", "left"),
        ({"truncation_side": "right"}, "truncation_side", "right"),
        ({}, "truncation_side", None),
        ({"truncate_prompt_tokens": -1}, "truncate_prompt_tokens", -1),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", 0),
        ({"truncate_prompt_tokens": 100}, "truncate_prompt_tokens", 100),
        ({"documents": [{"title": "t", "text": "x"}]}, "documents", ({"title": "t", "text": "x"},)),
        ({"documents": None}, "documents", None),
        ({"reasoning_effort": "high"}, "reasoning_effort", "high"),
        ({"max_completion_tokens": 0}, "max_tokens", 0),
        ({"nvext": {"agent_hints": {"priority": 2**31 - 1}}}, "agent_hints", {"priority": 2**31 - 1}),
        ({"nvext": {"agent_hints": {"osl": 2**32 - 1}}}, "agent_hints", {"osl": 2**32 - 1}),
    ],
)
def test_fields_for_the_engines_tokenizer_are_parsed(fields, attribute, expected):
    assert getattr(parse(chat(**fields)), attribute) == expected


def test_the_largest_integers_in_range_are_accepted_and_one_more_is_not():
    assert "priority must be an integer in" in message_of(chat(nvext={"agent_hints": {"priority": 2**31}}))
    assert "osl must be an integer in" in message_of(chat(nvext={"agent_hints": {"osl": 2**32}}))


# --- n: choices generated from one prompt (the router counts n decoding sequences) ------------------------


@pytest.mark.parametrize("make, path", [(chat, CHAT), (completion, COMPLETIONS)])
@pytest.mark.parametrize(("value", "expected"), [(1, 1), (2, 2), (128, 128), (None, 1)])
def test_n_is_read_for_chat_and_completions(make, path, value, expected):
    assert parse(make(n=value), path).n == expected
    assert parse(make(), path).n == 1  # absent: one choice


@pytest.mark.parametrize(
    ("value", "sent"),
    [(0, "the number 0"), (129, "the number 129"), (-1, "the number -1"), (2.0, "the number 2.0"),
     (True, "a boolean"), ("2", "a string"), ([2], "an array")],
)  # fmt: skip
def test_an_n_out_of_bounds_or_not_an_integer_is_a_400_naming_it(value, sent):
    for body, path in ((chat(n=value), CHAT), (completion(n=value), COMPLETIONS)):
        with pytest.raises(RequestInvalid) as caught:
            parse(body, path)
        assert caught.value.message == f"n must be an integer in [1, 128], not {sent}"
        assert epp.status_of(caught.value) == (400, "invalid-request")
        assert json.loads(epp.error_answer(caught.value).immediate_response.body)["error"]["code"] == 400


def test_the_responses_and_messages_paths_parse_into_chat_requests():
    responses = parse_openai_body(
        json.dumps({"model": "m", "input": "hi"}).encode(), "/v1/responses", max_bytes=1 << 20
    )
    assert (responses.kind, responses.responses_api) == ("chat", True)
    assert [dict(m) for m in responses.messages] == [{"role": "user", "content": "hi"}]
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "yo"}]}
    messages = parse_openai_body(json.dumps(body).encode(), "/v1/messages", max_bytes=1 << 20)
    assert (messages.kind, messages.responses_api, messages.max_tokens) == ("chat", False, 4)
    assert [dict(m) for m in messages.messages] == [{"role": "user", "content": "yo"}]
