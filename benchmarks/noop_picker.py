"""The baseline endpoint picker: answers every ext_proc phase with CONTINUE and picks round robin.

No parsing, no tokenizing, no router: what is left is the floor every real picker pays (one gRPC
stream per request, one round trip per phase). It is also the reference for how a picker must
answer Envoy 1.40 in each body mode; the facts cited are in /work/shared/REFERENCE.md section 2
and the protocol in section 1 (Gateway API Inference Extension endpoint-picker protocol v1.0).

    python benchmarks/noop_picker.py --port 9002 --workers 127.0.0.1:8001,127.0.0.1:8002

`--port 0 --ports-file PATH` binds a free port and writes it to PATH ({"port": N}, as `extproc
serve --ports-file` does). Importable: `await serve_noop_picker(port, workers)` returns a started
`grpc.aio.Server` and the port it listens on (port 0 picks a free one).
Wire types come from xds-protos (`envoy.service.ext_proc.v3`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import signal
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from extproc.runtime.ports_file import write_ports_file

log = logging.getLogger("noop_picker")

DESTINATION_HEADER = "x-gateway-destination-endpoint"  # EPP protocol: header and metadata key
DESTINATION_NAMESPACE = "envoy.lb"  # dynamic metadata namespace read by the cluster / override_host
# Envoy accepts streamed body chunks of at most ~62 KB back from the picker (REFERENCE 2).
MAX_STREAMED_CHUNK_BYTES = 62 * 1024
# grpcio refuses messages above 4 MiB by default; a BUFFERED body arrives as one message.
MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    # grpcio sets SO_REUSEPORT by default: a second server could silently share the port.
    ("grpc.so_reuseport", 0),
]

_Mode = processing_mode_pb2.ProcessingMode
NONE = _Mode.NONE
STREAMED = _Mode.STREAMED
BUFFERED = _Mode.BUFFERED
BUFFERED_PARTIAL = _Mode.BUFFERED_PARTIAL
FULL_DUPLEX_STREAMED = _Mode.FULL_DUPLEX_STREAMED

_CONTINUE_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
_CONTINUE_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
_CONTINUE_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
_CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
_CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
_CONTINUE_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def destination_common_response(endpoint: str) -> pb.CommonResponse:
    """CONTINUE with the destination header set, overwriting any client value (EPP protocol)."""
    return pb.CommonResponse(
        status=pb.CommonResponse.CONTINUE,
        header_mutation=pb.HeaderMutation(
            set_headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=DESTINATION_HEADER, raw_value=endpoint.encode()),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                )
            ]
        ),
        # The destination changes routing: make Envoy re-evaluate the route (EPP protocol).
        clear_route_cache=True,
    )


def destination_metadata(endpoint: str) -> struct_pb2.Struct:
    """dynamic_metadata {envoy.lb: {x-gateway-destination-endpoint: endpoint}}.

    Envoy keeps it only because the filter lists envoy.lb in receiving_namespaces (REFERENCE 2);
    the ORIGINAL_DST cluster (buffered, duplex) and override_host (failopen) route on it.
    """
    metadata = struct_pb2.Struct()
    metadata.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: endpoint}})
    return metadata


def streamed_body_responses(
    body: bytes, *, end_of_stream: bool, response_phase: bool = False
) -> list[pb.ProcessingResponse]:
    """`body` as FULL_DUPLEX_STREAMED answers: chunks of <= 62 KB, `end_of_stream` on the last."""
    chunks = [body[i : i + MAX_STREAMED_CHUNK_BYTES] for i in range(0, len(body), MAX_STREAMED_CHUNK_BYTES)]
    chunks = chunks or [b""]
    answers = []
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        body_response = pb.BodyResponse(
            response=pb.CommonResponse(
                body_mutation=pb.BodyMutation(
                    streamed_response=pb.StreamedBodyResponse(
                        body=chunk, end_of_stream=end_of_stream and last
                    )
                )
            )
        )
        if response_phase:
            answers.append(pb.ProcessingResponse(response_body=body_response))
        else:
            answers.append(pb.ProcessingResponse(request_body=body_response))
    return answers


class NoopPicker(pb_grpc.ExternalProcessorServicer):
    """ext_proc servicer: CONTINUE for every phase, destination = next worker in round robin.

    With `record=True` it keeps the request headers it was shown and its picks (the last 1000)
    so tests can check what reached the picker; off by default to keep the baseline lean.
    """

    def __init__(self, workers: Sequence[str], *, record: bool = False) -> None:
        if not workers:
            raise ValueError("NoopPicker needs at least one worker 'ip:port'")
        self.workers = list(workers)
        self._round_robin = itertools.cycle(self.workers)
        self._answers: dict[str, tuple[pb.ProcessingResponse, pb.ProcessingResponse]] = {}
        self.seen_request_headers: deque[dict[str, str]] | None = deque(maxlen=1000) if record else None
        self.picks: deque[str] | None = deque(maxlen=1000) if record else None

    def pick(self) -> str:
        endpoint = next(self._round_robin)
        if self.picks is not None:
            self.picks.append(endpoint)
        return endpoint

    def _destination_answers(self, endpoint: str) -> tuple[pb.ProcessingResponse, pb.ProcessingResponse]:
        """(headers answer, body answer) carrying `endpoint`; built once per endpoint and reused."""
        answers = self._answers.get(endpoint)
        if answers is None:
            common, metadata = destination_common_response(endpoint), destination_metadata(endpoint)
            answers = (
                pb.ProcessingResponse(
                    request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
                ),
                pb.ProcessingResponse(
                    request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata
                ),
            )
            self._answers[endpoint] = answers
        return answers

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """One stream per HTTP request; one answer per message Envoy sends (none are async)."""
        request_body_mode = NONE
        response_body_mode = NONE
        # FULL_DUPLEX_STREAMED: request body chunks held until end_of_stream (or trailers).
        held_body: list[bytes] | None = None
        async for request in request_iterator:
            if request.HasField("protocol_config"):
                # Sent on the first message only: the body modes this filter instance uses.
                request_body_mode = request.protocol_config.request_body_mode
                response_body_mode = request.protocol_config.response_body_mode
            phase = request.WhichOneof("request")

            if phase == "request_headers":
                if self.seen_request_headers is not None:
                    self.seen_request_headers.append(_header_dict(request.request_headers))
                if request.request_headers.end_of_stream:
                    # No body (GET): the destination goes on the headers answer in every mode.
                    yield self._destination_answers(self.pick())[0]
                elif request_body_mode in (BUFFERED, BUFFERED_PARTIAL):
                    # BUFFERED: CONTINUE at once, or Envoy never sends the body and the request
                    # ends in 504 after message_timeout (REFERENCE 2). Destination comes with the body.
                    yield _CONTINUE_REQUEST_HEADERS
                elif request_body_mode == FULL_DUPLEX_STREAMED:
                    # Hold the headers answer until the body has been seen (REFERENCE 2).
                    held_body = []
                else:
                    # NONE / STREAMED: the body is never needed (or cannot wait): decide now.
                    yield self._destination_answers(self.pick())[0]

            elif phase == "request_body":
                body = request.request_body
                if request_body_mode == FULL_DUPLEX_STREAMED and held_body is not None:
                    held_body.append(body.body)
                    if body.end_of_stream:
                        for answer in self._release_duplex(b"".join(held_body), end_of_stream=True):
                            yield answer
                        held_body = None
                elif request_body_mode in (BUFFERED, BUFFERED_PARTIAL):
                    # The whole body in one message; the header mutation and metadata ride on the
                    # BodyResponse and Content-Length is kept (REFERENCE 2).
                    yield self._destination_answers(self.pick())[1]
                else:
                    yield _CONTINUE_REQUEST_BODY

            elif phase == "request_trailers":
                if held_body is not None:
                    # Trailers end the body instead of an end_of_stream chunk.
                    for answer in self._release_duplex(b"".join(held_body), end_of_stream=False):
                        yield answer
                    held_body = None
                yield _CONTINUE_REQUEST_TRAILERS

            elif phase == "response_headers":
                yield _CONTINUE_RESPONSE_HEADERS

            elif phase == "response_body":
                if response_body_mode == FULL_DUPLEX_STREAMED:
                    # Envoy forwards only what we stream back: echo every chunk.
                    body = request.response_body
                    for answer in streamed_body_responses(
                        body.body, end_of_stream=body.end_of_stream, response_phase=True
                    ):
                        yield answer
                else:
                    # STREAMED: one answer per chunk; the first chunk is about the first token.
                    yield _CONTINUE_RESPONSE_BODY

            elif phase == "response_trailers":
                yield _CONTINUE_RESPONSE_TRAILERS

    def _release_duplex(self, body: bytes, *, end_of_stream: bool) -> list[pb.ProcessingResponse]:
        """The held headers answer (with destination) followed by the body echoed in chunks."""
        headers_answer = self._destination_answers(self.pick())[0]
        return [headers_answer, *streamed_body_responses(body, end_of_stream=end_of_stream)]


def _header_dict(headers: pb.HttpHeaders) -> dict[str, str]:
    # Envoy 1.40 fills raw_value; value is kept for older proxies.
    return {
        h.key: (h.raw_value.decode(errors="replace") if h.raw_value else h.value)
        for h in headers.headers.headers
    }


async def serve_noop_picker(
    port: int, workers: Iterable[str], *, host: str = "127.0.0.1", picker: NoopPicker | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the no-op picker on host:port (in the running event loop); return the server and the
    port it bound (port 0 picks a free one).

    Pass `picker` to keep a handle on the servicer (e.g. `NoopPicker(workers, record=True)`);
    otherwise one is built from `workers`. Stop it with `await server.stop(grace_s)`.
    Raises RuntimeError if the port cannot be bound.
    """
    servicer = picker if picker is not None else NoopPicker(list(workers))
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot bind the no-op picker to {address}: {exc}") from exc
    if bound == 0:
        raise RuntimeError(f"cannot bind the no-op picker to {address}")
    await server.start()
    return server, bound


async def _main(port: int, workers: list[str], host: str, ports_file: str | None) -> None:
    server, port = await serve_noop_picker(port, workers, host=host)
    if ports_file:
        write_ports_file(ports_file, {"port": port})
    log.info("no-op picker on %s:%d, round robin over %s", host, port, ", ".join(workers))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9002, help="ext_proc gRPC port (EPP convention: 9002)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--workers", required=True, help="comma-separated ip:port list to pick from round robin"
    )
    parser.add_argument("--ports-file", help='once listening, write {"port": N} here (for --port 0)')
    args = parser.parse_args(argv)
    workers = [w.strip() for w in args.workers.split(",") if w.strip()]
    if not workers:
        parser.error("--workers needs at least one ip:port")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(_main(args.port, workers, args.host, args.ports_file))


if __name__ == "__main__":
    main()
