"""Route with the KV-aware router from Python, no Envoy: `RoutingClient.generate` streams, routes, frees.

Start two mock workers, then run this against them:

    .venv/bin/python -m extproc mock-worker --port 8001 --worker-id w0 --block-size 16 --kv-events off &
    .venv/bin/python -m extproc mock-worker --port 8002 --worker-id w1 --block-size 16 --kv-events off &
    .venv/bin/python examples/python_client.py 127.0.0.1:8001 127.0.0.1:8002

To route on the workers' real caches, let them publish KV events on ports of their own and give
the client those endpoints (then `use_kv_events` is on by itself):

    .venv/bin/python -m extproc mock-worker --port 8001 --worker-id w0 --block-size 16 \\
        --kv-events-port 5557 --kv-replay-port 5558 &
    ...
    RoutingClient.from_workers("demo-model", [
        WorkerConfig("w0", "127.0.0.1:8001", "demo-model",
                     kv_events="tcp://127.0.0.1:5557", kv_replay="tcp://127.0.0.1:5558"), ...])

The client tokenizes each request as the engine will (here UTF-8 bytes, the mock worker's default;
`tokenizer=` takes a Hugging Face directory), picks the worker with the best cache overlap for its
load, sends the request there, and tells the router when the first chunk arrives and when the
stream ends, so the next decision sees true load. Leaving the `async with` block early (or a
cancelled task) closes the connection and frees the request. For the lower-level manual pattern
(`KvRouter.best_worker` and your own HTTP), see `manual_routing.py`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

from extproc.client import RouterConfigOverride, RoutingClient, WorkerFailed  # noqa: E402

MODEL = "demo-model"
DOCUMENT = "Release notes: the cache now survives restarts and evictions are logged. " * 10


def conversation(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": DOCUMENT}, {"role": "user", "content": question}]


async def main(endpoints: Sequence[str]) -> int:
    async with RoutingClient.from_workers(MODEL, endpoints, block_size=16) as client:
        for question in ("What changed?", "Is anything logged?"):
            async with client.generate(model=MODEL, messages=conversation(question), max_tokens=12) as stream:
                pick = stream.pick
                assert pick is not None
                print(f"{question!r}: routed to {stream.endpoint}, "
                      f"{pick.overlap_blocks}/{pick.request_blocks} prompt blocks cached there")  # fmt: skip
                async for chunk in stream:
                    print(chunk["choices"][0]["delta"].get("content", ""), end="", flush=True)
                print()

        # per request: ignore the cache (load alone decides), and a non-streamed answer
        override = RouterConfigOverride(overlap_score_weight=0.0)
        answer = await client.complete(
            model=MODEL, prompt="Summarize the notes.", max_tokens=4, router_override=override
        )
        print(f"complete(): {answer['choices'][0]['text']!r}")

        try:
            await client.complete(model=MODEL, prompt="x", max_tokens=0)  # the worker refuses it
        except WorkerFailed as exc:
            print(f"worker error {exc.status}: {exc.message}")
        print(f"picker idle: {client.picker.is_idle()}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} IP:PORT [IP:PORT ...]  (mock workers; see the docstring)")
    sys.exit(asyncio.run(main(sys.argv[1:])))
