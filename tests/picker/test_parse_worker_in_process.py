"""The body parse worker's functions, called in this process (extproc/picker/parse_worker.py).

A worker answers with marshalled values the picker builds back (`read_request_answer`): each answer must
give what the event loop gets parsing the same body itself (`parse_openai_body`, `limit_prompt`,
`json_object`, `model_of`), with the same 400 messages; a chat body's answer also says where its
`messages` lie (what the loop keeps for the chat's next turn). `main` is driven here with its stdin and
stdout as byte buffers, and the process-wide settings it makes (collector, SIGINT, oom_score_adj)
recorded instead of made.
"""

from __future__ import annotations

import gc
import io
import json
import marshal
import signal
import sys
from collections.abc import Callable
from dataclasses import astuple
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from extproc.errors import RequestInvalid
from extproc.picker import parse_worker
from extproc.picker.parse_worker import (
    FUNCTIONS,
    ParsedBody,
    _answer,
    _read_exactly,
    _read_frame,
    answer_json_object,
    answer_model,
    answer_request,
    json_object,
    limit_prompt,
    main,
    model_of,
    read_request_answer,
)
from extproc.request.body_prefixes import MessagesSpans
from extproc.request.parse import body_prefixes, parse_openai_body

from ..picker_fixtures import MODEL, chat_body

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
MAX_BYTES = 1 << 24
MAX_VALUES = 100_000
PAD = "be brief " * 5000  # 45 kB: a body this long is walked by the worker's recent bodies (>= 32 KiB)


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def frames_of(data: bytes) -> list[bytes]:
    """The frames of a byte string that holds only whole frames."""
    found = []
    while data:
        size = int.from_bytes(data[:4], "big")
        assert len(data) >= 4 + size, "a truncated frame"
        found.append(data[4 : 4 + size])
        data = data[4 + size :]
    return found


def on_loop(body: bytes, path: str, max_values: int = MAX_VALUES) -> ParsedBody | str:
    """What the event loop makes of `body`: its ParsedBody, or the 400's message."""
    try:
        return limit_prompt(parse_openai_body(body, path, max_bytes=MAX_BYTES), max_values)
    except RequestInvalid as exc:
        return exc.message


def from_worker(answer: bytes) -> tuple[ParsedBody, MessagesSpans | None] | str:
    """A worker's answer to "request" as the picker reads it back, or the 400's message."""
    try:
        return read_request_answer(marshal.loads(answer))
    except RequestInvalid as exc:
        return exc.message


def json_body(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, **fields}).encode()


REQUESTS = {
    "chat": (chat_body("hello"), CHAT),
    "chat-with-every-prompt-field": (
        chat_body(
            "x",
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2]}}}],
            documents=[{"title": "t", "text": "d"}],
            chat_template_kwargs={"enable_thinking": False},
            nvext={"session_control": {"session_id": "s", "action": "close"}, "agent_hints": {"priority": 3}},
            stream=True,
            max_completion_tokens=7,
            n=2,
            cache_salt="salt",
            lora_path="adapter",
        ),
        CHAT,
    ),
    "completion-text": (json_body(prompt="text " * 50, stream=True), COMPLETIONS),
    "completion-token-ids": (json_body(prompt=list(range(300)), cache_salt="t", max_tokens=3), COMPLETIONS),
    "responses": (json_body(input=[{"role": "user", "content": "hi"}]), RESPONSES),
    "anthropic-messages": (json_body(max_tokens=5, messages=[{"role": "user", "content": "hi"}]), MESSAGES),
    "long-chat": (
        json_body(messages=[{"role": "system", "content": PAD}, {"role": "user", "content": "hi"}]),
        CHAT,
    ),
    "chat-path-with-query": (chat_body("q"), CHAT + "?x=1"),
}

REFUSED = {
    "empty": (b"", CHAT),
    "not-json": (b"{not json", CHAT),
    "not-utf8": (b'{"model": "\xff"}', CHAT),
    "not-an-object": (b"[1, 2]", CHAT),
    "no-model": (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), CHAT),
    "empty-messages": (json_body(messages=[]), CHAT),
    "token-id-too-large": (json_body(prompt=[1, 2**32]), COMPLETIONS),
    "unroutable-path": (chat_body("x"), "/v1/embeddings"),
    "bom": (b"\xef\xbb\xbf" + chat_body("x"), CHAT),
}


@pytest.mark.parametrize(("body", "path"), REQUESTS.values(), ids=REQUESTS.keys())
def test_a_workers_answer_rebuilds_the_request_the_loop_parses(body: bytes, path: str) -> None:
    expected = on_loop(body, path)
    assert isinstance(expected, ParsedBody)
    rebuilt = from_worker(answer_request(body, path, MAX_BYTES, MAX_VALUES))
    assert not isinstance(rebuilt, str), rebuilt
    parsed, _ = rebuilt
    assert parsed == expected
    assert parsed.request.model == MODEL and parsed.request.body_size == len(body)
    for name in ("chat_template_kwargs", "agent_hints", "nvext"):  # read-only views, as on the loop
        assert type(getattr(parsed.request, name)) is MappingProxyType, name


def test_the_prompt_fields_a_worker_sends_back_are_those_of_the_body() -> None:
    body, path = REQUESTS["chat-with-every-prompt-field"]
    parsed, where = read_request_answer(marshal.loads(answer_request(body, path, MAX_BYTES, MAX_VALUES)))
    request = parsed.request
    assert request.messages == ({"role": "user", "content": "x"},)
    assert request.tools == ({"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2]}}},)
    assert request.documents == ({"title": "t", "text": "d"},)
    assert dict(request.chat_template_kwargs) == {"enable_thinking": False}
    assert dict(request.agent_hints) == {"priority": 3}
    assert (request.session_id, request.session_action) == ("s", "close")
    assert (request.stream, request.max_tokens, request.n, request.cache_salt) == (True, 7, 2, "salt")
    assert parsed.prompt_dropped == 0 and parsed.prompt_values > 0 and where is None  # a short body


@pytest.mark.parametrize(("body", "path"), REFUSED.values(), ids=REFUSED.keys())
def test_a_worker_refuses_what_the_loop_refuses_with_the_same_message(body: bytes, path: str) -> None:
    message = on_loop(body, path)
    assert isinstance(message, str)
    answer = answer_request(body, path, MAX_BYTES, MAX_VALUES)
    assert marshal.loads(answer) == ("invalid", message)
    assert from_worker(answer) == message


def test_a_long_chats_answer_says_where_its_messages_lie_as_a_fresh_parse_finds_them() -> None:
    body, path = REQUESTS["long-chat"]
    fresh = body_prefixes()
    parse_openai_body(body, path, max_bytes=MAX_BYTES, prefixes=fresh)
    assert fresh.last is not None
    answer = marshal.loads(answer_request(body, path, MAX_BYTES, MAX_VALUES))
    assert answer[-1] == astuple(fresh.last)
    parsed, where = read_request_answer(answer)
    assert where == fresh.last
    assert parsed.request.messages is not None and len(where.element_ends) == len(parsed.request.messages)
    text = body.decode()  # the spans name the message texts in the body
    first = json.loads(text[where.array_start + 1 : where.element_ends[0]])
    assert first == parsed.request.messages[0]


@pytest.mark.parametrize(
    ("body", "path"),
    [
        REQUESTS["chat"],  # too short to be walked: no spans
        REQUESTS["anthropic-messages"],
        (json_body(max_tokens=5, messages=[{"role": "user", "content": PAD}]), MESSAGES),
        (
            json_body(input=[{"role": "user", "content": PAD}], messages=[{"role": "user", "content": "x"}]),
            RESPONSES,
        ),
        (json_body(prompt=PAD, messages=[{"role": "user", "content": "x"}]), COMPLETIONS),
    ],
    ids=["short-chat", "short-anthropic", "long-anthropic", "long-responses", "long-completion"],
)
def test_only_a_chat_completions_body_says_where_its_messages_lie(body: bytes, path: str) -> None:
    """The loop takes a chat's next turn only from a /v1/chat/completions body's raw `messages`: another
    API's `messages` are built from the body, not the body's own."""
    parsed, where = read_request_answer(marshal.loads(answer_request(body, path, MAX_BYTES, MAX_VALUES)))
    assert where is None
    assert parsed == on_loop(body, path)


def test_a_long_chat_whose_prompt_is_dropped_says_nothing_of_its_messages() -> None:
    body, path = REQUESTS["long-chat"]
    parsed, where = read_request_answer(marshal.loads(answer_request(body, path, MAX_BYTES, 5)))
    assert parsed.request.messages is None and parsed.prompt_dropped > 5 and not parsed.has_prompt
    assert where is None
    assert parsed == on_loop(body, path, 5)


# --- limit_prompt ------------------------------------------------------------------------------

ONE_MESSAGE = parse_openai_body(chat_body("hi"), CHAT, max_bytes=MAX_BYTES)
# its prompt values: messages 6 (the tuple, the message, 2 keys, 2 values), then tools, documents,
# chat_template_kwargs and nvext 1 each (None, None, {}, {})
ONE_MESSAGE_VALUES = 10


def test_a_prompt_of_exactly_max_values_is_kept_and_counted() -> None:
    kept = limit_prompt(ONE_MESSAGE, ONE_MESSAGE_VALUES)
    assert kept == ParsedBody(ONE_MESSAGE, prompt_dropped=0, prompt_values=ONE_MESSAGE_VALUES)
    assert kept.has_prompt


def test_one_value_over_max_values_drops_the_prompt_counting_what_was_walked() -> None:
    dropped = limit_prompt(ONE_MESSAGE, ONE_MESSAGE_VALUES - 1)
    assert dropped.request.messages is None and not dropped.has_prompt
    assert (dropped.prompt_dropped, dropped.prompt_values) == (ONE_MESSAGE_VALUES, 0)


def test_a_budget_spent_exactly_by_the_messages_is_overrun_by_the_fields_after_them() -> None:
    """After `messages` (6 values) no budget is left: `tools` (None, 1 value) is one too many."""
    dropped = limit_prompt(ONE_MESSAGE, 6)
    assert dropped.request.messages is None
    assert (dropped.prompt_dropped, dropped.prompt_values) == (7, 0)


def test_a_dropped_prompt_leaves_model_session_and_scalar_hints_and_nothing_of_the_prompt() -> None:
    body = chat_body(
        "x",
        tools=[{"type": "function", "function": {"name": "f"}}],
        documents=[{"text": "d"}],
        chat_template_kwargs={"enable_thinking": False},
        nvext={
            "session_control": {"session_id": "s"},
            "agent_hints": {"priority": 2, "custom": [1], "tag": "a"},
        },
    )
    request = parse_openai_body(body, CHAT, max_bytes=MAX_BYTES)
    dropped = limit_prompt(request, 3)
    stripped = dropped.request
    assert (stripped.messages, stripped.tools, stripped.documents) == (None, None, None)
    for name, value in (
        ("chat_template_kwargs", {}),
        ("nvext", {}),
        ("agent_hints", {"priority": 2, "tag": "a"}),
    ):
        mapping = getattr(stripped, name)
        assert type(mapping) is MappingProxyType and dict(mapping) == value, name
    assert (stripped.model, stripped.session_id, stripped.kind) == (MODEL, "s", "chat")
    assert dropped.prompt_dropped > 3


def test_a_completion_over_max_values_keeps_its_prompt() -> None:
    request = parse_openai_body(json_body(prompt=list(range(50))), COMPLETIONS, max_bytes=MAX_BYTES)
    dropped = limit_prompt(request, 1)
    assert dropped.prompt_dropped > 1 and dropped.has_prompt
    assert dropped.request.prompt_token_ids == tuple(range(50))


# --- model_of, json_object and their answers --------------------------------------------------


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (chat_body("x"), MODEL),
        (b'{"model": ""}', None),
        (b'{"model": 3}', None),
        (b'["model"]', None),  # a JSON value, not an object
        (b'"model"', None),
        (b"{not json", None),
        (b"\xff", None),
        (b"[" * 100_000 + b"]" * 100_000, None),  # nested too deeply
    ],
    ids=["chat", "empty", "number", "list", "string", "not-json", "not-utf8", "deep"],
)
def test_the_model_is_a_json_objects_non_empty_string_model_and_answered_so(
    body: bytes, model: str | None
) -> None:
    assert model_of(body) == model
    assert marshal.loads(answer_model(body)) == model


NOT_AN_OBJECT = "the body must be a JSON object"
BAD_IDS = "'input_ids' must be a list of token ids (integers in [0, 2**32))"


@pytest.mark.parametrize(
    ("body", "token_field", "max_tokens", "says"),
    [
        (b"{not json", None, 0, NOT_AN_OBJECT),
        (b"[" * 100_000 + b"]" * 100_000, None, 0, NOT_AN_OBJECT),
        (b"[1]", None, 0, NOT_AN_OBJECT),
        (b'"x"', "input_ids", 4, NOT_AN_OBJECT),
        (b'{"input_ids": [0, 4294967296]}', "input_ids", 4, BAD_IDS),  # 2**32: one over the largest id
        (b'{"input_ids": [-1]}', "input_ids", 4, BAD_IDS),
        (b'{"input_ids": [true]}', "input_ids", 4, BAD_IDS),
        (b'{"input_ids": [1.0]}', "input_ids", 4, BAD_IDS),
        (b'{"input_ids": "1 2"}', "input_ids", 4, BAD_IDS),
        (b'{"input_ids": [1, 2, 3]}', "input_ids", 2, "'input_ids' has 3 token ids; the limit is 2"),
    ],
    ids=[
        "not-json",
        "deep",
        "list",
        "string",
        "id-2**32",
        "negative",
        "bool",
        "float",
        "not-a-list",
        "too-many",
    ],
)
def test_a_json_object_is_refused_naming_the_problem_and_answered_invalid(
    body: bytes, token_field: str | None, max_tokens: int, says: str
) -> None:
    with pytest.raises(RequestInvalid) as refused:
        json_object(body, token_field, max_tokens)
    assert refused.value.message == says
    assert marshal.loads(answer_json_object(body, token_field, max_tokens)) == ("invalid", says)


@pytest.mark.parametrize(
    ("body", "token_field", "max_tokens"),
    [
        (b'{"input_ids": [0, 4294967295], "x": {"y": [1]}}', "input_ids", 2),  # 2**32 - 1: the largest id
        (b'{"input_ids": [1, 2]}', "input_ids", 2),  # exactly max_tokens
        (b'{"input_ids": null}', "input_ids", 0),  # absent
        (b'{"input_ids": "not checked"}', None, 0),  # no token field
        (b'{"input_ids": [1, 2, 3]}', "other", 0),
    ],
    ids=["largest-id", "at-the-limit", "null", "no-token-field", "another-field"],
)
def test_a_json_object_within_its_limits_is_answered_whole(
    body: bytes, token_field: str | None, max_tokens: int
) -> None:
    assert json_object(body, token_field, max_tokens) == json.loads(body)
    assert marshal.loads(answer_json_object(body, token_field, max_tokens)) == ("ok", json.loads(body))


# --- frames and the worker loop ---------------------------------------------------------------


def test_read_exactly_takes_that_many_bytes_or_none_when_fewer_are_left() -> None:
    stream = io.BytesIO(b"abcdef")
    assert _read_exactly(stream, 4) == b"abcd"
    assert _read_exactly(stream, 2) == b"ef"
    assert _read_exactly(stream, 1) is None
    assert _read_exactly(io.BytesIO(b"abc"), 4) is None


def test_a_frame_is_its_big_endian_length_and_that_many_bytes_and_the_rest_stays() -> None:
    payload = bytes(range(256)) * 2  # 512 bytes: both bytes of the length matter
    stream = io.BytesIO(frame(payload) + frame(b"") + frame(b"xyz") + b"tail")
    assert _read_frame(stream) == payload
    assert _read_frame(stream) == b""
    assert _read_frame(stream) == b"xyz"
    assert stream.read() == b"tail"


@pytest.mark.parametrize(
    "data", [b"", b"\x00\x00", b"\x00\x00\x00\x05abc"], ids=["nothing", "a-short-length", "a-short-payload"]
)
def test_a_truncated_frame_reads_as_none(data: bytes) -> None:
    assert _read_frame(io.BytesIO(data)) is None


def test_answer_calls_the_named_function_with_the_body_then_the_arguments() -> None:
    chat = chat_body("x")
    assert _answer("model", (), chat) == answer_model(chat)
    assert _answer("request", (CHAT, MAX_BYTES, MAX_VALUES), chat) == answer_request(
        chat, CHAT, MAX_BYTES, MAX_VALUES
    )
    ids = b'{"input_ids": [1, 2, 3]}'
    assert marshal.loads(_answer("json_object", ("input_ids", 2), ids)) == (
        "invalid",
        "'input_ids' has 3 token ids; the limit is 2",
    )


def test_a_body_too_large_to_parse_is_answered_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(body: bytes, *args: Any) -> bytes:
        raise MemoryError

    monkeypatch.setitem(FUNCTIONS, "request", out_of_memory)
    answer = marshal.loads(_answer("request", (CHAT, MAX_BYTES, MAX_VALUES), chat_body("x")))
    assert answer == ("invalid", "the body is too large to parse")
    with pytest.raises(RequestInvalid, match=r"^the body is too large to parse$"):
        read_request_answer(answer)


class Recorded:
    """What `main` did to its process, recorded instead of done."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.written: list[tuple[str, str]] = []


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[list[bytes], Recorded]]:
    """Runs `main` on the given stdin bytes; its stdout frames, and what it did to its process."""
    recorded = Recorded()

    class FakePath:
        def __init__(self, path: str) -> None:
            self.path = path

        def write_text(self, text: str) -> None:
            recorded.written.append((self.path, text))
            if fail_oom_score:
                raise PermissionError(13, "not permitted")

    fail_oom_score = False
    monkeypatch.setattr(gc, "disable", lambda: recorded.calls.append(("gc.disable",)))
    monkeypatch.setattr(signal, "signal", lambda *args: recorded.calls.append(("signal", *args)))
    monkeypatch.setattr(parse_worker, "Path", FakePath)

    def run(data: bytes, *, oom_score_fails: bool = False) -> tuple[list[bytes], Recorded]:
        nonlocal fail_oom_score
        fail_oom_score = oom_score_fails
        stdout = io.BytesIO()
        monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(data)))
        monkeypatch.setattr(sys, "stdout", SimpleNamespace(buffer=stdout))
        assert main() is None
        return frames_of(stdout.getvalue()), recorded

    return run


def call(function: str, args: tuple[Any, ...], body: bytes) -> bytes:
    return frame(marshal.dumps((function, args))) + frame(body)


def test_the_worker_answers_each_framed_call_in_order_until_its_input_ends(worker) -> None:
    long_chat, _ = REQUESTS["long-chat"]
    calls = [
        ("model", (), chat_body("x")),
        ("request", (CHAT, MAX_BYTES, MAX_VALUES), long_chat),
        ("json_object", ("input_ids", 4), b'{"input_ids": [1, 2]}'),
        ("request", (CHAT, MAX_BYTES, MAX_VALUES), b"{not json"),
        ("model", (), b"[]"),
    ]
    answers, _ = worker(b"".join(call(*c) for c in calls))
    assert len(answers) == len(calls)
    assert marshal.loads(answers[0]) == MODEL
    parsed, where = read_request_answer(marshal.loads(answers[1]))
    assert parsed == on_loop(long_chat, CHAT) and where is not None
    assert marshal.loads(answers[2]) == ("ok", {"input_ids": [1, 2]})
    assert from_worker(answers[3]) == on_loop(b"{not json", CHAT)
    assert marshal.loads(answers[4]) is None


def test_a_long_answer_is_framed_with_its_whole_length(worker) -> None:
    body = json_body(prompt=list(range(20_000)))  # an answer of about 100 kB: three bytes of length
    [answer], _ = worker(call("request", (COMPLETIONS, MAX_BYTES, MAX_VALUES), body))
    assert len(answer) > 65_536
    parsed, _ = read_request_answer(marshal.loads(answer))
    assert parsed.request.prompt_token_ids == tuple(range(20_000))


@pytest.mark.parametrize(
    "tail",
    [
        b"",
        b"\x00\x00",  # a short length
        frame(marshal.dumps(("model", ()))),  # a call without its body
        frame(marshal.dumps(("model", ())))[:-3],  # a short call
        frame(marshal.dumps(("model", ()))) + b"\x00\x00\x00\x09{}",  # a short body
    ],
    ids=["nothing", "short-length", "no-body", "short-call", "short-body"],
)
def test_the_worker_returns_at_the_end_of_its_input_answering_only_whole_calls(worker, tail: bytes) -> None:
    answers, _ = worker(call("model", (), chat_body("x")) + tail)
    assert [marshal.loads(a) for a in answers] == [MODEL]


def test_the_worker_turns_off_the_collector_ignores_sigint_and_asks_to_be_killed_first(worker) -> None:
    answers, recorded = worker(call("model", (), chat_body("x")))
    assert [marshal.loads(a) for a in answers] == [MODEL]
    assert recorded.calls == [("gc.disable",), ("signal", signal.SIGINT, signal.SIG_IGN)]
    assert recorded.written == [("/proc/self/oom_score_adj", "1000")]


def test_a_worker_that_may_not_set_its_oom_score_still_answers(worker) -> None:
    answers, recorded = worker(call("model", (), chat_body("x")), oom_score_fails=True)
    assert [marshal.loads(a) for a in answers] == [MODEL]
    assert recorded.written == [("/proc/self/oom_score_adj", "1000")]
