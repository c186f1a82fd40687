"""Block hashing compatible with NVIDIA Dynamo's KV router. Pure functions, no state.

Mirrors ai-dynamo `lib/kv-router/src/protocols.rs` (`compute_block_hash_for_seq`,
`compute_seq_hash_for_block`); the vectors that pin them are in `tests/router/test_hashing.py`.

- Local block hash: XXH3-64 of one full block of token ids as little-endian uint32 bytes,
  seed 1337. A partial tail block is not hashed.
- LoRA adapters and cache namespaces shift the seed, so equal tokens under different adapters
  never share a block.
- Sequence hash: the local hashes chained from the first block, identifying a block together
  with everything before it.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter

import numpy as np
import xxhash

XXH3_SEED = 1337  # Dynamo protocols.rs
_MASK64 = (1 << 64) - 1
_xxh3 = xxhash.xxh3_64_intdigest
_BIG_ENDIAN = sys.byteorder == "big"
_pack_pair = struct.Struct("<QQ").pack  # two little-endian u64: what a sequence hash hashes
_first = itemgetter(0)
assert array.array("I").itemsize == 4, "uint32 token layout needs a 4-byte C unsigned int"

TokenIds = Sequence[int] | np.ndarray


def block_seed(lora_name: str | None = None, namespace: str | None = None) -> int:
    """The XXH3 seed for blocks of `lora_name` in `namespace` (empty or None = absent)."""
    seed = XXH3_SEED
    if lora_name:
        seed += _xxh3(lora_name.encode("utf-8"), seed=0)
    if namespace:
        seed += _xxh3(namespace.encode("utf-8"), seed=1)
    return seed & _MASK64


def tokens_as_u32le(tokens: TokenIds) -> memoryview:
    """Token ids as little-endian uint32 bytes (the layout the hashes are defined on).

    Lists go through `array.array` (a C loop, about 4x faster than numpy's list conversion);
    uint32 `array.array`s (on a little-endian machine) and `<u4` numpy arrays are viewed without a copy.
    Raises ValueError when a token id is not an integer in [0, 2**32).
    """
    if isinstance(tokens, np.ndarray):
        if tokens.size and (tokens.dtype.kind not in "iu" or tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):
            raise ValueError("token ids must be integers in [0, 2**32)")
        return np.ascontiguousarray(tokens, dtype="<u4").data.cast("B")
    if type(tokens) is array.array and tokens.typecode == "I" and not _BIG_ENDIAN:
        return memoryview(tokens).cast("B")  # already the layout (a tokenizer's ids): no copy
    try:
        arr = array.array("I", tokens)
    except (OverflowError, TypeError) as exc:
        raise ValueError("token ids must be integers in [0, 2**32)") from exc
    if _BIG_ENDIAN:
        arr.byteswap()
    return memoryview(arr).cast("B")


def compute_block_hashes(
    tokens: TokenIds,
    block_size: int,
    *,
    lora_name: str | None = None,
    namespace: str | None = None,
) -> list[int]:
    """Local block hashes of every full `block_size`-token block of `tokens`.

    The token array is laid out once as little-endian uint32 bytes, `struct.iter_unpack` cuts it
    into blocks and `map` hashes them: no Python-level loop, per block or per token.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    buf = tokens_as_u32le(tokens)
    step = block_size * 4
    end = len(buf) - len(buf) % step
    if not end:
        return []
    seed = block_seed(lora_name, namespace)
    blocks = map(_first, struct.iter_unpack(f"{step}s", buf[:end]))
    return list(map(_xxh3, blocks, repeat(seed)))


def compute_sequence_hashes(local_hashes: Sequence[int]) -> list[int]:
    """Chained sequence hashes: seq[0] = local[0]; seq[i] = XXH3(le64(seq[i-1]) + le64(local[i])).

    Raises OverflowError for a hash outside [0, 2**64).
    """
    if not local_hashes:
        return []
    prev = local_hashes[0]
    out = [prev]
    append, pack, xxh3 = out.append, _pack_pair, _xxh3
    try:
        for h in local_hashes[1:]:
            prev = xxh3(pack(prev, h), XXH3_SEED)
            append(prev)
    except struct.error as exc:  # a hash outside [0, 2**64): the error numpy's uint64 raised
        raise OverflowError(f"block hashes must be in [0, 2**64): {exc}") from None
    return out
