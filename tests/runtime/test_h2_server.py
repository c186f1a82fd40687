"""The picker's own HTTP/2 gRPC server against real clients: grpcio's (grpc.aio) and python-hyper's h2.

Envoy itself drives it in every e2e test (`start_picker` serves ext_proc with it by default); these
cover what Envoy does not show on a good day: flow control past the windows, resets, refusals,
malformed frames, TLS and the graceful stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from google.protobuf.wrappers_pb2 import BytesValue

from extproc.config import TlsConfig
from extproc.runtime import h2_server
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
    """An h2 client connection over a plain socket, read until a condition holds (what it reads is
    credited back to the server at once)."""

    def __init__(self, port: int, *, stream_window: int | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        if stream_window is not None:  # the client's SETTINGS_INITIAL_WINDOW_SIZE
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window}
            )
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
            for event in self.conn.receive_data(data):
                self.events.append(event)
                if isinstance(event, h2.events.DataReceived):  # give the server its window back
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
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


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
    return data


# --- every protocol violation gets its own GOAWAY code (the module's answers table) --------------


def _raw_frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


_OPEN_BLOCK = hpack.Encoder().encode(
    [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "x"),
     ("content-type", "application/grpc"), ("te", "trailers")],
)  # fmt: skip
DATA_, HEADERS_, SETTINGS_, PUSH_PROMISE_, PING_, WINDOW_UPDATE_, CONTINUATION_ = 0, 1, 4, 5, 6, 8, 9
END_STREAM_, END_HEADERS_, PADDED_ = 0x1, 0x4, 0x8
PROTOCOL, FLOW_CONTROL, FRAME_SIZE, COMPRESSION = 0x1, 0x3, 0x6, 0x9


def _open(stream_id: int, flags: int = END_HEADERS_) -> bytes:
    return _raw_frame(HEADERS_, flags, stream_id, _OPEN_BLOCK)


def _setting(key: int, value: int) -> bytes:
    return _raw_frame(SETTINGS_, 0, 0, struct.pack(">HI", key, value))


VIOLATIONS = {  # what follows the client's preface
    "headers-on-stream-0": (_raw_frame(HEADERS_, END_HEADERS_, 0, _OPEN_BLOCK), PROTOCOL),
    "continuation-without-headers": (_raw_frame(CONTINUATION_, END_HEADERS_, 1, _OPEN_BLOCK), PROTOCOL),
    "continuation-of-another-stream": (_open(1, 0) + _raw_frame(CONTINUATION_, END_HEADERS_, 3), PROTOCOL),
    "header-block-interrupted": (_open(1, 0) + _raw_frame(PING_, 0, 0, b"12345678"), PROTOCOL),
    "header-block-over-64k": (
        _open(1, 0)
        + _raw_frame(CONTINUATION_, 0, 1, b"\0" * 40_000)
        + _raw_frame(CONTINUATION_, 0, 1, b"\0" * 40_000),
        PROTOCOL,
    ),
    "bad-hpack": (_raw_frame(HEADERS_, END_HEADERS_, 1, b"\xff\xff"), COMPRESSION),
    "even-stream-id": (_open(2), PROTOCOL),
    "stream-opened-out-of-order": (_open(3) + _open(1), PROTOCOL),
    "second-header-block-without-end": (_open(1) + _open(1), PROTOCOL),
    "data-after-end-of-stream": (
        _open(1, END_HEADERS_ | END_STREAM_) + _raw_frame(DATA_, 0, 1, b"\0\0\0\0\0"),
        PROTOCOL,
    ),
    "data-on-stream-0": (_raw_frame(DATA_, 0, 0, b"abcd"), PROTOCOL),
    "padding-longer-than-frame": (_raw_frame(HEADERS_, END_HEADERS_ | PADDED_, 1, b"\x05abcd"), PROTOCOL),
    "empty-padded-frame": (_raw_frame(HEADERS_, END_HEADERS_ | PADDED_, 1), PROTOCOL),
    "data-padding-longer-than-frame": (  # its second byte (a gRPC prefix's flag, 0) is no pad length
        _open(1) + _raw_frame(DATA_, PADDED_, 1, b"\x09\0\0\0\0"),
        PROTOCOL,
    ),
    "ping-of-7-bytes": (_raw_frame(PING_, 0, 0, b"1234567"), FRAME_SIZE),
    "ping-on-a-stream": (_raw_frame(PING_, 0, 1, b"12345678"), PROTOCOL),
    "settings-on-a-stream": (_raw_frame(SETTINGS_, 0, 1), PROTOCOL),
    "settings-not-6-byte-entries": (_raw_frame(SETTINGS_, 0, 0, b"\0\4\0\0\0"), FRAME_SIZE),
    "initial-window-over-2^31-1": (_setting(0x4, 1 << 31), FLOW_CONTROL),
    "max-frame-size-under-16k": (_setting(0x5, 16383), PROTOCOL),
    "max-frame-size-over-16m": (_setting(0x5, 1 << 24), PROTOCOL),
    "window-update-of-3-bytes": (_raw_frame(WINDOW_UPDATE_, 0, 0, b"\0\0\1"), FRAME_SIZE),
    "connection-window-over-2^31-1": (
        _raw_frame(WINDOW_UPDATE_, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535 + 1)),
        FLOW_CONTROL,
    ),
    "push-promise-from-a-client": (_raw_frame(PUSH_PROMISE_, END_HEADERS_, 1, b"\0\0\0\2"), PROTOCOL),
    "frame-over-1-mib": (struct.pack(">BHBBI", 0x10, 1, DATA_, 0, 1), FRAME_SIZE),
    "data-on-a-stream-never-opened": (_raw_frame(DATA_, 0, 7, b"abcd"), PROTOCOL),
}
NOT_HTTP2 = {  # a client that never sends the preface
    "http1": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "preface-cut-short-then-wrong": PREFACE[:10] + b"X",
    "preface-wrong-at-its-last-byte": PREFACE[:-1] + b"X",
}


def _parse(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The server's frames in `data` (bytes read to the connection's end) as (type, flags, stream,
    payload), as `_frames_until` gives them."""
    frames = []
    pos = 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        stream_id = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        frames.append((data[pos + 3], data[pos + 4], stream_id, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return frames


def _goaway_code(data: bytes) -> int | None:
    """The error code of the first GOAWAY among the server's frames in `data`."""
    codes = [int.from_bytes(p[4:8], "big") for t, _, _, p in _parse(data) if t == 0x7]
    return codes[0] if codes else None


def _data(frames: list[tuple[int, int, int, bytes]], stream_id: int) -> bytes:
    """The DATA bytes the server sent on `stream_id`."""
    return b"".join(p for t, _, s, p in frames if t == DATA_ and s == stream_id)


@pytest.mark.parametrize(
    ("sent", "code"),
    [(PREFACE + frames, code) for frames, code in VIOLATIONS.values()]
    + [(garbage, PROTOCOL) for garbage in NOT_HTTP2.values()],
    ids=[*VIOLATIONS, *NOT_HTTP2],
)
async def test_each_protocol_violation_is_answered_with_its_goaway_code(sent, code, caplog):
    caplog.set_level(logging.WARNING)
    async with serving(Echo()) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        await writer.drain()
        answer = await asyncio.wait_for(_read_to_end(reader), 5)  # closed after the GOAWAY
        writer.close()
        assert _goaway_code(answer) == code
        async with channel_to(port) as channel:
            await assert_echoed(channel, b"the next connection is served")
    # answered by the server itself: no exception escaped into asyncio's "Fatal error" handler
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _message(value: bytes) -> bytes:
    """A gRPC message (5-byte prefix) carrying BytesValue(value)."""
    payload = BytesValue(value=value).SerializeToString()
    return struct.pack(">BI", 0, len(payload)) + payload


def _send(client: RawClient, stream_id: int, rest: bytearray, *, end_stream: bool = False) -> int:
    """Send from the front of `rest` what the stream's and the connection's windows and the frame
    size allow (END_STREAM with its last byte if `end_stream`); returns the frames sent."""
    frames = 0
    while rest:
        n = min(
            len(rest), client.conn.local_flow_control_window(stream_id), client.conn.max_outbound_frame_size
        )
        if n <= 0:
            break
        client.conn.send_data(stream_id, bytes(rest[:n]), end_stream=end_stream and n == len(rest))
        del rest[:n]
        frames += 1
    client.flush()
    return frames


def _server_windows_known(events: list[Any]) -> bool:
    settings = any(isinstance(e, h2.events.RemoteSettingsChanged) for e in events)
    return settings and any(isinstance(e, h2.events.WindowUpdated) and e.stream_id == 0 for e in events)


async def test_the_connection_window_is_credited_back_so_a_long_lived_connection_never_stalls(monkeypatch):
    """Envoy keeps one connection for every ext_proc stream: the server must hand the connection
    window back as it receives, or after 2 GiB in all the client can send nothing more. At a lower
    threshold (the real one is 1 GiB) 180 kB on one stream get one connection-level credit."""
    monkeypatch.setattr(h2_server, "CONNECTION_CREDIT_AT", 100_000)
    initial_increase = h2_server.MAX_WINDOW - 65535  # sent once at the connection's start

    def credited(events: list[Any]) -> list[int]:
        return [
            e.delta
            for e in events
            if isinstance(e, h2.events.WindowUpdated) and e.stream_id == 0 and e.delta != initial_increase
        ]

    echo = Echo()
    async with serving(echo) as (_, port):
        with closing(RawClient(port)) as client:
            await asyncio.to_thread(client.read_until, _server_windows_known)  # else 64 KiB in all
            client.open(1)
            _send(client, 1, bytearray(b"".join(_message(bytes([i]) * 60_000) for i in range(3))))
            events = await asyncio.to_thread(client.read_until, lambda ev: credited(ev))
            [delta] = credited(events)
            sent = 3 * len(_message(bytes(60_000)))
            assert 100_000 <= delta <= sent
            client.conn.end_stream(1)
            client.flush()
            events = await asyncio.to_thread(client.read_until, lambda ev: _status(ev, 1) is not None)
            assert _status(events, 1) == "0"
            echoed = sum(len(e.data) for e in events if isinstance(e, h2.events.DataReceived))
            assert echoed == sent
    assert echo.ended == ["complete"]


async def test_a_connection_that_drops_cancels_its_streams_servicers_at_once():
    echo = Echo(hold=True)
    async with serving(echo) as (server, port):
        client = RawClient(port)
        client.open(1)
        client.conn.send_data(1, _message(b"held"))
        client.flush()
        await asyncio.wait_for(echo.started.wait(), 5)
        await eventually(lambda: server.open_streams == 1)
        client.close()
        await eventually(lambda: echo.ended == ["cancelled"])  # the server is still running
        assert server.open_streams == 0


async def test_grpc_message_is_percent_encoded_and_a_clean_end_sends_only_grpc_status():
    async with serving(Echo()) as (_, port):
        with closing(RawClient(port)) as client:
            client.open(1, path="/t%\u00fc")  # an unknown method, named with '%' and a non-ASCII letter
            client.open(3)
            client.conn.send_data(3, _message(b"hi"), end_stream=True)
            client.flush()
            done = lambda ev: _status(ev, 1) is not None and _status(ev, 3) is not None  # noqa: E731
            events = await asyncio.to_thread(client.read_until, done)
    blocks = {
        (e.stream_id, type(e).__name__): [(bytes(n), bytes(v)) for n, v in e.headers]
        for e in events
        if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived))
    }
    assert blocks[(1, "TrailersReceived")] == [
        (b"grpc-status", b"12"),
        (b"grpc-message", b"unknown method /t%25%C3%BC"),
    ]
    assert blocks[(3, "ResponseReceived")] == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert blocks[(3, "TrailersReceived")] == [(b"grpc-status", b"0")]


async def _frames_until(reader: asyncio.StreamReader, done: Any) -> list[tuple[int, int, int, bytes]]:
    """The server's frames as (type, flags, stream, payload), read until `done(frames)` holds."""
    frames: list[tuple[int, int, int, bytes]] = []
    while not done(frames):
        head = await asyncio.wait_for(reader.readexactly(9), 5)
        length = int.from_bytes(head[:3], "big")
        payload = await asyncio.wait_for(reader.readexactly(length), 5)
        frames.append((head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload))
    return frames


def _ended(stream_id: int) -> Any:
    return lambda frames: any(t == HEADERS_ and f & END_STREAM_ and s == stream_id for t, f, s, _ in frames)


async def test_a_client_whose_bytes_arrive_one_at_a_time_is_served():
    """Frames (and the preface) split anywhere across reads, as TCP may deliver them: a real h2
    client's bytes handed to the server's connection one `data_received` at a time (a socket on
    loopback would deliver them in one read), its answers read from the socket."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "x"),
                          ("content-type", "application/grpc"), ("te", "trailers")])  # fmt: skip
    conn.send_data(1, _message(b"drip" * 100), end_stream=True)
    sent = conn.data_to_send()
    async with serving(Echo()) as (server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await eventually(lambda: len(server.connections) == 1)
        [connection] = server.connections
        for i in range(len(sent)):
            connection.data_received(sent[i : i + 1])
        frames = await _frames_until(reader, _ended(1))
        writer.close()
    assert not any(t == 0x7 for t, _, _, _ in frames)  # no GOAWAY
    data = _data(frames, 1)
    assert data == _message(b"drip" * 100)


async def test_a_frame_of_exactly_the_largest_size_and_the_largest_stream_id_are_accepted():
    """1 MiB frames (the server's SETTINGS_MAX_FRAME_SIZE) carrying a 3 MiB message on stream
    2^31 - 1: the first frame fills the stream's whole window, which is credited back while the
    message is still arriving."""
    value = bytes(range(256)) * (3 * 4096)
    top = (1 << 31) - 1
    async with serving(Echo()) as (_, port):
        with closing(RawClient(port)) as client:
            await asyncio.to_thread(client.read_until, _server_windows_known)
            assert client.conn.max_outbound_frame_size == 1 << 20
            client.open(top)
            rest = bytearray(_message(value))
            frames_sent = 0

            def send_more(events: list[Any]) -> bool:  # as the window comes back
                nonlocal frames_sent
                frames_sent += _send(client, top, rest, end_stream=True)
                return _status(events, top) is not None

            events = await asyncio.to_thread(client.read_until, send_more)
    assert _status(events, top) == "0"
    assert frames_sent == 4  # three full 1 MiB frames and the rest
    echoed = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert echoed == _message(value)


async def test_after_the_clients_goaway_new_streams_are_refused_and_open_ones_finish():
    echo = Echo(hold=True)
    goaway = _raw_frame(0x7, 0, 0, struct.pack(">II", 1, 0))
    async with serving(echo) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            PREFACE + _open(1) + _raw_frame(DATA_, END_STREAM_, 1, _message(b"open")) + goaway + _open(3)
        )
        await writer.drain()
        refused = lambda frames: any(t == 0x3 and s == 3 for t, _, s, _ in frames)  # noqa: E731
        frames = await _frames_until(reader, refused)
        [(_, _, _, code)] = [f for f in frames if f[0] == 0x3 and f[2] == 3]
        assert int.from_bytes(code, "big") == 0x7  # REFUSED_STREAM
        echo.release.set()
        frames += await _frames_until(reader, _ended(1))
        writer.close()
    assert _data(frames, 1) == _message(b"open")
    assert echo.ended == ["complete"]


async def test_a_stream_the_client_resets_gets_nothing_more_and_the_next_one_is_served():
    echo = Echo(hold=True)
    rst = _raw_frame(0x3, 0, 1, struct.pack(">I", 0x8))  # CANCEL
    async with serving(echo) as (server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + _open(1) + _raw_frame(DATA_, 0, 1, _message(b"first")))
        await writer.drain()
        await eventually(lambda: server.open_streams == 1)
        writer.write(rst + _open(3) + _raw_frame(DATA_, END_STREAM_, 3, _message(b"second")))
        await writer.drain()
        await eventually(lambda: echo.ended == ["cancelled"])
        echo.release.set()
        frames = await _frames_until(reader, _ended(3))
        writer.close()
    assert [f for f in frames if f[2] == 1] == []  # no headers, data or trailers for the reset stream
    assert _data(frames, 3) == _message(b"second")


async def test_messages_packed_into_one_frame_split_over_frames_padded_or_empty_arrive_whole():
    echo = Echo()
    values = [b"one", b"", b"three" * 1000, b"four"]
    async with serving(echo) as (_, port):
        with closing(RawClient(port)) as client:
            await asyncio.to_thread(client.read_until, _server_windows_known)
            client.open(1)
            client.conn.send_data(1, _message(values[0]) + _message(values[1]), pad_length=7)  # two in one
            third = _message(values[2])
            for part in (third[:3], third[3:2000], third[2000:]):  # a prefix cut, then the body in two
                client.conn.send_data(1, part)
            client.conn.send_data(1, _message(values[3]), end_stream=True, pad_length=0)
            client.flush()
            events = await asyncio.to_thread(client.read_until, lambda ev: _status(ev, 1) is not None)
    assert _status(events, 1) == "0"
    echoed = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert echoed == b"".join(_message(v) for v in values)


async def test_answers_respect_the_clients_stream_and_connection_windows():
    """The client's stream windows are 1 MiB but its connection window 64 KiB, then 1,000 bytes per
    stream under a 64 KiB connection: h2 raises on any frame past a window, so a server that ignored
    either window fails here."""
    for stream_window in (1 << 20, 1000):
        async with serving(Echo(repeat=4)) as (_, port):
            with closing(RawClient(port, stream_window=stream_window)) as client:
                await asyncio.to_thread(client.read_until, _server_windows_known)
                for stream_id in (1, 3):
                    client.open(stream_id)
                    client.conn.send_data(stream_id, _message(b"%d" % stream_id * 50_000), end_stream=True)
                client.flush()
                both = lambda ev: _status(ev, 1) is not None and _status(ev, 3) is not None  # noqa: E731
                events = await asyncio.to_thread(client.read_until, both)
        for stream_id in (1, 3):
            assert _status(events, stream_id) == "0"
            got = b"".join(
                e.data for e in events if isinstance(e, h2.events.DataReceived) and e.stream_id == stream_id
            )
            assert got == _message(b"%d" % stream_id * 200_000)


class AnswerOnce:
    """Answers the first message and ends the stream without waiting for the client's end."""

    async def __call__(self, requests: AsyncIterator[BytesValue], context: Any) -> AsyncIterator[BytesValue]:
        async for request in requests:
            yield request
            return


async def test_a_stream_answered_before_the_clients_end_is_reset_with_no_error():
    """Trailers, then RST_STREAM NO_ERROR, so the client need not send the rest (as grpc servers
    do); a 415 answer likewise."""
    async with serving(AnswerOnce()) as (_, port):
        with closing(RawClient(port)) as client:
            client.open(1)
            client.conn.send_data(1, _message(b"only this"))
            client.open(3, content_type="text/plain")
            client.flush()
            reset = lambda ev, s: [e for e in ev if isinstance(e, h2.events.StreamReset) and e.stream_id == s]  # noqa: E731
            events = await asyncio.to_thread(client.read_until, lambda ev: reset(ev, 1) and reset(ev, 3))
    assert _status(events, 1) == "0" and _status(events, 3) == "415"
    for stream_id in (1, 3):
        [r] = reset(events, stream_id)
        assert r.error_code == h2.errors.ErrorCodes.NO_ERROR and r.remote_reset


async def test_data_for_a_finished_stream_is_dropped_but_reopening_it_is_a_protocol_error():
    async with serving(Echo()) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + _open(1, END_HEADERS_ | END_STREAM_))
        await writer.drain()
        frames = await _frames_until(reader, _ended(1))
        writer.write(_raw_frame(DATA_, 0, 1, _message(b"late")) + _open(3, END_HEADERS_ | END_STREAM_))
        await writer.drain()
        frames += await _frames_until(reader, _ended(3))  # the late DATA cost no GOAWAY
        assert not any(t == 0x7 for t, _, _, _ in frames)
        writer.write(_open(3))  # stream 3 again
        await writer.drain()
        answer = await asyncio.wait_for(_read_to_end(reader), 5)
        writer.close()
    assert _goaway_code(answer) == PROTOCOL


async def test_a_servicer_that_does_not_read_holds_the_client_to_one_stream_window():
    """Backpressure, the per-stream bound on what the server buffers: complete messages the servicer
    has not taken are not credited back, so a client can queue at most one stream window (1 MiB)
    of them; once the servicer takes them the window comes back and the rest flows."""
    echo = Echo(hold=True)  # reads one message, then waits before answering and reading on
    value = bytes(100_000)
    count = 16
    async with serving(echo) as (server, port):
        with closing(RawClient(port)) as client:
            await asyncio.to_thread(client.read_until, _server_windows_known)
            client.open(1)
            sent = bytearray(b"".join(_message(value) for _ in range(count)))
            window = client.conn.local_flow_control_window(1)
            _send(client, 1, sent)  # until the window is used up
            [connection] = server.connections
            read_all = lambda: 1 in connection.streams and connection.streams[1].owed == window  # noqa: E731
            await eventually(read_all)
            client.sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # what the server wrote while reading it
                client.events += client.conn.receive_data(client.sock.recv(1 << 20))
            client.sock.setblocking(True)
            assert not [
                e for e in client.events if isinstance(e, h2.events.WindowUpdated) and e.stream_id == 1
            ]
            assert client.conn.local_flow_control_window(1) == 0
            stream = connection.streams[1]
            queued = sum(5 + len(m) for m in stream.messages) + len(stream.inbound)
            assert queued + len(_message(value)) >= window  # the one taken, the rest waiting
            echo.release.set()

            def send_the_rest(events: list[Any]) -> bool:  # as the window comes back
                _send(client, 1, sent, end_stream=True)
                return _status(events, 1) is not None

            events = await asyncio.to_thread(client.read_until, send_the_rest)
    assert _status(events, 1) == "0"
    echoed = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert echoed == _message(value) * count


async def test_streams_opened_and_reset_at_once_leave_nothing_behind():
    """HTTP/2 "rapid reset": 2,000 streams each opened and reset in the same write. Each is cancelled
    before its servicer runs or as it starts; none stays open, and the connection serves the next."""
    echo = Echo(hold=True)
    pairs = b"".join(_open(s) + _raw_frame(0x3, 0, s, struct.pack(">I", 0x8)) for s in range(1, 4001, 2))
    async with serving(echo) as (server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + pairs + _open(4001, END_HEADERS_ | END_STREAM_))
        await writer.drain()
        frames = await _frames_until(reader, _ended(4001))
        [connection] = server.connections
        assert list(connection.streams) == [] and server.open_streams == 0
        assert not any(t == 0x7 for t, _, _, _ in frames)  # no GOAWAY
        assert {s for _, _, s, _ in frames if s} == {4001}  # nothing sent for the reset streams
        writer.close()
