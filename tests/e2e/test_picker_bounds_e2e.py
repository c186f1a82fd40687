"""What a client's input may cost the picker, through a real Envoy 1.40 (issue 19, the picker's side).

- Large bodies never hold the event loop: a burst of big, slow-to-parse bodies (legal JSON, deeply
  nested in an ignored field) is parsed in the picker's worker process while small requests keep
  being answered at once, buffered and duplex. The picker runs as a child process here, so the
  test's own event loop is not the one measured.
- A client's `x-request-id` can never equal an id the picker makes: a client that sends `dup#1`
  while others send `dup` twice keeps its own request, and no request's end frees another's load.
- Several models: an embeddings body goes to its model's workers; GET /v1/models to any worker.
- A client that leaves while queued leaves no task behind (issue 19's "Task was destroyed but it
  is pending!"); the other places a client can leave mid-decision are in test_cancel_tasks_e2e.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import Variant, render_envoy_config
from extproc.devstack.procs import ManagedProcess, start_envoy
from extproc.devstack.stack import MODEL
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from .harness import EchoWorker, start_echo_worker_process, start_echo_workers
from .tasks import destroyed_pending, new_tasks_left, running_tasks

pytestmark = pytest.mark.asyncio(loop_scope="module")

MiB = 1024 * 1024
TIMEOUT = aiohttp.ClientTimeout(total=60)
VARIANTS: list[Variant] = ["buffered", "duplex"]


def chat(text: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}


def big_body(size_bytes: int, tag: int = 0) -> bytes:
    """A legal chat body of about `size_bytes`: its bulk many small nested arrays in an ignored field,
    about 1 s of parsing per 4 MiB on an event loop. Bodies of different `tag`s differ before it: a
    parse worker takes what a recent body shares from it (`BodyPrefixes`), and these must be parsed."""
    unit = "[" * 20 + "]" * 20
    junk = "[" + ",".join([unit] * (size_bytes // len(unit))) + "]"
    return (json.dumps(chat(f"big {tag}"))[:-1] + ', "x": ' + junk + "}").encode()


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("picker-bounds-e2e")


# --- large bodies ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve_stack(log_dir: Path) -> Iterator[dict[Variant, str]]:
    """Two echo workers, `python -m extproc serve` (its default one parse worker) and one Envoy per
    variant, all child processes."""
    processes: list[ManagedProcess] = []
    try:
        workers = [start_echo_worker_process(log_path=log_dir / f"echo-{i}.log") for i in range(2)]
        processes += workers
        endpoints = [f"127.0.0.1:{w.ports()['port']}" for w in workers]
        config = log_dir / "picker.yaml"
        config.write_text(json.dumps({"workers": [{"id": f"w{i}", "endpoint": ep, "model": MODEL}
                                                  for i, ep in enumerate(endpoints)]}))  # fmt: skip
        ports = log_dir / "picker.ports.json"
        argv = [
            *__import__("sys").executable.split(), "-m", "extproc", "serve", "--config", str(config),
            "--port", "0", "--health-port", "0", "--ports-file", str(ports), "--kv-cache-block-size", "16",
        ]  # fmt: skip
        picker = ManagedProcess(argv, log_path=log_dir / "picker.log", ports_file=ports).start()
        processes.append(picker)
        address = f"127.0.0.1:{picker.ports()['port']}"
        urls: dict[Variant, str] = {}
        for variant in VARIANTS:
            yaml = render_envoy_config(
                variant, picker_address=address, workers=endpoints, max_body_bytes=8 * MiB
            )
            envoy = start_envoy(yaml, log_path=log_dir / f"envoy-bodies-{variant}.log")
            processes.append(envoy)
            urls[variant] = envoy.url
        yield urls
    finally:
        for process in reversed(processes):
            process.stop()


@pytest.mark.parametrize("variant", VARIANTS)
async def test_small_requests_are_answered_at_once_while_big_bodies_are_parsed(variant, serve_stack) -> None:
    """Issue 19: twelve 3.9 MiB bodies stalled the picker's loop past Envoy's 5 s message timeout and
    unrelated clients got 504 (measured before the fix with this burst: every small request waited
    5 s or more). Now the bodies are parsed in a worker process and the loop keeps answering."""
    url = f"{serve_stack[variant]}/v1/chat/completions"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def send(data: bytes) -> tuple[int, float]:
            start = time.perf_counter()
            headers = {"content-type": "application/json"}
            async with http.post(url, data=io.BytesIO(data), headers=headers) as r:
                await r.read()
                return r.status, time.perf_counter() - start

        assert (await send(big_body(64 * 1024)))[0] == 200  # the parse worker is running
        bigs = [asyncio.ensure_future(send(big_body(int(3.9 * MiB), i))) for i in range(6)]
        smalls = []
        while not all(b.done() for b in bigs):
            smalls.append(asyncio.ensure_future(send(json.dumps(chat(f"small {len(smalls)}")).encode())))
            await asyncio.sleep(0.1)  # the probe's pace, not synchronisation
        small = await asyncio.gather(*smalls)
    assert [s for s, _ in (b.result() for b in bigs)] == [200] * 6
    assert len(small) >= 5 and {s for s, _ in small} == {200}
    slowest = max(t for _, t in small)
    assert slowest < 1.5, f"a small request waited {slowest:.2f} s while big bodies were parsed"


# --- request ids and several models: an in-process picker the test can look into ---------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def two_models(log_dir) -> AsyncIterator[tuple[RunningPicker, dict[Variant, str], list[EchoWorker]]]:
    workers = await start_echo_workers(4)
    models = ("demo-model", "embedder")
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=tuple(WorkerConfig(f"w{i}", w.address, models[i // 2]) for i, w in enumerate(workers)),
        models=tuple(ModelConfig(m) for m in models),
        port=0,
        health_port=0,
        seed=3,
    )
    picker = await start_picker(config)
    envoys = []
    try:
        urls: dict[Variant, str] = {}
        for variant in VARIANTS:
            yaml = render_envoy_config(
                variant, picker_address=f"127.0.0.1:{picker.port}", workers=[w.address for w in workers]
            )
            envoys.append(start_envoy(yaml, log_path=log_dir / f"envoy-models-{variant}.log"))
            urls[variant] = envoys[-1].url
        yield picker, urls, workers
    finally:
        for envoy in envoys:
            envoy.stop()
        await picker.stop(0)
        for w in workers:
            await w.stop()


async def test_a_client_request_id_equal_to_a_made_one_keeps_its_own_request(two_models) -> None:
    """Issue 19: `<x-request-id>#<n>`, the id the picker made for a second `dup`, could equal the id
    another client sent (`dup#1`): that client's request went untracked, and its end freed the other
    request's load mid-stream. Made ids are in the picker's own namespace now."""
    running, urls, workers = two_models
    picker = running.picker
    router = picker.pools[MODEL].router
    url = f"{urls['buffered']}/v1/chat/completions"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def held(request_id: str, key: str) -> int:
            async with http.post(f"{url}?hold={key}", json=chat(f"{key} " * 30),
                                 headers={"x-request-id": request_id}) as r:  # fmt: skip
                await r.read()
                return r.status

        client = asyncio.ensure_future(held("dup#1", "a"))
        await until(lambda: len(router.sequences) == 1, "the client's request was not routed")
        first = asyncio.ensure_future(held("dup", "b"))
        await until(lambda: "dup" in router.sequences, "Envoy did not pass the client's x-request-id")
        second = asyncio.ensure_future(held("dup", "c"))
        await until(lambda: len(router.sequences) == 3, "the third request was not routed")
        assert picker.selector.in_flight() == 3
        for w in workers:
            w.release("a")
        assert await client == 200
        await until(lambda: len(router.sequences) == 2, "the client's request was not freed")
        assert picker.selector.in_flight() == 2  # the other two are still tracked, mid-stream
        for w in workers:
            w.release("b")
            w.release("c")
        assert (await first, await second) == (200, 200)
    await until(picker.is_idle, "load was left behind")


@pytest.mark.parametrize("variant", VARIANTS)
async def test_embeddings_go_to_their_models_workers_and_models_lists_to_any(variant, two_models) -> None:
    """Issue 19: /v1/models and /v1/embeddings always went to the first model's workers."""
    running, urls, workers = two_models
    embedders = {w.address for w in workers[2:]}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for i in range(4):
            body = {"model": "embedder", "input": f"text {i}"}
            async with http.post(f"{urls[variant]}/v1/embeddings", json=body) as r:
                assert r.status == 200 and (await r.json())["worker"] in embedders
        async with http.post(f"{urls[variant]}/v1/embeddings", json={"model": "nope", "input": "x"}) as r:
            assert r.status == 404
        served = set()
        for _ in range(4):
            async with http.get(f"{urls[variant]}/v1/models") as r:
                assert r.status == 200
                served.add((await r.json())["worker"])
    assert served & embedders and served - embedders  # both models' workers answer it, in turn
    await until(running.picker.is_idle, "an untracked request was tracked")


# --- a client that leaves the admission queue -----------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def queueing(log_dir) -> AsyncIterator[tuple[RunningPicker, str, list[EchoWorker]]]:
    workers = await start_echo_workers(1)
    config = PickerConfig(
        # Dynamo's cost: the held prompt saturates its worker until its first token
        router=RouterConfig(
            block_size=16, use_kv_events=False, router_queue_threshold=0.0, prefill_load_model="none"
        ),
        workers=(WorkerConfig("w0", workers[0].address, MODEL),),
        models=(ModelConfig(MODEL),),
        port=0,
        health_port=0,
        seed=3,
    )
    picker = await start_picker(replace(config, queue_max_wait_s=10.0))
    yaml = render_envoy_config("buffered", picker_address=f"127.0.0.1:{picker.port}")
    envoy = start_envoy(yaml, log_path=log_dir / "envoy-queue.log")
    try:
        yield picker, envoy.url, workers
    finally:
        envoy.stop()
        await picker.stop(0)
        await workers[0].stop()


async def test_a_client_that_leaves_the_queue_leaves_no_task_behind(queueing, caplog) -> None:
    """Issue 19: "Task was destroyed but it is pending!" logged at ERROR when queued clients left:
    the servicer waited for the queue's notices with a task of its own (`Event.wait`) that nothing
    cancelled when the stream went away. Now the notice is a plain future and every task the
    request started ends with it."""
    running, url, workers = queueing
    gate = running.picker.gate(MODEL)
    before = running_tasks()
    with destroyed_pending(caplog) as destroyed:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

            async def post(query: str = "") -> int:
                async with http.post(f"{url}/v1/chat/completions{query}", json=chat("q " * 30)) as r:
                    await r.read()
                    return r.status

            holder = asyncio.ensure_future(post("?hold=q"))
            await until(lambda: len(running.picker.pools[MODEL].router.sequences) == 1, "not routed")
            leaving = asyncio.ensure_future(post())
            await until(lambda: len(gate) == 1, "the second request did not queue")
            leaving.cancel()
            await until(lambda: len(gate) == 0, "the client that left stayed in the queue")
            workers[0].release("q")
            assert await holder == 200
        await until(running.picker.is_idle, "load was left behind")
        left = await new_tasks_left(before)
    assert not left and not destroyed, (left, destroyed)
