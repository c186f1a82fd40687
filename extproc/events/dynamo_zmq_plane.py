"""Dynamo's KV event plane over ZMQ (a Dynamo worker with `--event-plane zmq`), heard by the picker.

What is spoken, as ai-dynamo-runtime 1.6.1's and 1.3.1's own `KvEventPublisher` send it (their bytes
are in tests/nats/fixtures/dynamo-zmq-<release>/; tests/nats/test_dynamo_zmq_plane.py decodes them
and runs 1.6.1's publishers):

Each message is four ZMQ frames: the topic, the publisher id (u64, big-endian), the sequence (u64,
big-endian) and a frame of one version byte (1), a u32 big-endian length and the envelope: the same
msgpack envelope as on Dynamo's NATS event plane (`extproc.events.dynamo_plane`). Two modes:

- Direct (Dynamo's default): each publisher (one per worker and dp rank) binds its own PUB socket
  and advertises it in Dynamo's discovery. In the file store (`--discovery-backend file`, DYN_FILE_KV)
  that is `<root>/v1/event_channels/<key>`, JSON

      {"type": "EventChannel", "scope": {"kind": "endpoint", "endpoint": {namespace, component, name}},
       "topic": "kv-events", "instance_id": <publisher id>,
       "transport": {"kind": "Zmq", "config": {"endpoint": "tcp://<DYN_EVENT_PLANE_HOST or host IP>:<port>"}}}

  removed when the publisher shuts down (Dynamo 1.0-1.3, whose publishers are on this plane only
  with a local indexer: `{"type": "EventChannel", "namespace", "component", "topic", "instance_id",
  "transport"}`, the component's, and the host's IP without DYN_EVENT_PLANE_HOST). The topic frame
  is `kv-events`. The envelope of 1.0-1.3 carries one RouterEvent, not an array (`dynamo_plane`
  reads both). The picker lists the store every `rescan_s` and connects its SUB socket to every
  matching publisher (and disconnects those gone). Dynamo's etcd and Kubernetes discovery are not
  read here (startup says so).
- Broker (`DYN_ZMQ_BROKER_URL="xsub=tcp://a:5555;tcp://b:5555 , xpub=tcp://a:5556;tcp://b:5556"`):
  publishers connect to the brokers' XSUB sockets and nothing is advertised; subscribers connect to
  every XPUB. The topic frame is then the whole subject,
  `namespace.<ns>.component.<c>.endpoint.<e>.kv-events` (`dynamo_plane.event_plane_subject`); from
  Dynamo 1.0-1.3 publishers it is `kv-events` there too, which names no namespace or component: all
  of a broker's KV events are then taken, as Dynamo 1.3's own router takes them (the picker applies
  only those of its workers' instance ids).
  With several brokers every message arrives once per broker: the last `DEDUP_KEYS` (publisher id,
  sequence) pairs are remembered and repeats dropped (`zmq_plane.duplicate`), as Dynamo does (only
  then: Dynamo 1.0's publishers of one runtime share a publisher id, so the pair names a message
  only within one publisher's socket).

The decoded events go through `DynamoEventIntake` (event-id gaps, restarts, the local-indexer
recovery's gate), as those of the NATS event plane. The SUB socket buffers at most `queue_size`
messages (`--event-queue-size`); ZMQ drops what comes beyond, and the event-id gap shows the loss.
Bad input is counted and dropped, never raised: `zmq_plane.malformed` (frames), `zmq_plane.topic`
(a topic that is not ours), plus the envelope decoder's `dynamo.*` keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from extproc.events.counters import EventCounters
from extproc.events.dynamo_intake import DynamoEventIntake
from extproc.events.sink import EventSink
from extproc.router.types import WorkerId
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.events.dynamo")

TOPIC = "kv-events"  # a direct publisher's topic frame (and the last token of a broker's subject)
FRAME_VERSION = 1
FRAME_HEADER = struct.Struct(">BI")  # version, envelope length
DEDUP_KEYS = 65_536  # (publisher id, sequence) pairs remembered against a second broker's copy
RESCAN_S = 1.0  # the file store is listed again this often for publishers that came or went
MAX_CHANNELS = 4096  # publishers connected at once, at most (each is one TCP connection)
QUEUE_SIZE = 10_000  # messages the SUB socket holds for the picker by default (--event-queue-size)
TCP_ENDPOINT = re.compile(r"tcp://[^\s/]+:\d{1,5}")  # what a publisher or broker may be


@dataclass(frozen=True, slots=True)
class Channel:
    """One publisher's PUB socket, as advertised in Dynamo's discovery."""

    publisher_id: int
    endpoint: str  # tcp://host:port


def read_file_channels(root: str, namespace: str, component: str, endpoint: str) -> list[Channel]:
    """The ZMQ publishers of KV events advertised in Dynamo's file store under `root` for this
    namespace, component and endpoint (`*`: any), by publisher id; unreadable or foreign entries
    are skipped. Blocking (run it in a thread)."""
    folder = Path(root) / "v1" / "event_channels"
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    channels: dict[int, Channel] = {}
    for name in names:
        try:
            document = json.loads((folder / name).read_bytes())
        except (OSError, ValueError):
            continue  # being written, or gone since the listing
        channel = _channel(document, namespace, component, endpoint)
        if channel is not None:
            channels[channel.publisher_id] = channel
    return [channels[pid] for pid in sorted(channels)]


def _channel(document: Any, namespace: str, component: str, endpoint: str) -> Channel | None:
    if not isinstance(document, dict) or document.get("type") != "EventChannel":
        return None
    if document.get("topic") != TOPIC:
        return None
    scope = document.get("scope", document)  # Dynamo 1.0-1.3: namespace and component at the top
    where = scope.get(scope.get("kind"), scope) if isinstance(scope, dict) else None
    if not isinstance(where, dict) or where.get("namespace") != namespace:
        return None
    if where.get("component") != component or endpoint not in ("*", where.get("name", endpoint)):
        return None
    transport = document.get("transport")
    if not isinstance(transport, dict) or transport.get("kind") != "Zmq":
        return None
    config = transport.get("config")
    url = config.get("endpoint") if isinstance(config, dict) else None
    publisher_id = document.get("instance_id")
    if not isinstance(url, str) or not TCP_ENDPOINT.fullmatch(url) or not isinstance(publisher_id, int):
        return None
    return Channel(publisher_id, url)


def unframe(frames: Sequence[bytes]) -> tuple[bytes, int, int, bytes]:
    """(topic, publisher id, sequence, envelope) of one message's frames; ValueError if malformed."""
    if len(frames) != 4:
        raise ValueError(f"{len(frames)} frames, expected 4")
    topic, publisher, sequence, frame = frames
    if len(publisher) != 8 or len(sequence) != 8:
        raise ValueError("publisher id and sequence must be 8 bytes each")
    if len(frame) < FRAME_HEADER.size:
        raise ValueError(f"a frame of {len(frame)} bytes has no header")
    version, length = FRAME_HEADER.unpack_from(frame)
    if version != FRAME_VERSION:
        raise ValueError(f"frame version {version}, expected {FRAME_VERSION}")
    if length != len(frame) - FRAME_HEADER.size:
        raise ValueError(f"frame says {length} bytes, carries {len(frame) - FRAME_HEADER.size}")
    return (
        topic,
        int.from_bytes(publisher, "big"),
        int.from_bytes(sequence, "big"),
        frame[FRAME_HEADER.size :],
    )


def _subject_matcher(subject: str) -> Callable[[str], bool]:
    """Whether a broker's topic is `subject`, whose `*` tokens stand for any one token."""
    pattern = re.compile(
        r"\.".join("[^.]+" if token == "*" else re.escape(token) for token in subject.split("."))
    )
    return lambda topic: pattern.fullmatch(topic) is not None


class DynamoZmqPlaneSubscriber(DynamoEventIntake):
    """Hears Dynamo's ZMQ event plane: the publishers `channels()` lists (direct mode, listed again
    every `rescan_s`) and the brokers' XPUB endpoints `brokers`, on one SUB socket.

    `subject` is the event plane subject of the picker's namespace, component and endpoint (a `*`
    token allowed): what a broker's topic must be. Counter keys: `zmq_plane.event`, `zmq_plane.gap`,
    `zmq_plane.new_publisher`, `zmq_plane.malformed`, `zmq_plane.topic`, `zmq_plane.duplicate`, and
    loudly `zmq_plane.channels_capped`, `zmq_plane.connect_failed`.
    """

    source = "zmq_plane"

    def __init__(
        self,
        sink: EventSink,
        counters: EventCounters,
        subject: str,
        *,
        channels: Callable[[], list[Channel]] | None = None,
        brokers: Sequence[str] = (),
        worker_id_of: Callable[[int], WorkerId] = str,
        queue_size: int = QUEUE_SIZE,
        rescan_s: float = RESCAN_S,
    ) -> None:
        if channels is None and not brokers:
            raise ValueError("DynamoZmqPlaneSubscriber needs a channel listing, brokers or both")
        super().__init__(sink, counters, worker_id_of=worker_id_of)
        self.subject = subject
        self.channels = channels
        self.brokers = tuple(brokers)
        self.queue_size = queue_size
        self.rescan_s = rescan_s
        self._is_ours = _subject_matcher(subject)
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._connected: dict[str, int] = {}  # direct publishers: endpoint -> publisher id
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def publishers(self) -> dict[str, int]:
        """The direct publishers connected now: endpoint -> publisher id."""
        return dict(self._connected)

    async def start(self) -> None:
        """Subscribe and connect; direct publishers advertised now are connected when this returns."""
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.queue_size)
        sock.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())  # direct publishers, and brokers of Dynamo 1.0-1.3
        if self.brokers:
            sock.setsockopt(zmq.SUBSCRIBE, self.subject.split("*", 1)[0].encode())
            for url in self.brokers:
                sock.connect(url)
            log.info("Dynamo ZMQ event plane: connected to the brokers %s", ", ".join(self.brokers))
        self._sock = sock
        if self.channels is not None:
            await self.rescan()
            self._tasks.append(asyncio.create_task(self._rescan_forever()))
        self._tasks.append(asyncio.create_task(self._read()))

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks.clear()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._connected.clear()

    async def rescan(self) -> None:
        """Connect to the publishers advertised now and disconnect those no longer advertised."""
        if self.channels is None or self._sock is None:
            return
        listed = await asyncio.to_thread(self.channels)
        sock = self._sock
        if sock is None:  # stopped meanwhile
            return
        wanted = {c.endpoint: c.publisher_id for c in listed}
        if len(wanted) > MAX_CHANNELS:
            self.counters.loud(
                "zmq_plane.channels_capped",
                "Dynamo's discovery lists %d ZMQ publishers; connecting to the first %d only",
                len(wanted),
                MAX_CHANNELS,
            )
            wanted = dict(list(wanted.items())[:MAX_CHANNELS])
        for url in [u for u in self._connected if u not in wanted]:
            with contextlib.suppress(zmq.ZMQError):
                sock.disconnect(url)
            log.info("Dynamo ZMQ event plane: publisher %x at %s is gone from discovery; disconnected",
                     self._connected.pop(url), url)  # fmt: skip
        for url, publisher_id in wanted.items():
            if url in self._connected:
                continue
            try:
                sock.connect(url)
            except zmq.ZMQError as exc:
                self.counters.loud("zmq_plane.connect_failed", "cannot connect to %s: %s", url, exc)
                continue
            self._connected[url] = publisher_id
            log.info("Dynamo ZMQ event plane: connected to publisher %x at %s", publisher_id, url)

    async def _rescan_forever(self) -> None:
        while True:
            await asyncio.sleep(self.rescan_s)
            try:
                await self.rescan()
            except Exception:  # the next listing may do better; the connected publishers stay
                log.exception("listing Dynamo's ZMQ publishers failed")

    async def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            frames = await sock.recv_multipart()
            self.handle_frames(frames)

    def handle_frames(self, frames: Sequence[bytes]) -> None:
        """Check, deduplicate and apply one message's frames; never raises."""
        try:
            topic, publisher_id, sequence, envelope = unframe(frames)
        except ValueError as exc:
            self.counters.loud(
                "zmq_plane.malformed", "malformed message on Dynamo's ZMQ event plane (%s)", exc
            )
            return
        where = topic.decode(errors="replace")
        if where != TOPIC and not self._is_ours(where):
            self.counters.add("zmq_plane.topic")  # a broker's other namespace or endpoint
            return
        if len(self.brokers) > 1:  # each broker delivers every message
            key = (publisher_id, sequence)
            if key in self._seen:
                self.counters.add("zmq_plane.duplicate")
                return
            self._seen[key] = None
            if len(self._seen) > DEDUP_KEYS:
                self._seen.popitem(last=False)
        self.handle_event_plane(envelope, f"Dynamo's ZMQ event plane (publisher {publisher_id:x})")
