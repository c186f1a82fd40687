"""Large request bodies and everyone else: does a burst of big, slow-to-parse bodies hold up small
requests? Through real Envoy and the picker (`python -m extproc serve`), issue 19.

    .venv/bin/python benchmarks/bench_big_bodies.py                      # both variants, before/after
    .venv/bin/python benchmarks/bench_big_bodies.py --variant buffered --count 12 --mib 3.9
    .venv/bin/python benchmarks/bench_big_bodies.py --variant duplex --count 20 --mib 15.5

Each run starts two echo workers (child processes running this script's `worker` command: they
hash the body, they do not parse it), the picker as a child process with `--body-parse-workers W`,
and Envoy. It sends `--count` chat bodies of `--mib` MiB at once, their bulk a deeply nested array
in an ignored field (legal JSON, about 1 s of parsing per 4 MiB on the event loop), and meanwhile
one small chat request every 50 ms. `W = 0` parses every body on the picker's event loop (what the
picker did before issue 19); `W = 1` (the default) parses bodies over 16 KiB in a worker process.
Prints one JSON object: per run, the small requests' statuses and latency (p50, p90, max), the big
ones' statuses and slowest answer, and the peak RSS of the picker process and of its parse workers.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from extproc.devstack.envoy_config import Variant, render_envoy_config
from extproc.devstack.procs import ManagedProcess, start_envoy
from extproc.runtime.ports_file import write_ports_file

MODEL = "demo-model"
MiB = 1024 * 1024
PROBE_EVERY_S = 0.05


def big_body(size_bytes: int, tag: int = 0) -> bytes:
    """A legal chat body of about `size_bytes`, its bulk many small nested arrays in an ignored field;
    bodies of different `tag`s differ before it (a parse worker reuses what a recent body shares)."""
    unit = "[" * 20 + "]" * 20
    junk = "[" + ",".join([unit] * (size_bytes // len(unit))) + "]"
    message = {"role": "user", "content": f"big {tag}"}
    head = json.dumps({"model": MODEL, "messages": [message], "max_tokens": 1})
    return (head[:-1] + ', "x": ' + junk + "}").encode()


def small_body(i: int) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"small {i}"}]}).encode()


async def serve_echo_worker(ports_file: str) -> None:
    """An upstream that hashes what it gets and does not parse it; runs until SIGTERM."""

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"body_len": len(body), "sha256": hashlib.sha256(body).hexdigest()})

    app = web.Application(client_max_size=64 * MiB)
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    write_ports_file(ports_file, {"port": runner.addresses[0][1]})
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


def start_echo_worker(log_dir: Path, name: str) -> ManagedProcess:
    ports = log_dir / f"{name}.ports.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "worker", "--ports-file", str(ports)]
    process = ManagedProcess(argv, log_path=log_dir / f"{name}.log", ports_file=ports).start()
    try:
        process.ports()
    except BaseException:
        process.stop(grace_s=1.0)
        raise
    return process


def start_picker(endpoints: list[str], workers: int, log_dir: Path, name: str) -> ManagedProcess:
    config = log_dir / f"{name}.yaml"
    entries = [{"id": f"w{i}", "endpoint": ep, "model": MODEL} for i, ep in enumerate(endpoints)]
    config.write_text(json.dumps({"workers": entries}))  # JSON is YAML
    ports = log_dir / f"{name}.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", "0",
        "--health-port", "0", "--ports-file", str(ports), "--body-parse-workers", str(workers),
        "--max-body-bytes", str(32 * MiB), "--kv-cache-block-size", "16", "--log-level", "warning",
    ]  # fmt: skip
    process = ManagedProcess(argv, log_path=log_dir / f"{name}.log", ports_file=ports).start()
    try:
        process.ports()
    except BaseException:
        process.stop(grace_s=1.0)
        raise
    return process


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


async def burst(url: str, picker_pid: int, *, count: int, size_bytes: int) -> dict[str, Any]:
    """Send `count` big bodies at once and a small request every PROBE_EVERY_S until they are answered."""
    bodies = [big_body(size_bytes, i) for i in range(count)]
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def send(data: bytes) -> tuple[int, float]:
            start = time.perf_counter()
            async with session.post(
                f"{url}/v1/chat/completions",
                data=io.BytesIO(data),
                headers={"content-type": "application/json"},
            ) as r:
                await r.read()
                return r.status, time.perf_counter() - start

        # warm up: the parse worker starts with the first large body
        await send(big_body(64 * 1024))
        picker_peak = worker_peak = 0.0
        bigs = [asyncio.ensure_future(send(body)) for body in bodies]
        smalls: list[asyncio.Future[tuple[int, float]]] = []
        i = 0
        while not all(b.done() for b in bigs):
            smalls.append(asyncio.ensure_future(send(small_body(i))))
            i += 1
            picker_peak = max(picker_peak, rss_mib(picker_pid))
            worker_peak = max([worker_peak, *(rss_mib(c) for c in children(picker_pid))])
            await asyncio.sleep(PROBE_EVERY_S)  # the probe's pace, not synchronisation
        big_results = [b.result() for b in bigs]
        small_results = await asyncio.gather(*smalls)
    small_latency = [s for _, s in small_results]
    return {
        "big": {
            "count": count,
            "mib": round(size_bytes / MiB, 2),
            "statuses": _count(s for s, _ in big_results),
            "slowest_s": round(max(s for _, s in big_results), 2),
        },
        "small": {
            "count": len(small_results),
            "statuses": _count(s for s, _ in small_results),
            "latency_p50_ms": round(statistics.median(small_latency) * 1000, 1),
            "latency_p90_ms": round(statistics.quantiles(small_latency, n=10)[-1] * 1000, 1),
            "latency_max_ms": round(max(small_latency) * 1000, 1),
        },
        "picker_rss_peak_mib": round(picker_peak),
        "parse_workers_rss_peak_mib": round(worker_peak),
    }


def _count(statuses: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in statuses:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return dict(sorted(counts.items()))


async def run(
    variant: Variant, parse_workers: int, *, count: int, mib: float, log_dir: Path
) -> dict[str, Any]:
    workers: list[ManagedProcess] = []
    picker = envoy = None
    try:
        for i in range(2):
            workers.append(start_echo_worker(log_dir, f"worker-{variant}-{parse_workers}-{i}"))
        endpoints = [f"127.0.0.1:{w.ports()['port']}" for w in workers]
        picker = start_picker(endpoints, parse_workers, log_dir, f"picker-{variant}-{parse_workers}")
        config = render_envoy_config(
            variant,
            picker_address=f"127.0.0.1:{picker.ports()['port']}",
            workers=endpoints,
            max_body_bytes=32 * MiB,
        )
        envoy = start_envoy(config, log_path=log_dir / f"envoy-{variant}-{parse_workers}.log")
        result = await burst(envoy.url, picker.pid, count=count, size_bytes=int(mib * MiB))
        return {"variant": variant, "body_parse_workers": parse_workers, **result}
    finally:
        if envoy is not None:
            envoy.stop()
        if picker is not None:
            picker.stop()
        for worker in workers:
            worker.stop()


async def main_async(args: argparse.Namespace) -> None:
    log_dir = Path(tempfile.mkdtemp(prefix="bench-big-bodies-"))
    plans: list[tuple[Variant, int, float]] = (
        [(args.variant, args.count, args.mib)]
        if args.variant
        else [("buffered", 12, 3.9), ("duplex", 20, 15.5)]
    )
    results = []
    for variant, count, mib in plans:
        for workers in args.workers:
            print(f"{variant}: {count} x {mib} MiB, --body-parse-workers {workers}", file=sys.stderr)
            results.append(await run(variant, workers, count=count, mib=mib, log_dir=log_dir))
    print(json.dumps({"runs": results, "logs": str(log_dir)}, indent=2))


def main() -> None:
    if sys.argv[1:2] == ["worker"]:  # an echo worker, started by `run`
        asyncio.run(serve_echo_worker(sys.argv[sys.argv.index("--ports-file") + 1]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", choices=["buffered", "duplex"], help="one variant (default: both)")
    parser.add_argument("--count", type=int, default=12, help="big bodies sent at once (with --variant)")
    parser.add_argument("--mib", type=float, default=3.9, help="size of each big body (with --variant)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[0, 1], help="--body-parse-workers values to compare"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
