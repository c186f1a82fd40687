"""The picker's prompt ids equal vLLM's on every golden request, with the real Qwen3 and Llama 3.1 tokenizers.

`tests/request_goldens/<tokenizer>.json.gz` hold OpenAI request bodies and the ids vLLM 0.33 prefills for
them, computed by transformers' own `apply_chat_template` and tokenizer (`tests/request_goldens/generate.py`
says how; with `--check-vllm` it replays every body through vLLM's own request handling, and the goldens'
`meta.vllm_checked` names the vLLM that agreed). Each body takes the path `serve` gives it: a config file
naming the tokenizer directory for the model (as the README shows), the `EndpointPicker` built from it, and
that model's `RequestTokenizer` over `parse_openai_body`. transformers is not needed here: the goldens are
committed. The tokenizers come from `../shared/tokenizers` beside the checkout, as CI lays it out.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from extproc.config import load_config
from extproc.picker.pipeline import EndpointPicker, ModelPool
from extproc.request.parse import parse_openai_body
from extproc.request.tokenizer import HfTokenizer, template_kwargs

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "tests" / "request_goldens"
TOKENIZERS = REPO.parent / "shared" / "tokenizers"
FAMILIES = ("qwen3", "llama3_1")


def load_goldens(family: str) -> dict[str, Any]:
    with gzip.open(GOLDENS / f"{family}.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


GOLDEN_SETS = {family: load_goldens(family) for family in FAMILIES}
CASES = [(family, case) for family, goldens in GOLDEN_SETS.items() for case in goldens["cases"]]


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mapping[str, ModelPool]]:
    assert TOKENIZERS.is_dir(), f"the real tokenizers belong at {TOKENIZERS} (clone next to ../shared)"
    lines = ["workers:"]
    lines += [
        f'  - {{id: w-{f}, endpoint: "127.0.0.1:{8000 + i}", model: {f}}}' for i, f in enumerate(FAMILIES)
    ]
    lines += ["models:"] + [
        f"  - {{name: {f}, tokenizer: {json.dumps(str(TOKENIZERS / f))}}}" for f in FAMILIES
    ]
    config_file = tmp_path_factory.mktemp("conformance") / "picker.yaml"
    config_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    picker = EndpointPicker(load_config(["--config", str(config_file), "--no-router-kv-events"], environ={}))
    try:
        yield picker.pools
    finally:
        asyncio.run(picker.close())


@pytest.mark.parametrize("family, case", CASES, ids=[f"{f}-{c['id']}" for f, c in CASES])
async def test_picker_ids_equal_vllm_ids(pools: Mapping[str, ModelPool], family: str, case: dict[str, Any]):
    body = json.dumps(case["body"], ensure_ascii=False).encode("utf-8")
    request = parse_openai_body(body, case["path"], max_bytes=1 << 24)
    ids = await pools[family].tokenizer.tokenize(request)
    if ids != case["ids"]:
        pytest.fail(_explain(pools[family], request, ids, case))


def _explain(pool: ModelPool, request: Any, ids: list[int], case: dict[str, Any]) -> str:
    """Where the picker's ids leave vLLM's, with both prompts around that point."""
    at = next(
        (i for i, (a, b) in enumerate(zip(ids, case["ids"], strict=False)) if a != b),
        min(len(ids), len(case["ids"])),
    )
    lines = [f"{case['id']}: {len(ids)} ids, vLLM {len(case['ids'])}; first difference at {at}"]
    backend = pool.tokenizer.backend
    if "prompt" in case and isinstance(backend, HfTokenizer) and request.messages is not None:
        ours = backend.render_chat(
            request.messages,
            tools=request.tools,
            add_generation_prompt=request.add_generation_prompt,
            chat_template_kwargs=template_kwargs(request),
        )
        where = next((i for i, (a, b) in enumerate(zip(ours, case["prompt"], strict=False)) if a != b), None)
        if where is not None or ours != case["prompt"]:
            where = where if where is not None else min(len(ours), len(case["prompt"]))
            lines.append(f"prompt (picker): {ours[max(0, where - 80) : where + 80]!r}")
            lines.append(f"prompt (vLLM):   {case['prompt'][max(0, where - 80) : where + 80]!r}")
    lines.append(f"ids (picker): {ids[max(0, at - 5) : at + 10]}")
    lines.append(f"ids (vLLM):   {case['ids'][max(0, at - 5) : at + 10]}")
    return "\n".join(lines)


@pytest.mark.parametrize("family", FAMILIES)
def test_goldens_were_made_from_these_tokenizer_files(family: str):
    meta = GOLDEN_SETS[family]["meta"]
    directory = TOKENIZERS / family
    files = {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.iterdir()) if f.is_file()
    }
    assert meta["files_sha256"] == files, "the shared tokenizer files changed: regenerate the goldens"
    assert meta["tokenize_true_disagreements"] == 0  # apply_chat_template(tokenize=True) gives the same ids
    assert meta["versions"]["transformers"] and meta["versions"]["tokenizers"]


@pytest.mark.parametrize("family", FAMILIES)
def test_goldens_cover_every_kind_of_request(family: str):
    cases = GOLDEN_SETS[family]["cases"]
    kinds = {case["id"].rsplit("-", 1)[0] for case in cases}
    expected = {
        "basic", "unicode", "space", "special", "any", "special-exact", "space-exact", "parts", "tools",
        "tools-empty-calls", "no-generation-prompt", "continue-final", "enable-thinking", "reasoning-effort",
        "reasoning-reasoning_content", "developer-mid", "system-mid", "names", "billing-header", "long",
        "chat-add-special-tokens", "kwargs-generation-prompt-overridden", "completion-any",
        "completion-exact", "truncate-chat", "truncate-completion", "truncate-token-prompt",
        "tools-json-numbers",
    }  # fmt: skip
    assert expected <= kinds, expected - kinds
    assert len(cases) >= 300
    assert sum(case["path"] == "/v1/completions" for case in cases) >= 50
