"""Fuzz `parse_openai_body`: OpenAI-shaped bodies with hostile fields, mutated bodies, raw bytes.

Promise (extproc/request.py): it returns a `ParsedRequest` or raises `BodyTooLarge` / `RequestInvalid`,
whatever the bytes; what it returns is routable (a model, messages or one prompt, u32 token ids) and
the default tokenizer encodes it. `tests/request/test_parse.py` fuzzes every field of two fixed bodies with
arbitrary JSON; this target generates the bodies themselves, biased to the schema and nvext hints.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from extproc.errors import BodyTooLarge, RequestInvalid
from extproc.request.anthropic import MESSAGES_PATH
from extproc.request.parse import CHAT_PATH, COMPLETIONS_PATH, MAX_TOKEN_ID, parse_openai_body
from extproc.request.responses import RESPONSES_PATH
from extproc.request.tokenizer import ByteTokenizer
from tests.fuzz.gen import chance, deep, floating, integer, json_bytes, json_value, mutate, one_of, pick, text
from tests.fuzz.harness import (
    DECODED,
    REJECTED,
    SHRINKING_SHARE,
    Check,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
    sync_session,
)

LIMIT = 1 << 20
WORDS = (
    "model", "messages", "prompt", "role", "content", "user", "assistant", "system", "tool", "developer",
    "text", "type", "image_url", "input_text", "output_text", "refusal", "thinking", "name", "tool_calls",
    "tool_call_id", "function", "arguments", "tools", "stream", "max_tokens", "max_completion_tokens",
    "nvext", "session_control", "session_id", "action", "close", "agent_hints", "osl", "priority",
    "latency_sensitivity", "speculative_prefill", "kv_overlap_score_weight", "temperature",
    "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "prompt_embeds", "m",
    "input", "instructions", "previous_response_id", "function_call", "function_call_output", "call_id",
    "output", "reasoning", "summary", "status", "in_progress", "incomplete", "message", "max_output_tokens",
)  # fmt: skip
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning", "item_reference", None, 3)
HINTS = ("latency_sensitivity", "osl", "priority", "speculative_prefill", "kv_overlap_score_weight",
         "temperature", "custom")  # fmt: skip
PART_TYPES = ("text", "input_text", "output_text", "refusal", "thinking", "image_url", None, 3)

Case = tuple[bytes, str, int]  # body, :path, max_bytes


class _Body:
    """Builds one body; each field is present with its own odds and hostile with odds `hostility`."""

    def __init__(self, r: random.Random, hostility: float) -> None:
        self.r = r
        self.hostility = hostility

    def put(self, obj: dict[str, Any], key: str, make: Any, p: float = 0.5) -> None:
        r = self.r
        if chance(r, p):
            obj[key] = json_value(r, WORDS) if chance(r, self.hostility) else make(r)

    def part(self, r: random.Random) -> Any:
        if chance(r, 0.2):
            return text(r, WORDS)
        part_type = pick(r, PART_TYPES)
        part: dict[str, Any] = {} if part_type is None and chance(r, 0.5) else {"type": part_type}
        field = {"refusal": "refusal", "thinking": "thinking"}.get(part_type, "text")  # type: ignore[arg-type]
        self.put(part, field, lambda r: text(r, WORDS), 0.9)
        return part

    def tool_call(self, r: random.Random) -> Any:
        function: dict[str, Any] = {}
        self.put(function, "name", lambda r: text(r, WORDS), 0.95)
        self.put(function, "arguments", lambda r: one_of(r, lambda r: "{}", lambda r: {"a": 1}, text))
        call: dict[str, Any] = {"id": text(r), "type": "function"}
        self.put(call, "function", lambda r: function, 0.95)
        return call

    def message(self, r: random.Random) -> Any:
        message: dict[str, Any] = {}
        self.put(message, "role", lambda r: pick(r, ("user", "assistant", "system", "tool", "x")), 0.97)
        parts = lambda r: [self.part(r) for _ in range(r.randint(0, 3))]  # noqa: E731
        self.put(message, "content", lambda r: one_of(r, text, text, lambda r: None, parts), 0.9)
        self.put(message, "name", text, 0.1)
        self.put(message, "tool_call_id", text, 0.1)
        self.put(message, "tool_calls", lambda r: [self.tool_call(r) for _ in range(r.randint(0, 2))], 0.1)
        return message

    def tokens(self, r: random.Random) -> list[Any]:
        hostile = self.hostility / 2
        return [integer(r) if chance(r, hostile) else r.randint(0, 50) for _ in range(r.randint(0, 6))]

    def prompt(self, r: random.Random) -> Any:
        return one_of(
            r,
            text,
            self.tokens,
            lambda r: [text(r)],
            lambda r: [self.tokens(r)],
            lambda r: [text(r), self.tokens(r)],
            lambda r: [],
        )

    def nvext(self, r: random.Random) -> dict[str, Any]:
        nvext: dict[str, Any] = {}
        session: dict[str, Any] = {}
        self.put(session, "session_id", text, 0.8)
        self.put(session, "action", lambda r: pick(r, ("open", "close", "")))
        self.put(nvext, "session_control", lambda r: session, 0.5)
        hints: dict[str, Any] = {}
        for hint in HINTS:
            if chance(r, 0.3):
                hints[hint] = one_of(
                    r, lambda r: r.randint(0, 100), lambda r: r.uniform(0, 2), lambda r: chance(r, 0.5)
                )
                if chance(r, self.hostility):
                    hints[hint] = one_of(r, integer, floating)
        self.put(nvext, "agent_hints", lambda r: hints, 0.6)
        self.put(nvext, "token_data", self.tokens, 0.1)
        return nvext

    def item(self, r: random.Random) -> Any:
        """A Responses API input item: a message, a call, its output, reasoning, or something else."""
        kind = pick(r, ITEM_TYPES)
        item: dict[str, Any] = {} if kind is None else {"type": kind}
        if kind in (None, "message"):
            item |= self.message(r)
            self.put(item, "status", lambda r: pick(r, ("completed", "in_progress", "incomplete")), 0.2)
            self.put(item, "id", text, 0.2)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                self.put(item, key, lambda r: text(r, WORDS), 0.95)
        elif kind == "function_call_output":
            self.put(item, "call_id", text, 0.95)
            self.put(item, "output", lambda r: one_of(r, text, lambda r: [self.part(r)]), 0.95)
        elif kind == "reasoning":
            parts = lambda r: [{"type": "reasoning_text", "text": text(r)} for _ in range(r.randint(0, 2))]  # noqa: E731
            self.put(item, "summary", parts, 0.9)
            self.put(item, "content", parts, 0.5)
            self.put(item, "encrypted_content", text, 0.05)
        return item

    def responses_fields(self, obj: dict[str, Any]) -> None:
        items = lambda r: [self.item(r) for _ in range(pick(r, (0, 1, 2, 3, 5)))]  # noqa: E731
        self.put(obj, "input", lambda r: one_of(r, text, items, items), 0.97)
        self.put(obj, "instructions", text, 0.3)
        tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
        self.put(obj, "tools", lambda r: [tool] if chance(r, 0.8) else [{"type": "web_search"}], 0.2)
        self.put(obj, "reasoning", lambda r: {"effort": pick(r, ("low", "high", "none", None))}, 0.1)
        self.put(obj, "previous_response_id", text, 0.1)
        self.put(obj, "request_id", text, 0.1)
        self.put(obj, "max_output_tokens", lambda r: r.randint(0, 4096), 0.2)

    def block(self, r: random.Random) -> Any:
        """An Anthropic content block: text, thinking, a tool use or result, or something else."""
        kind = pick(
            r, ("text", "text", "thinking", "tool_use", "tool_result", "redacted_thinking", "image", None)
        )
        block: dict[str, Any] = {} if kind is None else {"type": kind}
        self.put(block, "text", lambda r: text(r, WORDS), 0.8 if kind == "text" else 0.1)
        self.put(block, "thinking", text, 0.8 if kind == "thinking" else 0.05)
        self.put(block, "id", text, 0.9 if kind == "tool_use" else 0.05)
        self.put(block, "name", lambda r: text(r, WORDS), 0.9 if kind == "tool_use" else 0.05)
        self.put(block, "input", lambda r: {"path": text(r)}, 0.8 if kind == "tool_use" else 0.05)
        self.put(block, "tool_use_id", text, 0.9 if kind == "tool_result" else 0.05)

        def parts(r: random.Random) -> list[dict[str, Any]]:
            return [{"type": pick(r, ("text", "image")), "text": text(r)} for _ in range(r.randint(0, 2))]

        self.put(block, "content", lambda r: one_of(r, text, parts), 0.8 if kind == "tool_result" else 0.05)
        return block

    def anthropic_fields(self, obj: dict[str, Any]) -> None:
        def message(r: random.Random) -> dict[str, Any]:
            out: dict[str, Any] = {}
            self.put(out, "role", lambda r: pick(r, ("user", "assistant", "system", "tool")), 0.97)
            blocks = lambda r: [self.block(r) for _ in range(r.randint(0, 3))]  # noqa: E731
            self.put(out, "content", lambda r: one_of(r, text, blocks, blocks), 0.95)
            return out

        self.put(obj, "messages", lambda r: [message(r) for _ in range(pick(r, (0, 1, 2, 3, 5)))], 0.97)
        self.put(obj, "max_tokens", lambda r: r.randint(0, 4096), 0.9)
        self.put(obj, "system", lambda r: one_of(r, text, lambda r: [self.block(r)]), 0.5)
        tool = {"name": "f", "input_schema": {"type": "object"}}
        self.put(obj, "tools", lambda r: [tool], 0.2)
        self.put(
            obj, "thinking", lambda r: {"type": pick(r, ("enabled", "disabled")), "budget_tokens": 2048}, 0.1
        )
        self.put(obj, "output_config", lambda r: {"effort": pick(r, ("low", "high"))}, 0.1)

    def body(self, kind: str) -> dict[str, Any]:
        r, obj = self.r, {}
        chat = kind == "chat"
        self.put(obj, "model", lambda r: pick(r, ("m", "demo-model")), 0.97)
        if kind == "responses":
            self.responses_fields(obj)
        elif kind == "messages":
            self.anthropic_fields(obj)
        elif chat:
            self.put(
                obj, "messages", lambda r: [self.message(r) for _ in range(pick(r, (0, 1, 1, 1, 2, 3)))], 0.97
            )
            self.put(obj, "tools", lambda r: [{"type": "function", "function": {"name": "f"}}], 0.1)
            self.put(obj, "chat_template_kwargs", lambda r: {"enable_thinking": chance(r, 0.5)}, 0.1)
            self.put(obj, "add_generation_prompt", lambda r: chance(r, 0.7), 0.2)
            self.put(obj, "continue_final_message", lambda r: chance(r, 0.3), 0.2)
        else:
            self.put(obj, "prompt", self.prompt, 0.97)
            self.put(obj, "prompt_embeds", text, 0.05)
        self.put(obj, "stream", lambda r: chance(r, 0.5), 0.3)
        self.put(obj, "max_tokens", lambda r: r.randint(0, 4096), 0.2)
        self.put(obj, "max_completion_tokens", lambda r: r.randint(0, 4096), 0.2)
        self.put(obj, "nvext", self.nvext, 0.4)
        if chance(r, self.hostility):
            obj[text(r, WORDS)] = json_value(r, WORDS)  # an unknown field, or a known one overwritten
        return obj


_PATHS = {
    "chat": CHAT_PATH,
    "completion": COMPLETIONS_PATH,
    "responses": RESPONSES_PATH,
    "messages": MESSAGES_PATH,
}


def openai_object(r: random.Random, kind: str) -> dict[str, Any]:
    """A request body object: every field of the schema, valid-looking or (at a drawn rate) hostile."""
    return _Body(r, pick(r, (0.0, 0.02, 0.1, 0.3))).body(kind)


def _path(r: random.Random, kind: str) -> str:
    roll = r.random()
    if roll < 0.8:
        return _PATHS[kind]
    if roll < 0.88:
        return _PATHS[kind] + "?" + text(r)
    if roll < 0.94:
        return pick(r, [p for k, p in _PATHS.items() if k != kind])
    return text(r, ("/", "/v1/models", "/v1/chat/completions/", "/v1/responses/", "?"))


def generate(r: random.Random) -> Case:
    kind = pick(r, ("chat", "chat", "chat", "completion", "completion", "responses", "responses", "messages"))
    roll = r.random()
    if roll < 0.6:
        body = json_bytes(r, openai_object(r, kind))
    elif roll < 0.8:
        body = mutate(r, json_bytes(r, openai_object(r, kind)))
    elif roll < 0.88:
        body = json_bytes(r, json_value(r, WORDS))
    elif roll < 0.95:
        body = r.randbytes(r.randint(0, 64))
    else:
        obj = openai_object(r, kind)
        obj[pick(r, ("messages", "prompt", "nvext", "tools", "model", "input"))] = deep(r)
        body = json_bytes(r, obj)
    max_bytes = LIMIT if chance(r, 0.9) else r.randint(0, len(body) + 1)
    return body, _path(r, kind), max_bytes


def check(case: Case) -> Outcome:
    body, path, max_bytes = case
    try:
        request = parse_openai_body(body, path, max_bytes=max_bytes)
    except BodyTooLarge as exc:
        assert len(body) > max_bytes and exc.message
        return REJECTED
    except RequestInvalid as exc:
        assert exc.message and len(body) <= max_bytes
        return REJECTED
    assert len(body) <= max_bytes and request.body_size == len(body)
    assert isinstance(request.model, str) and request.model
    route = path.partition("?")[0]
    tokenizer = ByteTokenizer()
    if route in (RESPONSES_PATH, MESSAGES_PATH):
        assert request.responses_api == (route == RESPONSES_PATH) and request.kind == "chat"
        if request.messages is None:  # routed on load, saying why
            assert isinstance(request.load_only_reason, str) and request.load_only_reason
            return DECODED
        assert all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in request.messages)
        ids = tokenizer.encode_chat(request.system_merged or request.messages, tools=request.tools)
    elif route == CHAT_PATH:
        assert request.kind == "chat" and request.messages
        assert all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in request.messages)
        ids = tokenizer.encode_chat(request.messages, tools=request.tools)
    else:
        assert route == COMPLETIONS_PATH and request.kind == "completion" and request.messages is None
        assert (request.prompt_text is None) != (request.prompt_token_ids is None)
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            assert ids
        else:
            ids = tokenizer.encode_text(request.prompt_text or "")
    assert all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in ids)
    assert request.max_tokens is None or (type(request.max_tokens) is int and request.max_tokens >= 0)
    assert request.session_id is None or isinstance(request.session_id, str)
    return DECODED


def describe(case: Case) -> str:
    body, path, max_bytes = case
    return f"path={path[:80]!r} max_bytes={max_bytes} body={body[:400]!r}"


TARGET = Target("request", generate, sync_session(check), describe)


check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_parse_openai_body_decodes_or_rejects(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_parse_openai_body_decodes_or_rejects_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_bodies_reach_both_outcomes() -> None:
    """The generator is not all garbage: seeded inputs are both accepted and rejected."""
    outcomes = [next(iter(check(generate(random.Random(i))))) for i in range(300)]
    assert 0.1 < outcomes.count("decoded") / len(outcomes) < 0.9
