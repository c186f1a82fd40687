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
string's content. The value after the key is decoded alone (`raw_decode`), whatever surrounds it.
A member cut by the end of a chunk is carried to the next, and so is the beginning of a key that
ends a chunk. A member longer than `MAX_BYTES` (key to the value's end) is not read, so at most that
much is carried. Nothing here raises on bad input.
"""

from __future__ import annotations

import json
import re
from typing import Any

KEY = b'"usage"'
MAX_BYTES = 4096  # a usage member: tens of bytes, a few hundred with details
_COLON = re.compile(rb"\s*(:\s*)?")
_CODEC = "latin-1"  # one character per byte: positions in the text are positions in the bytes
_DECODER = json.JSONDecoder()
_PROMPT = ("prompt_tokens", "input_tokens")
_OUTPUT = ("completion_tokens", "output_tokens")
_DETAILS = ("prompt_tokens_details", "input_tokens_details")


class Usage:
    """One response's `usage` counts, fed chunk by chunk; None where the engine did not say."""

    __slots__ = ("_carried", "cached_tokens", "completion_tokens", "prompt_tokens")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._carried = b""  # the last chunk's end, read with the next: a member or key it cut

    def feed(self, data: bytes) -> None:
        """The next body chunk."""
        if self._carried:
            data, self._carried = self._carried + data, b""
        at = data.find(KEY)
        while at >= 0:
            end = self._read(data, at)
            if end is None:  # the chunk ends inside this member: read it with the next
                self._carried = data[at:]
                return
            at = data.find(KEY, end)
        # a key the chunk's end cut begins at its last quote (carried bytes that begin no key are
        # harmless: no key can straddle them)
        quote = data.rfind(b'"', 1 - len(KEY))
        if quote >= 0:
            self._carried = data[quote:]

    def _read(self, data: bytes, at: int) -> int | None:
        """Read the member whose key is at `at`: where to search on, or None when `data` ends
        inside it (it is shorter than `MAX_BYTES` so far)."""
        member = data[at : at + MAX_BYTES]
        cut = len(member) < MAX_BYTES
        colon = _COLON.match(member, len(KEY))
        assert colon is not None  # the pattern matches the empty string
        if colon.group(1) is None:  # no colon: the chunk ends here, or a string "usage" in a list
            return None if cut and colon.end() == len(member) else at + len(KEY)
        try:
            value, end = _DECODER.raw_decode(member.decode(_CODEC), colon.end())
        except ValueError:
            return None if cut else at + len(KEY)
        except RecursionError:  # nested deeper than the decoder goes: no usage object
            return at + len(KEY)
        if isinstance(value, dict):
            self._take(value)
        return at + end

    def _take(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = _larger(self.prompt_tokens, _first(usage, _PROMPT))
        self.completion_tokens = _larger(self.completion_tokens, _first(usage, _OUTPUT))
        cached = _count(usage.get("cache_read_input_tokens"))
        for name in _DETAILS:
            details = usage.get(name)
            if isinstance(details, dict):
                cached = _larger(cached, _count(details.get("cached_tokens")))
        self.cached_tokens = _larger(self.cached_tokens, cached)


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
