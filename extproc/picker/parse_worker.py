"""The body parse worker: `python -m extproc.picker.parse_worker`, and what it runs (also on the loop).

A plain child process, not multiprocessing: nothing of the parent's `__main__` is imported again,
nothing is forked from the gRPC process, and the parent talks to it through asyncio pipes (no
thread of its own). One body at a time. On stdin, per request: a frame holding the marshalled
`(function name, arguments)`, then a frame holding the body; on stdout, a frame holding the
marshalled answer. A frame is a 4-byte big-endian length and that many bytes. The worker exits
at the end of stdin (the parent stopped it, or died). It parses with the garbage collector off:
JSON trees have no cycles, and on deeply nested bodies the collections cost several times the
parse itself. Out of memory, the kernel kills a worker first (`oom_score_adj` 1000): the picker
replaces it and answers that one body 400.

The functions answer with marshal-able values only (JSON values, tuples): marshal builds them back
in the parent several times faster than pickle, with no code of ours involved.
"""

from __future__ import annotations

import contextlib
import gc
import json
import marshal
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from extproc.errors import RequestInvalid
from extproc.request.body_prefixes import MessagesSpans
from extproc.request.parse import CHAT_PATH, ParsedRequest, body_prefixes, parse_openai_body, route_of

PROMPT_FIELDS = ("messages", "tools", "documents", "chat_template_kwargs", "nvext")
_SCALARS = (str, int, float, bool, type(None))
MAX_FRAME_BYTES = 2**31  # a frame's length is four bytes
# A worker's recent bodies (`BodyPrefixes`): a chat's next turn parses only its new messages. Their
# values are only marshalled here, never changed.
BODY_PREFIXES = body_prefixes()


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """A parsed request, and how many JSON values of its prompt fields were left out (0: none)."""

    request: ParsedRequest
    prompt_dropped: int = 0
    prompt_values: int = 0  # JSON values of the prompt fields (kept ones: up to the limit)

    @property
    def has_prompt(self) -> bool:
        """Whether the request can be tokenized (a chat request whose messages were dropped cannot)."""
        return self.request.kind == "completion" or self.request.messages is not None


# --- the same on the loop and in a worker ---------------------------------------------------


def limit_prompt(request: ParsedRequest, max_values: int) -> ParsedBody:
    """The request as parsed, or without its prompt fields when they hold more than `max_values`
    JSON values (a completion keeps its prompt, the agent hints their scalar values)."""
    budget = max_values
    for name in PROMPT_FIELDS:
        budget = _count_down(getattr(request, name), budget)
        if budget < 0:
            break
    if budget >= 0:
        return ParsedBody(request, prompt_values=max_values - budget)
    hints = {k: v for k, v in request.agent_hints.items() if isinstance(v, _SCALARS)}
    stripped = replace(
        request,
        messages=None,
        tools=None,
        documents=None,
        chat_template_kwargs=MappingProxyType({}),
        nvext=MappingProxyType({}),
        agent_hints=MappingProxyType(hints),
    )
    return ParsedBody(stripped, prompt_dropped=max_values - budget)


def _count_down(value: object, budget: int) -> int:
    """`budget` minus the JSON values in `value` (keys counted); stops once below zero."""
    stack = [value]
    while stack and budget >= 0:
        item = stack.pop()
        budget -= 1
        if type(item) is str:  # most values: skip the container checks
            continue
        if isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
            budget -= len(item)
    return budget


def model_of(body: bytes) -> str | None:
    """The non-empty string `model` of a JSON object body, else None."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) and model else None


def with_model(body: bytes, model: str) -> bytes:
    """`body` (a JSON object, as the request parser accepted it) with its `model` set to `model`; the
    rest is the same JSON, written compactly (as the Inference Extension's picker rewrites it)."""
    document = json.loads(body)
    document["model"] = model
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def json_object(body: bytes, token_field: str | None, max_tokens: int) -> dict[str, Any]:
    """A JSON object; `token_field`, when present, a list of at most `max_tokens` token ids.
    Raises RequestInvalid naming the problem."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply, too many digits
        raise RequestInvalid("the body must be a JSON object") from None
    if not isinstance(value, dict):
        raise RequestInvalid("the body must be a JSON object")
    tokens = value.get(token_field) if token_field is not None else None
    if tokens is not None:
        if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < 2**32 for t in tokens):
            raise RequestInvalid(f"'{token_field}' must be a list of token ids (integers in [0, 2**32))")
        if len(tokens) > max_tokens:
            raise RequestInvalid(f"'{token_field}' has {len(tokens)} token ids; the limit is {max_tokens}")
    return value


# --- answers, as the worker sends them --------------------------------------------------------


def answer_request(body: bytes, path: str, max_bytes: int, max_values: int) -> bytes:
    """The parsed request, and where a chat body's `messages` lie in it (`MessagesSpans` as a tuple,
    or None): the picker's event loop may parse the next turn of the chat from them."""
    BODY_PREFIXES.last = None  # set by this body's parse, if it walks one
    try:
        request = parse_openai_body(body, path, max_bytes=max_bytes, prefixes=BODY_PREFIXES)
        parsed = limit_prompt(request, max_values)
    except RequestInvalid as exc:
        return marshal.dumps(("invalid", exc.message))
    values = {}
    mappings = []
    for f in fields(ParsedRequest):
        value = getattr(parsed.request, f.name)
        if isinstance(value, MappingProxyType):
            value = dict(value)
            mappings.append(f.name)
        values[f.name] = value
    spans = BODY_PREFIXES.last
    raw_messages = route_of(path) == CHAT_PATH and parsed.request.messages is not None
    where = astuple(spans) if spans is not None and raw_messages else None
    return marshal.dumps(("ok", values, tuple(mappings), parsed.prompt_dropped, parsed.prompt_values, where))


def read_request_answer(answer: Any) -> tuple[ParsedBody, MessagesSpans | None]:
    """`answer_request`'s answer (unmarshalled) back into a ParsedBody and where its `messages` lie,
    or its RequestInvalid."""
    if answer[0] != "ok":
        raise RequestInvalid(answer[1])
    _, values, mappings, dropped, prompt_values, where = answer
    for name in mappings:
        values[name] = MappingProxyType(values[name])
    parsed = ParsedBody(ParsedRequest(**values), prompt_dropped=dropped, prompt_values=prompt_values)
    return parsed, MessagesSpans(*where) if where is not None else None


def answer_model(body: bytes) -> bytes:
    return marshal.dumps(model_of(body))


def answer_json_object(body: bytes, token_field: str | None, max_tokens: int) -> bytes:
    try:
        return marshal.dumps(("ok", json_object(body, token_field, max_tokens)))
    except RequestInvalid as exc:
        return marshal.dumps(("invalid", exc.message))


def answer_with_model(body: bytes, model: str) -> bytes:
    return marshal.dumps(with_model(body, model))


FUNCTIONS: dict[str, Callable[..., bytes]] = {
    "request": answer_request,
    "model": answer_model,
    "json_object": answer_json_object,
    "with_model": answer_with_model,
}


# --- the worker process -----------------------------------------------------------------------


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    if len(data) < size:
        return None
    return data


def _read_frame(stream: BinaryIO) -> bytes | None:
    header = _read_exactly(stream, 4)
    return None if header is None else _read_exactly(stream, int.from_bytes(header, "big"))


def _answer(name: str, args: tuple[Any, ...], body: bytes) -> bytes:
    try:
        return FUNCTIONS[name](body, *args)
    except MemoryError:
        return marshal.dumps(("invalid", "the body is too large to parse"))


def main() -> None:
    gc.disable()  # JSON trees have no cycles; collections would only slow the parse down
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a worker stops
    with contextlib.suppress(OSError):  # out of memory, the kernel kills a worker before the picker
        Path("/proc/self/oom_score_adj").write_text("1000")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        request = _read_frame(stdin)
        body = _read_frame(stdin) if request is not None else None
        if request is None or body is None:
            return  # the parent closed our stdin
        name, args = marshal.loads(request)
        answer = _answer(name, tuple(args), body)
        stdout.write(len(answer).to_bytes(4, "big"))
        stdout.write(answer)
        stdout.flush()


if __name__ == "__main__":
    # run as the module itself rather than as `__main__`, so its functions carry their own module's
    # name, as in the parent (mutation testing switches a mutant on by that name, also in here)
    from extproc.picker import parse_worker

    parse_worker.main()
