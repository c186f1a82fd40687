"""`python -m extproc replay`: replay traces through simulated engines and the real router.

Owns the command line only: flags, building the configs, printing, files. The router flags are
`serve`'s (`extproc.config.ROUTER_OPTIONS`, same names, env vars and config-file keys, built by the
same `load_config`), except `--router-mode`, which `--router` replaces so that one run can compare
several routers on the same trace. The router's block size defaults to the engines' here.
`--disagg P:D` replays P prefill and D decode workers (`extproc.sim.replay_disagg`) with serve's
`--disagg-*` policy flags and a simulated KV transfer time. `--worker-speed` makes a mixed fleet;
`--router-replicas N` spreads arrivals over N routers synced with `--replica-sync-lag-ms` of lag
(`extproc.sim.replay_replicas`), disaggregated ones too (`--replica-sync-prefill`: prefill legs
shared as serve shares them, or not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from extproc.config import DISAGG_OPTIONS, ROUTER_OPTIONS, ConfigError, PickerConfig, add_options, load_config
from extproc.router.config import PrefillLoadModel, RouterConfig, RouterMode
from extproc.sim.engine import EngineConfig
from extproc.sim.replay import ReplayConfig, Replayer, ReplayResult
from extproc.sim.replay_disagg import DisaggReplayer, DisaggSetup
from extproc.sim.replay_metrics import format_summary, summarize
from extproc.sim.replay_replicas import ReplicaAssignment, ReplicaSetup, replicated_router_factory
from extproc.sim.trace import TraceError, load_mooncake
from extproc.sim.transfer import add_kv_transfer_arguments, kv_transfer_from_args

ROUTERS = tuple(m.value for m in RouterMode)
SYNC_PREFILL = ("shared", "own")  # --replica-sync-prefill: the prefill legs published, or not


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces", nargs="+", metavar="TRACE", help="Mooncake JSONL trace file(s), replayed in order"
    )
    parser.add_argument("--workers", type=int, default=4, help="simulated workers (default: %(default)s)")
    parser.add_argument(
        "--router",
        action="append",
        metavar="ROUTER",
        help=f"router to replay with: {', '.join(ROUTERS)}; repeat or comma-separate to compare several "
        "(default: kv)",
    )
    parser.add_argument(
        "--speedup", type=float, default=1.0, help="divide arrival times by this (default: %(default)s)"
    )
    parser.add_argument(
        "--trace-block-size",
        type=int,
        default=512,
        help="tokens per trace hash id (512 for Mooncake; default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the router's rng (default: %(default)s)")
    parser.add_argument(
        "--kv-event-lag-ms",
        type=float,
        default=0.0,
        help="delay between an engine's KV event and the router applying it (default: %(default)s)",
    )
    parser.add_argument(
        "--router-replicas",
        type=int,
        default=1,
        metavar="N",
        help="N router replicas sharing in-flight load through the replica-sync model, each receiving "
        "every KV event (default: %(default)s)",
    )
    parser.add_argument(
        "--replica-sync-lag-ms",
        type=float,
        default=10.0,
        help="with --router-replicas: delay of one replica's add/prefill/free reaching the others "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--router-replica-assignment",
        choices=[a.value for a in ReplicaAssignment],
        default=ReplicaAssignment.ROUND_ROBIN.value,
        help="with --router-replicas: how arrivals are spread (session: by the prompt's first block)",
    )
    parser.add_argument(
        "--replica-sync-prefill",
        choices=SYNC_PREFILL,
        default="shared",
        help="with --router-replicas and --disagg: whether replicas share prefill workers' in-flight "
        "prompts (serve does) or each sees only its own (serve before 2026-11-27) (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON on stdout")
    parser.add_argument("--requests-out", metavar="FILE.jsonl", help="write one JSON line per request")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="TTFT distribution per router and load per worker (matplotlib)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")

    engine = parser.add_argument_group("simulated engine (Dynamo mocker defaults)")
    defaults = EngineConfig()
    engine.add_argument("--block-size", type=int, default=defaults.block_size, help="KV block size in tokens")
    engine.add_argument(
        "--num-gpu-blocks", type=int, default=defaults.num_gpu_blocks, help="KV blocks per worker"
    )
    engine.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=defaults.max_num_batched_tokens,
        help="token budget of one pass",
    )
    engine.add_argument(
        "--max-num-seqs", type=int, default=defaults.max_num_seqs, help="running requests per worker"
    )
    engine.add_argument(
        "--num-host-blocks",
        type=int,
        default=defaults.num_host_blocks,
        help="host-memory tier per worker for blocks evicted from the GPU pool, reported as vLLM's CPU "
        "offloading reports them (medium CPU); 0: none, as the mocker (default: %(default)s)",
    )
    engine.add_argument(
        "--host-load-speedup",
        type=float,
        default=defaults.host_load_speedup,
        help="loading a block back from the host tier costs 1/this of computing it (default: %(default)s)",
    )
    engine.add_argument(
        "--worker-speed",
        type=_speeds,
        metavar="S1,S2,...",
        help="a mixed fleet: one speed per worker (0.5 = its passes take twice the model's time); "
        "default: all 1",
    )

    router = parser.add_argument_group("router (the flags of serve; env DYN_<FLAG>; --config FILE 'router:')")
    router.add_argument(
        "--config", metavar="FILE", help="YAML config file; only its 'router' and 'disagg' sections are used"
    )
    add_options(router, ROUTER_OPTIONS, skip=("router_mode",))  # --router replaces --router-mode

    disagg = parser.add_argument_group("disaggregated prefill/decode (serve's --disagg-* flags)")
    disagg.add_argument(
        "--disagg",
        metavar="P:D",
        type=_prefill_decode,
        help="replay P prefill and D decode workers (the picker's two-stage router) instead of --workers",
    )
    add_kv_transfer_arguments(disagg, "the prompt's full blocks up to the cached-prefix cap")
    add_options(disagg, DISAGG_OPTIONS, skip=("prefill_endpoint_header", "prefill_health_interval_secs"))


def _speeds(text: str) -> tuple[float, ...]:
    try:
        speeds = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated speeds, got {text!r}") from None
    if not all(0 < s < float("inf") for s in speeds):
        raise argparse.ArgumentTypeError(f"every speed must be a number > 0, got {text!r}")
    return speeds


def _prefill_decode(text: str) -> tuple[int, int]:
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected P:D (prefill:decode workers), got {text!r}") from None
    if p < 0 or d < 1:
        raise argparse.ArgumentTypeError(f"expected P >= 0 prefill and D >= 1 decode workers, got {text!r}")
    return p, d


def _load(args: argparse.Namespace, environ: Mapping[str, str]) -> PickerConfig:
    ns = argparse.Namespace(**vars(args))
    if ns.router_kv_events is None:
        ns.router_kv_events = True
    return load_config(args=ns, environ=environ)


def router_config(args: argparse.Namespace, engine: EngineConfig, environ: Mapping[str, str]) -> RouterConfig:
    """The router config `serve` would build from these flags, with replay defaults: KV events on
    (the engines publish them) and the engines' block size. Raises ConfigError."""
    config = _load(args, environ).router
    given_block_size = args.kv_cache_block_size is not None or "DYN_KV_CACHE_BLOCK_SIZE" in environ
    if not given_block_size:
        config = replace(config, block_size=engine.block_size)
    return config


def disagg_setup(args: argparse.Namespace, environ: Mapping[str, str]) -> DisaggSetup | None:
    """The disaggregated fleet and policy of `--disagg P:D`, or None. Raises ConfigError, ValueError."""
    if args.disagg is None:
        return None
    policy = _load(args, environ).disagg.policy
    return DisaggSetup(args.disagg[0], policy, kv_transfer_from_args(args))


def replica_setup(args: argparse.Namespace) -> ReplicaSetup:
    """The router replicas of `--router-replicas` and the `--replica-sync-*` flags."""
    return ReplicaSetup(
        args.router_replicas,
        args.replica_sync_lag_ms,
        ReplicaAssignment(args.router_replica_assignment),
        share_prefill=args.replica_sync_prefill == "shared",
    )


def _routers(args: argparse.Namespace) -> list[str]:
    names = [n.strip() for value in (args.router or ["kv"]) for n in value.split(",") if n.strip()]
    for name in names:
        if name not in ROUTERS:
            raise ConfigError(f"invalid --router {name!r}: expected one of {', '.join(ROUTERS)}")
    return list(dict.fromkeys(names))


class _Progress:
    """One line on stderr every couple of seconds of wall time."""

    def __init__(self, label: str, stream: TextIO, every_s: float = 2.0) -> None:
        self.label = label
        self.stream = stream
        self.every_s = every_s
        self.started = time.monotonic()
        self.last = self.started

    def __call__(self, done: int, total: int, now_ms: float) -> None:
        t = time.monotonic()
        if t - self.last < self.every_s:
            return
        self.last = t
        pct = 100.0 * done / total if total else 100.0
        print(
            f"  {self.label}: {done}/{total} requests done ({pct:.0f} %), simulated {now_ms / 1000:.0f} s,"
            f" wall {t - self.started:.0f} s",
            file=self.stream,
            flush=True,
        )


def run_replay(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        engine = EngineConfig(
            block_size=args.block_size,
            num_gpu_blocks=args.num_gpu_blocks,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            num_host_blocks=args.num_host_blocks,
            host_load_speedup=args.host_load_speedup,
        )
        base = router_config(args, engine, environ)
        setup = disagg_setup(args, environ)
        routers = _routers(args)
        if args.router_replicas < 1 or args.replica_sync_lag_ms < 0:
            raise ValueError("--router-replicas must be >= 1 and --replica-sync-lag-ms >= 0")
        replicas = replica_setup(args)
        requests = load_mooncake(args.traces, trace_block_size=args.trace_block_size, speedup=args.speedup)
    except (ConfigError, ValueError, TraceError, OSError) as exc:
        print(f"extproc replay: {exc}", file=sys.stderr)
        return 2
    if not requests:
        print("extproc replay: the trace holds no request", file=sys.stderr)
        return 2
    workers = args.workers if setup is None else args.disagg[1]
    fleet = (
        f"{workers} workers"
        if setup is None
        else f"{setup.prefill_workers} prefill + {workers} decode workers"
    )
    results: dict[str, ReplayResult] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for name in routers:
        try:
            config = ReplayConfig(
                workers,
                router=replace(base, mode=RouterMode(name)),
                engine=engine,
                kv_event_lag_ms=args.kv_event_lag_ms,
                seed=args.seed,
                worker_speeds=args.worker_speed or (),
            )
        except ValueError as exc:
            print(f"extproc replay: {exc}", file=sys.stderr)
            return 2
        progress = None if args.quiet else _Progress(name, sys.stderr)
        if progress is not None:
            print(f"replaying {len(requests)} requests on {fleet} with {name}", file=sys.stderr)
        if setup is None and args.router_replicas > 1:
            factory = replicated_router_factory(
                args.router_replicas,
                args.replica_sync_lag_ms,
                ReplicaAssignment(args.router_replica_assignment),
            )
            results[name] = Replayer(requests, config, router_factory=factory, progress=progress).run()
        elif setup is None:
            results[name] = Replayer(requests, config, progress=progress).run()
        else:
            replayer = DisaggReplayer(requests, config, setup, replicas=replicas, progress=progress)
            results[name] = replayer.run()
        summaries[name] = summarize(results[name])
    timed = base.prefill_load_model is PrefillLoadModel.TIMING
    labels = {name: f"{name} (timing)" if name == "kv" and timed else name for name in results}
    if args.requests_out:
        write_requests(args.requests_out, results)
    if args.plot:
        title = f"{', '.join(Path(t).name for t in args.traces)}: {fleet}, {args.speedup:g}x"
        try:
            from extproc.sim.replay_plot import plot_replays

            plot_replays({labels[n]: r for n, r in results.items()}, args.plot, title=title)
        except RuntimeError as exc:
            print(f"extproc replay: {exc}", file=sys.stderr)
            return 2
    if args.json:
        doc = {
            "traces": list(args.traces),
            "workers": workers if setup is None else workers + setup.prefill_workers,
            "speedup": args.speedup,
            "seed": args.seed,
            "kv_event_lag_ms": args.kv_event_lag_ms,
            "worker_speeds": list(args.worker_speed or ()),
            "router_replicas": args.router_replicas,
            "replica_sync_lag_ms": args.replica_sync_lag_ms if args.router_replicas > 1 else None,
            "replica_sync_prefill": (
                args.replica_sync_prefill if args.router_replicas > 1 and setup is not None else None
            ),
            "prefill_load_model": str(base.prefill_load_model),
            "routers": summaries,
        }
        if setup is not None:
            doc["disagg"] = {
                "prefill_workers": setup.prefill_workers,
                "decode_workers": workers,
                "kv_transfer_base_ms": setup.kv_transfer.base_ms,
                "kv_transfer_ms_per_block": setup.kv_transfer.ms_per_block,
                "min_remote_prefill_tokens": setup.policy.min_remote_prefill_tokens,
                "max_decode_prefix_frac": setup.policy.max_decode_prefix_frac,
                "decode_overlap_weight": setup.policy.decode_overlap_weight,
            }
        print(json.dumps(doc, indent=2))
    else:
        for name, summary in summaries.items():
            print(format_summary(labels[name], summary))
    return 0


def write_requests(path: str | Path, results: Mapping[str, ReplayResult]) -> None:
    """One JSON line per request and router: times in ms from the trace start."""
    with open(path, "w", encoding="utf-8") as f:
        for name, result in results.items():
            for r in result.records:
                f.write(
                    json.dumps(
                        {
                            "router": name,
                            "index": r.index,
                            "worker": r.worker,
                            "arrival_ms": r.arrival_ms,
                            "routed_ms": r.routed_ms,
                            "first_token_ms": r.first_token_ms,
                            "end_ms": r.end_ms,
                            "ttft_ms": r.ttft_ms,
                            "tpot_ms": r.tpot_ms,
                            "e2e_ms": r.e2e_ms,
                            "input_tokens": r.input_tokens,
                            "output_tokens": r.output_tokens,
                            "cached_tokens": r.cached_tokens,
                            "overlap_blocks": r.overlap_blocks,
                            "best_overlap_blocks": r.best_overlap_blocks,
                            "admissions": r.admissions,
                            "rejected": r.rejected,
                            "prefill_worker": r.prefill_worker if r.remote_prefill else None,
                            "local_reason": r.local_reason,
                            "prefill_end_ms": r.prefill_end_ms,
                            "transfer_ms": r.transfer_ms,
                        }
                    )
                    + "\n"
                )
