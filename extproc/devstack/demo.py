"""`python -m extproc demo`: KV routing against round robin, through real Envoy, on loopback.

For each router mode it starts fresh mock workers (empty caches), the picker and Envoy, then
plays the same multi-turn chat traffic: sessions that share a few long system prompts and grow
their own history turn by turn. Per worker it reports requests, prefix-cache hit rate (cached
prompt tokens / prompt tokens, from the worker's `x-prefix-cache-hit-tokens` header) and TTFT
measured by the client, side by side.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from extproc.devstack.stack import MODEL, start_stack

# demo mode -> (picker flags, whether the mock workers publish KV events)
MODES: dict[str, tuple[tuple[str, ...], bool]] = {
    "kv": (("--router-mode", "kv"), True),  # exact: fed by the workers' ZMQ KV events
    "kv-predicted": (("--router-mode", "kv", "--no-kv-events"), False),  # predicted from decisions
    "round-robin": (("--router-mode", "round-robin"), False),
}


@dataclass
class Result:
    worker: str
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float
    status: int


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=4, help="mock workers (default: %(default)s)")
    parser.add_argument("--sessions", type=int, default=24, help="chat sessions (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=5, help="turns per session (default: %(default)s)")
    parser.add_argument(
        "--turn-tokens", type=int, default=800, help="tokens in each user message (default: %(default)s)"
    )
    parser.add_argument(
        "--system-prompts", type=int, default=4, help="distinct shared system prompts (default: %(default)s)"
    )
    parser.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=3000,
        help="length of each system prompt in tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="sessions in flight at once (default: %(default)s)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=24, help="tokens generated per turn (default: %(default)s)"
    )
    parser.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="mock workers' simulated-time speed-up (default: %(default)s)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="router modes to compare: kv (fed by the workers' KV events), kv-predicted (no events, cache "
        "predicted from routing decisions), round-robin (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="traffic seed (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    parser.add_argument(
        "--picker-log-level",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="the picker's log level; its log is picker.log under --log-dir/<mode> (default: %(default)s)",
    )
    parser.add_argument("--log-dir", help="keep process logs here (default: a temporary directory)")


def _text(rng: random.Random, n_chars: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "kv", "cache", "prefix", "token", "route", "envoy", "worker"]
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


async def _session(
    http: aiohttp.ClientSession, url: str, system: str, args: argparse.Namespace, rng: random.Random
) -> list[Result]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    results = []
    for _ in range(args.turns):
        messages.append({"role": "user", "content": _text(rng, args.turn_tokens)})
        body = {
            "model": MODEL,
            "messages": messages,
            "stream": True,
            "max_tokens": args.max_tokens,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        ttft = None
        answer = []
        prompt_tokens = 0
        async with http.post(f"{url}/v1/chat/completions", json=body) as response:
            async for line in response.content:
                if ttft is None:
                    ttft = (time.perf_counter() - start) * 1000
                if line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    prompt_tokens = (chunk.get("usage") or {}).get("prompt_tokens", prompt_tokens)
                    for choice in chunk.get("choices", []):
                        answer.append(choice.get("delta", {}).get("content") or "")
            results.append(
                Result(
                    worker=response.headers.get("x-worker-id", "?"),
                    prompt_tokens=prompt_tokens,
                    cached_tokens=int(response.headers.get("x-prefix-cache-hit-tokens", 0)),
                    ttft_ms=ttft or 0.0,
                    status=response.status,
                )
            )
        messages.append({"role": "assistant", "content": "".join(answer)})
    return results


async def _traffic(url: str, args: argparse.Namespace) -> list[Result]:
    rng = random.Random(args.seed)
    systems = [_text(random.Random(1000 + i), args.system_prompt_tokens) for i in range(args.system_prompts)]
    plan = [(systems[i % len(systems)], random.Random(rng.random())) for i in range(args.sessions)]
    gate = asyncio.Semaphore(args.concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(system: str, srng: random.Random) -> list[Result]:
            async with gate:
                return await _session(http, url, system, args, srng)

        batches = await asyncio.gather(*(one(s, r) for s, r in plan))
    return [r for batch in batches for r in batch]


def _summarise(results: list[Result]) -> dict[str, Any]:
    per_worker: dict[str, Any] = {}
    for worker in sorted({r.worker for r in results}):
        rs = [r for r in results if r.worker == worker]
        per_worker[worker] = _stats(rs)
    return {"workers": per_worker, "total": _stats(results)}


def _stats(rs: list[Result]) -> dict[str, Any]:
    prompt = sum(r.prompt_tokens for r in rs)
    ttfts = sorted(r.ttft_ms for r in rs)
    return {
        "requests": len(rs),
        "errors": sum(1 for r in rs if r.status != 200),
        "prefix_cache_hit_rate": round(sum(r.cached_tokens for r in rs) / prompt, 3) if prompt else 0.0,
        "ttft_mean_ms": round(statistics.fmean(ttfts), 1) if ttfts else 0.0,
        "ttft_p90_ms": round(ttfts[min(len(ttfts) - 1, round(0.9 * (len(ttfts) - 1)))], 1) if ttfts else 0.0,
    }


def _run_mode(mode: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    picker_args, kv_events = MODES[mode]
    stack = start_stack(
        log_dir / mode,
        workers=args.workers,
        picker_args=[*picker_args, "--log-level", args.picker_log_level],
        speedup=args.speedup,
        kv_events=kv_events,
    )
    try:
        print(
            f"[{mode}] {args.sessions} sessions x {args.turns} turns through Envoy at {stack.url} ...",
            file=sys.stderr,
            flush=True,
        )
        results = asyncio.run(_traffic(stack.url, args))
    finally:
        stack.stop()
    return _summarise(results)


def _table(summaries: dict[str, dict[str, Any]]) -> str:
    modes = list(summaries)
    workers = sorted({w for s in summaries.values() for w in s["workers"]})
    header = f"{'worker':<8}" + "".join(f" | {m:^34}" for m in modes)
    sub = f"{'':<8}" + "".join(f" | {'reqs':>5} {'hit rate':>9} {'TTFT mean':>9} {'p90':>7}" for _ in modes)
    lines = [header, sub, "-" * len(sub)]
    for w in [*workers, "total"]:
        row = f"{w:<8}"
        for m in modes:
            s = summaries[m]["total"] if w == "total" else summaries[m]["workers"].get(w)
            if s is None:
                row += f" | {'-':>5} {'-':>9} {'-':>9} {'-':>7}"
            else:
                row += (
                    f" | {s['requests']:>5} {s['prefix_cache_hit_rate'] * 100:>8.1f}%"
                    f" {s['ttft_mean_ms']:>7.1f}ms {s['ttft_p90_ms']:>5.0f}ms"
                )
        lines.append(row)
    return "\n".join(lines)


def run_modes(modes: list[str], args: argparse.Namespace, log_dir: Path) -> dict[str, dict[str, Any]]:
    """Play the same traffic against a fresh stack per mode; per-mode summaries (logs in log_dir/<mode>)."""
    return {mode: _run_mode(mode, args, log_dir) for mode in modes}


def run_demo(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        print(f"unknown demo mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="extproc-demo-") as tmp:
        summaries = run_modes(modes, args, Path(args.log_dir or tmp))
    if args.json:
        print(
            json.dumps(
                {"config": {k: v for k, v in vars(args).items() if k != "func"}, "modes": summaries}, indent=2
            )
        )
    else:
        print(_table(summaries))
    return 0 if all(s["total"]["errors"] == 0 for s in summaries.values()) else 1
