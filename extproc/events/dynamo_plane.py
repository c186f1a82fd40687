"""Dynamo's KV event plane on NATS (what ai-dynamo-runtime 1.6.1's `KvEventPublisher` sends) decoded
into the router's event model.

The wire, as captured from the real publisher (`tests/nats/fixtures/capture_dynamo.py`, fixtures in
`tests/nats/fixtures/dynamo-1.6.1/`):

    subject   namespace.<ns>.component.<component>.endpoint.<endpoint>.kv-events
              (Dynamo 1.0-1.3 workers with a local indexer: namespace.<ns>.component.<component>.kv-events)
    message   msgpack map {publisher_id: u64, sequence: u64, published_at: u64 (ms since the epoch),
                           topic: "kv-events", payload: bin}
    payload   msgpack array of one or more RouterEvents, in event-id order (Dynamo 1.0-1.3: one
              RouterEvent, not in an array, and no residency_domain):
              {worker_id: u64, storage_tier: "device" | "host_pinned" | "disk" | ...,
               residency_domain: "worker", event: {event_id: u64, data: DATA, dp_rank: u32}}
    DATA      {"stored": {parent_hash: u64 | nil, start_position: nil, blocks: [{block_hash: u64,
               tokens_hash: u64, mm_extra_info: nil | {mm_objects: [...]}}]}}
              | {"removed": {block_hashes: [u64]}} | "cleared"

`<endpoint>` is the publisher's KV state endpoint, by default the endpoint it serves (`generate` for
Dynamo's engine workers). `sequence` counts one publisher's messages from 0 and `event_id` its events
from 1 (one publisher per worker and dp rank); a restarted publisher has a new `publisher_id` and starts
both again: the subscriber takes a worker's new publisher id as its restart
(`dynamo_intake.DynamoEventIntake`), whatever the event ids it happens to hear first. Hashes are
unsigned on the wire (the publisher's signed inputs arrive as their two's complement). `tokens_hash` is
the router's local block hash (`extproc.router.hashing`, LoRA name and cache salt included) and is used
as is; `block_hash` is the engine's own id. `start_position` and `mm_extra_info` are ignored (a
multimodal block's `tokens_hash` covers its media too, so only a request hashed the same way can match
it).

`storage_tier: "device"` blocks of `residency_domain: "worker"` (or without these keys) are the
engine's GPU prefix cache. The lower tiers Dynamo names (`host_pinned`, `disk`, `external`: KVBM's and
vLLM's offloaded copies) decode into events of that tier, which the router indexes apart and credits
less (`extproc.router.tiers`; counted `dynamo.other_tier` and `dynamo.tier_event`). Events of an
unknown tier or of another residency domain still carry an event id of the same per-publisher
sequence, so they are decoded as `PlaneEvent`s without an event: the subscriber checks their id for
gaps and applies nothing (counted `dynamo.other_tier` with `dynamo.unknown_tier`, and
`dynamo.other_domain`). A data variant other than stored, removed and cleared is kept the same way
(counted loudly, `dynamo.unknown_variant`).

Decoding never raises: a message that is not such an envelope is counted loudly (`dynamo.malformed`,
`dynamo.unknown_topic`) and dropped; a malformed RouterEvent in a payload is dropped alone (its lost id
shows as a gap at that worker's next event). RouterEvents share their shape with Dynamo's JSON, so
`extproc.events.dynamo_json` parses them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from extproc.events.counters import EventCounters
from extproc.events.dynamo_json import (
    MalformedEvent,
    count_unknown_variant,
    router_event_data,
    router_event_header,
)
from extproc.router.tiers import tier_of_name
from extproc.router.types import KvEvent, Worker, WorkerId

TOPIC = "kv-events"  # the envelope's topic, also the subject's last token
DEVICE_TIER = "device"  # Dynamo's StorageTier for GPU memory (vLLM's medium "GPU")
WORKER_DOMAIN = "worker"  # blocks resident in the worker's own cache
DEFAULT_ENDPOINT = "generate"  # the endpoint Dynamo's vLLM, SGLang and TensorRT-LLM workers serve


def event_plane_subject(namespace: str, component: str, endpoint: str = DEFAULT_ENDPOINT) -> str:
    """The NATS subject of an endpoint's KV events on Dynamo's event plane (`*`: every endpoint)."""
    return f"namespace.{namespace}.component.{component}.endpoint.{endpoint}.{TOPIC}"


def component_plane_subject(namespace: str, component: str) -> str:
    """The NATS subject of a component's KV events on Dynamo 1.0-1.3's event plane: what their workers
    with a local indexer publish on (no endpoint in it; one RouterEvent a message)."""
    return f"namespace.{namespace}.component.{component}.{TOPIC}"


@dataclass(frozen=True, slots=True)
class PlaneEvent:
    """One RouterEvent: its worker and event id, and the event to apply (None: nothing to apply, as
    for a block of another storage tier, but the id counts for gap detection)."""

    worker: Worker
    event_id: int
    event: KvEvent | None


def decode_envelope(
    data: bytes,
    counters: EventCounters,
    *,
    worker_id_of: Callable[[int], WorkerId] = str,
) -> list[PlaneEvent]:
    """The RouterEvents of one event-plane message, in order; [] (counted) when it is unusable
    (`read_envelope` without the publisher id)."""
    return read_envelope(data, counters, worker_id_of=worker_id_of)[1]


def read_envelope(
    data: bytes,
    counters: EventCounters,
    *,
    worker_id_of: Callable[[int], WorkerId] = str,
) -> tuple[int | None, list[PlaneEvent]]:
    """The publisher id (None when absent) and RouterEvents of one event-plane message, in order;
    (None, []) (counted) when it is unusable.

    Worker ids go through `worker_id_of` (the wire's u64 to the picker's worker id), as in
    `dynamo_json.decode_event`. Counter keys: `dynamo.event` (a device event decoded),
    `dynamo.other_tier` (with `dynamo.tier_event` or `dynamo.unknown_tier`), `dynamo.other_domain`,
    and loudly `dynamo.malformed`, `dynamo.unknown_topic`, `dynamo.unknown_variant`.
    """
    try:
        envelope = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        counters.loud("dynamo.malformed", "Dynamo event-plane message is not msgpack (%r); dropped", exc)
        return None, []
    try:
        raw_events = _payload(envelope)
    except _WrongTopic as exc:
        counters.loud(
            "dynamo.unknown_topic", "Dynamo event-plane message with topic %.80r; dropped", exc.topic
        )
        return None, []
    except MalformedEvent as exc:
        counters.loud("dynamo.malformed", "malformed Dynamo event-plane message (%s); dropped", exc)
        return None, []
    decoded: list[PlaneEvent] = []
    for raw in raw_events:
        try:
            decoded.append(_router_event(raw, counters, worker_id_of))
        except MalformedEvent as exc:
            counters.loud(
                "dynamo.malformed", "malformed Dynamo KV event on the event plane (%s); dropped", exc
            )
    publisher = envelope.get("publisher_id")
    return (publisher if isinstance(publisher, int) and not isinstance(publisher, bool) else None), decoded


class _WrongTopic(Exception):
    def __init__(self, topic: object) -> None:
        super().__init__(topic)
        self.topic = topic


def _payload(envelope: Any) -> list[Any]:
    if not isinstance(envelope, dict):
        raise MalformedEvent(f"envelope is {type(envelope).__name__}, not a map")
    topic = envelope.get("topic", TOPIC)
    if topic != TOPIC:
        raise _WrongTopic(topic)
    payload = envelope.get("payload")
    if not isinstance(payload, bytes):
        raise MalformedEvent(f"payload is {type(payload).__name__}, not bin")
    try:
        events = msgpack.unpackb(payload, raw=False)
    except Exception as exc:
        raise MalformedEvent(f"payload is not msgpack ({exc!r})") from None
    if isinstance(events, dict):  # Dynamo 1.0-1.3: one RouterEvent per message
        return [events]
    if not isinstance(events, list):
        raise MalformedEvent(f"payload is {type(events).__name__}, not an array of RouterEvents")
    return events


def _router_event(raw: Any, counters: EventCounters, worker_id_of: Callable[[int], WorkerId]) -> PlaneEvent:
    wire_worker, event_id, dp_rank, payload = router_event_header(raw)
    worker = Worker(worker_id_of(wire_worker), dp_rank)
    tier = raw.get("storage_tier", DEVICE_TIER)
    domain = raw.get("residency_domain", WORKER_DOMAIN)
    if not isinstance(tier, str):
        raise MalformedEvent(f"storage_tier is {type(tier).__name__}, not a string")
    event = router_event_data(payload, worker, event_id)
    if event is None:
        count_unknown_variant(counters, worker, payload)
        return PlaneEvent(worker, event_id, None)
    if domain != WORKER_DOMAIN:
        counters.add("dynamo.other_domain")
        return PlaneEvent(worker, event_id, None)
    if tier != DEVICE_TIER:
        counters.add("dynamo.other_tier")
        known = tier_of_name(tier)
        if known is None:
            counters.add("dynamo.unknown_tier")
            return PlaneEvent(worker, event_id, None)
        counters.add("dynamo.tier_event")
        return PlaneEvent(worker, event_id, replace(event, tier=known))
    counters.add("dynamo.event")
    return PlaneEvent(worker, event_id, event)
