"""Dynamo 1.0-1.3 workers with a local indexer, heard on their event plane over NATS.

Until 1.4 a Dynamo worker started with `--enable-local-indexer` publishes its KV events on the
component's event plane subject, `namespace.<ns>.component.<component>.kv-events` (1.4 and later:
`...endpoint.<endpoint>.kv-events`), each envelope carrying one RouterEvent rather than an array. The
picker listened on neither that subject nor that shape, so such a fleet was routed on predictions.
The fixtures are the bytes ai-dynamo-runtime 1.0.2's and 1.3.1's own publishers sent
(`fixtures/capture_dynamo_local_indexer.py`, one venv per release; these releases cannot be
installed beside the compat extra's 1.6.1, so the tests replay their bytes on a real nats-server).
1.0.2 names a worker by its Dynamo instance id (the same for both dp ranks' publishers, whatever
`worker_id` they were given) and numbers events from 0; 1.3.1 by `worker_id`, from 1.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import msgpack
import nats
import pytest

from extproc.config import EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.events.counters import EventCounters
from extproc.events.dynamo_plane import component_plane_subject, read_envelope
from extproc.router import RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import Worker
from extproc.runtime.server import start_picker

from .conftest import eventually, matches

FIXTURES = Path(__file__).parent / "fixtures"
RELEASES = ("1.0.2", "1.3.1")
BS = 16
SUBJECT = component_plane_subject("ns1", "backend")


@cache
def manifest(release: str) -> dict[str, Any]:
    document = json.loads((FIXTURES / f"dynamo-local-indexer-{release}" / "manifest.json").read_text())
    assert document["ai-dynamo-runtime"] == release
    return document


def messages(release: str) -> list[bytes]:
    folder = FIXTURES / f"dynamo-local-indexer-{release}"
    return [(folder / m["file"]).read_bytes() for m in manifest(release)["messages"]]


def wire_worker(release: str) -> int:
    (worker,) = {msgpack.unpackb(msgpack.unpackb(m)["payload"])["worker_id"] for m in messages(release)}
    return worker


def h(tokens: range) -> list[int]:
    return compute_block_hashes(list(tokens), BS)


@pytest.mark.parametrize("release", RELEASES)
def test_each_message_is_on_the_component_subject_and_carries_one_router_event(release):
    assert {m["subject"] for m in manifest(release)["messages"]} == {SUBJECT}
    for data in messages(release):
        publisher, events = read_envelope(data, EventCounters())
        assert publisher == msgpack.unpackb(data)["publisher_id"] and len(events) == 1
    ids = [read_envelope(d, EventCounters())[1][0].event_id for d in messages(release)]
    assert ids == ([0, 1, 2, 0] if release == "1.0.2" else [1, 2, 3, 1])
    assert (wire_worker(release) == 7) is (release == "1.3.1")  # 1.0.2: the runtime's instance id


def picker_config(nats_url: str, release: str) -> PickerConfig:
    return PickerConfig(
        router=RouterConfig(block_size=BS, use_kv_events=True),
        workers=(WorkerConfig("w", "127.0.0.1:9", "m", instance_id=wire_worker(release), dp_ranks=(0, 1)),),
        models=(ModelConfig("m"),),
        port=0,
        health_port=0,
        events=EventsConfig(nats_url=nats_url, namespace="ns1", component="backend"),
        kv_events_source=True,
    )


@pytest.mark.parametrize("release", RELEASES)
async def test_a_picker_hears_a_local_indexer_worker_of_each_release(nats_server, release):
    picker = await start_picker(picker_config(nats_server.url, release))
    try:
        subscriber = picker.sources.nats_events
        assert subscriber is not None and SUBJECT in subscriber.subjects
        router = picker.picker.pools["m"].router
        nc = await nats.connect(nats_server.url)
        try:
            for data in messages(release):
                await nc.publish(SUBJECT, data)
            await nc.flush()
        finally:
            await nc.close()
        # stored 0..31, 32..47 under it, removed 32..47; dp 1 stored 0..15
        expected = {Worker("w"): 2, Worker("w", 1): 1}
        await eventually(
            lambda: matches(router, h(range(48))) == expected, what=lambda: matches(router, h(range(48)))
        )
        assert picker.sources.counters["nats.gap"] == 0 and picker.sources.counters["nats.new_publisher"] == 0
    finally:
        await picker.stop(0)
