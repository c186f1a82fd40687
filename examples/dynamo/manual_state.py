"""Dynamo's "Manual State Management (Advanced)" routing pattern, run on extproc: only the import changed.

The KV Cache Routing guide's snippet, made whole. Changed beyond the import (`extproc.compat` for
`dynamo._core`), each strictly necessary:
- the workers come from the picker's config file named by DYN_CONFIG (see minimize_ttft.py), with
  each worker's id its `ip:port`, so a worker id says where to send;
- the snippet's `client` is undefined there (in Dynamo it is the endpoint's client): `WorkerClient`
  below sends the tokens to the chosen worker's OpenAI /v1/completions and streams the answer. The
  snippet's call gains `worker_id=worker_id`: without it nothing sends the request to the worker
  the router chose and tracked;
- the commented-out lines (first token, the rest) are written out; `free` is in a `finally`;
- `main()` returns the router and the route, so tests can check them.

    DYN_CONFIG=workers.yaml .venv/bin/python examples/dynamo/manual_state.py  # workers serve "model-name"
"""

import asyncio
import json
import sys
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from extproc.compat import DistributedRuntime, KvPushRouter, KvRouterConfig


class WorkerClient:
    """Sends token ids to one worker's OpenAI completions endpoint and streams the text back."""

    def __init__(self, session):
        self.session = session

    async def generate(self, tokens, request_id, worker_id):
        body = {"model": "model-name", "prompt": tokens, "max_tokens": 8, "stream": True}
        url = f"http://{worker_id}/v1/completions"
        async with self.session.post(url, json=body, headers={"x-request-id": request_id}) as response:
            response.raise_for_status()
            async for line in response.content:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    yield json.loads(line[len(b"data: ") :])["choices"][0]["text"]


async def main():
    runtime = DistributedRuntime.detached()
    endpoint = runtime.namespace("dynamo").component("backend").endpoint("generate")
    router = KvPushRouter(
        endpoint=endpoint, block_size=16, kv_router_config=KvRouterConfig(use_kv_events=False)
    )
    tokens = list(range(1, 100))
    async with aiohttp.ClientSession() as session:
        client = WorkerClient(session)
        routes = []
        for _ in range(2):  # the second time, the router remembers where the prefix went
            worker_id, overlap = await router.best_worker_id(tokens, request_id="req-123")
            try:
                response = client.generate(tokens, request_id="req-123", worker_id=worker_id)
                await anext(response)  # Get first token
                await router.mark_prefill_complete("req-123")  # After first token
                async for _ in response:  # Continue generating
                    pass
            finally:
                await router.free("req-123")  # After completion
            print(f"req-123 -> worker {worker_id}, {overlap} blocks cached")
            routes.append((worker_id, overlap))
    return router, routes


if __name__ == "__main__":
    asyncio.run(main())
