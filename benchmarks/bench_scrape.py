"""What scraping the engines' metrics costs a picker, per worker and per second, as the fleet grows.

The picker reads every worker's Prometheus endpoint once a second by default
(`--engine-metrics-interval-ms`), so this background cost grows with the fleet whether or not
anything is routed. A child process (stopped by pid) serves `--endpoints` metrics endpoints on
127.0.0.1, each answering with a real engine's exposition text (the fixtures generated from vLLM
0.33.0's and SGLang 0.5.23's own metric code, `tests/runtime/engine_metrics/`); this process runs the
picker's `EngineMetricsScraper` over them for `--rounds` rounds and reads its own CPU time
(`time.process_time`, all of it the scraper's: nothing else runs here).

Also, in the same run, what parsing one body costs: the parser as it is, against one pass of its
pattern over every line (how it parsed before), so the ratio holds on a noisy host. Prints one JSON
object on stdout (progress on stderr).

    .venv/bin/python benchmarks/bench_scrape.py                  # about 20 seconds
    .venv/bin/python benchmarks/bench_scrape.py --endpoints 256 --body sglang-0.5.23/default
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from aiohttp import web  # noqa: E402

from extproc.config import EngineMetricsConfig, WorkerConfig  # noqa: E402
from extproc.router import KvRouter, RouterConfig, WorkerSpec  # noqa: E402
from extproc.runtime import engine_metrics  # noqa: E402
from extproc.runtime.engine_metrics import EngineMetricsScraper, parse_engine_metrics  # noqa: E402

FIXTURES = REPO_ROOT / "tests" / "runtime" / "engine_metrics"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def serve(body: bytes, endpoints: int) -> None:
    """The child: `endpoints` HTTP servers on 127.0.0.1 answering GET /metrics with `body`; their
    ports go to stdout as one JSON line, then it serves until killed."""
    app = web.Application()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports = []
    for _ in range(endpoints):
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


class _Pool:
    def __init__(self, workers: Mapping[str, WorkerConfig], router: KvRouter) -> None:
        self.workers, self.router = workers, router

    def all_workers(self) -> Mapping[str, WorkerConfig]:
        return self.workers

    def router_for(self, worker: WorkerConfig) -> KvRouter:
        return self.router


class _Target:
    def __init__(self, pool: _Pool) -> None:
        self.pools = {"bench": pool}


async def scrape(ports: list[int], rounds: int) -> dict[str, Any]:
    workers = {
        f"w{i}": WorkerConfig(id=f"w{i}", endpoint=f"127.0.0.1:{port}", model="bench")
        for i, port in enumerate(ports)
    }
    router = KvRouter(
        RouterConfig(block_size=16), workers=[WorkerSpec(w) for w in workers], clock=time.monotonic
    )
    scraper = EngineMetricsScraper(_Target(_Pool(workers, router)), EngineMetricsConfig())
    try:
        await scraper.scrape_once()  # connections opened, code warmed
        failed = [s.url for s in (scraper.state(w) for w in workers.values()) if s is None or not s.ok]
        if failed:
            raise SystemExit(f"scrapes failed: {failed[:3]}")
        started, wall = time.process_time(), time.monotonic()
        for _ in range(rounds):
            await scraper.scrape_once()
        cpu = time.process_time() - started
        wall = time.monotonic() - wall
    finally:
        await scraper.stop()
    per_scrape = cpu / rounds / len(ports)
    return {
        "us_cpu_per_scrape": round(1e6 * per_scrape, 1),
        "ms_per_round": round(1e3 * wall / rounds, 2),
        # at the default interval (1 s): the share of one core the scraper takes, per 1,000 workers
        "core_share_per_1000_workers_at_1s": round(1000 * per_scrape / EngineMetricsConfig().interval_s, 3),
    }


def parse_us(body: bytes, seconds: float = 1.0) -> dict[str, float]:
    """One body parsed: the parser now, and one pass of its pattern over every line (before)."""

    def one_pass(data: bytes) -> list[tuple[bytes | None, ...]]:
        return [m.groups() for m in engine_metrics._SAMPLE.finditer(data)]

    out = {}
    for name, fn in (("now", parse_engine_metrics), ("one_pattern_pass_only", one_pass)):
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            fn(body)
            n += 1
        out[name] = round(1e6 * (time.perf_counter() - started) / n, 1)
    out["ratio"] = round(out["now"] / out["one_pattern_pass_only"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=64, help="metrics endpoints scraped each round")
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds (after one to warm up)")
    parser.add_argument(
        "--body",
        default="vllm-0.33.0/single-engine",
        help="the fixture each endpoint serves (tests/runtime/engine_metrics/<BODY>.prom)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    body_path = FIXTURES / f"{args.body}.prom"
    if not body_path.is_file():
        parser.error(f"no fixture {body_path}")
    body = body_path.read_bytes()
    if args.serve:
        asyncio.run(serve(body, args.endpoints))
        return
    argv = [sys.executable, __file__, "--serve", "--endpoints", str(args.endpoints), "--body", args.body]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())
        log(f"scraping {len(ports)} endpoints ({args.body}, {len(body):,} bytes) for {args.rounds} rounds")
        scraping = asyncio.run(scrape(ports, args.rounds))
    finally:
        child.kill()
        child.wait()
    log("parsing one body")
    out = {
        "config": {
            "endpoints": args.endpoints,
            "rounds": args.rounds,
            "body": args.body,
            "body_bytes": len(body),
        },
        "scrape": scraping,
        "parse_us": parse_us(body),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
