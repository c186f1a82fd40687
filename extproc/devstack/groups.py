"""A hierarchical stack on loopback: router groups (each a picker with its mock workers), a top-level
picker over them, and Envoy in front, all child processes.

Used by `examples/hierarchical/`, the end-to-end tests and `benchmarks/bench_groups.py`, so they all
start the product the way a user does: each group is `python -m extproc serve --group-api-port N`
over its own workers (`extproc.stack.start_workers` / `start_picker`), the top-level picker is
`python -m extproc serve` with a `groups:` section, and Envoy runs the `buffered` template. Every
process is stopped by its pid; every one binds port 0 and reports its ports (`--ports-file`,
Envoy's admin API).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import ManagedProcess, start_envoy
from extproc.devstack.stack import MODEL, WorkerProcess, start_picker, start_workers


@dataclass
class GroupProcess:
    """One router group: its workers and the picker serving its routers on the group API."""

    name: str
    workers: list[WorkerProcess]
    picker: ManagedProcess
    api_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.api_port}"

    def worker_at(self, endpoint: str) -> WorkerProcess | None:
        return next((w for w in self.workers if w.endpoint == endpoint), None)

    def stop(self) -> None:
        for process in [self.picker, *(w.process for w in self.workers)]:
            process.stop(grace_s=3.0)


@dataclass
class Hierarchy:
    """Running groups, the top-level picker and Envoy, and where to reach them."""

    log_dir: Path
    groups: list[GroupProcess] = field(default_factory=list)
    top: ManagedProcess | None = None
    top_port: int = 0
    top_admin_port: int = 0
    envoy: ManagedProcess | None = None
    listen_port: int = 0
    admin_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.top_admin_port}/metrics"

    def group(self, name: str) -> GroupProcess:
        return next(g for g in self.groups if g.name == name)

    def group_of(self, endpoint: str) -> GroupProcess | None:
        return next((g for g in self.groups if g.worker_at(endpoint) is not None), None)

    def stop(self) -> None:
        for process in (self.envoy, self.top):
            if process is not None:
                process.stop(grace_s=3.0)
        for group in self.groups:
            group.stop()


def start_group(
    name: str,
    log_dir: Path,
    *,
    workers: int = 2,
    speedup: float = 10.0,
    block_size: int = 16,
    kv_events: bool = True,
    picker_args: Sequence[str] = (),
) -> GroupProcess:
    """Mock workers (logs in log_dir/<name>/) and a picker serving their routers on the group API
    (port 0: the port it reports)."""
    group_dir = log_dir / name
    group_dir.mkdir(parents=True, exist_ok=True)
    started = start_workers(workers, group_dir, speedup=speedup, block_size=block_size, kv_events=kv_events)
    args = ["--kv-cache-block-size", str(block_size), "--group-api-port", "0", *picker_args]
    if not kv_events:
        args.append("--no-router-kv-events")
    try:
        picker = start_picker(started, group_dir, args=args, name="picker")
    except BaseException:
        for w in started:
            w.process.stop(grace_s=1.0)
        raise
    return GroupProcess(name, started, picker, picker.ports()["group_api_port"])


def launch_group_picker(
    name: str,
    workers: Sequence[tuple[str, str]],
    log_dir: Path,
    *,
    api_port: int = 0,
    block_size: int = 16,
    args: Sequence[str] = (),
) -> ManagedProcess:
    """`serve --group-api-port` over (id, endpoint) workers that need not exist (routing decisions only:
    no KV events, nothing contacts them); returns at once, see `wait_until_serving`. `api_port` 0
    (the default) lets it bind a free port; give a `reserve_port()` one to restart it where it was."""
    config = log_dir / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump({"workers": [{"id": i, "endpoint": e, "model": MODEL} for i, e in workers]})
    )
    ports = log_dir / f"{name}.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", "0",
        "--health-port", "0", "--group-api-port", str(api_port), "--ports-file", str(ports),
        "--no-router-kv-events", "--kv-cache-block-size", str(block_size), "--log-level", "warning", *args,
    ]  # fmt: skip
    return ManagedProcess(argv, log_path=log_dir / f"{name}.log", ports_file=ports).start()


def wait_until_serving(process: ManagedProcess, timeout_s: float = 30.0) -> int:
    """Wait (bounded) until a `launch_group_picker` process serves and return its group API port;
    stops the process if it never does."""
    try:
        return process.ports(timeout_s)["group_api_port"]
    except BaseException:
        process.stop(grace_s=1.0)
        raise


def write_top_config(groups: Sequence[tuple[str, str]], path: Path) -> Path:
    """A top-level picker's config: the model and one remote group per (name, host:port)."""
    document = {
        "models": [{"name": MODEL}],
        "groups": [{"name": name, "address": address} for name, address in groups],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def start_top_picker(
    groups: Sequence[tuple[str, str]],
    log_dir: Path,
    *,
    probe_timeout_ms: float = 50.0,
    policy: str = "max-overlap",
    args: Sequence[str] = (),
) -> tuple[ManagedProcess, int, int]:
    """`python -m extproc serve` over remote groups; returns (process, ext_proc port, admin port),
    the ports it bound (port 0) and reported."""
    config = write_top_config(groups, log_dir / "top.yaml")
    ports_file = log_dir / "top.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", "0",
        "--health-port", "0", "--admin-port", "0", "--ports-file", str(ports_file),
        "--group-probe-timeout-ms", str(probe_timeout_ms), "--group-policy", policy, *args,
    ]  # fmt: skip
    process = ManagedProcess(argv, log_path=log_dir / "top.log", ports_file=ports_file).start()
    try:
        ports = process.ports()
    except BaseException:
        process.stop(grace_s=1.0)
        raise
    return process, ports["port"], ports["admin_port"]


def start_hierarchy(
    log_dir: Path,
    *,
    groups: Sequence[str] = ("east", "west"),
    workers_per_group: int = 2,
    speedup: float = 10.0,
    block_size: int = 16,
    kv_events: bool = True,
    probe_timeout_ms: float = 50.0,
    policy: str = "max-overlap",
    top_args: Sequence[str] = (),
    group_args: Sequence[str] = (),
) -> Hierarchy:
    """Groups (mock workers + a group picker each), the top-level picker and Envoy, on 127.0.0.1."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = Hierarchy(log_dir)
    try:
        for name in groups:
            stack.groups.append(
                start_group(
                    name,
                    log_dir,
                    workers=workers_per_group,
                    speedup=speedup,
                    block_size=block_size,
                    kv_events=kv_events,
                    picker_args=group_args,
                )
            )
        stack.top, stack.top_port, stack.top_admin_port = start_top_picker(
            [(g.name, g.address) for g in stack.groups],
            log_dir,
            probe_timeout_ms=probe_timeout_ms,
            policy=policy,
            args=["--kv-cache-block-size", str(block_size), *top_args],
        )
        config = render_envoy_config(
            "buffered",
            picker_address=f"127.0.0.1:{stack.top_port}",
            workers=[w.endpoint for g in stack.groups for w in g.workers],
        )
        envoy = start_envoy(config, log_path=log_dir / "envoy.log")
        stack.envoy, stack.listen_port, stack.admin_port = envoy, envoy.listen_port, envoy.admin_port
    except BaseException:
        stack.stop()
        raise
    return stack
