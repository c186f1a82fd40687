"""Fuzz the router tree snapshot codec (durable mode loads these from the NATS object store).

Promise (extproc/events/snapshot.py): `decode_snapshot` returns a `Snapshot` or raises `SnapshotError`,
whatever the bytes. A decoded snapshot is well-typed, re-encodes to an equal snapshot, and its events
applied to a `KvRouter` give a sound tree that rebuilds from `dump_events`.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from extproc.events.snapshot import (
    SNAPSHOT_FORMAT,
    SNAPSHOT_VERSION,
    Snapshot,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
)
from extproc.router import AllBlocksCleared, BlocksRemoved, BlocksStored, StoredBlock, Worker, WorkerSpec
from tests.fuzz.gen import chance, deep_msgpack, integer, msgpack_value, mutate, pack, pick, text
from tests.fuzz.harness import (
    DECODED,
    REJECTED,
    SHRINKING_SHARE,
    Check,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
    sync_session,
)
from tests.fuzz.router_checks import check_tree, make_router

BLOCK = 4
WORDS = (SNAPSHOT_FORMAT, "format", "version", "stream_seq", "created_by", "created_at_s", "events")
I64_MIN, U64 = -(2**63), 2**64


class _Snapshot:
    def __init__(self, r: random.Random, hostility: float) -> None:
        self.r = r
        self.hostility = hostility

    def value(self, good: Any) -> Any:
        return msgpack_value(self.r, WORDS) if chance(self.r, self.hostility) else good

    def hash(self) -> Any:
        r = self.r
        return self.value(r.randint(-3, 12) if chance(r, 0.9) else integer(r))

    def event(self) -> list[Any]:
        r = self.r
        kind = pick(r, (0, 0, 0, 1, 2, 3))
        head = [self.value(kind), self.value(pick(r, ("w0", "w1", 0, 7))), self.value(pick(r, (0, 0, 1)))]
        if kind == 0:
            flat = [self.hash() if i % 2 == 0 else r.randint(0, 5) for i in range(2 * r.randint(0, 3))]
            if chance(r, self.hostility):
                flat.append(self.hash())  # an odd length
            return [*head, self.hash() if chance(r, 0.4) else None, self.value(flat)]
        if kind == 1:
            return [*head, self.value([self.hash() for _ in range(r.randint(0, 3))])]
        return head + ([self.hash()] if chance(r, self.hostility) else [])

    def snapshot(self) -> dict[Any, Any]:
        r = self.r
        top = {
            "format": self.value(SNAPSHOT_FORMAT),
            "version": self.value(SNAPSHOT_VERSION),
            "stream_seq": self.value(r.randint(0, 1000)),
            "created_by": self.value(text(r)),
            "created_at_s": self.value(r.uniform(0, 2e9)),
            "events": self.value([self.event() for _ in range(r.randint(0, 6))]),
        }
        for key in list(top):
            if chance(r, self.hostility / 3):
                del top[key]
        return top


def _valid(r: random.Random) -> bytes:
    """A snapshot the encoder wrote: what mutations start from."""
    workers = [Worker("w0"), Worker(7, 1)]
    events: list[Any] = []
    for _ in range(r.randint(1, 4)):
        worker = pick(r, workers)
        blocks = tuple(StoredBlock(r.randint(-2, 9), r.randint(0, 5)) for _ in range(r.randint(1, 3)))
        kinds = (BlocksStored(worker, blocks, None), BlocksRemoved(worker, (1, 2)), AllBlocksCleared(worker))
        events.append(pick(r, kinds))
    return encode_snapshot(Snapshot(tuple(events), r.randint(0, 99), "r", 1.5))


def generate(r: random.Random) -> bytes:
    roll = r.random()
    if roll < 0.7:
        return pack(_Snapshot(r, pick(r, (0.0, 0.03, 0.15))).snapshot())
    if roll < 0.88:
        return mutate(r, _valid(r))
    if roll < 0.94:
        return pack(msgpack_value(r, WORDS))
    if roll < 0.98:
        return r.randbytes(r.randint(0, 40))
    return deep_msgpack(r.choice((100, 5000, 200000)))


def check(data: bytes) -> Outcome:
    try:
        snapshot = decode_snapshot(data)
    except SnapshotError as exc:
        assert str(exc)
        return REJECTED
    assert type(snapshot.stream_seq) is int and snapshot.stream_seq >= 0
    assert isinstance(snapshot.created_by, str) and type(snapshot.created_at_s) is float
    for event in snapshot.events:
        assert type(event.worker.worker_id) in (int, str) and type(event.worker.dp_rank) is int
        assert event.worker.dp_rank >= 0
        if isinstance(event, BlocksStored):
            hashes = [h for b in event.blocks for h in (b.engine_hash, b.local_hash)]
            hashes += [event.parent_hash] if event.parent_hash is not None else []
        elif isinstance(event, BlocksRemoved):
            hashes = list(event.engine_hashes)
        else:
            assert isinstance(event, AllBlocksCleared)
            hashes = []
        assert all(type(h) is int and I64_MIN <= h < U64 for h in hashes)
    again = decode_snapshot(encode_snapshot(snapshot))
    assert (again.events, again.stream_seq, again.created_by) == (
        snapshot.events,
        snapshot.stream_seq,
        snapshot.created_by,
    )
    ranks: dict[int | str, set[int]] = {}
    for event in snapshot.events:
        ranks.setdefault(event.worker.worker_id, set()).add(event.worker.dp_rank)
    specs = [WorkerSpec(worker_id, dp_ranks=tuple(sorted(dp))) for worker_id, dp in ranks.items()]
    router = make_router(specs, BLOCK)
    for event in snapshot.events:
        router.apply_event(event)
    check_tree(router)
    return DECODED


TARGET = Target("snapshots", generate, sync_session(check), lambda data: repr(data[:1500]))
check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_snapshots_decode_or_raise_snapshot_error(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_snapshots_decode_or_raise_snapshot_error_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_snapshots_reach_both_outcomes() -> None:
    outcomes = [next(iter(check(generate(random.Random(i))))) for i in range(300)]
    assert 0.2 < outcomes.count("decoded") / len(outcomes) < 0.8
