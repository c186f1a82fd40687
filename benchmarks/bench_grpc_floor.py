"""What an ext_proc stream costs the picker's process over gRPC alone (no Envoy), by layer.

    .venv/bin/python benchmarks/bench_grpc_floor.py                 # 1k and 8k bodies, about 1 minute
    .venv/bin/python benchmarks/bench_grpc_floor.py --burn-us 170   # the stub also burns 170 us of CPU

Prints ONE JSON object on stdout; progress on stderr. Each setup is a server in a child process
(stopped by its pid) on 127.0.0.1, sent the ext_proc streams `bench_extproc.py` measures in-process
(request headers, a BUFFERED chat body, response headers, response body) from this process over
grpc.aio, `--concurrency` streams at a time:
- `noop`: `benchmarks/noop_picker.py`'s servicer (the floor of any Python ext_proc picker);
- `stub`: `ExtProcService` with a picker that answers a fixed worker at once (the stream handling
  and answers, no decision), or after burning `--burn-us` of CPU;
- `picker`: `ExtProcService` with the real `EndpointPicker` (4 workers, no KV events).
Each runs on every server of `--servers`: `grpcio` (grpc.aio, as `noop_picker.py` and
`serve --ext-proc-server grpcio`) and `h2` (`extproc.runtime.h2_server`, serve's default); a setup
is named `kind@server`. Reported per setup and body: CPU of the server process per stream (all
threads, utime + stime), split by thread name, over `--rounds` rounds (setups alternate within a
round), and each setup's CPU over the no-op's on grpcio (`over_noop_grpcio`).

Why (issue 21): through Envoy the picker's CPU per request is 1.6-1.8x the no-op's at 1k tokens
while its in-process stream costs about 185 us against the no-op's 13 us; this separates what gRPC
adds to the picker's own work from the work itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

import bench_extproc as bx  # noqa: E402  (benchmarks/ is not a package)

from extproc.devstack.procs import ManagedProcess  # noqa: E402
from extproc.runtime.ports_file import write_ports_file  # noqa: E402

SETUPS = ("noop", "stub", "picker")


def log(message: str) -> None:
    print(f"[bench_grpc_floor {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the server (a child process) ------------------------------------------------------------


def serve(kind: str, ports_file: str, burn_us: int, server_kind: str = "grpcio") -> None:
    import grpc
    import noop_picker
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from extproc.epp.service import ExtProcService
    from extproc.picker.pipeline import EndpointPicker, Pick
    from extproc.router.types import Worker

    class StubPicker:
        """Answers one worker at once (after `burn_us` of CPU): the service without a decision."""

        may_queue = False

        async def pick(self, **_: Any) -> Pick:
            if burn_us:
                until = time.thread_time_ns() + burn_us * 1000
                while time.thread_time_ns() < until:
                    pass
            return Pick("r", bx.MODEL, Worker("w0"), "127.0.0.1:8000", {})

        def first_token(self, pick: Pick, *, at_first_token: bool = True) -> None: ...

        def finish(self, pick: Pick, cause: str) -> None: ...

        def answered(self, pick: Pick, status: int) -> None: ...

        def response_stored(self, pick: Pick, response_id: str) -> None: ...

        def rejected(self, status: int, reason: str) -> None: ...

    async def main() -> None:
        config = bx.inprocess_config()
        if kind == "noop":
            servicer: Any = noop_picker.NoopPicker([w.endpoint for w in config.workers])
        elif kind == "stub":
            servicer = ExtProcService(StubPicker(), max_body_bytes=16 << 20)
        else:
            servicer = ExtProcService(EndpointPicker(config), max_body_bytes=16 << 20)
        if server_kind == "h2":
            from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

            from extproc.runtime.h2_server import H2GrpcServer
            from extproc.runtime.server import EXT_PROC_METHOD

            h2 = H2GrpcServer(EXT_PROC_METHOD, servicer.Process, pb.ProcessingRequest.FromString)
            write_ports_file(ports_file, {"port": await h2.start("127.0.0.1", 0)})
            await asyncio.Event().wait()  # until the parent stops this process
        server = grpc.aio.server(options=noop_picker.GRPC_SERVER_OPTIONS)
        pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        write_ports_file(ports_file, {"port": port})
        await server.wait_for_termination()

    asyncio.run(main())


# --- the client (this process) ---------------------------------------------------------------


async def drive(port: int, bodies: list[bytes], count: int, concurrency: int) -> None:
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                call = stub.Process()
                for message in bx._stream_messages(f"s{i}", bodies[i % len(bodies)], bx._BUFFERED):
                    await call.write(message)
                    await call.read()
                await call.done_writing()
                await call.read()  # the end of the stream

        await asyncio.gather(*(client() for _ in range(concurrency)))


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU time (utime + stime) per thread name of process `pid`."""
    ticks_ns = 1e9 / os.sysconf("SC_CLK_TCK")
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0) + int((int(fields[11]) + int(fields[12])) * ticks_ns)
    return out


def measure(setup: str, bodies: list[bytes], args: argparse.Namespace, log_dir: Path) -> dict[str, float]:
    """`setup` is `kind@server` (server: grpcio or h2)."""
    kind, server_kind = setup.split("@")
    ports_file = log_dir / f"{kind}-{server_kind}.ports.json"
    argv = [sys.executable, __file__, "--serve", kind, "--ports-file", str(ports_file)]
    argv += ["--burn-us", str(args.burn_us), "--server", server_kind]
    log_path = log_dir / f"{kind}-{server_kind}.log"
    server = ManagedProcess(argv, log_path=log_path, ports_file=ports_file).start()
    try:
        port = server.ports(30.0)["port"]
        asyncio.run(drive(port, bodies, args.warmup, args.concurrency))
        before = thread_cpu_ns(server.pid)
        asyncio.run(drive(port, bodies, args.streams, args.concurrency))
        after = thread_cpu_ns(server.pid)
    finally:
        server.stop()
    per_thread = {name: (after[name] - before.get(name, 0)) / args.streams / 1e3 for name in after}
    per_thread = {name: round(us, 1) for name, us in per_thread.items() if us >= 0.5}
    return {"total_us": round(sum(per_thread.values()), 1), **per_thread}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=3000, help="measured streams per setup and round")
    parser.add_argument("--warmup", type=int, default=300, help="streams before measuring")
    parser.add_argument("--concurrency", type=int, default=16, help="streams at a time (default 16)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every setup (default 2)")
    parser.add_argument("--bodies", default="1k,8k", help="body sizes: 1k and/or 8k (bench_extproc's)")
    parser.add_argument("--burn-us", type=int, default=0, help="CPU the stub burns per pick (us)")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/bench-grpc-floor"))
    parser.add_argument(
        "--servers",
        default="grpcio,h2",
        help="what serves the stream: grpcio (grpc.aio) and/or h2 (extproc.runtime.h2_server); "
        "ratios are over the no-op servicer on grpcio",
    )
    parser.add_argument("--serve", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--server", choices=("grpcio", "h2"), default="grpcio", help=argparse.SUPPRESS)
    parser.add_argument("--ports-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.ports_file, args.burn_us, args.server)
        return 0
    servers = args.servers.split(",")
    setups = [f"{kind}@{server}" for server in servers for kind in SETUPS]
    if "noop@grpcio" not in setups:
        setups.insert(0, "noop@grpcio")  # the baseline of every ratio
    args.log_dir.mkdir(parents=True, exist_ok=True)
    all_bodies = bx.make_bodies()
    result: dict[str, Any] = {"streams": args.streams, "concurrency": args.concurrency}
    result["burn_us"] = args.burn_us
    for size in args.bodies.split(","):
        runs: dict[str, list[dict[str, float]]] = {setup: [] for setup in setups}
        for round_index in range(args.rounds):
            order = setups if round_index % 2 == 0 else setups[::-1]
            for setup in order:
                log(f"{size} round {round_index + 1}/{args.rounds}: {setup}")
                runs[setup].append(measure(setup, all_bodies[size], args, args.log_dir))
        section: dict[str, Any] = {
            setup: {"cpu_us_per_stream": [r["total_us"] for r in rs], "by_thread_us": rs}
            for setup, rs in runs.items()
        }
        noop = statistics.mean(r["total_us"] for r in runs["noop@grpcio"])
        section["over_noop_grpcio"] = {
            setup: round(statistics.mean(r["total_us"] for r in rs) / noop, 3) for setup, rs in runs.items()
        }
        result[size] = section
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
