"""The soak test's processes: nats-server, mock workers, the picker and Envoy (fail-open), and the
faults done to them. Everything on 127.0.0.1, started as child processes and stopped by pid.

Workers w0 and w1 publish KV events over ZMQ (with a replay socket), the others over NATS core.
The picker runs as `python -m extproc serve` with its admin port (/debug/workers, /metrics,
/readyz) and the limits below; Envoy renders the `failopen` template. The blocking methods here are
called from the soak's event loop through `asyncio.to_thread`.

Ports: nats-server, the workers and the picker are killed and restarted on their ports (their
clients, the picker's config and Envoy's clusters name them), so those ports are reserved for the
whole run (`reserve_port`: held by this process, bindable by our children only, never handed to
anyone else by the kernel) and nobody can take one while its process is down. Envoy, never
restarted, binds port 0 and reports its ports through its admin API. One more reserved port never
listens: the destination the hostile requests name in the headers the picker owns (a request sent
there would fail, so a 200 shows the header did not route it).

A SIGTERMed picker releases its ports at once and drains meanwhile (extproc/runtime/server.py): its
replacement is started as soon as those ports are free, while the old process may still drain, and
the old one is reaped afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import (
    ManagedProcess,
    NatsServer,
    PortReservation,
    http_status,
    port_is_open,
    reserve_port,
    start_envoy,
    start_nats_server,
    wait_for_port,
    wait_http_ok,
)
from extproc.devstack.stack import MODEL

BLOCK_SIZE = 16
NAMESPACE = "soak"
MAX_BODY_BYTES = 4 * 1024 * 1024  # the picker's --max-body-bytes: several-MiB bodies are parsed
MAX_PROMPT_TOKENS = 2048  # the picker's --max-prompt-tokens
ENVOY_MAX_BODY_BYTES = 6 * 1024 * 1024  # Envoy's request_body_buffer_limit
SESSION_MAX_PINS = 100  # the picker's --session-max-pins: the full soak's sessions overflow it
WORKER_MAX_BODY_BYTES = 1024 * 1024  # the mock workers' own limit (aiohttp's client_max_size): 413 above
WORKER_MAX_MODEL_LEN = 2304  # the workers' own limit: prompt + output tokens
WORKER_GPU_BLOCKS = 4096
SHUTDOWN_GRACE_S = 5.0  # the picker's --shutdown-grace-secs
ZMQ_WORKERS = 2  # w0..w{n-1} publish over ZMQ, the rest over NATS


@dataclass
class WorkerSpec:
    worker_id: str
    port: int
    argv: list[str]
    transport: str  # zmq or nats
    process: ManagedProcess | None = None
    starts: int = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class ProcessSample:
    rss_kib: int
    fds: int
    at_s: float
    children: int = 0  # the picker's child processes (body parse workers)
    children_rss_kib: int = 0


@dataclass
class PickerLife:
    pid: int
    started_at_request: int  # requests done when this process started
    warm: ProcessSample | None = None
    end: ProcessSample | None = None
    exit_code: int | None = None
    drain_log: str | None = None
    crashed: bool = False  # ended by SIGKILL (a crash), not SIGTERM


def sample_process(pid: int, t0: float) -> ProcessSample:
    """RSS (VmRSS, KiB) and open file descriptors of `pid`, from /proc, and its children's RSS."""
    children = [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]  # fmt: skip
    child_rss = 0
    for child in children:
        with contextlib.suppress(OSError):
            child_rss += _rss_kib(child)
    return ProcessSample(
        _rss_kib(pid),
        len(os.listdir(f"/proc/{pid}/fd")),
        round(time.monotonic() - t0, 2),
        len(children),
        child_rss,
    )


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


class SoakStack:
    """The processes of one soak run, their ports, and the faults applied to them."""

    def __init__(self, log_dir: Path, workers: int, speedup: float, seed: int) -> None:
        self.log_dir = log_dir
        self.seed = seed
        self.reserved: list[PortReservation] = []  # released by stop(), after every process
        self.nats: NatsServer | None = None
        self.nats_port = self._reserve()
        self.nats_starts = 0
        self.workers = [self._worker_spec(i, speedup) for i in range(workers)]
        self.picker: ManagedProcess | None = None
        self.picker_port, self.health_port, self.picker_admin = (
            self._reserve(),
            self._reserve(),
            self._reserve(),
        )
        self.picker_starts = 0
        self.dead_port = self._reserve()  # never listens: where hostile owned headers point
        self.pokes = 0  # requests sent straight to workers by recovery checks
        self.envoy: ManagedProcess | None = None
        self.listen_port = self.envoy_admin = 0  # Envoy's own choice, known once it runs

    def _reserve(self) -> int:
        """A loopback port held until stop(): the processes restarted on it can always bind it again."""
        self.reserved.append(reserve_port())
        return self.reserved[-1].port

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.picker_admin}"

    def _worker_spec(self, i: int, speedup: float) -> WorkerSpec:
        wid, port = f"w{i}", self._reserve()
        argv = [
            sys.executable, "-m", "extproc", "mock-worker", "--port", str(port), "--worker-id", wid,
            "--model", MODEL, "--block-size", str(BLOCK_SIZE), "--speedup", str(speedup),
            "--num-gpu-blocks", str(WORKER_GPU_BLOCKS), "--max-model-len", str(WORKER_MAX_MODEL_LEN),
        ]  # fmt: skip
        if i < ZMQ_WORKERS:
            argv += ["--kv-events", "zmq", "--kv-events-port", str(self._reserve())]
            argv += ["--kv-replay-port", str(self._reserve())]
            return WorkerSpec(wid, port, argv, "zmq")
        argv += ["--kv-events", "nats", "--nats-url", self.nats_url, "--instance-id", str(i)]
        argv += ["--namespace", NAMESPACE]
        return WorkerSpec(wid, port, argv, "nats")

    def start(self) -> None:
        self.start_nats()
        for spec in self.workers:
            self._spawn_worker(spec)
        for spec in self.workers:
            assert spec.process is not None
            wait_http_ok(f"http://{spec.endpoint}/health", 30.0, process=spec.process)
        self.start_picker()
        config = render_envoy_config(
            "failopen",
            picker_address=f"127.0.0.1:{self.picker_port}",
            workers=[w.endpoint for w in self.workers],
            max_body_bytes=ENVOY_MAX_BODY_BYTES,
        )
        envoy = start_envoy(config, log_path=self.log_dir / "envoy.log")
        self.envoy, self.listen_port, self.envoy_admin = envoy, envoy.listen_port, envoy.admin_port

    def stop(self) -> None:
        for process in [self.envoy, self.picker, *(w.process for w in self.workers), self.nats]:
            if process is not None:
                process.stop(grace_s=SHUTDOWN_GRACE_S + 2.0)
        for reservation in self.reserved:
            reservation.release()

    def start_nats(self) -> None:
        self.nats_starts += 1
        self.nats = start_nats_server(
            self.nats_port,
            jetstream=False,
            store_dir=self.log_dir / "nats",
            log_path=self.log_dir / f"nats-{self.nats_starts}.log",
        )

    def _spawn_worker(self, spec: WorkerSpec) -> None:
        spec.starts += 1
        log_path = self.log_dir / f"worker-{spec.worker_id}-{spec.starts}.log"
        spec.process = ManagedProcess(spec.argv, log_path=log_path).start()

    def worker(self, worker_id: str) -> WorkerSpec:
        for spec in self.workers:
            if spec.worker_id == worker_id:
                return spec
        raise ValueError(f"no worker {worker_id!r}; workers: {', '.join(w.worker_id for w in self.workers)}")

    def picker_config(self) -> Path:
        entries = []
        for spec in self.workers:
            entry: dict[str, Any] = {
                "id": spec.worker_id,
                "endpoint": spec.endpoint,
                "model": MODEL,
                "total_blocks": WORKER_GPU_BLOCKS,
            }
            if spec.transport == "zmq":
                entry["kv-events"] = "tcp://127.0.0.1:" + spec.argv[spec.argv.index("--kv-events-port") + 1]
                entry["kv-replay"] = "tcp://127.0.0.1:" + spec.argv[spec.argv.index("--kv-replay-port") + 1]
            else:
                entry["instance_id"] = int(spec.argv[spec.argv.index("--instance-id") + 1])
            entries.append(entry)
        path = self.log_dir / "picker.yaml"
        path.write_text(yaml.safe_dump({"workers": entries}))
        return path

    def start_picker(self) -> None:
        self.picker_starts += 1
        argv = [
            sys.executable, "-m", "extproc", "serve", "--config", str(self.picker_config()),
            "--port", str(self.picker_port), "--health-port", str(self.health_port),
            "--admin-port", str(self.picker_admin), "--kv-cache-block-size", str(BLOCK_SIZE),
            "--nats-url", self.nats_url, "--namespace", NAMESPACE,
            "--max-body-bytes", str(MAX_BODY_BYTES), "--max-prompt-tokens", str(MAX_PROMPT_TOKENS),
            "--session-max-pins", str(SESSION_MAX_PINS),
            "--shutdown-grace-secs", str(SHUTDOWN_GRACE_S), "--seed", str(self.seed),
        ]  # fmt: skip
        log_path = self.log_dir / f"picker-{self.picker_starts}.log"
        self.picker = ManagedProcess(argv, log_path=log_path).start()
        wait_for_port("127.0.0.1", self.picker_port, 30.0, process=self.picker)
        wait_http_ok(f"{self.admin_url}/healthz", 30.0, process=self.picker)

    # faults (blocking: run them in a thread)

    def kill_worker(self, worker_id: str) -> None:
        spec = self.worker(worker_id)
        assert spec.process is not None
        os.kill(spec.process.pid, signal.SIGKILL)
        spec.process.stop(grace_s=5.0)  # reaps it

    def restart_worker(self, worker_id: str) -> None:
        spec = self.worker(worker_id)
        self._spawn_worker(spec)
        assert spec.process is not None
        wait_http_ok(f"http://{spec.endpoint}/health", 30.0, process=spec.process)

    def kill_nats(self) -> None:
        assert self.nats is not None
        os.kill(self.nats.pid, signal.SIGKILL)
        self.nats.stop(grace_s=5.0)

    def terminate_picker(self) -> ManagedProcess:
        """SIGTERM the picker and wait (bounded) until its ports are free; it may still be draining.
        Returns the old process, for `reap_picker` once its replacement runs."""
        old = self.picker
        assert old is not None
        os.kill(old.pid, signal.SIGTERM)
        ports = (self.picker_port, self.health_port, self.picker_admin)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S + 10.0
        while any(port_is_open("127.0.0.1", port) for port in ports):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stopping picker still listens on one of {ports}")
            time.sleep(0.02)  # polling the ports, bounded by the deadline
        return old

    def reap_picker(self, old: ManagedProcess) -> tuple[int | None, str | None]:
        """Wait for a terminated picker to exit; (exit code, its drain log line). Polled: another
        signal would cut its drain short."""
        deadline = time.monotonic() + SHUTDOWN_GRACE_S + 10.0
        while old.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the process, bounded by the deadline
        code = old.stop(grace_s=5.0)  # reaps it (kills it only if it outlived the deadline)
        drained = [line for line in old.log_tail(20_000).splitlines() if "stopped in" in line]
        return code, (drained[-1].partition("extproc.server: ")[2] if drained else None)

    def crash_picker(self) -> tuple[int | None, None]:
        """SIGKILL the picker (a crash: no drain) and reap it; (exit code, None)."""
        assert self.picker is not None
        os.kill(self.picker.pid, signal.SIGKILL)
        return self.picker.stop(grace_s=5.0), None

    def poke(self, worker_ids: Sequence[str]) -> None:
        """One small request with a fresh prompt straight to each worker (new blocks: KV events)."""
        for wid in worker_ids:
            self.pokes += 1
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"poke {self.pokes} " * 8}],
                "max_tokens": 1,
            }
            request = urllib.request.Request(
                f"http://{self.worker(wid).endpoint}/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
            )
            with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=2.0) as response:
                response.read()

    def debug_workers(self) -> dict[str, Any] | None:
        status, text = http_status(f"{self.admin_url}/debug/workers", timeout_s=2.0)
        return json.loads(text) if status == 200 else None

    def event_counters(self) -> dict[str, int]:
        """The picker's KV event counters (feed.reset, nats.reconnect, zmq.reconnect, ...)."""
        state = self.debug_workers()
        return state["kv_event_counters"] if state is not None else {}

    def picker_metric(self, name: str) -> dict[str, float]:
        """Samples of one metric on the picker's /metrics, keyed by their label text."""
        status, text = http_status(f"{self.admin_url}/metrics", timeout_s=2.0)
        if status != 200:
            return {}
        return _samples(text, name)

    def worker_gauges(self) -> dict[str, float]:
        """Each worker's running + waiting requests (vLLM gauges on its /metrics)."""
        out = {}
        for spec in self.workers:
            status, text = http_status(f"http://{spec.endpoint}/metrics", timeout_s=2.0)
            if status != 200:
                out[spec.worker_id] = float("nan")
                continue
            running = sum(_samples(text, "vllm:num_requests_running").values())
            waiting = sum(_samples(text, "vllm:num_requests_waiting").values())
            out[spec.worker_id] = running + waiting
        return out


def _samples(exposition: str, name: str) -> dict[str, float]:
    out = {}
    for line in exposition.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out
