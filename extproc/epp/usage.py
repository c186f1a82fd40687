"""The engine's own token counts (`usage`), read from a response body as it streams past.

For the Inference Extension's per-request series (`objective_metrics.py`): the prompt's tokens, the
tokens generated and the prompt's tokens the engine found cached, as the engine counted them. Where
they are:
- a non-streamed answer: its `usage` member (chat, completions, the Responses API, Anthropic's
  Messages API);
- an OpenAI event stream: the last chunk's `usage`, sent when the client asked with
  `stream_options: {"include_usage": true}` (vLLM's `continuous_usage_stats` puts a running one in
  every chunk); without it the stream has none;
- the Responses API stream: `response.completed`'s `response.usage`; Anthropic's: `message_start`'s
  (input) and `message_delta`'s (output) `usage`.

Names: `prompt_tokens` or `input_tokens`; `completion_tokens` or `output_tokens`; cached
`prompt_tokens_details.cached_tokens`, `input_tokens_details.cached_tokens` or Anthropic's
`cache_read_input_tokens`. Each count is the largest seen (running totals only grow), so the order
of events does not matter.

Cheap on every chunk: a chunk is searched for the bytes `"usage"` (in C) and nothing else is done
unless they are there. A key inside generated text cannot match: JSON escapes the quotes of a
string's content. The value after the key is decoded alone (`raw_decode`), whatever surrounds it;
one cut by the end of a chunk waits for the next (at most `MAX_HELD_BYTES` held). A key cut in two
by chunks is found across the cut. Nothing here raises on bad input.
"""

from __future__ import annotations

import json
from typing import Any

KEY = b'"usage"'
MAX_HELD_BYTES = 4096  # a usage object (tens of bytes; a few hundred with details) cut by a chunk's end
_DECODER = json.JSONDecoder()
_PROMPT = ("prompt_tokens", "input_tokens")
_OUTPUT = ("completion_tokens", "output_tokens")
_DETAILS = ("prompt_tokens_details", "input_tokens_details")


class Usage:
    """One response's `usage` counts, fed chunk by chunk; None where the engine did not say."""

    __slots__ = ("_held", "_seam", "cached_tokens", "completion_tokens", "prompt_tokens")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._held = b""  # from a key on, its value cut by the last chunk's end
        self._seam = b""  # the last chunk's last bytes: a key cut in two

    def feed(self, data: bytes) -> None:
        """The next body chunk."""
        if self._held:
            data, self._held = self._held + data, b""
        elif self._seam:
            joined = self._seam + data[: len(KEY) - 1]
            if KEY in joined:
                data = self._seam + data
        at = data.find(KEY)
        while at >= 0:
            end = self._read(data, at)
            if end < 0:  # cut by the chunk's end: wait for the rest
                if len(data) - at <= MAX_HELD_BYTES:
                    self._held = data[at:]
                return
            at = data.find(KEY, end)
        self._seam = (self._seam + data if len(data) < len(KEY) else data)[-(len(KEY) - 1) :]

    def _read(self, data: bytes, at: int) -> int:
        """Decode the value after the key at `at`; where to look on, or -1 when it is cut."""
        text = data[at + len(KEY) : at + len(KEY) + MAX_HELD_BYTES].decode("utf-8", "replace")
        colon = len(text) - len(text.lstrip())
        if colon >= len(text):
            return -1
        if text[colon] != ":":
            return at + len(KEY)  # a string "usage", not a key
        start = colon + 1
        while start < len(text) and text[start] in " \t\r\n":
            start += 1
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            # cut, unless a whole window of bytes follows (then the value is not JSON: skip the key)
            return -1 if len(data) - at < MAX_HELD_BYTES else at + len(KEY)
        except RecursionError:
            return at + len(KEY)
        if isinstance(value, dict):
            self._take(value)
        return at + len(KEY) + len(text[:end].encode("utf-8"))

    def _take(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = _larger(self.prompt_tokens, _first(usage, _PROMPT))
        self.completion_tokens = _larger(self.completion_tokens, _first(usage, _OUTPUT))
        cached = usage.get("cache_read_input_tokens")
        for name in _DETAILS:
            details = usage.get(name)
            if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
                cached = details.get("cached_tokens")
        self.cached_tokens = _larger(self.cached_tokens, _count(cached))


def _first(usage: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        count = _count(usage.get(name))
        if count is not None:
            return count
    return None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _larger(old: int | None, new: int | None) -> int | None:
    if new is None:
        return old
    return new if old is None else max(old, new)
