"""vLLM / SGLang KV events: the ZMQ frames and msgpack batches, decoded into the router's event model.

Owns the wire format only (no sockets): `parse_frames` splits a multipart message,
`parse_replay_reply` one replay answer, `VllmEventDecoder` turns a msgpack batch into
`BlocksStored` / `BlocksRemoved` / `AllBlocksCleared`, and `encode_batch` writes batches the way the
engines' msgspec encoders do (for our publisher and the tests). REFERENCE section 4. Every fact
below was read in the engines' published code (vLLM 0.33.0 and SGLang 0.5.23 wheels) and is pinned
by the fixtures their real publishers and producers wrote (`tests/events/engines/`).

Wire facts

- Frames: PUB `[topic, seq (8-byte big-endian), payload]`, topic empty by default
  (vllm/distributed/kv_events.py and sglang/srt/disaggregation/kv_events.py, `ZmqEventPublisher`).
  The replay ROUTER answers `[b"", start seq]` from a DEALER with `[b"", topic, seq, payload]` per
  buffered batch and ends with `[b"", b"", END_SEQ, b""]` (END_SEQ is -1 as a signed 8-byte
  big-endian int); older vLLM sent `[b"", seq, payload]` and `[b"", END_SEQ, b""]`. Both accepted.
- Batch: both engines' `EventBatch` is msgspec `array_like`: `[ts, events, dp_rank]` (vLLM's
  `data_parallel_rank`, SGLang's `attn_dp_rank`, both stamped by the publisher). A map batch
  `{"ts", "events", "data_parallel_rank"}` (seen in previews) is accepted too.
- Events: msgspec tagged structs with `omit_defaults`, i.e. maps `{"type": "BlockStored", ...}`;
  fields without a default are always present (nil when None), the others only when set. Older
  vLLM sent tagged arrays `["BlockStored", block_hashes, parent_block_hash, ...]` (accepted).
  vLLM 0.33 `BlockStored`: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, locality,
  ownership, session_id, lookahead_token_ids; `BlockRemoved`: block_hashes, medium, group_idx,
  locality, ownership. SGLang 0.5.23 `BlockStored`: block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, cache_salt, session_id, lora_name; `BlockRemoved`: block_hashes,
  medium. Unknown keys are ignored.
- Block ids: vLLM sends unsigned 64-bit ints (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, the default;
  the low 64 bits of the SHA-256 digest, big-endian) or the 32-byte digests; SGLang signed int64.
  All become the same non-negative 64-bit int (signed: modulo 2**64; digests: as vLLM converts).
- One BlockStored covers consecutive full blocks. vLLM (v1/core/block_pool.py) stores full blocks
  of `block_size`, re-announces prefix-cache hits from block 0 (`emit_cached_block_events`) and, in
  hybrid models whose hash unit (`prefix_match_unit`, the groups' gcd) is smaller than the block,
  registers the prompt's tail as a *partial block* (`cache_partial_block`): one id, `block_size`
  = the hash unit, its tokens only. SGLang (mem_cache/events.py `record_store`) emits one store
  per page, coalescing full pages of a chain into one event; the last page of a node may be
  partial (`block_size=len(page_tokens)`). SGLang's EAGLE bigram keys send token pairs.
- Salt: vLLM puts a request's `cache_salt` into the untagged per-block `extra_keys` (one entry per
  block, None or a tuple; v1/core/kv_cache_utils.py `generate_block_hash_extra_keys` and
  `to_event_extra_keys`): in order the LoRA name (when `lora_name` is set), `(mm_identifier,
  offset)` pairs, the salt (only in the block with start_token_idx 0), prompt-embeds digests
  (bytes). SGLang sends `cache_salt` on every BlockStored.
- Media: vLLM "GPU", "CPU", "STORAGE" (offload tiers: `MEDIUM_CPU`, `MEDIUM_STORAGE` of its
  offloading connector, v1/kv_offload and kv_connector/v1/offloading/events.py); SGLang "GPU",
  "CPU_PINNED", "DISK", "EXTERNAL" (`StorageMedium`).

What the picker makes of it (decisions)

- The router re-hashes `token_ids` into local hashes (the engines' own hashes cannot be
  reproduced); engine ids only link parents and name removals. A salted block is hashed with the
  salt as Dynamo's cache namespace (`compute_block_hashes(..., namespace=salt)`), a LoRA block
  with its adapter name.
- A vLLM store continuing a salted sequence (a parent, no salt in its extra keys) inherits its
  parent block's salt: each decoder keeps engine id -> salt for salted blocks only, dropped with
  a BlockRemoved of that id, AllBlocksCleared and `reset()` (the subscriber calls it whenever it
  resets the worker), bounded by `max_tracked_blocks` (oldest forgotten first, counted).
- Multimodal and prompt-embeds extra keys make the engine's block content depend on data the
  tokens do not carry (placeholder tokens are the same for every image): indexed by tokens they
  would match other images' prompts. Such a block and every block after it in the event (they
  chain from it) are dropped, counted (`vllm.multimodal_block`, `vllm.prompt_embeds_block`);
  blocks before it are indexed.
- Partial blocks (a store with `block_size` below the router's, one id, `block_size` tokens; or
  a tail past the full blocks of a store) are never matchable: counted (`vllm.partial_block`),
  not indexed, no warning. A store under an id the decoder did not index (a partial block, a
  multimodal block, ...) cannot align with the router's blocks either: dropped quietly and
  counted (`vllm.partial_parent`, `vllm.unindexed_parent`) so it is not taken for a lost parent,
  and its ids join that lineage. These ids are remembered per decoder under the same bound and
  are taken out of removals (the router never held them). A genuine block-size mismatch (a
  larger block size, or a small one that is not one partial block) stays a loud
  `vllm.block_size_mismatch`.
- Tiers: medium "GPU" (or absent) is the device tier; the offload media are lower tiers
  (`extproc.router.tiers.tier_of_medium`, Dynamo's mapping: vLLM "CPU" and SGLang "CPU_PINNED" are
  host_pinned, "STORAGE"/"DISK" disk, "EXTERNAL" external) and decode into events of that tier,
  which the router indexes apart and credits less (counted `vllm.other_medium` as before, and
  `vllm.tier_event`); an unknown medium is counted (`vllm.unknown_medium`) and ignored. vLLM's
  offloading connector sends a chunk without its payload (no token ids, `block_size` 0) unless
  `self_describing_kv_events` is on: such a store cannot be indexed and is counted
  (`vllm.tier_placeholder`). Engines give the same content the same id in every tier, so a lower
  tier's removal leaves the decoder's salt and lineage maps to the device copy.
- Only KV cache group 0, full or MLA attention specs (`kv_cache_spec_kind` absent,
  "full_attention", "mla_attention") and local blocks (`locality` absent or "LOCAL") are routable;
  the rest is counted (`vllm.other_kv_group`, `vllm.other_kv_spec`, `vllm.remote_block`) and
  ignored.
- Lookahead hashing (vLLM `num_hash_lookahead_tokens`, for EAGLE drafters; SGLang bigram keys):
  the engine's block also depends on the next token(s). The block is indexed by its own tokens
  (counted `vllm.lookahead_block`, `vllm.bigram_page`): a match can be over-estimated by at most
  its last block, when the request's next tokens differ; two ids for the same tokens are aliases
  in the router's tree.
- `ownership` (offload tier name), `session_id` (attribution), `lora_id` (deprecated number; a
  LoRA without a name cannot be hashed and is dropped loudly) and
  `kv_cache_spec_sliding_window` are not used.
- Not visible on the wire: SGLang's caller-defined `extra_key` namespaces its radix tree but is
  only published when it carries a LoRA; such blocks are indexed as plain tokens.

The decoder never raises on bad input: it counts (`counters.loud` for what an operator must look
at) and drops only what it cannot use.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeAlias

import msgpack

from extproc.events.counters import EventCounters
from extproc.router.hashing import compute_block_hashes
from extproc.router.tiers import tier_of_medium
from extproc.router.types import (
    DEVICE_TIER,
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    StoredBlocks,
    Worker,
)

MASK64 = (1 << 64) - 1
MEDIUM_GPU = "GPU"  # the device tier; vLLM "CPU"/"STORAGE", SGLang "CPU_PINNED"/"DISK"/... lower ones
ROUTABLE_SPEC_KINDS = frozenset({"full_attention", "mla_attention"})  # vLLM KVCacheSpecKind values
LOCAL = "LOCAL"
END_SEQ = -1  # the replay socket's end-of-replay marker, as a signed 8-byte big-endian seq
DEFAULT_MAX_TRACKED_BLOCKS = 1 << 18  # per decoder: salted ids, and ids of blocks not indexed

PARTIAL_PARENT = "vllm.partial_parent"
UNINDEXED_PARENT = "vllm.unindexed_parent"

# Field order of the tagged-array (msgspec array_like) encoding, after the tag (vLLM 0.33 order).
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
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")

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
    value = int.from_bytes(seq, "big")
    if value == MASK64:  # END_SEQ's bytes: the replay's end marker, never a batch's seq
        counters.loud("vllm.malformed_frames", "KV event message with the end-of-replay marker as its seq")
        return None
    return Frame(bytes(topic), value, bytes(payload))


def parse_replay_reply(frames: Sequence[bytes]) -> Frame | None:
    """One replay answer, as a DEALER receives it; None if it is neither layout.

    Current vLLM (0.33) and SGLang (0.5.23): `[b"", topic, seq, payload]`, ending with
    `[b"", b"", END_SEQ, b""]`; older vLLM: `[b"", seq, payload]`, ending with
    `[b"", END_SEQ, b""]`. The end marker comes back with seq END_SEQ.
    """
    if frames and not frames[0] and len(frames) in (3, 4):
        frames = frames[1:]  # the DEALER's empty delimiter
    if len(frames) == 3:
        topic, seq, payload = frames
    elif len(frames) == 2:
        topic, (seq, payload) = b"", frames
    else:
        return None
    if len(seq) != 8:
        return None
    value = decode_seq(seq)
    if value == END_SEQ and payload:
        return None
    return Frame(bytes(topic), value, bytes(payload))


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
    """One batch: its timestamp (engine wall clock, seconds), dp rank and decoded events in order.
    `valid` is False when the payload was not a batch at all (not msgpack, not `[ts, events]`)."""

    ts: float | None
    dp_rank: int
    events: list[KvEvent]
    valid: bool = True


class _Drop(Exception):
    """An event that cannot be used; already counted."""


class _ExtraKeys(NamedTuple):
    """What a store's `extra_keys` say: its salt, and the first block tokens cannot name (with why)."""

    salt: str | None
    cut: int
    cut_reason: str | None


class _Tracked:
    """A bounded insertion-ordered map engine id -> value; the oldest entry goes first (counted)."""

    def __init__(self, cap: int, counters: EventCounters, full_key: str, what: str) -> None:
        self.cap = cap
        self.counters = counters
        self.full_key = full_key
        self.what = what
        self.items: dict[int, str] = {}

    def put(self, key: int, value: str) -> None:
        items = self.items
        if key not in items and len(items) >= self.cap:
            del items[next(iter(items))]
            self.counters.loud(
                self.full_key,
                "KV events: more than %d %s tracked; forgetting the oldest",
                self.cap,
                self.what,
            )
        items[key] = value


class VllmEventDecoder:
    """Decodes msgpack batches of one engine endpoint (`worker_id`, one dp rank) into router events.

    `block_size` is the router's: stores of a larger block size, or of a smaller one that is not a
    single partial block, are dropped loudly, since their tokens would hash into blocks the router
    never looks up. `default_dp_rank` names the rank when a batch carries none. With
    `strict_dp_rank`, a batch naming another rank decodes to no events and changes nothing
    (counted `vllm.other_dp_rank`): the decoder of one endpoint (one rank's socket) then only ever
    produces that rank's events, which its owner's reset clears. The decoder keeps, per engine, the
    salts of salted blocks and the ids it did not index (module docstring), at most
    `max_tracked_blocks` of each; `reset()` forgets them (a worker reset).
    """

    def __init__(
        self,
        worker_id: int | str,
        block_size: int,
        *,
        counters: EventCounters,
        default_dp_rank: int = 0,
        strict_dp_rank: bool = False,
        max_tracked_blocks: int = DEFAULT_MAX_TRACKED_BLOCKS,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if max_tracked_blocks <= 0:
            raise ValueError(f"max_tracked_blocks must be positive, got {max_tracked_blocks}")
        self.worker_id = worker_id
        self.block_size = block_size
        self.counters = counters
        self.default_dp_rank = default_dp_rank
        self.strict_dp_rank = strict_dp_rank
        self._salts = _Tracked(max_tracked_blocks, counters, "vllm.salt_map_full", "salted blocks")
        self._unindexed = _Tracked(
            max_tracked_blocks, counters, "vllm.unindexed_map_full", "unindexed blocks"
        )

    def reset(self) -> None:
        """Forget what was learnt of the engine's blocks (salts, ids not indexed): a worker reset."""
        self._salts.items.clear()
        self._unindexed.items.clear()

    @property
    def tracked(self) -> tuple[int, int]:
        """(salted block ids, unindexed block ids) currently remembered."""
        return len(self._salts.items), len(self._unindexed.items)

    def decode(self, payload: bytes) -> DecodedBatch:
        """Decode one batch; a malformed one decodes to no events (and is counted)."""
        empty = DecodedBatch(None, self.default_dp_rank, [], valid=False)
        try:
            raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            self.counters.loud("vllm.malformed_batch", "KV event batch is not msgpack: %r", exc)
            return empty
        parts = self._batch_parts(raw)
        if parts is None:
            return empty
        ts, raw_events, dp_rank = parts
        if self.strict_dp_rank and dp_rank != self.default_dp_rank:
            self.counters.add("vllm.other_dp_rank")
            return DecodedBatch(ts, dp_rank, [])
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
            self.reset()
            return AllBlocksCleared(worker)
        self.counters.loud("vllm.unknown_event", "unknown KV event type %r ignored", tag)
        return None

    def _routable(self, fields: Mapping[str, Any]) -> str | None:
        """The tier of a routable event (KV cache group 0, full attention, local blocks of a known
        medium); None for the rest, counted."""
        medium = fields.get("medium")
        tier = DEVICE_TIER
        if medium is not None and (not isinstance(medium, str) or medium.upper() != MEDIUM_GPU):
            self.counters.add("vllm.other_medium")
            known = tier_of_medium(medium) if isinstance(medium, str) else None
            if known is None:
                self.counters.add("vllm.unknown_medium")
                return None
            tier = known
        if fields.get("group_idx") not in (None, 0):
            self.counters.add("vllm.other_kv_group")
            return None
        kind = fields.get("kv_cache_spec_kind")
        if kind is not None and (not isinstance(kind, str) or kind not in ROUTABLE_SPEC_KINDS):
            self.counters.add("vllm.other_kv_spec")
            return None
        locality = fields.get("locality")
        if locality is not None and locality != LOCAL:
            self.counters.add("vllm.remote_block")
            return None
        if tier != DEVICE_TIER:
            self.counters.add("vllm.tier_event")
        return tier

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

    def _mismatch(self, worker: Worker, block_size: int, tokens: int, hashes: int) -> None:
        self.counters.loud(
            "vllm.block_size_mismatch",
            "KV event from %s with block_size %d (%d tokens, %d blocks), the router's is %d: event "
            "dropped (configure the router's block size to match the engine's)",
            worker,
            block_size,
            tokens,
            hashes,
            self.block_size,
        )

    def _unindexed_all(self, ids: Sequence[int], lineage: str) -> None:
        for engine_id in ids:
            self._unindexed.put(engine_id, lineage)

    def _stored(self, fields: Mapping[str, Any], worker: Worker) -> BlocksStored | None:
        tier = self._routable(fields)
        if tier is None:
            return None
        if tier != DEVICE_TIER and (not fields.get("token_ids") or not fields.get("block_size")):
            self.counters.add("vllm.tier_placeholder")  # an offloaded chunk's id alone: no tokens
            return None
        ids = self._hashes(fields.get("block_hashes"), "BlockStored.block_hashes")
        parent_raw = fields.get("parent_block_hash")
        parent = None if parent_raw is None else normalize_hash(parent_raw)
        if parent_raw is not None and parent is None:
            raise self._malformed("BlockStored.parent_block_hash is a %s", type(parent_raw).__name__)
        lineage = self._unindexed.items.get(parent) if parent is not None else None
        if lineage is not None:  # hangs under a block that was not indexed: cannot align either
            self.counters.add(lineage)
            self._unindexed_all(ids, lineage)
            return None
        tokens = self._tokens(fields.get("token_ids"))
        block_size = fields.get("block_size")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise self._malformed("BlockStored without a positive block_size")
        full = self._full_blocks(worker, ids, tokens, block_size)
        if not full:
            return None
        lora_name = self._lora_name(fields, worker)
        if lora_name is False:
            self._unindexed_all(ids, UNINDEXED_PARENT)
            return None
        keys = self._extra_keys(fields.get("extra_keys"), len(ids), lora_name or None)
        salt = self._salt(fields, keys, parent)
        indexed = min(full, keys.cut)
        if indexed < full:
            assert keys.cut_reason is not None
            self.counters.add(keys.cut_reason, full - indexed)
            self._unindexed_all(ids[indexed:full], UNINDEXED_PARENT)
        if not indexed:
            return None
        try:
            local = compute_block_hashes(
                tokens[: indexed * self.block_size],
                self.block_size,
                lora_name=lora_name or None,
                namespace=salt,
            )
        except ValueError as exc:
            raise self._malformed("BlockStored.token_ids: %s", exc) from None
        if fields.get("lookahead_token_ids") is not None:
            self.counters.add("vllm.lookahead_block", indexed)
        return BlocksStored(worker, self._remember(ids[:indexed], local, salt), parent, tier=tier)

    def _tokens(self, value: Any) -> list[Any]:
        """Token ids; SGLang's bigram pages send `(token, next token)` pairs: their first elements."""
        if not isinstance(value, list | tuple):
            raise self._malformed("BlockStored without token_ids")
        if value and isinstance(value[0], list | tuple):
            if not all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
                raise self._malformed("BlockStored.token_ids mixes pairs and tokens")
            self.counters.add("vllm.bigram_page")
            return [p[0] for p in value]
        return list(value)

    def _full_blocks(self, worker: Worker, ids: list[int], tokens: list[Any], block_size: int) -> int:
        """How many full router blocks the store holds; partial blocks are counted and remembered."""
        if block_size < self.block_size:
            if len(ids) == 1 and len(tokens) == block_size:
                self.counters.add("vllm.partial_block")
                self._unindexed.put(ids[0], PARTIAL_PARENT)
            else:
                self._mismatch(worker, block_size, len(tokens), len(ids))
            return 0
        if block_size > self.block_size:
            self._mismatch(worker, block_size, len(tokens), len(ids))
            return 0
        full, tail = divmod(len(tokens), block_size)
        if len(ids) != full + (tail > 0):
            raise self._malformed(
                "BlockStored with %d block hashes for %d tokens of block size %d",
                len(ids),
                len(tokens),
                block_size,
            )
        if tail:
            self.counters.add("vllm.partial_block")
            self._unindexed.put(ids[-1], PARTIAL_PARENT)
        return full

    def _lora_name(self, fields: Mapping[str, Any], worker: Worker) -> str | Literal[False]:
        """The adapter name ("" for none), or False when a LoRA is named only by its id (dropped)."""
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
            return False
        return lora_name or ""

    def _extra_keys(self, raw: Any, blocks: int, lora_name: str | None) -> _ExtraKeys:
        """vLLM's per-block extra keys: the salt, and the first block with multimodal or
        prompt-embeds content (kv_cache_utils.py `to_event_extra_keys` order)."""
        none = _ExtraKeys(None, blocks, None)
        if raw is None:
            return none
        if not isinstance(raw, list | tuple) or len(raw) != blocks:
            raise self._malformed("BlockStored.extra_keys is not one entry per block")
        salts: set[str] = set()
        cut, reason = blocks, None
        for i, entry in enumerate(raw):
            if entry is None:
                continue
            if not isinstance(entry, list | tuple):
                raise self._malformed("BlockStored.extra_keys entry is a %s", type(entry).__name__)
            items = list(entry)
            if lora_name is not None and items and items[0] == lora_name:
                items = items[1:]
            for item in items:
                kind = self._extra_key_kind(item)
                if kind is None:
                    salts.add(item)
                elif i < cut:
                    cut, reason = i, kind
        if len(salts) > 1:
            raise self._malformed("BlockStored.extra_keys name %d different salts", len(salts))
        return _ExtraKeys(salts.pop() if salts else None, cut, reason)

    def _extra_key_kind(self, item: Any) -> str | None:
        """None for a salt (a string); the counter of what makes the block unindexable otherwise."""
        if isinstance(item, str):
            return None
        if isinstance(item, bytes):
            return "vllm.prompt_embeds_block"
        if isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[1], int):
            return "vllm.multimodal_block"
        raise self._malformed("BlockStored.extra_keys holds a %s", type(item).__name__)

    def _salt(self, fields: Mapping[str, Any], keys: _ExtraKeys, parent: int | None) -> str | None:
        """SGLang's `cache_salt`, else the salt in vLLM's extra keys, else the parent block's salt."""
        salt = fields.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise self._malformed("BlockStored.cache_salt is a %s", type(salt).__name__)
        if salt and keys.salt and salt != keys.salt:
            raise self._malformed("BlockStored names two salts")
        salt = salt or keys.salt
        if not salt and parent is not None:
            salt = self._salts.items.get(parent)
        return salt or None

    def _remember(self, ids: Sequence[int], local: Sequence[int], salt: str | None) -> StoredBlocks:
        """The indexed blocks; their ids leave the unindexed lineage and, when salted, name the salt."""
        unindexed = self._unindexed.items
        for engine_id in ids:
            if unindexed:
                unindexed.pop(engine_id, None)
            if salt:
                self._salts.put(engine_id, salt)
        n = min(len(ids), len(local))
        return StoredBlocks(list(ids[:n]), list(local[:n]))

    def _removed(self, fields: Mapping[str, Any], worker: Worker) -> BlocksRemoved | None:
        tier = self._routable(fields)
        if tier is None:
            return None
        ids = self._hashes(fields.get("block_hashes"), "BlockRemoved.block_hashes")
        salts, unindexed = self._salts.items, self._unindexed.items
        device = tier == DEVICE_TIER  # a lower tier's copy going leaves the maps to the device copy
        kept = []
        for engine_id in ids:
            if salts and device:
                salts.pop(engine_id, None)
            if unindexed and engine_id in unindexed:
                if device:
                    del unindexed[engine_id]
                continue  # never indexed: the router does not hold it
            kept.append(engine_id)
        if not kept and ids:
            self.counters.add("vllm.unindexed_removal")
            return None
        return BlocksRemoved(worker, tuple(kept), tier=tier)


# --- encoding (what the engines' publishers send) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class WireBlockStored:
    """vLLM's `BlockStored` as sent: `token_ids` of all blocks, flat; `medium` "GPU" by default.
    `extra_keys` (one entry per block: None or a tuple, e.g. `(salt,)` for a salted first block)
    and `group_idx` are written only when set, as vLLM's `omit_defaults` encoder does."""

    block_hashes: Sequence[WireHash]
    parent_block_hash: WireHash | None
    token_ids: Sequence[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: Sequence[Sequence[Any] | None] | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class WireBlockRemoved:
    block_hashes: Sequence[WireHash]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class WireAllBlocksCleared:
    pass


WireEvent: TypeAlias = WireBlockStored | WireBlockRemoved | WireAllBlocksCleared
Layout: TypeAlias = Literal["current", "map", "array"]
LAYOUTS = ("current", "map", "array")
_REQUIRED = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}  # fields without a default


def _wire_fields(event: WireEvent) -> tuple[str, list[tuple[str, Any]]]:
    if isinstance(event, WireBlockStored):
        extra = (
            None if event.extra_keys is None else [None if k is None else list(k) for k in event.extra_keys]
        )
        return "BlockStored", [
            ("block_hashes", list(event.block_hashes)),
            ("parent_block_hash", event.parent_block_hash),
            ("token_ids", list(event.token_ids)),
            ("block_size", event.block_size),
            ("lora_id", event.lora_id),
            ("medium", event.medium),
            ("lora_name", event.lora_name),
            ("extra_keys", extra),
            ("group_idx", event.group_idx),
        ]
    if isinstance(event, WireBlockRemoved):
        return "BlockRemoved", [
            ("block_hashes", list(event.block_hashes)),
            ("medium", event.medium),
            ("group_idx", event.group_idx),
        ]
    if isinstance(event, WireAllBlocksCleared):
        return "AllBlocksCleared", []
    raise TypeError(f"not a wire KV event: {type(event).__name__}")


def _encode_event(event: WireEvent, as_map: bool) -> Any:
    """A tagged map (optional fields left out when None) or a tagged array (trailing ones left out)."""
    tag, fields = _wire_fields(event)
    required = _REQUIRED[tag]
    if as_map:
        return {"type": tag, **{k: v for i, (k, v) in enumerate(fields) if i < required or v is not None}}
    values = [v for _, v in fields]
    while len(values) > required and values[-1] is None:
        values.pop()
    return [tag, *values]


def _pack_msgspec_event(packer: msgpack.Packer, event: dict[str, Any]) -> bytes:
    """A tagged map as msgspec writes it: the header of a struct with `omit_defaults` is sized for
    all its fields and its tag, so vLLM 0.33's BlockStored (15 fields + tag) always gets a map16
    header, whatever is omitted; smaller structs a fixmap."""
    body = b"".join(packer.pack(k) + packer.pack(v) for k, v in event.items())
    if event["type"] == "BlockStored":
        return b"\xde" + len(event).to_bytes(2, "big") + body
    return packer.pack_map_header(len(event)) + body


def encode_batch(
    events: Sequence[WireEvent],
    *,
    ts: float | None = None,
    dp_rank: int | None = None,
    layout: Layout = "current",
) -> bytes:
    """A msgpack batch as the engines' msgspec encoders write it.

    `layout="current"`: vLLM 0.33 (`[ts, events(, dp_rank)]`, events tagged maps with the fields in
    declaration order), byte for byte (SGLang 0.5.23's is the same shape, its BlockStored has a
    fixmap header). `"map"`: the map batch of previews (`{"ts", "events", "data_parallel_rank"}`, the
    same events, msgpack's smallest headers). `"array"`: older vLLM (`[ts, events(, dp_rank)]`,
    events `[tag, *fields]`). A None dp rank is left out; `ts` defaults to now.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    ts = time.time() if ts is None else ts
    encoded = [_encode_event(event, layout != "array") for event in events]
    if layout == "current":
        packer = msgpack.Packer(use_bin_type=True)
        head = [float(ts)] + ([dp_rank] if dp_rank is not None else [])
        return b"".join(
            [
                packer.pack_array_header(len(head) + 1),
                packer.pack(head[0]),
                packer.pack_array_header(len(encoded)),
                *(_pack_msgspec_event(packer, e) for e in encoded),
                *(packer.pack(x) for x in head[1:]),
            ]
        )
    batch: Any
    if layout == "map":
        batch = {"ts": float(ts), "events": encoded}
        if dp_rank is not None:
            batch["data_parallel_rank"] = dp_rank
    else:
        batch = [float(ts), encoded] + ([dp_rank] if dp_rank is not None else [])
    return msgpack.packb(batch, use_bin_type=True)
