"""Aggregated against disaggregated serving on a trace, with the same total number of workers.

Every replay runs the shared Mooncake trace (REFERENCE section 6) in virtual time through simulated
engines and the real routers (`extproc.sim.replay`, `extproc.sim.replay_disagg`: the same code as
`python -m extproc replay [--disagg P:D]`). For a total of N workers it compares N aggregated
workers with P prefill + (N - P) decode workers for each P of --prefill, at each arrival speed and
router, and reports TTFT, ITL, TPOT, throughput and reuse side by side, plus where the prompts were
prefilled and what the KV transfers cost.

The disaggregated layouts use the picker's `DisaggRouter` with its policy flags (conditional
disaggregation: a prompt is prefilled remotely only when at least --min-remote-prefill-tokens of it
are uncached on the decode worker and that worker caches less than --max-decode-prefix-frac of
it) and a simulated transfer of base + per-block ms (--transfers, several to compare).

With --replicas N (N > 1) every disaggregated layout is also replayed through N router replicas
kept in step by the replica-sync model (`extproc.sim.replay_replicas`, --replica-sync-lag-ms of
lag), twice: sharing the prefill workers' in-flight prompts as serve does, and not sharing them (each
replica sees only its own prefill load: serve before 2026-11-27). The three variants of a layout are
shown side by side.

Prints one JSON object on stdout, a table on stderr (progress too) and writes `disagg.json` and
`disagg.md` under --out-dir.

    .venv/bin/python benchmarks/bench_disagg.py                 # 16 replays, about 3 minutes on 2 CPUs
    .venv/bin/python benchmarks/bench_disagg.py --quick         # a smoke test: seconds
    .venv/bin/python benchmarks/bench_disagg.py --prefill 3 --transfers 2:0.2,0:0 --speedups 2
    .venv/bin/python benchmarks/bench_disagg.py --prefill 2,3 --replicas 3 --jobs 2   # replica sync
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    _path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if _path not in sys.path:
        sys.path.insert(0, _path)

from extproc.router.config import PrefillLoadModel, RouterConfig, RouterMode
from extproc.router.disagg import DisaggPolicy
from extproc.sim.engine import EngineConfig
from extproc.sim.replay import ReplayConfig, Replayer
from extproc.sim.replay_disagg import DisaggReplayer, DisaggSetup
from extproc.sim.replay_metrics import summarize
from extproc.sim.replay_replicas import ReplicaSetup
from extproc.sim.trace import load_mooncake
from extproc.sim.transfer import KvTransferModel

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
ROUTERS: dict[str, dict[str, Any]] = {  # as in bench_quality.py
    "kv": {"mode": RouterMode.KV, "prefill_load_model": PrefillLoadModel.NONE},  # Dynamo's cost
    "kv-timing": {
        "mode": RouterMode.KV,
        "prefill_load_model": PrefillLoadModel.TIMING,
        "learn_prefill_timing": False,
    },
    "kv-timing-learn": {"mode": RouterMode.KV, "prefill_load_model": PrefillLoadModel.TIMING},  # kv's default
}
QUICK_REQUESTS = 300


def replay_one(job: dict[str, Any]) -> dict[str, Any]:
    """One replay (in a worker process): its summary, without per-request records."""
    requests = load_mooncake([job["trace"]], trace_block_size=512, speedup=job["speedup"])
    if job["limit"]:
        requests = requests[: job["limit"]]
    engine = EngineConfig()
    router = RouterConfig(block_size=engine.block_size, **ROUTERS[job["router"]])
    prefill = job["prefill"]
    config = ReplayConfig(job["total"] - prefill, router=router, engine=engine, seed=job["seed"])
    if job["aggregated"]:
        result = Replayer(requests, config).run()
    else:
        base, per_block = job["transfer"]
        setup = DisaggSetup(prefill, DisaggPolicy(*job["policy"]), KvTransferModel(base, per_block))
        replicas = ReplicaSetup(job["replicas"], job["sync_lag_ms"], share_prefill=job["share_prefill"])
        result = DisaggReplayer(requests, config, setup, replicas=replicas).run()
    return {**job, "summary": summarize(result)}


def layout(job: dict[str, Any]) -> str:
    if job["aggregated"]:
        return f"aggregated {job['total']}"
    base, per_block = job["transfer"]
    name = f"{job['prefill']}P:{job['total'] - job['prefill']}D, transfer {base:g}+{per_block:g}/block ms"
    if job["replicas"] > 1:
        name += f", {job['replicas']} routers {replica_sync(job)} prefill"
    return name


def replica_sync(job: dict[str, Any]) -> str | None:
    """What the replicas share of the prefill side: "shared", "own", or None with one router."""
    if job["replicas"] == 1:
        return None
    return "shared" if job["share_prefill"] else "own"


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of the figures of one cell."""

    def mean(get: Any) -> float:
        return sum(get(r["summary"]) for r in runs) / len(runs)

    cell: dict[str, Any] = {
        "seeds": [r["seed"] for r in runs],
        "ttft_mean_ms": mean(lambda s: s["ttft_ms"]["mean"]),
        "ttft_p50_ms": mean(lambda s: s["ttft_ms"]["p50"]),
        "ttft_p99_ms": mean(lambda s: s["ttft_ms"]["p99"]),
        "itl_mean_ms": mean(lambda s: s["itl_ms"]["mean"]),
        "itl_p99_ms": mean(lambda s: s["itl_ms"]["p99"]),
        "tpot_mean_ms": mean(lambda s: s["tpot_ms"]["mean"]),
        "e2e_mean_ms": mean(lambda s: s["e2e_ms"]["mean"]),
        "output_tokens_per_s": mean(lambda s: s["throughput"]["output_tokens_per_s"]),
        "requests_per_s": mean(lambda s: s["throughput"]["requests_per_s"]),
        "reuse": mean(lambda s: s["reuse"]),
        "preemptions": mean(lambda s: s["engine"]["preemptions"]),
        "wall_s": mean(lambda s: s["wall_s"]),
    }
    if "disagg" in runs[0]["summary"]:
        cell["remote_frac"] = mean(lambda s: s["disagg"]["remote_prefill"] / s["requests"])
        cell["ttft_remote_mean_ms"] = mean(lambda s: s["disagg"]["ttft_mean_ms"]["remote"])
        cell["ttft_local_mean_ms"] = mean(lambda s: s["disagg"]["ttft_mean_ms"]["local"])
        cell["prefill_reuse"] = mean(lambda s: s["disagg"]["prefill_reuse"])
        cell["transfer_mean_ms"] = mean(lambda s: s["disagg"]["transfer_ms"]["mean"])
        cell["transfer_total_s"] = mean(lambda s: s["disagg"]["transfer_ms"]["total"] / 1000)
        reasons: dict[str, float] = {}
        for r in runs:
            for k, v in r["summary"]["disagg"]["local_reasons"].items():
                reasons[k] = reasons.get(k, 0) + v / len(runs)
        cell["local_reasons"] = reasons
        cell["transfers_not_landed"] = mean(lambda s: s["disagg"]["transfers_not_landed"])
    return cell


def table(doc: dict[str, Any]) -> str:
    lines = [
        "| speed | router | layout | TTFT mean | p50 | p99 | ITL mean | ITL p99 | TPOT mean | output tok/s "
        "| reuse | remote prefill | remote / local TTFT mean | transfer mean |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        remote = ""
        split = ""
        transfer = ""
        if "remote_frac" in c:
            remote = f"{c['remote_frac']:.0%} (prefill reuse {c['prefill_reuse']:.3f})"
            split = f"{c['ttft_remote_mean_ms']:.1f} / {c['ttft_local_mean_ms']:.1f}"
            transfer = f"{c['transfer_mean_ms']:.1f}"
        figures = [
            f"{c['speedup']:g}x",
            c["router"],
            c["layout"],
            f"{c['ttft_mean_ms']:.1f}",
            f"{c['ttft_p50_ms']:.1f}",
            f"{c['ttft_p99_ms']:.1f}",
            f"{c['itl_mean_ms']:.2f}",
            f"{c['itl_p99_ms']:.2f}",
            f"{c['tpot_mean_ms']:.2f}",
            f"{c['output_tokens_per_s']:.0f}",
            f"{c['reuse']:.3f}",
            remote,
            split,
            transfer,
        ]
        lines.append("| " + " | ".join(figures) + " |")
    return "\n".join(lines) + "\n"


COMPARED = ("ttft_mean_ms", "ttft_p99_ms", "reuse", "prefill_reuse", "remote_frac")


def replica_comparison(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per disaggregated layout, speed and router: one router, replicas sharing the prefill side and
    replicas not sharing it, side by side."""
    rows: dict[tuple[float, str, str], dict[str, Any]] = {}
    for c in cells:
        if c["aggregated"]:
            continue
        base = layout(c | {"replicas": 1})  # the layout with one router
        row = rows.setdefault((c["speedup"], c["router"], base), {})
        row |= {"speedup": c["speedup"], "router": c["router"], "layout": base}
        row[c["replica_sync"] or "one_router"] = {k: c[k] for k in COMPARED}
    return list(rows.values())


def replica_table(doc: dict[str, Any]) -> str:
    """The side-by-side markdown of `replica_comparison`: one router / N shared / N own."""
    n = doc["replicas"]
    lines = [
        f"Router replicas: 1 router / {n} sharing the prefill side / {n} not sharing it"
        f" (sync lag {doc['replica_sync_lag_ms']:g} ms)",
        "",
        "| speed | router | layout | TTFT mean | TTFT p99 | reuse | prefill reuse | remote prefill |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["replica_comparison"]:
        figures = [
            f"{row['speedup']:g}x",
            row["router"],
            row["layout"],
            _side(row, "ttft_mean_ms", ".1f"),
            _side(row, "ttft_p99_ms", ".1f"),
            _side(row, "reuse", ".3f"),
            _side(row, "prefill_reuse", ".3f"),
            _side(row, "remote_frac", ".0%"),
        ]
        lines.append("| " + " | ".join(figures) + " |")
    return "\n".join(lines) + "\n"


def _side(row: dict[str, Any], key: str, fmt: str) -> str:
    """One figure of the three variants: one router / shared / own ("-" for one not run)."""
    return " / ".join(format(row[v][key], fmt) if v in row else "-" for v in ("one_router", "shared", "own"))


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _transfers(text: str) -> list[tuple[float, float]]:
    out = []
    for item in text.split(","):
        base, per_block = item.split(":")
        out.append((float(base), float(per_block)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--out-dir", default="benchmarks/results/disagg", help="where the JSON and table go")
    parser.add_argument("--total", type=int, default=8, help="workers in every layout (default 8)")
    parser.add_argument("--prefill", default="2,3,4", help="prefill workers of the disaggregated layouts")
    parser.add_argument("--speedups", default="1,2")
    parser.add_argument(
        "--routers", default="kv,kv-timing-learn", help="comma list of: " + ", ".join(ROUTERS)
    )
    parser.add_argument("--seeds", type=int, default=1, help="seeds per cell (default 1)")
    transfer = KvTransferModel()  # the simulator's defaults, the mock worker's too
    parser.add_argument(
        "--transfers",
        default=f"{transfer.base_ms:g}:{transfer.ms_per_block:g}",
        help="KV transfer costs to compare, base_ms:ms_per_block, comma separated (default %(default)s)",
    )
    defaults = DisaggPolicy()
    parser.add_argument("--min-remote-prefill-tokens", type=int, default=defaults.min_remote_prefill_tokens)
    parser.add_argument("--max-decode-prefix-frac", type=float, default=defaults.max_decode_prefix_frac)
    parser.add_argument(
        "--decode-overlap-weight",
        type=float,
        default=None,
        help="decode stage's weight (default: the router's)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="N > 1: also replay each disaggregated layout through N router replicas, sharing the "
        "prefill side and not (default 1: one router)",
    )
    parser.add_argument(
        "--replica-sync-lag-ms",
        type=float,
        default=10.0,
        help="with --replicas: the replica-sync lag in ms (default 10)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="replays in parallel")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke test: the first {QUICK_REQUESTS} requests, 4 workers (1P:3D), 1x, kv, one transfer cost",
    )
    args = parser.parse_args(argv)

    routers = [r for r in args.routers.split(",") if r]
    for r in routers:
        if r not in ROUTERS:
            parser.error(f"unknown router {r!r}: expected one of {', '.join(ROUTERS)}")
    prefills = [int(p) for p in args.prefill.split(",") if p]
    speedups = _floats(args.speedups)
    transfers = _transfers(args.transfers)
    total, limit = args.total, 0
    if args.quick:
        total, prefills, speedups, routers, limit = 4, [1], [1.0], ["kv"], QUICK_REQUESTS
        transfers = transfers[:1]
    if any(not 0 < p < total for p in prefills):
        parser.error(f"--prefill values must be between 1 and {total - 1}")
    if args.replicas < 1 or args.replica_sync_lag_ms < 0:
        parser.error("--replicas must be >= 1 and --replica-sync-lag-ms >= 0")
    policy = (args.min_remote_prefill_tokens, args.max_decode_prefix_frac, args.decode_overlap_weight)

    # one router, then (with --replicas N) N replicas sharing the prefill side and N not sharing it
    variants = [(1, True)] + ([(args.replicas, True), (args.replicas, False)] if args.replicas > 1 else [])
    jobs: list[dict[str, Any]] = []
    for speedup, router, seed in itertools.product(speedups, routers, range(args.seeds)):
        common = {"trace": args.trace, "total": total, "speedup": speedup, "router": router, "seed": seed}
        common |= {
            "limit": limit,
            "replicas": 1,
            "share_prefill": True,
            "sync_lag_ms": args.replica_sync_lag_ms,
        }
        jobs.append({**common, "aggregated": True, "prefill": 0, "transfer": None, "policy": None})
        for prefill, transfer, (replicas, share) in itertools.product(prefills, transfers, variants):
            disagg = {"aggregated": False, "prefill": prefill, "transfer": transfer, "policy": policy}
            jobs.append({**common, **disagg, "replicas": replicas, "share_prefill": share})
    started = time.perf_counter()
    print(f"{len(jobs)} replays on {min(args.jobs, len(jobs))} processes", file=sys.stderr)
    runs: list[dict[str, Any]] = []

    def report(run: dict[str, Any]) -> None:
        s = run["summary"]
        print(
            f"  {run['speedup']:g}x {run['router']:<9} seed {run['seed']} {layout(run):<38} TTFT mean"
            f" {s['ttft_ms']['mean']:7.1f} ms, ITL mean {s['itl_ms']['mean']:5.2f} ms ({s['wall_s']:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        runs.append(run)

    if args.jobs <= 1:
        for job in jobs:
            report(replay_one(job))
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for run in pool.map(replay_one, jobs):
                report(run)

    groups: dict[tuple[float, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["speedup"], run["router"], layout(run)), []).append(run)
    cells = []
    for (speedup, router, name), group in groups.items():
        first = group[0]
        cell = {"speedup": speedup, "router": router, "layout": name}
        cell |= {k: first[k] for k in ("total", "prefill", "aggregated", "transfer")}
        if args.replicas > 1:
            cell |= {"replicas": first["replicas"], "replica_sync": replica_sync(first)}
        cells.append(cell | aggregate(group))
    doc: dict[str, Any] = {
        "benchmark": "bench_disagg",
        "trace": args.trace,
        "requests": limit or None,
        "total_workers": total,
        "policy": {
            "min_remote_prefill_tokens": policy[0],
            "max_decode_prefix_frac": policy[1],
            "decode_overlap_weight": policy[2],
        },
        "seeds": list(range(args.seeds)),
        "wall_s": round(time.perf_counter() - started, 1),
        "cells": cells,
    }
    markdown = table(doc)
    if args.replicas > 1:
        doc |= {"replicas": args.replicas, "replica_sync_lag_ms": args.replica_sync_lag_ms}
        doc["replica_comparison"] = replica_comparison(cells)
        markdown += "\n" + replica_table(doc)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "disagg.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "disagg.md").write_text(markdown)
    print(markdown, file=sys.stderr)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
