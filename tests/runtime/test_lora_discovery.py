"""LoRA adapters discovered from the workers' own model lists, on the bodies vLLM 0.33.0's and SGLang
0.5.23's code answers (`lora_models/models.json`, recorded by `lora_models/generate_fixtures.py`):
each adapter a worker lists becomes a model name requests may give, routed to that worker's model;
one unloaded goes on the next round; a worker that cannot be read keeps its last answer; names that
are already something else stay what they were.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from extproc.config import ConfigError, DiscoveryConfig, ModelConfig, WorkerConfig, load_config
from extproc.errors import UnknownModel
from extproc.picker.pipeline import EndpointPicker
from extproc.runtime import lora_discovery, wakeups
from extproc.runtime.lora_discovery import (
    MAX_NAME,
    MAX_NAMES_PER_WORKER,
    AdapterDiscovery,
    ModelsInvalid,
    names_in,
)
from extproc.runtime.server import start_picker

from ..picker_fixtures import MODEL, picker_config
from ..replica_helpers import until

MAX = MAX_NAMES_PER_WORKER
FIXTURES = Path(__file__).parent / "lora_models" / "models.json"
CASES = [
    (engine, case)
    for engine in ("vllm", "sglang")
    for case in json.loads(FIXTURES.read_text())[engine]["cases"]
]


@cache
def recorded() -> dict[str, Any]:
    return json.loads(FIXTURES.read_text())


def body(engine: str, case: str) -> bytes:
    return recorded()[engine]["cases"][case]["body"].encode()


def test_the_fixtures_name_the_engines_versions():
    assert (recorded()["vllm"]["version"], recorded()["sglang"]["version"]) == ("0.33.0", "0.5.23")


@pytest.mark.parametrize(("engine", "case"), CASES)
def test_the_adapters_of_each_engines_model_list_are_the_ones_it_was_given(engine, case):
    """vLLM's: each adapter it was given. SGLang's: none, though it lists them: it serves an adapter
    only as `MODEL:ADAPTER` or `lora_path` (a bare adapter name gets the base model there)."""
    given = list(recorded()[engine]["cases"][case]["adapters"])
    assert list(names_in(body(engine, case)).adapters) == (given if engine == "vllm" else [])


def card(name: Any, parent: Any = "llama") -> dict[str, Any]:
    return {"id": name, "object": "model", "parent": parent}


@pytest.mark.parametrize(
    ("data", "adapters"),
    [
        ([card("a"), card("a"), card("b")], ["a", "b"]),  # each once, in order
        ([card("a", None), card("b", 7), card(7), "x", None, card("")], []),
        ([{**card("s"), "owned_by": "sglang"}, {**card("v"), "owned_by": "vllm"}, card("o")], ["v", "o"]),
        (["x", None, card("a", None), card("b")], ["b"]),  # past cards that are not adapters
        ([card("x" * MAX_NAME), card("y" * (MAX_NAME + 1))], ["x" * MAX_NAME]),
        (
            [card(f"a{i}") for i in range(MAX_NAMES_PER_WORKER + 5)],
            [f"a{i}" for i in range(MAX_NAMES_PER_WORKER)],
        ),
    ],
)
def test_only_cards_with_a_parent_are_adapters_each_once_and_bounded(data, adapters):
    assert list(names_in(json.dumps({"object": "list", "data": data}).encode()).adapters) == adapters


@pytest.mark.parametrize(
    "raw", [b"", b"not json", b"\xff\xfe", b"[]", b'{"data": {}}', b'{"object": "list"}', b"[" * 100_000]
)
def test_a_body_that_is_no_model_list_is_refused(raw):
    with pytest.raises(ModelsInvalid):
        names_in(raw)


# --- against workers serving the engines' answers --------------------------------------------------


class ModelsWorker:
    """A worker's /v1/models: the answer it is set to (bytes, or an HTTP status)."""

    def __init__(self, answer: bytes | int) -> None:
        self.answer = answer
        self.reads = 0
        self.server: TestServer | None = None

    async def _models(self, _: web.Request) -> web.Response:
        self.reads += 1
        if isinstance(self.answer, int):
            return web.Response(status=self.answer)
        return web.Response(body=self.answer, content_type="application/json")

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        self.server = TestServer(app, host="127.0.0.1", port=0)
        await self.server.start_server()
        return f"127.0.0.1:{self.server.port}"


@pytest.fixture
async def workers() -> AsyncIterator[Callable[..., Any]]:
    started: list[ModelsWorker] = []

    async def make(*answers: bytes | int) -> tuple[list[ModelsWorker], list[str]]:
        made = [ModelsWorker(a) for a in answers]
        endpoints = [await w.start() for w in made]
        started.extend(made)
        return made, endpoints

    yield make
    for w in started:
        assert w.server is not None
        await w.server.close()


def picker_over(endpoints: list[str], **models: tuple[str, ...]) -> EndpointPicker:
    """A picker whose MODEL workers are `endpoints` (plus a model `other` without workers' lists)."""
    workers = tuple(WorkerConfig(f"w{i}", e, MODEL) for i, e in enumerate(endpoints))
    configured = (
        ModelConfig(MODEL, lora_adapters=models.get(MODEL, ())),
        ModelConfig("other", lora_adapters=models.get("other", ())),
    )
    other = WorkerConfig("o0", "127.0.0.1:9", "other")
    return EndpointPicker(replace(picker_config(0), workers=(*workers, other), models=configured))


async def read(picker: EndpointPicker, discovery: AdapterDiscovery | None = None) -> AdapterDiscovery:
    discovery = discovery or AdapterDiscovery(picker, DiscoveryConfig(lora_timeout_s=2.0))
    await discovery.read_once()
    return discovery


async def test_a_models_adapters_are_what_any_of_its_workers_lists_and_requests_may_name_them(workers):
    (w0, w1), endpoints = await workers(body("vllm", "static-and-loaded"), body("sglang", "lora-paths"))
    picker = picker_over(endpoints)
    try:
        discovery = await read(picker)
        assert sorted(picker.adapters(MODEL)) == ["chat-lora", "sql-lora"]
        pool, lora_name = picker.resolve_model("sql-lora")
        assert (pool.model, lora_name) == (MODEL, "sql-lora")
        # vLLM unloads sql-lora, SGLang stops listing adapters (--enable-lora off after a restart)
        w0.answer, w1.answer = body("vllm", "unloaded"), body("sglang", "base-only")
        await read(picker, discovery)
        assert picker.adapters(MODEL) == ["chat-lora"]
        with pytest.raises(UnknownModel):
            picker.resolve_model("sql-lora")
    finally:
        await discovery.stop()
        await picker.close()


async def test_an_adapter_named_for_another_base_is_still_this_workers_model(workers):
    """vLLM names a `--lora-modules` adapter's parent as given: another of the worker's served names."""
    _, endpoints = await workers(body("vllm", "named-base"))
    picker = picker_over(endpoints)
    try:
        discovery = await read(picker)
        assert picker.resolve_model("doc-lora")[0].model == MODEL
    finally:
        await discovery.stop()
        await picker.close()


async def test_a_worker_that_cannot_be_read_keeps_its_last_answer_and_is_logged_once(workers, caplog):
    (w0,), endpoints = await workers(body("vllm", "static-and-loaded"))
    picker = picker_over(endpoints)
    try:
        discovery = await read(picker)
        w0.answer = 503
        with caplog.at_level(logging.INFO, logger="extproc.lora_discovery"):
            await read(picker, discovery)
            assert any("HTTP 503" in r.getMessage() for r in caplog.records)  # at the first failure
            await read(picker, discovery)
            assert sorted(picker.adapters(MODEL)) == ["chat-lora", "sql-lora"]
            w0.answer = body("vllm", "base-only")
            await read(picker, discovery)
        assert picker.adapters(MODEL) == []
        lines = [r.getMessage() for r in caplog.records]
        assert (
            sum("HTTP 503" in line for line in lines) == 1
            and sum("answers again" in line for line in lines) == 1
        )
        assert w0.reads == 4
    finally:
        await discovery.stop()
        await picker.close()


async def test_a_worker_that_leaves_takes_its_adapters_with_it(workers):
    _, endpoints = await workers(body("vllm", "static-and-loaded"), body("vllm", "base-only"))
    picker = picker_over(endpoints)
    try:
        discovery = await read(picker)
        assert len(picker.adapters(MODEL)) == 2
        picker.set_workers(MODEL, [WorkerConfig("w1", endpoints[1], MODEL)])
        await read(picker, discovery)
        assert picker.adapters(MODEL) == []
    finally:
        await discovery.stop()
        await picker.close()


async def test_a_listed_name_that_is_a_model_or_another_models_adapter_stays_what_it_was(workers, caplog):
    cards = [card("other"), card("sql-lora"), card("mine")]
    _, endpoints = await workers(json.dumps({"object": "list", "data": cards}).encode())
    picker = picker_over(endpoints, other=("sql-lora",))
    try:
        with caplog.at_level(logging.WARNING, logger="extproc.picker"):
            discovery = await read(picker)
            assert sum("already" in r.getMessage() for r in caplog.records) == 2  # as they appear
            await read(picker, discovery)
        assert picker.adapters(MODEL) == ["mine"]
        assert (
            picker.resolve_model("sql-lora")[0].model == "other" and picker.resolve_model("other")[1] is None
        )
        warned = [r.getMessage() for r in caplog.records if "already" in r.getMessage()]
        assert (
            len(warned) == 2 and any("a model" in w for w in warned) and any("other's" in w for w in warned)
        )
    finally:
        await discovery.stop()
        await picker.close()


async def test_setting_a_models_adapters_says_which_came_and_went():
    picker = picker_over([], **{MODEL: ("pinned-lora",)})
    try:
        assert picker.set_discovered_names(MODEL, [], ["a", "b", "pinned-lora"]) == (["a", "b"], [])
        assert picker.set_discovered_names(MODEL, [], ["b", "c"]) == (["c"], ["a"])
        assert picker.set_discovered_names(MODEL, [], []) == ([], ["b", "c"])
        assert picker.adapters(MODEL) == ["pinned-lora"]
        with pytest.raises(UnknownModel) as raised:
            picker.set_discovered_names("nope", [], ["a"])
        assert raised.value.model == "nope" and raised.value.known == [MODEL, "other"]
    finally:
        await picker.close()


async def test_a_configured_adapter_stays_when_no_worker_lists_it(workers):
    _, endpoints = await workers(body("vllm", "base-only"))
    picker = picker_over(endpoints, **{MODEL: ("pinned-lora",)})
    try:
        discovery = await read(picker)
        assert picker.adapters(MODEL) == ["pinned-lora"]
    finally:
        await discovery.stop()
        await picker.close()


async def test_a_worker_that_does_not_answer_is_given_up_at_the_time_limit():
    """A worker that accepts the connection and never answers: the round ends at the time limit."""
    held = asyncio.Event()

    async def never(_: web.Request) -> web.Response:
        await held.wait()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/v1/models", never)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    picker = picker_over([f"127.0.0.1:{server.port}"])
    discovery = AdapterDiscovery(picker, DiscoveryConfig(lora_timeout_s=0.2))
    try:
        await asyncio.wait_for(discovery.read_once(), 5.0)
        (state,) = [s for s in discovery._states.values() if str(server.port) in s.url]
        assert state.ok is False and state.error == "no answer within 0.2 s"
    finally:
        held.set()
        await discovery.stop()
        await picker.close()
        await server.close()


async def test_a_model_list_over_its_bound_is_not_read(workers, monkeypatch):
    monkeypatch.setattr(lora_discovery, "MAX_MODELS_BYTES", 100)
    _, endpoints = await workers(body("sglang", "lora-paths"))
    picker = picker_over(endpoints)
    try:
        discovery = await read(picker)
        assert picker.adapters(MODEL) == []
        (state,) = [s for s in discovery._states.values() if s.url.endswith(f"{endpoints[0]}/v1/models")]
        assert state.ok is False and "over 100" in (state.error or "")
    finally:
        await discovery.stop()
        await picker.close()


async def test_serve_reads_the_workers_lists_on_its_interval(workers):
    (w0,), endpoints = await workers(body("vllm", "base-only"))
    config = replace(
        picker_config(0),
        workers=(WorkerConfig("w0", endpoints[0], MODEL),),
        port=0,
        health_port=0,
        discovery=DiscoveryConfig(lora_interval_s=0.05),
    )
    running = await start_picker(config)
    assert running.lora_discovery is not None
    task = running.lora_discovery._task
    try:
        await until(lambda: w0.reads >= 1, 5.0, "the first read")
        w0.answer = body("vllm", "static-and-loaded")  # POST /v1/load_lora_adapter, say
        await until(lambda: len(running.picker.adapters(MODEL)) == 2, 5.0, "the loaded adapters appear")
        # on its interval: 0.05 s between rounds, so ten rounds within seconds, and not hundreds
        reads = w0.reads
        await until(lambda: w0.reads >= reads + 10, 5.0, "ten more rounds")
        started = asyncio.get_running_loop().time()
        reads = w0.reads
        await until(lambda: asyncio.get_running_loop().time() - started >= 0.3, 5.0, "0.3 s")
        assert w0.reads - reads <= 0.3 / 0.05 + 5
    finally:
        await running.stop(0)
    assert task is not None and task.cancelled()


def test_the_interval_and_time_limit_come_from_flags_environment_or_file(tmp_path):
    assert (load_config([], environ={}).discovery.lora_interval_s, DiscoveryConfig().lora_timeout_s) == (
        30.0,
        2.0,
    )
    config = load_config(
        ["--lora-discovery-interval-ms", "250"], environ={"DYN_LORA_DISCOVERY_TIMEOUT_MS": "500"}
    ).discovery
    assert (config.lora_interval_s, config.lora_timeout_s) == (0.25, 0.5)
    path = tmp_path / "picker.yaml"
    path.write_text("discovery:\n  lora-discovery-interval-ms: 0\n")
    assert load_config(["--config", str(path)], environ={}).discovery.lora_interval_s == 0
    for argv, name in (
        (["--lora-discovery-interval-ms", "-1"], "lora-discovery-interval-ms=-1"),
        (["--lora-discovery-timeout-ms", "0"], "lora-discovery-timeout-ms"),
    ):
        with pytest.raises(ConfigError, match=name):
            load_config(argv, environ={})


async def test_off_starts_nothing():
    picker = picker_over([])
    try:
        assert await lora_discovery.start_lora_discovery(picker, DiscoveryConfig(lora_interval_s=0)) is None
    finally:
        await picker.close()


def test_the_rounds_keep_their_interval_on_serves_own_loop():
    """On serve's own loop, where sleeps between rounds are lazy (`wakeups`), rounds go on."""

    async def main() -> None:
        worker = ModelsWorker(body("vllm", "base-only"))
        endpoint = await worker.start()
        picker = picker_over([endpoint])
        discovery = AdapterDiscovery(picker, DiscoveryConfig(lora_interval_s=0.05))
        discovery.start()
        try:
            await until(lambda: worker.reads >= 4, 5.0, "four rounds")
        finally:
            await discovery.stop()
            await picker.close()
            assert worker.server is not None
            await worker.server.close()

    wakeups.run(main())


async def test_stopping_twice_is_stopping_once(workers):
    (worker,), endpoints = await workers(body("vllm", "base-only"))
    picker = picker_over(endpoints)
    discovery = AdapterDiscovery(picker, DiscoveryConfig(lora_interval_s=0.05))
    discovery.start()
    try:
        await until(lambda: worker.reads >= 1, 5.0, "a first read (its session open)")
        await discovery.stop()
        await discovery.stop()
    finally:
        await picker.close()


async def test_a_round_that_fails_is_logged_and_the_rounds_go_on(workers, caplog):
    _, endpoints = await workers(body("vllm", "static-and-loaded"))
    picker = picker_over(endpoints)
    discovery = AdapterDiscovery(picker, DiscoveryConfig(lora_interval_s=0.05))
    set_names = picker.set_discovered_names
    calls = 0

    def failing_once(model, aliases, adapters):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in a round")
        return set_names(model, aliases, adapters)

    picker.set_discovered_names = failing_once  # type: ignore[method-assign]
    discovery.start()
    try:
        await until(lambda: len(picker.adapters(MODEL)) == 2, 5.0, "a later round's adapters")
        assert any("lora-discovery: a round failed" in r.getMessage() for r in caplog.records)
    finally:
        await discovery.stop()
        await picker.close()
