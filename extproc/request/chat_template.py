"""Chat templates: turn OpenAI messages into the prompt text a vLLM engine renders for them.

Mirrors two upstream steps as vLLM 0.33 runs them (with transformers 5.20), because the router's tokens must
equal the engine's; `tests/request/test_tokenizer_conformance.py` checks the result on real tokenizers:
- vLLM's message preparation (`vllm/renderers/chat_utils/chat_message.py`, `vllm/renderers/hf.py`): content
  parts become one "\\n"-joined string, or a list of `{"type": "text"|"image"|...}` items (keeping a part's
  undeclared keys) when the template loops over a message's content (the "openai" content format, detected
  from the template AST as vLLM does: through `{% set %}` and namespace aliases, macros handed the content);
  only role, content, name, tool_calls (arguments parsed to an object), tool_call_id and reasoning (or the
  older reasoning_content) are kept; a system text's leading Claude Code billing-header line is dropped;
  templates without a developer role get developer messages as system ones; tools are dumped as vLLM's
  pydantic models dump them (`vllm_tool`).
- transformers' `apply_chat_template` (`utils/chat_template_utils.py`): an ImmutableSandboxedEnvironment
  with trim_blocks, lstrip_blocks, loop controls and the `{% generation %}` tag; `raise_exception`,
  `strftime_now` and a `tojson` that does not HTML-escape; special tokens and `chat_template_kwargs` as
  template variables; `continue_final_message` cutting the prompt where its tag for the final text lands.

Known gap (use the engine's /tokenize backend when it matters): multimodal placeholders are model-specific
and dropped in the "string" format; in the "openai" one the template's marker (Gemma 3's `<start_of_image>`)
is rendered, but not the image tokens the engine's processor expands it to. transformers 5.21+ also drops
null-valued message keys and copies the reasoning to a `thinking` key; this follows 5.20, as vLLM 0.33 pins
`transformers<5.21` (on the goldens the two agree).
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
# The fields vLLM 0.33 takes an untyped part's type from, in its order (`parse_chat_message_content_mm_part`);
# it reads a part with a `uuid` this way too, whatever its type. `input_image` is not among them.
_UNTYPED_PART_FIELDS = (
    "image_url", "image_pil", "image_embeds", "audio_embeds", "audio_url", "input_audio", "video_url",
    "tool_reference",
)  # fmt: skip
# vLLM 0.33's `_KNOWN_CONTENT_PART_FIELDS` (`renderers/chat_utils/chat_message.py`): the keys of its
# content-part types. In the "openai" format a text or media item keeps a part's other keys (`cache_control`,
# `signature`, ...), which a template that dumps its items shows.
_KNOWN_PART_FIELDS = frozenset(
    {
        "audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url",
        "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid",
        "video_embeds", "video_url",
    }
)  # fmt: skip
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
    if part_type is None or part.get("uuid") is not None:  # vLLM reads these parts by their fields
        part_type = next((key for key in _UNTYPED_PART_FIELDS if key in part), None)
    if part_type in _TEXT_KEYS:
        text = part.get(_TEXT_KEYS[part_type])
        if text is None:
            return None
        if not isinstance(text, str):
            raise TokenizerUnavailable(
                f"content part {part_type!r} needs a string, not {type(text).__name__}"
            )
        return {"type": "text", "text": text, **_extra_fields(part)} if wrap else text
    if part_type in _MEDIA_TYPES:
        return {"type": _MEDIA_TYPES[part_type], **_extra_fields(part)} if wrap else None
    if part_type == "tool_reference":
        return {"type": "tool_reference", "name": part.get("name")} if wrap else part.get("name")
    raise TokenizerUnavailable(f"unsupported chat content part type {part_type!r}")


def _extra_fields(part: Mapping[str, Any]) -> dict[str, Any]:
    """A part's keys that are no field of vLLM's content-part types (its `_collect_extra_fields`)."""
    return {key: value for key, value in part.items() if key not in _KNOWN_PART_FIELDS}


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


# Content-format detection, after vLLM 0.33's `_detect_content_format` (`vllm/renderers/hf.py`): the template
# gets the "openai" format when it loops over the content of a message (a loop variable drawn from `messages`
# or an alias of it), over a macro parameter that some call passes such a content, or over a variable named
# `content` outside any macro. Aliases are `{% set %}` variables and namespace attributes
# (`namespace(rest=messages)`, `{% set ns.rest = messages %}`), which vLLM names "ns.rest".
class _Undetectable(Exception):
    """A construct vLLM's detector gives up on (an assertion fails there); it then falls back to "string"."""


def _detect_content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    try:
        next(_content_loops(ast))
    except (StopIteration, _Undetectable):
        return "string"
    return "openai"


def _is_var(node: jinja2.nodes.Node, name: str) -> bool:
    """vLLM's `_is_var_access`: a load of `name`, or of the dotted namespace attribute it names."""
    if isinstance(node, jinja2.nodes.Name):
        return node.ctx == "load" and node.name == name
    if isinstance(node, jinja2.nodes.Getattr) and "." in name:
        base, _, attr = name.rpartition(".")
        return node.attr == attr and _is_var(node.node, base)
    return False


def _is_key_of(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    """vLLM's `_is_attr_access`: `name[key]` with a constant key, or `name.key`."""
    if isinstance(node, jinja2.nodes.Getitem):
        is_key = isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        return is_key and _is_var(node.node, name)
    return isinstance(node, jinja2.nodes.Getattr) and node.attr == key and _is_var(node.node, name)


def _accesses(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    """vLLM's `_is_var_or_elems_access`: `name` (or its `key`), through filters, tests and slices."""
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _accesses(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _accesses(node.node, name, key)
    return _is_key_of(node, name, key) if key else _is_var(node, name)


def _dotted_name(node: jinja2.nodes.Node) -> str | None:
    """vLLM's `_attr_dotted_name`: an attribute assignment target (`ns.rest`) as "ns.rest"."""
    if isinstance(node, jinja2.nodes.NSRef):
        return f"{node.name}.{node.attr}"
    attrs = []
    while isinstance(node, jinja2.nodes.Getattr):
        attrs.append(node.attr)
        node = node.node
    if isinstance(node, jinja2.nodes.Name):
        return ".".join([node.name, *reversed(attrs)])
    return None


def _assigned_aliases(assign: jinja2.nodes.Assign, name: str) -> list[str]:
    """The names one `{% set %}` makes aliases of `name`: its plain target, or namespace attributes."""
    target, value = assign.target, assign.node
    aliases = []
    if isinstance(target, jinja2.nodes.Name) and _accesses(value, name):
        aliases.append(target.name)
    if (
        isinstance(target, jinja2.nodes.Name)
        and isinstance(value, jinja2.nodes.Call)
        and isinstance(value.node, jinja2.nodes.Name)
        and value.node.name == "namespace"
    ):
        aliases += [f"{target.name}.{kwarg.key}" for kwarg in value.kwargs if _accesses(kwarg.value, name)]
    elif isinstance(target, jinja2.nodes.Getattr | jinja2.nodes.NSRef) and _accesses(value, name):
        dotted = _dotted_name(target)
        aliases += [dotted] if dotted is not None else []
    return aliases  # other targets (tuples) are no aliases


def _aliases(ast: jinja2.nodes.Template, name: str) -> list[str]:
    """`name` and every alias of it, transitively (vLLM's `_iter_nodes_assign_var_or_elems`)."""
    found, pending, seen = [name], [name], {name}
    while pending:
        current = pending.pop(0)
        for assign in ast.find_all(jinja2.nodes.Assign):
            for alias in _assigned_aliases(assign, current):
                if alias not in seen:
                    seen.add(alias)
                    found.append(alias)
                    pending.append(alias)
    return found


def _loop_target(loop: jinja2.nodes.For) -> str:
    if not isinstance(loop.target, jinja2.nodes.Name):  # `for a, b in ...`: vLLM's assertion fails
        raise _Undetectable
    return loop.target.name


def _message_names(ast: jinja2.nodes.Template) -> list[str]:
    """Loop variables drawn from `messages` or an alias of it (vLLM's `_iter_nodes_assign_messages_item`)."""
    names = _aliases(ast, "messages")
    return [
        _loop_target(loop)
        for loop in ast.find_all(jinja2.nodes.For)
        if any(_accesses(loop.iter, name) for name in names)
    ]


def _content_loops(ast: jinja2.nodes.Template) -> Iterator[str]:
    """The loop variables of loops over message content, in template order
    (vLLM's `_iter_nodes_assign_content_item`)."""
    message_names = _message_names(ast)
    params_by_loop, loops_in_macros = _macro_content_params(ast, message_names)
    for loop in ast.find_all(jinja2.nodes.For):
        if _over_content(loop, message_names, params_by_loop.get(id(loop)), id(loop) in loops_in_macros):
            yield _loop_target(loop)


def _over_content(
    loop: jinja2.nodes.For, message_names: list[str], macro_params: set[str] | None, in_macro: bool
) -> bool:
    """Whether `loop` iterates over a message's content, a macro parameter given one, or a bare `content`
    outside macros."""
    iterable = loop.iter
    if any(_accesses(iterable, name, "content") for name in message_names):
        return True
    if not isinstance(iterable, jinja2.nodes.Name):
        return False
    if macro_params is not None and iterable.name in macro_params:
        return True
    return not in_macro and iterable.name == "content"


def _macro_content_params(
    ast: jinja2.nodes.Template, message_names: list[str]
) -> tuple[dict[int, set[str]], set[int]]:
    """Per loop inside a macro (by node id), the macro's parameters that some call passes a message's
    content; and the ids of every loop inside a macro. A loop in nested macros takes the innermost macro's
    parameters when it has any, as vLLM's walk does."""
    params_by_loop: dict[int, set[str]] = {}
    loops_in_macros: set[int] = set()
    for macro in ast.find_all(jinja2.nodes.Macro):
        params = _content_params(ast, macro, message_names)
        for loop in macro.find_all(jinja2.nodes.For):
            loops_in_macros.add(id(loop))
            if params:
                params_by_loop[id(loop)] = params
    return params_by_loop, loops_in_macros


def _content_params(
    ast: jinja2.nodes.Template, macro: jinja2.nodes.Macro, message_names: list[str]
) -> set[str]:
    """The parameters of `macro` that a call passes `message.content` (positionally or by keyword)."""
    names = [arg.name for arg in macro.args]
    params = set()
    for call in ast.find_all(jinja2.nodes.Call):
        if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
            continue
        passed = [(names[i], arg) for i, arg in enumerate(call.args[: len(names)])]
        passed += [(kwarg.key, kwarg.value) for kwarg in call.kwargs if kwarg.key in names]
        params |= {
            param
            for param, value in passed
            if any(_accesses(value, name, "content") for name in message_names)
        }
    return params
