"""vLLM / SGLang KV events: the ZMQ frames and msgpack batches, decoded into the router's event model.

Owns the wire format only (no sockets): `parse_frames` splits a multipart message, `VllmEventDecoder`
turns a msgpack batch into `BlocksStored` / `BlocksRemoved` / `AllBlocksCleared`, and `encode_batch`
writes batches the way vLLM's msgspec encoder does (for the publisher and the tests). Mirrors
`vllm/distributed/kv_events.py` (`KVEventBatch`, `BlockStored`, `BlockRemoved`, `AllBlocksCleared`)
and SGLang's copy of it (`sglang/srt/disaggregation/kv_events.py`); REFERENCE section 4.

Every shape seen in the field is accepted:

- batch: an array `[ts, events]` / `[ts, events, data_parallel_rank]` (older vLLM, SGLang) or a map
  `{"ts", "events", "data_parallel_rank"}` (2026 vLLM);
- event: a tagged array `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name, ...]` or a tagged map `{"type": "BlockStored", ...}`; trailing or
  optional fields may be missing, unknown keys are ignored;
- block hash: an unsigned 64-bit int, a signed one (SGLang) or a bytes digest (vLLM without
  `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`). All become the same non-negative 64-bit int: signed ints
  are taken modulo 2**64 and digests as vLLM itself converts them (big-endian, low 64 bits), so an
  engine's ids agree whichever way it was configured.

The router re-hashes `token_ids` into local hashes (engines' own hashes cannot be reproduced); the
engine ids only link parents and name removals. The decoder never raises on bad input: it counts
(`counters.loud` for what an operator must look at) and drops only what it cannot use.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeAlias

import msgpack

from extproc.events.counters import EventCounters
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored, KvEvent, StoredBlock, Worker

MASK64 = (1 << 64) - 1
MEDIUM_GPU = "GPU"  # vllm kv_events.py MEDIUM_GPU; other media (e.g. "CPU" offload) are not routable
END_SEQ = -1  # the replay socket's end-of-replay marker, as a signed 8-byte big-endian seq

# Field order of the tagged-array (msgspec array_like) encoding, after the tag.
STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")

WireHash: TypeAlias = int | bytes


# --- frames ------------------------------------------------------------------------------------


class Frame(NamedTuple):
    """One PUB message: `[topic, seq (8-byte big-endian), payload]`."""

    topic: bytes
    seq: int
    payload: bytes


def parse_frames(frames: Sequence[bytes], counters: EventCounters) -> Frame | None:
    """Split a multipart PUB message; None (counted loudly as `vllm.malformed_frames`) if it is not one."""
    if len(frames) != 3 or len(frames[1]) != 8:
        counters.loud(
            "vllm.malformed_frames",
            "KV event message with %d frames (seq frame of %s bytes); expected [topic, 8-byte seq, payload]",
            len(frames),
            len(frames[1]) if len(frames) > 1 else "no",
        )
        return None
    topic, seq, payload = frames
    return Frame(bytes(topic), int.from_bytes(seq, "big"), bytes(payload))


def encode_seq(seq: int) -> bytes:
    """A seq as the 8-byte big-endian frame (signed, so END_SEQ = -1 encodes as vLLM sends it)."""
    return seq.to_bytes(8, "big", signed=seq < 0)


def decode_seq(frame: bytes) -> int:
    """An 8-byte big-endian seq frame; the replay end marker decodes to END_SEQ."""
    value = int.from_bytes(frame, "big")
    return END_SEQ if value == MASK64 else value


def normalize_hash(value: object) -> int | None:
    """An engine block id as a non-negative 64-bit int; None when it is neither an int nor bytes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, bytes | bytearray | memoryview):
        return int.from_bytes(value, "big") & MASK64
    return None


# --- decoding ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """One batch: its timestamp (engine wall clock, seconds), dp rank and decoded events in order."""

    ts: float | None
    dp_rank: int
    events: list[KvEvent]


class _Drop(Exception):
    """An event that cannot be used; already counted."""


class VllmEventDecoder:
    """Decodes msgpack batches of one engine (`worker_id`) into the router's event model.

    `block_size` is the router's: events of another block size are dropped (loudly), since their
    tokens would hash into blocks the router never looks up. `default_dp_rank` names the rank when
    a batch carries none (the endpoint it came from decides).
    """

    def __init__(
        self, worker_id: int | str, block_size: int, *, counters: EventCounters, default_dp_rank: int = 0
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.worker_id = worker_id
        self.block_size = block_size
        self.counters = counters
        self.default_dp_rank = default_dp_rank

    def decode(self, payload: bytes) -> DecodedBatch:
        """Decode one batch; a malformed one decodes to no events (and is counted)."""
        empty = DecodedBatch(None, self.default_dp_rank, [])
        try:
            raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            self.counters.loud("vllm.malformed_batch", "KV event batch is not msgpack: %r", exc)
            return empty
        parts = self._batch_parts(raw)
        if parts is None:
            return empty
        ts, raw_events, dp_rank = parts
        worker = Worker(self.worker_id, dp_rank)
        self.counters.add("vllm.batch")
        events: list[KvEvent] = []
        for raw_event in raw_events:
            try:
                event = self._event(raw_event, worker)
            except _Drop:
                continue
            if event is not None:
                events.append(event)
        return DecodedBatch(ts, dp_rank, events)

    def _batch_parts(self, raw: Any) -> tuple[float | None, list[Any], int] | None:
        if isinstance(raw, list | tuple) and len(raw) >= 2:
            ts, raw_events = raw[0], raw[1]
            dp_rank = raw[2] if len(raw) > 2 else None
        elif isinstance(raw, Mapping) and "events" in raw:
            ts, raw_events, dp_rank = raw.get("ts"), raw["events"], raw.get("data_parallel_rank")
        else:
            self.counters.loud(
                "vllm.malformed_batch", "KV event batch is a %s, not [ts, events, ...]", type(raw).__name__
            )
            return None
        if not isinstance(raw_events, list | tuple):
            self.counters.loud("vllm.malformed_batch", "KV event batch's events is not a list")
            return None
        if dp_rank is None:
            dp_rank = self.default_dp_rank
        elif isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or dp_rank < 0:
            self.counters.loud("vllm.malformed_batch", "KV event batch has dp rank %r", dp_rank)
            return None
        if not isinstance(ts, int | float) or isinstance(ts, bool):
            ts = None
        return (float(ts) if ts is not None else None), list(raw_events), dp_rank

    def _event(self, raw: Any, worker: Worker) -> KvEvent | None:
        if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
            tag = raw[0]
            fields_of = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, ())
            fields: Mapping[str, Any] = dict(zip(fields_of, raw[1:], strict=False))
        elif isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
            tag, fields = raw["type"], raw
        else:
            self.counters.loud("vllm.malformed_event", "KV event is a %s without a tag", type(raw).__name__)
            return None
        if tag == "BlockStored":
            self.counters.add("vllm.stored_event")
            return self._stored(fields, worker)
        if tag == "BlockRemoved":
            self.counters.add("vllm.removed_event")
            return self._removed(fields, worker)
        if tag == "AllBlocksCleared":
            self.counters.add("vllm.cleared_event")
            return AllBlocksCleared(worker)
        self.counters.loud("vllm.unknown_event", "unknown KV event type %r ignored", tag)
        return None

    def _routable(self, fields: Mapping[str, Any]) -> bool:
        """GPU (or unnamed) medium and the first KV cache group; other tiers and groups are counted."""
        medium = fields.get("medium")
        if medium is not None and (not isinstance(medium, str) or medium.upper() != MEDIUM_GPU):
            self.counters.add("vllm.other_medium")
            return False
        group = fields.get("group_idx")
        if group not in (None, 0):
            self.counters.add("vllm.other_kv_group")
            return False
        return True

    def _hashes(self, value: Any, what: str) -> list[int]:
        if not isinstance(value, list | tuple):
            raise self._malformed("%s is not a list", what)
        out = []
        for item in value:
            h = normalize_hash(item)
            if h is None:
                raise self._malformed("%s holds a %s", what, type(item).__name__)
            out.append(h)
        return out

    def _malformed(self, message: str, *args: object) -> _Drop:
        self.counters.loud("vllm.malformed_event", "KV event dropped: " + message, *args)
        return _Drop()

    def _stored(self, fields: Mapping[str, Any], worker: Worker) -> BlocksStored | None:
        if not self._routable(fields):
            return None
        engine_hashes = self._hashes(fields.get("block_hashes"), "BlockStored.block_hashes")
        parent_raw = fields.get("parent_block_hash")
        parent = None if parent_raw is None else normalize_hash(parent_raw)
        if parent_raw is not None and parent is None:
            raise self._malformed("BlockStored.parent_block_hash is a %s", type(parent_raw).__name__)
        token_ids, block_size = fields.get("token_ids"), fields.get("block_size")
        if not isinstance(token_ids, list | tuple) or not isinstance(block_size, int):
            raise self._malformed("BlockStored without token_ids or block_size")
        if block_size != self.block_size:
            self.counters.loud(
                "vllm.block_size_mismatch",
                "KV event from %s with block_size %d, the router's is %d: event dropped "
                "(configure the router's block size to match the engine's)",
                worker,
                block_size,
                self.block_size,
            )
            return None
        full, tail = divmod(len(token_ids), block_size)
        if len(engine_hashes) != full + (tail > 0):
            raise self._malformed(
                "BlockStored with %d block hashes for %d tokens of block size %d",
                len(engine_hashes),
                len(token_ids),
                block_size,
            )
        if tail:
            self.counters.add("vllm.partial_block")  # a partial page (SGLang) is never matchable
        if not full:
            return None
        lora_name = fields.get("lora_name")
        if lora_name is not None and not isinstance(lora_name, str):
            raise self._malformed("BlockStored.lora_name is a %s", type(lora_name).__name__)
        if fields.get("lora_id") is not None and not lora_name:
            self.counters.loud(
                "vllm.lora_without_name",
                "BlockStored from %s names LoRA id %r but no lora_name: its blocks cannot be hashed "
                "as the router hashes requests; event dropped",
                worker,
                fields.get("lora_id"),
            )
            return None
        try:
            local = compute_block_hashes(token_ids[: full * block_size], block_size, lora_name=lora_name)
        except ValueError as exc:
            raise self._malformed("BlockStored.token_ids: %s", exc) from None
        blocks = tuple(StoredBlock(e, h) for e, h in zip(engine_hashes, local, strict=False))
        return BlocksStored(worker, blocks, parent)

    def _removed(self, fields: Mapping[str, Any], worker: Worker) -> BlocksRemoved | None:
        if not self._routable(fields):
            return None
        return BlocksRemoved(
            worker, tuple(self._hashes(fields.get("block_hashes"), "BlockRemoved.block_hashes"))
        )


# --- encoding (what vLLM's publisher sends) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class WireBlockStored:
    """vLLM's `BlockStored` as sent: `token_ids` of all blocks, flat; `medium` "GPU" by default."""

    block_hashes: Sequence[WireHash]
    parent_block_hash: WireHash | None
    token_ids: Sequence[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class WireBlockRemoved:
    block_hashes: Sequence[WireHash]
    medium: str | None = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class WireAllBlocksCleared:
    pass


WireEvent: TypeAlias = WireBlockStored | WireBlockRemoved | WireAllBlocksCleared
Layout: TypeAlias = Literal["map", "array"]


def _wire_fields(event: WireEvent) -> tuple[str, list[tuple[str, Any]]]:
    if isinstance(event, WireBlockStored):
        return "BlockStored", [
            ("block_hashes", list(event.block_hashes)),
            ("parent_block_hash", event.parent_block_hash),
            ("token_ids", list(event.token_ids)),
            ("block_size", event.block_size),
            ("lora_id", event.lora_id),
            ("medium", event.medium),
            ("lora_name", event.lora_name),
        ]
    if isinstance(event, WireBlockRemoved):
        return "BlockRemoved", [("block_hashes", list(event.block_hashes)), ("medium", event.medium)]
    if isinstance(event, WireAllBlocksCleared):
        return "AllBlocksCleared", []
    raise TypeError(f"not a wire KV event: {type(event).__name__}")


def encode_batch(
    events: Sequence[WireEvent],
    *,
    ts: float | None = None,
    dp_rank: int | None = None,
    layout: Layout = "map",
) -> bytes:
    """A msgpack batch as vLLM's msgspec encoder writes it.

    `layout="map"`: 2026 vLLM (`{"ts", "events", "data_parallel_rank"}`, events tagged by "type",
    fields in declaration order, `data_parallel_rank` omitted when None). `layout="array"`: older
    vLLM (`[ts, events(, data_parallel_rank)]`, events `[tag, *fields]`). `ts` defaults to now.
    """
    if layout not in ("map", "array"):
        raise ValueError(f"layout must be 'map' or 'array', got {layout!r}")
    ts = time.time() if ts is None else ts
    encoded: list[Any] = []
    for event in events:
        tag, fields = _wire_fields(event)
        if layout == "map":
            encoded.append({"type": tag, **dict(fields)})
        else:
            encoded.append([tag, *(value for _, value in fields)])
    batch: Any
    if layout == "map":
        batch = {"ts": float(ts), "events": encoded}
        if dp_rank is not None:
            batch["data_parallel_rank"] = dp_rank
    else:
        batch = [float(ts), encoded] + ([dp_rank] if dp_rank is not None else [])
    return msgpack.packb(batch, use_bin_type=True)
