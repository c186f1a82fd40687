"""extproc.compat.KvPushRouter against in-process mock workers: Dynamo's return shapes, pinning,
overrides, lifecycle, events; and its signatures checked against ai-dynamo-runtime 1.6.1's own."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from typing import Any

import pytest

from extproc.client import WorkerFailed
from extproc.compat import DistributedRuntime, KvPushRouter, KvRouterConfig
from extproc.config import ModelConfig, PickerConfig
from extproc.router import InvalidConfig, PinnedWorkerUnavailable, RouterConfig
from tests.nats.dynamo_helpers import require_dynamo
from tests.test_client import serve_workers, wait_for

MODEL = "demo-model"
TOKENS = list(range(1, 65))  # 4 blocks of 16


def make_router(workers, **settings) -> KvPushRouter:
    configs = tuple(w.config(MODEL) for w in workers)
    runtime = DistributedRuntime.detached(config=PickerConfig(RouterConfig(), configs, (ModelConfig(MODEL),)))
    endpoint = runtime.namespace("dynamo").component("backend").endpoint("generate")
    return KvPushRouter(endpoint, 16, KvRouterConfig(**settings))


async def test_loads_best_worker_and_lifecycle_have_dynamos_shapes():
    async with serve_workers(2) as workers, make_router(workers, use_kv_events=False) as router:
        loads = await router.get_potential_loads(TOKENS)
        assert [sorted(row) for row in loads] == [
            [
                "active_requests",
                "dp_rank",
                "potential_decode_blocks",
                "potential_prefill_tokens",
                "worker_id",
            ]
        ] * 2
        worker_id, dp_rank, overlap = await router.best_worker(TOKENS)  # a probe: nothing tracked
        assert (worker_id in {w.endpoint for w in workers}, dp_rank, overlap) == (True, 0, 0)
        assert router.router.is_idle()
        worker_id, overlap = await router.best_worker_id(TOKENS, request_id="r1")
        loads = {row["worker_id"]: row for row in await router.get_potential_loads(TOKENS)}
        assert loads[worker_id]["active_requests"] == 1
        assert loads[worker_id]["potential_prefill_tokens"] == 64  # its own prompt, still prefilling
        await router.mark_prefill_complete("r1")
        await router.free("r1")
        await router.free("r1")  # idempotent
        assert router.router.is_idle()
        assert await router.best_worker_id(TOKENS) == (worker_id, 4)  # predicted from the routing


async def test_generate_pins_worker_and_streams_engine_outputs():
    async with serve_workers(2) as workers, make_router(workers, use_kv_events=False) as router:
        target = workers[1].endpoint
        for pin in (target, None):  # pinned; then the router's own choice follows the cache
            stream = await router.generate(
                TOKENS,
                model=MODEL,
                stop_conditions={"max_tokens": 3},
                sampling_options={"temperature": 0.0},
                router_config_override={"overlap_score_weight": 2.0, "router_temperature": 0.0},
                worker_id=pin,
            )
            outputs = [r async for r in stream]
            assert stream.endpoint == target
            assert [sorted(o) for o in outputs] == [["finish_reason", "index", "text", "token_ids"]] * 3
            assert outputs[-1]["finish_reason"] == "length"
            assert all(o["token_ids"] for o in outputs)
        assert router.router.is_idle()


async def test_generate_errors_unknown_overrides_and_dropped_streams_free_the_request():
    async with serve_workers(1) as workers, make_router(workers, use_kv_events=False) as router:
        with pytest.raises(PinnedWorkerUnavailable):
            await router.generate(TOKENS, model=MODEL, worker_id="nobody")
        with pytest.raises(InvalidConfig, match="router_config_override"):
            await router.generate(TOKENS, model=MODEL, router_config_override={"temperature": 1.0})
        with pytest.raises(WorkerFailed) as failed:
            async for _ in await router.generate(TOKENS, model="another-model"):
                pass
        assert failed.value.status == 404
        stream = await router.generate(TOKENS, model=MODEL, dp_rank=0)
        assert not router.router.is_idle()
        del stream  # never read: freed, nothing sent
        assert router.router.is_idle()
        stream = await router.generate(TOKENS, model=MODEL, stop_conditions={"max_tokens": 100})
        await anext(stream)
        await stream.aclose()
        assert router.router.is_idle()


async def test_dump_events_is_dynamos_router_event_json():
    # use_kv_events (the default): the worker's ZMQ events
    async with serve_workers(1, kv_events=True) as workers, make_router(workers) as router:
        async for _ in await router.generate(TOKENS, model=MODEL, stop_conditions={"max_tokens": 1}):
            pass
        await wait_for(lambda: router.router.dump_events(), "the worker's stored event")
        dumped = await router.dump_events()
    assert isinstance(dumped, str)
    event = json.loads(dumped)[0]
    assert event["worker_id"] == workers[0].endpoint and event["event"]["dp_rank"] == 0
    assert set(event["event"]) == {"event_id", "dp_rank", "data"}
    assert len(event["event"]["data"]["stored"]["blocks"]) == 4


def dynamo_core() -> Any:
    """ai-dynamo-runtime 1.6.1's compiled module (the `compat` extra): missing, the test fails."""
    require_dynamo()
    return importlib.import_module("dynamo._core")


def dynamo_parameters(signature: str) -> dict[str, str | None]:
    """name -> default text (None: no default) of a `__text_signature__`, without $self, * and /."""
    params = [p.strip() for p in signature.strip("()").split(",")]
    named = [p.split("=", 1) for p in params if p and p not in ("$self", "*", "/")]
    return {p[0]: (p[1] if len(p) == 2 else None) for p in named}


def test_kv_router_config_takes_every_keyword_of_dynamos_and_says_which_do_nothing(caplog):
    core = dynamo_core()
    defaults = dynamo_parameters(core.KvRouterConfig.__text_signature__)
    KvRouterConfig(**{name: ast.literal_eval(value or "None") for name, value in defaults.items()})
    assert not caplog.records  # Dynamo's defaults: nothing to say
    KvRouterConfig(router_replica_sync=True, router_event_threads=8)
    assert [r.getMessage() for r in caplog.records] == [
        "KvRouterConfig(router_replica_sync=True) has no effect in extproc.compat; ignored",
        "KvRouterConfig(router_event_threads=8) has no effect in extproc.compat; ignored",
    ]
    with pytest.raises(TypeError, match="no_such_knob"):
        KvRouterConfig(no_such_knob=1)


@pytest.mark.parametrize(
    "method",
    ["generate", "best_worker", "get_potential_loads", "mark_prefill_complete", "free", "dump_events"],
)
def test_each_method_takes_dynamo_161s_parameters_in_its_order(method):
    """Positional parameters are a prefix of Dynamo's, keyword-only ones among Dynamo's; what is left
    off is listed in push_router.py's docstring."""
    core = dynamo_core()
    theirs = list(dynamo_parameters(getattr(core.KvRouter, method).__text_signature__))
    params = list(inspect.signature(getattr(KvPushRouter, method)).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    assert theirs[: len(positional)] == positional
    assert set(keyword_only) <= set(theirs)
    assert inspect.iscoroutinefunction(getattr(KvPushRouter, method))


def test_the_package_exports_exactly_its_listed_names():
    import extproc.compat

    assert extproc.compat.__all__ == [
        "Component",
        "DistributedRuntime",
        "Endpoint",
        "KvPushRouter",
        "KvRouter",
        "KvRouterConfig",
        "Namespace",
        "ResponseStream",
    ]
    assert extproc.compat.KvRouter is KvPushRouter


async def test_a_start_that_fails_closes_the_picker(monkeypatch):
    """`async with KvPushRouter(...)` whose event sources cannot start: nothing is left running
    (`__aexit__` is not called when `__aenter__` raises), and the router says it is closed."""
    import extproc.compat.push_router as push_router

    async def refused(config, picker):
        raise OSError("nats-server refused the connection")

    monkeypatch.setattr(push_router, "start_event_sources", refused)
    async with serve_workers(1) as workers:
        router = make_router(workers, use_kv_events=True)
        closed: list[bool] = []
        real_close = router._picker.close

        async def close() -> None:
            closed.append(True)
            await real_close()

        monkeypatch.setattr(router._picker, "close", close)
        with pytest.raises(OSError, match="refused"):
            async with router:
                pass
        assert closed == [True]
        with pytest.raises(RuntimeError, match="closed"):
            await router.start()
