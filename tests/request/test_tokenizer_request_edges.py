"""Edges of the request tokenizer that the picker routes on.

`ByteTokenizer`'s fixed chat layout (the mock worker's prompts), `message_text` on part lists, the kwargs
`template_kwargs` hands the template, what `RequestTokenizer` sends to the engine's `/tokenize`, the time
bound it puts on that wait, which prompts it encodes on the event loop and which in a worker thread, its
cache stats for backends without caches, and `truncate_prompt_tokens: 0`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from extproc.errors import TokenizerUnavailable
from extproc.request.parse import ParsedRequest, parse_openai_body
from extproc.request.remote_tokenizer import RemoteTokenizer
from extproc.request.tokenizer import (
    ByteTokenizer,
    HfTokenizer,
    RequestTokenizer,
    message_text,
    template_kwargs,
)
from tests.tokenizer_files import LLAMA_TEMPLATE, write_tokenizer_dir

from .test_tokenizer import FakeEngine, engine  # noqa: F401 (a fixture)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
# A template with no added token between messages: a chat rendered with it cannot be encoded piecewise.
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def parsed(body: dict[str, Any]) -> ParsedRequest:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    return parse_openai_body(json.dumps(body).encode(), path, max_bytes=1 << 20)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-3-like tokenizer (its post-processor prepends BOS) whose "tool_use" template cannot be
    encoded piecewise while its "default" one can."""
    templates = [
        {"name": "default", "template": LLAMA_TEMPLATE},
        {"name": "tool_use", "template": PLAIN_TEMPLATE},
    ]
    return write_tokenizer_dir(tmp_path_factory.mktemp("tok") / "two-templates", chat_template=templates)


# --- message_text and ByteTokenizer's chat layout --------------------------------------------------------


def test_message_text_joins_only_the_text_parts_of_a_part_list():
    assert message_text(None) == ""
    assert message_text("plain é") == "plain é"
    parts = [
        {"type": "text", "text": "first "},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        "not a part",
        {"type": "text"},  # a text part without text adds nothing
        {"type": "text", "text": "second"},
    ]
    assert message_text(parts) == "first second"
    with pytest.raises(ValueError):
        message_text(42)


def test_byte_tokenizer_chat_is_a_role_line_and_content_per_message_then_the_assistant_prompt():
    """The fixed layout the mock worker prefills: a message without a role is a user's, content parts
    keep their text only, null content is empty; ids are the UTF-8 bytes."""
    messages = [
        {"role": "system", "content": "be brief"},
        {"content": "who am I"},
        {"role": "user", "content": [{"type": "text", "text": "hé"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    conversation = "<|system|>\nbe brief\n<|user|>\nwho am I\n<|user|>\nhé\n<|assistant|>\n\n"
    tokenizer = ByteTokenizer()
    assert tokenizer.encode_chat(messages) == list(f"{conversation}<|assistant|>\n".encode())
    assert tokenizer.encode_chat(messages, add_generation_prompt=False) == list(conversation.encode())


# --- template_kwargs ----------------------------------------------------------------------------------


def test_template_kwargs_carry_the_requests_add_generation_prompt_over_the_kwargs_one():
    """vLLM merges the request's fields over `chat_template_kwargs`: the field wins."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    prefill = parsed(
        {
            "model": "m",
            "messages": messages,
            "add_generation_prompt": False,
            "chat_template_kwargs": {"add_generation_prompt": True, "k": 1},
        }
    )
    expected = {"add_generation_prompt": False, "continue_final_message": False, "k": 1}
    assert template_kwargs(prefill) == expected
    assert template_kwargs(parsed({"model": "m", "messages": messages}))["add_generation_prompt"] is True


# --- RequestTokenizer over the engine's /tokenize --------------------------------------------------------


async def test_remote_chat_sends_tools_generation_prompt_and_continue_final_message_to_the_engine(
    engine: FakeEngine,  # noqa: F811 (the fixture)
):
    """Without a configured model name each request's own model is sent; the prefill asks the engine to
    continue the final message (a `chat_template_kwargs` entry: /tokenize has no such field)."""
    tokenizer = RequestTokenizer(RemoteTokenizer(engine.url, timeout_s=5.0, cache_size=0), timeout_s=5.0)
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "It is"}]
    request = parsed(
        {
            "model": "alias",
            "messages": messages,
            "tools": TOOLS,
            "add_generation_prompt": False,
            "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    try:
        # the engine's ids as it answered ([message count, add_generation_prompt]: test_tokenizer's fake)
        assert await tokenizer.tokenize(request) == [2, 0]
        assert await tokenizer.tokenize(parsed({"model": "alias", "messages": messages[:1]})) == [1, 1]
    finally:
        await tokenizer.close()
    assert engine.requests == [
        {
            "model": "alias",
            "messages": messages,
            "add_generation_prompt": False,
            "tools": TOOLS,
            "chat_template_kwargs": {"continue_final_message": True, "enable_thinking": False},
        },
        {"model": "alias", "messages": messages[:1], "add_generation_prompt": True},
    ]


async def test_a_remote_wait_is_bounded_by_the_request_tokenizers_own_timeout(engine: FakeEngine):  # noqa: F811
    """The picker's bound applies even when the backend's HTTP client would wait longer."""
    engine.mode = "hang"
    tokenizer = RequestTokenizer(RemoteTokenizer(engine.url, timeout_s=3.0, cache_size=0), timeout_s=0.05)
    start = time.monotonic()
    try:
        with pytest.raises(TokenizerUnavailable, match=r"took longer than 0\.05s"):
            await tokenizer.tokenize(parsed({"model": "m", "prompt": "slow"}))
    finally:
        await tokenizer.close()
    assert time.monotonic() - start < 2.5


async def test_backends_without_caches_report_no_cache_stats():
    unused = RemoteTokenizer("http://127.0.0.1:9", timeout_s=1.0, cache_size=4)  # never asked here
    remote = RequestTokenizer(unused, timeout_s=1.0)
    for tokenizer in (RequestTokenizer(ByteTokenizer(), timeout_s=1.0), remote):
        assert tokenizer.piece_cache_stats() is None
        assert tokenizer.prefix_cache_stats() is None
    await remote.close()


# --- where local tokenization runs: the event loop or a worker thread ------------------------------------


class ThreadRecordingBytes(ByteTokenizer):
    """The byte tokenizer, noting the thread each prompt was encoded on."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def encode_text(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().encode_text(text, add_special_tokens=add_special_tokens)


async def test_a_body_of_exactly_inline_max_bytes_is_tokenized_on_the_loop_one_more_byte_in_a_thread():
    request = parsed({"model": "m", "prompt": "hello"})
    loop = threading.get_ident()
    at_limit, over_limit = ThreadRecordingBytes(), ThreadRecordingBytes()
    inline = RequestTokenizer(at_limit, timeout_s=5.0, inline_max_bytes=request.body_size)
    threaded = RequestTokenizer(over_limit, timeout_s=5.0, inline_max_bytes=request.body_size - 1)
    assert await inline.tokenize(request) == await threaded.tokenize(request) == list(b"hello")
    assert at_limit.threads == [loop]
    assert len(over_limit.threads) == 1 and over_limit.threads[0] != loop


async def test_from_settings_applies_its_inline_max_bytes(monkeypatch: pytest.MonkeyPatch):
    threads: list[int] = []
    plain_encode = ByteTokenizer.encode_text

    def recording_encode(self: ByteTokenizer, text: str, *, add_special_tokens: bool | None = None) -> Any:
        threads.append(threading.get_ident())
        return plain_encode(self, text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(ByteTokenizer, "encode_text", recording_encode)
    every_body = RequestTokenizer.from_settings(None, None, "", 5.0, 0, inline_max_bytes=0)
    default = RequestTokenizer.from_settings(None, None, "", 5.0, 0)
    request = parsed({"model": "m", "prompt": "hi"})
    assert await every_body.tokenize(request) == await default.tokenize(request) == [104, 105]
    loop = threading.get_ident()
    assert threads[0] != loop and threads[1] == loop


class ThreadRecordingHf(HfTokenizer):
    """The real tokenizer, noting the thread each chat was encoded on."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.threads: list[int] = []

    def encode_chat_ids(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().encode_chat_ids(*args, **kwargs)


@pytest.mark.parametrize(
    "tool_fields, encode_args",
    [
        ({"tools": tuple(TOOLS)}, {"tools": TOOLS}),
        ({"chat_template_kwargs": {"tools": TOOLS}}, {"chat_template_kwargs": {"tools": TOOLS}}),
    ],
    ids=["request-tools", "kwargs-tools"],
)
async def test_a_next_turn_whose_tool_template_is_encoded_whole_goes_to_a_thread(
    tok_dir: Path, tool_fields: dict[str, Any], encode_args: dict[str, Any]
):
    """A chat's next turn stays on the loop only when its template is encoded piecewise from the cache:
    with tools (in the request or the kwargs) the "tool_use" template is chosen, which is encoded whole."""
    backend = ThreadRecordingHf(tok_dir)
    assert backend.encodes_piecewise(None, None, False)
    tokenizer = RequestTokenizer(backend, timeout_s=5.0, inline_max_bytes=100)
    messages = tuple({"role": "user", "content": f"turn {i} " * 20} for i in range(3))
    turn = {"kind": "chat", "model": "m", "messages": messages, "body_size": 1000, "new_bytes": 100}
    without_tools = await tokenizer.token_ids(ParsedRequest(**turn))
    with_tools = await tokenizer.token_ids(ParsedRequest(**turn, **tool_fields))
    whole = HfTokenizer(tok_dir, piece_cache_bytes=0)
    assert list(without_tools) == whole.encode_chat(messages)
    assert list(with_tools) == whole.encode_chat(messages, **encode_args)
    loop = threading.get_ident()
    assert backend.threads[0] == loop
    assert backend.threads[1] != loop


# --- truncate_prompt_tokens ------------------------------------------------------------------------------


async def test_truncate_prompt_tokens_zero_keeps_no_token_as_vllm(tok_dir: Path):
    """The tokenizer keeps the post-processor's BOS; vLLM 0.33's `_token_truncation` then cuts to
    max_length 0 (`slice(0, 0)`) and keeps no token."""
    tokenizer = RequestTokenizer(HfTokenizer(tok_dir), timeout_s=5.0)
    request = parsed({"model": "m", "prompt": "hello world", "truncate_prompt_tokens": 0})
    assert await tokenizer.tokenize(request) == []
