"""The picker against what vLLM 0.33.0 and SGLang 0.5.23 really send (`tests/events/engines/`).

The fixtures were recorded from the engines' own code (their `ZmqEventPublisher`, vLLM's `BlockPool`
and SGLang's `KVCacheEventRecorder`) by `engines/generate_fixtures.py`; `engines/manifest.json`
says, from what the engine was asked to do and its own state, which blocks each batch stores and
what the router must hold at the end. No wheel is needed here: the bytes are replayed as recorded.

- every live batch decodes to exactly the expected blocks (local hashes from the token ids with
  the LoRA name and the salt as namespace), removals and counters;
- the recorded replay exchanges, served verbatim from a ROUTER socket, rebuild a real `KvRouter`
  through the real `ZmqEventSubscriber` to exactly the engine's cache, and fill a gap in the live
  frames; a replay of malformed frames leaves the worker down with the cause;
- our encoder and our publisher write the engines' bytes and replay framing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from extproc.events.counters import EventCounters
from extproc.events.vllm import (
    VllmEventDecoder,
    WireAllBlocksCleared,
    WireBlockRemoved,
    WireBlockStored,
    encode_batch,
    parse_frames,
)
from extproc.events.zmq_publisher import ZmqEventPublisher
from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscriber
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import DEVICE_TIER, AllBlocksCleared, BlocksRemoved, BlocksStored, Worker
from tests.events.test_zmq import RouterSink, wait_until
from tests.events.zmq_fakes import FakeEngine

ENGINES = Path(__file__).parent / "engines"
TIMINGS = SubscriberTimings(silence_s=30.0, replay_timeout_s=1.0, backoff_min_s=0.02, backoff_max_s=0.2)
LOUD = (
    "vllm.malformed_frames",
    "vllm.malformed_batch",
    "vllm.malformed_event",
    "vllm.block_size_mismatch",
    "vllm.unknown_event",
    "vllm.lora_without_name",
)
Frames = list[bytes]


@cache
def manifest() -> dict[str, Any]:
    return json.loads((ENGINES / "manifest.json").read_text())


@cache
def recording(name: str) -> dict[str, Any]:
    return json.loads((ENGINES / manifest()["fixtures"][name]["file"]).read_text())


def frames(hexes: list[str]) -> Frames:
    return [bytes.fromhex(h) for h in hexes]


def live(name: str) -> list[Frames]:
    return [frames(m) for m in recording(name)["live"]]


def exchange(name: str, start: int) -> tuple[Frames, list[Frames]]:
    """A recorded replay: the request the DEALER sent and the replies it got, verbatim."""
    (found,) = [r for r in recording(name)["replays"] if r["start"] == start]
    return frames(found["request"]), [frames(m) for m in found["reply"]]


FIXTURES = sorted(manifest()["fixtures"])
BS = {m["router_block_size"] for m in manifest()["fixtures"].values()}.pop()


def worker(name: str) -> Worker:
    return Worker("w0", manifest()["fixtures"][name]["dp_rank"])


def local_hash(block: dict[str, Any]) -> int:
    (h,) = compute_block_hashes(
        block["tokens"], BS, lora_name=block["lora_name"], namespace=block["cache_salt"]
    )
    return h


def test_the_manifest_names_the_engines_their_wheels_and_every_fixture():
    engines = manifest()["engines"]
    assert {name: e["version"] for name, e in engines.items()} == {"vllm": "0.33.0", "sglang": "0.5.23"}
    assert all(len(e["sha256"]) == 64 and e["wheel"].endswith(".whl") for e in engines.values())
    assert {name.split("/")[0] for name in FIXTURES} == {"vllm", "sglang"}
    for name in FIXTURES:
        data = recording(name)
        assert len(data["live"]) == len(manifest()["fixtures"][name]["batches"]) > 0
        assert [r["start"] for r in data["replays"]] == [0, len(data["live"]) // 2]


# --- decoding ----------------------------------------------------------------------------------


def decoded_blocks(events: list[Any]) -> tuple[list[tuple[int, int | None, int]], list[int], bool]:
    """(engine id, parent id, local hash) of every stored block in order, removed ids, cleared."""
    stored, removed, cleared = [], [], False
    for event in events:
        if isinstance(event, BlocksStored):
            parent = event.parent_hash
            for block in event.blocks:
                stored.append((block.engine_hash, parent, block.local_hash))
                parent = block.engine_hash
        elif isinstance(event, BlocksRemoved):
            removed += event.engine_hashes
        else:
            assert isinstance(event, AllBlocksCleared)
            cleared = True
    return stored, sorted(removed), cleared


@pytest.mark.parametrize("name", FIXTURES)
def test_every_engine_batch_decodes_to_the_blocks_the_engine_stored(name):
    w = worker(name)
    counters = EventCounters()
    decoder = VllmEventDecoder(w.worker_id, BS, counters=counters, default_dp_rank=1 - w.dp_rank)
    for seq, (message, expected) in enumerate(
        zip(live(name), manifest()["fixtures"][name]["batches"], strict=True)
    ):
        frame = parse_frames(message, counters)
        assert frame is not None and frame.seq == seq and frame.topic == b""
        before = counters.snapshot()
        batch = decoder.decode(frame.payload)
        assert batch.valid and batch.dp_rank == w.dp_rank  # the engine stamps its rank
        assert all(event.worker == w for event in batch.events)
        want = [(b["engine_id"], b["parent"], local_hash(b)) for b in expected["stored"]]
        device = [e for e in batch.events if e.tier == DEVICE_TIER]  # lower tiers: test_tier_fixtures.py
        assert decoded_blocks(device) == (want, expected["removed"], expected["cleared"]), seq
        after = counters.snapshot()
        for key, n in expected["counters"].items():
            assert after.get(key, 0) - before.get(key, 0) == n, (seq, key)
    assert not {key: counters[key] for key in LOUD if counters[key]}


def test_the_fixtures_cover_salts_loras_partial_pages_media_and_lineages():
    """The engines' features the decoder handles are all in the recordings (so the tests above
    exercise each of them on real bytes)."""
    totals: dict[str, int] = {}
    salts, loras = set(), set()
    for name in FIXTURES:
        for batch in manifest()["fixtures"][name]["batches"]:
            for key, n in batch["counters"].items():
                totals[key] = totals.get(key, 0) + n
            salts |= {(name.split("/")[0], b["cache_salt"]) for b in batch["stored"] if b["cache_salt"]}
            loras |= {(name.split("/")[0], b["lora_name"]) for b in batch["stored"] if b["lora_name"]}
    assert {e for e, _ in salts} == {e for e, _ in loras} == {"vllm", "sglang"}
    for key in (
        "vllm.partial_block",
        "vllm.partial_parent",
        "vllm.unindexed_parent",
        "vllm.unindexed_removal",
        "vllm.multimodal_block",
        "vllm.prompt_embeds_block",
        "vllm.other_medium",
        "vllm.lookahead_block",
    ):
        assert totals.get(key, 0) > 0, key


def test_a_salted_vllm_continuation_names_no_salt_and_inherits_its_first_blocks():
    """vLLM names the salt only in the first block's extra_keys; the next chunk's store names its
    parent only. Decoded without the first batch, the continuation would be hashed plainly."""
    name = "vllm/standard"
    salted = [
        b for batch in manifest()["fixtures"][name]["batches"] for b in batch["stored"] if b["cache_salt"]
    ]
    first, second = salted[0], salted[1]
    assert second["parent"] == first["engine_id"]
    payloads = [m[2] for m in live(name)]
    for payload in payloads:
        for event in msgpack.unpackb(payload, strict_map_key=False)[1]:
            if second["engine_id"] in event.get("block_hashes", ()) and event["type"] == "BlockStored":
                assert event["parent_block_hash"] == first["engine_id"] and event["extra_keys"] == [None]
                alone = VllmEventDecoder("w0", BS, counters=EventCounters()).decode(payload)
                ids = {
                    b.engine_hash: b.local_hash
                    for e in alone.events
                    if isinstance(e, BlocksStored)
                    for b in e.blocks
                }
                assert (
                    ids[second["engine_id"]]
                    == compute_block_hashes(second["tokens"], BS)[0]
                    != local_hash(second)
                )
                return
    raise AssertionError("the continuation is not in the recording")


def test_dynamos_salt_vector_is_the_hash_of_the_engines_salted_block():
    """REFERENCE section 3/4: tokens 5000..5015, block 16, salt "salt-A" -> 7339200549687331636."""
    for name in ("vllm/standard", "sglang/default-format", "sglang/dynamo-format"):
        blocks = [b for batch in manifest()["fixtures"][name]["batches"] for b in batch["stored"]]
        (block,) = [b for b in blocks if b["tokens"][0] == 5000 and b["cache_salt"] == "salt-A"]
        assert local_hash(block) == 7339200549687331636


# --- replays through the real subscriber into a real router -------------------------------------


class Recorded:
    """Serves recorded replay exchanges verbatim (and checks the requests are the recorded ones)."""

    def __init__(self, name: str, answers: dict[int, list[Frames]]) -> None:
        self.name = name
        self.answers = answers
        self.unexpected: list[int] = []

    def __call__(self, start: int) -> list[Frames]:
        if start not in self.answers:
            self.unexpected.append(start)
            return []
        return self.answers[start]


def make_router() -> KvRouter:
    return KvRouter(RouterConfig(block_size=BS, use_kv_events=True), clock=lambda: 0.0)


def assert_holds_the_engines_cache(router: KvRouter, name: str) -> None:
    holds(router, worker(name), manifest()["fixtures"][name]["final"])


def holds(router: KvRouter, w: Worker, final: dict[str, Any]) -> None:
    """The router holds exactly a capture's `final` state for `w` (its blocks, each chain's match)."""
    assert router.indexer.num_blocks(w) == final["num_blocks"]
    for chain in final["chains"]:
        query = compute_block_hashes(
            chain["tokens"], BS, lora_name=chain["lora_name"], namespace=chain["cache_salt"]
        )
        assert router.indexer.find_matches(query).get(w, 0) == chain["blocks"], chain["note"]


async def subscriber(
    engine: FakeEngine, name: str, router: KvRouter, counters: EventCounters
) -> ZmqEventSubscriber:
    return await subscribe(engine, worker(name), router, counters)


async def subscribe(
    engine: FakeEngine, w: Worker, router: KvRouter, counters: EventCounters
) -> ZmqEventSubscriber:
    endpoint = ZmqEndpoint(w, engine.pub_endpoint, engine.replay_endpoint)
    sub = ZmqEventSubscriber(endpoint, RouterSink(router), block_size=BS, counters=counters, timings=TIMINGS)
    await sub.start()
    return sub


async def rebuilds_from_its_replay(
    engine: FakeEngine, w: Worker, final: dict[str, Any], request: Frames, reply: list[Frames]
) -> None:
    """An engine's replay from seq 0 (`request` answered with `reply`, verbatim) rebuilds a real
    router through the real subscriber to the capture's `final` state."""
    engine.script = Recorded("replay", {0: reply})
    router, counters = make_router(), EventCounters()
    sub = await subscribe(engine, w, router, counters)
    try:
        await wait_until(lambda: sub.status.up, what="rebuilt from the engine's replay")
        assert sub.status.reason == f"rebuilt from replay ({len(reply) - 1} batches)" and sub.status.complete
        assert engine.requests == [request]
        holds(router, w, final)
        assert counters["zmq.replay_malformed"] == 0
    finally:
        await sub.stop()


async def fills_a_gap_from_its_replay(
    engine: FakeEngine,
    w: Worker,
    final: dict[str, Any],
    messages: list[Frames],
    exchange_at: Callable[[int], tuple[Frames, list[Frames]]],
) -> None:
    """Live `messages` missing their middle: the engine's replay from there (`exchange_at(start)`,
    verbatim) fills the gap, and the router ends with the capture's `final` state."""
    middle = len(messages) // 2
    request, reply = exchange_at(middle)
    end_marker = reply[-1]  # the engine's own end marker: its buffer was empty when we connected
    engine.script = Recorded("gap", {0: [end_marker], middle: reply})
    router, counters = make_router(), EventCounters()
    sub = await subscribe(engine, w, router, counters)
    try:
        await wait_until(lambda: sub.status.up, what="rebuilt from an empty buffer")
        await engine.wait_subscribed()
        for message in messages[:middle] + messages[-1:]:  # batches middle..n-2 never arrive live
            await engine.publish(message)
        await wait_until(lambda: sub.status.last_seq == len(messages) - 1, what="the last batch")
        assert engine.requests[1] == request and engine.script.unexpected == []
        assert counters["zmq.gap"] == 1 and counters["zmq.unfilled_gap"] == 0
        holds(router, w, final)
        assert sub.status.up and sub.status.complete
    finally:
        await sub.stop()


@pytest.mark.parametrize("name", FIXTURES)
async def test_the_engines_replay_rebuilds_the_router_to_exactly_its_cache(engine, name):
    final = manifest()["fixtures"][name]["final"]
    await rebuilds_from_its_replay(engine, worker(name), final, *exchange(name, 0))


def unsalted_twin(name: str, chain: dict[str, Any]) -> int:
    """What the manifest says the same tokens find without a salt (another chain's blocks, or 0)."""
    final = manifest()["fixtures"][name]["final"]["chains"]
    same = [c for c in final if c["tokens"] == chain["tokens"] and c["lora_name"] == chain["lora_name"]]
    return next((c["blocks"] for c in same if not c["cache_salt"]), 0)


async def test_salted_blocks_match_only_requests_with_that_salt(engine):
    """After each engine's replay: every salted chain matches with its salt, not with another salt,
    and without a salt only what the engine holds unsalted (nothing, or an unsalted twin's blocks)."""
    checked = 0
    for name in FIXTURES:
        final = manifest()["fixtures"][name]["final"]["chains"]
        chains = [c for c in final if c["cache_salt"] and c["blocks"]]
        if not chains:
            continue
        engine.script = Recorded(name, {0: exchange(name, 0)[1]})
        router = make_router()
        sub = await subscriber(engine, name, router, EventCounters())
        try:
            await wait_until(lambda s=sub: s.status.up, what="rebuilt")
            w = worker(name)
            for c in chains:
                salt = c["cache_salt"]
                for namespace, blocks in (
                    (salt, c["blocks"]),
                    (salt + "-other", 0),
                    (None, unsalted_twin(name, c)),
                ):
                    query = compute_block_hashes(
                        c["tokens"], BS, lora_name=c["lora_name"], namespace=namespace
                    )
                    assert router.indexer.find_matches(query).get(w, 0) == blocks, (
                        name,
                        c["note"],
                        namespace,
                    )
                    checked += 1
        finally:
            await sub.stop()
    assert checked == 3 * 7  # vLLM: salt-A, salt-B with a LoRA, salt-C; SGLang: two formats x two nodes


GAPPED = [name for name in FIXTURES if len(recording(name)["live"]) >= 3]


@pytest.mark.parametrize("name", GAPPED)
async def test_the_engines_replay_from_the_middle_fills_a_gap_in_its_live_frames(engine, name):
    final = manifest()["fixtures"][name]["final"]
    await fills_a_gap_from_its_replay(engine, worker(name), final, live(name), partial(exchange, name))


async def test_a_replay_of_malformed_frames_leaves_the_worker_down_with_the_cause(engine):
    name = "vllm/standard"
    _, reply = exchange(name, 0)
    broken = [[m[0], m[1], m[3]] for m in reply[:-1]]  # the seq frame lost: [b"", topic, payload]
    engine.script = Recorded(name, {0: [*broken, reply[-1]]})
    router, counters = make_router(), EventCounters()
    sub = await subscriber(engine, name, router, counters)
    try:
        await wait_until(lambda: counters["zmq.replay_failed"] >= 2, what="the rebuild retried")
        assert not sub.status.up and not sub.status.complete
        assert sub.status.reason.endswith(f"answered {len(broken)} malformed replies")
        assert router.indexer.num_blocks(worker(name)) == 0
    finally:
        await sub.stop()


# --- our side writes what the engines write ------------------------------------------------------


def wire_event(raw: dict[str, Any]) -> Any:
    """The engine's decoded event as our encoder's input."""
    if raw["type"] == "BlockStored":
        return WireBlockStored(
            raw["block_hashes"],
            raw["parent_block_hash"],
            raw["token_ids"],
            raw["block_size"],
            raw["lora_id"],
            raw["medium"],
            raw["lora_name"],
            raw.get("extra_keys"),
            raw.get("group_idx"),
        )
    if raw["type"] == "BlockRemoved":
        return WireBlockRemoved(raw["block_hashes"], raw["medium"], raw.get("group_idx"))
    return WireAllBlocksCleared()


def vllm_payloads() -> list[bytes]:
    out = []
    for name in FIXTURES:
        if name.startswith("vllm/"):
            out += [m[2] for m in live(name)]
    return out


def test_our_encoder_writes_vllms_bytes():
    """Every vLLM batch without session ids or lookahead (fields our encoder does not write)."""
    compared = 0
    for payload in vllm_payloads():
        ts, events, dp_rank = msgpack.unpackb(payload, strict_map_key=False)
        if any({"session_id", "lookahead_token_ids"} & set(e) for e in events):
            continue
        assert encode_batch([wire_event(e) for e in events], ts=ts, dp_rank=dp_rank) == payload
        compared += 1
    assert compared >= 8


async def test_our_publisher_replays_what_vllm_replays():
    name = "vllm/standard"
    recorded_live = live(name)
    request, reply = exchange(name, len(recorded_live) // 2)
    publisher = ZmqEventPublisher(port=0, replay_port=0)
    await publisher.start()
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(publisher.replay_endpoint)
    try:
        for message in recorded_live:
            publisher.publish_payload(message[2])
        await dealer.send_multipart(request)
        assert [await asyncio.wait_for(dealer.recv_multipart(), 2.0) for _ in reply] == reply
    finally:
        dealer.close(linger=0)
        ctx.term()
        await publisher.stop()
