"""GroupSelector over local groups (and scripted ones): choice, deadline, failures, fallback, lifecycle."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from extproc.config import GroupConfig, GroupsConfig
from extproc.epp import answers as epp
from extproc.errors import UnknownModel
from extproc.groups import (
    AllGroupsBusy,
    GroupCollector,
    GroupPolicy,
    GroupProbe,
    GroupRequest,
    GroupSelector,
    GroupUnreachable,
    NoGroupAvailable,
    RemoteGroup,
    RouterGroup,
)
from extproc.groups.errors import TIMEOUT, UNREACHABLE
from extproc.picker.local_group import LocalGroup
from extproc.picker.pipeline import EndpointPicker

from .builders import MODEL, group_config, local_group, prompt, request


def local(
    name: str, subnet: int, n_workers: int = 2, cls: type[LocalGroup] = LocalGroup, **router
) -> LocalGroup:
    return local_group(name, n_workers, name=name, subnet=subnet, cls=cls, **router)


class Held(LocalGroup):
    """A group whose probes wait until released (a slow group)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()

    async def probe(self, request: GroupRequest, *, timeout_s: float) -> GroupProbe:
        await self.release.wait()
        return await super().probe(request, timeout_s=timeout_s)


class Down(LocalGroup):
    """A group whose calls fail as an unreachable remote's do, while `down` is set."""

    down = True
    probes = 0

    async def probe(self, request: GroupRequest, *, timeout_s: float) -> GroupProbe:
        self.probes += 1
        if self.down:
            raise GroupUnreachable(self.name, "UNAVAILABLE: connection refused")
        return await super().probe(request, timeout_s=timeout_s)


class FailingCommit(LocalGroup):
    async def commit(self, request, request_id, worker):
        raise GroupUnreachable(self.name, "UNAVAILABLE: reset")


def selector(*groups: RouterGroup, **kwargs) -> GroupSelector:
    kwargs.setdefault("probe_timeout_s", 0.05)
    return GroupSelector(groups, rng=random.Random(1), **kwargs)


def router_of(group: LocalGroup):
    return group.pools[MODEL].router


async def test_each_conversation_sticks_to_the_group_and_worker_holding_its_prefix():
    a, b = local("a", 1), local("b", 2)
    sel = selector(a, b)
    first_turns = {}
    for conv in range(8):
        decision = await sel.route(request(prompt(conv)), f"c{conv}-t1")
        first_turns[conv] = (decision.group, decision.choice.worker)
        sel.first_token(f"c{conv}-t1")
        sel.finish(f"c{conv}-t1", "complete")
    await sel.drain()
    assert {g for g, _ in first_turns.values()} == {"a", "b"}  # idle groups share new conversations
    for conv in range(8):
        decision = await sel.route(request(prompt(conv) + prompt(100 + conv)), f"c{conv}-t2")
        assert (decision.group, decision.choice.worker) == first_turns[conv]
        assert decision.choice.overlap_blocks == decision.best_overlap_blocks == 10
        sel.finish(f"c{conv}-t2", "complete")
    await sel.drain()
    assert sel.in_flight() == 0 and router_of(a).is_idle() and router_of(b).is_idle()
    stats = sel.metrics.groups
    assert stats["a"].chosen + stats["b"].chosen == 16
    assert stats["a"].overlap_won_blocks + stats["b"].overlap_won_blocks == 80
    assert stats["a"].overlap_wins + stats["b"].overlap_wins == 8


async def test_min_cost_goes_to_the_idle_group_where_max_overlap_follows_the_cache():
    a, b = local("a", 1, n_workers=1), local("b", 2, n_workers=1)
    for policy, expected in ((GroupPolicy.MAX_OVERLAP, "a"), (GroupPolicy.MIN_COST, "b")):
        sel = selector(a, b, policy=policy)
        # group a caches the prefix and is busy decoding a long request; group b is idle
        router_of(a).best_worker(prompt(1), request_id="cached")
        router_of(a).mark_prefill_complete("cached")
        router_of(a).best_worker(prompt(50, 16 * 40), request_id="long")
        router_of(a).mark_prefill_complete("long")
        decision = await sel.route(request(prompt(1) + prompt(2)), "r")
        assert decision.group == expected
        sel.finish("r", "complete")
        await sel.drain()
        router_of(a).free("cached")
        router_of(a).free("long")


async def test_when_no_group_answers_by_the_deadline_the_first_late_answer_is_taken():
    # a loaded machine: both groups answer, just after the 50 ms deadline
    a, b = local("a", 1, cls=Held), local("b", 2, cls=Held)
    sel = selector(a, b, probe_timeout_s=0.05, probe_grace_s=5.0)
    loop = asyncio.get_running_loop()
    loop.call_later(0.1, b.release.set)
    decision = await sel.route(request(prompt(1)), "r1")
    assert decision.group == "b"
    assert sel.metrics.groups["b"].probes_late == 1 and sel.metrics.groups["b"].probes_answered == 1
    assert sel.metrics.groups["a"].probe_failures == {TIMEOUT: 1}
    assert sel.metrics.outcomes["routed"] == 1
    a.release.set()
    sel.finish("r1", "complete")


async def test_without_a_grace_a_late_answer_is_a_503():
    a = local("a", 1, cls=Held)
    sel = selector(a, local("b", 2, cls=Held), probe_timeout_s=0.05, probe_grace_s=0.0)
    asyncio.get_running_loop().call_later(0.1, a.release.set)
    with pytest.raises(NoGroupAvailable):
        await sel.route(request(prompt(1)), "r1")


async def test_groups_that_never_answer_are_given_up_after_the_deadline_and_the_grace():
    sel = selector(local("a", 1, cls=Held), local("b", 2, cls=Held), probe_timeout_s=0.05, probe_grace_s=0.1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(NoGroupAvailable):
        await sel.route(request(prompt(1)), "r1")
    assert 0.15 <= loop.time() - start < 2.0
    assert all(sel.metrics.groups[g].probe_failures == {TIMEOUT: 1} for g in ("a", "b"))


async def test_a_slow_group_is_skipped_after_the_deadline():
    fast, slow = local("fast", 1), local("slow", 2, 2, cls=Held)
    sel = selector(fast, slow, probe_timeout_s=0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    decision = await sel.route(request(prompt(1)), "r1")
    assert decision.group == "fast"
    assert loop.time() - start < 0.5
    assert sel.metrics.groups["slow"].probe_failures == {TIMEOUT: 1}
    assert sel.metrics.groups["fast"].probes_answered == 1
    slow.release.set()
    sel.finish("r1", "complete")
    await sel.drain()
    assert router_of(slow).is_idle() and router_of(fast).is_idle()


async def test_failed_groups_are_skipped_ejected_and_probed_again_later():
    now = [100.0]
    up, down = local("up", 1), local("down", 2, 2, cls=Down)
    sel = selector(up, down, clock=lambda: now[0], eject_after=3, eject_s=1.0)
    for i in range(3):
        assert (await sel.route(request(prompt(i)), f"r{i}")).group == "up"
    assert down.probes == 3 and sel.metrics.groups["down"].ejected
    await sel.route(request(prompt(9)), "r9")
    assert down.probes == 3  # skipped while ejected
    assert sel.metrics.groups["down"].probe_failures == {UNREACHABLE: 3, "ejected": 1}
    now[0] += 1.5
    down.down = False
    await sel.route(request(prompt(10)), "r10")
    assert down.probes == 4 and not sel.metrics.groups["down"].ejected


async def test_groups_skipped_after_failures_are_tried_before_giving_up():
    now = [100.0]
    first, second = (
        local("first", 1, 1, cls=Down),
        local("second", 2, 1, cls=Down),
    )
    second.down = False
    sel = selector(first, second, clock=lambda: now[0], eject_after=1, eject_s=60.0)
    assert (await sel.route(request(prompt(1)), "r1")).group == "second"
    assert sel.metrics.groups["first"].ejected
    first.down, second.down = False, True  # the ejected group is back, the other one fails now
    decision = await sel.route(request(prompt(2)), "r2")
    assert decision.group == "first" and first.probes == 2
    assert sel.metrics.outcomes["routed"] == 2


async def test_a_failed_commit_falls_to_the_next_group():
    a = local("a", 1, 1, cls=FailingCommit)
    b = local("b", 2, n_workers=1)
    router_of(a).best_worker(prompt(1), request_id="warm")  # a would win on overlap
    sel = selector(a, b)
    decision = await sel.route(request(prompt(1)), "r1")
    assert decision.group == "b" and sel.owner_of("r1") == "b"
    assert sel.metrics.groups["a"].commit_failures == 1


class LostCommitAnswer(LocalGroup):
    """Commits, but its answer never comes back (the caller gives up first)."""

    async def commit(self, request, request_id, worker):
        await super().commit(request, request_id, worker)
        await asyncio.Event().wait()


async def test_a_request_cancelled_mid_commit_is_freed_in_the_group():
    group = local("g", 1, 2, cls=LostCommitAnswer)
    sel = selector(group)
    routing = asyncio.ensure_future(sel.route(request(prompt(1)), "r1"))
    for _ in range(100):  # a few loop turns: probe, then the commit that never answers
        if not router_of(group).is_idle():
            break
        await asyncio.sleep(0)
    assert not router_of(group).is_idle()
    routing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await routing
    await sel.drain()
    assert router_of(group).is_idle() and sel.in_flight() == 0


async def test_no_answer_uses_the_fallback_group():
    reserve = local("reserve", 3)
    sel = selector(local("r1", 1, 1, cls=Down), reserve, fallback="reserve")
    decision = await sel.route(request(prompt(1)), "x")
    assert decision.group == "reserve" and sel.owner_of("x") == "reserve"
    assert sel.metrics.outcomes["fallback"] == 1
    # the reserve is never probed while another group answers
    sel2 = selector(local("main", 1), reserve, fallback="reserve")
    assert (await sel2.route(request(prompt(2)), "y")).group == "main"
    assert sel2.metrics.groups["reserve"].probes_answered == 0


async def test_no_group_at_all_answers_503():
    sel = selector(local("a", 1, 1, cls=Down), local("b", 2, 1, cls=Held))
    with pytest.raises(NoGroupAvailable) as caught:
        await sel.route(request(prompt(1)), "r")
    assert caught.value.failures == {"a": UNREACHABLE, "b": TIMEOUT}
    assert epp.status_of(caught.value) == (503, "rejected-no-endpoints")
    assert sel.metrics.outcomes["rejected"] == 1 and sel.in_flight() == 0


async def test_every_group_saturated_answers_503_saturated():
    a = local("a", 1, n_workers=1, active_prefill_tokens_threshold=100)
    b = local("b", 2, n_workers=1, active_prefill_tokens_threshold=100)
    router_of(a).best_worker(prompt(1), request_id="x")
    router_of(b).best_worker(prompt(2), request_id="y")
    with pytest.raises(AllGroupsBusy) as caught:
        await selector(a, b).route(request(prompt(3)), "r")
    assert epp.status_of(caught.value) == (503, "rejected-saturated")


async def test_a_model_no_group_serves_is_unknown():
    with pytest.raises(UnknownModel):
        await selector(local("a", 1), local("b", 2)).route(GroupRequest("other", prompt(1)), "r")


async def test_lifecycle_goes_to_the_owning_group_once():
    a, b = local("a", 1), local("b", 2)
    sel = selector(a, b)
    decision = await sel.route(request(prompt(1)), "r1")
    owner = a if decision.group == "a" else b
    other = b if owner is a else a
    worker = decision.choice.worker
    assert router_of(owner).sequences.prefill_tokens(worker) == 160
    sel.first_token("r1")
    await sel.drain()
    assert router_of(owner).sequences.prefill_tokens(worker) == 0
    sel.finish("r1", "cancelled")
    sel.finish("r1", "complete")  # once
    sel.first_token("r1")  # after the end: nothing
    await sel.drain()
    assert router_of(owner).is_idle() and router_of(other).is_idle() and sel.in_flight() == 0
    sel.finish("never-routed", "complete")


async def test_lifecycle_failures_are_counted_not_raised(refusing_port):
    port = refusing_port()
    gone = RemoteGroup("gone", f"127.0.0.1:{port}", retries=2, retry_base_s=0.01)
    sel = selector(gone, local("b", 2), probe_timeout_s=0.5)
    gone.on_lifecycle_failure = sel.metrics.lifecycle_failed
    decision = await sel.route(request(prompt(1)), "r1")
    assert decision.group == "b"
    sel._owned["r1"].group = sel.groups[0]  # pretend the vanished group owned it
    sel.finish("r1", "complete")
    await sel.drain()
    assert sel.metrics.groups["gone"].lifecycle_failures == {"free": 2}  # each attempt
    await sel.close()


async def test_the_collector_exposes_per_group_metrics():
    sel = selector(local("a", 1), local("b", 2, 1, cls=Down))
    await sel.route(request(prompt(1)), "r1")
    registry = CollectorRegistry()
    registry.register(GroupCollector(sel.metrics))
    text = generate_latest(registry).decode()
    assert 'extproc_group_probe_latency_seconds_count{group="a"} 1.0' in text
    assert 'extproc_group_probe_failures_total{group="b",reason="unreachable"} 1.0' in text
    assert 'extproc_group_chosen_total{group="a"} 1.0' in text
    assert 'extproc_group_overlap_won_blocks_total{group="a"} 0.0' in text
    assert 'extproc_group_requests_total{outcome="routed"} 1.0' in text
    assert 'extproc_group_ejected{group="b"} 0.0' in text
    assert 'extproc_group_in_flight{group="a"} 1.0' in text
    sel.finish("r1", "complete")
    assert 'extproc_group_in_flight{group="a"} 0.0' in generate_latest(registry).decode()


async def test_groups_from_config(refusing_port):
    groups = GroupsConfig(
        groups=(GroupConfig("here", None, 2.0), GroupConfig("there", f"127.0.0.1:{refusing_port()}")),
        probe_timeout_s=0.02,
        policy="weighted",
        fallback="here",
    )
    picker = EndpointPicker(replace(group_config("h", 1), groups=groups))
    sel = picker.selector
    assert [type(g) for g in sel.groups] == [LocalGroup, RemoteGroup] and picker.local is sel.groups[0]
    assert (
        sel.policy is GroupPolicy.WEIGHTED and sel.fallback is sel.groups[0] and sel.groups[0].weight == 2.0
    )
    assert (await sel.route(request(prompt(1)), "r")).group == "here"  # "there" is down
    await picker.close()


def test_invalid_selectors_are_refused():
    a = local("a", 1)
    with pytest.raises(ValueError, match="unique"):
        GroupSelector([a, a], probe_timeout_s=0.05)
    with pytest.raises(ValueError, match="fallback"):
        GroupSelector([a], probe_timeout_s=0.05, fallback="b")
    with pytest.raises(ValueError, match="positive"):
        GroupSelector([a], probe_timeout_s=0)


async def test_both_group_kinds_are_router_groups():
    groups: list[RouterGroup] = [local("a", 1), RemoteGroup("b", "127.0.0.1:1")]  # the type checker's test
    assert [g.name for g in groups] == ["a", "b"]
    for group in groups:
        await group.close()
