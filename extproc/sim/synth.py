"""A synthetic Mooncake-format trace of multi-turn chat sessions, to check the router off the shared trace.

Owns trace generation only (pure but for the output file). The shared trace's reuse comes from
prompts sharing leading hash ids; this one is built differently on purpose, so a policy tuned to
one cannot pass as general:

- tenants: `system_prompts` shared system prompts, popularity Zipf(1.1), lengths log-normal;
- sessions start as a Poisson process (`session_rate_per_s`); each has a geometric number of turns
  (mean `mean_turns`) separated by exponential think times (mean `think_s`);
- turn n's prompt is turn n-1's prompt (its full 512-token blocks), that turn's answer and a new
  user message (log-normal length): a session's context grows turn by turn, as in a chat;
- output lengths log-normal.

All randomness comes from one seeded `random.Random`, so a seed names a trace.

    python -m extproc.sim.synth --seed 7 --out /tmp/sessions.jsonl
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionTraceShape:
    """The distributions of `session_trace` (lengths in tokens, times in seconds)."""

    requests: int = 4000
    session_rate_per_s: float = 1.2
    mean_turns: float = 4.0
    think_s: float = 20.0
    system_prompts: int = 40
    system_median_tokens: float = 3000.0
    user_median_tokens: float = 1500.0
    output_median_tokens: float = 120.0
    length_sigma: float = 0.9  # log-normal shape of every length
    max_context_tokens: int = 120_000
    trace_block_size: int = 512


def session_trace(seed: int, shape: SessionTraceShape | None = None) -> list[dict[str, object]]:
    """Mooncake rows (`timestamp` ms, `input_length`, `output_length`, `hash_ids`), in arrival order."""
    s = shape or SessionTraceShape()
    rng = random.Random(seed)
    bs = s.trace_block_size
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    def lognormal(median: float) -> int:
        return max(1, round(median * math.exp(rng.gauss(0.0, s.length_sigma))))

    systems = [fresh(math.ceil(lognormal(s.system_median_tokens) / bs)) for _ in range(s.system_prompts)]
    weights = [1.0 / (k + 1) ** 1.1 for k in range(s.system_prompts)]
    # (arrival s, tiebreak, session context ids, context tokens, turns left)
    heap: list[tuple[float, int, list[int], int, int]] = []
    t = 0.0
    order = 0
    rows: list[dict[str, object]] = []

    def turn() -> dict[str, object]:
        at, order, context, tokens, turns = heapq.heappop(heap)
        prompt_tokens = min(s.max_context_tokens, tokens + lognormal(s.user_median_tokens))
        ids = context + fresh(math.ceil(prompt_tokens / bs) - len(context))
        output = lognormal(s.output_median_tokens)
        if turns > 1 and prompt_tokens + output < s.max_context_tokens:
            kept = ids[: prompt_tokens // bs]  # full blocks only: the next turn appends after them
            grown = (prompt_tokens // bs) * bs + output
            kept += fresh(grown // bs - len(kept))
            think = rng.expovariate(1.0 / s.think_s)
            heapq.heappush(heap, (at + think, order, kept, grown // bs * bs, turns - 1))
        return {
            "timestamp": round(at * 1000.0),
            "input_length": prompt_tokens,
            "output_length": output,
            "hash_ids": ids,
        }

    while len(rows) < s.requests:
        t += rng.expovariate(s.session_rate_per_s)
        while heap and heap[0][0] <= t and len(rows) < s.requests:
            rows.append(turn())
        system = rng.choices(systems, weights)[0]
        turns = 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / s.mean_turns))
        order += 1
        heapq.heappush(heap, (t, order, list(system), len(system) * bs, turns))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=7)
    defaults = SessionTraceShape()
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--session-rate", type=float, default=defaults.session_rate_per_s)
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    args = parser.parse_args(argv)
    shape = SessionTraceShape(requests=args.requests, session_rate_per_s=args.session_rate)
    rows = session_trace(args.seed, shape)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    span_s = len(rows) and rows[-1]["timestamp"]
    print(f"{len(rows)} requests over {span_s} ms -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
