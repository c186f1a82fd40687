"""extproc.events.vllm: checked-in engine payloads decode to exactly these events; bad input is counted.

The payloads are built by `fixtures/make_fixtures.py` the way vLLM's msgspec encoder and SGLang
write them; the bytes are pinned here, so a decoder change that misreads any of them fails.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.events.counters import EventCounters
from extproc.events.vllm import (
    END_SEQ,
    VllmEventDecoder,
    WireAllBlocksCleared,
    WireBlockRemoved,
    WireBlockStored,
    decode_seq,
    encode_batch,
    encode_seq,
    normalize_hash,
    parse_frames,
    parse_replay_reply,
)
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import (
    DISK_TIER,
    EXTERNAL_TIER,
    HOST_PINNED_TIER,
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    StoredBlock,
    Worker,
)

FIXTURES = Path(__file__).parent / "fixtures"
TS = 1767225600.125
BS = 4
W0 = Worker("w0")
H1, H2, H3 = 0xF0E1D2C3B4A59687, 0x0123456789ABCDEF, 0x8000000000000000


def local(tokens: list[int], lora_name: str | None = None) -> list[int]:
    return compute_block_hashes(tokens, BS, lora_name=lora_name)


def digest_id(n: int) -> int:
    """vLLM's own int form of a digest: big-endian, low 64 bits."""
    return int.from_bytes(bytes(range(n, n + 32)), "big") & (2**64 - 1)


def decode(name: str, *, worker_id: str = "w0", default_dp_rank: int = 0):
    counters = EventCounters()
    decoder = VllmEventDecoder(worker_id, BS, counters=counters, default_dp_rank=default_dp_rank)
    return decoder.decode((FIXTURES / name).read_bytes()), counters


L12, L34 = local([1, 2, 3, 4, 5, 6, 7, 8]), local([9, 10, 11, 12])
BASIC = [
    BlocksStored(W0, (StoredBlock(H1, L12[0]), StoredBlock(H2, L12[1])), None),
    BlocksStored(W0, (StoredBlock(H3, L34[0]),), H2),
    BlocksRemoved(W0, (H3,)),
    AllBlocksCleared(W0),
]


@pytest.mark.parametrize("name", ["vllm_array.bin", "vllm_map.bin"])
def test_vllm_array_and_map_layouts_decode_to_the_same_events(name):
    batch, counters = decode(name)
    assert batch.ts == TS
    assert batch.dp_rank == 0
    assert batch.events == BASIC
    assert counters.snapshot() == {
        "vllm.batch": 1,
        "vllm.stored_event": 2,
        "vllm.removed_event": 1,
        "vllm.cleared_event": 1,
    }


def test_optional_and_unknown_keys_are_ignored_and_other_kv_groups_dropped():
    batch, counters = decode("vllm_map_extra_keys.bin", default_dp_rank=3)
    w = Worker("w0", 3)  # no data_parallel_rank in the batch: the endpoint's rank
    assert batch.dp_rank == 3
    assert batch.events == [
        BlocksStored(w, (StoredBlock(H1, L12[0]), StoredBlock(H2, L12[1])), None),
        BlocksRemoved(w, (H2,)),
    ]
    assert counters["vllm.other_kv_group"] == 1


def test_sglang_signed_hashes_pages_and_partial_last_page():
    batch, counters = decode("sglang.bin")
    pages = local([1, 2, 3, 4, 5, 6, 7, 8])
    assert batch.events == [
        BlocksStored(W0, (StoredBlock(H1, pages[0]),), None),
        BlocksStored(W0, (StoredBlock(H3, pages[1]),), H1),  # signed parent normalised like the id
        BlocksRemoved(W0, (H3,)),  # the partial page [9, 10] is not a block
    ]
    assert counters["vllm.partial_block"] == 1


def test_partial_tail_of_a_multi_block_store_keeps_the_full_blocks():
    counters = EventCounters()
    payload = encode_batch([WireBlockStored([H1, H2, H3], None, list(range(1, 11)), BS)], ts=1.0)
    batch = VllmEventDecoder("w0", BS, counters=counters).decode(payload)
    full = local(list(range(1, 9)))
    assert batch.events == [BlocksStored(W0, (StoredBlock(H1, full[0]), StoredBlock(H2, full[1])), None)]
    assert counters["vllm.partial_block"] == 1


def test_bytes_digests_become_vllms_int_ids_for_ids_parents_and_removals():
    batch, _ = decode("bytes_digests.bin")
    assert batch.events == [
        BlocksStored(W0, (StoredBlock(digest_id(0), L12[0]), StoredBlock(digest_id(1), L12[1])), None),
        BlocksStored(W0, (StoredBlock(digest_id(2), L34[0]),), digest_id(1)),
        BlocksRemoved(W0, (digest_id(2),)),
    ]


def test_multi_block_store_with_dp_rank_and_lora_name():
    batch, _ = decode("multi_block_dp_lora.bin", worker_id="engine-7")
    tokens = list(range(100, 112))
    lora = local(tokens, lora_name="my-lora")
    assert lora != local(tokens)  # the adapter shifts the seed: never shared with the base model
    w = Worker("engine-7", 2)
    assert batch.dp_rank == 2
    assert batch.events == [BlocksStored(w, tuple(map(StoredBlock, (H1, H2, H3), lora)), 7)]


def test_cpu_medium_decodes_into_the_host_tier_and_is_counted():
    batch, counters = decode("cpu_medium.bin")
    block = (StoredBlock(H1, local([1, 2, 3, 4])[0]),)
    assert batch.events == [
        BlocksStored(W0, block, None),
        BlocksStored(W0, block, None, tier=HOST_PINNED_TIER),
        BlocksRemoved(W0, (H1,), tier=HOST_PINNED_TIER),
    ]
    assert counters["vllm.other_medium"] == 2
    assert counters["vllm.tier_event"] == 2


def test_unknown_event_types_are_counted_loudly_and_the_rest_kept(caplog):
    batch, counters = decode("unknown_event.bin")
    assert batch.events == [
        BlocksStored(W0, (StoredBlock(H1, local([1, 2, 3, 4])[0]),), None),
        BlocksRemoved(W0, (H1,)),
    ]
    assert counters["vllm.unknown_event"] == 2
    assert "BlockTouched" in caplog.text and "BlockPinned" in caplog.text


def test_block_size_mismatch_drops_the_store_loudly(caplog):
    batch, counters = decode("block_size_mismatch.bin")
    assert batch.events == [BlocksRemoved(W0, (H2,))]
    assert counters["vllm.block_size_mismatch"] == 1
    assert "block_size 16" in caplog.text


def test_malformed_events_are_dropped_one_by_one():
    batch, counters = decode("malformed_event.bin")
    assert batch.events == [BlocksRemoved(W0, (H2,))]
    assert counters["vllm.malformed_event"] == 3


@pytest.mark.parametrize(
    "name", ["malformed_not_a_batch.bin", "malformed_events_not_a_list.bin", "malformed_truncated.bin"]
)
def test_malformed_batches_decode_to_nothing_and_are_counted(name):
    batch, counters = decode(name)
    assert batch.events == []
    assert counters.snapshot() == {"vllm.malformed_batch": 1}


def test_lora_id_without_a_name_cannot_be_hashed_and_is_dropped():
    counters = EventCounters()
    payload = encode_batch([WireBlockStored([H1], None, [1, 2, 3, 4], BS, lora_id=3)], ts=1.0)
    assert VllmEventDecoder("w0", BS, counters=counters).decode(payload).events == []
    assert counters["vllm.lora_without_name"] == 1


@pytest.mark.parametrize(("layout", "name"), [("map", "vllm_map.bin"), ("array", "vllm_array.bin")])
def test_encoder_writes_what_vllm_writes(layout, name):
    events = [
        WireBlockStored([H1, H2], None, [1, 2, 3, 4, 5, 6, 7, 8], BS),
        WireBlockStored([H3], H2, [9, 10, 11, 12], BS),
        WireBlockRemoved([H3]),
        WireAllBlocksCleared(),
    ]
    assert encode_batch(events, ts=TS, dp_rank=0, layout=layout) == (FIXTURES / name).read_bytes()


def test_encoder_omits_a_missing_dp_rank():
    assert msgpack.unpackb(encode_batch([], ts=1.0, layout="map")) == {"ts": 1.0, "events": []}
    assert msgpack.unpackb(encode_batch([], ts=1.0, layout="array")) == [1.0, []]
    assert msgpack.unpackb(encode_batch([], ts=1.0)) == [1.0, []]  # current engines: an array batch


def test_current_layout_is_an_array_batch_of_map_events_with_optional_fields_only_when_set():
    events = [
        WireBlockStored([H1], None, [1, 2, 3, 4], BS, extra_keys=[("salt-A",)], group_idx=0),
        WireBlockRemoved([H1], group_idx=0),
        WireBlockRemoved([H2]),
    ]
    assert msgpack.unpackb(encode_batch(events, ts=1.0, dp_rank=2)) == [
        1.0,
        [
            {
                "type": "BlockStored",
                "block_hashes": [H1],
                "parent_block_hash": None,
                "token_ids": [1, 2, 3, 4],
                "block_size": BS,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "extra_keys": [["salt-A"]],
                "group_idx": 0,
            },
            {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU", "group_idx": 0},
            {"type": "BlockRemoved", "block_hashes": [H2], "medium": "GPU"},
        ],
        2,
    ]
    with pytest.raises(ValueError, match="layout"):
        encode_batch([], layout="json")  # type: ignore[arg-type]


def test_replay_replies_in_both_layouts_and_both_end_markers():
    seq, end = encode_seq(7), encode_seq(END_SEQ)
    assert parse_replay_reply([b"", b"kv", seq, b"x"]) == (b"kv", 7, b"x")  # vLLM 0.33, SGLang 0.5.23
    assert parse_replay_reply([b"", seq, b"x"]) == (b"", 7, b"x")  # older vLLM
    assert parse_replay_reply([b"", b"", end, b""]) == (b"", END_SEQ, b"")
    assert parse_replay_reply([b"", end, b""]) == (b"", END_SEQ, b"")
    assert parse_replay_reply([b"kv", seq, b"x"]) == (b"kv", 7, b"x")  # without the delimiter (a REQ)
    for bad in ([b"", b"\x07", b"x"], [b"", b"kv", seq, b"x", b"y"], [b""], [], [b"", end, b"x"]):
        assert parse_replay_reply(bad) is None, bad


def test_frames_and_seqs():
    counters = EventCounters()
    assert parse_frames([b"kv", encode_seq(5), b"x"], counters) == (b"kv", 5, b"x")
    assert parse_frames([b"kv", b"\x05", b"x"], counters) is None
    assert parse_frames([b"x"], counters) is None
    assert counters["vllm.malformed_frames"] == 2
    assert encode_seq(END_SEQ) == (-1).to_bytes(8, "big", signed=True)  # vLLM's END_SEQ
    assert decode_seq(encode_seq(END_SEQ)) == END_SEQ
    assert decode_seq(encode_seq(2**40)) == 2**40


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(5, 5), (-1, 2**64 - 1), (-(2**63), 2**63), (b"\x01\x02", 0x0102), (True, None), ("5", None)],
)
def test_normalize_hash(raw, expected):
    assert normalize_hash(raw) == expected


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_signed_and_unsigned_forms_of_an_id_agree(value):
    signed = value - 2**64 if value >= 2**63 else value
    assert normalize_hash(signed) == normalize_hash(value) == value
    assert normalize_hash(value.to_bytes(32, "big")) == value


@given(st.binary(max_size=64))
def test_decoder_never_raises_on_garbage(payload):
    counters = EventCounters()
    batch = VllmEventDecoder("w0", BS, counters=counters).decode(payload)
    assert isinstance(batch.events, list)


U64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
FIELD = st.one_of(
    st.just(BS),
    st.lists(st.integers(0, 9), max_size=9),
    U64,
    st.none(),
    st.text(max_size=4),
    st.binary(max_size=9),
    st.lists(U64, max_size=9),
)
TAG = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"])
KEYS = st.sampled_from(
    ["block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "lora_name"]
)


@given(
    st.lists(
        st.one_of(
            FIELD,
            st.tuples(TAG, st.lists(FIELD, max_size=8)).map(lambda t: [t[0], *t[1]]),
            st.tuples(TAG, st.dictionaries(KEYS, FIELD)).map(lambda t: {"type": t[0], **t[1]}),
        ),
        max_size=6,
    )
)
def test_decoder_never_raises_on_odd_events(events):
    counters = EventCounters()
    payload = msgpack.packb({"ts": 1.0, "events": events})
    batch = VllmEventDecoder("w0", BS, counters=counters).decode(payload)
    assert isinstance(batch.events, list)


# --- salts, partial blocks, lineages (vLLM 0.33 / SGLang 0.5.23 semantics) -----------------------


def stored(ids, parent, tokens, *, block_size=BS, **extra):
    return {
        "type": "BlockStored",
        "block_hashes": ids,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        **extra,
    }


def removed(ids, **extra):
    return {"type": "BlockRemoved", "block_hashes": ids, "medium": "GPU", **extra}


def run(decoder: VllmEventDecoder, *events) -> list:
    return decoder.decode(msgpack.packb([1.0, list(events), 0])).events


def new_decoder(**kwargs) -> VllmEventDecoder:
    return VllmEventDecoder("w0", BS, counters=EventCounters(), **kwargs)


def salted(tokens: list[int], salt: str, lora_name: str | None = None) -> list[int]:
    return compute_block_hashes(tokens, BS, lora_name=lora_name, namespace=salt)


def test_a_vllm_salt_in_the_first_blocks_extra_keys_salts_the_whole_store_and_its_continuations():
    d = new_decoder()
    first = run(d, stored([1, 2], None, [1, 2, 3, 4, 5, 6, 7, 8], extra_keys=[["salt-A"], None]))
    assert first == [BlocksStored(W0, tuple(map(StoredBlock, (1, 2), salted(list(range(1, 9)), "salt-A"))))]
    # a later chunk: a parent, no salt in its extra keys -> the parent's salt
    more = run(d, stored([3], 2, [9, 10, 11, 12], extra_keys=[None]))
    assert more == [BlocksStored(W0, (StoredBlock(3, salted([9, 10, 11, 12], "salt-A")[0]),), 2)]
    # an unsalted sequence is hashed plainly
    plain = run(d, stored([7], None, [1, 2, 3, 4]))
    assert plain == [BlocksStored(W0, (StoredBlock(7, local([1, 2, 3, 4])[0]),))]
    assert d.tracked == (3, 0)


def test_a_lora_name_leads_each_extra_keys_entry_and_is_not_a_salt():
    d = new_decoder()
    events = run(
        d,
        stored([1, 2], None, list(range(8)), lora_id=1, lora_name="sql", extra_keys=[["sql", "s"], ["sql"]]),
        stored([3], None, list(range(4)), lora_id=1, lora_name="sql", extra_keys=[["sql"]]),
    )
    assert events == [
        BlocksStored(W0, tuple(map(StoredBlock, (1, 2), salted(list(range(8)), "s", "sql")))),
        BlocksStored(W0, (StoredBlock(3, local(list(range(4)), "sql")[0]),)),
    ]


def test_sglang_cache_salt_is_on_every_store():
    d = new_decoder()
    events = run(
        d,
        stored([1], None, [1, 2, 3, 4], cache_salt="salt-A"),
        stored([2], 1, [5, 6, 7, 8], cache_salt="salt-A"),
    )
    assert [e.blocks[0].local_hash for e in events] == salted(list(range(1, 9)), "salt-A")


def test_salts_are_forgotten_with_removals_clears_and_resets():
    d = new_decoder()
    run(d, stored([1, 2], None, list(range(8)), extra_keys=[["s"], None]))
    run(d, removed([2]))
    assert d.tracked == (1, 0)
    assert run(d, stored([2], 1, [4, 5, 6, 7]))[0].blocks[0].local_hash == salted([4, 5, 6, 7], "s")[0]
    run(d, {"type": "AllBlocksCleared"})
    assert d.tracked == (0, 0)
    run(d, stored([1], None, list(range(4)), extra_keys=[["s"]]))
    d.reset()
    # after a reset the parent's salt is unknown: the store is hashed plainly (the router drops it
    # anyway, its parent is gone with the reset)
    assert run(d, stored([2], 1, [4, 5, 6, 7]))[0].blocks[0].local_hash == local([4, 5, 6, 7])[0]


def test_tracked_blocks_are_bounded_and_the_oldest_go_first():
    d = new_decoder(max_tracked_blocks=2)
    for i in range(1, 4):
        run(d, stored([i], None, [i] * BS, cache_salt="s"))
    assert d.tracked == (2, 0)
    assert d.counters["vllm.salt_map_full"] == 1
    assert run(d, stored([9], 1, [0] * BS))[0].blocks[0].local_hash == local([0] * BS)[0]  # 1 was forgotten
    assert run(d, stored([8], 3, [0] * BS))[0].blocks[0].local_hash == salted([0] * BS, "s")[0]
    with pytest.raises(ValueError):
        new_decoder(max_tracked_blocks=0)


def test_multimodal_and_prompt_embeds_blocks_and_what_follows_them_are_not_indexed():
    d = new_decoder()
    mm = [None, [["img-1", 2]], None]
    events = run(d, stored([1, 2, 3], None, list(range(12)), extra_keys=mm))
    assert events == [BlocksStored(W0, (StoredBlock(1, local(list(range(4)))[0]),))]
    assert d.counters["vllm.multimodal_block"] == 2
    # what continues after the image hangs under a block the router never had: dropped quietly
    assert run(d, stored([4], 3, [0] * BS)) == []
    assert d.counters["vllm.unindexed_parent"] == 1
    assert run(d, stored([5, 6], None, list(range(8)), extra_keys=[[b"\x01" * 32], [b"\x02" * 32]])) == []
    assert d.counters["vllm.prompt_embeds_block"] == 2
    # their removals never reach the router; indexed ones do
    assert run(d, removed([2, 3, 4]), removed([1, 5])) == [BlocksRemoved(W0, (1,))]
    assert d.counters["vllm.unindexed_removal"] == 1
    assert d.tracked == (0, 1)  # 6 is still held by the engine


def test_a_partial_page_is_counted_quietly_and_what_hangs_under_it_is_recognised(caplog):
    d = new_decoder()
    events = run(
        d,
        stored([1], None, [1, 2, 3, 4]),
        stored([2], 1, [5, 6], block_size=2),  # SGLang's partial last page / vLLM's partial block
        stored([3, 4], 2, [7, 8, 9, 10, 11, 12, 13, 14]),  # a child under the partial page
        stored([5], 4, [0] * BS),  # and its child
    )
    assert events == [BlocksStored(W0, (StoredBlock(1, local([1, 2, 3, 4])[0]),))]
    assert d.counters["vllm.partial_block"] == 1
    assert d.counters["vllm.partial_parent"] == 2
    assert d.counters["vllm.block_size_mismatch"] == 0
    assert "block_size" not in caplog.text
    assert run(d, removed([2, 3, 4, 5, 1])) == [BlocksRemoved(W0, (1,))]
    assert d.tracked == (0, 0)


@pytest.mark.parametrize(
    "event",
    [
        stored([1], None, list(range(8)), block_size=8),  # a larger block size
        stored([1, 2], None, [1, 2, 3, 4], block_size=2),  # a smaller one, several blocks
        stored([1], None, [1, 2, 3], block_size=2),  # a smaller one, tokens not one block
    ],
)
def test_a_genuine_block_size_mismatch_stays_loud(event, caplog):
    d = new_decoder()
    assert run(d, event) == []
    assert d.counters["vllm.block_size_mismatch"] == 1
    assert d.counters["vllm.partial_block"] == 0
    assert "the router's is 4" in caplog.text


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        ("CPU", HOST_PINNED_TIER),  # vLLM's offloading connector
        ("cpu_pinned", HOST_PINNED_TIER),  # SGLang's HiCache (any case)
        ("STORAGE", DISK_TIER),
        ("DISK", DISK_TIER),
        ("EXTERNAL", EXTERNAL_TIER),
    ],
)
def test_offload_media_decode_into_their_tier(medium, tier):
    d = new_decoder()
    assert run(d, stored([1], None, [1, 2, 3, 4], medium=medium), removed([1], medium=medium)) == [
        BlocksStored(W0, (StoredBlock(1, local([1, 2, 3, 4])[0]),), None, tier=tier),
        BlocksRemoved(W0, (1,), tier=tier),
    ]
    assert d.counters["vllm.tier_event"] == 2


def test_an_unknown_medium_and_an_offload_placeholder_are_counted_and_dropped():
    d = new_decoder()
    placeholder = stored([1], None, [], block_size=0, medium="CPU")  # self_describing_kv_events off
    assert run(d, stored([1], None, [1, 2, 3, 4], medium="HBM3"), placeholder) == []
    assert d.counters["vllm.unknown_medium"] == 1
    assert d.counters["vllm.tier_placeholder"] == 1
    assert d.counters["vllm.malformed_event"] == 0


def test_a_lower_tier_removal_keeps_the_device_copys_salt():
    d = new_decoder()
    first = stored([1], None, [1, 2, 3, 4], cache_salt="s")
    child = stored([2], 1, [5, 6, 7, 8])  # inherits its parent's salt
    events = run(d, first, stored([1], None, [1, 2, 3, 4], medium="CPU", cache_salt="s"))
    events += run(d, removed([1], medium="CPU"), child)
    assert events[-1] == BlocksStored(W0, (StoredBlock(2, salted([1, 2, 3, 4, 5, 6, 7, 8], "s")[1]),), 1)


@pytest.mark.parametrize(
    ("extra", "counter"),
    [
        ({"group_idx": 1}, "vllm.other_kv_group"),
        ({"kv_cache_spec_kind": "sliding_window"}, "vllm.other_kv_spec"),
        ({"kv_cache_spec_kind": "mamba"}, "vllm.other_kv_spec"),
        ({"kv_cache_spec_kind": ["odd"]}, "vllm.other_kv_spec"),
        ({"locality": "REMOTE"}, "vllm.remote_block"),
    ],
)
def test_only_local_gpu_full_attention_blocks_of_group_0_are_routable(extra, counter):
    d = new_decoder()
    assert run(d, stored([1], None, [1, 2, 3, 4], **extra)) == []
    assert d.counters[counter] == 1


def test_fields_used_deliberately_or_ignored():
    d = new_decoder()
    event = stored(
        [1],
        None,
        [1, 2, 3, 4],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
        locality="LOCAL",
        ownership="kvcr",
        session_id="sess-1",
        kv_cache_spec_sliding_window=None,
        lookahead_token_ids=[[5]],
    )
    assert run(d, event) == [BlocksStored(W0, (StoredBlock(1, local([1, 2, 3, 4])[0]),))]
    assert d.counters["vllm.lookahead_block"] == 1
    mla = stored([2], None, [1, 2, 3, 4], kv_cache_spec_kind="mla_attention")
    assert run(d, mla)[0].blocks == (StoredBlock(2, local([1, 2, 3, 4])[0]),)


def test_sglang_bigram_pages_are_indexed_by_their_first_tokens():
    d = new_decoder()
    pairs = [[1, 2], [2, 3], [3, 4], [4, 5]]
    assert run(d, stored([1], None, pairs))[0].blocks == (StoredBlock(1, local([1, 2, 3, 4])[0]),)
    assert d.counters["vllm.bigram_page"] == 1
    assert run(d, stored([2], None, [[1, 2], 3, 4, 5])) == []
    assert d.counters["vllm.malformed_event"] == 1


@pytest.mark.parametrize(
    "extra",
    [
        {"extra_keys": [["a"], ["b"]]},  # two salts
        {"extra_keys": [None]},  # not one entry per block
        {"extra_keys": "salt"},
        {"extra_keys": [5, None]},
        {"extra_keys": [[5], None]},
        {"cache_salt": 5},
        {"cache_salt": "a", "extra_keys": [["b"], None]},
    ],
)
def test_inconsistent_salts_and_extra_keys_are_malformed(extra):
    d = new_decoder()
    assert run(d, stored([1, 2], None, list(range(8)), **extra)) == []
    assert d.counters["vllm.malformed_event"] == 1


# --- edges the first mutation run of this module showed untested ------------------------------------


def test_under_strict_dp_rank_a_batch_of_another_rank_decodes_to_nothing_and_keeps_its_header():
    d = new_decoder(strict_dp_rank=True, default_dp_rank=0)
    batch = d.decode(msgpack.packb([2.5, [stored([1], None, [1] * BS)], 1]))
    assert (batch.ts, batch.dp_rank, batch.events, batch.valid) == (2.5, 1, [], True)
    assert d.counters["vllm.other_dp_rank"] == 1
    assert [
        e.worker for e in new_decoder().decode(msgpack.packb([2.5, [stored([1], None, [1] * BS)], 1])).events
    ] == [Worker("w0", 1)]


def test_a_payload_that_is_no_batch_is_invalid_and_names_the_default_rank():
    d = new_decoder(default_dp_rank=3)
    for payload in (b"\xc1", msgpack.packb({"not": "a batch"})):
        batch = d.decode(payload)
        assert (batch.ts, batch.dp_rank, batch.events, batch.valid) == (None, 3, [], False)


def test_block_size_one_is_a_block_size_and_zero_or_a_bool_is_not():
    """SGLang's default page is one token: a decoder for a router of block size 1 indexes each token."""
    d = VllmEventDecoder("w0", 1, counters=EventCounters(), max_tracked_blocks=1)
    [event] = d.decode(msgpack.packb([1.0, [stored([7, 8], None, [5, 6], block_size=1)], 0])).events
    assert [b.local_hash for b in event.blocks] == compute_block_hashes([5, 6], 1)
    for bad in (0, True):
        d = new_decoder()
        assert run(d, stored([1], None, [1] * BS, block_size=bad)) == []
        assert d.counters["vllm.malformed_event"] == 1
    for kwargs in ({"block_size": 0}, {"max_tracked_blocks": 0}):
        with pytest.raises(ValueError):
            VllmEventDecoder("w0", **{"block_size": BS, **kwargs}, counters=EventCounters())


def test_the_unindexed_ids_are_bounded_and_what_overflows_is_counted():
    """Partial pages are remembered as not indexed (what hangs under them is recognised); at most
    `max_tracked_blocks` of them, the oldest forgotten first, each overflow counted."""
    d = new_decoder(max_tracked_blocks=2)
    for i in range(1, 4):  # a one-token page under a router block of BS tokens: remembered
        assert run(d, stored([i], None, [i], block_size=1)) == []
    assert d.tracked == (0, 2)
    assert d.counters["vllm.unindexed_map_full"] == 1


def test_a_tail_of_one_token_is_a_partial_block_of_the_store():
    """Two full blocks and one token more come with three ids: the two full blocks are indexed."""
    d = new_decoder()
    [event] = run(d, stored([1, 2, 3], None, list(range(2 * BS + 1))))
    assert [b.local_hash for b in event.blocks] == local(list(range(2 * BS)))


def test_the_encoder_stamps_the_current_time_when_no_ts_is_given():
    before = time.time()
    [ts, *_] = msgpack.unpackb(encode_batch([WireBlockRemoved([1])]), raw=False)
    assert isinstance(ts, float) and before <= ts <= time.time()


def test_an_event_map_with_a_key_that_is_not_a_string_is_still_read():
    """Unknown keys are ignored whatever their type (msgpack maps may have any keys)."""
    [event] = run(new_decoder(), {**stored([1], None, [1] * BS), 7: "extra"})
    assert [b.local_hash for b in event.blocks] == local([1] * BS)


def test_an_offloaded_store_with_tokens_but_no_block_size_is_a_placeholder_not_malformed():
    d = new_decoder()
    assert run(d, {**stored([1], None, [1] * BS, medium="CPU"), "block_size": None}) == []
    assert (d.counters["vllm.tier_placeholder"], d.counters["vllm.malformed_event"]) == (1, 0)


def test_what_hangs_under_a_block_that_was_not_indexed_is_not_indexed_either():
    """Under a store named only by its LoRA id, and under a store's partial last block."""
    d = new_decoder()
    assert run(d, stored([1], None, [1] * BS, lora_id=3)) == []  # no name: cannot be hashed
    assert run(d, stored([2], 1, [2] * BS)) == []
    assert d.counters["vllm.unindexed_parent"] == 1
    [event] = run(d, stored([3, 4, 5], None, list(range(2 * BS + 1))))  # 5 is the partial tail
    assert [b.engine_hash for b in event.blocks] == [3, 4]
    assert run(d, stored([6], 5, [6] * BS)) == []
    assert d.counters["vllm.partial_parent"] == 1


def test_an_id_that_was_a_partial_page_and_is_then_stored_whole_is_indexed_with_its_children():
    """Engines reuse ids: once an id is stored as an indexed block it leaves the unindexed ids."""
    d = new_decoder()
    assert run(d, stored([5], None, [1, 2], block_size=2)) == []  # a partial page
    assert d.tracked == (0, 1)
    assert len(run(d, stored([5], None, [1] * BS))) == 1  # the same id, a full block now
    assert d.tracked == (0, 0)
    [child] = run(d, stored([6], 5, [2] * BS))
    assert [b.engine_hash for b in child.blocks] == [6]


def test_a_live_message_whose_seq_is_the_end_marker_is_counted_malformed():
    counters = EventCounters()
    assert parse_frames([b"", encode_seq(END_SEQ), b"payload"], counters) is None
    assert counters["vllm.malformed_frames"] == 1


def test_extra_keys_edges_an_empty_entry_a_salt_not_led_by_the_lora_and_a_salt_under_an_unsalted_parent():
    d = new_decoder()
    [plain] = run(d, stored([1], None, [1] * BS, extra_keys=[[]]))  # an entry naming nothing
    assert plain.blocks[0].local_hash == local([1] * BS)[0]
    [lora] = run(d, stored([2], None, [2] * BS, lora_name="a", lora_id=1, extra_keys=[["s"]]))
    assert lora.blocks[0].local_hash == salted([2] * BS, "s", lora_name="a")[0]  # the salt is kept
    [child] = run(d, stored([3], 1, [3] * BS, cache_salt="t"))  # its own salt, not its parent's none
    assert child.blocks[0].local_hash == salted([3] * BS, "t")[0]
