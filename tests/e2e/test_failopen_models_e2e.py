"""`failopen` with several models, through a real Envoy 1.40 (issue 19).

Issue 19: when the picker does not answer, failopen's round robin spanned every model's workers, so
a request could reach a worker that does not serve its model. Now each worker carries its model as
envoy.lb metadata, json_to_metadata lifts the body's `model`, and the fallback is a subset load
balancer over the model's workers. Five echo workers: `chat` on w0, w1, `embed` on w2, w3, and w4
serving both. Checked with the picker down (nothing listens), hung (never answers: skipped after
message_timeout) and live (its destination is used as it is).
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from extproc.devstack.procs import PortReservation, reserve_port

from .harness import (
    EchoWorker,
    EnvoyUnderTest,
    InProcessPicker,
    envoy_version,
    start_echo_workers,
    start_envoy_variant,
    start_noop_picker,
    start_stalled_picker,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = aiohttp.ClientTimeout(total=20)
STALL_TIMEOUT_MS = 300
DESTINATION = "x-gateway-destination-endpoint"
MODELS = ("chat", "embed")
CONTENT_TYPES: list[str | None] = ["application/json", None, "text/plain"]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("failopen-models")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers() -> AsyncIterator[list[EchoWorker]]:
    started = await start_echo_workers(5)
    yield started
    for worker in started:
        await worker.stop()


def served(workers: list[EchoWorker]) -> dict[str, list[str]]:
    w = [x.address for x in workers]
    return {"chat": [w[0], w[1], w[4]], "embed": [w[2], w[3], w[4]]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stalled() -> AsyncIterator[InProcessPicker]:
    started = await start_stalled_picker()
    yield started
    await started.stop(grace_s=0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def naming_w2(workers: list[EchoWorker]) -> AsyncIterator[InProcessPicker]:
    """A live picker that names w2 (an `embed` worker) for every request."""
    started = await start_noop_picker([workers[2].address])
    yield started
    await started.stop()


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[PortReservation]:
    """An address no worker of Envoy's has (held: nothing listens there)."""
    held = reserve_port()
    yield held
    held.release()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def naming_elsewhere(elsewhere: PortReservation) -> AsyncIterator[InProcessPicker]:
    """A live picker that names an endpoint Envoy's cluster does not list."""
    started = await start_noop_picker([elsewhere.address])
    yield started
    await started.stop()


@pytest.fixture(scope="module")
def envoys(
    workers: list[EchoWorker],
    stalled: InProcessPicker,
    naming_w2: InProcessPicker,
    naming_elsewhere: InProcessPicker,
    elsewhere: PortReservation,
    log_dir: Path,
) -> Iterator[dict[str, EnvoyUnderTest]]:
    dead = reserve_port()  # the picker is down: nothing listens at its address
    pickers = {
        "down": dead.address,
        "hung": stalled.address,
        "names-w2": naming_w2.address,
        "names-elsewhere": naming_elsewhere.address,
    }
    started: dict[str, EnvoyUnderTest] = {}
    try:
        for name, address in pickers.items():
            started[name] = start_envoy_variant(
                "failopen",
                picker_address=address,
                workers=served(workers),  # type: ignore[arg-type]
                log_dir=log_dir,
                message_timeout_ms=STALL_TIMEOUT_MS,
            )
        yield started
    finally:
        for envoy in started.values():
            envoy.stop()
        dead.release()


async def send(url: str, body: bytes | None, content_type: str | None = "application/json") -> dict[str, Any]:
    headers = {"content-type": content_type} if content_type else {}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        if body is None:
            response = await http.get(f"{url}/v1/models")
        else:
            response = await http.post(f"{url}/v1/chat/completions", data=io.BytesIO(body), headers=headers)
        async with response:
            text = await response.text()
            assert response.status == 200, f"{response.status}: {text[:300]}"
            echoed: dict[str, Any] = json.loads(text)
            return echoed


def chat_body(model: str, text: str = "hello") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()


@pytest.mark.parametrize("picker", ["down", "hung"])
async def test_a_request_the_picker_skipped_reaches_only_its_models_workers(
    picker: str, envoys: dict[str, EnvoyUnderTest], workers: list[EchoWorker]
) -> None:
    """Every request of each model, whatever its content type, lands on a worker of that model, and
    the model's workers take turns (w4 serves both)."""
    url = envoys[picker].url
    for model, endpoints in served(workers).items():
        reached = []
        for i in range(6):
            echoed = await send(url, chat_body(model, f"turn {i}"), CONTENT_TYPES[i % 3])
            assert DESTINATION not in echoed["headers"]  # the picker named nobody
            reached.append(echoed["worker"])
        assert set(reached) == set(endpoints), (model, reached)


async def test_a_request_with_no_model_or_an_unknown_one_goes_to_any_worker(
    envoys: dict[str, EnvoyUnderTest], workers: list[EchoWorker]
) -> None:
    """The documented answer: such a request goes to any worker, round robin, which answers for
    itself (a vLLM worker: 404 for a model it does not serve; /v1/models is served)."""
    url = envoys["down"].url
    everyone = {w.address for w in workers}
    for body in (None, chat_body("unknown-model"), b'{"messages": []}', b"not json", b'{"model": 7}'):
        reached = {(await send(url, body))["worker"] for _ in range(len(workers))}
        assert reached == everyone, (body, reached)


async def test_a_body_nested_past_envoys_json_limit_goes_to_any_worker(
    envoys: dict[str, EnvoyUnderTest], workers: list[EchoWorker]
) -> None:
    """Envoy's JSON parser gives up on nesting deeper than about 1,000 levels (Envoy 1.38 and later;
    1.36 and 1.37 read 2,000 levels); such a body carries no model to Envoy and goes to any worker
    (documented)."""
    url = envoys["down"].url
    shallow = b'{"model": "chat", "x": ' + b"[" * 500 + b"]" * 500 + b"}"
    assert {(await send(url, shallow))["worker"] for _ in range(6)} == set(served(workers)["chat"])
    deep = b'{"model": "chat", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    reached = {(await send(url, deep))["worker"] for _ in range(len(workers))}
    everyone = {w.address for w in workers}
    assert reached == (everyone if envoy_version() >= (1, 38) else set(served(workers)["chat"]))


async def test_the_pickers_destination_is_used_as_it_is(
    envoys: dict[str, EnvoyUnderTest], workers: list[EchoWorker]
) -> None:
    """The model's workers are only the fallback: the picker's choice wins (here w2, an `embed`
    worker, for `chat` requests: the picker is the one that knows)."""
    for _ in range(3):
        echoed = await send(envoys["names-w2"].url, chat_body("chat"))
        assert echoed["worker"] == echoed["headers"][DESTINATION] == workers[2].address


async def test_a_destination_envoy_does_not_list_falls_back_to_the_models_workers(
    envoys: dict[str, EnvoyUnderTest], workers: list[EchoWorker], elsewhere: PortReservation
) -> None:
    """A picker naming a worker Envoy's cluster does not list (discovered since the config was
    written): override_host falls back, and the fallback keeps to the request's model."""
    for model, endpoints in served(workers).items():
        reached = set()
        for _ in range(6):
            echoed = await send(envoys["names-elsewhere"].url, chat_body(model))
            assert echoed["headers"][DESTINATION] == elsewhere.address
            reached.add(echoed["worker"])
        assert reached == set(endpoints), (model, reached)
