"""What the Inference Extension's per-request and scheduler series cost a request: in process, side by
side.

    .venv/bin/python benchmarks/bench_objective_metrics.py            # about 20 s
    .venv/bin/python benchmarks/bench_objective_metrics.py --quick    # about 5 s

The servicer counts each routed request and its answer for the `inference_objective_*` series
(`extproc/epp/objective_metrics.py`) and the scheduler's (`extproc/epp/scheduler_metrics.py`), and
reads the engine's `usage` from every chunk of a 2xx answer
(`extproc/epp/usage.py`). This drives whole ext_proc streams through `ExtProcService.Process` in
this process (no gRPC, no Envoy): request headers and body, response headers, then `--chunks`
event-stream chunks as vLLM writes them (one token each, about 200 bytes, the last with its
`usage`), through the servicer as it is (`on`) and through the same servicer with both series
replaced by recorders that do nothing and the usage reader by one that reads nothing (`off`),
interleaved, `--rounds` rounds; the lowest time per stream of each is kept. Also `feed_us`:
`Usage.feed` alone per chunk. Prints one JSON object (progress on stderr): the cost per stream of
each, their difference per request and per chunk, and their ratio.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_asked_model import cli, one_stream, stream_messages

import extproc.epp.service as service_module
from extproc.config import ModelConfig, PickerConfig, RouterConfig, WorkerConfig
from extproc.epp.service import ExtProcService
from extproc.epp.usage import Usage
from extproc.picker.pick import ObjectiveLabels, Pick
from extproc.picker.pipeline import EndpointPicker

MODEL = "demo-model"


def chunk(index: int, last: bool) -> bytes:
    event: dict[str, object] = {
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1764300000, "model": MODEL,
        "choices": [
            {"index": 0, "delta": {"content": f" word{index}"}, "logprobs": None, "finish_reason": None}
        ],
    }  # fmt: skip
    if last:
        event["choices"] = []
        event["usage"] = {"prompt_tokens": 600, "total_tokens": 600 + index, "completion_tokens": index}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def messages(chunks: int) -> list[pb.ProcessingRequest]:
    answer = [chunk(i, i == chunks - 2) for i in range(chunks - 1)]
    return stream_messages(MODEL, [*answer, b"data: [DONE]\n\n"])


class NoSeries:
    """The per-request series' recorder, doing nothing (the `off` side)."""

    def routed(self, labels: ObjectiveLabels, request_bytes: int) -> None:
        pass

    def ended(self, labels: ObjectiveLabels) -> None:
        pass

    def failed(self, labels: ObjectiveLabels, code: str) -> None:
        pass

    def answered(self, *args: object) -> None:
        pass


class NoScheduler:
    """The scheduler series' recorder, doing nothing (the `off` side)."""

    def scheduled(self, pick: Pick) -> None:
        pass

    def refused(self, exc: BaseException) -> None:
        pass


class NoUsage(Usage):
    """A usage reader reading nothing (the `off` side)."""

    def feed(self, data: bytes) -> None:
        pass


async def measure(chunks: int, rounds: int, streams: int) -> dict[str, object]:
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=(WorkerConfig("w0", "127.0.0.1:8000", MODEL),),
        models=(ModelConfig(MODEL),),
    )
    picker = EndpointPicker(config)
    services = {"on": ExtProcService(picker, max_body_bytes=1 << 20)}
    services["off"] = ExtProcService(picker, max_body_bytes=1 << 20)
    services["off"].objectives = NoSeries()  # type: ignore[assignment]
    services["off"].scheduler = NoScheduler()  # type: ignore[assignment]
    stream = messages(chunks)
    readers = {"on": Usage, "off": NoUsage}
    best = dict.fromkeys(services, float("inf"))
    for round_index in range(rounds):
        for name, service in services.items():
            service_module.Usage = readers[name]  # type: ignore[misc]
            total = 0.0
            for _ in range(streams):
                total += await one_stream(service, stream)
            best[name] = min(best[name], total / streams)
        print(f"round {round_index + 1}/{rounds}: {best}", file=sys.stderr)
    service_module.Usage = Usage  # type: ignore[misc]
    await picker.close()
    data = [message.response_body.body for message in stream[3:]]
    start = time.perf_counter()
    for _ in range(streams):
        usage = Usage()
        for piece in data:
            usage.feed(piece)
    feed_us = (time.perf_counter() - start) / (streams * chunks) * 1e6
    added = best["on"] - best["off"]
    return {
        "chunks_per_stream": chunks,
        "chunk_bytes": len(data[0]),
        "rounds": rounds,
        "streams_per_round": streams,
        "stream_us": {name: round(seconds * 1e6, 1) for name, seconds in best.items()},
        "added_per_request_us": round(added * 1e6, 2),
        "added_per_chunk_us": round(added / chunks * 1e6, 3),
        "ratio_on_to_off": round(best["on"] / best["off"], 3),
        "feed_us": round(feed_us, 3),
    }


def main() -> None:
    cli(__doc__, measure)


if __name__ == "__main__":
    main()
