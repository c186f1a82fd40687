"""The simulated engine's host tier (vLLM's CPU offloading as the router sees it): evicted blocks are
offloaded and reported as medium "CPU" stores, the host tier evicts its least recently used blocks,
a prompt loads the blocks after its cached prefix back at a quarter of their compute, and the
router indexes what the engine reports per tier."""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from extproc.cli import build_parser
from extproc.events.counters import EventCounters
from extproc.events.vllm import VllmEventDecoder, encode_batch
from extproc.events.zmq_publisher import VllmEventListener
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import (
    DEVICE_TIER,
    HOST_PINNED_TIER,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    StoredBlock,
    Worker,
    WorkerSpec,
)
from extproc.sim.engine import Engine, EngineConfig
from extproc.sim.mock_worker import add_mock_worker_arguments, config_from_args
from extproc.sim.prefix_cache import BlockTable, OffloadListener, PrefixCache
from extproc.sim.replay_router import KvEventTap
from extproc.sim.timing import prefill_ms
from tests.sim.replay_helpers import replay
from tests.sim.test_engine import prompt, run_until_idle

B = 4


class Recorder:
    """A KvCacheListener and OffloadListener that keeps every call."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_stored(self, parent_hash, block_hashes, token_ids, *, cache_salt=None) -> None:
        self.events.append(("stored", parent_hash, list(block_hashes)))

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        self.events.append(("removed", list(block_hashes)))

    def on_cleared(self) -> None:
        self.events.append(("cleared",))

    def on_offloaded(self, parent_hash, block_hashes, token_ids, *, cache_salt=None, medium="CPU") -> None:
        self.events.append(
            (medium, parent_hash, list(block_hashes), [list(t) for t in token_ids], cache_salt)
        )

    def on_offload_removed(self, block_hashes: Sequence[int], *, medium: str = "CPU") -> None:
        self.events.append((medium + " removed", list(block_hashes)))


def test_the_recorder_is_an_offload_listener():
    recorder: OffloadListener = Recorder()
    assert isinstance(recorder, OffloadListener)


def cached(cache: PrefixCache, hashes: list[int], tokens: list[int], salt: str | None = None) -> None:
    """Store `hashes` as one request does, then release them (cached, evictable)."""
    table = BlockTable()
    assert cache.allocate(table, hashes, len(hashes) * B, tokens, cache_salt=salt)
    cache.release(table)


def test_evicted_blocks_are_offloaded_with_their_parents_and_tokens():
    rec = Recorder()
    cache = PrefixCache(2, B, rec, num_host_blocks=3)
    cached(cache, [1, 2], list(range(8)), salt="s")
    rec.events.clear()
    cached(cache, [3, 4], list(range(100, 108)))  # evicts 2 then 1 (tail first)
    assert rec.events[1:3] == [
        ("CPU", 1, [2], [[4, 5, 6, 7]], "s"),
        ("CPU", None, [1], [[0, 1, 2, 3]], "s"),
    ]
    assert cache.num_host_cached == 2
    assert cache.match_host([1, 2, 3], 0, 3) == 2 and cache.match_host([1, 2], 1, 2) == 1
    assert cache.match_host([9, 1], 0, 2) == 0 and cache.match_host([1, 2], 0, 1) == 1
    rec.events.clear()
    cached(cache, [5, 6], list(range(200, 208)))  # evicts 4, 3: the host tier holds 3, drops 2
    assert rec.events[1:4] == [  # after the pool's removal, before its store
        ("CPU", 3, [4], [[104, 105, 106, 107]], None),
        ("CPU", None, [3], [[100, 101, 102, 103]], None),
        ("CPU removed", [2]),
    ]
    assert cache.match_host([1, 2], 0, 2) == 1


def test_a_block_back_in_the_host_tier_is_refreshed_not_reported_and_the_lru_follows_use():
    rec = Recorder()
    cache = PrefixCache(1, B, rec, num_host_blocks=2)
    cached(cache, [1], [0, 1, 2, 3])
    cached(cache, [2], [4, 5, 6, 7])  # 1 offloaded
    cache.touch_host([1, 42])  # 42: not held, ignored
    cached(cache, [1], [0, 1, 2, 3])  # back on the device (a new block), 2 offloaded
    rec.events.clear()
    cached(cache, [3], [8, 9, 10, 11])  # 1 evicted again: already in host memory, refreshed
    assert [e for e in rec.events if e[0] in ("CPU", "CPU removed")] == []
    cached(cache, [4], [12, 13, 14, 15])  # 3 offloaded: 2 is the least recently used
    assert rec.events[-2] == ("CPU removed", [2])


def test_a_block_copied_and_dropped_at_once_is_never_reported_and_unknown_tokens_are_not_offloaded():
    rec = Recorder()
    cache = PrefixCache(3, B, rec, num_host_blocks=1)
    cached(cache, [1, 2, 3], list(range(12)))
    rec.events.clear()
    cached(cache, [4, 5, 6], list(range(50, 62)))  # evicts 3, 2, 1 at once: the host keeps 1 only
    assert [e[:3] for e in rec.events if e[0].startswith("CPU")] == [("CPU", None, [1])]
    table = BlockTable()
    cache.allocate(table, [7, 8, 9], 12)  # no tokens given: nothing to describe
    cache.release(table)
    rec.events.clear()
    cached(cache, [10, 11, 12], list(range(70, 82)))
    assert [e for e in rec.events if e[0].startswith("CPU")] == []


def test_clearing_the_pool_leaves_the_host_tier():
    cache = PrefixCache(2, B, Recorder(), num_host_blocks=4)
    cached(cache, [1, 2], list(range(8)))
    cached(cache, [3, 4], list(range(10, 18)))
    cache.clear_cached()
    assert cache.num_host_cached == 2 and cache.num_cached_blocks == 0
    cached(cache, [5, 6], list(range(20, 28)))  # 3 and 4 were dropped, not evicted: not offloaded
    assert cache.num_host_cached == 2


def test_without_a_host_tier_nothing_is_offloaded():
    rec = Recorder()
    cache = PrefixCache(2, B, rec)
    cached(cache, [1, 2], list(range(8)))
    cached(cache, [3, 4], list(range(10, 18)))
    assert cache.num_host_cached == 0 and not [e for e in rec.events if e[0] == "CPU"]
    with pytest.raises(ValueError, match="num_host_blocks"):
        PrefixCache(2, B, num_host_blocks=-1)


@pytest.mark.parametrize(
    "change",
    [{"num_host_blocks": -1}, {"num_host_blocks": 1.5}, {"host_load_speedup": 0}, {"host_load_speedup": "4"}],
)
def test_engine_config_checks_the_host_tier(change):
    with pytest.raises(ValueError):
        EngineConfig(**change)


def engine(host_blocks: int, listener: object = None) -> Engine:
    config = EngineConfig(block_size=B, num_gpu_blocks=5, num_host_blocks=host_blocks)
    return Engine(config, listener)  # type: ignore[arg-type]


def test_a_prompt_loads_the_blocks_after_its_cached_prefix_from_the_host_at_a_quarter_of_their_compute():
    """a's 4 blocks, then b's 4 evict 3 of them (tail first) to the host; a's prompt again: 1 block
    cached on the device, 2 loaded from the host (the cap leaves its last block to compute), 4
    tokens computed: the pass prices 4 + ceil(8 / 4) = 6 prefill tokens."""
    for host in (0, 16):
        e = engine(host)
        e.add_request("a", prompt(16), 1, 0.0)
        run_until_idle(e)
        e.add_request("b", prompt(16, start=500), 1, 100.0)
        run_until_idle(e, 100.0)
        e.add_request("c", prompt(16), 1, 200.0)
        p = e.next_pass(200.0)
        assert p is not None
        (entry,) = p.entries
        if host:
            assert (entry.cached_tokens, entry.new_tokens, p.prefill_tokens) == (12, 4, 4 + math.ceil(8 / 4))
            assert p.duration_ms == pytest.approx(prefill_ms(6))
            assert e.cache.hit_tokens == 4  # the GPU prefix cache's own hits (vLLM's metric)
        else:
            assert (entry.cached_tokens, entry.new_tokens, p.prefill_tokens) == (4, 12, 12)


def test_the_router_indexes_what_the_engine_offloads_and_credits_it():
    events: list[KvEvent] = []
    e = engine(16, KvEventTap(Worker(0), B, events.append))
    e.add_request("a", prompt(16), 1, 0.0)
    run_until_idle(e)
    e.add_request("b", prompt(16, start=500), 1, 100.0)
    run_until_idle(e, 100.0)
    assert [ev.tier for ev in events].count(HOST_PINNED_TIER) == 3
    assert [ev.event_id for ev in events] == list(range(1, len(events) + 1))
    r = KvRouter(
        RouterConfig(block_size=B, prefill_load_model="none"), clock=lambda: 0.0, rng=random.Random(0)
    )
    r.add_worker(WorkerSpec(0))
    for ev in events:
        r.apply_event(ev)
    hashes = compute_block_hashes(prompt(16), B)
    assert r.tiers.match(r.indexer, hashes, r.find_matches(hashes)).blocks(Worker(0)) == {
        DEVICE_TIER: 1,
        HOST_PINNED_TIER: 3,
    }
    (load,) = r.get_potential_loads(prompt(16))
    assert load.overlap_blocks == 1 + 3 * 0.75


def test_a_replay_with_a_host_tier_serves_evicted_prefixes_from_it(tmp_path: Path):
    """One worker, a pool of 3 blocks: A, B, A again (3 blocks each). Without a host tier A's second
    run is computed again; with one, its evicted blocks come back from host memory."""
    rows = [(0.0, 192, 1, [1, 2, 3]), (1000.0, 192, 1, [4, 5, 6]), (2000.0, 192, 1, [1, 2, 3])]
    results = {}
    for host in (0, 8):
        config = EngineConfig(num_gpu_blocks=3, num_host_blocks=host)
        results[host] = replay(tmp_path, rows, engine=config, trace_block_size=64, mode="kv")
    plain, tiered = results[0], results[8]
    assert [r.cached_tokens for r in plain.records] == [0, 0, 0]
    assert [r.cached_tokens for r in tiered.records] == [0, 0, 128]  # capped: its last block is computed
    assert tiered.records[2].ttft_ms < plain.records[2].ttft_ms
    assert tiered.kv_events > plain.kv_events  # the offloads and host evictions were reported


def test_the_mock_workers_vllm_events_carry_the_offload_as_vllm_sends_it():
    """The ZMQ listener writes the host tier's changes as vLLM's offloading connector does (medium
    "CPU", own parent, tokens); our decoder reads them back into the host tier."""
    sent: list[list] = []
    listener = VllmEventListener(sent.append, B)
    listener.on_offloaded(7, [8], [[4, 5, 6, 7]])
    listener.on_offload_removed([8])
    decoder = VllmEventDecoder("w", B, counters=EventCounters())
    events = [e for batch in sent for e in decoder.decode(encode_batch(batch, ts=1.0)).events]
    local = compute_block_hashes([4, 5, 6, 7], B)[0]
    assert events == [
        BlocksStored(Worker("w"), (StoredBlock(8, local),), 7, tier=HOST_PINNED_TIER),
        BlocksRemoved(Worker("w"), (8,), tier=HOST_PINNED_TIER),
    ]


def test_the_mock_worker_and_the_replay_take_a_host_tier():
    parser = argparse.ArgumentParser()
    add_mock_worker_arguments(parser)
    config = config_from_args(parser.parse_args(["--num-host-blocks", "256"]))
    assert config.engine.num_host_blocks == 256
    assert config_from_args(parser.parse_args([])).engine.num_host_blocks == 0
    args = build_parser().parse_args(
        ["replay", "t.jsonl", "--num-host-blocks", "64", "--host-load-speedup", "2"]
    )
    assert (args.num_host_blocks, args.host_load_speedup) == (64, 2.0)
