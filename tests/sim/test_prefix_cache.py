"""Block pool: prefix matching, all-or-nothing allocation, tail-first LRU eviction, listener calls."""

from collections.abc import Sequence

import pytest

from extproc.sim.prefix_cache import BlockTable, KvCacheListener, PrefixCache

B = 4


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.salts: list[str] = []

    def on_stored(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
    ) -> None:
        self.events.append(("stored", parent_hash, list(block_hashes), [list(t) for t in token_ids]))
        if cache_salt is not None:
            self.salts.append(cache_salt)

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        self.events.append(("removed", list(block_hashes)))

    def on_cleared(self) -> None:
        self.events.append(("cleared",))


def test_recorder_satisfies_the_listener_protocol():
    listener: KvCacheListener = Recorder()
    assert PrefixCache(4, B, listener).listener is listener


def hold(cache: PrefixCache, hashes: list[int], num_tokens: int | None = None) -> BlockTable:
    table = BlockTable()
    assert cache.allocate(table, hashes, num_tokens if num_tokens is not None else len(hashes) * B)
    return table


def test_match_prefix_counts_leading_pooled_blocks_only():
    cache = PrefixCache(8, B)
    hold(cache, [1, 2, 3])
    assert cache.match_prefix([1, 2, 3, 4]) == 3
    assert cache.match_prefix([1, 9, 3]) == 1
    assert cache.match_prefix([9, 1]) == 0


def test_shared_blocks_take_one_slot_and_stay_active_until_every_holder_releases():
    cache = PrefixCache(8, B)
    a = hold(cache, [1, 2])
    b = hold(cache, [1, 2, 3])
    assert cache.num_active_blocks == 3
    cache.release(a)
    assert cache.num_active_blocks == 3
    cache.release(b)
    assert (cache.num_active_blocks, cache.num_cached_blocks, cache.num_free_blocks) == (0, 3, 8)


def test_release_is_tail_first_so_the_tail_is_evicted_before_the_head():
    cache = PrefixCache(4, B)
    cache.release(hold(cache, [1, 2, 3, 4]))
    hold(cache, [10, 11])  # needs two slots: evicts 4 then 3
    assert cache.match_prefix([1, 2, 3, 4]) == 2
    assert 3 not in cache and 4 not in cache


def test_least_recently_released_request_is_evicted_first():
    cache = PrefixCache(4, B)
    a, b = hold(cache, [1, 2]), hold(cache, [5, 6])
    cache.release(a)
    cache.release(b)
    hold(cache, [9, 10])
    assert cache.match_prefix([1, 2]) == 0
    assert cache.match_prefix([5, 6]) == 2


def test_allocation_is_all_or_nothing():
    cache = PrefixCache(4, B)
    hold(cache, [1, 2])
    table = BlockTable()
    assert not cache.allocate(table, [5, 6, 7], 3 * B)
    assert table == BlockTable()
    assert (cache.num_active_blocks, cache.num_free_blocks) == (2, 2)
    assert cache.allocate(table, [5, 6], 2 * B)


def test_reused_cached_blocks_do_not_count_as_free_room():
    cache = PrefixCache(3, B)
    cache.release(hold(cache, [1, 2, 3]))
    # reusing 1, 2, 3 leaves no room for a fourth block, even though all three were evictable
    assert not cache.allocate(BlockTable(), [1, 2, 3, 4], 4 * B)
    assert cache.allocate(BlockTable(), [1, 2, 3], 3 * B)


def test_partial_tail_block_is_anonymous_and_goes_straight_back_free():
    cache = PrefixCache(4, B)
    table = hold(cache, [1, 2], num_tokens=2 * B + 1)
    assert table.num_blocks == 3 and cache.num_active_blocks == 3
    cache.release(table)
    assert (cache.num_active_blocks, cache.num_cached_blocks) == (0, 2)


def test_growing_a_partial_block_into_a_full_one_reuses_its_slot():
    cache = PrefixCache(2, B)
    table = hold(cache, [1], num_tokens=B + 3)
    assert cache.allocate(table, [1, 2], 2 * B)
    assert table == BlockTable([1, 2], has_partial=False)
    assert cache.num_active_blocks == 2


def test_listener_hears_stored_runs_with_parents_then_evictions_and_clear():
    rec = Recorder()
    cache = PrefixCache(3, B, rec)
    tokens = list(range(3 * B))
    a = BlockTable()
    assert cache.allocate(a, [1, 2, 3], 3 * B, tokens)
    cache.release(a)
    assert cache.allocate(BlockTable(), [1, 7], 2 * B, tokens)  # reuses 1, evicts 3 for 7
    cache.clear_cached()
    assert rec.events == [
        ("stored", None, [1, 2, 3], [tokens[0:4], tokens[4:8], tokens[8:12]]),
        ("removed", [3]),
        ("stored", 1, [7], [tokens[4:8]]),
        ("removed", [2]),
    ]


def test_clearing_a_pool_with_nothing_active_reports_cleared():
    rec = Recorder()
    cache = PrefixCache(2, B, rec)
    cache.release(hold(cache, [4]))
    rec.events.clear()
    cache.clear_cached()
    assert rec.events == [("cleared",)]
    assert cache.num_free_blocks == 2 and 4 not in cache


def test_query_counters_are_in_tokens():
    cache = PrefixCache(4, B)
    cache.record_query(10, 8)
    cache.record_query(5, 0)
    assert (cache.queried_tokens, cache.hit_tokens) == (15, 8)


def test_too_few_hashes_for_the_tokens_is_a_caller_error():
    with pytest.raises(ValueError):
        PrefixCache(4, B).allocate(BlockTable(), [1], 2 * B)


def test_the_listener_hears_the_salt_of_the_request_that_stored_the_blocks():
    recorder = Recorder()
    cache = PrefixCache(8, B, recorder)
    cache.allocate(BlockTable(), [11, 12], 2 * B, list(range(2 * B)), cache_salt="tenant-a")
    cache.allocate(BlockTable(), [21], B, list(range(B)))
    assert recorder.salts == ["tenant-a"] and [e[2] for e in recorder.events] == [[11, 12], [21]]
