"""Invariants of a router after fuzzed events or requests: its tree is sound and rebuilds from its dump."""

from __future__ import annotations

import random
from collections.abc import Iterable

from extproc.router import KvRouter, RadixTree, RouterConfig, WorkerSpec
from extproc.router.types import KvEvent
from tests.router.clock import FakeClock
from tests.router.test_radix import check_runs


def make_router(specs: Iterable[WorkerSpec], block_size: int, **config: object) -> KvRouter:
    return KvRouter(
        RouterConfig(block_size=block_size, use_kv_events=True, **config),  # type: ignore[arg-type]
        clock=FakeClock(),
        rng=random.Random(0),
        workers=list(specs),
    )


def rebuild(events: Iterable[KvEvent]) -> RadixTree:
    tree = RadixTree()
    for event in events:
        tree.apply_event(event)
    return tree


def entries(tree: RadixTree) -> list[tuple[str, str, int, tuple[int, ...]]]:
    return sorted(
        (type(w.worker_id).__name__, f"{w.worker_id}/{w.dp_rank}", e, p) for w, e, p in tree.entries()
    )


def check_tree(router: KvRouter) -> None:
    """The run tree's own invariants hold and `dump_events` rebuilds the same (worker, block) entries."""
    tree = router.indexer
    check_runs(tree)
    rebuilt = rebuild(router.dump_events())
    check_runs(rebuilt)
    assert entries(rebuilt) == entries(tree), "dump_events does not rebuild the tree"
    assert rebuilt.stats.unknown_parent == 0 and rebuilt.stats.unknown_removal == 0


def check_loads(router: KvRouter) -> None:
    """No worker's active load went negative."""
    for worker in router.workers():
        assert router.sequences.prefill_tokens(worker) >= 0, worker
        assert router.sequences.decode_blocks(worker) >= -1e-9, worker
