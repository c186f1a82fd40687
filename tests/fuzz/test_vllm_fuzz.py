"""Fuzz the vLLM / SGLang ZMQ event decoder: multipart frames and msgpack batches, hostile or mutated.

Promise (extproc/events/vllm.py): `parse_frames` returns a frame or None, `VllmEventDecoder.decode`
never raises; what cannot be used is counted (every decode counts something), and what is decoded
is well-formed for the router. Each input is a short stream of messages from one engine (two dp
ranks configured, batches naming a third), applied through a `RouterFeed` to a `KvRouter`, whose
tree must stay sound, rebuild from `dump_events` and hold no block of the unconfigured rank.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from extproc.events.counters import EventCounters
from extproc.events.feed import RouterFeed
from extproc.events.vllm import (
    REMOVED_FIELDS,
    STORED_FIELDS,
    DecodedBatch,
    VllmEventDecoder,
    encode_seq,
    parse_frames,
)
from extproc.router import AllBlocksCleared, BlocksRemoved, BlocksStored, Worker, WorkerSpec
from tests.fuzz.gen import (
    chance,
    deep_msgpack,
    floating,
    integer,
    msgpack_value,
    mutate,
    one_of,
    pack,
    pick,
    text,
)
from tests.fuzz.harness import (
    SHRINKING_SHARE,
    Check,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
    sync_session,
    tally,
)
from tests.fuzz.router_checks import check_tree, make_router

WORKER = "w0"
BLOCK = 4
U64 = 2**64
WORDS = ("BlockStored", "BlockRemoved", "AllBlocksCleared", "GPU", "CPU", "type", "events", "ts")

Frames = list[bytes]


def _engine_hash(r: random.Random) -> Any:
    roll = r.random()
    if roll < 0.75:
        return r.randint(0, 12)  # a small id space, so that stores, parents and removals meet
    if roll < 0.85:
        return r.randbytes(pick(r, (8, 32, 0)))
    if roll < 0.95:
        return integer(r)
    return msgpack_value(r)


class _Batch:
    """One msgpack batch: events valid-looking or (at odds `hostility`) with a hostile field."""

    def __init__(self, r: random.Random, hostility: float) -> None:
        self.r = r
        self.hostility = hostility

    def value(self, good: Any) -> Any:
        return msgpack_value(self.r, WORDS) if chance(self.r, self.hostility) else good

    def stored(self) -> dict[str, Any]:
        r = self.r
        blocks = r.randint(0, 3)
        tokens = [
            r.randint(0, 2)
            for _ in range(blocks * BLOCK + (r.randint(1, BLOCK - 1) if chance(r, 0.1) else 0))
        ]
        if chance(r, self.hostility):
            tokens.append(one_of(r, integer, floating, text))
        hashes = [_engine_hash(r) for _ in range(-(-len(tokens) // BLOCK))]
        if chance(r, self.hostility):
            hashes = hashes[:-1] if hashes and chance(r, 0.5) else [*hashes, _engine_hash(r)]
        fields = {
            "block_hashes": self.value(hashes),
            "parent_block_hash": self.value(_engine_hash(r) if chance(r, 0.5) else None),
            "token_ids": self.value(tokens),
            "block_size": self.value(BLOCK if chance(r, 0.95) else pick(r, (1, 16, 0, -4))),
            "lora_id": self.value(None if chance(r, 0.9) else r.randint(0, 3)),
            "medium": self.value(pick(r, ("GPU", "GPU", "gpu", None, "CPU"))),
            "lora_name": self.value(None if chance(r, 0.8) else pick(r, ("a", ""))),
        }
        if chance(r, 0.1):
            fields["group_idx"] = self.value(pick(r, (0, 1, None)))
        return fields

    def removed(self) -> dict[str, Any]:
        r = self.r
        hashes = [_engine_hash(r) for _ in range(r.randint(0, 3))]
        return {"block_hashes": self.value(hashes), "medium": self.value(pick(r, ("GPU", None, "CPU")))}

    def event(self) -> Any:
        r = self.r
        tag = pick(r, ("BlockStored", "BlockStored", "BlockStored", "BlockRemoved", "BlockRemoved",
                       "AllBlocksCleared", "Unknown"))  # fmt: skip
        fields = self.stored() if tag == "BlockStored" else self.removed() if tag == "BlockRemoved" else {}
        if fields and chance(r, self.hostility / 2):
            del fields[pick(r, list(fields))]
        if chance(r, 0.5):
            return {"type": self.value(tag), **fields}
        order = STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS if tag == "BlockRemoved" else ()
        values = [fields.get(name) for name in order]  # msgspec's array_like sends every field
        return [self.value(tag), *values]

    def batch(self) -> Any:
        r = self.r
        events = [self.event() for _ in range(r.randint(0, 4))]
        ts = self.value(r.uniform(0, 2e9))
        dp = self.value(pick(r, (None, 0, 0, 1, 5)))  # the worker has ranks 0 and 1
        if chance(r, 0.5):
            batch: dict[str, Any] = {"ts": ts, "events": self.value(events)}
            if dp is not None:
                batch["data_parallel_rank"] = dp
            return batch
        return [ts, self.value(events), *([dp] if dp is not None else [])]


def payload(r: random.Random) -> bytes:
    roll = r.random()
    if roll < 0.75:
        return pack(_Batch(r, pick(r, (0.0, 0.03, 0.15))).batch())
    if roll < 0.88:
        return mutate(r, pack(_Batch(r, 0.0).batch()))
    if roll < 0.94:
        return pack(msgpack_value(r, WORDS))
    if roll < 0.98:
        return r.randbytes(r.randint(0, 40))
    return deep_msgpack(r.choice((100, 5000, 200000)))


def frames(r: random.Random, seq: int) -> Frames:
    message = [b"kv-events", encode_seq(seq), payload(r)]
    if chance(r, 0.05):
        roll = r.random()
        if roll < 0.4:
            del message[r.randrange(3)]
        elif roll < 0.7:
            message[1] = message[1][: r.randint(0, 7)] + (
                b"\x00" * r.randint(0, 3) if chance(r, 0.5) else b""
            )
        else:
            message.append(r.randbytes(3))
    return message


def generate(r: random.Random) -> list[Frames]:
    return [frames(r, seq) for seq in range(r.randint(1, 6))]


def _check_batch(batch: DecodedBatch) -> None:
    assert isinstance(batch, DecodedBatch)
    assert type(batch.dp_rank) is int and batch.dp_rank >= 0
    assert batch.ts is None or type(batch.ts) is float
    for event in batch.events:
        assert event.worker.worker_id == WORKER and event.worker.dp_rank == batch.dp_rank
        if isinstance(event, BlocksStored):
            assert event.blocks and (event.parent_hash is None or 0 <= event.parent_hash < U64)
            for block in event.blocks:
                assert type(block.engine_hash) is int and 0 <= block.engine_hash < U64
                assert type(block.local_hash) is int and 0 <= block.local_hash < U64
        elif isinstance(event, BlocksRemoved):
            assert all(type(h) is int and 0 <= h < U64 for h in event.engine_hashes)
        else:
            assert isinstance(event, AllBlocksCleared)


def check(messages: list[Frames]) -> Outcome:
    counters = EventCounters()
    router = make_router([WorkerSpec(WORKER, dp_ranks=(0, 1))], BLOCK)
    feed = RouterFeed({WORKER: router}, counters)
    decoder = VllmEventDecoder(WORKER, BLOCK, counters=counters)
    outcomes = []
    for message in messages:
        before = sum(counters.snapshot().values())
        frame = parse_frames(message, counters)
        if frame is None:
            assert counters["vllm.malformed_frames"] and sum(counters.snapshot().values()) == before + 1
            outcomes.append("rejected")
            continue
        dropped = counters["vllm.malformed_batch"] + counters["vllm.malformed_event"]
        batch = decoder.decode(frame.payload)
        assert sum(counters.snapshot().values()) > before, "a decode that counted nothing"
        _check_batch(batch)
        feed.apply_events(batch.events)
        if batch.events:
            outcomes.append("decoded")
        elif counters["vllm.malformed_batch"] + counters["vllm.malformed_event"] > dropped:
            outcomes.append("rejected")
        else:
            outcomes.append("empty")  # well-formed, nothing to route (partial block, other medium, ...)
    check_tree(router)
    assert set(router.indexer.workers()) <= {Worker(WORKER, 0), Worker(WORKER, 1)}  # never rank 5
    return tally(outcomes)


def describe(messages: list[Frames]) -> str:
    return repr([[f[:200] for f in m] for m in messages])[:1500]


TARGET = Target("vllm_events", generate, sync_session(check), describe)


check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_vllm_decoder_keeps_the_tree_sound(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_vllm_decoder_keeps_the_tree_sound_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_batches_reach_every_outcome() -> None:
    total: dict[str, int] = {}
    for i in range(200):
        for key, n in check(generate(random.Random(i))).items():
            total[key] = total.get(key, 0) + n
    assert min(total.get(k, 0) for k in ("decoded", "rejected", "empty")) > 20, total
