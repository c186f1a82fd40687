"""What a KV event over NATS costs a picker that is not routing, by `--nats-read-delay-ms`.

Real processes on 127.0.0.1, stopped by pid: a nats-server and one `extproc serve` picker (four
configured workers, KV events from NATS, no traffic to route) per delay. This process publishes
Dynamo JSON KV events of four workers on the picker's subject, as engines do: bursts of 1-3 events
(stored chains of 16-32 blocks and removals of them), at `--rates` events per second in all; the
same schedule for every delay, the delays alternated over `--rounds`. CPU is user+sys of the
picker process from /proc/<pid>/stat over the window, minus its idle rate; per event applied.
Prints one JSON object (progress on stderr).

    .venv/bin/python benchmarks/bench_nats_reads.py --quick     # about 1.5 minutes
    .venv/bin/python benchmarks/bench_nats_reads.py --delays 0,20,50 --rates 130,520 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: E402
import bench_replicas as replicas  # noqa: E402
import nats  # noqa: E402

from extproc.devstack.procs import start_nats_server  # noqa: E402
from extproc.events.dynamo_json import encode_event, kv_events_subject  # noqa: E402
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker  # noqa: E402

WORKERS = 4


def schedule(rate: float, seconds: float, seed: int) -> list[tuple[float, list[bytes]]]:
    """(send time, a burst of payloads): stored chains and, later, their removal, per worker."""
    rng = random.Random(seed)
    next_id = [0] * WORKERS
    stored: list[list[list[int]]] = [[] for _ in range(WORKERS)]
    out: list[tuple[float, list[bytes]]] = []
    t = 0.0
    while t < seconds:
        burst = []
        for _ in range(rng.randint(1, 3)):
            w = rng.randrange(WORKERS)
            if stored[w] and rng.random() < 0.45:
                hashes = stored[w].pop(0)
                event: Any = BlocksRemoved(Worker(str(w)), tuple(hashes))
            else:
                hashes = [rng.getrandbits(63) for _ in range(rng.randint(16, 32))]
                stored[w].append(hashes)
                event = BlocksStored(Worker(str(w)), tuple(StoredBlock(h, h) for h in hashes), None)
            burst.append(encode_event(100 + w, event, next_id[w], 0))
            next_id[w] += 1
        out.append((t, burst))
        t += rng.expovariate(rate / 2)  # 2 events per burst on average
    return out


async def measure(delay_ms: float, rate: float, args: argparse.Namespace, nats_url: str, tmp: Path) -> dict:
    stage = tmp / f"d{delay_ms:g}-r{rate:g}-{time.monotonic_ns()}"
    stage.mkdir()

    class Worker_:
        def __init__(self, i: int) -> None:
            self.name = f"w{i}"
            self.ports = {"port": 1}  # never routed to

    workers: Any = [Worker_(i) for i in range(WORKERS)]
    config = replicas.write_config(workers, stage / "picker.yaml")
    picker = replicas.start_picker(
        "r0",
        config,
        nats_url,
        stage,
        sync=False,
        repo=REPO_ROOT,
        extra=["--nats-read-delay-ms", str(delay_ms)],
    )
    try:
        picker.ports = picker.process.ports(30.0)
        plan = schedule(rate, args.seconds, args.seed)
        events = sum(len(b) for _, b in plan)
        nc = await nats.connect(nats_url)
        subject = kv_events_subject(replicas.NAMESPACE, "backend")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await replicas.wait_ready(http, picker)
            idle0 = replicas.cpu_s(picker.pid)
            await asyncio.sleep(args.idle_s)
            idle_rate = (replicas.cpu_s(picker.pid) - idle0) / args.idle_s
            c0 = (await replicas.counters(http, picker)).get("nats.event", 0)
            cpu0, t0 = replicas.cpu_s(picker.pid), time.monotonic()
            for at, burst in plan:
                wait = at - (time.monotonic() - t0)
                if wait > 0:
                    await asyncio.sleep(wait)
                for payload in burst:
                    await nc.publish(subject, payload)
                await nc.flush()
            await asyncio.sleep(0.2 + delay_ms / 1000)
            wall = time.monotonic() - t0
            cpu = replicas.cpu_s(picker.pid) - cpu0 - idle_rate * wall
            applied = (await replicas.counters(http, picker)).get("nats.event", 0) - c0
        await nc.close()
        return {"events": events, "applied": applied, "us_per_event": round(1e6 * cpu / max(applied, 1), 1)}
    finally:
        picker.stop()


async def amain(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    server = start_nats_server(None, jetstream=False, store_dir=tmp / "nats")
    runs: dict[str, dict[str, list[float]]] = {}
    try:
        for round_ in range(args.rounds):
            for rate in args.rates:
                for delay in args.delays:
                    result = await measure(delay, rate, args, server.url, tmp)
                    key = f"{rate:g}/s"
                    runs.setdefault(key, {}).setdefault(f"{delay:g}ms", []).append(result["us_per_event"])
                    replicas.log(f"round {round_ + 1}: {rate:g} events/s, delay {delay:g} ms: {result}")
    finally:
        server.stop(grace_s=2.0)
    medians = {rate: {d: statistics.median(v) for d, v in by.items()} for rate, by in runs.items()}
    base = f"{args.delays[0]:g}ms"
    return {
        "config": {k: v for k, v in vars(args).items()},
        "us_per_event_runs": runs,
        "us_per_event_median": medians,
        f"ratio_to_{base}": {
            rate: {d: round(v / by[base], 2) for d, v in by.items()} for rate, by in medians.items()
        },
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s windows, two rounds")
    parser.add_argument("--delays", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 50.0],
                        help="--nats-read-delay-ms values, the first the ratios' base (0,50)")  # fmt: skip
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[130.0, 520.0],
                        help="KV events per second, all workers (130,520)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="measured window per run")
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.seconds = args.seconds or (10.0 if args.quick else 20.0)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-nats-reads-"))
    try:
        report = asyncio.run(amain(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
