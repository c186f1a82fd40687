"""LoadOrder and TimedLoadOrder on their own: each agrees with a plain model of the workers' states
(busy, idle or in an idle class, keyed) after any sequence of changes, and answers the rank
queries the router's fleet-sized decisions draw ties with."""

import random

import pytest

from extproc.router.load_order import LoadOrder, TimedLoadOrder
from extproc.router.types import Worker

N = 12
WORKERS = [Worker(f"w{i}") for i in range(N)]


def _check_load_order(order: LoadOrder, model: dict[int, float | str | None]) -> None:
    idle = [r for r in range(N) if model[r] == "idle"]
    keyed = sorted((k, r) for r, k in model.items() if isinstance(k, float))
    assert order.idle == idle
    assert order.keyed == keyed
    assert len(order) == len(idle) + len(keyed)
    for r in range(N):
        assert order.is_idle(r) is (model[r] == "idle")
        assert order.is_busy(r) is (model[r] is None)


def test_workers_start_idle_in_rank_order():
    order = LoadOrder(WORKERS)
    assert order.workers == WORKERS and order.rank == {w: i for i, w in enumerate(WORKERS)}
    _check_load_order(order, dict.fromkeys(range(N), "idle"))


@pytest.mark.parametrize("seed", range(4))
def test_load_order_agrees_with_a_model_of_the_states(seed):
    rng = random.Random(seed)
    order = LoadOrder(WORKERS)
    model: dict[int, float | str | None] = dict.fromkeys(range(N), "idle")
    for _ in range(400):
        r = rng.randrange(N)
        action = rng.random()
        if action < 0.4:
            key = float(rng.randrange(4))  # few keys: ties keep rank order
            order.set_key(r, key)
            model[r] = key
        elif action < 0.7:
            order.set_busy(r)
            model[r] = None
        else:
            order.set_idle(r)
            model[r] = "idle"
        _check_load_order(order, model)


def test_setting_the_same_state_again_changes_nothing():
    order = LoadOrder(WORKERS)
    order.set_key(3, 2.0)
    order.set_key(3, 2.0)
    order.set_busy(4)
    order.set_busy(4)
    order.set_idle(5)
    assert order.keyed == [(2.0, 3)]
    assert order.idle == [r for r in range(N) if r not in (3, 4)]
    assert len(order) == N - 1


@pytest.mark.parametrize("seed", range(3))
def test_idle_rank_at_is_the_index_into_the_idle_ranks_less_excluded_plus_extra(seed):
    rng = random.Random(seed)
    for _ in range(100):
        order = LoadOrder(WORKERS)
        for r in rng.sample(range(N), rng.randrange(N)):
            if rng.random() < 0.5:
                order.set_busy(r)
            else:
                order.set_key(r, 1.0)
        idle = list(order.idle)
        excluded = sorted(rng.sample(idle, rng.randrange(len(idle) + 1)))
        others = [r for r in range(N) if r not in idle or r in excluded]
        extra = sorted(rng.sample(others, rng.randrange(len(others) + 1)))
        merged = sorted((set(idle) - set(excluded)) | set(extra))
        assert [order.idle_rank_at(i, excluded, extra) for i in range(len(merged))] == merged


# --- TimedLoadOrder ------------------------------------------------------------------------------


def _check_timed(order: TimedLoadOrder, model: dict[int, tuple], class_key: dict[str, float]) -> None:
    keyed = sorted((m[1], r) for r, m in model.items() if m[0] == "key")
    assert order.keyed == keyed
    assert order.streams == {r: m[2] for r, m in model.items() if m[0] == "key" and m[2] is not None}
    members: dict[str, list[int]] = {}
    for r, m in model.items():
        if m[0] == "class":
            members.setdefault(m[1], []).append(r)
    ids = {}
    for cls, ranks in members.items():
        cid = order.class_id(ranks[0])
        assert cid is not None and all(order.class_id(r) == cid for r in ranks)
        assert order.classes[cid] == ranks  # ascending
        ids[cls] = cid
    assert len(set(ids.values())) == len(ids)  # one id per class
    assert set(order.classes) == set(ids.values())  # emptied classes are gone
    assert order.class_keys == sorted((class_key[cls], cid) for cls, cid in ids.items())
    for r, m in model.items():
        assert order.is_busy(r) is (m[0] == "busy")
        if m[0] != "class":
            assert order.class_id(r) is None
    assert len(order) == len(keyed) + sum(len(ranks) for ranks in members.values())


def test_timed_workers_start_busy():
    order = TimedLoadOrder(WORKERS)
    assert order.workers == WORKERS and order.rank == {w: i for i, w in enumerate(WORKERS)}
    _check_timed(order, {r: ("busy",) for r in range(N)}, {})
    assert len(order) == 0 and order.due(1e12) == []


@pytest.mark.parametrize("seed", range(4))
def test_timed_load_order_agrees_with_a_model_of_the_states(seed):
    rng = random.Random(seed)
    order = TimedLoadOrder(WORKERS)
    model: dict[int, tuple] = {r: ("busy",) for r in range(N)}
    class_key: dict[str, float] = {}  # a class's key: the one given when it was (re)created
    for _ in range(400):
        r = rng.randrange(N)
        action = rng.random()
        if action < 0.35:
            key = float(rng.randrange(4))
            stream = (float(rng.randrange(100)), 0.5) if rng.random() < 0.5 else None
            order.set_key(r, key, stream, None)
            model[r] = ("key", key, stream)
        elif action < 0.55:
            order.set_busy(r)
            model[r] = ("busy",)
        else:
            cls = rng.choice("abc")
            key = float(rng.randrange(4))
            if ("class", cls) not in model.values():
                class_key[cls] = key  # a new class (or one emptied before): this key
            order.set_class(r, cls, key)
            model[r] = ("class", cls)
        _check_timed(order, model, class_key)


def test_a_class_keeps_its_first_key_and_an_emptied_class_is_forgotten():
    order = TimedLoadOrder(WORKERS)
    order.set_class(0, "c", 5.0)
    order.set_class(1, "c", 9.0)  # joins: the class's key stays 5
    cid = order.class_id(0)
    assert order.class_id(1) == cid and order.classes == {cid: [0, 1]}
    assert order.class_keys == [(5.0, cid)]
    order.set_class(0, "c", 7.0)  # already a member: nothing moves
    assert order.classes == {cid: [0, 1]} and order.class_keys == [(5.0, cid)]
    order.set_busy(0)
    order.set_busy(1)
    assert order.classes == {} and order.class_keys == []
    order.set_class(2, "c", 3.0)  # made again: a new id, the new key
    new = order.class_id(2)
    assert new is not None and new != cid and order.class_keys == [(3.0, new)]
    order.set_class(3, "d", 1.0)
    assert order.class_keys == [(1.0, order.class_id(3)), (3.0, new)]


def test_a_stream_ends_due_once_and_a_change_cancels_it():
    order = TimedLoadOrder(WORKERS)
    order.set_key(0, 1.0, (50.0, 0.1), 50.0)
    order.set_key(1, 1.0, (40.0, 0.1), 40.0)
    order.set_key(2, 1.0, (45.0, 0.1), 45.0)
    order.set_key(3, 1.0, None, None)  # no stream: never due
    assert order.streams == {0: (50.0, 0.1), 1: (40.0, 0.1), 2: (45.0, 0.1)}
    order.set_class(2, "idle", 0.0)  # left its keyed state: its wake no longer counts
    assert 2 not in order.streams
    assert order.due(39.9) == []
    assert order.due(40.0) == [1]  # at its end
    assert order.due(40.0) == []  # once
    order.set_key(0, 2.0, (70.0, 0.1), 70.0)  # set again: the new end counts, not the old
    assert order.due(60.0) == []
    assert order.due(80.0) == [0]
    order.set_key(4, 1.0, (10.0, 0.1), 10.0)
    order.set_key(5, 1.0, (10.0, 0.1), 10.0)
    assert order.due(10.0) == [4, 5]


@pytest.mark.parametrize("seed", range(3))
def test_rank_at_is_the_index_into_the_union_less_excluded_plus_extra(seed):
    rng = random.Random(seed)
    for _ in range(200):
        ranks = list(range(N))
        rng.shuffle(ranks)
        cut = sorted(rng.sample(range(N + 1), rng.randrange(1, 4)))
        lists = [sorted(ranks[a:b]) for a, b in zip([0, *cut], [*cut, N], strict=True)]
        lists = [part for part in lists if part] or [[]]
        if rng.random() < 0.4:
            lists = [lists[0]]
        pool = [r for part in lists for r in part]
        excluded = sorted(rng.sample(pool, rng.randrange(len(pool) + 1)))
        others = [r for r in range(N) if r not in pool or r in excluded]
        extra = sorted(rng.sample(others, rng.randrange(len(others) + 1)))
        merged = sorted((set(pool) - set(excluded)) | set(extra))
        got = [TimedLoadOrder.rank_at(i, lists, excluded, extra) for i in range(len(merged))]
        assert got == merged, (lists, excluded, extra)


def test_rank_at_an_empty_list_counts_the_extra_ranks_alone():
    assert [TimedLoadOrder.rank_at(i, [[]], [], [3, 7]) for i in range(2)] == [3, 7]
    assert [TimedLoadOrder.rank_at(i, [[], []], [], [3, 7]) for i in range(2)] == [3, 7]
