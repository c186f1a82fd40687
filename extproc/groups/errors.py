"""Errors of hierarchical routing, named by situation. Only `epp.py` maps errors to HTTP.

    GroupError                 one group could not answer; the selector skips it and counts why
    ├── GroupRefused           the group answered that it cannot take the request (`reason`)
    ├── GroupTimeout           no answer within the deadline
    └── GroupUnreachable       the call failed: connection refused or reset, the group crashed

What the selector raises when no group can take a request; both subclass errors `epp.ANSWERS`
already maps, so they reach Envoy as 503 without a mapping of their own:

    NoGroupAvailable(NoEligibleWorker)   no group answered and no fallback group: 503 rejected-no-endpoints
    AllGroupsBusy(AllWorkersBusy)        every group that answered is saturated: 503 rejected-saturated
"""

from __future__ import annotations

from collections.abc import Mapping

from extproc.errors import NoEligibleWorker
from extproc.router.errors import AllWorkersBusy

# GroupRefused reasons (also the `reason` label of the probe-failure metric, with the two below)
UNKNOWN_MODEL = "unknown-model"
NO_WORKERS = "no-workers"
ALL_BUSY = "all-busy"
INVALID_REQUEST = "invalid-request"
TIMEOUT = "timeout"
UNREACHABLE = "unreachable"


class GroupError(Exception):
    """A group could not answer a call; `reason` is one of the constants above."""

    def __init__(self, group: str, reason: str, detail: str = "") -> None:
        super().__init__(f"router group {group!r}: {reason}" + (f" ({detail})" if detail else ""))
        self.group = group
        self.reason = reason
        self.detail = detail


class GroupRefused(GroupError):
    """The group answered but cannot take the request (unknown model, no workers, all busy, invalid)."""


class GroupTimeout(GroupError):
    def __init__(self, group: str, timeout_s: float) -> None:
        super().__init__(group, TIMEOUT, f"no answer within {timeout_s * 1000:.0f} ms")
        self.timeout_s = timeout_s


class GroupUnreachable(GroupError):
    def __init__(self, group: str, detail: str) -> None:
        super().__init__(group, UNREACHABLE, detail)


class NoGroupAvailable(NoEligibleWorker):
    """No router group answered a probe (and no fallback group is configured)."""

    def __init__(self, failures: Mapping[str, str]) -> None:
        summary = ", ".join(f"{g}: {r}" for g, r in sorted(failures.items())) or "no group is configured"
        super().__init__(f"no router group can take the request ({summary})")
        self.failures = dict(failures)


class AllGroupsBusy(AllWorkersBusy):
    """Every router group that answered has all its workers over a busy threshold."""

    def __init__(self, groups: int) -> None:
        super().__init__(groups)
        self.args = (f"all {groups} router groups that answered are saturated",)
        self.groups = groups
