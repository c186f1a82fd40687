"""The concurrent-stream limit through a real Envoy: what a client sees past `--max-concurrent-streams`.

Two echo workers hold their answers until the test releases them, so each request keeps its
ext_proc stream open; the picker's service allows two streams. The third request gets the 429
ImmediateResponse, also under `failure_mode_allow` (an ImmediateResponse is an answer, not a
failure, so Envoy does not fail open around it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import Variant
from extproc.devstack.stack import MODEL
from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig

from .harness import EchoWorker, EnvoyUnderTest, envoy_version, start_echo_workers, start_envoy_variant

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = aiohttp.ClientTimeout(total=30)
LIMIT = 2


@dataclass
class Stack:
    picker: EndpointPicker
    service: ExtProcService
    envoy: EnvoyUnderTest
    workers: list[EchoWorker]


@contextlib.asynccontextmanager
async def serving(
    endpoints: list[str], variant: Variant, log_dir: Path, **service_options: Any
) -> AsyncIterator[tuple[EndpointPicker, ExtProcService, EnvoyUnderTest]]:
    """A picker for `endpoints` behind its ext_proc service on a free port, and an Envoy using it."""
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=tuple(WorkerConfig(f"w{i}", ep, MODEL) for i, ep in enumerate(endpoints)),
        models=(ModelConfig(MODEL),),
        seed=5,
    )
    picker = EndpointPicker(config)
    service = ExtProcService(picker, max_body_bytes=config.max_body_bytes, **service_options)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_ExternalProcessorServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")  # the port it bound
    await server.start()
    try:
        envoy = start_envoy_variant(
            variant, picker_address=f"127.0.0.1:{port}", workers=endpoints, log_dir=log_dir
        )
        try:
            yield picker, service, envoy
        finally:
            envoy.stop()
    finally:
        await server.stop(0)
        await picker.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["buffered", "failopen"])
async def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    variant: Variant = request.param
    workers = await start_echo_workers(2)
    endpoints = [w.address for w in workers]
    try:
        log_dir = tmp_path_factory.mktemp(f"limits-{variant}")
        async with serving(endpoints, variant, log_dir, max_concurrent_streams=LIMIT) as running:
            yield Stack(*running, workers)
    finally:
        for w in workers:
            await w.stop()


async def post(http: aiohttp.ClientSession, url: str, text: str, query: str = "") -> tuple[int, dict, dict]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    async with http.post(f"{url}/v1/chat/completions{query}", json=body) as r:
        data = await r.read()
        answer = json.loads(data) if r.content_type == "application/json" else {"text": data.decode()}
        return r.status, {k.lower(): v for k, v in r.headers.items()}, answer


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_a_request_beyond_the_stream_limit_gets_429_and_the_next_one_after_a_slot_frees_is_served(
    stack: Stack,
) -> None:
    rejected = stack.picker.metrics.registry.get_sample_value
    labels = {"status": "429", "reason": "rejected-too-many-streams"}
    before = rejected("extproc_rejections_total", labels) or 0.0
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        held = [asyncio.create_task(post(http, stack.envoy.url, f"held {k}", f"?hold={k}")) for k in "ab"]
        await until(lambda: stack.service.open_streams == LIMIT)

        status, headers, answer = await post(http, stack.envoy.url, "one too many")
        assert status == 429
        assert headers[epp.DROPPED_REASON_HEADER] == "rejected-too-many-streams"
        assert answer["error"]["type"] == "RateLimitError" and "limit of 2" in answer["error"]["message"]
        assert headers["retry-after"] == "1"
        assert "worker" not in answer  # no worker saw it
        assert rejected("extproc_rejections_total", labels) == before + 1

        for w in stack.workers:
            for k in "ab":
                w.release(k)
        assert [(await t)[0] for t in held] == [200, 200]
        await until(lambda: stack.service.open_streams == 0)
        status, _, answer = await post(http, stack.envoy.url, "room again")
        assert status == 200 and answer["worker"] in {w.address for w in stack.workers}
    await until(stack.picker.is_idle)


async def test_a_dead_worker_gets_envoys_503_counted_as_failures_in_a_row_until_it_answers_again(
    tmp_path: Path, refusing_port
) -> None:
    dead = EchoWorker(port=refusing_port())  # held for the test: nothing listens there until it starts
    # Envoy 1.36 sends ext_proc none of its own replies (from 1.37 on it does, envoyproxy/envoy#41769):
    # the client gets the same 503, but the picker is not told, and cannot eject the worker
    told = envoy_version() >= (1, 37)
    async with serving([dead.address], "buffered", tmp_path) as (picker, _service, envoy):
        sample = picker.metrics.registry.get_sample_value
        labels = {"model": MODEL, "worker": "w0"}
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            for attempt in range(1, 4):
                status, headers, answer = await post(http, envoy.url, f"nobody there {attempt}")
                # Envoy's own answer, in the picker's shape (envoy/local_replies.yaml)
                assert status == 503 and "upstream connect error" in answer["error"]["message"]
                assert answer["error"]["type"] == "ServiceUnavailableError" and answer["error"]["code"] == 503
                assert headers[epp.DROPPED_REASON_HEADER] == "upstream-unavailable"
                assert headers["retry-after"] == "1"
                await until(picker.is_idle)  # freed like any other failed request
                assert sample("extproc_worker_consecutive_failures", labels) == (attempt if told else None)
            assert sample("extproc_upstream_responses_total", {**labels, "status": "503"}) == (
                3 if told else None
            )
            await dead.start()  # the worker comes (back) up
            try:
                status, _, answer = await post(http, envoy.url, "hello again")
                assert status == 200 and answer["worker"] == dead.address
                await until(picker.is_idle)
                assert sample("extproc_worker_consecutive_failures", labels) == (0 if told else None)
                assert sample("extproc_upstream_responses_total", {**labels, "status": "200"}) == 1
            finally:
                await dead.stop()
