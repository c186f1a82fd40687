"""The Inference Extension's pool gauges on /metrics, from engine metrics scraped over HTTP: the
bodies vLLM 0.33.0's own code writes (`tests/runtime/engine_metrics/`, one engine and two
data-parallel ranks) and a worker whose metrics cannot be read. Names and labels as llm-d's endpoint
picker exports them (`extproc/admin/inference_extension_metrics.py` names its source)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from extproc.admin.api import make_admin_app
from extproc.config import EngineMetricsConfig, ModelConfig, WorkerConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.events.counters import EventCounters
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker
from extproc.runtime.engine_metrics import EngineMetricsScraper

from ..config.test_inference_extension import CANARY, objective, rewrite
from ..picker_fixtures import MODEL, chat_body, picker_config
from ..runtime.test_engine_metrics import fixture

GAUGES = (
    "inference_pool_average_kv_cache_utilization",
    "inference_pool_average_queue_size",
    "inference_pool_average_running_requests",
    "inference_pool_ready_pods",
)


async def server(body: bytes | None) -> TestServer:
    async def metrics(_request: web.Request) -> web.Response:
        if body is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    started = TestServer(app, host="127.0.0.1", port=0)
    await started.start_server()
    return started


@pytest.fixture
async def engines() -> AsyncIterator[list[TestServer]]:
    """vLLM with one engine (KV 0.95, 7 running, 3 waiting), vLLM with two data-parallel ranks
    ((0.25, 2, 0) and (0.875, 11, 4)), and a worker whose /metrics answers 404."""
    servers = [
        await server(fixture("vllm", "0.33.0", "single-engine")),
        await server(fixture("vllm", "0.33.0", "data-parallel-2")),
        await server(None),
    ]
    yield servers
    for s in servers:
        await s.close()


def picker_for(engines: list[TestServer], **extension: object) -> EndpointPicker:
    workers = (
        WorkerConfig("w0", f"127.0.0.1:{engines[0].port}", MODEL),
        WorkerConfig("w1", f"127.0.0.1:{engines[1].port}", MODEL, dp_ranks=(0, 1)),
        WorkerConfig("w2", f"127.0.0.1:{engines[2].port}", MODEL),
    )
    config = dataclasses.replace(picker_config(1), workers=workers, **extension)  # type: ignore[arg-type]
    return EndpointPicker(config)


async def scraped(picker: EndpointPicker) -> dict[str, list[tuple[dict[str, str], float]]]:
    scraper = EngineMetricsScraper(picker, EngineMetricsConfig(interval_s=1.0, timeout_s=2.0))
    try:
        await scraper.scrape_once()
        counters = EventCounters()
        sources = EventSources(RouterFeed(picker.routers_by_worker(), counters), counters)
        app = make_admin_app(picker, sources, engine_metrics=scraper)
        async with TestClient(TestServer(app)) as client:
            text = await (await client.get("/metrics")).text()
    finally:
        await scraper.stop()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


async def test_the_pool_gauges_average_the_ready_workers_and_list_every_pods_queue(engines) -> None:
    picker = picker_for(engines)
    try:
        found = await scraped(picker)
    finally:
        await picker.close()
    values = {name: found[name] for name in GAUGES}
    # ready: the three engines whose metrics are fresh (w1 is two pods, its ranks); w2 never answered
    assert values["inference_pool_ready_pods"] == [({"name": MODEL}, 3.0)]
    ((labels, kv),) = values["inference_pool_average_kv_cache_utilization"]
    assert labels == {"name": MODEL} and kv == pytest.approx((0.95 + 0.25 + 0.875) / 3)
    assert values["inference_pool_average_queue_size"] == [({"name": MODEL}, pytest.approx(7 / 3))]
    assert values["inference_pool_average_running_requests"] == [({"name": MODEL}, pytest.approx(20 / 3))]
    per_pod = {labels["model_server_pod"]: v for labels, v in found["inference_pool_per_pod_queue_size"]}
    assert per_pod == {"w0-rank-0": 3, "w1-rank-0": 0, "w1-rank-1": 4, "w2-rank-0": 0}  # llm-d's names
    assert found["inference_extension_info"] == [({"commit": "", "build_ref": "extproc-0.1.0"}, 1.0)]


async def test_the_pool_is_named_by_pool_name_and_rewrites_are_counted_by_rule(
    engines, tmp_path: Path
) -> None:
    path = tmp_path / "resources.yaml"
    path.write_text(rewrite("canary", CANARY))
    pool = Pool("vllm-qwen3-32b")
    extension = InferenceExtensionConfig(str(path), pool, read_resources(str(path), pool))
    picker = picker_for(
        engines,
        inference_extension=extension,
        models=(ModelConfig(MODEL, lora_adapters=("foodreview-v1", "foodreview-v2")),),
    )
    try:
        chosen = await picker.pick(
            body=chat_body(model="foodreview"), path="/v1/chat/completions", headers={}, subset=None,
            client_request_id="r1",
        )  # fmt: skip
        picker.finish(chosen, "complete")
        found = await scraped(picker)
    finally:
        await picker.close()
    assert found["inference_pool_ready_pods"] == [({"name": "vllm-qwen3-32b"}, 3.0)]
    target = json.loads(chosen.body or b"{}")["model"]
    assert found["inference_extension_model_rewrite_decisions_total"] == [
        ({"model_rewrite_name": "canary", "model_name": "foodreview", "target_model": target}, 1.0)
    ]


async def test_the_prefix_indexer_size_is_every_workers_cached_blocks(engines) -> None:
    """Approximate mode (no KV events): each routed prompt's full blocks are predicted cached on its
    worker, so the size grows with what was routed and equals the per-worker gauges' sum."""
    picker = picker_for(engines)
    try:
        for i in range(2):
            chosen = await picker.pick(
                body=chat_body(f"prompt {i} " * 40), path="/v1/chat/completions", headers={},
                subset=[f"127.0.0.1:{engines[i].port}"], client_request_id=f"r{i}",
            )  # fmt: skip
            picker.finish(chosen, "complete")
        found = await scraped(picker)
    finally:
        await picker.close()
    cached = sum(value for _, value in found["extproc_worker_cached_blocks"])
    assert cached > 0 and found["inference_extension_prefix_indexer_size"] == [({}, cached)]


async def test_without_fresh_engine_metrics_no_pod_is_ready_and_no_average_is_made() -> None:
    silent = [await server(None) for _ in range(3)]
    picker = picker_for(silent)
    try:
        found = await scraped(picker)
    finally:
        await picker.close()
        for s in silent:
            await s.close()
    assert found["inference_pool_ready_pods"] == [({"name": MODEL}, 0.0)]
    assert "inference_pool_average_kv_cache_utilization" not in found  # as there: nothing to average
    assert sorted(labels["model_server_pod"] for labels, _ in found["inference_pool_per_pod_queue_size"]) == [
        "w0-rank-0", "w1-rank-0", "w1-rank-1", "w2-rank-0"
    ]  # fmt: skip


async def test_debug_inference_resources_shows_what_the_picker_uses(engines, tmp_path: Path) -> None:
    path = tmp_path / "resources.yaml"
    path.write_text(
        rewrite("canary", CANARY)
        + "---\n"
        + objective("batch", -1)
        + "---\n"
        + objective("x", 1, pool="other")
    )
    pool = Pool("vllm-qwen3-32b")
    picker = picker_for(
        engines,
        inference_extension=InferenceExtensionConfig(str(path), pool, read_resources(str(path), pool)),
    )
    plain = picker_for(engines)
    try:
        counters = EventCounters()
        sources = EventSources(RouterFeed(picker.routers_by_worker(), counters), counters)
        async with TestClient(TestServer(make_admin_app(picker, sources))) as client:
            answer = await (await client.get("/debug/inference_resources")).json()
        async with TestClient(TestServer(make_admin_app(plain, sources))) as client:
            nothing = await (await client.get("/debug/inference_resources")).json()
    finally:
        await picker.close()
        await plain.close()
    assert answer["file"] == str(path) and answer["readings"] == 1 and answer["objectives"] == {"batch": -1}
    assert answer["pool"] == {
        "name": "vllm-qwen3-32b",
        "namespace": None,
        "group": "inference.networking.k8s.io",
    }
    assert answer["model_rewrites"] == [
        {
            "rewrite": "canary",
            "models": ["foodreview"],
            "targets": [{"model": "foodreview-v1", "weight": 10}, {"model": "foodreview-v2", "weight": 90}],
        }
    ]
    assert len(answer["left_out"]) == 1 and "'x' is for pool 'other'" in answer["left_out"][0]
    assert nothing == {"file": None}
