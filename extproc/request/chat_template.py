"""Chat templates: turn OpenAI messages into the prompt text a vLLM engine renders for them.

Mirrors two upstream steps as vLLM 0.33 runs them (with transformers 5.20), because the router's tokens must
equal the engine's; `tests/request/test_tokenizer_conformance.py` checks the result on real tokenizers:
- vLLM's message preparation (`vllm/renderers/chat_utils/chat_message.py`, `vllm/renderers/hf.py`): content
  parts become one "\\n"-joined string, or a list of `{"type": "text"|"image"|...}` items when the template
  loops over `message['content']` (the "openai" content format, detected from the template AST as vLLM does);
  only role, content, name, tool_calls (arguments parsed to an object), tool_call_id and reasoning (or the
  older reasoning_content) are kept; a system text's leading Claude Code billing-header line is dropped;
  templates without a developer role get developer messages as system ones; tools are dumped as vLLM's
  pydantic models dump them (`vllm_tool`).
- transformers' `apply_chat_template` (`utils/chat_template_utils.py`): an ImmutableSandboxedEnvironment
  with trim_blocks, lstrip_blocks, loop controls and the `{% generation %}` tag; `raise_exception`,
  `strftime_now` and a `tojson` that does not HTML-escape; special tokens and `chat_template_kwargs` as
  template variables; `continue_final_message` cutting the prompt where its tag for the final text lands.

Known gap (use the engine's /tokenize backend when it matters): multimodal placeholders are model-specific
and dropped in the "string" format. transformers 5.21+ also drops null-valued message keys and copies the
reasoning to a `thinking` key; this follows 5.20, as vLLM 0.33 pins `transformers<5.21` (on the goldens the
two agree).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from extproc.errors import TokenizerUnavailable

ContentFormat = Literal["string", "openai"]

_TEXT_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_MEDIA_TYPES = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
}
_BILLING_HEADER = "x-anthropic-billing-header"
# roles whose {"role", "content": str} message the conversation keeps as it is (a system message's text
# may lose a billing header; a developer message gains `tools`)
_PLAIN_ROLES = ("user", "assistant", "tool")  # a tuple: `in` hashes nothing (a role may be any JSON)
# Never taken from chat_template_kwargs: messages come from the request; vLLM rejects the others.
_RESERVED_KWARGS = frozenset({"messages", "chat_template", "tokenize"})


class ChatTemplate:
    """One compiled chat template and its detected content format. Compile once, render per request."""

    def __init__(self, source: str) -> None:
        """Compile `source`; raises `TokenizerUnavailable` on a syntax error."""
        self.source = source
        # vLLM's test for templates that render a developer role themselves
        self._knows_developer = '"developer"' in source or "'developer'" in source
        env = _environment()
        try:
            self._template = env.from_string(source)
            self.content_format = _detect_content_format(env.parse(source))
        except jinja2.TemplateError as e:
            raise TokenizerUnavailable(f"chat template does not compile: {e}") from e

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        special_tokens: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages`. Raises `TokenizerUnavailable` when the template fails.

        `chat_template_kwargs` (merged with the request's fields: `tokenizer.template_kwargs`) override
        special tokens. `add_generation_prompt` is the request field, which wins over the kwargs in vLLM. The
        kwargs' `continue_final_message` asks for the prefill cut; their `tools`, when set, replace `tools` as
        they are (vLLM's default for that kwarg is the dumped request tools).
        """
        context: dict[str, Any] = dict(special_tokens or {})
        context.update({k: v for k, v in (chat_template_kwargs or {}).items() if k not in _RESERVED_KWARGS})
        context.pop("add_generation_prompt", None)
        continue_final_message = context.pop("continue_final_message", False)
        kwargs_tools = context.pop("tools", None)
        if add_generation_prompt and continue_final_message:
            raise TokenizerUnavailable("add_generation_prompt and continue_final_message cannot both be set")
        conversation = build_conversation(messages, self.content_format)
        if not self._knows_developer:
            conversation = _developer_as_system(conversation)
        final_text = _tag_final_message(conversation, self.source) if continue_final_message else None
        context.setdefault("documents", None)
        context.update(
            messages=conversation,
            tools=kwargs_tools if kwargs_tools is not None else _vllm_tools(tools),
            add_generation_prompt=add_generation_prompt,
        )
        try:
            rendered = self._template.render(context)
        # The template is third-party code that can raise anything (TemplateError from raise_exception,
        # TypeError from `'a' + none`, ...); every failure means "cannot reproduce the engine's prompt".
        except Exception as e:
            raise TokenizerUnavailable(f"chat template failed: {type(e).__name__}: {e}") from e
        return rendered if final_text is None else _cut_at_tag(rendered, final_text)


def _vllm_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    return [vllm_tool(t) for t in tools] if tools is not None else None


def vllm_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool as vLLM hands it to the template: `ChatCompletionToolsParam(**tool).model_dump()`.

    Only the declared keys, in declaration order: `{"type", "function": {"name", "description", "parameters",
    "strict"?, "defer_loading"?}, "defer_loading"?}`. A missing description or parameters is null; `strict`
    and `defer_loading` appear when set, and a tool-level `defer_loading` is copied into a function without.
    """
    function = tool.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise TokenizerUnavailable("each tool needs a `function` object with a string `name`")
    out_function: dict[str, Any] = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    if function.get("strict") is not None:
        out_function["strict"] = function["strict"]
    defer_loading = function.get("defer_loading")
    if defer_loading is None:
        defer_loading = tool.get("defer_loading")
    if defer_loading is not None:
        out_function["defer_loading"] = defer_loading
    out: dict[str, Any] = {"type": tool.get("type", "function"), "function": out_function}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


def build_conversation(
    messages: Sequence[Mapping[str, Any]], content_format: ContentFormat
) -> list[dict[str, Any]]:
    """vLLM's conversation for the template: normalised content, kept keys, tool-call arguments as objects.

    Raises `TokenizerUnavailable` for content vLLM would reject (unknown part types, malformed tool calls).
    """
    conversation = []
    plain = content_format == "string"
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if plain and type(content) is str and len(message) == 2 and role in _PLAIN_ROLES:
            conversation.append({"role": role, "content": content})  # what the steps below give it
            continue
        parts = _parts(content)
        if role == "system":
            parts = _without_billing_header(parts)
        items = [item for part in parts if (item := _part(part, content_format))]
        content = items if content_format == "openai" else "\n".join(items)
        out: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            if message.get("tool_calls") is not None:
                out["tool_calls"] = _tool_calls(message["tool_calls"])
            # vLLM's request model renames the older `reasoning_content` to `reasoning` when that is unset
            reasoning = message.get("reasoning")
            if reasoning is None:
                reasoning = message.get("reasoning_content")
            if reasoning is not None:
                out["reasoning"] = out["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in message:
                out["tool_call_id"] = message["tool_call_id"]
            content = out["content"]
            if isinstance(content, list) and all(item.get("type") == "text" for item in content):
                out["content"] = "\n".join(item["text"] for item in content)
        for key in ("name", "task"):
            if isinstance(message.get(key), str):
                out[key] = message[key]
        if role == "developer":
            out["tools"] = message.get("tools")
        if out.get("tool_calls") == []:
            del out["tool_calls"]  # vLLM drops empty tool_calls to keep templates on the plain path
        conversation.append(out)
    return conversation


def _developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's `safe_apply_chat_template` for templates that never name "developer": such messages become
    system ones (without their tools), and once a system message is not first, all merge into the first.
    """
    if not any(m["role"] == "developer" for m in conversation):
        return conversation
    converted = [
        {**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m["role"] == "developer" else m
        for m in conversation
    ]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if systems == [0]:
        return converted
    texts = [_plain_text(m["content"]) for m in converted if m["role"] == "system"]
    merged = {"role": "system", "content": "\n\n".join(t for t in texts if t)}
    return [merged, *(m for m in converted if m["role"] != "system")]


def _plain_text(content: Any) -> str:
    if isinstance(content, list):  # the "openai" content format
        texts = [p if isinstance(p, str) else p["text"] for p in content if isinstance(p, str) or "text" in p]
        return "\n".join(texts)
    return content or ""


def _parts(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    raise TokenizerUnavailable(f"message content of type {type(content).__name__} cannot be rendered")


def _without_billing_header(parts: list[Any]) -> list[Any]:
    """vLLM drops the first line of a system text that starts with Claude Code's billing header.

    Its `cch` value changes with every request, so keeping it would end every prefix match right there.
    """
    out = []
    for part in parts:
        if isinstance(part, str):
            text: Any = part
        elif isinstance(part, Mapping) and part.get("type") == "text":
            text = part.get("text")
        else:
            text = None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
        elif rest := text.partition("\n")[2]:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _part(part: Any, content_format: ContentFormat) -> Any:
    wrap = content_format == "openai"
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    if not isinstance(part, Mapping):
        raise TokenizerUnavailable(f"content part of type {type(part).__name__} cannot be rendered")
    part_type = part.get("type")
    if part_type is not None and not isinstance(part_type, str):
        raise TokenizerUnavailable(f"content part type must be a string, not {type(part_type).__name__}")
    if part_type is None:  # vLLM accepts untyped parts that carry a media field
        part_type = next((key for key in _MEDIA_TYPES if key in part), None)
    if part_type in _TEXT_KEYS:
        text = part.get(_TEXT_KEYS[part_type])
        if text is None:
            return None
        if not isinstance(text, str):
            raise TokenizerUnavailable(
                f"content part {part_type!r} needs a string, not {type(text).__name__}"
            )
        return {"type": "text", "text": text} if wrap else text
    if part_type in _MEDIA_TYPES:
        return {"type": _MEDIA_TYPES[part_type]} if wrap else None
    if part_type == "tool_reference":
        return {"type": "tool_reference", "name": part.get("name")} if wrap else part.get("name")
    raise TokenizerUnavailable(f"unsupported chat content part type {part_type!r}")


def _tool_calls(tool_calls: Any) -> list[dict[str, Any]]:
    if not isinstance(tool_calls, list):
        raise TokenizerUnavailable("tool_calls must be a list")
    out = []
    for call in tool_calls:
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            raise TokenizerUnavailable("each tool call needs a `function` object")
        function = dict(call["function"])
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                arguments = None
        # vLLM's `_postprocess_messages`: templates get an object; JSON that is not one, or none, becomes {}
        function["arguments"] = arguments if isinstance(arguments, dict) else {}
        out.append({**call, "function": function})
    return out


# transformers' `continue_final_message` (`render_jinja_template`): the final message's text gets this tag,
# and the prompt ends where the rendered tag starts.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tag_final_message(conversation: list[dict[str, Any]], source: str) -> str:
    """Tag the final message's text (its last text part in the "openai" format); return the untagged text."""
    final = conversation[-1] if conversation else {}
    content = final.get("content")
    if content is None or "content" not in source:
        raise TokenizerUnavailable("continue_final_message is set but there is no final message content")
    if isinstance(content, str):
        final["content"] = content + _CONTINUE_TAG
        return content
    for block in reversed(content):
        if "text" in block:
            text = block["text"]
            block["text"] = text + _CONTINUE_TAG
            return text
    raise TokenizerUnavailable("continue_final_message is set but the final message has no text")


def _cut_at_tag(rendered: str, final_text: str) -> str:
    if final_text.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise TokenizerUnavailable("continue_final_message is set but the template dropped the final message")
    at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the text's end, tag included


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers tracks assistant spans; output is the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# Content-format detection, after vLLM's `_detect_content_format`: the template uses the "openai" format
# when it loops over `message['content']` (or `.content`) of a loop variable drawn from `messages`.
class _Undetectable(Exception):
    """A construct vLLM's detector gives up on; it then falls back to "string"."""


def _detect_content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    try:
        message_names = [name for _, name in _loops_over(ast, list(_aliases(ast, "messages")), None)]
        next(_loops_over(ast, message_names, "content"))
    except (StopIteration, _Undetectable):
        return "string"
    return "openai"


def _accesses(node: jinja2.nodes.Node, name: str, key: str | None) -> bool:
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _accesses(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _accesses(node.node, name, key)
    if key is None:
        return _is_name(node, name)
    if isinstance(node, jinja2.nodes.Getitem):
        is_key = isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        return is_key and _is_name(node.node, name)
    return isinstance(node, jinja2.nodes.Getattr) and _is_name(node.node, name) and node.attr == key


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _aliases(ast: jinja2.nodes.Template, name: str) -> Iterator[str]:
    """`name` and every variable `{% set %}` from it (transitively, through filters and slices)."""
    yield name
    pending, seen = [name], {name}
    while pending:
        current = pending.pop(0)
        for assign in ast.find_all(jinja2.nodes.Assign):
            if _accesses(assign.node, current, None):
                if not isinstance(assign.target, jinja2.nodes.Name):
                    raise _Undetectable
                yield assign.target.name
                if assign.target.name not in seen:
                    seen.add(assign.target.name)
                    pending.append(assign.target.name)


def _loops_over(ast: jinja2.nodes.Template, names: list[str], key: str | None) -> Iterator[tuple[Any, str]]:
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_accesses(loop.iter, name, key) for name in names):
            if not isinstance(loop.target, jinja2.nodes.Name):
                raise _Undetectable
            yield loop, loop.target.name
