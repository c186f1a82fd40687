"""Audio uploads through a real Envoy 1.40 to the worker of the model their form names.

A deployment that serves a chat model and a speech model behind one picker: the `openai` client's
`audio.transcriptions.create` and `curl -F` send multipart forms whose `model` field names the
model. The two workers are FastAPI apps (vLLM's and SGLang's framework; FastAPI's `Form()` parses
the form with python-multipart, as theirs do) with the engines' own handler signatures for
`/v1/audio/transcriptions`, vLLM 0.33.0's `Annotated[TranscriptionRequest, Form()]` and SGLang
0.5.23's `File(...)` and `Form(default="default")` parameters (no GPU here, so they answer with
what they read instead of a transcript). Each answers 404 for a model it does not serve, as vLLM
does. Every upload must reach its model's worker whole; in duplex mode one of 20 MiB, over the
picker's 16 MiB body limit, is routed on its first bytes and streams on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

import openai
import pytest
import pytest_asyncio
from fastapi import FastAPI, File, Form, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import Variant
from extproc.router import RouterConfig

from ..picker.test_worker_sessions_edges import fastapi_worker
from .harness import behind_envoy

pytestmark = pytest.mark.asyncio(loop_scope="module")

SPEECH = "openai/whisper-large-v3"  # served by the vLLM-like worker
OMNI = "Qwen/Qwen2-Audio-7B-Instruct"  # served by the SGLang-like worker
CURL_TIMEOUT_S = 60.0


def answer(worker: str, served: str, model: str | None, audio: bytes) -> JSONResponse:
    if model not in (served, None, "default"):  # vLLM's `_check_model`: its own error for another model
        message = f"The model `{model}` does not exist."
        return JSONResponse({"error": {"message": message, "type": "NotFoundError", "code": 404}}, 404)
    digest = hashlib.sha256(audio).hexdigest()
    return JSONResponse({"text": f"{worker}:{served}:{len(audio)}:{digest}"})


class TranscriptionRequest(BaseModel):
    """The fields of vLLM 0.33.0's `TranscriptionRequest` this test sends (its others have defaults)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    file: UploadFile
    model: str | None = None
    language: str | None = None


def vllm_like() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/audio/transcriptions")
    async def create_transcriptions(request: Annotated[TranscriptionRequest, Form()]) -> JSONResponse:
        return answer("vllm", SPEECH, request.model, await request.file.read())

    return app


def sglang_like() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/audio/transcriptions")
    async def openai_v1_audio_transcriptions(  # SGLang's own parameters, FastAPI's default-call style
        file: UploadFile = File(...),  # noqa: B008
        model: str = Form(default="default"),
        language: str | None = Form(default=None),
    ) -> JSONResponse:
        return answer("sglang", OMNI, model, await file.read())

    return app


def one_worker_per_model(workers: dict[str, tuple[str, str]]) -> PickerConfig:
    """A picker (free ports, no KV events, no session calls) for `{model: (worker id, endpoint)}`."""
    return PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=tuple(WorkerConfig(worker, endpoint, model) for model, (worker, endpoint) in workers.items()),
        models=tuple(ModelConfig(model) for model in workers),
        port=0,
        health_port=0,
        worker_session_control="off",
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["buffered", "duplex"])
async def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    variant: Variant = request.param
    async with fastapi_worker(vllm_like()) as speech, fastapi_worker(sglang_like()) as omni:
        config = one_worker_per_model({SPEECH: ("vllm", speech), OMNI: ("sglang", omni)})
        log_dir = tmp_path_factory.mktemp(f"audio-{variant}")
        async with behind_envoy(config, log_dir, variant, workers={SPEECH: [speech], OMNI: [omni]}) as (
            _,
            envoy,
        ):
            yield envoy.url, variant


def transcribed(text: str, worker: str, served: str, audio: bytes) -> bool:
    return text == f"{worker}:{served}:{len(audio)}:{hashlib.sha256(audio).hexdigest()}"


async def test_the_openai_client_uploads_reach_the_worker_of_the_model_they_name(stack) -> None:
    url, _ = stack
    audio = bytes(range(256)) * 400
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        # not in turns: a picker that sent uploads to the models in turn would match an alternating order
        for model, worker in [(SPEECH, "vllm"), (SPEECH, "vllm"), (OMNI, "sglang"), (OMNI, "sglang")] * 2:
            result = await client.audio.transcriptions.create(model=model, file=("a.wav", audio, "audio/wav"))
            assert transcribed(result.text, worker, model, audio), result.text


async def test_curl_with_the_file_before_the_model_reaches_the_right_worker(stack, tmp_path: Path) -> None:
    url, _ = stack
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("this test runs the host's curl binary, and none is on PATH (apt-get install curl)")
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"\x07" * 300_000)
    for model, worker in [(OMNI, "sglang"), (SPEECH, "vllm")]:
        args = [curl, "-sS", "-F", f"file=@{audio}", "-F", f"model={model}", f"{url}/v1/audio/transcriptions"]
        done = await asyncio.to_thread(subprocess.run, args, capture_output=True, timeout=CURL_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        assert transcribed(json.loads(done.stdout)["text"], worker, model, audio.read_bytes())


async def test_an_upload_over_the_body_limit_streams_on_in_duplex_mode(stack) -> None:
    """Duplex: routed on the form's first bytes, the 20 MiB file is never held by the picker (its
    --max-body-bytes is 16 MiB). Buffered: Envoy holds the whole body first, up to its
    `request_body_buffer_limit` (4 MiB in our configs): Envoy refuses it."""
    url, variant = stack
    audio = b"\x08" * (20 << 20)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        if variant == "duplex":
            result = await client.audio.transcriptions.create(
                model=SPEECH, file=("a.wav", audio, "audio/wav")
            )
            assert transcribed(result.text, "vllm", SPEECH, audio)
        else:
            # Envoy answers 413 while the client still sends, and closes: the client reads the 413 or,
            # when its write meets the closed connection first, a connection error
            with pytest.raises((openai.APIStatusError, openai.APIConnectionError)) as refused:
                await client.audio.transcriptions.create(model=SPEECH, file=("a.wav", audio, "audio/wav"))
            assert getattr(refused.value, "status_code", 413) == 413
