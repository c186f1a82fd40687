"""A whole local stack on loopback: mock workers, the picker and Envoy, as child processes.

Used by the demo, the end-to-end tests and the benchmarks so they all start the product the
same way a user does (`python -m extproc ...` and the configs in `extproc/devstack/envoy/`). Every process is
stopped by its pid in `Stack.stop()`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from extproc.devstack.envoy_config import Variant, render_envoy_config
from extproc.devstack.procs import ManagedProcess, free_port, start_envoy, wait_for_port, wait_http_ok

MODEL = "demo-model"


@dataclass
class WorkerProcess:
    worker_id: str
    endpoint: str
    process: ManagedProcess
    kv_events: str | None = None  # ZMQ PUB endpoint of its KV events (tcp://127.0.0.1:port)
    kv_replay: str | None = None  # ZMQ replay endpoint

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"


@dataclass
class Stack:
    """Running processes and where to reach them."""

    log_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    picker: ManagedProcess | None = None
    picker_port: int = 0
    health_port: int = 0
    envoy: ManagedProcess | None = None
    listen_port: int = 0
    admin_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def stop(self) -> None:
        for process in [self.envoy, self.picker, *(w.process for w in self.workers)]:
            if process is not None:
                process.stop(grace_s=3.0)


def start_workers(
    count: int,
    log_dir: Path,
    *,
    speedup: float = 1.0,
    block_size: int = 16,
    kv_events: bool = True,
    extra_args: Sequence[str] = (),
    id_prefix: str = "w",
) -> list[WorkerProcess]:
    """Start `count` mock workers on free loopback ports and wait until /health answers.

    With `kv_events` each publishes its KV events over ZMQ (vLLM's format) on free ports too.
    """
    workers = []
    try:
        for i in range(count):
            port, wid = free_port(), f"{id_prefix}{i}"
            argv = [
                sys.executable, "-m", "extproc", "mock-worker", "--port", str(port), "--worker-id", wid,
                "--model", MODEL, "--block-size", str(block_size), "--speedup", str(speedup),
            ]  # fmt: skip
            events = replay = None
            if kv_events:
                events_port, replay_port = free_port(), free_port()
                argv += ["--kv-events", "zmq", "--kv-events-port", str(events_port)]
                argv += ["--kv-replay-port", str(replay_port)]
                events, replay = f"tcp://127.0.0.1:{events_port}", f"tcp://127.0.0.1:{replay_port}"
            else:
                argv += ["--kv-events", "off"]
            process = ManagedProcess([*argv, *extra_args], log_path=log_dir / f"worker-{wid}.log").start()
            workers.append(WorkerProcess(wid, f"127.0.0.1:{port}", process, events, replay))
        for w in workers:
            wait_http_ok(f"{w.url}/health", 30.0, process=w.process)
    except BaseException:
        for w in workers:
            w.process.stop(grace_s=1.0)
        raise
    return workers


def write_picker_config(workers: Sequence[WorkerProcess], path: Path) -> Path:
    entries = []
    for w in workers:
        entry = {"id": w.worker_id, "endpoint": w.endpoint, "model": MODEL}
        if w.kv_events:
            entry["kv-events"] = w.kv_events
        if w.kv_replay:
            entry["kv-replay"] = w.kv_replay
        entries.append(entry)
    path.write_text(yaml.safe_dump({"workers": entries}))
    return path


def start_picker(
    workers: Sequence[WorkerProcess], log_dir: Path, *, args: Sequence[str] = (), name: str = "picker"
) -> tuple[ManagedProcess, int, int]:
    """Start `python -m extproc serve` for `workers`; returns (process, ext_proc port, health port)."""
    config = write_picker_config(workers, log_dir / f"{name}.yaml")
    port, health_port = free_port(), free_port()
    argv = [
        sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", str(port),
        "--health-port", str(health_port), *args,
    ]  # fmt: skip
    process = ManagedProcess(argv, log_path=log_dir / f"{name}.log").start()
    try:
        wait_for_port("127.0.0.1", port, 30.0, process=process)
    except BaseException:
        process.stop(grace_s=1.0)
        raise
    return process, port, health_port


def start_stack(
    log_dir: Path,
    *,
    workers: int = 4,
    variant: Variant = "buffered",
    picker_args: Sequence[str] = (),
    worker_args: Sequence[str] = (),
    speedup: float = 1.0,
    block_size: int = 16,
    kv_events: bool = True,
    with_picker: bool = True,
) -> Stack:
    """Mock workers (publishing KV events over ZMQ unless `kv_events` is False), the picker
    (unless `with_picker` is False) and Envoy, all on 127.0.0.1."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(log_dir)
    try:
        stack.workers = start_workers(
            workers,
            log_dir,
            speedup=speedup,
            block_size=block_size,
            kv_events=kv_events,
            extra_args=worker_args,
        )
        if with_picker:
            args = ["--kv-cache-block-size", str(block_size), *picker_args]
            stack.picker, stack.picker_port, stack.health_port = start_picker(
                stack.workers, log_dir, args=args
            )
        else:
            stack.picker_port = free_port()  # nothing listens there: the picker is "down"
        stack.listen_port, stack.admin_port = free_port(), free_port()
        config = render_envoy_config(
            variant,
            listen_port=stack.listen_port,
            admin_port=stack.admin_port,
            picker_address=f"127.0.0.1:{stack.picker_port}",
            workers=[w.endpoint for w in stack.workers],
        )
        stack.envoy = start_envoy(config, log_path=log_dir / "envoy.log", admin_port=stack.admin_port)
    except BaseException:
        stack.stop()
        raise
    return stack
