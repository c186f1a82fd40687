"""Replica sync's messages on the wire: their formats, the digest, and checks of what arrives.

Messages are msgpack maps; `v` is the format. Lifecycle messages keep format 1, which a version-1
replica still reads (it ignores `boot` and `seq`); control messages are format 2, which a
version-1 replica drops as malformed (counted there); batches are format 3:

    {"v": 1, "router": str, "boot": int, "seq": int, "op": "add", "id": str, "worker": int | str,
     "dp": int, "hashes": [local block hash, ...], "isl": int, "overlap": int, "eot": int | nil}
    {"v": 1, "router": str, "boot": int, "seq": int, "op": "prefill" | "free", "id": str}
    {"v": 1, "router": str, "boot": int, "seq": int, "op": "bye"}   # stopping: forget my requests
    {"v": 2, "router": str, "boot": int, "seq": int, "op": "hb", "n": int, "digest": int,
     "lease_s": float, "batch": 1, "routes": 1, "handover": 1}  # the last three: what it reads
    {"v": 2, "router": str, "boot": int, "seq": int, "op": "want", "from": str}  # router id or "*"
    {"v": 2, "router": str, "boot": int, "seq": int, "op": "state", "part": int, "parts": int,
     "reqs": [[id, worker, dp, [hashes], isl, overlap, eot | nil, prefilled], ...]}

    {"v": 2, "router": str, "boot": int, "seq": int, "op": "home", "id": str, "model": str,
     "worker": int | str, "dp": int, "endpoint": str, "group": str}
    {"v": 2, "router": str, "boot": int, "seq": int, "op": "pin", "id": str, "model": str,
     "worker": int | str, "dp": int, "group": str}
    {"v": 2, "router": str, "boot": int, "seq": int, "op": "unpin", "id": str, "model": str}

    {"v": 3, "router": str, "boot": int, "seq": int, "op": "batch", "ops": [op, ...]}
    op = [0, id, worker, dp, hashes, isl, overlap, eot | nil]   # add; hashes: bytes, u64 little
         | [1, id] | [2, id]                                    # endian each (or a list of ints)
                                                                # prefill complete, free
         | [3, id, model, worker, dp, endpoint, group]          # home
         | [4, id, model, worker, dp, group] | [5, id, model]   # pin, unpin

Routes that clients name, shared so that any replica sends them where the first one did:
- a `home` says which worker stored a Responses API answer (`id` is the response id), so that a
  follow-up naming it (`previous_response_id`) or its retrieval reaches that worker
  (`extproc.picker.response_homes`);
- a `pin` says which worker a sticky session (`id` is the session id) is pinned to: sent when it is
  pinned or moves, and again while it is used (at most once a quarter of the session TTL), so that
  every replica keeps it alive; an `unpin` says the session was closed (`extproc.router.sessions`).
They are not requests: no digest or `state` counts them, and a lost one costs what the receiver would
have been told by it (a route on load). A replica sends them only while every other replica it knows
said `"routes": 1` in its last heartbeat (a replica that does not keep them, or of a version before
them, would drop a batch holding one as malformed).
A replica that was not listening when a route was shared (it started late, reconnected) is handed
every route another replica keeps (`want_routes`, `extproc.events.route_catchup`).

A request prefilled on a prefill worker (disaggregated serving) is shared as two: its decode
request under its id, on its decode worker, prefill complete at once; and its prompt under
`prefill_leg_id(id)` (the id, NUL, "prefill"), on the prefill worker, freed at its first token or
its end. A receiver applies each add to the router of the worker it names, so a replica that
predates the prompt's share applies it too. NUL cannot come in a request id from an HTTP header.

`digest` is the sum, modulo 2**64, over the sender's in-flight requests of the first 8 bytes
(little endian) of BLAKE2b(id UTF-8, NUL, "1" if its prefill completed else "0"). A `state` is one
snapshot cut into parts (of at most `replica_sync.STATE_PART_BYTES`), published back to back
(consecutive `seq`), so no lifecycle message of its sender falls between its parts; `parts` is at
least 1 (an empty set is a state too). A receiver applies it once every part arrived in order.

Every value read from the wire is checked here (`add_record`, `wire_hashes`, ...): a message that
fails a check raises ValueError or TypeError, and the receiver drops it (counted) rather than let a
count out of range make a worker look more or less loaded than it is.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from extproc.router.types import Worker

VERSION = 2  # control messages; lifecycle messages are still written as V1 when not batched
V1 = 1
V3 = 3  # batches of lifecycle messages
OP_ADD, OP_PREFILL, OP_FREE = 0, 1, 2  # op codes in a batch
OP_NAMES = ("add", "prefill", "free")
OP_HOME, OP_PIN, OP_UNPIN = 3, 4, 5  # routes clients name (not lifecycle ops): see the docstring
ROUTE_NAMES = ("home", "pin", "unpin")  # the ops of OP_HOME, OP_PIN and OP_UNPIN
MAX_ROUTE_TEXT = 512  # characters of a route's id, model, endpoint or group
MAX_HASHES = 1 << 17  # block hashes in one add: a 2M-token prompt at block size 16
MAX_TOKENS = (1 << 32) - 1  # an add's prompt (isl) and expected output tokens (eot), as u32 token counts
MAX_BATCH_OPS = 4096  # ops in one batch
_MASK = (1 << 64) - 1
_PREFILL_LEG = "\x00prefill"


def prefill_leg_id(request_id: str) -> str:
    """The id under which a disaggregated request's prompt on its prefill worker is shared."""
    return request_id + _PREFILL_LEG


@dataclass(slots=True)
class Record:
    """One in-flight request as replicas share it."""

    worker: Worker
    hashes: tuple[int, ...]
    isl: int
    overlap: int
    eot: int | None
    prefilled: bool = False

    def wire(self, request_id: str) -> list[Any]:
        w = self.worker
        return [request_id, w.worker_id, w.dp_rank, list(self.hashes), self.isl, self.overlap, self.eot,
                self.prefilled]  # fmt: skip

    @classmethod
    def from_wire(cls, item: Any) -> tuple[str, Record]:
        """(id, record) from a `state` entry; raises ValueError or TypeError."""
        if not isinstance(item, list) or len(item) != 8:
            raise ValueError(f"state entry {item!r:.60} is not an 8-item list")
        request_id, worker_id, dp, hashes, isl, overlap, eot, prefilled = item
        record = add_record(wire_worker(worker_id, dp), wire_hashes(hashes), isl, overlap, eot)
        record.prefilled = bool(prefilled)
        return wire_text(request_id, "request id"), record


@dataclass(frozen=True, slots=True)
class SharedHome:
    """Where a Responses API answer is stored, as replicas share it (see the module docstring)."""

    model: str
    worker: Worker
    endpoint: str  # ip:port, where what names the answer goes
    group: str  # the router group that owns the worker


@dataclass(frozen=True, slots=True)
class SharedPin:
    """The worker a sticky session is pinned to, as replicas share it."""

    model: str
    worker: Worker
    group: str


@dataclass(frozen=True, slots=True)
class SharedUnpin:
    """A sticky session closed."""

    model: str


SharedRoute = SharedHome | SharedPin | SharedUnpin


def id_hash(request_id: str, prefilled: bool) -> int:
    """A request's share of the digest (see the module docstring)."""
    data = request_id.encode("utf-8", "surrogatepass") + (b"\x001" if prefilled else b"\x000")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class InFlight:
    """Request id -> Record, with the count and digest heartbeats carry, kept up to date."""

    def __init__(self) -> None:
        self.requests: dict[str, Record] = {}
        self.digest = 0

    def __len__(self) -> int:
        return len(self.requests)

    def summary(self) -> tuple[int, int]:
        return len(self.requests), self.digest

    def put(self, request_id: str, record: Record) -> Record | None:
        old = self.pop(request_id)
        self.requests[request_id] = record
        self.digest = (self.digest + id_hash(request_id, record.prefilled)) & _MASK
        return old

    def mark_prefilled(self, request_id: str) -> bool:
        record = self.requests.get(request_id)
        if record is None or record.prefilled:
            return False
        self.digest = (self.digest - id_hash(request_id, False) + id_hash(request_id, True)) & _MASK
        record.prefilled = True
        return True

    def pop(self, request_id: str) -> Record | None:
        record = self.requests.pop(request_id, None)
        if record is not None:
            self.digest = (self.digest - id_hash(request_id, record.prefilled)) & _MASK
        return record


# --- checks of values from the wire ---------------------------------------------------------------


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 64)


def wire_int(value: Any) -> int:
    if not is_int(value):
        raise TypeError(f"{value!r:.40} is not an integer")
    return int(value)


def wire_opt_int(value: Any) -> int | None:
    return None if value is None else wire_int(value)


def add_record(worker: Worker, hashes: tuple[int, ...], isl: Any, overlap: Any, eot: Any) -> Record:
    """An add's record from the wire; raises ValueError or TypeError. A prompt of at most
    MAX_TOKENS tokens, an overlap within its blocks and an output of at most MAX_TOKENS: a count out
    of range would make its worker look less loaded than it is (or more) until the request ends."""
    isl, overlap, eot = wire_int(isl), wire_int(overlap), wire_opt_int(eot)
    in_range = 0 <= isl <= MAX_TOKENS and 0 <= overlap <= len(hashes)
    if not (in_range and (eot is None or 0 <= eot <= MAX_TOKENS)):
        raise ValueError(f"add: a count out of range: isl {isl}, overlap {overlap}/{len(hashes)}, eot {eot}")
    return Record(worker, hashes, isl, overlap, eot)


def wire_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} {value!r:.40} is not a string")
    return value


def wire_worker(worker_id: Any, dp: Any) -> Worker:
    if not isinstance(worker_id, str) and not is_int(worker_id):
        raise TypeError(f"worker {worker_id!r:.40} is neither a string nor an integer")
    return Worker(worker_id, wire_int(dp))


_INT_ONLY = {int}
_MIN, _END = -(1 << 63), 1 << 64
_U64_MASK = _END - 1


def wire_hashes(value: Any) -> tuple[int, ...]:
    """Block hashes from the wire: a list of integers, or bytes (8 per hash, u64 little endian)."""
    if isinstance(value, bytes):
        if len(value) % 8 or len(value) > 8 * MAX_HASHES:
            raise ValueError(f"packed hashes: {len(value)} bytes, expected 8 per hash, at most {MAX_HASHES}")
        return struct.unpack(f"<{len(value) >> 3}Q", value)
    if not isinstance(value, list) or len(value) > MAX_HASHES:
        raise ValueError(f"hashes: expected a list of at most {MAX_HASHES} integers")
    if not value:
        return ()
    if not (set(map(type, value)) <= _INT_ONLY and (lo := min(value)) >= _MIN and max(value) < _END):
        raise TypeError("hashes: expected integers in [-2**63, 2**64)")  # checked in C, not one by one
    return tuple(value) if lo >= 0 else tuple(h & _U64_MASK for h in value)  # signed: the same u64s


def packed_hashes(hashes: tuple[int, ...]) -> bytes | list[int]:
    """Hashes for a batch: packed when every one is a u64 (local hashes are), else the list."""
    try:
        return struct.pack(f"<{len(hashes)}Q", *hashes)
    except struct.error:
        return list(hashes)


def single_message(code: int, request_id: str, record: Record | None) -> dict[str, Any]:
    """A lifecycle op as its own format-1 message (without the head)."""
    if record is None:
        return {"op": OP_NAMES[code], "id": request_id}
    w = record.worker
    return {"op": "add", "id": request_id, "worker": w.worker_id, "dp": w.dp_rank,
            "hashes": list(record.hashes), "isl": record.isl, "overlap": record.overlap,
            "eot": record.eot}  # fmt: skip


def batch_op(code: int, request_id: str, record: Record | None) -> list[Any]:
    if record is None:
        return [code, request_id]
    w = record.worker
    return [code, request_id, w.worker_id, w.dp_rank, packed_hashes(record.hashes), record.isl,
            record.overlap, record.eot]  # fmt: skip


def batch_op_from_wire(item: Any) -> tuple[int, str, Record | SharedRoute | None]:
    """(code, request, response or session id, the add's record or the route) from a batch's op;
    raises ValueError or TypeError."""
    if not isinstance(item, list) or not item:
        raise ValueError(f"batch op {item!r:.60} is not a list")
    code = item[0]
    if code == OP_ADD and len(item) == 8 and type(code) is int:
        _, request_id, worker_id, dp, hashes, isl, overlap, eot = item
        record = add_record(wire_worker(worker_id, dp), wire_hashes(hashes), isl, overlap, eot)
        return OP_ADD, wire_text(request_id, "request id"), record
    if code in (OP_PREFILL, OP_FREE) and len(item) == 2 and type(code) is int:
        return code, wire_text(item[1], "request id"), None
    if code in _ROUTE_OPS and type(code) is int:
        return (code, *route_from_wire(code, item[1:]))
    raise ValueError(f"batch op {item!r:.60}: unknown code or length")


def route_message(key: str, route: SharedRoute) -> dict[str, Any]:
    """A route as its own format-2 message (without the head)."""
    if isinstance(route, SharedUnpin):
        return {"op": "unpin", "id": key, "model": route.model}
    w = route.worker
    message = {"op": "pin", "id": key, "model": route.model, "worker": w.worker_id, "dp": w.dp_rank,
               "group": route.group}  # fmt: skip
    if isinstance(route, SharedHome):
        message |= {"op": "home", "endpoint": route.endpoint}
    return message


def route_op(key: str, route: SharedRoute) -> list[Any]:
    """A route as an op of a batch."""
    if isinstance(route, SharedUnpin):
        return [OP_UNPIN, key, route.model]
    w = route.worker
    if isinstance(route, SharedHome):
        return [OP_HOME, key, route.model, w.worker_id, w.dp_rank, route.endpoint, route.group]
    return [OP_PIN, key, route.model, w.worker_id, w.dp_rank, route.group]


_ROUTE_FIELDS = {  # op: (code, its fields after the id, as in a single message)
    "home": (OP_HOME, ("model", "worker", "dp", "endpoint", "group")),
    "pin": (OP_PIN, ("model", "worker", "dp", "group")),
    "unpin": (OP_UNPIN, ("model",)),
}
_ROUTE_OPS = {code: (op, fields) for op, (code, fields) in _ROUTE_FIELDS.items()}


def route_from_message(op: str, message: dict[str, Any]) -> tuple[str, SharedRoute] | None:
    """(id, route) from a single message whose op is a route's, None for any other op; raises
    ValueError, TypeError or KeyError."""
    entry = _ROUTE_FIELDS.get(op)
    if entry is None:
        return None
    code, fields = entry
    return route_from_wire(code, [message["id"], *(message[f] for f in fields)])


def route_from_wire(code: int, items: list[Any]) -> tuple[str, SharedRoute]:
    """(id, route) from a route op's items after its code; raises ValueError or TypeError. Every
    text is bounded (`MAX_ROUTE_TEXT`): the ids come from clients and engines, and the tables they
    land in are kept for minutes to an hour."""
    op, fields = _ROUTE_OPS[code]
    if len(items) != 1 + len(fields):
        raise ValueError(f"{op}: {len(items)} items, expected {1 + len(fields)}")
    named = dict(zip(("id", *fields), items, strict=True))
    texts = {name: wire_text(value, name) for name, value in named.items() if name not in ("worker", "dp")}
    if not texts["id"] or any(len(text) > MAX_ROUTE_TEXT for text in texts.values()):
        raise ValueError(f"{op}: an id of 1 to {MAX_ROUTE_TEXT} characters and texts of at most as many")
    key, model = texts["id"], texts["model"]
    if code == OP_UNPIN:
        return key, SharedUnpin(model)
    worker = wire_worker(named["worker"], named["dp"])
    if code == OP_HOME:
        return key, SharedHome(model, worker, texts["endpoint"], texts["group"])
    return key, SharedPin(model, worker, texts["group"])
