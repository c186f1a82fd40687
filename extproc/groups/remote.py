"""RemoteGroup: another picker's router-group API (`--group-api-port`) as a `RouterGroup`.

A gRPC client: encodes with `codec.py`, calls with a deadline, decodes, and translates gRPC
failures into `GroupError`s where they enter (status codes as listed in `router_group.proto`).
Calls never wait for a connection: an unreachable group fails at once, and the channel retries in
the background with a short backoff so a restarted group is used again within seconds.

It also owns what keeps the group's load true when calls fail (`leases.py` is the group's side):
- every commit carries this picker's `owner` id, a sequence number and the lease;
- while it holds requests there, a renewal goes out every third of the lease, listing them; the
  group frees the ones no longer listed (a Free that never arrived) and, if renewals stop (this
  picker died), all of them when the lease runs out;
- first-token and free calls run in the background, so the ext_proc stream never waits on another
  picker, and are retried (`RETRIES`, with backoff) until the group acknowledges them; a free that
  still fails is reconciled by the next renewal.
- the worker's response status goes with the free, for the group's outlier ejection.

With `tls` (from --group-tls-*: a CA to verify the group against, a client certificate for groups
that require mutual TLS, a server name) the channel is TLS; a failed handshake (unknown CA, wrong
name, missing client certificate) makes the group unreachable, with gRPC's reason in the error.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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
from extproc.router import Worker
from extproc.runtime.tls import channel_credentials, channel_options
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.groups")

T = TypeVar("T")

DEFAULT_LEASE_S = 10.0  # a dead top-level picker's requests are freed in its groups after this
RETRIES = 6  # attempts of a lifecycle call before leaving it to the next renewal
RETRY_BASE_S = 0.2  # first pause between attempts; doubles each time (0.2 ... 6.4 s)

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

LifecycleFailure = Callable[[str, str], None]  # (group, call) of a failed attempt, for the metrics


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
        owner: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        on_lifecycle_failure: LifecycleFailure | None = None,
        retries: int = RETRIES,
        retry_base_s: float = RETRY_BASE_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Raises TlsError (extproc.runtime.tls) when `tls` names unusable files. `sleep`: the pause
        between a lifecycle call's attempts and between renewals (tests record them)."""
        if not lease_s > 0:
            raise ValueError(f"lease_s must be positive, got {lease_s!r}")
        self._name = name
        self._weight = weight
        self.address = address
        self.commit_timeout_s = commit_timeout_s
        self.lifecycle_timeout_s = lifecycle_timeout_s
        self.owner = owner or uuid.uuid4().hex
        self.lease_s = lease_s
        self.on_lifecycle_failure = on_lifecycle_failure
        self.retries = retries
        self.retry_base_s = retry_base_s
        self._sleep = sleep
        self._channel: grpc.aio.Channel | None = None  # opened on first use, in the running event loop
        self._stub_: pb_grpc.RouterGroupStub | None = None
        self._encoded: tuple[GroupRequest, pb.RoutingRequest] | None = None
        tls = tls or ClientTlsConfig()
        self._credentials = channel_credentials(tls)  # read now: bad files fail at start, not per call
        self._options = [*CHANNEL_OPTIONS, *channel_options(tls)]
        self._seq = 0  # commits sent to this group
        self._committing: set[int] = set()  # commit numbers sent and not yet answered
        self._live: dict[str, int] = {}  # group request id -> commit number, until freed here
        self._status: dict[str, int] = {}  # the worker's answer of a live request, sent with its free
        self._reconcile = False  # a free may not have arrived: the next renewal settles it
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_call: dict[str, asyncio.Task[Any]] = {}  # per request: its latest lifecycle call
        self._renewer: asyncio.Task[None] | None = None
        self._output_pending: dict[str, list[int]] = {}  # request -> [tokens, sequences] not sent yet
        self._sends_output_tokens = True  # False once the group answered UNIMPLEMENTED

    @property
    def name(self) -> str:
        return self._name

    @property
    def weight(self) -> float:
        return self._weight

    @property
    def in_process(self) -> bool:
        return False

    def live(self) -> int:
        """Requests committed here and not yet freed by this picker."""
        return len(self._live)

    # --- decisions ---------------------------------------------------------------------------

    async def probe(self, request: GroupRequest, *, timeout_s: float) -> GroupProbe:
        message = pb.ProbeRequest(request=self._encode(request))
        start = time.perf_counter()
        answer = await self._call(self._stub.Probe, message, timeout_s)
        return decode_probe(self._name, answer, time.perf_counter() - start)

    async def commit(self, request: GroupRequest, request_id: str, worker: Worker | None) -> GroupDecision:
        self._seq += 1
        seq = self._seq
        message = pb.CommitRequest(
            request=self._encode(request),
            request_id=request_id,
            owner=self.owner,
            owner_seq=seq,
            lease_s=self.lease_s,
        )
        if worker is not None:
            message.probed_worker.CopyFrom(encode_worker(worker))
        self._committing.add(seq)
        try:
            answer = await self._call(self._stub.Commit, message, self.commit_timeout_s)
        except BaseException:
            self._reconcile = True  # it may have tracked the request: the next renewal frees it
            self._ensure_renewer()
            raise
        else:
            decision = decode_commit(self._name, answer)
            self._live[decision.request_id] = seq
            self._ensure_renewer()
            return decision
        finally:
            self._committing.discard(seq)

    async def has_capacity(self, request: GroupRequest) -> bool:
        return (await self.probe(request, timeout_s=self.commit_timeout_s)).has_capacity

    async def potential_loads(self, request: GroupRequest) -> GroupLoads:
        message = pb.PotentialLoadsRequest(request=self._encode(request))
        answer = await self._call(self._stub.PotentialLoads, message, self.lifecycle_timeout_s)
        return decode_loads(self._name, answer)

    # --- lifecycle (never waits, never raises) ---------------------------------------------

    def mark_prefill_complete(self, model: str, request_id: str, *, at_first_token: bool = True) -> None:
        if request_id in self._live:
            message = pb.LifecycleRequest(
                model=model, request_id=request_id, after_first_token=not at_first_token
            )
            call = self._retried("prefill_complete", self._stub.MarkPrefillComplete, message)
            self._spawn(request_id, call)

    def add_output_tokens(self, model: str, request_id: str, count: int, sequences: int) -> None:
        """Forwarded (AddOutputTokens), coalesced: while a call is on its way, more tokens add up and
        go in the next one, so a stream of chunks costs at most one call in flight per request. Not
        retried (the free settles the load anyway); a group that does not serve the call (an older
        picker: UNIMPLEMENTED) is not asked again. The group's own --router-track-output-blocks
        decides whether its router counts them; more sequences (the request's `n`) count without it."""
        if request_id not in self._live or not self._sends_output_tokens or (count <= 0 and sequences <= 1):
            return
        pending = self._output_pending.get(request_id)
        if pending is not None:
            pending[0] += count
            pending[1] = sequences
            return
        self._output_pending[request_id] = [count, sequences]
        self._spawn(request_id, self._send_output_tokens(model, request_id))

    async def _send_output_tokens(self, model: str, request_id: str) -> None:
        pending = self._output_pending.pop(request_id, None)
        if pending is None or request_id not in self._live or not self._sends_output_tokens:
            return
        message = pb.OutputTokensRequest(
            model=model,
            request_id=request_id,
            tokens=min(pending[0], 2**32 - 1),
            sequences=min(pending[1], 2**32 - 1),
        )
        try:
            await self._stub.AddOutputTokens(message, timeout=self.lifecycle_timeout_s, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                if self._sends_output_tokens:  # calls already on their way answer the same: said once
                    log.warning(
                        "group %s does not serve AddOutputTokens (an older picker): its requests' "
                        "output blocks are not counted there", self._name,
                    )  # fmt: skip
                self._sends_output_tokens = False
                return
            if self.on_lifecycle_failure is not None:
                self.on_lifecycle_failure(self._name, "output_tokens")
            log.debug("output tokens of %s in group %s not sent: %s", request_id, self._name, exc.code().name)

    def answered(self, model: str, request_id: str, worker: Worker, status: int) -> None:
        if request_id in self._live:
            self._status[request_id] = status

    def free(self, model: str, request_id: str) -> None:
        self._live.pop(request_id, None)
        self._output_pending.pop(request_id, None)
        status = self._status.pop(request_id, 0)
        message = pb.LifecycleRequest(model=model, request_id=request_id, status=status)
        self._spawn(request_id, self._retried("free", self._stub.Free, message))

    async def renew(self) -> int:
        """Renew this picker's requests in the group now; returns how many the group freed."""
        # commits still unanswered cannot be listed yet: reconcile only those before them
        settled = min(self._committing) - 1 if self._committing else self._seq
        message = pb.RenewRequest(
            owner=self.owner, lease_s=self.lease_s, live=list(self._live), up_to_seq=settled
        )
        answer = await self._call(self._stub.Renew, message, self.lifecycle_timeout_s)
        self._reconcile = False
        if answer.freed:
            log.info(
                "router group %s freed %d requests this picker no longer holds", self._name, answer.freed
            )
        return int(answer.freed)

    async def drain(self) -> None:
        """Wait until every background lifecycle call has finished (acknowledged or given up)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        if self._renewer is not None:
            await cancel_and_wait(self._renewer)
            self._renewer = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub_ = None

    # --- internals ---------------------------------------------------------------------------

    async def _retried(self, call: str, method: Callable[..., Awaitable[Any]], message: object) -> None:
        delay = self.retry_base_s
        for attempt in range(1, self.retries + 1):
            try:
                await self._call(method, message, self.lifecycle_timeout_s)
                return
            except GroupError as exc:
                if self.on_lifecycle_failure is not None:
                    self.on_lifecycle_failure(self._name, call)
                if attempt == self.retries:
                    log.warning("%s in group %s failed %d times (%s); the next renewal settles it",
                                call, self._name, attempt, exc)  # fmt: skip
                    self._reconcile = True
                    self._ensure_renewer()
                    return
                await self._sleep(delay)  # backoff between attempts, not synchronisation
                delay *= 2

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_loop(), name=f"renew-group-{self._name}"
            )

    async def _renew_loop(self) -> None:
        """Renew every third of the lease while requests are held here or a free may be missing."""
        while self._live or self._reconcile:
            await self._sleep(self.lease_s / 3)  # the renewal period, not synchronisation
            try:
                await self.renew()
            except GroupError as exc:
                if self.on_lifecycle_failure is not None:
                    self.on_lifecycle_failure(self._name, "renew")
                log.warning("renewing the lease of %d requests in group %s failed: %s",
                            len(self._live), self._name, exc)  # fmt: skip

    def _spawn(self, request_id: str, coro: Awaitable[None]) -> None:
        """Run a lifecycle call in the background, after the request's previous one (a free never
        overtakes its first token)."""
        previous = self._last_call.get(request_id)
        task = asyncio.ensure_future(self._after(previous, coro))
        self._last_call[request_id] = task
        self._tasks.add(task)

        def done(finished: asyncio.Task[Any]) -> None:
            self._tasks.discard(finished)
            if self._last_call.get(request_id) is finished:
                del self._last_call[request_id]

        task.add_done_callback(done)

    @staticmethod
    async def _after(previous: asyncio.Task[Any] | None, coro: Awaitable[None]) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await coro

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
