"""Config reload while the picker runs: the file's `workers:` are re-read and applied.

The config file is laid out as kubelet lays out a ConfigMap volume (picker.yaml -> ..data/picker.yaml,
..data -> a timestamped directory, swapped atomically on update), so the test exercises the update
a running pod sees. A file that does not load is logged and ignored. Conditions are polled with a
deadline, never slept for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from itertools import count
from pathlib import Path

import pytest
import yaml

from extproc.config import load_config
from extproc.runtime.server import RunningPicker, start_picker

MODEL = "demo-model"


class ConfigMapVolume:
    """A directory updated the way kubelet updates a mounted ConfigMap: write new, swap a symlink."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._versions = count()
        root.mkdir()
        (root / "picker.yaml").symlink_to("..data/picker.yaml")

    @property
    def path(self) -> Path:
        return self.root / "picker.yaml"

    def write(self, text: str) -> None:
        version = self.root / f"..2026_{next(self._versions)}"
        version.mkdir()
        (version / "picker.yaml").write_text(text)
        link = self.root / "..data_tmp"
        link.symlink_to(version.name)
        os.replace(link, self.root / "..data")


def document(workers: list[tuple[str, str]], *, mode: str = "kv") -> str:
    return yaml.safe_dump(
        {
            "router": {"router-mode": mode},
            "models": [{"name": MODEL}],
            "workers": [{"id": wid, "endpoint": endpoint, "model": MODEL} for wid, endpoint in workers],
        }
    )


@pytest.fixture
async def picker(tmp_path) -> AsyncIterator[tuple[RunningPicker, ConfigMapVolume]]:
    volume = ConfigMapVolume(tmp_path / "config")
    volume.write(document([("w0", "10.2.0.1:8000"), ("w1", "10.2.0.2:8000")]))
    config = load_config(
        ["--config", str(volume.path), "--port", "0", "--health-port", "0", "--reload-config",
         "--discovery-refresh-secs", "0.05"],
        environ={},
    )  # fmt: skip
    running = await start_picker(config)
    try:
        yield running, volume
    finally:
        await running.stop(0)


def workers(running: RunningPicker) -> dict[str, str]:
    return {wid: w.endpoint for wid, w in running.picker.pools[MODEL].workers.items()}


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        await asyncio.sleep(0.01)


async def test_changed_workers_are_applied_without_a_restart(picker):
    running, volume = picker
    assert workers(running) == {"w0": "10.2.0.1:8000", "w1": "10.2.0.2:8000"}

    volume.write(document([("w1", "10.2.0.2:8000"), ("w2", "10.2.0.3:8000")]))
    await wait_until(lambda: set(workers(running)) == {"w1", "w2"}, "w0 replaced by w2")

    volume.write(document([("w1", "10.2.0.9:8000"), ("w2", "10.2.0.3:8000")]))  # w1 moved
    await wait_until(lambda: workers(running)["w1"] == "10.2.0.9:8000", "w1's new endpoint")


async def test_a_broken_file_is_logged_and_ignored(picker, caplog):
    running, volume = picker
    caplog.set_level(logging.INFO, logger="extproc.discovery")
    before = workers(running)

    volume.write("workers: [{id: w9, endpoint: 10.2.0.9:8000}]\n")  # no model: not a valid worker
    await wait_until(lambda: "does not load" in caplog.text, "the error logged")
    assert workers(running) == before

    volume.write("router: [unclosed\n")  # not even YAML
    await wait_until(lambda: caplog.text.count("does not load") >= 2, "the second error logged")
    assert workers(running) == before

    volume.write(document([("w3", "10.2.0.4:8000")]))  # fixed: applied
    await wait_until(lambda: workers(running) == {"w3": "10.2.0.4:8000"}, "the fixed file applied")


async def test_other_changes_are_reported_as_needing_a_restart(picker, caplog):
    running, volume = picker
    caplog.set_level(logging.INFO, logger="extproc.discovery")
    volume.write(document([("w0", "10.2.0.1:8000")], mode="round-robin"))
    await wait_until(lambda: set(workers(running)) == {"w0"}, "workers applied")
    assert "only `workers:` is applied without a restart" in caplog.text
    assert running.picker.config.router.mode == "kv"
