"""Dynamo 1.6.1's own KV event relay, as a Dynamo vLLM worker runs it beside its engine.

    NATS_SERVER=nats://127.0.0.1:4222 .venv/bin/python benchmarks/dynamo_relay.py \
        --endpoint ns1.backend.generate --block-size 16 \
        --relay 100=tcp://127.0.0.1:5557 --relay 101=tcp://127.0.0.1:5567

One process of ai-dynamo-runtime (the `compat` extra): `DistributedRuntime(loop, "mem", "tcp",
event_plane="nats")` and, per `--relay WORKER_ID=ZMQ_ENDPOINT`, a `KvEventPublisher(...,
zmq_endpoint=...)` that subscribes to an engine's ZMQ KV events (vLLM's PUB socket, here a mock
worker's `--kv-events zmq`) and republishes each batch it hears on Dynamo's event plane
(`namespace.<ns>.component.<c>.endpoint.<e>.kv-events`, msgpack envelopes of RouterEvents). This is
the event stream a picker in front of a Dynamo 1.6.1 deployment consumes; `bench_replicas.py
--kv-events dynamo-relay` uses it. Prints `ready` once every publisher exists; runs until SIGTERM or
SIGINT (stop it by pid).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any


def parse_relay(text: str) -> tuple[int, str]:
    worker_id, sep, endpoint = text.partition("=")
    if not sep or not worker_id.isdigit() or not endpoint:
        raise argparse.ArgumentTypeError(f"expected WORKER_ID=ZMQ_ENDPOINT, got {text!r}")
    return int(worker_id), endpoint


async def main(args: argparse.Namespace) -> None:
    from dynamo._core import DistributedRuntime, KvEventPublisher

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "mem", "tcp", event_plane="nats")
    publishers: list[Any] = [
        KvEventPublisher(
            runtime.endpoint(args.endpoint),
            worker_id=worker_id,
            kv_block_size=args.block_size,
            dp_rank=0,
            zmq_endpoint=zmq_endpoint,
        )
        for worker_id, zmq_endpoint in args.relay
    ]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        for publisher in publishers:
            publisher.shutdown()
        runtime.shutdown()


def cli(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--endpoint", default="dynamo.backend.generate", help="namespace.component.endpoint")
    parser.add_argument("--block-size", type=int, default=16, help="the engines' KV block size")
    parser.add_argument(
        "--relay", type=parse_relay, action="append", required=True, metavar="WORKER_ID=ZMQ_ENDPOINT",
        help="one engine's ZMQ PUB endpoint and the Dynamo worker id it is published under (repeat)",
    )  # fmt: skip
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(cli(sys.argv[1:])))
