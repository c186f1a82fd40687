"""`KvPushRouter`: Dynamo's Python router API over our KvRouter, sending to the workers' OpenAI API.

The names, keywords, return shapes and awaits of Dynamo's "Using KvPushRouter Python API" guide
(../shared/dynamo-docs/001 and 004), so its examples run with only the import changed. Underneath:
an `EndpointPicker` over the endpoint's workers (its model pool's `KvRouter` decides and tracks;
its KV event sources start on the first call when `use_kv_events` and the config names any), and
client.py's SSE reading and error types for the HTTP side. One `KvPushRouter` routes one model.

Differences from ai-dynamo-runtime 1.6.1 (`dynamo._core.KvRouter`, introspected), kept on purpose:

- The class is `KvPushRouter`, the guide's name; 1.6.1 renamed it `KvRouter`, exported here too.
  `best_worker_id` (the guide's, deprecated in the later guide, gone in 1.6.1) is kept beside
  `best_worker`.
- Worker ids are the configured workers' ids (strings such as "w0" or "10.0.0.5:8000"), not
  Dynamo's u64 instance ids; `worker_id=` also takes an int and matches it as a string.
- `generate` returns the stream after routing (worker chosen, request tracked: errors such as an
  unknown or busy pinned worker raise from the await) and sends the request when the stream is
  first iterated. It sends `/v1/completions` with the token ids as the prompt; each item is an
  LLMEngineOutput-shaped dict (`token_ids`, `text`, `finish_reason`, `index`). A stream dropped
  unread frees its request. Worker failures raise client.py's `WorkerFailed`.
- Not accepted (TypeError): the multimodal (`block_mm_infos`, `multi_modal_data`,
  `mm_routing_info`), `routing_constraints`, `strict_priority`, `policy_class` and
  `response_buffer_size` keywords, `generate_from_request` and `get_overlap_scores`.
  `lora_name` and `cache_namespace` are keyword-only (Dynamo's sit after the multimodal ones).
  `update_indexer=True` needs a `request_id` here (tracking a request records its routing in the
  approximate indexer); without one it raises NotImplementedError.
- `router_config_override` takes `overlap_score_weight` and `router_temperature`, Dynamo's two;
  any other key raises InvalidConfig. `get_potential_loads` rounds `potential_decode_blocks` (ours
  are fractional with output-block decay) to an int, as Dynamo's are.
- `dump_events()` returns Dynamo's RouterEvent JSON (a string) of the events the engines reported;
  `worker_id` there is the configured id too.
- `mark_prefill_complete` and `free` of an unknown request id do nothing (Dynamo logs a warning).
- `close()` (or `async with`) stops KV event sources; Dynamo ties this to the runtime's lifetime.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from types import TracebackType
from typing import Any

import aiohttp

from extproc.client import (
    BAD_GATEWAY,
    COMPLETIONS_PATH,
    WorkerFailed,
    _chunk,
    _error_body,
    _error_message,
    _sse_payloads,
)
from extproc.compat.config import KvRouterConfig, parse_override
from extproc.compat.runtime import Endpoint
from extproc.compat.wire import completion_body, engine_output, potential_load, router_event
from extproc.events.sources import EventSources, start_event_sources
from extproc.picker.pipeline import EndpointPicker
from extproc.request.tokenizer import Tokenizer, load_tokenizer
from extproc.router import KvRouter, Worker, WorkerId

log = logging.getLogger("extproc.compat")


class KvPushRouter:
    """Routes one model's requests by KV overlap and load, Dynamo's way; see the module docstring."""

    def __init__(
        self,
        endpoint: Endpoint,
        block_size: int,
        kv_router_config: KvRouterConfig | None = None,
        *,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> None:
        """`block_size`: tokens per KV block, the engines'. `timeout`: for worker requests (default:
        connecting bounded to 10 s, a generation may stream for minutes). Raises ValueError
        (InvalidConfig) for an unusable setting."""
        self.endpoint = endpoint
        self.model = endpoint.model
        settings = kv_router_config or KvRouterConfig()
        self.config = dataclasses.replace(
            endpoint.runtime.config,
            router=settings.router_config(block_size),
            body_parse_workers=0,  # bodies are never parsed here
        )
        self._picker = EndpointPicker(self.config)
        self._pool = self._picker.pools[self.model]
        self._timeout = timeout or aiohttp.ClientTimeout(total=None, sock_connect=10.0)
        self._tokenizer: Tokenizer | None = None
        self._sources: EventSources | None = None
        self._started = False
        self._closed = False

    @property
    def router(self) -> KvRouter:
        """Our router underneath (its `Decision`s, `is_idle`, ...)."""
        return self._pool.router

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the KV event sources (done by the first call; idempotent)."""
        if self._closed:
            raise RuntimeError("this KvPushRouter is closed; make a new one")
        if self._started:
            return
        self._started = True
        if self.config.router.use_kv_events:
            try:
                self._sources = await start_event_sources(self.config, self._picker)
            except BaseException:  # `async with` will not call close: release the picker here
                await self.close()
                raise

    async def close(self) -> None:
        """Stop the event sources and the picker (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._sources is not None:
            sources, self._sources = self._sources, None
            await sources.stop()
        await self._picker.close()

    async def __aenter__(self) -> KvPushRouter:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- Dynamo's methods ------------------------------------------------------------------------

    async def generate(
        self,
        token_ids: Sequence[int],
        model: str,
        stop_conditions: Mapping[str, Any] | None = None,
        sampling_options: Mapping[str, Any] | None = None,
        output_options: Mapping[str, Any] | None = None,
        router_config_override: Mapping[str, Any] | None = None,
        worker_id: WorkerId | None = None,
        dp_rank: int | None = None,
        extra_args: Mapping[str, Any] | None = None,
    ) -> ResponseStream:
        """Route (to `worker_id` / `dp_rank` when given, still tracked), then stream the answer.

        Raises NoWorkers, AllWorkersBusy, PinnedWorkerUnavailable (RouterError), InvalidConfig
        for a bad override, ValueError for a reserved option key.
        """
        await self.start()
        body = completion_body(
            model, token_ids, stop_conditions, sampling_options, output_options, extra_args
        )
        max_tokens = (stop_conditions or {}).get("max_tokens")
        request_id = uuid.uuid4().hex
        pinned, allowed = self._target(worker_id, dp_rank)
        decision = self.router.best_worker(
            token_ids,
            request_id=request_id,
            config_override=parse_override(router_config_override),
            pinned_worker=pinned,
            allowed_workers=allowed,
            expected_output_tokens=max_tokens if isinstance(max_tokens, int) else None,
        )
        endpoint = self._pool.endpoint_of(decision.worker)
        headers = {"content-type": "application/json", "x-request-id": request_id}
        headers |= self._pool.extra_headers(decision.worker)
        log.info(
            "routed %s to %s (%s) overlap=%d/%d blocks%s",
            request_id, decision.worker, endpoint, decision.overlap_blocks, decision.request_blocks,
            " (pinned)" if pinned is not None else "",
        )  # fmt: skip
        return ResponseStream(self, request_id, endpoint, json.dumps(body).encode(), headers)

    async def best_worker(
        self,
        token_ids: Sequence[int],
        router_config_override: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        update_indexer: bool = False,
        *,
        lora_name: str | None = None,
        cache_namespace: str | None = None,
    ) -> tuple[WorkerId, int, int]:
        """(worker_id, dp_rank, overlap_blocks) the router would choose; with `request_id` the
        request is tracked (then call `mark_prefill_complete` and `free`)."""
        await self.start()
        if update_indexer and request_id is None:
            raise NotImplementedError("update_indexer=True needs a request_id here (see extproc.compat)")
        decision = self.router.best_worker(
            token_ids,
            request_id=request_id,
            config_override=parse_override(router_config_override),
            lora_name=lora_name,
            cache_salt=cache_namespace,
        )
        return decision.worker_id, decision.dp_rank, decision.overlap_blocks

    async def best_worker_id(
        self,
        token_ids: Sequence[int],
        router_config_override: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> tuple[WorkerId, int]:
        """(worker_id, overlap_blocks): the guide's older form of `best_worker`."""
        worker_id, _, overlap_blocks = await self.best_worker(token_ids, router_config_override, request_id)
        return worker_id, overlap_blocks

    async def get_potential_loads(
        self, token_ids: Sequence[int], *, lora_name: str | None = None, cache_namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Per (worker, dp rank): `worker_id`, `dp_rank`, `potential_prefill_tokens`,
        `potential_decode_blocks`, `active_requests`. Changes nothing."""
        await self.start()
        loads = self.router.get_potential_loads(token_ids, lora_name=lora_name, cache_salt=cache_namespace)
        sequences = self.router.sequences
        return [potential_load(load, sequences.num_requests(load.worker)) for load in loads]

    async def mark_prefill_complete(self, request_id: str) -> None:
        """The request's first token arrived (manual lifecycle with `best_worker(request_id=...)`)."""
        self.router.mark_prefill_complete(request_id)

    async def free(self, request_id: str) -> None:
        """The request ended, however it ended (manual lifecycle); idempotent."""
        self.router.free(request_id)

    async def dump_events(self) -> str:
        """The events that rebuild the indexer, as Dynamo's RouterEvent JSON list (a string)."""
        events = self.router.dump_events()
        return json.dumps(
            [router_event(e, e.event_id if e.event_id is not None else i) for i, e in enumerate(events)]
        )

    # --- internals -------------------------------------------------------------------------------

    def _target(
        self, worker_id: WorkerId | None, dp_rank: int | None
    ) -> tuple[Worker | WorkerId | None, list[Worker] | None]:
        """The pinned worker, or the dp-rank restriction, of a `generate` call."""
        if worker_id is not None:
            wid = str(worker_id)
            return (Worker(wid, dp_rank) if dp_rank is not None else wid), None
        if dp_rank is not None:
            return None, [w for w in self.router.workers() if w.dp_rank == dp_rank]
        return None, None

    def _output_tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            model = next((m for m in self.config.models if m.name == self.model), None)
            self._tokenizer = load_tokenizer((model.tokenizer if model else None) or self.config.tokenizer)
        return self._tokenizer


class ResponseStream:
    """One generation: an async iterator of LLMEngineOutput dicts, sent on the first iteration.

    Prefill is marked complete on the first chunk; the request is freed exactly once when the
    stream ends, fails, is closed (`aclose`) or is dropped unread.
    """

    def __init__(
        self, owner: KvPushRouter, request_id: str, endpoint: str, body: bytes, headers: dict[str, str]
    ) -> None:
        self.request_id = request_id
        self.endpoint = endpoint
        self._owner = owner
        self._body = body
        self._headers = headers
        self._freed = False
        self._items: AsyncGenerator[dict[str, Any], None] | None = None  # made on first read: none, no cycle

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._items is None:
            if self._freed:
                raise StopAsyncIteration
            self._items = self._run()
        return await self._items.__anext__()

    async def aclose(self) -> None:
        """Stop reading: close the worker connection and free the request (idempotent)."""
        if self._items is not None:
            await self._items.aclose()
        self._free()

    def __del__(self) -> None:
        self._free()

    def _free(self) -> None:
        if not self._freed:
            self._freed = True
            self._owner.router.free(self.request_id)

    async def _run(self) -> AsyncGenerator[dict[str, Any], None]:
        endpoint, router = self.endpoint, self._owner.router
        try:
            async with (
                aiohttp.ClientSession(timeout=self._owner._timeout) as session,
                session.post(
                    f"http://{endpoint}{COMPLETIONS_PATH}", data=self._body, headers=self._headers
                ) as response,
            ):
                if not 200 <= response.status < 300:
                    error = await _error_body(response)
                    message = f"worker at {endpoint} answered {response.status}: {_error_message(error)}"
                    raise WorkerFailed(response.status, message, endpoint=endpoint, body=error)
                first = True
                async for payload in _sse_payloads(response):
                    if payload == "[DONE]":
                        return
                    chunk = _chunk(payload, endpoint)
                    if first:
                        first = False
                        router.mark_prefill_complete(self.request_id)
                    output = engine_output(chunk, self._owner._output_tokenizer())
                    if output is not None:
                        yield output
                raise WorkerFailed(
                    BAD_GATEWAY, f"worker at {endpoint} ended the stream before [DONE]", endpoint=endpoint
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            detail = str(exc) or type(exc).__name__
            raise WorkerFailed(
                BAD_GATEWAY, f"worker at {endpoint} failed: {detail}", endpoint=endpoint
            ) from exc
        finally:
            self._free()
