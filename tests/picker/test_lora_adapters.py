"""LoRA adapters served as models: a request naming an adapter goes to its base model's workers
and matches the blocks the engines stored under that adapter, on vLLM 0.33.0's own KV event bytes.

vLLM serves an adapter (`--lora-modules sql-lora=PATH`) under its own model name and hashes its
blocks with the adapter's name; its `BlockStored` events carry `lora_name`. The config says which
names are adapters (`models[].lora-adapters`). The events come from `tests/events/engines/`: vLLM's
`BlockPool` recorded in the `standard` capture stores tokens 1000.. without an adapter (3 blocks,
evicted by the end) and again under `sql-lora` (2 blocks, held at the end).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest

from extproc.client import RoutingClient
from extproc.config import ConfigError, ModelConfig, PickerConfig, load_config
from extproc.config.workers import other_names, read_models
from extproc.errors import RequestInvalid, UnknownModel
from extproc.events.counters import EventCounters
from extproc.events.vllm import VllmEventDecoder, parse_frames
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.runtime.server import start_picker

from ..events.test_engine_fixtures import BS, live
from ..picker_fixtures import MODEL, picker_config

ADAPTER, OTHER = "sql-lora", "chat-lora"
PROMPT = list(range(1000, 1048))  # three blocks: vLLM stored the first two under sql-lora too


def lora_config(**router: object) -> PickerConfig:
    base = picker_config(2, use_kv_events=True, **router)
    return replace(base, models=(ModelConfig(MODEL, lora_adapters=(ADAPTER, OTHER)),))


def replay_vllm(
    picker: EndpointPicker,
    worker: str,
    batches: int | None = None,
    capture: str = "vllm/standard",
    model: str = MODEL,
) -> None:
    """`worker`'s engine (serving `model`) published the capture's first `batches` batches (all: None)."""
    counters = EventCounters()
    decoder = VllmEventDecoder(worker, BS, counters=counters)
    router = picker.pools[model].router
    for message in live(capture)[:batches]:
        frame = parse_frames(message, counters)
        assert frame is not None
        for event in decoder.decode(frame.payload).events:
            router.apply_event(event)
    assert counters["vllm.lora_without_name"] == 0


@pytest.fixture
async def picker() -> AsyncIterator[EndpointPicker]:
    picker = EndpointPicker(lora_config())
    replay_vllm(picker, "w0")  # ends holding sql-lora's two blocks of PROMPT, none without it
    replay_vllm(picker, "w1", batches=2)  # holds PROMPT's three blocks without an adapter
    yield picker
    await picker.close()


async def pick(picker: EndpointPicker, model: str = MODEL, tokens: Iterable[int] = PROMPT, **extra) -> Pick:
    body = json.dumps({"model": model, "prompt": list(tokens), **extra}).encode()
    return await picker.pick(
        body=body, path="/v1/completions", headers={}, subset=None, client_request_id="r"
    )


async def test_an_adapter_request_matches_the_blocks_vllm_stored_under_that_adapter(picker):
    chosen = await pick(picker, ADAPTER)
    assert (str(chosen.worker.worker_id), chosen.overlap_blocks, chosen.request_blocks) == ("w0", 2, 3)
    assert chosen.model == MODEL  # counted, queued and pinned with its base model
    base = await pick(picker, MODEL)  # the same tokens without the adapter: w1's blocks, not sql-lora's
    assert (str(base.worker.worker_id), base.overlap_blocks) == ("w1", 3)


async def test_another_adapter_matches_neither_the_base_models_blocks_nor_sql_loras(picker):
    chosen = await pick(picker, OTHER)
    assert chosen.overlap_blocks == 0 and chosen.model == MODEL


async def test_an_unknown_model_is_a_404_that_names_the_adapters_too(picker):
    with pytest.raises(UnknownModel) as raised:
        await pick(picker, "sql-lora-v2")
    assert raised.value.known == [MODEL, ADAPTER, OTHER]
    assert f"known models: {OTHER}, {MODEL}, {ADAPTER}" in raised.value.message


def test_an_unknown_models_answer_names_at_most_twenty_known_names():
    many = UnknownModel("nope", [f"lora-{i:03}" for i in range(UnknownModel.SHOWN + 5)])
    assert many.message.endswith("lora-018, lora-019 and 5 more") and "lora-020" not in many.message
    assert UnknownModel("nope", [f"m{i}" for i in range(UnknownModel.SHOWN)]).message.endswith("m8, m9")
    assert UnknownModel("nope", []).message.endswith("known models: none")


async def test_an_adapters_request_on_another_path_goes_to_the_base_models_workers(picker):
    chosen = await picker.pick(
        body=json.dumps({"model": ADAPTER, "input": "embed me"}).encode(),
        path="/v1/embeddings",
        headers={},
        subset=None,
        client_request_id="e",
    )
    assert not chosen.tracked and chosen.model == MODEL


async def test_a_sticky_session_of_an_adapter_stays_on_its_worker(picker):
    hints = {"nvext": {"session_control": {"session_id": "s-1"}}}
    first = await pick(picker, OTHER, list(range(50_000, 50_064)), **hints)
    picker.answered(first, 200)
    again = await pick(picker, OTHER, list(range(60_000, 60_064)), **hints)
    assert again.worker == first.worker


async def test_potential_loads_of_an_adapter_show_its_blocks():
    running = await start_picker(replace(lora_config(), port=0, health_port=0, admin_port=0))
    try:
        replay_vllm(running.picker, "w0")
        async with aiohttp.ClientSession(f"http://127.0.0.1:{running.admin.port}") as http:
            overlap = {}
            for model in (ADAPTER, MODEL):
                async with http.post("/debug/potential_loads", json={"model": model, "tokens": PROMPT}) as r:
                    assert r.status == 200
                    overlap[model] = {e["worker"]: e["overlap_blocks"] for e in (await r.json())["loads"]}
            assert overlap == {ADAPTER: {"w0": 2, "w1": 0}, MODEL: {"w0": 0, "w1": 0}}
            async with http.post("/debug/potential_loads", json={"model": "nope", "tokens": PROMPT}) as r:
                assert r.status == 404
            async with http.get("/debug/workers") as r:
                assert (await r.json())["lora_adapters"] == {MODEL: [ADAPTER, OTHER]}
    finally:
        await running.stop(0)


@pytest.mark.parametrize(
    ("body", "overlap"),
    [
        ({"model": f"{MODEL}:{ADAPTER}"}, 2),
        ({"model": MODEL, "lora_path": ADAPTER}, 2),
        ({"model": f"{MODEL}:{ADAPTER}", "lora_path": OTHER}, 2),  # the model's adapter wins, as in SGLang
        ({"model": f"{MODEL}:{OTHER}"}, 0),
        ({"model": MODEL, "lora_path": OTHER}, 0),
        ({"model": f"{MODEL}:not-configured"}, 0),  # SGLang's syntax needs no config
    ],
)
async def test_sglangs_ways_of_naming_an_adapter_match_its_blocks(body, overlap):
    """SGLang 0.5.23's recorder stored tokens 3000.. under sql-lora (two pages) and without an adapter."""
    picker = EndpointPicker(lora_config())
    try:
        replay_vllm(picker, "w0", capture="sglang/default-format")
        chosen = await pick(picker, tokens=range(3000, 3032), **body)
        assert (chosen.overlap_blocks, chosen.model) == (overlap, MODEL)
    finally:
        await picker.close()


async def test_requests_are_counted_per_listed_adapter_and_any_other_name_as_unlisted(picker):
    """vLLM serves each adapter as a model, so an operator asks how traffic splits between them. A name
    SGLang's syntax or `lora_path` gives need not be listed: a client must not make a series each."""
    for body in (
        {"model": ADAPTER}, {"model": ADAPTER},
        {"model": f"{MODEL}:{OTHER}"}, {"model": MODEL, "lora_path": OTHER},
        {"model": f"{MODEL}:made-up-1"}, {"model": MODEL, "lora_path": "made-up-2"},
        {"model": MODEL},
    ):  # fmt: skip
        await pick(picker, **body)
    text = generate_latest(picker.metrics.registry).decode()
    series = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("extproc_lora_requests_total{")
    }
    assert series == {
        f'extproc_lora_requests_total{{adapter="{ADAPTER}",model="{MODEL}"}}': 2.0,
        f'extproc_lora_requests_total{{adapter="{OTHER}",model="{MODEL}"}}': 2.0,
        f'extproc_lora_requests_total{{adapter="unlisted",model="{MODEL}"}}': 2.0,
    }
    assert f'extproc_requests_total{{model="{MODEL}",outcome="routed"}} 7.0' in text


async def test_an_adapter_the_workers_list_is_counted_by_its_name():
    picker = EndpointPicker(picker_config(2, use_kv_events=True))
    with pytest.raises(UnknownModel):
        await pick(picker, "found-lora")  # not listed yet: the unknown model's 404
    picker.set_discovered_names(MODEL, [], ["found-lora"])  # a worker's /v1/models lists it
    try:
        await pick(picker, "found-lora")
        await pick(picker, f"{MODEL}:found-lora")
        assert dict(picker.metrics.lora_requests.values) == {(MODEL, "found-lora"): 2}
    finally:
        await picker.close()


@pytest.mark.parametrize("model", [f"{MODEL}:", f"{MODEL}: "])
async def test_sglangs_syntax_with_no_adapter_is_the_base_model(model):
    picker = EndpointPicker(lora_config())
    try:
        replay_vllm(picker, "w0", capture="sglang/default-format")
        chosen = await pick(picker, model, range(3000, 3064))  # node c: the base model's two pages
        assert (chosen.overlap_blocks, chosen.model) == (2, MODEL)
    finally:
        await picker.close()


@pytest.mark.parametrize("lora_path", [7, ["sql-lora"], {"name": "sql-lora"}])
async def test_a_lora_path_that_is_not_a_name_is_a_400(picker, lora_path):
    with pytest.raises(RequestInvalid, match="lora_path"):
        await pick(picker, MODEL, lora_path=lora_path)


# --- config -----------------------------------------------------------------------------------


def test_the_file_names_a_models_adapters_in_either_spelling(tmp_path: Path):
    path = tmp_path / "picker.yaml"
    path.write_text(
        "workers:\n  - {id: w0, endpoint: '10.0.0.5:8000', model: llama}\n"
        "models:\n  - {name: llama, lora-adapters: [sql-lora, chat-lora]}\n"
        "  - {name: qwen, lora_adapters: [qwen-sql]}\n"
    )
    models = load_config(["--config", str(path)]).models
    assert [(m.name, m.lora_adapters) for m in models] == [
        ("llama", ("sql-lora", "chat-lora")),
        ("qwen", ("qwen-sql",)),
    ]
    assert other_names(models) == {
        "sql-lora": ("llama", "adapter"),
        "chat-lora": ("llama", "adapter"),
        "qwen-sql": ("qwen", "adapter"),
    }


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "llama", "lora-adapters": "sql-lora"}], "expected a list of names"),
        ([{"name": "llama", "lora-adapters": ["sql-lora", ""]}], "expected a list of names"),
        ([{"name": "llama", "lora-adapters": [7]}], "expected a list of names"),
        ([{"name": "llama", "lora-adapters": ["qwen"]}, {"name": "qwen"}], "'qwen' is also a model"),
        (
            [{"name": "llama", "lora-adapters": ["sql"]}, {"name": "qwen", "lora-adapters": ["sql"]}],
            "'sql' is already llama's adapter",
        ),
    ],
)
def test_a_name_that_would_be_two_things_is_refused_at_start(models, message):
    with pytest.raises(ConfigError, match=message):
        read_models(models, [])


def test_an_adapter_named_by_a_workers_model_is_refused_too():
    with pytest.raises(ConfigError, match="'w-model' is also a model"):
        EndpointPicker(
            replace(
                picker_config(1),
                models=(ModelConfig(MODEL, lora_adapters=("w-model",)), ModelConfig("w-model")),
            )
        )


async def test_the_python_client_takes_a_models_adapters():
    client = RoutingClient.from_workers(MODEL, ["127.0.0.1:8000"], lora_adapters=[ADAPTER], kv_events=False)
    try:
        pool, lora_name = client.picker.resolve_model(ADAPTER)
        assert (pool.model, lora_name) == (MODEL, ADAPTER)
        with pytest.raises(UnknownModel):
            client.picker.resolve_model(OTHER)
    finally:
        await client.close()
