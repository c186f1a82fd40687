"""Records `<engine>-<version>/answers.json`: the exact bytes an inference engine's own HTTP server code
writes in its OpenAI-compatible answers, for a rewrite of the `"model":"..."` field in response bodies.

Run in one engine's venv, it feeds that engine's own answer-building functions a fixed, fake generation
(a 5-token prompt, a 3-token answer cut by `max_tokens: 3`) for each model name in `MODELS`, and keeps, per
model, the bytes its server would send:

- `chat_json`: the whole body of a non-streamed `/v1/chat/completions` answer;
- `chat_sse`: the whole SSE byte stream of a streamed one asked with `stream_options: {"include_usage": true}`
  (role chunk, content chunks, finish, usage chunk, `data: [DONE]`), concatenated;
- `completion_json`, `completion_sse`: the same for `/v1/completions`.

Nothing here writes JSON itself: the engine's request classes validate the request bodies (`requests`), its
serving classes (constructed with the server's default settings) turn the engine's outputs into answers, and
the bytes come out of its own serialisation step (named in `functions`). Only what the engine's model runner
would give is made up (`RequestOutput`s for vLLM, the tokenizer manager's output dicts for SGLang), and the
clock is pinned (`CREATED`) so the file is deterministic. The request ids are fixed strings of the engine's
own shape (a real server draws them at random).

vLLM 0.33.0 (`OpenAIServingChat` / `OpenAIServingCompletion` are made with `__new__` and given the
attributes their `__init__` sets for a default `vllm serve` -- no parser, no logging, no prompt-token
details -- since the real `__init__` wants a running engine client; `system_fingerprint` is vLLM's own
`build_system_fingerprint` in its default "full" mode over a stand-in config whose `compute_hash()` is
fixed, where a real server hashes its `VllmConfig`). Run from the repository root, in a separate venv
(never the project's; nothing from the wheel is committed, only this script and the data it writes):

    python3.11 -m venv /tmp/vv && /tmp/vv/bin/pip install torch==2.13.0   # the CPU wheel; vllm imports torch
    pip download --no-deps vllm==0.33.0 -d /tmp/vllmw
    unzip -q /tmp/vllmw/vllm-0.33.0-*.whl -d /tmp/vllmw/full
    /tmp/vv/bin/pip install -r <(the wheel's unconditional Requires-Dist, without torch*, numba,
        outlines_core, mistral_common, mcp, opentelemetry, compressed-tensors, depyf and the GPU kernels:
        flashinfer, apache-tvm-ffi, tilelang, nvidia-*, nvtx, fastsafetensors, instanttensor, quack-kernels,
        tokenspeed-mla, humming-kernels, PyNvVideoCodec)
    PYTHONPATH=/tmp/vllmw/full /tmp/vv/bin/python tests/request/engines/generate_answer_fixtures.py

SGLang (the newest on PyPI; 0.5.23 when written). `OpenAIServingChat` / `OpenAIServingCompletion` are built
by their real `__init__` over a stand-in tokenizer manager (no tokenizer, a llama `hf_config`, config values
read from SGLang's published config) whose `generate_request` yields the dicts SGLang's `TokenizerManager`
yields (cumulative `text`, `meta_info` with id, finish_reason, token counts, weight_version); SGLang's config
is SGLang's own default `ServerArgs`, published by its test hook `get_context().override_server_args()`.
The module graph imports without a GPU; nothing in it is stubbed. In a separate venv:

    python3.11 -m venv /tmp/sv && /tmp/sv/bin/pip install torch==2.13.0
    pip download --no-deps sglang -d /tmp/sglw && unzip -q /tmp/sglw/sglang-*.whl -d /tmp/sglw/full
    /tmp/sv/bin/pip install -r <(the wheel's unconditional Requires-Dist, without torch*, numba, outlines,
        mistral_common, timm, soundfile, av, decord, datasets, modelscope, py-spy, smg-grpc-servicer,
        deepseek-recipe, tml-renderers, kernels, compressed-tensors and the GPU kernels: flash-attn-4,
        flashinfer, apache-tvm-ffi, tilelang, nvidia-*, nvshmem4py, quack-kernels, humming-kernels, sgl-*,
        cuda-python)
    /tmp/sv/bin/pip install triton torchvision IPython jsonschema dill apache-tvm-ffi==0.1.11 loguru gguf \\
        xgrammar==0.2.7 llguidance && /tmp/sv/bin/pip install --no-deps compressed-tensors==0.18.0
        # what sglang.srt.entrypoints.openai.serving_chat imports at module level (torchvision moves torch
        # to 2.14.1, a CUDA build, which imports fine without a GPU)
    PYTHONPATH=/tmp/sglw/full /tmp/sv/bin/python tests/request/engines/generate_answer_fixtures.py
"""

from __future__ import annotations

import asyncio
import copy
import json
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = ["foodreview-v2", "meta-llama/Llama-3.1-8B-Instruct"]
CREATED = 1735689600  # 2025-01-01T00:00:00Z, in place of int(time.time())
PROMPT = "Was the pasta good?"
PROMPT_TOKEN_IDS = [128000, 27125, 279, 61798, 1695]  # 5 tokens
ANSWER = [("Yes", 9642), (",", 11), (" very", 1633)]  # 3 tokens, then max_tokens stops it
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def chat_body(model: str, stream: bool) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": len(ANSWER)}
    return {**body, **STREAM} if stream else body


def completion_body(model: str, stream: bool) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": len(ANSWER)}
    return {**body, **STREAM} if stream else body


def pinned_clock(*modules: types.ModuleType) -> None:
    """Pin `time.time()` as seen by the engine's serving modules (they do `created = int(time.time())`)."""
    clock = types.SimpleNamespace(time=lambda: float(CREATED))
    for module in modules:
        module.time = clock  # type: ignore[attr-defined]


async def collect(stream: Any) -> str:
    """What a StreamingResponse sends: each chunk, str chunks encoded as UTF-8."""
    out = b""
    async for chunk in stream:
        out += chunk if isinstance(chunk, bytes) else chunk.encode("utf-8")
    return out.decode("utf-8")


# --------------------------------------------------------------------------------------------- vLLM


def vllm_doc() -> dict[str, Any]:
    import vllm
    import vllm.entrypoints.openai.chat_completion.serving as chat_serving
    import vllm.entrypoints.openai.completion.serving as completion_serving
    from fastapi.responses import JSONResponse
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.utils.fingerprint import build_system_fingerprint
    from vllm.entrypoints.serve.utils.sse_keep_alive import with_sse_keep_alive
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.utils.async_utils import merge_async_iterators

    pinned_clock(chat_serving, completion_serving)

    class StandInConfig:  # a real server hashes its VllmConfig here
        parallel_config = None

        @staticmethod
        def compute_hash() -> str:
            return "0123abcd" * 8

    fingerprint = build_system_fingerprint(StandInConfig(), "full")
    defaults = {  # what __init__ sets for a default `vllm serve <model> --served-model-name <name>`
        "request_logger": None, "return_tokens_as_token_ids": False, "system_fingerprint": fingerprint,
        "enable_log_outputs": False, "enable_log_deltas": True, "enable_prompt_tokens_details": False,
        "enable_force_include_usage": False, "enable_per_request_metrics": False, "has_kv_connector": False,
    }  # fmt: skip
    chat = chat_serving.OpenAIServingChat.__new__(chat_serving.OpenAIServingChat)
    vars(chat).update(defaults, response_role="assistant", enable_auto_tools=False, parser_cls=None,
                      _include_reasoning_tokens_details=False, default_chat_template_kwargs={})  # fmt: skip
    completion = completion_serving.OpenAIServingCompletion.__new__(
        completion_serving.OpenAIServingCompletion
    )
    vars(completion).update(defaults)

    def outputs(request_id: str, stream: bool) -> list[RequestOutput]:
        """The engine's RequestOutputs: one per token (output_kind DELTA) when streaming, else the last."""
        steps = [(n + 1, [token]) for n, token in enumerate(ANSWER)] if stream else [(len(ANSWER), ANSWER)]
        out = []
        for n, step in steps:
            done = n == len(ANSWER)
            piece = CompletionOutput(
                index=0, text="".join(t for t, _ in step), token_ids=[i for _, i in step],
                cumulative_logprob=None, logprobs=None, finish_reason="length" if done else None,
                stop_reason=None,
            )  # fmt: skip
            out.append(RequestOutput(
                request_id=request_id, prompt=None, prompt_token_ids=PROMPT_TOKEN_IDS, prompt_logprobs=None,
                outputs=[piece], finished=done, num_cached_tokens=0,
            ))  # fmt: skip
        return out

    async def agen(items: list[Any]) -> Any:
        for item in items:
            yield item

    async def answers(model: str) -> dict[str, str]:
        chat_id, cmpl_id = "chatcmpl-0123456789abcdef", "cmpl-0123456789abcdef"
        meta = RequestResponseMetadata(request_id=chat_id)
        # /v1/chat/completions, not streamed: api_router.create_chat_completion -> JSONResponse(model_dump())
        request = ChatCompletionRequest.model_validate(chat_body(model, False))
        response = await chat.chat_completion_full_generator(
            request, agen(outputs(chat_id, False)), chat_id, model, [], None, meta
        )
        chat_json = JSONResponse(content=response.model_dump()).body.decode("utf-8")
        # streamed: StreamingResponse(with_sse_keep_alive(chat_completion_stream_generator(...), 0))
        request = ChatCompletionRequest.model_validate(chat_body(model, True))
        stream = chat.chat_completion_stream_generator(
            request, agen(outputs(chat_id, True)), chat_id, model, [], None, meta
        )
        chat_sse = await collect(with_sse_keep_alive(stream, 0.0))
        # /v1/completions: request_output_to_completion_response / completion_stream_generator
        meta = RequestResponseMetadata(request_id=cmpl_id)
        request = CompletionRequest.model_validate(completion_body(model, False))
        final = outputs(cmpl_id, False)
        final[0].prompt = PROMPT
        response = completion.request_output_to_completion_response(final, request, cmpl_id, CREATED, model,
                                                                    None, meta)  # fmt: skip
        completion_json = JSONResponse(content=response.model_dump()).body.decode("utf-8")
        request = CompletionRequest.model_validate(completion_body(model, True))
        steps = outputs(cmpl_id, True)
        for step in steps:
            step.prompt = PROMPT
        stream = completion.completion_stream_generator(
            request, [{"prompt": PROMPT}], merge_async_iterators(agen(steps)), cmpl_id, CREATED, model,
            num_prompts=1, tokenizer=None, request_metadata=meta,
        )  # fmt: skip
        completion_sse = await collect(with_sse_keep_alive(stream, 0.0))
        return {"chat_json": chat_json, "chat_sse": chat_sse,
                "completion_json": completion_json, "completion_sse": completion_sse}  # fmt: skip

    return {
        "engine": f"vllm {vllm.__version__}",
        "version": vllm.__version__,
        "functions": [
            "vllm.entrypoints.openai.chat_completion.protocol.ChatCompletionRequest.model_validate",
            "vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat.chat_completion_full_generator",
            "vllm.entrypoints.openai.chat_completion.api_router.create_chat_completion: "
            "fastapi.responses.JSONResponse(content=generator.model_dump())",
            "vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat"
            ".chat_completion_stream_generator: "
            'f"data: {chunk.model_dump_json(exclude_unset=True, exclude_none=not chunk.choices)}\\n\\n", '
            'then "data: [DONE]\\n\\n"',
            "vllm.entrypoints.openai.completion.protocol.CompletionRequest.model_validate",
            "vllm.entrypoints.openai.completion.serving.OpenAIServingCompletion.request_output_to_completion_response",
            "vllm.entrypoints.openai.completion.api_router.create_completion: "
            "fastapi.responses.JSONResponse(content=generator.model_dump())",
            "vllm.entrypoints.openai.completion.serving.OpenAIServingCompletion.completion_stream_generator: "
            'f"data: {chunk.model_dump_json(exclude_unset=True)}\\n\\n"; usage chunk '
            'model_dump_json(exclude_unset=False, exclude_none=True); then "data: [DONE]\\n\\n"',
            "vllm.entrypoints.serve.utils.sse_keep_alive.with_sse_keep_alive(generator, 0.0) "
            "(the default --sse-keep-alive-interval 0 passes the stream through)",
            "vllm.entrypoints.serve.utils.fingerprint.build_system_fingerprint(config, 'full')",
        ],
        "notes": [
            "model is the server's served model name (OpenAIServingModels.model_name), "
            "here the same as the request's",
            "system_fingerprint's last 8 characters stand in for VllmConfig.compute_hash()[:8]",
            "in the chat stream the finish_reason rides on the last content chunk (no separate finish chunk)",
        ],
        "by_model": {model: asyncio.run(answers(model)) for model in MODELS},
    }


# ------------------------------------------------------------------------------------------- SGLang


def sglang_doc() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import sglang.srt.entrypoints.openai.serving_chat as chat_serving
    import sglang.srt.entrypoints.openai.serving_completions as completion_serving
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.runtime_context import get_context
    from sglang.srt.utils.json_response import model_json_response
    from transformers import LlamaConfig

    try:
        sglang_version = version("sglang")  # the wheel's dist-info, unzipped beside the package
    except PackageNotFoundError:
        import sglang.version

        sglang_version = sglang.version.__version__

    pinned_clock(chat_serving, completion_serving)
    server_args = get_context().override_server_args().install()  # SGLang's default ServerArgs, published

    class StandInTokenizerManager:
        """What OpenAIServing* read from SGLang's TokenizerManager, and the dicts generate_request yields."""

        tokenizer = None
        model_path = "dummy"
        model_config = types.SimpleNamespace(
            hf_config=LlamaConfig(architectures=["LlamaForCausalLM"]), get_default_sampling_params=lambda: {}
        )

        def __init__(self) -> None:
            self.server_args = server_args
            self.served_model_name = "dummy"
            self.items: list[dict[str, Any]] = []

        def config_value(self, name: str) -> Any:  # as TokenizerManager.config_value
            return get_context().config_leaf(name)

        async def generate_request(self, obj: Any, raw_request: Any = None) -> Any:
            for item in self.items:
                yield item

        def create_abort_task(self, obj: Any) -> None:
            return None

    def items(rid: str, stream: bool) -> list[dict[str, Any]]:
        """TokenizerManager's output dicts: cumulative text each step when streaming, else the final one."""
        steps = range(1, len(ANSWER) + 1) if stream else [len(ANSWER)]
        out = []
        for n in steps:
            done = n == len(ANSWER)
            meta = {
                "id": rid,
                "finish_reason": FINISH_LENGTH(length=len(ANSWER)).to_json() if done else None,
                "prompt_tokens": len(PROMPT_TOKEN_IDS),
                "weight_version": server_args.weight_version,
                "num_retractions": 0,
                "reasoning_tokens": 0,
                "completion_tokens": n,
                "cached_tokens": 0,
            }
            text = "".join(t for t, _ in ANSWER[:n])
            out.append(
                {"text": text, "output_ids": [i for _, i in ANSWER[:n]], "meta_info": meta, "index": 0}
            )
        return out

    manager = StandInTokenizerManager()
    template_manager = types.SimpleNamespace(
        chat_template_name=None,
        python_chat_template=None,
        completion_template_name=None,
        force_reasoning=False,
    )
    chat = chat_serving.OpenAIServingChat(manager, template_manager)
    completion = completion_serving.OpenAIServingCompletion(manager, template_manager)

    def body_of(response: Any) -> str:
        """http_server.openai_v1_*: model_json_response(result) -> result.model_dump_json(by_alias=True)."""
        return bytes(model_json_response(response).body).decode("utf-8")

    async def answers(model: str) -> dict[str, str]:
        chat_id, cmpl_id = (
            "chatcmpl-0123456789abcdef0123456789abcdef",
            "cmpl-0123456789abcdef0123456789abcdef",
        )
        request = ChatCompletionRequest.model_validate(chat_body(model, False))
        manager.items = items(chat_id, False)
        chat_json = body_of(await chat._handle_non_streaming_request(None, request, None))
        request = ChatCompletionRequest.model_validate(chat_body(model, True))
        manager.items = items(chat_id, True)
        chat_sse = await collect((await chat._handle_streaming_request(None, request, None)).body_iterator)
        request = CompletionRequest.model_validate(completion_body(model, False))
        manager.items = items(cmpl_id, False)
        completion_json = body_of(await completion._handle_non_streaming_request(None, request, None))
        request = CompletionRequest.model_validate(completion_body(model, True))
        manager.items = items(cmpl_id, True)
        response = await completion._handle_streaming_request(None, request, None)
        completion_sse = await collect(response.body_iterator)
        return {"chat_json": chat_json, "chat_sse": chat_sse,
                "completion_json": completion_json, "completion_sse": completion_sse}  # fmt: skip

    return {
        "engine": f"sglang {sglang_version}",
        "version": sglang_version,
        "functions": [
            "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest.model_validate",
            "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._handle_non_streaming_request "
            "(-> _build_chat_response)",
            "sglang.srt.entrypoints.http_server.openai_v1_chat_completions: "
            "sglang.srt.utils.json_response.model_json_response -> content.model_dump_json(by_alias=True)",
            "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._handle_streaming_request "
            "(-> _generate_chat_stream, _generate_stream_content)",
            "sglang.srt.entrypoints.openai.sse_utils.build_sse_content: "
            "b'data: ' + msgspec.json.Encoder().encode(StreamChunk) + b'\\n\\n' "
            "(role, content and finish chunks)",
            "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_chat_stream: "
            'f"data: {usage_chunk.model_dump_json()}\\n\\n", then "data: [DONE]\\n\\n"',
            "sglang.srt.entrypoints.openai.protocol.CompletionRequest.model_validate",
            "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"
            "._handle_non_streaming_request "
            "(-> _build_completion_response)",
            "sglang.srt.entrypoints.http_server.openai_v1_completions: model_json_response",
            "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"
            "._handle_streaming_request "
            '(-> _generate_completion_stream): f"data: {chunk.model_dump_json()}\\n\\n"; usage chunk '
            'model_dump_json(exclude_none=True); then "data: [DONE]\\n\\n"',
            "sglang.srt.managers.schedule_batch.FINISH_LENGTH.to_json (the finish_reason in meta_info)",
        ],
        "notes": [
            "model is the request's own model field (request.model), echoed as sent",
            "the chat stream's role, content and finish chunks come from msgspec; "
            "its usage chunk and the JSON bodies from pydantic",
        ],
        "by_model": {model: asyncio.run(answers(model)) for model in MODELS},
    }


def main() -> None:
    try:
        import vllm  # noqa: F401

        name, doc = "vllm", vllm_doc()
    except ImportError:
        name, doc = "sglang", sglang_doc()
    out = HERE / f"{name}-{doc.pop('version')}" / "answers.json"
    requests = {
        "chat_json": chat_body("<model>", False),
        "chat_sse": chat_body("<model>", True),
        "completion_json": completion_body("<model>", False),
        "completion_sse": completion_body("<model>", True),
    }
    doc = {
        "generated_by": "tests/request/engines/generate_answer_fixtures.py",
        "engine": doc.pop("engine"),
        "functions": doc.pop("functions"),
        "notes": doc.pop("notes"),
        "created": CREATED,
        "requests": copy.deepcopy(requests),
        **doc,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(doc['by_model'])} models to {out}")


if __name__ == "__main__":
    main()
