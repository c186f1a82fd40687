"""A scripted engine on loopback for subscriber tests: an XPUB socket (it hears the subscription,
so a test publishes only once the subscriber listens, without sleeping) and a ROUTER replay socket
that answers each request with whatever the test scripts, recording the requests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

Reply = list[bytes]  # one message after the client identity, e.g. [b"", topic, seq, payload]
Script = Callable[[int], Sequence[Reply]]  # start seq -> the messages that answer it


def bound_endpoint(sock: zmq.asyncio.Socket) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


class FakeEngine:
    """PUB (XPUB) and replay (ROUTER) sockets on 127.0.0.1, ports chosen by the OS."""

    def __init__(self, script: Script | None = None) -> None:
        self.script: Script | None = script
        self.requests: list[list[bytes]] = []  # as received, without the client identity
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:0")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:0")
        self._task: asyncio.Task[None] | None = None

    @property
    def pub_endpoint(self) -> str:
        return bound_endpoint(self.pub)

    @property
    def replay_endpoint(self) -> str:
        return bound_endpoint(self.router)

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            client, *request = await self.router.recv_multipart()
            self.requests.append(request)
            if self.script is None or len(request) != 2 or len(request[1]) != 8:
                continue  # no answer at all
            for message in self.script(int.from_bytes(request[1], "big")):
                await self.router.send_multipart([client, *message])

    async def wait_subscribed(self, timeout_s: float = 3.0) -> None:
        """Until a subscriber's subscription has reached the PUB side."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("no subscriber subscribed")
            message = await asyncio.wait_for(self.pub.recv(), remaining)
            if message[:1] == b"\x01":
                return

    async def publish(self, frames: Sequence[bytes]) -> None:
        await self.pub.send_multipart(list(frames))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()
