"""A vLLM-compatible KV event publisher over ZMQ, and the listener that feeds it from a simulated engine.

Owns the publishing side of the vLLM KV event stream, as `ZmqEventPublisher` in vLLM 0.33.0's
`vllm/distributed/kv_events.py` runs it (SGLang 0.5.23's is the same), so that the mock worker speaks
exactly what a real engine speaks (`tests/events/test_engine_fixtures.py` compares our bytes with
theirs):

- PUB socket: every batch goes out as `[topic, seq (8-byte big-endian), msgpack payload]`, seq
  counting from 0 for the life of the publisher (a restart starts again at 0); the payload is
  `[ts, events, dp_rank]` with tagged-map events (`encode_batch`'s "current" layout);
- a bounded replay buffer of the last `buffer_steps` (seq, payload) pairs;
- ROUTER replay socket: a client sends `[b"", start seq (8 bytes)]` (a REQ or DEALER socket), gets
  one `[b"", topic, seq, payload]` message per buffered batch with seq >= start, then
  `[b"", b"", END_SEQ, b""]` with END_SEQ the signed 8-byte -1 (older vLLM left the topic out).

Runs on the asyncio loop (zmq.asyncio); `publish` never blocks (PUB drops at its high-water mark,
as vLLM's does). `VllmEventListener` is the `KvCacheListener` seam of `extproc.sim.prefix_cache`:
it turns block changes into vLLM map-format events and hands one batch per event-loop turn (one
engine pass) to `publish`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from extproc.events.vllm import (
    END_SEQ,
    Layout,
    WireAllBlocksCleared,
    WireBlockRemoved,
    WireBlockStored,
    WireEvent,
    encode_batch,
    encode_seq,
)
from extproc.tasks import cancel_and_wait

log = logging.getLogger(__name__)

DEFAULT_PUB_PORT = 5557  # vLLM's default KV events endpoint tcp://*:5557
DEFAULT_REPLAY_PORT = 5558  # the replay endpoint vLLM's docs and Dynamo use


class ZmqEventPublisher:
    """PUB + replay buffer + ROUTER replay socket on `host`; ports 0 pick free ones.

    With `fallback_to_free_port`, a port that is taken is replaced by a free one (logged); without
    it, `start` raises `zmq.ZMQError`. `dp_rank` is stamped on every batch (vLLM does the same).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PUB_PORT,
        replay_port: int | None = DEFAULT_REPLAY_PORT,
        topic: str = "",
        dp_rank: int = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        layout: Layout = "current",
        fallback_to_free_port: bool = False,
    ) -> None:
        if buffer_steps <= 0:
            raise ValueError(f"buffer_steps must be positive, got {buffer_steps}")
        self.host = host
        self.port = port
        self.replay_port = replay_port
        self.topic = topic.encode()
        self.dp_rank = dp_rank
        self.layout: Layout = layout
        self._hwm = hwm
        self._fallback = fallback_to_free_port
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = itertools.count()
        self._withhold = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._pub_send: zmq.Socket | None = None  # a blocking shadow: PUB sends never wait
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.replay_port is None else f"tcp://{self.host}:{self.replay_port}"

    @property
    def started(self) -> bool:
        return self._pub_send is not None

    @property
    def next_seq(self) -> int:
        """The seq the next batch will get (peeking does not consume it)."""
        return self._buffer[-1][0] + 1 if self._buffer else 0

    async def start(self) -> None:
        """Bind the sockets and start serving replay requests. Raises zmq.ZMQError if a port is taken."""
        if self._ctx is not None:
            raise RuntimeError("publisher already started")
        self._ctx = zmq.asyncio.Context()
        try:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.SNDHWM, self._hwm)
            self._pub.setsockopt(zmq.LINGER, 0)
            self.port = self._bind(self._pub, self.port, "PUB")
            self._pub_send = zmq.Socket.shadow(self._pub.underlying)
            if self.replay_port is not None:
                self._router = self._ctx.socket(zmq.ROUTER)
                self._router.setsockopt(zmq.SNDHWM, 0)  # a replay may exceed any HWM; never drop it
                self._router.setsockopt(zmq.LINGER, 0)
                self.replay_port = self._bind(self._router, self.replay_port, "replay")
                self._replay_task = asyncio.create_task(self._serve_replay(), name="kv-events-replay")
        except BaseException:
            self._close()
            raise
        log.info("KV events: PUB %s replay %s", self.endpoint, self.replay_endpoint or "off")

    def _bind(self, sock: zmq.asyncio.Socket, port: int, what: str) -> int:
        try:
            sock.bind(f"tcp://{self.host}:{port or '*'}")
        except zmq.ZMQError as exc:
            if not (self._fallback and port and exc.errno == zmq.EADDRINUSE):
                raise
            sock.bind(f"tcp://{self.host}:*")
            log.warning("KV events %s port %d is taken; using a free port instead", what, port)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return int(endpoint.rsplit(":", 1)[1])

    def publish(self, events: Sequence[WireEvent], *, ts: float | None = None) -> int:
        """Encode and send one batch; returns its seq."""
        return self.publish_payload(encode_batch(events, ts=ts, dp_rank=self.dp_rank, layout=self.layout))

    def publish_payload(self, payload: bytes) -> int:
        """Send an already encoded batch; returns its seq."""
        if self._pub_send is None:
            raise RuntimeError("publisher is not started")
        seq = next(self._seq)
        self._buffer.append((seq, payload))
        if self._withhold > 0:
            self._withhold -= 1
            return seq
        self._pub_send.send_multipart((self.topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)
        return seq

    def withhold(self, count: int) -> None:
        """Keep the next `count` batches off PUB (replay buffer only): forces a gap, for tests."""
        self._withhold = count

    async def _serve_replay(self) -> None:
        assert self._router is not None
        router = self._router
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:  # vLLM accepts exactly [identity, b"", start seq]
                log.warning("invalid KV event replay request of %d frames", len(frames))
                continue
            client, _empty, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in [item for item in self._buffer if item[0] >= start_seq]:
                await router.send_multipart((client, b"", self.topic, encode_seq(seq), payload))
            await router.send_multipart((client, b"", b"", encode_seq(END_SEQ), b""))

    async def stop(self) -> None:
        """Stop serving replays and close the sockets (idempotent)."""
        if self._replay_task is not None:
            await cancel_and_wait(self._replay_task)
            self._replay_task = None
        self._close()

    def _close(self) -> None:
        for sock in (self._router, self._pub):
            if sock is not None:
                sock.close(linger=0)
        self._router = self._pub = self._pub_send = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


class VllmEventListener:
    """A `KvCacheListener` that publishes the engine's block changes as vLLM KV events.

    Engine block ids are the cache's sequence hashes; every store carries its blocks' token ids,
    medium "GPU", KV cache group 0 and vLLM 0.33's per-block `extra_keys` (the LoRA name in each
    entry, a request's `cache_salt` in the first block of a sequence: pass it to `on_stored`).
    Events are collected and sent as one batch per event-loop turn (a pass of the simulated engine
    runs synchronously within one turn), or at once when no loop is running.
    """

    def __init__(
        self, publish: Callable[[list[WireEvent]], object], block_size: int, *, lora_name: str | None = None
    ) -> None:
        self._publish = publish
        self.block_size = block_size
        self.lora_name = lora_name
        self._pending: list[WireEvent] = []
        self._scheduled = False

    def on_stored(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
    ) -> None:
        tokens = [t for block in token_ids for t in block]
        keys = extra_keys(len(block_hashes), self.lora_name, cache_salt if parent_hash is None else None)
        event = WireBlockStored(
            list(block_hashes),
            parent_hash,
            tokens,
            self.block_size,
            lora_name=self.lora_name,
            extra_keys=keys,
            group_idx=0,
        )
        self._add(event)

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        self._add(WireBlockRemoved(list(block_hashes), group_idx=0))

    def on_offloaded(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
        medium: str = "CPU",
    ) -> None:
        """A host-tier copy, as vLLM's offloading connector sends it with self-describing events (each
        chunk with its own parent and tokens, the salt in its first block's extra_keys at the root)."""
        tokens = [t for block in token_ids for t in block]
        keys = extra_keys(len(block_hashes), self.lora_name, cache_salt if parent_hash is None else None)
        self._add(
            WireBlockStored(
                list(block_hashes),
                parent_hash,
                tokens,
                self.block_size,
                medium=medium,
                lora_name=self.lora_name,
                extra_keys=keys,
                group_idx=0,
            )
        )

    def on_offload_removed(self, block_hashes: Sequence[int], *, medium: str = "CPU") -> None:
        self._add(WireBlockRemoved(list(block_hashes), medium=medium, group_idx=0))

    def on_cleared(self) -> None:
        self._add(WireAllBlocksCleared())

    def flush(self) -> None:
        """Publish what is pending as one batch."""
        self._scheduled = False
        if self._pending:
            events, self._pending = self._pending, []
            self._publish(events)

    def _add(self, event: WireEvent) -> None:
        self._pending.append(event)
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)


def extra_keys(
    blocks: int, lora_name: str | None, first_block_salt: str | None
) -> list[tuple[str, ...] | None]:
    """vLLM 0.33's untagged per-block extra keys of a text prompt (kv_cache_utils.py
    `to_event_extra_keys`): the LoRA name in every entry, then the salt in the first block's."""
    keys: list[tuple[str, ...] | None] = []
    for i in range(blocks):
        key = ((lora_name,) if lora_name else ()) + (
            (first_block_salt,) if i == 0 and first_block_salt else ()
        )
        keys.append(key or None)
    return keys
