"""Fairness between flows in the admission queue: global-strict, and round-robin turns."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.router import AdmissionQueue, QueuedRequest, QueueFairness


def request(name: str, arrival: float, flow: str, priority: int = 0, tokens: int = 1) -> QueuedRequest:
    return QueuedRequest(name, arrival, new_tokens=tokens, priority=priority, flow=flow)


def queue_of(fairness: str, *entries: QueuedRequest, policy: str = "fcfs") -> AdmissionQueue:
    queue = AdmissionQueue(policy, fairness)
    for entry in entries:
        queue.push(entry)
    return queue


def drain(queue: AdmissionQueue) -> list[str]:
    """Release the queue's requests one by one, each when its turn comes."""
    order = []
    while (head := queue.peek()) is not None:
        assert next(queue.in_order()).request_id == head.request_id
        queue.remove(head.request_id, released=True)
        order.append(head.request_id)
    return order


BURST = [request(f"a{i}", float(i), "tenant-a") for i in range(4)] + [request("b0", 10.0, "tenant-b")]


def test_global_strict_serves_one_tenants_burst_before_a_later_single_request() -> None:
    assert drain(queue_of("global-strict", *BURST)) == ["a0", "a1", "a2", "a3", "b0"]


def test_round_robin_lets_a_later_tenant_in_after_one_turn_of_the_burst() -> None:
    assert drain(queue_of("round-robin", *BURST)) == ["a0", "b0", "a1", "a2", "a3"]


def test_the_flow_served_longest_ago_goes_first() -> None:
    queue = queue_of("round-robin", *BURST, request("c0", 11.0, "tenant-c"), request("c1", 12.0, "tenant-c"))
    assert [e.request_id for e in queue.in_order()] == ["a0", "b0", "c0", "a1", "c1", "a2", "a3"]
    queue.remove("a0", released=True)  # tenant-a served: now last in turn
    assert [e.request_id for e in queue.in_order()] == ["b0", "c0", "a1", "c1", "a2", "a3"]
    queue.remove("c0", released=True)  # tenant-c's turn, out of order (only its workers had room)
    assert [e.request_id for e in queue.in_order()] == ["b0", "a1", "c1", "a2", "a3"]


def test_a_request_whose_client_left_does_not_use_its_flows_turn() -> None:
    queue = queue_of("round-robin", *BURST)
    queue.remove("a0")  # gone, not served
    assert drain(queue) == ["a1", "b0", "a2", "a3"]


def test_priorities_stay_strict_and_take_turns_within_each() -> None:
    queue = queue_of(
        "round-robin",
        request("low-a", 0.0, "a", priority=-1), request("low-b", 1.0, "b", priority=-1),
        request("a0", 2.0, "a", priority=5), request("a1", 3.0, "a", priority=5),
        request("b0", 4.0, "b", priority=5),
    )  # fmt: skip
    assert drain(queue) == ["a0", "b0", "a1", "low-a", "low-b"]


def test_within_a_flow_the_policy_orders() -> None:
    queue = queue_of(
        "round-robin",
        request("a-long", 0.0, "a", tokens=900), request("a-short", 1.0, "a", tokens=10),
        request("b", 2.0, "b", tokens=500),
        policy="wspt",
    )  # fmt: skip
    assert drain(queue) == ["a-short", "b", "a-long"]


def test_flows_are_forgotten_with_their_last_request() -> None:
    queue = queue_of("round-robin", *BURST)
    for name in ("a0", "b0", "a1", "a2", "a3"):
        queue.remove(name, released=name != "a2")
    assert len(queue) == 0 and not queue._waiting and not queue._served  # nothing left per flow


@given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.integers(-1, 1)), min_size=1, max_size=30), st.randoms()
)
def test_round_robin_releases_every_request_once_and_no_flow_waits_two_turns_of_another(
    arrivals: list[tuple[str, int]], rng: random.Random
) -> None:
    entries = [request(f"r{i}", float(i), flow, priority) for i, (flow, priority) in enumerate(arrivals)]
    queue = queue_of("round-robin", *entries)
    gone = {e.request_id for e in entries if rng.random() < 0.2}
    for name in sorted(gone):
        queue.remove(name)
    order = drain(queue)
    assert sorted(order) == sorted(e.request_id for e in entries if e.request_id not in gone)
    by_name = {e.request_id: e for e in entries}
    for i, name in enumerate(order):  # while a flow waits, no other flow of its priority is served twice
        entry = by_name[name]
        later = [by_name[n] for n in order[i + 1 :] if by_name[n].priority == entry.priority]
        waiting = {e.flow for e in later}
        served_since: dict[str, int] = {}
        for other in later:
            if other.flow != entry.flow:
                served_since[other.flow] = served_since.get(other.flow, 0) + 1
            else:
                break
        if entry.flow in waiting:
            assert all(count <= 1 for count in served_since.values())


def test_an_unknown_fairness_is_refused() -> None:
    with pytest.raises(ValueError):
        AdmissionQueue("fcfs", "weighted")
    assert AdmissionQueue().fairness is QueueFairness.GLOBAL_STRICT
