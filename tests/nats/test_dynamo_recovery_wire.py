"""The local-indexer query's failure paths on the wire (extproc.events.dynamo_recovery.query_local_indexer).

Dynamo's own worker answers the success paths in tests/nats/test_dynamo_recovery.py; the ways a query
fails are hard to make it produce, so a worker is played here on 127.0.0.1 with Dynamo 1.6.1's
framing (the request-plane frame, two-part frames, the response stream it dials back), answering as
`lib/runtime/src/pipeline/network` does: a refusal on the request connection, a failed prologue, a
stream that ends early, and a JSON payload codec.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import pytest
import pytest_asyncio

from extproc.events.dynamo_recovery import EVENTS, QueryTarget, RecoveryError, query_local_indexer

Reply = Callable[[dict[str, Any], Any, asyncio.StreamWriter], Awaitable[None]]


def two_part(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">QQQ", len(header), len(body), 0) + header + body


class PlayedWorker:
    """Reads one request-plane frame per connection and answers with `reply`; records the requests."""

    def __init__(self) -> None:
        self.reply: Reply | None = None
        self.requests: list[tuple[str, dict[str, str], dict[str, Any], Any]] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (n,) = struct.unpack(">H", await reader.readexactly(2))
        path = (await reader.readexactly(n)).decode()
        (n,) = struct.unpack(">H", await reader.readexactly(2))
        headers = json.loads(await reader.readexactly(n))
        (n,) = struct.unpack(">I", await reader.readexactly(4))
        payload = await reader.readexactly(n)
        header_len, body_len, _ = struct.unpack(">QQQ", payload[:24])
        control = json.loads(payload[24 : 24 + header_len])
        body = payload[24 + header_len : 24 + header_len + body_len]
        request = json.loads(body) if control["payload_codec"] == "json" else msgpack.unpackb(body)
        self.requests.append((path, headers, control, request))
        assert self.reply is not None
        await self.reply(control, request, writer)
        await writer.drain()
        writer.close()

    def target(self, codec: str = "msgpack") -> QueryTarget:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return QueryTarget(
            8, 1, 0x2ABC, "127.0.0.1", port, "e607/ns1/backend/worker_kv_query_source_2abc", codec
        )


@pytest_asyncio.fixture
async def played() -> AsyncIterator[PlayedWorker]:
    worker = PlayedWorker()
    worker.server = await asyncio.start_server(worker.handle, "127.0.0.1", 0)
    try:
        yield worker
    finally:
        worker.server.close()
        await worker.server.wait_closed()


async def dial_back(control: dict[str, Any], *frames: bytes) -> None:
    """Open the response stream the request names and send its handshake, then `frames`."""
    info = json.loads(control["connection_info"]["info"])
    host, port = info["address"].rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    handshake = json.dumps({"subject": info["subject"], "stream_type": "response"}).encode()
    writer.write(two_part(handshake) + b"".join(frames))
    await writer.drain()
    writer.close()


ACK = struct.pack(">I", 0)


async def test_the_request_is_dynamos_frame_and_a_json_codec_is_followed(played):
    async def reply(control: dict[str, Any], request: Any, writer: asyncio.StreamWriter) -> None:
        writer.write(ACK)
        answer = {"Events": {"events": [], "last_event_id": 9}}
        data = json.dumps({"data": answer, "complete_final": False}).encode()
        done = json.dumps({"complete_final": True}).encode()
        await dial_back(control, two_part(b'{"error":null}'), two_part(b"", data), two_part(b"", done))

    played.reply = reply
    answer = await query_local_indexer(played.target("json"), 7, timeout_s=10)
    assert (answer.kind, answer.events, answer.last_event_id) == (EVENTS, [], 9)
    ((path, headers, control, request),) = played.requests
    assert path == "e607/ns1/backend/worker_kv_query_source_2abc"
    assert request == {"worker_id": 8, "dp_rank": 1, "start_event_id": 7, "end_event_id": None}
    assert (control["request_type"], control["response_type"], control["payload_codec"]) == (
        "single_in",
        "many_out",
        "json",
    )
    info = json.loads(control["connection_info"]["info"])
    assert control["connection_info"]["transport"] == "tcp_server" and info["stream_type"] == "response"
    assert info["context"] == control["id"] == headers["request-id"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("refused", "refused the query: Server unavailable: at capacity"),
        ("prologue", "failed the query: no such worker"),
        ("closed", "expected one answer after the prologue, got 0"),
        ("unknown", "unexpected answer"),
    ],
)
async def test_a_query_that_is_not_answered_raises(played, case, message):
    async def reply(control: dict[str, Any], request: Any, writer: asyncio.StreamWriter) -> None:
        if case == "refused":
            text = b"Server unavailable: at capacity"
            writer.write(struct.pack(">I", len(text)) + text)
            return
        writer.write(ACK)
        if case == "prologue":
            await dial_back(control, two_part(b'{"error":"no such worker"}'))
        elif case == "closed":
            await dial_back(control, two_part(b'{"error":null}'))
        else:
            data = msgpack.packb({"data": ["not", "an", "answer"], "complete_final": True})
            await dial_back(control, two_part(b'{"error":null}'), two_part(b"", data))

    played.reply = reply
    with pytest.raises(RecoveryError, match=message):
        await query_local_indexer(played.target(), None, timeout_s=10)


async def test_a_worker_that_never_answers_times_out(played):
    async def reply(control: dict[str, Any], request: Any, writer: asyncio.StreamWriter) -> None:
        writer.write(ACK)  # and no response stream

    played.reply = reply
    with pytest.raises(TimeoutError):
        await query_local_indexer(played.target(), None, timeout_s=0.3)
