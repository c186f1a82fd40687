"""The admission gate at its edges (extproc/picker/admission.py).

Which waiting requests a drain round decides, and in what order, when candidate sets differ, when a
group cannot answer, when capacity frees mid-round or a client leaves mid-question; what is undone
(with which decision) when a client leaves; WSPT's token estimate; the counters and waits an
operator reads, on the gate's own clock; and `close`.

The gate is driven directly with capacity checks and decisions of the test's own. Its poll is set to
an hour, so that only the test's kicks start drain rounds: each test decides when capacity frees.
For a local answer the gate never waits on anything but the event loop, so a few loop steps
(`settle`) finish whatever a kick started.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any

import pytest

from extproc.picker.admission import AdmissionGate
from extproc.router import QueuedRequest, QueueTimeout

from ..router.clock import FakeClock
from .test_admission import until

NO_POLL_S = 3600.0  # the poll never fires during a test: rounds start on the test's kicks only


async def settle(steps: int = 20) -> None:
    """Run the ready callbacks a few rounds over: enough for a kick's rounds to end when nothing
    they await is held by the test."""
    for _ in range(steps):
        await asyncio.sleep(0)


async def decided(*tasks: asyncio.Task[tuple[str, float]]) -> list[tuple[str, float]]:
    """The tasks' results: a kick's rounds must have decided them within a few loop steps."""
    await settle()
    assert all(task.done() for task in tasks), "not decided by the rounds the kick started"
    return [task.result() for task in tasks]


class Room:
    """Capacity per candidate set (the gate's `key`), as the groups would answer, and the questions
    asked, by key."""

    def __init__(self) -> None:
        self.free: set[Hashable] = set()
        self.asked: list[Hashable] = []

    def check(self, key: Hashable = None) -> Callable[[], Awaitable[bool]]:
        async def has_capacity() -> bool:
            self.asked.append(key)
            return key in self.free

        return has_capacity


class RemoteAnswer:
    """A remote group's capacity check: while `hold` is set, each question waits for the test to
    answer it (`pending`), as a round trip would."""

    def __init__(self) -> None:
        self.room = False
        self.hold = False
        self.pending: asyncio.Future[bool] | None = None

    async def __call__(self) -> bool:
        if not self.hold:
            return self.room
        self.pending = asyncio.get_running_loop().create_future()
        return await self.pending

    def answer(self, room: bool) -> None:
        assert self.pending is not None
        self.hold = False
        self.pending.set_result(room)


def decider(request_id: str, order: list[str]) -> Callable[[], Awaitable[str]]:
    async def decide() -> str:
        order.append(request_id)
        return f"decision-{request_id}"

    return decide


GateFactory = Callable[..., AdmissionGate]


@pytest.fixture
async def new_gate() -> AsyncIterator[GateFactory]:
    """Makes gates (enabled, no poll); each is closed when the test ends."""
    made: list[AdmissionGate] = []

    def make(
        policy: str = "fcfs", *, max_wait_s: float = 60.0, clock: Callable[[], float] | None = None
    ) -> AdmissionGate:
        gate = AdmissionGate(
            enabled=True, policy=policy, max_wait_s=max_wait_s, clock=clock or FakeClock(), poll_s=NO_POLL_S
        )
        made.append(gate)
        return gate

    yield make
    for gate in made:
        await gate.close()


def waiting(
    gate: AdmissionGate,
    request_id: str,
    arrival_s: float,
    has_capacity: Callable[[], Awaitable[bool]],
    order: list[str],
    **kwargs: Any,
) -> asyncio.Task[tuple[str, float]]:
    """A client's request at the gate, as a task (its client leaves when the task is cancelled)."""
    entry = QueuedRequest(request_id, arrival_s)
    return asyncio.create_task(
        gate.admit(entry, decider(request_id, order), has_capacity=has_capacity, **kwargs)
    )


# --- which requests a round decides, and in what order -------------------------------------------


async def test_a_saturated_candidate_set_holds_back_only_requests_bound_for_it(new_gate: GateFactory) -> None:
    gate, room, order = new_gate(), Room(), []
    head = waiting(gate, "head", 0.0, room.check("a"), order, key="a")
    same = waiting(gate, "same", 1.0, room.check("a"), order, key="a")
    other = waiting(gate, "other", 2.0, room.check(), order)  # the default key: any worker
    await until(lambda: len(gate) == 3)
    room.free.add(None)
    room.asked.clear()
    gate.kick()
    await settle()
    assert order == ["other"]  # behind two requests whose workers are all saturated
    assert room.asked == ["a", None]  # "same" shares the head's answer: its set is not asked again
    room.free.add("a")
    gate.kick()
    await settle()
    assert order == ["other", "head", "same"]  # one kick decides every request that has room
    assert [task.result()[0] for task in (head, same, other)] == [
        "decision-head",
        "decision-same",
        "decision-other",
    ]
    assert len(gate) == 0


async def test_requests_sharing_a_candidate_set_keep_policy_order_when_load_frees_mid_round(
    new_gate: GateFactory,
) -> None:
    """The set's load frees just after the head is told it has no room: the request behind it, with
    the same candidates, must not be decided ahead of it in that round."""
    gate, order = new_gate(), []
    room = {"k": False}
    frees_after_answer = False

    async def has_capacity() -> bool:
        answer = room["k"]
        if frees_after_answer:
            room["k"] = True
        return answer

    first = waiting(gate, "first", 0.0, has_capacity, order, key="k")
    second = waiting(gate, "second", 1.0, has_capacity, order, key="k")
    await until(lambda: len(gate) == 2)
    frees_after_answer = True
    gate.kick()
    await settle()
    assert order == [] and len(gate) == 2
    gate.kick()
    await decided(first, second)
    assert order == ["first", "second"]


async def test_a_group_that_cannot_answer_has_no_room_and_holds_back_no_one_else(
    new_gate: GateFactory,
) -> None:
    gate, room, order = new_gate(), Room(), []
    down = False

    async def remote_capacity() -> bool:
        if down:
            raise ConnectionError("group unreachable")
        return "remote" in room.free

    remote = waiting(gate, "remote", 0.0, remote_capacity, order, key="remote")
    local = waiting(gate, "local", 1.0, room.check("local"), order, key="local")
    await until(lambda: len(gate) == 2)
    down = True
    room.free.update({"remote", "local"})
    gate.kick()
    await settle()
    assert order == ["local"] and len(gate) == 1 and not remote.done()
    down = False
    gate.kick()
    assert await decided(remote, local) == [("decision-remote", 0.0), ("decision-local", 0.0)]


async def test_a_client_leaving_while_its_capacity_is_asked_does_not_end_the_round(
    new_gate: GateFactory,
) -> None:
    gate, room, order = new_gate(), Room(), []
    remote = RemoteAnswer()
    leaving = waiting(gate, "leaving", 0.0, remote, order, key="remote")
    behind = waiting(gate, "behind", 1.0, room.check("local"), order, key="local")
    await until(lambda: len(gate) == 2)
    remote.hold = True
    room.free.add("local")
    gate.kick()
    await until(lambda: remote.pending is not None)  # the round asks the head's group ...
    leaving.cancel()  # ... and its client leaves meanwhile
    with pytest.raises(asyncio.CancelledError):
        await leaving
    remote.answer(True)
    await settle()
    assert order == ["behind"]  # the round went on past the request that left; nobody decided it
    assert (await behind)[0] == "decision-behind"
    assert len(gate) == 0 and gate.stats.cancelled == 1


async def test_a_kick_while_a_round_runs_starts_another_round(new_gate: GateFactory) -> None:
    gate, order = new_gate(), []
    remote = RemoteAnswer()
    task = waiting(gate, "r", 0.0, remote, order)
    await until(lambda: len(gate) == 1)
    remote.hold = True
    gate.kick()
    await until(lambda: remote.pending is not None)  # a round asks; the answer is in flight
    remote.room = True  # capacity frees meanwhile, and says so
    gate.kick()
    remote.answer(False)  # the answer in flight is from before the capacity freed
    await settle()
    assert order == ["r"]  # decided by the round the kick asked for, with no further kick
    assert (await task)[0] == "decision-r"


# --- what is undone when a client leaves -----------------------------------------------------------


async def _failing() -> str:
    raise RuntimeError("the group refused")


@pytest.mark.parametrize(
    "fails, undo, undone",
    [
        (False, True, ["decision-r"]),  # given back, with that decision
        (False, False, []),  # nothing to give it back to
        (True, True, []),  # a failed decision: nothing to undo
    ],
    ids=["undone", "no-undo", "failed"],
)
async def test_a_decision_racing_the_cancel_ends_cancelled_and_is_undone_only_if_made(
    new_gate: GateFactory, fails: bool, undo: bool, undone: list[str]
) -> None:
    gate, room, given_back = new_gate(), Room(), []
    entry = QueuedRequest("r", 0.0)
    decide = _failing if fails else decider("r", [])
    task = asyncio.create_task(
        gate.admit(entry, decide, has_capacity=room.check(), undo=given_back.append if undo else None)
    )
    await until(lambda: len(gate) == 1)
    entry.handle.future.add_done_callback(lambda _: task.cancel())  # leaves as the decision arrives
    room.free.add(None)
    gate.kick()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert given_back == undone
    assert (gate.stats.cancelled, gate.stats.released) == (1, 0)


# --- WSPT's token estimate ---------------------------------------------------------------------------


async def test_wspt_decides_the_fewest_new_tokens_first_asking_only_waiting_requests(
    new_gate: GateFactory,
) -> None:
    gate, room, order = new_gate("wspt"), Room(), []
    asked: list[str] = []

    def tokens(request_id: str, n: int) -> Callable[[], int]:
        return lambda: asked.append(request_id) or n

    room.free.add(None)
    now = await waiting(gate, "now", 0.0, room.check(), order, new_tokens=tokens("now", 5))
    assert now == ("decision-now", 0.0) and asked == []  # it did not wait: no estimate needed
    room.free.clear()
    tasks = [
        waiting(gate, "long", 1.0, room.check(), order, new_tokens=tokens("long", 4000)),
        waiting(gate, "short", 2.0, room.check(), order, new_tokens=tokens("short", 40)),
        waiting(gate, "unknown", 3.0, room.check(), order),  # no estimate: counted as 1 new token
    ]
    await until(lambda: len(gate) == 3)
    assert asked == ["long", "short"]
    room.free.add(None)
    gate.kick()
    await decided(*tasks)
    assert order == ["now", "unknown", "short", "long"]


@pytest.mark.parametrize("policy", ["fcfs", "lcfs"])
async def test_new_tokens_is_asked_only_under_wspt(new_gate: GateFactory, policy: str) -> None:
    gate, room, order, asked = new_gate(policy), Room(), [], []
    task = waiting(gate, "r", 0.0, room.check(), order, new_tokens=lambda: asked.append("r") or 40)
    await until(lambda: len(gate) == 1)
    room.free.add(None)
    gate.kick()
    await decided(task)
    assert asked == []


# --- what the operator and the caller are told ---------------------------------------------------------


async def test_every_request_that_waits_is_counted_and_told_its_bound(new_gate: GateFactory) -> None:
    gate, room, order = new_gate(max_wait_s=7.5), Room(), []
    bounds: list[float] = []
    room.free.add(None)
    await waiting(gate, "now", 0.0, room.check(), order, on_queued=bounds.append)
    assert gate.stats.queued == 0 and bounds == []
    room.free.clear()
    tasks = [waiting(gate, f"r{i}", float(i), room.check(), order, on_queued=bounds.append) for i in range(3)]
    await until(lambda: len(gate) == 3)
    assert gate.stats.queued == 3 and bounds == [7.5, 7.5, 7.5]
    room.free.add(None)
    gate.kick()
    await decided(*tasks)
    assert (gate.stats.queued, gate.stats.released) == (3, 3)


async def test_the_wait_returned_and_recorded_is_measured_on_the_gates_clock(new_gate: GateFactory) -> None:
    clock = FakeClock(100.0)
    gate, room, order = new_gate(clock=clock), Room(), []
    first = waiting(gate, "first", 0.0, room.check(), order)
    await until(lambda: len(gate) == 1)
    clock.advance(1.0)
    second = waiting(gate, "second", 1.0, room.check(), order)
    await until(lambda: len(gate) == 2)
    clock.advance(1.5)
    room.free.add(None)
    gate.kick()
    assert await decided(first, second) == [("decision-first", 2.5), ("decision-second", 1.5)]
    assert gate.stats.wait_s == [2.5, 1.5]


async def test_the_recorded_waits_keep_only_the_last_1000(new_gate: GateFactory) -> None:
    clock = FakeClock()
    gate, room, order = new_gate(clock=clock), Room(), []
    tasks = []
    for i in range(1001):
        clock.now = float(i)  # request i starts waiting at time i
        tasks.append(waiting(gate, f"r{i}", float(i), room.check(), order))
        await settle(1)  # it runs until it waits
        assert len(gate) == i + 1
    clock.now = 2000.0
    room.free.add(None)
    gate.kick()
    await decided(*tasks)
    assert gate.stats.released == 1001
    assert gate.stats.wait_s == [2000.0 - i for i in range(1, 1001)]  # r0's wait, the oldest, is gone


async def test_timeouts_and_sheds_are_each_counted_and_report_the_wait_on_the_gates_clock(
    new_gate: GateFactory,
) -> None:
    clock = FakeClock(100.0)
    gate, room = new_gate(max_wait_s=0.01, clock=clock), Room()

    def waits(_: float) -> None:
        clock.advance(1.5)  # the time it spends waiting, as the gate's clock sees it

    errors: list[QueueTimeout] = []
    for request_id, sheddable in (("a", False), ("b", True), ("c", False), ("d", True)):
        entry = QueuedRequest(request_id, 0.0, sheddable=sheddable)
        with pytest.raises(QueueTimeout) as timeout:
            await gate.admit(entry, decider(request_id, []), has_capacity=room.check(), on_queued=waits)
        errors.append(timeout.value)
    assert [(e.waited_s, e.sheddable) for e in errors] == [
        (1.5, False),
        (1.5, True),
        (1.5, False),
        (1.5, True),
    ]
    assert (gate.stats.timed_out, gate.stats.shed, gate.stats.released) == (2, 2, 0)
    assert len(gate) == 0


async def test_a_decision_made_as_the_bound_expires_is_returned_with_its_wait(new_gate: GateFactory) -> None:
    """The bound (0 s here) expires in the very loop round that delivers the decision: the decision
    wins, with the time it took on the gate's clock."""
    clock = FakeClock(100.0)
    gate, room = new_gate(max_wait_s=0.0, clock=clock), Room()

    async def decide() -> str:
        clock.advance(2.5)
        return "decision-r"

    result = await gate.admit(
        QueuedRequest("r", 0.0), decide, has_capacity=room.check(), on_queued=lambda _: room.free.add(None)
    )
    assert result == ("decision-r", 2.5)
    assert (gate.stats.timed_out, gate.stats.shed, gate.stats.cancelled) == (0, 0, 0) and len(gate) == 0


async def test_a_decision_made_as_the_bound_expires_is_counted_as_released(new_gate: GateFactory) -> None:
    """`extproc_admission_queue_events{outcome}`: every queued request leaves by one outcome. Here
    it leaves decided, on the path the test above takes: released, its wait recorded (until
    2026-11-27 it was counted under no outcome, so queued != released + timed_out + shed + cancelled)."""
    clock = FakeClock(100.0)
    gate, room = new_gate(max_wait_s=0.0, clock=clock), Room()

    async def decide() -> str:
        clock.advance(2.5)
        return "decision-r"

    await gate.admit(
        QueuedRequest("r", 0.0), decide, has_capacity=room.check(), on_queued=lambda _: room.free.add(None)
    )
    assert (gate.stats.queued, gate.stats.released, gate.stats.wait_s) == (1, 1, [2.5])


@pytest.mark.parametrize("max_wait_s", [30.0, 0.0], ids=["within-the-bound", "as-the-bound-expires"])
async def test_a_decision_that_fails_after_waiting_is_counted_as_failed(
    new_gate: GateFactory, max_wait_s: float
) -> None:
    """A request that waited and whose decision then raised (its group refused) gets that error, as
    an immediate decision's would be answered, and leaves the queue counted as `failed`: every
    queued request is counted under one outcome (until 2026-11-27 under none)."""
    gate, room = new_gate(max_wait_s=max_wait_s), Room()
    on_queued = (lambda _: room.free.add(None)) if max_wait_s == 0.0 else None
    for i in range(2):  # each failure counts
        task = asyncio.create_task(
            gate.admit(QueuedRequest(f"r{i}", 0.0), _failing, has_capacity=room.check(), on_queued=on_queued)
        )
        if max_wait_s:
            await until(lambda: len(gate) == 1)
            room.free.add(None)
            gate.kick()
        with pytest.raises(RuntimeError, match="the group refused"):
            await task
        room.free.clear()
    stats = gate.stats
    assert (stats.queued, stats.failed, stats.released, stats.timed_out, stats.cancelled) == (2, 2, 0, 0, 0)
    assert stats.wait_s == [] and len(gate) == 0


async def test_each_client_that_leaves_is_counted(new_gate: GateFactory) -> None:
    gate, room, order = new_gate(), Room(), []
    tasks = [waiting(gate, f"r{i}", float(i), room.check(), order) for i in range(2)]
    await until(lambda: len(gate) == 2)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task
    assert gate.stats.cancelled == 2 and len(gate) == 0 and order == []


# --- close ---------------------------------------------------------------------------------------------


async def test_close_stops_the_poll_and_a_running_round_and_may_be_followed_by_kicks_and_closes(
    new_gate: GateFactory,
) -> None:
    gate, order = new_gate(), []
    remote = RemoteAnswer()
    before = asyncio.all_tasks()
    task = waiting(gate, "r", 0.0, remote, order)
    await until(lambda: len(gate) == 1)
    remote.hold = True
    gate.kick()
    await until(lambda: remote.pending is not None)  # a round is running
    background = asyncio.all_tasks() - before - {task}
    assert len(background) == 2  # the poll and the round
    await gate.close()
    assert all(t.done() for t in background)
    assert order == [] and len(gate) == 1  # the request still waits
    await gate.close()  # closing twice is harmless
    remote.hold, remote.room = False, True
    gate.kick()  # e.g. a request that ends during shutdown
    assert await decided(task) == [("decision-r", 0.0)]
