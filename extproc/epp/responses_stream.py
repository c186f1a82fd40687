"""What the picker reads of a Responses API answer (`POST /v1/responses`) as it passes.

- Its id. vLLM's answer is a `ResponsesResponse` whose first field is `id`; streamed, its first event
  is `response.created`, whose `response` starts with the same `id` (`vllm/entrypoints/openai/
  responses/`: `protocol.py`, `api_router.py`). So the first `"id"` string of the answer, found within
  its first `MAX_ID_SCAN_BYTES`, names the stored response.
- Its first token. A streamed answer starts with `response.created` and `response.in_progress` (and
  `response.queued` for a background one), sent before generation starts: a chunk holding only those
  events is not the first token.
"""

from __future__ import annotations

import json
import re
from typing import Final

MAX_ID_SCAN_BYTES: Final = 64 * 1024
PREAMBLE_EVENTS: Final = frozenset({b"response.created", b"response.in_progress", b"response.queued"})

_EVENT = re.compile(rb"^event:[ \t]*([^\r\n]*)", re.MULTILINE)
_ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){1,512}")')


def only_preamble(chunk: bytes) -> bool:
    """Whether `chunk` holds SSE events and all of them come before generation."""
    events = _EVENT.findall(chunk)
    return bool(events) and all(event.strip() in PREAMBLE_EVENTS for event in events)


def response_id(head: bytes) -> str | None:
    """The first `"id"` string in `head` (the answer's first bytes), or None."""
    match = _ID.search(head)
    if match is None:
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, str) and value else None
