"""Request traces for replay: the Mooncake (FAST'25) JSONL format and its token expansion. No clock.

A Mooncake line is one request: `timestamp` (ms since the trace start), `input_length`,
`output_length` and `hash_ids`, one id per `trace_block_size`-token block of the prompt (512 in
the published traces). Prompts that share a leading run of hash ids share that prefix. As
Dynamo's mocker replays them (REFERENCE section 6), hash id h becomes `trace_block_size` copies of
token id h and the prompt is clamped to `len(hash_ids) * trace_block_size` tokens.

Times are made relative to the first request (it arrives at 0, as in Dynamo's replay), then divided
by the speed-up. Several files are concatenated in time: each next file starts where the previous
one ended.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path


class TraceError(ValueError):
    """A trace file cannot be read: names the file, the line and what is wrong."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, arrival already scaled by the replay speed-up."""

    index: int  # position in the (concatenated) trace
    arrival_ms: float
    input_tokens: int  # prompt length after clamping to the hash ids
    output_tokens: int
    hash_ids: tuple[int, ...]
    trace_block_size: int

    def token_ids(self) -> list[int]:
        """The prompt: `trace_block_size` copies of each hash id, cut at `input_tokens`."""
        bs = self.trace_block_size
        tokens: list[int] = []
        for h in self.hash_ids:
            tokens += [h] * bs
        del tokens[self.input_tokens :]
        return tokens


def load_mooncake(
    paths: Sequence[str | Path], *, trace_block_size: int = 512, speedup: float = 1.0
) -> list[TraceRequest]:
    """Read Mooncake JSONL files into requests sorted by arrival. Raises TraceError, OSError.

    `speedup` divides every arrival time (2 = arrivals twice as fast).
    """
    if trace_block_size < 1:
        raise ValueError(f"trace_block_size must be >= 1, got {trace_block_size}")
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    requests: list[TraceRequest] = []
    offset_ms = 0.0
    for path in paths:
        end_ms = offset_ms
        with open(path, encoding="utf-8") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                ts, isl, osl, ids = _parse_line(str(path), number, raw)
                arrival = offset_ms + ts
                end_ms = max(end_ms, arrival)
                isl = min(isl, len(ids) * trace_block_size)
                requests.append(TraceRequest(len(requests), arrival, isl, osl, ids, trace_block_size))
        offset_ms = end_ms
    requests.sort(key=lambda r: (r.arrival_ms, r.index))
    start_ms = requests[0].arrival_ms if requests else 0.0
    if speedup != 1.0 or start_ms != 0.0:
        requests = [_shifted(r, start_ms, speedup) for r in requests]
    return requests


def jitter_arrivals(requests: Sequence[TraceRequest], max_ms: float, seed: int) -> list[TraceRequest]:
    """The same requests, each arriving up to `max_ms` later (uniform, drawn from `seed`), re-sorted.

    For comparing routing policies: a replay is chaotic, so one tie broken otherwise changes every
    later decision and a policy with no random draw replays one trajectory whatever the seed. A
    millisecond of jitter gives such a policy a spread of trajectories of the same trace, and each
    seed the same trace for every policy compared. Indexes are kept, so records still name lines.
    """
    if max_ms < 0:
        raise ValueError(f"max_ms must be >= 0, got {max_ms}")
    if max_ms == 0:
        return list(requests)
    rng = random.Random(f"arrivals-{seed}")  # not the router's stream: seeds stay independent
    out = [replace(r, arrival_ms=r.arrival_ms + rng.uniform(0.0, max_ms)) for r in requests]
    out.sort(key=lambda r: (r.arrival_ms, r.index))
    return out


def _shifted(r: TraceRequest, start_ms: float, speedup: float) -> TraceRequest:
    arrival = (r.arrival_ms - start_ms) / speedup
    return TraceRequest(r.index, arrival, r.input_tokens, r.output_tokens, r.hash_ids, r.trace_block_size)


def _parse_line(path: str, number: int, raw: str) -> tuple[float, int, int, tuple[int, ...]]:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceError(path, number, f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(path, number, "expected a JSON object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise TraceError(path, number, f"missing key {key!r}")
    ts, isl, osl, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts < 0:
        raise TraceError(path, number, f"timestamp must be a number of ms >= 0, got {ts!r}")
    if not _positive_int(isl) or not _positive_int(osl):
        raise TraceError(
            path, number, f"input_length and output_length must be integers >= 1, got {isl!r}, {osl!r}"
        )
    if not isinstance(ids, list) or not ids or not all(_id(h) for h in ids):
        raise TraceError(path, number, "hash_ids must be a non-empty list of integers in [0, 2**32)")
    return float(ts), isl, osl, tuple(ids)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def write_mooncake(path: str | Path, rows: Iterable[tuple[float, int, int, Sequence[int]]]) -> None:
    """Write (timestamp ms, input length, output length, hash ids) rows as Mooncake JSONL (tests, tools)."""
    with open(path, "w", encoding="utf-8") as f:
        for ts, isl, osl, ids in rows:
            f.write(
                json.dumps(
                    {"timestamp": ts, "input_length": isl, "output_length": osl, "hash_ids": list(ids)}
                )
                + "\n"
            )
