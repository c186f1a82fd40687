"""A rewritten request's answer names the model its client asked for again.

When the picker sends a request under another model than its client named (an
InferenceModelRewrite, or the `x-gateway-model-name-rewrite` header), the engine answers with the
name it served: `"model":"foodreview-v2"` in a JSON answer, in every chunk of a server-sent event
stream, in a Responses API answer. The Inference Extension's picker writes the client's name back
into the response body, so a canary stays invisible to its clients; `ModelNameRestorer` does the
same, chunk by chunk, as Envoy streams the body through the picker.

What is replaced: the `model` member written compactly, as vLLM and SGLang write it (pydantic's
`model_dump_json`: `"model":"<name>"`), or with one space after the colon (Python's `json.dumps`
default: `"model": "<name>"`); the name JSON-encoded as an engine encodes it (non-ASCII characters
kept as UTF-8; `ensure_ascii` engines write escapes, which are matched too). An occurrence cut by a
chunk boundary is still found: a chunk's tail that could begin an occurrence is held back and sent
with the next chunk. That tail is shorter than the pattern and holds no line break, so it never
delays the end of an event (a blank line) and is held only within an event the engine cut. A body that no
pattern matches (a compressed answer, another serialisation) passes unchanged: the client then sees
the served name, never a broken body.
"""

from __future__ import annotations

import json

__all__ = ["ModelNameRestorer"]


def _replacements(sent: str, asked: str) -> tuple[tuple[bytes, bytes], ...]:
    """(what an engine may write, what to write instead): each form of `"model":"<sent>"` paired
    with the same form (separator, escaping) of the asked name."""
    pairs: dict[bytes, bytes] = {}
    for ascii_only in (False, True):  # UTF-8 kept, or \\u escapes
        for sep in (":", ": "):
            old = f'"model"{sep}{json.dumps(sent, ensure_ascii=ascii_only)}'.encode()
            pairs.setdefault(old, f'"model"{sep}{json.dumps(asked, ensure_ascii=ascii_only)}'.encode())
    return tuple(pairs.items())


class ModelNameRestorer:
    """Rewrites `"model":"<sent>"` into `"model":"<asked>"` across the chunks of one body."""

    __slots__ = ("_held", "_longest", "_replacements")

    def __init__(self, sent: str, asked: str) -> None:
        if sent == asked:
            raise ValueError("nothing to restore: the model was sent as asked")
        self._replacements = _replacements(sent, asked)
        self._longest = max(len(old) for old, _ in self._replacements)
        self._held = b""

    @property
    def held(self) -> int:
        """Bytes held back, waiting for the next chunk (0 after the last)."""
        return len(self._held)

    def feed(self, chunk: bytes, end: bool = False) -> bytes:
        """The bytes to send for `chunk`: replaced, less a tail that may begin a match (sent with
        the next chunk; all of it when `end`)."""
        data = self._held + chunk if self._held else chunk
        if not data:
            return data
        replaced_to = 0
        if any(old in data for old, _ in self._replacements):  # most chunks: none
            data, replaced_to = self._replace(data)
        if end or data.endswith(b"\n"):  # a line's end: no name spans it (JSON writes "\\n" in one)
            self._held = b""
            return data
        cut = self._partial_tail(data, replaced_to)
        self._held = data[cut:]
        return data[:cut]

    def _replace(self, data: bytes) -> tuple[bytes, int]:
        """`data` with its occurrences replaced from left to right, and where the last replacement
        ends in what is returned. An occurrence that begins inside one replaced is none (the two
        share a quote: `"model":"x"model":"x"`), whatever the chunks the bytes came in."""
        out = bytearray()
        at = 0
        while found := [(i, old, new) for old, new in self._replacements if (i := data.find(old, at)) != -1]:
            i, old, new = min(found)
            out += data[at:i]
            out += new
            at = i + len(old)
        replaced_to = len(out)
        out += data[at:]
        return bytes(out), replaced_to

    def _partial_tail(self, data: bytes, floor: int) -> int:
        """Where the tail that may begin a pattern starts (len(data): no such tail). Only a tail
        shorter than the longest pattern is looked at, after `floor` (what was replaced: none of
        its bytes begins another occurrence), from its first `"` on."""
        start = max(floor, len(data) - self._longest + 1)
        quote = data.find(b'"', start)
        while quote != -1:
            tail = data[quote:]
            if any(old.startswith(tail) for old, _ in self._replacements):
                return quote
            quote = data.find(b'"', quote + 1)
        return len(data)
