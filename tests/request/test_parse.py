"""parse_openai_body: every accepted form, every rejection, and a fuzz proof that nothing else escapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.errors import BodyTooLarge, RequestInvalid, TokenizerUnavailable
from extproc.request.parse import (
    ROUTABLE_PATHS,
    ParsedRequest,
    is_routable,
    normalize_path,
    parse_openai_body,
)
from extproc.request.tokenizer import ByteTokenizer, HfTokenizer
from tests.tokenizer_files import write_tokenizer_dir

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LIMIT = 1 << 20
USER = [{"role": "user", "content": "hi"}]


def parse(body: Any, path: str = CHAT, max_bytes: int = LIMIT) -> ParsedRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_openai_body(raw, path, max_bytes=max_bytes)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


def test_routable_paths():
    assert {CHAT, COMPLETIONS, "/v1/responses", "/v1/messages"} == ROUTABLE_PATHS


def test_minimal_chat_request_has_defaults():
    body = json.dumps(chat()).encode()
    request = parse_openai_body(body, CHAT + "?trace=1", max_bytes=LIMIT)
    assert request == ParsedRequest(kind="chat", model="m", messages=tuple(USER), body_size=len(body))
    assert request.add_generation_prompt and not request.stream and request.lora_name is None


@pytest.mark.parametrize(
    "fields, attribute, expected",
    [
        ({"stream": True}, "stream", True),
        ({"stream": None}, "stream", False),
        ({"max_tokens": 7}, "max_tokens", 7),
        ({"max_completion_tokens": 9, "max_tokens": 7}, "max_tokens", 9),
        ({"max_tokens": 0}, "max_tokens", 0),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools",
            ({"type": "function", "function": {"name": "f"}},),
        ),
        (
            {"chat_template_kwargs": {"enable_thinking": False}},
            "chat_template_kwargs",
            {"enable_thinking": False},
        ),
        ({"add_generation_prompt": False}, "add_generation_prompt", False),
        ({"add_generation_prompt": False, "continue_final_message": True}, "continue_final_message", True),
        ({"nvext": {"session_control": {"session_id": "s1", "action": "close"}}}, "session_id", "s1"),
        ({"nvext": {"session_control": {"session_id": "s1", "action": "close"}}}, "session_action", "close"),
        (
            {"nvext": {"agent_hints": {"osl": 64, "priority": -1, "latency_sensitivity": 1.5, "mine": [1]}}},
            "agent_hints",
            {"osl": 64, "priority": -1, "latency_sensitivity": 1.5, "mine": [1]},
        ),
        (
            {
                "nvext": {
                    "agent_hints": {
                        "kv_overlap_score_weight": 0,
                        "temperature": 0.5,
                        "speculative_prefill": True,
                    }
                }
            },
            "agent_hints",
            {"kv_overlap_score_weight": 0, "temperature": 0.5, "speculative_prefill": True},
        ),
        (
            {"nvext": {"token_data": [1], "agent_hints": None}},
            "nvext",
            {"token_data": [1], "agent_hints": None},
        ),
        ({"nvext": None}, "nvext", {}),
        ({"cache_salt": "tenant-a"}, "cache_salt", "tenant-a"),
        ({"cache_salt": None}, "cache_salt", None),
        ({}, "cache_salt", None),
        ({"lora_path": "sql-lora"}, "lora_name", "sql-lora"),  # SGLang's adapter field
        ({"lora_path": " sql-lora "}, "lora_name", "sql-lora"),
        ({"lora_path": ""}, "lora_name", None),
        ({"lora_path": "  "}, "lora_name", None),
        ({"lora_path": None}, "lora_name", None),
        ({}, "lora_name", None),
    ],
)
def test_chat_fields(fields: dict[str, Any], attribute: str, expected: Any):
    assert getattr(parse(chat(**fields)), attribute) == expected


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "plain"},
        {"role": "assistant", "content": None},
        {"role": "assistant"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "u"}},
                "bare string part",
                {"image_url": "untyped"},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "refusal", "refusal": "no"}, {"type": "thinking", "thinking": "t"}],
        },
        {"role": "user", "content": "x", "name": "bob"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"function": {"name": "g", "arguments": {"a": 1}}},
                {"function": {"name": "h"}},
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c"},
        {"role": "developer", "content": "x", "reasoning": "kept", "anything": {"else": 1}},
    ],
)
def test_accepted_message_forms(message: dict[str, Any]):
    assert parse(chat(messages=[message])).messages == (message,)


@pytest.mark.parametrize(
    "prompt, text, token_ids",
    [
        ("hello", "hello", None),
        ("", "", None),
        ([1, 2, 3], None, (1, 2, 3)),
        (["hello"], "hello", None),
        ([[4, 5]], None, (4, 5)),
        ([0, 2**32 - 1], None, (0, 2**32 - 1)),
    ],
)
def test_completion_prompt_forms(prompt: Any, text: str | None, token_ids: tuple[int, ...] | None):
    request = parse(completion(prompt=prompt), COMPLETIONS)
    assert (request.kind, request.prompt_text, request.prompt_token_ids) == ("completion", text, token_ids)
    assert request.messages is None


@pytest.mark.parametrize(
    "body, path, message",
    [
        (b"\xff\xfe{}", CHAT, "not valid UTF-8"),
        (b"{", CHAT, "not valid JSON"),
        (b'{"model": NaN}', CHAT, "NaN is not a JSON value"),
        (b"[" * 100_000, CHAT, "nested too deeply"),
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", CHAT, "not valid JSON"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
            CHAT,
            "unpaired UTF-16 surrogate",
        ),
        ([], CHAT, "must be a JSON object, not an array"),
        ("text", CHAT, "must be a JSON object, not a string"),
        ({"messages": USER}, CHAT, "model must be a non-empty string, not null"),
        (chat(model=""), CHAT, "model must be a non-empty string"),
        (chat(model=3), CHAT, "model must be a non-empty string, not the number 3"),
        (chat(), "/v1/embeddings", "path '/v1/embeddings' is not routable"),
        (chat(), "/v1/chat/completions/", "is not routable"),
        ({"model": "m"}, CHAT, "chat requests need `messages`"),
        (chat(messages={}), CHAT, "messages must be a list of message objects, not an object"),
        (chat(messages=[]), CHAT, "messages must not be empty"),
        (chat(messages=["hi"]), CHAT, r"messages\[0\] must be a message object, not a string"),
        (chat(messages=[{"content": "x"}]), CHAT, r"messages\[0\].role must be a string, not null"),
        (
            chat(messages=[{"role": "user", "content": 5}]),
            CHAT,
            r"messages\[0\].content must be a string, a list",
        ),
        (chat(messages=[{"role": "user", "content": [5]}]), CHAT, r"content\[0\] must be a content part"),
        (
            chat(messages=[{"role": "user", "content": [{"type": 1}]}]),
            CHAT,
            r"content\[0\].type must be a string",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            CHAT,
            r"content\[0\].text must be a str",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": None}]}]),
            CHAT,
            "text must be",
        ),
        (
            chat(messages=[{"role": "user", "content": "x", "name": 1}]),
            CHAT,
            r"messages\[0\].name must be a str",
        ),
        (chat(messages=[{"role": "tool", "content": "x", "tool_call_id": 1}]), CHAT, "tool_call_id must be"),
        (chat(messages=[{"role": "assistant", "tool_calls": {}}]), CHAT, "tool_calls must be a list"),
        (
            chat(messages=[{"role": "assistant", "tool_calls": [1]}]),
            CHAT,
            r"tool_calls\[0\] must be an object",
        ),
        (
            chat(messages=[{"role": "assistant", "tool_calls": [{}]}]),
            CHAT,
            r"tool_calls\[0\].function must be",
        ),
        (
            chat(messages=[{"role": "assistant", "tool_calls": [{"function": {}}]}]),
            CHAT,
            "function.name must be",
        ),
        (
            chat(
                messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]}]
            ),
            CHAT,
            "arguments must be a string or an object",
        ),
        (chat(tools={}), CHAT, "tools must be a list of tool objects"),
        (chat(tools=["f"]), CHAT, r"tools\[0\] must be an object"),
        (chat(chat_template_kwargs=[]), CHAT, "chat_template_kwargs must be an object"),
        (chat(add_generation_prompt="yes"), CHAT, "add_generation_prompt must be a boolean"),
        (chat(continue_final_message=True), CHAT, "cannot both be true"),
        (chat(stream="true"), CHAT, "stream must be a boolean, not a string"),
        (chat(stream=1), CHAT, "stream must be a boolean, not the number 1"),
        (chat(max_tokens=-1), CHAT, "max_tokens must be an integer >= 0"),
        (chat(max_tokens=1.5), CHAT, "max_tokens must be an integer"),
        (chat(max_tokens=True), CHAT, "max_tokens must be an integer >= 0, not a boolean"),
        (chat(max_completion_tokens="9"), CHAT, "max_completion_tokens must be an integer"),
        (chat(nvext=[]), CHAT, "nvext must be an object"),
        (chat(nvext={"session_control": "s"}), CHAT, "nvext.session_control must be an object"),
        (chat(nvext={"session_control": {"session_id": 1}}), CHAT, "session_id must be a string"),
        (chat(nvext={"session_control": {"action": 1}}), CHAT, "session_control.action must be a string"),
        (chat(nvext={"agent_hints": 1}), CHAT, "nvext.agent_hints must be an object"),
        (chat(nvext={"agent_hints": {"osl": -1}}), CHAT, "osl must be an integer in"),
        (chat(nvext={"agent_hints": {"priority": 2**31}}), CHAT, "priority must be an integer in"),
        (
            chat(nvext={"agent_hints": {"latency_sensitivity": "high"}}),
            CHAT,
            "latency_sensitivity must be a finite",
        ),
        (
            b'{"model": "m", "messages": [{"role": "u"}], "nvext": {"agent_hints": {"temperature": 1e999}}}',
            CHAT,
            "temperature must be a finite number",
        ),
        (chat(nvext={"agent_hints": {"kv_overlap_score_weight": -1}}), CHAT, "must be a finite number >= 0"),
        (  # fuzz-found: an integer past the float range raised OverflowError
            chat(nvext={"agent_hints": {"kv_overlap_score_weight": 10**400}}),
            CHAT,
            "must be a finite number >= 0",
        ),
        (chat(nvext={"agent_hints": {"latency_sensitivity": -(10**400)}}), CHAT, "must be a finite number"),
        (
            chat(nvext={"agent_hints": {"speculative_prefill": "yes"}}),
            CHAT,
            "speculative_prefill must be a bool",
        ),
        ({"model": "m"}, COMPLETIONS, "completion requests need `prompt`"),
        ({"model": "m", "prompt_embeds": "AAAA"}, COMPLETIONS, "prompt_embeds requests cannot be routed"),
        (completion(prompt=5), COMPLETIONS, "prompt must be a string, a list of token ids"),
        (completion(prompt=[]), COMPLETIONS, "prompt must not be an empty list"),
        (completion(prompt=[[]]), COMPLETIONS, r"prompt\[0\] must not be an empty token list"),
        (
            completion(prompt=["a", "b"]),
            COMPLETIONS,
            "batch of 2 prompts, which cannot be routed as one request",
        ),
        (completion(prompt=[[1], [2]]), COMPLETIONS, "batch of 2 prompts"),
        (completion(prompt=["a", 1]), COMPLETIONS, "prompt must be a string, a list of token ids"),
        (completion(prompt=[1, "a"]), COMPLETIONS, r"prompt\[1\] must be a token id in \[0, 4294967295\]"),
        (completion(prompt=[1, True]), COMPLETIONS, r"prompt\[1\] must be a token id"),
        (completion(prompt=[-1]), COMPLETIONS, r"prompt\[0\] must be a token id"),
        (completion(prompt=[2**32]), COMPLETIONS, r"prompt\[0\] must be a token id"),
        (completion(prompt=[[1, 2.0]]), COMPLETIONS, r"prompt\[0\]\[1\] must be a token id"),
        (completion(prompt=[None]), COMPLETIONS, r"prompt\[0\] must be a string or a list of token ids"),
        (completion(stream=[]), COMPLETIONS, "stream must be a boolean"),
        (chat(cache_salt=""), CHAT, "cache_salt must be a non-empty string"),
        (completion(cache_salt=7), COMPLETIONS, "cache_salt must be a string, not the number 7"),
        (chat(lora_path=["a", "b"]), CHAT, "lora_path must be a string"),
    ],
)
def test_rejections_name_the_problem(body: Any, path: str, message: str):
    with pytest.raises(RequestInvalid, match=message):
        parse(body, path)


def test_body_too_large_is_checked_first():
    body = b"x" * 101
    with pytest.raises(BodyTooLarge) as info:
        parse_openai_body(body, "/nowhere", max_bytes=100)
    assert (info.value.size_bytes, info.value.limit_bytes) == (101, 100)
    assert parse(completion(), COMPLETIONS, max_bytes=len(json.dumps(completion()))).kind == "completion"


def test_valid_surrogate_pairs_and_escaped_backslashes_are_accepted():
    request = parse(b'{"model": "m", "prompt": "\\ud83d\\ude00 \\\\ud800"}', COMPLETIONS)
    assert request.prompt_text == "\U0001f600 \\ud800"


def test_parsed_request_is_frozen_and_read_only():
    request = parse(chat(nvext={"agent_hints": {"osl": 1}}))
    with pytest.raises(AttributeError):
        request.model = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        request.agent_hints["osl"] = 2  # type: ignore[index]


# --- fuzzing: arbitrary bytes, and arbitrary JSON values in every field ----------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
BASE_CHAT: dict[str, Any] = {
    "model": "m",
    "stream": False,
    "max_tokens": 4,
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "chat_template_kwargs": {},
    "add_generation_prompt": True,
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "n"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
        },
    ],
    "nvext": {
        "session_control": {"session_id": "s", "action": "open"},
        "agent_hints": {"osl": 3, "priority": 1},
    },
}
BASE_COMPLETION: dict[str, Any] = {"model": "m", "prompt": ["hi"], "max_completion_tokens": 1, "nvext": {}}
FIELD_PATHS: list[tuple[Any, ...]] = [
    (),
    ("model",),
    ("stream",),
    ("max_tokens",),
    ("tools",),
    ("tools", 0),
    ("chat_template_kwargs",),
    ("add_generation_prompt",),
    ("continue_final_message",),
    ("messages",),
    ("messages", 0),
    ("messages", 0, "role"),
    ("messages", 0, "content"),
    ("messages", 0, "content", 0),
    ("messages", 0, "content", 0, "text"),
    ("messages", 0, "content", 0, "type"),
    ("messages", 0, "name"),
    ("messages", 1, "tool_calls"),
    ("messages", 1, "tool_calls", 0),
    ("messages", 1, "tool_calls", 0, "function"),
    ("messages", 1, "tool_calls", 0, "function", "arguments"),
    ("nvext",),
    ("nvext", "session_control"),
    ("nvext", "session_control", "session_id"),
    ("nvext", "session_control", "action"),
    ("nvext", "agent_hints"),
    ("nvext", "agent_hints", "osl"),
    ("nvext", "agent_hints", "priority"),
    ("nvext", "agent_hints", "latency_sensitivity"),
    ("nvext", "agent_hints", "temperature"),
    # fields that always parse, so arbitrary values reach the tokenizers and the chat template
    ("chat_template_kwargs", "enable_thinking"),
    ("chat_template_kwargs", "bos_token"),
    ("messages", 0, "extra"),
    ("tools", 0, "function"),
    ("nvext", "agent_hints", "custom"),
    ("messages", 1, "tool_calls", 0, "id"),
]
COMPLETION_PATHS: list[tuple[Any, ...]] = [("prompt",), ("prompt", 0), ("max_completion_tokens",), ("nvext",)]


def replaced(base: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of `base` with the value at `path` replaced."""
    copy = json.loads(json.dumps(base))
    if not path:
        return value
    node = copy
    for key in path[:-1]:
        node = node[key]
    if isinstance(node, list) and path[-1] >= len(node):
        node.append(value)
    else:
        node[path[-1]] = value
    return copy


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizer:
    return HfTokenizer(write_tokenizer_dir(tmp_path_factory.mktemp("fuzz") / "tok"))


def check_parse_and_tokenize(raw: bytes, path: str, hf: HfTokenizer) -> None:
    """Parsing yields a request or a picker error; what parses, the tokenizers encode or cleanly refuse."""
    try:
        request = parse_openai_body(raw, path, max_bytes=4096)
    except (RequestInvalid, BodyTooLarge):
        return
    assert request.body_size == len(raw)
    if request.prompt_token_ids is not None:
        return
    byte_tokenizer = ByteTokenizer()
    for tokenizer in (byte_tokenizer, hf):
        try:
            if request.messages is not None:
                ids = tokenizer.encode_chat(
                    request.messages, tools=request.tools, chat_template_kwargs=request.chat_template_kwargs
                )
            else:
                ids = tokenizer.encode_text(request.prompt_text or "")
        except TokenizerUnavailable:
            assert tokenizer is hf, "the byte tokenizer accepts every parsed request"
            continue
        assert all(type(i) is int for i in ids)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300), path=st.sampled_from([*sorted(ROUTABLE_PATHS), "/x"]))
def test_fuzz_arbitrary_bytes(raw: bytes, path: str, hf: HfTokenizer):
    check_parse_and_tokenize(raw, path, hf)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chat_case=st.booleans(),
    path_index=st.integers(min_value=0, max_value=len(FIELD_PATHS) - 1),
    value=JSON_VALUES,
)
def test_fuzz_arbitrary_json_in_every_field(chat_case: bool, path_index: int, value: Any, hf: HfTokenizer):
    if chat_case:
        body, path = replaced(BASE_CHAT, FIELD_PATHS[path_index], value), CHAT
    else:
        fields = COMPLETION_PATHS[path_index % len(COMPLETION_PATHS)]
        body, path = replaced(BASE_COMPLETION, fields, value), COMPLETIONS
    check_parse_and_tokenize(json.dumps(body).encode(), path, hf)


@settings(max_examples=100, deadline=None)
@given(text=st.text(st.characters(exclude_categories=()), max_size=20))
def test_fuzz_strings_with_any_code_points(text: str, hf: HfTokenizer):
    for ensure_ascii in (True, False):
        raw = json.dumps(chat(messages=[{"role": "user", "content": text}]), ensure_ascii=ensure_ascii)
        check_parse_and_tokenize(raw.encode("utf-8", "surrogatepass"), CHAT, hf)


def test_fuzz_bases_parse():
    assert parse(BASE_CHAT).kind == "chat"
    assert parse(BASE_COMPLETION, COMPLETIONS).kind == "completion"


# --- paths are decided normalised (issue 19) ---------------------------------------------------


@pytest.mark.parametrize(
    ("path", "normalised"),
    [
        ("/v1/chat/%63ompletions", CHAT),
        ("/v1/chat/%63%6F%6d%70letions?x=%63", CHAT + "?x=%63"),  # the query is left alone
        ("/v1//chat///completions", CHAT),
        ("//v1/completions", COMPLETIONS),
        ("/v1/x/../chat/completions", CHAT),
        ("/v1/./chat/./completions", CHAT),
        ("/../v1/completions", COMPLETIONS),  # never above the root
        ("/v1/chat/%2e%2E/completions", COMPLETIONS),  # encoded dots are dot segments too
        ("/v1\\chat\\completions", CHAT),
        ("/v1/chat/completions/", CHAT + "/"),  # not routable: a worker 404s or redirects it
        ("/v1/%7e%20x%3f", "/v1/~%20x%3f"),  # reserved and other escapes stay as they are
        ("/a%252Fb", "/a%252Fb"),
        ("*", "*"),
        # a `%` that starts no escape stays, unless the decoding puts two hex digits after it (real
        # Envoy 1.40's answers, tests/e2e/test_envoy_configs.py): never an encoded dot left over
        ("/%%32%65/v1/./com%70%6c%65%74ions", "/%252e/v1/completions"),
        ("/v1/%2%65/x", "/v1/%252e/x"),
        ("/%41/%%32%65/x", "/A/%252e/x"),  # a stray after decoded text
        ("/v1/%4%31", "/v1/%2541"),
        ("/v1/%%41", "/v1/%A"),
        ("/v1/%%2e%2e/x", "/v1/%../x"),
        ("/v1/100%", "/v1/100%"),
        ("/v1/%zz/%4x/%g1/%/%%", "/v1/%zz/%4x/%g1/%/%%"),
    ],
)
def test_paths_are_normalised_as_envoy_forwards_them(path: str, normalised: str):
    assert normalize_path(path) == normalised
    assert normalize_path(normalised) == normalised


@pytest.mark.parametrize(
    "path", ["/v1/chat/%63ompletions", "/v1//chat/completions", "/v1/a/../chat/completions"]
)
def test_an_encoded_routable_path_is_parsed(path: str):
    assert is_routable(path)
    assert parse(chat(), path).kind == "chat"


@pytest.mark.parametrize(
    "path", ["/v1%2Fchat%2Fcompletions", "/v1%2fcompletions", "/v1/chat%5Ccompletions", "/v1/%00", "/v1/x#y"]
)
def test_encoded_slashes_nuls_and_fragments_are_rejected(path: str):
    with pytest.raises(RequestInvalid, match="not accepted"):
        normalize_path(path)
    with pytest.raises(RequestInvalid, match="not accepted"):
        parse(chat(), path)


def test_an_empty_body_is_rejected_naming_it():
    with pytest.raises(RequestInvalid, match="request body is empty"):
        parse(b"", CHAT)


@settings(max_examples=300, deadline=None)
@given(path=st.text(st.sampled_from("/.%2fF5cC0aAvx\\?#~"), max_size=24))
def test_fuzz_normalisation_is_idempotent_and_raises_only_request_invalid(path: str):
    try:
        once = normalize_path("/" + path)
    except RequestInvalid:
        return
    assert normalize_path(once) == once
    route = once.partition("?")[0]
    assert "//" not in route and "/./" not in route and "/../" not in route
