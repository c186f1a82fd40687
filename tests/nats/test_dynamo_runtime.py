"""Dynamo 1.6.1's own KvEventPublisher -> a real nats-server -> the picker's event sources -> KvRouter.

Dynamo's runtime (ai-dynamo-runtime 1.6.1, the `compat` extra; missing, the tests fail, they do not
skip) runs in a child process (`tests/nats/dynamo_worker.py`) driven one command at a time and
stopped by pid. The picker's side is what `serve` starts: a config loaded from flags and a config
file as a Dynamo user writes them (`--dynamo-endpoint ns1.backend.generate`), `EndpointPicker`, and
`start_event_sources`. Everything runs on 127.0.0.1; conditions are polled with a deadline.

The ZMQ relay test also cross-checks our vLLM decoder against Dynamo's: Dynamo's relay of our
publisher's vLLM-format stream carries the same events and local hashes as we decode from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import nats
import pytest

from extproc.config import load_config
from extproc.devstack.procs import NatsServer
from extproc.events.counters import EventCounters
from extproc.events.dynamo_json import kv_events_subject
from extproc.events.dynamo_plane import decode_envelope, event_plane_subject
from extproc.events.nats_events import NatsEventPublisher
from extproc.events.sources import EventSources, start_event_sources
from extproc.events.vllm import (
    VllmEventDecoder,
    WireAllBlocksCleared,
    WireBlockRemoved,
    WireBlockStored,
    encode_batch,
)
from extproc.events.zmq_publisher import ZmqEventPublisher
from extproc.picker.pipeline import EndpointPicker
from extproc.router import KvRouter
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import DEVICE_TIER, HOST_PINNED_TIER, BlocksStored, KvEvent, Worker

from .conftest import eventually
from .dynamo_helpers import BS, ENDPOINT, primed

MODEL = "m"
PLANE = event_plane_subject("ns1", "backend", "generate")
W7, W7_DP1, W8, W9 = Worker("w7"), Worker("w7", 1), Worker("w8"), Worker("w9")


CONFIG = """\
workers:
  - {id: w7, endpoint: "127.0.0.1:8001", model: m, instance-id: 7, dp-size: 2}
  - {id: w8, endpoint: "127.0.0.1:8002", model: m, instance-id: 8}
  - {id: w9, endpoint: "127.0.0.1:8003", model: m, instance-id: 9}
"""


@contextlib.asynccontextmanager
async def picker_listening(
    nats_server: NatsServer, tmp_path: Path, dynamo_endpoint: str = ENDPOINT
) -> AsyncIterator[tuple[KvRouter, EventSources]]:
    """The picker's event sources as `serve` starts them, from a user's flags and config file."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "picker.yaml"
    path.write_text(CONFIG)
    argv = ["--config", str(path), "--nats-url", nats_server.url, "--kv-cache-block-size", str(BS)]
    config = load_config([*argv, "--dynamo-endpoint", dynamo_endpoint], environ={})
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker)
    try:
        assert sources.nats_events is not None
        yield picker.pools[MODEL].router, sources
    finally:
        await sources.stop()


def h(tokens: list[int], **salting: str) -> list[int]:
    return compute_block_hashes(tokens, BS, **salting)


def held(router: KvRouter) -> set[tuple[Worker, int]]:
    """Every (worker, local hash) the router's index holds from the engines' events."""
    return {
        (e.worker, b.local_hash)
        for e in router.dump_events()
        if isinstance(e, BlocksStored)
        for b in e.blocks
    }


def overlap(router: KvRouter, hashes: list[int]) -> dict[Worker, int]:
    return {w: n for w, n in router.indexer.find_matches(hashes).items() if n}


async def test_dynamos_own_publisher_feeds_the_index_stores_lora_salt_removals_dp_ranks(
    nats_server, dynamo, tmp_path
):
    async with picker_listening(nats_server, tmp_path) as (router, sources):
        subscriber = sources.nats_events
        assert subscriber is not None and subscriber.event_plane_subject == PLANE
        await primed(dynamo, sources)
        await dynamo.publisher("w7", 7)
        await dynamo.publisher("w7dp1", 7, dp_rank=1)
        await dynamo.publisher("w8", 8)

        a = list(range(64))  # four blocks over three events, each under its parent
        ha = h(a)
        await dynamo.stored("w7", a[:32], [11, 12])
        await dynamo.stored("w7", a[32:48], [13], parent=12)
        await dynamo.stored("w7", a[48:], [14], parent=13)
        await dynamo.stored("w7dp1", a[:32], [-21, -22])  # Dynamo takes signed ids and sends them unsigned
        await eventually(
            lambda: overlap(router, ha) == {W7: 4, W7_DP1: 2}, what=lambda: str(overlap(router, ha))
        )
        decision = router.best_worker(a)
        assert (decision.worker, decision.overlap_blocks) == (W7, 4)

        b = list(range(1000, 1032))
        await dynamo.stored("w8", b, [31, 32], lora_name="my-lora")
        c = list(range(5000, 5032))
        assert h(c[:16], namespace="salt-A") == [7339200549687331636]  # REFERENCE section 4's vector
        await dynamo.stored("w8", c, [41, 42], cache_salt="salt-A")
        await dynamo.stored("w7", c, [51, 52])
        await eventually(lambda: overlap(router, h(c)) == {W7: 2}, what="the unsalted copy on w7")
        await eventually(lambda: overlap(router, h(c, namespace="salt-A")) == {W8: 2}, what="the salted one")
        assert overlap(router, h(b, lora_name="my-lora")) == {W8: 2}
        assert overlap(router, h(b)) == {}  # a request without the adapter does not match its blocks
        assert router.best_worker(b, lora_name="my-lora").overlap_blocks == 2
        salted = router.best_worker(c, cache_salt="salt-A")
        assert (salted.worker, salted.overlap_blocks) == (W8, 2)
        assert router.best_worker(c).overlap_blocks == 2 and router.best_worker(c).worker == W7

        await dynamo.call("removed", name="w7", block_hashes=[14, 13])
        await dynamo.call("removed", name="w7dp1", block_hashes=[-22])
        await eventually(lambda: overlap(router, ha) == {W7: 2, W7_DP1: 1}, what="removals applied")
        assert held(router) == {
            *((W7, x) for x in ha[:2]),
            (W7_DP1, ha[0]),
            *((W8, x) for x in h(b, lora_name="my-lora")),
            *((W8, x) for x in h(c, namespace="salt-A")),
            *((W7, x) for x in h(c)),
        }
        assert subscriber.gaps == 0
        assert sources.counters["dynamo.malformed"] == 0 and sources.feed.state(W7) == "event-fed"


async def test_a_publisher_restart_is_told_by_its_new_publisher_id_and_forgets_the_old_blocks(
    nats_server, dynamo, tmp_path
):
    async with picker_listening(nats_server, tmp_path) as (router, sources):
        subscriber = sources.nats_events
        assert subscriber is not None
        gaps: list[tuple[Worker, int, int]] = []
        subscriber.on_gap = lambda *gap: gaps.append(gap)
        await primed(dynamo, sources)
        await dynamo.publisher("w8", 8)
        await dynamo.stored("w8", list(range(16)), [1])  # event 1
        await dynamo.stored("w8", list(range(16, 32)), [2], parent=1)  # event 2
        await eventually(lambda: overlap(router, h(list(range(32)))) == {W8: 2})
        await dynamo.call("shutdown", name="w8")
        await dynamo.publisher("w8", 8)  # a new publisher id; its events are numbered from 1 again
        await dynamo.stored("w8", list(range(100, 116)), [3])
        await eventually(lambda: overlap(router, h(list(range(100, 116)))) == {W8: 1})
        assert overlap(router, h(list(range(32)))) == {}  # the restarted engine's cache is empty
        assert sources.counters["nats.new_publisher"] == 1
        assert gaps == [] and subscriber.gaps == 0  # told by the publisher id, not by the event ids


async def test_the_json_subject_keeps_working_beside_the_event_plane(nats_server, dynamo, tmp_path):
    async with picker_listening(nats_server, tmp_path) as (router, sources):
        await primed(dynamo, sources)
        nc = await nats.connect(nats_server.url)
        json_publisher = NatsEventPublisher(nc, kv_events_subject("ns1", "backend"), 9)
        try:
            await dynamo.publisher("w8", 8)
            await dynamo.stored("w8", list(range(32)), [1, 2])
            tokens = list(range(200, 216))
            for _ in range(100):  # the JSON path on its own connection: primed by its own events
                json_publisher.on_stored(None, [7], [tokens])
                await json_publisher.flush()
                with contextlib.suppress(pytest.fail.Exception):
                    await eventually(lambda: overlap(router, h(tokens)) == {W9: 1}, 0.1)
                    break
            await eventually(lambda: overlap(router, h(list(range(32)))) == {W8: 2})
            assert overlap(router, h(tokens)) == {W9: 1}
        finally:
            await json_publisher.stop()
            await nc.close()


async def test_only_the_configured_endpoint_is_heard_unless_it_is_a_wildcard(nats_server, dynamo, tmp_path):
    await dynamo.call("publisher", name="other", endpoint="ns1.backend.other", worker_id=9, block_size=BS)
    await dynamo.publisher("w8", 8)
    other, mine = list(range(300, 316)), list(range(400, 416))
    async with picker_listening(nats_server, tmp_path / "one") as (router, sources):
        await primed(dynamo, sources)
        await dynamo.stored("other", other, [1])
        await dynamo.stored("w8", mine, [2])
        await eventually(lambda: overlap(router, h(mine)) == {W8: 1})
        assert overlap(router, h(other)) == {}  # no subscription covers ns1.backend.other
    async with picker_listening(nats_server, tmp_path / "all", "ns1.backend.*") as (router, sources):
        assert sources.nats_events is not None
        assert (
            sources.nats_events.event_plane_subject == "namespace.ns1.component.backend.endpoint.*.kv-events"
        )
        await primed(dynamo, sources)
        await dynamo.stored("other", other, [3])
        await eventually(lambda: overlap(router, h(other)) == {W9: 1}, what="the other endpoint heard")


# --- Dynamo's ZMQ relay of our vLLM-format publisher ---------------------------------------------


async def test_dynamos_relay_of_our_vllm_stream_matches_our_own_decoding(nats_server, dynamo, tmp_path):
    """Dynamo re-hashes the vLLM events it relays; its tokens_hash must be our local hash for each
    block, and its events the ones our vLLM decoder makes of the same batch. Cleared and other
    tiers, which Dynamo's Python API cannot send, arrive this way too."""
    zmq_pub = ZmqEventPublisher(port=0, replay_port=None, layout="array")
    await zmq_pub.start()
    raw: list[bytes] = []
    nc = await nats.connect(nats_server.url)

    async def keep(msg: Any) -> None:
        raw.append(msg.data)

    await nc.subscribe(PLANE, cb=keep)
    await nc.flush()
    try:
        async with picker_listening(nats_server, tmp_path) as (router, sources):
            subscriber = sources.nats_events
            assert subscriber is not None
            await dynamo.publisher("relay", 8, zmq_endpoint=zmq_pub.endpoint)
            # the relay's SUB joins our PUB in its own time: harmless removals until one comes through
            for _ in range(200):
                zmq_pub.publish([WireBlockRemoved([0])])
                with contextlib.suppress(pytest.fail.Exception):
                    await eventually(lambda: subscriber.event_ids.knows(W8) and raw, 0.05)
                    break
            else:
                pytest.fail(f"Dynamo's relay never relayed our ZMQ publisher\n{dynamo.log_tail()}")

            async def relayed(payload: bytes) -> list[KvEvent | None]:
                """Publish one batch; the events Dynamo relays for it (None: an unknown tier or domain)."""
                barrier = 10**9 + len(raw)
                seen = len(raw)
                zmq_pub.publish_payload(payload)
                zmq_pub.publish([WireBlockRemoved([barrier])])  # what follows proves the batch is through
                await eventually(lambda: any(_removes(m, barrier) for m in raw[seen:]), what="relayed")
                messages = [m for m in raw[seen:] if not _removes(m, barrier)]
                return [e.event for m in messages for e in decode_envelope(m, EventCounters())]

            async def cross_check(events: list) -> list[KvEvent | None]:
                payload = _batch(events)
                ours = VllmEventDecoder("8", BS, counters=EventCounters()).decode(payload).events
                theirs = await relayed(payload)
                assert [_no_id(e) for e in theirs if e is not None] == [_no_id(e) for e in ours]
                return theirs

            lora = list(range(5000, 5032))
            first = await cross_check(
                [
                    WireBlockStored([-1, 2], None, list(range(32)), BS),  # a signed id, as SGLang sends
                    WireBlockStored([3], 2, list(range(32, 48)), BS, medium="CPU"),  # host_pinned
                    WireBlockStored([4, 5], None, lora, BS, lora_id=1, lora_name="my-lora"),
                    WireBlockStored([6, 7], None, list(range(600, 620)), BS),  # a partial second block
                ]
            )
            assert [e and e.tier for e in first] == ["device", "host_pinned", "device", "device"]
            await eventually(lambda: overlap(router, h(list(range(32)))) == {W8: 2})
            assert overlap(router, h(lora, lora_name="my-lora")) == {W8: 2}
            assert overlap(router, h([*range(32), *range(32, 48)])) == {
                W8: 2
            }  # the CPU copy is not GPU cache: the host tier continues the device prefix (issue 23)
            prompt = h([*range(32), *range(32, 48)])
            assert router.tiers.match(router.indexer, prompt, router.find_matches(prompt)).blocks(W8) == {
                DEVICE_TIER: 2,
                HOST_PINNED_TIER: 1,
            }
            assert overlap(router, h(list(range(600, 620)))) == {W8: 1}

            await cross_check([WireBlockRemoved([2]), WireBlockRemoved([3], medium="CPU")])
            await eventually(lambda: overlap(router, h(list(range(32)))) == {W8: 1})

            # SGLang's map events name a cache salt; Dynamo hashes it as our cache namespace
            salted = await relayed(
                _batch([{**_map_stored([8], list(range(5000, 5016))), "cache_salt": "salt-A"}])
            )
            assert [(b.engine_hash, b.local_hash) for b in salted[0].blocks] == [(8, 7339200549687331636)]
            # Dynamo 1.6.1's relay ignores vLLM's extra_keys (where vLLM puts the salt): unsalted hash
            extra = await relayed(_batch([{**_map_stored([9], list(range(16))), "extra_keys": [["salt-A"]]}]))
            assert [b.local_hash for b in extra[0].blocks] == h(list(range(16)))
            # a map-layout batch (vLLM previews) is not decoded by Dynamo 1.6.1: nothing relayed, no id used
            assert (
                await relayed(msgpack.packb({"ts": 0.0, "events": [_map_stored([10], list(range(16)))]}))
                == []
            )

            await cross_check([WireAllBlocksCleared()])
            await eventually(lambda: all(w != W8 for w, _ in held(router)), what="cleared")
            assert subscriber.gaps == 0  # other tiers and skipped batches used no id or kept the chain
            assert sources.counters["dynamo.other_tier"] == 2
    finally:
        await nc.close()
        await zmq_pub.stop()


def _batch(events: list) -> bytes:
    """A vLLM batch `[ts, events, dp_rank]` (what vLLM and SGLang send): our wire dataclasses in the
    array layout Dynamo 1.6.1 decodes, or raw map events as vLLM 0.33 and SGLang write them."""
    if all(isinstance(e, dict) for e in events):
        return msgpack.packb([0.0, events, 0])
    return encode_batch(events, ts=0.0, dp_rank=0, layout="array")


def _map_stored(hashes: list[int], tokens: list[int]) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": tokens,
            "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None}  # fmt: skip


def _removes(message: bytes, block_hash: int) -> bool:
    return any(
        getattr(e.event, "engine_hashes", None) == (block_hash,)
        for e in decode_envelope(message, EventCounters())
    )


def _no_id(event: KvEvent) -> KvEvent:
    return dataclasses.replace(event, event_id=None)
