"""Routing quality on a trace: routers x workers x arrival speed x seeds, replayed in virtual time.

Every replay runs the shared Mooncake trace (REFERENCE section 6) through simulated engines and the
real `KvRouter` (`extproc.sim.replay`). Routers:

  round-robin   the calibration baseline (deterministic: one seed)
  random        uniform choice
  kv            Dynamo's cost (--router-prefill-load-model none): prefill blocks + decode blocks,
                prompt load static until first token
  kv-timing     --router-prefill-load-model timing --no-router-learn-prefill-timing: predicted time
                to first token per worker from the configured pass-time model alone
  kv-timing-learn  kv mode's default: the same, each worker's pass-time scale learned online from
                its first tokens, pooled over the fleet (RouterConfig.learn_prefill_timing)
  kv-aic        --router-prefill-load-model aic --no-router-learn-prefill-timing: Dynamo's cost, only
                the oldest active prefill per worker decaying over its predicted duration

`--worker-speed 1,1,0.5,...` replays a mixed fleet (one speed per worker, for one worker count);
`--replicas N --replica-sync-lag-ms L` spreads arrivals over N routers sharing in-flight load
through the replica-sync model (`extproc.sim.replay_replicas`), each receiving every KV event.
`--arrival-jitter-ms 1` delays each arrival by up to 1 ms, drawn per seed: a replay is chaotic (one
tie broken otherwise changes every later decision), so a policy that draws nothing at random replays
one trajectory whatever its seed, and one trajectory is one draw from a spread of several ms (the
default's seeds 0-9 span 2.7 ms at 8 workers 1x, 5.2 at 4 workers); with jitter its seeds show the
spread, and a change is judged by the means of many seeds.

Prints one JSON object on stdout (progress on stderr) and writes, under --out-dir, a markdown
table (`quality.md`), the JSON (`quality.json`) and a plot (`quality.png`). With --calibrate it
also replays round robin at 4x and compares every round-robin cell with REFERENCE section 6's
published figures. The "pooled bound" is a perfect router's TTFT at 1x: one LRU cache as large
as all workers together, every request alone on an idle worker (no queueing at all).

    .venv/bin/python benchmarks/bench_quality.py                     # 3 seeds, about 5 minutes on 2 CPUs
    .venv/bin/python benchmarks/bench_quality.py --calibrate --seeds 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    _path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if _path not in sys.path:
        sys.path.insert(0, _path)
    _bench = os.path.dirname(os.path.abspath(__file__))
    if _bench not in sys.path:
        sys.path.insert(0, _bench)

from bench_router import DEFAULT_TRACE, machine_environment

from extproc.router.config import PrefillLoadModel, RouterConfig, RouterMode
from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.sim.engine import EngineConfig
from extproc.sim.replay import ReplayConfig, Replayer, kv_router_factory
from extproc.sim.replay_metrics import summarize
from extproc.sim.replay_replicas import ReplicaAssignment, replicated_router_factory
from extproc.sim.timing import prefill_ms
from extproc.sim.trace import jitter_arrivals, load_mooncake

ROUTERS: dict[str, dict[str, Any]] = {
    "round-robin": {"mode": RouterMode.ROUND_ROBIN},
    "random": {"mode": RouterMode.RANDOM},
    "kv": {"mode": RouterMode.KV, "prefill_load_model": PrefillLoadModel.NONE},
    "kv-timing": {
        "mode": RouterMode.KV,
        "prefill_load_model": PrefillLoadModel.TIMING,
        "learn_prefill_timing": False,
    },
    "kv-timing-learn": {
        "mode": RouterMode.KV,
        "prefill_load_model": PrefillLoadModel.TIMING,
        "learn_prefill_timing": True,
    },
    "kv-aic": {  # Dynamo's aic, each prefill's duration from the configured pass-time model (not learned)
        "mode": RouterMode.KV,
        "prefill_load_model": PrefillLoadModel.AIC,
        "learn_prefill_timing": False,
    },
}
DETERMINISTIC = {"round-robin"}

# REFERENCE section 6: Dynamo 1.6.1's mocker on the shared trace (TTFT ms; reuse).
REFERENCE_ROUND_ROBIN = {
    (4, 1.0): {"mean": 365.2, "p50": 233.0, "p90": 881.6, "p99": 2110.0, "reuse": 0.120},
    (8, 1.0): {"mean": 301.5, "p50": 136.6, "p90": 790.5, "p99": 1435.1, "reuse": 0.112},
    (4, 4.0): {"mean": 26_753.0, "p99": 82_719.0},
    (8, 4.0): {"mean": 653.5, "p99": 4_199.0},
}
DYNAMO_KV = {  # Dynamo's KV router: REFERENCE section 6 (1x) and issue 10 (2x)
    (4, 1.0): {"mean": 243.4, "p50": 47.8, "p90": 721.4, "p99": 1213.0, "reuse": 0.309},
    (8, 1.0): {"mean": 171.2, "p50": 27.4, "p90": 545.8, "p99": 1133.3, "reuse": 0.503},
    (4, 2.0): {"mean": 323.3, "reuse": 0.254},
    (8, 2.0): {"mean": 191.8, "reuse": 0.454},
}
TARGETS = {(8, 1.0): 163.0, (4, 1.0): 231.0, (8, 2.0): 172.6, (4, 2.0): 291.0}  # issue 10, TTFT mean ms


@dataclass(frozen=True, slots=True)
class Job:
    trace: str
    router: str
    workers: int
    speedup: float
    seed: int
    worker_speeds: tuple[float, ...] = ()
    replicas: int = 1
    replica_sync_lag_ms: float = 0.0
    replica_assignment: str = "round-robin"
    arrival_jitter_ms: float = 0.0


def replay_one(job: Job) -> dict[str, Any]:
    """One replay in a worker process; returns its summary (without per-request records)."""
    requests = load_mooncake([job.trace], trace_block_size=512, speedup=job.speedup)
    requests = jitter_arrivals(requests, job.arrival_jitter_ms, job.seed)
    engine = EngineConfig()
    config = ReplayConfig(
        job.workers,
        router=RouterConfig(block_size=engine.block_size, **ROUTERS[job.router]),
        engine=engine,
        seed=job.seed,
        worker_speeds=job.worker_speeds,
    )
    factory = kv_router_factory
    if job.replicas > 1:
        factory = replicated_router_factory(
            job.replicas, job.replica_sync_lag_ms, ReplicaAssignment(job.replica_assignment)
        )
    result = Replayer(requests, config, router_factory=factory).run()
    summary = summarize(result)
    return {
        "router": job.router,
        "workers": job.workers,
        "speedup": job.speedup,
        "seed": job.seed,
        "summary": summary,
    }


def pooled_bound(trace: str, workers: int) -> dict[str, float]:
    """A perfect router's TTFT at 1x: one LRU cache of `workers` pools, each request prefilled alone."""
    engine = EngineConfig()
    bs, budget = engine.block_size, engine.max_num_batched_tokens
    capacity = workers * engine.num_gpu_blocks
    lru: OrderedDict[int, None] = OrderedDict()
    total_ms = 0.0
    hit = 0
    tokens_in = 0
    requests = load_mooncake([trace], trace_block_size=512)
    for r in requests:
        tokens = r.token_ids()
        hashes = compute_sequence_hashes(compute_block_hashes(tokens, bs))
        cached = 0
        for h in hashes[: (len(tokens) - 1) // bs]:
            if h not in lru:
                break
            cached += bs
        left = len(tokens) - cached
        while left > 0:
            chunk = min(left, budget)
            total_ms += prefill_ms(chunk)
            left -= chunk
        hit += cached
        tokens_in += len(tokens)
        for h in reversed(hashes):  # the head ends most recently used, as tail-first release leaves it
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity:
            lru.popitem(last=False)
    return {"ttft_mean_ms": total_ms / len(requests), "reuse": hit / tokens_in}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of the headline figures, with every seed's TTFT mean."""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    s = [r["summary"] for r in runs]
    return {
        "seeds": [r["seed"] for r in runs],
        "ttft_mean_ms": mean([x["ttft_ms"]["mean"] for x in s]),
        "ttft_p50_ms": mean([x["ttft_ms"]["p50"] for x in s]),
        "ttft_p90_ms": mean([x["ttft_ms"]["p90"] for x in s]),
        "ttft_p99_ms": mean([x["ttft_ms"]["p99"] for x in s]),
        "ttft_mean_per_seed": [round(x["ttft_ms"]["mean"], 2) for x in s],
        "ttft_mean_spread_ms": max(x["ttft_ms"]["mean"] for x in s) - min(x["ttft_ms"]["mean"] for x in s),
        "itl_mean_ms": mean([x["itl_ms"]["mean"] for x in s]),
        "e2e_mean_ms": mean([x["e2e_ms"]["mean"] for x in s]),
        "reuse": mean([x["reuse"] for x in s]),
        "overlap_chosen_over_best": mean([x["overlap"]["chosen_over_best"] for x in s]),
        "imbalance_max_over_mean": mean([x["imbalance"]["max_over_mean"] for x in s]),
        "wall_s": mean([x["wall_s"] for x in s]),
    }


def calibration(cells: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for (workers, speedup), ref in REFERENCE_ROUND_ROBIN.items():
        cell = cells.get(f"{workers}w-{speedup:g}x", {}).get("round-robin")
        if cell is None:
            continue
        ours = {
            "mean": cell["ttft_mean_ms"],
            "p50": cell["ttft_p50_ms"],
            "p90": cell["ttft_p90_ms"],
            "p99": cell["ttft_p99_ms"],
            "reuse": cell["reuse"],
        }
        row = {"workers": workers, "speedup": speedup}
        for key, value in ref.items():
            row[key] = {"ours": round(ours[key], 4), "reference": value, "error": ours[key] / value - 1}
        out.append(row)
    return out


def verdicts(cells: dict[str, Any], router: str) -> list[dict[str, Any]]:
    out = []
    for (workers, speedup), target in TARGETS.items():
        cell = cells.get(f"{workers}w-{speedup:g}x", {}).get(router)
        if cell is None:
            continue
        dyn = DYNAMO_KV[(workers, speedup)]
        out.append(
            {
                "cell": f"{workers}w-{speedup:g}x",
                "router": router,
                "ttft_mean_ms": round(cell["ttft_mean_ms"], 2),
                "target_ms": target,
                "dynamo_ms": dyn["mean"],
                "reuse": round(cell["reuse"], 4),
                "dynamo_reuse": dyn["reuse"],
                "meets_target": cell["ttft_mean_ms"] <= target and cell["reuse"] >= dyn["reuse"],
            }
        )
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Routing quality on `{Path(doc['trace']).name}`",
        "",
        f"Mean over seeds {doc['seeds']} (round robin: one seed, it is deterministic). TTFT in ms.",
        "",
        "| cell | router | TTFT mean | p50 | p90 | p99 | spread of means | reuse | chosen/best overlap "
        "| ITL mean | imbalance | Dynamo KV mean (reuse) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, routers in doc["cells"].items():
        workers, speed = name.split("w-")
        dyn = DYNAMO_KV.get((int(workers), float(speed.rstrip("x"))))
        for router, c in routers.items():
            dyn_text = f"{dyn['mean']} ({dyn['reuse']})" if dyn and router.startswith("kv") else ""
            figures = [
                f"{c['ttft_mean_ms']:.1f}",
                f"{c['ttft_p50_ms']:.1f}",
                f"{c['ttft_p90_ms']:.1f}",
                f"{c['ttft_p99_ms']:.1f}",
                f"{c['ttft_mean_spread_ms']:.1f}",
                f"{c['reuse']:.3f}",
                f"{c['overlap_chosen_over_best']:.3f}",
                f"{c['itl_mean_ms']:.2f}",
                f"{c['imbalance_max_over_mean']:.2f}",
                dyn_text,
            ]
            lines.append(f"| {name} | {router} | " + " | ".join(figures) + " |")
    if doc.get("targets"):
        lines += ["", "Issue 10 targets (TTFT mean at most the target, reuse at least Dynamo's):", ""]
        lines += [
            "| cell | router | TTFT mean | target | Dynamo | reuse | Dynamo reuse | met |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for v in doc["targets"]:
            met = "yes" if v["meets_target"] else "NO"
            figures = [v["cell"], v["router"], f"{v['ttft_mean_ms']:.1f}", str(v["target_ms"])]
            figures += [str(v["dynamo_ms"]), f"{v['reuse']:.3f}", str(v["dynamo_reuse"]), met]
            lines.append("| " + " | ".join(figures) + " |")
    if doc.get("pooled_bound"):
        lines += ["", "Pooled-cache bound (one LRU cache of all workers, no queueing), 1x:", ""]
        for workers, b in doc["pooled_bound"].items():
            lines.append(f"- {workers} workers: TTFT mean {b['ttft_mean_ms']:.1f} ms, reuse {b['reuse']:.3f}")
    if doc.get("calibration"):
        lines += ["", "Round robin against REFERENCE section 6 (relative error):", ""]
        for row in doc["calibration"]:
            parts = [
                f"{k} {v['ours']:.{1 if v['ours'] >= 1 else 4}f} vs {v['reference']} ({v['error']:+.3%})"
                for k, v in row.items()
                if isinstance(v, dict)
            ]
            lines.append(f"- {row['workers']} workers, {row['speedup']:g}x: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(doc["cells"])
    routers = doc["routers"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(1, len(routers))
    for k, router in enumerate(routers):
        xs = [i + (k - (len(routers) - 1) / 2) * width for i in range(len(cells))]
        ys = [doc["cells"][c].get(router, {}).get("ttft_mean_ms", math.nan) for c in cells]
        ax.bar(xs, ys, width, label=router)
    for i, c in enumerate(cells):
        workers, speed = c.split("w-")
        dyn = DYNAMO_KV.get((int(workers), float(speed.rstrip("x"))))
        if dyn:
            ax.hlines(dyn["mean"], i - 0.4, i + 0.4, colors="black", linestyles="dashed")
    ax.plot([], [], "k--", label="Dynamo KV (published)")
    ax.set_xticks(range(len(cells)), cells)
    ax.set_ylabel("TTFT mean (ms)")
    ax.set_yscale("log")
    ax.set_title(f"Routing quality, mean over seeds {doc['seeds']}")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument(
        "--out-dir", default="benchmarks/results/quality", help="where the table, JSON and plot go"
    )
    parser.add_argument("--routers", default=",".join(ROUTERS), help="comma list of: " + ", ".join(ROUTERS))
    parser.add_argument("--workers", default="4,8")
    parser.add_argument("--speedups", default="1,2")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per randomised router (default 3)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="replays in parallel")
    parser.add_argument("--calibrate", action="store_true", help="also round robin at 4x, against REFERENCE")
    parser.add_argument("--worker-speed", default="", help="one speed per worker: a mixed fleet")
    parser.add_argument("--replicas", type=int, default=1, help="router replicas (replica-sync model)")
    parser.add_argument("--replica-sync-lag-ms", type=float, default=0.0)
    parser.add_argument(
        "--replica-assignment", default="round-robin", choices=[a.value for a in ReplicaAssignment]
    )
    parser.add_argument(
        "--arrival-jitter-ms",
        type=float,
        default=0.0,
        help="delay each arrival by up to this many ms, drawn per seed (compare policies that draw"
        " nothing at random over seeds; 1 is enough)",
    )
    args = parser.parse_args(argv)

    routers = [r for r in args.routers.split(",") if r]
    for r in routers:
        if r not in ROUTERS:
            parser.error(f"unknown router {r!r}: expected one of {', '.join(ROUTERS)}")
    workers = [int(w) for w in args.workers.split(",")]
    speedups = [float(s) for s in args.speedups.split(",")]
    seeds = list(range(args.seeds))
    speeds = tuple(float(x) for x in args.worker_speed.split(",")) if args.worker_speed else ()
    if speeds and workers != [len(speeds)]:
        parser.error(f"--worker-speed names {len(speeds)} workers: pass --workers {len(speeds)}")
    fleet = {
        "worker_speeds": speeds,
        "replicas": args.replicas,
        "replica_sync_lag_ms": args.replica_sync_lag_ms,
        "replica_assignment": args.replica_assignment,
        "arrival_jitter_ms": args.arrival_jitter_ms,
    }
    jobs = []
    for w in workers:
        for sp in speedups:
            for r in routers:
                for seed in [0] if r in DETERMINISTIC and not args.arrival_jitter_ms else seeds:
                    jobs.append(Job(args.trace, r, w, sp, seed, **fleet))
    if args.calibrate and "round-robin" in routers:
        jobs += [Job(args.trace, "round-robin", w, 4.0, 0) for w in (4, 8) if 4.0 not in speedups]
    env = machine_environment()
    started = time.perf_counter()
    print(f"{len(jobs)} replays on {args.jobs} processes", file=sys.stderr)
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for run in pool.map(replay_one, jobs):
            s = run["summary"]
            print(
                f"  {run['workers']}w {run['speedup']:g}x {run['router']:<11} seed {run['seed']}: TTFT mean"
                f" {s['ttft_ms']['mean']:8.1f} ms, reuse {s['reuse']:.3f} ({s['wall_s']:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            runs.append(run)
    cells: dict[str, dict[str, Any]] = {}
    for run in runs:
        cells.setdefault(f"{run['workers']}w-{run['speedup']:g}x", {}).setdefault(run["router"], []).append(
            run
        )
    cells = {
        name: {r: aggregate(v) for r, v in rs.items()} for name, rs in sorted(cells.items(), key=_cell_order)
    }
    bounds = {}
    if 1.0 in speedups:
        print("pooled-cache bound ...", file=sys.stderr)
        bounds = {str(w): pooled_bound(args.trace, w) for w in workers}
    best = "kv-timing" if "kv-timing" in routers else ("kv" if "kv" in routers else None)
    doc: dict[str, Any] = {
        "benchmark": "bench_quality",
        "env": env,
        "trace": args.trace,
        "fleet": {**fleet, "worker_speeds": list(speeds)},
        "routers": routers,
        "seeds": seeds,
        "wall_s": round(time.perf_counter() - started, 1),
        "cells": cells,
        "targets": verdicts(cells, best) if best else [],
        "pooled_bound": bounds,
        "calibration": calibration(cells),
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "quality.md").write_text(markdown(doc))
    try:
        plot(doc, out / "quality.png")
    except ImportError:
        print("no matplotlib: skipped the plot", file=sys.stderr)
    print(json.dumps(doc, indent=2))
    return 0


def _cell_order(item: tuple[str, Any]) -> tuple[float, int]:
    workers, speed = item[0].split("w-")
    return (float(speed.rstrip("x")), -int(workers))


if __name__ == "__main__":
    sys.exit(main())
