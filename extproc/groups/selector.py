"""GroupSelector: every routing decision goes through it. Choose a group, commit there, own the request.

A plain deployment has one group (the local one): a request is committed to it straight away, and
whatever that group raises is the answer, exactly as if the picker decided alone. Otherwise, per
request (`route`):
1. A sticky session's request goes to its pinned group and worker when that group is live (the
   group decides again inside itself if the worker cannot take it any more).
2. Otherwise probe every group concurrently; whatever has not answered within `probe_timeout_s`
   is skipped. Failed, refused and slow groups are skipped and counted (`GroupMetrics`). When no
   group answered by the deadline and some are still working on it, the machine is loaded rather
   than the groups gone: the first answer within `probe_grace_s` more is taken (counted as late)
   instead of answering 503.
3. Order the answers by the policy (`policy.py`) and commit to the best group. A commit the group
   cannot take any more (its workers filled up meanwhile, or it went away) falls to the next one.
4. Remember which group owns the request: first token, response status and free (a cancel is a
   free) go to it, exactly once. They never wait: a remote group sends them in the background,
   retries them and keeps its requests alive with a lease (`remote.py`).
If no group can take the request, the fallback group (a local group kept in reserve, never probed
otherwise) decides; without one the selector raises `AllGroupsBusy` (every answer was "saturated")
or `NoGroupAvailable`, both answered 503.

The admission queue asks `has_capacity` (some group has a worker under the queue threshold) before
it lets a request be routed; `choose` routes a request that is not tracked (not a generation
request) on load, changing nothing.

A group that times out or is unreachable `eject_after` times in a row is skipped for `eject_s`
seconds (then probed again), so a hung group does not add the probe deadline to every request.
When every group is ejected they are all probed anyway, and when no other group can take a request
the skipped ones are probed before giving up.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from extproc.errors import NoEligibleWorker, RequestInvalid, UnknownModel
from extproc.groups.errors import (
    ALL_BUSY,
    INVALID_REQUEST,
    NO_WORKERS,
    TIMEOUT,
    UNKNOWN_MODEL,
    UNREACHABLE,
    AllGroupsBusy,
    GroupError,
    GroupRefused,
    GroupTimeout,
    NoGroupAvailable,
)
from extproc.groups.metrics import GroupMetrics
from extproc.groups.policy import GroupPolicy, rank
from extproc.groups.types import (
    GroupChoice,
    GroupDecision,
    GroupLoads,
    GroupProbe,
    GroupRequest,
    RouterGroup,
)
from extproc.router import AllWorkersBusy, NoWorkers, Worker

log = logging.getLogger("extproc.groups")

EJECTED = "ejected"
ERROR = "error"
_REFUSALS: tuple[tuple[type[BaseException], str], ...] = (  # a local group's own errors, read as refusals
    (UnknownModel, UNKNOWN_MODEL),
    (NoEligibleWorker, NO_WORKERS),
    (NoWorkers, NO_WORKERS),
    (AllWorkersBusy, ALL_BUSY),
    (RequestInvalid, INVALID_REQUEST),
)


@dataclass(slots=True)
class _Owned:
    group: RouterGroup
    model: str
    group_request_id: str
    worker: Worker


@dataclass(slots=True)
class _Health:
    consecutive_failures: int = 0
    ejected_until: float = 0.0


class GroupSelector:
    """Routes requests across router groups and keeps track of which group owns each one."""

    def __init__(
        self,
        groups: Sequence[RouterGroup],
        *,
        probe_timeout_s: float,
        policy: GroupPolicy = GroupPolicy.MAX_OVERLAP,
        fallback: str | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        eject_after: int = 3,
        eject_s: float = 1.0,
        probe_grace_s: float = 0.2,
    ) -> None:
        names = [g.name for g in groups]
        if not names:
            raise ValueError("a selector needs at least one router group")
        if len(set(names)) != len(names):
            raise ValueError(f"router group names must be unique, got {names}")
        if fallback is not None and fallback not in names:
            raise ValueError(f"fallback group {fallback!r} is not one of {names}")
        if not probe_timeout_s > 0:
            raise ValueError(f"probe_timeout_s must be positive, got {probe_timeout_s!r}")
        if probe_grace_s < 0:
            raise ValueError(f"probe_grace_s must not be negative, got {probe_grace_s!r}")
        self.groups = list(groups)
        self.probe_timeout_s = probe_timeout_s
        self.probe_grace_s = probe_grace_s
        self.policy = policy
        self.fallback = next((g for g in groups if g.name == fallback), None)
        self.metrics = GroupMetrics(names)
        self._rng = rng or random.Random()
        self._clock = clock
        self._eject_after = eject_after
        self._eject_s = eject_s
        self._health = {name: _Health() for name in names}
        self._weights = {g.name: g.weight for g in groups}
        self._by_name = {g.name: g for g in groups}
        self._candidates = [g for g in self.groups if g is not self.fallback]
        self._owned: dict[str, _Owned] = {}
        self._single = self.groups[0] if len(self.groups) == 1 and self.groups[0].in_process else None
        # its synchronous commit (a local group's `commit_now`, unless it asks a KV indexer), for `route_now`
        self._commit_now: Callable[[GroupRequest, str, Worker | None], GroupDecision] | None = (
            getattr(self._single, "commit_now", None) if getattr(self._single, "decides_now", True) else None
        )

    @property
    def single(self) -> RouterGroup | None:
        """The one group when there is only one and it runs here: no probe, no choice, it decides."""
        return self._single

    # --- routing -----------------------------------------------------------------------------

    async def route(
        self, request: GroupRequest, request_id: str, *, pinned: tuple[str, Worker] | None = None
    ) -> GroupDecision:
        """Choose a group and commit there; the request is owned by the decision's group until `finish`.

        `pinned`: a sticky session's (group, worker). With one group, that group's own errors are
        raised; with several, AllGroupsBusy, NoGroupAvailable (both 503) or UnknownModel (every
        group said so).
        """
        single = self.single
        if single is not None:
            try:
                committed = await single.commit(request, request_id, pinned[1] if pinned else None)
            except asyncio.CancelledError:  # the stream went away mid-commit; the group may track it
                single.free(request.model, request_id)
                raise
            self._owned_by(request_id, single, request.model, committed, won_on_overlap=False)
            self.metrics.outcome("routed")
            return committed
        failures: dict[str, str] = {}
        if pinned is not None:
            decision = await self._commit_pinned(request, request_id, pinned, failures)
            if decision is not None:
                self.metrics.outcome("routed")
                return decision
        probes, probe_failures = await self.probe_all(request)
        failures.update(probe_failures)
        decision = await self._commit_best(request, request_id, probes, failures)
        skipped = [g for g in self.groups if failures.get(g.name) == EJECTED]
        if decision is None and skipped:  # everything else failed: try the groups skipped for now
            retried, retry_failures = await self._probe_groups(skipped, request)
            failures.update(retry_failures)
            decision = await self._commit_best(request, request_id, retried, failures)
        if decision is None:
            return await self._fall_back(request, request_id, failures)
        self.metrics.outcome("routed")
        return decision

    def route_now(
        self, request: GroupRequest, request_id: str, *, pinned: tuple[str, Worker] | None = None
    ) -> GroupDecision | None:
        """`route` without a coroutine where the one group decides synchronously (a plain
        deployment's local group): its decision, or None when `route` has to be awaited."""
        commit_now, single = self._commit_now, self._single
        if commit_now is None or single is None:
            return None
        committed = commit_now(request, request_id, pinned[1] if pinned else None)
        self._owned_by(request_id, single, request.model, committed, won_on_overlap=False)
        self.metrics.outcome("routed")
        return committed

    async def choose(self, request: GroupRequest) -> tuple[str, GroupChoice]:
        """The group and worker a request would go to, committing nothing (untracked requests)."""
        single = self.single
        if single is not None:
            return single.name, (await single.probe(request, timeout_s=self.probe_timeout_s)).choice
        probes, failures = await self.probe_all(request)
        ranked = rank(probes, self.policy, weights=self._weights, rng=self._rng)
        if ranked:
            return ranked[0].group, ranked[0].choice
        if self.fallback is not None:
            probe = await self.fallback.probe(request, timeout_s=self.probe_timeout_s)
            return self.fallback.name, probe.choice
        raise _unavailable(request, failures)

    async def has_capacity(self, request: GroupRequest) -> bool:
        """Whether some group has a worker for the request under the queue threshold."""
        single = self.single
        if single is not None:
            return await single.has_capacity(request)
        answers = await asyncio.gather(
            *(self._capacity(g, request) for g in self.groups), return_exceptions=True
        )
        return any(a is True for a in answers)

    async def probe_all(self, request: GroupRequest) -> tuple[list[GroupProbe], dict[str, str]]:
        """Every non-reserve, non-ejected group's probe within the deadline; (answers, {group: failure})."""
        now = self._clock()
        candidates = self._candidates
        live = [g for g in candidates if self._health[g.name].ejected_until <= now] or candidates
        failures: dict[str, str] = {}
        for g in candidates:
            if g not in live:
                failures[g.name] = EJECTED
                self.metrics.probe_failed(g.name, EJECTED)
        probes, probe_failures = await self._probe_groups(live, request)
        failures.update(probe_failures)
        return probes, failures

    async def potential_loads(self, request: GroupRequest) -> list[GroupLoads]:
        """Every group's potential loads for `request` (groups that fail are left out)."""
        answers = await asyncio.gather(
            *(g.potential_loads(request) for g in self.groups), return_exceptions=True
        )
        return [a for a in answers if isinstance(a, GroupLoads)]

    # --- lifecycle ---------------------------------------------------------------------------

    def owner_of(self, request_id: str) -> str | None:
        owned = self._owned.get(request_id)
        return owned.group.name if owned is not None else None

    def in_flight(self) -> int:
        """Requests committed and not yet freed."""
        return len(self._owned)

    def first_token(self, request_id: str, *, at_first_token: bool = True) -> None:
        """The request's first token arrived: tell its group (a remote one in the background).
        `at_first_token` False: seen only later (a non-streamed answer), not a time to learn from."""
        owned = self._owned.get(request_id)
        if owned is not None:
            owned.group.mark_prefill_complete(
                owned.model, owned.group_request_id, at_first_token=at_first_token
            )

    def output_tokens(self, request_id: str, count: int, sequences: int) -> None:
        """`count` more tokens generated per sequence, of `sequences`: tell its group."""
        owned = self._owned.get(request_id)
        if owned is not None:
            owned.group.add_output_tokens(owned.model, owned.group_request_id, count, sequences)

    def answered(self, request_id: str, status: int) -> None:
        """The worker's response status arrived: tell its group (outlier ejection)."""
        owned = self._owned.get(request_id)
        if owned is not None:
            owned.group.answered(owned.model, owned.group_request_id, owned.worker, status)

    def answered_untracked(self, group: str, model: str, worker: Worker, status: int) -> None:
        """The status of a request routed without tracking (`choose`), for its group's worker."""
        target = self._by_name.get(group)
        if target is not None:
            target.answered(model, "", worker, status)

    def finish(self, request_id: str, cause: str) -> bool:
        """The request ended (complete, error, cancel): free it in its group, once. False when this
        selector does not own it (any more)."""
        owned = self._owned.pop(request_id, None)
        if owned is None:
            return False
        self.metrics.owned(owned.group.name, -1)
        log.debug("freeing %s in group %s (%s)", request_id, owned.group.name, cause)
        owned.group.free(owned.model, owned.group_request_id)
        return True

    async def drain(self) -> None:
        """Wait until every remote group's background lifecycle call has finished."""
        for group in self.groups:
            drain = getattr(group, "drain", None)
            if drain is not None:
                await drain()

    async def close(self) -> None:
        await self.drain()
        for group in self.groups:
            await group.close()

    # --- internals ---------------------------------------------------------------------------

    async def _commit_pinned(
        self, request: GroupRequest, request_id: str, pinned: tuple[str, Worker], failures: dict[str, str]
    ) -> GroupDecision | None:
        group = self._by_name.get(pinned[0])
        if group is None or group is self.fallback or self._health[group.name].ejected_until > self._clock():
            return None
        try:
            decision = await group.commit(request, request_id, pinned[1])
        except Exception as exc:
            error = self._as_group_error(group, exc)
            failures[group.name] = error.reason
            self.metrics.commit_failed(group.name)
            log.info("session of %s: its group %s cannot take it (%s)", request_id, group.name, error)
            return None
        self._owned_by(request_id, group, request.model, decision, won_on_overlap=False)
        return decision

    async def _probe_groups(
        self, groups: Sequence[RouterGroup], request: GroupRequest
    ) -> tuple[list[GroupProbe], dict[str, str]]:
        """Probe `groups` concurrently; whatever has not answered within the deadline is a timeout,
        unless nobody answered in time: then the first answer within the grace is taken."""
        failures: dict[str, str] = {}
        tasks = {asyncio.ensure_future(self._probe(g, request)): g for g in groups}
        if not tasks:
            return [], failures
        try:
            done, pending = await asyncio.wait(tasks, timeout=self.probe_timeout_s)
            late: set[_ProbeTask] = set()
            waited_s = self.probe_timeout_s
            if pending and not _answered_any(done) and self.probe_grace_s > 0:
                late, pending = await _first_answer(pending, self.probe_grace_s)
                done |= late
                waited_s += self.probe_grace_s
        except BaseException:  # the stream went away (cancelled): its probes go with it
            for task in tasks:
                task.cancel()
                task.add_done_callback(_retrieve)
            raise
        probes: list[GroupProbe] = []
        for task in pending:
            task.cancel()
            task.add_done_callback(_retrieve)
            self._failed(tasks[task].name, GroupTimeout(tasks[task].name, waited_s), failures)
        for task in done:
            group = tasks[task]
            outcome = task.result()
            if isinstance(outcome, GroupProbe):
                probes.append(outcome)
                self._answered(group.name, outcome.latency_s)
                if task in late:
                    self.metrics.probe_late(group.name)
                    log.info(
                        "no router group answered within the %.0f ms probe deadline; %s answered after "
                        "%.0f ms and is used (a loaded machine?)",
                        self.probe_timeout_s * 1000, group.name, outcome.latency_s * 1000,
                    )  # fmt: skip
            else:
                self._failed(group.name, outcome, failures)
        # in configuration order, not arrival order: a seeded rng then breaks ties reproducibly
        order = {g.name: i for i, g in enumerate(self.groups)}
        probes.sort(key=lambda p: order[p.group])
        return probes, failures

    async def _commit_best(
        self, request: GroupRequest, request_id: str, probes: list[GroupProbe], failures: dict[str, str]
    ) -> GroupDecision | None:
        """Commit to the best group by policy; a failed commit falls to the next. None: nobody took it."""
        ranked = rank(probes, self.policy, weights=self._weights, rng=self._rng)
        for position, probe in enumerate(ranked):
            group = self._by_name[probe.group]
            try:
                decision = await group.commit(request, request_id, probe.choice.worker)
            except asyncio.CancelledError:  # the stream went away mid-commit; the group may track it
                group.free(request.model, request_id)
                raise
            except Exception as exc:
                error = self._as_group_error(group, exc)
                log.warning("commit of %s to %s failed: %s", request_id, group.name, error)
                self.metrics.commit_failed(group.name)
                failures[group.name] = error.reason
                if isinstance(error, GroupTimeout):  # it may have tracked the request: undo
                    group.free(request.model, request_id)
                continue
            others = [p.overlap_tokens for p in ranked if p is not probe]
            won = bool(others) and probe.overlap_tokens > max(others)
            best = max(p.choice.best_overlap_blocks for p in ranked)
            decision = replace(decision, best_overlap_blocks=max(best, decision.best_overlap_blocks))
            self._owned_by(request_id, group, request.model, decision, won_on_overlap=won)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s -> group %s (rank %d); %s",
                    request_id,
                    group.name,
                    position,
                    _summary(probes, failures),
                )
            return decision
        return None

    async def _probe(self, group: RouterGroup, request: GroupRequest) -> GroupProbe | Exception:
        start = time.perf_counter()
        try:
            probe = await group.probe(request, timeout_s=self.probe_timeout_s + self.probe_grace_s)
        except Exception as exc:
            return self._as_group_error(group, exc)
        if not probe.latency_s:
            probe = replace(probe, latency_s=time.perf_counter() - start)
        return probe

    async def _capacity(self, group: RouterGroup, request: GroupRequest) -> bool:
        if group is not self.fallback and self._health[group.name].ejected_until > self._clock():
            return False
        async with asyncio.timeout(self.probe_timeout_s):
            return await group.has_capacity(request)

    def _as_group_error(self, group: RouterGroup, exc: BaseException) -> GroupError:
        if isinstance(exc, GroupError):
            return exc
        for kind, reason in _REFUSALS:
            if isinstance(exc, kind):
                return GroupRefused(group.name, reason, str(exc))
        log.error("router group %s failed: %r", group.name, exc, exc_info=exc)  # a bug: skip the group
        return GroupError(group.name, ERROR, repr(exc))

    def _answered(self, name: str, latency_s: float) -> None:
        self.metrics.probe_answered(name, latency_s)
        health = self._health[name]
        health.consecutive_failures = 0
        if health.ejected_until:
            health.ejected_until = 0.0
            self.metrics.set_ejected(name, False)
            log.info("router group %s answers again", name)

    def _failed(self, name: str, exc: BaseException, failures: dict[str, str]) -> None:
        reason = exc.reason if isinstance(exc, GroupError) else ERROR
        failures[name] = reason
        self.metrics.probe_failed(name, reason)
        if reason not in (TIMEOUT, UNREACHABLE, ERROR):
            return  # the group answered (busy, no workers, ...): it is healthy
        health = self._health[name]
        health.consecutive_failures += 1
        if health.consecutive_failures >= self._eject_after:
            if not health.ejected_until:
                log.warning(
                    "router group %s skipped for %.1f s after %s: %s", name, self._eject_s, reason, exc
                )
            health.ejected_until = self._clock() + self._eject_s
            self.metrics.set_ejected(name, True)

    async def _fall_back(
        self, request: GroupRequest, request_id: str, failures: dict[str, str]
    ) -> GroupDecision:
        if self.fallback is not None:
            try:
                decision = await self.fallback.commit(request, request_id, None)
            except Exception as exc:
                failures[self.fallback.name] = self._as_group_error(self.fallback, exc).reason
            else:
                log.info(
                    "no router group could take %s (%s): fallback %s",
                    request_id,
                    _summary([], failures),
                    self.fallback.name,
                )
                self._owned_by(request_id, self.fallback, request.model, decision, won_on_overlap=False)
                self.metrics.outcome("fallback")
                return decision
        self.metrics.outcome("rejected")
        raise _unavailable(request, failures)

    def _owned_by(
        self,
        request_id: str,
        group: RouterGroup,
        model: str,
        decision: GroupDecision,
        *,
        won_on_overlap: bool,
    ) -> None:
        self._owned[request_id] = _Owned(group, model, decision.request_id, decision.choice.worker)
        self.metrics.owned(group.name, 1)
        self.metrics.chosen(group.name, decision.choice.overlap_blocks, won_on_overlap=won_on_overlap)
        if decision.redecided:
            self.metrics.commit_redecided(group.name)


def _unavailable(request: GroupRequest, failures: dict[str, str]) -> Exception:
    reasons = set(failures.values())
    if reasons == {UNKNOWN_MODEL}:
        return UnknownModel(request.model, [])
    if reasons == {ALL_BUSY}:
        return AllGroupsBusy(len(failures))
    return NoGroupAvailable(failures)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _summary(probes: Sequence[GroupProbe], failures: dict[str, str]) -> str:
    answered = [f"{p.group}: overlap={p.choice.overlap_blocks} cost={p.choice.cost:.1f}" for p in probes]
    return "; ".join([*answered, *(f"{g}: {r}" for g, r in failures.items())])


_ProbeTask = asyncio.Task[GroupProbe | Exception]


def _answered_any(done: set[_ProbeTask]) -> bool:
    return any(isinstance(task.result(), GroupProbe) for task in done)


async def _first_answer(pending: set[_ProbeTask], grace_s: float) -> tuple[set[_ProbeTask], set[_ProbeTask]]:
    """Wait up to `grace_s` for the first of `pending` to answer; (finished meanwhile, still pending)."""
    finished: set[_ProbeTask] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while pending and not _answered_any(finished):
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        more, pending = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        if not more:
            break
        finished |= more
    return finished, pending
