"""Dynamo 1.0-1.3 workers in JetStream mode: what their own KvEventPublisher put in JetStream.

Until 1.4 a Dynamo worker without `--enable-local-indexer` published its KV events durably (the router
guide's "JetStream mode (default)"): into a stream it creates itself, `namespace-<ns>-component-
<component>-kv-events`, on `<stream>.kv-events`, one Dynamo JSON RouterEvent per message. Neither of the
subjects the picker listened on, so such a fleet's events never reached it. The fixtures are the bytes
ai-dynamo-runtime 1.0.2, 1.2.1 and 1.3.1 published and the stream each created
(`fixtures/capture_dynamo_jetstream.py`, one venv per release):

- each message decodes to exactly the events its call asked for (1.0 numbers events from 0 and names
  no tier; 1.0 and 1.2 name the worker by its Dynamo instance id, 1.3 by the publisher's `worker_id`);
- on a real nats-server the stream is created as the worker created it (its own request, verbatim)
  and the messages published into it: a picker hears them live, and a durable picker
  (`--router-durable-kv-events`) consumes them through its own stream, which sources Dynamo's
  whether the workers or the picker came first, and a replica started later rebuilds from it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import nats
import pytest

from extproc.config import EventsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.events.counters import EventCounters
from extproc.events.dynamo_json import decode_event, jetstream_stream, jetstream_subject
from extproc.router import RouterConfig
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored, KvEvent, StoredBlock, Worker
from extproc.runtime.server import RunningPicker, start_picker

from .conftest import eventually, matches

FIXTURES = Path(__file__).parent / "fixtures" / "dynamo-jetstream"
RELEASES = ("1.0.2", "1.2.1", "1.3.1")
BS = 16
U64 = 1 << 64
NAMESPACE, COMPONENT = "ns1", "backend"
STREAM = jetstream_stream(NAMESPACE, COMPONENT)


def h(tokens: range, **salting: str) -> list[int]:
    return compute_block_hashes(list(tokens), BS, **salting)


ROOT, LORA, RELAYED = (
    h(range(32)),
    h(range(5000, 5016), lora_name="my-lora"),
    h(range(7000, 7032), lora_name="my-lora"),
)
DIRECT = ("stored-root", "stored-child", "stored-lora", "stored-signed-hashes", "removed", "stored-dp1")


@cache
def manifest(release: str) -> dict[str, Any]:
    return json.loads((FIXTURES / release / "manifest.json").read_text())


def message(release: str, name: str) -> tuple[dict[str, Any], bytes]:
    (entry,) = [m for m in manifest(release)["messages"] if m["file"] == f"{name}.json"]
    return entry, (FIXTURES / release / entry["file"]).read_bytes()


def expected(release: str, name: str) -> KvEvent:
    """The event `name`'s call asked for, as the router must get it (ids as the release numbered them)."""
    entry, data = message(release, name)
    event = json.loads(data)["event"]
    w = Worker(str(entry["worker_id"]), event["dp_rank"])
    eid = event["event_id"]

    def stored(blocks: list[tuple[int, int]], parent: int | None = None) -> BlocksStored:
        return BlocksStored(w, tuple(StoredBlock(e, local) for e, local in blocks), parent, eid)

    return {
        "stored-root": lambda: stored([(101, ROOT[0]), (102, ROOT[1])]),
        "stored-child": lambda: stored([(103, h(range(48))[2])], parent=102),
        "stored-lora": lambda: stored([(201, LORA[0])]),
        "stored-signed-hashes": lambda: stored([(U64 - 5, ROOT[0]), (1 << 63, ROOT[1])]),
        "removed": lambda: BlocksRemoved(w, (103, 102), eid),
        "stored-dp1": lambda: stored([(111, ROOT[0])]),
        "relay-stored-lora": lambda: stored([(901, RELAYED[0]), (902, RELAYED[1])]),
        "relay-removed": lambda: BlocksRemoved(w, (902,), eid),
        "relay-cleared": lambda: AllBlocksCleared(w, eid),
    }[name]()


def test_each_release_created_dynamos_stream_and_published_on_its_subject():
    for release in RELEASES:
        m = manifest(release)
        assert (m["ai-dynamo-runtime"], m["stream"]) == (release, STREAM)
        created = json.loads((FIXTURES / release / m["stream_create"]).read_text())
        assert (created["name"], created["subjects"]) == (STREAM, [jetstream_subject(NAMESPACE, COMPONENT)])
        assert {e["subject"] for e in m["messages"]} == {f"{STREAM}.kv-events"}
    assert STREAM == "namespace-ns1-component-backend-kv-events"
    assert jetstream_stream("my_ns", "VllmWorker-x") == "namespace-my-ns-component-vllmworker-x-kv-events"
    # what differs between releases: the worker id (instance id before 1.3), the first event id
    ids = {r: {e["worker_id"] for e in manifest(r)["messages"]} for r in RELEASES}
    assert ids["1.3.1"] == {7, 9} and all(len(ids[r]) == 1 and ids[r] != {7} for r in ("1.0.2", "1.2.1"))
    first = {r: json.loads(message(r, "stored-root")[1])["event"]["event_id"] for r in RELEASES}
    assert first == {"1.0.2": 0, "1.2.1": 1, "1.3.1": 1}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", [*DIRECT, "relay-stored-lora", "relay-removed", "relay-cleared"])
def test_each_golden_message_decodes_to_the_event_its_call_asked_for(release, name):
    counters = EventCounters()
    decoded = decode_event(message(release, name)[1], counters)
    assert decoded is not None
    _, event_id, event = decoded
    assert event == expected(release, name) and event_id == event.event_id
    assert counters.snapshot() == {"dynamo.event": 1}


# --- on a real nats-server ---------------------------------------------------------------------


def picker_config(nats_url: str, release: str, **events: Any) -> PickerConfig:
    """A picker of the captured worker (its wire id as `instance-id`), on Dynamo's ns1/backend."""
    (wire_id,) = {
        e["worker_id"] for e in manifest(release)["messages"] if e["file"] in {f"{n}.json" for n in DIRECT}
    }
    return PickerConfig(
        router=RouterConfig(block_size=BS, use_kv_events=True),
        workers=(WorkerConfig("w", "127.0.0.1:9", "m", instance_id=wire_id, dp_ranks=(0, 1)),),
        models=(ModelConfig("m"),),
        port=0,
        health_port=0,
        events=EventsConfig(nats_url=nats_url, namespace=NAMESPACE, component=COMPONENT, **events),
        kv_events_source=True,
    )


async def as_the_worker_publishes(nats_url: str, release: str, *, create: bool = True) -> None:
    """Dynamo's stream created with the worker's own request (verbatim), then its direct calls'
    messages published into it in order, each acknowledged by the stream."""
    nc = await nats.connect(nats_url)
    try:
        if create:
            request = (FIXTURES / release / manifest(release)["stream_create"]).read_bytes()
            answer = json.loads(
                (await nc.request(f"$JS.API.STREAM.CREATE.{STREAM}", request, timeout=5)).data
            )
            assert "error" not in answer, answer
        js = nc.jetstream()
        for name in DIRECT:
            entry, data = message(release, name)
            ack = await js.publish(entry["subject"], data)
            assert ack.stream == STREAM
    finally:
        await nc.close()


async def holds_what_the_worker_stored(picker: RunningPicker, what: str) -> None:
    router = picker.picker.pools["m"].router
    w0, w1 = Worker("w", 0), Worker("w", 1)
    want = ({w0: 2, w1: 1}, {w0: 1}, {w0: 2, w1: 1})  # 103 and 102 removed; 102 held again as 2**63

    def holds() -> bool:
        got = (matches(router, ROOT), matches(router, LORA), matches(router, h(range(48))))
        return got == want

    await eventually(
        holds, 10.0, lambda: f"{what}: {matches(router, ROOT)}, {picker.sources.counters.snapshot()}"
    )


@pytest.mark.parametrize("release", RELEASES)
async def test_a_picker_hears_a_jetstream_mode_worker_live(nats_server, release):
    picker = await start_picker(picker_config(nats_server.url, release))
    try:
        subscriber = picker.sources.nats_events
        assert subscriber is not None and jetstream_subject(NAMESPACE, COMPONENT) in subscriber.subjects
        await as_the_worker_publishes(nats_server.url, release)
        await holds_what_the_worker_stored(picker, "heard live")
        assert picker.sources.counters["nats.gap"] == 0
    finally:
        await picker.stop(0)


@pytest.mark.parametrize("workers_first", [True, False], ids=["workers-first", "picker-first"])
async def test_a_durable_picker_sources_dynamos_stream_and_a_later_replica_rebuilds_from_it(
    nats_server, workers_first
):
    release = "1.3.1"
    durable = {"durable_kv_events": True}
    if workers_first:
        await as_the_worker_publishes(nats_server.url, release)
    first = await start_picker(picker_config(nats_server.url, release, router_id="r1", **durable))
    second: RunningPicker | None = None
    try:
        if not workers_first:  # Dynamo's stream does not exist yet: the worker creates it now
            await as_the_worker_publishes(nats_server.url, release)
        await holds_what_the_worker_stored(first, "the first replica")
        second = await start_picker(picker_config(nats_server.url, release, router_id="r2", **durable))
        await holds_what_the_worker_stored(second, "a replica started after the events")
        assert first.sources.durable is not None
        nc = await nats.connect(nats_server.url)
        try:
            ours = await nc.jetstream().stream_info(first.sources.durable.config.stream)
        finally:
            await nc.close()
        assert [s.name for s in ours.config.sources or []] == [STREAM] and ours.state.messages == len(DIRECT)
    finally:
        if second is not None:
            await second.stop(0)
        await first.stop(0)


async def test_a_jetstream_worker_is_named_by_its_subject_and_a_restarted_one_forgets_its_blocks(nats_server):
    """The operator's view names the stream's subject the worker published on (not the JSON subject
    the picker also hears). When its event ids start again (the worker restarted, its cache empty),
    what it stored before is forgotten."""
    release = "1.3.1"
    picker = await start_picker(picker_config(nats_server.url, release))
    try:
        await as_the_worker_publishes(nats_server.url, release)
        await holds_what_the_worker_stored(picker, "heard live")
        feed, router, w0 = picker.sources.feed, picker.picker.pools["m"].router, Worker("w", 0)
        assert feed.reason(w0) == f"first event on {STREAM}.kv-events"
        nc = await nats.connect(nats_server.url)
        try:
            entry, data = message(release, "stored-root")  # event 1 again: the publisher restarted
            await nc.jetstream().publish(entry["subject"], data)
        finally:
            await nc.close()
        await eventually(
            lambda: not matches(router, LORA), 10.0, "the LoRA block it stored before is forgotten"
        )
        assert matches(router, ROOT) == {w0: 2, Worker("w", 1): 1}  # what it stored again, and dp rank 1's
    finally:
        await picker.stop(0)
