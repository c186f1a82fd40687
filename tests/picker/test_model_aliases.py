"""A model's other served names: vLLM started with `--served-model-name llama llama-3.1` answers to
both names and hashes its blocks alike under either (no name enters the hash; an adapter's does).
A request naming `llama-3.1` is `llama`'s: its workers, its blocks, its load.

The names come from the file (`models[].aliases`) or from the workers' own model lists, vLLM
0.33.0's recorded `/v1/models` bodies (`tests/runtime/lora_models/models.json`: the cards without a
`parent`). The blocks are vLLM 0.33.0's own KV event bytes (`test_lora_adapters.replay_vllm`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from extproc.client import RoutingClient
from extproc.config import ConfigError, DiscoveryConfig, ModelConfig, WorkerConfig, load_config
from extproc.config.workers import other_names, read_models
from extproc.errors import UnknownModel
from extproc.picker.model_names import ModelName, ModelNames
from extproc.picker.pipeline import EndpointPicker
from extproc.runtime.lora_discovery import AdapterDiscovery, names_in
from extproc.runtime.server import start_picker

from ..picker_fixtures import picker_config
from ..replica_helpers import until
from ..runtime.test_lora_discovery import body, workers  # noqa: F401 (a fixture)
from .test_lora_adapters import PROMPT, replay_vllm

LLAMA, ALIAS = "llama", "llama-3.1"  # vLLM's recorded list serves llama as both


def llama_picker(endpoints: list[str], *models: ModelConfig) -> EndpointPicker:
    """A picker whose `llama` workers are `endpoints` (w0, w1, ...), with KV events."""
    base = picker_config(0, use_kv_events=True)
    configs = tuple(WorkerConfig(f"w{i}", e, LLAMA) for i, e in enumerate(endpoints))
    return EndpointPicker(replace(base, workers=configs, models=models or (ModelConfig(LLAMA),)))


async def pick_worker(picker: EndpointPicker, model: str) -> tuple[str, int]:
    body_ = json.dumps({"model": model, "prompt": PROMPT}).encode()
    chosen = await picker.pick(
        body=body_, path="/v1/completions", headers={}, subset=None, client_request_id="r"
    )
    assert chosen.model == LLAMA  # counted, queued and tracked as the model's
    return str(chosen.worker.worker_id), chosen.overlap_blocks


async def read_names(picker: EndpointPicker) -> None:
    discovery = AdapterDiscovery(picker, DiscoveryConfig(lora_timeout_s=2.0))
    try:
        await discovery.read_once()
    finally:
        await discovery.stop()


# --- what the engines' model lists say ------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "served"),
    [("base-only", [LLAMA]), ("static-and-loaded", [LLAMA, ALIAS]), ("named-base", [LLAMA, ALIAS])],
)
def test_vllms_cards_without_a_parent_are_the_names_it_serves_its_model_as(case, served):
    assert list(names_in(body("vllm", case)).served) == served


@pytest.mark.parametrize("case", ["base-only", "lora-paths"])
def test_sglangs_cards_name_nothing(case):
    """SGLang has one served name and serves adapters only as MODEL:ADAPTER or lora_path."""
    assert names_in(body("sglang", case)) == names_in(b'{"data": []}')


def test_a_name_listed_twice_or_as_both_kinds_is_taken_once_as_first_listed():
    cards = [{"id": "a"}, {"id": "a", "parent": LLAMA}, {"id": "b", "parent": LLAMA}, {"id": "b"}]
    names = names_in(json.dumps({"data": cards}).encode())
    assert (names.served, names.adapters) == (("a",), ("b",))


# --- routing --------------------------------------------------------------------------------------


async def test_a_request_for_a_served_name_read_from_the_workers_is_the_models(workers):  # noqa: F811
    _, endpoints = await workers(body("vllm", "static-and-loaded"), body("vllm", "static-and-loaded"))
    picker = llama_picker(endpoints)
    replay_vllm(picker, "w0", model=LLAMA)  # sql-lora's two blocks of PROMPT
    replay_vllm(picker, "w1", batches=2, model=LLAMA)  # the base model's three
    try:
        with pytest.raises(UnknownModel):  # before the workers were read: 404
            await pick_worker(picker, ALIAS)
        await read_names(picker)
        assert picker.aliases(LLAMA) == [ALIAS]
        assert await pick_worker(picker, ALIAS) == await pick_worker(picker, LLAMA) == ("w1", 3)
        assert picker.resolve_model(ALIAS)[1] is None  # no adapter: blocks hashed as the model's
    finally:
        await picker.close()


async def test_a_served_name_no_worker_lists_any_more_goes(workers):  # noqa: F811
    (w0,), endpoints = await workers(body("vllm", "static-and-loaded"))
    picker = llama_picker(endpoints)
    try:
        await read_names(picker)
        assert picker.model_names() == [LLAMA, ALIAS, "chat-lora", "sql-lora"]
        w0.answer = body("vllm", "base-only")  # restarted with one --served-model-name
        await read_names(picker)
        assert picker.model_names() == [LLAMA]
        with pytest.raises(UnknownModel):
            picker.resolve_model(ALIAS)
    finally:
        await picker.close()


async def test_a_configured_alias_needs_no_worker_and_stays(workers):  # noqa: F811
    _, endpoints = await workers(body("vllm", "base-only"))
    picker = llama_picker(endpoints, ModelConfig(LLAMA, aliases=("llama-8b",)))
    try:
        await read_names(picker)
        assert picker.aliases(LLAMA) == ["llama-8b"]
        pool, adapter = picker.resolve_model("llama-8b")
        assert (pool.model, adapter) == (LLAMA, None)
    finally:
        await picker.close()


async def test_a_listed_name_that_is_already_something_else_stays_what_it_was(workers, caplog):  # noqa: F811
    """`qwen`'s workers list `llama-3.1` and `llama`: one is llama's configured alias, one a model."""
    cards = [{"id": "qwen"}, {"id": ALIAS}, {"id": LLAMA}]
    _, endpoints = await workers(json.dumps({"data": cards}).encode())
    config = picker_config(0)
    config = replace(
        config,
        workers=(WorkerConfig("q0", endpoints[0], "qwen"), WorkerConfig("w0", "127.0.0.1:9", LLAMA)),
        models=(ModelConfig(LLAMA, aliases=(ALIAS,)), ModelConfig("qwen")),
    )
    picker = EndpointPicker(config)
    try:
        with caplog.at_level(logging.WARNING, logger="extproc.picker"):
            await read_names(picker)
            await read_names(picker)
        assert picker.resolve_model(ALIAS)[0].model == LLAMA and picker.aliases("qwen") == []
        warned = [r.getMessage() for r in caplog.records if "already" in r.getMessage()]
        assert len(warned) == 2, warned  # once each, as they appeared
        assert any("already a model" in w for w in warned) and any("llama's alias" in w for w in warned)
    finally:
        await picker.close()


async def test_a_worker_that_does_not_list_its_models_name_is_logged_once(workers, caplog):  # noqa: F811
    """A worker configured as `llama` that serves only other names answers `llama` requests 404."""
    (w0,), endpoints = await workers(json.dumps({"data": [{"id": "meta-llama/Llama-3.1-8B"}]}).encode())
    picker = llama_picker(endpoints)
    try:
        with caplog.at_level(logging.WARNING, logger="extproc.lora_discovery"):
            discovery = AdapterDiscovery(picker, DiscoveryConfig(lora_timeout_s=2.0))
            await discovery.read_once()
            await discovery.read_once()
            w0.answer = body("vllm", "base-only")  # fixed: it lists llama again
            await discovery.read_once()
            w0.answer = json.dumps({"data": [{"id": "other"}]}).encode()
            await discovery.read_once()
            await discovery.stop()
        warned = [r.getMessage() for r in caplog.records if "404" in r.getMessage()]
        assert len(warned) == 2 and "serves meta-llama/Llama-3.1-8B, not llama" in warned[0], warned
    finally:
        await picker.close()


async def test_debug_workers_lists_each_models_aliases(workers):  # noqa: F811
    _, endpoints = await workers(body("vllm", "static-and-loaded"))
    config = replace(
        picker_config(0),
        workers=(WorkerConfig("w0", endpoints[0], LLAMA),),
        models=(ModelConfig(LLAMA),),
        port=0,
        health_port=0,
        admin_port=0,
        discovery=DiscoveryConfig(lora_interval_s=0.05),
    )
    running = await start_picker(config)
    try:
        url = f"http://127.0.0.1:{running.admin.port}/debug/workers"
        await until(lambda: running.picker.aliases(LLAMA) != [], 5.0, "the first read")
        async with aiohttp.ClientSession() as session, session.get(url) as r:
            answer = await r.json()
        assert answer["model_aliases"] == {LLAMA: [ALIAS]}
        assert answer["lora_adapters"] == {LLAMA: ["chat-lora", "sql-lora"]}
    finally:
        await running.stop(0)


# --- the name table -------------------------------------------------------------------------------


def test_listed_names_never_take_a_name_configured_or_listed_first():
    names = ModelNames(["a", "b"], {"x": ("a", "alias")})
    assert names.set_listed("a", {"alias": ["a", "y"], "adapter": ["z"]}) == (["y", "z"], [])
    assert names.set_listed("b", {"alias": ["x", "y", "b2", "a"], "adapter": ["z", "b-lora"]}) == (
        ["b-lora", "b2"],
        [],
    )
    assert (names.get("x"), names.get("y"), names.get("z")) == (
        ModelName("a", "alias"),
        ModelName("a", "alias"),
        ModelName("a", "adapter"),
    )
    assert names.get("a") is None and names.get("b") is None  # models resolve as models
    # a's workers stop listing y: it goes to b, whose workers list it too
    assert names.set_listed("a", {"alias": [], "adapter": ["z"]}) == ([], ["y"])
    assert names.get("y") == ModelName("b", "alias")
    assert names.of("b", "alias") == ["b2", "y"] and names.of("b", "adapter") == ["b-lora"]
    assert names.names() == ["x", "z", "b2", "y", "b-lora"]


def test_a_name_listed_as_an_alias_and_an_adapter_of_one_model_stays_the_first():
    names = ModelNames(["a"], {})
    names.set_listed("a", {"alias": ["n"], "adapter": ["n"]})
    assert names.get("n") == ModelName("a", "alias")


# --- config ---------------------------------------------------------------------------------------


def test_the_file_names_a_models_aliases(tmp_path: Path):
    path = tmp_path / "picker.yaml"
    path.write_text(
        "workers:\n  - {id: w0, endpoint: '10.0.0.5:8000', model: llama}\n"
        "models:\n  - {name: llama, aliases: [llama-3.1, llama-8b], lora-adapters: [sql-lora]}\n"
    )
    (model,) = load_config(["--config", str(path)]).models
    assert (model.aliases, model.lora_adapters) == ((ALIAS, "llama-8b"), ("sql-lora",))
    assert other_names([model]) == {
        ALIAS: (LLAMA, "alias"),
        "llama-8b": (LLAMA, "alias"),
        "sql-lora": (LLAMA, "adapter"),
    }


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "llama", "aliases": "llama-3.1"}], r"aliases=.*expected a list of names"),
        ([{"name": "llama", "aliases": [""]}], "expected a list of names"),
        ([{"name": "llama", "aliases": ["qwen"]}, {"name": "qwen"}], "'qwen' is also a model"),
        (
            [{"name": "llama", "aliases": ["x"]}, {"name": "qwen", "aliases": ["x"]}],
            "aliases of qwen: 'x' is already llama's alias",
        ),
        (
            [{"name": "llama", "aliases": ["x"], "lora-adapters": ["x"]}],
            "lora-adapters of llama: 'x' is already llama's alias",
        ),
    ],
)
def test_an_alias_that_would_be_two_things_is_refused_at_start(models, message):
    with pytest.raises(ConfigError, match=message):
        read_models(models, [])


async def test_the_python_client_takes_a_models_aliases():
    client = RoutingClient.from_workers(LLAMA, ["127.0.0.1:8000"], aliases=[ALIAS], kv_events=False)
    try:
        pool, adapter = client.picker.resolve_model(ALIAS)
        assert (pool.model, adapter) == (LLAMA, None)
    finally:
        await client.close()


async def test_names_that_only_came_are_logged(workers, caplog):  # noqa: F811
    _, endpoints = await workers(body("vllm", "static-and-loaded"))
    picker = llama_picker(endpoints)
    try:
        with caplog.at_level(logging.INFO, logger="extproc.lora_discovery"):
            await read_names(picker)
        (line,) = [r.getMessage() for r in caplog.records if "listed by its workers" in r.getMessage()]
        assert "2 adapters, 1 other served names" in line and ALIAS in line
    finally:
        await picker.close()
