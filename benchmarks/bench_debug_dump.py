"""What `/debug/dump_events` costs routing: the event loop's longest wait while it answers.

    .venv/bin/python benchmarks/bench_debug_dump.py                      # 2^20 entries, about 1 minute
    .venv/bin/python benchmarks/bench_debug_dump.py --entries 262144

A router holding `--entries` (worker, block) entries (16 workers, 64-block chains of random 64-bit
hashes), one process, no HTTP. Per round, alternating: `inline`, the dump and its JSON in one
`json.dumps` on the event loop (the endpoint until 2026-11-28), and `threaded`, what the endpoint
does now (the dump on the loop, `extproc.admin.api._dump_json` in a thread). Prints one JSON
object: per way the time to the answer and the longest the loop went without a turn for another
task (what a routing decision would have waited), lowest of the rounds, and the answer's size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from extproc.admin.api import _dump_json, _event_json
from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.types import BlocksStored, StoredBlocks, Worker

WORKERS = 16
CHAIN = 64


def router_with(entries: int) -> KvRouter:
    rng = random.Random(0)
    router = KvRouter(
        RouterConfig(block_size=16, use_kv_events=True),
        clock=lambda: 0.0,
        workers=[WorkerSpec(str(i)) for i in range(WORKERS)],
    )
    for w in range(WORKERS):
        for _ in range(entries // WORKERS // CHAIN):
            ids = [rng.getrandbits(63) for _ in range(CHAIN)]
            hashes = [rng.getrandbits(63) for _ in range(CHAIN)]
            router.apply_event(BlocksStored(Worker(str(w)), StoredBlocks(ids, hashes), None))
    return router


async def answer(router: KvRouter, threaded: bool) -> tuple[float, float, int]:
    """(seconds to the answer, the loop's longest turn, bytes) for one dump."""
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    events = router.dump_events()
    if threaded:
        body = await asyncio.to_thread(_dump_json, "m", events)
    else:
        body = json.dumps({"model": "m", "events": [_event_json(e) for e in events]})
    took = time.perf_counter() - start
    await asyncio.sleep(0.01)
    done = True
    await task
    return took, max(gaps), len(body)


async def run(entries: int, rounds: int) -> dict[str, object]:
    router = router_with(entries)
    best: dict[str, list[float]] = {}
    size = 0
    for r in range(rounds):
        for threaded in (r % 2 == 0, r % 2 == 1):
            took, longest, size = await answer(router, threaded)
            way = "threaded" if threaded else "inline"
            low = best.setdefault(way, [took, longest])
            best[way] = [min(low[0], took), min(low[1], longest)]
    return {
        "entries": entries,
        "megabytes": round(size / 1e6, 1),
        **{way: {"answer_s": round(t, 3), "longest_turn_s": round(g, 3)} for way, (t, g) in best.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1 << 20, help="(worker, block) entries in the tree")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.entries, args.rounds)), indent=2))


if __name__ == "__main__":
    main()
