"""Generated tokens, counted from a response body as it streams through the picker (no tokenizer).

For `--router-track-output-blocks`: the ext_proc stream feeds each response body chunk here and
reports the count to the router, which adds placeholder output blocks (`ActiveSequences`).

- Server-sent events (`text/event-stream`, OpenAI streaming as vLLM and SGLang send it): each
  `data: {...}` line is one chunk. Exact where the engine says: a chunk's `usage.completion_tokens`
  (the last chunk with `stream_options.include_usage`, every chunk with vLLM's
  `continuous_usage_stats`) replaces the count from then on. Otherwise each choice whose delta
  carries output (`content`, `reasoning_content`/`reasoning`, `tool_calls`; `text` for completions)
  counts as one token: vLLM and SGLang send one chunk per decode step, so this is exact for them
  except where a step's text is held back (a partial UTF-8 character, a stop string being matched,
  a tool-call parser buffering) and comes out later in one chunk, or under speculative decoding
  (several tokens per step): an undercount, never an overcount.
- A JSON body (`application/json`, a non-streamed answer): `usage.completion_tokens` once the body
  is whole. Such a body arrives when generation is over, so its output blocks are added only just
  before the request is freed.
- The Responses API (`/v1/responses`): each `response.output_text.delta`,
  `response.reasoning_text.delta` or `response.function_call_arguments.delta` event counts as one
  token, and `usage.output_tokens` (of the JSON answer, or of the stream's `response.completed`
  event's `response`) is the exact count.
- The Anthropic Messages API (`/v1/messages`): each `content_block_delta` event (text, thinking or
  tool input) counts as one token; `usage.output_tokens` (the JSON answer's, the stream's
  `message_delta`) is exact.
- Sequences (`n`): the choices' `index` values (the highest + 1), as the engine answers; the count
  reported per sequence is the total divided by the sequences, rounded up (`usage` is the total of
  all choices).

Bounded per request: an SSE line longer than `max_line_bytes` is skipped (its bytes are not kept,
`skipped_lines` counts it) and a JSON body longer than `max_json_bytes` is not counted (`oversize`).
Nothing here raises on bad input: a line that is not a JSON object counts in `bad_events`.
"""

from __future__ import annotations

import json
from typing import Any, TypeGuard

MAX_LINE_BYTES = 64 * 1024  # an SSE line (one chunk: a few hundred bytes, more with logprobs)
MAX_JSON_BYTES = 4 * 1024 * 1024  # a whole non-streamed answer
MAX_SEQUENCES = 256  # a choice index above this is not believed

_OUTPUT_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls")
# Responses API and Anthropic Messages stream events that carry generated text (one per decode step)
_TEXT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "content_block_delta",
    }
)


class OutputTokens:
    """Counts one response's generated tokens, chunk by chunk."""

    __slots__ = (
        "_buf",
        "_mode",
        "_skipping",
        "bad_events",
        "counted",
        "max_json_bytes",
        "max_line_bytes",
        "oversize",
        "sequences",
        "skipped_lines",
        "usage",
    )

    def __init__(
        self,
        content_type: str = "",
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_json_bytes: int = MAX_JSON_BYTES,
    ) -> None:
        """`content_type`: the response's; without a known one the first byte decides (`{`: JSON)."""
        media = content_type.partition(";")[0].strip().lower()
        self._mode = "sse" if media == "text/event-stream" else "json" if media == "application/json" else ""
        self.max_line_bytes = max_line_bytes
        self.max_json_bytes = max_json_bytes
        self.counted = 0  # tokens counted from deltas
        self.usage: int | None = None  # the engine's completion_tokens, when it said
        self.sequences = 1
        self.skipped_lines = 0
        self.bad_events = 0
        self.oversize = False
        self._buf = bytearray()
        self._skipping = False  # inside a line over the bound: dropped up to its newline

    @property
    def tokens(self) -> int:
        """Generated tokens over all sequences: the engine's count when it gave one."""
        return self.usage if self.usage is not None else self.counted

    def per_sequence(self) -> int:
        """Tokens of one sequence (rounded up)."""
        return -(-self.tokens // self.sequences)

    def feed(self, data: bytes) -> None:
        """The next body chunk."""
        if not data:
            return
        if not self._mode:
            head = data.lstrip()
            if not head:
                return
            self._mode = "json" if head[:1] in (b"{", b"[") else "sse"
        if self._mode == "json":
            if self.oversize:
                return
            if len(self._buf) + len(data) > self.max_json_bytes:
                self.oversize = True
                self._buf = bytearray()
                return
            self._buf += data
            return
        self._feed_sse(data)

    def finish(self) -> None:
        """The body ended: count what is left (a last SSE line without a newline, a JSON body)."""
        buf, self._buf = bytes(self._buf), bytearray()
        if self._mode == "json":
            if buf and not self.oversize:
                obj = _load(buf)
                if isinstance(obj, dict):
                    self._event(obj, streamed=False)
                else:
                    self.bad_events += 1
        elif self._mode == "sse" and buf and not self._skipping:
            self._line(buf)
        self._skipping = False

    def _feed_sse(self, data: bytes) -> None:
        start, limit = 0, self.max_line_bytes
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                rest = data[start:]
                if self._skipping or not rest:
                    return
                if len(self._buf) + len(rest) > limit:
                    self._skip()
                else:
                    self._buf += rest
                return
            piece = data[start:nl]
            start = nl + 1
            if self._skipping:  # the end of a line over the bound
                self._skipping = False
                continue
            if len(self._buf) + len(piece) > limit:
                self._buf = bytearray()
                self.skipped_lines += 1
                continue
            if self._buf:
                line = bytes(self._buf) + piece
                self._buf = bytearray()
            else:
                line = piece
            self._line(line)

    def _skip(self) -> None:
        self._buf = bytearray()
        self._skipping = True
        self.skipped_lines += 1

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # a blank separator, a comment (`:`), `event:`/`id:` fields
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        obj = _load(payload)
        if isinstance(obj, dict):
            self._event(obj, streamed=True)
        else:
            self.bad_events += 1

    def _event(self, obj: dict[str, Any], *, streamed: bool) -> None:
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                index = choice.get("index")
                if _is_int(index) and 0 <= index < MAX_SEQUENCES and index >= self.sequences:
                    self.sequences = index + 1
                if streamed and _has_output(choice):
                    self.counted += 1
        elif streamed and obj.get("type") in _TEXT_EVENTS:
            self.counted += 1
        usage = obj.get("usage")
        response = obj.get("response")  # a Responses API stream's response.completed
        if usage is None and isinstance(response, dict):
            usage = response.get("usage")
        if isinstance(usage, dict):
            tokens = usage.get("completion_tokens", usage.get("output_tokens"))  # chat / Responses API
            if _is_int(tokens) and tokens >= 0:
                self.usage = max(tokens, self.usage or 0)


def _load(payload: bytes) -> object:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        return None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _has_output(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return any(delta.get(key) for key in _OUTPUT_KEYS)
    return bool(choice.get("text"))
