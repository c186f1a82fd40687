"""What a picker replica costs (issue 22): one picker against three replicas sharing their load.

Real processes on 127.0.0.1, stopped by pid: a nats-server, mock workers (`extproc mock-worker
--kv-events nats`, Dynamo JSON KV events over NATS core, one event per message; with `--kv-events
dynamo-relay`, vLLM's ZMQ batches republished on Dynamo's event plane by ai-dynamo-runtime 1.6.1's
own relay, `benchmarks/dynamo_relay.py`, as a Dynamo vLLM worker runs it; with `--kv-events
indexer`, vLLM's ZMQ batches consumed by Dynamo 1.6.1's standalone indexer, `python -m
dynamo.indexer`, which the pickers ask for overlaps: `--kv-indexer-url`), and `extproc serve`
pickers with KV events from NATS, the replicas with `--router-replica-sync`. This script is the
client (Envoy's part): per request it opens an ext_proc stream to a picker (round robin over the
replicas), sends the request headers and body, reads the chosen worker from the answer, sends the
request to that worker over HTTP (so the worker's prefix cache publishes its KV events), then hands
the worker's answer back as response headers and one response body with end_of_stream (first
token, then the free).

Setups, one after the other, each with freshly started workers (empty caches) and pickers:

- `single`: one picker, no replica sync, at `--rate` requests per second.
- `replicas3`: three pickers with replica sync, the same total rate spread round robin, plus two
  observers that route nothing: `observer_sync` (a replica: it applies every sync message of the
  cluster and every KV event) and `observer_kv` (no replica sync: every KV event only). Their CPU
  attributes a replica's cost: KV events = observer_kv minus its idle CPU, sync = observer_sync
  minus observer_kv; divided by the messages each applied (admin `/debug/workers` counters).

Each setup: warm-up traffic (KV events and sync flowing, caches filling), an idle window (the
background CPU of every picker: heartbeats, leases, discovery), then the measured window at the
rate. CPU is user+sys of each picker process from /proc/<pid>/stat (all threads, also those that
ended) over the window, never wall time: the machine is shared. Prints one JSON object on stdout
(progress on stderr).

    .venv/bin/python benchmarks/bench_replicas.py --quick     # about 2.5 minutes
    .venv/bin/python benchmarks/bench_replicas.py             # about 5 minutes
    .venv/bin/python benchmarks/bench_replicas.py --quick --py-spy .venv/bin/py-spy   # + a profile

`per_replica_vs_single`: each replica's CPU over the window / the single picker's (goal: at most
0.45, issue 22). The single picker is measured again after the replicas (`single_again`;
`--no-repeat-single` skips it): `per_replica_vs_single_again` holds the ratios against it,
`single_again_vs_single` how far the two singles are apart, and the goal counts as met only against
both. With `--kv-events indexer --compare-kv-events json`, `indexer_vs_events` holds each
indexer-mode replica against the single picker that consumes the events itself (`before`), alone
and with a third of the indexer's CPU added (`with_indexer_share`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import aiohttp  # noqa: E402
import grpc  # noqa: E402
import nats  # noqa: E402
from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc  # noqa: E402

from extproc.devstack.dynamo_indexer import DynamoIndexer  # noqa: E402
from extproc.devstack.procs import ManagedProcess, start_nats_server, wait_http_ok  # noqa: E402
from extproc.events.dynamo_json import encode_event, kv_events_subject  # noqa: E402
from extproc.events.dynamo_plane import event_plane_subject  # noqa: E402
from extproc.router.types import AllBlocksCleared, Worker  # noqa: E402

MODEL = "demo-model"
BLOCK_SIZE = 16
NAMESPACE = "bench"
CHAT_PATH = "/v1/chat/completions"
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
STREAMED = processing_mode_pb2.ProcessingMode.STREAMED
TICKS = os.sysconf("SC_CLK_TCK")
GOAL = 0.45
KEPT_COUNTERS = ("sync.applied", "sync.published", "sync.batch_ops", "nats.event", "feed.events", "sync.gap",
                 "sync.resync", "sync.malformed", "sync.catch_up", "sync.catch_up_turns")  # fmt: skip
_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def _user_system_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid`, all its threads (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime (fields 14 and 15)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`."""
    return sum(_user_system_s(pid))


def sys_s(pid: int) -> float:
    """System (kernel) CPU seconds of process `pid`: the part of `cpu_s` spent in system calls."""
    return _user_system_s(pid)[1]


def sleeps(pid: int) -> int:
    """How often the main thread of `pid` went to sleep waiting (voluntary context switches): each
    ends in a wake-up, the costly part of a message that does little."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


# -- prompts ------------------------------------------------------------------------------------


def make_prompts(count: int, seed: int, max_tokens: int) -> list[bytes]:
    """Chat bodies of about 2-4k tokens (the byte tokenizer: one token per character): one of 12
    shared system prompts of 1.5-2.5k characters (skewed: the first ones more often), then a
    conversation of its own of 0.5-1.5k characters."""
    rng = random.Random(seed)
    words = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(2000)
    ]

    def text(chars: int) -> str:
        out: list[str] = []
        size = 0
        while size < chars:
            w = rng.choice(words)
            out.append(w)
            size += len(w) + 1
        return " ".join(out)[:chars]

    systems = [text(rng.randint(1500, 2500)) for _ in range(12)]
    bodies = []
    for i in range(count):
        system = systems[min(int(rng.expovariate(0.35)), len(systems) - 1)]
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"request {i}: " + text(rng.randint(500, 1500))},
        ]
        bodies.append(json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens}).encode())
    return bodies


# -- processes ----------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    process: ManagedProcess
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.process.stop(grace_s=5.0)


def start_workers(
    n: int, nats_url: str, tmp: Path, speedup: float, blocks: int, kv_events: str = "json"
) -> list[Proc]:
    """`n` mock workers. `kv_events` "json": each publishes Dynamo JSON on NATS itself (one event per
    message); "dynamo-relay": each publishes vLLM's ZMQ batches (one per engine pass) for
    `start_relay` to republish."""
    procs = []
    relay = kv_events in ("dynamo-relay", "indexer")  # vLLM's ZMQ batches, consumed by a Dynamo process
    for i in range(n):
        ports_file = tmp / f"worker{i}.ports.json"
        argv = [
            sys.executable, "-m", "extproc", "mock-worker", "--port", "0", "--worker-id", f"w{i}",
            "--model", MODEL, "--block-size", str(BLOCK_SIZE), "--speedup", str(speedup),
            "--num-gpu-blocks", str(blocks), "--ports-file", str(ports_file),
        ]  # fmt: skip
        if relay:
            argv += ["--kv-events", "zmq", "--kv-events-port", "0", "--kv-replay-port", "0"]
        else:
            argv += ["--kv-events", "nats", "--nats-url", nats_url, "--instance-id", str(100 + i),
                     "--namespace", NAMESPACE]  # fmt: skip
        process = ManagedProcess(argv, log_path=tmp / f"worker{i}.log", ports_file=ports_file).start()
        procs.append(Proc(f"w{i}", process))
    for p in procs:
        p.ports = p.process.ports(30.0)
        wait_http_ok(f"http://127.0.0.1:{p.ports['port']}/health", 30.0, process=p.process)
    return procs


def start_relay(workers: Sequence[Proc], nats_url: str, tmp: Path) -> Proc:
    """One process of Dynamo 1.6.1's own relay (benchmarks/dynamo_relay.py) republishing the ZMQ
    batches of `workers` on Dynamo's event plane, as a Dynamo vLLM worker does (Dynamo worker id
    100 + i, as `write_config` names them)."""
    argv = [sys.executable, str(REPO_ROOT / "benchmarks" / "dynamo_relay.py"), "--endpoint",
            f"{NAMESPACE}.backend.generate", "--block-size", str(BLOCK_SIZE)]  # fmt: skip
    for i, w in enumerate(workers):
        argv += ["--relay", f"{100 + i}=tcp://127.0.0.1:{w.ports['kv_events_port']}"]
    log_path = tmp / "dynamo_relay.log"
    process = ManagedProcess(argv, log_path=log_path, env={**os.environ, "NATS_SERVER": nats_url}).start()
    deadline = time.monotonic() + 60.0
    while b"ready" not in (log_path.read_bytes() if log_path.exists() else b""):
        if process.returncode is not None or time.monotonic() > deadline:
            process.stop(grace_s=2.0)
            raise RuntimeError(f"Dynamo's relay did not start (needs the compat extra): see {log_path}")
        time.sleep(0.05)
    return Proc("dynamo_relay", process)


def write_config(workers: Sequence[Proc], path: Path, *, zmq: bool = False) -> Path:
    """The pickers' config; with `zmq`, each worker's KV event and replay sockets (for an indexer)."""
    lines = [
        f"models: [{{name: {MODEL}}}]",
        f"router: {{kv-cache-block-size: {BLOCK_SIZE}}}",
        "workers:",
    ]
    for i, w in enumerate(workers):
        sockets = (
            f", kv-events: 'tcp://127.0.0.1:{w.ports['kv_events_port']}', "
            f"kv-replay: 'tcp://127.0.0.1:{w.ports['kv_replay_port']}'"
            if zmq
            else ""
        )
        lines.append(
            f"  - {{id: {w.name}, endpoint: '127.0.0.1:{w.ports['port']}', model: {MODEL}, "
            f"instance-id: {100 + i}{sockets}}}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def start_picker(
    name: str, config: Path, nats_url: str, tmp: Path, *, sync: bool, repo: Path, extra: Sequence[str] = (),
    sync_extra: Sequence[str] = (),
) -> Proc:  # fmt: skip
    ports_file = tmp / f"{name}.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "serve", "--config", str(config), "--port", "0",
        "--health-port", "0", "--admin-port", "0", "--ports-file", str(ports_file),
        "--nats-url", nats_url, "--namespace", NAMESPACE, "--router-kv-events", "--log-level", "warning",
        "--shutdown-grace-secs", "0",
        *extra,
    ]  # fmt: skip
    if sync:
        argv += ["--router-replica-sync", "--router-id", name, *sync_extra]
    env = {**os.environ, "PYTHONPATH": str(repo)}  # `-m extproc` from `repo` (a checkout to compare)
    process = ManagedProcess(argv, log_path=tmp / f"{name}.log", ports_file=ports_file, env=env, cwd=repo)
    return Proc(name, process.start())


# -- traffic ------------------------------------------------------------------------------------


def _headers(request_id: str, body_len: int) -> pb.ProcessingRequest:
    headers = {
        ":authority": "127.0.0.1:10000", ":path": CHAT_PATH, ":method": "POST", ":scheme": "http",
        "content-type": "application/json", "content-length": str(body_len),
        "x-forwarded-proto": "http", "x-request-id": request_id,
    }  # fmt: skip
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
            )
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=BUFFERED, response_body_mode=STREAMED),
    )


_STATUS = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")])


@dataclass
class Traffic:
    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    per_picker: Counter[str] = field(default_factory=Counter)
    per_worker: Counter[str] = field(default_factory=Counter)


class Client:
    """Envoy's part: ext_proc streams to the pickers, HTTP to the chosen workers."""

    def __init__(self, pickers: Sequence[Proc], prompts: Sequence[bytes]) -> None:
        self.pickers = list(pickers)
        self.channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p.ports['port']}") for p in pickers]
        self.stubs = [ext_grpc.ExternalProcessorStub(c) for c in self.channels]
        self.prompts = prompts
        self.http: aiohttp.ClientSession | None = None
        self.n = 0

    async def __aenter__(self) -> Client:
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.http is not None
        await self.http.close()
        for c in self.channels:
            await c.close()

    async def one(self, traffic: Traffic) -> None:
        assert self.http is not None
        n = self.n
        self.n += 1
        index = n % len(self.stubs)
        body = self.prompts[n % len(self.prompts)]
        traffic.sent += 1
        call = self.stubs[index].Process()
        try:
            await call.write(_headers(f"bench-{os.getpid()}-{n}", len(body)))
            await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
            await call.read()
            answer = await call.read()
            set_headers = answer.request_body.response.header_mutation.set_headers
            worker = {h.header.key: h.header.raw_value.decode() for h in set_headers}.get(
                "x-gateway-destination-endpoint"
            )
            if worker is None:
                traffic.errors["no destination"] += 1
                call.cancel()
                return
            async with self.http.post(
                f"http://{worker}{CHAT_PATH}", data=body, headers={"content-type": "application/json"}
            ) as r:
                data = await r.read()
                status = r.status
            await call.write(pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=_STATUS)))
            await call.read()
            await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=True)))
            await call.read()
            await call.done_writing()
            traffic.per_picker[self.pickers[index].name] += 1
            traffic.per_worker[worker] += 1
            if status == 200:
                traffic.ok += 1
            else:
                traffic.errors[f"status {status}"] += 1
        except (grpc.aio.AioRpcError, aiohttp.ClientError, TimeoutError) as exc:
            traffic.errors[type(exc).__name__] += 1
            call.cancel()

    async def run(self, rate: float, duration_s: float) -> Traffic:
        """Open loop: one request every 1/rate seconds for duration_s; waits for all to end."""
        traffic = Traffic()
        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        total = int(rate * duration_s)
        for i in range(total):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the open loop
            tasks.append(asyncio.create_task(self.one(traffic)))
        await asyncio.gather(*tasks)
        return traffic


# -- a setup ------------------------------------------------------------------------------------


class WireCount:
    """The KV event messages on NATS over the window, both formats (this process's own subscriber)."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.messages = 0

    @classmethod
    async def start(cls, nats_url: str) -> WireCount:
        counter = cls(await nats.connect(nats_url))
        for subject in (kv_events_subject(NAMESPACE, "backend"), event_plane_subject(NAMESPACE, "backend")):
            await counter.nc.subscribe(subject, cb=counter._on_message)
        return counter

    async def _on_message(self, _msg: Any) -> None:
        self.messages += 1

    async def stop(self) -> dict[str, int]:
        await self.nc.drain()
        return {"messages": self.messages}


async def counters(http: aiohttp.ClientSession, p: Proc) -> dict[str, int]:
    async with http.get(f"http://127.0.0.1:{p.ports['admin_port']}/debug/workers") as r:
        return dict((await r.json())["kv_event_counters"])


async def wait_ready(http: aiohttp.ClientSession, p: Proc, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await counters(http, p)
            return
        except aiohttp.ClientError:
            if time.monotonic() > deadline or not p.process.is_running():
                raise RuntimeError(f"{p.name} not ready; log:\n{p.process.log_tail()}") from None
            await asyncio.sleep(0.1)  # polling for readiness


def profile_start(py_spy: str | None, pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    if py_spy is None:
        return None
    argv = [py_spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "1000",
            "--nonblocking", "--format", "raw", "--output", str(out)]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _frame(text: str) -> str:
    """`function (path/file.py:line)` -> `function file.py`."""
    function, _, where = text.partition(" (")
    return f"{function} {where.split(':')[0].rsplit('/', 1)[-1]}"


def summarise_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares of the frames in a py-spy raw (collapsed) profile."""
    if not path.exists():
        return {}
    self_counts: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        frames = [
            f.split(" (")[0] + " " + f.split("(")[-1].split(":")[0].rsplit("/", 1)[-1]
            for f in stack.split(";")
        ]
        total += count
        self_counts[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    share = lambda c: round(100 * c / total, 1) if total else 0.0  # noqa: E731
    ours = {f: c for f, c in incl.items() if "replica_sync" in f or "nats_events" in f or "feed.py" in f}
    return {
        "samples": total,
        "self_pct": {f: share(c) for f, c in self_counts.most_common(top)},
        "inclusive_pct_events": {f: share(c) for f, c in sorted(ours.items(), key=lambda x: -x[1])[:top]},
    }


class _Wire:
    """Stands in for replica sync's publishing queue (the in-process part)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def submit(self, subject: str, payload: bytes) -> None:
        self.sent.append(payload)


def inprocess_costs(prompts: Sequence[bytes], requests: int = 400) -> dict[str, float]:
    """CPU per op in one process, no transport: a decision (`best_worker`, the routing part of a
    request), applying another replica's lifecycle ops sent one by one or in batches of 8, and a
    Dynamo JSON KV event (decode + apply). Workers event-fed, as in the picker."""
    from extproc.events.counters import EventCounters
    from extproc.events.feed import RouterFeed
    from extproc.events.nats_events import NatsEventSubscriber
    from extproc.events.replica_sync import ReplicaSync
    from extproc.router import KvRouter, RouterConfig, WorkerSpec
    from extproc.router.types import BlocksStored, StoredBlock

    def router() -> KvRouter:
        r = KvRouter(RouterConfig(block_size=BLOCK_SIZE, use_kv_events=True), clock=time.monotonic,
                     workers=[WorkerSpec(f"w{i}") for i in range(4)])  # fmt: skip
        for i in range(4):
            r.set_event_fed(Worker(f"w{i}"), True)
        return r

    tokens = [
        list("".join(m["content"] for m in json.loads(b)["messages"]).encode()) for b in prompts[:requests]
    ]
    out: dict[str, float] = {}
    sender = router()
    started = time.process_time()
    decisions = [sender.best_worker(t, request_id=f"q{i}") for i, t in enumerate(tokens)]
    out["decision_us"] = round(1e6 * (time.process_time() - started) / requests, 1)
    for batch_s, name in ((0.0, "single"), (1.0, "batch8")):
        wire = _Wire()
        sync = ReplicaSync(None, router(), "s", "x", batch_s=batch_s, heartbeat_s=2.0, lease_s=5.0)  # type: ignore[arg-type]
        sync._sender = wire  # type: ignore[assignment]
        for i, (t, d) in enumerate(zip(tokens, decisions, strict=True)):
            sync.publish_added(f"q{i}", d.worker, sender.block_hashes(t), len(t), d.overlap_blocks, 32)
            sync.publish_prefill_complete(f"q{i}")
            sync.publish_freed(f"q{i}")
            if i % 3 == 2:  # 8-9 ops per batch
                sync.flush_batch()
        sync.flush_batch()
        receiver = ReplicaSync(None, router(), "r", "x", heartbeat_s=2.0, lease_s=5.0)  # type: ignore[arg-type]
        started = time.process_time()
        for payload in wire.sent:
            receiver.handle(payload, now=0.0)
        out[f"sync_{name}_us_per_request"] = round(1e6 * (time.process_time() - started) / requests, 1)
    target = router()
    feed = RouterFeed({f"w{i}": target for i in range(4)}, EventCounters())
    link: Any = type("Link", (), {"counters": EventCounters(), "watch": lambda self, w: lambda: None})()
    subscriber = NatsEventSubscriber(link, feed, "x", worker_id_of=lambda i: f"w{i}")
    events = []
    for i, t in enumerate(tokens):  # engine ids from the content, alike on every worker (as engines do)
        hashes = sender.block_hashes(t)[:64]
        blocks = tuple(StoredBlock((h * 0x9E3779B97F4A7C15) % (1 << 63), h) for h in hashes)
        events.append(encode_event(i % 4, BlocksStored(Worker(i % 4), blocks), i // 4, 0))
    started = time.process_time()
    for e in events:
        subscriber.handle(e)
    out["kv_event_64_blocks_us"] = round(1e6 * (time.process_time() - started) / len(events), 1)
    return out


async def transport_probe(nats_url: str, picker: Proc, seconds: float, idle_rate: float) -> dict[str, Any]:
    """What one NATS message costs the picker whatever it says: KV events that do next to nothing
    (`cleared` from an instance id no worker has: decoded, counted as an unknown worker), 50 a
    second, one at a time; the picker's CPU over them, minus its idle rate, per message."""
    nc = await nats.connect(nats_url)
    try:
        subject = kv_events_subject(NAMESPACE, "backend")
        count = int(50 * seconds)
        before = cpu_s(picker.pid)
        start = time.monotonic()
        for i in range(count):
            delay = start + i / 50 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the probes
            await nc.publish(subject, encode_event(999_999, AllBlocksCleared(Worker(999_999)), i, 0))
            await nc.flush()
        await asyncio.sleep(0.2)  # the last probes are handled
        wall = time.monotonic() - start
        used = cpu_s(picker.pid) - before - idle_rate * wall
    finally:
        await nc.close()
    return {"messages": count, "us_per_message": round(1e6 * used / count, 1)}


async def run_setup(
    name: str, replicas: int, observers: bool, nats_url: str, args: argparse.Namespace, tmp: Path,
    prompts: Sequence[bytes], repo: Path, extra: Sequence[str], sync_extra: Sequence[str], kv_events: str,
) -> dict[str, Any]:  # fmt: skip
    log(f"{name}: starting {args.workers} workers and {replicas} picker(s)")
    stage = tmp / name
    stage.mkdir()
    workers = start_workers(args.workers, nats_url, stage, args.speedup, args.gpu_blocks, kv_events)
    relays: list[Proc] = []
    pickers: list[Proc] = []
    observing: list[Proc] = []
    indexer: DynamoIndexer | None = None
    try:
        if kv_events == "dynamo-relay":
            relays.append(start_relay(workers, nats_url, stage))
        if kv_events == "indexer":
            indexer = DynamoIndexer(stage / "dynamo_indexer.log", threads=1).start()
            extra = [*extra, "--kv-indexer-url", indexer.url]
        config = write_config(workers, stage / "picker.yaml", zmq=indexer is not None)
        sync = replicas > 1
        pickers = [
            start_picker(
                f"r{i}", config, nats_url, stage, sync=sync, repo=repo, extra=extra, sync_extra=sync_extra
            )
            for i in range(replicas)
        ]
        if observers:
            observing = [
                start_picker(
                    "observer_sync",
                    config,
                    nats_url,
                    stage,
                    sync=True,
                    repo=repo,
                    extra=extra,
                    sync_extra=sync_extra,
                ),
                start_picker("observer_kv", config, nats_url, stage, sync=False, repo=repo, extra=extra),
            ]
        everyone = pickers + observing
        for p in everyone:
            p.ports = p.process.ports(30.0)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for p in everyone:
                await wait_ready(http, p)
            async with Client(pickers, prompts) as client:
                log(f"{name}: warm-up {args.warmup_s:.0f} s at {args.rate:g} req/s")
                warm = await client.run(args.rate, args.warmup_s)
                await asyncio.sleep(1.0)  # the last frees and events settle before the idle window
                before = {p.name: cpu_s(p.pid) for p in everyone}
                await asyncio.sleep(args.idle_s)  # the idle window: background CPU only
                after_idle = {p.name: cpu_s(p.pid) for p in everyone}
                idle_rate = {k: (after_idle[k] - before[k]) / args.idle_s for k in before}
                probe = None
                if args.probe_s > 0 and replicas == 1:
                    probe = await transport_probe(nats_url, pickers[0], args.probe_s, idle_rate["r0"])
                profile_target = next((p for p in everyone if p.name == args.profile), pickers[0])
                profiler = profile_start(args.py_spy, profile_target.pid, args.duration_s,
                                         stage / "profile.txt")  # fmt: skip
                wire = await WireCount.start(nats_url)
                c0 = {p.name: await counters(http, p) for p in everyone}
                i0 = cpu_s(indexer.process.pid) if indexer is not None else 0.0
                t0 = {p.name: cpu_s(p.pid) for p in everyone}
                k0 = {p.name: sys_s(p.pid) for p in everyone}
                s0 = {p.name: sleeps(p.pid) for p in everyone}
                w0 = time.monotonic()
                log(f"{name}: measuring {args.duration_s:.0f} s at {args.rate:g} req/s")
                traffic = await client.run(args.rate, args.duration_s)
                await asyncio.sleep(0.5)  # the frees and KV events of the last requests arrive
                wall = time.monotonic() - w0
                t1 = {p.name: cpu_s(p.pid) for p in everyone}
                i1 = cpu_s(indexer.process.pid) if indexer is not None else 0.0
                k1 = {p.name: sys_s(p.pid) for p in everyone}
                s1 = {p.name: sleeps(p.pid) for p in everyone}
                c1 = {p.name: await counters(http, p) for p in everyone}
                on_wire = await wire.stop()
                if profiler is not None:
                    profiler.wait(timeout=args.duration_s + 30)
        cpu = {k: t1[k] - t0[k] for k in t0}
        delta = {k: {c: c1[k].get(c, 0) - c0[k].get(c, 0) for c in c1[k]} for k in c1}
        requests = traffic.ok
        out: dict[str, Any] = {
            "requests": requests,
            "warmup_requests": warm.ok,
            "errors": dict(traffic.errors | warm.errors),
            "wall_s": round(wall, 2),
            "per_picker_requests": dict(traffic.per_picker),
            "per_worker_requests": dict(traffic.per_worker),
            "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
            "kernel_share": {k: round((k1[k] - k0[k]) / v, 2) if v > 0 else None for k, v in cpu.items()},
            "idle_cpu_pct": {k: round(100 * v, 2) for k, v in idle_rate.items()},
            "cpu_ms_per_cluster_request": {k: round(1e3 * v / max(requests, 1), 3) for k, v in cpu.items()},
            "wakeups_per_s": {k: round((s1[k] - s0[k]) / wall, 1) for k in s0},
            "messages": {k: {c: v for c, v in d.items() if c in KEPT_COUNTERS} for k, d in delta.items()},
            "kv_events_on_wire": {**on_wire, "per_request": round(on_wire["messages"] / max(requests, 1), 2)},
        }
        if probe is not None:
            out["transport_probe"] = probe
        if indexer is not None:  # Dynamo's indexer process: every worker's KV events, every query
            out["indexer_cpu_s"] = round(i1 - i0, 3)
            out["indexer_ms_per_cluster_request"] = round(1e3 * (i1 - i0) / max(requests, 1), 3)
        if observers:
            kv, sy = "observer_kv", "observer_sync"
            kv_cpu = cpu[kv] - idle_rate[kv] * wall
            sync_cpu = cpu[sy] - cpu[kv]
            events = delta[kv].get("nats.event", 0)
            applied = delta[sy].get("sync.applied", 0)
            out["attribution"] = {
                "kv_events_ms_per_cluster_request": round(1e3 * kv_cpu / max(requests, 1), 3),
                "sync_apply_ms_per_cluster_request": round(1e3 * sync_cpu / max(requests, 1), 3),
                "kv_event_us": round(1e6 * kv_cpu / events, 1) if events else None,
                "sync_message_us": round(1e6 * sync_cpu / applied, 1) if applied else None,
                "kv_events": events,
                "sync_messages_applied": applied,
            }
        if args.py_spy is not None:
            out["profile_of"] = profile_target.name
            out["profile"] = summarise_profile(stage / "profile.txt")
        return out
    finally:
        for p in observing + pickers + relays + workers:
            p.stop()
        if indexer is not None:
            indexer.stop()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows (about 2.5 minutes in all)")
    parser.add_argument("--rate", type=float, default=25.0, help="total requests per second")
    parser.add_argument("--duration-s", type=float, default=None, help="measured window per setup")
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--idle-s", type=float, default=None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--speedup", type=float, default=1.0, help="mock workers' simulated-time speedup")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--batch-ms", type=float, default=None,
                        help="the replicas' --replica-sync-batch-ms (default: theirs)")  # fmt: skip
    parser.add_argument("--compare-repo", type=Path, metavar="PATH",
                        help="also run both setups with pickers from this checkout (`before`), "
                        "alternating with this one's (`after`)")  # fmt: skip
    parser.add_argument("--compare-batch-ms", type=float, metavar="MS",
                        help="`before`'s replicas with this --replica-sync-batch-ms (this checkout unless "
                        "--compare-repo)")  # fmt: skip
    parser.add_argument("--read-delay-ms", type=float, default=None,
                        help="every picker's --nats-read-delay-ms (default: theirs)")  # fmt: skip
    parser.add_argument("--compare-read-delay-ms", type=float, metavar="MS",
                        help="`before`'s pickers with this --nats-read-delay-ms (this checkout unless "
                        "--compare-repo)")  # fmt: skip
    parser.add_argument("--gpu-blocks", type=int, default=4096, help="mock workers' KV blocks (evictions)")
    parser.add_argument(
        "--kv-events",
        choices=("json", "dynamo-relay", "indexer"),
        default="json",
        help="json: the workers publish Dynamo JSON on NATS, one event per message; "
        "dynamo-relay: vLLM ZMQ batches republished by Dynamo 1.6.1's own relay on "
        "its event plane (benchmarks/dynamo_relay.py, the compat extra); indexer: vLLM ZMQ "
        "batches consumed by Dynamo 1.6.1's standalone indexer, which the pickers ask for "
        "overlaps (--kv-indexer-url; the compat extra)",
    )
    parser.add_argument("--compare-kv-events", choices=("json", "dynamo-relay", "indexer"), metavar="MODE",
                        help="both setups again (`before`) with the workers' KV events so")  # fmt: skip
    parser.add_argument("--single-only", action="store_true", help="only the single picker (no ratio)")
    parser.add_argument("--no-observers", action="store_true", help="no observer pickers (no attribution)")
    parser.add_argument(
        "--decompose",
        action="store_true",
        help="also one picker alone at rate / replicas (what one replica routes), and split a replica's "
        "CPU into routing its share, KV events and sync (needs the observers)",
    )
    parser.add_argument("--py-spy", metavar="PATH", help="profile a picker over the window (--profile)")
    parser.add_argument("--profile", default="observer_sync", metavar="NAME",
                        help="the picker --py-spy profiles: r0, r1, r2, observer_sync or observer_kv "
                             "(r0 where the setup has no such picker)")  # fmt: skip
    parser.add_argument("--log-dir", type=Path, help="keep child logs here (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--probe-s", type=float, default=6.0, help="transport probe on the single picker")
    parser.add_argument(
        "--no-repeat-single",
        dest="repeat_single",
        action="store_false",
        help="measure the single picker once, not again after the replicas (saves one setup; the"
        " second one shows how far the host drifted: `per_replica_vs_single_again`)",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.duration_s = args.duration_s or (30.0 if quick else 90.0)
    args.warmup_s = args.warmup_s or (12.0 if quick else 25.0)
    args.idle_s = args.idle_s or (4.0 if quick else 8.0)
    return args


async def amain(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prompts = make_prompts(4000, args.seed, args.max_tokens)
    variants = {"after": REPO_ROOT}
    if (
        args.compare_repo is not None
        or args.compare_batch_ms is not None
        or args.compare_read_delay_ms is not None
        or args.compare_kv_events is not None
    ):
        before = REPO_ROOT if args.compare_repo is None else args.compare_repo.resolve()
        variants = {"before": before, "after": REPO_ROOT}
    sync_flags = {
        "after": [] if args.batch_ms is None else ["--replica-sync-batch-ms", str(args.batch_ms)],
        "before": []
        if args.compare_batch_ms is None
        else ["--replica-sync-batch-ms", str(args.compare_batch_ms)],
    }
    flags = {
        "after": [] if args.read_delay_ms is None else ["--nats-read-delay-ms", str(args.read_delay_ms)],
        "before": []
        if args.compare_read_delay_ms is None
        else ["--nats-read-delay-ms", str(args.compare_read_delay_ms)],
    }
    kv_events = {"after": args.kv_events, "before": args.compare_kv_events or args.kv_events}
    many_name = f"replicas{args.replicas}"
    nats = start_nats_server(None, jetstream=False, store_dir=tmp / "nats")
    results: dict[str, dict[str, Any]] = {v: {} for v in variants}
    try:
        setups = ["single"] if args.single_only else ["single", many_name]
        if not args.single_only and args.repeat_single:
            setups.append("single_again")  # the host's drift between the first and last setup
        for setup in setups:
            for variant, repo in variants.items():
                name = f"{setup}-{variant}" if len(variants) > 1 else setup
                alone = setup.startswith("single")
                replicas = 1 if alone else args.replicas
                observers = not alone and not args.no_observers
                results[variant][setup] = await run_setup(
                    name,
                    replicas,
                    observers,
                    nats.url,
                    args,
                    tmp,
                    prompts,
                    repo,
                    flags[variant],
                    sync_flags[variant],
                    kv_events[variant],
                )
        if args.decompose and not args.single_only and not args.no_observers:
            share = argparse.Namespace(**{**vars(args), "rate": args.rate / args.replicas})
            results["after"]["single_share"] = await run_setup(
                "single_share",
                1,
                False,
                nats.url,
                share,
                tmp,
                prompts,
                REPO_ROOT,
                flags["after"],
                [],
                args.kv_events,
            )
    finally:
        nats.stop(grace_s=2.0)
    ratios: dict[str, dict[str, float]] = {}
    again: dict[str, dict[str, float]] = {}
    drift: dict[str, float] = {}
    for variant, by_setup in results.items():
        if many_name not in by_setup:  # --single-only: no ratio
            continue
        many = by_setup[many_name]["cpu_s"]
        single = by_setup["single"]["cpu_s"]["r0"]
        ratios[variant] = {f"r{i}": round(many[f"r{i}"] / single, 3) for i in range(args.replicas)}
        if "single_again" in by_setup:
            last = by_setup["single_again"]["cpu_s"]["r0"]
            again[variant] = {f"r{i}": round(many[f"r{i}"] / last, 3) for i in range(args.replicas)}
            drift[variant] = round(last / single, 3)
    out: dict[str, Any] = {}
    if kv_events["after"] == "indexer" and kv_events["before"] != "indexer" and ratios.get("after"):
        out["indexer_vs_events"] = indexer_vs_events(results, many_name, args.replicas)
    if again:
        out["per_replica_vs_single_again"] = again
        out["single_again_vs_single"] = drift
    if "single_share" in results["after"]:
        out["decomposition"] = decompose(results["after"], many_name, args.replicas)
    return {
        **out,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "host": {"loadavg": os.getloadavg(), "cpus": os.cpu_count()},
        "inprocess": inprocess_costs(prompts),
        "setups": results,
        "per_replica_vs_single": ratios,
        "goal": {
            "max_ratio": GOAL,
            # met only against both singles when there are two: one single measured on a bad
            # stretch of a shared host (2026-11-28: 5.5 ms a request, 3.9 in the next run) says met
            "met": {
                v: max(r.values()) <= GOAL and all(x <= GOAL for x in again.get(v, {}).values())
                for v, r in ratios.items()
            },
        },
    }


def indexer_vs_events(results: dict[str, dict[str, Any]], many_name: str, replicas: int) -> dict[str, Any]:
    """Each replica asking the indexer (`after`) against the single picker consuming the KV events
    itself (`before`, and `single_again` where measured), alone and with its share of the indexer."""
    many = results["after"][many_name]
    share = many.get("indexer_cpu_s", 0.0) / replicas
    out: dict[str, Any] = {"indexer_share_cpu_s": round(share, 3)}
    for single_name in ("single", "single_again"):
        if single_name not in results["before"]:
            continue
        single = results["before"][single_name]["cpu_s"]["r0"]
        out[f"vs_{single_name}"] = {
            f"r{i}": round(many["cpu_s"][f"r{i}"] / single, 3) for i in range(replicas)
        }
        out[f"vs_{single_name}_with_indexer_share"] = {
            f"r{i}": round((many["cpu_s"][f"r{i}"] + share) / single, 3) for i in range(replicas)
        }
    return out


def decompose(by_setup: dict[str, Any], many_name: str, replicas: int) -> dict[str, Any]:
    """A replica's CPU per cluster request split into routing its share (the lone picker at rate /
    replicas, less its KV events at the observers' cost per event), the fleet's KV events and other
    replicas' sync (the observers); the single picker's into routing and KV events alike. `gap`: what
    the parts leave unexplained. 0.45x needs 0.55 K + S + (R' - R) / 3 <= 0.117 R (three replicas)."""
    many, single, share = by_setup[many_name], by_setup["single"], by_setup["single_share"]
    att = many["attribution"]
    kv_us = att["kv_event_us"] or 0.0

    def routing_ms(setup: dict[str, Any]) -> float:  # per request it routes, KV events taken out
        requests = max(setup["requests"], 1)
        events = setup["messages"]["r0"].get("nats.event", 0)
        return setup["cpu_ms_per_cluster_request"]["r0"] - events / requests * kv_us / 1e3

    r_single, r_share = routing_ms(single), routing_ms(share)
    replica = statistics.fmean(many["cpu_ms_per_cluster_request"][f"r{i}"] for i in range(replicas))
    k, sync = att["kv_events_ms_per_cluster_request"], att["sync_apply_ms_per_cluster_request"]
    own = r_share / replicas
    return {
        "replica_ms_per_cluster_request": round(replica, 3),
        "own_share_routing_ms": round(own, 3),
        "kv_events_ms": k,
        "sync_apply_ms": sync,
        "gap_ms": round(replica - own - k - sync, 3),
        "single_ms_per_request": single["cpu_ms_per_cluster_request"]["r0"],
        "single_routing_ms": round(r_single, 3),
        "share_routing_ms_per_own_request": round(r_share, 3),
        "condition_for_goal": {
            "lhs_0.55K+S+(R'-R)/n": round((1 - GOAL) * k + sync + (r_share - r_single) / replicas, 3),
            "rhs_(0.45-1/n)R": round((GOAL - 1 / replicas) * r_single, 3),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    try:
        report = asyncio.run(amain(args, tmp))
    finally:
        if args.log_dir is not None:
            shutil.copytree(tmp, args.log_dir, dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
