"""Offloaded KV from real engine bytes: SGLang 0.5.23's CPU tier copy (`tests/events/engines/`,
recorded from its own KVCacheEventRecorder and ZmqEventPublisher) decodes into the host tier, is
credited as Dynamo does, and its removal empties that tier only. (Dynamo 1.6.1's relay of vLLM's CPU
and DISK media: tests/nats/test_dynamo_plane.py.)"""

from __future__ import annotations

import random

import pytest

from extproc.events.counters import EventCounters
from extproc.events.vllm import VllmEventDecoder, parse_frames
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import DEVICE_TIER, HOST_PINNED_TIER, KvEvent, WorkerSpec
from tests.events.test_engine_fixtures import BS, live, worker

SALTED_NODE = list(range(5000, 5032))  # the node SGLang copied to its CPU tier (salt "salt-A")
SALTED_CHILD = list(range(5032, 5048))


def batches(name: str) -> list[list[KvEvent]]:
    w = worker(name)
    counters = EventCounters()
    decoder = VllmEventDecoder(w.worker_id, BS, counters=counters, default_dp_rank=w.dp_rank)
    out = []
    for message in live(name):
        frame = parse_frames(message, counters)
        assert frame is not None
        out.append(decoder.decode(frame.payload).events)
    assert counters["vllm.tier_event"] == 2  # the CPU copy and its removal
    return out


def router(name: str) -> KvRouter:
    r = KvRouter(
        RouterConfig(block_size=BS, prefill_load_model="none"), clock=lambda: 0.0, rng=random.Random(0)
    )
    r.add_worker(WorkerSpec(worker(name).worker_id))
    return r


def tiers(r: KvRouter, tokens: list[int]) -> dict[str, int]:
    """The one worker's matched blocks per tier for the salted prompt `tokens`."""
    hashes = compute_block_hashes(tokens, BS, namespace="salt-A")
    (w,) = r.workers()
    return r.tiers.match(r.indexer, hashes, r.find_matches(hashes)).blocks(w)


@pytest.mark.parametrize("name", ["sglang/default-format", "sglang/dynamo-format"])
def test_sglangs_cpu_copy_is_the_host_tier_and_counts_as_device_while_the_device_holds_it(name):
    r = router(name)
    recorded = batches(name)
    for events in recorded[:3]:
        for event in events:
            r.apply_event(event)
    host = r.tiers.index(HOST_PINNED_TIER)
    assert host is not None and host.num_blocks(worker(name)) == 2
    assert tiers(r, SALTED_NODE + SALTED_CHILD) == {DEVICE_TIER: 3}  # on the device too: device
    for events in recorded[3:]:
        for event in events:
            r.apply_event(event)
    assert r.tiers.num_blocks(worker(name)) == {}  # the CPU copy's removal
    assert tiers(r, SALTED_NODE + SALTED_CHILD) == {DEVICE_TIER: 2}  # the child left the device


@pytest.mark.parametrize("name", ["sglang/default-format", "sglang/dynamo-format"])
def test_the_cpu_copy_alone_is_credited_three_quarters_of_a_device_block(name):
    r = router(name)
    (host_store,) = [e for e in batches(name)[2] if e.tier == HOST_PINNED_TIER]
    r.apply_event(host_store)
    assert tiers(r, SALTED_NODE) == {HOST_PINNED_TIER: 2}
    (load,) = r.get_potential_loads(SALTED_NODE, cache_salt="salt-A")
    assert load.overlap_blocks == 1.5  # 2 blocks at 0.75
    assert load.prefill_tokens == 32 - 24
