"""The picker against the KV event bytes of older vLLM and SGLang releases (`engines/engine-wire/`).

Fleets run the engine they deployed, not the newest. Each release's own event structs and
`ZmqEventPublisher` (vLLM's `vllm/distributed/kv_events.py`, SGLang's `sglang/srt/disaggregation/
kv_events.py`, from the source archives on PyPI) sent the recorded bytes
(`engines/generate_engine_wire.py`): vLLM's tagged msgpack arrays through 0.20 and maps from 0.25,
five to fifteen fields, the replay end marker with the topic frame from 0.30; SGLang 0.4.7's and
0.5.10's arrays of five and six fields, with negative block ids. For each:

- every live batch decodes to exactly the blocks the script asked the publisher to send;
- the recorded replay, served verbatim, rebuilds a real `KvRouter` through the real
  `ZmqEventSubscriber` to what the engine holds, and the replay from the middle fills a gap;
- what a release cannot say is handled as documented: before vLLM 0.18 (and in these SGLang
  releases) a LoRA block names its adapter by number only (dropped, counted
  `vllm.lora_without_name`) and a salted block carries no salt (indexed as plain tokens, the same
  tokens asked with the salt match nothing).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import msgpack
import pytest

from extproc.events.counters import EventCounters
from extproc.events.vllm import VllmEventDecoder, parse_frames
from extproc.events.zmq_subscriber import ZmqEndpoint, ZmqEventSubscriber
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import Worker
from tests.events.test_engine_fixtures import LOUD, TIMINGS, Frames, Recorded, decoded_blocks, engine, frames
from tests.events.test_zmq import RouterSink, wait_until
from tests.events.zmq_fakes import FakeEngine

WIRE = Path(__file__).parent / "engines" / "engine-wire"
W0 = Worker("w0")
__all__ = ["engine"]  # the FakeEngine fixture, shared with test_engine_fixtures.py


@cache
def manifest() -> dict[str, Any]:
    return json.loads((WIRE / "manifest.json").read_text())


RELEASES = list(manifest()["releases"])
BS = manifest()["router_block_size"]


@cache
def recording(release: str) -> dict[str, Any]:
    return json.loads((WIRE.parent / manifest()["releases"][release]["file"]).read_text())


def live(release: str) -> list[Frames]:
    return [frames(m) for m in recording(release)["live"]]


def exchange(release: str, start: int) -> tuple[Frames, list[Frames]]:
    (found,) = [r for r in recording(release)["replays"] if r["start"] == start]
    return frames(found["request"]), [frames(m) for m in found["reply"]]


def local_hash(block: dict[str, Any]) -> int:
    (h,) = compute_block_hashes(
        block["tokens"], BS, lora_name=block["lora_name"], namespace=block["cache_salt"]
    )
    return h


def first_event(release: str) -> Any:
    payload = live(release)[0][2]
    return msgpack.unpackb(payload, strict_map_key=False)[1][0]


def test_the_releases_their_sources_and_both_wire_shapes_are_recorded():
    vllm = ["vllm-0.9.2", "vllm-0.11.0", "vllm-0.18.1", "vllm-0.20.2", "vllm-0.25.1", "vllm-0.30.0"]
    assert [*vllm, "sglang-0.4.7", "sglang-0.5.10"] == RELEASES
    for release, entry in manifest()["releases"].items():
        assert entry["sdist"] == f"{release}.tar.gz" and len(entry["sdist_sha256"]) == 64
        assert len(recording(release)["live"]) == len(entry["batches"]) == 5
        assert [r["start"] for r in recording(release)["replays"]] == [0, 2]
    arrays = [r for r in RELEASES if isinstance(first_event(r), list)]
    assert arrays == [*vllm[:4], "sglang-0.4.7", "sglang-0.5.10"]  # vLLM maps from 0.25: both paths run
    assert first_event("vllm-0.9.2")[0] == "BlockStored" and len(first_event("vllm-0.9.2")) == 6
    assert first_event("sglang-0.4.7")[1][0] < 0  # SGLang's signed block ids
    markers = {r: exchange(r, 0)[1][-1] for r in RELEASES}
    assert {r for r, m in markers.items() if len(m) == 4} == {"vllm-0.30.0"}  # [b"", topic, END, b""]
    assert {r for r, m in markers.items() if len(m) == 3} == set(RELEASES) - {"vllm-0.30.0"}


@pytest.mark.parametrize("release", RELEASES)
def test_every_batch_of_a_release_decodes_to_the_blocks_it_was_asked_to_store(release):
    counters = EventCounters()
    decoder = VllmEventDecoder(W0.worker_id, BS, counters=counters)
    expects = manifest()["releases"][release]["batches"]
    for seq, (message, expected) in enumerate(zip(live(release), expects, strict=True)):
        frame = parse_frames(message, counters)
        assert frame is not None and frame.seq == seq and frame.topic == b""
        before = counters.snapshot()
        batch = decoder.decode(frame.payload)
        assert batch.valid and batch.dp_rank == 0
        want = [(b["engine_id"], b["parent"], local_hash(b)) for b in expected["stored"]]
        assert decoded_blocks(batch.events) == (want, expected["removed"], expected["cleared"]), seq
        after = counters.snapshot()
        changed = {k: after.get(k, 0) - before.get(k, 0) for k in LOUD}
        assert {k: n for k, n in changed.items() if n} == expected["counters"], seq


def make_router() -> KvRouter:
    return KvRouter(RouterConfig(block_size=BS, use_kv_events=True), clock=lambda: 0.0)


def assert_holds_the_engines_cache(router: KvRouter, release: str) -> None:
    final = manifest()["releases"][release]["final"]
    assert router.indexer.num_blocks(W0) == final["num_blocks"]
    for chain in final["chains"]:
        query = compute_block_hashes(
            chain["tokens"], BS, lora_name=chain["lora_name"], namespace=chain["cache_salt"]
        )
        assert router.indexer.find_matches(query).get(W0, 0) == chain["blocks"], chain["note"]


async def subscriber(engine: FakeEngine, router: KvRouter, counters: EventCounters) -> ZmqEventSubscriber:
    endpoint = ZmqEndpoint(W0, engine.pub_endpoint, engine.replay_endpoint)
    sub = ZmqEventSubscriber(endpoint, RouterSink(router), block_size=BS, counters=counters, timings=TIMINGS)
    await sub.start()
    return sub


@pytest.mark.parametrize("release", RELEASES)
async def test_a_releases_replay_rebuilds_the_router_to_what_the_engine_holds(engine, release):
    request, reply = exchange(release, 0)
    engine.script = Recorded(release, {0: reply})
    router, counters = make_router(), EventCounters()
    sub = await subscriber(engine, router, counters)
    try:
        await wait_until(lambda: sub.status.up, what="rebuilt from the engine's replay")
        assert sub.status.reason == f"rebuilt from replay ({len(reply) - 1} batches)" and sub.status.complete
        assert engine.requests == [request]
        assert_holds_the_engines_cache(router, release)
        assert counters["zmq.replay_malformed"] == 0
    finally:
        await sub.stop()


@pytest.mark.parametrize("release", RELEASES)
async def test_a_releases_replay_from_the_middle_fills_a_gap_in_its_live_frames(engine, release):
    messages = live(release)
    middle = len(messages) // 2
    request, reply = exchange(release, middle)
    engine.script = Recorded(release, {0: [reply[-1]], middle: reply})  # its end marker: nothing yet
    router, counters = make_router(), EventCounters()
    sub = await subscriber(engine, router, counters)
    try:
        await wait_until(lambda: sub.status.up, what="rebuilt from an empty buffer")
        await engine.wait_subscribed()
        for message in messages[:middle] + messages[-1:]:  # batches middle..n-2 never arrive live
            await engine.publish(message)
        await wait_until(lambda: sub.status.last_seq == len(messages) - 1, what="the last batch")
        assert engine.requests[1] == request and engine.script.unexpected == []
        assert counters["zmq.gap"] == 1 and counters["zmq.unfilled_gap"] == 0
        assert_holds_the_engines_cache(router, release)
    finally:
        await sub.stop()
