"""Custom routing with `KvRouter.get_potential_loads`: send each request where its TTFT is lowest.

    .venv/bin/python examples/custom_routing.py

The router's own choice minimises Dynamo's cost, `weight * prefill blocks + decode blocks`, which
balances time to first token against KV memory. A caller with a different goal reads the same
numbers and decides itself: `get_potential_loads(tokens)` says, per worker, how many prompt tokens
it would have to prefill (its queue plus this prompt's uncached part), how many KV blocks it would
hold, and how much of the prompt it caches. It changes no state. Here the goal is the least prefill
work ahead of the request, a proxy for TTFT; the request is then tracked on that worker by pinning
it (`best_worker(..., pinned_worker=..., request_id=...)`), so the router's load picture stays true.

The same numbers come from a router group over gRPC (`RemoteGroup.potential_loads`, the group API's
PotentialLoads call), for a top-level picker that wants its own rule across groups.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

from extproc.router import KvRouter, RouterConfig, WorkerLoad, WorkerSpec  # noqa: E402

BLOCK = 16


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(n)]


def min_prefill(loads: list[WorkerLoad]) -> WorkerLoad:
    """The worker with the least prefill work ahead of the request (fewer decode blocks break ties)."""
    return min(loads, key=lambda load: (load.prefill_tokens, load.decode_blocks))


def main() -> int:
    # use_kv_events=False: the router predicts caches from its own decisions (no engines here)
    router = KvRouter(
        RouterConfig(block_size=BLOCK, use_kv_events=False, prefill_load_model="none"),  # loads in tokens
        clock=time.monotonic,
        rng=random.Random(0),
        workers=[WorkerSpec(f"w{i}") for i in range(3)],
    )
    document = tokens(1, 4000)
    # w0 has served the document before (it caches it) and is now prefilling a 3,000-token prompt;
    # w1 and w2 are idle and cache nothing of it.
    router.best_worker(document, request_id="earlier", pinned_worker="w0")
    router.mark_prefill_complete("earlier")
    router.free("earlier")
    router.best_worker(tokens(2, 3000), request_id="in-flight", pinned_worker="w0")

    request = document + tokens(3, 200)  # a question about the document
    loads = router.get_potential_loads(request)
    print(f"{'worker':<7}{'prefill tokens':>15}{'decode blocks':>15}{'overlap blocks':>16}")
    for load in loads:
        print(
            f"{load.worker!s:<7}{load.prefill_tokens:>15}{load.decode_blocks:>15.0f}{load.overlap_blocks:>16}"
        )

    by_cost = router.best_worker(request)  # no request_id: a probe, nothing changes
    fastest = min_prefill(loads)
    print(f"\nthe router's cost picks {by_cost.worker} (cost {by_cost.cost:.0f}: prefill against KV memory)")
    print(f"least prefill work picks {fastest.worker} ({fastest.prefill_tokens} tokens to prefill first)")

    decision = router.best_worker(request, request_id="question", pinned_worker=fastest.worker)
    print(
        f"tracked on {decision.worker} with {decision.overlap_blocks}/{decision.request_blocks} blocks cached"
    )
    router.mark_prefill_complete("question")  # first token arrived
    router.free("question")  # stream ended
    router.free("in-flight")
    assert router.is_idle()
    return 0 if fastest.worker != by_cost.worker else 1


if __name__ == "__main__":
    sys.exit(main())
