"""The snapshot codec: dump_events round-trips into an identical tree; garbage is rejected clearly."""

import msgpack
import pytest

from extproc.events import snapshot as snapshot_codec
from extproc.events.snapshot import (
    Snapshot,
    SnapshotError,
    SnapshotWriter,
    _unpack,
    decode_snapshot,
    encode_snapshot,
)
from extproc.router.radix import RadixTree
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored, StoredBlock, Worker

W0, W1 = Worker("7"), Worker(8, dp_rank=2)


def test_a_dumped_tree_survives_the_codec():
    tree = RadixTree()
    tree.apply_event(BlocksStored(W0, (StoredBlock(1, 10), StoredBlock(2, 20), StoredBlock(3, 30))))
    tree.apply_event(BlocksStored(W1, (StoredBlock(-5, 10), StoredBlock(2**64 - 1, 21))))
    tree.apply_event(BlocksRemoved(W0, (1,)))  # W0 keeps blocks 2, 3 without their parent
    snapshot = Snapshot(tuple(tree.dump_events()), stream_seq=42, created_by="r1", created_at_s=1.5)

    decoded = decode_snapshot(encode_snapshot(snapshot))
    assert decoded == snapshot
    rebuilt = RadixTree()
    for event in decoded.events:
        rebuilt.apply_event(event)
    assert sorted(rebuilt.entries(), key=repr) == sorted(tree.entries(), key=repr)
    assert rebuilt.find_matches([10, 21]) == {W1: 2}


def test_every_event_kind_round_trips():
    events = (
        BlocksStored(W0, (StoredBlock(1, 2),), parent_hash=9),
        BlocksRemoved(W1, (1, 2)),
        AllBlocksCleared(W0),
    )
    assert decode_snapshot(encode_snapshot(Snapshot(events))).events == events


def test_hashes_at_both_ends_of_the_64_bit_ranges_round_trip():
    """Engines' ids are unsigned 64-bit (vLLM, Dynamo) or signed (SGLang): both ends decode."""
    low, high = -(2**63), 2**64 - 1
    events = (
        BlocksStored(W0, (StoredBlock(low, high), StoredBlock(high, low)), parent_hash=low),
        BlocksStored(W1, (StoredBlock(1, 2),), parent_hash=high),
        BlocksRemoved(W1, (low, high)),
    )
    assert decode_snapshot(encode_snapshot(Snapshot(events))).events == events


def _one_packb(snapshot: Snapshot) -> bytes:
    """The snapshot packed in one msgpack call, as encode_snapshot did before it wrote slices."""
    events = []
    for e in snapshot.events:
        if isinstance(e, BlocksStored):
            flat = [h for b in e.blocks for h in (b.engine_hash, b.local_hash)]
            events.append([0, e.worker.worker_id, e.worker.dp_rank, e.parent_hash, flat])
        else:
            events.append([1, e.worker.worker_id, e.worker.dp_rank, list(e.engine_hashes)])
    top = {"format": "extproc.kv-snapshot", "version": 1, "stream_seq": snapshot.stream_seq}
    top |= {"created_by": snapshot.created_by, "created_at_s": snapshot.created_at_s, "events": events}
    return msgpack.packb(top, use_bin_type=True)


@pytest.mark.parametrize("count", [0, 1, 15, 16, 65_535, 65_536])  # each size of msgpack's array header
def test_a_snapshot_written_in_slices_is_the_bytes_one_msgpack_call_gives(count):
    events = tuple(
        BlocksStored(W0, (StoredBlock(i, 2**64 - 1 - i),), parent_hash=i - 1 if i else None)
        if i % 3
        else BlocksRemoved(W1, (i, -i))
        for i in range(count)
    )
    snapshot = Snapshot(events, stream_seq=2**40, created_by="r-é", created_at_s=1.25)
    writer = SnapshotWriter(2**40, "r-é", 1.25)
    for start in range(0, count, 7_000):
        writer.add(events[start : start + 7_000])
    writer.add(())
    assert writer.events == count
    assert writer.finish() == encode_snapshot(snapshot) == _one_packb(snapshot)
    assert decode_snapshot(writer.finish()) == snapshot


def test_the_writer_refuses_what_is_not_a_kv_event():
    with pytest.raises(TypeError, match="not a KV event: str"):
        SnapshotWriter(1, "r", 0.0).add(["stored"])


def test_a_snapshot_without_its_optional_fields_reads_them_as_unknown():
    snapshot = decode_snapshot(_packed())
    assert (snapshot.created_by, snapshot.created_at_s, snapshot.events) == ("", 0.0, ())


def _packed(**fields):
    top = {"format": "extproc.kv-snapshot", "version": 1, "stream_seq": 0, "events": []}
    top.update(fields)
    return msgpack.packb(top)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "msgpack decoding failed"),
        (b"\xc1", "msgpack decoding failed"),
        (msgpack.packb([1, 2]), "expected a map with format"),
        (_packed(format="other"), "expected a map with format"),
        (_packed(version=2), "version 2 is not supported"),
        (_packed(stream_seq=-1), "stream_seq -1"),
        (_packed(events={}), "events is not a list"),
        (_packed(events=[[9, "w", 0]]), "event 0 is malformed: unknown event kind 9"),
        (_packed(events=[[0, "w"]]), r"event 0 is malformed: expected a list \[kind"),
        (_packed(events=[[2, "w", 0], 5]), r"event 1 is malformed: expected a list \[kind"),
        (_packed(events=[[1, "w", 0, None, []]]), "unknown event kind 1 with 5 fields"),
        (_packed(events=[[2, "w", 0, []]]), "unknown event kind 2 with 4 fields"),
        (_packed(created_by=7), "created_by/created_at_s have the wrong types"),
        (_packed(events=[[1, "w", 0, 5]]), "block hashes are not a list"),
        (msgpack.packb({1: 2}), "msgpack decoding failed"),  # only string keys in a snapshot's map
        (_packed(events=[[0, "w", 0, None, [1]]]), "odd length"),
        (_packed(events=[[1, 1.5, 0, []]]), "worker_id 1.5"),
        (_packed(events=[[1, "w", -1, []]]), "dp_rank -1"),
        (_packed(events=[[1, "w", 0, ["x"]]]), "block hash 'x'"),
        (_packed(events=[[0, "w", 0, None, [1, 2, 3, True]]]), "block hash True"),  # an int's subclass
        (_packed(events=[[0, "w", 0, None, [1, 2.5, "x", 4]]]), "block hash 2.5"),  # the first one named
        (b"\x81\xa1a" + b"\x91" * 5000, "msgpack decoding failed"),
    ],
)
def test_garbage_is_rejected_with_a_clear_error(data, message):
    with pytest.raises(SnapshotError, match=message):
        decode_snapshot(data)


def _outcome(unpack, data):
    try:
        return "decoded", unpack(data)
    except Exception:
        return "refused", None


@pytest.mark.parametrize("read_size", [snapshot_codec._READ_SIZE, 1, 5])
def test_the_item_by_item_unpack_gives_what_msgpack_unpackb_gives(monkeypatch, read_size):
    """The events array is read one item per call (the event loop gets turns between them): every
    prefix of a snapshot, with a byte more, and maps of other shapes decode or fail alike, also
    when msgpack's reads of the bytes end inside items and headers (`read_size`)."""
    monkeypatch.setattr(snapshot_codec, "_READ_SIZE", read_size)
    snapshot = encode_snapshot(
        Snapshot((BlocksStored(W0, (StoredBlock(1, 10), StoredBlock(2, 20))), AllBlocksCleared(W1)), 3, "r1")
    )
    whole = msgpack.packb
    shapes = [
        whole({"events": {}}),
        whole({b"events": [1, 2]}),
        whole({"a": [1], "events": [[1], "x"], "b": {"c": 2}}),
        whole({}),
        whole({"events": [1], "events2": [2]}),
        whole({1: [2]}),
        b"\x81\xa6events\xdc\x00\x02\x01",  # an array 16 of two items holding one
        whole({"events": [{1: 2}]}),  # map keys that are not strings, inside the array read by item
        whole([{1: 2}]),  # and inside a top that is not a map
        whole({"events": ["x", [1], b"y"]}),  # strings stay str, arrays lists, bytes bytes
        whole(["x", [1], b"y"]),
    ]
    cases = [snapshot[:n] for n in range(len(snapshot) + 1)] + [snapshot + b"\x00"] + shapes

    def unpackb(data):
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)

    for data in cases:
        assert _outcome(_unpack, data) == _outcome(unpackb, data), data


def test_a_snapshot_past_msgpacks_default_buffer_of_100_mib_is_read_item_by_item_too():
    data = msgpack.packb({"events": [b"x" * (101 << 20), 1]})
    top = _unpack(data)
    assert len(top["events"][0]) == 101 << 20 and top["events"][1] == 1
