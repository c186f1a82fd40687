"""Routes for a replica that missed them: one other replica hands over every route it keeps.

Replica sync shares each route clients name (a Responses API answer's worker, a sticky session's
pin) as it is learned (`extproc.events.replica_wire`). A replica that was not listening then (it
started later, restarted, or lost its NATS connection meanwhile) would know only the routes
learned after it came, so what names an older answer or session would be routed on load: a
404 from the engine for a follow-up of a stored response. So such a replica asks one other replica,
and learns from the answer every route it does not know yet:

    {"v": 2, "router": str, "boot": int, "seq": int, "op": "want_routes", "from": str,
     "reply": str, "ask": int}           # on the sync subject: `from` answers, nobody else
    {"v": 2, "router": str, "op": "routes", "ask": int, "part": int, "last": bool,
     "routes": [[age_s, *route op], ...]}      # to `reply` (the asker's inbox) only, no `seq`

- Whom: the first replica heard saying `"routes": 1, "handover": 1` in a heartbeat while routes
  are missed: at start, and after a reconnect. Any one will do: every replica keeps every route
  (unless a message was lost, which costs that route only). Not after messages dropped from a full
  queue: a replica that falls behind is not handed every route on top. A replica of the version
  before says `"routes": 1` only: it keeps routes, but would drop a `want_routes` as an unknown op.
- What: the answer is a route op of a batch (`replica_wire.route_op`: a `home` or a `pin`) per
  route, least recently used first, each after its age (seconds since its last use, so that it
  lapses on time here too), cut into parts of at most about `PART_BYTES`, numbered from 0, the last
  one marked; an empty answer is one part. The answering replica makes and sends one part per turn
  of its event loop (`answer_stream`), a few milliseconds each, never the whole table at once:
  100,000 answers' homes and as many pins are about 300 parts.
- Fill, never replace: a route this replica already knows was learned later than the answer's
  (live, or from its own traffic) and is kept; a route that lapsed on the way is not taken.
- Asked again: a part out of order or a silence of `lease_s` (the asked replica died, or the answer
  was dropped) drops the ask; the next heartbeat of a replica that keeps routes asks again.
- Taken as a bulk load: from the first part of an answer until it ends (whole, dropped or silent),
  no full garbage collection of the growing tables stops the new replica's loop, and the heap is
  frozen when it ends (`extproc.runtime.heap`).
- Bounded: at most `MAX_PARTS` parts; the tables the routes land in are bounded themselves; one
  answer at a time is pending per asking replica, at most `MAX_PENDING_ANSWERS` in all.

A route closed (unpinned) while the answer was on its way may come back from it: its session stays
on that worker until its pin lapses or moves, which costs nothing the session would notice.

No I/O here: `ReplicaSync` publishes and subscribes; this module keeps the asking side's state and
encodes and checks the answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from extproc.events.replica_wire import (
    MAX_ROUTE_TEXT,
    OP_HOME,
    OP_PIN,
    VERSION,
    is_int,
    wire_int,
    wire_worker,
)
from extproc.router.types import Worker
from extproc.runtime.heap import BulkLoad, bulk_load

PART_BYTES = 64 * 1024  # about 600 routes: made in a few milliseconds, far below NATS's max_payload
MAX_PARTS = 8192
MAX_PENDING_ANSWERS = 64  # replicas whose want_routes waits for this one's next tick
MAX_REPLY_CHARS = 256
_SUBJECT_FORBIDDEN = frozenset(" \t\r\n*>")

HomeRow = tuple[str, str, Worker, str, str, float]  # response id, model, worker, endpoint, group, age
PinRow = tuple[str, str, Worker, str, float]  # session id, model, worker, group, age


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

    def known_response_homes(self) -> Iterable[HomeRow]:
        """Every answer's home kept now, least recently used first, made as it is read (its age in
        seconds); the table may change meanwhile."""
        ...

    def known_session_pins(self) -> Iterable[PinRow]:
        """Every session's pin kept now, as `known_response_homes`."""
        ...


def reply_subject(value: Any) -> str:
    """The asker's inbox from a want_routes: a plain NATS subject (no wildcard), bounded."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REPLY_CHARS:
        raise ValueError(f"reply: a subject of 1 to {MAX_REPLY_CHARS} characters")
    if _SUBJECT_FORBIDDEN.intersection(value) or ".." in value or value[0] == "." or value[-1] == ".":
        raise ValueError(f"reply {value!r:.60}: not a plain subject")
    return value


def answer_stream(sink: RouteSink, router_id: str, ask: int, part_bytes: int = PART_BYTES) -> Iterator[bytes]:
    """The messages of one answer, each part made when the next one is asked for."""
    items: list[list[Any]] = []
    size = part = 0
    for item, item_size in _route_items(sink):
        if items and size + item_size > part_bytes:
            if part == MAX_PARTS - 1:
                break  # a table larger than any bound: the oldest are sent, the rest is lost
            yield answer_message(router_id, ask, part, False, items)
            items, size, part = [], 0, part + 1
        items.append(item)
        size += item_size
    yield answer_message(router_id, ask, part, True, items)


def answer_message(router_id: str, ask: int, part: int, last: bool, items: list[Any]) -> bytes:
    """One part of an answer (see the module docstring)."""
    message = {"v": VERSION, "router": router_id, "op": "routes", "ask": ask, "part": part, "last": last,
               "routes": items}  # fmt: skip
    return msgpack.packb(message)


def _route_items(sink: RouteSink) -> Iterator[tuple[list[Any], int]]:
    """(an answer's item, its size in bytes, generously) per route: the layout of `route_op`,
    written out here (no SharedHome per route: 100,000 of them cost a loop turn)."""
    for rid, model, w, endpoint, group, age in sink.known_response_homes():
        item = [max(age, 0.0), OP_HOME, rid, model, w.worker_id, w.dp_rank, endpoint, group]
        yield item, 48 + len(rid) + len(model) + len(endpoint) + len(group)
    for sid, model, w, group, age in sink.known_session_pins():
        item = [max(age, 0.0), OP_PIN, sid, model, w.worker_id, w.dp_rank, group]
        yield item, 48 + len(sid) + len(model) + len(group)


def fill_from_answer(sink: RouteSink, item: Any) -> bool:
    """Give `sink` one route of an answer, unless it knows one for that id; whether it took it.
    Raises ValueError or TypeError for a malformed item, checked as `replica_wire.route_from_wire`
    checks a route (written out here: an answer brings hundreds of thousands of them)."""
    if type(item) is not list or len(item) < 2:
        raise ValueError("a route of an answer is a list: [age_s, code, id, ...]")
    age_s, code = item[0], item[1]
    if type(age_s) not in (int, float) or not 0 <= age_s < math.inf:
        raise ValueError(f"age {age_s!r:.20}: a finite number of seconds, at least 0")
    if type(code) is int and code == OP_HOME and len(item) == 8:
        _, _, key, model, worker_id, dp, endpoint, group = item
        _check_texts(key, model, endpoint, group)
        worker = wire_worker(worker_id, dp)
        return sink.remember_response_home(key, model, worker, endpoint, group, age_s=float(age_s), fill=True)
    if type(code) is int and code == OP_PIN and len(item) == 7:
        _, _, key, model, worker_id, dp, group = item
        _check_texts(key, model, group)
        worker = wire_worker(worker_id, dp)
        return sink.remember_session_pin(key, model, worker, group, age_s=float(age_s), fill=True)
    raise ValueError(f"route {code!r:.20} of {len(item)} items: an answer holds homes (8) and pins (7)")


def _check_texts(key: Any, *texts: Any) -> None:
    for text in (key, *texts):
        if type(text) is not str or len(text) > MAX_ROUTE_TEXT:
            raise TypeError(f"{text!r:.40}: a route's id and texts are strings of at most {MAX_ROUTE_TEXT}")
    if not key:
        raise ValueError("a route's id is not empty")


@dataclass(slots=True)
class Answer:
    """An answer this replica is sending, one part per tick."""

    reply: str  # the asker's inbox
    parts: Iterator[bytes]  # `answer_stream`
    sent: int = 0


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
    complete answer clears it. `ask` makes the ask for a replica heard; `take` checks a part against
    the pending ask; `expired` drops an ask that went silent.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.missed = True
        self.pending: Ask | None = None
        self.answered = False  # an answer was taken whole since this replica started
        self._asks = 0
        self._load: BulkLoad | None = None  # from the pending answer's first part until it ends

    def missed_some(self) -> None:
        """Routes may have been missed (a reconnect): ask again."""
        self.missed = True

    @property
    def asked(self) -> bool:
        """Whether a replica was asked since this one started."""
        return self._asks > 0

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
        KeyError); the items are checked one by one (`fill_from_answer`)."""
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
            part, last, items = wire_int(message["part"]), message["last"], message["routes"]
            if part != pending.parts_next or part >= MAX_PARTS or not isinstance(last, bool):
                raise ValueError(
                    f"routes part {part!r:.20} (last: {last!r:.10}), expected {pending.parts_next}"
                )
            if not isinstance(items, list):
                raise ValueError("routes: a list")
        except (KeyError, TypeError, ValueError):
            self._settle()
            raise
        if pending.parts_next == 0:
            self._load = bulk_load()
            self._load.__enter__()
        pending.parts_next += 1
        pending.heard_at = now
        if last:
            self._settle()
            self.missed = False
            self.answered = True
        return pending, items, last

    def expired(self, now: float) -> Ask | None:
        """The pending ask, dropped, if nothing came for `timeout_s`; else None."""
        pending = self.pending
        if pending is None or now - pending.heard_at <= self.timeout_s:
            return None
        self._settle()
        return pending

    def give_up(self) -> None:
        """Stop waiting for the pending answer (this replica stops)."""
        self._settle()

    def _settle(self) -> None:
        """The pending ask is over (answered whole, dropped or silent); so is its bulk load."""
        self.pending = None
        load, self._load = self._load, None
        if load is not None:
            load.__exit__(None, None, None)
