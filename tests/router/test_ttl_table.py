"""TtlTable: the bound in number and in time that sticky-session pins and stored answers' homes share."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from extproc.router.ttl_table import TtlTable


@dataclass
class Entry:
    last_used_s: float
    name: str = ""


def table(ttl_s: float = 10.0, max_entries: int | None = None) -> tuple[TtlTable[Entry], list[str]]:
    heard: list[str] = []
    return TtlTable(ttl_s, max_entries, on_drop=lambda key, e: heard.append(key)), heard


def test_an_entry_lapses_ttl_after_its_last_use_and_a_use_restarts_it() -> None:
    t, heard = table(ttl_s=10.0)
    t.put("a", Entry(0.0))
    t.used("a", 8.0)
    assert t.get("a", 17.9) is not None  # 9.9 s after its last use
    assert t.get("a", 18.0) is None  # exactly ttl_s: lapsed
    assert "a" not in t and t.expired == 1 and heard == ["a"]


def test_a_lookup_is_not_a_use() -> None:
    t, _ = table(ttl_s=10.0)
    t.put("a", Entry(0.0))
    assert t.get("a", 9.0) is not None
    assert t.get("a", 10.0) is None


def test_an_entry_older_than_the_ones_after_it_lapses_on_its_own_time() -> None:
    """Handed over by another replica with its last use there, it lands behind newer entries."""
    t, heard = table(ttl_s=10.0)
    t.put("new", Entry(100.0))
    t.put("old", Entry(92.0))
    assert t.expire(101.0) == 0  # the sweep stops at the first live entry
    assert [key for key, _ in t.live(102.5)] == ["new"]  # listed only while live
    assert t.get("old", 102.5) is None and heard == ["old"] and t.expired == 1
    assert t.get("new", 102.5) is not None


def test_expire_sweeps_oldest_first_and_tells_of_each() -> None:
    t, heard = table(ttl_s=10.0)
    for i in range(5):
        t.put(f"k{i}", Entry(float(i)))
    assert t.expire(12.5) == 3  # used at 0, 1 and 2
    assert heard == ["k0", "k1", "k2"] and len(t) == 2 and t.expired == 3
    assert [key for key, _ in t.live(12.5)] == ["k3", "k4"]


def test_beyond_the_bound_the_least_recently_used_entry_is_evicted() -> None:
    t, heard = table(ttl_s=100.0, max_entries=2)
    t.put("a", Entry(0.0))
    t.put("b", Entry(1.0))
    t.used("a", 2.0)  # b is now the least recently used
    t.put("c", Entry(3.0))
    assert heard == ["b"] and t.evicted == 1 and "a" in t and "c" in t
    t.put("c", Entry(4.0, "again"))  # a key already kept is replaced: nothing evicted
    assert t.evicted == 1 and len(t) == 2 and t.peek("c") == Entry(4.0, "again")
    assert [key for key, _ in t.live(5.0)] == ["a", "c"]  # replaced: the most recently used


def test_pop_takes_an_entry_out_without_telling_anyone() -> None:
    t, heard = table()
    t.put("a", Entry(0.0))
    assert t.pop("a") == Entry(0.0) and t.pop("a") is None
    assert heard == [] and len(t) == 0 and t.expired == 0


def test_drop_where_drops_what_it_is_told_and_tells_of_each() -> None:
    t, heard = table()
    for key, name in (("a", "w0"), ("b", "w1"), ("c", "w0")):
        t.put(key, Entry(0.0, name))
    assert t.drop_where(lambda e: e.name == "w0") == 2
    assert heard == ["a", "c"] and list(t.entries()) == [Entry(0.0, "w1")]
    assert t.expired == 0 and t.evicted == 0


def test_peek_and_entries_show_lapsed_entries_too() -> None:
    t, _ = table(ttl_s=1.0)
    t.put("a", Entry(0.0))
    assert t.peek("a") == Entry(0.0) and list(t.entries()) == [Entry(0.0)]  # no sweep, no clock
    assert t.peek("b") is None


def test_without_a_listener_entries_still_go() -> None:
    t: TtlTable[Entry] = TtlTable(1.0, 1)
    t.put("a", Entry(0.0))
    t.put("b", Entry(0.5))
    assert t.expire(2.0) == 1 and len(t) == 0 and t.evicted == 1


@pytest.mark.parametrize(
    ("ttl_s", "max_entries", "named"), [(0.0, None, "ttl_s"), (-1.0, 5, "ttl_s"), (1.0, 0, "max_entries")]
)
def test_bad_bounds_are_refused(ttl_s: float, max_entries: int | None, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        TtlTable(ttl_s, max_entries)


def test_the_smallest_bounds_are_accepted() -> None:
    t: TtlTable[Entry] = TtlTable(0.5, 1)
    assert t.ttl_s == 0.5 and t.max_entries == 1
