"""What routing an audio upload on its form's `model` field costs, in process.

    .venv/bin/python benchmarks/bench_forms.py            # about 30 s
    .venv/bin/python benchmarks/bench_forms.py --quick    # about 5 s

An upload (`/v1/audio/transcriptions`, a multipart form) is read for its `model` field with the
engines' parser (`extproc/request/form.py`). This measures, lowest of `--rounds`:
- `settle_us`: `FormModel` reading the `openai` client's form (fields before the file) chunk by chunk
  until the field is read (the first chunk);
- `file_first_mb_per_s`: a whole body whose `model` comes after a `--mib` MiB file (`curl -F
  file=@... -F model=...`), read by `form_model`: the file is skipped by the parser;
- whole ext_proc streams through `ExtProcService.Process` in duplex mode (no gRPC, no Envoy): the
  same `--mib` MiB upload in 64 KiB chunks as a form (`form`: routed on its first chunk, then each
  chunk echoed as it comes) and as an opaque body of the same size (`opaque`:
  `application/octet-stream`, held whole and routed at its end, as every upload was before; the
  body limit raised to let it pass), interleaved. Per variant: the time per stream, and the time
  until the routing answer (the headers answer that lets Envoy open the upstream request).
Prints one JSON object (progress on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import ModelConfig, PickerConfig, RouterConfig, WorkerConfig
from extproc.epp.service import DUPLEX, ExtProcService
from extproc.picker.pipeline import EndpointPicker
from extproc.request.form import FormModel, form_model

MODELS = ("chat-model", "speech-model")
PATH = "/v1/audio/transcriptions"
CHUNK = 65536
BOUNDARY = "bench5d2c8f0e"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def upload(mib: int, *, file_first: bool) -> bytes:
    """A form as httpx writes it (fields first), or with the file first as `curl -F` may."""
    fields = b"".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in (("model", MODELS[1]), ("language", "en"))
    )
    file = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + bytes(range(256)) * (mib * 4096)
        + b"\r\n"
    )
    return (file + fields if file_first else fields + file) + f"--{BOUNDARY}--\r\n".encode()


def service(max_body_bytes: int) -> ExtProcService:
    workers = tuple(WorkerConfig(f"w{i}", f"127.0.0.{i + 1}:8000", MODELS[i % 2]) for i in range(4))
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=workers,
        models=tuple(ModelConfig(m) for m in MODELS),
        worker_session_control="off",
    )
    return ExtProcService(EndpointPicker(config), max_body_bytes=max_body_bytes)


def messages(body: bytes, content_type: str) -> list[pb.ProcessingRequest]:
    headers = {":path": PATH, ":method": "POST", "content-type": content_type}
    headers["content-length"] = str(len(body))
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
            )
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=DUPLEX, response_body_mode=1),
    )
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    return [first] + [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=c, end_of_stream=i == len(chunks) - 1))
        for i, c in enumerate(chunks)
    ]


async def stream(svc: ExtProcService, sent: list[pb.ProcessingRequest]) -> tuple[float, float]:
    """Seconds for the whole stream, and until its routing answer."""

    async def feed():
        for message in sent:
            yield message

    start = time.perf_counter()
    routed = None
    async for answer in svc.Process(feed(), None):
        if routed is None and answer.HasField("request_headers"):
            routed = time.perf_counter() - start
    total = time.perf_counter() - start
    if routed is None:
        raise SystemExit("a stream was never routed")
    return total, routed


async def measure(mib: int, rounds: int) -> dict[str, object]:
    body = upload(mib, file_first=False)
    variants = {
        "form": (service(16 << 20), messages(body, CONTENT_TYPE)),
        "opaque": (service(len(body) + 1), messages(body, "application/octet-stream")),
    }
    best: dict[str, tuple[float, float]] = {}
    for round_ in range(rounds):
        for name, (svc, sent) in variants.items():
            total, routed = await stream(svc, sent)
            previous = best.get(name)
            best[name] = (min(total, previous[0]), min(routed, previous[1])) if previous else (total, routed)
        print(f"round {round_ + 1}/{rounds}", file=sys.stderr)
    chunks = len(variants["form"][1]) - 1
    return {
        name: {
            "stream_ms": round(total * 1e3, 2),
            "per_chunk_us": round(total * 1e6 / chunks, 1),
            "until_routed_ms": round(routed * 1e3, 3),
        }
        for name, (total, routed) in best.items()
    } | {
        "chunks": chunks,
        "form_vs_opaque_stream": round(best["form"][0] / best["opaque"][0], 3),
        "form_vs_opaque_until_routed": round(best["form"][1] / best["opaque"][1], 5),
    }


def settle_us(rounds: int) -> float:
    body = upload(20, file_first=False)
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    best = float("inf")
    for _ in range(rounds * 50):
        start = time.perf_counter()
        form = FormModel(CONTENT_TYPE)
        for chunk in chunks:
            if form.feed(chunk):
                break
        best = min(best, time.perf_counter() - start)
        assert form.model == MODELS[1]
    return round(best * 1e6, 1)


def file_first_rate(mib: int, rounds: int) -> float:
    body = upload(mib, file_first=True)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        assert form_model(body, CONTENT_TYPE) == MODELS[1]
        best = min(best, time.perf_counter() - start)
    return round(len(body) / best / 1e6, 1)


def main() -> None:
    doc = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=doc)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and a 4 MiB upload")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per measure (7; quick: 3)")
    parser.add_argument("--mib", type=int, default=None, help="the upload's file in MiB (20; quick: 4)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    mib = args.mib or (4 if args.quick else 20)
    result = {
        "mib": mib,
        "rounds": rounds,
        "settle_us": settle_us(rounds),
        "file_first_mb_per_s": file_first_rate(mib, rounds),
        "duplex": asyncio.run(measure(mib, rounds)),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
