"""The admission gate around a real KvRouter: queueing, release on capacity, bounded wait, cancel.

The gate is given, per request, an awaitable capacity check and decision (the picker gives it its
router groups'); here both read one KvRouter, as a plain deployment's local group does.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from extproc.picker.admission import AdmissionGate
from extproc.picker.flow_metrics import FlowMetrics
from extproc.router import KvRouter, QueuedRequest, QueueTimeout, RouterConfig, Worker, WorkerSpec

from ..router.clock import FakeClock


def prompt(request_id: str) -> list[int]:
    """128 tokens of its own: over 0.01 * 8192 = 81.9, so one prompt in prefill saturates a worker."""
    base = 1000 * (sum(map(ord, request_id)) + len(request_id))
    return list(range(base, base + 128))


def make(
    policy: str = "fcfs",
    *,
    max_wait_s: float = 5.0,
    fairness: str = "global-strict",
    flow_metrics: FlowMetrics | None = None,
) -> tuple[KvRouter, Gate]:
    router = KvRouter(
        RouterConfig(
            block_size=16,
            router_queue_threshold=0.01,
            router_queue_policy=policy,
            router_queue_fairness=fairness,
        ),
        clock=FakeClock(),
        rng=random.Random(1),
        workers=[WorkerSpec("a"), WorkerSpec("b")],
    )
    return router, Gate(router, max_wait_s=max_wait_s, flow_metrics=flow_metrics)


class Gate(AdmissionGate):
    """The gate over one router: its capacity test, and a decision's undo frees the request."""

    def __init__(
        self, router: KvRouter, *, max_wait_s: float, flow_metrics: FlowMetrics | None = None
    ) -> None:
        cfg = router.config
        super().__init__(
            enabled=cfg.router_queue_threshold is not None,
            policy=cfg.router_queue_policy,
            fairness=cfg.router_queue_fairness,
            max_wait_s=max_wait_s,
            poll_s=0.01,
            flow_metrics=flow_metrics,
        )
        self.router = router

    async def admit(self, entry, decide, **kwargs):  # type: ignore[override]
        async def has_capacity() -> bool:
            return self.router.has_capacity()

        async def decide_now():
            return decide()

        return await super().admit(
            entry,
            decide_now,
            has_capacity=has_capacity,
            undo=lambda _: self.router.free(entry.request_id),
            flow=kwargs.get("flow"),
        )


def saturate(router: KvRouter) -> None:
    for worker in ("a", "b"):
        router.best_worker(prompt(f"bg-{worker}"), request_id=f"bg-{worker}", pinned_worker=worker)


def decider(router: KvRouter, request_id: str, order: list[str]):
    def decide():
        order.append(request_id)
        return router.best_worker(prompt(request_id), request_id=request_id)

    return decide


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_a_request_with_room_is_decided_at_once() -> None:
    router, gate = make()
    decision, waited = await gate.admit(QueuedRequest("r", 0.0), decider(router, "r", []))
    assert waited == 0.0 and decision.worker in (Worker("a"), Worker("b"))
    assert gate.stats.queued == 0


async def test_queued_requests_are_released_as_capacity_frees_in_policy_order() -> None:
    router, gate = make("fcfs")
    saturate(router)
    order: list[str] = []
    entries = (QueuedRequest("late", 2.0), QueuedRequest("early", 1.0), QueuedRequest("vip", 3.0, priority=1))
    tasks = [asyncio.create_task(gate.admit(e, decider(router, e.request_id, order))) for e in entries]
    await until(lambda: len(gate) == 3)
    assert order == []  # all held: every worker has a prompt in prefill
    router.mark_prefill_complete("bg-a")
    gate.kick()
    await until(lambda: len(order) == 1)
    assert order == ["vip"]  # a's room goes to the strict priority class; a is saturated again
    router.mark_prefill_complete("bg-b")
    router.mark_prefill_complete("vip")
    gate.kick()
    await until(lambda: len(order) == 3)
    assert order == ["vip", "early", "late"]
    results = await asyncio.gather(*tasks)
    assert all(waited > 0 for _, waited in results)
    assert len(gate) == 0 and gate.stats.released == 3


@pytest.mark.parametrize(
    ("fairness", "expected"),
    [("global-strict", ["a0", "a1", "a2", "zz"]), ("round-robin", ["a0", "zz", "a1", "a2"])],
)
async def test_tenants_take_turns_under_round_robin_fairness(fairness: str, expected: list[str]) -> None:
    router, gate = make(fairness=fairness)
    saturate(router)
    order: list[str] = []
    entries = [QueuedRequest(f"a{i}", float(i), flow="tenant-a") for i in range(3)]
    entries.append(QueuedRequest("zz", 5.0, flow="tenant-b"))  # a prompt of its own (`prompt`)
    tasks = [asyncio.create_task(gate.admit(e, decider(router, e.request_id, order))) for e in entries]
    await until(lambda: len(gate) == 4)
    done = ["bg-a"]
    for count in range(1, 5):  # one worker's room at a time: each frees for the next request
        router.mark_prefill_complete(done[-1])
        gate.kick()
        await until(lambda count=count: len(order) == count)
        done.append(order[-1])
    assert order == expected
    await asyncio.gather(*tasks)


async def test_the_poll_releases_requests_when_load_frees_without_a_kick() -> None:
    router, gate = make()
    saturate(router)
    task = asyncio.create_task(gate.admit(QueuedRequest("r", 0.0), decider(router, "r", [])))
    await until(lambda: len(gate) == 1)
    router.free("bg-a")  # e.g. another replica's request ended: nobody calls kick
    decision, _ = await asyncio.wait_for(task, 5)
    assert decision.worker == Worker("a")


async def test_a_request_waits_at_most_its_bound_then_503_or_429_when_sheddable() -> None:
    router, gate = make(max_wait_s=0.1)
    saturate(router)
    with pytest.raises(QueueTimeout) as normal:
        await gate.admit(QueuedRequest("r", 0.0), decider(router, "r", []))
    with pytest.raises(QueueTimeout) as shed:
        await gate.admit(QueuedRequest("s", 0.0, sheddable=True), decider(router, "s", []))
    assert not normal.value.sheddable and shed.value.sheddable
    assert normal.value.waited_s >= 0.1
    assert len(gate) == 0 and (gate.stats.timed_out, gate.stats.shed) == (1, 1)
    router.free("bg-a")
    router.free("bg-b")
    assert router.is_idle()


async def test_a_client_leaving_while_queued_leaves_the_queue_and_no_load() -> None:
    router, gate = make()
    saturate(router)
    order: list[str] = []
    gone = asyncio.create_task(gate.admit(QueuedRequest("gone", 0.0), decider(router, "gone", order)))
    stays = asyncio.create_task(gate.admit(QueuedRequest("stays", 1.0), decider(router, "stays", order)))
    await until(lambda: len(gate) == 2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert len(gate) == 1 and gate.stats.cancelled == 1
    router.free("bg-a")
    gate.kick()
    await stays
    assert order == ["stays"]
    for rid in ("bg-b", "stays"):
        router.free(rid)
    assert router.is_idle()


async def test_a_decision_that_races_with_the_cancel_is_given_back() -> None:
    """The cancel wins: the client is gone, so the load is given back and the task ends cancelled.
    (Python 3.11's `asyncio.wait_for` returned the decision and dropped the cancel in this race: the
    caller went on to route a request nobody waited for.)"""
    router, gate = make()
    saturate(router)
    entry = QueuedRequest("r", 0.0)
    task = asyncio.create_task(gate.admit(entry, decider(router, "r", [])))
    await until(lambda: len(gate) == 1)
    # the client leaves in the very callback round that delivers the decision
    entry.handle.future.add_done_callback(lambda _: task.cancel())
    router.free("bg-a")
    gate.kick()  # decided: "r" now loads worker a ...
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.stats.cancelled == 1 and gate.stats.released == 0
    router.free("bg-b")
    assert router.is_idle()


async def test_a_failing_decision_reaches_the_waiting_request() -> None:
    router, gate = make()
    saturate(router)

    def boom():
        raise RuntimeError("no")

    task = asyncio.create_task(gate.admit(QueuedRequest("r", 0.0), boom))
    await until(lambda: len(gate) == 1)
    router.free("bg-a")
    gate.kick()
    with pytest.raises(RuntimeError):
        await task


async def test_without_a_queue_threshold_nothing_waits() -> None:
    router = KvRouter(RouterConfig(block_size=16), clock=FakeClock(), workers=[WorkerSpec("a")])
    gate = Gate(router, max_wait_s=1.0)
    assert not gate.enabled
    router.best_worker(prompt("bg"), request_id="bg", pinned_worker="a")
    decision, waited = await gate.admit(QueuedRequest("r", 0.0), decider(router, "r", []))
    assert waited == 0.0 and decision.worker == Worker("a")


async def test_a_client_leaving_while_its_decision_is_made_gets_it_given_back() -> None:
    """A remote group's decision takes a round trip: the client may leave meanwhile."""
    router, gate = make()
    saturate(router)
    deciding = asyncio.Event()
    release = asyncio.Event()
    undone: list[object] = []
    made: list[object] = []

    async def has_capacity() -> bool:
        return router.has_capacity()

    async def slow_decide():
        deciding.set()
        await release.wait()  # the round trip
        made.append(router.best_worker(prompt("r"), request_id="r"))
        return made[-1]

    def undo(decision) -> None:
        undone.append(decision)
        router.free("r")

    task = asyncio.create_task(
        AdmissionGate.admit(gate, QueuedRequest("r", 0.0), slow_decide, has_capacity=has_capacity, undo=undo)
    )
    await until(lambda: len(gate) == 1)
    router.free("bg-a")
    gate.kick()
    await until(deciding.is_set)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    await until(lambda: undone != [])
    assert undone == made  # given back once, with that very decision
    assert (gate.stats.cancelled, gate.stats.released) == (1, 0)
    router.free("bg-b")
    assert router.is_idle() and len(gate) == 0
