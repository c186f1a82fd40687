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
from functools import cache, partial
from pathlib import Path
from typing import Any

import msgpack
import pytest

from extproc.events.counters import EventCounters
from extproc.events.vllm import VllmEventDecoder, parse_frames
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import Worker
from tests.events.test_engine_fixtures import (
    LOUD,
    Frames,
    decoded_blocks,
    fills_a_gap_from_its_replay,
    frames,
    rebuilds_from_its_replay,
)

WIRE = Path(__file__).parent / "engines" / "engine-wire"
W0 = Worker("w0")


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


@pytest.mark.parametrize("release", RELEASES)
async def test_a_releases_replay_rebuilds_the_router_to_what_the_engine_holds(engine, release):
    final = manifest()["releases"][release]["final"]
    await rebuilds_from_its_replay(engine, W0, final, *exchange(release, 0))


@pytest.mark.parametrize("release", RELEASES)
async def test_a_releases_replay_from_the_middle_fills_a_gap_in_its_live_frames(engine, release):
    final = manifest()["releases"][release]["final"]
    await fills_a_gap_from_its_replay(engine, W0, final, live(release), partial(exchange, release))
