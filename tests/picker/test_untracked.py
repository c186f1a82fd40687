"""Requests that are not generation requests: routed on load, not tracked, to the right model's workers.

Issue 19: `/v1/models` and `/v1/embeddings` always went to the first model's workers. A body that
names a model (embeddings, rerank, ...) now goes to that model's workers; one that names none (GET
/v1/models, /health) to any worker, the models taken in turn.
"""

from __future__ import annotations

import json

import pytest

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.errors import NoEligibleWorker, UnknownModel
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig

MiB = 1024 * 1024


def two_models() -> EndpointPicker:
    workers = (
        WorkerConfig("a0", "127.0.0.1:8000", "model-a"),
        WorkerConfig("a1", "127.0.0.2:8000", "model-a"),
        WorkerConfig("b0", "127.0.1.1:8000", "embedder"),
        WorkerConfig("b1", "127.0.1.2:8000", "embedder"),
    )
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=workers,
        models=(ModelConfig("model-a"), ModelConfig("embedder")),
        seed=1,
    )
    return EndpointPicker(config)


async def route(picker, path, body=None, subset=None):
    return await picker.pick(body=body, path=path, headers={}, subset=subset, client_request_id="u")


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/rerank", "/tokenize", "/v1/embeddings?x=1"])
async def test_a_body_naming_a_model_goes_to_that_models_workers(path) -> None:
    picker = two_models()
    body = json.dumps({"model": "embedder", "input": "hello"}).encode()
    for _ in range(6):
        chosen = await route(picker, path, body)
        assert chosen.model == "embedder" and str(chosen.worker.worker_id) in {"b0", "b1"}
        assert not chosen.tracked
    assert picker.is_idle()


async def test_a_large_body_naming_a_model_is_read_off_the_loop_and_routed_there() -> None:
    picker = two_models()
    body = json.dumps({"model": "embedder", "input": ["x" * 1000] * 1000}).encode()
    try:
        chosen = await route(picker, "/v1/embeddings", body)
        assert chosen.model == "embedder" and picker.bodies.stats.in_worker == 1
    finally:
        await picker.close()


async def test_an_unknown_model_in_an_embeddings_body_is_a_404() -> None:
    with pytest.raises(UnknownModel):
        await route(two_models(), "/v1/embeddings", json.dumps({"model": "nope", "input": "x"}).encode())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/models", None),
        ("/health", None),
        ("/v1/embeddings", b'{"input": "x"}'),
        ("/v1/audio", b"\x00raw"),
    ],
)
async def test_without_a_model_any_worker_serves_the_models_in_turn(path, body) -> None:
    picker = two_models()
    models = [(await route(picker, path, body)).model for _ in range(4)]
    assert models == ["model-a", "embedder", "model-a", "embedder"]


async def test_without_a_model_a_subset_hint_finds_the_model_it_allows() -> None:
    picker = two_models()
    for _ in range(3):  # whichever model's turn it is, only the embedder's worker is allowed
        chosen = await route(picker, "/v1/models", subset=["127.0.1.2:8000"])
        assert str(chosen.worker.worker_id) == "b1"
    with pytest.raises(NoEligibleWorker):
        await route(picker, "/v1/models", subset=["10.9.9.9:1"])


@pytest.mark.parametrize(
    "path",
    [
        "/v1/realtime?model=embedder",
        "/v1/realtime?intent=transcription&model=embedder",
        "/v1/realtime?model=&model=embedder",  # the first non-empty one
        "/v1//realtime?model=embedd%65r",  # normalised, decoded
        "/v1/realtime?mo%64el=embedder",
    ],
)
async def test_a_realtime_connection_goes_to_the_workers_of_the_model_its_query_names(path) -> None:
    """The OpenAI clients open `/v1/realtime?model=...` (a WebSocket, routed on its headers alone)."""
    picker = two_models()
    for _ in range(4):
        chosen = await route(picker, path)
        assert chosen.model == "embedder" and not chosen.tracked


async def test_a_realtime_model_nobody_serves_is_a_404() -> None:
    with pytest.raises(UnknownModel):
        await route(two_models(), "/v1/realtime?model=nope")


@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/realtime?model=", "/v1/models?model=embedder"])
async def test_a_model_in_the_query_counts_only_for_a_realtime_connection(path) -> None:
    picker = two_models()
    assert [(await route(picker, path)).model for _ in range(2)] == ["model-a", "embedder"]
