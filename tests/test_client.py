"""RoutingClient against real mock workers served in-process: streaming, lifecycle, errors, cancellation,
per-request overrides, prefix reuse (predicted and from real ZMQ KV events), and the two examples."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web

from extproc.client import (
    RequestRejected,
    RouterConfigOverride,
    RoutingClient,
    WorkerFailed,
    _chunk,
    _SseDecoder,
)
from extproc.config import WorkerConfig
from extproc.request.tokenizer import ByteTokenizer
from extproc.sim.disagg import DisaggWorkerConfig
from extproc.sim.engine import Engine, EngineConfig
from extproc.sim.kv_events import KvEventsConfig
from extproc.sim.mock_worker import WORKER, MockWorkerConfig, make_app

MODEL = "demo-model"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DOCUMENT = "The quarterly report says revenue grew in every region. " * 12  # ~45 blocks of 16 tokens
LONG = 4096  # output tokens of a generation still running when a test stops it (the worker's cap)


@dataclass
class RunningWorker:
    endpoint: str
    app: web.Application
    kv_events: str | None = None  # tcp://ip:port of its ZMQ PUB socket, when it publishes
    kv_replay: str | None = None  # and of its replay socket
    role: str = "both"

    @property
    def engine(self) -> Engine:
        return self.app[WORKER].driver.engine

    def generated_tokens(self) -> float:
        worker = self.app[WORKER]
        sample = {"model_name": worker.config.model}
        return worker.metrics.registry.get_sample_value("vllm:generation_tokens_total", sample) or 0.0

    def config(self, model: str = MODEL) -> WorkerConfig:
        return WorkerConfig(
            self.endpoint,
            self.endpoint,
            model,
            kv_events=self.kv_events,
            kv_replay=self.kv_replay,
            role=self.role,
        )


@contextlib.asynccontextmanager
async def serve_workers(
    n: int,
    *,
    speedup: float = 1000.0,
    model: str = MODEL,
    kv_events: bool = False,
    roles: Sequence[str] | None = None,
) -> AsyncIterator[list[RunningWorker]]:
    """`n` mock workers on free loopback ports, stopped on exit. Handler cancellation is on, as in
    `python -m extproc mock-worker`, so a client disconnect frees the request in the engine."""
    runners: list[web.AppRunner] = []
    workers: list[RunningWorker] = []
    try:
        for i in range(n):
            role = roles[i] if roles else "both"
            events = KvEventsConfig("zmq", port=0, replay_port=0) if kv_events else None  # bound at setup
            config = MockWorkerConfig(
                worker_id=f"w{i}",
                model=model,
                engine=EngineConfig(block_size=16, num_gpu_blocks=2048),
                speedup=speedup,
                kv_events=events or KvEventsConfig(),
                disagg=DisaggWorkerConfig(role=role),
            )
            app = make_app(config)
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            worker = RunningWorker(f"{host}:{port}", app, role=role)
            if events is not None:
                publisher = app[WORKER].kv_events.publisher  # started by the runner: its ports are bound
                worker.kv_events = publisher.endpoint
                worker.kv_replay = publisher.replay_endpoint
            workers.append(worker)
        yield workers
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


@contextlib.asynccontextmanager
async def routed_workers(
    n: int, *, speedup: float = 1000.0, model: str = MODEL, **client_settings: Any
) -> AsyncIterator[tuple[list[RunningWorker], RoutingClient]]:
    """`n` mock workers serving `model` and a started client routing `MODEL` over them."""
    async with serve_workers(n, speedup=speedup, model=model) as workers:
        client = RoutingClient.from_workers(MODEL, [w.endpoint for w in workers], **client_settings)
        async with client:
            yield workers, client


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def outcomes(client: RoutingClient) -> dict[str, float]:
    """The picker's `extproc_requests` counter by outcome (what Prometheus would show)."""
    samples = client.picker.metrics.requests.collect()[0].samples
    return {s.labels["outcome"]: s.value for s in samples if s.name.endswith("_total")}


def chat(question: str, document: str = DOCUMENT) -> list[dict[str, str]]:
    return [{"role": "system", "content": document}, {"role": "user", "content": question}]


def idle_engine(worker: RunningWorker) -> bool:
    return worker.engine.num_running == 0 and worker.engine.num_waiting == 0


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --- streaming and lifecycle ------------------------------------------------------------------


async def test_chat_stream_arrives_in_order_and_the_picker_is_idle_after():
    async with routed_workers(2) as (workers, client):
        generation = client.generate(
            model=MODEL,
            messages=chat("How did revenue do?"),
            max_tokens=7,
            stream_options={"include_usage": True},
            request_id="rid-42",
        )
        chunks = [chunk async for chunk in generation]
        assert client.picker.is_idle()
        assert outcomes(client) == {"routed": 1, "completed": 1}

    assert generation.endpoint in {w.endpoint for w in workers}
    assert generation.request_id == generation.pick.request_id == "rid-42"
    assert generation.response_headers["x-worker-id"] in {"w0", "w1"}
    # the role delta, 7 tokens (the last one says why it stopped), then usage
    role, *tokens, usage = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"]["content"] for c in tokens] == [" tok"] * 7
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 6 + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_completion_stream_and_non_streamed_complete():
    async with routed_workers(1) as (_, client):
        texts = [
            c["choices"][0]["text"] async for c in client.generate(model=MODEL, prompt="Once", max_tokens=5)
        ]
        answer = await client.complete(model=MODEL, messages=chat("Summarize."), max_tokens=3)
        assert client.picker.is_idle()
        assert outcomes(client) == {"routed": 2, "completed": 2}
    assert texts == [" tok"] * 5
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == " tok" * 3


async def test_a_non_streamed_answer_teaches_the_pass_time_model_nothing():
    """`complete` sees the answer only whole: that is no time to first token (the default timing model
    learns from those); `generate`'s first chunk is one."""
    async with routed_workers(1, speedup=20.0) as (_, client):
        router = client.picker.pools[MODEL].router
        (worker,) = router.workers()
        assert router.config.learn_prefill_timing
        for i in range(3):
            await client.complete(model=MODEL, messages=chat(f"Summarize {i}."), max_tokens=16)
        assert router.sequences.learned_pass_time(worker) is None
        async for _ in client.generate(model=MODEL, messages=chat("Summarize again."), max_tokens=16):
            pass
        learned = router.sequences.learned_pass_time(worker)
        assert learned is not None and learned.samples == 1


async def test_a_malformed_call_raises_before_anything_is_sent():
    async with routed_workers(1) as (_, client):
        with pytest.raises(ValueError, match="exactly one of messages"):
            client.generate(model=MODEL, messages=chat("hi"), prompt="hi")
        with pytest.raises(ValueError, match="stream is set by the call"):
            await client.complete(model=MODEL, prompt="hi", stream=True)
        assert outcomes(client) == {}


# --- errors -------------------------------------------------------------------------------------


async def test_a_worker_error_raises_its_status_and_body_and_frees_the_request():
    # the worker serves another model: it answers 404 with vLLM's error JSON
    async with routed_workers(1, model="other-model") as (workers, client):
        with pytest.raises(WorkerFailed) as caught:
            async for _ in client.generate(model=MODEL, messages=chat("hi")):
                pass
        assert client.picker.is_idle()
        assert outcomes(client) == {"routed": 1, "upstream_error": 1}
    error = caught.value
    assert error.status == 404 and error.endpoint == workers[0].endpoint
    assert error.body["error"]["type"] == "NotFoundError"
    assert "The model `demo-model` does not exist." in error.message


async def test_an_unreachable_worker_raises_502_and_frees_the_request(refusing_port):
    endpoint = f"127.0.0.1:{refusing_port()}"  # nothing listens there: connection refused
    async with RoutingClient.from_workers(MODEL, [endpoint]) as client:
        with pytest.raises(WorkerFailed) as caught:
            await client.complete(model=MODEL, prompt="hi")
        assert client.picker.is_idle()
        assert outcomes(client) == {"routed": 1, "error": 1}
    assert caught.value.status == 502 and caught.value.endpoint == endpoint
    assert endpoint in caught.value.message


async def test_a_stream_broken_off_before_done_raises_and_frees_the_request(monkeypatch):
    async with routed_workers(1, speedup=10.0) as (workers, client):
        worker = workers[0]
        received = 0
        with pytest.raises(WorkerFailed, match=r"ended the stream before \[DONE\]") as caught:
            async for _ in client.generate(model=MODEL, messages=chat("hi"), max_tokens=LONG):
                received += 1
                if received == 2:  # the simulated engine fails on its next pass; the worker ends the stream

                    def fail(*args: Any) -> None:
                        raise RuntimeError("simulated engine fault")

                    monkeypatch.setattr(worker.engine, "finish_pass", fail)
        assert caught.value.status == 502
        assert client.picker.is_idle()
        assert outcomes(client) == {"routed": 1, "error": 1}


@pytest.mark.parametrize(
    ("model", "max_prompt_tokens", "status", "reason"),
    [("unknown-model", None, 404, "unknown-model"), (MODEL, 10, 413, "prompt-too-long")],
)
async def test_the_router_refusing_raises_request_rejected(model, max_prompt_tokens, status, reason):
    async with serve_workers(1) as workers:
        config = RoutingClient.from_workers(MODEL, [workers[0].endpoint]).config
        async with RoutingClient(replace(config, max_prompt_tokens=max_prompt_tokens)) as client:
            with pytest.raises(RequestRejected) as caught:
                async for _ in client.generate(model=model, messages=chat("hi")):
                    pass
            assert client.picker.is_idle()
            assert workers[0].generated_tokens() == 0  # no worker saw it
    assert (caught.value.status, caught.value.reason) == (status, reason)
    assert caught.value.message


# --- cancellation -------------------------------------------------------------------------------


async def test_breaking_out_of_the_loop_frees_the_request_and_the_worker_stops():
    async with routed_workers(1, speedup=1.0) as (workers, client):
        worker = workers[0]
        async with client.generate(model=MODEL, messages=chat("hi"), max_tokens=LONG) as stream:
            assert stream.endpoint == worker.endpoint  # routed and sent on entering
            received = 0
            async for _ in stream:
                received += 1
                if received == 2:
                    break
        assert client.picker.is_idle()  # freed as the block is left, not later at garbage collection
        assert outcomes(client) == {"routed": 1, "cancelled": 1}
        await wait_for(lambda: idle_engine(worker), "the worker to drop the request")
        assert worker.generated_tokens() < LONG


async def test_breaking_out_of_a_bare_loop_frees_the_request():
    async with routed_workers(1, speedup=1.0) as (workers, client):
        async for chunk in client.generate(model=MODEL, messages=chat("hi"), max_tokens=LONG):
            if chunk["choices"][0]["delta"].get("content"):
                break
        await wait_for(client.picker.is_idle, "the picker to free the request")
        assert outcomes(client) == {"routed": 1, "cancelled": 1}
        await wait_for(lambda: idle_engine(workers[0]), "the worker to drop the request")


async def test_cancelling_the_consuming_task_frees_the_request_and_the_worker_stops():
    async with routed_workers(1, speedup=1.0) as (workers, client):
        worker = workers[0]
        two_chunks = asyncio.Event()

        async def consume() -> None:
            received = 0
            async for _ in client.generate(model=MODEL, messages=chat("hi"), max_tokens=LONG):
                received += 1
                if received == 2:
                    two_chunks.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(two_chunks.wait(), 10.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.picker.is_idle()
        assert outcomes(client) == {"routed": 1, "cancelled": 1}
        await wait_for(lambda: idle_engine(worker), "the worker to drop the request")
        assert worker.generated_tokens() < LONG


# --- routing ------------------------------------------------------------------------------------


async def test_the_overlap_weight_override_changes_the_choice():
    """One worker caches the document but is busy decoding it; the other is idle and cold. With the
    overlap weight at 0 load decides (the cold worker); with a high weight, the cache does. Dynamo's
    cost: its load is decode blocks (the timing model's is time to first token, weighted alike)."""
    async with routed_workers(2, seed=3, prefill_load_model="none") as (_, client):
        async with client.generate(model=MODEL, messages=chat("First question?"), max_tokens=LONG) as busy:
            chunks = aiter(busy)
            await anext(chunks)  # prefill is done; the request stays in flight on its worker
            choices = {}
            for weight in (4.0, 0.0):  # high first: once the cold worker served it, both cache it
                override = RouterConfigOverride(overlap_score_weight=weight)
                answer = client.generate(
                    model=MODEL, messages=chat("Next?"), max_tokens=2, router_override=override
                )
                async for _ in answer:
                    pass
                choices[weight] = answer.endpoint
        assert client.picker.is_idle()
    assert choices[0.0] != busy.endpoint
    assert choices[4.0] == busy.endpoint


async def test_concurrent_generations_share_one_client_and_all_are_freed():
    async with routed_workers(2) as (_, client):

        async def ask(i: int) -> tuple[str | None, int]:
            generation = client.generate(
                model=MODEL, messages=chat("?", f"Document {i}. " * 40), max_tokens=5
            )
            tokens = [c async for c in generation if c["choices"][0]["delta"].get("content")]
            return generation.endpoint, len(tokens)

        results = await asyncio.gather(*(ask(i) for i in range(8)))
        assert client.picker.is_idle()
        assert outcomes(client) == {"routed": 8, "completed": 8}
    assert [n for _, n in results] == [5] * 8
    assert len({endpoint for endpoint, _ in results}) == 2  # load spreads the cold prompts


async def test_a_session_header_keeps_the_conversation_on_its_busy_worker():
    """The header reaches the picker: the session's worker takes the next turn though the other idles."""
    session = {"X-Session-Id": "s-1"}
    async with routed_workers(2) as (_, client):
        first = client.generate(
            model=MODEL, messages=chat("?", "Topic 0. " * 40), max_tokens=LONG, headers=session
        )
        async with first:
            chunks = aiter(first)
            await anext(chunks)  # in flight on its worker (`chunks` is kept: dropping it would end it)
            turn = client.generate(model=MODEL, messages=chat("?", "Topic 1. " * 40), headers=session)
            async for _ in turn:
                pass
        assert client.picker.is_idle()
    assert turn.endpoint == first.endpoint


@pytest.mark.parametrize("kv_events", [False, True], ids=["predicted", "zmq-events"])
async def test_a_shared_prefix_goes_back_to_the_worker_that_caches_it(kv_events):
    async with serve_workers(3, kv_events=kv_events) as workers:
        client = RoutingClient.from_workers(MODEL, [w.config() for w in workers], block_size=16, seed=1)
        assert client.config.router.use_kv_events is kv_events
        async with client:
            first = client.generate(model=MODEL, messages=chat("First question?"), max_tokens=2)
            async for _ in first:
                pass
            router = client.picker.pools[MODEL].router
            prompt = ByteTokenizer().encode_chat(chat("Second question?"))

            def first_worker_caches_it() -> bool:
                loads = {str(load.worker): load.overlap_blocks for load in router.get_potential_loads(prompt)}
                return loads[first.pick.worker.worker_id] >= 40

            # with events, the router learns the cache from the worker's ZMQ stream, a moment later
            await wait_for(first_worker_caches_it, "the router to see the first worker's cache")
            second = client.generate(model=MODEL, messages=chat("Second question?"), max_tokens=2)
            async for _ in second:
                pass
            assert client.picker.is_idle()
    assert second.endpoint == first.endpoint
    assert second.pick.overlap_blocks >= 40
    assert int(second.response_headers["x-prefix-cache-hit-tokens"]) >= 40 * 16  # the worker's own cache


async def test_a_disaggregated_request_carries_the_prefill_worker_to_the_decode_worker():
    async with serve_workers(2, roles=["prefill", "decode"]) as (prefill, decode):
        client = RoutingClient.from_workers(MODEL, [prefill.config(), decode.config()], block_size=16)
        async with client:
            generation = client.generate(model=MODEL, messages=chat("Long enough to prefill remotely?"))
            async for _ in generation:
                pass
            assert client.picker.is_idle()
    assert generation.endpoint == decode.endpoint
    assert generation.pick.prefill_endpoint == prefill.endpoint
    assert generation.response_headers["x-prefill-source"] == "remote"  # the decode worker got the header


# --- SSE ----------------------------------------------------------------------------------------


def test_sse_decoder_splits_events_across_arbitrary_chunk_boundaries():
    raw = (
        b': keep-alive comment\n\ndata: {"a": 1}\r\n\r\nevent: x\ndata: {"b":\ndata: 2}\n\n'
        + 'data: {"c": "\u00e9"}\n\n'.encode()
        + b"data: [DONE]"
    )
    for size in (1, 3, len(raw)):
        decoder = _SseDecoder()
        events = [e for i in range(0, len(raw), size) for e in decoder.feed(raw[i : i + size])]
        events += decoder.close()
        assert events == ['{"a": 1}', '{"b":\n2}', '{"c": "\u00e9"}', "[DONE]"]
        assert json.loads(events[1]) == {"b": 2}


def test_an_error_event_mid_stream_raises_with_its_code():
    with pytest.raises(WorkerFailed) as caught:
        _chunk(
            '{"error": {"message": "KV cache exhausted", "type": "InternalServerError", "code": 503}}', "ep"
        )
    assert (caught.value.status, caught.value.endpoint) == (503, "ep")
    assert "KV cache exhausted" in caught.value.message
    assert _chunk('{"choices": [], "error": null}', "ep") == {"choices": [], "error": None}


# --- examples -----------------------------------------------------------------------------------


async def test_manual_routing_example_runs_against_mock_workers(capsys):
    example = load_example("manual_routing")
    async with serve_workers(2) as workers:
        routes = await example.main([w.endpoint for w in workers])
    first, follow_up, *_ = routes
    assert follow_up.worker == first.worker and follow_up.overlap_blocks > 0
    assert follow_up.cached_tokens > 0  # the worker confirms the cache hit
    assert "router idle: True" in capsys.readouterr().out


async def test_python_client_example_runs_against_mock_workers(capsys):
    example = load_example("python_client")
    async with serve_workers(2) as workers:
        assert await example.main([w.endpoint for w in workers]) == 0
    out = capsys.readouterr().out
    assert "routed to 127.0.0.1:" in out and "46/49 prompt blocks cached there" in out
    assert "worker error 400: " in out and "picker idle: True" in out
