"""Durable mode's KV snapshot at fleet scale: its size, and what reading it costs a starting replica.

A real nats-server (JetStream, a temporary store, a free loopback port, stopped by pid). For each
`--entries` (worker, block) entries: 16 workers' trees of 64-block chains with random 64-bit hashes
are encoded as a snapshot (`encode_snapshot`) and written with nats.py's `ObjectStore.put`, as
`DurableKvEvents.snapshot_now` does. Then, per round, alternating which goes first:

- `nats_get_s`: nats.py's `ObjectStore.get` (what `load_snapshot` used until 2026-11-28);
- `read_object_s`: `extproc.events.object_read.read_object` (what it uses now);
- `decode_s`: `decode_snapshot` of the bytes;
- `replica_start_s`: a new replica's `DurableKvEvents.start`: read, decode, and apply into a router;
- `start_longest_turn_s`: the longest the event loop went without a turn for another task meanwhile
  (what routing on that loop would wait);
- `dump_s`: that router's `dump_events` in one go (`snapshot_now` dumps it in slices, one per loop
  turn, since 2026-11-28);
- `encode_s`: `encode_snapshot` of the dump;
- `write_s`: that replica's `snapshot_now` (dump, encode, write to the object store, purge), and
  `write_longest_turn_s`, the longest the event loop went without a turn for another task meanwhile
  (what routing on the replica that snapshots would wait).

Reported per size: the lowest of `--rounds` rounds and `get_vs_read` (nats_get_s / read_object_s,
from the same round). Prints one JSON object; progress on stderr.

    .venv/bin/python benchmarks/bench_snapshot.py --quick      # 2^18 and 2^20 entries, about 30 s
    .venv/bin/python benchmarks/bench_snapshot.py              # up to 2^22 entries, about 3 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import nats  # noqa: E402

from extproc.devstack.procs import reserve_port, start_nats_server  # noqa: E402
from extproc.events.counters import EventCounters  # noqa: E402
from extproc.events.durable import SNAPSHOT_OBJECT, DurableConfig, DurableKvEvents  # noqa: E402
from extproc.events.feed import RouterFeed  # noqa: E402
from extproc.events.object_read import read_object  # noqa: E402
from extproc.events.snapshot import Snapshot, decode_snapshot, encode_snapshot  # noqa: E402
from extproc.router import KvRouter, RouterConfig, WorkerSpec  # noqa: E402
from extproc.router.types import BlocksStored, StoredBlock, Worker  # noqa: E402

WORKERS = 16
CHAIN = 64


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def snapshot_of(entries: int, seed: int = 0) -> Snapshot:
    rng = random.Random(seed)
    events = []
    chains = max(1, entries // (WORKERS * CHAIN))
    for w in range(WORKERS):
        worker = Worker(str(w), 0)
        for _ in range(chains):
            blocks = tuple(StoredBlock(rng.getrandbits(64), rng.getrandbits(64)) for _ in range(CHAIN))
            events.append(BlocksStored(worker, blocks))
    return Snapshot(tuple(events), stream_seq=1, created_by="bench", created_at_s=time.time())


async def _longest_turn(gaps: list[float]) -> None:
    """Keeps in gaps[0] the longest wait between two of its turns: what routing on this loop waits."""
    last = time.perf_counter()
    while True:
        await asyncio.sleep(0)
        now = time.perf_counter()
        gaps[0] = max(gaps[0], now - last)
        last = now


def new_router() -> KvRouter:
    return KvRouter(
        RouterConfig(block_size=16, use_kv_events=True),
        clock=time.monotonic,
        workers=[WorkerSpec(str(w)) for w in range(WORKERS)],
    )


async def one_size(url: str, entries: int, rounds: int, namespace: str) -> dict[str, Any]:
    config = DurableConfig(namespace, "backend", "bench", snapshot_read_timeout_s=120)
    snapshot = snapshot_of(entries)
    held = sum(len(e.blocks) for e in snapshot.events)  # whole chains: entries rounded down
    data = encode_snapshot(snapshot)
    nc = await nats.connect(url)
    try:
        writer = DurableKvEvents(nc, RouterFeed({}, EventCounters()), new_router(), config)
        await writer._prepare()  # the stream and buckets, as a replica's start makes them
        js = nc.jetstream()
        store = await js.object_store(config.snapshot_bucket)
        started = time.perf_counter()
        await store.put(SNAPSHOT_OBJECT, data)
        put_s = time.perf_counter() - started
        per_round: list[dict[str, float]] = []

        async def nats_get() -> float:
            started = time.perf_counter()
            got = (await store.get(SNAPSHOT_OBJECT)).data
            elapsed = time.perf_counter() - started
            assert got == data
            return elapsed

        async def ours() -> float:
            started = time.perf_counter()
            got = await read_object(js, store, config.snapshot_bucket, SNAPSHOT_OBJECT, chunk_timeout_s=120)
            elapsed = time.perf_counter() - started
            assert got == data
            return elapsed

        for r in range(rounds):
            timings: dict[str, float] = {}
            steps = {"nats_get_s": nats_get, "read_object_s": ours}
            for key in steps if r % 2 == 0 else reversed(steps):
                timings[key] = await steps[key]()
            started = time.perf_counter()
            decode_snapshot(data)
            timings["decode_s"] = time.perf_counter() - started
            router = new_router()
            replica = DurableKvEvents(
                nc,
                RouterFeed({w.worker_id: router for w in router.workers()}, EventCounters()),
                router,
                config,
            )
            gaps = [0.0]
            ticker = asyncio.ensure_future(_longest_turn(gaps))
            started = time.perf_counter()
            await replica.start()
            timings["replica_start_s"] = time.perf_counter() - started
            ticker.cancel()
            timings["start_longest_turn_s"] = gaps[0]
            await replica.stop()
            gaps = [0.0]
            ticker = asyncio.ensure_future(_longest_turn(gaps))
            started = time.perf_counter()
            assert await replica.snapshot_now()
            timings["write_s"] = time.perf_counter() - started
            ticker.cancel()
            timings["write_longest_turn_s"] = gaps[0]
            await store.put(SNAPSHOT_OBJECT, data)  # the next round reads the same bytes
            started = time.perf_counter()
            dumped = Snapshot(tuple(router.dump_events()), 1)
            timings["dump_s"] = time.perf_counter() - started
            started = time.perf_counter()
            encode_snapshot(dumped)
            timings["encode_s"] = time.perf_counter() - started
            per_round.append(timings)
            log(
                f"  {entries} entries, round {r + 1}: "
                + ", ".join(f"{k} {v:.2f}" for k, v in timings.items())
            )
        best = {key: min(t[key] for t in per_round) for key in per_round[0]}
        return {
            "entries": held,
            "bytes": len(data),
            "bytes_per_entry": round(len(data) / held, 2),
            "put_s": round(put_s, 3),
            **{key: round(value, 3) for key, value in best.items()},
            "get_vs_read": [round(t["nats_get_s"] / t["read_object_s"], 2) for t in per_round],
        }
    finally:
        await nc.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [1 << 18, 1 << 20] if args.quick else [int(x) for x in args.entries.split(",")]
    rows = []
    with reserve_port() as port, tempfile.TemporaryDirectory() as tmp:
        server = start_nats_server(port.port, store_dir=Path(tmp) / "jetstream")
        try:
            for i, entries in enumerate(sizes):
                log(f"{entries} (worker, block) entries")
                rows.append(await one_size(server.url, entries, args.rounds, f"bench{i}"))
        finally:
            server.stop(grace_s=2.0)
    return {"benchmark": "bench_snapshot", "rounds": args.rounds, "workers": WORKERS, "sizes": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2^18 and 2^20 entries only")
    parser.add_argument(
        "--entries",
        default=f"{1 << 18},{1 << 20},{1 << 22}",
        help="comma-separated (worker, block) entry counts",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds per size (the lowest is reported)")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
