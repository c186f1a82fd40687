"""Dynamo's KV event JSON: byte-exact fixtures of each variant, and bad input counted, not raised."""

import pytest

from extproc.events.counters import EventCounters
from extproc.events.dynamo_json import decode_event, encode_event, kv_events_subject
from extproc.router.types import AllBlocksCleared, BlocksRemoved, BlocksStored, StoredBlock, Worker

U64 = 18446744073709551615

FIXTURES = [
    (
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"parent_hash":null,'
        b'"blocks":[{"block_hash":11,"tokens_hash":101}]}}}}',
        ("7", 0, BlocksStored(Worker("7"), (StoredBlock(11, 101),), None, 0)),
    ),
    (
        b'{"worker_id":7,"event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":11,'
        b'"blocks":[{"block_hash":12,"tokens_hash":102},{"block_hash":18446744073709551615,'
        b'"tokens_hash":18446744073709551615}]}}}}',
        ("7", 1, BlocksStored(Worker("7"), (StoredBlock(12, 102), StoredBlock(U64, U64)), 11, 1)),
    ),
    (
        b'{"worker_id":7,"event":{"event_id":2,"dp_rank":0,"data":{"removed":{"block_hashes":[12,11]}}}}',
        ("7", 2, BlocksRemoved(Worker("7"), (12, 11), 2)),
    ),
    (
        b'{"worker_id":7,"event":{"event_id":3,"dp_rank":0,"data":"cleared"}}',
        ("7", 3, AllBlocksCleared(Worker("7"), 3)),
    ),
    (
        b'{"worker_id":18446744073709551615,"event":{"event_id":9,"dp_rank":3,"data":"cleared"}}',
        (str(U64), 9, AllBlocksCleared(Worker(str(U64), 3), 9)),
    ),
]


@pytest.mark.parametrize("wire, expected", FIXTURES)
def test_each_variant_decodes_and_encodes_back_byte_exact(wire, expected):
    counters = EventCounters()
    assert decode_event(wire, counters) == expected
    worker_id, event_id, event = expected
    assert encode_event(int(worker_id), event, event_id, event.worker.dp_rank) == wire
    assert counters.snapshot() == {"dynamo.event": 1}


def test_dp_rank_defaults_to_zero_and_unknown_keys_are_ignored():
    wire = (
        b'{"worker_id":1,"event":{"event_id":5,"data":{"stored":{"parent_hash":null,"lora_name":null,'
        b'"blocks":[{"block_hash":1,"tokens_hash":2,"mm_extra_info":null}]}}},"extra":1}'
    )
    assert decode_event(wire, EventCounters()) == (
        "1",
        5,
        BlocksStored(Worker("1", 0), (StoredBlock(1, 2),), None, 5),
    )


def test_worker_ids_can_be_mapped():
    wire = b'{"worker_id":7,"event":{"event_id":0,"dp_rank":1,"data":"cleared"}}'
    assert decode_event(wire, EventCounters(), worker_id_of=lambda w: f"w{w}") == (
        "w7",
        0,
        AllBlocksCleared(Worker("w7", 1), 0),
    )


@pytest.mark.parametrize(
    "wire",
    [
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":"evicted_all"}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"moved":{"block_hashes":[1]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[]},"removed":{}}}}',
    ],
)
def test_unknown_variants_are_counted_loudly_and_dropped(wire, caplog):
    counters = EventCounters()
    assert decode_event(wire, counters) is None
    assert counters["dynamo.unknown_variant"] == 1
    assert "unknown data" in caplog.text


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"worker_id":-1,"event":{"event_id":0,"dp_rank":0,"data":"cleared"}}',
        b'{"worker_id":18446744073709551616,"event":{"event_id":0,"dp_rank":0,"data":"cleared"}}',
        b'{"worker_id":"7","event":{"event_id":0,"dp_rank":0,"data":"cleared"}}',
        b'{"worker_id":true,"event":{"event_id":0,"dp_rank":0,"data":"cleared"}}',
        b'{"worker_id":7,"event":{"dp_rank":0,"data":"cleared"}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":4294967296,"data":"cleared"}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"parent_hash":1.5,"blocks":[]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":{}}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[{"block_hash":1}]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"removed":{"block_hashes":["1"]}}}}',
        # a list of blocks is checked at once; each of these falls back to naming the bad field
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[{"block_hash":1,"tokens_hash":2},{"block_hash":true,"tokens_hash":2}]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[{"block_hash":1,"tokens_hash":-2}]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[{"block_hash":18446744073709551616,"tokens_hash":2}]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[{"block_hash":1,"tokens_hash":2.0}]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[{"block_hash":1,"tokens_hash":2},[1,2]]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":["ab"]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"removed":{"block_hashes":[1,false]}}}}',
        b'{"worker_id":7,"event":{"event_id":0,"dp_rank":0,"data":{"removed":{"block_hashes":[1,-1]}}}}',
        b'{"worker_id":7,"event":[]}',
    ],
)
def test_malformed_messages_are_counted_loudly_and_dropped(wire):
    counters = EventCounters()
    assert decode_event(wire, counters) is None
    assert counters.snapshot() == {"dynamo.malformed": 1}


def test_encode_rejects_numbers_the_wire_cannot_carry():
    with pytest.raises(ValueError, match="block_hash"):
        encode_event(7, BlocksRemoved(Worker("7"), (-1,)), 0, 0)
    with pytest.raises(ValueError, match="dp_rank"):
        encode_event(7, AllBlocksCleared(Worker("7")), 0, 1 << 32)


def test_subject():
    assert kv_events_subject("dynamo", "backend") == "namespace.dynamo.component.backend.kv_events"
