"""Builders shared by the picker and service tests: configs and ext_proc messages."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.router import RouterConfig

if TYPE_CHECKING:
    from extproc.picker.pipeline import EndpointPicker

MODEL = "demo-model"
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


_OPEN_PICKERS: list[EndpointPicker] = []


def closed_after_test(picker: EndpointPicker) -> EndpointPicker:
    """`picker`, closed when the test ends (by `close_pickers`, autouse in tests/epp/conftest.py).

    A body over 16 KiB starts a parse worker process: left open, it outlives its test, and its pipe
    is collected after the test's event loop closed, a ResourceWarning that fails a later test."""
    _OPEN_PICKERS.append(picker)
    return picker


async def close_pickers() -> None:
    pickers = list(_OPEN_PICKERS)
    _OPEN_PICKERS.clear()  # none left for the next test's loop, even if a close below fails
    for picker in pickers:
        await picker.close()


def picker_config(n_workers: int = 2, *, dp_ranks=(0,), **router) -> PickerConfig:
    router.setdefault("block_size", 16)
    router.setdefault("use_kv_events", False)
    router.setdefault("prefill_load_model", "none")  # Dynamo's cost, which these tests' loads are counted in
    workers = tuple(
        WorkerConfig(f"w{i}", f"127.0.0.{i + 1}:800{i}", MODEL, dp_ranks=tuple(dp_ranks))
        for i in range(n_workers)
    )
    return PickerConfig(
        router=RouterConfig(**router),
        workers=workers,
        models=(ModelConfig(MODEL),),
        max_body_bytes=1 << 20,
        seed=1,
        worker_session_control="off",  # no session calls to these made-up endpoints (test_worker_sessions)
    )


def chat_body(text: str = "hello there", *, model: str = MODEL, **extra) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}], **extra}).encode()


def request_headers(
    path="/v1/chat/completions", *, method="POST", end_of_stream=False, mode=BUFFERED, extra=None
):
    headers = {":path": path, ":method": method, "x-request-id": "rid-1", **(extra or {})}
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
            ),
            end_of_stream=end_of_stream,
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode, response_body_mode=1),
    )


def request_body(data: bytes, end_of_stream=True):
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def response_headers(status="200", end_of_stream=False, content_type: str | None = None):
    headers = [base_pb2.HeaderValue(key=":status", raw_value=status.encode())]
    if content_type is not None:
        headers.append(base_pb2.HeaderValue(key="content-type", raw_value=content_type.encode()))
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=headers), end_of_stream=end_of_stream
        )
    )


def response_body(data: bytes = b"data: {}\n\n", end_of_stream=False):
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def mutation_headers(common: pb.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


async def run(service, messages: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    """Feed `messages` to an ext_proc servicer's `Process` in this event loop (no gRPC): its answers."""

    async def feed():
        for message in messages:
            yield message

    return [answer async for answer in service.Process(feed(), None)]
