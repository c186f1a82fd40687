"""Disaggregated prefill/decode mock workers over real HTTP in-process: remote prefill, the
simulated KV transfer, KV events on both sides, fallback, cancellation and the roles' reporting.

Pairs of real workers (`make_app` on free loopback ports); conditions are polled with a deadline.
A "glacial" prefill worker (speedup 0.001: one pass takes over 16 real seconds) is still working
whenever a test looks, so timeouts and cancellation never race it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from extproc.events.counters import EventCounters
from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscriber
from extproc.router import KvRouter, RouterConfig
from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.router.types import KvEvent, Worker
from extproc.sim.disagg import DisaggWorkerConfig, prefill_request_body
from extproc.sim.engine import Engine, EngineConfig
from extproc.sim.kv_events import KvEventsConfig
from extproc.sim.mock_worker import (
    WORKER,
    MockWorkerConfig,
    add_mock_worker_arguments,
    config_from_args,
    make_app,
)
from extproc.sim.transfer import KvTransferModel

BS = 16
MODEL = "demo-model"
PROMPT = list(range(1, 100))  # 99 tokens: 6 full blocks, the 3-token tail is computed on the decode side
BASE_MS, PER_BLOCK_MS = 40.0, 10.0
HEADER = "x-prefill-endpoint"


def worker_config(
    worker_id: str,
    role: str = "both",
    *,
    speedup: float = 1000.0,
    model: str = MODEL,
    kv_events: KvEventsConfig | None = None,
    timeout_s: float = 30.0,
) -> MockWorkerConfig:
    disagg = DisaggWorkerConfig(
        role=role,
        kv_transfer=KvTransferModel(BASE_MS, PER_BLOCK_MS),
        remote_prefill_timeout_s=timeout_s,
    )
    return MockWorkerConfig(
        worker_id=worker_id,
        model=model,
        engine=EngineConfig(block_size=BS, num_gpu_blocks=1024),
        speedup=speedup,
        kv_events=kv_events or KvEventsConfig(),
        disagg=disagg,
    )


@asynccontextmanager
async def serving(*configs: MockWorkerConfig) -> AsyncIterator[list[TestClient]]:
    """Each config as a real worker on a free loopback port, stopped on exit."""
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(TestClient(TestServer(make_app(c)))) for c in configs]
        yield clients


def engine(client: TestClient) -> Engine:
    return client.server.app[WORKER].driver.engine


def endpoint(client: TestClient) -> str:
    return f"127.0.0.1:{client.server.port}"


async def metric(client: TestClient, name: str, **labels: str) -> float:
    """One sample of the worker's /metrics (0 when absent)."""
    text = await (await client.get("/metrics")).text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"{what} not reached within {timeout_s} s"
        await asyncio.sleep(0.01)


def drained(e: Engine) -> bool:
    return not e.has_work and e.cache.num_active_blocks == 0


def sse_payloads(raw: str) -> list[str]:
    assert raw.endswith("\n\n")
    return [event.removeprefix("data: ") for event in raw[:-2].split("\n\n")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_decode_worker_prefills_remotely_receives_the_blocks_and_answers(stream: bool):
    async with serving(worker_config("p", "prefill"), worker_config("d", "decode")) as (prefill, decode):
        if stream:
            path = "/v1/completions"
            body = {
                "prompt": PROMPT,
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        else:
            path = "/v1/chat/completions"
            body = {"messages": [{"role": "user", "content": "x" * 90}], "max_completion_tokens": 5}
        resp = await decode.post(path, json=body, headers={HEADER: endpoint(prefill)})
        assert resp.status == 200
        assert resp.headers["x-worker-id"] == "d" and resp.headers["x-prefill-source"] == "remote"
        if stream:
            events = sse_payloads(await resp.text())
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert [c["choices"][0]["text"] for c in chunks[:-1]] == [" tok"] * 5
            usage = chunks[-1]["usage"]
        else:
            answer = await resp.json()
            assert answer["choices"][0]["message"]["content"] == " tok" * 5
            assert "kv_transfer_params" not in answer
            usage = answer["usage"]
        n = usage["prompt_tokens"]
        assert usage["completion_tokens"] == 5 and n > 2 * BS
        received = (n - 1) // BS  # full blocks up to the cached-prefix cap: the decode side computes the rest
        # the prefill worker prefilled the whole prompt and generated exactly one token
        assert await metric(prefill, "vllm:prompt_tokens_total") == n
        assert await metric(prefill, "vllm:generation_tokens_total") == 1
        assert engine(prefill).cache.num_cached_blocks == n // BS
        # the decode worker took the received blocks as cached: only the rest was prefilled there
        assert int(resp.headers["x-prefix-cache-hit-tokens"]) == received * BS
        assert await metric(decode, "vllm:prefix_cache_hits_total") == received * BS
        assert await metric(decode, "extproc_mock_kv_transfer_blocks_total") == received
        assert await metric(decode, "extproc_mock_prefill_requests_total", source="remote") == 1
        assert await metric(decode, "extproc_mock_prefill_requests_total", source="local") == 0
        # the transfer took its configured time on the decode worker's simulated clock
        assert await metric(decode, "extproc_mock_kv_transfer_simulated_seconds_count") == 1
        transfer_s = await metric(decode, "extproc_mock_kv_transfer_simulated_seconds_sum")
        assert transfer_s >= (BASE_MS + PER_BLOCK_MS * received) / 1000.0 * (1 - 1e-6)
        assert drained(engine(prefill)) and drained(engine(decode))


async def test_only_blocks_the_decode_worker_lacks_are_transferred():
    async with serving(worker_config("p", "prefill"), worker_config("d", "decode")) as (prefill, decode):
        longer = PROMPT + list(range(500, 540))  # 139 tokens: its first 6 blocks are PROMPT's
        for prompt in (PROMPT, PROMPT, longer):
            resp = await decode.post(
                "/v1/completions",
                json={"prompt": prompt, "max_tokens": 2},
                headers={HEADER: endpoint(prefill)},
            )
            assert resp.status == 200 and resp.headers["x-prefill-source"] == "remote"
        # 6 blocks for the first request, none for the repeat, 8 - 6 for the longer prompt
        assert await metric(decode, "extproc_mock_kv_transfer_blocks_total") == 6 + 0 + 2
        assert await metric(decode, "extproc_mock_kv_transfer_simulated_seconds_count") == 3
        transfer_s = await metric(decode, "extproc_mock_kv_transfer_simulated_seconds_sum")
        assert transfer_s >= (3 * BASE_MS + 8 * PER_BLOCK_MS) / 1000.0 * (1 - 1e-6)
        assert resp.headers["x-prefix-cache-hit-tokens"] == str(8 * BS)


class RouterSink:
    """The picker's EventSink reduced to the router calls."""

    def __init__(self, router: KvRouter) -> None:
        self.router = router

    def apply_events(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            self.router.apply_event(event)

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.router.indexer.clear_worker(worker)

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        pass


async def test_both_workers_publish_the_prompt_blocks_as_kv_events():
    zmq = KvEventsConfig(transport="zmq", port=0, replay_port=0)
    configs = worker_config("p", "prefill", kv_events=zmq), worker_config("d", "decode", kv_events=zmq)
    router = KvRouter(RouterConfig(block_size=BS, use_kv_events=True), clock=lambda: 0.0)
    timings = SubscriberTimings(silence_s=0.3, replay_timeout_s=0.3, backoff_min_s=0.02, backoff_max_s=0.2)
    async with serving(*configs) as (prefill, decode), AsyncExitStack() as stack:
        for client in (prefill, decode):
            publisher = client.server.app[WORKER].kv_events.publisher
            where = ZmqEndpoint(Worker(client.server.app[WORKER].config.worker_id), publisher.endpoint,
                                publisher.replay_endpoint)  # fmt: skip
            sub = ZmqEventSubscriber(where, RouterSink(router), block_size=BS, counters=EventCounters(),
                                     timings=timings)  # fmt: skip
            await sub.start()
            stack.push_async_callback(sub.stop)
        resp = await decode.post(
            "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, headers={HEADER: endpoint(prefill)}
        )
        assert resp.status == 200 and resp.headers["x-prefill-source"] == "remote"
        full = len(PROMPT) // BS
        expected = {Worker("p"): full, Worker("d"): full}
        await wait_for(
            lambda: router.indexer.find_matches(compute_block_hashes(PROMPT, BS)) == expected,
            what="the prompt's blocks on both workers",
        )


def glacial(worker_id: str, **kwargs: object) -> MockWorkerConfig:
    """A worker whose first pass takes over 16 real seconds: still busy whenever a test looks."""
    return worker_config(worker_id, "prefill", speedup=0.001, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("failure", ["refused", "not-found", "timeout"])
async def test_a_failed_prefill_falls_back_to_local_prefill(failure: str, refusing_port):
    others = {
        "refused": [],
        "not-found": [worker_config("p", "prefill", model="other")],
        "timeout": [glacial("p")],
    }
    decode_config = worker_config("d", "decode", timeout_s=0.3)
    async with serving(decode_config, *others[failure]) as (decode, *prefill):
        target = endpoint(prefill[0]) if prefill else f"127.0.0.1:{refusing_port()}"
        resp = await decode.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 3},
            headers={HEADER: target},
        )
        assert resp.status == 200 and resp.headers["x-prefill-source"] == "local-fallback"
        assert (await resp.json())["usage"]["completion_tokens"] == 3
        assert resp.headers["x-prefix-cache-hit-tokens"] == "0"  # the whole prompt was prefilled here
        assert await metric(decode, "extproc_mock_prefill_requests_total", source="local-fallback") == 1
        assert await metric(decode, "extproc_mock_kv_transfer_blocks_total") == 0
        if failure == "timeout":  # the abandoned prefill request is cancelled on the prefill worker
            await wait_for(lambda: drained(engine(prefill[0])), what="the prefill worker freed it")


async def test_cancelling_while_the_prefill_worker_works_frees_both_engines():
    async with serving(glacial("p"), worker_config("d", "decode")) as (prefill, decode):
        request = {"prompt": PROMPT, "max_tokens": 3}
        task = asyncio.create_task(
            decode.post("/v1/completions", json=request, headers={HEADER: endpoint(prefill)})
        )
        await wait_for(lambda: engine(prefill).num_running == 1, what="the prefill worker running it")
        assert engine(prefill).cache.num_active_blocks > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: drained(engine(prefill)), what="the prefill worker freed it")
        assert drained(engine(decode)) and engine(decode).cache.queried_tokens == 0
        assert await metric(prefill, "vllm:generation_tokens_total") == 0  # cancelled, not finished
        assert await metric(decode, "extproc_mock_prefill_requests_total", source="remote") == 0


@pytest.mark.parametrize(
    "role, header",
    [("decode", None), ("both", "self"), ("prefill", "peer")],
    ids=["no-header", "header-names-itself", "prefill-role-ignores-it"],
)
async def test_served_locally_without_a_usable_header(role: str, header: str | None):
    async with serving(worker_config("w", role), worker_config("peer", "prefill")) as (worker, peer):
        headers = {HEADER: {"self": endpoint(worker), "peer": endpoint(peer)}[header]} if header else {}
        resp = await worker.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}, headers=headers)
        assert resp.status == 200 and resp.headers["x-prefill-source"] == "local"
        assert (await resp.json())["usage"]["completion_tokens"] == 3
        assert await metric(worker, "vllm:prompt_tokens_total") == len(PROMPT)
        assert await metric(worker, "extproc_mock_prefill_requests_total", source="local") == 1
        assert await metric(peer, "vllm:prompt_tokens_total") == 0  # the peer never heard of it


async def test_a_prefill_request_answers_one_token_and_where_its_blocks_are():
    async with serving(worker_config("p", "prefill")) as (prefill,):
        body = prefill_request_body({"model": MODEL, "prompt": PROMPT, "max_tokens": 50, "stream": True,
                                     "stream_options": {"include_usage": True}})  # fmt: skip
        assert body["max_tokens"] == 1 and body["stream"] is False and "stream_options" not in body
        answer = await (await prefill.post("/v1/completions", json=body)).json()
        assert answer["usage"]["completion_tokens"] == 1
        params = answer["kv_transfer_params"]
        block_ids = compute_sequence_hashes(compute_block_hashes(PROMPT, BS))
        assert params == {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": "p",
            "remote_block_ids": block_ids,
            "remote_host": "127.0.0.1",
            "remote_port": prefill.server.port,
            "remote_block_size": BS,
            "num_blocks": len(PROMPT) // BS,
        }
        assert all(h in engine(prefill).cache for h in block_ids)  # the ids of its KV events


async def test_role_flags_build_the_config_and_the_role_is_reported():
    parser = argparse.ArgumentParser()
    add_mock_worker_arguments(parser)
    flags = ["--role", "decode", "--prefill-endpoint-header", "x-p", "--kv-transfer-base-ms", "3"]
    args = parser.parse_args(
        [*flags, "--kv-transfer-ms-per-block", "0.25", "--remote-prefill-timeout-s", "5"]
    )
    disagg = config_from_args(args).disagg
    assert disagg == DisaggWorkerConfig("decode", "x-p", KvTransferModel(3.0, 0.25), 5.0)
    assert config_from_args(parser.parse_args([])).disagg == DisaggWorkerConfig()  # aggregated by default
    with pytest.raises(ValueError, match="--kv-transfer-ms-per-block"):
        config_from_args(parser.parse_args(["--kv-transfer-ms-per-block", "-1"]))
    async with serving(worker_config("d", "decode")) as (decode,):
        card = (await (await decode.get("/v1/models")).json())["data"][0]
        assert card["role"] == "decode"
        assert await metric(decode, "extproc_mock_worker_role", role="decode", model_name=MODEL) == 1
