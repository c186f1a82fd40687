"""TokenCache: keys, the bytes bound, least-recently-used eviction, counters and their Prometheus metrics."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from extproc.request.cache_metrics import TokenCacheCollector
from extproc.request.token_cache import SMALL_PIECE_CHARS, TokenCache, _entry_bytes, piece_key


def test_short_pieces_are_their_own_key_long_ones_a_digest_and_length():
    short = "x" * SMALL_PIECE_CHARS
    assert piece_key(short) == short
    long_a, long_b = "a" * 1000, "a" * 999 + "b"
    key_a = piece_key(long_a)
    assert isinstance(key_a, bytes) and len(key_a) == 24
    assert key_a == piece_key("a" * 1000) and key_a != piece_key(long_b)
    assert piece_key("\ud800" * 100) != piece_key("\udc00" * 100)  # lone surrogates hash, never raise


def test_get_many_finds_what_put_many_stored_and_counts():
    cache = TokenCache(1 << 20)
    assert cache.get_many(["a", "b"]) == [None, None]
    stored = cache.put_many([("a", [1, 2, 3]), ("b", [4])])
    assert [list(ids) for ids in stored] == [[1, 2, 3], [4]]
    found = cache.get_many(["a", "c", "b"])
    assert [list(ids) if ids is not None else None for ids in found] == [[1, 2, 3], None, [4]]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.hit_tokens, stats.miss_tokens) == (2, 3, 4, 4)
    assert stats.entries == 2 and stats.evictions == 0 and stats.token_hit_ratio == 0.5


def test_the_bytes_bound_holds_and_the_least_recently_used_goes_first():
    one = _entry_bytes("k0", TokenCache(1).put_many([("k0", range(100))])[0])
    cache = TokenCache(3 * one)
    cache.put_many([(f"k{i}", range(100)) for i in range(3)])
    assert cache.stats().bytes == 3 * one
    cache.get_many(["k0"])  # k0 becomes the most recent: k1 is now the least
    cache.put_many([("k3", range(100))])
    assert [ids is not None for ids in cache.get_many(["k0", "k1", "k2", "k3"])] == [True, False, True, True]
    stats = cache.stats()
    assert stats.evictions == 1 and stats.entries == 3 and stats.bytes == 3 * one <= stats.capacity_bytes
    for i in range(4, 50):
        cache.put_many([(f"k{i}", range(100 + i))])
        assert cache.stats().bytes <= cache.max_bytes


def test_an_entry_larger_than_the_bound_is_returned_not_kept():
    cache = TokenCache(1_000)
    (ids,) = cache.put_many([("big", range(1_000))])
    assert len(ids) == 1_000
    assert cache.get_many(["big"]) == [None]
    assert cache.stats().bytes == 0


def test_storing_a_key_again_replaces_it_without_counting_twice():
    cache = TokenCache(1 << 20)
    cache.put_many([("a", [1, 2])])
    cache.put_many([("a", [1, 2, 3])])
    stats = cache.stats()
    assert stats.entries == 1 and stats.bytes == _entry_bytes("a", cache.get_many(["a"])[0])  # type: ignore[arg-type]


def test_clear_drops_entries_and_keeps_counters():
    cache = TokenCache(1 << 20)
    cache.put_many([("a", [1])])
    cache.get_many(["a"])
    cache.clear()
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.hits) == (0, 0, 1)


@pytest.mark.parametrize("max_bytes", [0, -1])
def test_a_cache_needs_a_positive_bound(max_bytes: int):
    with pytest.raises(ValueError, match="max_bytes"):
        TokenCache(max_bytes)


def test_threads_sharing_the_cache_keep_its_size_exact():
    cache = TokenCache(64 * 1024)

    def work(n: int) -> None:
        for i in range(300):
            key = f"t{(n * 7 + i) % 150}"
            if cache.get_many([key])[0] is None:
                cache.put_many([(key, range(i % 97 + 1))])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = list(cache._entries.items())
    assert cache.stats().bytes == sum(size for _, (_, size) in entries) <= cache.max_bytes
    assert all(size == _entry_bytes(key, ids) for key, (ids, size) in entries)


def test_collector_renders_each_models_counters_and_skips_models_without_a_cache():
    cache = TokenCache(1 << 20)
    cache.put_many([("a", [1, 2, 3])])
    cache.get_many(["a", "b"])
    registry = CollectorRegistry()
    registry.register(TokenCacheCollector(lambda: {"llama": cache.stats(), "remote": None}))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"extproc_tokenizer_cache_{name}", {"model": "llama", **labels})

    assert value("lookups_total", result="hit") == 1 and value("lookups_total", result="miss") == 1
    assert value("tokens_total", result="hit") == 3 and value("tokens_total", result="miss") == 3
    assert value("entries") == 1 and value("evictions_total") == 0
    assert value("bytes") == cache.stats().bytes and value("capacity_bytes") == 1 << 20
    assert 'model="remote"' not in generate_latest(registry).decode()
