"""The mock worker over real HTTP in-process: vLLM wire shapes, SSE, errors, metrics, cancellation."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extproc.request.tokenizer import ByteTokenizer
from extproc.sim.engine import Engine, EngineConfig, Pass
from extproc.sim.mock_worker import (
    WORKER,
    MockWorkerConfig,
    TokenizerLike,
    add_mock_worker_arguments,
    config_from_args,
    main,
    make_app,
)

MODEL = "demo-model"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi " * 20}]


def worker_config(speedup: float = 1000.0) -> MockWorkerConfig:
    engine = EngineConfig(block_size=16, num_gpu_blocks=1024)
    return MockWorkerConfig(worker_id="w-test", model=MODEL, engine=engine, speedup=speedup)


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(make_app(worker_config()))) as c:
        yield c


@pytest.fixture
async def slow_client() -> AsyncIterator[TestClient]:
    """Real-time pacing (speedup 1): a long generation is still running when the test looks."""
    async with TestClient(TestServer(make_app(worker_config(speedup=1.0)))) as c:
        yield c


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll `condition` until it holds; fail after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def sse_events(raw: str) -> list[str]:
    """The data payloads of an SSE body, checking every event is `data: ...` followed by a blank line."""
    assert raw.endswith("\n\n")
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: ") :] for e in events]


async def test_chat_completion_has_vllm_shape_usage_and_headers(client: TestClient):
    resp = await client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 5}
    )
    assert resp.status == 200
    body = await resp.json()
    prompt_tokens = len(ByteTokenizer().encode_chat(MESSAGES))
    assert resp.headers["x-worker-id"] == "w-test"
    assert resp.headers["x-prefix-cache-hit-tokens"] == "0"
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == MODEL and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": " tok" * 5, "tool_calls": []}
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
    }


async def test_repeated_prompt_reports_its_cached_prefix(client: TestClient):
    request = {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": 1}
    n = len(ByteTokenizer().encode_chat(MESSAGES))
    await (await client.post("/v1/chat/completions", json=request)).read()
    resp = await client.post("/v1/chat/completions", json=request)
    await resp.read()
    assert int(resp.headers["x-prefix-cache-hit-tokens"]) == (n - 1) // 16 * 16


async def test_without_max_tokens_default_count_and_stop(client: TestClient):
    body = await (await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello"})).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["text"] == " tok" * 16 and choice["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize(
    "prompt, prompt_tokens",
    [("hello", 5), ([5, 6, 7], 3), (["hello"], 5), ([[5, 6, 7, 8]], 4)],
)
async def test_completion_prompt_forms(client: TestClient, prompt: Any, prompt_tokens: int):
    resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert resp.status == 200
    assert (await resp.json())["usage"]["prompt_tokens"] == prompt_tokens


async def test_chat_stream_is_sse_with_role_chunk_tokens_finish_usage_and_done(client: TestClient):
    request = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = await client.post("/v1/chat/completions", json=request)
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["x-worker-id"] == "w-test" and "x-prefix-cache-hit-tokens" in resp.headers
    events = sse_events(await resp.text())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-1]
    assert [c["choices"][0]["delta"] for c in tokens] == [{"content": " tok"}] * 4
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, None, "length"]
    n = len(ByteTokenizer().encode_chat(MESSAGES))
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": n, "completion_tokens": 4, "total_tokens": n + 4}


async def test_completion_stream_without_usage(client: TestClient):
    request = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}
    events = sse_events(await (await client.post("/v1/completions", json=request)).text())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["object"] for c in chunks] == ["text_completion"] * 3
    assert [c["choices"][0]["text"] for c in chunks] == [" tok"] * 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)


async def test_tokenize_matches_the_tokenizer(client: TestClient):
    tok = ByteTokenizer()
    body = await (await client.post("/tokenize", json={"model": MODEL, "prompt": "héllo"})).json()
    assert body == {
        "tokens": tok.encode_text("héllo"),
        "count": 6,
        "max_model_len": 16 * 1024,
        "token_strs": None,
    }
    request = {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": False}
    body = await (await client.post("/tokenize", json=request)).json()
    assert body["tokens"] == tok.encode_chat(MESSAGES, add_generation_prompt=False)
    assert body["count"] == len(body["tokens"])


class ShiftTokenizer:
    """Any object with encode_text / encode_chat will do."""

    def encode_text(self, text: str) -> list[int]:
        return [ord(c) + 1000 for c in text]

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Any = None, add_generation_prompt: bool = True
    ) -> list[int]:
        return self.encode_text("|".join(str(m["content"]) for m in messages))


async def test_a_custom_tokenizer_is_used_for_prompts_and_tokenize():
    tokenizer: TokenizerLike = ShiftTokenizer()
    async with TestClient(TestServer(make_app(worker_config(), tokenizer=tokenizer))) as c:
        body = await (await c.post("/tokenize", json={"prompt": "ab"})).json()
        assert body["tokens"] == [1097, 1098]
        body = await (await c.post("/v1/chat/completions", json={"messages": [{"content": "abc"}]})).json()
        assert body["usage"]["prompt_tokens"] == 3


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BAD, NOT_FOUND = (400, "BadRequestError"), (404, "NotFoundError")


@pytest.mark.parametrize(
    "path, payload, answer",
    [
        (CHAT, b"{not json", BAD),
        (CHAT, b"[1, 2]", BAD),
        (CHAT, {"model": MODEL}, BAD),
        (CHAT, {"model": MODEL, "messages": []}, BAD),
        (CHAT, {"model": "other", "messages": MESSAGES}, NOT_FOUND),
        (CHAT, {"model": MODEL, "messages": MESSAGES, "max_tokens": 0}, BAD),
        (CHAT, {"messages": MESSAGES, "stream_options": {"include_usage": True}}, BAD),
        (COMPLETIONS, {"model": MODEL}, BAD),
        (COMPLETIONS, {"model": MODEL, "prompt": [1, -2]}, BAD),
        (COMPLETIONS, {"model": MODEL, "prompt": [2**32]}, BAD),
        (COMPLETIONS, {"model": MODEL, "prompt": ""}, BAD),
        (COMPLETIONS, {"model": MODEL, "prompt": "x" * 16_380, "max_tokens": 10}, BAD),
        ("/tokenize", {"model": MODEL}, BAD),
        ("/tokenize", {"model": "other", "prompt": "x"}, NOT_FOUND),
    ],
)
async def test_errors_use_vllm_shape(client: TestClient, path: str, payload: Any, answer: tuple[int, str]):
    status, err_type = answer
    if isinstance(payload, bytes):
        resp = await client.post(path, data=payload, headers={"Content-Type": "application/json"})
    else:
        resp = await client.post(path, json=payload)
    assert resp.status == status
    assert resp.headers["x-worker-id"] == "w-test"
    error = (await resp.json())["error"]
    assert error["type"] == err_type and error["code"] == status and error["message"]
    assert client.server.app[WORKER].driver.engine.has_work is False


async def test_models_and_health(client: TestClient):
    resp = await client.get("/health")
    assert resp.status == 200 and await resp.read() == b"" and resp.headers["x-worker-id"] == "w-test"
    body = await (await client.get("/v1/models")).json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == 16 * 1024


async def test_metrics_use_vllm_names_with_model_label(client: TestClient):
    await (await client.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 3})).read()
    resp = await client.get("/metrics")
    assert resp.status == 200 and resp.headers["x-worker-id"] == "w-test"
    text = await resp.text()
    label = f'{{model_name="{MODEL}"}}'
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert name in text, name
    assert f"vllm:prompt_tokens_total{label} 11.0" in text
    assert f"vllm:generation_tokens_total{label} 3.0" in text
    assert f"vllm:prefix_cache_queries_total{label} 11.0" in text
    assert f"vllm:time_to_first_token_seconds_count{label} 1.0" in text


async def test_client_disconnect_mid_stream_cancels_and_frees_blocks(slow_client: TestClient):
    engine = lambda: slow_client.server.app[WORKER].driver.engine  # noqa: E731
    request = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4000, "stream": True}
    resp = await slow_client.post("/v1/chat/completions", json=request)
    assert (await resp.content.readline()).startswith(b"data: ")
    assert engine().num_running == 1 and engine().cache.num_active_blocks > 0
    resp.close()
    await wait_for(lambda: engine().num_running == 0 and engine().cache.num_active_blocks == 0)
    assert engine().cache.num_cached_blocks > 0


async def test_client_disconnect_while_waiting_for_a_full_response_cancels(slow_client: TestClient):
    engine = lambda: slow_client.server.app[WORKER].driver.engine  # noqa: E731
    request = {"model": MODEL, "prompt": "a long one", "max_tokens": 4000}
    task = asyncio.create_task(slow_client.post("/v1/completions", json=request))
    await wait_for(lambda: engine().num_running == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: not engine().has_work and engine().cache.num_active_blocks == 0)


def test_cli_flags_build_the_config():
    parser = argparse.ArgumentParser()
    add_mock_worker_arguments(parser)
    flags = ["--port", "0", "--worker-id", "w3", "--model", "m", "--block-size", "16"]
    args = parser.parse_args([*flags, "--num-gpu-blocks", "64", "--speedup", "10"])
    config = config_from_args(args)
    assert (args.host, config.worker_id, config.model, config.speedup) == ("127.0.0.1", "w3", "m", 10.0)
    assert (config.engine.block_size, config.engine.num_gpu_blocks) == (16, 64)
    assert config.effective_max_model_len == 1024


def test_help_explains_every_flag(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--host",
        "--port",
        "--worker-id",
        "--model",
        "--tokenizer",
        "--block-size",
        "--num-gpu-blocks",
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--max-output-tokens",
        "--speedup",
    ):
        assert flag in out, flag


def test_bad_flag_values_are_reported(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        main(["--block-size", "0"])
    assert info.value.code == 2
    assert "block_size" in capsys.readouterr().err


class FailingOnceEngine(Engine):
    """An engine whose first pass with work raises, as a bug in the core would."""

    failed = False

    def next_pass(self, now_ms: float) -> Pass | None:
        if self.has_work and not self.failed:
            self.failed = True
            raise RuntimeError("injected engine failure")
        return super().next_pass(now_ms)


async def test_an_engine_failure_answers_500_and_the_worker_keeps_serving(client: TestClient):
    client.server.app[WORKER].driver.engine = FailingOnceEngine(worker_config().engine)
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert resp.status == 500 and (await resp.json())["error"]["type"] == "InternalServerError"
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert resp.status == 200
