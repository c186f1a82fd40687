"""Realtime API connections (WebSocket) through a real Envoy 1.40, to the worker of their model.

vLLM 0.33.0 and SGLang 0.5.23 serve realtime transcription at `GET /v1/realtime` over a WebSocket;
the `openai` client's `realtime.connect(model=...)` opens it with the model in the query. Before,
every Envoy template refused the upgrade (403), and with upgrades allowed the handshake hung: the
picker waited for a request body that a WebSocket never ends. Now each template routes upgrades
on their headers alone (`envoy/websocket_route.yaml`) and the picker reads the query's model.

The workers are FastAPI apps that speak the start of vLLM's realtime protocol
(`speech_to_text/realtime/connection.py`): `session.created` on connect, then a `session.update`
naming a model it does not serve is answered with its `model_not_found` error event. Each connection
must land on its model's worker in every template, a model nobody serves is the picker's 404 at the
handshake, and plain HTTP requests on the same Envoy keep their route.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
import websockets
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from extproc.devstack.envoy_config import VARIANTS, Variant

from ..picker.test_worker_sessions_edges import fastapi_worker
from .harness import behind_envoy
from .test_audio_uploads_e2e import one_worker_per_model

pytestmark = pytest.mark.asyncio(loop_scope="module")

SPEECH = "mistralai/Voxtral-Mini-3B-2507"  # served by worker "a"
OTHER = "openai/whisper-large-v3"  # served by worker "b"


def realtime_worker(name: str, served: str) -> FastAPI:
    app = FastAPI()

    @app.websocket("/v1/realtime")
    async def realtime_endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(
            json.dumps({"type": "session.created", "id": f"sess-{name}", "worker": name})
        )
        try:
            while True:
                event = json.loads(await websocket.receive_text())
                if event.get("type") != "session.update":
                    continue
                if event.get("model") != served:  # vLLM's `_check_model`, answered as an error event
                    message = f"The model `{event.get('model')}` does not exist."
                    await websocket.send_text(
                        json.dumps({"type": "error", "error": message, "code": "model_not_found"})
                    )
                else:
                    await websocket.send_text(json.dumps({"type": "session.updated", "worker": name}))
        except WebSocketDisconnect:
            pass

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [{"id": served, "object": "model"}], "worker": name}

    return app


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=VARIANTS)
async def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    variant: Variant = request.param
    speech, other = realtime_worker("a", SPEECH), realtime_worker("b", OTHER)
    async with fastapi_worker(speech) as a, fastapi_worker(other) as b:
        config = one_worker_per_model({SPEECH: ("a", a), OTHER: ("b", b)})
        log_dir: Path = tmp_path_factory.mktemp(f"realtime-{variant}")
        async with behind_envoy(config, log_dir, variant, workers={SPEECH: [a], OTHER: [b]}) as (_, envoy):
            yield envoy.url


async def test_the_openai_clients_realtime_connections_reach_their_models_worker(stack) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack}/v1", api_key="unused", max_retries=0)
    # not in turns: a picker that sent connections to the models in turn would match an alternating order
    for model, worker in [(SPEECH, "a"), (SPEECH, "a"), (OTHER, "b"), (OTHER, "b"), (SPEECH, "a")]:
        async with client.realtime.connect(model=model) as connection:
            created = json.loads(await connection.recv_bytes())
            assert created == {"type": "session.created", "id": f"sess-{worker}", "worker": worker}
            await connection.send({"type": "session.update", "model": model})  # type: ignore[arg-type, misc]
            assert json.loads(await connection.recv_bytes()) == {"type": "session.updated", "worker": worker}


async def test_a_realtime_model_nobody_serves_is_refused_at_the_handshake(stack) -> None:
    url = stack.replace("http://", "ws://")
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"{url}/v1/realtime?model=nope", open_timeout=10):
            pass
    assert refused.value.response.status_code == 404
    assert b"nope" in refused.value.response.body


async def test_http_requests_keep_their_route_beside_websockets(stack) -> None:
    async with aiohttp.ClientSession() as session:
        workers = set()
        for _ in range(4):
            async with session.get(f"{stack}/v1/models") as answer:
                assert answer.status == 200
                workers.add((await answer.json())["worker"])
    assert workers == {"a", "b"}  # a request naming no model: any worker, the models in turn
