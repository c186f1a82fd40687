"""Dynamo's "Custom Routing Example: Minimizing TTFT", run on extproc: only the import changed.

From the KV Cache Routing guide's "Using KvPushRouter Python API" section, verbatim but for:
- the import: `extproc.compat` instead of `dynamo._core`;
- the workers: Dynamo discovers them under dynamo/backend/generate; here they are the workers of the
  picker's config file, named by DYN_CONFIG (the file `serve` reads), such as:

      workers:
        - {id: 127.0.0.1:8001, endpoint: 127.0.0.1:8001, model: backend}
        - {id: 127.0.0.1:8002, endpoint: 127.0.0.1:8002, model: backend}

  Worker ids are those ids (strings), not Dynamo's u64 instance ids;
- it returns the router and the chosen worker, so tests can check them; the sys.path lines run
  it from a checkout.

    .venv/bin/python -m extproc mock-worker --port 8001 --worker-id w0 --model meta-llama/Llama-2-7b-hf &
    .venv/bin/python -m extproc mock-worker --port 8002 --worker-id w1 --model meta-llama/Llama-2-7b-hf &
    DYN_CONFIG=workers.yaml .venv/bin/python examples/dynamo/minimize_ttft.py
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from extproc.compat import DistributedRuntime, KvPushRouter, KvRouterConfig


async def minimize_ttft_routing():
    # Setup router
    runtime = DistributedRuntime.detached()
    namespace = runtime.namespace("dynamo")
    component = namespace.component("backend")
    endpoint = component.endpoint("generate")

    router = KvPushRouter(endpoint=endpoint, block_size=16, kv_router_config=KvRouterConfig())

    # Your input tokens
    token_ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]

    # Get potential loads for all workers
    potential_loads = await router.get_potential_loads(token_ids)

    # Find worker with minimum prefill tokens (best for TTFT)
    best_worker = min(potential_loads, key=lambda x: x["potential_prefill_tokens"])

    print(f"Worker loads: {potential_loads}")
    print(
        f"Selected worker {best_worker['worker_id']} with {best_worker['potential_prefill_tokens']} prefill tokens"  # noqa: E501
    )

    # Route directly to the selected worker
    stream = await router.generate(
        token_ids=token_ids,
        model="meta-llama/Llama-2-7b-hf",
        worker_id=best_worker["worker_id"],  # Force routing to optimal worker
        stop_conditions={"max_tokens": 20},
    )

    # Process response
    async for response in stream:
        if isinstance(response, dict) and "token_ids" in response:
            print(f"Generated tokens: {response['token_ids']}")
    return router, best_worker


if __name__ == "__main__":
    asyncio.run(minimize_ttft_routing())
