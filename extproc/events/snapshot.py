"""Router tree snapshots: a versioned msgpack codec for `KvRouter.dump_events()` plus metadata.

Durable mode (`extproc.events.durable`) stores one in the NATS object store so that a replica
can start from it instead of replaying the whole event stream. No I/O here.

Layout (msgpack map, version 1):

    {"format": "extproc.kv-snapshot", "version": 1, "stream_seq": int, "created_by": str,
     "created_at_s": float, "events": [EVENT, ...]}
    EVENT = [0, worker_id, dp_rank, parent_hash | nil, [engine_hash, local_hash, engine_hash, ...]]
          | [1, worker_id, dp_rank, [engine_hash, ...]]
          | [2, worker_id, dp_rank]

`stream_seq` is the last event-stream sequence the events reflect (0: none). Worker ids keep
their type (int or str). Engine ids may be negative: `dump_events` uses negative stand-ins for
ancestors a worker does not hold. Event ids are not kept: a snapshot is state, not a stream.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from extproc.router.types import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    StoredBlocks,
    Worker,
    columns,
)

SNAPSHOT_FORMAT = "extproc.kv-snapshot"
SNAPSHOT_VERSION = 1

_STORED, _REMOVED, _CLEARED = 0, 1, 2
_I64_MIN, _U64_MAX = -(1 << 63), (1 << 64) - 1


class SnapshotError(ValueError):
    """Bytes that are not a snapshot this version can read; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Events that rebuild a router's prefix tree, and where in the event stream they stand."""

    events: tuple[KvEvent, ...]
    stream_seq: int = 0
    created_by: str = ""
    created_at_s: float = 0.0  # wall-clock Unix time, for operators only


def encode_snapshot(snapshot: Snapshot) -> bytes:
    """The snapshot as msgpack bytes (raises TypeError for an object that is not a KV event)."""
    writer = SnapshotWriter(snapshot.stream_seq, snapshot.created_by, snapshot.created_at_s)
    writer.add(snapshot.events)
    return writer.finish()


class SnapshotWriter:
    """A snapshot encoded as its events come, slice by slice (`add`), without holding them: the
    replica that snapshots dumps its tree in slices between routing's turns. `finish` gives the
    bytes `encode_snapshot` gives for the same events; its join of the parts releases the
    interpreter, so it may run in a thread (76 MB at 2^22 entries: about 60 ms)."""

    def __init__(self, stream_seq: int, created_by: str, created_at_s: float) -> None:
        self._head = {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "stream_seq": stream_seq,
            "created_by": created_by,
            "created_at_s": created_at_s,
        }
        self._packer = msgpack.Packer(use_bin_type=True)
        self._parts: list[bytes] = []  # the events, a part per `add`
        self.events = 0

    def add(self, events: Iterable[KvEvent]) -> None:
        """Encode `events` after those added before (TypeError for an object that is not a KV event)."""
        encoded = [self._packer.pack(_encode_event(e)) for e in events]
        self.events += len(encoded)
        self._parts.append(b"".join(encoded))

    def finish(self) -> bytes:
        """The snapshot: a map whose last entry is the events array (the layout above)."""
        pack = self._packer.pack
        head = [self._packer.pack_map_header(len(self._head) + 1)]
        for key, value in self._head.items():
            head += (pack(key), pack(value))
        head += (pack("events"), self._packer.pack_array_header(self.events))
        return b"".join((*head, *self._parts))


def decode_snapshot(data: bytes) -> Snapshot:
    """Parse snapshot bytes; raises SnapshotError naming the problem for anything else."""
    try:
        top = _unpack(data)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise SnapshotError(f"not a KV snapshot: msgpack decoding failed ({exc})") from exc
    if not isinstance(top, dict) or top.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"not a KV snapshot: expected a map with format {SNAPSHOT_FORMAT!r}")
    version = top.get("version")
    if version != SNAPSHOT_VERSION:
        raise SnapshotError(
            f"KV snapshot version {version!r} is not supported (this reader: {SNAPSHOT_VERSION})"
        )
    stream_seq = top.get("stream_seq")
    if type(stream_seq) is not int or stream_seq < 0:
        raise SnapshotError(f"KV snapshot stream_seq {stream_seq!r} is not a non-negative integer")
    created_by = top.get("created_by", "")
    created_at_s = top.get("created_at_s", 0.0)
    if not isinstance(created_by, str) or not isinstance(created_at_s, int | float):
        raise SnapshotError("KV snapshot created_by/created_at_s have the wrong types")
    raw_events = top.get("events")
    if not isinstance(raw_events, list):
        raise SnapshotError("KV snapshot events is not a list")
    events = []
    for i in range(len(raw_events)):
        raw, raw_events[i] = raw_events[i], None  # freed as it is decoded, not all at the end (70 ms)
        try:
            events.append(_decode_event(raw))
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"KV snapshot event {i} is malformed: {exc}") from exc
    return Snapshot(tuple(events), stream_seq, created_by, float(created_at_s))


_READ_SIZE = 1 << 20  # bytes msgpack reads at a time while decoding a snapshot
_MAP_HEADERS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])  # fixmap, map 16, map 32
_ARRAY_HEADERS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])  # fixarray, array 16, array 32


def _unpack(data: bytes) -> Any:
    """What `msgpack.unpackb` gives for `data`, except that a top-level map's "events" array is read
    one item per call. msgpack holds the interpreter for the whole of one call, so one call for a
    snapshot held the event loop still even from a thread: 1.4 s at 2^22 entries. Between items,
    the loop gets its turns. msgpack reads the bytes as a file, `_READ_SIZE` at a time: fed whole,
    it copied them into its buffer in one call (50 ms for the 76 MB of 2^22 entries). Raises as
    unpackb does (and ValueError for what it would refuse)."""
    if not data or data[0] not in _MAP_HEADERS:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    unpacker = msgpack.Unpacker(
        io.BytesIO(data),  # shares `data`'s bytes: no copy
        read_size=min(_READ_SIZE, len(data)),
        raw=False,
        use_list=True,
        strict_map_key=True,
        max_buffer_size=len(data),
    )
    top: dict[Any, Any] = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if type(key) not in (str, bytes):  # unpackb's strict_map_key
            raise ValueError(f"{type(key).__name__} is not allowed for map key")
        at = unpacker.tell()
        if key == "events" and at < len(data) and data[at] in _ARRAY_HEADERS:
            top[key] = [unpacker.unpack() for _ in range(unpacker.read_array_header())]
        else:
            top[key] = unpacker.unpack()
    if unpacker.tell() != len(data):
        raise ValueError(f"extra data after the snapshot's map ({len(data) - unpacker.tell()} bytes)")
    return top


def _encode_event(event: KvEvent) -> list[Any]:
    if isinstance(event, BlocksStored):
        w = event.worker
        engine, local = columns(event.blocks)
        flat = [0] * (2 * len(engine))
        flat[0::2], flat[1::2] = engine, local
        return [_STORED, w.worker_id, w.dp_rank, event.parent_hash, flat]
    if isinstance(event, BlocksRemoved):
        return [_REMOVED, event.worker.worker_id, event.worker.dp_rank, list(event.engine_hashes)]
    if isinstance(event, AllBlocksCleared):
        return [_CLEARED, event.worker.worker_id, event.worker.dp_rank]
    raise TypeError(f"not a KV event: {type(event).__name__}")


def _decode_event(raw: Any) -> KvEvent:
    if not isinstance(raw, list) or len(raw) < 3:
        raise ValueError("expected a list [kind, worker_id, dp_rank, ...]")
    kind, worker_id, dp_rank = raw[0], raw[1], raw[2]
    if type(worker_id) not in (int, str):
        raise ValueError(f"worker_id {worker_id!r:.40} is neither an integer nor a string")
    if type(dp_rank) is not int or dp_rank < 0:
        raise ValueError(f"dp_rank {dp_rank!r:.40} is not a non-negative integer")
    worker = Worker(worker_id, dp_rank)
    if kind == _STORED and len(raw) == 5:
        parent = None if raw[3] is None else _hash(raw[3])
        flat = _hashes(raw[4])
        if len(flat) % 2:
            raise ValueError("stored blocks list has an odd length")
        return BlocksStored(worker, StoredBlocks(flat[0::2], flat[1::2]), parent)
    if kind == _REMOVED and len(raw) == 4:
        return BlocksRemoved(worker, tuple(_hashes(raw[3])))
    if kind == _CLEARED and len(raw) == 3:
        return AllBlocksCleared(worker)
    raise ValueError(f"unknown event kind {kind!r:.20} with {len(raw)} fields")


def _hashes(raw: Any) -> list[int]:
    """`raw` checked as a list of 64-bit hashes (signed or not), in C-level passes over it: a
    snapshot holds one per (worker, block) entry, millions at fleet scale."""
    if not isinstance(raw, list):
        raise ValueError("block hashes are not a list")
    if raw and (set(map(type, raw)) != {int} or min(raw) < _I64_MIN or max(raw) > _U64_MAX):
        for h in raw:
            _hash(h)  # names the first bad one
    return raw


def _hash(value: Any) -> int:
    if type(value) is not int or not _I64_MIN <= value <= _U64_MAX:
        raise ValueError(f"block hash {value!r:.40} is not a 64-bit integer")
    return value
