"""Engine metrics: vLLM's and SGLang's real /metrics text parsed, the engines' own KV usage deciding
the decode-blocks busy threshold while fresh, the router's own view when stale, and the scraper
against a real HTTP server on 127.0.0.1 (fixtures: engine_metrics/, from vLLM 0.33.0's and SGLang
0.5.23's own metric code, see engine_metrics/generate_fixtures.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from extproc.admin.api import make_admin_app
from extproc.config import EngineMetricsConfig, WorkerConfig
from extproc.events.counters import EventCounters
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import AllWorkersBusy, KvRouter, RouterConfig, Worker, WorkerSpec
from extproc.runtime.engine_metrics import (
    _SAMPLE,
    EngineLoad,
    EngineMetricsScraper,
    _samples,
    loads_by_dp_rank,
    parse_engine_metrics,
)

from ..picker_fixtures import MODEL, picker_config
from ..router.clock import FakeClock

FIXTURES = Path(__file__).parent / "engine_metrics"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = [
    (engine, spec["version"], case, expected)
    for engine, spec in MANIFEST.items()
    for case, expected in spec["cases"].items()
]


def fixture(engine: str, version: str, case: str) -> bytes:
    return (FIXTURES / f"{engine}-{version}" / f"{case}.prom").read_bytes()


@pytest.mark.parametrize(
    ("engine", "version", "case", "expected"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES]
)
def test_real_exposition_text_parses_to_what_the_engine_was_told(engine, version, case, expected) -> None:
    parsed = parse_engine_metrics(fixture(engine, version, case))
    assert parsed == {
        rank: EngineLoad(engine, load["kv_usage"], load["running"], load["waiting"])
        for rank, load in expected.items()
    }


def test_ranks_map_to_dp_ranks_or_combine() -> None:
    parsed = parse_engine_metrics(fixture("vllm", "0.33.0", "data-parallel-2"))
    per_rank = loads_by_dp_rank(parsed, (0, 1))
    assert per_rank[1] == EngineLoad("vllm", 0.875, 11, 4) and per_rank[0].kv_usage == 0.25
    one = loads_by_dp_rank(parsed, (0,))  # one worker in front of both engines: mean usage, summed requests
    assert one == {0: EngineLoad("vllm", (0.25 + 0.875) / 2, 13, 4)}


def test_wanted_lines_are_found_as_one_pass_of_the_pattern_finds_them() -> None:
    """The parser looks only where a wanted name starts a line; it must find exactly the samples
    one `finditer` pass over the whole body finds, in order, whatever surrounds them."""
    rng = random.Random(24)
    lines = [line for e, v, c, _ in CASES for line in fixture(e, v, c).split(b"\n")]
    tricky = [
        b"vllm:num_requests_running 3",  # at the very start of a body, no labels
        b'vllm:num_requests_waiting_by_reason{reason="x"} 9',  # a wanted name's prefix
        b"xvllm:kv_cache_usage_perc 0.5",  # not at a line start
        b"# vllm:kv_cache_usage_perc 0.5",
        b'sglang:token_usage{dp_rank="1"}\t0.25\r',
        b"vllm:kv_cache_usage_perc",  # no value
        b'sglang:num_queue_reqs{a="}"} 2',  # a brace inside a label value
        b"",
    ]
    for _ in range(300):
        pick = lambda: rng.choice(lines if rng.random() < 0.7 else tricky)  # noqa: E731
        body = b"\n".join(pick() for _ in range(rng.randrange(12)))
        expected = [m.span() for m in _SAMPLE.finditer(body)]
        assert [m.span() for m in _samples(body)] == expected, body


def test_older_vllm_name_other_metrics_and_garbage_are_handled() -> None:
    body = (
        b"# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
        b"# TYPE vllm:gpu_cache_usage_perc gauge\n"
        b'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        b'vllm:num_requests_running{model_name="m"} NaN\n'
        b'vllm:num_requests_waiting{model_name="m"} -3\n'
        b'vllm:num_requests_waiting_by_reason{model_name="m",reason="capacity"} 9.0\n'
        b"vllm:kv_cache_usage_percent 0.99\n"
        b"vllm:num_requests_running not-a-number\n"
    )
    assert parse_engine_metrics(body) == {"": EngineLoad("vllm", 0.5, None, None)}
    assert parse_engine_metrics(b"<html>404</html>") == {}
    assert parse_engine_metrics(b"") == {}


# --- the router: the engine's numbers in the busy threshold -------------------------------------


def router(clock: FakeClock, **config) -> KvRouter:
    config.setdefault("block_size", 16)
    config.setdefault("prefill_load_model", "none")
    config.setdefault("use_kv_events", False)
    return KvRouter(RouterConfig(**config), clock=clock, workers=[WorkerSpec("w0"), WorkerSpec("w1")])


def test_engine_reporting_95_percent_is_busy_though_the_router_routed_nothing_there() -> None:
    clock = FakeClock()
    r = router(clock, active_decode_blocks_threshold=0.9)
    r.set_reported_load(Worker("w0"), kv_usage=0.95, running=7, waiting=3, max_age_s=3.0)
    for i in range(6):
        assert r.best_worker(list(range(i, i + 64)), request_id=f"r{i}").worker == Worker("w1")
    r.set_reported_load(Worker("w1"), kv_usage=0.99, max_age_s=3.0)
    with pytest.raises(AllWorkersBusy):
        r.best_worker(list(range(64)))
    assert not r.has_capacity()


def test_a_fresh_low_report_overrides_the_routers_own_blocks_and_a_stale_one_falls_back() -> None:
    clock = FakeClock()
    r = KvRouter(
        RouterConfig(block_size=16, prefill_load_model="none", active_decode_blocks_threshold=0.5),
        clock=clock,
        workers=[WorkerSpec("w0", total_blocks=8), WorkerSpec("w1", total_blocks=8)],
    )
    r.best_worker(list(range(16 * 6)), request_id="big", pinned_worker="w0")  # 6 of 8 blocks: busy by itself
    assert r.best_worker(list(range(16))).worker == Worker("w1")
    r.set_reported_load(Worker("w0"), kv_usage=0.1, max_age_s=3.0)  # the engine says 10 %
    assert r.best_worker(list(range(16)), pinned_worker="w0").worker == Worker("w0")
    clock.advance(3.5)  # stale: the router's own view again
    assert r.reported.fresh_kv_usage(Worker("w0")) is None
    assert r.best_worker(list(range(16))).worker == Worker("w1")


def test_reports_for_unknown_workers_are_ignored_and_removal_forgets_them() -> None:
    r = router(FakeClock(), active_decode_blocks_threshold=0.9)
    assert r.set_reported_load(Worker("nobody"), kv_usage=1.0, max_age_s=3.0) is None
    assert r.set_reported_load(Worker("w0", 3), kv_usage=1.0, max_age_s=3.0) is None
    r.set_reported_load(Worker("w0"), kv_usage=1.0, max_age_s=3.0)
    r.remove_worker("w0")
    assert r.reported.get(Worker("w0")) is None


def test_prefill_thresholds_ignore_waiting_requests() -> None:
    r = router(FakeClock(), active_prefill_tokens_threshold=1000)
    r.set_reported_load(Worker("w0"), kv_usage=0.0, running=50, waiting=40, max_age_s=3.0)
    assert r.best_worker(list(range(16)), pinned_worker="w0").worker == Worker("w0")


# --- the scraper against real HTTP --------------------------------------------------------------


async def serve(handler: Callable[[web.Request], web.StreamResponse]) -> AsyncIterator[TestServer]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def vllm_worker() -> AsyncIterator[TestServer]:
    body = fixture("vllm", "0.33.0", "single-engine")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    async for server in serve(metrics):
        yield server


def one_worker_picker(endpoint: str, **router) -> EndpointPicker:
    config = picker_config(1, **router)
    worker = dataclasses.replace(config.workers[0], endpoint=endpoint)
    return EndpointPicker(dataclasses.replace(config, workers=(worker,)))


async def test_scraped_vllm_metrics_make_an_idle_looking_worker_busy_and_show_in_debug_workers(
    vllm_worker: TestServer,
) -> None:
    picker = one_worker_picker(f"127.0.0.1:{vllm_worker.port}", active_decode_blocks_threshold=0.9)
    scraper = EngineMetricsScraper(picker, EngineMetricsConfig(interval_s=1.0, timeout_s=2.0))
    try:
        await scraper.scrape_once()
        router = picker.pools[MODEL].router
        report = router.reported.get(Worker("w0"))
        assert report is not None and (report.kv_usage, report.running, report.waiting) == (0.95, 7, 3)
        assert router.sequences.decode_blocks(Worker("w0")) == 0  # the router routed nothing there
        with pytest.raises(AllWorkersBusy):
            router.best_worker(list(range(32)))

        counters = EventCounters()
        app = make_admin_app(
            picker,
            EventSources(RouterFeed(picker.routers_by_worker(), counters), counters),
            engine_metrics=scraper,
        )
        async with TestClient(TestServer(app)) as client:
            answer = await (await client.get("/debug/workers")).json()
        entry = answer["workers"][0]
        assert entry["engine_load"]["kv_usage"] == 0.95 and entry["engine_load"]["stale"] is False
        assert entry["engine_metrics"]["state"] == "ok" and entry["engine_metrics"]["engine"] == "vllm"
        assert entry["busy_view"] == "engine"
    finally:
        await scraper.stop()


async def test_an_endpoint_without_metrics_costs_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    async def not_found(_request: web.Request) -> web.Response:
        return web.Response(status=404, text="Not Found")

    async for server in serve(not_found):
        picker = one_worker_picker(f"127.0.0.1:{server.port}")
        scraper = EngineMetricsScraper(picker, EngineMetricsConfig(interval_s=1.0, timeout_s=2.0))
        try:
            with caplog.at_level(logging.INFO, logger="extproc.engine_metrics"):
                for _ in range(4):
                    await scraper.scrape_once()
            lines = [r for r in caplog.records if r.name == "extproc.engine_metrics"]
            assert len(lines) == 1 and "HTTP 404" in lines[0].getMessage()
            state = scraper.state(picker.pools[MODEL].all_workers()["w0"])
            assert state is not None and state.ok is False and state.failures == 4
            assert picker.pools[MODEL].router.reported.get(Worker("w0")) is None
        finally:
            await scraper.stop()


async def test_a_hostile_endpoint_is_bounded_in_size_and_time() -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to refuse early
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"# " + b"x" * 65_534 + b"\n")
        return response

    async def slow(_request: web.Request) -> web.Response:
        await asyncio.sleep(5)  # an endpoint slower than the scrape's 0.2 s timeout
        return web.Response(text="vllm:kv_cache_usage_perc 1.0\n")

    async for server in serve(huge):
        picker = one_worker_picker(f"127.0.0.1:{server.port}")
        worker = picker.pools[MODEL].all_workers()["w0"]
        scraper = EngineMetricsScraper(picker, EngineMetricsConfig(timeout_s=2.0, max_bytes=256 * 1024))
        try:
            await scraper.scrape_once()
            state = scraper.state(worker)
            assert state is not None and state.ok is False and "over 262144" in (state.error or "")
        finally:
            await scraper.stop()
    async for server in serve(slow):
        picker = one_worker_picker(f"127.0.0.1:{server.port}")
        worker = picker.pools[MODEL].all_workers()["w0"]
        scraper = EngineMetricsScraper(picker, EngineMetricsConfig(timeout_s=0.2))
        try:
            await scraper.scrape_once()
            state = scraper.state(worker)
            assert state is not None and state.ok is False and "within 0.2 s" in (state.error or "")
        finally:
            await scraper.stop()


def test_metrics_url_follows_the_worker_or_the_configured_port_and_path() -> None:
    picker = EndpointPicker(picker_config(1))
    worker = WorkerConfig("w", "[fd00::5]:8000", MODEL)
    assert (
        EngineMetricsScraper(picker, EngineMetricsConfig()).url_of(worker) == "http://[fd00::5]:8000/metrics"
    )
    other = EngineMetricsScraper(picker, EngineMetricsConfig(port=9100, path="/engine/metrics"))
    assert other.url_of(worker) == "http://[fd00::5]:9100/engine/metrics"


def test_flags_environment_and_checks() -> None:
    from extproc.config import ConfigError, load_config

    assert load_config([], environ={}).engine_metrics == EngineMetricsConfig()
    config = load_config(
        ["--engine-metrics-interval-ms", "250", "--engine-metrics-port", "9100"],
        environ={"DYN_ENGINE_METRICS_PATH": "/m"},
    ).engine_metrics
    assert (config.interval_s, config.stale_after_s, config.port, config.path) == (0.25, 0.75, 9100, "/m")
    assert not load_config(["--engine-metrics-interval-ms", "0"], environ={}).engine_metrics.enabled
    for argv in (["--engine-metrics-interval-ms", "-1"], ["--engine-metrics-path", "metrics"]):
        with pytest.raises(ConfigError, match="engine-metrics"):
            load_config(argv, environ={})
