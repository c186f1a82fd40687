"""A request's place in the admission queue: its objective's priority, or the body's agent hints.

    x-gateway-inference-objective names a listed objective   -> that InferenceObjective's priority
    it names no listed objective (or no file is given)       -> the hints', counted as "unlisted"
    no header                                                -> nvext.agent_hints.priority, else 0

The objective wins over the body's hint: an operator declared it, and a route can set the header
(the Inference Extension's pickers read the objective alone). Below 0 a request is sheddable, as
there: answered 429 rather than 503 when its bounded wait ends. `latency_sensitivity` (a jump
ahead within a priority) and `sheddable: true` still come from the hints.

`ObjectiveFile` holds the objectives of `--inference-objectives` (`extproc.config.objectives`
checks them) and reads the file again when it changes, looking at most once a second and only
while requests name objectives. A file that changes into something wrong is logged and the
objectives read before stay in use, as a Kubernetes API server would have refused the change.
Clients choose header values: the header is only looked up, and a name the file does not list is
counted under one label, so no structure grows with what clients send.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from extproc.config.objectives import Objectives, ObjectivesConfig, Pool, read_objectives
from extproc.config.options import ConfigError
from extproc.router import QueuedRequest

log = logging.getLogger("extproc.objectives")

OBJECTIVE_HEADER = "x-gateway-inference-objective"
UNLISTED = "unlisted"  # the metrics' label for a name the file does not list
CHECK_EVERY_S = 1.0

_Signature = tuple[int, int, int]  # the file's (inode, size, mtime in ns)


class ObjectiveFile:
    """The objectives in use: the file's last good reading."""

    def __init__(
        self,
        path: str,
        pool: Pool,
        objectives: Objectives,
        *,
        clock: Callable[[], float],
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.path = path
        self.pool = pool
        self.priorities: Mapping[str, int] = objectives.priorities
        self.readings = 1  # good readings, the first included
        self._clock = clock
        self._check_every_s = check_every_s
        self._checked_at = clock()
        self._signature = _signature(path)
        _log_reading(path, objectives, "read")

    @classmethod
    def from_config(cls, config: ObjectivesConfig, clock: Callable[[], float]) -> ObjectiveFile | None:
        if config.path is None:
            return None
        return cls(config.path, config.pool, config.initial, clock=clock)

    def priority(self, name: str) -> int | None:
        """The priority of the objective `name`, or None when the file does not list it."""
        now = self._clock()
        if now - self._checked_at >= self._check_every_s:
            self._checked_at = now
            self.refresh()
        return self.priorities.get(name)

    def refresh(self) -> None:
        """Read the file again if it changed since the last look (a ConfigMap update swaps it)."""
        signature = _signature(self.path)
        if signature == self._signature:
            return
        self._signature = signature  # a bad file is reported once per change, not at every look
        try:
            objectives = read_objectives(self.path, self.pool)
        except ConfigError as exc:
            log.warning("%s; the %d objectives read before stay in use", exc, len(self.priorities))
            return
        self.priorities = objectives.priorities
        self.readings += 1
        _log_reading(self.path, objectives, "read again")


def queue_entry(
    request_id: str,
    arrival_s: float,
    new_tokens: int,
    hints: Mapping[str, Any],
    objective_priority: int | None,
) -> QueuedRequest:
    """The admission queue's entry for a request: see the table above."""
    priority = objective_priority if objective_priority is not None else _hinted_priority(hints)
    jump = hints.get("latency_sensitivity")
    if isinstance(jump, bool) or not isinstance(jump, int | float) or not 0 <= jump < float("inf"):
        jump = 0.0
    return QueuedRequest(
        request_id,
        arrival_s,
        new_tokens=new_tokens,
        priority=priority,
        latency_sensitivity=float(jump),
        sheddable=hints.get("sheddable") is True or priority < 0,
    )


def _hinted_priority(hints: Mapping[str, Any]) -> int:
    value = hints.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _signature(path: str) -> _Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _log_reading(path: str, objectives: Objectives, verb: str) -> None:
    for line in objectives.left_out:
        log.info("%s", line)
    shown = ", ".join(f"{name}={p}" for name, p in sorted(objectives.priorities.items())[:20])
    more = len(objectives.priorities) - 20
    log.info(
        "inference objectives %s from %s: %d (%s%s)",
        verb, path, len(objectives.priorities), shown or "none", f", and {more} more" if more > 0 else "",
    )  # fmt: skip
