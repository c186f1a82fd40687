"""ResponseHomes: bounded in count, time and id length; a worker that leaves takes its homes."""

from __future__ import annotations

import pytest

from extproc.picker.response_homes import MAX_ID_CHARS, ResponseHomes
from extproc.router.types import Worker

W0, W1 = Worker("w0"), Worker("w1")


def remember(homes: ResponseHomes, rid: str, worker: Worker = W0, now: float = 0.0, model: str = "m") -> bool:
    return homes.remember(rid, model, worker, f"{worker.worker_id}:8000", "local", now)


def test_an_id_leads_to_its_worker_and_endpoint():
    homes = ResponseHomes()
    assert remember(homes, "resp_a", W1)
    home = homes.get("resp_a", 1.0)
    assert (home.model, home.worker, home.endpoint, home.group) == ("m", W1, "w1:8000", "local")
    assert homes.get("resp_b", 1.0) is None


def test_at_most_max_homes_the_least_recently_used_leaves_first():
    homes = ResponseHomes(max_homes=3)
    for rid in ("a", "b", "c"):
        remember(homes, rid)
    homes.get("a", 0.0)  # used: "b" is now the least recently used
    remember(homes, "d")
    assert len(homes) == 3 and homes.evicted == 1
    assert homes.get("b", 0.0) is None and homes.get("a", 0.0) is not None


def test_an_id_lapses_ttl_after_its_last_use():
    homes = ResponseHomes(ttl_s=10.0)
    remember(homes, "a", now=0.0)
    assert homes.get("a", 9.0) is not None  # used at 9: lives until 19
    assert homes.get("a", 18.0) is not None
    assert homes.get("a", 28.5) is None and homes.expired == 1


def test_unusable_ids_are_not_kept():
    homes = ResponseHomes()
    assert not remember(homes, "")
    assert not remember(homes, "x" * (MAX_ID_CHARS + 1))
    assert remember(homes, "x" * MAX_ID_CHARS) and len(homes) == 1


def test_a_worker_that_leaves_takes_its_homes():
    homes = ResponseHomes()
    remember(homes, "a", W0)
    remember(homes, "b", W1)
    remember(homes, "c", W0, model="other")
    assert homes.drop_worker("m", "w0") == 1
    assert homes.get("a", 0.0) is None and homes.get("b", 0.0) is not None and homes.get("c", 0.0) is not None


@pytest.mark.parametrize(("ttl_s", "max_homes"), [(0.0, 10), (-1.0, 10), (10.0, 0)])
def test_bad_bounds_are_refused(ttl_s, max_homes):
    with pytest.raises(ValueError):
        ResponseHomes(ttl_s, max_homes)


def test_an_id_remembered_at_an_earlier_time_than_the_ids_after_it_lapses_on_its_own_time():
    """Another replica hands over an id with its last use there: it lands after newer ids."""
    homes = ResponseHomes(ttl_s=10.0)
    remember(homes, "new", now=100.0)
    remember(homes, "old", now=92.0)
    assert [rid for rid, _ in homes.homes(101.9)] == ["new", "old"]
    assert [rid for rid, _ in homes.homes(102.0)] == ["new"]
    assert homes.get("old", 102.0) is None and homes.get("new", 102.0) is not None
    assert homes.expired == 1 and "old" not in homes and len(homes) == 1
