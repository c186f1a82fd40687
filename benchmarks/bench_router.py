"""Router core microbenchmarks on the shared Mooncake trace; prints one JSON object on stdout.

    .venv/bin/python benchmarks/bench_router.py            # full run, about 1-3 minutes
    .venv/bin/python benchmarks/bench_router.py --quick    # about 20 s
    PYTHONPATH=. /tmp/probe/bin/python benchmarks/bench_router.py   # with ai-dynamo-runtime 1.6.1

What is measured (time.perf_counter_ns per call, warm-up excluded, medians and p99):
1. `RadixTree.apply_event` on a fresh tree: every trace request becomes one BlocksStored event
   (REFERENCE section 6 mapping: hash id h -> 512 copies of token h, input clamped to
   len(hash_ids) * 512, engine block size 64), on worker `i % W` for request i (round robin).
2. `RadixTree.find_matches` at 64, 512 and 2048 blocks on that tree: half the queries are real
   request prefixes (full match on the worker that stored them), half keep a real prefix of
   N/4..3N/4 blocks and continue with hashes never stored (partial match).
3. `KvRouter.best_worker(tokens)` probes (hashing included, tokens a list of ints) on a router fed
   the trace events and holding 32 in-flight requests (half prefill-complete), with a breakdown.
4. Memory: tracemalloc bytes of a tree per (worker, block) entry (`RadixTree.num_blocks()`), and
   the resident memory a fresh process adds building ours and (with Dynamo) Dynamo's tree from the
   same events (`--only memory`: this section alone). `--only live`: decisions as live traffic
   makes them (a first token and a free before each), 16 to 1,024 workers.
5. With `dynamo._core` importable, the same events and queries through Dynamo's Rust RadixTree
   in the same process (interleaved with ours), score agreement, ratios and the targets.
6. `RadixTree.apply_event` for BlocksRemoved on the tree of 1: newest request first, each one
   event naming its blocks leaf first (those its worker still holds), so shared prefixes go
   while older requests still hold their suffixes (runs split, then merge or vanish); then
   the same for a sample with one block per event. Against Dynamo too when importable.
7. Approximate mode's prune: ApproxIndexer at max_tree_size 2^20 (--prune-size) fed trace
   routings until its first prune ends, every record_routing timed (the pruning calls are the
   stalls); Dynamo's RadixTree given the same predicted events, then that prune in one go.
   `--only prune` / `--only remove` run one section.
8. The fleet curve: best_worker probes at 16, 64, 256 and 1,024 workers (1k/8k/32k tokens; hits,
   partial hits, misses) under Dynamo's cost and the timing model (each with the fleet-sized
   decision, and forced to the full scan), beside Dynamo's SelectionService.select on misses. `--only fleet`.
`nodes` are runs of consecutive blocks (RadixTree.num_nodes), not blocks.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # benchmark this checkout, whatever is installed
    sys.path.insert(0, str(REPO_ROOT))

from extproc.router import (  # noqa: E402
    ApproxIndexer,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    KvRouter,
    RadixTree,
    RouterConfig,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
    compute_sequence_hashes,
)

DEFAULT_TRACE = REPO_ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
TRACE_BLOCK_TOKENS = 512  # Mooncake hash ids name 512-token blocks
ENGINE_BLOCK_SIZE = 64  # Dynamo mocker default (REFERENCE section 6)
FIND_SIZES = (64, 512, 2048)
TOKEN_SIZES = {"1k": 1024, "8k": 8192, "32k": 32768}
QUERIES_PER_SIZE = 16
IN_FLIGHT = 32
FRESH_TOKEN_RANGE = (100_000, 150_000)  # above every trace hash id, so never stored
BS16_REQUESTS = 1000  # the block-size-16 router is fed the first requests only (memory)
TARGET_FIND_RATIO = 1.5
TARGET_STORE_FRACTION = 0.5
TARGET_BEST_WORKER_US = 150.0

clock = time.perf_counter_ns


def log(message: str) -> None:
    print(f"[bench_router {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- trace -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceRequest:
    index: int
    hash_ids: tuple[int, ...]
    input_tokens: int  # clamped to len(hash_ids) * 512

    def token_array(self) -> np.ndarray:
        ids = np.asarray(self.hash_ids, dtype=np.uint32)
        return np.repeat(ids, TRACE_BLOCK_TOKENS)[: self.input_tokens]

    def token_list(self, limit: int) -> list[int]:
        """The first `limit` tokens as a tokenizer returns them: a list of ints."""
        n = min(limit, self.input_tokens)
        out: list[int] = []
        for h in self.hash_ids[: -(-n // TRACE_BLOCK_TOKENS)]:
            out += [h] * TRACE_BLOCK_TOKENS
        del out[n:]
        return out


def load_trace(path: Path) -> list[TraceRequest]:
    requests = []
    with path.open() as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            ids = tuple(int(h) for h in row["hash_ids"])
            requests.append(
                TraceRequest(i, ids, min(int(row["input_length"]), len(ids) * TRACE_BLOCK_TOKENS))
            )
    return requests


@dataclass(frozen=True, slots=True)
class Hashed:
    local: list[int]
    seq: list[int]


def hash_requests(requests: Sequence[TraceRequest], block_size: int) -> list[Hashed]:
    out = []
    for r in requests:
        local = compute_block_hashes(r.token_array(), block_size)
        out.append(Hashed(local, compute_sequence_hashes(local)))
    return out


def stored_events(hashed: Sequence[Hashed], workers: int) -> list[BlocksStored]:
    """One event per request, request i on worker i % workers; engine ids are sequence hashes."""
    return [
        BlocksStored(Worker(i % workers), tuple(map(StoredBlock, h.seq, h.local)), None)
        for i, h in enumerate(hashed)
    ]


def reassign(events: Sequence[BlocksStored], workers: int) -> list[BlocksStored]:
    return [BlocksStored(Worker(i % workers), ev.blocks, None) for i, ev in enumerate(events)]


# --- statistics --------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    return sorted_values[max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))]


def summary_us(samples_ns: Sequence[int]) -> dict[str, Any]:
    values = sorted(samples_ns)
    return {
        "median_us": round(statistics.median(values) / 1e3, 2),
        "p99_us": round(percentile(values, 0.99) / 1e3, 2),
        "min_us": round(values[0] / 1e3, 2),
        "calls": len(values),
    }


def time_calls(fn: Callable[[Any], object], args: Sequence[Any], passes: int, warmup: int = 1) -> list[int]:
    """Per-call ns of fn(a) for every a in args, `passes` times; `warmup` untimed passes first."""
    for _ in range(warmup):
        for a in args:
            fn(a)
    samples = []
    for _ in range(passes):
        for a in args:
            t0 = clock()
            fn(a)
            samples.append(clock() - t0)
    return samples


# --- 1 and 5: applying stored events -----------------------------------------------------------


def build_ours(events: Sequence[BlocksStored]) -> tuple[RadixTree, int, list[int]]:
    tree = RadixTree()
    apply = tree.apply_event
    per_event = []
    start = clock()
    for ev in events:
        t0 = clock()
        apply(ev)
        per_event.append(clock() - t0)
    return tree, clock() - start, per_event


def build_dynamo(core: Any, payloads: Sequence[tuple[int, bytes]]) -> tuple[Any, int, list[int]]:
    tree = core.RadixTree()
    apply = tree.apply_event
    per_event = []
    start = clock()
    for worker_id, body in payloads:
        t0 = clock()
        apply(worker_id, body)
        per_event.append(clock() - t0)
    tree.find_matches([0])  # queued behind every event, should the binding apply them asynchronously
    return tree, clock() - start, per_event


def iter_dynamo_payloads(events: Iterable[BlocksStored]) -> Iterator[tuple[int, bytes]]:
    """Dynamo's KvCacheEvent JSON per event, consecutive event ids per worker."""
    next_id: dict[int, int] = defaultdict(int)
    for ev in events:
        wid = int(ev.worker.worker_id)
        blocks = [{"block_hash": b.engine_hash, "tokens_hash": b.local_hash} for b in ev.blocks]
        body = {
            "event_id": next_id[wid],
            "data": {"stored": {"parent_hash": None, "blocks": blocks}},
            "dp_rank": 0,
        }
        next_id[wid] += 1
        yield wid, json.dumps(body, separators=(",", ":")).encode()


def dynamo_payloads(events: Sequence[BlocksStored]) -> list[tuple[int, bytes]]:
    return list(iter_dynamo_payloads(events))


def throughput(total_ns: Sequence[int], events: int, blocks: int, per_event: list[int]) -> dict[str, Any]:
    best = statistics.median(total_ns)
    return {
        "builds": len(total_ns),
        "events_per_s": round(events / (best / 1e9)),
        "blocks_per_s": round(blocks / (best / 1e9)),
        "build_s_median": round(best / 1e9, 3),
        "build_s_all": [round(t / 1e9, 3) for t in total_ns],
        "per_event": summary_us(per_event),
    }


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


class GcWatch:
    """Counts the collector's runs per generation and the time spent in full (gen 2) ones."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.full_ns = 0
        self._t0 = 0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.runs[info["generation"]] += 1
            self._t0 = clock()
        elif info["generation"] == 2:
            self.full_ns += clock() - self._t0

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def run_apply(events, payloads, core, builds: int) -> tuple[dict, dict | None, RadixTree, Any]:
    blocks = sum(len(ev.blocks) for ev in events)
    log(f"apply_event: {len(events)} events, {blocks} blocks, {builds} fresh builds per tree")
    warm = min(200, len(events))
    build_ours(events[:warm])  # warm-up: code paths, allocator
    if core is not None:
        build_dynamo(core, payloads[:warm])
    ours_totals: list[int] = []
    ours_per: list[int] = []
    dyn_totals: list[int] = []
    dyn_per: list[int] = []
    tree = dyn_tree = None
    dyn_rss = None
    watch = GcWatch()
    for b in range(builds):  # interleaved so both see the same machine load
        tree = None
        gc.collect()
        with watch:
            tree, total, per = build_ours(events)
        ours_totals.append(total)
        ours_per += per
        if core is not None:
            dyn_tree = None
            gc.collect()
            before = rss_bytes()
            dyn_tree, total, per = build_dynamo(core, payloads)
            after = rss_bytes()
            if b == 0 and before is not None and after is not None:
                dyn_rss = after - before
            dyn_totals.append(total)
            dyn_per += per
        log(
            f"  build {b + 1}/{builds}: ours {ours_totals[-1] / 1e9:.3f} s"
            + (f", dynamo {dyn_totals[-1] / 1e9:.3f} s" if core is not None else "")
        )
    assert tree is not None
    ours = throughput(ours_totals, len(events), blocks, ours_per)
    ours["gc_per_build"] = {
        "collections_by_generation": [round(n / builds, 1) for n in watch.runs],
        "full_collection_ms": round(watch.full_ns / builds / 1e6, 1),
    }
    tree = None
    gc.collect()
    gc.disable()  # one more build without the cyclic collector, to show its share
    try:
        tree, total, _ = build_ours(events)
    finally:
        gc.enable()
    ours["gc_disabled_build_s"] = round(total / 1e9, 3)
    ours["entries"] = tree.num_blocks()
    ours["nodes"] = tree.num_nodes
    ours["blocks_in_events"] = blocks
    dyn = None
    if core is not None:
        dyn = throughput(dyn_totals, len(events), blocks, dyn_per)
        if dyn_rss is not None:
            dyn["rss_delta_mib_first_build"] = round(dyn_rss / 2**20, 1)
            dyn["rss_mib_per_million_entries_approx"] = round(dyn_rss / 2**20 / (tree.num_blocks() / 1e6), 1)
    return ours, dyn, tree, dyn_tree


# --- 6: removing blocks ------------------------------------------------------------------------


def removal_events(events: Sequence[BlocksStored]) -> list[BlocksRemoved]:
    """Newest request first, its blocks leaf first, each (worker, engine id) named once."""
    gone: set[tuple[Worker, int]] = set()
    out = []
    for ev in reversed(events):
        ids = tuple(b.engine_hash for b in reversed(ev.blocks) if (ev.worker, b.engine_hash) not in gone)
        gone.update((ev.worker, e) for e in ids)
        if ids:
            out.append(BlocksRemoved(ev.worker, ids))
    return out


def dynamo_removal_payloads(removals: Sequence[BlocksRemoved], first_id: int) -> list[tuple[int, bytes]]:
    next_id: dict[int, int] = defaultdict(lambda: first_id)
    out = []
    for ev in removals:
        wid = int(ev.worker.worker_id)
        body = {
            "event_id": next_id[wid],
            "data": {"removed": {"block_hashes": list(ev.engine_hashes)}},
            "dp_rank": 0,
        }
        next_id[wid] += 1
        out.append((wid, json.dumps(body, separators=(",", ":")).encode()))
    return out


def time_events(apply: Callable[..., object], items: Sequence[Any], star: bool) -> tuple[int, list[int]]:
    per = []
    start = clock()
    for item in items:
        t0 = clock()
        if star:
            apply(*item)
        else:
            apply(item)
        per.append(clock() - t0)
    return clock() - start, per


def run_remove(events, payloads, core, builds: int) -> tuple[dict, dict | None]:
    """Fresh trees (untimed builds), then every removal event timed; interleaved with Dynamo."""
    removals = removal_events(events)
    blocks = sum(len(ev.engine_hashes) for ev in removals)
    singles = [BlocksRemoved(ev.worker, (e,)) for ev in removals[:300] for e in ev.engine_hashes]
    dyn_removals = dynamo_removal_payloads(removals, first_id=len(events)) if core is not None else []
    log(f"remove: {len(removals)} events, {blocks} blocks, {builds} rounds")
    ours_totals: list[int] = []
    ours_per: list[int] = []
    single_per: list[int] = []
    dyn_totals: list[int] = []
    dyn_per: list[int] = []
    nodes_left = []
    for _ in range(builds):
        tree, _, _ = build_ours(events)
        gc.collect()
        total, per = time_events(tree.apply_event, removals, star=False)
        ours_totals.append(total)
        ours_per += per
        nodes_left.append(tree.num_nodes)
        tree, _, _ = build_ours(events)
        single_per += time_events(tree.apply_event, singles, star=False)[1]
        tree = None
        if core is not None:
            dyn_tree, _, _ = build_dynamo(core, payloads)
            gc.collect()
            start = clock()
            _, per = time_events(dyn_tree.apply_event, dyn_removals, star=True)
            dyn_tree.find_matches([0])  # queued behind every event, as in build_dynamo: timed too
            dyn_totals.append(clock() - start)
            dyn_per += per
            dyn_tree = None
    ours = throughput(ours_totals, len(removals), blocks, ours_per)
    ours["nodes_left"] = nodes_left
    ours["one_block_per_event"] = {
        "events": len(singles),
        "what": "the first 300 removal events, one BlocksRemoved per block, on a fresh tree",
        **summary_us(single_per),
    }
    dyn = throughput(dyn_totals, len(removals), blocks, dyn_per) if core is not None else None
    log(
        f"  remove: ours {ours['blocks_per_s']} blocks/s"
        + (f", dynamo {dyn['blocks_per_s']} blocks/s" if dyn else "")
    )
    return ours, dyn


# --- 7: approximate mode's pruning -------------------------------------------------------------


class RecordingTree(RadixTree):
    """A RadixTree that also keeps every event it is given (to replay them into Dynamo's)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[KvEvent] = []

    def apply_event(self, event: KvEvent) -> bool:
        self.log.append(event)
        return super().apply_event(event)


def predicted_to_u64(engine_hash: int) -> int:
    return -(1 << 64) - engine_hash  # approx.py's predicted ids are -(2^64) - sequence hash


def dynamo_event_payloads(log_events: Sequence[KvEvent]) -> list[tuple[int, bytes]]:
    """Dynamo's JSON for recorded stored/removed prediction events, ids mapped back to u64."""
    next_id: dict[int, int] = defaultdict(int)
    out = []
    for ev in log_events:
        wid = int(ev.worker.worker_id)
        if isinstance(ev, BlocksStored):
            parent = None if ev.parent_hash is None else predicted_to_u64(ev.parent_hash)
            blocks = [
                {"block_hash": predicted_to_u64(b.engine_hash), "tokens_hash": b.local_hash}
                for b in ev.blocks
            ]
            data: dict[str, Any] = {"stored": {"parent_hash": parent, "blocks": blocks}}
        else:
            assert isinstance(ev, BlocksRemoved)
            data = {"removed": {"block_hashes": [predicted_to_u64(e) for e in ev.engine_hashes]}}
        out.append((wid, json.dumps({"event_id": next_id[wid], "data": data, "dp_rank": 0}).encode()))
        next_id[wid] += 1
    return out


def run_prune(
    hashed: Sequence[Hashed], core: Any, max_tree_size: int, workers: int, rounds: int
) -> dict[str, Any]:
    """ApproxIndexer fed trace routings (request i -> worker (i + 5 * pass) % W) past its size
    bound: every record_routing call timed; the calls that pruned are the stalls. Dynamo: its
    RadixTree given the same predicted events up to the first prune, then that whole prune as one
    removal event per worker (what its approximate indexer's pruner sends its tree), timed."""
    log(f"approx prune: max_tree_size {max_tree_size}, {workers} workers, {rounds} rounds")
    ours_stalls: list[int] = []
    clean_stalls: list[int] = []  # pruning calls during which no full collection ran
    gc_calls = gc_quiet = 0
    other_max: list[int] = []
    pop_ns = [0, 0]  # time in ApproxIndexer._pop_oldest (choosing and removing), predictions popped
    dyn_stall: list[int] = []
    dyn_blocks = 0
    first: dict[str, Any] = {}
    for r in range(rounds):
        tree = RecordingTree()
        approx = ApproxIndexer(tree, ttl_s=1e12, max_tree_size=max_tree_size, prune_target_ratio=0.8)
        pop_oldest = approx._pop_oldest

        def timed_pop(count: int, pop_oldest: Callable[[int], int] = pop_oldest) -> int:
            t0 = clock()
            n = pop_oldest(count)
            pop_ns[0] += clock() - t0
            pop_ns[1] += n
            return n

        approx._pop_oldest = timed_pop  # type: ignore[method-assign]
        gc.collect()
        calls = 0
        trigger_log = -1
        pruning_calls: list[int] = []
        quiet: list[int] = []
        t = 0.0
        done = False
        watch = GcWatch()
        with watch:
            for p in range(100):
                for i, h in enumerate(hashed):
                    worker = Worker((i + 5 * p) % workers)
                    before = approx.pruned_blocks
                    full = watch.runs[2]
                    mark = len(tree.log)
                    t0 = clock()
                    approx.record_routing(worker, h.local, t, seq_hashes=h.seq)
                    ns = clock() - t0
                    t += 0.001
                    calls += 1
                    n = approx.pruned_blocks - before
                    if n:
                        if trigger_log < 0:
                            trigger_log = mark
                            first = {"calls_before": calls, "entries_before": len(approx) + n}
                        pruning_calls.append(ns)
                        if watch.runs[2] == full:
                            clean_stalls.append(ns)
                        else:
                            gc_calls += 1
                    else:
                        if watch.runs[2] == full:
                            quiet.append(ns)
                        else:
                            gc_quiet += 1
                        if trigger_log >= 0 and not getattr(approx, "pruning", False):
                            done = True
                            break
                if done:
                    break
        ours_stalls += pruning_calls
        other_max.append(max(quiet))
        if core is not None and trigger_log >= 0:
            stored = [ev for ev in tree.log[:trigger_log]]
            pruned: dict[Worker, list[int]] = defaultdict(list)
            for ev in tree.log[trigger_log:]:
                if isinstance(ev, BlocksRemoved):
                    pruned[ev.worker] += ev.engine_hashes
                else:
                    stored.append(ev)  # a routing's new blocks (ours interleaves them with slices)
            removals = [BlocksRemoved(w, tuple(ids)) for w, ids in pruned.items()]
            dyn_tree, _, _ = build_dynamo(core, dynamo_event_payloads(stored))
            payloads = dynamo_event_payloads(removals)
            dyn_tree.find_matches([0])
            t0 = clock()
            for wid, body in payloads:
                dyn_tree.apply_event(wid, body)
            dyn_tree.find_matches([0])  # a barrier, should events be applied asynchronously
            dyn_stall.append(clock() - t0)
            dyn_blocks += sum(len(ev.engine_hashes) for ev in removals)
            dyn_tree = None
        tree = approx = None
        log(
            f"  round {r + 1}: ours max prune call {max(pruning_calls) / 1e6:.1f} ms"
            f" over {len(pruning_calls)} calls"
            + (f", dynamo whole prune {dyn_stall[-1] / 1e6:.1f} ms" if dyn_stall else "")
        )
    ours = {
        "max_tree_size": max_tree_size,
        "first_prune": first,
        "pruning_calls": len(ours_stalls),
        "stall_max_ms": round(max(ours_stalls) / 1e6, 2),
        "stall_max_ms_without_full_gc": round(max(clean_stalls, default=0) / 1e6, 2),
        "pruning_calls_with_full_gc": gc_calls,
        "stall_median_ms": round(statistics.median(ours_stalls) / 1e6, 3),
        "non_pruning_call_max_ms_without_full_gc": round(max(other_max) / 1e6, 2),
        "non_pruning_calls_with_full_gc": gc_quiet,
        "pruned_blocks_per_s": round(pop_ns[1] / (pop_ns[0] / 1e9)),
        "what": (
            "record_routing calls that pruned (routing included), per round until pruning ends; "
            "pruned_blocks_per_s: predictions popped over time in _pop_oldest (choosing + tree removal)"
        ),
    }
    dyn = None
    if dyn_stall:
        dyn = {
            "stall_max_ms": round(max(dyn_stall) / 1e6, 2),
            "stall_median_ms": round(statistics.median(dyn_stall) / 1e6, 2),
            "pruned_blocks_per_s": round(dyn_blocks / (sum(dyn_stall) / 1e9)),
            "what": "RadixTree.apply_event of the same prune, one removal event per worker, in one go",
        }
    return {"ours": ours, "dynamo": dyn}


# --- 2 and 5: find_matches ---------------------------------------------------------------------


def find_queries(hashed: Sequence[Hashed], size: int, rng: random.Random) -> tuple[list[list[int]], int]:
    """Half real prefixes (full match), half a real prefix then never-stored hashes (partial)."""
    eligible = [h for h in hashed if len(h.local) >= size]
    picked = rng.sample(eligible, min(QUERIES_PER_SIZE, len(eligible)))
    full = len(picked) // 2
    queries = [h.local[:size] for h in picked[:full]]
    for h in picked[full:]:
        keep = rng.randint(size // 4, 3 * size // 4)
        queries.append(h.local[:keep] + [rng.getrandbits(64) for _ in range(size - keep)])
    return queries, full


def find_timings(fns: dict[str, Callable], queries, passes: int, idle_passes: int, acc: dict) -> None:
    """Adds, per implementation, per mode, per query, the ns of each call to `acc`.

    Implementations alternate call by call so both see the same machine load. Modes:
    "interleaved" calls back to back; "idle_1ms" sleeps 1 ms before each call, as a picker
    between requests does (Dynamo's binding hands each call to another thread, whose latency
    depends on whether that thread is awake).
    """
    for mode, mode_passes, gap in (("interleaved", passes, 0.0), ("idle_1ms", idle_passes, 0.001)):
        for _ in range(mode_passes):
            for i, q in enumerate(queries):
                for name, fn in fns.items():
                    if gap:
                        time.sleep(gap)
                    t0 = clock()
                    fn(q)
                    acc[name][mode][i].append(clock() - t0)


def find_summary(per_mode: dict[str, list[list[int]]], full: int) -> dict[str, Any]:
    per_query = per_mode["interleaved"]
    return {
        **summary_us([t for per in per_query for t in per]),
        "full_match_median_us": summary_us([t for per in per_query[:full] for t in per])["median_us"],
        "partial_match_median_us": summary_us([t for per in per_query[full:] for t in per])["median_us"],
        "idle_1ms": summary_us([t for per in per_mode["idle_1ms"] for t in per]),
    }


def run_find(tree: RadixTree, dyn_tree: Any, hashed, rounds: int, passes: int, idle_passes: int, rng):
    """Sizes take turns over `rounds` rounds, so a burst of machine load spreads over all of them."""
    fns: dict[str, Callable] = {"ours": tree.find_matches}
    if dyn_tree is not None:
        fns["dynamo"] = lambda q: dyn_tree.find_matches(q).scores
    sets = {size: find_queries(hashed, size, rng) for size in FIND_SIZES}
    sets = {size: qf for size, qf in sets.items() if qf[0]}
    acc = {
        size: {name: {"interleaved": [[] for _ in q], "idle_1ms": [[] for _ in q]} for name in fns}
        for size, (q, _) in sets.items()
    }
    for queries, _ in sets.values():  # warm-up
        for _ in range(2):
            for q in queries:
                for fn in fns.values():
                    fn(q)
    for _ in range(rounds):
        for size, (queries, _) in sets.items():
            find_timings(fns, queries, max(1, passes // rounds), max(1, idle_passes // rounds), acc[size])
    ours_out: dict[str, Any] = {str(size): None for size in FIND_SIZES}
    dyn_out: dict[str, Any] = {}
    mismatches = 0
    for size, (queries, full) in sets.items():
        depth = [max(tree.find_matches(q).values(), default=0) for q in queries]
        ours_out[str(size)] = {
            **find_summary(acc[size]["ours"], full),
            "queries": len(queries),
            "full_match_queries": full,
            "deepest_match_blocks_median": statistics.median(depth),
        }
        line = f"  find_matches {size}: ours median {ours_out[str(size)]['median_us']} us"
        if dyn_tree is not None:
            dyn_out[str(size)] = find_summary(acc[size]["dynamo"], full)
            for q in queries:
                ours = {(w.worker_id, w.dp_rank): s for w, s in tree.find_matches(q).items()}
                theirs = {tuple(k): v for k, v in fns["dynamo"](q).items()}
                mismatches += ours != theirs
            line += f", dynamo {dyn_out[str(size)]['median_us']} us"
        log(line)
    return ours_out, (dyn_out, mismatches == 0, mismatches) if dyn_tree is not None else None


# --- 3: best_worker ----------------------------------------------------------------------------


def make_router(workers: int, block_size: int, events: Sequence[BlocksStored]) -> KvRouter:
    router = KvRouter(
        RouterConfig(block_size=block_size),
        clock=time.monotonic,
        rng=random.Random(0),
        workers=[WorkerSpec(i) for i in range(workers)],
    )
    for ev in events:
        router.apply_event(ev)
    return router


def add_in_flight(router: KvRouter, requests: Sequence[TraceRequest], rng: random.Random) -> None:
    """32 tracked requests (1k-16k tokens of real trace prompts); every other one prefill-complete."""
    for k, r in enumerate(rng.sample(list(requests), IN_FLIGHT)):
        rid = f"inflight-{k}"
        router.best_worker(r.token_list(rng.randint(1024, 16384)), request_id=rid)
        if k % 2:
            router.mark_prefill_complete(rid)


def probe_queries(requests: Sequence[TraceRequest], tokens: int, rng: random.Random) -> list[list[int]]:
    """Real trace prompts cut to `tokens`; half continue with never-stored tokens after 1/4-3/4."""
    eligible = [r for r in requests if r.input_tokens >= tokens]
    out = []
    for k, r in enumerate(rng.sample(eligible, min(QUERIES_PER_SIZE, len(eligible)))):
        toks = r.token_list(tokens)
        if k % 2:
            keep = rng.randint(tokens // 4, 3 * tokens // 4)
            toks[keep:] = [rng.randrange(*FRESH_TOKEN_RANGE) for _ in range(tokens - keep)]
        out.append(toks)
    return out


@dataclass
class Job:
    """One timed call shape: fn over each of args, samples in ns."""

    fn: Callable[[Any], object]
    args: Sequence[Any]
    samples: list[int]


def run_jobs(jobs: dict[str, Job], rounds: int, passes: int) -> None:
    """Warm every job up, then let them take turns over `rounds` rounds (load bursts spread out)."""
    for job in jobs.values():
        for _ in range(2):
            for a in job.args:
                job.fn(a)
    for _ in range(rounds):
        for job in jobs.values():
            job.samples += time_calls(job.fn, job.args, max(1, passes // rounds), warmup=0)


def breakdown_jobs(router: KvRouter, queries: list[list[int]], tokens: int) -> dict[str, Job]:
    """The router's steps one by one on the same queries, to show where a decision's time goes."""
    bs = router.config.block_size
    local = [compute_block_hashes(q, bs) for q in queries]
    return {
        "total_best_worker": Job(router.best_worker, queries, []),
        "compute_block_hashes": Job(lambda q: compute_block_hashes(q, bs), queries, []),
        "compute_sequence_hashes": Job(compute_sequence_hashes, local, []),
        "find_matches": Job(router.indexer.find_matches, local, []),
        "best_worker_for_hashes": Job(lambda h: router.best_worker_for_hashes(h, tokens), local, []),
    }


def breakdown_summary(jobs: dict[str, Job]) -> dict[str, Any]:
    med = {k: statistics.median(j.samples) / 1e3 for k, j in jobs.items()}
    out: dict[str, Any] = {k: summary_us(j.samples) for k, j in jobs.items()}
    rest = med["total_best_worker"] - med["compute_block_hashes"] - med["compute_sequence_hashes"]
    rest -= med["find_matches"]
    out["rest_median_us"] = round(rest, 2)
    out["rest_is"] = "total - hashing - sequence hashes - find_matches: loads (new_blocks), costs, pick"
    out["share_of_total"] = {
        k: round(med[k] / med["total_best_worker"], 3)
        for k in ("compute_block_hashes", "compute_sequence_hashes", "find_matches")
    } | {"rest": round(rest / med["total_best_worker"], 3)}
    return out


def run_best_worker(requests, events, counts, rounds, passes, rng, quick) -> dict[str, Any]:
    """Builds every router first, then times all cases in turns (see run_jobs)."""
    routers: list[tuple[str, KvRouter, Sequence[TraceRequest], list[str]]] = []
    for workers in counts:
        evs = events if workers == counts[0] else reassign(events, workers)
        router = make_router(workers, ENGINE_BLOCK_SIZE, evs)
        add_in_flight(router, requests, rng)
        routers.append((f"{workers}_workers_bs{ENGINE_BLOCK_SIZE}", router, requests, list(TOKEN_SIZES)))
    bs16_note = None
    if 16 in counts:
        subset = requests[: 300 if quick else BS16_REQUESTS]
        log(f"  block size 16: hashing the first {len(subset)} requests")
        router = make_router(16, 16, stored_events(hash_requests(subset, 16), 16))
        add_in_flight(router, subset, rng)
        routers.append(("16_workers_bs16", router, subset, ["8k"]))
        bs16_note = f"fed the first {len(subset)} trace requests only ({router.indexer.num_blocks()} entries)"
    jobs: dict[str, Job] = {}
    request_blocks: dict[str, int] = {}
    parts: dict[str, Job] = {}
    for label, router, reqs, sizes in routers:
        for name in sizes:
            queries = probe_queries(reqs, TOKEN_SIZES[name], rng)
            if queries:
                jobs[f"{name}_tokens_{label}"] = Job(router.best_worker, queries, [])
                request_blocks[f"{name}_tokens_{label}"] = router.best_worker(queries[0]).request_blocks
        if label == f"16_workers_bs{ENGINE_BLOCK_SIZE}":
            parts = breakdown_jobs(router, probe_queries(reqs, 8192, rng), 8192)
    log(f"  timing {len(jobs)} cases and the breakdown in {rounds} rounds")
    run_jobs({**jobs, **{f"part:{k}": j for k, j in parts.items()}}, rounds, passes)
    cases: dict[str, Any] = {}
    for key, job in jobs.items():
        cases[key] = {
            **summary_us(job.samples),
            "queries": len(job.args),
            "request_blocks": request_blocks[key],
        }
        log(f"  best_worker {key}: median {cases[key]['median_us']} us")
    out: dict[str, Any] = {
        "setup": (
            f"KvRouter(RouterConfig(block_size=B)), WorkerSpec(i) ids, indexer fed the trace events "
            f"(request i on worker i % W); {IN_FLIGHT} in-flight requests tracked with request_id "
            "(1k-16k-token trace prompts), every other one prefill-complete; timed calls are probes "
            "(no request_id) on real trace prompts cut to the size, half of them diverging into "
            "never-stored tokens after 1/4-3/4 of the prompt; tokens are Python lists of ints"
        ),
        "cases": cases,
    }
    if parts:
        out["breakdown_8k_tokens_16_workers_bs64"] = breakdown_summary(parts)
    if bs16_note:
        out["bs16_indexer"] = bs16_note
    routers.clear()
    gc.collect()
    return out


# --- 4: memory ---------------------------------------------------------------------------------


def memory_events(requests: Sequence[TraceRequest], workers: int) -> Iterator[BlocksStored]:
    """`run_memory`'s layout as events, hashed one request at a time (nothing else stays alive)."""
    second = max(1, workers // 2)
    for i, r in enumerate(requests):
        tokens = r.token_array()
        for worker in (i % workers, workers + i % second):
            local = compute_block_hashes(tokens, ENGINE_BLOCK_SIZE)
            seq = compute_sequence_hashes(local)
            yield BlocksStored(Worker(worker), tuple(map(StoredBlock, seq, local)), None)


def run_memory(requests: Sequence[TraceRequest], workers: int) -> dict[str, Any]:
    """Request i stored on worker i % W and again on worker W + i % (W/2), hashed inside tracing.

    Hashes are computed while tracing (twice, once per event), so the tree owns its ints as it
    would after decoding real events; tracemalloc counts Python-allocated bytes only.
    """
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tree = RadixTree()
    for ev in memory_events(requests, workers):
        tree.apply_event(ev)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    entries = tree.num_blocks()
    return {
        "entries": entries,
        "entries_counted_as": "RadixTree.num_blocks(): (worker, engine block id) pairs",
        "nodes": tree.num_nodes,
        "workers": len(tree.workers()),
        "layout": (
            f"{len(requests)} trace requests, request i on worker i % {workers} and again on worker "
            f"{workers} + i % {max(1, workers // 2)}: shared prefixes across workers plus private suffixes"
        ),
        "traced_bytes": used,
        "bytes_per_entry": round(used / entries, 1),
        "mib_per_million_entries": round(used / entries * 1e6 / 2**20, 1),
        "bytes_per_node": round(used / max(1, tree.num_nodes), 1),
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(kind: str, trace: Path, workers: int, count: int | None) -> dict[str, Any]:
    """In this (fresh) process: resident bytes added by building one tree from `run_memory`'s
    layout: ours (`RadixTree`) or Dynamo's (`dynamo._core.RadixTree`, fed its event JSON)."""
    requests = load_trace(trace)[:count]
    gc.collect()
    base = _rss_bytes()
    if kind == "ours":
        tree = RadixTree()
        for ev in memory_events(requests, workers):
            tree.apply_event(ev)
    else:
        core, reason = import_dynamo(False)
        if core is None:
            return {"error": reason}
        tree = core.RadixTree()
        for wid, body in iter_dynamo_payloads(memory_events(requests, workers)):
            tree.apply_event(wid, body)
        tree.find_matches([0])  # queued behind every event, should the binding apply them asynchronously
    gc.collect()
    used = _rss_bytes() - base
    entries = len({(ev.worker, b.engine_hash) for ev in memory_events(requests, workers) for b in ev.blocks})
    return {
        "kind": kind,
        "entries": entries,
        "rss_bytes": used,
        "rss_bytes_per_entry": round(used / entries, 1),
    }


def run_memory_rss(trace: Path, workers: int, count: int | None, with_dynamo: bool) -> dict[str, Any]:
    """Ours and Dynamo's tree, each built in a fresh process: resident memory per entry, side by
    side (tracemalloc cannot see Dynamo's Rust allocations)."""
    out: dict[str, Any] = {"measured_as": "resident set growth of a fresh process building one tree"}
    for kind in ("ours", "dynamo") if with_dynamo else ("ours",):
        cmd = [
            sys.executable,
            __file__,
            "--memory-child",
            kind,
            "--trace",
            str(trace),
            "--workers",
            str(workers),
        ]
        if count is not None:
            cmd += ["--memory-requests", str(count)]
        log(f"memory ({kind}, fresh process)")
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
        out[kind] = json.loads(done.stdout)
    ours, theirs = out.get("ours"), out.get("dynamo")
    if ours and theirs and "rss_bytes_per_entry" in theirs:
        out["bytes_per_entry_ours_over_dynamo"] = round(
            ours["rss_bytes_per_entry"] / theirs["rss_bytes_per_entry"], 3
        )
    return out


# --- 8: the fleet curve ----------------------------------------------------------------------


FLEET_COUNTS = (16, 64, 256, 1024)
FLEET_REQUESTS = 2000  # trace requests whose events feed every fleet's indexer (round robin)
FLEET_QUERIES = 8  # per size and kind


def fleet_queries(
    requests: Sequence[TraceRequest], tokens: int, rng: random.Random
) -> dict[str, list[list[int]]]:
    """Hits (trace prompts cut to the size), partial hits (a real 1/4..3/4 then never-stored
    tokens) and misses (never-stored tokens only)."""
    eligible = [r for r in requests if r.input_tokens >= tokens]
    picked = rng.sample(eligible, min(FLEET_QUERIES, len(eligible)))
    hits = [r.token_list(tokens) for r in picked]
    partial = []
    for toks in hits:
        keep = rng.randint(tokens // 4, 3 * tokens // 4)
        partial.append(toks[:keep] + [rng.randrange(*FRESH_TOKEN_RANGE) for _ in range(tokens - keep)])
    misses = [[rng.randrange(*FRESH_TOKEN_RANGE) for _ in range(tokens)] for _ in range(FLEET_QUERIES)]
    return {"hit": hits, "partial": partial, "miss": misses}


def fleet_routers(workers: int, events: Sequence[BlocksStored], requests, rng) -> dict[str, KvRouter]:
    """Routers fed alike: Dynamo's cost and the timing model, each with the fleet-sized decision
    and forced to the full scan (the decision before it)."""
    routers = {}
    for label, model, full in (
        ("none", "none", False),
        ("none_full_scan", "none", True),
        ("timing", "timing", False),
        ("timing_full_scan", "timing", True),
    ):
        router = KvRouter(
            RouterConfig(block_size=ENGINE_BLOCK_SIZE, prefill_load_model=model),
            clock=time.monotonic,
            rng=random.Random(0),
            workers=[WorkerSpec(i) for i in range(workers)],
        )
        if full:
            router.full_scan_max_workers = 10**9
        for ev in events:
            router.apply_event(ev)
        routers[label] = router
    loads = random.Random(rng.random())
    in_flight = max(IN_FLIGHT, workers)
    for k in range(in_flight):  # one request in flight per worker on average, every other decoding
        r = loads.choice(requests)
        toks = r.token_list(loads.randint(1024, 16384))
        for router in routers.values():
            router.best_worker(toks, request_id=f"inflight-{k}")
            if k % 2:
                router.mark_prefill_complete(f"inflight-{k}")
    return routers


async def _awaited(call: Callable[[Any], Any], arg: Any) -> Any:
    """Dynamo's coroutines need a running loop when they are made, not only when awaited."""
    return await call(arg)


def dynamo_fleet(core: Any, workers: int) -> tuple[Any, Any]:
    """Dynamo's SelectionService with `workers` schedulable workers (no KV events, no load), and
    the event loop its calls run on."""
    import asyncio

    loop = asyncio.new_event_loop()
    service = core.SelectionService(indexer_threads=1)
    for i in range(workers):
        loop.run_until_complete(
            _awaited(
                service.upsert_worker,
                {
                    "worker_id": i,
                    "endpoint": f"http://127.0.0.1:{20000 + i}",
                    "block_size": ENGINE_BLOCK_SIZE,
                    "kv_events_endpoint": f"tcp://127.0.0.1:{30000 + i}",
                    "total_kv_blocks": 16384,
                    "max_num_batched_tokens": 8192,
                },
            )
        )
    return service, loop


LIVE_DECISIONS = 400  # per fleet size


class _StepClock:
    """A clock the live fleet moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_fleet_live(counts: Sequence[int], decisions: int, seed: int) -> dict[str, Any]:
    """Decisions as live traffic makes them: the default kv router (timing model, pass times
    learned), max(32, W) requests in flight, and before each 1k-token miss one request's first
    token (a learning observation) and its end. Medians in microseconds, and each size over 16."""
    out: dict[str, Any] = {
        "what": (
            "KvRouter.best_worker of a 1k-token miss, default config, each after a first token and a "
            "free with 10-200 ms of clock between decisions"
        )
    }
    for workers in counts:
        rng = random.Random(seed)
        clock = _StepClock()
        router = KvRouter(
            RouterConfig(block_size=ENGINE_BLOCK_SIZE),
            clock=clock,
            rng=random.Random(seed),
            workers=[WorkerSpec(f"w{i}") for i in range(workers)],
        )
        in_flight: list[str] = []
        for k in range(max(32, workers)):
            router.best_worker([rng.randrange(10**9) for _ in range(1024)], request_id=f"bg{k}")
            in_flight.append(f"bg{k}")
        times = []
        for k in range(decisions):
            clock.now += rng.uniform(0.01, 0.2)
            done = in_flight.pop(0)
            router.mark_prefill_complete(done)
            router.free(done)
            tokens = [rng.randrange(10**9) for _ in range(1024)]
            t0 = time.perf_counter_ns()
            router.best_worker(tokens, request_id=f"q{k}")
            times.append(time.perf_counter_ns() - t0)
            in_flight.append(f"q{k}")
        out[str(workers)] = {"median_us": round(statistics.median(times) / 1e3, 1), "decisions": decisions}
    first = out.get(str(counts[0]))
    if first:
        for workers in counts:
            out[str(workers)]["over_first"] = round(out[str(workers)]["median_us"] / first["median_us"], 2)
    return out


def run_fleet(
    requests: Sequence[TraceRequest], core: Any, counts, rounds: int, passes: int, rng
) -> dict[str, Any]:
    """best_worker probes over 16..1,024 workers, by size and kind; Dynamo's select on misses."""
    subset = requests[:FLEET_REQUESTS]
    hashed = hash_requests(subset, ENGINE_BLOCK_SIZE)
    queries = {name: fleet_queries(subset, tokens, rng) for name, tokens in TOKEN_SIZES.items()}
    jobs: dict[str, Job] = {}
    keep: list[Any] = []
    for workers in counts:
        log(f"  fleet of {workers}: routers and in-flight requests")
        routers = fleet_routers(workers, stored_events(hashed, workers), subset, rng)
        keep.append(routers)
        for label, router in routers.items():
            for size, kinds in queries.items():
                for kind, qs in kinds.items():
                    if qs:
                        jobs[f"{workers}/{size}/{kind}/{label}"] = Job(router.best_worker, qs, [])
        if core is not None:
            service, loop = dynamo_fleet(core, workers)
            keep.append((service, loop))
            for size, kinds in queries.items():
                reqs = [{"token_ids": q} for q in kinds["miss"]]
                jobs[f"{workers}/{size}/miss/dynamo"] = Job(
                    lambda req, s=service, lp=loop: lp.run_until_complete(_awaited(s.select, req)), reqs, []
                )
    log(f"  timing {len(jobs)} fleet cases in {rounds} rounds")
    run_jobs(jobs, rounds, passes)
    cases = {key: statistics.median(job.samples) / 1e3 for key, job in jobs.items()}
    table: dict[str, Any] = {}
    for key, us in cases.items():
        workers, size, kind, label = key.split("/")
        table.setdefault(f"{size}/{kind}", {}).setdefault(label, {})[workers] = round(us, 1)
    ratios: dict[str, Any] = {}
    first, last = str(counts[0]), str(counts[-1])
    for row, labels in table.items():
        for label, by_workers in labels.items():
            if first in by_workers and last in by_workers:
                ratios[f"{row}/{label}/{last}_over_{first}"] = round(by_workers[last] / by_workers[first], 2)
        size = row.split("/")[0]
        dyn = table.get(f"{size}/miss", {}).get("dynamo", {})
        for workers, us in labels.get("none", {}).items():
            if workers in dyn:
                ratios[f"{row}/none_over_dynamo_miss/{workers}"] = round(us / dyn[workers], 2)
            full = labels.get("none_full_scan", {}).get(workers)
            if full:
                ratios[f"{row}/none_over_full_scan/{workers}"] = round(us / full, 2)
        for workers, us in labels.get("timing", {}).items():
            if workers in dyn:
                ratios[f"{row}/timing_over_dynamo_miss/{workers}"] = round(us / dyn[workers], 2)
            full = labels.get("timing_full_scan", {}).get(workers)
            if full:
                ratios[f"{row}/timing_over_full_scan/{workers}"] = round(us / full, 2)
    for service, loop in (k for k in keep if isinstance(k, tuple)):
        service.shutdown()
        loop.close()
    keep.clear()
    gc.collect()
    return {
        "setup": (
            f"KvRouter(block_size={ENGINE_BLOCK_SIZE}) per fleet, indexer fed the first {len(subset)} trace "
            f"requests round robin; max({IN_FLIGHT}, W) requests in flight (1k-16k-token trace prompts, "
            "every other one prefill-complete); probes (no request_id), tokens as lists; "
            f"{FLEET_QUERIES} queries per size and kind. none: Dynamo's cost with the fleet-sized "
            "decision; none_full_scan: the same router forced to visit every worker (the decision "
            "before); timing, timing_full_scan: the default prefill load model, likewise. dynamo: "
            "SelectionService.select driven from Python (one asyncio run_until_complete per call), "
            "W schedulable workers, no KV events and no booked load, so only misses compare"
        ),
        "median_us": table,
        "ratios": ratios,
    }


# --- driver ------------------------------------------------------------------------------------


def import_dynamo(disabled: bool) -> tuple[Any, str | None]:
    if disabled:
        return None, "--no-dynamo given"
    try:
        import dynamo._core as core  # the [compare] extra: ai-dynamo-runtime==1.6.1
    except Exception as exc:  # ImportError, or a broken native wheel
        return None, f"import dynamo._core failed: {type(exc).__name__}: {exc}"
    return core, None


def machine_environment() -> dict[str, Any]:
    """Interpreter, machine and load at the start: what every benchmark's JSON records."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def environment(args: argparse.Namespace, core: Any) -> dict[str, Any]:
    import xxhash

    dyn_version = None
    if core is not None:
        try:
            from importlib.metadata import version

            dyn_version = version("ai-dynamo-runtime")
        except Exception:
            dyn_version = getattr(core, "__version__", "unknown")
    return {
        **machine_environment(),
        "numpy": np.__version__,
        "xxhash": xxhash.VERSION,
        "ai_dynamo_runtime": dyn_version,
        "gc": "enabled; prebuilt inputs frozen with gc.freeze() before timing",
        "quick": args.quick,
        "repeat": args.repeat,
    }


def targets(find: dict, apply_ours: dict, dyn: dict | None, best: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if dyn is not None and find.get("512") and dyn["find_matches"].get("512"):
        ours, theirs = find["512"], dyn["find_matches"]["512"]
        ratio = ours["median_us"] / theirs["median_us"]
        idle_ratio = ours["idle_1ms"]["median_us"] / theirs["idle_1ms"]["median_us"]
        out["find_matches_512_within_1_5x_dynamo"] = {
            "met": max(ratio, idle_ratio) <= TARGET_FIND_RATIO,
            "ours_over_dynamo": round(ratio, 3),
            "ours_over_dynamo_idle_1ms": round(idle_ratio, 3),
            "rule": "met when both modes are within 1.5x",
        }
        frac = apply_ours["blocks_per_s"] / dyn["apply_event"]["blocks_per_s"]
        out["stored_blocks_per_s_at_least_half_dynamo"] = {
            "met": frac >= TARGET_STORE_FRACTION,
            "ours_over_dynamo": round(frac, 3),
        }
    else:
        reason = "no Dynamo comparison in this run"
        out["find_matches_512_within_1_5x_dynamo"] = {"met": None, "reason": reason}
        out["stored_blocks_per_s_at_least_half_dynamo"] = {"met": None, "reason": reason}
    case = best["cases"].get("8k_tokens_16_workers_bs64")
    out["best_worker_8k_tokens_16_workers_median_le_150us"] = (
        {"met": case["median_us"] <= TARGET_BEST_WORKER_US, "median_us": case["median_us"]}
        if case
        else {"met": None, "reason": "16 workers not in --workers"}
    )
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake trace (JSONL)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions, about 20 s")
    p.add_argument(
        "--workers",
        default="16,64",
        help="comma-separated worker counts for best_worker; the first also builds the trace tree",
    )
    p.add_argument(
        "--repeat", type=int, default=None, help="fresh tree builds and timing rounds (default 5, quick 1)"
    )
    p.add_argument("--no-dynamo", action="store_true", help="skip the Dynamo comparison")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--prune-size",
        type=int,
        default=None,
        help="approximate mode's max_tree_size for the prune stalls (default 2^20, quick 2^18)",
    )
    p.add_argument(
        "--only",
        choices=("prune", "remove", "fleet", "live", "memory"),
        default=None,
        help="run only the prune, the removal, the fleet (live: as live traffic) or the memory section",
    )
    p.add_argument("--memory-child", choices=("ours", "dynamo"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--memory-requests", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 5
    if args.prune_size is None:
        args.prune_size = 2**18 if args.quick else 2**20
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if not args.trace.is_file():
        p.error(f"trace not found: {args.trace} (see REFERENCE section 6)")
    try:
        args.worker_counts = [int(x) for x in str(args.workers).split(",") if x.strip()]
    except ValueError:
        p.error(f"--workers must be comma-separated integers, got {args.workers!r}")
    if not args.worker_counts or min(args.worker_counts) < 1:
        p.error("--workers needs at least one count >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_child is not None:
        child = memory_child(args.memory_child, args.trace, args.worker_counts[0], args.memory_requests)
        json.dump(child, sys.stdout)
        return 0
    wall = time.monotonic()
    rng = random.Random(args.seed)
    core, no_dynamo_reason = import_dynamo(args.no_dynamo)
    env = environment(args, core)
    workers = args.worker_counts[0]
    find_passes = 10 if args.quick else 80 * args.repeat
    idle_passes = 2 if args.quick else 4 * args.repeat
    best_passes = 5 if args.quick else 40 * args.repeat

    log(f"loading {args.trace}")
    requests = load_trace(args.trace)
    mem_count = 1000 if args.quick else None
    if args.only == "live":
        counts = FLEET_COUNTS if args.workers == "16,64" else args.worker_counts
        live = run_fleet_live(counts, LIVE_DECISIONS // 4 if args.quick else LIVE_DECISIONS, args.seed)
        env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        json.dump({"benchmark": "router", "env": env, "fleet_live": live}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.only == "memory":
        memory = run_memory(requests[:mem_count], workers)
        memory["rss"] = run_memory_rss(args.trace, workers, mem_count, core is not None)
        env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        json.dump({"benchmark": "router", "env": env, "memory": memory}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.only == "fleet":
        counts = FLEET_COUNTS if args.workers == "16,64" else args.worker_counts
        fleet = run_fleet(requests, core, counts, args.repeat, 3 * args.repeat, rng)
        env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        json.dump({"benchmark": "router", "env": env, "fleet": fleet}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    log(f"hashing {len(requests)} requests at block size {ENGINE_BLOCK_SIZE}")
    hashed = hash_requests(requests, ENGINE_BLOCK_SIZE)
    events = stored_events(hashed, workers)
    payloads = dynamo_payloads(events) if core is not None else []
    gc.collect()
    gc.freeze()  # prebuilt inputs are not part of what a collection scans in production

    if args.only == "remove":
        ours, dyn = run_remove(events, payloads, core, args.repeat)
        out = {"ours": ours, "dynamo": dyn}
        if dyn is not None:
            out["removed_blocks_per_s_ours_over_dynamo"] = round(
                ours["blocks_per_s"] / dyn["blocks_per_s"], 3
            )
        env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        json.dump({"benchmark": "router", "env": env, "remove_event": out}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    prune = run_prune(hashed, core, args.prune_size, workers, 1 if args.quick else min(args.repeat, 2))
    if prune["dynamo"] is not None:
        prune["ratios"] = {
            "stall_max_ours_over_dynamo": round(
                prune["ours"]["stall_max_ms"] / prune["dynamo"]["stall_max_ms"], 3
            ),
            "pruned_blocks_per_s_ours_over_dynamo": round(
                prune["ours"]["pruned_blocks_per_s"] / prune["dynamo"]["pruned_blocks_per_s"], 3
            ),
        }
    if args.only == "prune":
        env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        json.dump({"benchmark": "router", "env": env, "approx_prune": prune}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    apply_ours, apply_dyn, tree, dyn_tree = run_apply(events, payloads, core, args.repeat)
    apply_ours["nodes_are"] = "runs of consecutive blocks (RadixTree.num_nodes)"
    log("find_matches")
    find_ours, find_dyn = run_find(tree, dyn_tree, hashed, args.repeat, find_passes, idle_passes, rng)
    remove_ours, remove_dyn = run_remove(events, payloads, core, min(args.repeat, 3))
    del tree, dyn_tree, payloads
    gc.collect()

    log("best_worker")
    best = run_best_worker(requests, events, args.worker_counts, args.repeat, best_passes, rng, args.quick)

    log("fleet curve")
    fleet = run_fleet(requests, core, FLEET_COUNTS, args.repeat, 3 * args.repeat, rng)

    mem_requests = requests[:mem_count]
    log(f"memory (tracemalloc) over {len(mem_requests)} requests")
    memory = run_memory(mem_requests, workers)
    memory["rss"] = run_memory_rss(args.trace, workers, mem_count, core is not None)

    result: dict[str, Any] = {
        "benchmark": "router",
        "env": env,
        "trace": {
            "path": str(args.trace),
            "requests": len(requests),
            "trace_blocks": sum(len(r.hash_ids) for r in requests),
            "mapping": "hash id h -> 512 x token h, input clamped to len(hash_ids)*512, engine block 64",
            "worker_assignment": f"round robin: request i -> worker i % {workers}",
            "events": len(events),
        },
        "apply_event": apply_ours,
        "remove_event": remove_ours,
        "find_matches": {
            "queries": (
                "per size up to 16 trace requests with enough blocks: half their first N local "
                "hashes (full match on the storing worker), half a real prefix of N/4..3N/4 blocks "
                "then random never-stored hashes (partial match)"
            ),
            **find_ours,
        },
        "best_worker": best,
        "fleet": fleet,
        "memory": memory,
        "approx_prune": prune,
    }
    if core is not None and find_dyn is not None and apply_dyn is not None:
        dyn_find, agree, mismatches = find_dyn
        result["dynamo"] = {
            "version": env["ai_dynamo_runtime"],
            "api": "dynamo._core.RadixTree: apply_event(worker_id, json_bytes), find_matches(hashes).scores",
            "note": "Dynamo's apply_event parses the event JSON itself; ours is given decoded BlocksStored",
            "apply_event": apply_dyn,
            "remove_event": remove_dyn,
            "find_matches": dyn_find,
            "agree": agree,
            "mismatched_queries": mismatches,
        }
        ratios: dict[str, float] = {}
        for size in FIND_SIZES:
            ours, theirs = find_ours.get(str(size)), dyn_find.get(str(size))
            if ours and theirs:
                ratios[f"find_matches_{size}_ours_over_dynamo"] = round(
                    ours["median_us"] / theirs["median_us"], 3
                )
                ratios[f"find_matches_{size}_ours_over_dynamo_idle_1ms"] = round(
                    ours["idle_1ms"]["median_us"] / theirs["idle_1ms"]["median_us"], 3
                )
        if remove_dyn is not None:
            ratios["removed_blocks_per_s_ours_over_dynamo"] = round(
                remove_ours["blocks_per_s"] / remove_dyn["blocks_per_s"], 3
            )
        ratios["stored_blocks_per_s_dynamo_over_ours"] = round(
            apply_dyn["blocks_per_s"] / apply_ours["blocks_per_s"], 3
        )
        result["ratios"] = ratios
    else:
        result["dynamo"] = None
        result["dynamo_reason"] = no_dynamo_reason
    result["targets"] = targets(result["find_matches"], apply_ours, result["dynamo"], best)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    env["wall_s"] = round(time.monotonic() - wall, 1)
    log(f"done in {env['wall_s']} s")
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
