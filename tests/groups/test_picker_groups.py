"""A top-level EndpointPicker with `groups:` configured, its groups' APIs served in this event loop.

Requests go through the picker (and once through the ext_proc servicer) exactly as Envoy's would:
parse, tokenize, then the selector probes the groups, commits to one and owns the lifecycle.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest_asyncio

from extproc.config import GroupConfig, GroupsConfig, ModelConfig, PickerConfig
from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.events.counters import EventCounters
from extproc.events.vllm import VllmEventDecoder, parse_frames
from extproc.groups import start_group_api
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig
from extproc.runtime.server import start_picker

from ..events.test_engine_fixtures import live
from ..picker_fixtures import request_body, request_headers
from .builders import BLOCK, MODEL, group_config


def chat(*turns: str) -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4}).encode()


def top_config(groups: list[GroupConfig], **kwargs) -> PickerConfig:
    return PickerConfig(
        router=RouterConfig(block_size=BLOCK, use_kv_events=False, prefill_load_model="none"),
        workers=(),
        models=(ModelConfig(MODEL),),
        seed=3,
        conformance_hooks=True,
        groups=GroupsConfig(groups=tuple(groups), probe_timeout_s=0.5, **kwargs),
    )


@pytest_asyncio.fixture
async def fleet() -> AsyncIterator[tuple[EndpointPicker, dict[str, EndpointPicker]]]:
    """Two group pickers (east: 127.0.1.x, west: 127.0.2.x) serving their API, and the top-level picker."""
    groups = {
        "east": EndpointPicker(group_config("e", 2, subnet=1)),
        "west": EndpointPicker(group_config("w", 2, subnet=2)),
    }
    apis = [await start_group_api(p.local, "127.0.0.1", 0) for n, p in groups.items()]
    top = EndpointPicker(
        top_config([GroupConfig(n, f"127.0.0.1:{api.port}") for n, api in zip(groups, apis, strict=True)])
    )
    try:
        yield top, groups
    finally:
        await top.close()
        for api in apis:
            await api.stop(0)


async def pick(picker: EndpointPicker, body: bytes | None, request_id: str, *, path="/v1/chat/completions",
               headers=None, subset=None):  # fmt: skip
    return await picker.pick(
        body=body, path=path, headers=headers or {}, subset=subset, client_request_id=request_id
    )


def idle(top: EndpointPicker, groups: dict[str, EndpointPicker]) -> bool:
    return top.is_idle() and all(g.is_idle() for g in groups.values())


async def test_a_conversation_sticks_to_its_group_and_worker(fleet):
    top, groups = fleet
    system = "you are a helpful assistant that answers in rhymes " * 8
    firsts = {}
    for conv in range(6):
        first = await pick(top, chat(system + f" conversation {conv} " * 20), f"c{conv}-1")
        assert first.group in groups and first.tracked
        assert first.endpoint == groups[first.group].pools[MODEL].endpoint_of(first.worker)
        top.first_token(first)
        top.finish(first, "complete")
        firsts[conv] = first
    await top.selector.drain()
    assert idle(top, groups)
    for conv, first in firsts.items():
        second = await pick(
            top, chat(system + f" conversation {conv} " * 20, "a rhyme", "another one"), f"c{conv}-2"
        )
        assert (second.group, second.worker, second.endpoint) == (first.group, first.worker, first.endpoint)
        assert second.overlap_blocks >= first.request_blocks - 1
        owner = groups[second.group].pools[MODEL].router
        assert owner.sequences.worker_of(second.request_id) == second.worker
        top.finish(second, "cancelled")
        await top.selector.drain()  # freed before the next turn: a busy holder may rightly lose a turn
    assert idle(top, groups)
    assert sum(s.chosen for s in top.selector.metrics.groups.values()) == 12


async def test_subset_hints_and_conformance_selection_reach_the_groups(fleet):
    top, groups = fleet
    only = groups["west"].pools[MODEL].workers["w1"].endpoint
    for i in range(4):
        chosen = await pick(top, chat(f"subset {i} " * 30), f"s{i}", subset=[only])
        assert (chosen.group, chosen.endpoint) == ("west", only)
        top.finish(chosen, "complete")
    chosen = await pick(
        top, chat("selection " * 30), "sel", headers={epp.CONFORMANCE_SELECTION_HEADER: "127.0.1.1"}
    )
    assert (chosen.group, chosen.endpoint) == ("east", "127.0.1.1:8000")
    top.finish(chosen, "complete")
    await top.selector.drain()
    assert idle(top, groups)


async def test_untracked_requests_are_routed_through_a_group_and_freed(fleet):
    top, groups = fleet
    chosen = await pick(top, None, "models", path="/v1/models")
    assert chosen.group in groups and not chosen.tracked
    await top.selector.drain()
    assert idle(top, groups)


async def test_no_group_answering_is_a_503_through_the_servicer(refusing_port):
    dead = [
        GroupConfig("a", f"127.0.0.1:{refusing_port()}"),
        GroupConfig("b", f"127.0.0.1:{refusing_port()}"),
    ]
    top = EndpointPicker(top_config(dead))
    service = ExtProcService(top, max_body_bytes=1 << 20)

    async def feed():
        yield request_headers()
        yield request_body(chat("nobody home " * 10))

    answers = [a async for a in service.Process(feed(), None)]
    immediate = answers[-1].immediate_response
    assert immediate.status.code == 503 and immediate.details == "rejected-no-endpoints"
    assert top.is_idle()
    await top.close()


async def test_a_local_fallback_group_takes_over_when_no_remote_answers(refusing_port):
    config = replace(
        top_config(
            [GroupConfig("remote", f"127.0.0.1:{refusing_port()}"), GroupConfig("here", None)],
            fallback="here",
        ),
        workers=group_config("h", 2, subnet=7).workers,
    )
    top = EndpointPicker(config)
    chosen = await pick(top, chat("fall back " * 20), "f1")
    assert chosen.group == "here" and chosen.endpoint.startswith("127.0.7.")
    assert top.selector.metrics.outcomes["fallback"] == 1
    assert not top.pools[MODEL].router.is_idle()
    top.finish(chosen, "complete")
    await top.selector.drain()
    assert top.is_idle()
    await top.close()


async def test_an_adapters_request_reaches_a_remote_group_with_its_name_and_matches_its_blocks():
    """The top picker knows `sql-lora` is an adapter (its config: it reads no worker's model list in
    front of remote groups); the group gets the base model and the adapter's name, and its worker
    that vLLM 0.33.0 told about sql-lora's blocks wins on them, in the west group over the east."""
    groups = {
        "east": EndpointPicker(group_config("e", 2, subnet=1)),
        "west": EndpointPicker(group_config("w", 2, subnet=2)),
    }
    counters = EventCounters()
    decoder = VllmEventDecoder("w1", BLOCK, counters=counters)
    for message in live("vllm/standard"):  # ends holding sql-lora's first two blocks of 1000..1047
        frame = parse_frames(message, counters)
        assert frame is not None
        for event in decoder.decode(frame.payload).events:
            groups["west"].pools[MODEL].router.apply_event(event)
    apis = [await start_group_api(p.local, "127.0.0.1", 0) for p in groups.values()]
    config = top_config(
        [GroupConfig(n, f"127.0.0.1:{api.port}") for n, api in zip(groups, apis, strict=True)]
    )
    top = EndpointPicker(replace(config, models=(ModelConfig(MODEL, lora_adapters=("sql-lora",)),)))
    try:
        body = json.dumps({"model": "sql-lora", "prompt": list(range(1000, 1048)), "max_tokens": 4}).encode()
        chosen = await pick(top, body, "r1", path="/v1/completions")
        assert (chosen.group, str(chosen.worker.worker_id), chosen.overlap_blocks) == ("west", "w1", 2)
        assert chosen.model == MODEL
        top.finish(chosen, "complete")
        await top.selector.drain()
        assert idle(top, groups)
    finally:
        await top.close()
        for api in apis:
            await api.stop(0)
        for group in groups.values():
            await group.close()


async def test_serve_says_its_lora_discovery_does_not_see_the_groups_workers(refusing_port, caplog):
    config = replace(top_config([GroupConfig("g", f"127.0.0.1:{refusing_port()}")]), port=0, health_port=0)
    with caplog.at_level(logging.INFO, logger="extproc.server"):
        running = await start_picker(config)
        await running.stop(0)
    assert any(
        "LoRA discovery reads this picker's own workers only" in r.getMessage() for r in caplog.records
    )
