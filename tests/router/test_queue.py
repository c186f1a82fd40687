"""Admission queue ordering under each policy, with arrival times given by hand."""

from __future__ import annotations

import pytest

from extproc.router import AdmissionQueue, QueuedRequest, QueuePolicy


def _ids(queue: AdmissionQueue) -> list[str]:
    return [e.request_id for e in queue.in_order()]


def _fill(policy: str, *entries: QueuedRequest) -> AdmissionQueue:
    queue = AdmissionQueue(policy)
    for entry in entries:
        queue.push(entry)
    return queue


def test_fcfs_serves_in_arrival_order() -> None:
    queue = _fill("fcfs", QueuedRequest("b", 2.0), QueuedRequest("a", 1.0), QueuedRequest("c", 3.0))
    assert _ids(queue) == ["a", "b", "c"]
    assert queue.peek().request_id == "a"


def test_fcfs_latency_sensitivity_moves_a_request_up_by_its_jump() -> None:
    queue = _fill(
        "fcfs",
        QueuedRequest("early", 0.0),
        QueuedRequest("urgent", 5.0, latency_sensitivity=10.0),  # acts as if it arrived at -5 s
        QueuedRequest("late", 6.0, latency_sensitivity=0.5),  # acts as if it arrived at 5.5 s
    )
    assert _ids(queue) == ["urgent", "early", "late"]


def test_a_higher_priority_class_always_goes_first() -> None:
    for policy in QueuePolicy:
        queue = _fill(
            policy,
            QueuedRequest("normal", 0.0, new_tokens=10, latency_sensitivity=100.0),
            QueuedRequest("high", 50.0, new_tokens=100_000, priority=1),
            QueuedRequest("low", 0.0, new_tokens=1, priority=-1),
        )
        assert _ids(queue)[0] == "high", policy
        assert _ids(queue)[-1] == "low", policy


def test_lcfs_serves_newest_first() -> None:
    queue = _fill("lcfs", QueuedRequest("a", 1.0), QueuedRequest("c", 3.0), QueuedRequest("b", 2.0))
    assert _ids(queue) == ["c", "b", "a"]


def test_wspt_serves_shortest_uncached_prompt_first_weighted_by_sensitivity() -> None:
    queue = _fill(
        "wspt",
        QueuedRequest("long", 0.0, new_tokens=4000),
        QueuedRequest("short", 1.0, new_tokens=100),
        QueuedRequest("weighted-long", 2.0, new_tokens=1000, latency_sensitivity=19.0),  # 20/1000
        QueuedRequest("cached", 3.0, new_tokens=0),  # fully cached: counts as 1 token
    )
    assert _ids(queue) == ["cached", "weighted-long", "short", "long"]


def test_equal_keys_leave_in_arrival_order() -> None:
    queue = _fill("wspt", *(QueuedRequest(f"r{i}", float(i), new_tokens=64) for i in range(5)))
    assert _ids(queue) == [f"r{i}" for i in range(5)]


def test_remove_takes_a_request_out_wherever_it_is() -> None:
    queue = _fill("fcfs", *(QueuedRequest(f"r{i}", float(i)) for i in range(100)))
    for i in range(0, 100, 2):
        assert queue.remove(f"r{i}") is not None
    assert queue.remove("r0") is None
    assert len(queue) == 50 and "r1" in queue and "r0" not in queue
    assert queue.peek().request_id == "r1"
    assert _ids(queue) == [f"r{i}" for i in range(1, 100, 2)]
    assert queue.oldest_arrival() == 1.0


def test_a_request_cannot_be_queued_twice() -> None:
    queue = _fill("fcfs", QueuedRequest("a", 0.0))
    with pytest.raises(ValueError, match="already queued"):
        queue.push(QueuedRequest("a", 1.0))


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        AdmissionQueue("sjf")


def test_wspt_latency_sensitivity_weighs_a_longer_prompt_ahead() -> None:
    # (1 + 2) / 25 = 0.12 beats (1 + 0) / 10 = 0.1: the weight is 1 + sensitivity, not more
    queue = _fill(
        "wspt",
        QueuedRequest("short", 0.0, new_tokens=10),
        QueuedRequest("sensitive", 1.0, new_tokens=25, latency_sensitivity=2.0),
    )
    assert _ids(queue) == ["sensitive", "short"]


def test_wspt_one_new_token_goes_before_two() -> None:
    queue = _fill("wspt", QueuedRequest("two", 0.0, new_tokens=2), QueuedRequest("one", 1.0, new_tokens=1))
    assert _ids(queue) == ["one", "two"]


def test_an_emptied_queue_has_nothing_to_peek_and_no_oldest_arrival() -> None:
    queue = _fill("fcfs", QueuedRequest("a", 0.0))
    assert queue.oldest_arrival() == 0.0
    assert queue.remove("a") is not None
    assert len(queue) == 0 and queue.peek() is None and queue.oldest_arrival() is None
    assert list(queue.in_order()) == []


def test_removed_requests_do_not_pile_up_and_the_rest_keep_their_order() -> None:
    # clients giving up one by one: the held slots stay within 2 n + 16 (n the requests still held)
    queue = _fill("fcfs", *(QueuedRequest(f"r{i}", float(i)) for i in range(200)))
    for i in range(200):
        if i % 10:
            assert queue.remove(f"r{i}") is not None
            assert len(queue._heap) <= 2 * len(queue) + 16
    assert len(queue) == 20
    assert _ids(queue) == [f"r{i}" for i in range(0, 200, 10)]
    assert queue.peek().request_id == "r0"
    for i in range(0, 200, 10):
        assert queue.remove(f"r{i}") is not None
        assert len(queue._heap) <= 2 * len(queue) + 16
    assert queue.peek() is None and len(queue) == 0
