"""Tiered KV in replay: engines that offload evicted blocks to host memory, the router crediting those
blocks (Dynamo's host 0.75, disk 0.25) or dropping them (credit 0: what the picker did before).

Replays the shared Mooncake trace (REFERENCE section 6) through the simulated engines with a small
GPU pool, so that blocks are evicted, and a host tier per worker that keeps them
(`EngineConfig.num_host_blocks`; loading a block back costs 1 / `host_load_speedup` of computing it).
The engines report offloads and host evictions as vLLM's CPU offloading does (medium "CPU"); the
router indexes them per tier (extproc/router/tiers.py). Three replays side by side, one seed:

  no-host-tier   the same small pool without a host tier (the engines forget evicted blocks)
  tiers-dropped  host tier, router credit 0 for host and disk blocks
  tiers-credited host tier, Dynamo's credits

    .venv/bin/python benchmarks/bench_tiers.py                       # 8 workers, seed 0
    .venv/bin/python benchmarks/bench_tiers.py --gpu-blocks 1024 --host-blocks 8192 --router kv

Prints one JSON object (TTFT distribution, reuse = input tokens served from the GPU pool or the host
tier, the cost's router and the engine shape) and a markdown table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

if __package__ in (None, ""):
    _path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if _path not in sys.path:
        sys.path.insert(0, _path)
    _bench = os.path.dirname(os.path.abspath(__file__))
    if _bench not in sys.path:
        sys.path.insert(0, _bench)

from bench_router import DEFAULT_TRACE

from extproc.router.config import PrefillLoadModel, RouterConfig
from extproc.sim.engine import EngineConfig
from extproc.sim.replay import ReplayConfig, Replayer
from extproc.sim.replay_metrics import summarize
from extproc.sim.trace import load_mooncake

VARIANTS = ("no-host-tier", "tiers-dropped", "tiers-credited")
ROUTERS = {"kv": PrefillLoadModel.NONE, "kv-timing-learn": PrefillLoadModel.TIMING}


def replay_one(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    host = 0 if variant == "no-host-tier" else args.host_blocks
    engine = EngineConfig(
        num_gpu_blocks=args.gpu_blocks, num_host_blocks=host, host_load_speedup=args.host_load_speedup
    )
    router = RouterConfig(block_size=engine.block_size, prefill_load_model=ROUTERS[args.router])
    if variant == "tiers-dropped":
        router = replace(router, host_cache_hit_weight=0.0, disk_cache_hit_weight=0.0)
    requests = load_mooncake([args.trace], trace_block_size=512, speedup=args.speedup)
    result = Replayer(
        requests, ReplayConfig(args.workers, router=router, engine=engine, seed=args.seed)
    ).run()
    summary = summarize(result)
    return {
        "variant": variant,
        "ttft_ms": summary["ttft_ms"],
        "reuse": summary["reuse"],
        "preemptions": summary["engine"]["preemptions"],
        "kv_events": summary["engine"]["kv_events"],
        "wall_s": summary["wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--gpu-blocks", type=int, default=1024, help="GPU pool per worker (64-token blocks)")
    parser.add_argument("--host-blocks", type=int, default=8192, help="host tier per worker")
    parser.add_argument("--host-load-speedup", type=float, default=EngineConfig().host_load_speedup)
    parser.add_argument("--router", choices=sorted(ROUTERS), default="kv-timing-learn")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(replay_one, VARIANTS, [args] * len(VARIANTS)))
    base = runs[VARIANTS.index("tiers-dropped")]["ttft_ms"]["mean"]
    print("| variant | TTFT mean | p50 | p90 | p99 | mean / tiers-dropped | reuse |", file=sys.stderr)
    print("|---|---|---|---|---|---|---|", file=sys.stderr)
    for run in runs:
        t = run["ttft_ms"]
        print(
            f"| {run['variant']} | {t['mean']:.1f} | {t['p50']:.1f} | {t['p90']:.1f} | {t['p99']:.1f} | "
            f"{t['mean'] / base:.3f} | {run['reuse']:.3f} |",
            file=sys.stderr,
        )
    shape = {"workers": args.workers, "gpu_blocks": args.gpu_blocks, "host_blocks": args.host_blocks}
    out = {"router": args.router, "seed": args.seed, "speedup": args.speedup, **shape, "runs": runs}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
