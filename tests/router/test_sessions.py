"""Sticky-session pins: sliding TTL, close, moves, workers leaving, and the bound on their number (LRU)."""

from __future__ import annotations

import pytest

from extproc.router import SessionPins, Worker

W0, W1 = Worker("w0"), Worker("w1")


def test_a_pin_lasts_its_ttl_after_the_last_use() -> None:
    pins = SessionPins(ttl_s=10.0)
    pins.pin("s", W0, now=0.0)
    assert pins.get("s", now=9.5) == W0
    pins.pin("s", W0, now=9.5)  # used again: the TTL slides
    assert pins.get("s", now=19.25) == W0
    assert pins.get("s", now=19.5) is None
    assert len(pins) == 0 and pins.expired == 1


def test_close_drops_the_pin() -> None:
    pins = SessionPins(ttl_s=10.0)
    pins.pin("s", W0, now=0.0)
    assert pins.close("s") and not pins.close("s")
    assert pins.get("s", now=1.0) is None


def test_repinning_to_another_worker_counts_a_move() -> None:
    pins = SessionPins(ttl_s=10.0)
    pins.pin("s", W0, now=0.0)
    pins.pin("s", W1, now=1.0)
    assert pins.get("s", now=2.0) == W1 and pins.moved == 1


def test_a_worker_leaving_drops_its_pins_only() -> None:
    pins = SessionPins(ttl_s=10.0)
    pins.pin("a", W0, now=0.0)
    pins.pin("b", W1, now=0.0)
    assert pins.drop_worker("w0") == 1
    assert pins.get("a", now=1.0) is None and pins.get("b", now=1.0) == W1


def test_expiry_sweeps_old_sessions_and_keeps_recent_ones() -> None:
    pins = SessionPins(ttl_s=500.0)
    for i in range(1000):
        pins.pin(f"s{i}", W0 if i % 2 else W1, now=float(i))
    assert pins.expire(now=999.5) == 500  # used at 499 s or before: gone
    assert len(pins) == 500
    assert pins.by_worker() == {W0: 250, W1: 250}


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SessionPins(ttl_s=0)


def test_pin_says_what_it_did() -> None:
    pins = SessionPins(ttl_s=10.0)
    assert pins.pin("s", W0, now=0.0) == "pinned"
    assert pins.pin("s", W0, now=1.0) == "refreshed"
    assert pins.pin("s", W1, now=2.0) == "moved"
    assert pins.pin("s", W1, now=3.0, group="g") == "moved"  # same worker, another group


def test_beyond_max_pins_the_least_recently_used_pin_is_evicted() -> None:
    pins = SessionPins(ttl_s=100.0, max_pins=3)
    for i, name in enumerate("abc"):
        pins.pin(name, W0, now=float(i))
    pins.pin("a", W0, now=3.0)  # used again: b is now the least recently used
    pins.pin("d", W1, now=4.0)
    assert len(pins) == 3 and pins.evicted == 1
    assert "b" not in pins and all(s in pins for s in "acd")
    for i in range(100):  # a flood of new ids never holds more than the bound
        pins.pin(f"flood{i}", W1, now=5.0 + i)
    assert len(pins) == 3 and pins.evicted == 101


def test_expire_sweeps_without_a_lookup() -> None:
    pins = SessionPins(ttl_s=10.0)
    pins.pin("old", W0, now=0.0)
    pins.pin("new", W1, now=5.0)
    assert pins.expire(now=12.0) == 1
    assert "old" not in pins and "new" in pins and pins.expired == 1


def test_max_pins_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SessionPins(ttl_s=1.0, max_pins=0)


def test_the_smallest_ttl_and_bound_are_accepted() -> None:
    assert SessionPins(ttl_s=0.5).ttl_s == 0.5
    pins = SessionPins(ttl_s=10.0, max_pins=1)
    pins.pin("a", W0, now=0.0)
    pins.pin("b", W0, now=1.0)
    assert "b" in pins and "a" not in pins and pins.evicted == 1


def test_the_counters_count_every_close_move_and_expiry() -> None:
    pins = SessionPins(ttl_s=10.0)
    assert (pins.closed, pins.moved, pins.expired, pins.evicted) == (0, 0, 0, 0)
    for s in ("a", "b", "c"):
        pins.pin(s, W0, now=0.0)
    assert pins.close("a") and pins.close("b") and not pins.close("a")
    assert pins.closed == 2
    pins.pin("c", W1, now=1.0)
    pins.pin("c", W0, now=2.0)
    assert pins.moved == 2
    pins.pin("d", W0, now=3.0)
    assert pins.expire(12.0) == 1  # c, last used at 2 s
    assert pins.expire(13.0) == 1  # d
    assert pins.expired == 2


def test_a_pin_counts_its_requests_and_keeps_its_group() -> None:
    pins = SessionPins(ttl_s=10.0)
    assert pins.pin("s", W0, now=0.0, group="g1") == "pinned"
    pin = pins.get_pin("s", now=0.0)
    assert (pin.worker, pin.requests, pin.group) == (W0, 1, "g1")
    assert pins.pin("s", W0, now=1.0, group="g1") == "refreshed"
    assert pins.pin("s", W0, now=2.0, group="g2") == "moved"  # same worker id, another group
    pin = pins.get_pin("s", now=2.0)
    assert (pin.requests, pin.group) == (3, "g2")
    pins.pin("t", W1, now=3.0)
    assert pins.get_pin("t", now=3.0).group == ""


def test_a_worker_leaving_one_group_keeps_the_pins_of_its_namesake_in_another() -> None:
    pins = SessionPins(ttl_s=10.0)
    pins.pin("a", W0, now=0.0, group="g1")
    pins.pin("b", W0, now=0.0, group="g2")
    pins.pin("c", W1, now=0.0, group="g1")
    assert pins.drop_worker("w0", group="g1") == 1
    assert "a" not in pins and "b" in pins and "c" in pins


def test_a_pin_with_an_open_worker_session_reports_every_way_it_leaves_but_close() -> None:
    left: list[tuple[str, str]] = []
    pins = SessionPins(ttl_s=10.0, max_pins=2, on_drop=lambda sid, endpoint: left.append((sid, endpoint)))
    a, b = Worker("a"), Worker("b")
    assert not pins.mark_opened("s", "10.0.0.1:8000")  # no pin yet: nothing to mark
    pins.pin("lapses", a, 0.0)
    pins.pin("plain", a, 0.0)  # never opened on its worker: leaves silently
    assert pins.mark_opened("lapses", "10.0.0.1:8000")
    pins.expire(9.9)
    assert left == []
    pins.expire(10.0)
    assert left == [("lapses", "10.0.0.1:8000")]
    pins.pin("moves", a, 10.0)
    pins.mark_opened("moves", "10.0.0.1:8000")
    pins.pin("moves", a, 11.0)  # the same worker: a refresh, no drop
    assert left == [("lapses", "10.0.0.1:8000")]
    pins.pin("moves", b, 12.0)  # another worker: its old session is told, the new pin is not opened
    assert left[-1] == ("moves", "10.0.0.1:8000")
    pins.mark_opened("moves", "10.0.0.2:8000")
    pins.pin("evicted", a, 13.0)
    pins.mark_opened("evicted", "10.0.0.1:8000")
    pins.pin("newest", a, 14.0)  # over max_pins: the least recently used pin ("moves") is evicted
    assert left[-1] == ("moves", "10.0.0.2:8000")
    pins.close("evicted")  # the caller closes the worker's session after the closing request
    assert left[-1] == ("moves", "10.0.0.2:8000")
    pins.pin("gone", b, 15.0)
    pins.mark_opened("gone", "10.0.0.2:8000")
    assert pins.drop_worker("b") == 1
    assert left == [
        ("lapses", "10.0.0.1:8000"), ("moves", "10.0.0.1:8000"), ("moves", "10.0.0.2:8000"),
        ("gone", "10.0.0.2:8000"),
    ]  # fmt: skip


def test_a_moved_pin_is_not_opened_on_its_new_worker_until_marked() -> None:
    left: list[tuple[str, str]] = []
    pins = SessionPins(ttl_s=10.0, on_drop=lambda sid, endpoint: left.append((sid, endpoint)))
    pins.pin("s", W0, 0.0)
    pins.mark_opened("s", "10.0.0.1:8000")
    pins.pin("s", W1, 1.0)  # moved: the old worker's session is told once
    assert left == [("s", "10.0.0.1:8000")]
    assert pins.get_pin("s", 1.0).opened_on is None
    pins.expire(11.0)  # the new worker never opened it: nothing more to close
    assert left == [("s", "10.0.0.1:8000")]


def test_a_pin_is_due_to_be_shared_once_per_interval() -> None:
    pins = SessionPins(ttl_s=60.0)
    assert not pins.share_due("s", 0.0, 0.0)  # no pin: nothing to share
    pins.pin("s", Worker("w0"), 10.0)
    assert pins.share_due("s", 10.0, 15.0)  # never shared
    assert not pins.share_due("s", 24.9, 15.0)
    assert pins.share_due("s", 25.0, 15.0)
    assert pins.share_due("s", 25.0, 0.0)  # a new pin or a move: at once


def test_a_pin_made_at_an_earlier_time_than_the_pins_after_it_lapses_on_its_own_time() -> None:
    """Another replica hands over a pin with its last use there: it lands after newer pins."""
    dropped: list[tuple[str, str]] = []
    pins = SessionPins(ttl_s=10.0, on_drop=lambda sid, endpoint: dropped.append((sid, endpoint)))
    pins.pin("new", W0, now=100.0)
    pins.pin("old", W1, now=92.0)
    pins.pin("older", W1, now=91.0)
    pins.mark_opened("old", "10.0.0.2:30000")
    assert [sid for sid, _ in pins.pins(101.9)] == ["new", "old"]
    assert [sid for sid, _ in pins.pins(102.0)] == ["new"]
    assert pins.get_pin("old", 102.0) is None and pins.get("older", 102.0) is None
    assert pins.get("new", 102.0) == W0
    assert pins.expired == 2 and "old" not in pins and dropped == [("old", "10.0.0.2:30000")]
