"""A LoRA adapter end to end: the `openai` client asks a real Envoy for model `sql-lora`, the picker
rebuilds its router from vLLM 0.33.0's own replay bytes over ZMQ, and the request lands on the
worker whose engine cached the prompt under that adapter, not on the one that cached it without.
Likewise a second served name (`--served-model-name llama llama-3.1`) that the picker learned from
the workers' model lists, vLLM 0.33.0's own `/v1/models` body: it is the base model's.

Each engine is a scripted ZMQ endpoint serving a recorded vLLM replay verbatim
(`tests/events/engines/vllm-0.33.0/standard.json`): `w0`'s engine the whole capture (sql-lora
holds the prompt's first two blocks, the base model none), `w1`'s its first two batches and the
end marker (the base model holds all three). The workers are echo servers; Envoy is a child
process; the picker runs in-process so the test can read its metrics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from extproc.config import DiscoveryConfig, EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import start_envoy
from extproc.router import RouterConfig, Worker
from extproc.runtime.server import RunningPicker, start_picker

from ..events.test_engine_fixtures import BS, Recorded, exchange
from ..events.zmq_fakes import FakeEngine
from ..replica_helpers import until
from ..runtime.test_lora_discovery import body
from .harness import EchoWorker, start_echo_workers

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL, ALIAS = "llama", "llama-3.1"  # the served names of vLLM's recorded model list
ADAPTER = "sql-lora"
PROMPT = list(range(1000, 1048))  # three blocks; vLLM cached the first two under sql-lora too


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[tuple[RunningPicker, str, list[EchoWorker]]]:
    _, reply = exchange("vllm/standard", 0)
    scripts = {"w0": reply, "w1": [*reply[:2], reply[-1]]}  # w1: two batches, then the end marker
    engines = {wid: FakeEngine(Recorded("vllm/standard", {0: frames})) for wid, frames in scripts.items()}
    for engine in engines.values():
        engine.start()
    workers = await start_echo_workers(2)
    for worker in workers:
        worker.models = body("vllm", "static-and-loaded")  # --served-model-name llama llama-3.1
    config = PickerConfig(
        router=RouterConfig(block_size=BS, use_kv_events=True, prefill_load_model="none"),
        workers=tuple(
            WorkerConfig(wid, w.address, MODEL, kv_events=e.pub_endpoint, kv_replay=e.replay_endpoint)
            for (wid, e), w in zip(engines.items(), workers, strict=True)
        ),
        models=(ModelConfig(MODEL, lora_adapters=(ADAPTER,)),),
        port=0,
        health_port=0,
        events=EventsConfig(),
        discovery=DiscoveryConfig(lora_interval_s=0.2),
        seed=5,
    )
    picker = await start_picker(config)
    log_dir: Path = tmp_path_factory.mktemp("lora-e2e")
    addresses = [w.address for w in workers]
    envoy_yaml = render_envoy_config("buffered", picker_address=f"127.0.0.1:{picker.port}", workers=addresses)
    envoy = start_envoy(envoy_yaml, log_path=log_dir / "envoy.log")
    try:
        router = picker.picker.pools[MODEL].router
        held = {"w0": 8, "w1": 3}  # each engine's blocks after its replay (w0: the manifest's final count)
        await until(
            lambda: all(router.indexer.num_blocks(Worker(w)) == n for w, n in held.items()),
            10.0,
            "both engines' replays applied",
        )
        await until(lambda: picker.picker.aliases(MODEL) == [ALIAS], 10.0, "the workers' names read")
        yield picker, envoy.url, workers
    finally:
        envoy.stop()
        await picker.stop(0)
        for w in workers:
            await w.stop()
        for engine in engines.values():
            await engine.close()


async def complete(url: str, model: str) -> str:
    """The echo worker that served `model`'s completion of PROMPT."""
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        raw = await client.completions.with_raw_response.create(model=model, prompt=PROMPT, max_tokens=4)
        return str(raw.http_response.json()["worker"])


def chosen_overlap(picker: RunningPicker) -> float:
    return picker.picker.metrics.overlap.values.get((MODEL, "chosen"), 0)


async def test_an_adapter_request_goes_to_the_worker_that_cached_it_under_that_adapter(stack):
    picker, url, workers = stack
    before = chosen_overlap(picker)
    counted = picker.picker.metrics.lora_requests.values
    routed_before = counted.get((MODEL, ADAPTER), 0)
    assert await complete(url, ADAPTER) == workers[0].address
    assert chosen_overlap(picker) - before == 2  # sql-lora's blocks; the base model's 3 on w1 do not match
    assert await complete(url, MODEL) == workers[1].address  # the same prompt, base model: w1's blocks
    assert chosen_overlap(picker) - before == 2 + 3
    # counted under its name (listed in the config, and in vLLM's own /v1/models body); the base model's not
    assert counted.get((MODEL, ADAPTER), 0) - routed_before == 1 and (MODEL, "unlisted") not in counted


async def test_an_adapter_nobody_serves_is_an_openai_404(stack):
    _, url, _ = stack
    with pytest.raises(openai.NotFoundError) as raised:
        await complete(url, "sql-lora-v2")
    assert "known models" in str(raised.value) and ADAPTER in str(raised.value)


async def test_another_served_name_read_from_the_workers_is_the_base_models(stack):
    picker, url, workers = stack
    before = chosen_overlap(picker)
    assert await complete(url, ALIAS) == workers[1].address  # the base model's blocks, on w1
    assert chosen_overlap(picker) - before == 3
