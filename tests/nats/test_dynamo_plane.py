"""Dynamo's KV event plane: golden messages of ai-dynamo-runtime 1.6.1's own KvEventPublisher.

The fixtures are the bytes the real publisher put on NATS (`fixtures/capture_dynamo.py` wrote them;
`fixtures/dynamo-1.6.1/README.md` says how). Each decodes to exactly the events expected here, with
local hashes computed by our own `compute_block_hashes`; then the subscriber's event-id checks run
over them without a server, and bad input is counted, never raised.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.events.counters import EventCounters
from extproc.events.dynamo_plane import PlaneEvent, decode_envelope, event_plane_subject, read_envelope
from extproc.events.feed import RouterFeed
from extproc.events.nats_events import NatsEventSubscriber
from extproc.router import KvRouter, RouterConfig, WorkerSpec
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import (
    DEVICE_TIER,
    DISK_TIER,
    HOST_PINNED_TIER,
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    StoredBlock,
    Worker,
)
from tests.router.clock import FakeClock

FIXTURES = Path(__file__).parent / "fixtures" / "dynamo-1.6.1"
SUBJECT = event_plane_subject("ns1", "backend", "generate")
BS = 16
W7, W7_DP1, W8, W9 = Worker("7"), Worker("7", 1), Worker("8"), Worker("9")
U64 = 1 << 64


def h(tokens: range | list[int], **salting: str) -> list[int]:
    return compute_block_hashes(list(tokens), BS, **salting)


def stored(worker: Worker, event_id: int, blocks: list[tuple[int, int]], parent: int | None = None):
    event = BlocksStored(worker, tuple(StoredBlock(e, local) for e, local in blocks), parent, event_id)
    return PlaneEvent(worker, event_id, event)


def host_stored(worker: Worker, event_id: int, blocks: list[tuple[int, int]], parent: int | None, tier: str):
    event = BlocksStored(worker, tuple(StoredBlock(e, local) for e, local in blocks), parent, event_id, tier)
    return PlaneEvent(worker, event_id, event)


ROOT = h(range(32))
HOST_LOCAL = h(range(5032, 5048))[0]  # published without the LoRA name
DISK_LOCAL = 15310707395893867146
LORA = h(range(5000, 5032), lora_name="my-lora")
SALTED = h(range(5000, 5016), namespace="salt-A")
MM_HASH = 3079393621450993078  # Dynamo's tokens_hash of 300..315 with mm_hash 42 at offsets 2..6

EXPECTED: dict[str, list[PlaneEvent]] = {
    "stored-root": [stored(W7, 1, [(101, ROOT[0]), (102, ROOT[1])])],
    "stored-child": [stored(W7, 2, [(103, h(range(32, 48))[0])], parent=102)],
    "stored-lora": [stored(W7, 3, [(201, LORA[0])])],
    "stored-salted": [stored(W7, 4, [(301, SALTED[0])])],
    "stored-lora-salted": [
        stored(W7, 5, [(302, h(range(5000, 5016), lora_name="my-lora", namespace="salt-A")[0])])
    ],
    "stored-signed-hashes": [stored(W7, 6, [(U64 - 5, ROOT[0]), (1 << 63, ROOT[1])])],
    "stored-partial": [stored(W7, 7, [(401, h(range(100, 116))[0])])],  # the 4-token tail is not sent
    "stored-other-block-size": [stored(W7, 8, [])],  # blocks of 8 under kv_block_size 16: none
    "stored-mm": [stored(W7, 9, [(601, MM_HASH)])],
    "removed": [PlaneEvent(W7, 10, BlocksRemoved(W7, (103, 102), 10))],
    "batch": [
        stored(W7, 11, [(701, h(range(700, 716))[0])]),
        PlaneEvent(W7, 12, BlocksRemoved(W7, (701,), 12)),
    ],
    "stored-dp1": [stored(W7_DP1, 1, [(111, ROOT[0])])],
    "restarted-removed": [PlaneEvent(W7, 1, BlocksRemoved(W7, (101,), 1))],
    "local-indexer-stored": [stored(W8, 1, [(801, ROOT[0])])],
    "relay-stored-lora": [stored(W9, 3, [(901, LORA[0]), (902, LORA[1])])],
    # vLLM's CPU and DISK media, relayed as Dynamo's lower tiers (the CPU block continues 902 on the device)
    "relay-host-pinned": [host_stored(W9, 4, [(903, HOST_LOCAL)], 902, HOST_PINNED_TIER)],
    "relay-disk": [host_stored(W9, 5, [(904, DISK_LOCAL)], None, DISK_TIER)],
    "relay-removed-tiers": [
        PlaneEvent(W9, 6, BlocksRemoved(W9, (902,), 6)),
        PlaneEvent(W9, 7, BlocksRemoved(W9, (903,), 7, tier=HOST_PINNED_TIER)),
    ],
    "relay-cleared": [PlaneEvent(W9, 8, AllBlocksCleared(W9, 8))],
}
OTHER_TIER = {"relay-host-pinned": 1, "relay-disk": 1, "relay-removed-tiers": 1}


def fixture(name: str) -> bytes:
    return (FIXTURES / f"{name}.msgpack").read_bytes()


def manifest() -> dict:
    return json.loads((FIXTURES / "manifest.json").read_text())


def test_the_fixtures_are_the_expected_set_from_dynamo_1_6_1_on_one_subject():
    m = manifest()
    assert m["ai-dynamo-runtime"] == "1.6.1"
    assert [e["file"] for e in m["messages"]] == [f"{name}.msgpack" for name in EXPECTED]
    assert {e["subject"] for e in m["messages"]} == {SUBJECT}
    assert SUBJECT == "namespace.ns1.component.backend.endpoint.generate.kv-events"


@pytest.mark.parametrize("name", EXPECTED)
def test_each_golden_message_decodes_to_the_router_events(name):
    counters = EventCounters()
    assert decode_envelope(fixture(name), counters) == EXPECTED[name]
    applied = sum(1 for e in EXPECTED[name] if e.event is not None and e.event.tier == DEVICE_TIER)
    tiers = OTHER_TIER.get(name, 0)
    counts = {"dynamo.event": applied, "dynamo.other_tier": tiers, "dynamo.tier_event": tiers}
    assert counters.snapshot() == {k: v for k, v in counts.items() if v}


@pytest.mark.parametrize("release", ["1.4.2", "1.5.1"])
def test_older_releases_put_the_same_events_on_the_plane(release):
    """ai-dynamo-runtime 1.4.2 and 1.5.1 driven by the same script (`fixtures/dynamo-<release>/`) send
    the same envelopes (1.4.2 without `residency_domain`, read as the worker's own cache)."""
    older = FIXTURES.parent / f"dynamo-{release}"
    m = json.loads((older / "manifest.json").read_text())
    assert m["ai-dynamo-runtime"] == release
    assert [e["file"] for e in m["messages"]] == [f"{name}.msgpack" for name in EXPECTED]
    for name, events in EXPECTED.items():
        assert decode_envelope((older / f"{name}.msgpack").read_bytes(), EventCounters()) == events, name
    domains = {
        "residency_domain" in event
        for name in EXPECTED
        for event in msgpack.unpackb(msgpack.unpackb((older / f"{name}.msgpack").read_bytes())["payload"])
    }
    assert domains == ({False} if release == "1.4.2" else {True})


def test_tokens_hash_is_our_local_hash_and_the_salt_vector_holds():
    assert SALTED == [7339200549687331636]  # REFERENCE section 4's vector for cache_salt "salt-A"
    assert h(range(300, 316))[0] != MM_HASH  # a multimodal block hashes its media too


def test_the_envelope_and_router_event_fields_as_sent():
    sequences: dict[int, list[int]] = {}
    for name in EXPECTED:
        envelope = msgpack.unpackb(fixture(name), raw=False)
        assert list(envelope) == ["publisher_id", "sequence", "published_at", "topic", "payload"]
        assert envelope["topic"] == "kv-events" and isinstance(envelope["payload"], bytes)
        assert envelope["published_at"] > 1_700_000_000_000  # milliseconds since the epoch
        sequences.setdefault(envelope["publisher_id"], []).append(envelope["sequence"])
        for event in msgpack.unpackb(envelope["payload"], raw=False):
            assert list(event) == ["worker_id", "storage_tier", "residency_domain", "event"]
            assert event["residency_domain"] == "worker"
            assert list(event["event"]) == ["event_id", "data", "dp_rank"]
    # each publisher numbers its messages from 0 (the relay's first two carried its warm-up)
    assert sorted(sequences.values()) == [[0], [0], [0], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 3, 4, 5, 6]]


def test_worker_ids_are_mapped_like_the_json_path():
    events = decode_envelope(fixture("stored-dp1"), EventCounters(), worker_id_of=lambda w: f"w{w}")
    assert [(e.worker, e.event_id) for e in events] == [(Worker("w7", 1), 1)]
    assert events[0].event.worker == Worker("w7", 1)


# --- the subscriber's event-id checks over the golden stream (no server) -------------------------


def router() -> KvRouter:
    return KvRouter(
        RouterConfig(block_size=BS, use_kv_events=True),
        clock=FakeClock(),
        rng=random.Random(0),
        workers=[WorkerSpec("7", dp_ranks=(0, 1)), WorkerSpec("8"), WorkerSpec("9")],
    )


def subscriber(r: KvRouter, gaps: list | None = None) -> NatsEventSubscriber:
    feed = RouterFeed({w.worker_id: r for w in r.workers()}, EventCounters())
    hook = (lambda *gap: gaps.append(gap)) if gaps is not None else None
    return NatsEventSubscriber(
        None,  # type: ignore[arg-type]  # handed messages directly: no link needed
        feed,
        None,
        event_plane_subject=SUBJECT,
        counters=EventCounters(),
        on_gap=hook,
    )


def matches(r: KvRouter, hashes: list[int]) -> dict[Worker, int]:
    return {w: n for w, n in r.indexer.find_matches(hashes).items() if n}


def test_the_golden_stream_indexes_each_worker_and_other_tiers_leave_no_gap():
    r = router()
    sub = subscriber(r)
    for name in EXPECTED:
        if name != "restarted-removed":
            sub.handle_event_plane(fixture(name), SUBJECT)
    assert sub.gaps == 0  # w9's ids 4, 5 and 7 are other tiers: checked, not applied
    assert sub.counters["nats.event"] == sum(
        1 for name, events in EXPECTED.items() if name != "restarted-removed" for e in events if e.event
    )
    # w7 removed 103 and 102, but holds the same two blocks again under the signed ids
    assert matches(r, [*ROOT, *h(range(32, 48))]) == {W7: 2, W7_DP1: 1, W8: 1}
    assert matches(r, LORA) == {W7: 1}  # w7's lora block; w9 removed 902, then cleared
    assert matches(r, SALTED) == {W7: 1}
    assert matches(r, h(range(5000, 5016))) == {}  # the unsalted prompt matches no salted block


def test_the_relayed_cpu_and_disk_blocks_are_credited_per_tier_and_removed_per_tier():
    """Dynamo 1.6.1's relay of vLLM's CPU and DISK media: the CPU block continues the device prefix
    (credit 2 + 0.75), the disk block stands alone (0.25); one batch's GPU and CPU removals go to
    their own tier."""
    r = router()
    sub = subscriber(r)
    for name in ("relay-stored-lora", "relay-host-pinned", "relay-disk"):
        sub.handle_event_plane(fixture(name), SUBJECT)
    prompt = [*LORA[:2], HOST_LOCAL]
    assert r.tiers.match(r.indexer, prompt, r.find_matches(prompt)).blocks(W9) == {
        DEVICE_TIER: 2,
        HOST_PINNED_TIER: 1,
    }
    assert r._overlaps(r.config, prompt) == {W9: 2.75}
    assert r._overlaps(r.config, [DISK_LOCAL]) == {W9: 0.25}
    sub.handle_event_plane(fixture("relay-removed-tiers"), SUBJECT)
    assert r._overlaps(r.config, prompt) == {W9: 1}  # 902 left the device, 903 the host
    assert r.tiers.num_blocks(W9) == {DISK_TIER: 1}


def test_a_missing_message_is_a_gap_and_a_restarted_publisher_is_told_by_its_publisher_id():
    gaps: list = []
    r = router()
    sub = subscriber(r, gaps)
    sub.handle_event_plane(fixture("stored-root"))
    sub.handle_event_plane(fixture("removed"))  # ids 2..9 never arrived
    sub.handle_event_plane(fixture("batch"))
    sub.handle_event_plane(fixture("restarted-removed"))  # a new publisher for w7 dp0 starts at 1
    assert gaps == [(W7, 2, 10)] and sub.gaps == 1
    assert sub.counters["nats.new_publisher"] == 1
    assert envelope_of("restarted-removed")["publisher_id"] != envelope_of("batch")["publisher_id"]


@pytest.mark.parametrize("publisher_id", ["a1", True, None, 2.5])
def test_a_publisher_id_that_is_not_a_u64_is_not_one(publisher_id):
    envelope = envelope_of("stored-root")
    envelope["publisher_id"] = publisher_id
    publisher, events = read_envelope(msgpack.packb(envelope), EventCounters())
    assert publisher is None and len(events) == 1
    assert (
        read_envelope(fixture("stored-root"), EventCounters())[0]
        == envelope_of("stored-root")["publisher_id"]
    )


def test_a_new_publisher_whose_first_ids_heard_look_in_order_is_still_a_restart():
    """A subscriber that joins late (a ZMQ subscription reaching a new publisher) may miss the new
    publisher's first events: the next id it hears can be the one the old publisher would have sent."""
    r = router()
    sub = subscriber(r)
    sub.handle_event_plane(fixture("stored-root"))  # event 1 of the first publisher
    restarted = envelope_of("restarted-removed")
    restarted["payload"] = msgpack.packb(
        [{**e, "event": {**e["event"], "event_id": 2}} for e in msgpack.unpackb(restarted["payload"])]
    )
    sub.handle_event_plane(msgpack.packb(restarted))  # "event 2", from the new publisher
    assert matches(r, ROOT) == {}
    assert sub.sink.counters["feed.reset"] == 1 and sub.gaps == 0


def test_by_default_lost_events_keep_the_blocks_and_a_restarted_publisher_resets():
    r = router()
    sub = subscriber(r)
    sub.handle_event_plane(fixture("stored-root"))
    sub.handle_event_plane(fixture("stored-lora"))  # id 3 after 1: one event lost, blocks kept
    assert matches(r, ROOT) == {W7: 2}
    assert matches(r, LORA[:1]) == {W7: 1}
    assert sub.sink.counters["feed.reset"] == 0
    assert sub.counters.drops[("nats", "7", "event-id-gap")] == 1
    sub.handle_event_plane(fixture("restarted-removed"))  # a new publisher starts at 1: a new engine
    assert matches(r, ROOT) == {} and matches(r, LORA[:1]) == {}
    assert sub.sink.counters["feed.reset"] == 1


# --- bad input: counted, never raised ---------------------------------------------------------


def envelope_of(name: str) -> dict:
    return msgpack.unpackb(fixture(name), raw=False)


def repack(envelope: dict, events: list | None = None) -> bytes:
    if events is not None:
        envelope = {**envelope, "payload": msgpack.packb(events)}
    return msgpack.packb(envelope)


def events_of(name: str) -> list:
    return msgpack.unpackb(envelope_of(name)["payload"], raw=False)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used in msgpack
        msgpack.packb([1, 2]),
        repack({**envelope_of("removed"), "payload": "not bin"}),
        repack({k: v for k, v in envelope_of("removed").items() if k != "payload"}),
        repack({**envelope_of("removed"), "payload": b"\xc1"}),
        repack({**envelope_of("removed"), "payload": msgpack.packb({"worker_id": 7})}),
    ],
)
def test_a_message_that_is_not_an_envelope_is_counted_and_dropped(data, caplog):
    counters = EventCounters()
    assert decode_envelope(data, counters) == []
    assert counters.snapshot() == {"dynamo.malformed": 1}
    assert "dropped" in caplog.text


def test_another_topic_is_counted_and_dropped():
    counters = EventCounters()
    assert decode_envelope(repack({**envelope_of("removed"), "topic": "kv-metrics"}), counters) == []
    assert counters.snapshot() == {"dynamo.unknown_topic": 1}


def test_an_envelope_without_a_topic_is_read_as_kv_events():
    """Only another topic is dropped: an envelope that names none (a publisher that leaves the
    field out, as an older or leaner one may) is taken for what its subject says it is."""
    envelope = {k: v for k, v in envelope_of("removed").items() if k != "topic"}
    counters = EventCounters()
    [decoded] = decode_envelope(repack(envelope), counters)
    assert decoded.event == decode_envelope(fixture("removed"), EventCounters())[0].event
    assert counters.snapshot() == {"dynamo.event": 1}


def test_a_bad_router_event_is_dropped_alone_and_its_id_shows_as_a_gap():
    good, other = events_of("batch")
    bad = {**good, "event": {**good["event"], "event_id": -1}}
    counters = EventCounters()
    decoded = decode_envelope(repack(envelope_of("batch"), [bad, other]), counters)
    assert decoded == EXPECTED["batch"][1:]
    assert counters.snapshot() == {"dynamo.malformed": 1, "dynamo.event": 1}


@pytest.mark.parametrize(
    "change, key",
    [
        ({"storage_tier": 3}, "dynamo.malformed"),
        ({"storage_tier": "g4"}, "dynamo.unknown_tier"),
        ({"residency_domain": "cluster"}, "dynamo.other_domain"),
        ({"worker_id": "7"}, "dynamo.malformed"),
        ({"event": {"event_id": 11, "dp_rank": 0, "data": {"moved": {}}}}, "dynamo.unknown_variant"),
    ],
)
def test_router_event_fields_are_checked(change, key):
    counters = EventCounters()
    decoded = decode_envelope(repack(envelope_of("batch"), [{**events_of("batch")[0], **change}]), counters)
    expected = {key: 1, "dynamo.other_tier": 1} if key == "dynamo.unknown_tier" else {key: 1}
    assert counters.snapshot() == expected
    kept = key != "dynamo.malformed"  # the id of a readable event still counts for gap detection
    assert decoded == ([PlaneEvent(W7, 11, None)] if kept else [])


def test_tier_and_domain_may_be_absent():
    event = {
        k: v for k, v in events_of("stored-dp1")[0].items() if k not in ("storage_tier", "residency_domain")
    }
    assert (
        decode_envelope(repack(envelope_of("stored-dp1"), [event]), EventCounters()) == EXPECTED["stored-dp1"]
    )


MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.binary(max_size=64)
    | MSGPACK_VALUES.map(msgpack.packb)
    | st.lists(MSGPACK_VALUES, max_size=3).map(lambda events: repack(envelope_of("batch"), events))
)
def test_decoding_never_raises(data):
    counters = EventCounters()
    for item in decode_envelope(data, counters):
        assert isinstance(item, PlaneEvent) and isinstance(item.event_id, int)
