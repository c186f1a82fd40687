"""GroupSelector's less travelled paths, over local groups that record what they are asked: what each
lifecycle call carries (the model and the group's own request id: a remote group sends both), the one
group of a plain deployment, sticky sessions' groups, ejection and its end, the grace after the probe
deadline, failed commits and the fallback group, `choose`, `has_capacity`, `potential_loads`, and the
log lines and counters an operator reads on the way.

Time: the selector's clock (ejection) is a list the test moves; probe deadlines are real and short
(50 ms), and a slow group is one whose probe waits for an event the test sets, or a timer that fires
after the deadline (a timer and the deadline fire in the order of their times, however busy the host).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from dataclasses import replace

import pytest

from extproc.errors import UnknownModel
from extproc.groups import AllGroupsBusy, GroupPolicy, GroupRequest, GroupSelector, NoGroupAvailable
from extproc.groups.errors import GroupTimeout, GroupUnreachable
from extproc.picker.local_group import LocalGroup
from extproc.router import AllWorkersBusy, NoWorkers
from tests.replica_helpers import until

from .builders import MODEL, local_group, prompt, request

DEADLINE_S = 0.05


class Scripted(LocalGroup):
    """A local group (real router, real decisions) that records every call made to it, and whose probe,
    commit, capacity and loads can be made to wait or fail."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []
        self.gate: asyncio.Event | None = None  # probes wait for it
        self.probe_error: Exception | None = None
        self.latency_s = 0.0  # a probe's own measure of its latency (0: none given)
        self.commit_gate: asyncio.Event | None = None
        self.commit_error: Exception | None = None
        self.commit_failures: int | None = None  # how many commits fail (None: all, while commit_error)
        self.block_s = 0.0  # a probe released from its gate holds the event loop this long (a loaded host)
        self.capacity: bool | Exception | None = None  # None: the group's own answer
        self.capacity_gate: asyncio.Event | None = None
        self.loads_error: Exception | None = None
        self.deciding_now = True

    @property
    def decides_now(self) -> bool:
        return self.deciding_now

    async def probe(self, request: GroupRequest, *, timeout_s: float = 0.0):
        self.calls.append(("probe", request, timeout_s))
        if self.gate is not None:
            await self.gate.wait()
        time.sleep(self.block_s)
        if self.probe_error is not None:
            raise self.probe_error
        probe = await super().probe(request, timeout_s=timeout_s)
        return replace(probe, latency_s=self.latency_s) if self.latency_s else probe

    async def commit(self, request, request_id, worker):
        self.calls.append(("commit", request_id, worker))
        if self.commit_gate is not None:
            await self.commit_gate.wait()
        if self.commit_error is not None and self.commit_failures != 0:
            if self.commit_failures is not None:
                self.commit_failures -= 1
            raise self.commit_error
        return await super().commit(request, request_id, worker)

    def commit_now(self, request, request_id, worker):
        self.calls.append(("commit_now", request_id, worker))
        return super().commit_now(request, request_id, worker)

    def mark_prefill_complete(self, model, request_id, *, at_first_token=True) -> None:
        self.calls.append(("prefill_complete", model, request_id, at_first_token))
        super().mark_prefill_complete(model, request_id, at_first_token=at_first_token)

    def add_output_tokens(self, model, request_id, count, sequences) -> None:
        self.calls.append(("output_tokens", model, request_id, count, sequences))
        super().add_output_tokens(model, request_id, count, sequences)

    def free(self, model, request_id) -> None:
        self.calls.append(("free", model, request_id))
        super().free(model, request_id)

    def answered(self, model, request_id, worker, status) -> None:
        self.calls.append(("answered", model, request_id, worker, status))
        super().answered(model, request_id, worker, status)

    async def has_capacity(self, request) -> bool:
        self.calls.append(("has_capacity", request))
        if self.capacity_gate is not None:
            await self.capacity_gate.wait()
        if isinstance(self.capacity, Exception):
            raise self.capacity
        return await super().has_capacity(request) if self.capacity is None else self.capacity

    async def potential_loads(self, request):
        self.calls.append(("loads", request))
        if self.loads_error is not None:
            raise self.loads_error
        return await super().potential_loads(request)

    def called(self, kind: str) -> list[tuple]:
        return [call for call in self.calls if call[0] == kind]


def scripted(name: str, subnet: int, n_workers: int = 2) -> Scripted:
    group = local_group(name, n_workers, name=name, subnet=subnet, cls=Scripted)
    assert isinstance(group, Scripted)
    return group


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def selector(*groups, **kwargs) -> GroupSelector:
    kwargs.setdefault("probe_timeout_s", DEADLINE_S)
    kwargs.setdefault("rng", random.Random(1))
    return GroupSelector(groups, **kwargs)


def messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def down(group: Scripted, detail: str = "down") -> None:
    group.probe_error = GroupUnreachable(group.name, detail)


# --- one group: a plain deployment ----------------------------------------------------------------


async def test_one_group_commits_straight_away_with_a_sessions_worker():
    g = scripted("g", 1)
    sel = selector(g)
    first = await sel.route(request(prompt(1)), "r1")
    assert g.called("probe") == [] and g.called("commit") == [("commit", "r1", None)]
    pinned = await sel.route(request(prompt(2)), "r2", pinned=("g", first.choice.worker))
    assert g.called("commit")[-1] == ("commit", "r2", first.choice.worker)
    assert pinned.choice.worker == first.choice.worker
    stats = sel.metrics.groups["g"]
    assert sel.metrics.outcomes == {"routed": 2} and stats.chosen == 2 and stats.overlap_wins == 0
    assert sel.finish("r1", "complete") and g.called("free") == [("free", MODEL, first.request_id)]


async def test_one_group_that_decides_now_is_routed_without_a_coroutine():
    g = scripted("g", 1)
    sel = selector(g)
    decision = sel.route_now(request(prompt(1)), "r1")
    assert decision is not None and g.called("commit_now") == [("commit_now", "r1", None)]
    again = sel.route_now(request(prompt(2)), "r2", pinned=("g", decision.choice.worker))
    assert again is not None and g.called("commit_now")[-1] == ("commit_now", "r2", decision.choice.worker)
    assert sel.owner_of("r1") == "g" and sel.in_flight() == 2
    assert sel.metrics.outcomes == {"routed": 2} and sel.metrics.groups["g"].overlap_wins == 0
    assert sel.finish("r1", "complete") and g.called("free") == [("free", MODEL, decision.request_id)]


async def test_route_now_is_none_where_the_decision_has_to_be_awaited():
    waits = scripted("g", 1)
    waits.deciding_now = False  # it asks a KV indexer first
    assert selector(waits).route_now(request(prompt(1)), "r1") is None
    two = selector(scripted("a", 1), scripted("b", 2))
    assert two.route_now(request(prompt(1)), "r1") is None
    assert waits.calls == [] and two.in_flight() == 0 and two.metrics.outcomes == {}


class WithoutDecidesNow:
    """An in-process group of another kind: no `decides_now`, so it decides now when it can commit now."""

    def __init__(self, group: LocalGroup) -> None:
        self._group = group

    def __getattr__(self, name: str):
        if name == "decides_now":
            raise AttributeError(name)
        return getattr(self._group, name)


async def test_a_group_without_decides_now_that_commits_now_is_routed_now():
    sel = selector(WithoutDecidesNow(scripted("g", 1)))
    assert sel.route_now(request(prompt(1)), "r1") is not None


async def test_one_groups_choice_is_its_probe_within_the_deadline_alone():
    g = scripted("g", 1)
    group, choice = await selector(g, probe_grace_s=0.5).choose(request(prompt(1)))
    assert group == "g" and choice.worker is not None
    assert g.calls == [("probe", request(prompt(1)), DEADLINE_S)]  # no grace added: nothing to wait for


# --- lifecycle: the model and the group's own id ---------------------------------------------------


async def test_each_lifecycle_call_carries_the_model_and_the_groups_request_id():
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b)
    decision = await sel.route(request(prompt(1)), "r1")
    owner = a if decision.group == "a" else b
    gid, worker = decision.request_id, decision.choice.worker
    sel.first_token("r1")
    sel.first_token("r1", at_first_token=False)
    sel.output_tokens("r1", 5, 2)
    sel.answered("r1", 503)
    assert [c for c in owner.calls if c[0] not in ("probe", "commit", "commit_now")] == [
        ("prefill_complete", MODEL, gid, True),
        ("prefill_complete", MODEL, gid, False),
        ("output_tokens", MODEL, gid, 5, 2),
        ("answered", MODEL, gid, worker, 503),
    ]
    assert sel.finish("r1", "complete") is True and owner.called("free") == [("free", MODEL, gid)]
    assert sel.finish("r1", "complete") is False and sel.finish("never", "complete") is False
    assert len(owner.called("free")) == 1


async def test_a_free_is_logged_with_the_request_its_group_and_why(caplog):
    sel = selector(scripted("a", 1), scripted("b", 2))
    decision = await sel.route(request(prompt(1)), "r1")
    with caplog.at_level(logging.DEBUG, "extproc.groups"):
        sel.finish("r1", "cancelled")
    assert f"freeing r1 in group {decision.group} (cancelled)" in messages(caplog)


async def test_an_untracked_requests_status_goes_to_the_named_groups_worker():
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b)
    group, choice = await sel.choose(request(prompt(1)))
    sel.answered_untracked(group, MODEL, choice.worker, 500)
    named, other = (a, b) if group == "a" else (b, a)
    assert named.called("answered") == [("answered", MODEL, "", choice.worker, 500)]
    sel.answered_untracked("gone", MODEL, choice.worker, 500)  # a group not configured: nothing
    assert other.called("answered") == [] and len(named.called("answered")) == 1


# --- sticky sessions' groups -----------------------------------------------------------------------


async def test_a_session_goes_to_its_group_and_worker_without_a_probe():
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b)
    worker = (await selector(scripted("x", 2)).route(request(prompt(1)), "x")).choice.worker
    decision = await sel.route(request(prompt(1)), "r1", pinned=("b", worker))
    assert decision.group == "b" and b.called("commit") == [("commit", "r1", worker)]
    assert a.calls == [] and b.called("probe") == []
    assert sel.metrics.outcomes == {"routed": 1} and sel.metrics.groups["b"].overlap_wins == 0
    sel.finish("r1", "complete")
    assert b.called("free") == [("free", MODEL, decision.request_id)]


async def test_a_session_whose_group_cannot_take_it_is_routed_afresh_and_logged(caplog):
    a, b = scripted("a", 1), scripted("b", 2)
    b.commit_error = GroupUnreachable("b", "reset")
    sel = selector(a, b)
    with caplog.at_level(logging.INFO, "extproc.groups"):
        decision = await sel.route(request(prompt(1)), "r1", pinned=("b", None))
    assert decision.group == "a" and sel.metrics.groups["b"].commit_failures >= 1
    assert "session of r1: its group b cannot take it (router group 'b': unreachable (reset))" in messages(
        caplog
    )


async def test_a_session_whose_group_refuses_names_the_refusal_when_nobody_can_take_it():
    a, b = scripted("a", 1), scripted("b", 2)
    b.commit_error = AllWorkersBusy(2)
    down(a)
    with pytest.raises(NoGroupAvailable) as raised:
        await selector(a, b).route(request(prompt(1)), "r1", pinned=("b", None))
    assert raised.value.failures == {"a": "unreachable", "b": "all-busy"}


async def test_a_session_pinned_to_the_fallback_group_is_routed_as_any_other(caplog):
    a, fb = scripted("a", 1), scripted("fb", 2)
    sel = selector(a, fb, fallback="fb")
    decision = await sel.route(request(prompt(1)), "r1", pinned=("fb", None))
    assert decision.group == "a" and fb.calls == []


async def test_a_session_waits_out_its_groups_ejection_to_the_instant():
    clock = Clock()
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b, clock=clock, eject_after=1, eject_s=1.0)
    down(b)
    await sel.route(request(prompt(1)), "r0")  # b ejected until 101.0
    b.probe_error = None
    clock.now = 100.999
    assert (await sel.route(request(prompt(2)), "r1", pinned=("b", None))).group == "a"
    assert b.called("commit") == []
    clock.now = 101.0
    probes = len(b.called("probe"))
    assert (await sel.route(request(prompt(3)), "r2", pinned=("b", None))).group == "b"
    assert len(b.called("probe")) == probes  # committed as the session's group, not ranked


# --- ejection ---------------------------------------------------------------------------------------


async def test_a_failing_group_is_ejected_after_three_failures_for_a_second_by_default(caplog):
    clock = Clock()
    a, b = scripted("a", 1), scripted("b", 2)
    sel = GroupSelector([a, b], probe_timeout_s=DEADLINE_S, rng=random.Random(1), clock=clock)
    down(b)
    with caplog.at_level(logging.WARNING, "extproc.groups"):
        for i in range(4):
            await sel.route(request(prompt(i)), f"r{i}")
    assert len(b.called("probe")) == 3 and sel.metrics.groups["b"].ejected is True
    assert messages(caplog) == [
        "router group b skipped for 1.0 s after unreachable: router group 'b': unreachable (down)"
    ]
    clock.now = 100.999
    await sel.route(request(prompt(5)), "r5")
    assert len(b.called("probe")) == 3
    clock.now = 101.0  # probed again at its deadline
    await sel.route(request(prompt(6)), "r6")
    assert len(b.called("probe")) == 4


async def test_a_group_that_answers_again_is_restored_and_needs_as_many_failures_to_go_again(caplog):
    clock = Clock()
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b, clock=clock, eject_after=2, eject_s=1.0)
    down(b)
    with caplog.at_level(logging.INFO, "extproc.groups"):
        for i in range(2):
            await sel.route(request(prompt(i)), f"r{i}")
        assert sel.metrics.groups["b"].ejected is True
        clock.now = 101.0
        b.probe_error = None
        await sel.route(request(prompt(3)), "r3")
        assert sel.metrics.groups["b"].ejected is False
        down(b)
        await sel.route(request(prompt(4)), "r4")
        assert sel.metrics.groups["b"].ejected is False  # one failure after an answer: not yet
        await sel.route(request(prompt(5)), "r5")
        assert sel.metrics.groups["b"].ejected is True
    skipped = "router group b skipped for 1.0 s after unreachable: router group 'b': unreachable (down)"
    assert [m for m in messages(caplog) if "router group b" in m] == [
        skipped,
        "router group b answers again",
        skipped,
    ]


async def test_a_group_that_raises_something_unexpected_is_skipped_as_an_error_and_logged(caplog):
    a, b = scripted("a", 1), scripted("b", 2)
    b.probe_error = RuntimeError("boom")
    sel = selector(a, b, eject_after=1)
    with caplog.at_level(logging.WARNING, "extproc.groups"):
        assert (await sel.route(request(prompt(1)), "r1")).group == "a"
    assert sel.metrics.groups["b"].probe_failures == {"error": 1} and sel.metrics.groups["b"].ejected
    failed = [r for r in caplog.records if r.getMessage() == "router group b failed: RuntimeError('boom')"]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR and failed[0].exc_info is not None
    assert failed[0].exc_info[1] is b.probe_error
    assert (
        "router group b skipped for 1.0 s after error: router group 'b': error (RuntimeError('boom'))"
        in messages(caplog)
    )


@pytest.mark.parametrize(
    ("error", "reason", "detail"),
    [
        (NoWorkers("no worker is registered"), "no-workers", "no worker is registered"),
        (AllWorkersBusy(2), "all-busy", "all 2 candidate workers are over a busy threshold"),
    ],
)
async def test_a_groups_own_refusal_keeps_its_name_and_words(caplog, error, reason, detail):
    a, b = scripted("a", 1), scripted("b", 2)
    b.commit_error = error
    with caplog.at_level(logging.INFO, "extproc.groups"):
        await selector(a, b).route(request(prompt(1)), "r1", pinned=("b", None))
    assert f"session of r1: its group b cannot take it (router group 'b': {reason} ({detail}))" in messages(
        caplog
    )


# --- the deadline and the grace -----------------------------------------------------------------------


def release_after(event: asyncio.Event, delay_s: float) -> None:
    asyncio.get_running_loop().call_later(delay_s, event.set)


async def test_an_answer_in_time_leaves_a_slow_group_to_its_deadline_even_with_a_grace():
    a, b = scripted("a", 1), scripted("b", 2)
    b.gate = asyncio.Event()
    release_after(b.gate, DEADLINE_S * 4)  # inside the grace: it would be taken if the grace applied
    sel = selector(a, b, probe_grace_s=5.0)
    assert (await sel.route(request(prompt(1)), "r1")).group == "a"
    assert sel.metrics.groups["b"].probe_failures == {"timeout": 1}
    assert sel.metrics.groups["b"].probes_late == 0 and sel.metrics.groups["b"].probes_answered == 0


async def test_the_first_late_answer_is_logged_with_the_deadline_and_its_latency(caplog):
    a, b = scripted("a", 1), scripted("b", 2)
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    b.latency_s = 0.123
    release_after(b.gate, DEADLINE_S * 2)
    sel = selector(a, b, probe_grace_s=5.0)
    with caplog.at_level(logging.INFO, "extproc.groups"):
        assert (await sel.route(request(prompt(1)), "r1")).group == "b"
    assert (
        "no router group answered within the 50 ms probe deadline; b answered after 123 ms and is used "
        "(a loaded machine?)"
    ) in messages(caplog)
    assert sel.metrics.groups["b"].probes_late == 1
    assert sel.metrics.groups["a"].probe_failures == {"timeout": 1}


async def test_only_the_first_late_answer_is_taken():
    a, b = scripted("a", 1), scripted("b", 2)
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    release_after(a.gate, DEADLINE_S * 2)
    release_after(b.gate, DEADLINE_S * 4)
    sel = selector(a, b, probe_grace_s=5.0)
    assert (await sel.route(request(prompt(1)), "r1")).group == "a"
    assert sel.metrics.groups["a"].probes_late == 1 and sel.metrics.groups["b"].probes_late == 0
    assert sel.metrics.groups["b"].probe_failures == {"timeout": 1}


async def test_a_failure_inside_the_grace_is_counted_and_the_next_answer_taken():
    a, b = scripted("a", 1), scripted("b", 2)
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    down(a)
    release_after(a.gate, DEADLINE_S * 2)
    release_after(b.gate, DEADLINE_S * 4)
    sel = selector(a, b, probe_grace_s=5.0)
    assert (await sel.route(request(prompt(1)), "r1")).group == "b"
    assert sel.metrics.groups["a"].probe_failures == {"unreachable": 1}
    assert sel.metrics.groups["b"].probes_late == 1


async def test_groups_that_all_fail_inside_the_grace_are_a_503_at_once():
    a, b = scripted("a", 1), scripted("b", 2)
    gate = asyncio.Event()
    a.gate = b.gate = gate
    down(a)
    down(b)
    release_after(gate, DEADLINE_S * 2)
    with pytest.raises(NoGroupAvailable) as raised:
        await selector(a, b, probe_grace_s=5.0).route(request(prompt(1)), "r1")
    assert raised.value.failures == {"a": "unreachable", "b": "unreachable"}


async def test_a_group_given_up_on_is_said_to_have_had_the_deadline_and_the_grace(caplog):
    a, b = scripted("a", 1), scripted("b", 2)
    a.gate = b.gate = asyncio.Event()  # never set
    sel = selector(a, b, probe_grace_s=0.2, eject_after=1)
    with caplog.at_level(logging.WARNING, "extproc.groups"), pytest.raises(NoGroupAvailable):
        await sel.route(request(prompt(1)), "r1")
    assert sorted(messages(caplog)) == [
        f"router group {g} skipped for 1.0 s after timeout: router group '{g}': timeout (no answer within "
        "250 ms)"
        for g in ("a", "b")
    ]


async def test_a_probe_may_take_the_deadline_and_the_grace_and_is_timed_unless_it_says():
    a, b = scripted("a", 1), scripted("b", 2)
    b.latency_s = 0.123
    sel = selector(a, b, probe_grace_s=0.2)
    await sel.route(request(prompt(1)), "r1")
    assert a.called("probe")[0][2] == pytest.approx(DEADLINE_S + 0.2)
    assert sel.metrics.groups["b"].probe_latency_sum_s == 0.123
    assert 0 < sel.metrics.groups["a"].probe_latency_sum_s < DEADLINE_S + 0.2


async def test_the_default_grace_is_200_ms():
    a, b = scripted("a", 1), scripted("b", 2)
    await GroupSelector([a, b], probe_timeout_s=DEADLINE_S).route(request(prompt(1)), "r1")
    assert a.called("probe")[0][2] == pytest.approx(DEADLINE_S + 0.2)


async def test_probes_given_up_on_leave_nothing_for_the_loop_to_report(loop_errors):
    a, b = scripted("a", 1), scripted("b", 2)
    b.gate = asyncio.Event()
    await selector(a, b).route(request(prompt(1)), "r1")
    for _ in range(3):
        await asyncio.sleep(0)  # the cancelled probe finishes and its callbacks run
    assert loop_errors == []


# --- commits -----------------------------------------------------------------------------------------


async def test_the_probed_worker_is_the_one_committed():
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b)
    decision = await sel.route(request(prompt(1)), "r1")
    owner = a if decision.group == "a" else b
    assert owner.called("commit") == [("commit", "r1", decision.choice.worker)]


async def test_a_commit_that_timed_out_is_undone_in_its_group_and_the_next_group_takes_it(caplog):
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b)
    first = await sel.route(request(prompt(1)), "r0")
    sel.first_token("r0")  # the prompt is cached in one group now
    cached, other = (a, b) if first.group == "a" else (b, a)
    cached.commit_error = GroupTimeout(cached.name, DEADLINE_S)
    with caplog.at_level(logging.DEBUG, "extproc.groups"):
        decision = await sel.route(request(prompt(1)), "r1")
    assert decision.group == other.name and cached.called("free") == [("free", MODEL, "r1")]
    assert decision.best_overlap_blocks == 10  # what the cached group reported, not the taker's 0
    failed = f"commit of r1 to {cached.name} failed: router group '{cached.name}': timeout"
    assert f"{failed} (no answer within 50 ms)" in messages(caplog)
    line = next(m for m in messages(caplog) if m.startswith("r1 -> "))
    probes = "; ".join(f"{g}: overlap={10 if g == cached.name else 0} cost=[0-9.]+" for g in ("a", "b"))
    assert re.fullmatch(rf"r1 -> group {other.name} \(rank 1\); {probes}; {cached.name}: timeout", line)


async def test_commits_that_all_fail_name_each_groups_reason():
    a, b = scripted("a", 1), scripted("b", 2)
    a.commit_error = GroupUnreachable("a", "reset")
    b.commit_error = AllWorkersBusy(2)
    with pytest.raises(NoGroupAvailable) as raised:
        await selector(a, b).route(request(prompt(1)), "r1")
    assert raised.value.failures == {"a": "unreachable", "b": "all-busy"}
    assert a.called("free") == []  # refused or unreachable: nothing to undo


async def test_a_request_cancelled_mid_commit_is_freed_under_its_model_and_id():
    a, b = scripted("a", 1), scripted("b", 2)
    a.commit_gate = b.commit_gate = asyncio.Event()
    sel = selector(a, b)
    routing = asyncio.ensure_future(sel.route(request(prompt(1)), "r1"))
    await until(lambda: a.called("commit") or b.called("commit"), 5, "a commit began")
    routing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await routing
    committing = a if a.called("commit") else b
    assert committing.called("free") == [("free", MODEL, "r1")]


async def test_weights_decide_between_equal_groups_under_the_weighted_policy():
    a, b = scripted("a", 1), scripted("b", 2)
    b._weight = 3.0
    sel = selector(a, b, policy=GroupPolicy.WEIGHTED)
    assert (await sel.route(request(prompt(1)), "r1")).group == "b"
    assert (await sel.choose(request(prompt(2))))[0] == "b"


async def test_a_selector_without_a_random_source_makes_its_own():
    sel = GroupSelector([scripted("a", 1), scripted("b", 2)], probe_timeout_s=DEADLINE_S)
    assert (await sel.route(request(prompt(1)), "r1")).group in ("a", "b")


# --- the fallback group --------------------------------------------------------------------------------


async def test_the_fallback_takes_what_no_group_can_and_owns_it(caplog):
    a, b, fb = scripted("a", 1), scripted("b", 2), scripted("fb", 3)
    down(a)
    down(b)
    sel = selector(a, b, fb, fallback="fb")
    with caplog.at_level(logging.INFO, "extproc.groups"):
        decision = await sel.route(request(prompt(1)), "r1")
    assert decision.group == "fb" and fb.called("probe") == []
    assert messages(caplog)[-1] in (  # in the order the probes failed
        "no router group could take r1 (a: unreachable; b: unreachable): fallback fb",
        "no router group could take r1 (b: unreachable; a: unreachable): fallback fb",
    )
    assert sel.metrics.outcomes == {"fallback": 1} and sel.metrics.groups["fb"].overlap_wins == 0
    sel.finish("r1", "complete")
    assert fb.called("free") == [("free", MODEL, decision.request_id)]


async def test_a_fallback_that_fails_too_is_named_in_the_503():
    a, fb = scripted("a", 1), scripted("fb", 3)
    down(a)
    fb.commit_error = NoWorkers("no worker is registered")
    sel = selector(a, fb, fallback="fb")
    with pytest.raises(NoGroupAvailable) as raised:
        await sel.route(request(prompt(1)), "r1")
    assert raised.value.failures == {"a": "unreachable", "fb": "no-workers"}
    assert sel.metrics.outcomes == {"rejected": 1}


# --- choose, has_capacity, potential_loads -------------------------------------------------------------


async def test_choose_ranks_by_the_policy_and_commits_nothing():
    """Group a caches the prefix and is busy decoding a long request; group b is idle."""
    a, b = scripted("a", 1, n_workers=1), scripted("b", 2, n_workers=1)
    a.pools[MODEL].router.best_worker(prompt(1), request_id="cached")
    a.pools[MODEL].router.mark_prefill_complete("cached")
    a.pools[MODEL].router.best_worker(prompt(50, 16 * 40), request_id="long")
    a.pools[MODEL].router.mark_prefill_complete("long")
    asked = request(prompt(1) + prompt(2))
    for policy, expected in ((GroupPolicy.MAX_OVERLAP, a), (GroupPolicy.MIN_COST, b)):
        group, choice = await selector(a, b, policy=policy).choose(asked)
        assert group == expected.name
        assert choice == (await expected.probe(asked)).choice
    assert a.called("commit") == b.called("commit") == []


async def test_choose_asks_the_fallback_when_no_group_answers():
    a, fb = scripted("a", 1), scripted("fb", 3)
    down(a)
    group, choice = await selector(a, fb, fallback="fb").choose(request(prompt(1)))
    assert group == "fb" and fb.calls == [("probe", request(prompt(1)), DEADLINE_S)]
    assert choice.worker is not None


async def test_choose_without_an_answer_or_a_fallback_says_why():
    a, b = scripted("a", 1), scripted("b", 2)
    down(a)
    b.probe_error = AllWorkersBusy(2)
    with pytest.raises(NoGroupAvailable) as raised:
        await selector(a, b).choose(request(prompt(1)))
    assert raised.value.failures == {"a": "unreachable", "b": "all-busy"}
    with pytest.raises(UnknownModel, match="other"):
        await selector(scripted("c", 1), scripted("d", 2)).choose(GroupRequest("other", prompt(1)))


async def test_every_group_saturated_is_counted_in_the_503():
    a, b = scripted("a", 1), scripted("b", 2)
    a.probe_error, b.probe_error = AllWorkersBusy(2), AllWorkersBusy(2)
    with pytest.raises(AllGroupsBusy, match=r"^all 2 router groups that answered are saturated$"):
        await selector(a, b).route(request(prompt(1)), "r1")


async def test_capacity_is_any_groups_and_a_failing_group_is_not_one():
    a, b = scripted("a", 1), scripted("b", 2)
    a.capacity, b.capacity = RuntimeError("boom"), True
    sel = selector(a, b)
    assert await sel.has_capacity(request(prompt(1))) is True
    b.capacity = False
    assert await sel.has_capacity(request(prompt(1))) is False


async def test_capacity_does_not_wait_past_the_deadline_for_a_group():
    a, b = scripted("a", 1), scripted("b", 2)
    a.capacity_gate = asyncio.Event()  # never set
    b.capacity = False
    assert await asyncio.wait_for(selector(a, b).has_capacity(request(prompt(1))), 5) is False


async def test_an_ejected_group_has_no_capacity_until_its_deadline():
    clock = Clock()
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b, clock=clock, eject_after=1, eject_s=1.0)
    down(b)
    await sel.route(request(prompt(1)), "r1")
    a.capacity, b.capacity = False, True
    assert await sel.has_capacity(request(prompt(2))) is False and b.called("has_capacity") == []
    clock.now = 101.0
    assert await sel.has_capacity(request(prompt(2))) is True


async def test_one_groups_capacity_is_its_own_answer():
    g = scripted("g", 1)
    g.capacity = False
    assert await selector(g).has_capacity(request(prompt(1))) is False
    assert g.called("has_capacity") == [("has_capacity", request(prompt(1)))]


async def test_potential_loads_leave_out_the_groups_that_fail():
    a, b = scripted("a", 1), scripted("b", 2)
    a.loads_error = GroupUnreachable("a", "reset")
    loads = await selector(a, b).potential_loads(request(prompt(1)))
    assert [group.group for group in loads] == ["b"]
    assert b.called("loads") == [("loads", request(prompt(1)))]


# --- configuration -------------------------------------------------------------------------------------


def test_a_selector_without_groups_or_with_a_negative_grace_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"^a selector needs at least one router group$"):
        GroupSelector([], probe_timeout_s=DEADLINE_S)
    with pytest.raises(ValueError, match=r"^probe_grace_s must not be negative, got -0\.1$"):
        GroupSelector([scripted("a", 1)], probe_timeout_s=DEADLINE_S, probe_grace_s=-0.1)


async def test_a_request_cancelled_mid_commit_in_the_one_group_is_freed_under_its_model_and_id():
    g = scripted("g", 1)
    g.commit_gate = asyncio.Event()
    routing = asyncio.ensure_future(selector(g).route(request(prompt(1)), "r1"))
    await until(lambda: g.called("commit"), 5, "the commit began")
    routing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await routing
    assert g.called("free") == [("free", MODEL, "r1")]


async def test_an_ejected_group_tried_last_that_cannot_commit_is_named_in_the_503():
    a, b = scripted("a", 1), scripted("b", 2)
    sel = selector(a, b, eject_after=1)
    down(a)
    await sel.route(request(prompt(1)), "r0")  # a ejected
    a.probe_error, a.commit_error = None, GroupUnreachable("a", "reset")
    down(b)
    with pytest.raises(NoGroupAvailable) as raised:
        await sel.route(request(prompt(2)), "r1")
    assert raised.value.failures == {"a": "unreachable", "b": "unreachable"}


async def test_a_session_whose_group_fails_once_and_then_takes_it_says_so_in_the_decision_log(caplog):
    a, b = scripted("a", 1), scripted("b", 2)
    b.commit_error, b.commit_failures = GroupUnreachable("b", "reset"), 1
    a.probe_error = AllWorkersBusy(2)
    with caplog.at_level(logging.DEBUG, "extproc.groups"):
        decision = await selector(a, b).route(request(prompt(1)), "r1", pinned=("b", None))
    assert decision.group == "b"
    line = next(m for m in messages(caplog) if m.startswith("r1 -> "))
    # the session's failed commit first, then the probes' failures
    assert re.fullmatch(
        r"r1 -> group b \(rank 0\); b: overlap=0 cost=[0-9.]+; b: unreachable; a: all-busy", line
    )


async def test_the_late_answer_log_rounds_the_deadline_and_the_latency_to_milliseconds(caplog):
    a, b = scripted("a", 1), scripted("b", 2)
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    b.latency_s = 0.9996
    release_after(b.gate, 0.1)
    sel = selector(a, b, probe_timeout_s=0.04549, probe_grace_s=5.0)
    with caplog.at_level(logging.INFO, "extproc.groups"):
        await sel.route(request(prompt(1)), "r1")
    assert (
        "no router group answered within the 45 ms probe deadline; b answered after 1000 ms and is used "
        "(a loaded machine?)"
    ) in messages(caplog)


async def test_a_failure_that_held_the_loop_past_the_grace_ends_the_wait():
    """A loaded host: the one group that came back within the grace held the loop past its end."""
    a, b = scripted("a", 1), scripted("b", 2)
    a.gate, b.gate = asyncio.Event(), asyncio.Event()  # b never answers
    down(a)
    a.block_s = 0.1
    release_after(a.gate, DEADLINE_S * 2)
    with pytest.raises(NoGroupAvailable) as raised:
        await selector(a, b, probe_grace_s=0.1).route(request(prompt(1)), "r1")
    assert raised.value.failures == {"a": "unreachable", "b": "timeout"}


async def test_a_route_cancelled_while_probing_leaves_nothing_for_the_loop_to_report(loop_errors):
    a, b = scripted("a", 1), scripted("b", 2)
    a.gate = b.gate = asyncio.Event()
    routing = asyncio.ensure_future(selector(a, b, probe_timeout_s=5.0).route(request(prompt(1)), "r1"))
    await until(lambda: a.called("probe") and b.called("probe"), 5, "both probes began")
    routing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await routing
    for _ in range(3):
        await asyncio.sleep(0)  # the cancelled probes finish and their callbacks run
    assert loop_errors == []
