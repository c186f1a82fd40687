"""A small HTTP/2 cleartext (h2c, prior knowledge) client on the `h2` protocol library, for what the
usual clients cannot send: request trailers. One request per connection; loopback tests only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events

Headers = Sequence[tuple[str, str]]


@dataclass
class H2Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    reset: bool = False  # the server reset the stream instead of ending it


async def h2_request(
    host: str,
    port: int,
    path: str,
    *,
    method: str = "POST",
    headers: Headers = (),
    body: bytes = b"",
    trailers: Headers = (),
    timeout_s: float = 20.0,
) -> H2Response:
    """Send one request over a new h2c connection (body, then trailers when given) and read the answer."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            return await _exchange(reader, writer, f"{host}:{port}", path, method, headers, body, trailers)
        finally:
            writer.close()
            await writer.wait_closed()


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    authority: str,
    path: str,
    method: str,
    headers: Headers,
    body: bytes,
    trailers: Headers,
) -> H2Response:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    stream_id = conn.get_next_available_stream_id()
    request = [(":method", method), (":scheme", "http"), (":authority", authority), (":path", path)]
    conn.send_headers(stream_id, [*request, *headers], end_stream=not body and not trailers)
    writer.write(conn.data_to_send())
    status = 0
    response_headers: dict[str, str] = {}
    received = bytearray()
    response_trailers: dict[str, str] = {}
    pending = memoryview(body)
    sent_end = not body and not trailers

    def send_what_fits() -> None:
        nonlocal pending, sent_end
        while pending and not sent_end:
            window = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
            if window <= 0:
                return
            chunk, pending = pending[:window], pending[window:]
            conn.send_data(stream_id, bytes(chunk), end_stream=not pending and not trailers)
        if not pending and not sent_end:
            if trailers:
                conn.send_headers(stream_id, list(trailers), end_stream=True)
            sent_end = True

    send_what_fits()
    writer.write(conn.data_to_send())
    await writer.drain()
    while True:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("the server closed the connection before the answer ended")
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                response_headers = {k: v for k, v in event.headers}  # type: ignore[misc]
                status = int(response_headers.pop(":status"))
            elif isinstance(event, h2.events.TrailersReceived) and event.stream_id == stream_id:
                response_trailers = {k: v for k, v in event.headers}  # type: ignore[misc]
            elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                received += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
                writer.write(conn.data_to_send())
                return H2Response(status, response_headers, bytes(received), response_trailers)
            elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream_id:
                return H2Response(status, response_headers, bytes(received), response_trailers, reset=True)
            elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                send_what_fits()
        writer.write(conn.data_to_send())
        await writer.drain()
