"""The hierarchical overlay's picker configurations, run for real on loopback.

Two group pickers (as gateway/hierarchical/group-*/picker: router-group API on) and the top-level
picker with the overlay's own top/picker.yaml, its group addresses pointed at them. The top-level
picker routes a request to a worker of one of the pools; and it should become ready, which is
what its readiness probe in the overlay waits for.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
import yaml

from extproc.config import load_config
from extproc.runtime.server import RunningPicker, start_picker
from tests.k8s.conftest import GATEWAY

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
async def hierarchy(tmp_path) -> AsyncIterator[tuple[RunningPicker, dict[str, set[str]]]]:
    running: list[RunningPicker] = []
    endpoints: dict[str, set[str]] = {}
    try:
        addresses = {}
        for group, first_octet in (("a", 1), ("b", 2)):
            workers = [(f"{group}{i}", f"10.{first_octet}.0.{i}:8000") for i in (1, 2)]
            endpoints[group] = {e for _, e in workers}
            path = tmp_path / f"group-{group}.yaml"
            path.write_text(yaml.safe_dump({
                "router": {"router-mode": "kv", "kv-cache-block-size": 16},
                "models": [{"name": MODEL}],
                "workers": [{"id": wid, "endpoint": e, "model": MODEL} for wid, e in workers],
            }))  # fmt: skip
            config = load_config(
                ["--config", str(path), "--port", "0", "--health-port", "0", "--group-api-port", "0"],
                environ={},
            )
            group_picker = await start_picker(config)
            running.append(group_picker)
            assert group_picker.group_api is not None
            addresses[f"extproc-picker-{group}:9100"] = f"127.0.0.1:{group_picker.group_api.port}"
        top = (GATEWAY / "hierarchical" / "top" / "picker.yaml").read_text()
        for in_cluster, local in addresses.items():
            assert in_cluster in top
            top = top.replace(in_cluster, local)
        top = top.replace("tokenize-url: http://llm-workers:8000", "")  # no engine here: byte tokens
        (tmp_path / "top.yaml").write_text(top)
        # the overlay's 50 ms probe deadline is for a cluster; a loaded test machine may need longer
        argv = ["--config", str(tmp_path / "top.yaml"), "--port", "0", "--health-port", "0"]
        config = load_config([*argv, "--group-probe-timeout-ms", "2000"], environ={})
        top_picker = await start_picker(config)
        running.append(top_picker)
        yield top_picker, endpoints
    finally:
        for picker in reversed(running):
            await picker.stop(0)


async def test_the_top_level_picker_routes_through_the_groups(hierarchy):
    top, endpoints = hierarchy
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello " * 40}]}).encode()
    pick = await top.picker.pick(
        body=body, path="/v1/chat/completions", headers={}, subset=None, client_request_id="r1"
    )
    try:
        assert pick.endpoint in endpoints["a"] | endpoints["b"]
    finally:
        top.picker.finish(pick, "test")


async def test_the_top_level_picker_becomes_ready(hierarchy):
    top, _ = hierarchy
    assert top.readiness is not None
    deadline = time.monotonic() + 2.0
    while not top.readiness.check().ready:
        assert time.monotonic() < deadline, top.readiness.check().reason
        await asyncio.sleep(0.02)
