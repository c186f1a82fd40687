"""Admission queue under overload: TTFT with and without `--router-queue-threshold` at the same
offered load, through real Envoy, the picker (`python -m extproc serve`) and mock workers.

    .venv/bin/python benchmarks/bench_queue.py --quick    # 150 requests, about 40 s
    .venv/bin/python benchmarks/bench_queue.py            # 400 requests, about 1 minute

Each mode starts its own stack (2 mock workers at --speedup, KV events off, Envoy buffered) and
sends the same open-loop Poisson schedule: --requests streaming chat requests at --rate req/s
(above what two workers sustain, so work piles up somewhere), prompts of 500 / 2,000 / 6,000
tokens, and 10% "interactive" requests marked `nvext.agent_hints.priority = 1`. Modes:
- `no-queue`: requests go straight to a worker and wait in the engine's FIFO queue;
- `queue-fcfs`: the picker holds requests while every worker has more than one batch
  (threshold 1.0 x max_num_batched_tokens) of prompt tokens in prefill, and routes them in arrival
  order (priority class first) with the load of the moment;
- `queue-wspt`: the same, shortest uncached prompt first.
TTFT is measured by the client from sending to the first streamed byte. Prints one JSON object:
per mode, TTFT mean/p50/p90/p99 overall and per class, errors, and wall time. Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import machine_environment

from extproc.devstack.stack import MODEL, start_stack

MODES: dict[str, list[str]] = {
    "no-queue": [],
    "queue-fcfs": ["--router-queue-threshold", "1.0", "--router-queue-policy", "fcfs"],
    "queue-wspt": ["--router-queue-threshold", "1.0", "--router-queue-policy", "wspt"],
}
PROMPT_TOKENS = (500, 2000, 6000)


def schedule(n: int, rate: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t = 0.0
    plan = []
    for i in range(n):
        t += rng.expovariate(rate)
        size = rng.choice(PROMPT_TOKENS)
        interactive = rng.random() < 0.1
        text = "".join(rng.choice("abcdefghij ") for _ in range(size))  # byte tokenizer: 1 token/char
        plan.append({"at": t, "id": i, "text": text, "interactive": interactive, "size": size})
    return plan


async def run_plan(url: str, plan: list[dict[str, Any]], max_tokens: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=300)
    start = time.perf_counter()
    done = 0

    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one(item: dict[str, Any]) -> None:
            nonlocal done
            await asyncio.sleep(max(0.0, item["at"] - (time.perf_counter() - start)))  # open-loop arrivals
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": [{"role": "user", "content": item["text"]}],
                "stream": True,
                "max_tokens": max_tokens,
            }
            if item["interactive"]:
                body["nvext"] = {"agent_hints": {"priority": 1}}
            sent = time.perf_counter()
            ttft = None
            try:
                async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                    async for _ in r.content.iter_any():
                        if ttft is None:
                            ttft = (time.perf_counter() - sent) * 1000
                    status = r.status
            except aiohttp.ClientError:
                status = -1
            results.append({**item, "status": status, "ttft_ms": ttft})
            done += 1
            if done % 50 == 0:
                print(f"  {done}/{len(plan)} answered", file=sys.stderr, flush=True)

        await asyncio.gather(*(one(item) for item in plan))
    return results


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))], 1)

    return {"n": len(v), "mean": round(statistics.fmean(v), 1), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def summarise(results: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r["status"] == 200 and r["ttft_ms"] is not None]
    return {
        "wall_s": round(wall_s, 1),
        "errors": len(results) - len(ok),
        "ttft_ms": stats([r["ttft_ms"] for r in ok]),
        "ttft_ms_interactive": stats([r["ttft_ms"] for r in ok if r["interactive"]]),
        "ttft_ms_batch": stats([r["ttft_ms"] for r in ok if not r["interactive"]]),
        "ttft_ms_by_prompt": {
            str(s): stats([r["ttft_ms"] for r in ok if r["size"] == s]) for s in PROMPT_TOKENS
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument(
        "--rate", type=float, default=12.0, help="offered load, requests/s (default %(default)s)"
    )
    parser.add_argument(
        "--speedup", type=float, default=4.0, help="mock worker speedup (default %(default)s)"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--quick", action="store_true", help="150 requests")
    args = parser.parse_args()
    n = 150 if args.quick else args.requests
    plan = schedule(n, args.rate, args.seed)
    out: dict[str, Any] = {
        "benchmark": "bench_queue",
        "environment": machine_environment(),
        "requests": n,
        "rate_per_s": args.rate,
        "speedup": args.speedup,
        "workers": 2,
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-queue-") as tmp:
        for mode in args.modes.split(","):
            print(f"[{mode}] {n} requests at {args.rate}/s ...", file=sys.stderr, flush=True)
            stack = start_stack(
                Path(tmp) / mode,
                workers=2,
                speedup=args.speedup,
                kv_events=False,
                picker_args=[*MODES[mode], "--router-queue-max-wait-ms", "120000", "--log-level", "warning"],
            )
            try:
                t0 = time.perf_counter()
                results = asyncio.run(run_plan(stack.url, plan, args.max_tokens))
                out["modes"][mode] = summarise(results, time.perf_counter() - t0)
            finally:
                stack.stop()
    base = out["modes"].get("no-queue", {}).get("ttft_ms", {})
    for summary in out["modes"].values():
        if base and summary.get("ttft_ms"):
            summary["p99_ratio_vs_no_queue"] = round(summary["ttft_ms"]["p99"] / base["p99"], 3)
            inter, base_inter = (
                summary["ttft_ms_interactive"],
                out["modes"]["no-queue"]["ttft_ms_interactive"],
            )
            if inter and base_inter:
                summary["interactive_p99_ratio_vs_no_queue"] = round(inter["p99"] / base_inter["p99"], 3)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
