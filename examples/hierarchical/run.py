"""Hierarchical routing on loopback: Envoy -> a top-level picker -> two router groups -> mock workers.

    .venv/bin/python examples/hierarchical/run.py                 # about 15 s
    .venv/bin/python examples/hierarchical/run.py --json          # machine-readable
    .venv/bin/python examples/hierarchical/run.py --log-dir /tmp/h  # keep every process's log

Starts, as child processes on 127.0.0.1 (stopped by pid at the end):
- per group ("east", "west"): two mock workers publishing their KV events over ZMQ, and a picker
  over them serving its routers on the router-group API (`serve --group-api-port`);
- the top-level picker (`serve` with a `groups:` section and no workers of its own);
- Envoy (`extproc/devstack/envoy/buffered.yaml`) in front of the top-level picker.
Then it plays multi-turn conversations through Envoy, each with its own long system prompt (turn k
of every conversation in flight together, then turn k+1), and prints where every turn was served
and how much of its prompt the worker already cached. Every conversation's later turns land on the
group and worker that served its first turn, because that worker caches its prefix; the groups'
probes show it before anything is committed.

The top-level picker runs with `--conformance-hooks` only so that responses name the endpoint that
served them (`x-conformance-test-served-endpoint`); leave it off in production.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

from extproc.devstack.groups import Hierarchy, start_hierarchy  # noqa: E402
from extproc.devstack.procs import http_status  # noqa: E402
from extproc.devstack.stack import MODEL  # noqa: E402
from extproc.epp.answers import CONFORMANCE_SERVED_HEADER  # noqa: E402

WORDS = ("alpha", "beta", "gamma", "delta", "kv", "cache", "prefix", "token", "route", "envoy", "group")


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat(url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
        return {
            "endpoint": response.headers.get(CONFORMANCE_SERVED_HEADER, "?"),
            "cached_tokens": int(response.headers.get("x-prefix-cache-hit-tokens", 0)),
            "prompt_tokens": answer["usage"]["prompt_tokens"],
            "reply": answer["choices"][0]["message"]["content"],
        }


def play(stack: Hierarchy, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Turn k of every conversation is sent at once (they are in flight together), then turn k+1."""
    rng = random.Random(args.seed)
    conversations = [
        [{"role": "system", "content": f"conversation {c}: " + text(rng, args.system_words)}]
        for c in range(args.conversations)
    ]
    turns = []
    with ThreadPoolExecutor(max_workers=args.conversations) as pool:
        for turn in range(args.turns):
            for messages in conversations:
                messages.append({"role": "user", "content": text(rng, 40)})
            answers = pool.map(lambda m: chat(stack.url, m, args.max_tokens), conversations)
            for c, (messages, served) in enumerate(zip(conversations, answers, strict=True)):
                messages.append({"role": "assistant", "content": served.pop("reply")})
                group = stack.group_of(served["endpoint"])
                worker = group.worker_at(served["endpoint"]) if group else None
                served.update(
                    conversation=c,
                    turn=turn + 1,
                    group=group.name if group else "?",
                    worker=worker.worker_id if worker else "?",
                )
                turns.append(served)
    return turns


def summarise(turns: list[dict[str, Any]]) -> dict[str, Any]:
    first = {t["conversation"]: (t["group"], t["worker"]) for t in turns if t["turn"] == 1}
    later = [t for t in turns if t["turn"] > 1]
    stuck = sum(1 for t in later if (t["group"], t["worker"]) == first[t["conversation"]])
    prompt = sum(t["prompt_tokens"] for t in later)
    return {
        "later_turns": len(later),
        "later_turns_on_first_group_and_worker": stuck,
        "later_turns_prefix_hit_rate": round(sum(t["cached_tokens"] for t in later) / prompt, 3)
        if prompt
        else 0,
        "conversations_per_group": {
            g: sum(1 for fg, _ in first.values() if fg == g) for g in sorted({fg for fg, _ in first.values()})
        },
    }


def group_metrics(stack: Hierarchy) -> list[str]:
    status, body = http_status(stack.metrics_url)
    if status != 200:
        return [f"(metrics unavailable: {status})"]
    wanted = ("extproc_group_chosen_total", "extproc_group_overlap_won_blocks_total",
              "extproc_group_probe_latency_seconds_count", "extproc_group_probe_failures_total")  # fmt: skip
    return [line for line in body.splitlines() if line.startswith(wanted)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--system-words", type=int, default=300, help="words of each conversation's system prompt"
    )
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--speedup", type=float, default=20.0, help="mock workers' simulated-time speed-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--log-dir", help="keep process logs here (default: a temporary directory)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="extproc-hierarchical-") as tmp:
        log_dir = Path(args.log_dir or tmp)
        print("starting 2 groups x 2 mock workers, the top-level picker and Envoy ...", file=sys.stderr)
        stack = start_hierarchy(
            log_dir, groups=("east", "west"), workers_per_group=2, speedup=args.speedup,
            top_args=["--conformance-hooks", "--log-level", "info"],
        )  # fmt: skip
        try:
            print(f"Envoy on {stack.url}; playing {args.conversations} conversations ...", file=sys.stderr)
            turns = play(stack, args)
            metrics = group_metrics(stack)
        finally:
            stack.stop()
    summary = summarise(turns)
    if args.json:
        print(json.dumps({"turns": turns, "summary": summary, "top_level_group_metrics": metrics}, indent=2))
    else:
        print(f"{'conv':>4} {'turn':>4}  {'group/worker':<14} {'prompt':>6} {'cached':>6}")
        for t in sorted(turns, key=lambda t: (t["conversation"], t["turn"])):
            where = f"{t['group']}/{t['worker']}"
            conv, turn, prompt, cached = t["conversation"], t["turn"], t["prompt_tokens"], t["cached_tokens"]
            print(f"{conv:>4} {turn:>4}  {where:<14} {prompt:>6} {cached:>6}")
        print()
        stuck, later = summary["later_turns_on_first_group_and_worker"], summary["later_turns"]
        print(
            f"later turns on their first turn's group and worker: {stuck}/{later}; their prefix hit rate "
            f"{summary['later_turns_prefix_hit_rate']:.1%}; conversations per group "
            f"{summary['conversations_per_group']}"
        )
        print("\ntop-level picker, per group:")
        print("\n".join(f"  {line}" for line in metrics))
    return 0 if summary["later_turns_on_first_group_and_worker"] == summary["later_turns"] else 1


if __name__ == "__main__":
    sys.exit(main())
