"""Tokenizer backends: turn an OpenAI request into the token ids the engine will see.

The router re-hashes token ids itself, so these must equal the engine's exactly (REFERENCE.md §4):
- `HfTokenizer`: a local Hugging Face directory, rendered as transformers + vLLM do (`chat_template.py`);
- `RemoteTokenizer` (`extproc/remote_tokenizer.py`): the engine's own `POST /tokenize`, exact by construction;
- `ByteTokenizer`: the zero-configuration default, shared with the simulated engine.
`RequestTokenizer` is the picker's async facade over them: it never blocks the event loop on a big prompt,
bounds the time spent, and reports every failure as `TokenizerUnavailable` (the picker then routes on
load alone).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import tokenizers

from extproc.errors import TokenizerUnavailable
from extproc.request.anthropic import needs_system_first
from extproc.request.chat_template import ChatTemplate
from extproc.request.parse import ParsedRequest
from extproc.request.piecewise import PiecewiseEncoder, batch_encoder, probe_mismatch
from extproc.request.prefix_cache import PromptPrefixes, PromptPrefixStats
from extproc.request.remote_tokenizer import RemoteTokenizer
from extproc.request.token_cache import DEFAULT_PIECE_CACHE_BYTES, TokenCache, TokenCacheStats

log = logging.getLogger(__name__)

_SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class Tokenizer(Protocol):
    """What the picker and the mock worker need from a tokenizer."""

    name: str

    def encode_text(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of a raw completion prompt; special tokens as the engine adds them by default (None)."""
        ...

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool | None = None,
    ) -> list[int]:
        """Token ids of a conversation rendered with the chat template (None: no special tokens added)."""
        ...


def message_text(content: Any) -> str:
    """The text of an OpenAI message `content`: a string, or the text parts of a part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    raise ValueError("message content must be a string or a list of parts")


class ByteTokenizer:
    """Zero-configuration default: UTF-8 bytes are token ids, with a fixed plain chat layout.

    Deterministic and dependency-free, so the picker and the mock worker agree without files.
    """

    name = "bytes"

    def encode_text(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        return list(text.encode("utf-8"))  # bytes have no special tokens to add

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool | None = None,
    ) -> list[int]:
        parts = [f"<|{m.get('role', 'user')}|>\n{message_text(m.get('content'))}\n" for m in messages]
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        return self.encode_text("".join(parts))


class HfTokenizer:
    """A local Hugging Face tokenizer directory, read as transformers' fast tokenizer reads it.

    `tokenizer.json` is used as saved: its post-processor adds the special tokens of `encode_text`, as vLLM's
    completions do unless a request says `add_special_tokens: false`; chat prompts are rendered, then encoded
    without them unless a request says `add_special_tokens: true`. Templates: `chat_template.jinja` and
    `additional_chat_templates/*.jinja` replace `tokenizer_config.json`'s `chat_template` (a string, or a list
    of {name, template}), which wins over `chat_template.json`; "tool_use" is chosen when the request has
    tools, else "default". Not reproduced: transformers 5's model-specific classes (`tokenizer_class`) that
    rebuild the normalizer and pre-tokenizer from the vocabulary instead of reading them from tokenizer.json.
    Those of Qwen2.5 and Qwen3 (Qwen2Tokenizer) and Gemma 3 (GemmaTokenizer) encode as tokenizer.json does,
    and Llama 3.x, Mistral Nemo and DeepSeek-V3 load as saved (tests/request/test_tokenizer_conformance.py);
    DeepSeek-V3 only because its config.json's model_type is one transformers exempts: a `LlamaTokenizerFast`
    whose directory's config.json names another model_type (a DeepSeek-R1-Distill-Llama, "llama") gets a
    Metaspace pre-tokenizer in place of its ByteLevel one, in vLLM too, and this does not follow it. Models
    vLLM serves through mistral_common (a Mistral directory with consolidated weights and tekken.json, or
    `--tokenizer-mode mistral`) are not rendered by a Jinja template at all. For both, use the engine's
    `/tokenize` (`tokenize-url`). Beside a tokenizer.json, transformers 5 ignores the config's
    `add_bos_token` and `add_eos_token`, as this does.

    Chat prompts are encoded piecewise (`piecewise.py`): the text between added tokens is encoded once and
    its ids kept in a cache of `piece_cache_bytes` (0: none), so a conversation's earlier turns cost a
    lookup. The ids are those of encoding the whole prompt; where the tokenizer's configuration or a chat
    template would make them differ, or pieces useless, whole prompts are encoded as before and the load
    logs why (`piecewise_off_reason`). Completion prompts and truncated prompts are always encoded whole.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, piece_cache_bytes: int = DEFAULT_PIECE_CACHE_BYTES
    ) -> None:
        """Load the directory at `path`; raises `TokenizerUnavailable` naming the file at fault, `ValueError`
        for a negative `piece_cache_bytes`."""
        if piece_cache_bytes < 0:
            raise ValueError(f"piece_cache_bytes must be >= 0, got {piece_cache_bytes!r}")
        root = Path(path)
        self.name = f"hf:{root}"
        try:
            self._backend = tokenizers.Tokenizer.from_file(str(root / "tokenizer.json"))
            self._encode_batch = batch_encoder(self._backend)
        except Exception as e:  # the Rust side raises a bare Exception for I/O and format errors
            raise TokenizerUnavailable(f"cannot load {root / 'tokenizer.json'}: {e}") from e
        config = _read_json_object(root / "tokenizer_config.json")
        legacy_map = root / "special_tokens_map.json"
        legacy = {} if "added_tokens_decoder" in config else _read_json_object(legacy_map)
        self.special_tokens: dict[str, str] = _special_tokens({**config, **legacy})
        self.chat_templates: dict[str, ChatTemplate] = {
            name: ChatTemplate(source) for name, source in _template_sources(root, config).items()
        }
        self.pieces: PiecewiseEncoder | None = None
        self._piecewise_templates: frozenset[str] = frozenset()
        self.piecewise_off_reason = self._set_up_pieces(piece_cache_bytes)
        if self.piecewise_off_reason is None:
            log.info(
                "tokenizer %s: chat prompts encoded piecewise, piece cache %d bytes",
                self.name,
                piece_cache_bytes,
            )
        else:
            log.warning("tokenizer %s: chat prompts encoded whole: %s", self.name, self.piecewise_off_reason)

    def piece_cache_stats(self) -> TokenCacheStats | None:
        """The piece cache's counters, or None without one."""
        return self.pieces.cache.stats() if self.pieces is not None else None

    def prefix_cache_stats(self) -> PromptPrefixStats | None:
        """The prompt prefix cache's counters, or None without one."""
        prefixes = self.pieces.prefixes if self.pieces is not None else None
        return prefixes.stats() if prefixes is not None else None

    def _set_up_pieces(self, cache_bytes: int) -> str | None:
        """Build `self.pieces` when piecewise encoding is exact and useful; else the reason it is off."""
        if cache_bytes == 0:
            return "the piece cache is off (0 bytes)"
        try:
            pieces = PiecewiseEncoder(
                self._backend, TokenCache(cache_bytes), PromptPrefixes(), encode_batch=self._encode_batch
            )
        except ValueError as e:
            return f"piecewise encoding would not be exact: {e}"
        probes = []
        usable = set()
        for name, template in self.chat_templates.items():
            rendered = [text for messages in _PROBE_CHATS if (text := self._probe_render(template, messages))]
            probes += rendered
            if rendered and _separates_messages(pieces, rendered[0]):
                usable.add(name)
            else:
                log.info(
                    "tokenizer %s: chat template %r encoded whole: no added token between messages",
                    self.name,
                    name,
                )
        if (mismatch := probe_mismatch(pieces, self._backend, probes)) is not None:
            return mismatch
        if not usable:
            return "no chat template puts an added token between messages"
        self.pieces, self._piecewise_templates = pieces, frozenset(usable)
        return None

    def _probe_render(self, template: ChatTemplate, messages: list[dict[str, str]]) -> str | None:
        try:
            return template.render(messages, special_tokens=self.special_tokens)
        except TokenizerUnavailable:
            return None  # a template may refuse a shape (roles out of order, ...): try the next

    def encode_text(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        return self._encode(text, add_special_tokens=add_special_tokens is not False)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text the engine builds for this conversation. Raises `TokenizerUnavailable`."""
        template = self.chat_templates[self._template_name(tools, chat_template_kwargs)]
        return template.render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
            special_tokens=self.special_tokens,
        )

    def _template_name(
        self, tools: Sequence[Mapping[str, Any]] | None, chat_template_kwargs: Mapping[str, Any] | None
    ) -> str:
        if chat_template_kwargs and chat_template_kwargs.get("tools") is not None:
            tools = chat_template_kwargs["tools"]  # vLLM picks the template by these
        if tools is not None and "tool_use" in self.chat_templates:
            return "tool_use"
        if "default" in self.chat_templates:
            return "default"
        raise TokenizerUnavailable(f"tokenizer {self.name} has no default chat template")

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool | None = None,
    ) -> list[int]:
        ids = self.encode_chat_ids(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
            add_special_tokens=add_special_tokens,
        )
        return ids if isinstance(ids, list) else ids.tolist()

    def encode_chat_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool | None = None,
    ) -> list[int] | array[int]:
        """As `encode_chat`; a prompt encoded piecewise comes as a uint32 array, copied from the piece
        cache in C (the router hashes it as it is: no list of 100k ints to build). Raises
        `TokenizerUnavailable`."""
        text = self.render_chat(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
        )
        add = add_special_tokens is True
        pieces = self.pieces
        if pieces is not None and self.encodes_piecewise(tools, chat_template_kwargs, add):
            try:
                return pieces.encode_array(text, add_special_tokens=add)
            except Exception as e:  # as `_encode`: the Rust side raises bare exceptions
                raise TokenizerUnavailable(f"tokenizer {self.name} failed: {e}") from e
        return self._encode(text, add_special_tokens=add)

    def encodes_piecewise(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        add_special_tokens: bool,
    ) -> bool:
        """Whether `encode_chat_ids` encodes such a chat piece by piece from the piece cache (what a
        conversation's earlier turns left there is not encoded again)."""
        pieces = self.pieces
        return (
            pieces is not None
            and self._template_name(tools, chat_template_kwargs) in self._piecewise_templates
            and (pieces.can_add_special_tokens or not add_special_tokens)
        )

    def truncated(self, text: str, *, add_special_tokens: bool, max_tokens: int) -> list[int]:
        """vLLM's `truncate_prompt_tokens` without a `truncation_side`: the tokenizer itself truncates, from
        the left (vLLM loads generation tokenizers so), keeping room for the special tokens it then adds."""
        try:
            encoding = self._backend.encode_batch([text], add_special_tokens=False)[0]
            added = self._backend.num_special_tokens_to_add(False) if add_special_tokens else 0
            encoding.truncate(max(max_tokens - added, 0), direction="left")
            return self._backend.post_process(encoding, add_special_tokens=add_special_tokens).ids
        except Exception as e:
            raise TokenizerUnavailable(f"tokenizer {self.name} failed: {e}") from e

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # encode_batch(_fast) releases the GIL while Rust works (encode does not), so a worker thread
        # running a big prompt leaves the event loop free.
        try:
            return self._encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except Exception as e:
            raise TokenizerUnavailable(f"tokenizer {self.name} failed: {e}") from e


# Rendered by each chat template at load: piecewise encoding pays only when messages land in distinct pieces.
_PROBE_CHATS: tuple[list[dict[str, str]], ...] = (
    [
        {"role": "system", "content": "probe-system"},
        {"role": "user", "content": "probe-user"},
        {"role": "assistant", "content": "probe-assistant"},
        {"role": "user", "content": "probe-again"},
    ],
    [{"role": "user", "content": "probe-user"}, {"role": "assistant", "content": "probe-assistant"}],
)


def _separates_messages(pieces: PiecewiseEncoder, rendered: str) -> bool:
    """Whether each probe message's text lies in a piece of its own in `rendered`."""
    found = [part for part in pieces.splitter.split(rendered) if isinstance(part, str) and "probe-" in part]
    return all(part.count("probe-") == 1 for part in found) and len(found) >= 2


def _read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(_read_text(path))
    except ValueError as e:
        raise TokenizerUnavailable(f"cannot read {path}: {e}") from e
    if not isinstance(value, dict):
        raise TokenizerUnavailable(f"{path} must hold a JSON object")
    return value


def _token_content(value: Any) -> str | None:
    """A special token as a string; tokenizer_config.json stores a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """transformers 5's `special_tokens_map`, the special tokens a chat template sees: the named ones that are
    set, every other `*_token` entry holding a token, and the `extra_special_tokens` (or
    `model_specific_special_tokens`) dict; no `additional_special_tokens` any more. `special_tokens_map.json`
    only counts in directories whose config has no `added_tokens_decoder`, and then wins over the config.
    """
    tokens = {k: t for k in _SPECIAL_TOKEN_KEYS if (t := _token_content(config.get(k)))}
    tokens.update((k, t) for k, v in config.items() if k.endswith("_token") and (t := _token_content(v)))
    for key in ("extra_special_tokens", "model_specific_special_tokens"):
        if isinstance(named := config.get(key), dict):
            tokens.update((k, t) for k, v in named.items() if isinstance(k, str) and (t := _token_content(v)))
    return tokens


def _template_sources(root: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The named chat templates as transformers 5 loads them: template files, when there are any, replace
    the config's `chat_template` whole (`chat_template.jinja` is "default", and each
    `additional_chat_templates/<name>.jinja` adds or overrides a name); otherwise the config's string or
    list, else a processor's `chat_template.json`."""
    files: dict[str, str] = {}
    if (jinja_file := root / "chat_template.jinja").is_file():
        files["default"] = _read_text(jinja_file)
    if (extra := root / "additional_chat_templates").is_dir():
        files.update((file.stem, _read_text(file)) for file in sorted(extra.glob("*.jinja")))
    if files:
        return files
    configured = config.get("chat_template")
    if isinstance(configured, str):
        return {"default": configured}
    if isinstance(configured, list):
        sources = {}
        for item in configured:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                raise TokenizerUnavailable(f"{root}: chat_template list items need string name and template")
            sources[item["name"]] = item["template"]
        return sources
    if configured is not None:
        raise TokenizerUnavailable(f"{root}: chat_template must be a string or a list of named templates")
    if isinstance(processor := _read_json_object(root / "chat_template.json").get("chat_template"), str):
        return {"default": processor}
    return {}


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        raise TokenizerUnavailable(f"cannot read {path}: {e}") from e


def load_tokenizer(path: str | None, *, piece_cache_bytes: int = DEFAULT_PIECE_CACHE_BYTES) -> Tokenizer:
    """The local tokenizer at `path` (a Hugging Face directory), or `ByteTokenizer` when `path` is None/empty.

    Raises `TokenizerUnavailable` when the directory cannot be loaded.
    """
    return HfTokenizer(path, piece_cache_bytes=piece_cache_bytes) if path else ByteTokenizer()


class RequestTokenizer:
    """The picker's async tokenizer: a `ParsedRequest` in, the engine's prompt token ids out.

    Prompt token ids are used as given. Local backends run inline for bodies up to `inline_max_bytes`
    (rendering and encoding them takes about a millisecond) and in a worker thread above it, so a
    100k-token prompt never stalls the event loop; remote backends are awaited. Threaded and remote work
    is bounded by `timeout_s` (a timed-out worker thread finishes in the background: threads cannot be
    cancelled). Every failure, including chat-template errors, is raised as `TokenizerUnavailable`.
    """

    def __init__(
        self,
        backend: Tokenizer | RemoteTokenizer,
        *,
        timeout_s: float,
        model: str = "",
        inline_max_bytes: int = 8_192,
    ) -> None:
        """`model` is the name sent to a remote `/tokenize` ("" sends each request's own model)."""
        if not timeout_s > 0:
            raise ValueError(f"tokenizer timeout_s must be > 0, got {timeout_s!r}")
        self.backend = backend
        self._timeout_s = timeout_s
        self._model = model
        self._inline_max_bytes = inline_max_bytes

    @classmethod
    def from_settings(
        cls,
        local_path: str | None,
        remote_url: str | None,
        model: str,
        timeout_s: float,
        cache_size: int,
        *,
        inline_max_bytes: int = 8_192,
        piece_cache_bytes: int = DEFAULT_PIECE_CACHE_BYTES,
    ) -> RequestTokenizer:
        """Build from configuration: a local directory, an engine URL, or neither (`ByteTokenizer`).

        `cache_size` bounds the remote backend's results, `piece_cache_bytes` a local directory's piece
        cache. Raises `ValueError` when both are set or a value is out of range, `TokenizerUnavailable` when
        the local directory cannot be loaded.
        """
        if local_path and remote_url:
            raise ValueError("set either a local tokenizer path or a remote /tokenize URL, not both")
        backend: Tokenizer | RemoteTokenizer
        if remote_url:
            backend = RemoteTokenizer(remote_url, timeout_s=timeout_s, cache_size=cache_size)
        else:
            backend = load_tokenizer(local_path, piece_cache_bytes=piece_cache_bytes)
        return cls(backend, timeout_s=timeout_s, model=model, inline_max_bytes=inline_max_bytes)

    @property
    def name(self) -> str:
        return self.backend.name

    @functools.cached_property
    def merges_inline_system(self) -> bool:
        """Whether vLLM merges an Anthropic Messages request's inline system messages into the leading
        one for this tokenizer: its chat template (for requests with and without tools, as vLLM checks)
        refuses a system message after a user one, or there is no template. A remote backend renders
        with the engine's own template and gets the messages as sent."""
        backend = self.backend
        if isinstance(backend, RemoteTokenizer):
            return False
        if not isinstance(backend, HfTokenizer):
            return True
        templates = backend.chat_templates
        chosen = {"default", "tool_use" if "tool_use" in templates else "default"}
        return any(needs_system_first(t.source if (t := templates.get(name)) else None) for name in chosen)

    def piece_cache_stats(self) -> TokenCacheStats | None:
        """The local backend's piece cache counters (`HfTokenizer`), or None without one."""
        return self.backend.piece_cache_stats() if isinstance(self.backend, HfTokenizer) else None

    def prefix_cache_stats(self) -> PromptPrefixStats | None:
        """The local backend's prompt prefix cache counters (`HfTokenizer`), or None without one."""
        return self.backend.prefix_cache_stats() if isinstance(self.backend, HfTokenizer) else None

    async def tokenize(self, request: ParsedRequest) -> list[int]:
        """The token ids the engine will prefill for `request`. Raises `TokenizerUnavailable`."""
        ids = await self.token_ids(request)
        return ids if isinstance(ids, list) else ids.tolist()

    async def token_ids(self, request: ParsedRequest) -> list[int] | array[int]:
        """As `tokenize`, without building a list where the ids come as an array (a chat prompt from
        the piece cache: `HfTokenizer.encode_chat_ids`). What the picker routes on."""
        if request.prompt_token_ids is not None:
            return _truncate(list(request.prompt_token_ids), request)
        try:
            if isinstance(self.backend, RemoteTokenizer):  # its payload has no truncation: cut here
                async with asyncio.timeout(self._timeout_s):
                    ids = await self._remote(self.backend, request)
                return _truncate(ids, request)
            if request.body_size <= self._inline_max_bytes or self._mostly_cached(request):
                return _tokenize_local(self.backend, request)
            work = asyncio.to_thread(_tokenize_local, self.backend, request)
            async with asyncio.timeout(self._timeout_s):
                return await work
        except TokenizerUnavailable:
            raise
        except TimeoutError as e:
            raise TokenizerUnavailable(f"tokenizer {self.name} took longer than {self._timeout_s}s") from e
        # The edge between the picker and a tokenizer backend: any other failure is a backend bug, logged
        # here once, and the picker still routes the request on load alone.
        except Exception as e:
            log.exception("tokenizer %s failed on a %s request", self.name, request.kind)
            raise TokenizerUnavailable(f"tokenizer {self.name} failed: {type(e).__name__}: {e}") from e

    def _mostly_cached(self, request: ParsedRequest) -> bool:
        """A chat's next turn whose earlier messages the picker parsed from the turn before
        (`new_bytes`, at most `--body-parse-inline-bytes`) and whose tokenizer encodes it piecewise:
        the earlier turns' pieces come from the cache, so the work is the new text, the template's
        render and the lookups (about 2-3 ms for a 100k-token chat), which a worker thread would
        not take off the loop (all but the new text's encoding holds the GIL) and whose hand-off
        costs two wake-ups. A tokenizer without its piece cache still gets the thread."""
        backend = self.backend
        return (
            request.new_bytes is not None
            and request.messages is not None
            and isinstance(backend, HfTokenizer)
            and backend.encodes_piecewise(
                request.tools, template_kwargs(request), request.add_special_tokens is True
            )
        )

    async def close(self) -> None:
        """Release the remote backend's HTTP session, if any."""
        if isinstance(self.backend, RemoteTokenizer):
            await self.backend.close()

    async def _remote(self, backend: RemoteTokenizer, request: ParsedRequest) -> list[int]:
        model = self._model or request.model
        if request.messages is not None:
            return await backend.encode_chat(
                request.messages,
                model=model,
                tools=request.tools,
                add_generation_prompt=request.add_generation_prompt,
                # the engine merges these itself; /tokenize has no continue_final_message field of ours to set
                chat_template_kwargs=(
                    {"continue_final_message": True, **request.chat_template_kwargs}
                    if request.continue_final_message
                    else dict(request.chat_template_kwargs) or None
                ),
            )
        if request.prompt_text is not None:
            return await backend.encode_text(request.prompt_text, model=model)
        raise TokenizerUnavailable("request has neither messages nor a prompt")


def template_kwargs(request: ParsedRequest) -> dict[str, Any]:
    """The chat template kwargs vLLM renders `request` with (`ChatCompletionRequest.build_chat_params`, then
    `ChatParams.with_defaults`): its `chat_template_kwargs`, overridden by its `add_generation_prompt`,
    `continue_final_message`, `documents` and `reasoning_effort` fields and by `enable_thinking =
    reasoning_effort != "none"` unless the kwargs name `enable_thinking`; null and "auto" values are skipped
    (`merge_kwargs`).
    """
    fields: dict[str, Any] = {
        "add_generation_prompt": request.add_generation_prompt,
        "continue_final_message": request.continue_final_message,
        "reasoning_effort": request.reasoning_effort,
        "documents": list(request.documents) if request.documents is not None else None,
    }
    if request.reasoning_effort is not None and "enable_thinking" not in request.chat_template_kwargs:
        fields["enable_thinking"] = request.reasoning_effort != "none"
    merged = {**request.chat_template_kwargs, **{k: v for k, v in fields.items() if not _unset(v)}}
    return {k: v for k, v in merged.items() if not _unset(v)}


def _unset(value: Any) -> bool:
    """vLLM's `merge_kwargs` skips these instead of overriding with them."""
    return value is None or (isinstance(value, str) and value == "auto")


def _tokenize_local(backend: Tokenizer, request: ParsedRequest) -> list[int] | array[int]:
    keep = request.truncate_prompt_tokens
    if (
        keep is not None
        and keep >= 0
        and request.truncation_side is None
        and isinstance(backend, HfTokenizer)
    ):
        # vLLM cuts again after the tokenizer did (`_token_truncation`): special tokens the tokenizer
        # added past `keep` go too, and a `keep` of 0 leaves nothing
        return _truncate(_truncated_by_tokenizer(backend, request, keep), request)
    ids: list[int] | array[int]
    if request.messages is not None:
        encode = backend.encode_chat_ids if isinstance(backend, HfTokenizer) else backend.encode_chat
        ids = encode(
            request.messages,
            tools=request.tools,
            add_generation_prompt=request.add_generation_prompt,
            chat_template_kwargs=template_kwargs(request),
            add_special_tokens=request.add_special_tokens,
        )
    elif request.prompt_text is not None:
        ids = backend.encode_text(request.prompt_text, add_special_tokens=request.add_special_tokens)
    else:
        raise TokenizerUnavailable("request has neither messages nor a prompt")
    return _truncate(ids, request)


def _truncate(ids: list[int] | array[int], request: ParsedRequest) -> list[int] | array[int]:
    """vLLM's `TokenizeParams._token_truncation`: keep `truncate_prompt_tokens` ids from the right end unless
    `truncation_side` is "right". A -1 means "to the engine's context length", which only the engine knows:
    such prompts stay whole (they differ only when longer than the context)."""
    keep = request.truncate_prompt_tokens
    if keep is None or keep < 0 or len(ids) <= keep:
        return ids
    return ids[:keep] if request.truncation_side == "right" else ids[len(ids) - keep :]


def _truncated_by_tokenizer(backend: HfTokenizer, request: ParsedRequest, keep: int) -> list[int]:
    if request.messages is not None:
        text = backend.render_chat(
            request.messages,
            tools=request.tools,
            add_generation_prompt=request.add_generation_prompt,
            chat_template_kwargs=template_kwargs(request),
        )
        return backend.truncated(text, add_special_tokens=request.add_special_tokens is True, max_tokens=keep)
    if request.prompt_text is None:
        raise TokenizerUnavailable("request has neither messages nor a prompt")
    add_special_tokens = request.add_special_tokens is not False
    return backend.truncated(request.prompt_text, add_special_tokens=add_special_tokens, max_tokens=keep)
