"""Router groups: the decision latency that probing remote groups adds, and the routing quality of
two groups of four workers against one flat router of eight. Prints ONE JSON object on stdout.

    .venv/bin/python benchmarks/bench_groups.py --quick    # about 1 minute
    .venv/bin/python benchmarks/bench_groups.py            # about 3 minutes

Sections of the JSON:

1. `latency`: one `GroupSelector.route` (probe every group concurrently, rank, commit) from this
   process to N = 1, 2, 4, 8 remote groups, each a child process `python -m extproc serve
   --group-api-port` over 4 workers (placeholders: decisions only, nothing contacts them; predicted
   cache state). The baseline `flat` is the decision a picker makes without groups for the same
   prompts: hash + `KvRouter.best_worker_for_hashes` with a request id, in process, over 4N workers.
   `added_*_us` = route - flat at the same percentile; `top_level_cpu_us_per_request` is this
   process's CPU time per request (route plus its lifecycle calls): the top-level picker's share,
   which grows with N, while the latency also includes the groups' work. Traffic: sequential
   requests, 1k or 8k tokens, 8 shared 75% prefixes with unique tails, each request's lifecycle
   (prefill complete, free) completed and drained outside the timing, so every group stays lightly
   loaded. Rounds rotate the order of N to spread drift; the 8 group processes run throughout.
2. `quality`: the shared Mooncake trace (`--trace`, REFERENCE section 6 mapping, 1x arrivals)
   replayed in virtual time through the simulated engines of `extproc.sim.replay` (the real
   `KvRouter`, KV events from the engines, no lag): one flat router over 8 workers against 2 groups
   of 4 (workers 0-3 and 4-7), each group a `KvRouter` of its own (for each of
   `--prefill-load-models`: kv mode's default `timing` and Dynamo's `none`), the decision made as
   `LocalGroup` / `GroupSelector` make it: probe each group (a decision without a request id),
   order the probes with `extproc.groups.policy.rank`, commit to the first with its probed worker
   pinned (re-deciding if it became busy). Mean/p50/p90/p99 TTFT (ms), reuse (cached prompt tokens
   / prompt tokens), chosen/best overlap and request imbalance from `extproc.sim.replay_metrics`
   (REFERENCE section 6 definitions), per seed and their mean over seeds;
   policies `max-overlap` (default) and `min-cost`. Skipped, with the reason, when the replay
   simulator is not importable.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(REPO_ROOT), str(BENCH_DIR)):  # benchmark this checkout; reuse bench_router's helpers
    if _path not in sys.path:
        sys.path.insert(0, _path)

from bench_router import DEFAULT_TRACE, machine_environment, percentile  # noqa: E402

from extproc.devstack.groups import launch_group_picker, wait_until_serving  # noqa: E402
from extproc.devstack.procs import ManagedProcess  # noqa: E402
from extproc.devstack.stack import MODEL  # noqa: E402
from extproc.groups import GroupProbe, GroupRequest, GroupSelector, RemoteGroup  # noqa: E402
from extproc.groups.policy import GroupPolicy, rank  # noqa: E402
from extproc.groups.types import GroupChoice  # noqa: E402
from extproc.picker.local_group import group_load  # noqa: E402
from extproc.router import (  # noqa: E402
    KvEvent,
    KvRouter,
    PinnedWorkerUnavailable,
    RouterConfig,
    RouterError,
    WorkerSpec,
)

GROUP_COUNTS = (1, 2, 4, 8)
WORKERS_PER_GROUP = 4
BLOCK = 16
PROMPT_SIZES = {"1k": 1024, "8k": 8192}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- 1. latency --------------------------------------------------------------------------------


def prompts(size: int, count: int, seed: int) -> list[list[int]]:
    """`count` prompts of `size` tokens: 8 shared prefixes of 3/4 of the prompt, unique tails."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 50_000) for _ in range(size * 3 // 4)] for _ in range(8)]
    return [
        prefixes[i % 8] + [rng.randrange(1, 50_000) for _ in range(size - size * 3 // 4)]
        for i in range(count)
    ]


def start_groups(log_dir: Path, count: int) -> list[tuple[ManagedProcess, int]]:
    """`count` group pickers, each on a group API port it binds itself and reports."""
    processes: list[ManagedProcess] = []
    try:
        for g in range(count):
            workers = [(f"g{g}w{i}", f"127.0.{g + 1}.{i + 1}:8000") for i in range(WORKERS_PER_GROUP)]
            processes.append(launch_group_picker(f"g{g}", workers, log_dir, block_size=BLOCK))
        return [(process, wait_until_serving(process)) for process in processes]
    except BaseException:
        for process in processes:
            process.stop(grace_s=1.0)
        raise


async def time_routes(selector: GroupSelector, batch: Sequence[list[int]], tag: str) -> list[int]:
    samples = []
    for i, tokens in enumerate(batch):
        request = GroupRequest(MODEL, tokens)
        start = time.perf_counter_ns()
        await selector.route(request, f"{tag}-{i}")
        samples.append(time.perf_counter_ns() - start)
        selector.first_token(f"{tag}-{i}")
        selector.finish(f"{tag}-{i}", "complete")
        await selector.drain()
    return samples


def time_flat(router: KvRouter, batch: Sequence[list[int]], tag: str) -> list[int]:
    samples = []
    for i, tokens in enumerate(batch):
        start = time.perf_counter_ns()
        router.best_worker_for_hashes(router.block_hashes(tokens), len(tokens), request_id=f"{tag}-{i}")
        samples.append(time.perf_counter_ns() - start)
        router.mark_prefill_complete(f"{tag}-{i}")
        router.free(f"{tag}-{i}")
    return samples


def summary(samples_ns: Sequence[int]) -> dict[str, float]:
    values = sorted(samples_ns)
    return {
        "p50_us": round(percentile(values, 0.5) / 1e3, 1),
        "p99_us": round(percentile(values, 0.99) / 1e3, 1),
        "mean_us": round(statistics.fmean(values) / 1e3, 1),
        "samples": len(values),
    }


async def latency_section(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    counts = [n for n in GROUP_COUNTS if n <= args.max_groups]
    log(f"latency: starting {max(counts)} group processes ({WORKERS_PER_GROUP} workers each) ...")
    processes = start_groups(log_dir, max(counts))
    selectors = {
        n: GroupSelector(
            [RemoteGroup(f"g{g}", f"127.0.0.1:{port}") for g, (_, port) in enumerate(processes[:n])],
            probe_timeout_s=1.0,  # nothing may be skipped while measuring
            rng=random.Random(n),
        )
        for n in counts
    }
    flats = {
        n: KvRouter(
            RouterConfig(block_size=BLOCK, use_kv_events=False),
            clock=time.monotonic,
            rng=random.Random(n),
            workers=[WorkerSpec(f"w{i}") for i in range(n * WORKERS_PER_GROUP)],
        )
        for n in counts
    }
    samples: dict[tuple[str, str, int], list[int]] = {}
    cpu_ns: dict[tuple[str, int], int] = {}  # this process's CPU time in timed routes (the top level's share)
    try:
        for size_name, size in PROMPT_SIZES.items():
            batch = prompts(size, args.requests, seed=size)
            for n in counts:  # warm-up: connections, caches of the prefixes
                await time_routes(selectors[n], batch[:16], f"warm-{size_name}")
                time_flat(flats[n], batch[:16], f"warm-{size_name}")
            per_round = max(1, args.requests // args.rounds)
            for r in range(args.rounds):
                order = counts[r % len(counts) :] + counts[: r % len(counts)]
                part = batch[r * per_round : (r + 1) * per_round]
                for n in order:
                    gc.collect()
                    cpu_start = time.process_time_ns()
                    samples.setdefault(("route", size_name, n), []).extend(
                        await time_routes(selectors[n], part, f"r{r}-{size_name}")
                    )
                    cpu_ns[(size_name, n)] = (
                        cpu_ns.get((size_name, n), 0) + time.process_time_ns() - cpu_start
                    )
                    samples.setdefault(("flat", size_name, n), []).extend(
                        time_flat(flats[n], part, f"r{r}-{size_name}")
                    )
                log(f"latency: {size_name} round {r + 1}/{args.rounds} done")
        failures = {
            n: {g: dict(s.probe_failures) for g, s in sel.metrics.groups.items() if s.probe_failures}
            for n, sel in selectors.items()
        }
    finally:
        for selector in selectors.values():
            await selector.close()
        for process, _ in processes:
            process.stop(grace_s=2.0)
    out: dict[str, Any] = {}
    for size_name in PROMPT_SIZES:
        rows = {}
        for n in counts:
            route = summary(samples[("route", size_name, n)])
            flat = summary(samples[("flat", size_name, n)])
            rows[f"{n}_groups"] = {
                "route": route,
                "flat": flat,
                "added_p50_us": round(route["p50_us"] - flat["p50_us"], 1),
                "added_p99_us": round(route["p99_us"] - flat["p99_us"], 1),
                "top_level_cpu_us_per_request": round(cpu_ns[(size_name, n)] / route["samples"] / 1e3, 1),
            }
        out[size_name] = rows
    out["probe_failures"] = {str(n): f for n, f in failures.items() if f}
    return out


# --- 2. quality --------------------------------------------------------------------------------


class GroupedReplayRouter:
    """The replay's `ReplayRouter` seam over router groups: each group a KvRouter over its workers.

    The top-level decision is the selector's, made synchronously in virtual time: probe every group
    (a decision without a request id, as `LocalGroup.probe_now`), rank with the real policy, commit to
    the best with the probed worker pinned, re-deciding if it cannot take it (as `LocalGroup.commit_now`).
    """

    def __init__(
        self,
        config: RouterConfig,
        workers: Sequence[WorkerSpec],
        clock_s: Callable[[], float],
        rng: random.Random,
        *,
        groups: int,
        policy: GroupPolicy,
    ) -> None:
        size = math.ceil(len(workers) / groups)
        self.routers = {
            f"g{g}": KvRouter(
                config,
                clock=clock_s,
                rng=random.Random(rng.random()),
                workers=workers[g * size : (g + 1) * size],
            )
            for g in range(groups)
        }
        self._by_worker = {w.worker_id: r for r in self.routers.values() for w in r.workers()}
        self._owner: dict[str, KvRouter] = {}
        self._rng = rng
        self.policy = policy
        self.redecided = 0

    @property
    def waiting(self) -> int:
        return 0  # no admission queue: every request is decided on arrival

    def released(self) -> list[Any]:
        return []

    def route(self, request_id: str, local_hashes: Sequence[int], isl: int, output_tokens: int) -> Any:
        from extproc.sim.replay_router import RouteResult

        probes = []
        for name, router in self.routers.items():
            try:
                d = router.best_worker_for_hashes(local_hashes, isl, expected_output_tokens=output_tokens)
            except RouterError:
                continue
            choice = GroupChoice(d.worker, "", {}, d.overlap_blocks, d.request_blocks, d.cost)
            probes.append(GroupProbe(name, choice, group_load(router), router.config.block_size))
        best = rank(probes, self.policy, weights={}, rng=self._rng)[0]
        router = self.routers[best.group]
        try:
            decision = router.best_worker_for_hashes(
                local_hashes, isl, request_id=request_id, pinned_worker=best.choice.worker,
                expected_output_tokens=output_tokens,
            )  # fmt: skip
        except PinnedWorkerUnavailable:
            self.redecided += 1
            decision = router.best_worker_for_hashes(
                local_hashes, isl, request_id=request_id, expected_output_tokens=output_tokens
            )
        self._owner[request_id] = router
        best_overlap = max(
            max(r.indexer.find_matches(local_hashes).values(), default=0) for r in self.routers.values()
        )
        return RouteResult(
            request_id, decision.worker, decision.overlap_blocks, max(best_overlap, decision.overlap_blocks)
        )

    def on_first_token(self, request_id: str) -> None:
        self._owner[request_id].mark_prefill_complete(request_id)

    def on_end(self, request_id: str) -> None:
        router = self._owner.pop(request_id, None)
        if router is not None:
            router.free(request_id)

    def on_kv_event(self, event: KvEvent) -> None:
        self._by_worker[event.worker.worker_id].apply_event(event)


def replay_summary(result: Any) -> dict[str, float]:
    from extproc.sim.replay_metrics import summarize

    s = summarize(result)
    return {
        "ttft_mean_ms": round(s["ttft_ms"]["mean"], 1),
        "ttft_p50_ms": round(s["ttft_ms"]["p50"], 1),
        "ttft_p90_ms": round(s["ttft_ms"]["p90"], 1),
        "ttft_p99_ms": round(s["ttft_ms"]["p99"], 1),
        "reuse": round(s["reuse"], 3),
        "overlap_chosen_over_best": round(s["overlap"]["chosen_over_best"], 3),
        "max_over_mean_requests_per_worker": round(s["imbalance"]["max_over_mean"], 3),
        "requests": s["completed"],
        "rejected": s["rejected"],
        "wall_s": round(s["wall_s"], 1),
    }


def quality_section(args: argparse.Namespace) -> dict[str, Any]:
    try:
        from extproc.sim.engine import EngineConfig
        from extproc.sim.replay import ReplayConfig, Replayer, kv_router_factory
        from extproc.sim.trace import load_mooncake
    except ImportError as exc:
        return {"skipped": f"the replay simulator (extproc.sim.replay) is not importable: {exc}"}
    requests = load_mooncake([args.trace])
    engine = EngineConfig()
    setups: dict[str, Any] = {"flat_8": kv_router_factory}
    for policy in (GroupPolicy.MAX_OVERLAP, GroupPolicy.MIN_COST):

        def factory(config, workers, clock_s, rng, policy=policy):  # type: ignore[no-untyped-def]
            return GroupedReplayRouter(config, workers, clock_s, rng, groups=2, policy=policy)

        setups[f"2_groups_of_4/{policy.value}"] = factory
    out: dict[str, Any] = {"trace": str(args.trace), "requests": len(requests), "workers": 8, "setups": {}}
    keys = ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "reuse", "overlap_chosen_over_best")
    for model in args.prefill_load_models:
        router_config = RouterConfig(block_size=engine.block_size, prefill_load_model=model)
        for name, factory in setups.items():
            runs = []
            for seed in range(args.seeds):
                log(f"quality: {model} {name} seed {seed} ...")
                replay = Replayer(
                    requests,
                    ReplayConfig(8, router=router_config, engine=engine, seed=seed),
                    router_factory=factory,
                )
                runs.append(replay_summary(replay.run()))
            out["setups"][f"{model}/{name}"] = {
                "mean_over_seeds": {k: round(statistics.fmean(r[k] for r in runs), 3) for k in keys},
                "per_seed": runs,
            }
    return out


# --- driver ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and seeds (about 1 minute)")
    parser.add_argument("--requests", type=int, help="timed requests per prompt size and group count")
    parser.add_argument("--rounds", type=int, default=4, help="rounds rotating the group counts")
    parser.add_argument("--max-groups", type=int, default=8)
    parser.add_argument("--seeds", type=int, help="replay seeds per setup (Dynamo-style random ties)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument(
        "--prefill-load-models",
        default="timing,none",
        type=lambda v: v.split(","),
        help="quality: --router-prefill-load-model values, each replayed flat and grouped "
        "(default: kv mode's default, timing, and Dynamo's none)",
    )
    parser.add_argument("--skip", choices=("latency", "quality"), action="append", default=[])
    parser.add_argument("--log-dir", help="keep the group processes' logs here")
    args = parser.parse_args(argv)
    args.requests = args.requests or (200 if args.quick else 600)
    args.seeds = args.seeds or (1 if args.quick else 3)
    result: dict[str, Any] = {"benchmark": "bench_groups", "env": machine_environment()}
    result["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    with tempfile.TemporaryDirectory(prefix="bench-groups-") as tmp:
        log_dir = Path(args.log_dir or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        if "latency" not in args.skip:
            result["latency"] = asyncio.run(latency_section(args, log_dir))
    if "quality" not in args.skip:
        result["quality"] = quality_section(args)
    result["env"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
