"""Dynamo's Python-side shapes <-> the workers' OpenAI API and the router's nouns. No I/O.

- `completion_body`: `generate`'s `token_ids`, `stop_conditions`, `sampling_options`,
  `output_options` and `extra_args` (Dynamo's PreprocessedRequest parts) as one streamed
  `/v1/completions` body with the token ids as the prompt. Keys are passed under their own names
  (vLLM's and SGLang's OpenAI servers take `max_tokens`, `min_tokens`, `stop`, `ignore_eos`,
  `temperature`, `top_p`, `top_k`, `seed`, `logprobs`, ...); Dynamo's `stop_token_ids_hidden`
  becomes `stop_token_ids`, and `return_token_ids` asks vLLM for the generated ids.
- `engine_output`: one OpenAI completion chunk as Dynamo's LLMEngineOutput dict (`token_ids`,
  `text`, `finish_reason`, `index`): the ids the worker returned, else its text encoded by the
  model's tokenizer (exact for the mock worker's byte tokenizer, an approximation per chunk for
  a real one).
- `potential_load` and `router_event`: the router's `WorkerLoad` and `KvEvent` in the keys of
  Dynamo's `get_potential_loads` and `dump_events` (RouterEvent: lib/kv-router/src/protocols.rs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from extproc.request.tokenizer import Tokenizer
from extproc.router import AllBlocksCleared, BlocksRemoved, BlocksStored, KvEvent, WorkerLoad

_RENAMED = {"stop_token_ids_hidden": "stop_token_ids"}
_RESERVED = ("model", "prompt", "stream")  # the call's own: an option cannot replace them


def completion_body(
    model: str,
    token_ids: Sequence[int],
    *parts: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A streamed completions body; `parts` (stop conditions, sampling, output options, extra args)
    are merged in that order, None values dropped. Raises ValueError for a reserved key."""
    body: dict[str, Any] = {"model": model, "prompt": list(token_ids), "stream": True}
    body["return_token_ids"] = True
    for part in parts:
        for key, value in (part or {}).items():
            if key in _RESERVED:
                raise ValueError(f"{key!r} is set by generate(); it cannot be an option")
            if value is not None:
                body[_RENAMED.get(key, key)] = value
    return body


def engine_output(chunk: Mapping[str, Any], tokenizer: Tokenizer) -> dict[str, Any] | None:
    """The chunk's first choice as an LLMEngineOutput dict; None for a chunk without one (usage)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    choice = choices[0]
    text = choice.get("text")
    if not isinstance(text, str):
        text = ""
    ids = choice.get("token_ids")
    if not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
        ids = tokenizer.encode_text(text, add_special_tokens=False) if text else []
    return {
        "token_ids": ids,
        "text": text,
        "finish_reason": choice.get("finish_reason"),
        "index": choice.get("index", 0),
    }


def potential_load(load: WorkerLoad, active_requests: int) -> dict[str, Any]:
    """One (worker, dp rank)'s row of `get_potential_loads`, in Dynamo's keys."""
    return {
        "worker_id": load.worker.worker_id,
        "dp_rank": load.worker.dp_rank,
        "potential_prefill_tokens": load.prefill_tokens,
        "potential_decode_blocks": round(load.decode_blocks),
        "active_requests": active_requests,
    }


def router_event(event: KvEvent, event_id: int) -> dict[str, Any]:
    """Dynamo's RouterEvent shape: {"worker_id", "event": {"event_id", "dp_rank", "data"}}."""
    data: Any
    if isinstance(event, BlocksStored):
        blocks = [{"block_hash": b.engine_hash, "tokens_hash": b.local_hash} for b in event.blocks]
        data = {"stored": {"parent_hash": event.parent_hash, "blocks": blocks}}
    elif isinstance(event, BlocksRemoved):
        data = {"removed": {"block_hashes": list(event.engine_hashes)}}
    elif isinstance(event, AllBlocksCleared):
        data = "cleared"
    else:
        raise TypeError(f"not a KV event: {type(event).__name__}")
    worker = event.worker
    return {
        "worker_id": worker.worker_id,
        "event": {"event_id": event_id, "dp_rank": worker.dp_rank, "data": data},
    }
