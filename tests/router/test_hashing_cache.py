"""BlockHashCache's bookkeeping as its metrics report it: the bytes it holds, what it evicts and in
which order, what it counts, and that a branch or a replaced turn keeps what it should.

Every prompt here uses blocks of 4 tokens and a checkpoint every 8 tokens (2 blocks), so a prompt of
24 tokens has 6 blocks and 3 checkpoints. The bytes a prompt takes are the cache's documented
estimate: its ids' bytes, a slot per hash held (local and sequence), per checkpoint and per prompt.
"""

import random
import uuid

import pytest

from extproc.router.hashing import (
    _CHECKPOINT_BYTES,
    _HASH_ITEM_BYTES,
    _RECORD_BYTES,
    CHECKPOINT_TOKENS,
    PREFIX_CACHE,
    BlockHashCache,
    PromptTokens,
    _hash_blocks,
    compute_block_hashes,
    compute_sequence_hashes,
    tokens_as_u32le,
)

BS, CP, SEED = 4, 8, 1337


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(2**32) for _ in range(n)]


def _look(cache: BlockHashCache, tokens: list[int]) -> list[int]:
    buf = tokens_as_u32le(PromptTokens("I", tokens))
    end = len(buf) - len(buf) % (4 * BS)
    return cache.block_hashes(buf[:end], BS, SEED)


def _uncached(tokens: list[int]) -> list[int]:
    buf = tokens_as_u32le(tokens)
    end = len(buf) - len(buf) % (4 * BS)
    return _hash_blocks(buf[:end], 4 * BS, SEED)


def _size(n_tokens: int, seq: int = 0) -> int:
    """The bytes a prompt of `n_tokens` takes with `seq` of its sequence hashes known."""
    blocks = n_tokens // BS
    checkpoints = n_tokens // CP
    return (
        blocks * BS * 4 + (blocks + seq) * _HASH_ITEM_BYTES + checkpoints * _CHECKPOINT_BYTES + _RECORD_BYTES
    )


def _counts(cache: BlockHashCache) -> tuple[int, int, int, int]:
    s = cache.stats()
    return s.lookups, s.hits, s.hit_blocks, s.miss_blocks


def test_a_new_cache_holds_and_has_counted_nothing():
    stats = BlockHashCache(1000).stats()
    assert (stats.lookups, stats.hits, stats.hit_blocks, stats.miss_blocks, stats.evictions) == (
        0,
        0,
        0,
        0,
        0,
    )
    assert (stats.entries, stats.bytes, stats.capacity_bytes) == (0, 0, 1000)
    assert stats.block_hit_ratio == 0.0


def test_a_checkpoint_every_token_is_accepted():
    cache = BlockHashCache(1 << 20, checkpoint_tokens=1)
    tokens = list(range(12))
    assert _look(cache, tokens) == _uncached(tokens)
    assert _look(cache, tokens) == _uncached(tokens)
    assert cache.stats().hits == 1


def test_a_checkpoint_of_one_block_finds_a_one_block_prompt():
    cache = BlockHashCache(1 << 20, checkpoint_tokens=BS)
    _look(cache, [1, 2, 3, 4])
    assert cache.stats().entries == 1
    _look(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert _counts(cache) == (2, 1, 1, 2)


def test_the_counters_count_lookups_hits_and_blocks():
    rng = random.Random(1)
    cache = BlockHashCache(1 << 20, checkpoint_tokens=CP)
    a = _ids(rng, 24)
    _look(cache, a)
    assert _counts(cache) == (1, 0, 0, 6)
    _look(cache, a)  # the same prompt again: every block from the cache
    assert _counts(cache) == (2, 1, 6, 6)
    b = a + _ids(rng, 8)
    assert _look(cache, b) == _uncached(b)
    assert _counts(cache) == (3, 2, 12, 8)  # the next turn: its 6 leading blocks found, 2 hashed
    _look(cache, _ids(rng, 24))  # an unrelated prompt
    assert _counts(cache) == (4, 2, 12, 14)
    _look(cache, _ids(rng, 7))  # shorter than a checkpoint: not looked up
    assert _counts(cache) == (4, 2, 12, 14)
    assert cache.stats().block_hit_ratio == pytest.approx(12 / 26)


def test_a_next_turn_is_hashed_like_the_uncached_prompt():
    rng = random.Random(2)
    cache = BlockHashCache(1 << 20, checkpoint_tokens=CP)
    a = _ids(rng, 24)
    _look(cache, a)
    b = a + _ids(rng, 10)
    assert _look(cache, b) == _uncached(b)


def test_a_disabled_cache_counts_and_holds_nothing():
    cache = BlockHashCache(0, checkpoint_tokens=CP)
    tokens = _ids(random.Random(3), 24)
    assert _look(cache, tokens) == _uncached(tokens)
    assert _look(cache, tokens) == _uncached(tokens)
    stats = cache.stats()
    assert stats == BlockHashCache(0).stats()  # a disabled cache counts no lookup and no block


def test_the_bytes_are_the_ids_and_hashes_held_through_a_replaced_turn():
    rng = random.Random(4)
    cache = BlockHashCache(1 << 20, checkpoint_tokens=CP)
    a = _ids(rng, 24)
    local = _look(cache, a)
    assert cache.stats().bytes == _size(24)
    assert compute_sequence_hashes(local) == compute_sequence_hashes(_uncached(a))
    assert cache.stats().bytes == _size(24, seq=6)  # its sequence hashes are held too
    compute_sequence_hashes(local)
    assert cache.stats().bytes == _size(24, seq=6)  # once
    b = a + _ids(rng, 16)  # the next turn replaces it and carries over its 6 sequence hashes
    local = _look(cache, b)
    assert (cache.stats().entries, cache.stats().bytes) == (1, _size(40, seq=6))
    assert compute_sequence_hashes(local) == compute_sequence_hashes(_uncached(b))
    assert (cache.stats().entries, cache.stats().bytes) == (1, _size(40, seq=10))


def test_a_prompt_of_exactly_the_capacity_is_held_and_a_larger_one_is_not():
    tokens = _ids(random.Random(5), 24)
    exact = BlockHashCache(_size(24), checkpoint_tokens=CP)
    _look(exact, tokens)
    assert (exact.stats().entries, exact.stats().bytes, exact.stats().evictions) == (1, _size(24), 0)
    small = BlockHashCache(_size(24) - 1, checkpoint_tokens=CP)
    assert _look(small, tokens) == _uncached(tokens)
    assert (small.stats().entries, small.stats().bytes, small.stats().evictions) == (0, 0, 0)


def test_eviction_drops_the_least_recently_used_prompt_and_releases_its_bytes():
    rng = random.Random(6)
    a, b, c, d = (_ids(rng, 24) for _ in range(4))
    cache = BlockHashCache(2 * _size(24), checkpoint_tokens=CP)  # exactly two prompts

    def held() -> tuple[int, int, int]:
        s = cache.stats()
        return s.entries, s.bytes, s.evictions

    _look(cache, a)
    _look(cache, b)
    assert held() == (2, 2 * _size(24), 0)  # at the bound is within it
    _look(cache, c)
    assert held() == (2, 2 * _size(24), 1)  # a, the oldest, made room
    _look(cache, b)  # used again: now c is the oldest
    assert cache.stats().hits == 1
    _look(cache, d)
    assert held() == (2, 2 * _size(24), 2)  # c made room
    _look(cache, b)
    _look(cache, d)
    assert cache.stats().hits == 3  # b and d are held
    _look(cache, a)  # evicted: not found, hashed and held again (b, the oldest, makes room)
    _look(cache, c)  # evicted: not found (d makes room)
    assert cache.stats().hits == 3
    assert held() == (2, 2 * _size(24), 4)


def test_an_evicted_prompt_releases_its_sequence_hashes_bytes_too():
    rng = random.Random(7)
    a, b, c = (_ids(rng, 24) for _ in range(3))
    cache = BlockHashCache(_size(24, seq=6) + _size(24), checkpoint_tokens=CP)
    compute_sequence_hashes(_look(cache, a))
    _look(cache, b)
    assert (cache.stats().entries, cache.stats().bytes) == (2, _size(24, seq=6) + _size(24))
    _look(cache, c)  # a goes, with its sequence hashes
    assert (cache.stats().entries, cache.stats().bytes, cache.stats().evictions) == (2, 2 * _size(24), 1)


def test_sequence_hashes_that_outgrow_the_bound_evict():
    rng = random.Random(8)
    a, b = _ids(rng, 24), _ids(rng, 24)
    cache = BlockHashCache(2 * _size(24), checkpoint_tokens=CP)
    _look(cache, a)
    local = _look(cache, b)
    assert compute_sequence_hashes(local) == compute_sequence_hashes(_uncached(b))
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (1, _size(24, seq=6), 1)  # a made room


def test_a_branch_keeps_the_prompt_it_shares_a_prefix_with():
    rng = random.Random(9)
    a = _ids(rng, 24)
    b = a[:8] + _ids(rng, 16)  # shares a's first checkpoint only
    c = a[:16] + _ids(rng, 8)  # shares a's first two
    cache = BlockHashCache(1 << 20, checkpoint_tokens=CP)
    _look(cache, a)
    assert _look(cache, b) == _uncached(b)
    assert _counts(cache) == (2, 1, 2, 10)  # b's first 2 blocks came from a
    assert (cache.stats().entries, cache.stats().bytes) == (2, 2 * _size(24))  # a still held
    assert _look(cache, c) == _uncached(c)
    assert _counts(cache) == (3, 2, 6, 12)  # c's first 4 blocks came from a
    assert cache.stats().entries == 3
    _look(cache, a)  # a is still found whole
    assert _counts(cache) == (4, 3, 12, 12)


def test_clear_drops_every_entry_and_keeps_the_counters():
    rng = random.Random(10)
    a = _ids(rng, 24)
    cache = BlockHashCache(1 << 20, checkpoint_tokens=CP)
    compute_sequence_hashes(_look(cache, a))
    cache.clear()
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.lookups, stats.miss_blocks) == (0, 0, 1, 6)
    _look(cache, a)  # not found after clear
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.hits) == (1, _size(24), 0)


def test_prompt_tokens_are_looked_up_in_the_process_cache_and_other_ids_are_not():
    namespace = f"test-{uuid.uuid4()}"  # blocks no other test hashed
    tokens = _ids(random.Random(11), 2 * CHECKPOINT_TOKENS)
    before = PREFIX_CACHE.stats()
    plain = compute_block_hashes(tokens, 16, namespace=namespace)
    assert PREFIX_CACHE.stats().lookups == before.lookups
    for _ in range(2):
        assert compute_block_hashes(PromptTokens("I", tokens), 16, namespace=namespace) == plain
    after = PREFIX_CACHE.stats()
    assert (after.lookups - before.lookups, after.hits - before.hits) == (2, 1)
    assert after.hit_blocks - before.hit_blocks == len(plain)
