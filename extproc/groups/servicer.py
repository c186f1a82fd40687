"""The router-group gRPC API served over this picker's local group (`--group-api-port`).

Only speaks `extproc.groups.v1.RouterGroup`: decodes with `codec.py`, calls the local group (the
same decision the picker's own ext_proc traffic gets), encodes the answer, and turns the decision's
errors into gRPC status codes (listed in `router_group.proto`). Runs in the picker's event loop, so
its decisions interleave with the picker's own traffic on the same routers without locks.

It keeps the leases of the top-level pickers that commit here (`leases.py`): a request whose owner
stops renewing is freed when the lease runs out (checked every `SWEEP_S`), and a renewal frees the
owner's requests it no longer lists. Counted in `freed_by_lease` / `freed_by_renewal`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol, TypeVar

import grpc

from extproc.errors import NoEligibleWorker, RequestInvalid, UnknownModel
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
from extproc.groups.leases import LeaseTable
from extproc.groups.types import GroupDecision, GroupLoads, GroupProbe, GroupRequest
from extproc.router import AllWorkersBusy, InvalidConfig, NoWorkers, Worker
from extproc.runtime.wakeups import lazy_sleep
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.groups.servicer")

T = TypeVar("T")
SWEEP_S = 0.5  # how often expired leases are looked for
GROUP_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),  # a 1M-token prompt is 4 MB of token ids
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


class ServedGroup(Protocol):
    """What the API serves: `extproc.picker.local_group.LocalGroup` fits."""

    @property
    def name(self) -> str: ...

    def probe_now(self, request: GroupRequest) -> GroupProbe: ...

    async def fetch_overlaps(self, request: GroupRequest) -> None: ...

    def commit_now(self, request: GroupRequest, request_id: str, worker: Worker | None) -> GroupDecision: ...

    def first_token(self, request_id: str, *, at_first_token: bool = True) -> bool: ...

    def finish(self, request_id: str, status: int | None = None) -> bool: ...

    def output_tokens(self, request_id: str, count: int, sequences: int) -> bool: ...

    def potential_loads_now(self, request: GroupRequest) -> GroupLoads: ...


@dataclass(slots=True)
class LeaseStats:
    freed_by_lease: int = 0  # requests of owners that stopped renewing
    freed_by_renewal: int = 0  # requests an owner no longer listed (their Free was lost)
    expired_owners: int = 0


class RouterGroupServicer(pb_grpc.RouterGroupServicer):
    """Serves this picker's local group to top-level pickers."""

    def __init__(
        self,
        group: ServedGroup,
        *,
        clock: Callable[[], float] = time.monotonic,
        before_decision: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.group = group
        self.clock = clock
        self.leases = LeaseTable()
        self.lease_stats = LeaseStats()
        self.before_decision = before_decision  # the picker's: replica sync's catch-up

    async def Probe(self, request: pb.ProbeRequest, context: grpc.aio.ServicerContext) -> pb.ProbeResponse:
        if self.before_decision is not None:
            await self.before_decision()
        asked = await _answer(context, lambda: decode_request(request.request))
        await self.group.fetch_overlaps(asked)
        return await _answer(context, lambda: encode_probe(self.group.probe_now(asked)))

    async def Commit(self, request: pb.CommitRequest, context: grpc.aio.ServicerContext) -> pb.CommitResponse:
        if self.before_decision is not None:
            await self.before_decision()
        asked = await _answer(context, lambda: decode_request(request.request))
        await self.group.fetch_overlaps(asked)

        def commit() -> pb.CommitResponse:
            probed = decode_worker(request.probed_worker) if request.HasField("probed_worker") else None
            decision = self.group.commit_now(asked, request.request_id, probed)
            if decision.redecided:
                log.info("commit %s: worker %s cannot take it any more; re-decided on %s",
                         request.request_id, probed, decision.choice.worker)  # fmt: skip
            if request.owner:
                lease_s = request.lease_s if request.lease_s > 0 else 10.0
                evicted = self.leases.track(
                    request.owner, decision.request_id, request.owner_seq, lease_s, self.clock()
                )
                self._free(evicted, "too many owners")
            return encode_commit(decision)

        return await _answer(context, commit)

    async def MarkPrefillComplete(
        self, request: pb.LifecycleRequest, context: grpc.aio.ServicerContext
    ) -> pb.LifecycleResponse:
        known = self.group.first_token(request.request_id, at_first_token=not request.after_first_token)
        return pb.LifecycleResponse(known=known)

    async def Free(
        self, request: pb.LifecycleRequest, context: grpc.aio.ServicerContext
    ) -> pb.LifecycleResponse:
        self.leases.untrack(request.request_id)
        return pb.LifecycleResponse(known=self.group.finish(request.request_id, request.status or None))

    async def AddOutputTokens(
        self, request: pb.OutputTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.LifecycleResponse:
        known = self.group.output_tokens(request.request_id, request.tokens, max(1, request.sequences))
        return pb.LifecycleResponse(known=known)

    async def PotentialLoads(
        self, request: pb.PotentialLoadsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PotentialLoadsResponse:
        asked = await _answer(context, lambda: decode_request(request.request))
        await self.group.fetch_overlaps(asked)
        return await _answer(context, lambda: encode_loads(self.group.potential_loads_now(asked)))

    async def Renew(self, request: pb.RenewRequest, context: grpc.aio.ServicerContext) -> pb.RenewResponse:
        if not request.owner or not request.lease_s > 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "a renewal needs an owner and a lease")
        stale = self.leases.renew(
            request.owner, request.lease_s, request.live, request.up_to_seq, self.clock()
        )
        self.lease_stats.freed_by_renewal += self._free(
            stale, f"owner {request.owner[:16]} no longer holds them"
        )
        return pb.RenewResponse(freed=len(stale))

    def sweep(self) -> int:
        """Free the requests of owners whose lease ran out; returns how many."""
        freed = 0
        for owner, requests in self.leases.expired(self.clock()).items():
            self.lease_stats.expired_owners += 1
            n = self._free(requests, "")
            freed += n
            log.warning("owner %s of %d requests stopped renewing its lease: freed them", owner[:16], n)
        self.lease_stats.freed_by_lease += freed
        return freed

    def _free(self, request_ids: list[str], why: str) -> int:
        freed = sum(1 for request_id in request_ids if self.group.finish(request_id))
        if freed and why:
            log.info("freed %d requests of %s: %s", freed, self.group.name, why)
        return freed


async def _answer(context: grpc.aio.ServicerContext, call: Callable[[], T]) -> T:
    try:
        return call()
    except (WireError, InvalidConfig, RequestInvalid, ValueError) as exc:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except UnknownModel as exc:
        await _abort(context, grpc.StatusCode.NOT_FOUND, exc.message)
    except (NoWorkers, NoEligibleWorker) as exc:
        await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except AllWorkersBusy as exc:
        await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("unreachable: abort raises")


@dataclass
class GroupApiServer:
    """The running group API: its gRPC server, the port it listens on, and the lease sweeper."""

    server: grpc.aio.Server
    port: int
    servicer: RouterGroupServicer
    sweeper: asyncio.Task[None] | None = field(default=None, repr=False)

    async def stop(self, grace_s: float | None = 1.0) -> None:
        """Refuse new calls, give open ones `grace_s` seconds (None: cancel them at once)."""
        if self.sweeper is not None:
            await cancel_and_wait(self.sweeper)
            self.sweeper = None
        await self.server.stop(grace_s)


async def _sweep_forever(servicer: RouterGroupServicer) -> None:
    while True:
        await lazy_sleep(SWEEP_S, SWEEP_S)  # a timer: leases run out with no event to wait for
        servicer.sweep()


async def start_group_api(
    group: ServedGroup,
    host: str,
    port: int,
    *,
    credentials: grpc.ServerCredentials | None = None,
    before_decision: Callable[[], Awaitable[None]] | None = None,
) -> GroupApiServer:
    """Serve `group` on host:port (0 picks a free port) in the running event loop; over TLS with
    `credentials` (the picker passes its ext_proc server's, see extproc/runtime/tls.py), else plaintext.
    `before_decision` is awaited before each probe and commit, as the picker's own decisions do.

    Raises OSError when the port cannot be bound.
    """
    server = grpc.aio.server(options=GROUP_GRPC_OPTIONS)
    servicer = RouterGroupServicer(group, before_decision=before_decision)
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
    sweeper = asyncio.get_running_loop().create_task(_sweep_forever(servicer), name="group-lease-sweeper")
    log.info("router-group API of %r on %s:%d (%s)", group.name, host, bound,
             "TLS" if credentials else "plaintext")  # fmt: skip
    return GroupApiServer(server, bound, servicer, sweeper)
