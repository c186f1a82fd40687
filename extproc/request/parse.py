"""OpenAI request bodies -> `ParsedRequest`: the one converter from an HTTP body to what routing reads.

Accepts `/v1/chat/completions` and `/v1/completions` bodies (the `:path` may carry a query string) and
validates only what routing, tokenization and the scheduling hints need; every other field is ignored and
reaches the engine untouched. Raises `BodyTooLarge` or `RequestInvalid` (with a message naming the field)
and nothing else, whatever the bytes: `tests/request/test_parse.py` fuzzes that promise.

Paths are decided normalised (`normalize_path`), as Envoy's http_connection_manager forwards them with
`normalize_path`, `merge_slashes` and `path_with_escaped_slashes_action: REJECT_REQUEST` (our Envoy
configs set all three): percent-encoded unreserved characters decoded, backslashes made slashes, `.`
and `..` segments resolved, runs of slashes merged. A worker that decodes paths (vLLM's server stack
does) then serves as chat or completions only paths the picker calls routable: `/v1/chat/%63ompletions`
is parsed, limited and tracked like `/v1/chat/completions`. An encoded slash, backslash or NUL (`%2F`,
`%5C`, `%00`) and a fragment are rejected (`RequestInvalid`, 400), as Envoy rejects them: decoded, a
slash would name another path than the one a gateway routes on.

Decisions:
- A completion `prompt` batch (several strings or token lists) is rejected: one HTTP request goes to one
  endpoint, and the engine would prefill every prompt there, so routing on the first alone would be wrong.
- JSON must be strict RFC 8259 (no NaN/Infinity) and UTF-8; unpaired UTF-16 surrogate escapes are rejected
  because no tokenizer can encode them.
- `null` means "absent" for optional fields, as in the OpenAI schema.
- `lora_name` is SGLang's `lora_path` (a string: the adapter's name; empty = none). vLLM serves adapters
  as model names (`--lora-modules NAME=PATH`) and SGLang also as `model: "BASE:ADAPTER"`: only the
  configured models say which, so the pipeline resolves `model` (`EndpointPicker.resolve_model`).
- `n` (choices to generate, vLLM's for chat and completions) must be an integer in [1, 128] (Dynamo's
  frontend's bounds): the router counts the request's decode load as `n` sequences sharing one prefill.
- `cache_salt` (vLLM's and SGLang's request field) must be a non-empty string when present, as vLLM
  requires: a salted prompt only reuses blocks stored under the same salt, so its block hashes are
  seeded with it (Dynamo's `cache_namespace`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, NoReturn
from urllib.parse import unquote_plus

from extproc.errors import BodyTooLarge, RequestInvalid
from extproc.request import anthropic
from extproc.request.anthropic import MESSAGES_PATH
from extproc.request.body_prefixes import DEFAULT_BODY_PREFIX_BYTES, MAX_ELEMENTS, BodyPrefixes
from extproc.request.json_type import json_type
from extproc.request.responses import RESPONSES_PATH, to_chat_fields

CHAT_PATH: Final = "/v1/chat/completions"
COMPLETIONS_PATH: Final = "/v1/completions"
ROUTABLE_PATHS: Final = frozenset({CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH, MESSAGES_PATH})
REALTIME_PATH: Final = "/v1/realtime"  # the Realtime API: a WebSocket, routed on its request headers
MAX_TOKEN_ID: Final = 2**32 - 1  # token ids are u32 everywhere downstream (block hashing, events)
MAX_CHOICES: Final = 128  # `n`: Dynamo's frontend accepts 1..128 (its validate.rs MAX_N)

_UNRESERVED: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})?")  # an escape, or a `%` that starts none
_HEX_PAIR = re.compile(r"[0-9A-Fa-f]{2}")
_REJECTED_ESCAPE = re.compile(r"%(?:2[fF]|5[cC]|00)")
_SLASHES = re.compile(r"/{2,}")

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_TEXT_PART_FIELDS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}


def _empty_mapping() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What routing needs from one OpenAI request. Top-level mappings are read-only views.

    A chat request has `messages`; a completion has exactly one of `prompt_text` and `prompt_token_ids`.
    A Responses API request (`responses_api`) and an Anthropic Messages request are chat requests built
    as vLLM builds them (`extproc.request.responses`, `extproc.request.anthropic`); without `messages`
    their `load_only_reason` says why.
    """

    kind: Literal["chat", "completion"]
    model: str
    messages: tuple[Mapping[str, Any], ...] | None = None  # as sent (validated, not normalised)
    prompt_text: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None  # u32 ids: the prompt needs no tokenizer
    tools: tuple[Mapping[str, Any], ...] | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=_empty_mapping)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # vLLM: render the last (assistant) message open-ended
    stream: bool = False
    max_tokens: int | None = None  # max_completion_tokens, else max_tokens
    n: int = 1  # choices generated from the one prompt: decoding sequences sharing its prefill
    session_id: str | None = None  # nvext.session_control.session_id
    session_action: str | None = None  # nvext.session_control.action, e.g. "close"
    agent_hints: Mapping[str, Any] = field(default_factory=_empty_mapping)  # known keys type-checked
    nvext: Mapping[str, Any] = field(default_factory=_empty_mapping)
    lora_name: str | None = None
    cache_salt: str | None = None  # the engines' per-tenant prefix-cache isolation key
    reasoning_effort: str | None = None  # chat: vLLM hands it, and enable_thinking, to the chat template
    documents: tuple[Any, ...] | None = None  # chat: RAG documents vLLM hands to the chat template
    add_special_tokens: bool | None = None  # None: the engine's default (chat False, completions True)
    truncate_prompt_tokens: int | None = None  # vLLM keeps this many prompt tokens (-1: up to its context)
    truncation_side: str | None = None  # "left" | "right": vLLM then cuts after tokenizing, from that side
    body_size: int = 0  # bytes
    # at most this many bytes of the body are new to the picker (a chat's next turn, its earlier
    # messages taken from the turn before: `parse_shared_body`); None: all of them may be. How it was
    # parsed, not what it asks: left out of equality
    new_bytes: int | None = field(default=None, compare=False)
    responses_api: bool = False  # POST /v1/responses
    previous_response_id: str | None = None  # Responses API: continues this stored response
    response_id: str | None = None  # Responses API: the id its answer will carry (vLLM's `request_id` field)
    load_only_reason: str | None = None  # why the prompt is not rebuilt (the request is routed on load)
    # Messages API: `messages` with inline system messages merged into the first one, when that differs
    # (for chat templates that need the system message first: `RequestTokenizer.merges_inline_system`)
    system_merged: tuple[Mapping[str, Any], ...] | None = None


def normalize_path(path: str) -> str:
    """`path` (a `:path`, query string included) as Envoy 1.40 forwards it with `normalize_path: true`,
    `merge_slashes: true` and escaped slashes rejected: percent-encoded unreserved characters
    (RFC 3986: letters, digits, `-._~`) decoded and other escapes left as they are, a `%` that starts
    no escape kept unless what follows it decodes to two hex digits (then it is `%25`: `%%32%65` is
    `%252e`, never an encoded dot a second pass would resolve), backslashes made
    slashes, `.` and `..` segments resolved (RFC 3986 5.2.4, never above the root), runs of slashes
    merged; the query string is left as it is. `tests/e2e/test_envoy_configs.py` checks the two agree.

    Raises `RequestInvalid` where Envoy answers 400: an encoded slash or backslash (`%2F`, `%5C`, any
    case) or an encoded NUL (`%00`) in the path, or a fragment (`#`) anywhere.
    """
    if "#" in path:
        raise RequestInvalid(f"path {path[:200]!r} contains a fragment (#), which is not accepted")
    route, sep, query = path.partition("?")
    bad = _REJECTED_ESCAPE.search(route)
    if bad:
        raise RequestInvalid(
            f"path {route[:200]!r} contains {bad.group(0)!r} (an encoded slash, backslash or NUL), "
            "which is not accepted"
        )
    route = _unescape_unreserved(route).replace("\\", "/")
    if route.startswith("/"):
        route = _remove_dot_segments(route)
    return _SLASHES.sub("/", route) + sep + query


def route_of(path: str) -> str:
    """The normalised path of a `:path` without its query string (see `normalize_path`)."""
    return normalize_path(path).partition("?")[0]


def realtime_model(path: str) -> str | None:
    """The model a Realtime API connection names in its query (`/v1/realtime?model=<name>`, as the
    OpenAI clients' `realtime.connect` opens it), decoded; None on another path or when none is named.

    vLLM and SGLang read the model from the session's `session.update` event instead, which passes
    the picker by: a connection that names none in its query is routed as a request naming no model.
    The first non-empty `model` parameter counts."""
    route, _, query = normalize_path(path).partition("?")
    if route != REALTIME_PATH:
        return None
    for parameter in query.split("&"):
        name, _, value = parameter.partition("=")
        if unquote_plus(name) == "model" and value:
            return unquote_plus(value)
    return None


def is_routable(path: str) -> bool:
    """Whether `path`, normalised, is one of `ROUTABLE_PATHS`; raises `RequestInvalid` as
    `normalize_path` does."""
    return route_of(path) in ROUTABLE_PATHS


def _unescape_unreserved(route: str) -> str:
    """The escapes of unreserved characters decoded, others kept. A `%` that starts no escape stays,
    unless the decoding puts two hex digits after it: it would read as an escape, so it becomes `%25`
    (as Envoy's canonicalizer does: `%%32%65` is `%252e`, `%%41` is `%A`, `100%` stays)."""
    if "%" not in route:
        return route
    pieces: list[str] = []
    strays: list[int] = []  # where each stray `%` lands in the decoded text
    length = start = 0
    for match in _PERCENT.finditer(route):
        pieces.append(route[start : match.start()])
        length += match.start() - start
        code = match.group(1)
        if code is None:
            strays.append(length)
            piece = "%"
        else:
            char = chr(int(code, 16))
            piece = char if char in _UNRESERVED else match.group(0)
        pieces.append(piece)
        length += len(piece)
        start = match.end()
    pieces.append(route[start:])
    text = "".join(pieces)
    marked = [at for at in strays if _HEX_PAIR.fullmatch(text, at + 1, at + 3)]
    if not marked:
        return text
    out: list[str] = []
    start = 0
    for at in marked:
        out += (text[start:at], "%25")
        start = at + 1
    out.append(text[start:])
    return "".join(out)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 on an absolute path: `.` segments dropped, `..` removes the segment before it
    (never above the root); a path ending in `.` or `..` keeps its trailing slash."""
    output: list[str] = []
    segments = path[1:].split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == ".":
            if last:
                output.append("")
        elif segment == "..":
            if output:
                output.pop()
            if last:
                output.append("")
        else:
            output.append(segment)
    return "/" + "/".join(output)


def parse_openai_body(
    body: bytes, path: str, *, max_bytes: int, prefixes: BodyPrefixes | None = None
) -> ParsedRequest:
    """Parse and validate one OpenAI request body sent to `path` (decided normalised: `normalize_path`).

    Raises `BodyTooLarge` when `len(body) > max_bytes`, `RequestInvalid` for anything else unroutable.
    With `prefixes` (made with `body_prefixes()`), the JSON values a recent body shares with this one
    are taken from it: the result is the same, and must not be changed (they are that body's too).
    """
    size = len(body)
    if size > max_bytes:
        raise BodyTooLarge(size, max_bytes)
    route = route_of(path)
    if route not in ROUTABLE_PATHS:
        supported = ", ".join(sorted(ROUTABLE_PATHS))
        raise RequestInvalid(f"path {route[:200]!r} is not routable; supported paths: {supported}")
    return _request_of(_load_json(body, prefixes), route, size)


def parse_shared_body(
    body: bytes, path: str, *, max_bytes: int, prefixes: BodyPrefixes, max_unshared: int
) -> ParsedRequest | None:
    """`parse_openai_body` of a chat body when `prefixes` holds a recent body whose `messages` leave at
    most `max_unshared` bytes of this one to parse (raising what it raises); None, having parsed
    nothing, otherwise (another path, no such body, or anything the bounded walk does not take)."""
    if len(body) > max_bytes or route_of(path) != CHAT_PATH:
        return None
    loaded = prefixes.loads_shared(body, max_unshared)
    if loaded is None:
        return None
    value, escaped = loaded
    _refuse_lone_surrogates(value, escaped)
    return _request_of(value, CHAT_PATH, len(body), new_bytes=max_unshared)


def _request_of(obj: Any, route: str, size: int, *, new_bytes: int | None = None) -> ParsedRequest:
    if not isinstance(obj, dict):
        raise RequestInvalid(f"request body must be a JSON object, not {json_type(obj)}")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        _invalid("model", model, "a non-empty string")
    common: dict[str, Any] = {"model": model, "body_size": size, "new_bytes": new_bytes, **_parse_common(obj)}
    if route == CHAT_PATH:
        return ParsedRequest(kind="chat", **common, **_parse_chat(obj))
    if route == RESPONSES_PATH:
        return ParsedRequest(kind="chat", **{**common, "responses_api": True, **to_chat_fields(obj)})
    if route == MESSAGES_PATH:
        return ParsedRequest(kind="chat", **{**common, **anthropic.to_chat_fields(obj)})
    return ParsedRequest(kind="completion", **common, **_parse_completion(obj))


def body_prefixes(
    max_bytes: int = DEFAULT_BODY_PREFIX_BYTES, *, max_elements: int = MAX_ELEMENTS
) -> BodyPrefixes:
    """A store of recent bodies' values for `parse_openai_body`, parsing as it does."""
    return BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, max_bytes, max_elements=max_elements)


def _load_json(body: bytes, prefixes: BodyPrefixes | None = None) -> Any:
    if not body:
        raise RequestInvalid("request body is empty; send the request as a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestInvalid(f"request body is not valid UTF-8 (at byte {e.start})") from e
    try:
        if prefixes is not None and not text.startswith("\ufeff"):  # json.loads refuses a BOM itself
            value, escaped = prefixes.loads(text, body)
        else:
            value = json.loads(text, parse_constant=_reject_constant)
            escaped = _SURROGATE_ESCAPE.search(text) is not None
    except RecursionError as e:
        raise RequestInvalid("request body is nested too deeply") from e
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, integers over the int-digits limit
        raise RequestInvalid(f"request body is not valid JSON: {e}") from e
    _refuse_lone_surrogates(value, escaped)
    return value


def _refuse_lone_surrogates(value: Any, escaped: bool) -> None:
    """`escaped`: whether the text holds a surrogate escape at all (a value can only get one so)."""
    if escaped and _has_lone_surrogate(value):
        raise RequestInvalid("request body contains an unpaired UTF-16 surrogate escape")


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # what json.loads above decodes with


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


def _parse_common(obj: dict[str, Any]) -> dict[str, Any]:
    max_completion_tokens = _opt_int(obj, "max_completion_tokens", "max_completion_tokens", 0, None)
    max_tokens = _opt_int(obj, "max_tokens", "max_tokens", 0, None)
    nvext = _opt_object(obj, "nvext", "nvext") or {}
    session = _opt_object(nvext, "session_control", "nvext.session_control") or {}
    hints = _opt_object(nvext, "agent_hints", "nvext.agent_hints") or {}
    for key, check in _HINT_CHECKS.items():
        if hints.get(key) is not None:
            check(hints, key, f"nvext.agent_hints.{key}")
    cache_salt = _opt_str(obj, "cache_salt", "cache_salt")
    if cache_salt == "":
        raise RequestInvalid("cache_salt must be a non-empty string when given")
    lora_path = _opt_str(obj, "lora_path", "lora_path")  # SGLang's adapter field: a name, one per prompt
    add_special_tokens = obj.get("add_special_tokens")
    if add_special_tokens is not None and not isinstance(add_special_tokens, bool):
        _invalid("add_special_tokens", add_special_tokens, "a boolean")
    n = _opt_int(obj, "n", "n", 1, MAX_CHOICES)
    truncation_side = _opt_str(obj, "truncation_side", "truncation_side")
    if truncation_side not in (None, "left", "right"):
        raise RequestInvalid('truncation_side must be "left" or "right"')
    return {
        "add_special_tokens": add_special_tokens,
        "truncate_prompt_tokens": _opt_int(obj, "truncate_prompt_tokens", "truncate_prompt_tokens", -1, None),
        "truncation_side": truncation_side,
        "cache_salt": cache_salt,
        "lora_name": lora_path.strip() or None if lora_path is not None else None,
        "stream": _opt_bool(obj, "stream", "stream", False),
        # vLLM's precedence: max_completion_tokens wins over the deprecated max_tokens.
        "max_tokens": max_completion_tokens if max_completion_tokens is not None else max_tokens,
        "n": 1 if n is None else n,
        "session_id": _opt_str(session, "session_id", "nvext.session_control.session_id"),
        "session_action": _opt_str(session, "action", "nvext.session_control.action"),
        "agent_hints": MappingProxyType(hints),
        "nvext": MappingProxyType(nvext),
    }


def _parse_chat(obj: dict[str, Any]) -> dict[str, Any]:
    messages = obj.get("messages")
    if messages is None:
        raise RequestInvalid("chat requests need `messages`")
    if not isinstance(messages, list):
        _invalid("messages", messages, "a list of message objects")
    if not messages:
        raise RequestInvalid("messages must not be empty")
    for i, message in enumerate(messages):
        _check_message(message, f"messages[{i}]")
    tools = obj.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            _invalid("tools", tools, "a list of tool objects")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                _invalid(f"tools[{i}]", tool, "an object")
    documents = obj.get("documents")
    if documents is not None and not isinstance(documents, list):
        _invalid("documents", documents, "a list of document objects")
    add_generation_prompt = _opt_bool(obj, "add_generation_prompt", "add_generation_prompt", True)
    continue_final_message = _opt_bool(obj, "continue_final_message", "continue_final_message", False)
    if add_generation_prompt and continue_final_message:
        raise RequestInvalid("add_generation_prompt and continue_final_message cannot both be true")
    return {
        "messages": tuple(messages),
        "tools": tuple(tools) if tools is not None else None,
        "chat_template_kwargs": MappingProxyType(
            _opt_object(obj, "chat_template_kwargs", "chat_template_kwargs") or {}
        ),
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "reasoning_effort": _opt_str(obj, "reasoning_effort", "reasoning_effort"),
        "documents": tuple(documents) if documents is not None else None,
    }


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        _invalid(where, message, "a message object")
    if not isinstance(message.get("role"), str):
        _invalid(f"{where}.role", message.get("role"), "a string")
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            _check_part(part, f"{where}.content[{j}]")
    elif content is not None and not isinstance(content, str):
        _invalid(f"{where}.content", content, "a string, a list of content parts or null")
    _opt_str(message, "name", f"{where}.name")
    _opt_str(message, "tool_call_id", f"{where}.tool_call_id")
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return
    if not isinstance(tool_calls, list):
        _invalid(f"{where}.tool_calls", tool_calls, "a list of tool calls")
    for k, call in enumerate(tool_calls):
        if not isinstance(call, dict):
            _invalid(f"{where}.tool_calls[{k}]", call, "an object")
        function = call.get("function")
        if not isinstance(function, dict):
            _invalid(f"{where}.tool_calls[{k}].function", function, "an object")
        if not isinstance(function.get("name"), str):
            _invalid(f"{where}.tool_calls[{k}].function.name", function.get("name"), "a string")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str | dict):
            _invalid(f"{where}.tool_calls[{k}].function.arguments", arguments, "a string or an object")


def _check_part(part: Any, where: str) -> None:
    if isinstance(part, str):
        return
    if not isinstance(part, dict):
        _invalid(where, part, "a content part object or a string")
    part_type = part.get("type")
    if part_type is not None and not isinstance(part_type, str):
        _invalid(f"{where}.type", part_type, "a string")
    text_field = _TEXT_PART_FIELDS.get(part_type) if isinstance(part_type, str) else None
    if text_field is not None and not isinstance(part.get(text_field), str):
        _invalid(f"{where}.{text_field}", part.get(text_field), "a string")


def _parse_completion(obj: dict[str, Any]) -> dict[str, Any]:
    prompt = obj.get("prompt")
    if prompt is None:
        if obj.get("prompt_embeds") is not None:
            raise RequestInvalid("prompt_embeds requests cannot be routed on tokens; send `prompt`")
        raise RequestInvalid("completion requests need `prompt`")
    if isinstance(prompt, str):
        return {"prompt_text": prompt}
    expected = "a string, a list of token ids, or a list holding one string or one token-id list"
    if not isinstance(prompt, list):
        _invalid("prompt", prompt, expected)
    if not prompt:
        raise RequestInvalid("prompt must not be an empty list")
    if type(prompt[0]) is int:
        return {"prompt_token_ids": _token_ids(prompt, "prompt")}
    if len(prompt) > 1:
        if all(isinstance(p, str | list) for p in prompt):
            raise RequestInvalid(
                f"prompt is a batch of {len(prompt)} prompts, which cannot be routed as one request; "
                "send one prompt per request"
            )
        _invalid("prompt", prompt, expected)
    only = prompt[0]
    if isinstance(only, str):
        return {"prompt_text": only}
    if isinstance(only, list):
        return {"prompt_token_ids": _token_ids(only, "prompt[0]")}
    _invalid("prompt[0]", only, "a string or a list of token ids")


def _token_ids(values: list[Any], where: str) -> tuple[int, ...]:
    if not values:
        raise RequestInvalid(f"{where} must not be an empty token list")
    for i, token in enumerate(values):
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            _invalid(f"{where}[{i}]", token, f"a token id in [0, {MAX_TOKEN_ID}]")
    return tuple(values)


def _opt_bool(obj: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        _invalid(where, value, "a boolean")
    return value


def _opt_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        _invalid(where, value, "a string")
    return value


def _opt_int(obj: Mapping[str, Any], key: str, where: str, low: int, high: int | None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if type(value) is not int or value < low or (high is not None and value > high):
        bounds = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        _invalid(where, value, bounds)
    return value


def _opt_object(obj: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        _invalid(where, value, "an object")
    return value


def _check_number(obj: Mapping[str, Any], key: str, where: str, low: float | None = None) -> None:
    value = obj[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and _finite(value)
    if not ok or (low is not None and value < low):
        _invalid(where, value, "a finite number" if low is None else f"a finite number >= {low:g}")


def _finite(value: float) -> bool:
    """Whether `value` is finite as a float (an integer past the float range is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


_HINT_CHECKS: Final = {  # Dynamo's nvext.agent_hints types; unknown keys pass through unchecked
    "latency_sensitivity": lambda o, k, w: _check_number(o, k, w),
    "osl": lambda o, k, w: _opt_int(o, k, w, 0, MAX_TOKEN_ID),
    "priority": lambda o, k, w: _opt_int(o, k, w, -(2**31), 2**31 - 1),
    "speculative_prefill": lambda o, k, w: _opt_bool(o, k, w, False),
    "kv_overlap_score_weight": lambda o, k, w: _check_number(o, k, w, 0.0),
    "temperature": lambda o, k, w: _check_number(o, k, w, 0.0),
}


def _invalid(where: str, value: Any, expected: str) -> NoReturn:
    raise RequestInvalid(f"{where} must be {expected}, not {json_type(value)}")
