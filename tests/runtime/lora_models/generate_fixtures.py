"""Records `models.json` beside this file: the `/v1/models` bodies vLLM 0.33.0's and SGLang 0.5.23's
own code answers, with and without LoRA adapters.

Run from the repository root with a Python holding pydantic and msgspec (the engines' model cards
and LoRA records need both; the project's venv has no msgspec, so use another one; nothing from
the wheels is committed, only this script and the JSON it writes):

    python3 -m venv /tmp/gv && /tmp/gv/bin/pip install pydantic msgspec
    /tmp/gv/bin/python tests/runtime/lora_models/generate_fixtures.py [--cache DIR] [--check]

What it runs:

- vLLM: `OpenAIServingModels` (vllm/entrypoints/openai/models/serving.py) over its own
  `ModelCard`/`ModelList` (vllm/entrypoints/serve/engine/protocol.py), `LoRARequest` and
  `LoadLoRAAdapterRequest`. Adapters are loaded the two ways vLLM loads them:
  `init_static_loras` (`--lora-modules NAME=PATH`) and `load_lora_adapter` (`POST
  /v1/load_lora_adapter`, runtime loading), and one is unloaded (`unload_lora_adapter`). The body
  is what its api_router answers: `JSONResponse(content=models.model_dump())`.
- SGLang: `available_models` of sglang/srt/entrypoints/http_server.py (the function's own source,
  without its route decorator) over its own `ModelCard`/`ModelList`
  (sglang/srt/entrypoints/openai/protocol.py) and `LoRARef`s (sglang/srt/lora/lora_registry.py)
  in the registry the tokenizer manager keeps; the body is what FastAPI's ORJSONResponse writes.

Every other module the engines import is a stub (`tests/runtime/engine_metrics/generate_fixtures.py`'s
finder); `created` is pinned and vLLM's permission ids are numbered, so the bytes are reproducible.
`--check` only regenerates into memory and fails when the committed file differs.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import sys
import time
import types
import zipfile
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.runtime.engine_metrics.generate_fixtures import (
    SGLANG_VERSION,
    VLLM_VERSION,
    _load,
    _StubFinder,
    _wheels,
)

HERE = Path(__file__).resolve().parent
CREATED = 1767225600  # every card's `created`
BASE = "meta-llama/Llama-3.1-8B-Instruct"


def _compact(content: Any) -> str:
    """JSON as Starlette's JSONResponse and FastAPI's ORJSONResponse write it (no spaces)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _vllm(wheel: Path) -> dict[str, dict[str, Any]]:
    ids = iter(range(1, 1000))
    sys.modules["vllm.utils"] = utils = types.ModuleType("vllm.utils")
    utils.random_uuid = lambda: f"{next(ids):032x}"  # type: ignore[attr-defined]
    sys.modules["vllm.lora.resolver"] = resolver = types.ModuleType("vllm.lora.resolver")
    resolver.LoRAResolver = object  # type: ignore[attr-defined]
    resolver.LoRAResolverRegistry = mock.MagicMock(get_supported_resolvers=lambda: [])  # type: ignore[attr-defined]
    modules = _load(
        wheel,
        {
            "vllm.entrypoints.serve.engine.protocol": "vllm/entrypoints/serve/engine/protocol.py",
            "vllm.entrypoints.serve.lora.protocol": "vllm/entrypoints/serve/lora/protocol.py",
            "vllm.lora.request": "vllm/lora/request.py",
            "vllm.utils.counter": "vllm/utils/counter.py",
            "vllm.entrypoints.openai.models.protocol": "vllm/entrypoints/openai/models/protocol.py",
            "vllm.entrypoints.openai.models.serving": "vllm/entrypoints/openai/models/serving.py",
        },
    )
    serving = modules["vllm.entrypoints.openai.models.serving"]
    paths = modules["vllm.entrypoints.openai.models.protocol"]
    load_request = modules["vllm.entrypoints.serve.lora.protocol"].LoadLoRAAdapterRequest
    unload_request = modules["vllm.entrypoints.serve.lora.protocol"].UnloadLoRAAdapterRequest

    def engine() -> Any:
        client = mock.MagicMock()
        client.model_config.max_model_len = 8192
        client.add_lora = mock.AsyncMock(return_value=True)
        return client

    async def body(models: Any) -> str:
        return _compact((await models.show_available_models()).model_dump())

    async def cases() -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        base = [paths.BaseModelPath(name="llama", model_path=BASE)]
        plain = serving.OpenAIServingModels(engine(), base)
        out["base-only"] = {"body": await body(plain), "base": ["llama"], "adapters": {}}
        # --served-model-name llama llama-3.1 --lora-modules sql-lora=/adapters/sql, then
        # POST /v1/load_lora_adapter {"lora_name": "chat-lora", ...}: the parent is the first name
        two_names = [paths.BaseModelPath("llama", BASE), paths.BaseModelPath("llama-3.1", BASE)]
        static = [paths.LoRAModulePath(name="sql-lora", path="/adapters/sql")]
        models = serving.OpenAIServingModels(engine(), two_names, lora_modules=static)
        await models.init_static_loras()
        loaded = await models.load_lora_adapter(
            load_request(lora_name="chat-lora", lora_path="/adapters/chat")
        )
        assert loaded.startswith("Success"), loaded
        out["static-and-loaded"] = {
            "body": await body(models),
            "base": ["llama", "llama-3.1"],
            "adapters": {"sql-lora": "llama", "chat-lora": "llama"},
        }
        # an adapter whose --lora-modules JSON names its base model (the second served name)
        named = [paths.LoRAModulePath(name="doc-lora", path="/adapters/doc", base_model_name="llama-3.1")]
        models = serving.OpenAIServingModels(engine(), two_names, lora_modules=named)
        await models.init_static_loras()
        out["named-base"] = {
            "body": await body(models),
            "base": ["llama", "llama-3.1"],
            "adapters": {"doc-lora": "llama-3.1"},
        }
        # POST /v1/unload_lora_adapter {"lora_name": "sql-lora"} after both were loaded
        models = serving.OpenAIServingModels(engine(), base, lora_modules=static)
        await models.init_static_loras()
        await models.load_lora_adapter(load_request(lora_name="chat-lora", lora_path="/adapters/chat"))
        unloaded = await models.unload_lora_adapter(unload_request(lora_name="sql-lora"))
        assert unloaded.startswith("Success"), unloaded
        out["unloaded"] = {"body": await body(models), "base": ["llama"], "adapters": {"chat-lora": "llama"}}
        return out

    with mock.patch.object(time, "time", return_value=float(CREATED)):
        return asyncio.run(cases())


def _function(source: str, name: str, namespace: dict[str, Any]) -> Any:
    """The module-level function `name` of `source`, compiled alone (decorators dropped)."""
    tree = ast.parse(source)
    (node,) = [
        n for n in tree.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef) and n.name == name
    ]
    node.decorator_list = []
    exec(compile(ast.Module(body=[node], type_ignores=[]), f"<sglang {name}>", "exec"), namespace)
    return namespace[name]


def _classes(source: str, names: tuple[str, ...], namespace: dict[str, Any]) -> None:
    tree = ast.parse(source)
    body = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), "<sglang protocol>", "exec"), namespace)


def _sglang(wheel: Path) -> dict[str, dict[str, Any]]:
    from typing import Optional  # the name SGLang's classes use

    from pydantic import BaseModel, Field

    registry = _load(wheel, {"sglang.srt.lora.lora_registry": "sglang/srt/lora/lora_registry.py"})
    lora_ref = registry["sglang.srt.lora.lora_registry"].LoRARef
    with zipfile.ZipFile(wheel) as zf:
        protocol = zf.read("sglang/srt/entrypoints/openai/protocol.py").decode()
        server = zf.read("sglang/srt/entrypoints/http_server.py").decode()
    cards: dict[str, Any] = {"BaseModel": BaseModel, "Field": Field, "time": time}
    cards |= {"List": list, "Optional": Optional}  # the names SGLang's annotations use
    _classes(protocol, ("ModelCard", "ModelList"), cards)
    for name in ("ModelCard", "ModelList"):  # protocol.py's annotations are strings (__future__)
        cards[name].model_rebuild(_types_namespace=cards)

    def answer(enable_lora: bool, adapters: dict[str, str]) -> str:
        refs = {
            name: lora_ref(lora_id=f"{i:032x}", lora_name=name, lora_path=path)
            for i, (name, path) in enumerate(adapters.items(), 1)
        }
        manager = mock.MagicMock(served_model_name="llama")
        manager.model_config.context_len = 8192
        manager.lora_registry.get_all_adapters = lambda: dict(refs)
        namespace = {
            "ModelCard": cards["ModelCard"],
            "ModelList": cards["ModelList"],
            "_global_state": types.SimpleNamespace(tokenizer_manager=manager),
            "get_lora": lambda: types.SimpleNamespace(enable_lora=enable_lora),
        }
        available_models = _function(server, "available_models", namespace)
        with mock.patch.object(time, "time", return_value=float(CREATED)):
            models = asyncio.run(available_models())
        return _compact(models.model_dump(mode="json"))

    # --lora-paths sql-lora=/adapters/sql chat-lora=/adapters/chat (or POST /load_lora_adapter)
    two = {"sql-lora": "/adapters/sql", "chat-lora": "/adapters/chat"}
    return {
        "base-only": {"body": answer(False, {}), "base": ["llama"], "adapters": {}},
        "lora-paths": {
            "body": answer(True, two),
            "base": ["llama"],
            "adapters": dict.fromkeys(two, "llama"),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/engine-metrics-wheels"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    wheels = _wheels(args.cache)
    sys.meta_path.append(_StubFinder(("vllm", "sglang")))
    recorded = {
        "generated_by": "tests/runtime/lora_models/generate_fixtures.py",
        "vllm": {"version": VLLM_VERSION, "cases": _vllm(wheels["vllm"])},
        "sglang": {"version": SGLANG_VERSION, "cases": _sglang(wheels["sglang"])},
    }
    text = json.dumps(recorded, indent=1) + "\n"
    out = HERE / "models.json"
    if args.check:
        if not out.exists() or out.read_text() != text:
            sys.exit(f"{out} differs from the engines' code")
        print("fixtures match")
        return
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
