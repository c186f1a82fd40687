"""Tiered KV (extproc/router/tiers.py): offloaded blocks indexed per tier and credited as Dynamo does.

Hand computations use block size 4 and the prefill load model `none` (Dynamo's cost: weight *
(active prefill + uncached tokens) / block size + decode blocks), so every number is checkable.
"""

from __future__ import annotations

import random

import pytest

from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.tiers import (
    LOWER_TIERS,
    TierIndex,
    TierMatch,
    tier_of_medium,
    tier_of_name,
)
from extproc.router.types import (
    DEVICE_TIER,
    DISK_TIER,
    EXTERNAL_TIER,
    HOST_PINNED_TIER,
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    StoredBlock,
    Worker,
    WorkerSpec,
)

BS = 4
A, B, C = Worker("a"), Worker("b"), Worker("c")
TOKENS = list(range(100, 132))  # 8 blocks
H = compute_block_hashes(TOKENS, BS)


def ids(worker: Worker, first: int, last: int) -> list[int]:
    """Engine ids of blocks first..last-1 of TOKENS on `worker` (workers name them differently)."""
    base = {A: 1000, B: 2000, C: 3000}[worker]
    return [base + i for i in range(first, last)]


def store(
    worker: Worker, first: int, last: int, tier: str = DEVICE_TIER, *, parent: bool = True
) -> BlocksStored:
    """Blocks first..last-1 of TOKENS, under the worker's id of block first-1 (the root for 0)."""
    blocks = tuple(
        StoredBlock(e, H[i]) for e, i in zip(ids(worker, first, last), range(first, last), strict=True)
    )
    before = ids(worker, first - 1, first)[0] if first and parent else None
    return BlocksStored(worker, blocks, before, tier=tier)


def removed(worker: Worker, first: int, last: int, tier: str = DEVICE_TIER) -> BlocksRemoved:
    return BlocksRemoved(worker, tuple(ids(worker, first, last)), tier=tier)


def router(*workers: Worker, **config: object) -> KvRouter:
    cfg = RouterConfig(block_size=BS, prefill_load_model="none", **config)  # type: ignore[arg-type]
    r = KvRouter(cfg, clock=lambda: 0.0, rng=random.Random(0))
    for w in workers:
        r.add_worker(WorkerSpec(w.worker_id))
    return r


def tiers_of(r: KvRouter, prompt: list[int] = H) -> dict[Worker, dict[str, int]]:
    found = r.tiers.match(r.indexer, prompt, r.find_matches(prompt))
    workers = set(found.device) | {w for hits in found.tiers.values() for w in hits}
    return {w: found.blocks(w) for w in sorted(workers)}


def costs(r: KvRouter, tokens: list[int] = TOKENS) -> dict[Worker, float]:
    return {c.worker: c.cost for c in r.best_worker(tokens).costs}


# --- media and tier names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        ("GPU", DEVICE_TIER),
        ("device", DEVICE_TIER),
        ("CPU", HOST_PINNED_TIER),
        ("CPU_PINNED", HOST_PINNED_TIER),
        ("cpu_tier1", HOST_PINNED_TIER),
        ("CPU_TIER2", DISK_TIER),
        ("DISK", DISK_TIER),
        ("NVME", DISK_TIER),
        ("STORAGE", DISK_TIER),
        ("EXTERNAL", EXTERNAL_TIER),
        ("NETWORK", EXTERNAL_TIER),
        ("REMOTE", EXTERNAL_TIER),
        ("SHARED", EXTERNAL_TIER),
        ("HBM", None),
    ],
)
def test_media_map_to_dynamos_storage_tiers(medium, tier):
    assert tier_of_medium(medium) == tier


def test_dynamo_tier_names():
    assert [tier_of_name(t) for t in ("device", *LOWER_TIERS, "Host_Pinned", "g2")] == [
        "device",
        "host_pinned",
        "disk",
        "external",
        None,
        None,
    ]
    assert LOWER_TIERS == (HOST_PINNED_TIER, DISK_TIER, EXTERNAL_TIER)  # the query order


# --- one tier's index ----------------------------------------------------------------------------


def test_a_tier_index_walks_consecutive_blocks_from_each_start():
    index = TierIndex()
    index.apply_event(store(A, 0, 3, HOST_PINNED_TIER))
    index.apply_event(store(A, 4, 6, HOST_PINNED_TIER))  # block 3 is missing: a gap
    assert len(index) == 5 and index.num_blocks(A) == 5 and index.workers() == [A]
    assert index.walk(H, {A: (0, None)}) == {A: (3, 1002)}
    assert index.walk(H, {A: (4, 1003)}) == {A: (6, 1005)}
    assert index.walk(H, {A: (3, 1002)}) == {A: (3, 1002)}  # block 3 is not in this tier
    assert index.walk(H[:2], {A: (0, None)}) == {A: (2, 1001)}  # the prompt ends first
    assert index.walk(H, {B: (0, None)}) == {B: (0, None)}


def test_workers_naming_the_same_blocks_differently_walk_apart():
    index = TierIndex()
    index.apply_event(store(A, 0, 4, DISK_TIER))
    index.apply_event(store(B, 0, 2, DISK_TIER))
    index.apply_event(store(C, 0, 3, DISK_TIER))
    assert index.walk(H, {A: (0, None), B: (0, None), C: (0, None)}) == {
        A: (4, 1003),
        B: (2, 2001),
        C: (3, 3002),
    }


def test_stores_are_idempotent_and_the_first_mapping_wins():
    index = TierIndex()
    index.apply_event(store(A, 0, 2, HOST_PINNED_TIER))
    index.apply_event(store(A, 0, 2, HOST_PINNED_TIER))
    assert len(index) == 2
    # the same id under another parent, and the same block under another id: ignored
    index.apply_event(BlocksStored(A, (StoredBlock(1001, H[5]),), 77, tier=HOST_PINNED_TIER))
    index.apply_event(BlocksStored(A, (StoredBlock(9999, H[1]),), 1000, tier=HOST_PINNED_TIER))
    assert len(index) == 2
    assert index.walk(H, {A: (0, None)}) == {A: (2, 1001)}
    index.apply_event(removed(A, 1, 2, HOST_PINNED_TIER))
    assert index.walk(H, {A: (0, None)}) == {A: (1, 1000)}
    index.apply_event(BlocksRemoved(A, (9999, 1001), tier=HOST_PINNED_TIER))  # unknown ids: ignored
    assert len(index) == 1
    index.apply_event(
        BlocksRemoved(A, (9999, 1000), tier=HOST_PINNED_TIER)
    )  # an unknown id, then a known one
    assert len(index) == 0


def test_removal_and_clear_leave_other_workers_and_empty_workers_go():
    index = TierIndex()
    index.apply_event(store(A, 0, 2, HOST_PINNED_TIER))
    index.apply_event(store(B, 0, 2, HOST_PINNED_TIER))
    index.apply_event(removed(A, 0, 2, HOST_PINNED_TIER))
    assert index.workers() == [B] and index.num_blocks(A) == 0
    assert index.walk(H, {A: (0, None), B: (0, None)}) == {A: (0, None), B: (2, 2001)}
    index.apply_event(removed(C, 0, 1, HOST_PINNED_TIER))  # a worker never seen
    index.apply_event(AllBlocksCleared(B, tier=HOST_PINNED_TIER))
    assert len(index) == 0 and index.workers() == []
    index.clear_worker(B)  # twice: nothing left
    index.apply_event(BlocksStored(C, (), None, tier=HOST_PINNED_TIER))  # an empty store holds nothing
    assert index.workers() == []


def test_a_shared_edge_survives_until_its_last_holder_goes():
    index = TierIndex()
    for w in (A, B):
        index.apply_event(BlocksStored(w, (StoredBlock(5, H[0]),), None, tier=DISK_TIER))
    index.apply_event(BlocksRemoved(A, (5,), tier=DISK_TIER))
    assert index.walk(H, {A: (0, None), B: (0, None)}) == {A: (0, None), B: (1, 5)}
    index.clear_worker(B)
    assert index.walk(H, {B: (0, None)}) == {B: (0, None)}
    index.apply_event(BlocksStored(A, (StoredBlock(5, H[0]),), None, tier=DISK_TIER))
    assert index.walk(H, {A: (0, None)}) == {A: (1, 5)}
    index.apply_event(BlocksStored(B, (StoredBlock(6, H[0]),), None, tier=DISK_TIER))
    index.clear_worker(A)  # B still holds the edge
    assert index.walk(H, {A: (0, None), B: (0, None)}) == {A: (0, None), B: (1, 6)}


# --- the tiered match: one prefix across tiers -----------------------------------------------------


def test_the_host_tier_continues_the_device_prefix():
    r = router(A, B)
    r.apply_event(store(A, 0, 3))
    r.apply_event(store(A, 3, 6, HOST_PINNED_TIER))  # offloaded after the device prefix
    r.apply_event(store(B, 0, 4, HOST_PINNED_TIER))  # host only, from the root
    assert tiers_of(r) == {A: {DEVICE_TIER: 3, HOST_PINNED_TIER: 3}, B: {HOST_PINNED_TIER: 4}}


def test_a_block_on_the_device_and_the_host_counts_as_device():
    r = router(A)
    r.apply_event(store(A, 0, 4))
    r.apply_event(store(A, 0, 6, HOST_PINNED_TIER))  # a host copy of the device blocks and two more
    assert tiers_of(r) == {A: {DEVICE_TIER: 4, HOST_PINNED_TIER: 2}}
    assert r.best_worker(TOKENS).overlap_blocks == 4  # the decision reports the device's


def test_offloaded_chunks_arrive_in_any_order_with_their_own_parents():
    """vLLM's connector: 'Events are self-contained (own parent), so key order is free'."""
    r = router(A)
    r.apply_event(store(A, 0, 2))
    r.apply_event(store(A, 4, 6, HOST_PINNED_TIER))  # a later chunk first: no match past the gap yet
    assert tiers_of(r) == {A: {DEVICE_TIER: 2}}
    r.apply_event(store(A, 2, 4, HOST_PINNED_TIER))  # its parent (block 1) is on the device only
    assert tiers_of(r) == {A: {DEVICE_TIER: 2, HOST_PINNED_TIER: 4}}


def test_disk_continues_where_host_stopped_and_external_after_disk():
    r = router(A, B)
    r.apply_event(store(A, 0, 1))
    r.apply_event(store(A, 1, 3, HOST_PINNED_TIER))
    r.apply_event(store(A, 3, 5, DISK_TIER))
    r.apply_event(store(A, 5, 8, EXTERNAL_TIER))
    r.apply_event(store(B, 0, 2, DISK_TIER))  # no device nor host block: disk from the root
    r.apply_event(store(B, 2, 3, EXTERNAL_TIER))
    assert tiers_of(r) == {
        A: {DEVICE_TIER: 1, HOST_PINNED_TIER: 2, DISK_TIER: 2, EXTERNAL_TIER: 3},
        B: {DISK_TIER: 2, EXTERNAL_TIER: 1},
    }


def test_a_lower_tier_block_past_a_gap_counts_nothing():
    r = router(A)
    r.apply_event(store(A, 0, 2))
    r.apply_event(store(A, 3, 5, HOST_PINNED_TIER))  # block 2 is nowhere
    r.apply_event(store(A, 2, 3, DISK_TIER))  # ... now on disk: host comes before disk, so still a gap
    assert tiers_of(r) == {A: {DEVICE_TIER: 2, DISK_TIER: 1}}
    prompt = compute_block_hashes(list(range(500, 516)), BS)
    assert tiers_of(r, prompt) == {}  # another prompt


def test_device_matches_ending_in_later_runs_and_at_run_boundaries_are_continued():
    """The device tree splits where workers branch: A's match ends inside a second run, B's exactly
    where a run ends (A's continues), C holds more than the prompt and d branches where it ends."""
    longer = compute_block_hashes([*TOKENS, *range(132, 140)], BS)  # H and two blocks more
    r = router(A, B, C)
    r.apply_event(store(A, 0, 6))
    r.apply_event(store(B, 0, 2))
    r.apply_event(
        BlocksStored(B, (StoredBlock(2999, compute_block_hashes(list(range(900, 904)), BS)[0]),), 2001)
    )
    r.apply_event(BlocksStored(C, tuple(StoredBlock(3000 + i, h) for i, h in enumerate(longer)), None))
    r.apply_event(store(A, 6, 8, HOST_PINNED_TIER))
    r.apply_event(store(B, 2, 5, HOST_PINNED_TIER))
    r.apply_event(BlocksStored(C, (StoredBlock(7777, H[0]),), None, tier=DISK_TIER))  # under its device copy
    other = compute_block_hashes(list(range(950, 954)), BS)[0]
    d = Worker("d")  # the prompt, then its own block: the run of C's last blocks splits where H ends
    r.apply_event(BlocksStored(d, tuple(StoredBlock(4000 + i, h) for i, h in enumerate([*H, other])), None))
    assert tiers_of(r) == {
        A: {DEVICE_TIER: 6, HOST_PINNED_TIER: 2},
        B: {DEVICE_TIER: 2, HOST_PINNED_TIER: 3},
        C: {DEVICE_TIER: 8},
        d: {DEVICE_TIER: 8},
    }
    assert tiers_of(r, H[:4]) == {
        A: {DEVICE_TIER: 4},
        B: {DEVICE_TIER: 2, HOST_PINNED_TIER: 2},
        C: {DEVICE_TIER: 4},
        d: {DEVICE_TIER: 4},
    }


def test_a_lower_tier_block_under_a_device_alias_does_not_continue():
    """A device block stored twice under two ids is named by the first (the radix tree's alias);
    a host block whose parent is the second id is not credited (a limit: engines name a block once)."""
    r = router(A)
    r.apply_event(store(A, 0, 2))
    r.apply_event(BlocksStored(A, (StoredBlock(6001, H[1]),), 1000))  # block 1 again, another id
    r.apply_event(BlocksStored(A, (StoredBlock(7, H[2]),), 6001, tier=HOST_PINNED_TIER))
    assert tiers_of(r, H[:3]) == {A: {DEVICE_TIER: 2}}
    r.apply_event(BlocksStored(A, (StoredBlock(7, H[2]),), 1001, tier=HOST_PINNED_TIER))  # id 7 is held
    assert tiers_of(r, H[:3]) == {A: {DEVICE_TIER: 2}}
    r.apply_event(BlocksStored(A, (StoredBlock(8, H[2]),), 1001, tier=HOST_PINNED_TIER))
    assert tiers_of(r, H[:3]) == {A: {DEVICE_TIER: 2, HOST_PINNED_TIER: 1}}


def test_device_prefixes_of_several_workers_end_in_different_runs():
    r = router(A, B, C)
    r.apply_event(store(A, 0, 6))
    r.apply_event(store(B, 0, 2))
    r.apply_event(store(B, 2, 4, HOST_PINNED_TIER))
    r.apply_event(store(C, 0, 5, HOST_PINNED_TIER))
    r.apply_event(store(A, 6, 8, HOST_PINNED_TIER))
    assert tiers_of(r) == {
        A: {DEVICE_TIER: 6, HOST_PINNED_TIER: 2},
        B: {DEVICE_TIER: 2, HOST_PINNED_TIER: 2},
        C: {HOST_PINNED_TIER: 5},
    }


# --- the credit ----------------------------------------------------------------------------------


def test_credits_weigh_each_tier_as_dynamo_does():
    """Dynamo's own example (its cache-hit estimates test): device 2, host 3, disk 4 and external 5
    blocks with host 0.5 and disk 0.25 make 2 + 1.5 + 0.25 * 9 = 5.75 cached blocks."""
    longer = compute_block_hashes(list(range(100, 156)), BS)  # 14 blocks
    r = router(A)
    parent = None
    for tier, first, last in (
        (DEVICE_TIER, 0, 2),
        (HOST_PINNED_TIER, 2, 5),
        (DISK_TIER, 5, 9),
        (EXTERNAL_TIER, 9, 14),
    ):
        r.apply_event(
            BlocksStored(A, tuple(StoredBlock(i, longer[i]) for i in range(first, last)), parent, tier=tier)
        )
        parent = last - 1
    found = r.tiers.credit(r.indexer, longer, r.find_matches(longer), 0.5, 0.25)
    assert found.blocks(A) == {DEVICE_TIER: 2, HOST_PINNED_TIER: 3, DISK_TIER: 4, EXTERNAL_TIER: 5}
    assert found == {A: 5.75}
    assert isinstance(found, TierMatch) and found.device == {A: 2}
    assert found.blocks(B) == {}


def test_default_credits_and_a_zero_weight():
    r = router(A, B)
    r.apply_event(store(A, 0, 4, HOST_PINNED_TIER))
    r.apply_event(store(B, 0, 4, DISK_TIER))
    assert r.tiers.credit(r.indexer, H, {}) == {A: 3.0, B: 1.0}  # 0.75 and 0.25 per block
    assert r.tiers.credit(r.indexer, H, {}, 0.0, 0.0) == {}
    assert r.tiers.credit(r.indexer, H, {}, 1.0, 0.0) == {A: 4.0}


def test_the_cost_credits_host_blocks_by_hand():
    """8 blocks of 4 tokens, nothing in flight. A holds 2 on the device and 4 more in host memory:
    credit 2 + 0.75 * 4 = 5 blocks, 32 - 20 = 12 uncached tokens, cost 12 / 4 + 8 new blocks = 11.
    B holds the 2 device blocks only: 24 / 4 + 8 = 14. C nothing: 32 / 4 + 8 = 16."""
    r = router(A, B, C)
    r.apply_event(store(A, 0, 2))
    r.apply_event(store(A, 2, 6, HOST_PINNED_TIER))
    r.apply_event(store(B, 0, 2))
    assert costs(r) == {A: 11.0, B: 14.0, C: 16.0}
    decision = r.best_worker(TOKENS, request_id="r1")
    assert decision.worker == A and decision.overlap_blocks == 2 and decision.best_overlap_blocks == 2
    assert r.sequences.prefill_tokens(A) == 12  # tracked as credited
    loads = {load.worker: load for load in r.get_potential_loads(TOKENS)}
    assert loads[A].overlap_blocks == 5.0 and loads[A].prefill_tokens == 12 + 12


def test_the_credit_rounds_to_whole_tokens_as_dynamos_cached_token_estimate():
    r = router(A, host_cache_hit_weight=0.3)
    r.apply_event(store(A, 0, 1, HOST_PINNED_TIER))  # 0.3 blocks = 1.2 tokens -> 1 cached token
    assert costs(r) == {A: 31 / 4 + 8}


def test_zero_credits_drop_the_tiers_from_the_cost():
    r = router(A, B, host_cache_hit_weight=0.0, disk_cache_hit_weight=0.0)
    r.apply_event(store(A, 0, 8, HOST_PINNED_TIER))
    r.apply_event(store(B, 0, 8, DISK_TIER))
    assert costs(r) == {A: 16.0, B: 16.0}


def test_tiers_need_kv_rules_and_a_weight():
    r = router(A, B, overlap_score_weight=0.0)
    r.apply_event(store(A, 0, 8, HOST_PINNED_TIER))
    assert costs(r) == {A: 8.0, B: 8.0}  # pure load balancing: no lookups


# --- removal, clear, reset per tier --------------------------------------------------------------


def test_removal_and_clear_apply_to_their_tier_only():
    r = router(A)
    r.apply_event(store(A, 0, 4))
    r.apply_event(store(A, 0, 6, HOST_PINNED_TIER))
    r.apply_event(store(A, 6, 8, DISK_TIER))
    r.apply_event(removed(A, 2, 4))  # evicted from the device: the host copy remains
    assert tiers_of(r) == {A: {DEVICE_TIER: 2, HOST_PINNED_TIER: 4, DISK_TIER: 2}}
    r.apply_event(removed(A, 4, 6, HOST_PINNED_TIER))
    assert tiers_of(r) == {A: {DEVICE_TIER: 2, HOST_PINNED_TIER: 2}}
    r.apply_event(AllBlocksCleared(A, tier=HOST_PINNED_TIER))
    assert tiers_of(r) == {A: {DEVICE_TIER: 2}} and r.tiers.num_blocks(A) == {DISK_TIER: 2}
    r.apply_event(AllBlocksCleared(A))  # the device's own clear leaves the lower tiers
    assert r.tiers.num_blocks(A) == {DISK_TIER: 2} and r.indexer.num_blocks(A) == 0


def test_a_worker_reset_or_removal_clears_every_tier():
    r = router(A, B)
    for w in (A, B):
        r.apply_event(store(w, 0, 2))
        r.apply_event(store(w, 2, 4, HOST_PINNED_TIER))
        r.apply_event(store(w, 4, 6, EXTERNAL_TIER))
    r.reset_worker_cache(A)
    assert tiers_of(r) == {B: {DEVICE_TIER: 2, HOST_PINNED_TIER: 2, EXTERNAL_TIER: 2}}
    r.remove_worker(B.worker_id)
    assert len(r.tiers) == 0 and not r.tiers.active


def test_lower_tier_events_never_reach_the_device_tree_nor_its_dump():
    r = router(A)
    assert r.apply_event(store(A, 3, 5, HOST_PINNED_TIER))  # no known parent: still applied (True)
    assert r.indexer.num_blocks() == 0 and r.dump_events() == []
    assert r.tiers.index(HOST_PINNED_TIER) is not None and r.tiers.index(DISK_TIER) is None
    assert r.apply_event(BlocksStored(A, (StoredBlock(1, H[0]),), None, tier="g9"))  # unknown: ignored
    assert r.tiers.num_blocks(A) == {HOST_PINNED_TIER: 2}


# --- every decision path credits the tiers --------------------------------------------------------


@pytest.mark.parametrize("model", ["none", "timing"])
def test_the_fleet_fast_path_credits_tiers_as_the_full_scan(model):
    """Past 32 workers a decision visits only matching workers and the load order; a worker whose
    only match is offloaded must be among them."""
    for seed in range(6):
        rng = random.Random(seed)
        fleet = [Worker(f"w{i:02}") for i in range(40)]
        routers = []
        for full in (False, True):
            cfg = RouterConfig(block_size=BS, prefill_load_model=model)  # type: ignore[arg-type]
            r = KvRouter(cfg, clock=lambda: 1.0, rng=random.Random(seed))
            for w in fleet:
                r.add_worker(WorkerSpec(w.worker_id))
            if full:
                r.full_scan_max_workers = 10**6
            routers.append(r)
        events = []
        for w in rng.sample(fleet, 6):
            cut = rng.randrange(0, 4)
            if cut:
                events.append(BlocksStored(w, tuple(StoredBlock(i, H[i]) for i in range(cut)), None))
            tier = rng.choice(LOWER_TIERS)
            events.append(
                BlocksStored(
                    w, tuple(StoredBlock(i, H[i]) for i in range(cut, 8)), cut - 1 if cut else None, tier=tier
                )
            )
        for r in routers:
            for e in events:
                r.apply_event(e)
        for i in range(12):
            tokens = TOKENS[: 4 * rng.randrange(1, 9)]
            picks = [r.best_worker(tokens, request_id=f"q{i}") for r in routers]
            assert picks[0].worker == picks[1].worker and picks[0].cost == picks[1].cost, (seed, i)
