"""Dynamo's standalone KV indexer as a child process, for tests and benchmarks (`--kv-indexer-url`).

`python -m dynamo.indexer` comes with ai-dynamo-runtime 1.6.1 (the `compat` extra; Linux only). It
takes no address to bind: it listens on 0.0.0.0 at `--port`, so the port is one found free on
127.0.0.1 just before (best effort). Stopped by pid like every other child here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from extproc.devstack.procs import ManagedProcess, reserve_port, wait_http_ok


class DynamoIndexer:
    """One running `python -m dynamo.indexer`; `restart()` keeps its port (and loses its state)."""

    def __init__(self, log_path: Path, *, threads: int = 1) -> None:
        with reserve_port() as held:
            self.port = held.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = ManagedProcess(
            [sys.executable, "-m", "dynamo.indexer", "--port", str(self.port), "--threads", str(threads)],
            log_path=log_path,
        )

    def start(self, ready_timeout_s: float = 30.0) -> DynamoIndexer:
        self.process.start()
        wait_http_ok(f"{self.url}/workers", ready_timeout_s, process=self.process)
        return self

    def stop(self) -> None:
        self.process.stop()

    def restart(self, ready_timeout_s: float = 30.0) -> None:
        self.process.stop()
        self.process = ManagedProcess(self.process.argv, log_path=self.process.log_path)
        self.start(ready_timeout_s)


def start_dynamo_indexer(log_path: Path, *, threads: int = 1) -> DynamoIndexer:
    """A started indexer answering on 127.0.0.1 (raises if it does not within 30 s)."""
    return DynamoIndexer(log_path, threads=threads).start()
