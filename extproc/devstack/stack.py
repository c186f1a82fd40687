"""A whole local stack on loopback: mock workers, the picker and Envoy, as child processes.

Used by the demo, the end-to-end tests and the benchmarks so they all start the product the
same way a user does (`python -m extproc ...` and the configs in `extproc/devstack/envoy/`). Every process is
stopped by its pid in `Stack.stop()`. Every process binds port 0 and reports the port it got
(`--ports-file`, Envoy's admin API): no port is chosen before its process binds it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from extproc.devstack.envoy_config import DEFAULT_PICKER_HEALTH_PORT, Variant, render_envoy_config
from extproc.devstack.procs import ManagedProcess, PortReservation, reserve_port, start_envoy, wait_http_ok

MODEL = "demo-model"


@dataclass
class WorkerProcess:
    worker_id: str
    endpoint: str
    process: ManagedProcess
    kv_events: str | None = None  # ZMQ PUB endpoint of its KV events (tcp://127.0.0.1:port)
    kv_replay: str | None = None  # ZMQ replay endpoint
    held: list[PortReservation] = field(default_factory=list)  # start_workers(hold_ports=True)

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def release_ports(self) -> None:
        """Let go of the ports held for restarts (after its last stop)."""
        for reservation in self.held:
            reservation.release()
        self.held.clear()


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
    reserved: list[PortReservation] = field(default_factory=list)  # held until stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def stop(self) -> None:
        for process in [self.envoy, self.picker, *(w.process for w in self.workers)]:
            if process is not None:
                process.stop(grace_s=3.0)
        for reservation in self.reserved:
            reservation.release()
        for w in self.workers:
            w.release_ports()


def start_workers(
    count: int,
    log_dir: Path,
    *,
    speedup: float = 1.0,
    block_size: int = 16,
    kv_events: bool = True,
    extra_args: Sequence[str] = (),
    id_prefix: str = "w",
    hold_ports: bool = False,
) -> list[WorkerProcess]:
    """Start `count` mock workers on loopback and wait until /health answers.

    Each binds port 0 and reports its port (`--ports-file`); with `kv_events` each publishes its
    KV events over ZMQ (vLLM's format) on ports it reports the same way. With `hold_ports`, the
    ports are reserved here first (`reserve_port`) and passed explicitly instead, so a worker
    restarted with the same argv gets them back (nobody else can take them meanwhile); release
    them with `WorkerProcess.release_ports()` after its last stop (`Stack.stop()` does).
    """
    processes: list[tuple[str, ManagedProcess, list[PortReservation]]] = []
    try:
        for i in range(count):
            wid = f"{id_prefix}{i}"
            held = [reserve_port() for _ in range(3)] if hold_ports else []  # HTTP, PUB, replay
            port, events_port, replay_port = (str(r.port) for r in held) if held else ("0", "0", "0")
            ports = log_dir / f"worker-{wid}.ports.json"
            argv = [
                sys.executable, "-m", "extproc", "mock-worker", "--port", port, "--worker-id", wid,
                "--model", MODEL, "--block-size", str(block_size), "--speedup", str(speedup),
                "--ports-file", str(ports),
            ]  # fmt: skip
            if kv_events:
                argv += [
                    "--kv-events",
                    "zmq",
                    "--kv-events-port",
                    events_port,
                    "--kv-replay-port",
                    replay_port,
                ]
            else:
                argv += ["--kv-events", "off"]
            process = ManagedProcess(
                [*argv, *extra_args], log_path=log_dir / f"worker-{wid}.log", ports_file=ports
            )
            processes.append((wid, process.start(), held))
        workers = []
        for wid, process, held in processes:
            bound = process.ports()
            events = replay = None
            if kv_events:
                events = f"tcp://127.0.0.1:{bound['kv_events_port']}"
                replay = f"tcp://127.0.0.1:{bound['kv_replay_port']}"
            worker = WorkerProcess(wid, f"127.0.0.1:{bound['port']}", process, events, replay, held)
            workers.append(worker)
            wait_http_ok(f"{worker.url}/health", 30.0, process=process)
    except BaseException:
        for _, process, held in processes:
            process.stop(grace_s=1.0)
            for reservation in held:
                reservation.release()
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
) -> ManagedProcess:
    """Start `python -m extproc serve` for `workers` and return once it listens.

    It binds port 0 and reports its ports (`--ports-file`): `.ports()` has port (ext_proc) and
    health_port, and admin_port / group_api_port when `args` turn those on (with port 0).
    """
    config = write_picker_config(workers, log_dir / f"{name}.yaml")
    ports = log_dir / f"{name}.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", "0",
        "--health-port", "0", "--ports-file", str(ports), *args,
    ]  # fmt: skip
    process = ManagedProcess(argv, log_path=log_dir / f"{name}.log", ports_file=ports).start()
    try:
        process.ports()
    except BaseException:
        process.stop(grace_s=1.0)
        raise
    return process


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
            stack.picker = start_picker(stack.workers, log_dir, args=args)
            ports = stack.picker.ports()
            stack.picker_port, stack.health_port = ports["port"], ports["health_port"]
        else:  # held, nothing listens there: the picker is "down" (connections refused)
            stack.reserved.append(reserve_port())
            stack.picker_port = stack.reserved[-1].port
        config = render_envoy_config(
            variant,
            picker_address=f"127.0.0.1:{stack.picker_port}",
            picker_health_port=stack.health_port or DEFAULT_PICKER_HEALTH_PORT,
            workers=[w.endpoint for w in stack.workers],
        )
        envoy = start_envoy(config, log_path=log_dir / "envoy.log")
        stack.envoy, stack.listen_port, stack.admin_port = envoy, envoy.listen_port, envoy.admin_port
    except BaseException:
        stack.stop()
        raise
    return stack
