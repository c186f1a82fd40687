"""Issue 23: Dynamo's router metric names exported beside ours, with the same values, and every name
we claim is one the installed Dynamo (ai-dynamo-runtime 1.6.1) itself defines."""

from __future__ import annotations

import inspect
import mmap
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from extproc.admin.dynamo_metrics import exported_names
from extproc.runtime.server import start_picker

from ..picker_fixtures import MODEL, chat_body, picker_config


@pytest.fixture
async def running():
    config = replace(picker_config(2), port=0, health_port=0, admin_port=0)
    picker = await start_picker(config)
    try:
        yield picker
    finally:
        await picker.stop(0)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(found, name: str, **labels: str) -> float:
    matching = [v for lab, v in found[name] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(matching) == 1, (name, labels, found.get(name))
    return matching[0]


async def test_dynamo_names_carry_our_values_after_routed_requests(running) -> None:
    picker = running.picker
    for i in range(4):
        p = await picker.pick(
            body=chat_body("the same long system prompt " * 40 + str(i)),
            path="/v1/chat/completions",
            headers={},
            subset=None,
            client_request_id=f"d{i}",
        )
        if i < 3:  # one stays in flight: active load on its worker
            picker.answered(p, 200)
            picker.first_token(p)
            picker.finish(p, "complete")
    async with (
        aiohttp.ClientSession(f"http://127.0.0.1:{running.admin.port}") as http,
        http.get("/metrics") as r,
    ):
        text = await r.text()
    found = samples(text)
    for name in exported_names():
        base = name.removesuffix("_total")
        assert any(n == name or n.startswith(base + "_") for n in found), name

    # per worker: the router's own numbers, Dynamo's labels (plus model)
    pool = picker.pools[MODEL]
    for worker in pool.router.workers():
        labels = {"worker_id": str(worker.worker_id), "dp_rank": str(worker.dp_rank), "worker_type": "decode"}
        assert one(found, "dynamo_frontend_worker_active_decode_blocks", model=MODEL, **labels) == (
            pool.router.sequences.decode_blocks(worker)
        )
        assert one(found, "dynamo_frontend_worker_active_prefill_tokens", model=MODEL, **labels) == (
            pool.router.sequences.prefill_tokens(worker)
        )
        registered = {"router_worker_id": str(worker.worker_id), "dp_rank": str(worker.dp_rank)}
        assert one(found, "dynamo_component_router_worker_registered", model=MODEL, **registered) == 1
    assert sum(v for _, v in found["dynamo_frontend_worker_active_decode_blocks"]) > 0  # one in flight

    # requests: routed = started, finished = processed
    labels = {"model": MODEL, "dynamo_component": "router"}
    assert one(found, "dynamo_component_router_requests_started_total", **labels) == 4
    assert one(found, "dynamo_component_router_requests_total", **labels) == 3
    assert one(found, "extproc_requests_total", model=MODEL, outcome="routed") == 4

    # overlap: our blocks times the block size, in tokens
    block = pool.router.config.block_size
    for ours, theirs in (
        ("best", "dynamo_component_router_kv_best_eligible_cached_prefix_tokens_total"),
        ("chosen", "dynamo_component_router_kv_selected_cached_prefix_tokens_total"),
    ):
        blocks = one(found, "extproc_overlap_blocks_total", model=MODEL, which=ours)
        assert blocks > 0
        assert one(found, theirs, phase="aggregated", **labels) == blocks * block
    regret = next(v for lab, v in found["extproc_overlap_regret_blocks_bucket"] if lab["le"] == "0.0")
    regret_count = one(found, "extproc_overlap_regret_blocks_count", model=MODEL)
    lost = one(found, "dynamo_component_router_overlap_blocks_lost_count", worker_type="decode", **labels)
    assert lost == regret_count - regret
    assert one(found, "dynamo_component_router_non_max_overlap_selections_total", **labels) == lost
    assert one(found, "dynamo_component_router_overlap_blocks_lost_sum", **labels) == one(
        found, "extproc_overlap_regret_blocks_sum", model=MODEL
    )

    # routing overhead: our decision stages, in milliseconds
    for stage, name in (
        ("hash", "dynamo_router_overhead_block_hashing_ms"),
        ("match", "dynamo_router_overhead_indexer_find_matches_ms"),
        ("select", "dynamo_router_overhead_scheduling_ms"),
    ):
        assert (
            one(found, f"{name}_count")
            == one(found, "extproc_decision_stage_seconds_count", stage=stage)
            == 4
        )
        ours = one(found, "extproc_decision_stage_seconds_sum", stage=stage)
        assert one(found, f"{name}_sum") == pytest.approx(ours * 1000)
        assert {lab["router_id"] for lab, _ in found[f"{name}_count"]} != {""}


def _dynamo_names() -> set[str]:
    """Full metric names as the installed Dynamo composes them: a `name_prefix` + "_" + a suffix from
    its prometheus_names module (and `dynamo_component_` + "router_" + a frontend_service suffix)."""
    from dynamo import prometheus_names as pn

    suffixes: set[str] = set()

    def walk(cls: type) -> None:
        for key, value in vars(cls).items():
            if key.isupper() and isinstance(value, str) and value:
                suffixes.add(value)
            elif inspect.isclass(value):
                walk(value)

    for _, cls in inspect.getmembers(pn, inspect.isclass):
        walk(cls)
    prefixes = {v for k, v in vars(pn.name_prefix).items() if k.isupper()}
    names = {f"{p}_{s}" for p in prefixes for s in suffixes}
    names |= {f"{pn.name_prefix.COMPONENT}_{pn.router_request.METRIC_PREFIX}{s}" for s in suffixes}
    return names


def _core_contains(*strings: str) -> dict[str, bool]:
    import dynamo._core as core

    with Path(core.__file__).open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return {s: data.find(s.encode()) >= 0 for s in strings}


def test_every_claimed_name_is_one_the_installed_dynamo_defines() -> None:
    known = _dynamo_names()
    claimed = exported_names()
    assert not [n for n in claimed if n not in known]
    # and the compiled router itself holds each name's suffix (the module could drift from it)
    suffixes = [n.removeprefix("dynamo_component_").removeprefix("dynamo_frontend_") for n in claimed]
    suffixes = [s.removeprefix("dynamo_router_") for s in suffixes]
    present = _core_contains(*suffixes, *(s.removeprefix("router_") for s in suffixes))
    # the kv_*_cached_prefix_tokens counters are "router_" + a frontend_service name, joined at run time
    assert [s for s in suffixes if not (present[s] or present[s.removeprefix("router_")])] == []


def test_label_names_are_dynamos() -> None:
    from dynamo import prometheus_names as pn

    ours = {"worker_id", "dp_rank", "worker_type", "model", "router_id", "dynamo_component"}
    assert ours <= {v for k, v in vars(pn.labels).items() if k.isupper()}
    # the two Dynamo names that are not in its labels module: kv_router/metrics.rs constants
    assert _core_contains("router_worker_id", "phase") == {"router_worker_id": True, "phase": True}
