"""Dynamo's ZMQ event plane steering real requests: Dynamo 1.6.1's own publishers (a child process,
`event_plane="zmq"`, file discovery, no NATS anywhere) tell the picker which worker caches a prompt,
and requests sent through a real Envoy go there.

The picker is configured from a Dynamo user's flags (`--event-plane zmq --discovery-backend file
--file-kv <store>`) and runs in this process behind Envoy (a child process); the two mock workers
publish nothing themselves. Every process is stopped by pid; everything binds 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import pytest
import pytest_asyncio

from extproc.config import load_config
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.router import KvRouter, Worker
from extproc.runtime.server import RunningPicker
from tests.e2e.harness import behind_envoy
from tests.e2e.test_kv_events_e2e import chat, prompt_tokens, send
from tests.nats.dynamo_helpers import DynamoWorker, require_dynamo
from tests.nats.test_dynamo_zmq_plane import heard
from tests.replica_helpers import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16
INSTANCE_IDS = {"w0": 4100, "w1": 4101}  # the Dynamo instance ids the publishers name


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dynamo-zmq-plane-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(2, log_dir, speedup=50.0, block_size=BLOCK, kv_events=False)
    yield started
    for w in started:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dynamo(log_dir: Path) -> AsyncIterator[DynamoWorker]:
    require_dynamo()
    store = log_dir / "dynamo_store_kv"
    process = await DynamoWorker.start(
        None, log_dir / "dynamo-worker.log", DYNAMO_WORKER_DISCOVERY="file", DYN_FILE_KV=str(store)
    )
    try:
        for name, iid in INSTANCE_IDS.items():
            await process.publisher(name, iid)
            await process.call("removed", name=name, block_hashes=[0])  # advertised at its first event
        yield process
    finally:
        await process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workers, dynamo, log_dir) -> AsyncIterator[tuple[RunningPicker, str]]:
    path = log_dir / "picker.yaml"
    lines = ["workers:"] + [
        f'  - {{id: {w.worker_id}, endpoint: "{w.endpoint}", model: {MODEL}, '
        f"instance-id: {INSTANCE_IDS[w.worker_id]}}}"
        for w in workers
    ]
    path.write_text("\n".join(lines) + "\n")
    store = log_dir / "dynamo_store_kv"
    argv = [
        "--config",
        str(path),
        "--kv-cache-block-size",
        str(BLOCK),
        "--dynamo-endpoint",
        "ns1.backend.generate",
    ]
    argv += ["--event-plane", "zmq", "--discovery-backend", "file", "--file-kv", str(store)]
    config = dataclasses.replace(load_config(argv, environ={}), port=0, health_port=0, admin_port=0)
    async with behind_envoy(config, log_dir, workers=[w.endpoint for w in workers]) as (picker, envoy):
        yield picker, envoy.url


def cached(router: KvRouter, hashes: list[int], worker: Worker) -> bool:
    return router.indexer.find_matches(hashes).get(worker) == len(hashes)


async def test_a_prompt_goes_to_the_worker_whose_dynamo_publisher_says_it_caches_it(stack, dynamo, workers):
    picker, url = stack
    router = picker.picker.pools[MODEL].router
    plane = picker.sources.zmq_plane
    assert plane is not None
    for name in INSTANCE_IDS:
        await heard(dynamo, name, Worker(name), plane)
    for n, cached_on in enumerate(["w1", "w1", "w0", "w1"]):
        body = chat(f"conversation {n}: what the engines' own events say decides the worker " * 12)
        tokens = await prompt_tokens(picker, body)
        hashes = router.block_hashes(tokens)
        full = len(hashes) * BLOCK
        await dynamo.stored(cached_on, tokens[:full], [9000 + 100 * n + i for i in range(len(hashes))])
        await until(
            partial(cached, router, hashes, Worker(cached_on)),
            10.0,
            "the publisher's blocks reach the picker",
        )
        served = await send(url, body)
        assert served.headers["x-worker-id"] == cached_on
    assert picker.sources.counters["zmq_plane.event"] >= 4
