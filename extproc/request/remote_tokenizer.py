"""RemoteTokenizer: the engine's own vLLM-style `POST {base_url}/tokenize`, with a timeout and an LRU cache.

Exact by construction (the engine renders and tokenizes), at the price of one loopback/LAN round trip per
distinct request. Wire format (vLLM `serving_tokenization.py`): `{"model", "prompt", "add_special_tokens"}`
or `{"model", "messages", "add_generation_prompt", "tools"?, "chat_template_kwargs"?}` answered by
`{"tokens": [...], "count", "max_model_len"}`. Every failure (timeout, refused connection, non-200, bad
JSON, wrong shape) becomes `TokenizerUnavailable`, chained with `from`.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from extproc.errors import TokenizerUnavailable
from extproc.request.parse import MAX_TOKEN_ID


class RemoteTokenizer:
    """Async client of one engine's `/tokenize` endpoint. Create and use it inside one event loop."""

    def __init__(self, base_url: str, *, timeout_s: float, cache_size: int) -> None:
        """`base_url` is the engine root (`http://host:port`); `cache_size` 0 disables the cache.

        Raises `ValueError` for a URL that is not http(s), a non-positive timeout or a negative cache size.
        """
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"tokenizer URL must start with http:// or https://, got {base_url!r}")
        if not timeout_s > 0:
            raise ValueError(f"tokenizer timeout_s must be > 0, got {timeout_s!r}")
        if cache_size < 0:
            raise ValueError(f"tokenizer cache_size must be >= 0, got {cache_size!r}")
        self.url = base_url.rstrip("/") + "/tokenize"
        self.name = f"remote:{self.url}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._cache_size = cache_size
        self._cache: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None

    async def encode_text(self, text: str, *, model: str) -> list[int]:
        """Token ids of a completion prompt, with the engine's default special tokens."""
        return await self._tokenize({"model": model, "prompt": text, "add_special_tokens": True})

    async def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a conversation as the engine renders it (its template, its content format)."""
        payload: dict[str, Any] = {
            "model": model,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        if tools is not None:
            payload["tools"] = [dict(t) for t in tools]
        if chat_template_kwargs:
            payload["chat_template_kwargs"] = dict(chat_template_kwargs)
        return await self._tokenize(payload)

    async def close(self) -> None:
        """Close the HTTP session; the tokenizer may be used again afterwards (a new session opens)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _tokenize(self, payload: dict[str, Any]) -> list[int]:
        try:
            body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:
            raise TokenizerUnavailable(f"request cannot be sent to {self.url}: {e}") from e
        key = hashlib.blake2b(body, digest_size=16).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return list(cached)
        tokens = await self._post(body)
        if self._cache_size:
            self._cache[key] = tuple(tokens)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return tokens

    async def _post(self, body: bytes) -> list[int]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(
                self.url, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                raw = await response.read()
                if response.status != 200:
                    snippet = raw[:200].decode("utf-8", "replace")
                    raise TokenizerUnavailable(f"{self.url} answered HTTP {response.status}: {snippet}")
                answer = json.loads(raw)
        except TimeoutError as e:
            raise TokenizerUnavailable(f"{self.url} did not answer within {self._timeout.total}s") from e
        except (aiohttp.ClientError, OSError) as e:
            raise TokenizerUnavailable(f"{self.url} is unreachable: {type(e).__name__}: {e}") from e
        except (ValueError, RecursionError) as e:
            raise TokenizerUnavailable(f"{self.url} answered with invalid JSON: {e}") from e
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in tokens):
            raise TokenizerUnavailable(f"{self.url} answered without a `tokens` list of token ids")
        return tokens
