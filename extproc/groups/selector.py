"""GroupSelector: probe every router group, choose one by policy, commit there, own the lifecycle.

Per request (`route`):
1. Probe every group concurrently; whatever has not answered within `probe_timeout_s` is
   skipped. Failed, refused and slow groups are skipped and counted (`GroupMetrics`).
2. Order the answers by the policy (`policy.py`) and commit to the best group. A commit the group
   cannot take any more (its workers filled up meanwhile, or it went away) falls to the next one.
3. Remember which group owns the request: prefill-complete and free (a cancel is a free) go to it,
   exactly once. Remote lifecycle calls run as background tasks so the ext_proc stream never waits
   on another picker; `drain()` awaits them.
If no group can take the request, the fallback group (a local group kept in reserve, never probed
otherwise) decides; without one the selector raises `AllGroupsBusy` (every answer was "saturated")
or `NoGroupAvailable`, both answered 503.

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
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from extproc.config import GroupsConfig
from extproc.errors import UnknownModel
from extproc.groups.errors import (
    ALL_BUSY,
    TIMEOUT,
    UNKNOWN_MODEL,
    UNREACHABLE,
    AllGroupsBusy,
    GroupError,
    GroupTimeout,
    NoGroupAvailable,
)
from extproc.groups.local import LocalGroup
from extproc.groups.metrics import GroupMetrics
from extproc.groups.policy import GroupPolicy, parse_policy, rank
from extproc.groups.remote import RemoteGroup
from extproc.groups.routers import GroupPool
from extproc.groups.types import GroupDecision, GroupLoads, GroupProbe, GroupRequest, RouterGroup

log = logging.getLogger("extproc.groups")

EJECTED = "ejected"
ERROR = "error"


@dataclass(slots=True)
class _Owned:
    group: RouterGroup
    model: str
    group_request_id: str


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
    ) -> None:
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"router group names must be unique, got {names}")
        if fallback is not None and fallback not in names:
            raise ValueError(f"fallback group {fallback!r} is not one of {names}")
        if not probe_timeout_s > 0:
            raise ValueError(f"probe_timeout_s must be positive, got {probe_timeout_s!r}")
        self.groups = list(groups)
        self.probe_timeout_s = probe_timeout_s
        self.policy = policy
        self.fallback = next((g for g in groups if g.name == fallback), None)
        self.metrics = GroupMetrics(names)
        self._rng = rng or random.Random()
        self._clock = clock
        self._eject_after = eject_after
        self._eject_s = eject_s
        self._health = {name: _Health() for name in names}
        self._weights = {g.name: g.weight for g in groups}
        self._owned: dict[str, _Owned] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    @classmethod
    def from_config(
        cls, config: GroupsConfig, pools: Mapping[str, GroupPool], *, rng: random.Random | None = None
    ) -> GroupSelector:
        """Local groups over `pools` (this picker's routers) and remote groups at their addresses."""
        groups: list[RouterGroup] = [
            LocalGroup(g.name, pools, weight=g.weight)
            if g.address is None
            else RemoteGroup(g.name, g.address, weight=g.weight, tls=config.tls)
            for g in config.groups
        ]
        return cls(
            groups,
            probe_timeout_s=config.probe_timeout_s,
            policy=parse_policy(config.policy),
            fallback=config.fallback,
            rng=rng,
        )

    # --- routing -----------------------------------------------------------------------------

    async def route(self, request: GroupRequest, request_id: str) -> GroupDecision:
        """Probe, choose and commit; the request is owned by the returned decision's group until `free`.

        Raises AllGroupsBusy, NoGroupAvailable (both 503) or UnknownModel (every group said so).
        """
        probes, failures = await self.probe_all(request)
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

    async def probe_all(self, request: GroupRequest) -> tuple[list[GroupProbe], dict[str, str]]:
        """Every non-reserve, non-ejected group's probe within the deadline; (answers, {group: failure})."""
        now = self._clock()
        candidates = [g for g in self.groups if g is not self.fallback]
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

    def first_token(self, request_id: str) -> None:
        """The request's first token arrived: tell its group (in the background)."""
        owned = self._owned.get(request_id)
        if owned is not None:
            self._spawn(self._lifecycle(owned.group, "prefill_complete", owned.model, owned.group_request_id))

    def finish(self, request_id: str, cause: str) -> None:
        """The request ended (complete, error, cancel): free it in its group, once (in the background)."""
        owned = self._owned.pop(request_id, None)
        if owned is not None:
            self.metrics.owned(owned.group.name, -1)
            log.debug("freeing %s in group %s (%s)", request_id, owned.group.name, cause)
            self._spawn(self._lifecycle(owned.group, "free", owned.model, owned.group_request_id))

    async def drain(self) -> None:
        """Wait until every background lifecycle call has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        for group in self.groups:
            await group.close()

    # --- internals ---------------------------------------------------------------------------

    async def _probe_groups(
        self, groups: Sequence[RouterGroup], request: GroupRequest
    ) -> tuple[list[GroupProbe], dict[str, str]]:
        """Probe `groups` concurrently; whatever has not answered within the deadline is a timeout."""
        failures: dict[str, str] = {}
        tasks = {asyncio.ensure_future(self._probe(g, request)): g for g in groups}
        if not tasks:
            return [], failures
        done, pending = await asyncio.wait(tasks, timeout=self.probe_timeout_s)
        probes = []
        for task in pending:
            task.cancel()
            task.add_done_callback(_retrieve)
            self._failed(tasks[task].name, GroupTimeout(tasks[task].name, self.probe_timeout_s), failures)
        for task in done:
            group = tasks[task]
            outcome = task.result()
            if isinstance(outcome, GroupProbe):
                probes.append(outcome)
                self._answered(group.name, outcome.latency_s)
            else:
                self._failed(group.name, outcome, failures)
        return probes, failures

    async def _commit_best(
        self, request: GroupRequest, request_id: str, probes: list[GroupProbe], failures: dict[str, str]
    ) -> GroupDecision | None:
        """Commit to the best group by policy; a failed commit falls to the next. None: nobody took it."""
        ranked = rank(probes, self.policy, weights=self._weights, rng=self._rng)
        for position, probe in enumerate(ranked):
            group = self._group(probe.group)
            try:
                decision = await group.commit(request, request_id, probe)
            except asyncio.CancelledError:  # the stream went away mid-commit; the group may track it
                self._spawn(self._lifecycle(group, "free", request.model, request_id))
                raise
            except GroupError as exc:
                log.warning("commit of %s to %s failed: %s", request_id, group.name, exc)
                self.metrics.commit_failed(group.name)
                failures[group.name] = exc.reason
                if isinstance(exc, GroupTimeout):  # it may have tracked the request: undo
                    self._spawn(self._lifecycle(group, "free", request.model, request_id))
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
            probe = await group.probe(request, timeout_s=self.probe_timeout_s)
        except GroupError as exc:
            return exc
        except Exception as exc:  # a bug or an undecodable answer: skip the group, keep routing
            log.exception("probe of group %s failed", group.name)
            return exc
        if not probe.latency_s:
            probe = GroupProbe(
                probe.group, probe.choice, probe.load, probe.block_size, time.perf_counter() - start
            )
        return probe

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
                probe = await self.fallback.probe(request, timeout_s=self.probe_timeout_s)
                decision = await self.fallback.commit(request, request_id, probe)
            except GroupError as exc:
                failures[self.fallback.name] = exc.reason
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
        reasons = set(failures.values())
        if reasons == {UNKNOWN_MODEL}:
            raise UnknownModel(request.model, [])
        if reasons == {ALL_BUSY}:
            raise AllGroupsBusy(len(failures))
        raise NoGroupAvailable(failures)

    def _owned_by(
        self,
        request_id: str,
        group: RouterGroup,
        model: str,
        decision: GroupDecision,
        *,
        won_on_overlap: bool,
    ) -> None:
        self._owned[request_id] = _Owned(group, model, decision.request_id)
        self.metrics.owned(group.name, 1)
        self.metrics.chosen(group.name, decision.choice.overlap_blocks, won_on_overlap=won_on_overlap)
        if decision.redecided:
            self.metrics.commit_redecided(group.name)

    async def _lifecycle(self, group: RouterGroup, call: str, model: str, group_request_id: str) -> None:
        try:
            if call == "free":
                await group.free(model, group_request_id)
            else:
                await group.mark_prefill_complete(model, group_request_id)
        except Exception as exc:  # edge: the group went away; its state went with it
            self.metrics.lifecycle_failed(group.name, call)
            log.warning("%s of %s in group %s failed: %s", call, group_request_id, group.name, exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _group(self, name: str) -> RouterGroup:
        return next(g for g in self.groups if g.name == name)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _summary(probes: Sequence[GroupProbe], failures: dict[str, str]) -> str:
    answered = [f"{p.group}: overlap={p.choice.overlap_blocks} cost={p.choice.cost:.1f}" for p in probes]
    return "; ".join([*answered, *(f"{g}: {r}" for g, r in failures.items())])
