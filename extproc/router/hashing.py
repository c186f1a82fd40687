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
import sys
from collections.abc import Sequence

import numpy as np
import xxhash

XXH3_SEED = 1337  # Dynamo protocols.rs
_MASK64 = (1 << 64) - 1
_xxh3 = xxhash.xxh3_64_intdigest
_BIG_ENDIAN = sys.byteorder == "big"
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
    numpy arrays are cast without a copy when they already are `<u4`.
    Raises ValueError when a token id is not an integer in [0, 2**32).
    """
    if isinstance(tokens, np.ndarray):
        if tokens.size and (tokens.dtype.kind not in "iu" or tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):
            raise ValueError("token ids must be integers in [0, 2**32)")
        return np.ascontiguousarray(tokens, dtype="<u4").data.cast("B")
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

    The token array is laid out once as little-endian uint32 bytes and each block is hashed
    straight from that buffer; the loop runs per block, never per token.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    buf = tokens_as_u32le(tokens)
    step = block_size * 4
    end = len(buf) - len(buf) % step
    seed = block_seed(lora_name, namespace)
    return [_xxh3(buf[i : i + step], seed) for i in range(0, end, step)]


def compute_sequence_hashes(local_hashes: Sequence[int]) -> list[int]:
    """Chained sequence hashes: seq[0] = local[0]; seq[i] = XXH3(le64(seq[i-1]) + le64(local[i]))."""
    if not local_hashes:
        return []
    pair = np.empty(2, dtype="<u8")
    raw = pair.data.cast("B")  # a live view: hashes what `pair` holds at each call
    out = [local_hashes[0]]
    prev = local_hashes[0]
    for h in local_hashes[1:]:
        pair[0] = prev
        pair[1] = h
        prev = _xxh3(raw, XXH3_SEED)
        out.append(prev)
    return out
