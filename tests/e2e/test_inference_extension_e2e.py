"""InferenceObjectives end to end: the `openai` client names its objective in the
x-gateway-inference-objective header (`extra_headers`), a real Envoy 1.40 passes it to the picker,
whose admission queue orders held requests by the objective's priority and sheds the negative ones
429 when their wait ends. The objectives file is mounted as a kubelet mounts a ConfigMap
(`objectives.yaml -> ..data/objectives.yaml`, `..data` a symlink swapped atomically on update), and
the picker reads the new version while it serves.

One echo worker that holds answers until the test releases them: with `router_queue_threshold = 0`
one prompt in prefill saturates it, so every later request waits in the queue.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from extproc.config import ModelConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.devstack.stack import MODEL
from extproc.picker.inference_extension import FAIRNESS_HEADER, OBJECTIVE_HEADER
from extproc.runtime.server import RunningPicker

from ..config.test_inference_extension import objective, rewrite
from .harness import EchoWorker, behind_envoy, start_echo_workers
from .test_admission_e2e import MESSAGE_TIMEOUT_MS, config, until

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_WAIT_S = 1.5
POOL = "vllm-qwen3-32b"
HOLDS = itertools.count()
OBJECTIVES = "---\n".join(
    [objective("interactive", 10), objective("batch", -1), objective("other-pools", 99, pool="other")]
)


class ConfigMapVolume:
    """A directory laid out as the kubelet lays out a mounted ConfigMap, updated as it updates it."""

    def __init__(self, root: Path, key: str = "objectives.yaml") -> None:
        self.root, self.key, self.version = root, key, 0
        root.mkdir()
        (root / key).symlink_to(Path("..data") / key)

    @property
    def path(self) -> Path:
        return self.root / self.key

    def write(self, text: str) -> None:
        self.version += 1
        data = self.root / f"..2026_11_28_v{self.version}"
        data.mkdir()
        (data / self.key).write_text(text)
        staged = self.root / "..data_tmp"
        staged.symlink_to(data.name)
        os.replace(staged, self.root / "..data")  # the atomic swap


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[RunningPicker, str, EchoWorker, ConfigMapVolume]]:
    root = tmp_path_factory.mktemp("objectives-e2e")
    volume = ConfigMapVolume(root / "objectives")
    volume.write(OBJECTIVES)
    pool = Pool(POOL)
    resources = InferenceExtensionConfig(str(volume.path), pool, read_resources(str(volume.path), pool))
    (worker,) = await start_echo_workers(1)
    cfg = replace(
        config([worker.address], router_queue_threshold=0.0),
        queue_max_wait_s=MAX_WAIT_S,
        inference_extension=resources,
    )
    try:
        async with behind_envoy(cfg, root, message_timeout_ms=MESSAGE_TIMEOUT_MS) as (picker, envoy):
            yield picker, envoy.url, worker, volume
    finally:
        await worker.stop()


async def ask(
    url: str, text: str, objective_name: str | None = None, hold: str | None = None, tenant: str | None = None
) -> str:
    """A chat completion through Envoy (`tenant`: its fairness id); returns `text` once it is
    answered 200."""
    headers = {OBJECTIVE_HEADER: objective_name} if objective_name else {}
    if tenant is not None:
        headers[FAIRNESS_HEADER] = tenant
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{text} " * 30}],
            max_tokens=4,
            extra_headers=headers or None,
            extra_query={"hold": hold} if hold else None,
        )
    return text


async def in_answer_order(
    picker: RunningPicker,
    url: str,
    worker: EchoWorker,
    queued: list[tuple[str, str | None]],
    tenants: dict[str, str] | None = None,
) -> list[str]:
    """Saturate the worker, queue `queued` ((text, objective) in this order; `tenants`: text ->
    fairness id), free the worker and return the texts in the order they were answered (one worker:
    the order they were routed)."""
    gate = picker.picker.gate(MODEL)
    key = f"hold-{next(HOLDS)}"
    held = asyncio.create_task(ask(url, "held", hold=key))
    await until(lambda: key in worker.holding)
    answered: list[str] = []
    tasks = []
    for count, (text, name) in enumerate(queued, 1):
        task = asyncio.create_task(ask(url, text, name, tenant=(tenants or {}).get(text)))
        task.add_done_callback(lambda t: answered.append(t.result()) if not t.exception() else None)
        tasks.append(task)
        await until(lambda count=count: len(gate) == count)  # queued in this order
    worker.release(key)
    await held
    await asyncio.gather(*tasks)
    return answered


async def test_the_queue_serves_the_higher_objective_first_and_the_negative_last(stack) -> None:
    picker, url, worker, _ = stack
    order = await in_answer_order(
        picker, url, worker, [("plain", None), ("batch", "batch"), ("interactive", "interactive")]
    )
    assert order == ["interactive", "plain", "batch"]
    counted = picker.picker.metrics.objective_requests.values
    assert counted[MODEL, "interactive"] >= 1 and counted[MODEL, "batch"] >= 1
    await until(picker.picker.is_idle)


async def test_a_negative_objective_is_shed_429_and_an_unlisted_one_gets_503_when_the_wait_ends(
    stack,
) -> None:
    picker, url, worker, _ = stack
    held = asyncio.create_task(ask(url, "held", hold="shed"))
    await until(lambda: "shed" in worker.holding)
    before = picker.picker.metrics.objective_requests.values.get((MODEL, "unlisted"), 0)
    results = await asyncio.gather(
        ask(url, "batch", "batch"),
        ask(url, "other-pools", "other-pools"),  # in the file, but for another pool: not listed here
        return_exceptions=True,
    )
    shed, refused = results
    assert isinstance(shed, openai.RateLimitError) and "shed" in shed.message
    assert isinstance(refused, openai.APIStatusError) and refused.status_code == 503
    assert picker.picker.metrics.objective_requests.values[MODEL, "unlisted"] == before + 1
    worker.release("shed")
    await held
    await until(picker.picker.is_idle)


async def test_a_configmap_update_changes_the_priorities_while_the_picker_serves(stack) -> None:
    picker, url, worker, volume = stack
    objectives = picker.picker.inference.file
    assert objectives is not None
    readings = objectives.readings
    assert objectives.priority("promoted") is None  # not listed yet: its requests are of priority 0
    volume.write(OBJECTIVES + "---\n" + objective("promoted", 20))
    # the file is looked at once a second at most, when a request names an objective
    deadline = asyncio.get_running_loop().time() + 10.0
    while objectives.readings == readings:
        assert asyncio.get_running_loop().time() < deadline, "the updated ConfigMap was not read"
        await ask(url, "poll", "interactive")
        await asyncio.sleep(0.2)
    order = await in_answer_order(
        picker, url, worker, [("interactive", "interactive"), ("promoted", "promoted")]
    )
    assert order == ["promoted", "interactive"]
    await until(picker.picker.is_idle)


# --- InferenceModelRewrite ----------------------------------------------------------------------

ADAPTERS = ("foodreview-v1", "foodreview-v2")
ROLLOUT = """\
  - matches:
    - model: {value: foodreview}
    targets:
    - modelRewrite: foodreview-v2
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["buffered", "duplex"])
async def rewrite_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[RunningPicker, str, EchoWorker, str]]:
    """One echo worker serving the base model and its two adapters, a picker with a rewrite that
    sends `foodreview` to `foodreview-v2`, and an Envoy whose request body mode is the param."""
    root = tmp_path_factory.mktemp(f"rewrite-{request.param}")
    path = root / "resources.yaml"
    path.write_text(rewrite("foodreview-rollout", ROLLOUT))
    resources = InferenceExtensionConfig(str(path), Pool(), read_resources(str(path), Pool()))
    (worker,) = await start_echo_workers(1)
    cfg = replace(
        config([worker.address]),
        models=(ModelConfig(MODEL, lora_adapters=ADAPTERS),),
        inference_extension=resources,
    )
    try:
        async with behind_envoy(cfg, root, request.param) as (picker, envoy):
            yield picker, envoy.url, worker, request.param
    finally:
        await worker.stop()


async def test_the_worker_receives_the_rewritten_model_with_a_body_envoy_accepts(rewrite_stack) -> None:
    picker, url, worker, mode = rewrite_stack
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="foodreview",
            messages=[{"role": "user", "content": "Was the soup good? ¿Sí? 🍜 " * 40}],
            max_tokens=4,
            temperature=0.3,
        )
        echoed = raw.http_response.json()
    sent = json.loads(worker.received[-1])
    assert sent["model"] == "foodreview-v2"  # the engine serves the adapter the rewrite chose
    assert sent["messages"][0]["content"] == "Was the soup good? ¿Sí? 🍜 " * 40 and sent["max_tokens"] == 4
    assert echoed["body_len"] == len(worker.received[-1])
    if mode == "buffered":  # Envoy leaves the length to the processor: the picker set the new one
        assert int(echoed["headers"]["content-length"]) == echoed["body_len"]
    else:  # duplex: Envoy drops the length of a body it streams, and sends it chunked
        assert echoed["headers"].get("transfer-encoding") == "chunked"
    assert (
        picker.picker.metrics.model_rewrites.values[("foodreview-rollout", "foodreview", "foodreview-v2")]
        >= 1
    )
    assert picker.picker.metrics.lora_requests.values[(MODEL, "foodreview-v2")] >= 1
    # the base model's requests pass untouched, byte for byte
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "plain"}], max_tokens=4
        )
    assert json.loads(worker.received[-1])["model"] == MODEL
    await until(picker.picker.is_idle)


async def test_the_objective_header_stops_at_the_picker(stack) -> None:
    picker, url, _, _ = stack
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            extra_headers={OBJECTIVE_HEADER: "interactive", "x-other": "kept"},
        )
    received = raw.http_response.json()["headers"]
    assert OBJECTIVE_HEADER not in received and received["x-other"] == "kept"
    await until(picker.picker.is_idle)


# --- fairness between tenants (x-gateway-inference-fairness-id) ------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["global-strict", "round-robin"])
async def fair_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[RunningPicker, str, EchoWorker, str]]:
    """The held worker and an Envoy in front of a picker whose queue fairness is the param."""
    root = tmp_path_factory.mktemp(f"fairness-{request.param}")
    (worker,) = await start_echo_workers(1)
    cfg = replace(
        config([worker.address], router_queue_threshold=0.0, router_queue_fairness=request.param),
        queue_max_wait_s=10.0,
    )
    try:
        async with behind_envoy(cfg, root, message_timeout_ms=MESSAGE_TIMEOUT_MS) as (picker, envoy):
            yield picker, envoy.url, worker, request.param
    finally:
        await worker.stop()


async def test_round_robin_lets_a_tenant_in_before_anothers_burst_is_done(fair_stack) -> None:
    picker, url, worker, fairness = fair_stack
    burst = [(f"a{i}", None) for i in range(4)]
    tenants = {f"a{i}": "tenant-a" for i in range(4)} | {"b0": "tenant-b", "c0": "tenant-c"}
    order = await in_answer_order(picker, url, worker, [*burst, ("b0", None), ("c0", None)], tenants)
    if fairness == "round-robin":
        assert order == ["a0", "b0", "c0", "a1", "a2", "a3"]
    else:  # the Inference Extension's default, and ours: arrival order across tenants
        assert order == ["a0", "a1", "a2", "a3", "b0", "c0"]
    await until(picker.picker.is_idle)
