"""Chat tokenization with the piece cache against whole prompts, on the real Llama 3.1 tokenizer.

    .venv/bin/python benchmarks/bench_tokenize.py            # about 1-2 minutes
    .venv/bin/python benchmarks/bench_tokenize.py --quick    # about 30 s

Prints ONE JSON object on stdout; progress goes to stderr. Everything is in this process, one run:

- Chats grow in turns of about `--turn-tokens` (2,000: a user message and an assistant reply of about
  1,000 tokens each, words drawn Zipf-like from 20,000 made-up words, numbers and punctuation, so the
  tokenizer's own word cache does not make a second text free) until a request reaches `--target-tokens`
  (100,000). Each request is one client's whole conversation, as chat clients send it.
- `whole`: `HfTokenizer(piece_cache_bytes=0)`, the code path before the piece cache (render, one
  `encode_batch` of the whole prompt): the baseline.
- `cold`: `HfTokenizer` with its piece cache, on a chat it has never seen (every piece a miss).
- `warm`: the same tokenizer on the request that brings a chat to the target, every earlier turn of that
  chat sent before (and other chats' turns: the cache is shared).
Rounds interleave the three on fresh chats (`--rounds`), so drift from other work on the machine spreads
over all; medians are reported with each round's values. `cpu_ms` is `time.process_time` (all threads:
`encode_batch` spreads missed pieces over the cores), `wall_ms` is `time.perf_counter`.

Sections: `results` (per case), `ratios` (warm/cold, cold/whole, warm/whole on CPU and wall), `targets`
(warm at most 0.08 x cold CPU; cold CPU not above whole), `cache` (hit ratios over the warm-up turns,
entries, accounted bytes, bytes per cached token, and `traced_bytes`: what tracemalloc sees one 100k
chat's pieces hold), `warm_turns` (CPU of every warm turn, by size), `piece_costs_us` (encoding one piece
against looking it up, by length: why every piece is cached, and which are keyed by their text).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from extproc.request.token_cache import SMALL_PIECE_CHARS, TokenCache, piece_key  # noqa: E402
from extproc.request.tokenizer import HfTokenizer  # noqa: E402

TOKENIZER = REPO.parent / "shared" / "tokenizers" / "llama3_1"
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "ve", "dar", "en", "ul", "om", "ir", "ex"]
SYLLABLES += ["pa", "qui", "zo", "ba", "te", "str", "ing", "ion", "ment", "al"]
PUNCTUATION = [". ", ", ", "; ", "? ", "! ", ":\n", ".\n\n", " - ", " (", ") "]
Messages = list[dict[str, str]]


class TextSource:
    """Zipf-like prose over made-up words: realistic work for BPE (not every word in its cache)."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.vocab = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(20_000)]
        self.weights = [1.0 / (rank + 1) for rank in range(len(self.vocab))]

    def text(self, rng: random.Random, words: int) -> str:
        out = []
        for word in rng.choices(self.vocab, self.weights, k=words):
            out.append(word if rng.random() > 0.05 else str(rng.randint(0, 99_999)))
            out.append(rng.choice(PUNCTUATION) if rng.random() < 0.12 else " ")
        return "".join(out)


def grow_chat(
    source: TextSource, seed: int, turn_tokens: int, target_tokens: int, count: Callable[[str], int]
) -> list[Messages]:
    """The requests of one chat, each the whole conversation so far, the last at about `target_tokens`
    (`count`: tokens of a message's text; the template adds a few more per message)."""
    rng = random.Random(seed)
    sample = source.text(random.Random(-1), 2_000)
    words = max(1, round(turn_tokens / 2 * 2_000 / count(sample)))  # a message: half a turn
    messages: Messages = [
        {"role": "system", "content": "You are a careful assistant. " + source.text(rng, 80)}
    ]
    requests = []
    tokens = count(messages[0]["content"])
    while True:
        messages.append({"role": "user", "content": source.text(rng, words)})
        tokens += count(messages[-1]["content"])
        requests.append([dict(m) for m in messages])
        if tokens >= target_tokens:
            return requests
        messages.append({"role": "assistant", "content": source.text(rng, words)})
        tokens += count(messages[-1]["content"])


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(cpu ms, wall ms, result) of one call."""
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = fn()
    return (time.process_time() - cpu0) * 1e3, (time.perf_counter() - wall0) * 1e3, result


def piece_costs(hf: HfTokenizer, source: TextSource) -> dict[str, dict[str, Any]]:
    """Per piece length: µs to encode it, to key it, and to look its key up in a warm cache."""
    backend = hf._backend
    rng = random.Random(7)
    out: dict[str, dict[str, Any]] = {}
    for length in (4, 16, 64, 256, 1024, 4096):
        pieces = [source.text(rng, length)[:length] for _ in range(200)]
        cache = TokenCache(1 << 26)
        cache.put_many([(piece_key(p), [1] * (length // 4)) for p in pieces])
        fresh = [p[:-1] + "#" for p in pieces]  # new str objects: their hash is not cached yet
        t0 = time.perf_counter()
        for p in pieces:
            backend.encode(p, add_special_tokens=False)
        t1 = time.perf_counter()
        keys = [piece_key(p) for p in fresh]
        t2 = time.perf_counter()
        cache.get_many(keys)
        t3 = time.perf_counter()
        n = len(pieces)
        out[str(length)] = {
            "encode": round((t1 - t0) / n * 1e6, 2),
            "key": round((t2 - t1) / n * 1e6, 2),
            "lookup": round((t3 - t2) / n * 1e6, 2),
            "key_kind": "text" if length <= SMALL_PIECE_CHARS else "blake2b",
        }
    return out


def traced_cache_bytes(final_request: Messages) -> dict[str, float]:
    """What tracemalloc sees a fresh piece cache hold after one chat's request, against its accounting."""
    hf = HfTokenizer(TOKENIZER)
    hf.encode_chat(final_request[:1])  # the tokenizer's own first-use allocations, outside the measure
    assert hf.pieces is not None
    hf.pieces.cache.clear()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ids = hf.encode_chat(final_request)
    tokens = len(ids)
    del ids
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    stats = hf.piece_cache_stats()
    assert stats is not None
    return {
        "tokens": tokens,
        "accounted_bytes": stats.bytes,
        "traced_bytes": traced,
        "traced_bytes_per_token": round(traced / tokens, 2),
        "accounted_over_traced": round(stats.bytes / traced, 3),
    }


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds (default 7)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--target-tokens", type=int, default=100_000)
    parser.add_argument("--turn-tokens", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=21)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)

    def progress(message: str) -> None:
        print(f"[bench_tokenize] {message}", file=sys.stderr, flush=True)

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    whole = HfTokenizer(TOKENIZER, piece_cache_bytes=0)
    ours = HfTokenizer(TOKENIZER)
    assert ours.pieces is not None and whole.pieces is None, ours.piecewise_off_reason
    source = TextSource(args.seed)

    def count(text: str) -> int:
        return len(whole.encode_text(text, add_special_tokens=False))

    progress(f"growing {2 * rounds} chats to ~{args.target_tokens} tokens in ~{args.turn_tokens}-token turns")
    warm_chats = [
        grow_chat(source, args.seed * 1000 + r, args.turn_tokens, args.target_tokens, count)
        for r in range(rounds)
    ]
    cold_chats = [
        grow_chat(source, args.seed * 1000 + 500 + r, args.turn_tokens, args.target_tokens, count)
        for r in range(rounds)
    ]
    for text in ("warm-up " * 2000, warm_chats[0][0][0]["content"]):  # both tokenizers' first-use costs
        whole.encode_chat([{"role": "user", "content": text}])
        ours.encode_chat([{"role": "user", "content": text}])
    assert ours.pieces is not None
    ours.pieces.cache.clear()

    results: dict[str, dict[str, list[float]]] = {
        c: {"cpu_ms": [], "wall_ms": [], "tokens": []} for c in ("whole", "cold", "warm")
    }
    warm_turns: list[tuple[int, float]] = []
    hit_counts = {
        "turns_hit": 0,
        "turns_miss": 0,
        "last_hit": 0,
        "last_miss": 0,
    }  # the cold chats' misses apart
    for r in range(rounds):
        chat = warm_chats[r]
        progress(f"round {r + 1}/{rounds}: {len(chat) - 1} turns of a chat, then its last; a cold chat")
        before = ours.piece_cache_stats()
        for request in chat[:-1]:
            cpu, _, ids = timed(lambda request=request: ours.encode_chat(request))  # type: ignore[misc]
            warm_turns.append((len(ids), cpu))
        after_turns = ours.piece_cache_stats()
        assert before is not None and after_turns is not None
        hit_counts["turns_hit"] += after_turns.hit_tokens - before.hit_tokens
        hit_counts["turns_miss"] += after_turns.miss_tokens - before.miss_tokens
        cold, last = cold_chats[r][-1], chat[-1]
        cases: list[tuple[str, Callable[[], list[int]]]] = [
            ("whole", lambda cold=cold: whole.encode_chat(cold)),  # type: ignore[misc]
            ("cold", lambda cold=cold: ours.encode_chat(cold)),  # type: ignore[misc]
            ("warm", lambda last=last: ours.encode_chat(last)),  # type: ignore[misc]
        ]
        mid = None
        for name, fn in random.Random(r).sample(cases, len(cases)):
            if name == "warm":
                mid = ours.piece_cache_stats()
            cpu, wall, ids = timed(fn)
            if name == "warm":
                after = ours.piece_cache_stats()
                assert mid is not None and after is not None
                hit_counts["last_hit"] += after.hit_tokens - mid.hit_tokens
                hit_counts["last_miss"] += after.miss_tokens - mid.miss_tokens
            results[name]["cpu_ms"].append(round(cpu, 3))
            results[name]["wall_ms"].append(round(wall, 3))
            results[name]["tokens"].append(len(ids))
        assert ours.encode_chat(last) == whole.encode_chat(last)  # exact, checked outside the timing
        assert ours.encode_chat(cold) == whole.encode_chat(cold)
    stats = ours.piece_cache_stats()
    assert stats is not None

    summary: dict[str, dict[str, Any]] = {
        name: {
            "cpu_ms_median": median(r["cpu_ms"]),
            "wall_ms_median": median(r["wall_ms"]),
            "tokens_median": median(r["tokens"]),
            **r,
        }
        for name, r in results.items()
    }

    def ratio(a: str, b: str, key: str) -> float:
        return round(summary[a][key] / summary[b][key], 4)

    ratios = {
        f"{a}_over_{b}_{key[:-10]}": ratio(a, b, key)
        for a, b in (("warm", "cold"), ("cold", "whole"), ("warm", "whole"))
        for key in ("cpu_ms_median", "wall_ms_median")
    }
    per_round_warm_over_cold = [
        round(w / c, 4) for w, c in zip(results["warm"]["cpu_ms"], results["cold"]["cpu_ms"], strict=True)
    ]
    progress("measuring the cache's memory with tracemalloc and the cost of a piece")
    buckets: dict[str, list[float]] = {}
    for tokens, cpu in warm_turns:
        buckets.setdefault(f"{tokens // 20_000 * 20}k-{tokens // 20_000 * 20 + 20}k", []).append(cpu)
    report = {
        "config": {
            "tokenizer": str(TOKENIZER),
            "rounds": rounds,
            "target_tokens": args.target_tokens,
            "turn_tokens": args.turn_tokens,
            "turns_per_chat": [len(c) for c in warm_chats],
            "seed": args.seed,
        },
        "env": env,
        "results": summary,
        "ratios": {**ratios, "warm_over_cold_cpu_per_round": per_round_warm_over_cold},
        "targets": {
            "warm_at_most_0.08x_cold_cpu": summary["warm"]["cpu_ms_median"]
            <= 0.08 * summary["cold"]["cpu_ms_median"],
            "cold_cpu_not_above_whole": summary["cold"]["cpu_ms_median"] <= summary["whole"]["cpu_ms_median"],
        },
        "cache": {
            "lookups_hit_ratio": round(stats.hits / max(1, stats.hits + stats.misses), 4),
            "token_hit_ratio_growing_turns": round(
                hit_counts["turns_hit"] / max(1, hit_counts["turns_hit"] + hit_counts["turns_miss"]), 4
            ),
            "token_hit_ratio_last_turn": round(
                hit_counts["last_hit"] / max(1, hit_counts["last_hit"] + hit_counts["last_miss"]), 4
            ),
            "entries": stats.entries,
            "bytes": stats.bytes,
            "capacity_bytes": stats.capacity_bytes,
            "evictions": stats.evictions,
            "bytes_per_cached_token": round(stats.bytes / max(1, stats.miss_tokens), 2),
            "one_chat": traced_cache_bytes(warm_chats[0][-1]),
        },
        "warm_turns_cpu_ms_median": {
            k: median(v) for k, v in sorted(buckets.items(), key=lambda kv: len(kv[0]))
        },
        "piece_costs_us": piece_costs(whole, source),
    }
    report["env"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
