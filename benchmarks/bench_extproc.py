"""What the picker adds to a request through Envoy, against Envoy alone and the no-op picker.

    .venv/bin/python benchmarks/bench_extproc.py            # full run, about 3-4 minutes
    .venv/bin/python benchmarks/bench_extproc.py --quick    # about 40 s
    .venv/bin/python benchmarks/bench_extproc.py --quick --py-spy .venv/bin/py-spy   # + profile (bench extra)

Prints ONE JSON object on stdout; progress goes to stderr, child logs to --log-dir.

Everything runs on 127.0.0.1 as child processes stopped by pid (`ManagedProcess.stop`); Envoy runs
with `--concurrency 1`. Setups, each started, measured and stopped before the next one so that they do
not compete for the cores (rounds interleave them to spread drift over all setups):

- `direct`: Envoy without ext_proc. Derived from the rendered `buffered.yaml` template by removing the
  ext_proc filter and the `endpoint_picker` cluster and turning `picked_endpoint` into a STATIC
  ROUND_ROBIN cluster over the same echo workers. The listener, HCM settings and the header_mutation
  filter stay identical, so the only difference left is the picker.
- `noop/<mode>`: Envoy (`extproc/devstack/envoy/<mode>.yaml`) + `benchmarks/noop_picker.py` as a child process
  (round robin, no parsing): the floor of any Python ext_proc picker (REFERENCE section 2).
- `picker/<mode>`: Envoy + `python -m extproc serve --no-router-kv-events --log-level warning`
  (`--ext-proc-server h2`, serve's default, or `grpcio` with this script's `--ext-proc-server`).

`<mode>` is `buffered` (request body BUFFERED) or `duplex` (FULL_DUPLEX_STREAMED); both configs send the
response headers and stream the response body to the picker. Upstreams are 4 echo workers
(`tests/e2e/harness.py`, one process each) answering a small JSON at once. Chat bodies carry 1,000 or
8,000 ASCII characters of content (the default tokenizer is byte-level: about 1k and 8k tokens, see
`config.bodies`); 8 distinct bodies per size are cycled. The client is a raw keep-alive HTTP/1.1 client
in this process (blocking socket when sequential, asyncio protocol for 16 concurrent connections), the
same for every setup.

Sections of the JSON:
1. `latency`: p50/p90/p99 per setup, sequential and 16 concurrent, `added_*` against direct, the ratio
   (picker added p50) / (noop added p50) pooled and per round, throughput at 16 concurrent, and
   `cpu_us_per_request` of Envoy, the picker process (all threads, /proc schedstat, and its body parse
   workers: bodies over 16 KiB, 8k-token ones here, are parsed there) and this client.
2. `picker_split_us`: `EndpointPicker.pick` called in-process on the same bodies (`Pick.timings_ns`:
   parse, tokenize, hash, route), plus whole ext_proc streams through `ExtProcService.Process` and
   `NoopPicker.Process` in-process (no gRPC), which isolates the Python cost of each servicer.
3. `itl`: a mock worker (`--speedup 1`) streams 64 tokens; client-side gaps between SSE events through
   Envoy direct and through Envoy + picker (buffered, response body STREAMED: one picker round trip
   per chunk). A constant per-chunk delay cancels out of the gaps; it shows in `ttft_p50_added_ms`.
4. `targets`: picker added p50 <= 1.3 x noop added p50 (1k body, sequential, per body mode), picker
   CPU per request at 16 concurrent <= 1.3 x the no-op's at 1k and 1.6 x at 8k (per body mode), and
   picker ITL p50 - direct ITL p50 < 0.2 ms.
With `--py-spy PATH`, `profile` holds py-spy's on-CPU samples (--nonblocking) of the no-op and the real
picker process (buffered, 1k bodies, sequential and 16 concurrent clients): shares of self time, of a
few picker functions (inclusive), of grpc's other threads, and the picker's CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import itertools
import json
import math
import os
import platform
import random
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
for _path in (REPO_ROOT, BENCH_DIR):  # benchmark this checkout; noop_picker.py lives next to this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402

from extproc.config import ModelConfig, PickerConfig, WorkerConfig  # noqa: E402
from extproc.devstack.envoy_config import render_envoy_config  # noqa: E402
from extproc.devstack.procs import ManagedProcess, find_envoy, start_envoy  # noqa: E402
from extproc.devstack.stack import MODEL, WorkerProcess, start_picker, start_workers  # noqa: E402
from extproc.epp.service import ExtProcService  # noqa: E402
from extproc.picker.pipeline import EndpointPicker  # noqa: E402
from extproc.request.tokenizer import ByteTokenizer  # noqa: E402
from extproc.router import RouterConfig  # noqa: E402
from tests.e2e.harness import NOOP_PICKER_PATH, start_echo_worker_process, start_reporting  # noqa: E402

CHAT_PATH = "/v1/chat/completions"
BODY_SIZES = {"1k": 1_000, "8k": 8_000}  # characters of message content (ASCII: bytes = chars)
DISTINCT_BODIES = 8
MODES = ("buffered", "duplex")
PICKER_ARGS = ("--no-router-kv-events", "--log-level", "warning")
BLOCK_SIZE = 16
REQUEST_TIMEOUT_S = 10.0
TARGET_RATIO = 1.3  # picker added p50 <= 1.3 x noop added p50 (1k body, sequential)
TARGET_ITL_MS = 0.2  # lifecycle tracking adds < 0.2 ms to the median inter-token latency
CPU_TARGET_RATIOS = {"1k": 1.3, "8k": 1.6}  # picker CPU per request at 16 concurrent <= x noop (issue 21)
_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


# --- bodies ----------------------------------------------------------------------------------------


def chat_body(content: str, **extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}).encode()


def make_contents(chars: int, count: int, seed: int) -> list[str]:
    """`count` distinct ASCII texts of exactly `chars` characters (words of random letters)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words: list[str] = []
        size = 0
        while size < chars:
            word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
            words.append(word)
            size += len(word) + 1
        texts.append(" ".join(words)[:chars])
    return texts


def make_bodies(seed: int = 7) -> dict[str, list[bytes]]:
    return {
        name: [chat_body(text, max_tokens=1) for text in make_contents(chars, DISTINCT_BODIES, seed + i)]
        for i, (name, chars) in enumerate(BODY_SIZES.items())
    }


def body_facts(bodies: dict[str, list[bytes]]) -> dict[str, Any]:
    tokenizer = ByteTokenizer()
    facts = {}
    for name, items in bodies.items():
        messages = json.loads(items[0])["messages"]
        facts[name] = {
            "content_chars": BODY_SIZES[name],
            "body_bytes": len(items[0]),
            "prompt_tokens": len(tokenizer.encode_chat(messages)),
            "distinct_bodies": len(items),
        }
    return facts


def http_request(port: int, body: bytes, path: str = CHAT_PATH) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- a minimal HTTP/1.1 client ---------------------------------------------------------------------

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS, _DONE = range(7)


class ResponseReader:
    """Incremental HTTP/1.1 response parser (Content-Length or chunked), one response per instance.

    With `sse`, records the arrival time (ns) of every server-sent event ("\\n\\n"-terminated) in the
    de-chunked body: events arriving in the same read share its timestamp.
    """

    __slots__ = ("_buf", "_last", "_remaining", "_state", "close", "event_ns", "sse", "status")

    def __init__(self, *, sse: bool = False) -> None:
        self._buf = bytearray()
        self._state = _HEAD
        self._remaining = 0
        self._last = b""
        self.status = 0
        self.close = False
        self.sse = sse
        self.event_ns: list[int] = []

    def feed(self, data: bytes, now_ns: int) -> bool:
        """Consume `data`; True once the response is complete."""
        buf = self._buf
        buf += data
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return False
                self._parse_head(bytes(buf[:end]))
                del buf[: end + 4]
            elif state == _LENGTH:
                take = min(self._remaining, len(buf))
                self._body(buf[:take], now_ns)
                del buf[:take]
                self._remaining -= take
                if self._remaining:
                    return False
                self._state = _DONE
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
                del buf[: end + 2]
                self._remaining = size
                self._state = _CHUNK_DATA if size else _TRAILERS
            elif state == _CHUNK_DATA:
                take = min(self._remaining, len(buf))
                self._body(buf[:take], now_ns)
                del buf[:take]
                self._remaining -= take
                if self._remaining:
                    return False
                self._state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:
                if len(buf) < 2:
                    return False
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                if buf[:2] == b"\r\n":
                    del buf[:2]
                    self._state = _DONE
                    continue
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return False
                del buf[: end + 4]
                self._state = _DONE
            else:
                return True

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split(b" ", 2)[1])
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                self.close = b"close" in value.lower()
        if chunked:
            self._state = _CHUNK_SIZE
        else:
            self._remaining = length
            self._state = _LENGTH if length else _DONE

    def _body(self, data: bytes | bytearray, now_ns: int) -> None:
        if self.sse and data:
            chunk = self._last + bytes(data)
            self.event_ns.extend([now_ns] * chunk.count(b"\n\n"))
            self._last = chunk[-1:]


class BlockingClient:
    """One keep-alive connection, one request at a time (the sequential client: least overhead)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=REQUEST_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        return sock

    def send(self, request: bytes, reader: ResponseReader) -> tuple[int, int]:
        """(start ns, end ns) of one request; `reader` holds the status (0 on a broken connection)."""
        sock = self.sock or self._connect()
        t0 = time.perf_counter_ns()
        try:
            sock.sendall(request)
            while True:
                data = sock.recv(262144)
                if not data:
                    raise ConnectionError("connection closed by Envoy")
                if reader.feed(data, time.perf_counter_ns()):
                    break
        except OSError:
            self.close()
            reader.status = 0
            return t0, time.perf_counter_ns()
        t1 = time.perf_counter_ns()
        if reader.close:
            self.close()
        return t0, t1

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class _ClientProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader()
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.reader.feed(data, 0) and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))


# --- statistics ------------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """Percentile q of `values`: sorted[round_half_up(q * (n - 1))] (REFERENCE section 6 convention)."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1) + 0.5)] if ordered else math.nan


def r3(x: float) -> float:
    return round(x, 3) if math.isfinite(x) else x


def summary_ms(latencies_ns: Sequence[int], errors: int) -> dict[str, Any]:
    ms = [x / 1e6 for x in latencies_ns]
    return {
        "n": len(ms),
        "errors": errors,
        "p50_ms": r3(pct(ms, 0.5)),
        "p90_ms": r3(pct(ms, 0.9)),
        "p99_ms": r3(pct(ms, 0.99)),
        "mean_ms": r3(statistics.fmean(ms)) if ms else math.nan,
    }


# --- setups ----------------------------------------------------------------------------------------


@dataclass
class Setup:
    name: str  # direct | noop/<mode> | picker/<mode>
    kind: str  # direct | noop | picker
    mode: str | None  # buffered | duplex | None (direct)


@dataclass
class Running:
    listen_port: int = 0  # Envoy's, known once it runs (it binds port 0 and reports)
    processes: list[ManagedProcess] = field(default_factory=list)  # stopped in reverse order
    picker: ManagedProcess | None = None

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(grace_s=3.0)


def render_direct_config(workers: Sequence[str]) -> str:
    """The buffered template without ext_proc: STATIC round robin over `workers`, all else identical
    (port 0 listeners: Envoy binds free ports and `start_envoy` reads them back)."""
    text = render_envoy_config("buffered", picker_address="127.0.0.1:9", workers=workers)
    document = yaml.safe_load(text)
    resources = document["static_resources"]
    hcm = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]
    upstream = next(c for c in resources["clusters"] if c["name"] == "picked_endpoint")
    endpoints = []
    for worker in workers:
        host, port = worker.rsplit(":", 1)
        endpoints.append(
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": int(port)}}}}
        )
    resources["clusters"] = [
        {
            "name": "picked_endpoint",
            "type": "STATIC",
            "lb_policy": "ROUND_ROBIN",
            "connect_timeout": upstream["connect_timeout"],
            "circuit_breakers": upstream["circuit_breakers"],
            "load_assignment": {
                "cluster_name": "picked_endpoint",
                "endpoints": [{"lb_endpoints": endpoints}],
            },
        }
    ]
    return yaml.safe_dump(document, sort_keys=False)


def start_setup(setup: Setup, workers: Sequence[WorkerProcess], log_dir: Path) -> Running:
    """Start the picker (if any) and Envoy for `setup`; waits until Envoy is LIVE. Every process binds
    port 0 and reports the port it got."""
    endpoints = [w.endpoint for w in workers]
    tag = setup.name.replace("/", "-")
    log_dir.mkdir(parents=True, exist_ok=True)
    running = Running()
    try:
        if setup.kind == "direct":
            config = render_direct_config(endpoints)
        else:
            assert setup.mode is not None
            if setup.kind == "noop":
                argv = [
                    sys.executable,
                    str(NOOP_PICKER_PATH),
                    "--port",
                    "0",
                    "--workers",
                    ",".join(endpoints),
                ]
                picker = start_reporting(argv, log_dir / f"{tag}.log", 20.0)
            else:
                picker = start_picker(workers, log_dir, args=PICKER_ARGS, name=tag)
            running.processes.append(picker)
            running.picker = picker
            config = render_envoy_config(
                setup.mode,  # type: ignore[arg-type]
                picker_address=f"127.0.0.1:{picker.ports()['port']}",
                workers=endpoints,
            )
        envoy = start_envoy(config, log_path=log_dir / f"envoy-{tag}.log")
        running.processes.append(envoy)
        running.listen_port = envoy.listen_port
    except BaseException:
        running.stop()
        raise
    return running


# --- measurements ----------------------------------------------------------------------------------


def run_sequential(port: int, requests: Sequence[bytes], warmup: int, count: int) -> tuple[list[int], int]:
    """`warmup` then `count` requests one after another on one connection; (latencies ns, errors)."""
    client = BlockingClient(port)
    latencies: list[int] = []
    errors = 0
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(warmup + count):
            reader = ResponseReader()
            t0, t1 = client.send(requests[i % len(requests)], reader)
            if i < warmup:
                continue
            if reader.status == 200:
                latencies.append(t1 - t0)
            else:
                errors += 1
    finally:
        client.close()
        if gc_was_enabled:
            gc.enable()
    return latencies, errors


async def _concurrent(
    port: int, requests: Sequence[bytes], clients: int, warmup: int, count: int
) -> tuple[list[int], int, float]:
    loop = asyncio.get_running_loop()
    barrier = asyncio.Barrier(clients + 1)
    latencies: list[int] = []
    errors = 0
    finished_ns: list[int] = []

    async def one_client(index: int) -> None:
        nonlocal errors
        transport, proto = await loop.create_connection(_ClientProtocol, "127.0.0.1", port)
        try:
            for i in range(warmup + count):
                if i == warmup:
                    await barrier.wait()
                proto.reader = ResponseReader()
                proto.waiter = loop.create_future()
                t0 = time.perf_counter_ns()
                transport.write(requests[(index * 7 + i) % len(requests)])
                try:
                    await asyncio.wait_for(proto.waiter, REQUEST_TIMEOUT_S)
                except (ConnectionError, TimeoutError):
                    errors += 1
                    transport.close()
                    transport, proto = await loop.create_connection(_ClientProtocol, "127.0.0.1", port)
                    continue
                t1 = time.perf_counter_ns()
                if i >= warmup:
                    if proto.reader.status == 200:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1
                if proto.reader.close:
                    transport.close()
                    transport, proto = await loop.create_connection(_ClientProtocol, "127.0.0.1", port)
            finished_ns.append(time.perf_counter_ns())
        finally:
            transport.close()

    tasks = [asyncio.create_task(one_client(i)) for i in range(clients)]
    await barrier.wait()
    start_ns = time.perf_counter_ns()
    await asyncio.gather(*tasks)
    wall_s = (max(finished_ns) - start_ns) / 1e9 if finished_ns else math.nan
    return latencies, errors, wall_s


def run_concurrent(
    port: int, requests: Sequence[bytes], clients: int, warmup: int, count: int
) -> tuple[list[int], int, float]:
    """`clients` connections, each `warmup` then `count` requests back to back; (latencies, errors, s)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return asyncio.run(_concurrent(port, requests, clients, warmup, count))
    finally:
        if gc_was_enabled:
            gc.enable()


@dataclass
class Samples:
    latencies: list[int] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0
    per_round_p50_ms: list[float] = field(default_factory=list)
    cpu_ns: Counter[str] = field(default_factory=Counter)  # process -> on-CPU ns over the phases
    sent: int = 0  # requests sent in those phases (warm-up included)

    def add(self, latencies: list[int], errors: int, wall_s: float = 0.0) -> None:
        self.latencies += latencies
        self.errors += errors
        self.wall_s += wall_s
        self.per_round_p50_ms.append(r3(pct(latencies, 0.5) / 1e6))

    def cpu_us_per_request(self) -> dict[str, float]:
        return {name: round(ns / self.sent / 1e3, 1) for name, ns in self.cpu_ns.items()} if self.sent else {}


def process_cpu_ns(pid: int) -> int:
    """On-CPU time of every live thread of `pid` (/proc/<pid>/task/*/schedstat, Linux), 0 if unknown."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def child_pids(pid: int) -> list[int]:
    """The live children of `pid` (/proc/<pid>/task/*/children: the picker's body parse workers)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def process_tree_cpu_ns(pid: int) -> int:
    """`process_cpu_ns` of `pid` and of its live children."""
    return process_cpu_ns(pid) + sum(process_cpu_ns(child) for child in child_pids(pid))


def cpu_snapshot(processes: dict[str, int]) -> dict[str, int]:
    snapshot = {name: process_tree_cpu_ns(pid) for name, pid in processes.items()}
    snapshot["client"] = time.process_time_ns()
    return snapshot


def measure_setup(
    running: Running,
    requests: dict[str, list[bytes]],
    args: argparse.Namespace,
    samples: dict[tuple[str, str], Samples],
) -> None:
    port = running.listen_port
    pids = {"envoy": running.processes[-1].pid}
    if running.picker is not None:
        pids["picker"] = running.picker.pid
        # a body over 16 KiB starts the picker's parse worker (its CPU counts with the picker's):
        # started here, outside every measured window, not inside the first one with its imports
        largest = max(requests, key=lambda size: max(map(len, requests[size])))
        run_sequential(port, sorted(requests[largest], key=len)[-1:], 0, 1)

    def account(sample: Samples, before: dict[str, int], sent: int) -> None:
        after = cpu_snapshot(pids)
        for name, value in after.items():
            sample.cpu_ns[name] += value - before[name]
        sample.sent += sent

    for size, items in requests.items():
        before = cpu_snapshot(pids)
        latencies, errors = run_sequential(port, items, args.warmup, args.sequential)
        account(samples[size, "sequential"], before, args.warmup + args.sequential)
        samples[size, "sequential"].add(latencies, errors)
    for size, items in requests.items():
        before = cpu_snapshot(pids)
        latencies, errors, wall_s = run_concurrent(
            port, items, args.clients, args.client_warmup, args.per_client
        )
        account(samples[size, "concurrent"], before, args.clients * (args.client_warmup + args.per_client))
        samples[size, "concurrent"].add(latencies, errors, wall_s)


def latency_report(
    results: dict[str, dict[tuple[str, str], Samples]], setups: Sequence[Setup], clients: int
) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for size in BODY_SIZES:
        report[size] = {}
        for load in ("sequential", "concurrent"):
            key = (size, load)
            direct = results["direct"][key]
            direct_sum = summary_ms(direct.latencies, direct.errors)
            direct_sum["per_round_p50_ms"] = direct.per_round_p50_ms
            direct_sum["cpu_us_per_request"] = direct.cpu_us_per_request()
            section: dict[str, Any] = {"direct": direct_sum}
            if load == "concurrent":
                direct_sum["throughput_rps"] = round(len(direct.latencies) / direct.wall_s, 1)
            for mode in MODES:
                by_kind: dict[str, Any] = {}
                for kind in ("noop", "picker"):
                    setup = next(s for s in setups if s.kind == kind and s.mode == mode)
                    got = results[setup.name][key]
                    entry = summary_ms(got.latencies, got.errors)
                    entry["added_p50_ms"] = r3(entry["p50_ms"] - direct_sum["p50_ms"])
                    entry["added_p99_ms"] = r3(entry["p99_ms"] - direct_sum["p99_ms"])
                    entry["per_round_p50_ms"] = got.per_round_p50_ms
                    entry["cpu_us_per_request"] = got.cpu_us_per_request()
                    if load == "concurrent":
                        entry["throughput_rps"] = round(len(got.latencies) / got.wall_s, 1)
                    by_kind[kind] = entry
                noop_added = by_kind["noop"]["added_p50_ms"]
                by_kind["picker_vs_noop_added_p50_ratio"] = (
                    r3(by_kind["picker"]["added_p50_ms"] / noop_added) if noop_added > 0 else math.nan
                )
                per_round = [
                    r3((p - d) / (n - d)) if n > d else math.nan
                    for p, n, d in zip(
                        by_kind["picker"]["per_round_p50_ms"],
                        by_kind["noop"]["per_round_p50_ms"],
                        direct_sum["per_round_p50_ms"],
                        strict=False,
                    )
                ]
                by_kind["per_round_ratio"] = per_round
                if load == "concurrent":
                    by_kind["picker_vs_noop_throughput_ratio"] = r3(
                        by_kind["picker"]["throughput_rps"] / by_kind["noop"]["throughput_rps"]
                    )
                section[mode] = by_kind
            report[size]["sequential" if load == "sequential" else f"concurrent{clients}"] = section
    return report


# --- in-process split ------------------------------------------------------------------------------

_BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
_STREAMED = processing_mode_pb2.ProcessingMode.STREAMED


def inprocess_config(workers: int = 4) -> PickerConfig:
    return PickerConfig(
        router=RouterConfig(block_size=BLOCK_SIZE, use_kv_events=False),
        workers=tuple(WorkerConfig(f"w{i}", f"127.0.0.1:{8000 + i}", MODEL) for i in range(workers)),
        models=(ModelConfig(MODEL),),
        seed=1,
    )


def _headers_message(request_id: str, body_len: int, mode: int) -> pb.ProcessingRequest:
    """Request headers as Envoy 1.40 sends them (the same set of pseudo and regular headers)."""
    headers = {
        ":authority": "127.0.0.1:10000", ":path": CHAT_PATH, ":method": "POST", ":scheme": "http",
        "content-type": "application/json", "content-length": str(body_len),
        "x-forwarded-proto": "http", "x-request-id": request_id,
    }  # fmt: skip
    response_mode = _DUPLEX if mode == _DUPLEX else _STREAMED
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
            )
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode, response_body_mode=response_mode),
    )


def _stream_messages(request_id: str, body: bytes, mode: int) -> list[pb.ProcessingRequest]:
    status = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")])
    return [
        _headers_message(request_id, len(body), mode),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=status)),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b'{"worker": "x"}', end_of_stream=True)),
    ]


async def _run_stream(servicer: Any, messages: list[pb.ProcessingRequest]) -> int:
    async def feed() -> Any:
        for message in messages:
            yield message

    answers = 0
    async for _ in servicer.Process(feed(), None):
        answers += 1
    return answers


async def _inprocess(bodies: dict[str, list[bytes]], iterations: dict[str, int]) -> dict[str, Any]:
    import noop_picker

    picker = EndpointPicker(inprocess_config())
    service = ExtProcService(picker, max_body_bytes=16 << 20)
    noop = noop_picker.NoopPicker([w.endpoint for w in inprocess_config().workers])
    result: dict[str, Any] = {}
    seq = 0
    for size, items in bodies.items():
        n = iterations[size]
        timings: dict[str, list[int]] = defaultdict(list)
        for i in range(n + n // 10):  # the first tenth warms up
            seq += 1
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            pick = await picker.pick(
                body=items[i % len(items)], path=CHAT_PATH, headers={":path": CHAT_PATH}, subset=None,
                client_request_id=f"r{seq}",
            )  # fmt: skip
            t1 = time.perf_counter_ns()
            c1 = time.thread_time_ns()
            picker.first_token(pick)
            picker.finish(pick, "complete")
            t2 = time.perf_counter_ns()
            if i >= n // 10:
                for key, value in pick.timings_ns.items():
                    timings[key].append(value)
                timings["pick_total"].append(t1 - t0)
                timings["pick_cpu"].append(c1 - c0)
                timings["first_token_and_finish"].append(t2 - t1)
        entry = {f"{key}_us": round(statistics.median(v) / 1e3, 1) for key, v in timings.items()}
        entry["pick_total_p99_us"] = round(pct(timings["pick_total"], 0.99) / 1e3, 1)
        # on-CPU time of this thread: a wall-clock p99 far above it means preemption by other processes
        entry["pick_cpu_p99_us"] = round(pct(timings["pick_cpu"], 0.99) / 1e3, 1)
        entry["n"] = n
        # Whole ext_proc streams (headers, body, response headers, response body), no gRPC.
        streams: dict[str, list[int]] = defaultdict(list)
        for i in range(n + n // 10):
            for mode_name, mode in (("buffered", _BUFFERED), ("duplex", _DUPLEX)):
                for name, servicer in (("picker", service), ("noop", noop)):
                    seq += 1
                    messages = _stream_messages(f"s{seq}", items[i % len(items)], mode)
                    t0 = time.perf_counter_ns()
                    await _run_stream(servicer, messages)
                    if i >= n // 10:
                        streams[f"{name}_{mode_name}"].append(time.perf_counter_ns() - t0)
        entry["stream_inprocess_us"] = {k: round(statistics.median(v) / 1e3, 1) for k, v in streams.items()}
        result[size] = entry
    result["picker_idle_after"] = picker.is_idle()
    await picker.close()
    return result


def inprocess_split(bodies: dict[str, list[bytes]], quick: bool) -> dict[str, Any]:
    iterations = {"1k": 300, "8k": 150} if quick else {"1k": 2000, "8k": 800}
    return asyncio.run(_inprocess(bodies, iterations))


# --- inter-token latency ---------------------------------------------------------------------------


def stream_once(port: int, request: bytes, tokens: int) -> tuple[list[float], float, bool]:
    """One streamed chat request; (gaps between token events in ms, TTFT ms, complete)."""
    client = BlockingClient(port)
    reader = ResponseReader(sse=True)
    try:
        t0, _t1 = client.send(request, reader)
    finally:
        client.close()
    events = reader.event_ns  # role head, `tokens` token chunks, [DONE]
    complete = reader.status == 200 and len(events) == tokens + 2
    token_ns = events[1 : tokens + 1]
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(token_ns)]
    ttft = (token_ns[0] - t0) / 1e6 if token_ns else math.nan
    return gaps, ttft, complete


def measure_itl(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    workers = start_workers(1, log_dir, speedup=1.0, block_size=BLOCK_SIZE)
    try:
        content = make_contents(BODY_SIZES["1k"], 1, 99)[0]
        body = chat_body(content, max_tokens=args.itl_tokens, stream=True)
        setups = [Setup("direct", "direct", None), Setup("picker/buffered", "picker", "buffered")]
        gaps: dict[str, list[float]] = defaultdict(list)
        ttft: dict[str, list[float]] = defaultdict(list)
        incomplete: Counter[str] = Counter()
        for round_index in range(args.rounds):
            for setup in setups if round_index % 2 == 0 else setups[::-1]:
                log(f"ITL round {round_index + 1}/{args.rounds}: {setup.name}")
                running = start_setup(setup, workers, log_dir / "itl")
                try:
                    request = http_request(running.listen_port, body)
                    stream_once(running.listen_port, request, args.itl_tokens)  # warm-up
                    for _ in range(args.itl_requests):
                        g, t, complete = stream_once(running.listen_port, request, args.itl_tokens)
                        if not complete:
                            incomplete[setup.name] += 1
                            continue
                        gaps[setup.name] += g
                        ttft[setup.name].append(t)
                finally:
                    running.stop()
    finally:
        for w in workers:
            w.process.stop(grace_s=3.0)
    out: dict[str, Any] = {
        "worker": "python -m extproc mock-worker --speedup 1 (decode step ~5.7 ms)",
        "tokens_per_stream": args.itl_tokens,
        "streams_per_setup": args.itl_requests * args.rounds,
    }
    for setup in setups:
        g = gaps[setup.name]
        out[setup.name] = {
            "gaps": len(g),
            "incomplete_streams": incomplete[setup.name],
            "itl_p50_ms": r3(pct(g, 0.5)),
            "itl_p90_ms": r3(pct(g, 0.9)),
            "itl_p99_ms": r3(pct(g, 0.99)),
            "itl_mean_ms": r3(statistics.fmean(g)) if g else math.nan,
            "ttft_p50_ms": r3(pct(ttft[setup.name], 0.5)),
        }
    direct, picker = out["direct"], out["picker/buffered"]
    out["itl_p50_added_ms"] = r3(picker["itl_p50_ms"] - direct["itl_p50_ms"])
    out["itl_p90_added_ms"] = r3(picker["itl_p90_ms"] - direct["itl_p90_ms"])
    out["itl_mean_added_ms"] = r3(picker["itl_mean_ms"] - direct["itl_mean_ms"])
    out["ttft_p50_added_ms"] = r3(picker["ttft_p50_ms"] - direct["ttft_p50_ms"])
    return out


# --- profile ---------------------------------------------------------------------------------------

PROFILE_FOCUS = (
    "ExtProcService.Process (extproc/epp/service.py)",
    "EndpointPicker.pick (extproc/picker/pipeline.py)",
    "parse_openai_body (extproc/request/parse.py)",
    "RequestTokenizer.tokenize (extproc/request/tokenizer.py)",
    "KvRouter.block_hashes (extproc/router/router.py)",
    "KvRouter.best_worker_for_hashes (extproc/router/router.py)",
    "ApproxIndexer.record_routing (extproc/router/approx.py)",
    "RadixTree.find_matches (extproc/router/radix.py)",
    "ActiveSequences.add_request (extproc/router/sequences.py)",
)


def profile_pickers(
    py_spy: str, workers: Sequence[WorkerProcess], bodies: dict[str, list[bytes]], log_dir: Path, seconds: int
) -> dict[str, Any]:
    """py-spy (on-CPU samples, --nonblocking) on the no-op and the real picker process, buffered, 1k
    bodies: one client sending back to back (what sequential latency pays), then 16 concurrent clients."""
    out_dir = log_dir / "profile"
    out: dict[str, Any] = {"body": "1k", "seconds_each": seconds, "rate_hz": 250}
    for setup in (Setup("noop/buffered", "noop", "buffered"), Setup("picker/buffered", "picker", "buffered")):
        running = start_setup(setup, workers, out_dir)
        out[setup.name] = {}
        try:
            assert running.picker is not None
            port, pid = running.listen_port, running.picker.pid
            requests = [http_request(port, b) for b in bodies["1k"]]
            run_concurrent(port, requests, 16, 5, 20)  # warm-up
            for name in ("sequential", "concurrent16"):
                tag = f"{setup.kind}-{name}"
                raw = out_dir / f"{tag}.pyspy.txt"
                argv = [
                    py_spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "250",
                    "--format", "raw", "--output", str(raw), "--nonblocking",
                ]  # fmt: skip
                spy = ManagedProcess(argv, log_path=out_dir / f"py-spy-{tag}.log").start()
                try:
                    time.sleep(1.0)  # py-spy attaching
                    cpu0, t0 = process_cpu_ns(pid), time.monotonic()
                    deadline = t0 + seconds + 10
                    sent = 0
                    while spy.is_running() and time.monotonic() < deadline and sent < 500_000:
                        sent += _drive(name, port, requests)
                    cpu_us = (process_cpu_ns(pid) - cpu0) / 1e3 / max(sent, 1)
                    rate = sent / (time.monotonic() - t0)
                    spy_wait = time.monotonic() + 15
                    while spy.is_running() and time.monotonic() < spy_wait:
                        time.sleep(0.1)
                finally:
                    spy.stop(grace_s=5.0)
                if raw.exists():
                    summary = summarise_collapsed(raw.read_text())
                    out[setup.name][name] = {
                        "requests": sent,
                        "req_per_s": round(rate, 1),
                        "picker_cpu_us_per_request": round(cpu_us, 1),
                        **summary,
                        "raw": str(raw),
                    }
                else:
                    out[setup.name][name] = {"error": f"no py-spy output; see {out_dir}/py-spy-{tag}.log"}
        finally:
            running.stop()
    return out


def _drive(load: str, port: int, requests: Sequence[bytes]) -> int:
    """One batch of profiling load; returns the number of requests answered."""
    if load == "sequential":
        return len(run_sequential(port, requests, 0, 200)[0])
    return len(run_concurrent(port, requests, 16, 0, 50)[0])


def _frame_label(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (short/path.py)'."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0].rstrip(")")
    for marker in ("/extproc/", "/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            path = ("extproc/" + path) if marker == "/extproc/" else path
            break
    return f"{name} ({path})"


_LOOP_CALLBACK = "Handle._run (asyncio/events.py)"


def summarise_collapsed(text: str) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks -> shares of samples: self, inclusive, our code vs the rest."""
    self_samples: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = ours = other_threads = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_label(f) for f in stack.split(";")]
        total += count
        self_samples[frames[-1]] += count
        for label in set(frames):
            inclusive[label] += count
        # our code runs under an event-loop callback (Handle._run); main() frames above it do not count
        if _LOOP_CALLBACK in frames:
            start = frames.index(_LOOP_CALLBACK) + 1
        else:  # waiting in the loop, or a stack py-spy could only read partly (no root frame)
            start = len(frames) if frames[0].startswith(("_run_module_as_main", "<module>")) else 0
        if any("(extproc/" in f or "(noop_picker.py)" in f for f in frames[start:]):
            ours += count
        if any(f.startswith("Thread.run (") for f in frames):
            other_threads += count

    def share(c: int) -> float:
        return round(100.0 * c / total, 1) if total else math.nan

    return {
        "samples": total,
        # grpc.aio's completion-queue poller thread (native code under Thread.run)
        "other_threads_pct": share(other_threads),
        # samples inside the picker's own code (extproc/ or noop_picker.py) called from the event loop;
        # the rest is grpc.aio and asyncio machinery (native code shows as Handle._run / Thread.run)
        "picker_code_pct": share(ours),
        "top_self_pct": {label: share(c) for label, c in self_samples.most_common(15)},
        "focus_inclusive_pct": {label: share(inclusive.get(label, 0)) for label in PROFILE_FOCUS},
    }


# --- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts, two rounds (about 30-40 s)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds over all setups (default 3, quick 2)")
    parser.add_argument("--sequential", type=int, help="measured sequential requests per round and body")
    parser.add_argument("--warmup", type=int, help="sequential warm-up requests per round and body")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default: %(default)s)")
    parser.add_argument("--per-client", type=int, help="measured requests per concurrent client")
    parser.add_argument("--client-warmup", type=int, default=5, help="warm-up requests per concurrent client")
    parser.add_argument(
        "--echo-workers", type=int, default=4, help="upstream echo workers (default: %(default)s)"
    )
    parser.add_argument("--itl-requests", type=int, help="streamed requests per ITL setup and round")
    parser.add_argument("--itl-tokens", type=int, default=64, help="tokens per streamed response")
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy binary: also profile both pickers")
    parser.add_argument(
        "--profile-seconds", type=int, default=6, help="py-spy duration (default: %(default)s)"
    )
    parser.add_argument("--skip-itl", action="store_true", help="leave out the inter-token latency part")
    parser.add_argument(
        "--ext-proc-server",
        choices=("h2", "grpcio"),
        default="h2",
        help="the picker's ext_proc server (serve --ext-proc-server; default: %(default)s, serve's)",
    )
    parser.add_argument("--log-dir", type=Path, help="child process logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    global PICKER_ARGS
    PICKER_ARGS = (*PICKER_ARGS, "--ext-proc-server", args.ext_proc_server)
    defaults = (
        {"rounds": 2, "sequential": 200, "warmup": 30, "per_client": 40, "itl_requests": 3}
        if args.quick
        else {"rounds": 3, "sequential": 400, "warmup": 50, "per_client": 100, "itl_requests": 5}
    )
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def envoy_version() -> str:
    try:
        out = subprocess.run([find_envoy(), "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def targets(latency: dict[str, Any], itl: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        section = latency["1k"]["sequential"][mode]
        ratio = section["picker_vs_noop_added_p50_ratio"]
        out[f"picker_added_p50_le_1.3x_noop_1k_sequential_{mode}"] = {
            "ok": bool(ratio <= TARGET_RATIO),
            "ratio": ratio,
            "limit": TARGET_RATIO,
            "picker_added_p50_ms": section["picker"]["added_p50_ms"],
            "noop_added_p50_ms": section["noop"]["added_p50_ms"],
        }
    for size, limit in CPU_TARGET_RATIOS.items():
        for mode in MODES:
            section = latency[size]["concurrent16"][mode]
            picker_cpu = section["picker"]["cpu_us_per_request"].get("picker", math.nan)
            noop_cpu = section["noop"]["cpu_us_per_request"].get("picker", math.nan)
            ratio = r3(picker_cpu / noop_cpu) if noop_cpu else math.nan
            out[f"picker_cpu_le_{limit}x_noop_{size}_concurrent16_{mode}"] = {
                "ok": bool(ratio <= limit),
                "ratio": ratio,
                "limit": limit,
                "picker_cpu_us_per_request": picker_cpu,
                "noop_cpu_us_per_request": noop_cpu,
            }
    if itl is not None:
        added = itl["itl_p50_added_ms"]
        out["itl_p50_added_lt_0.2ms"] = {
            "ok": bool(added < TARGET_ITL_MS),
            "added_ms": added,
            "limit_ms": TARGET_ITL_MS,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-extproc-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log(f"logs in {log_dir}")
    started = time.monotonic()
    load_before = os.getloadavg()
    bodies = make_bodies()
    setups = [Setup("direct", "direct", None)]
    setups += [Setup(f"{kind}/{mode}", kind, mode) for mode in MODES for kind in ("noop", "picker")]

    log("in-process picker split")
    split = inprocess_split(bodies, args.quick)

    echo: list[WorkerProcess] = []
    results: dict[str, dict[tuple[str, str], Samples]] = {s.name: defaultdict(Samples) for s in setups}
    profile: dict[str, Any] | None = None
    try:
        for i in range(args.echo_workers):
            process = start_echo_worker_process(log_path=log_dir / f"echo-{i}.log")
            echo.append(WorkerProcess(f"w{i}", f"127.0.0.1:{process.ports()['port']}", process))
        for round_index in range(args.rounds):
            shift = round_index % len(setups)
            for setup in setups[shift:] + setups[:shift]:
                log(f"round {round_index + 1}/{args.rounds}: {setup.name}")
                running = start_setup(setup, echo, log_dir)
                try:
                    requests = {
                        size: [http_request(running.listen_port, b) for b in items]
                        for size, items in bodies.items()
                    }
                    measure_setup(running, requests, args, results[setup.name])
                finally:
                    running.stop()
        if args.py_spy:
            log(f"profiling the picker with {args.py_spy} for {args.profile_seconds} s")
            try:
                profile = profile_pickers(args.py_spy, echo, bodies, log_dir, args.profile_seconds)
            except Exception as exc:  # the measurements above still get printed
                log(f"profiling failed: {exc!r}")
                profile = {"error": repr(exc)}
    finally:
        for w in echo:
            w.process.stop(grace_s=3.0)

    latency = latency_report(results, setups, args.clients)
    itl = None
    if not args.skip_itl:
        itl = measure_itl(args, log_dir)

    document: dict[str, Any] = {
        "benchmark": "bench_extproc",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "envoy": envoy_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "config": {
            "quick": args.quick,
            "rounds": args.rounds,
            "sequential_per_round": args.sequential,
            "sequential_warmup": args.warmup,
            "clients": args.clients,
            "per_client_per_round": args.per_client,
            "echo_workers": args.echo_workers,
            "envoy_concurrency": 1,
            "picker_args": list(PICKER_ARGS),
            "bodies": body_facts(bodies),
            "direct_config": "buffered.yaml rendered, ext_proc filter and endpoint_picker cluster "
            "removed, picked_endpoint as STATIC ROUND_ROBIN over the echo workers",
            "client": "raw HTTP/1.1 keep-alive: blocking socket (sequential), asyncio protocol (concurrent)",
        },
        "latency": latency,
        "picker_split_us": split,
        "itl": itl,
        "targets": targets(latency, itl),
    }
    if profile is not None:
        document["profile"] = profile
    document["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(document, indent=2))
    log(f"done in {document['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
