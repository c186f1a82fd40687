"""How much prefix reuse is left for routing to win: a trace through one pooled LRU cache of the fleet's size.

    .venv/bin/python -m extproc replay ../shared/traces/mooncake_synthetic_trace.jsonl --workers 8 \\
        --router kv --requests-out /tmp/kv8.jsonl
    .venv/bin/python benchmarks/lru_bound.py ../shared/traces/mooncake_synthetic_trace.jsonl \\
        --workers 8 --requests /tmp/kv8.jsonl

Prints one JSON object: per cache model, the prefix reuse (cached prompt tokens / prompt tokens, as the
replay reports it) of the trace's requests in arrival order, and `alone_ttft_ms`, the mean time to first
token if each request ran alone on an idle worker with that model's hits (its uncached tokens' chunked
prefill at the default pass-time model, the simulator's): what is left above it in a replay is waiting
and passes shared with other requests. The cache models:
- `unbounded`: a cache that never evicts (every block seen before is a hit);
- `pooled_lru`: one LRU cache holding `--workers` x the engine's blocks (`--num-gpu-blocks` of
  `--block-size` tokens, the simulator's defaults), what any routing of the same fleet could at best
  keep if its workers shared one cache;
- `routed_lru` (with `--requests`, a replay's `--requests-out`): one LRU cache per worker, each request
  on the worker the router chose; `replayed`, the replay's own reuse and mean time to first token.
Each request looks up its leading blocks, then touches all of its blocks (most recent last). Simpler than
the simulator (no blocks pinned by running requests, no output blocks), so compare the three with each
other, not with the replay's figure.
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path

from extproc.router.prefill_model import PrefillTiming
from extproc.sim.engine import EngineConfig


def cached_tokens(
    rows: list[dict], capacity: int | None, worker_of: list[int], workers: int, block: int
) -> list[int]:
    """Each request's cached prompt tokens, through one LRU cache per worker of `capacity` blocks."""
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(workers)]
    out = []
    for i, row in enumerate(rows):
        cache = caches[worker_of[i]]
        hashes, tokens = row["hash_ids"], row["input_length"]
        k = 0
        while k < len(hashes) and hashes[k] in cache:
            k += 1
        out.append(min(k * block, tokens))
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)
    return out


def summary(rows: list[dict], cached: list[int], timing: PrefillTiming) -> dict[str, float]:
    """Prefix reuse, and the mean time to first token if every request ran alone on an idle worker
    (its uncached tokens' chunked prefill at the configured pass-time model, the simulator's)."""
    total = sum(row["input_length"] for row in rows)
    alone = [timing.prompt_ms(max(1, row["input_length"] - c)) for row, c in zip(rows, cached, strict=True)]
    return {
        "reuse": round(sum(cached) / max(1, total), 4),
        "alone_ttft_ms": round(sum(alone) / len(alone), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", type=Path)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--requests", type=Path, help="a replay's --requests-out (JSON lines)")
    parser.add_argument("--trace-block-size", type=int, default=512)
    defaults = EngineConfig()
    parser.add_argument("--num-gpu-blocks", type=int, default=defaults.num_gpu_blocks)
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    per_worker = args.num_gpu_blocks * args.block_size // args.trace_block_size  # in trace blocks
    block = args.trace_block_size
    everyone = [0] * len(rows)
    timing = PrefillTiming()
    result: dict[str, object] = {
        "trace": str(args.trace),
        "requests": len(rows),
        "workers": args.workers,
        "worker_capacity_trace_blocks": per_worker,
        "unbounded": summary(rows, cached_tokens(rows, None, everyone, 1, block), timing),
        "pooled_lru": summary(
            rows, cached_tokens(rows, per_worker * args.workers, everyone, 1, block), timing
        ),
    }
    if args.requests is not None:
        records = [json.loads(line) for line in args.requests.read_text().splitlines() if line.strip()]
        chosen = {record["index"]: record["worker"] for record in records}
        worker_of = [chosen[i] for i in range(len(rows))]
        cached = cached_tokens(rows, per_worker, worker_of, max(worker_of) + 1, block)
        result["routed_lru"] = summary(rows, cached, timing)
        tokens = sum(row["input_length"] for row in rows)
        result["replayed"] = {
            "reuse": round(sum(record["cached_tokens"] for record in records) / max(1, tokens), 4),
            "ttft_ms": round(sum(record["ttft_ms"] for record in records) / max(1, len(records)), 1),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
