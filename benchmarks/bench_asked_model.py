"""What saying the asked model again costs a streamed answer: per response chunk, in process.

    .venv/bin/python benchmarks/bench_asked_model.py            # about 20 s
    .venv/bin/python benchmarks/bench_asked_model.py --quick    # about 5 s

A request that a rewrite sent as another model (`foodreview` as the adapter `foodreview-v2`) has
every chunk of its answer rewritten by the picker (`extproc/epp/asked_model.py`): the chunk is
searched, replaced and answered with a body mutation instead of the shared CONTINUE answer. This
drives whole ext_proc streams through `ExtProcService.Process` in this process (no gRPC, no Envoy):
request headers and body, response headers, then `--chunks` event-stream chunks as vLLM writes
them (one token each, about 200 bytes), for a request sent as asked (`as_asked`) and one sent as
the adapter (`rewritten`), interleaved, `--rounds` rounds; the lowest time per stream of each is
kept. Also `feed_us`: `ModelNameRestorer.feed` alone per chunk. Prints one JSON object (progress on
stderr): the response-path cost per chunk of each, their difference and ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import ModelConfig, PickerConfig, RouterConfig, WorkerConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.epp.asked_model import ModelNameRestorer
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker

MODEL = "demo-model"
RESOURCES = """\
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: rollout}
spec:
  poolRef: {name: pool}
  rules:
  - matches:
    - model: {value: foodreview}
    targets:
    - modelRewrite: foodreview-v2
"""


def chunk(model: str, index: int) -> bytes:
    event = {
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1764300000, "model": model,
        "choices": [
            {"index": 0, "delta": {"content": f" word{index}"}, "logprobs": None, "finish_reason": None}
        ],
    }  # fmt: skip
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def messages(asked: str, sent: str, chunks: int) -> list[pb.ProcessingRequest]:
    data = [chunk(sent, i) for i in range(chunks - 1)]
    return stream_messages(asked, [*data, b"data: [DONE]\n\n"])


def stream_messages(asked: str, answer: list[bytes]) -> list[pb.ProcessingRequest]:
    """One whole ext_proc stream: a chat request for `asked` (BUFFERED request body), a 2xx event
    stream's headers, and `answer`'s chunks, the last ending the body (STREAMED)."""
    headers = {":path": "/v1/chat/completions", ":method": "POST", "x-request-id": "bench"}
    body = json.dumps({"model": asked, "messages": [{"role": "user", "content": "hi " * 200}]}).encode()
    status = [base_pb2.HeaderValue(key=":status", raw_value=b"200")]
    status.append(base_pb2.HeaderValue(key="content-type", raw_value=b"text/event-stream"))
    out = [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(
                headers=base_pb2.HeaderMap(
                    headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
                )
            ),
            protocol_config=pb.ProtocolConfiguration(request_body_mode=2, response_body_mode=1),
        ),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=status))),
    ]
    last = len(answer) - 1
    for i, data in enumerate(answer):
        out.append(pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=i == last)))
    return out


async def one_stream(service: ExtProcService, stream: list[pb.ProcessingRequest]) -> float:
    async def feed():
        for message in stream:
            yield message

    start = time.perf_counter()
    async for _ in service.Process(feed(), None):
        pass
    return time.perf_counter() - start


async def measure(chunks: int, rounds: int, streams: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resources.yaml"
        path.write_text(RESOURCES)
        config = PickerConfig(
            router=RouterConfig(block_size=16, use_kv_events=False),
            workers=(WorkerConfig("w0", "127.0.0.1:8000", MODEL),),
            models=(ModelConfig(MODEL, lora_adapters=("foodreview-v2",)),),
            inference_extension=InferenceExtensionConfig(
                str(path), Pool("pool"), read_resources(str(path), Pool("pool"))
            ),
        )
        picker = EndpointPicker(config)
        service = ExtProcService(picker, max_body_bytes=1 << 20)
        cases = {
            "as_asked": messages("foodreview-v2", "foodreview-v2", chunks),
            "rewritten": messages("foodreview", "foodreview-v2", chunks),
        }
        best = dict.fromkeys(cases, float("inf"))
        for round_index in range(rounds):
            for name, stream in cases.items():
                total = 0.0
                for _ in range(streams):
                    total += await one_stream(service, stream)
                best[name] = min(best[name], total / streams)
            print(f"round {round_index + 1}/{rounds}: {best}", file=sys.stderr)
        await picker.close()
    restorer = ModelNameRestorer("foodreview-v2", "foodreview")
    data = [chunk("foodreview-v2", i) for i in range(chunks)]
    start = time.perf_counter()
    for _ in range(streams):
        for piece in data:
            restorer.feed(piece)
    feed_us = (time.perf_counter() - start) / (streams * chunks) * 1e6
    per_chunk = {name: seconds / chunks * 1e6 for name, seconds in best.items()}
    return {
        "chunks_per_stream": chunks,
        "chunk_bytes": len(data[0]),
        "rounds": rounds,
        "streams_per_round": streams,
        "stream_us": {name: round(seconds * 1e6, 1) for name, seconds in best.items()},
        "per_chunk_us": {name: round(value, 2) for name, value in per_chunk.items()},
        "added_per_chunk_us": round(per_chunk["rewritten"] - per_chunk["as_asked"], 2),
        "ratio_rewritten_to_as_asked": round(best["rewritten"] / best["as_asked"], 3),
        "feed_us": round(feed_us, 2),
    }


def cli(description: str | None, measure: Callable[[int, int, int], Awaitable[dict[str, object]]]) -> None:
    """Both stream benchmarks' command line: `--quick`, `--chunks`; `measure(chunks, rounds,
    streams)`'s JSON on stdout."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and streams (about 5 s)")
    parser.add_argument("--chunks", type=int, default=256, help="response chunks per stream (default 256)")
    args = parser.parse_args()
    rounds, streams = (3, 20) if args.quick else (7, 60)
    print(json.dumps(asyncio.run(measure(args.chunks, rounds, streams)), indent=2))


def main() -> None:
    cli(__doc__, measure)


if __name__ == "__main__":
    main()
