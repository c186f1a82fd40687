"""BlockHashCache: hashes from the prefix cache equal the uncached ones; the cache stays in its bound."""

import random

import pytest

from extproc.router.hashing import (
    BlockHashCache,
    PromptTokens,
    _hash_blocks,
    block_seed,
    compute_block_hashes,
    compute_sequence_hashes,
    tokens_as_u32le,
)


def _uncached(tokens, block_size, seed):
    buf = tokens_as_u32le(list(tokens))
    end = len(buf) - len(buf) % (4 * block_size)
    return _hash_blocks(buf[:end], 4 * block_size, seed)


def _cached(cache, tokens, block_size, seed):
    buf = tokens_as_u32le(PromptTokens("I", tokens))
    end = len(buf) - len(buf) % (4 * block_size)
    return cache.block_hashes(buf[:end], block_size, seed)


@pytest.mark.parametrize("block_size", [16, 64])
def test_cached_hashes_equal_uncached_over_random_growing_and_branching_prompts(block_size):
    rng = random.Random(block_size)
    cache = BlockHashCache(8 << 20, checkpoint_tokens=256)
    chats = [[rng.randrange(2**32) for _ in range(rng.randrange(0, 600))] for _ in range(6)]
    earlier = []  # what the cache returned before: a later prompt may take its record's lists over
    for _ in range(300):
        chat = rng.choice(chats)
        action = rng.random()
        if action < 0.6:
            chat += [rng.randrange(128) for _ in range(rng.randrange(1, 400))]
        elif action < 0.8 and chat:  # an edit: the same length, a token changed somewhere
            chat[rng.randrange(len(chat))] ^= 1
        elif chat:
            del chat[rng.randrange(len(chat)) :]
        seed = block_seed(rng.choice([None, "lora"]), rng.choice([None, "ns"]))
        local = _cached(cache, chat, block_size, seed)
        expected = _uncached(chat, block_size, seed)
        assert local == expected
        assert compute_sequence_hashes(local) == compute_sequence_hashes(expected)
        assert compute_sequence_hashes(local) == compute_sequence_hashes(expected)  # remembered
        earlier.append((local, expected))
        held = {id(r) for r in cache._records.values()}
        assert all(id(r) in held for r in cache._index.values())  # no key leads outside the bound
        old_local, old_expected = rng.choice(earlier)
        assert old_local == old_expected
        assert compute_sequence_hashes(old_local) == compute_sequence_hashes(old_expected)
    stats = cache.stats()
    assert stats.hits > 50 and stats.hit_blocks > 0


def test_compute_block_hashes_uses_the_cache_only_for_prompt_tokens():
    rng = random.Random(7)
    tokens = [rng.randrange(128_000) for _ in range(20_000)]
    plain = compute_block_hashes(tokens, 16, namespace="x")
    assert type(plain) is list
    for _ in range(2):
        cached = compute_block_hashes(PromptTokens("I", tokens), 16, namespace="x")
        assert cached == plain
        assert compute_sequence_hashes(cached) == compute_sequence_hashes(plain)


def test_a_changed_list_is_chained_from_what_it_holds():
    cache = BlockHashCache(1 << 20, checkpoint_tokens=16)
    tokens = list(range(16 * 40))
    local = _cached(cache, tokens, 16, 1337)
    compute_sequence_hashes(local)
    local[3] ^= 1
    assert compute_sequence_hashes(local) == compute_sequence_hashes(list(local))
    again = _cached(cache, tokens, 16, 1337)  # the cache was not changed through the list
    assert again == _uncached(tokens, 16, 1337)


def test_the_cache_stays_within_its_bytes_and_drops_superseded_turns():
    rng = random.Random(3)
    cache = BlockHashCache(300_000, checkpoint_tokens=64)
    chat: list[int] = []
    for _ in range(20):  # one growing chat: each turn supersedes the one before
        chat += [rng.randrange(2**32) for _ in range(500)]
        _cached(cache, chat, 16, 1337)
        assert cache.stats().entries == 1
    for _ in range(50):  # many distinct prompts: evicted, least recently used first
        _cached(cache, [rng.randrange(2**32) for _ in range(3000)], 16, 1337)
        stats = cache.stats()
        assert stats.bytes <= stats.capacity_bytes
    assert cache.stats().evictions > 0
    off = BlockHashCache(0)
    assert _cached(off, chat, 16, 1337) == _uncached(chat, 16, 1337)
    assert off.stats().entries == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        BlockHashCache(-1)
    with pytest.raises(ValueError, match="checkpoint_tokens"):
        BlockHashCache(1, checkpoint_tokens=0)


def test_the_picker_exposes_the_cache_metrics():
    from prometheus_client import generate_latest

    from extproc.config import ModelConfig, PickerConfig, WorkerConfig
    from extproc.picker.pipeline import EndpointPicker
    from extproc.router import RouterConfig

    config = PickerConfig(
        router=RouterConfig(),
        workers=(WorkerConfig("w0", "127.0.0.1:8000", "m"),),
        models=(ModelConfig("m"),),
    )
    text = generate_latest(EndpointPicker(config).metrics.registry).decode()
    for name in ("lookups_total", "blocks_total", "evictions_total", "bytes", "entries", "capacity_bytes"):
        assert f"extproc_block_hash_cache_{name}" in text


def test_a_turn_too_large_to_keep_leaves_no_key_to_the_turn_it_took_over():
    rng = random.Random(5)
    chat = [rng.randrange(2**32) for _ in range(1000)]
    cache = BlockHashCache(1 << 20, checkpoint_tokens=64)
    _cached(cache, chat, 16, 1337)
    cache.max_bytes = cache.stats().bytes + 100  # the next turn, far longer, does not fit
    longer = chat + [rng.randrange(2**32) for _ in range(5000)]
    assert _cached(cache, longer, 16, 1337) == _uncached(longer, 16, 1337)
    assert cache.stats().entries == 0 and not cache._index  # the turn it took over is gone, keys too
    assert _cached(cache, chat, 16, 1337) == _uncached(chat, 16, 1337)
