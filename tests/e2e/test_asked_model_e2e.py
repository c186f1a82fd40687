"""A rewritten request's answer names the model its client asked for, through a real Envoy 1.40.

The worker replays what vLLM 0.33.0 and SGLang write for the model a request is sent as, byte for
byte (`tests/request/engines/*/answers.json`, recorded from the engines' own serving code by
`tests/request/engines/generate_answer_fixtures.py`): a non-streamed JSON answer with its
content-length, and an event stream written in small pieces so that Envoy hands the picker chunks
cut anywhere, inside `"model":"..."` too. The `openai` client asks for `foodreview`; an
InferenceModelRewrite sends it as the adapter `foodreview-v2`, and the client must read
`foodreview` in every answer, in both of our Envoy templates (a STREAMED answer body after a
BUFFERED request; FULL_DUPLEX_STREAMED both ways). The `x-gateway-model-name-rewrite` header does
the same without a rule.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from aiohttp import web

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.devstack.envoy_config import Variant
from extproc.picker.inference_extension import MODEL_REWRITE_HEADER
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker

from ..config.test_inference_extension import rewrite
from .harness import EnvoyProcess, behind_envoy
from .test_admission_e2e import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENGINES_DIR = Path(__file__).resolve().parents[1] / "request" / "engines"
ENGINES = sorted(p.parent.name for p in ENGINES_DIR.glob("*/answers.json"))
BASE = "meta-llama/Llama-3.1-8B-Instruct"  # a recorded name with a slash: the served base model
ADAPTER = "foodreview-v2"  # the other recorded name: the adapter a rule sends `foodreview` to
ROLLOUT = "  - matches:\n    - model: {value: foodreview}\n    targets:\n    - modelRewrite: foodreview-v2\n"
PIECE = 7  # bytes per write of a replayed event stream


def recorded(engine: str) -> dict[str, Any]:
    return json.loads((ENGINES_DIR / engine / "answers.json").read_text())


class ReplayWorker:
    """Answers /v1/chat/completions and /v1/completions with an engine's recorded bytes for the
    body's model: JSON with its content-length, or the event stream in `PIECE`-byte writes.

    An event stream's first write ends inside its first `"model":"<name>"` member, and the rest is
    written only once `first_tokens()` (the picker's count of first tokens) says the picker had
    that chunk: Envoy would otherwise pass the small writes on as one chunk."""

    def __init__(self, answers: dict[str, Any], metrics: bytes | None = None) -> None:
        """`metrics`: what its /metrics answers (an engine's exposition), when given."""
        self.by_model: dict[str, dict[str, str]] = answers["by_model"]
        self.metrics = metrics
        self.sent: list[str] = []  # the model of each request, as it arrived
        self.first_tokens: Callable[[], int] = lambda: 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> ReplayWorker:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._answer)
        app.router.add_post("/v1/completions", self._answer)
        if self.metrics is not None:
            app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics, content_type="text/plain")

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.sent.append(body["model"])
        kind = "chat" if request.path.endswith("chat/completions") else "completion"
        if not body.get("stream"):
            return web.Response(
                body=self.by_model[body["model"]][f"{kind}_json"].encode(), content_type="application/json"
            )
        stream = self.by_model[body["model"]][f"{kind}_sse"].encode()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        cut = stream.index(b'"model":') + len(b'"model":"') + 4  # inside the served name
        seen = self.first_tokens()
        await response.write(stream[:cut])
        await until(lambda: self.first_tokens() > seen)  # the picker had the chunk cut there
        for start in range(cut, len(stream), PIECE):
            await response.write(stream[start : start + PIECE])
        await response.write_eof()
        return response


@asynccontextmanager
async def replay_behind_envoy(
    worker: ReplayWorker,
    root: Path,
    mode: Variant,
    resources: str,
    adapters: tuple[str, ...] = (ADAPTER,),
    **options: Any,
) -> AsyncIterator[tuple[RunningPicker, EnvoyProcess]]:
    """The picker for `worker` (serving BASE and `adapters`, reading `resources`; `options`: more of
    PickerConfig) behind a real Envoy of template `mode`, the worker told the picker's first tokens."""
    path = root / "resources.yaml"
    path.write_text(resources)
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=(WorkerConfig("w0", f"127.0.0.1:{worker.port}", BASE),),
        models=(ModelConfig(BASE, lora_adapters=adapters),),
        port=0,
        health_port=0,
        inference_extension=InferenceExtensionConfig(str(path), Pool(), read_resources(str(path), Pool())),
        **options,
    )
    async with behind_envoy(config, root, mode) as (picker, envoy):
        ttft = picker.picker.metrics.ttft
        worker.first_tokens = lambda: sum(ttft.child((BASE,))[0])
        yield picker, envoy


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=[(e, m) for e in ENGINES for m in ("buffered", "duplex")]
)
async def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[RunningPicker, str, ReplayWorker]]:
    engine, mode = request.param
    root = tmp_path_factory.mktemp(f"asked-model-{engine}-{mode}")
    worker = await ReplayWorker(recorded(engine)).start()
    try:
        async with replay_behind_envoy(worker, root, mode, rewrite("foodreview-rollout", ROLLOUT)) as (
            picker,
            envoy,
        ):
            yield picker, envoy.url, worker
    finally:
        await worker.stop()


async def test_both_engines_answers_are_recorded() -> None:
    """The stack's params come from the files: none found would run no test here."""
    assert ENGINES == ["sglang-0.5.23", "vllm-0.33.0"]


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def test_a_chat_completion_sent_as_the_adapter_is_answered_as_asked(stack) -> None:
    picker, url, worker = stack
    async with client(url) as openai_client:
        answer = await openai_client.chat.completions.create(
            model="foodreview", messages=[{"role": "user", "content": "Was the soup good?"}], max_tokens=3
        )
        raw = await openai_client.chat.completions.with_raw_response.create(
            model="foodreview", messages=[{"role": "user", "content": "And the bread?"}], max_tokens=3
        )
    assert worker.sent[-2:] == [ADAPTER, ADAPTER]  # the engine served the adapter the rule chose
    assert answer.model == "foodreview" and answer.choices[0].message.content
    assert raw.http_response.headers.get("content-length") is None  # the length changed: sent chunked
    assert json.loads(raw.http_response.content)["model"] == "foodreview"
    await until(picker.picker.is_idle)


async def test_every_streamed_chunk_names_the_asked_model(stack) -> None:
    picker, url, worker = stack
    async with client(url) as openai_client:
        events = await openai_client.chat.completions.create(
            model="foodreview",
            messages=[{"role": "user", "content": "Describe the soup."}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in events]
        completion = await openai_client.completions.create(
            model="foodreview", prompt="The soup was", max_tokens=3, stream=True
        )
        pieces = [piece async for piece in completion]
    assert worker.sent[-2:] == [ADAPTER, ADAPTER]
    assert len(chunks) >= 4 and {c.model for c in chunks} == {"foodreview"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert len(pieces) >= 2 and {p.model for p in pieces} == {"foodreview"}
    await until(picker.picker.is_idle)


async def test_the_header_sends_the_request_as_the_model_it_names(stack) -> None:
    picker, url, worker = stack
    async with client(url) as openai_client:
        answer = await openai_client.completions.create(
            model="llama-8b", prompt="Hi", max_tokens=3, extra_headers={MODEL_REWRITE_HEADER: BASE}
        )
        plain = await openai_client.completions.create(model=BASE, prompt="Hi", max_tokens=3)
    assert worker.sent[-2:] == [BASE, BASE]
    assert answer.model == "llama-8b"  # said again as asked, a slash in the served name or not
    assert plain.model == BASE  # a request sent as asked: its answer passes untouched
    await until(picker.picker.is_idle)


async def test_answers_in_parallel_keep_their_own_names(stack) -> None:
    """Each stream restores its own request's name: none leaks into another's answer."""
    picker, url, _ = stack

    async def ask(model: str, header: str | None) -> str:
        async with client(url) as openai_client:
            answer = await openai_client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"{model}?"}],
                max_tokens=3,
                extra_headers={MODEL_REWRITE_HEADER: header} if header else None,
            )
        return answer.model

    asked = [("foodreview", None), ("llama-8b", BASE), (BASE, None), ("foodreview", BASE)] * 3
    got = await asyncio.gather(*(ask(model, header) for model, header in asked))
    assert got == [model for model, _ in asked]  # the rule wins over the header for `foodreview`
    await until(picker.picker.is_idle)
