"""Local-indexer recovery (issue 23): rebuilding a Dynamo worker from its local indexer beside hearing
the same blocks as live events, one run, side by side.

Dynamo 1.6.1's runtime runs in this process (ai-dynamo-runtime, the `compat` extra) with its file
discovery in a temporary directory and a nats-server on loopback; one `KvEventPublisher` with
`enable_local_indexer=True` stores `--blocks` blocks in chains of `--chain` (one event per chain). The
event-plane messages it sends are captured. Then, each into a fresh router:

  live      the captured messages applied as the picker's NATS subscriber applies them
            (`NatsEventSubscriber.handle_event_plane`)
  recovery  `LocalIndexerRecovery`: the tree dump asked over Dynamo's request plane, decoded, applied

    .venv/bin/python benchmarks/bench_local_indexer.py                  # 65,536 blocks, chains of 64
    .venv/bin/python benchmarks/bench_local_indexer.py --blocks 16384 --chain 16

Prints one JSON object: seconds for each, blocks indexed by each (they must agree), and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    _path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if _path not in sys.path:
        sys.path.insert(0, _path)

import nats

from extproc.devstack.procs import start_nats_server
from extproc.events.counters import EventCounters
from extproc.events.dynamo_plane import decode_envelope, event_plane_subject
from extproc.events.dynamo_recovery import LocalIndexerRecovery, read_file_sources
from extproc.events.feed import RouterFeed
from extproc.events.nats_events import NatsEventSubscriber, NatsLink
from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.types import BlocksStored

BS = 16


def fresh() -> tuple[KvRouter, RouterFeed]:
    router = KvRouter(
        RouterConfig(block_size=BS, use_kv_events=True), workers=[WorkerSpec("8")], clock=time.monotonic
    )
    return router, RouterFeed({"8": router}, EventCounters())


def indexed(router: KvRouter) -> int:
    return sum(len(e.blocks) for e in router.dump_events() if isinstance(e, BlocksStored))


async def run(blocks: int, chain: int, root: Path) -> dict[str, Any]:
    server = start_nats_server(None, store_dir=root / "nats", jetstream=False)
    try:
        return await measure(blocks, chain, root, server.url)
    finally:
        server.stop()


async def measure(blocks: int, chain: int, root: Path, nats_url: str) -> dict[str, Any]:
    os.environ.update(NATS_SERVER=nats_url, DYN_FILE_KV=str(root / "store"), DYN_TCP_RPC_HOST="127.0.0.1")
    from dynamo._core import DistributedRuntime, KvEventPublisher

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="nats")
    nc = await nats.connect(nats_url)
    captured: list[bytes] = []

    async def keep(msg: Any) -> None:
        captured.append(msg.data)

    await nc.subscribe(event_plane_subject("ns1", "backend"), cb=keep)
    await nc.flush()
    publisher = KvEventPublisher(
        runtime.endpoint("ns1.backend.generate"), worker_id=8, kv_block_size=BS, enable_local_indexer=True
    )
    try:
        while not captured:  # nats-server may drop what follows a new subscription at once: prime it
            publisher.publish_removed([0])
            await asyncio.sleep(0.05)
        captured.clear()
        events = blocks // chain
        for c in range(events):
            tokens = list(range(c * chain * BS, (c + 1) * chain * BS))
            publisher.publish_stored(
                tokens, [BS] * chain, list(range(c * chain + 1, (c + 1) * chain + 1)), None
            )
        heard, deadline = 0, time.monotonic() + 60
        while heard < events:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {heard} of {events} events heard on the event plane")
            await asyncio.sleep(0.1)
            heard = sum(len(decode_envelope(m, EventCounters())) for m in list(captured))
        targets = read_file_sources(str(root / "store"), "ns1", "backend", "generate")

        live_router, live_feed = fresh()
        link = NatsLink(EventCounters())
        subscriber = NatsEventSubscriber(link, live_feed, None, event_plane_subject="unused")
        t0 = time.perf_counter()
        for message in captured:
            subscriber.handle_event_plane(message)
        live_s = time.perf_counter() - t0

        recovered_router, recovered_feed = fresh()
        recovery = LocalIndexerRecovery(recovered_feed, lambda: targets)
        t0 = time.perf_counter()
        await recovery.start()
        await recovery.wait_idle()
        recovery_s = time.perf_counter() - t0
        return {
            "blocks": blocks,
            "chain": chain,
            "events": events,
            "live_s": round(live_s, 4),
            "recovery_s": round(recovery_s, 4),
            "recovery_over_live": round(recovery_s / live_s, 3),
            "indexed_live": indexed(live_router),
            "indexed_recovery": indexed(recovered_router),
        }
    finally:
        publisher.shutdown()
        await nc.close()
        runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=65536)
    parser.add_argument("--chain", type=int, default=64, help="blocks per stored event (one chain each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-local-indexer-") as root:
        print(json.dumps(asyncio.run(run(args.blocks, args.chain, Path(root)))))


if __name__ == "__main__":
    main()
