"""The whole picker on long chats with the real Llama 3.1 tokenizer: cold and warm picks, and throughput.

    .venv/bin/python benchmarks/bench_picker_tokens.py --quick   # 3 rounds, about 1 minute
    .venv/bin/python benchmarks/bench_picker_tokens.py           # 5 rounds, about 2 minutes

Prints ONE JSON object on stdout; progress goes to stderr. Everything runs in this process (issue 21's
picker benchmark; `bench_tokenize.py` measures the tokenizer alone, `bench_extproc.py` the picker through
Envoy with the byte tokenizer):

- Pickers: `EndpointPicker` over `--workers` (16) workers of one model, tokenizer
  `../shared/tokenizers/llama3_1`, block size 16, KV events off (the router predicts each worker's cache
  from its own decisions, as Dynamo's `--no-kv-events`), the default router otherwise. `picker` has the
  piece cache (`--tokenizer-cache-bytes` default); `whole` has it off (0: every prompt tokenized whole,
  the code path before incremental tokenization).
- Chats (`bench_tokenize.grow_chat`): turns of ~`--turn-tokens` (a user message and an assistant reply,
  Zipf-like prose over made-up words) until a request reaches ~`--target-tokens` (100k); each request is
  the whole conversation, as chat clients send it, through `picker.pick` with the request's JSON body,
  then `first_token` and `finish` (the stream's end frees its load).
- Per round, on fresh chats, in shuffled order: `whole` (a never-seen ~100k chat on `whole`), `cold` (a
  never-seen ~100k chat on `picker`) and `warm` (on `picker`, the turn that brings a chat to ~100k, its
  earlier turns sent before, in the same round). Medians over rounds, with each round's values.
- CPU of a pick: `time.process_time` (every thread of this process: the event loop, the tokenizing worker
  thread and the tokenizer's own threads) plus the body parser's worker processes (bodies over 16 KiB
  are parsed there; `/proc/<pid>/schedstat`), `cpu_ms`; `loop_cpu_ms` is the event loop's thread alone
  (`time.thread_time`); `wall_ms` `time.perf_counter`; `finish_cpu_ms` the free after it.
  `core_s_per_100k_tokens` scales `cpu_ms` to 100,000 prompt tokens. `timings_ms` are the pick's own
  stage times (`Pick.timings_ns`: parse, tokenize, hash, match, select; wall).
- `cache`: the piece cache's token hit ratio over the growing turns and on the measured warm turns, its
  entries and bytes; the process's resident memory (VmRSS) and its peak (VmHWM).
- `throughput`: `--concurrency` (16) clients, each a loop of whole ext_proc streams (`ExtProcService`
  in-process, no gRPC, buffered: request headers, body, response headers, response body) with ~8k-token
  chat prompts (`--throughput-tokens`), `--throughput-requests` in all: `unique` (a system prompt and one
  ~8k-token user message, never seen: cold tokenization) and `turns` (the turn that brings a chat of
  ~`--throughput-turn-tokens`-token turns to ~8k, its earlier turns sent before, unmeasured: warm).
  Requests per second of wall time, picker CPU per request (process + parse workers), the piece cache's
  token hit ratio over the measured requests.
- `targets`: warm pick CPU at most 0.08x cold (issue 21), cold CPU not above `whole`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_tokenize import TOKENIZER, Messages, TextSource, grow_chat  # noqa: E402
from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402

from extproc.config import ModelConfig, PickerConfig, WorkerConfig  # noqa: E402
from extproc.epp.service import ExtProcService  # noqa: E402
from extproc.picker.pipeline import EndpointPicker, Pick  # noqa: E402
from extproc.request.tokenizer import HfTokenizer  # noqa: E402
from extproc.router import RouterConfig  # noqa: E402

MODEL = "llama3_1"
CHAT_PATH = "/v1/chat/completions"
CASES = ("whole", "cold", "warm")


def progress(message: str) -> None:
    print(f"[bench_picker_tokens] {message}", file=sys.stderr, flush=True)


def picker_config(workers: int, cache_bytes: int | None) -> PickerConfig:
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=tuple(WorkerConfig(f"w{i}", f"127.0.0.1:{8000 + i}", MODEL) for i in range(workers)),
        models=(ModelConfig(MODEL, tokenizer=str(TOKENIZER)),),
        max_body_bytes=16 << 20,
        seed=1,
    )
    return config if cache_bytes is None else replace(config, tokenizer_cache_bytes=cache_bytes)


def body_of(messages: Messages) -> bytes:
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 64}).encode()


def parse_workers_cpu_s(picker: EndpointPicker) -> float:
    """On-CPU seconds of the body parser's worker processes so far (schedstat: nanoseconds)."""
    total = 0
    for pid in picker.bodies.worker_pids():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a worker that just exited
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    return total / 1e9


def memory_kib() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


class Measured:
    """One pick's costs."""

    def __init__(self, picker: EndpointPicker, messages: Messages, request_id: str) -> None:
        self.picker, self.body, self.request_id = picker, body_of(messages), request_id

    async def run(self) -> dict[str, Any]:
        picker = self.picker
        gc.collect()
        child0, cpu0, loop0 = parse_workers_cpu_s(picker), time.process_time(), time.thread_time()
        wall0 = time.perf_counter()
        pick: Pick = await picker.pick(
            body=self.body, path=CHAT_PATH, headers={}, subset=None, client_request_id=self.request_id
        )
        wall1 = time.perf_counter()
        cpu1, loop1, child1 = time.process_time(), time.thread_time(), parse_workers_cpu_s(picker)
        picker.first_token(pick)
        picker.finish(pick, "complete")
        cpu2 = time.process_time()
        return {
            "cpu_ms": (cpu1 - cpu0 + child1 - child0) * 1e3,
            "process_cpu_ms": (cpu1 - cpu0) * 1e3,
            "parse_workers_cpu_ms": (child1 - child0) * 1e3,
            "loop_cpu_ms": (loop1 - loop0) * 1e3,
            "wall_ms": (wall1 - wall0) * 1e3,
            "finish_cpu_ms": (cpu2 - cpu1) * 1e3,
            "overlap_blocks": pick.overlap_blocks,
            "request_blocks": pick.request_blocks,
            "timings_ms": {k: v / 1e6 for k, v in pick.timings_ns.items()},
        }


async def send(picker: EndpointPicker, messages: Messages, request_id: str) -> None:
    pick = await picker.pick(
        body=body_of(messages), path=CHAT_PATH, headers={}, subset=None, client_request_id=request_id
    )
    picker.first_token(pick)
    picker.finish(pick, "complete")


def token_counter(hf: HfTokenizer) -> Callable[[str], int]:
    return lambda text: len(hf.encode_text(text, add_special_tokens=False))


async def cold_and_warm(args: argparse.Namespace, source: TextSource, count: Callable[[str], int]) -> dict:
    rounds = args.rounds or (3 if args.quick else 5)
    pickers = {
        "picker": EndpointPicker(picker_config(args.workers, None)),
        "whole": EndpointPicker(picker_config(args.workers, 0)),
    }
    tokenizer = pickers["picker"].pools[MODEL].tokenizer
    progress(f"growing {3 * rounds} chats to ~{args.target_tokens} tokens in ~{args.turn_tokens}-token turns")
    chats = {
        case: [
            grow_chat(source, args.seed * 1000 + 100 * k + r, args.turn_tokens, args.target_tokens, count)
            for r in range(rounds)
        ]
        for k, case in enumerate(CASES)
    }
    warmup = grow_chat(source, args.seed * 1000 + 999, args.turn_tokens, 8_000, count)
    for name, picker in pickers.items():  # first-use costs (parse worker start, tokenizer): outside
        for i, request in enumerate(warmup):
            await send(picker, request, f"warmup-{name}-{i}")
    results: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    hits = {"turns": [0, 0], "warm": [0, 0]}
    for r in range(rounds):
        chat = chats["warm"][r]
        progress(f"round {r + 1}/{rounds}: {len(chat) - 1} earlier turns of a chat, then the three cases")
        before = tokenizer.piece_cache_stats()
        for i, request in enumerate(chat[:-1]):
            await send(pickers["picker"], request, f"r{r}-turn{i}")
        after = tokenizer.piece_cache_stats()
        assert before is not None and after is not None
        hits["turns"][0] += after.hit_tokens - before.hit_tokens
        hits["turns"][1] += after.miss_tokens - before.miss_tokens
        for case in random.Random(args.seed + r).sample(CASES, len(CASES)):
            picker = pickers["whole" if case == "whole" else "picker"]
            mid = tokenizer.piece_cache_stats()
            result = await Measured(picker, chats[case][r][-1], f"r{r}-{case}").run()
            end = tokenizer.piece_cache_stats()
            if case == "warm":
                assert mid is not None and end is not None
                hits["warm"][0] += end.hit_tokens - mid.hit_tokens
                hits["warm"][1] += end.miss_tokens - mid.miss_tokens
            results[case].append(result)
    for case in CASES:  # outside the measure, after it: lookups would count as hits
        for r, result in enumerate(results[case]):
            result["tokens"] = len(await tokenizer.tokenize(_parsed(pickers["picker"], chats[case][r][-1])))
    stats = tokenizer.piece_cache_stats()
    assert stats is not None
    idle = all(p.is_idle() for p in pickers.values())
    for picker in pickers.values():
        await picker.close()
    summary: dict[str, Any] = {}
    for case, runs in results.items():
        entry: dict[str, Any] = {}
        for key in ("cpu_ms", "process_cpu_ms", "parse_workers_cpu_ms", "loop_cpu_ms", "wall_ms"):
            entry[f"{key}_median"] = round(statistics.median(x[key] for x in runs), 3)
        entry["finish_cpu_ms_median"] = round(statistics.median(x["finish_cpu_ms"] for x in runs), 3)
        entry["tokens_median"] = statistics.median(x["tokens"] for x in runs)
        entry["core_s_per_100k_tokens"] = round(
            statistics.median(x["cpu_ms"] / 1e3 * 100_000 / x["tokens"] for x in runs), 5
        )
        stages = {k for x in runs for k in x["timings_ms"]}
        entry["timings_ms_median"] = {
            k: round(statistics.median(x["timings_ms"].get(k, 0.0) for x in runs), 3) for k in sorted(stages)
        }
        entry["overlap_blocks"] = [x["overlap_blocks"] for x in runs]
        entry["request_blocks"] = [x["request_blocks"] for x in runs]
        entry["cpu_ms"] = [round(x["cpu_ms"], 3) for x in runs]
        entry["loop_cpu_ms"] = [round(x["loop_cpu_ms"], 3) for x in runs]
        summary[case] = entry
    per_round = [
        round(w["cpu_ms"] / c["cpu_ms"], 4) for w, c in zip(results["warm"], results["cold"], strict=True)
    ]
    warm, cold, whole = (summary[c]["cpu_ms_median"] for c in ("warm", "cold", "whole"))
    return {
        "rounds": rounds,
        "turns_per_chat": [len(c) for c in chats["warm"]],
        "results": summary,
        "ratios": {
            "warm_over_cold_cpu": round(warm / cold, 4),
            "warm_over_cold_cpu_per_round": per_round,
            "cold_over_whole_cpu": round(cold / whole, 4),
            "warm_over_cold_loop_cpu": round(
                summary["warm"]["loop_cpu_ms_median"] / summary["cold"]["loop_cpu_ms_median"], 4
            ),
            "warm_over_cold_wall": round(
                summary["warm"]["wall_ms_median"] / summary["cold"]["wall_ms_median"], 4
            ),
        },
        "targets": {
            "warm_at_most_0.08x_cold_cpu": warm <= 0.08 * cold,
            "cold_cpu_not_above_whole": cold <= whole,
        },
        "cache": {
            "token_hit_ratio_growing_turns": round(hits["turns"][0] / max(1, sum(hits["turns"])), 4),
            "token_hit_ratio_warm_turn": round(hits["warm"][0] / max(1, sum(hits["warm"])), 4),
            "piece_cache_entries": stats.entries,
            "piece_cache_bytes": stats.bytes,
            "piece_cache_capacity_bytes": stats.capacity_bytes,
            "piece_cache_evictions": stats.evictions,
            "memory_kib": memory_kib(),
        },
        "pickers_idle_after": idle,
    }


def _parsed(picker: EndpointPicker, messages: Messages) -> Any:
    from extproc.request.parse import parse_openai_body

    return parse_openai_body(body_of(messages), CHAT_PATH, max_bytes=picker.config.max_body_bytes)


# --- throughput ------------------------------------------------------------------------------------


def _stream(request_id: str, body: bytes) -> list[pb.ProcessingRequest]:
    headers = {
        ":authority": "127.0.0.1:10000", ":path": CHAT_PATH, ":method": "POST", ":scheme": "http",
        "content-type": "application/json", "content-length": str(len(body)), "x-request-id": request_id,
    }  # fmt: skip
    status = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")])
    buffered = processing_mode_pb2.ProcessingMode.BUFFERED
    streamed = processing_mode_pb2.ProcessingMode.STREAMED
    return [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(
                headers=base_pb2.HeaderMap(
                    headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
                )
            ),
            protocol_config=pb.ProtocolConfiguration(request_body_mode=buffered, response_body_mode=streamed),
        ),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=status)),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b'{"ok": true}', end_of_stream=True)),
    ]


async def _run_stream(service: ExtProcService, messages: list[pb.ProcessingRequest]) -> None:
    async def feed() -> Any:
        for message in messages:
            yield message

    async for _ in service.Process(feed(), None):  # type: ignore[arg-type]  # no gRPC context in-process
        pass


async def _client(service: ExtProcService, bodies: list[bytes], tag: str) -> None:
    for i, body in enumerate(bodies):
        await _run_stream(service, _stream(f"{tag}-{i}", body))


async def throughput(
    args: argparse.Namespace, source: TextSource, count: Callable[[str], int]
) -> dict[str, Any]:
    clients = args.concurrency
    per_client = max(1, args.throughput_requests // clients)
    size = args.throughput_tokens
    progress(f"throughput: {clients} clients x {per_client} unique and warm ~{size}-token prompts")
    # grow_chat's first request is the system prompt and one user message of half a turn: ~size tokens
    unique = [
        [grow_chat(source, 50_000 + c * 1000 + i, 2 * size, size, count)[0] for i in range(per_client)]
        for c in range(clients)
    ]
    chats = [
        [
            grow_chat(source, 90_000 + c * 1000 + i, args.throughput_turn_tokens, size, count)
            for i in range(per_client)
        ]
        for c in range(clients)
    ]
    out: dict[str, Any] = {"concurrency": clients, "requests": clients * per_client}
    for name, workload, earlier in (
        ("unique", unique, [[] for _ in range(clients)]),
        (
            "turns",
            [[chat[-1] for chat in client] for client in chats],
            [[m for chat in client for m in chat[:-1]] for client in chats],
        ),
    ):
        picker = EndpointPicker(picker_config(args.workers, None))
        service = ExtProcService(picker, max_body_bytes=16 << 20)
        for i, request in enumerate(grow_chat(source, 77, 2_000, 8_000, count)):  # first-use costs
            await _run_stream(service, _stream(f"warmup-{i}", body_of(request)))

        if any(earlier):  # the chats' earlier turns, unmeasured: the measured turns find them cached
            await asyncio.gather(
                *(
                    _client(service, [body_of(m) for m in e], f"{name}-earlier-{i}")
                    for i, e in enumerate(earlier)
                )
            )
        bodies = [[body_of(m) for m in client] for client in workload]
        before = picker.pools[MODEL].tokenizer.piece_cache_stats()
        gc.collect()
        child0, cpu0, wall0 = parse_workers_cpu_s(picker), time.process_time(), time.perf_counter()
        await asyncio.gather(*(_client(service, b, f"{name}-{i}") for i, b in enumerate(bodies)))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        child = parse_workers_cpu_s(picker) - child0
        n = sum(len(b) for b in bodies)
        tokenizer = picker.pools[MODEL].tokenizer
        stats = tokenizer.piece_cache_stats()
        tokens = [len(await tokenizer.tokenize(_parsed(picker, m))) for m in workload[0]]  # after: not hits
        assert stats is not None and before is not None
        hit, miss = stats.hit_tokens - before.hit_tokens, stats.miss_tokens - before.miss_tokens
        out[name] = {
            "requests_per_s": round(n / wall, 1),
            "cpu_ms_per_request": round((cpu + child) / n * 1e3, 3),
            "process_cpu_ms_per_request": round(cpu / n * 1e3, 3),
            "parse_workers_cpu_ms_per_request": round(child / n * 1e3, 3),
            "cores_busy": round((cpu + child) / wall, 2),
            "prompt_tokens_median": statistics.median(tokens),
            "piece_cache_token_hit_ratio": round(hit / max(1, hit + miss), 4),
            "picker_idle_after": picker.is_idle(),
        }
        progress(f"throughput {name}: {out[name]['requests_per_s']} requests/s")
        await picker.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds (default 5), fewer throughput requests"
    )
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--target-tokens", type=int, default=100_000)
    parser.add_argument("--turn-tokens", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--throughput-tokens", type=int, default=8_000)
    parser.add_argument("--throughput-turn-tokens", type=int, default=1_000)
    parser.add_argument("--throughput-requests", type=int, default=None, help="default 160 (--quick 96)")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--seed", type=int, default=21)
    args = parser.parse_args()
    args.throughput_requests = args.throughput_requests or (96 if args.quick else 160)
    report: dict[str, Any] = {
        "env": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        },
        "config": {
            "tokenizer": str(TOKENIZER),
            "workers": args.workers,
            "block_size": 16,
            "kv_events": False,
            "target_tokens": args.target_tokens,
            "turn_tokens": args.turn_tokens,
            "seed": args.seed,
        },
    }
    source = TextSource(args.seed)
    count = token_counter(HfTokenizer(TOKENIZER, piece_cache_bytes=0))
    report["picks"] = asyncio.run(cold_and_warm(args, source, count))
    if not args.no_throughput:
        report["throughput"] = asyncio.run(throughput(args, source, count))
    report["env"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
