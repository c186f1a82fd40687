"""The router-group gRPC API served over a picker's routers (`--group-api-port`).

Only speaks `extproc.groups.v1.RouterGroup`: decodes with `codec.py`, calls `GroupRouters`,
encodes the answer, and turns the decision side's errors into gRPC status codes (listed in
`router_group.proto`). Runs in the picker's event loop, so its decisions interleave with the
picker's own ext_proc traffic on the same routers without locks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import grpc

from extproc.errors import UnknownModel
from extproc.groups._generated import router_group_pb2 as pb
from extproc.groups._generated import router_group_pb2_grpc as pb_grpc
from extproc.groups.codec import (
    WireError,
    decode_request,
    decode_worker,
    encode_commit,
    encode_loads,
    encode_probe,
)
from extproc.groups.routers import GroupRouters
from extproc.router import AllWorkersBusy, InvalidConfig, NoWorkers

log = logging.getLogger("extproc.groups.servicer")

T = TypeVar("T")
GROUP_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),  # a 1M-token prompt is 4 MB of token ids
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


class RouterGroupServicer(pb_grpc.RouterGroupServicer):
    """Serves one picker's routers to top-level pickers."""

    def __init__(self, routers: GroupRouters) -> None:
        self.routers = routers

    async def Probe(self, request: pb.ProbeRequest, context: grpc.aio.ServicerContext) -> pb.ProbeResponse:
        return await _answer(
            context, lambda: encode_probe(self.routers.probe(decode_request(request.request)))
        )

    async def Commit(self, request: pb.CommitRequest, context: grpc.aio.ServicerContext) -> pb.CommitResponse:
        def commit() -> pb.CommitResponse:
            probed = decode_worker(request.probed_worker) if request.HasField("probed_worker") else None
            decision = self.routers.commit(decode_request(request.request), request.request_id, probed)
            if decision.redecided:
                log.info(
                    "commit %s: probed worker %s cannot take it any more; re-decided on %s",
                    request.request_id,
                    probed,
                    decision.choice.worker,
                )
            return encode_commit(decision)

        return await _answer(context, commit)

    async def MarkPrefillComplete(
        self, request: pb.LifecycleRequest, context: grpc.aio.ServicerContext
    ) -> pb.LifecycleResponse:
        return pb.LifecycleResponse(
            known=self.routers.mark_prefill_complete(request.model, request.request_id)
        )

    async def Free(
        self, request: pb.LifecycleRequest, context: grpc.aio.ServicerContext
    ) -> pb.LifecycleResponse:
        return pb.LifecycleResponse(known=self.routers.free(request.model, request.request_id))

    async def PotentialLoads(
        self, request: pb.PotentialLoadsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PotentialLoadsResponse:
        return await _answer(
            context, lambda: encode_loads(self.routers.potential_loads(decode_request(request.request)))
        )


async def _answer(context: grpc.aio.ServicerContext, call: Callable[[], T]) -> T:
    try:
        return call()
    except (WireError, InvalidConfig, ValueError) as exc:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except UnknownModel as exc:
        await _abort(context, grpc.StatusCode.NOT_FOUND, exc.message)
    except NoWorkers as exc:
        await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except AllWorkersBusy as exc:
        await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("unreachable: abort raises")


@dataclass
class GroupApiServer:
    """The running group API: its gRPC server and the port it listens on."""

    server: grpc.aio.Server
    port: int
    servicer: RouterGroupServicer

    async def stop(self, grace_s: float | None = 1.0) -> None:
        """Refuse new calls, give open ones `grace_s` seconds (None: cancel them at once)."""
        await self.server.stop(grace_s)


async def start_group_api(
    routers: GroupRouters, host: str, port: int, *, credentials: grpc.ServerCredentials | None = None
) -> GroupApiServer:
    """Serve `routers` on host:port (0 picks a free port) in the running event loop; over TLS with
    `credentials` (the picker passes its ext_proc server's, see extproc/tls.py), else plaintext.

    Raises OSError when the port cannot be bound.
    """
    server = grpc.aio.server(options=GROUP_GRPC_OPTIONS)
    servicer = RouterGroupServicer(routers)
    pb_grpc.add_RouterGroupServicer_to_server(servicer, server)
    address = f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:  # newer grpcio raises instead of returning 0
        bound = 0
    if not bound:
        raise OSError(f"cannot listen on {host}:{port} for the router-group API")
    await server.start()
    log.info(
        "router-group API of %r on %s:%d (%s)",
        routers.name,
        host,
        bound,
        "TLS" if credentials else "plaintext",
    )
    return GroupApiServer(server, bound, servicer)
