"""Block and sequence hashes are bit-identical to Dynamo's (REFERENCE section 3 vectors)."""

import array

import numpy as np
import pytest

from extproc.router import compute_block_hashes, compute_sequence_hashes
from extproc.router.hashing import tokens_as_u32le


@pytest.mark.parametrize(
    ("tokens", "block_size", "kwargs", "expected"),
    [
        (list(range(1, 33)), 16, {}, [16863443419780771464, 2287610619914608821]),
        (list(range(1, 36)), 16, {}, [16863443419780771464, 2287610619914608821]),
        ([0] * 64, 64, {}, [15480293642169978529]),
        ([7] * 512, 64, {}, [17903371052352623343] * 8),
        (
            list(range(100000, 100128)),
            32,
            {},
            [3814359024762509559, 17748218047578296623, 4588325122450598197, 12452316145895131616],
        ),
        (list(range(1, 33)), 16, {"lora_name": "my-lora"}, [4148081000444450790, 2866551892415683476]),
        (list(range(1, 33)), 16, {"namespace": "ns1"}, [10470563794485058852, 9596755744098040008]),
        (
            list(range(1, 33)),
            16,
            {"lora_name": "", "namespace": ""},
            [16863443419780771464, 2287610619914608821],
        ),
        (list(range(1, 16)), 16, {}, []),
    ],
)
def test_local_block_hashes_match_reference_vectors(tokens, block_size, kwargs, expected):
    assert compute_block_hashes(tokens, block_size, **kwargs) == expected
    assert compute_block_hashes(np.array(tokens, dtype=np.int64), block_size, **kwargs) == expected


@pytest.mark.parametrize(
    ("tokens", "block_size", "seq1"),
    [
        (list(range(1, 33)), 16, 12466389667045779788),
        ([7] * 512, 64, 12965916393006254241),
        (list(range(100000, 100128)), 32, 14252585027742979009),
    ],
)
def test_sequence_hashes_chain_from_the_first_block(tokens, block_size, seq1):
    local = compute_block_hashes(tokens, block_size)
    seq = compute_sequence_hashes(local)
    assert seq[0] == local[0]
    assert seq[1] == seq1
    assert len(seq) == len(local)


def test_equal_blocks_at_different_positions_get_different_sequence_hashes():
    seq = compute_sequence_hashes(compute_block_hashes([7] * 512, 64))
    assert len(set(seq)) == 8


@pytest.mark.parametrize("bad", [[-1] * 16, [2**32] * 16, ["a"] * 16, [1.5] * 16])
def test_token_ids_outside_uint32_are_rejected(bad):
    with pytest.raises(ValueError, match="token ids"):
        compute_block_hashes(bad, 16)


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size"):
        compute_block_hashes([1, 2, 3], 0)


@pytest.mark.parametrize(
    "bad",
    [
        np.array([-1] * 16, dtype=np.int64),
        np.array([2**32] * 16, dtype=np.int64),
        np.array([1.5] * 16),
        np.array([1.0] * 16),  # a float, even integral, is not a token id
    ],
)
def test_numpy_token_ids_outside_uint32_are_rejected_too(bad):
    with pytest.raises(ValueError, match="token ids"):
        compute_block_hashes(bad, 16)


def test_the_largest_uint32_token_id_hashes_alike_from_a_list_and_an_array():
    tokens = [0xFFFFFFFF] * 16
    expected = compute_block_hashes(tokens, 16)
    assert len(expected) == 1
    assert compute_block_hashes(np.array(tokens, dtype=np.int64), 16) == expected
    assert compute_block_hashes(np.array(tokens, dtype=np.uint32), 16) == expected


def test_a_uint32_array_hashes_as_its_list_does():
    tokens = [0xFFFFFFFF, 0, 7, 128_000] * 12
    ids = array.array("I", tokens)
    assert compute_block_hashes(ids, 16) == compute_block_hashes(tokens, 16)
    assert compute_block_hashes(ids, 16, lora_name="a") == compute_block_hashes(tokens, 16, lora_name="a")
    assert bytes(tokens_as_u32le(ids)) == bytes(tokens_as_u32le(tokens))


def test_token_bytes_are_unsigned_little_endian():
    for tokens in ([0xFFFFFFFF, 1], np.array([0xFFFFFFFF, 1], dtype=np.int64)):
        assert list(tokens_as_u32le(tokens)) == [255, 255, 255, 255, 1, 0, 0, 0]


def test_a_block_of_one_token_hashes_every_token():
    hashes = compute_block_hashes([5, 6, 5], 1)
    assert len(hashes) == 3 and hashes[0] == hashes[2] != hashes[1]


@pytest.mark.parametrize("typecode", ["I", "i", "l", "q", "L"])
def test_token_arrays_of_any_integer_type_hash_like_a_list(typecode):
    tokens = list(range(1, 33))
    assert compute_block_hashes(array.array(typecode, tokens), 16) == compute_block_hashes(tokens, 16)


def test_a_signed_token_array_with_a_negative_id_is_rejected():
    with pytest.raises(ValueError, match="token ids"):
        compute_block_hashes(array.array("i", [-1] * 16), 16)


def test_a_uint32_token_array_is_viewed_as_unsigned_little_endian_bytes():
    assert list(tokens_as_u32le(array.array("I", [0xFFFFFFFF, 1]))) == [255, 255, 255, 255, 1, 0, 0, 0]


@pytest.mark.parametrize("bad", [-1, 2**64], ids=["negative", "2**64"])
@pytest.mark.parametrize("where", [0, 1], ids=["first", "chained"])
def test_a_block_hash_outside_64_bits_is_refused_wherever_it_is(bad: int, where: int) -> None:
    """Hashes that arrive as numbers (a remote group's, a replica's) are 64-bit: one outside is an
    OverflowError, the first as well as a chained one (until 2026-11-27 a lone first passed)."""
    hashes = [5, 6]
    hashes[where] = bad
    with pytest.raises(OverflowError, match=r"\[0, 2\*\*64\)"):
        compute_sequence_hashes(hashes[: where + 1])
    assert compute_sequence_hashes([0]) == [0] and compute_sequence_hashes([2**64 - 1]) == [2**64 - 1]
