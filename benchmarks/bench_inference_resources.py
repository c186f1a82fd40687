"""What reading `--inference-resources` again costs routing: the event loop's longest wait while a
changed file is read.

    .venv/bin/python benchmarks/bench_inference_resources.py              # about 30 s
    .venv/bin/python benchmarks/bench_inference_resources.py --objectives 100,1000

Files of `--objectives` InferenceObjectives (and one InferenceModelRewrite per ten), one process,
no HTTP. Per size, alternating over `--rounds`: `inline`, the file read on the event loop with
PyYAML's Python reader (how the picker read it when the feature came, 2026-11-28), and
`threaded`, what `ResourceFile` does now (libyaml's reader, in a thread, the last reading serving
meanwhile). Prints one JSON object: per size and way the time until the new reading is in use and
the longest the loop went without a turn for another task (what a routing decision would have
waited), lowest of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from extproc.config import inference_extension
from extproc.config.inference_extension import Pool, read_resources
from extproc.picker.inference_extension import ResourceFile

RULES = "  - matches:\n    - model: {value: m}\n    targets:\n    - {modelRewrite: a, weight: 10}\n"


def document(objectives: int) -> str:
    docs = []
    for i in range(objectives):
        docs.append(
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"
            f"metadata:\n  name: objective-{i}\nspec:\n  priority: {i % 7 - 1}\n"
            "  poolRef:\n    group: inference.networking.k8s.io\n    name: pool\n"
        )
        if i % 10 == 0:
            docs.append(
                "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModelRewrite\n"
                f"metadata:\n  name: rewrite-{i}\nspec:\n  poolRef:\n    name: pool\n  rules:\n{RULES}"
            )
    return "---\n".join(docs)


async def longest_turn(work: Callable[[], bool]) -> tuple[float, float]:
    """(seconds until `work()` says done, the loop's longest turn meanwhile); `work` is polled."""
    longest, last = 0.0, time.perf_counter()
    start = last
    while not work():
        await asyncio.sleep(0)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return time.perf_counter() - start, longest


async def one_round(path: Path, text: str, way: str) -> tuple[float, float]:
    path.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    file = ResourceFile(
        str(path), Pool(), read_resources(str(path), Pool()), clock=time.monotonic, check_every_s=0
    )
    path.write_text(text)
    if way == "inline":  # the first version: PyYAML's Python reader, on the loop, which waits for all of it
        saved, inference_extension._LOADER = inference_extension._LOADER, yaml.SafeLoader
        try:
            start = time.perf_counter()
            read_resources(str(path), Pool())
            took = time.perf_counter() - start
        finally:
            inference_extension._LOADER = saved
        return took, took
    readings = file.readings
    file.priority("objective-0")  # notices the change: the read starts in a thread
    return await longest_turn(lambda: file.readings > readings)


async def main(sizes: list[int], rounds: int) -> dict[str, object]:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resources.yaml"
        for size in sizes:
            text = document(size)
            best: dict[str, list[float]] = {}
            for _ in range(rounds):
                for way in ("inline", "threaded"):
                    seconds, longest = await one_round(path, text, way)
                    kept = best.setdefault(way, [seconds, longest])
                    best[way] = [min(kept[0], seconds), min(kept[1], longest)]
            results[str(size)] = {
                "bytes": len(text.encode()),
                **{
                    way: {"seconds_to_use": round(s, 4), "loop_longest_turn_s": round(t, 4)}
                    for way, (s, t) in best.items()
                },
            }
    return {"benchmark": "inference_resources_reload", "rounds": rounds, "objectives": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--objectives", default="100,1000,4400", help="comma-separated file sizes")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.objectives.split(",")]
    print(json.dumps(asyncio.run(main(sizes, args.rounds)), indent=2))
