"""Dynamo 1.6.1's own KvEventPublisher in a child process (`tests/nats/dynamo_worker.py`), for tests.

`DynamoWorker` starts it and sends one JSON command at a time; `dynamo` (in conftest) is the fixture
that starts one per test on the test's nats-server and stops it by pid; `primed` waits until the
picker hears it. ai-dynamo-runtime 1.6.1 (the `compat` extra) must be installed: missing, the tests
fail, they do not skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from extproc.events.sources import EventSources
from extproc.router.types import Worker

from .conftest import eventually

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_VERSION = "1.6.1"
BS = 16
ENDPOINT = "ns1.backend.generate"
PROBE_ID = 999  # a Dynamo worker id the picker does not know: its events only prime the path
CALL_TIMEOUT_S = 30.0


def require_dynamo() -> None:
    try:
        version = importlib.metadata.version("ai-dynamo-runtime")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(
            "ai-dynamo-runtime is not installed: these tests run Dynamo's own publisher. "
            "pip install -e '.[compat]' (make test installs it)"
        )
    if version != DYNAMO_VERSION:
        pytest.fail(
            f"ai-dynamo-runtime {version} is installed; these tests pin {DYNAMO_VERSION} (the compat extra)"
        )


class DynamoWorker:
    """The child process running Dynamo's publishers; one JSON command line, one answer line."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @classmethod
    async def start(cls, nats_url: str | None, log_path: Path, **env_vars: str) -> DynamoWorker:
        """`env_vars` go to its environment (DYNAMO_WORKER_DISCOVERY, DYN_FILE_KV, ...); without a
        NATS server, Dynamo's ZMQ event plane (DYNAMO_WORKER_EVENT_PLANE=zmq) on 127.0.0.1."""
        plane = {"NATS_SERVER": nats_url} if nats_url is not None else {"DYNAMO_WORKER_EVENT_PLANE": "zmq"}
        env = {
            **os.environ,
            **env_vars,
            **plane,
            "DYN_EVENT_PLANE_HOST": "127.0.0.1",  # a direct ZMQ publisher advertises loopback
            "DYN_TCP_RPC_HOST": "127.0.0.1",  # the request plane (local indexer queries) on loopback
            "DYN_SYSTEM_ENABLED": "false",
            "PYTHONPATH": str(ROOT),
        }
        with open(log_path, "wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.nats.dynamo_worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )
        return cls(process, log_path)

    async def call(self, op: str, **fields: Any) -> None:
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        await process.stdin.drain()
        line = await asyncio.wait_for(process.stdout.readline(), CALL_TIMEOUT_S)
        if not line:
            pytest.fail(f"the Dynamo worker ended (rc {process.returncode}); its log:\n{self.log_tail()}")
        answer = json.loads(line)
        assert answer["ok"], f"{op} {fields}: {answer.get('error')}\n{self.log_tail()}"

    async def publisher(self, name: str, worker_id: int, dp_rank: int = 0, **options: Any) -> None:
        await self.call(
            "publisher",
            name=name,
            endpoint=ENDPOINT,
            worker_id=worker_id,
            block_size=BS,
            dp_rank=dp_rank,
            **options,
        )

    async def stored(
        self, name: str, tokens: list[int], hashes: list[int], parent: int | None = None, **kw
    ) -> None:
        await self.call(
            "stored",
            name=name,
            token_ids=tokens,
            num_block_tokens=[BS] * len(hashes),
            block_hashes=hashes,
            parent_hash=parent,
            **kw,
        )

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    async def stop(self) -> None:
        """Ask it to exit; SIGTERM, then SIGKILL, its pid if it does not within the bound."""
        process = self.process
        with contextlib.suppress(Exception):
            if process.returncode is None:
                assert process.stdin is not None
                process.stdin.write(b'{"op": "exit"}\n')
                await process.stdin.drain()
                process.stdin.close()
        for sig, wait_s in ((None, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            if sig is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)
            try:
                await asyncio.wait_for(process.wait(), wait_s)
                return
            except TimeoutError:
                continue


async def primed(dynamo: DynamoWorker, sources: EventSources) -> None:
    """Until the picker hears Dynamo's publisher (nats-server may drop the first messages after a new
    subscription: see conftest.prime); the probe worker is unknown to the picker, its events ignored.
    Works for the core NATS subscriber and for the durable consumer (whose stream then holds them)."""
    transport = sources.nats_events or sources.durable
    assert transport is not None
    await dynamo.publisher("probe", PROBE_ID)
    probe = Worker(str(PROBE_ID))
    for _ in range(100):
        await dynamo.call("removed", name="probe", block_hashes=[0])
        with contextlib.suppress(pytest.fail.Exception):
            await eventually(lambda: transport.event_ids.knows(probe), 0.1)
            return
    pytest.fail("the picker never heard Dynamo's publisher")
