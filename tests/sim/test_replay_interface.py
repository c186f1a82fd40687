"""The router in a replay sees only what a real router sees: decisions, lifecycle calls and KV events."""

import ast
import gc
import pathlib
import random
import sys
from collections.abc import Sequence

from extproc.router.config import RouterConfig
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored, Worker, WorkerSpec
from extproc.sim import replay_router
from extproc.sim.engine import Engine, EngineConfig
from extproc.sim.prefix_cache import PrefixCache
from extproc.sim.replay import Replayer
from extproc.sim.replay_router import KvRouterAdapter, ReplayRouter, RouteResult

from .replay_helpers import replay, replayer

ENGINE = EngineConfig(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=256)
ROWS = [(t * 7, 40 + t, 3, [t % 3, 100 + t, 200 + t]) for t in range(30)]


class SpyRouter:
    """Round robin that records every call and checks that its arguments are plain data."""

    def __init__(self, config, workers, clock_s, rng) -> None:
        assert isinstance(config, RouterConfig) and isinstance(rng, random.Random)
        assert all(isinstance(w, WorkerSpec) for w in workers)
        self.workers = [w.workers()[0] for w in workers]
        self.clock_s = clock_s
        self.calls: list[str] = []
        self.n = 0

    waiting = 0

    def released(self) -> list[RouteResult]:
        return []

    def route(
        self, request_id: str, local_hashes: Sequence[int], isl: int, output_tokens: int
    ) -> RouteResult:
        assert isinstance(request_id, str) and isinstance(isl, int) and isinstance(output_tokens, int)
        assert all(isinstance(h, int) for h in local_hashes)
        self.calls.append("route")
        self.n += 1
        return RouteResult(request_id, self.workers[self.n % len(self.workers)], 0, 0)

    def on_first_token(self, request_id: str) -> None:
        assert isinstance(request_id, str)
        self.calls.append("first")

    def on_end(self, request_id: str) -> None:
        assert isinstance(request_id, str)
        self.calls.append("end")

    def on_kv_event(self, event) -> None:
        assert isinstance(event, BlocksStored | BlocksRemoved | AllBlocksCleared)
        assert isinstance(event.worker, Worker)
        self.calls.append("event")


def test_any_replay_router_drives_the_replay_through_decisions_lifecycle_and_events_only(tmp_path):
    spy: list[SpyRouter] = []

    def factory(config, workers, clock_s, rng):
        spy.append(SpyRouter(config, workers, clock_s, rng))
        router: ReplayRouter = spy[0]  # the Protocol is all the replayer needs
        return router

    run = replayer(tmp_path, ROWS, engine=ENGINE, workers=3)
    result = Replayer(run.requests, run.config, router_factory=factory).run()
    calls = spy[0].calls
    assert calls.count("route") == calls.count("first") == calls.count("end") == len(ROWS)
    assert calls.count("event") > 0
    assert all(r.end_ms is not None for r in result.records)


def test_the_real_router_holds_no_reference_to_any_engine(tmp_path):
    run = replayer(tmp_path, ROWS, engine=ENGINE, workers=3, mode="kv")
    run.run()
    adapter = run.router
    assert isinstance(adapter, KvRouterAdapter)
    # Module globals are the interpreter's, not the router's: a function's __globals__ leads to every
    # module, and from there to whatever any test left in a cache (an engine's mock worker, once)
    globals_of_modules = {id(vars(m)) for m in list(sys.modules.values()) if m is not None}
    seen: set[int] = set()
    stack: list[object] = [adapter]
    forbidden = (Engine, PrefixCache, Replayer)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | type(gc)) or id(obj) in globals_of_modules:
            continue
        seen.add(id(obj))
        assert not isinstance(obj, forbidden), f"the router reaches a {type(obj).__name__}"
        stack.extend(gc.get_referents(obj))
    assert len(seen) > 100  # it did walk the router's tree, sequences and config


def test_the_router_seam_imports_nothing_of_the_engines():
    tree = ast.parse(pathlib.Path(replay_router.__file__).read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in modules if m and m.startswith("extproc.")} <= {
        "extproc.router.config",
        "extproc.router.disagg",
        "extproc.router.hashing",
        "extproc.router.queue",
        "extproc.router.router",
        "extproc.router.tiers",
        "extproc.router.types",
    }


def test_the_same_seed_replays_the_same_decisions(tmp_path):
    a = replay(tmp_path, ROWS, engine=ENGINE, workers=3, mode="random", seed=5)
    b = replay(tmp_path, ROWS, engine=ENGINE, workers=3, mode="random", seed=5)
    c = replay(tmp_path, ROWS, engine=ENGINE, workers=3, mode="random", seed=6)
    assert [r.worker for r in a.records] == [r.worker for r in b.records]
    assert [r.worker for r in a.records] != [r.worker for r in c.records]
