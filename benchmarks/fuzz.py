"""Full-size fuzzing: every decoder of outside bytes, 100,000 generated inputs per target by default.

Runs the targets of `tests/fuzz/` (the CI runs the same checks on a few hundred inputs each) with the
seeded generators directly: input i of target T is `random.Random(f"{T}:{seed}:{i}")`, so any input
can be replayed alone (`--replay i --targets T`). Each input is generated and checked; the check's
promise is the decoder's documented one (decoded, or rejected with the module's error, counter or
status; no state leaked). Failures are classified:

- unhandled_exceptions: an exception the code under test let escape (a bug);
- broken_promises: the check's assertion failed (wrong error, leaked request, unsound tree, ...);
- hangs: one input took over `--input-timeout-s` (each input is small: a hang is a bug).

Progress goes to stderr, one JSON summary to stdout: per target the inputs run, the outcomes counted
by the check (decoded / rejected / ..., per message for targets whose inputs are streams), the three
failure counts with the first examples, and the wall time. Exit status 1 if anything failed.

    nice -n 10 .venv/bin/python benchmarks/fuzz.py                      # all targets, 100k inputs each
    .venv/bin/python benchmarks/fuzz.py --inputs 2000 --targets request,ext_proc
    .venv/bin/python benchmarks/fuzz.py --targets snapshots --replay 4325   # one input, with its traceback
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import logging
import multiprocessing
import resource
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
for _path in (REPO_ROOT, BENCH_DIR):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench_router import machine_environment  # noqa: E402

from tests.fuzz.harness import input_rng  # noqa: E402
from tests.fuzz.targets import TARGET_MODULES, load  # noqa: E402

DEFAULT_INPUTS = 100_000
EXAMPLES_KEPT = 5  # distinct failures reported per target
PROGRESS_EVERY_S = 15.0
US_PER_INPUT = {  # what each target cost per input in the run of 2026-11-21, to start the slowest first
    "config_yaml": 1300, "admin_api": 900, "ext_proc": 700, "dynamo_events": 600, "group_api": 400,
    "vllm_events": 340, "replica_sync": 220, "request": 160, "snapshots": 95,
}  # fmt: skip


class Hang(Exception):
    """An input ran past `--input-timeout-s`."""


def _on_alarm(_signum: int, _frame: Any) -> None:
    raise Hang


def _where(exc: BaseException) -> str:
    """The innermost frame in extproc/ (else the innermost frame) that raised `exc`."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/extproc/" in f.filename] or frames[-1:]
    if not ours:
        return ""
    frame = ours[-1]
    return f"{frame.filename.split(str(REPO_ROOT) + '/')[-1]}:{frame.lineno}"


def _kind(exc: BaseException) -> str:
    if isinstance(exc, Hang):
        return "hangs"
    if isinstance(exc, AssertionError):
        return "broken_promises"
    return "unhandled_exceptions"


def _limit_memory(gib: float) -> None:
    """Cap the address space: a runaway allocation fails as MemoryError instead of paging the machine."""
    if gib > 0:
        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_target(name: str, inputs: int, seed: int, timeout_s: float, memory_gib: float) -> dict[str, Any]:
    """Generate and check `inputs` inputs of one target; the summary of what happened."""
    logging.disable(logging.CRITICAL)  # the decoders warn about every bad input they drop
    _limit_memory(memory_gib)
    signal.signal(signal.SIGALRM, _on_alarm)
    target = load(name)
    outcomes: Counter[str] = Counter()
    failures: dict[tuple[str, str, str], dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    started = last_report = time.monotonic()
    stack = contextlib.ExitStack()
    check = stack.enter_context(target.session())
    try:
        for i in range(inputs):
            case = target.generate(input_rng(name, seed, i))
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                outcomes.update(check(case))
            except Exception as exc:
                signal.setitimer(signal.ITIMER_REAL, 0)
                kind = _kind(exc)
                counts[kind] += 1
                key = (kind, type(exc).__name__, _where(exc))
                if key in failures:
                    failures[key]["count"] += 1
                elif len(failures) < EXAMPLES_KEPT:
                    failures[key] = {
                        "kind": kind,
                        "exception": f"{type(exc).__name__}: {str(exc)[:300]}",
                        "where": key[2],
                        "count": 1,
                        "first_index": i,
                        "input": target.describe(case)[:800],
                    }
                with contextlib.suppress(Exception):
                    stack.close()  # a fresh session: what this input broke must not fail the next ones
                stack = contextlib.ExitStack()
                check = stack.enter_context(target.session())
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            now = time.monotonic()
            if now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                rate = (i + 1) / (now - started)
                print(
                    f"[{name}] {i + 1}/{inputs} inputs, {rate:.0f}/s, failures {sum(counts.values())}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        stack.close()
    wall = time.monotonic() - started
    print(f"[{name}] done: {inputs} inputs in {wall:.0f} s, failures {sum(counts.values())}", file=sys.stderr)
    return {
        "inputs": inputs,
        "outcomes": dict(sorted(outcomes.items())),
        "unhandled_exceptions": counts["unhandled_exceptions"],
        "broken_promises": counts["broken_promises"],
        "hangs": counts["hangs"],
        "failures": list(failures.values()),
        "wall_s": round(wall, 1),
        "us_per_input": round(wall / max(inputs, 1) * 1e6),
    }


def replay(name: str, index: int, seed: int) -> int:
    """Run one input of one target in the foreground; its traceback, if any, is the answer."""
    target = load(name)
    case = target.generate(input_rng(name, seed, index))
    print(target.describe(case), file=sys.stderr)
    with target.session() as check:
        print(json.dumps({"target": name, "index": index, "seed": seed, "outcome": dict(check(case))}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inputs", type=int, default=DEFAULT_INPUTS, help="per target (default %(default)s)")
    parser.add_argument("--targets", default=",".join(TARGET_MODULES), help="comma-separated (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="targets run in parallel processes")
    parser.add_argument(
        "--input-timeout-s", type=float, default=30.0, help="an input running longer is a hang"
    )
    parser.add_argument(
        "--memory-limit-gib", type=float, default=4.0, help="per process address space; 0: none"
    )
    parser.add_argument("--replay", type=int, metavar="INDEX", help="run input INDEX of the one target given")
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - set(TARGET_MODULES))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGET_MODULES)}")
    if args.replay is not None:
        if len(names) != 1:
            parser.error("--replay needs exactly one target")
        return replay(names[0], args.replay, args.seed)

    out: dict[str, Any] = {
        "benchmark": "fuzz",
        "environment": machine_environment(),
        "seed": args.seed,
        "inputs_per_target": args.inputs,
        "jobs": args.jobs,
        "targets": {},
    }
    started = time.monotonic()
    print(f"fuzzing {len(names)} targets x {args.inputs} inputs, {args.jobs} at a time", file=sys.stderr)
    task = (args.inputs, args.seed, args.input_timeout_s, args.memory_limit_gib)
    context = multiprocessing.get_context("spawn")  # no forked gRPC or event-loop state
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs), mp_context=context) as pool:
        slowest_first = sorted(names, key=lambda n: -US_PER_INPUT.get(n, 0))  # so the jobs finish together
        futures = {name: pool.submit(run_target, name, *task) for name in slowest_first}
        for name in names:
            out["targets"][name] = futures[name].result()
    results = out["targets"].values()
    out["totals"] = {
        key: sum(r[key] for r in results)
        for key in ("inputs", "unhandled_exceptions", "broken_promises", "hangs")
    }
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=2))
    failed = sum(out["totals"][k] for k in ("unhandled_exceptions", "broken_promises", "hangs"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
