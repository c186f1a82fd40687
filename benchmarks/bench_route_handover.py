"""What handing the routes over costs a replica's event loop (replica sync, `want_routes`).

    .venv/bin/python benchmarks/bench_route_handover.py                 # 100,000 homes and 100,000 pins
    .venv/bin/python benchmarks/bench_route_handover.py --routes 10000

Two pickers in one process, no NATS: the first keeps `--routes` stored answers' homes and as many
sticky-session pins (one model, 8 workers); its answer is made part by part as `ReplicaSync` makes it
(one part per turn of the event loop), and the second takes every part as its inbox would. Prints one
JSON object: the parts and bytes, and per part the time to make it (sender) and to take it (receiver),
median, 99th percentile and max, in ms, plus the totals. A loop turn holds at most one part: the max
is what a decision may wait behind (the first part of each table also copies the table's keys; a
full garbage collection of the growing tables shows in the receiver's max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from extproc.config import ModelConfig, PickerConfig, RouterConfig, WorkerConfig
from extproc.events.route_catchup import RoutesWanted, answer_stream, fill_from_answer
from extproc.picker.pipeline import EndpointPicker
from extproc.router.types import Worker

MODEL = "bench-model"


def config(workers: int, max_pins: int) -> PickerConfig:
    listed = tuple(WorkerConfig(f"w{i}", endpoint(i), MODEL) for i in range(workers))
    return PickerConfig(
        router=RouterConfig(use_kv_events=False), workers=listed, models=(ModelConfig(MODEL),),
        session_max_pins=max_pins, worker_session_control="off",
    )  # fmt: skip


def endpoint(i: int) -> str:
    return f"127.0.0.{i + 1}:8000"


def summary(times_s: list[float]) -> dict[str, float]:
    ms = sorted(t * 1e3 for t in times_s)
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "max_ms": round(ms[-1], 3),
        "total_ms": round(sum(ms), 1),
    }


async def run(routes: int, workers: int) -> dict[str, object]:
    sender = EndpointPicker(config(workers, routes))
    for i in range(routes):
        worker = Worker(f"w{i % workers}")
        sender.remember_response_home(
            f"resp_{i:032x}", MODEL, worker, f"127.0.0.{i % workers + 1}:8000", "local"
        )
        sender.remember_session_pin(f"session-{i:024x}", MODEL, worker, "local")
    stream = answer_stream(sender, "a", 1)
    made: list[float] = []
    parts: list[bytes] = []
    while True:
        start = time.perf_counter()
        payload = next(stream, None)
        made.append(time.perf_counter() - start)
        if payload is None:
            break
        parts.append(payload)
    receiver = EndpointPicker(config(workers, routes))
    wanted = RoutesWanted(5.0)
    wanted.ask("a", 0.0)
    taken: list[float] = []
    learned = 0
    for payload in parts:
        start = time.perf_counter()
        got = wanted.take(payload, 0.0)
        assert got is not None
        for item in got[1]:
            learned += fill_from_answer(receiver, item)
        taken.append(time.perf_counter() - start)
    return {
        "routes": 2 * routes,
        "learned": learned,
        "parts": len(parts),
        "megabytes": round(sum(map(len, parts)) / 1e6, 2),
        "send_per_part": summary(made),
        "receive_per_part": summary(taken),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", type=int, default=100_000, help="stored answers' homes, and as many pins")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.routes, args.workers)), indent=2))


if __name__ == "__main__":
    main()
