"""Dynamo's "Hierarchical Router Probing" routing pattern, run on extproc: only the import changed.

The KV Cache Routing guide's snippet, made whole. Changed beyond the import (`extproc.compat` for
`dynamo._core`), each strictly necessary:
- two routers need two worker groups: the config file named by DYN_CONFIG lists its workers under
  two labels, `group_1` and `group_2` (the `model:` of each worker there; the engines themselves
  serve "model-name"), and each router's component names its group:

      workers:
        - {id: 127.0.0.1:8001, endpoint: 127.0.0.1:8001, model: group_1}
        - {id: 127.0.0.1:8002, endpoint: 127.0.0.1:8002, model: group_2}

- the snippet passes an undefined `worker_id` to `generate`: here it is the chosen router's probe;
- `main()` warms group_2 with the prompt first, so the probe has a cache to find, and returns what
  it chose so tests can check it.

Dynamo's later guide warns against two KvPushRouters in one process (they share a lease); here each
is independent. The same pattern across pickers in other processes is extproc's router groups
(examples/hierarchical/).

    DYN_CONFIG=groups.yaml .venv/bin/python examples/dynamo/hierarchical_probing.py
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from extproc.compat import DistributedRuntime, KvPushRouter, KvRouterConfig


async def main():
    runtime = DistributedRuntime.detached()
    namespace = runtime.namespace("dynamo")
    config = KvRouterConfig(use_kv_events=False)  # no engine events here: caches predicted from routing
    router_1 = KvPushRouter(
        endpoint=namespace.component("group_1").endpoint("generate"), block_size=16, kv_router_config=config
    )
    router_2 = KvPushRouter(
        endpoint=namespace.component("group_2").endpoint("generate"), block_size=16, kv_router_config=config
    )
    tokens = list(range(1, 200))

    warm = await router_2.generate(tokens, model="model-name", stop_conditions={"max_tokens": 4})
    async for _ in warm:
        pass

    # Probe multiple routers without updating state
    worker_id_1, overlap_1 = await router_1.best_worker_id(tokens)  # No request_id
    worker_id_2, overlap_2 = await router_2.best_worker_id(tokens)

    # Pick the best router based on results
    chosen_router = router_1 if overlap_1 > overlap_2 else router_2
    worker_id = worker_id_1 if chosen_router is router_1 else worker_id_2
    stream = await chosen_router.generate(tokens, model="model-name", worker_id=worker_id)

    generated = [token for response in [r async for r in stream] for token in response["token_ids"]]
    group = "group_1" if chosen_router is router_1 else "group_2"
    print(f"probes: group_1 {worker_id_1} ({overlap_1} blocks), group_2 {worker_id_2} ({overlap_2} blocks)")
    print(f"routed through {group} to {worker_id}: {len(generated)} tokens")
    return group, worker_id, [router_1, router_2]


if __name__ == "__main__":
    asyncio.run(main())
