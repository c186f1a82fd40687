"""KV events in the replay: stored and evicted blocks keep the router's tree equal to the engines' pools."""

import random

import pytest

from extproc.router.types import BlocksRemoved, BlocksStored
from extproc.sim.engine import EngineConfig

from .replay_helpers import replayer

ENGINE = EngineConfig(block_size=16, num_gpu_blocks=40, max_num_batched_tokens=128)


def churn(seed: int, count: int = 80) -> list:
    """Requests sharing a few prefixes, more content than the pools hold: evictions all along."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(4)] for _ in range(5)]
    rows = []
    t = 0
    for i in range(count):
        t += rng.choice([0, 1, 5, 20, 60])
        ids = rng.choice(prefixes)[: rng.randrange(1, 5)] + [
            10_000 + 10 * i + k for k in range(rng.randrange(1, 5))
        ]
        rows.append((t, len(ids) * 16 - rng.randrange(16), rng.randrange(1, 20), ids))
    return rows


def tree_blocks(router, worker) -> set[int]:
    """Engine block ids the router's tree holds for `worker` (replaying its own dump)."""
    held: set[int] = set()
    for event in router.indexer.dump_events():
        if event.worker != worker:
            continue
        if isinstance(event, BlocksStored):
            held |= {b.engine_hash for b in event.blocks}
        elif isinstance(event, BlocksRemoved):
            held -= set(event.engine_hashes)
    return held


@pytest.mark.parametrize("lag_ms", [0.0, 7.5])
def test_evictions_reach_the_router_and_its_tree_equals_every_engines_pool(tmp_path, lag_ms):
    events = []
    run = replayer(tmp_path, churn(1), engine=ENGINE, workers=2, mode="kv", kv_event_lag_ms=lag_ms)
    router = run.router.router
    apply = router.apply_event

    def spy(event):
        events.append(event)
        apply(event)

    router.apply_event = spy  # type: ignore[method-assign]
    result = run.run()
    assert sum(isinstance(e, BlocksRemoved) for e in events) > 10  # the pools really overflowed
    for worker, engine in zip(router.workers(), run.engines, strict=True):
        pool = set(engine.cache._ref_counts)  # every full block in the pool, active or cached
        assert pool, "the engine should still cache blocks"
        assert tree_blocks(router, worker) == pool
    assert result.kv_events == len(events)
    assert router.is_idle()


def test_approximate_mode_gets_no_kv_events_and_predicts_the_cache_from_its_decisions(tmp_path):
    run = replayer(tmp_path, churn(3), engine=ENGINE, workers=2, mode="kv", router={"use_kv_events": False})
    result = run.run()
    router = run.router.router
    assert router.dump_events() == []  # nothing the engines reported
    assert router.dump_events(include_predicted=True)  # what it predicted from its own decisions
    assert sum(r.overlap_blocks for r in result.records) > 0
