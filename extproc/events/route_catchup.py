"""Routes for a replica that missed them: one other replica hands over every route it keeps.

Replica sync shares each route clients name (a Responses API answer's worker, a sticky session's
pin) as it is learned (`extproc.events.replica_wire`). A replica that was not listening then (it
started later, restarted, or lost its NATS connection or messages meanwhile) would know only the
routes learned after it came, so what names an older answer or session would be routed on load: a
404 from the engine for a follow-up of a stored response. So such a replica asks one other replica,
and learns from the answer every route it does not know yet:

    {"v": 2, "router": str, "boot": int, "seq": int, "op": "want_routes", "from": str,
     "reply": str, "ask": int}           # on the sync subject: `from` answers, nobody else
    {"v": 2, "router": str, "boot": int, "op": "routes", "ask": int, "part": int, "parts": int,
     "routes": [[age_s, *route op], ...]}      # to `reply` (the asker's inbox) only, no `seq`

- Whom: the first replica heard saying `"routes": 1, "handover": 1` in a heartbeat while routes
  are missed (at start, after a reconnect, after dropped messages). Any one will do: every replica
  keeps every route (unless a message was lost, which costs that route only). A replica of the
  version before says `"routes": 1` only: it keeps routes, but would drop a `want_routes` as an
  unknown op.
- What: the answer is a route op of a batch (`replica_wire.route_op`: a `home` or a `pin`) per
  route, least recently used first, each after its age (seconds since its last use, so that it
  lapses on time here too), cut into parts of at most `PART_BYTES`; an empty answer is one part.
- Fill, never replace: a route this replica already knows was learned later than the answer's
  (live, or from its own traffic) and is kept; a route that lapsed on the way is not taken.
- Asked again: a part out of order or a silence of `lease_s` (the asked replica died, or the answer
  was dropped) drops the ask; the next heartbeat of a replica that keeps routes asks again.
- Bounded: at most `MAX_PARTS` parts; the tables the routes land in are bounded themselves; one
  answer at a time is pending per asking replica, at most `MAX_PENDING_ANSWERS` in all.

A route closed (unpinned) while the answer was on its way may come back from it: its session stays
on that worker until its pin lapses or moves, which costs nothing the session would notice.

No I/O here: `ReplicaSync` publishes and subscribes; this module keeps the asking side's state and
encodes and checks the answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from extproc.events.replica_wire import (
    OP_HOME,
    OP_PIN,
    VERSION,
    SharedHome,
    SharedPin,
    is_int,
    route_from_wire,
    route_op,
    wire_int,
)
from extproc.router.types import Worker

PART_BYTES = 256 * 1024  # below NATS's default max_payload of 1 MiB
MAX_PARTS = 4096
MAX_PENDING_ANSWERS = 64  # replicas whose want_routes waits for this one's next tick
MAX_REPLY_CHARS = 256
_SUBJECT_FORBIDDEN = frozenset(" \t\r\n*>")

KnownRoute = tuple[str, SharedHome | SharedPin, float]  # (response or session id, route, age in seconds)


class RouteSink(Protocol):
    """Where the routes other replicas share land (`EndpointPicker`): Responses API answers' workers
    and sticky sessions' pins. `fill`: keep what is known here (a route handed over by
    `route_catchup`); `age_s`: seconds since the route's last use."""

    def remember_response_home(
        self, response_id: str, model: str, worker: Worker, endpoint: str, group: str, *,
        age_s: float = 0.0, fill: bool = False,
    ) -> bool: ...  # fmt: skip

    def remember_session_pin(
        self,
        session_id: str,
        model: str,
        worker: Worker,
        group: str,
        *,
        age_s: float = 0.0,
        fill: bool = False,
    ) -> bool: ...

    def forget_session_pin(self, session_id: str, model: str) -> bool: ...

    def known_response_homes(self) -> list[tuple[str, str, Worker, str, str, float]]:
        """(response id, model, worker, endpoint, group, age in seconds), least recently used first."""
        ...

    def known_session_pins(self) -> list[tuple[str, str, Worker, str, float]]:
        """(session id, model, worker, group, age in seconds), least recently used first."""
        ...


def known_routes(sink: RouteSink) -> list[KnownRoute]:
    """Every route `sink` keeps: the answers' homes, then the sessions' pins, each least recently
    used first."""
    known: list[KnownRoute] = [
        (rid, SharedHome(model, worker, endpoint, group), age)
        for rid, model, worker, endpoint, group, age in sink.known_response_homes()
    ]
    known += [
        (sid, SharedPin(model, worker, group), age)
        for sid, model, worker, group, age in sink.known_session_pins()
    ]
    return known


def fill_route(sink: RouteSink, key: str, route: SharedHome | SharedPin, age_s: float) -> bool:
    """Give `sink` a route handed over, unless it knows one for `key`; whether it took it."""
    if isinstance(route, SharedHome):
        return sink.remember_response_home(
            key, route.model, route.worker, route.endpoint, route.group, age_s=age_s, fill=True
        )
    return sink.remember_session_pin(key, route.model, route.worker, route.group, age_s=age_s, fill=True)


def reply_subject(value: Any) -> str:
    """The asker's inbox from a want_routes: a plain NATS subject (no wildcard), bounded."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REPLY_CHARS:
        raise ValueError(f"reply: a subject of 1 to {MAX_REPLY_CHARS} characters")
    if _SUBJECT_FORBIDDEN.intersection(value) or ".." in value or value[0] == "." or value[-1] == ".":
        raise ValueError(f"reply {value!r:.60}: not a plain subject")
    return value


def answer_parts(routes: Iterable[KnownRoute], part_bytes: int = PART_BYTES) -> list[list[list[Any]]]:
    """The answer's items, cut into parts of at most about `part_bytes` (at least one part)."""
    parts: list[list[list[Any]]] = [[]]
    size = 0
    for key, route, age_s in routes:
        item = [round(max(age_s, 0.0), 3), *route_op(key, route)]
        item_size = 40 + sum(len(x) for x in item if isinstance(x, str))  # msgpack, generously
        if parts[-1] and size + item_size > part_bytes:
            if len(parts) == MAX_PARTS:
                break  # a table larger than any bound: the oldest are sent, the rest is lost
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += item_size
    return parts


def answer_payloads(parts: list[list[list[Any]]], router_id: str, boot: int, ask: int) -> list[bytes]:
    """The messages of one answer (see the module docstring)."""
    head = {"v": VERSION, "router": router_id, "boot": boot, "op": "routes", "ask": ask}
    return [
        msgpack.packb({**head, "part": i, "parts": len(parts), "routes": items})
        for i, items in enumerate(parts)
    ]


def route_from_answer(item: Any) -> KnownRoute:
    """(id, route, age) from an answer's item; raises ValueError or TypeError."""
    if not isinstance(item, list) or len(item) < 2:
        raise ValueError("a route of an answer is a list: [age_s, code, id, ...]")
    age_s, code = item[0], item[1]
    if not isinstance(age_s, int | float) or isinstance(age_s, bool) or not 0 <= age_s < math.inf:
        raise ValueError(f"age {age_s!r:.20}: a finite number of seconds, at least 0")
    if code not in (OP_HOME, OP_PIN) or type(code) is not int:
        raise ValueError(f"op {code!r:.20}: an answer holds homes and pins only")
    key, route = route_from_wire(code, item[2:])
    assert isinstance(route, SharedHome | SharedPin)
    return key, route, float(age_s)


@dataclass(slots=True)
class Ask:
    """An answer this replica waits for."""

    origin: str  # the replica asked
    ask: int  # its number, echoed in the answer
    heard_at: float  # when it was asked, or its last part came
    parts_next: int = 0
    learned: int = 0  # routes taken (the others were known here, or lapsed)
    told: int = 0


class RoutesWanted:
    """The asking side: whether routes are missed, whom they were asked of, the parts as they come.

    `missed` starts True (a replica that starts may be late) and is set again by `missed_some`; a
    complete answer clears it. `whom` names the replica to ask when one is heard; `part` checks a
    part against the pending ask; `expired` drops an ask that went silent.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.missed = True
        self.pending: Ask | None = None
        self._asks = 0

    def missed_some(self) -> None:
        """Routes may have been missed (a reconnect, dropped messages): ask again."""
        self.missed = True

    def ask(self, origin: str, now: float) -> Ask | None:
        """A replica that keeps routes was heard: the ask to send it, or None (none missed, or one
        is pending)."""
        if not self.missed or self.pending is not None:
            return None
        self._asks += 1
        self.pending = Ask(origin, self._asks, now)
        return self.pending

    def take(self, data: bytes, now: float) -> tuple[Ask, list[Any], bool] | None:
        """(the ask, the part's items, whether it was the last) for the next part of the pending
        answer; None for an answer to no pending ask (a late one: ignored). A part out of order
        drops the ask and raises ValueError; so does a malformed one (ValueError, TypeError or
        KeyError); the items are checked one by one (`route_from_answer`)."""
        message = msgpack.unpackb(data, raw=False)
        if not isinstance(message, dict) or message.get("v") != VERSION or message.get("op") != "routes":
            raise ValueError("not a routes answer")
        pending = self.pending
        ask = message.get("ask")
        if (
            pending is None
            or message.get("router") != pending.origin
            or not is_int(ask)
            or ask != pending.ask
        ):
            return None
        try:
            part, parts, items = wire_int(message["part"]), wire_int(message["parts"]), message["routes"]
            if not 1 <= parts <= MAX_PARTS or part != pending.parts_next or part >= parts:
                raise ValueError(f"routes part {part} of {parts}, expected part {pending.parts_next}")
            if not isinstance(items, list):
                raise ValueError("routes: a list")
        except (KeyError, TypeError, ValueError):
            self.pending = None
            raise
        pending.parts_next += 1
        pending.heard_at = now
        last = pending.parts_next == parts
        if last:
            self.pending = None
            self.missed = False
        return pending, items, last

    def expired(self, now: float) -> Ask | None:
        """The pending ask, dropped, if nothing came for `timeout_s`; else None."""
        pending = self.pending
        if pending is None or now - pending.heard_at <= self.timeout_s:
            return None
        self.pending = None
        return pending
