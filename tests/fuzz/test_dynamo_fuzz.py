"""Fuzz Dynamo's JSON KV events as the NATS core subscriber and the durable JetStream consumer apply them.

Promise (extproc/events/dynamo_json.py): `decode_event` never raises; it returns None and counts
`dynamo.malformed` or `dynamo.unknown_variant`, or returns a well-formed event and counts
`dynamo.event`. The subscriber and the durable consumer (extproc/events/nats_events.py, durable.py)
never raise either and apply the same events the same way: each input is a short stream from two
engines (plus an unknown one) with gaps and redeliveries, applied by both to their own `KvRouter`;
the two trees must be equal, sound and rebuild from `dump_events`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from extproc.events.counters import EventCounters
from extproc.events.durable import DurableConfig, DurableKvEvents
from extproc.events.dynamo_json import decode_event
from extproc.events.feed import RouterFeed
from extproc.events.nats_events import NatsEventSubscriber
from extproc.router import AllBlocksCleared, BlocksRemoved, BlocksStored, KvRouter, WorkerSpec
from tests.fuzz.gen import chance, deep, integer, json_bytes, json_value, mutate, pick
from tests.fuzz.harness import (
    SHRINKING_SHARE,
    Check,
    LoopRunner,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
    tally,
)
from tests.fuzz.router_checks import check_tree, entries, make_router

WORKERS = ("7", "8")
BLOCK = 4
U64, U32 = 2**64, 2**32
WORDS = ("worker_id", "event", "event_id", "dp_rank", "data", "stored", "removed", "cleared",
         "parent_hash", "blocks", "block_hash", "tokens_hash", "block_hashes")  # fmt: skip

Stream = list[tuple[int, bytes]]  # (JetStream sequence, message); a repeated sequence is a redelivery


class _Messages:
    """Messages of one stream: valid-looking, with a hostile value at odds `hostility`."""

    def __init__(self, r: random.Random, hostility: float) -> None:
        self.r = r
        self.hostility = hostility
        self.next_id = {w: r.randint(0, 3) for w in (7, 8, 9)}

    def value(self, good: Any) -> Any:
        return json_value(self.r, WORDS) if chance(self.r, self.hostility) else good

    def engine_hash(self) -> Any:
        r = self.r
        return self.value(r.randint(0, 12) if chance(r, 0.9) else integer(r))

    def data(self) -> Any:
        r = self.r
        roll = r.random()
        if roll < 0.5:
            blocks = [
                {"block_hash": self.engine_hash(), "tokens_hash": self.value(r.randint(0, 5))}
                for _ in range(r.randint(0, 3))
            ]
            parent = self.engine_hash() if chance(r, 0.5) else None
            return {"stored": {"parent_hash": parent, "blocks": self.value(blocks)}}
        if roll < 0.8:
            hashes = [self.engine_hash() for _ in range(r.randint(0, 3))]
            return {"removed": {"block_hashes": self.value(hashes)}}
        if roll < 0.9:
            return "cleared"
        return pick(r, ({"other": {}}, {"stored": {}, "removed": {}}, "Cleared", None, {}))

    def message(self) -> dict[str, Any]:
        r = self.r
        worker = pick(r, (7, 7, 8, 8, 9))
        event_id = self.next_id[worker]
        self.next_id[worker] = event_id + (1 if chance(r, 0.9) else pick(r, (0, 2, 5, -1)))
        event: dict[str, Any] = {"event_id": self.value(event_id), "data": self.value(self.data())}
        if chance(r, 0.8):
            event["dp_rank"] = self.value(pick(r, (0, 0, 1)))
        return {"worker_id": self.value(worker), "event": self.value(event)}


def _message_bytes(r: random.Random, messages: _Messages) -> bytes:
    roll = r.random()
    if roll < 0.78:
        return json_bytes(r, messages.message())
    if roll < 0.9:
        return mutate(r, json_bytes(r, messages.message()))
    if roll < 0.95:
        return json_bytes(r, json_value(r, WORDS))
    if roll < 0.98:
        return r.randbytes(r.randint(0, 40))
    return json_bytes(r, deep(r))


def generate(r: random.Random) -> Stream:
    messages = _Messages(r, pick(r, (0.0, 0.03, 0.15)))
    stream: Stream = []
    for seq in range(1, r.randint(2, 9)):
        stream.append((seq, _message_bytes(r, messages)))
        if chance(r, 0.05):
            stream.append(stream[r.randrange(len(stream))])  # a JetStream redelivery
    return stream


class _NoNats:
    """Enough of a NATS client for a durable consumer that is handed messages, never started."""

    def jetstream(self) -> None:
        return None


def _check_decoded(decoded: tuple[Any, int, Any]) -> None:
    worker_id, event_id, event = decoded
    assert isinstance(worker_id, str) and worker_id.isdigit() and int(worker_id) < U64
    assert type(event_id) is int and 0 <= event_id < U64
    assert event.worker.worker_id == worker_id and 0 <= event.worker.dp_rank < U32
    if isinstance(event, BlocksStored):
        assert event.parent_hash is None or 0 <= event.parent_hash < U64
        assert all(0 <= b.engine_hash < U64 and 0 <= b.local_hash < U64 for b in event.blocks)
    elif isinstance(event, BlocksRemoved):
        assert all(type(h) is int and 0 <= h < U64 for h in event.engine_hashes)
    else:
        assert isinstance(event, AllBlocksCleared)


def _router() -> KvRouter:
    return make_router([WorkerSpec(w, dp_ranks=(0, 1)) for w in WORKERS], BLOCK)


async def _consume(durable: DurableKvEvents, stream: Stream) -> None:
    for seq, data in stream:
        await durable._handle(seq, data)  # what the consume loop does with each fetched message


@contextlib.contextmanager
def session() -> Iterator[Check]:
    loop = LoopRunner()

    def check(stream: Stream) -> Outcome:
        core_router, durable_router = _router(), _router()
        core_counters, durable_counters, counters = EventCounters(), EventCounters(), EventCounters()
        core = NatsEventSubscriber(
            None,  # type: ignore[arg-type]  # handed messages directly: no link needed
            RouterFeed(dict.fromkeys(WORKERS, core_router), core_counters),
            "kv_events",
            counters=core_counters,
        )
        durable = DurableKvEvents(
            _NoNats(),  # type: ignore[arg-type]
            RouterFeed(dict.fromkeys(WORKERS, durable_router), durable_counters),
            durable_router,
            DurableConfig("ns", "backend", "fuzz"),
            counters=durable_counters,
        )
        outcomes = []
        seen = set()
        for seq, data in stream:
            redelivered = seq in seen
            seen.add(seq)
            if not redelivered:
                before = counters.snapshot()
                decoded = decode_event(data, counters)
                after = counters.snapshot()
                rose = {k for k in after if after[k] > before.get(k, 0)}
                if decoded is None:
                    assert rose in ({"dynamo.malformed"}, {"dynamo.unknown_variant"}), rose
                    outcomes.append("rejected")
                else:
                    assert rose == {"dynamo.event"}, rose
                    _check_decoded(decoded)
                    outcomes.append("decoded")
                core.handle(data)
        loop.run(_consume(durable, stream))
        assert core_counters["nats.sink_error"] == 0
        assert durable_counters["durable.redelivered"] == len(stream) - len(seen)
        check_tree(core_router)
        assert entries(durable_router.indexer) == entries(core_router.indexer), "durable and core differ"
        return tally(outcomes)

    try:
        yield check
    finally:
        loop.close()


def describe(stream: Stream) -> str:
    return repr([(seq, data[:300]) for seq, data in stream])[:2000]


TARGET = Target("dynamo_events", generate, session, describe)
check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_dynamo_events_apply_alike(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_dynamo_events_apply_alike_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_streams_reach_both_outcomes(check_target: Check) -> None:
    total: dict[str, int] = {}
    for i in range(200):
        for key, n in check_target(generate(random.Random(i))).items():
            total[key] = total.get(key, 0) + n
    assert min(total.get(k, 0) for k in ("decoded", "rejected")) > 100, total
