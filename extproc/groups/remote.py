"""RemoteGroup: another picker's router-group API (`--group-api-port`) as a `RouterGroup`.

A thin gRPC client: encodes with `codec.py`, calls with a deadline, decodes, and translates gRPC
failures into `GroupError`s where they enter (status codes as listed in `router_group.proto`).
Calls never wait for a connection: an unreachable group fails at once, and the channel retries in
the background with a short backoff so a restarted group is used again within seconds.

With `tls` (from --group-tls-*: a CA to verify the group against, a client certificate for groups
that require mutual TLS, a server name) the channel is TLS; a failed handshake (unknown CA, wrong
name, missing client certificate) makes the group unreachable, with gRPC's reason in the error.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from extproc.config import ClientTlsConfig
from extproc.groups._generated import router_group_pb2 as pb
from extproc.groups._generated import router_group_pb2_grpc as pb_grpc
from extproc.groups.codec import decode_commit, decode_loads, decode_probe, encode_request, encode_worker
from extproc.groups.errors import (
    ALL_BUSY,
    INVALID_REQUEST,
    NO_WORKERS,
    UNKNOWN_MODEL,
    GroupError,
    GroupRefused,
    GroupTimeout,
    GroupUnreachable,
)
from extproc.groups.servicer import GROUP_GRPC_OPTIONS
from extproc.groups.types import GroupDecision, GroupLoads, GroupProbe, GroupRequest
from extproc.runtime.tls import channel_credentials, channel_options

T = TypeVar("T")

CHANNEL_OPTIONS = [
    *GROUP_GRPC_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),  # a probe past its deadline is skipped, not retried
]
_REFUSALS = {
    grpc.StatusCode.NOT_FOUND: UNKNOWN_MODEL,
    grpc.StatusCode.FAILED_PRECONDITION: NO_WORKERS,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ALL_BUSY,
    grpc.StatusCode.INVALID_ARGUMENT: INVALID_REQUEST,
}


class RemoteGroup:
    """A router group reached over gRPC at `address` (host:port)."""

    def __init__(
        self,
        name: str,
        address: str,
        *,
        weight: float = 1.0,
        commit_timeout_s: float = 1.0,
        lifecycle_timeout_s: float = 2.0,
        tls: ClientTlsConfig | None = None,
    ) -> None:
        """Raises TlsError (extproc.tls) when `tls` names unusable files."""
        self._name = name
        self._weight = weight
        self.address = address
        self.commit_timeout_s = commit_timeout_s
        self.lifecycle_timeout_s = lifecycle_timeout_s
        self._channel: grpc.aio.Channel | None = None  # opened on first use, in the running event loop
        self._stub_: pb_grpc.RouterGroupStub | None = None
        self._encoded: tuple[GroupRequest, pb.RoutingRequest] | None = None
        tls = tls or ClientTlsConfig()
        self._credentials = channel_credentials(tls)  # read now: bad files fail at start, not per call
        self._options = [*CHANNEL_OPTIONS, *channel_options(tls)]

    @property
    def name(self) -> str:
        return self._name

    @property
    def weight(self) -> float:
        return self._weight

    async def probe(self, request: GroupRequest, *, timeout_s: float) -> GroupProbe:
        message = pb.ProbeRequest(request=self._encode(request))
        start = time.perf_counter()
        answer = await self._call(self._stub.Probe, message, timeout_s)
        return decode_probe(self._name, answer, time.perf_counter() - start)

    async def commit(self, request: GroupRequest, request_id: str, probe: GroupProbe) -> GroupDecision:
        message = pb.CommitRequest(
            request=self._encode(request),
            request_id=request_id,
            probed_worker=encode_worker(probe.choice.worker),
        )
        return decode_commit(self._name, await self._call(self._stub.Commit, message, self.commit_timeout_s))

    async def mark_prefill_complete(self, model: str, request_id: str) -> bool:
        message = pb.LifecycleRequest(model=model, request_id=request_id)
        answer = await self._call(self._stub.MarkPrefillComplete, message, self.lifecycle_timeout_s)
        return answer.known

    async def free(self, model: str, request_id: str) -> bool:
        message = pb.LifecycleRequest(model=model, request_id=request_id)
        return (await self._call(self._stub.Free, message, self.lifecycle_timeout_s)).known

    async def potential_loads(self, request: GroupRequest) -> GroupLoads:
        message = pb.PotentialLoadsRequest(request=self._encode(request))
        answer = await self._call(self._stub.PotentialLoads, message, self.lifecycle_timeout_s)
        return decode_loads(self._name, answer)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub_ = None

    @property
    def _stub(self) -> pb_grpc.RouterGroupStub:
        if self._stub_ is None:
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(
                    self.address, self._credentials, options=self._options
                )
            self._stub_ = pb_grpc.RouterGroupStub(self._channel)
        return self._stub_

    def _encode(self, request: GroupRequest) -> pb.RoutingRequest:
        # A probe and its commit send the same prompt: pack the token ids once.
        if self._encoded is None or self._encoded[0] is not request:
            self._encoded = (request, encode_request(request))
        return self._encoded[1]

    async def _call(self, method: Callable[..., Awaitable[T]], message: object, timeout_s: float) -> T:
        try:
            return await method(message, timeout=timeout_s, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            raise self._translate(exc, timeout_s) from exc

    def _translate(self, exc: grpc.aio.AioRpcError, timeout_s: float) -> GroupError:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return GroupTimeout(self._name, timeout_s)
        reason = _REFUSALS.get(code)
        if reason is not None:
            return GroupRefused(self._name, reason, exc.details() or "")
        return GroupUnreachable(self._name, f"{code.name}: {exc.details() or ''}".strip())

    def __repr__(self) -> str:
        return f"RemoteGroup({self._name!r}, {self.address!r})"
