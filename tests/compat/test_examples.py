"""examples/dynamo/: Dynamo's KvPushRouter guide examples, run against in-process mock workers with the
workers named in a DYN_CONFIG file, as their headers say."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.test_client import RunningWorker, serve_workers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dynamo"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"dynamo_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def name_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workers: Sequence[RunningWorker], labels: Sequence[str]
) -> None:
    """The config file the examples' headers show: each worker's id is its ip:port."""
    lines = ["workers:"]
    lines += [
        f"  - {{id: {w.endpoint}, endpoint: {w.endpoint}, model: {label}}}"
        for w, label in zip(workers, labels, strict=True)
    ]
    path = tmp_path / "workers.yaml"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("DYN_CONFIG", str(path))


async def test_minimize_ttft_routes_to_the_worker_with_least_prefill(monkeypatch, tmp_path, capsys):
    example = load_example("minimize_ttft")
    async with serve_workers(2, model="meta-llama/Llama-2-7b-hf") as workers:
        name_workers(monkeypatch, tmp_path, workers, ["backend", "backend"])
        router, best = await example.minimize_ttft_routing()
        await router.close()
    out = capsys.readouterr().out
    assert "'potential_prefill_tokens': 10, 'potential_decode_blocks': 1, 'active_requests': 0" in out
    assert f"Selected worker {best['worker_id']} with 10 prefill tokens" in out
    assert best["worker_id"] in {w.endpoint for w in workers}
    assert out.count("Generated tokens: [") == 20  # max_tokens 20, one token per chunk
    assert router.router.is_idle()


async def test_manual_state_management_tracks_and_frees_the_request(monkeypatch, tmp_path, capsys):
    example = load_example("manual_state")
    async with serve_workers(2, model="model-name") as workers:
        name_workers(monkeypatch, tmp_path, workers, ["backend", "backend"])
        router, routes = await example.main()
        await router.close()
    (first, first_overlap), (second, second_overlap) = routes
    assert first_overlap == 0 and second == first and second_overlap == 6  # 99 tokens: 6 full blocks
    assert router.router.is_idle()
    assert f"req-123 -> worker {second}, 6 blocks cached" in capsys.readouterr().out


async def test_hierarchical_probing_routes_through_the_router_whose_group_caches_the_prompt(
    monkeypatch, tmp_path, capsys
):
    example = load_example("hierarchical_probing")
    async with serve_workers(2, model="model-name") as workers:
        name_workers(monkeypatch, tmp_path, workers, ["group_1", "group_2"])
        group, worker_id, routers = await example.main()
        for router in routers:
            await router.close()
    assert (group, worker_id) == ("group_2", workers[1].endpoint)
    out = capsys.readouterr().out
    assert f"group_2 {workers[1].endpoint} (12 blocks)" in out and "group_1" in out
    assert all(router.router.is_idle() for router in routers)
