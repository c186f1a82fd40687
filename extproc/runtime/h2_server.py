"""ext_proc's one gRPC method served over HTTP/2 on the picker's own event loop, without grpc.aio.

Why: through Envoy at 16 concurrent requests, grpc.aio cost the picker about 450 us of CPU per
ext_proc stream before any picking (its no-op servicer) and charged the picker's own work 2-3x what
it costs in process (its callbacks hop between its poller thread and the loop). This server is an
`asyncio.Protocol` that parses HTTP/2 frames itself and hands each gRPC message to the servicer's
`Process` as it completes: about 130 us per no-op stream, and the picker's work at its in-process
cost (`benchmarks/bench_grpc_floor.py --servers grpcio,h2`).

What it serves: one bidirectional-streaming method (`path`), plaintext or TLS (ALPN `h2`), gRPC
messages uncompressed (Envoy sends them so unless told otherwise; a compressed one ends the stream
with UNIMPLEMENTED). What it answers:

    frame or header block the protocol forbids ........ GOAWAY (PROTOCOL_ERROR, FRAME_SIZE_ERROR,
                                                          COMPRESSION_ERROR), connection closed
    a stream past max_concurrent_streams ............... RST_STREAM REFUSED_STREAM (not processed)
    another :path ...................................... grpc-status 12 UNIMPLEMENTED
    a content-type other than application/grpc ........ HTTP 415
    a message over max_message_bytes ................... grpc-status 8 RESOURCE_EXHAUSTED
    a compressed message ............................... grpc-status 12 UNIMPLEMENTED
    a message that does not parse ...................... grpc-status 3 INVALID_ARGUMENT
    the servicer raising ............................... grpc-status 13 INTERNAL (logged)
    the client resetting the stream or going away ...... the servicer cancelled (it frees the request)

Flow control both ways: the client's windows bound what is sent (queued per stream until a
WINDOW_UPDATE); what is received is credited back as soon as it is part of a message still arriving,
and otherwise only as the servicer takes its messages, so a stream holds at most one window of
messages the servicer has not read. `stop(grace)` works as grpc.aio's: the listener closes, each
connection is told GOAWAY, open streams get `grace` seconds, then they are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import hpack
from google.protobuf.message import DecodeError

log = logging.getLogger("extproc.h2")

Req = TypeVar("Req")
Handler = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types (RFC 9113 section 6)
# (PRIORITY, 0x2, and unknown types are ignored: section 5.5)
DATA, HEADERS, RST_STREAM, SETTINGS = 0x0, 0x1, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# error codes (section 7)
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
REFUSED_STREAM, COMPRESSION_ERROR = 0x7, 0x9
# settings
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = (1 << 31) - 1
CONNECTION_CREDIT_AT = MAX_WINDOW // 2  # received bytes credited back to the connection at once
STREAM_WINDOW = 1 << 20  # what one stream may send ahead of the servicer reading it
MAX_FRAME = 1 << 20  # the largest frame this server accepts (the client's own bound applies to ours)
MAX_HEADER_LIST = 64 << 10
DEFAULT_MAX_STREAMS = 10_000

# grpc status codes
OK, CANCELLED, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 1, 3, 8, 12, 13

_FRAME_HEAD = struct.Struct(">BHBBI")
_MESSAGE_HEAD = struct.Struct(">BI")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME_HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def _header_block(*fields: tuple[bytes, bytes]) -> bytes:
    """HPACK for `fields`, never indexed: the block neither refers to nor adds a dynamic table entry
    (a static table match is still indexed), so it can be built once and sent on any connection."""
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields], huffman=False)


_RESPONSE_HEADERS = _header_block((b":status", b"200"), (b"content-type", b"application/grpc"))
_UNSUPPORTED_MEDIA_TYPE = _header_block((b":status", b"415"))
_TRAILERS_OK = _header_block((b"grpc-status", b"0"))


def _trailers(status: int, message: str) -> bytes:
    if status == OK and not message:
        return _TRAILERS_OK
    return _header_block((b"grpc-status", str(status).encode()), (b"grpc-message", _percent_encode(message)))


def _percent_encode(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII but '%' as is, the rest percent-encoded UTF-8."""
    return b"".join(
        bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode("utf-8")
    )


class ConnectionError_(Exception):
    """A connection-level protocol error: GOAWAY with `code`, then close."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class _StreamEnd(Exception):
    """Ends one stream with a gRPC status (raised into the servicer's request iterator)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Stream:
    __slots__ = (
        "closed",
        "ended",
        "error",
        "id",
        "inbound",
        "messages",
        "owed",
        "pending",
        "send_window",
        "started",
        "task",
        "trailers",
        "waiter",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.inbound = bytearray()  # the message still arriving, with its 5-byte gRPC prefix
        self.messages: deque[bytes] = deque()  # complete messages the servicer has not taken
        self.owed = 0  # received bytes not credited back to the client yet
        self.waiter: asyncio.Future[None] | None = None
        self.ended = False  # the client half-closed
        self.error: _StreamEnd | None = None
        self.task: asyncio.Task[None] | None = None
        self.send_window = send_window
        self.started = False  # response headers sent
        self.pending = bytearray()  # DATA waiting for the client's window
        self.trailers: bytes | None = None  # to send once `pending` is out
        self.closed = False

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Requests(Generic[Req]):
    """The servicer's request iterator: the stream's messages, parsed as they are taken."""

    __slots__ = ("_connection", "_parse", "_stream")

    def __init__(self, connection: _Connection, stream: _Stream, parse: Callable[[bytes], Req]) -> None:
        self._connection = connection
        self._stream = stream
        self._parse = parse

    def __aiter__(self) -> _Requests[Req]:
        return self

    async def __anext__(self) -> Req:
        stream = self._stream
        while not stream.messages:
            if stream.error is not None:
                raise stream.error
            if stream.ended:
                raise StopAsyncIteration
            stream.waiter = asyncio.get_running_loop().create_future()
            try:
                await stream.waiter
            finally:
                stream.waiter = None
        data = stream.messages.popleft()
        if not stream.messages:
            self._connection.credit(stream)
        try:
            return self._parse(data)
        except DecodeError as exc:
            raise _StreamEnd(INVALID_ARGUMENT, f"cannot parse the request message: {exc}") from None


class _Context:
    """What the servicer is given for grpc.aio's ServicerContext (the picker's reads none of it)."""

    __slots__ = ("_peer",)

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


class _Connection(asyncio.Protocol):
    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface_seen = False
        self.streams: dict[int, _Stream] = {}
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.send_window = 65535  # the client's connection window for what we send
        self.initial_window = 65535  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self.max_frame = 16384  # the client's SETTINGS_MAX_FRAME_SIZE
        self.header_block: tuple[int, int, bytearray] | None = None  # (stream, flags, block) in CONTINUATION
        self.owed = 0  # connection-level bytes not credited back yet
        self.last_stream = 0
        self.going_away = False
        self.peer = ""

    # --- the wire ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):  # grpc's form: ipv4:host:port, ipv6:[host]:port
            self.peer = f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"ipv4:{peer[0]}:{peer[1]}"
        else:
            self.peer = str(peer)
        settings = b"".join(
            struct.pack(">HI", key, value)
            for key, value in (
                (SETTINGS_MAX_CONCURRENT_STREAMS, self.server.max_concurrent_streams),
                (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME),
                (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            )
        )
        increase = struct.pack(">I", MAX_WINDOW - 65535)
        transport.write(_frame(SETTINGS, 0, 0, settings) + _frame(WINDOW_UPDATE, 0, 0, increase))
        self.server.connections.add(self)
        if self.server.stopping:
            self.go_away(NO_ERROR)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for stream in self.streams.values():
            stream.closed = True
            if stream.task is not None:
                stream.task.cancel()
        self.streams.clear()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        try:
            self._read_frames()
        except ConnectionError_ as exc:
            log.warning("HTTP/2 connection from %s closed: %s", self.peer, exc)
            self.go_away(exc.code, str(exc))
            assert self.transport is not None
            self.transport.close()

    def _read_frames(self) -> None:
        buffer = self.buffer
        pos = 0
        if not self.preface_seen:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if bytes(buffer[: len(PREFACE)]) != PREFACE:
                raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self.preface_seen = True
            pos = len(PREFACE)
        end = len(buffer)
        try:
            while end - pos >= 9:
                length = (buffer[pos] << 16) | (buffer[pos + 1] << 8) | buffer[pos + 2]
                if length > MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR, f"a {length}-byte frame (at most {MAX_FRAME})")
                if end - pos - 9 < length:
                    break
                kind, flags = buffer[pos + 3], buffer[pos + 4]
                stream_id = int.from_bytes(buffer[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                payload = bytes(buffer[pos + 9 : pos + 9 + length])
                pos += 9 + length
                if self.header_block is not None and kind != CONTINUATION:
                    raise ConnectionError_(PROTOCOL_ERROR, "a header block interrupted by another frame")
                self._frame_received(kind, flags, stream_id, payload)
        finally:
            del buffer[:pos]

    def _frame_received(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            if stream_id == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
            payload = _unpad(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self.header_block = (stream_id, flags, bytearray(payload))
            if flags & END_HEADERS:
                self._header_block_done()
        elif kind == CONTINUATION:
            if self.header_block is None or self.header_block[0] != stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self.header_block[2].extend(payload)
            if len(self.header_block[2]) > MAX_HEADER_LIST:
                raise ConnectionError_(PROTOCOL_ERROR, "a header block over 64 KiB")
            if flags & END_HEADERS:
                self._header_block_done()
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8 or stream_id != 0:
                raise ConnectionError_(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "bad PING")
            if not flags & ACK:
                self._write(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                stream.closed = True
                if stream.task is not None:
                    stream.task.cancel()
        elif kind == GOAWAY:
            self.going_away = True  # the client opens no new stream; open ones finish
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored (section 5.5)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.owed += len(payload)  # padding included: it counts against the windows too
        if self.owed >= CONNECTION_CREDIT_AT:
            self._write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.owed)))
            self.owed = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id == 0 or stream_id > self.last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, f"DATA on stream {stream_id}, never opened")
            return  # a stream already closed or reset: dropped
        data = _unpad(flags, payload)
        stream.owed += len(payload)  # padding included
        if stream.ended:
            raise ConnectionError_(PROTOCOL_ERROR, f"DATA on stream {stream_id} after its end")
        if stream.error is None:
            self._collect(stream, data)
        if flags & END_STREAM:
            stream.ended = True
            if stream.inbound and stream.error is None:
                stream.error = _StreamEnd(INTERNAL, "the stream ended inside a message")
        if not stream.messages:
            self.credit(stream)
        stream.wake()

    def _collect(self, stream: _Stream, data: bytes) -> None:
        """Cut complete gRPC messages out of the stream's bytes."""
        inbound = stream.inbound
        inbound += data
        limit = self.server.max_message_bytes
        while len(inbound) >= 5:
            compressed, length = _MESSAGE_HEAD.unpack_from(inbound)
            if compressed:
                stream.error = _StreamEnd(UNIMPLEMENTED, "compressed messages are not supported")
            elif length > limit:
                stream.error = _StreamEnd(
                    RESOURCE_EXHAUSTED, f"a message of {length} bytes (at most {limit})"
                )
            if stream.error is not None:
                inbound.clear()
                stream.messages.clear()
                return
            if len(inbound) < 5 + length:
                break
            stream.messages.append(bytes(inbound[5 : 5 + length]))
            del inbound[: 5 + length]

    def credit(self, stream: _Stream) -> None:
        """Give the client back the stream's window once that is half the window or more (small
        streams never need it). Called only when no complete message waits for the servicer: every
        byte received was then taken by it or belongs to the message still arriving, so all may go
        back, and a servicer that does not read holds the client to one window."""
        give = stream.owed
        if give >= STREAM_WINDOW // 2 and not stream.closed and not stream.ended:
            stream.owed = 0
            self._write(_frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">I", give)))

    def _header_block_done(self) -> None:
        assert self.header_block is not None
        stream_id, flags, block = self.header_block
        self.header_block = None
        try:
            headers = self.decoder.decode(bytes(block), raw=True)
        except hpack.HPACKError as exc:
            raise ConnectionError_(COMPRESSION_ERROR, f"bad header block ({exc})") from None
        known = self.streams.get(stream_id)
        if known is not None:  # trailers: the client's half of the stream ends
            if not flags & END_STREAM:
                raise ConnectionError_(PROTOCOL_ERROR, f"a second header block on stream {stream_id}")
            known.ended = True
            known.wake()
            return
        if stream_id % 2 == 0 or stream_id <= self.last_stream:
            raise ConnectionError_(PROTOCOL_ERROR, f"stream {stream_id} opened out of order")
        self.last_stream = stream_id
        if self.going_away or self.server.stopping:
            self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", REFUSED_STREAM)))
            return
        if len(self.streams) >= self.server.max_concurrent_streams:  # a client that ignored SETTINGS
            self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", REFUSED_STREAM)))
            return
        stream = _Stream(stream_id, self.initial_window)
        stream.ended = bool(flags & END_STREAM)
        fields = dict(headers)
        content_type = fields.get(b"content-type", b"")
        if not content_type.startswith(b"application/grpc"):
            self._write(_frame(HEADERS, END_HEADERS | END_STREAM, stream_id, _UNSUPPORTED_MEDIA_TYPE))
            if not stream.ended:
                self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", NO_ERROR)))
            return
        self.streams[stream_id] = stream
        path = fields.get(b":path", b"")
        if path != self.server.path:
            stream.error = _StreamEnd(UNIMPLEMENTED, f"unknown method {path.decode(errors='replace')}")
        stream.task = asyncio.get_running_loop().create_task(self._serve(stream))

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "a SETTINGS frame not made of 6-byte settings")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "an initial window over 2^31 - 1")
                delta, self.initial_window = value - self.initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16384 <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, f"a max frame size of {value}")
                self.max_frame = value
        self._write(_frame(SETTINGS, ACK, 0))
        for stream in list(self.streams.values()):
            self._flush(stream)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "the connection window over 2^31 - 1")
            for open_stream in list(self.streams.values()):
                self._flush(open_stream)
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            self._flush(stream)

    def go_away(self, code: int, why: str = "") -> None:
        self.going_away = True
        self._write(_frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream, code) + why.encode()[:200]))

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # --- one stream --------------------------------------------------------------------------

    async def _serve(self, stream: _Stream) -> None:
        server = self.server
        status, message = OK, ""
        try:
            if stream.error is not None:  # refused before the servicer sees it (an unknown method)
                raise stream.error
            requests: _Requests[Any] = _Requests(self, stream, server.parse)
            async for response in server.handler(requests, _Context(self.peer)):
                if stream.closed:
                    break
                self._send(stream, response.SerializeToString())
        except _StreamEnd as end:
            status, message = end.status, end.message
        except asyncio.CancelledError:
            if stream.closed:  # reset by the client, or its connection went away
                return
            status, message = CANCELLED, "the server stopped"
        except Exception:
            log.exception("ext_proc stream %d failed", stream.id)
            status, message = INTERNAL, "internal error"
        if stream.closed:
            return
        trailers = _frame(HEADERS, END_HEADERS | END_STREAM, stream.id, _trailers(status, message))
        head = b"" if stream.started else _frame(HEADERS, END_HEADERS, stream.id, _RESPONSE_HEADERS)
        stream.started = True
        stream.trailers = head + trailers
        self._flush(stream)

    def _send(self, stream: _Stream, message: bytes) -> None:
        head = b""
        if not stream.started:
            stream.started = True
            head = _frame(HEADERS, END_HEADERS, stream.id, _RESPONSE_HEADERS)
        data = _MESSAGE_HEAD.pack(0, len(message)) + message
        size = len(data)
        if stream.pending or size > stream.send_window or size > self.send_window or size > self.max_frame:
            if head:
                self._write(head)
            stream.pending += data
            self._flush(stream)
            return
        stream.send_window -= size
        self.send_window -= size
        self._write(head + _frame(DATA, 0, stream.id, data))

    def _flush(self, stream: _Stream) -> None:
        """Send what the client's windows allow; the trailers once nothing is left."""
        pending = stream.pending
        while pending:
            n = min(len(pending), stream.send_window, self.send_window, self.max_frame)
            if n <= 0:
                return
            chunk = bytes(pending[:n])
            del pending[:n]
            stream.send_window -= n
            self.send_window -= n
            self._write(_frame(DATA, 0, stream.id, chunk))
        if stream.trailers is not None:
            self._write(stream.trailers)
            stream.trailers = None
            stream.closed = True
            self.streams.pop(stream.id, None)
            if not stream.ended:  # answered before the client's end: it need not send the rest
                self._write(_frame(RST_STREAM, 0, stream.id, struct.pack(">I", NO_ERROR)))
            if self.going_away and not self.streams and self.transport is not None:
                self.transport.close()


def _unpad(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


class H2GrpcServer:
    """Serves `handler` (a grpc.aio-style bidirectional-streaming method) at `path`."""

    def __init__(
        self,
        path: str,
        handler: Handler,
        parse: Callable[[bytes], Any],
        *,
        max_message_bytes: int = 64 << 20,
        max_concurrent_streams: int | None = None,
    ) -> None:
        self.path = path.encode()
        self.handler = handler
        self.parse = parse
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_streams = max_concurrent_streams or DEFAULT_MAX_STREAMS
        self.connections: set[_Connection] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None

    @property
    def open_streams(self) -> int:
        """Streams whose servicer is still running, over every connection."""
        return len(self._running())

    def _running(self) -> list[asyncio.Task[None]]:
        return [
            stream.task
            for connection in self.connections
            for stream in connection.streams.values()
            if stream.task is not None and not stream.task.done()
        ]

    async def start(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on (host, port); returns the bound port (port 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, ssl=ssl_context)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """Close the listener, tell every connection GOAWAY, give open streams `grace` seconds
        (None: none), then cancel them and close the connections."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away(NO_ERROR)
        running = self._running()  # no stream starts from now on
        if running and grace:
            await asyncio.wait(running, timeout=grace)
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
