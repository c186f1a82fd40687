"""The manual pattern: ask `KvRouter` for a worker, send the request yourself, report its lifecycle.

Start two mock workers, then run this against them:

    .venv/bin/python -m extproc mock-worker --port 8001 --worker-id w0 --block-size 16 --kv-events off &
    .venv/bin/python -m extproc mock-worker --port 8002 --worker-id w1 --block-size 16 --kv-events off &
    .venv/bin/python examples/manual_routing.py 127.0.0.1:8001 127.0.0.1:8002

For callers who own the HTTP side (their own client, retries, another protocol) and want only the
decision. Three calls keep the router's load picture true:

    decision = router.best_worker(tokens, request_id=rid)   # choose, and track the request
    router.mark_prefill_complete(rid)                        # on the first streamed chunk
    router.free(rid)                                         # at the end, however it ends

`free` belongs in a `finally`: a request that is never freed counts as load on its worker forever.
The router here predicts each worker's cache from its own decisions (`use_kv_events=False`); with
KV events it would apply the workers' own (see `extproc.events`). Token ids must be the engine's:
the mock worker's default tokenizer is `ByteTokenizer` (UTF-8 bytes), so it is used here too. For
the same flow with the tokenizing, sending and freeing done for you, see `python_client.py`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

from extproc.request.tokenizer import ByteTokenizer  # noqa: E402
from extproc.router import KvRouter, RouterConfig, WorkerSpec  # noqa: E402

MODEL = "demo-model"
DOCUMENT = "Shipping policy: orders leave the warehouse within two days of payment. " * 10
QUESTIONS = ["When do orders ship?", "Is shipping free?", "Can I change my address?"]


@dataclass(frozen=True)
class Route:
    """Where one request went and how much of its prompt was cached there."""

    worker: str
    overlap_blocks: int  # the router's view
    cached_tokens: int  # the worker's own (x-prefix-cache-hit-tokens)


async def ask(
    session: aiohttp.ClientSession, router: KvRouter, endpoints: dict[str, str], question: str
) -> Route:
    messages = [{"role": "system", "content": DOCUMENT}, {"role": "user", "content": question}]
    tokens = ByteTokenizer().encode_chat(messages)
    request_id = uuid.uuid4().hex
    decision = router.best_worker(tokens, request_id=request_id)  # tracked from here on
    worker = str(decision.worker.worker_id)
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "stream": True}
    answer: list[str] = []
    try:
        url = f"http://{endpoints[worker]}/v1/chat/completions"
        async with session.post(url, json=body) as response:
            response.raise_for_status()
            prefilled = False
            async for line in response.content:  # SSE: one "data: {...}" line per chunk
                if not line.startswith(b"data: "):
                    continue
                if not prefilled:
                    router.mark_prefill_complete(request_id)
                    prefilled = True
                data = line[len(b"data: ") :].strip()
                if data == b"[DONE]":
                    break
                delta = json.loads(data)["choices"][0].get("delta", {})
                answer.append(delta.get("content") or "")
            cached = int(response.headers.get("x-prefix-cache-hit-tokens", "0"))
    finally:
        router.free(request_id)  # complete, error or cancelled: always exactly once
    print(
        f"{question!r:30} -> {worker} ({endpoints[worker]}): overlap {decision.overlap_blocks}/"
        f"{decision.request_blocks} blocks, worker cached {cached} tokens, answer {''.join(answer)!r}"
    )
    return Route(worker, decision.overlap_blocks, cached)


async def main(worker_endpoints: Sequence[str]) -> list[Route]:
    """Ask each question in turn; all share the document, so all but the first reuse its cache."""
    endpoints = {f"w{i}": endpoint for i, endpoint in enumerate(worker_endpoints)}
    router = KvRouter(
        RouterConfig(block_size=16, use_kv_events=False),
        clock=time.monotonic,
        workers=[WorkerSpec(worker_id) for worker_id in endpoints],
    )
    async with aiohttp.ClientSession() as session:
        routes = [await ask(session, router, endpoints, question) for question in QUESTIONS]
    print(f"router idle: {router.is_idle()}")
    return routes


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} IP:PORT [IP:PORT ...]  (mock workers; see the docstring)")
    asyncio.run(main(sys.argv[1:]))
