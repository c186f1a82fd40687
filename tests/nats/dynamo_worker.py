"""Dynamo's own KV event publisher in a child process, driven one command line at a time (tests).

    python -m tests.nats.dynamo_worker        # NATS_SERVER names the nats-server

Runs `dynamo._core.DistributedRuntime(loop, "mem", "tcp", event_plane="nats")` (ai-dynamo-runtime, the
`compat` extra) and any number of `KvEventPublisher`s. DYNAMO_WORKER_DISCOVERY=file selects Dynamo's
file discovery instead (its store at DYN_FILE_KV), where a publisher with `enable_local_indexer`
advertises the query endpoint of its local indexer, which this process serves (on its TCP request plane,
DYN_TCP_RPC_HOST) for as long as it runs. DYNAMO_WORKER_EVENT_PLANE=zmq selects Dynamo's ZMQ event
plane: each publisher binds its own PUB socket and advertises it in the discovery (at
DYN_EVENT_PLANE_HOST), or connects to the brokers of DYN_ZMQ_BROKER_URL. Each stdin line is a JSON
command; each gets one JSON answer line on stdout, `{"ok": true}` or `{"ok": false, "error": "..."}`
(Dynamo logs to stderr). The runtime's threads stay out of the test process; the test stops this one by
pid.

    {"op": "publisher", "name": "w7", "endpoint": "ns1.backend.generate", "worker_id": 7,
     "block_size": 16, "dp_rank": 0, "zmq_endpoint": null, "enable_local_indexer": false}
    {"op": "stored", "name": "w7", "token_ids": [...], "num_block_tokens": [16, ...],
     "block_hashes": [...], "parent_hash": null, "lora_name": null, "cache_salt": null}
    {"op": "removed", "name": "w7", "block_hashes": [...]}
    {"op": "batch", "name": "w7", "events": [{"type": "stored", ...}, {"type": "removed", ...}]}
    {"op": "shutdown", "name": "w7"}       # that publisher only (a later one may take its name)
    {"op": "exit"}
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any


async def main() -> None:
    from dynamo._core import DistributedRuntime, KvEventPublisher

    loop = asyncio.get_running_loop()
    discovery = os.environ.get("DYNAMO_WORKER_DISCOVERY", "mem")
    plane = os.environ.get("DYNAMO_WORKER_EVENT_PLANE", "nats")
    runtime = DistributedRuntime(loop, discovery, "tcp", event_plane=plane)
    publishers: dict[str, Any] = {}

    def run(command: dict[str, Any]) -> None:
        op = command["op"]
        if op == "publisher":
            publishers[command["name"]] = KvEventPublisher(
                runtime.endpoint(command["endpoint"]),
                worker_id=command["worker_id"],
                kv_block_size=command["block_size"],
                dp_rank=command.get("dp_rank", 0),
                enable_local_indexer=command.get("enable_local_indexer", False),
                zmq_endpoint=command.get("zmq_endpoint"),
            )
        elif op == "stored":
            publishers[command["name"]].publish_stored(
                command["token_ids"],
                command["num_block_tokens"],
                command["block_hashes"],
                command.get("parent_hash"),
                lora_name=command.get("lora_name"),
                cache_salt=command.get("cache_salt"),
            )
        elif op == "removed":
            publishers[command["name"]].publish_removed(command["block_hashes"])
        elif op == "batch":
            publishers[command["name"]].publish_batch(command["events"])
        elif op == "shutdown":
            publishers.pop(command["name"]).shutdown()
        else:
            raise ValueError(f"unknown op {op!r}")

    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            command = json.loads(line)
            if command.get("op") == "exit":
                print(json.dumps({"ok": True}), flush=True)
                return
            try:
                run(command)
                answer: dict[str, Any] = {"ok": True}
            except Exception as exc:
                answer = {"ok": False, "error": repr(exc)}
            print(json.dumps(answer), flush=True)
    finally:
        for publisher in publishers.values():
            publisher.shutdown()
        runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
