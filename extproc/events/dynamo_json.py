"""Dynamo's KV event JSON (NATS `kv_events` subject) to and from the router's event model.

Mirrors the wire shape of ai-dynamo `RouterEvent` / `KvCacheEvent` (lib/kv-router/src/protocols.rs,
serde defaults), REFERENCE section 4:

    {"worker_id": u64, "event": {"event_id": u64, "dp_rank": u32, "data": DATA}}
    DATA = {"stored": {"parent_hash": u64 | null, "blocks": [{"block_hash": u64, "tokens_hash": u64}]}}
         | {"removed": {"block_hashes": [u64]}}
         | "cleared"

`tokens_hash` is the router's local block hash (`extproc.router.hashing`) and is used as is;
`block_hash` is the engine's own block id. Dynamo names workers by u64; the picker's config
names them by string, so `decode_event` maps the wire id through `worker_id_of` (default `str`).

Decoding never raises: malformed JSON, unknown variants and out-of-range numbers are counted
loudly in `EventCounters` under `dynamo.*` keys and the message is dropped.

The same JSON is what a Dynamo worker of ai-dynamo-runtime 1.0 to 1.3 publishes by default (without
`--enable-local-indexer`: the router guide's "JetStream mode"): into a JetStream stream it creates,
`jetstream_stream(ns, component)`, on the subject `<stream>.kv-events`, with the worker's Dynamo
instance id as `worker_id` (1.0 to 1.2; 1.3 the publisher's `worker_id`) and, in 1.0, event ids from
0 and no `storage_tier` (tests/nats/fixtures/dynamo-jetstream/, captured from each release).

The RouterEvent shape is shared with Dynamo's msgpack event plane (`extproc.events.dynamo_plane`),
which parses its envelope and hands each RouterEvent to `router_event_header` / `router_event_data`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from extproc.events.counters import EventCounters
from extproc.router.types import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    StoredBlock,
    StoredBlocks,
    Worker,
    WorkerId,
)

U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1

DecodedEvent = tuple[WorkerId, int, KvEvent]  # (worker id, event id, event)


def kv_events_subject(namespace: str, component: str) -> str:
    """The NATS subject Dynamo publishes a component's KV events on."""
    return f"namespace.{namespace}.component.{component}.kv_events"


def jetstream_stream(namespace: str, component: str) -> str:
    """The JetStream stream a Dynamo 1.0-1.3 worker publishes a component's KV events into: Dynamo's
    slug of `namespace.<ns>.component.<component>.kv-events` (lower case, every character but a
    letter, a digit or `-` made `-`), e.g. `namespace-dynamo-component-backend-kv-events`."""
    name = f"namespace.{namespace}.component.{component}.kv-events".lower()
    return "".join(c if c.isascii() and c.isalnum() else "-" for c in name)


def jetstream_subject(namespace: str, component: str) -> str:
    """The subjects of that stream (its workers publish on `<stream>.kv-events`)."""
    return f"{jetstream_stream(namespace, component)}.*"


def encode_event(worker_id: int, event: KvEvent, event_id: int, dp_rank: int) -> bytes:
    """Dynamo JSON for `event` from engine `worker_id` (u64) at `dp_rank`, numbered `event_id`.

    The ids given here win over `event.worker` / `event.event_id` (the router may name the worker
    by a string the wire cannot carry). Raises ValueError when a number is out of its u64/u32
    range (engine ids must be unsigned: the snapshot's negative stand-in ids never go on the wire).
    """
    _check_uint(worker_id, U64_MAX, "worker_id")
    _check_uint(event_id, U64_MAX, "event_id")
    _check_uint(dp_rank, U32_MAX, "dp_rank")
    data: Any
    if isinstance(event, BlocksStored):
        if event.parent_hash is not None:
            _check_uint(event.parent_hash, U64_MAX, "parent_hash")
        blocks = []
        for b in event.blocks:
            _check_uint(b.engine_hash, U64_MAX, "block_hash")
            _check_uint(b.local_hash, U64_MAX, "tokens_hash")
            blocks.append({"block_hash": b.engine_hash, "tokens_hash": b.local_hash})
        data = {"stored": {"parent_hash": event.parent_hash, "blocks": blocks}}
    elif isinstance(event, BlocksRemoved):
        for h in event.engine_hashes:
            _check_uint(h, U64_MAX, "block_hash")
        data = {"removed": {"block_hashes": list(event.engine_hashes)}}
    elif isinstance(event, AllBlocksCleared):
        data = "cleared"
    else:
        raise TypeError(f"not a KV event: {type(event).__name__}")
    message = {"worker_id": worker_id, "event": {"event_id": event_id, "dp_rank": dp_rank, "data": data}}
    return json.dumps(message, separators=(",", ":")).encode()


def decode_event(
    data: bytes,
    counters: EventCounters,
    *,
    worker_id_of: Callable[[int], WorkerId] = str,
) -> DecodedEvent | None:
    """(worker id, event id, event) from one Dynamo JSON message, or None (counted) if unusable.

    The event carries `Worker(worker_id_of(wire id), dp_rank)` and the event id. Counter keys:
    `dynamo.malformed` (not JSON, wrong shape or types), `dynamo.unknown_variant` (a `data`
    variant other than stored/removed/cleared), `dynamo.event` (decoded).
    """
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        counters.loud("dynamo.malformed", "Dynamo KV event is not JSON (%s); dropped", exc)
        return None
    try:
        return _decode(message, counters, worker_id_of)
    except MalformedEvent as exc:
        counters.loud("dynamo.malformed", "malformed Dynamo KV event (%s); dropped", exc)
        return None


class MalformedEvent(ValueError):
    """A RouterEvent (or its envelope) that does not have Dynamo's shape; the message says where."""


def router_event_header(message: Any) -> tuple[int, int, int, Any]:
    """(wire worker id, event id, dp rank, data) of one parsed RouterEvent, JSON or msgpack alike.

    Raises MalformedEvent when a field is missing or out of range (`dp_rank` defaults to 0).
    """
    message = _object(message, "message")
    wire_worker = _uint(message.get("worker_id"), U64_MAX, "worker_id")
    event = _object(message.get("event"), "event")
    event_id = _uint(event.get("event_id"), U64_MAX, "event_id")
    dp_rank = _uint(event.get("dp_rank", 0), U32_MAX, "dp_rank")
    return wire_worker, event_id, dp_rank, event.get("data")


def router_event_data(payload: Any, worker: Worker, event_id: int) -> KvEvent | None:
    """The router's event for a RouterEvent's `data`; None for a variant other than stored, removed
    and cleared (the caller counts it). Raises MalformedEvent on a known variant of the wrong shape."""
    if payload == "cleared":
        return AllBlocksCleared(worker, event_id)
    if isinstance(payload, dict) and len(payload) == 1 and "stored" in payload:
        stored = _object(payload["stored"], "stored")
        parent = stored.get("parent_hash")
        parent_hash = None if parent is None else _uint(parent, U64_MAX, "parent_hash")
        blocks = _stored_blocks(_list(stored.get("blocks"), "blocks"))
        return BlocksStored(worker, blocks, parent_hash, event_id)
    if isinstance(payload, dict) and len(payload) == 1 and "removed" in payload:
        removed = _object(payload["removed"], "removed")
        hashes = _list(removed.get("block_hashes"), "block_hashes")
        if not _all_u64(hashes):  # the first bad one, named
            hashes = [_uint(h, U64_MAX, "block_hash") for h in hashes]
        return BlocksRemoved(worker, tuple(hashes), event_id)
    return None


def _stored_blocks(blocks: list[Any]) -> Sequence[StoredBlock]:
    """The blocks of a `stored` event: checked a list at a time (most of an event's decoding cost was
    checking each field in Python); any doubt goes field by field, for the error that names it."""
    try:
        engine = [b["block_hash"] for b in blocks]
        local = [b["tokens_hash"] for b in blocks]
    except (TypeError, KeyError):  # not objects (JSON and msgpack give no other indexable), a field missing
        engine = local = []
    if len(engine) == len(blocks) and _all_u64(engine) and _all_u64(local):
        return StoredBlocks(engine, local)
    return tuple(
        StoredBlock(
            _uint(b.get("block_hash"), U64_MAX, "block_hash"),
            _uint(b.get("tokens_hash"), U64_MAX, "tokens_hash"),
        )
        for b in (_object(b, "block") for b in blocks)
    )


def _all_u64(values: list[Any]) -> bool:
    """Every value an int (not a bool) in [0, 2**64)."""
    return not values or (set(map(type, values)) == {int} and min(values) >= 0 and max(values) <= U64_MAX)


def count_unknown_variant(counters: EventCounters, worker: Worker, payload: Any) -> None:
    """Count (loudly) a RouterEvent whose `data` is none of stored, removed and cleared."""
    variant = sorted(payload) if isinstance(payload, dict) else payload
    counters.loud(
        "dynamo.unknown_variant",
        "Dynamo KV event from worker %s with unknown data %.80r; dropped",
        worker,
        variant,
    )


def _decode(
    message: Any, counters: EventCounters, worker_id_of: Callable[[int], WorkerId]
) -> DecodedEvent | None:
    wire_worker, event_id, dp_rank, payload = router_event_header(message)
    worker_id = worker_id_of(wire_worker)
    worker = Worker(worker_id, dp_rank)
    decoded = router_event_data(payload, worker, event_id)
    if decoded is None:
        count_unknown_variant(counters, worker, payload)
        return None
    counters.add("dynamo.event")
    return worker_id, event_id, decoded


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedEvent(f"{what} is {type(value).__name__}, not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedEvent(f"{what} is {type(value).__name__}, not a list")
    return value


def _uint(value: Any, limit: int, what: str) -> int:
    if type(value) is not int or not 0 <= value <= limit:  # bool is not a number here
        raise MalformedEvent(f"{what} {value!r:.40} is not an integer in [0, {limit}]")
    return value


def _check_uint(value: int, limit: int, what: str) -> None:
    if type(value) is not int or not 0 <= value <= limit:
        raise ValueError(f"{what} {value!r} is not an integer in [0, {limit}]")
