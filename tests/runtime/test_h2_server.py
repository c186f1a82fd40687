"""The picker's own HTTP/2 gRPC server against real clients: grpcio's (grpc.aio) and python-hyper's h2.

Envoy itself drives it in every e2e test (`start_picker` serves ext_proc with it by default); these
cover what Envoy does not show on a good day: flow control past the windows, resets, refusals,
malformed frames, TLS and the graceful stop.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from google.protobuf.wrappers_pb2 import BytesValue

from extproc.config import TlsConfig
from extproc.runtime.h2_server import PREFACE, H2GrpcServer
from extproc.runtime.tls import self_signed_pair, server_ssl_context

METHOD = "/test.Echo/Stream"


class Echo:
    """Answers every message with its bytes (times `repeat`); records how streams ended."""

    def __init__(self, repeat: int = 1, *, hold: bool = False) -> None:
        self.repeat = repeat
        self.ended: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()  # `hold`: answers wait until it is set
        if not hold:
            self.release.set()

    async def __call__(self, requests: AsyncIterator[BytesValue], context: Any) -> AsyncIterator[BytesValue]:
        self.started.set()
        try:
            async for request in requests:
                if request.value == b"raise":
                    raise RuntimeError("the servicer failed")
                await self.release.wait()
                yield BytesValue(value=request.value * self.repeat)
            self.ended.append("complete")
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise


@asynccontextmanager
async def serving(handler: Any, **kwargs: Any) -> AsyncIterator[tuple[H2GrpcServer, int]]:
    """The server on 127.0.0.1 and a free port, stopped on the way out (again, if a test stopped it)."""
    ssl_context = kwargs.pop("ssl_context", None)
    server = H2GrpcServer(METHOD, handler, BytesValue.FromString, **kwargs)
    port = await server.start("127.0.0.1", 0, ssl_context=ssl_context)
    try:
        yield server, port
    finally:
        await server.stop(None)


def channel_to(port: int, **kwargs: Any) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", **kwargs)


def call(channel: grpc.aio.Channel, method: str = METHOD) -> Any:
    return channel.stream_stream(
        method, request_serializer=BytesValue.SerializeToString, response_deserializer=BytesValue.FromString
    )()


async def assert_echoed(channel: grpc.aio.Channel, value: bytes) -> None:
    """One stream on `channel`: `value` out and back, then a clean end."""
    stream = call(channel)
    await stream.write(BytesValue(value=value))
    assert (await stream.read()).value == value
    await stream.done_writing()
    assert await stream.code() is grpc.StatusCode.OK


async def eventually(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)  # a bounded poll


async def test_a_grpcio_client_streams_messages_back_and_forth():
    echo = Echo()
    async with serving(echo) as (_, port), channel_to(port) as channel:
        stream = call(channel)
        for i in range(20):
            await stream.write(BytesValue(value=b"m%d" % i))
            assert (await stream.read()).value == b"m%d" % i
        await stream.done_writing()
        assert await stream.read() is grpc.aio.EOF
        assert await stream.code() is grpc.StatusCode.OK
    assert echo.ended == ["complete"]


async def test_many_concurrent_streams_on_one_connection_each_get_their_own_answers():
    async with serving(Echo()) as (server, port), channel_to(port) as channel:

        async def one(k: int) -> list[bytes]:
            stream = call(channel)
            got = []
            for i in range(5):
                await stream.write(BytesValue(value=b"%d-%d" % (k, i)))
                got.append((await stream.read()).value)
            await stream.done_writing()
            assert await stream.code() is grpc.StatusCode.OK
            return got

        results = await asyncio.gather(*(one(k) for k in range(64)))
        assert results == [[b"%d-%d" % (k, i) for i in range(5)] for k in range(64)]
        assert server.open_streams == 0


async def test_messages_larger_than_every_window_and_frame_go_through_both_ways():
    """5 MiB up (the stream window is 1 MiB, a frame at most 1 MiB) and 15 MiB down (grpcio's
    windows are smaller still): both sides wait for WINDOW_UPDATEs and nothing is lost."""
    body = bytes(range(256)) * (5 * 4096)
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    async with serving(Echo(repeat=3)) as (_, port), channel_to(port, options=options) as channel:
        stream = call(channel)
        for _ in range(2):
            await stream.write(BytesValue(value=body))
            assert (await stream.read()).value == body * 3
        await stream.done_writing()
        assert await stream.code() is grpc.StatusCode.OK


async def test_a_message_over_the_limit_ends_the_stream_resource_exhausted():
    async with serving(Echo(), max_message_bytes=1000) as (_, port), channel_to(port) as channel:
        stream = call(channel)
        await stream.write(BytesValue(value=b"x" * 2000))
        assert await stream.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most 1000" in await stream.details()
        await assert_echoed(channel, b"fine")  # the connection serves the next stream as usual


async def test_an_unknown_method_is_unimplemented_and_never_reaches_the_servicer():
    echo = Echo()
    async with serving(echo) as (_, port), channel_to(port) as channel:
        stream = call(channel, "/test.Echo/Other")  # answered at its headers
        assert await stream.code() is grpc.StatusCode.UNIMPLEMENTED
        assert "/test.Echo/Other" in await stream.details()
    assert not echo.started.is_set()


async def test_a_servicer_that_raises_ends_its_stream_internal_and_the_server_goes_on():
    async with serving(Echo()) as (_, port), channel_to(port) as channel:
        stream = call(channel)
        await stream.write(BytesValue(value=b"raise"))
        assert await stream.code() is grpc.StatusCode.INTERNAL
        await assert_echoed(channel, b"next")


async def test_a_message_that_does_not_parse_is_invalid_argument():
    async with serving(Echo()) as (_, port), channel_to(port) as channel:
        raw = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)()
        await raw.write(b"\x0a\xff\xff\xff\xff")  # field 1, a length past the message's end
        assert await raw.code() is grpc.StatusCode.INVALID_ARGUMENT


async def in_flight(channel: grpc.aio.Channel, echo: Echo, value: bytes) -> Any:
    """A stream whose message the servicer has and holds (an `Echo(hold=True)`)."""
    stream = call(channel)
    await stream.write(BytesValue(value=value))
    await asyncio.wait_for(echo.started.wait(), 5)
    return stream


async def test_a_stream_the_client_cancels_cancels_the_servicer():
    echo = Echo(hold=True)  # the servicer holds its answer: the stream is open when cancelled
    async with serving(echo) as (server, port), channel_to(port) as channel:
        stream = await in_flight(channel, echo, b"held")
        stream.cancel()
        await eventually(lambda: echo.ended == ["cancelled"])
        await eventually(lambda: server.open_streams == 0)


async def test_stop_lets_open_streams_finish_within_the_grace_and_refuses_new_ones():
    echo = Echo(hold=True)
    async with serving(echo) as (server, port), channel_to(port) as channel:
        stream = await in_flight(channel, echo, b"in flight")
        stopping = asyncio.ensure_future(server.stop(10.0))
        await eventually(lambda: server.stopping)
        with pytest.raises(OSError):  # the listener is closed at once
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        echo.release.set()  # the stream in flight is answered and finishes
        assert (await stream.read()).value == b"in flight"
        await stream.done_writing()
        assert await stream.code() is grpc.StatusCode.OK
        await asyncio.wait_for(stopping, 5)
    assert echo.ended == ["complete"]


async def test_stop_cancels_what_is_still_open_after_the_grace():
    echo = Echo(hold=True)
    async with serving(echo) as (server, port), channel_to(port) as channel:
        stream = await in_flight(channel, echo, b"never answered")
        await server.stop(0.05)
        assert echo.ended == ["cancelled"]
        assert await stream.code() is grpc.StatusCode.CANCELLED


async def test_tls_with_a_self_signed_certificate_and_alpn_h2():
    pair = self_signed_pair(["localhost"])
    context = server_ssl_context(TlsConfig(self_signed=True), pair)
    credentials = grpc.ssl_channel_credentials(root_certificates=pair.certificate_pem)
    options = [("grpc.ssl_target_name_override", "localhost")]
    async with (
        serving(Echo(), ssl_context=context) as (_, port),
        grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel,
    ):
        await assert_echoed(channel, b"secret")


# --- raw HTTP/2 with python-hyper's h2 (what grpcio never sends) -----------------------------------


class RawClient:
    """An h2 client connection over a plain socket, read until a condition holds."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.events: list[Any] = []

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def read_until(self, predicate: Any) -> list[Any]:
        while not predicate(self.events):
            data = self.sock.recv(65536)
            if not data:
                return self.events
            self.events += self.conn.receive_data(data)
            self.flush()
        return self.events

    def open(self, stream_id: int, path: str = METHOD, content_type: str = "application/grpc") -> None:
        self.conn.send_headers(
            stream_id,
            [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
             ("content-type", content_type), ("te", "trailers")],
        )  # fmt: skip
        self.flush()

    def close(self) -> None:
        self.sock.close()


def _status(events: list[Any], stream_id: int) -> str | None:
    for event in events:
        if (
            isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived))
            and event.stream_id == stream_id
        ):
            for name, value in event.headers:
                if name in (b"grpc-status", b":status") and value != b"200":
                    return value.decode()
    return None


async def test_a_compressed_message_is_unimplemented():
    async with serving(Echo()) as (_, port):
        with closing(RawClient(port)) as client:
            client.open(1)
            client.conn.send_data(1, struct.pack(">BI", 1, 3) + b"abc")
            client.flush()
            events = await asyncio.to_thread(client.read_until, lambda ev: _status(ev, 1) is not None)
            assert _status(events, 1) == "12"


async def test_a_content_type_that_is_not_grpc_is_answered_415():
    echo = Echo()
    async with serving(echo) as (_, port):
        with closing(RawClient(port)) as client:
            client.open(1, content_type="application/json")
            events = await asyncio.to_thread(client.read_until, lambda ev: _status(ev, 1) is not None)
            assert _status(events, 1) == "415"
    assert not echo.started.is_set()


async def test_streams_past_the_limit_are_refused_and_a_ping_is_answered():
    echo = Echo(hold=True)

    def refused_and_pong(events: list[Any]) -> bool:
        reset = any(isinstance(e, h2.events.StreamReset) and e.stream_id == 5 for e in events)
        return reset and any(isinstance(e, h2.events.PingAckReceived) for e in events)

    async with serving(echo, max_concurrent_streams=2) as (server, port):
        with closing(RawClient(port)) as client:
            for stream_id in (1, 3, 5):  # before the server's SETTINGS (its limit) reached the client
                client.open(stream_id)
            client.conn.ping(b"12345678")
            client.flush()
            events = await asyncio.to_thread(client.read_until, refused_and_pong)
            assert refused_and_pong(events)
            reset = next(e for e in events if isinstance(e, h2.events.StreamReset))
            assert reset.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
            await eventually(lambda: server.open_streams == 2)
    assert echo.ended == ["cancelled", "cancelled"]  # the connection's close cancelled both


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not HTTP/2
        PREFACE + struct.pack(">BHBBI", 0x11, 0, 0x0, 0, 1),  # a frame over 1 MiB
        PREFACE + struct.pack(">BHBBI", 0, 2, 0x1, 0x4, 1) + b"\xff\xff",  # bad HPACK
        PREFACE + struct.pack(">BHBBI", 0, 4, 0x0, 0, 7) + b"abcd",  # DATA on a stream never opened
    ],
    ids=["http1", "frame-too-large", "bad-hpack", "data-on-idle-stream"],
)
async def test_malformed_connections_are_closed_and_the_server_serves_the_next(garbage):
    async with serving(Echo()) as (server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        await writer.drain()
        assert await asyncio.wait_for(_read_to_end(reader), 5)  # its SETTINGS, maybe a GOAWAY, then EOF
        writer.close()
        assert server.connections == set() or all(c.going_away for c in server.connections)
        async with channel_to(port) as channel:
            await assert_echoed(channel, b"still here")


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
    return data
