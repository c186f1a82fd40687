"""The Inference Extension's resources at request time: a request's objective and its model rewrite.

A request's place in the admission queue:

    x-gateway-inference-objective names a listed objective   -> that InferenceObjective's priority
    it names no listed objective (or no file is given)       -> the hints', counted as "unlisted"
    no header                                                -> nvext.agent_hints.priority, else 0

The objective wins over the body's hint: an operator declared it, and a route can set the header
(the Inference Extension's pickers read the objective alone). Below 0 a request is sheddable, as
there: answered 429 rather than 503 when its bounded wait ends. `latency_sensitivity` (a jump
ahead within a priority) and `sheddable: true` still come from the hints. With round-robin fairness
(`--router-queue-fairness`), the flows of a priority take turns, a flow being the requests of one
`x-gateway-inference-fairness-id` (none: one shared flow), as in the Inference Extension's flow control.

A request's model: the InferenceModelRewrite rule that applies to its `model` (the one that names
it, else one for every model) picks a target by weight (weight / the sum of its rule's weights; no
weights: each target alike), and the request is routed, tokenized and sent as that model: its
body's `model` is rewritten (`BodyParser.with_model`, off the loop for large bodies). A rule
without targets leaves the model as asked. Without a rule for its model, a request's
`x-gateway-model-name-rewrite` header (set by a route, or by the client) names the model it is sent
as: a rule wins over the header, as in the Inference Extension's picker. Either way the answer
names the model the client asked for again (`extproc.epp.asked_model`).

`ResourceFile` holds the resources of `--inference-resources` (`extproc.config.inference_extension`
checks them) and reads the file again when it changes, looking at most once a second and only
while requests need it. A file that changes into something wrong is logged and the resources read
before stay in use, as a Kubernetes API server would have refused the change. Clients choose
header values and model names: both are only looked up, and a name the file does not list is
counted under one label, so no structure grows with what clients send.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from bisect import bisect_right
from collections.abc import Callable, Mapping
from itertools import accumulate
from typing import Any

from extproc.config.inference_extension import (
    InferenceExtensionConfig,
    InferenceResources,
    Pool,
    RewriteRule,
    read_resources,
)
from extproc.config.options import ConfigError
from extproc.picker.metrics import PickMetrics
from extproc.router import QueuedRequest

log = logging.getLogger("extproc.inference_extension")

OBJECTIVE_HEADER = "x-gateway-inference-objective"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
MAX_FAIRNESS_ID = 256  # characters of a fairness id kept (a flow's name while it has requests waiting)
UNLISTED = "unlisted"  # the metrics' label for a name the file does not list
ANY_MODEL = "*"  # the metrics' label for the model of a rule without matches (any model)
CHECK_EVERY_S = 1.0

_Signature = tuple[int, int, int]  # the file's (inode, size, mtime in ns)


class ResourceFile:
    """The resources in use: the file's last good reading."""

    def __init__(
        self,
        path: str,
        pool: Pool,
        resources: InferenceResources,
        *,
        clock: Callable[[], float],
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.path = path
        self.pool = pool
        self.resources = resources
        self.readings = 1  # good readings, the first included
        self._clock = clock
        self._check_every_s = check_every_s
        self._checked_at = clock()
        self._signature = _signature(path)
        self._reading: asyncio.Future[InferenceResources | str] | None = None  # a read in a thread
        _log_reading(path, resources, "read")

    @classmethod
    def from_config(cls, config: InferenceExtensionConfig, clock: Callable[[], float]) -> ResourceFile | None:
        if config.path is None:
            return None
        return cls(config.path, config.pool, config.initial, clock=clock)

    def priority(self, name: str) -> int | None:
        """The priority of the objective `name`, or None when the file does not list it."""
        return self._current().priorities.get(name)

    def rewrite(self, model: str, rng: random.Random) -> tuple[str, RewriteRule] | None:
        """(the model to serve instead, the rule that chose it) for a request for `model`; None when
        no rule applies or the rule has no targets."""
        rule = self._current().rewrite_rule(model)
        if rule is None or not rule.targets:
            return None
        return pick_target(rule, rng), rule

    def _current(self) -> InferenceResources:
        now = self._clock()
        if now - self._checked_at >= self._check_every_s:
            self._checked_at = now
            self.refresh()
        return self.resources

    def refresh(self) -> None:
        """Read the file again if it changed since the last look (a ConfigMap update swaps it). In a
        running event loop it is read in a thread (PyYAML: about 10 ms per 100 objectives, 0.5 s for
        a full 1 MiB ConfigMap) and the last reading serves until the new one is ready."""
        signature = _signature(self.path)
        if signature == self._signature or self._reading is not None:
            return
        self._signature = signature  # a bad file is reported once per change, not at every look
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a tool, a test): read it here
            self._use(self._read())
            return
        self._reading = loop.run_in_executor(None, self._read)
        self._reading.add_done_callback(self._read_done)

    def _read(self) -> InferenceResources | str:
        """The file's resources, or why they cannot be used."""
        try:
            return read_resources(self.path, self.pool)
        except ConfigError as exc:
            return str(exc)
        except Exception as exc:  # a bug, never a request's failure
            return f"{self.path} could not be read: {exc!r}"

    def _read_done(self, reading: asyncio.Future[InferenceResources | str]) -> None:
        self._reading = None
        if not reading.cancelled():
            self._use(reading.result())

    def _use(self, reading: InferenceResources | str) -> None:
        if isinstance(reading, str):
            kept = self.resources
            log.warning(
                "%s; the %d objectives and %d rewrite rules read before stay in use",
                reading, len(kept.priorities), len(kept.rewrites),
            )  # fmt: skip
            return
        self.resources = reading
        self.readings += 1
        _log_reading(self.path, reading, "read again")


class InferenceExtension:
    """What the resources say about one request, counted in the picker's metrics (`file` None: no
    `--inference-resources`; a named objective then counts as "unlisted" and nothing is rewritten)."""

    def __init__(self, file: ResourceFile | None, metrics: PickMetrics, rng: random.Random) -> None:
        self.file = file
        self._metrics = metrics
        self._rng = rng

    @classmethod
    def from_config(
        cls,
        config: InferenceExtensionConfig,
        metrics: PickMetrics,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> InferenceExtension:
        return cls(ResourceFile.from_config(config, clock), metrics, rng)

    def objective(self, model: str, headers: Mapping[str, str]) -> int | None:
        """The priority of the objective a request names (its x-gateway-inference-objective header),
        if the file lists it; counted per name, a name the file does not list as "unlisted"."""
        name = headers.get(OBJECTIVE_HEADER)
        if name is None:
            return None
        priority = self.file.priority(name) if self.file is not None else None
        self._metrics.objective_requests.values[model, name if priority is not None else UNLISTED] += 1
        return priority

    def matches(self, model: str) -> bool:
        """Whether a rewrite rule names `model` among the models it matches."""
        return self.file is not None and any(model in rule.models for rule in self.file.resources.rewrites)

    def model_for(self, model: str, headers: Mapping[str, str] | None = None) -> str | None:
        """The model a request for `model` is sent as, when not as asked: a rewrite rule's target,
        else the model its x-gateway-model-name-rewrite header (in `headers`) names."""
        chosen = self.file.rewrite(model, self._rng) if self.file is not None else None
        if chosen is None:
            target = (headers or {}).get(MODEL_REWRITE_HEADER) or None
        else:
            target, rule = chosen
            matched = model if model in rule.models else ANY_MODEL  # a client's name only when listed
            self._metrics.model_rewrites.values[rule.rewrite, matched, target] += 1
        return target if target != model else None


def pick_target(rule: RewriteRule, rng: random.Random) -> str:
    """A target of `rule` by weight (none weighted: each alike)."""
    bounds = list(accumulate(t.weight for t in rule.targets))  # a target owns [its start, its bound)
    if bounds[-1] == 0:
        return rule.targets[rng.randrange(len(rule.targets))].model
    return rule.targets[bisect_right(bounds, rng.randrange(bounds[-1]))].model


def queue_entry(
    request_id: str,
    arrival_s: float,
    new_tokens: int,
    hints: Mapping[str, Any],
    objective_priority: int | None,
    fairness_id: str | None = None,
) -> QueuedRequest:
    """The admission queue's entry for a request: see the table above. `fairness_id`: its
    x-gateway-inference-fairness-id header, its flow under round-robin fairness (the first
    `MAX_FAIRNESS_ID` characters; none: the one default flow)."""
    priority = objective_priority if objective_priority is not None else _hinted_priority(hints)
    jump = hints.get("latency_sensitivity")
    if isinstance(jump, bool) or not isinstance(jump, int | float) or not 0 <= jump < math.inf:
        jump = 0.0
    return QueuedRequest(
        request_id,
        arrival_s,
        new_tokens=new_tokens,
        priority=priority,
        latency_sensitivity=float(jump),
        sheddable=hints.get("sheddable") is True or priority < 0,
        flow=(fairness_id or "")[:MAX_FAIRNESS_ID],
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


def _log_reading(path: str, resources: InferenceResources, verb: str) -> None:
    for line in resources.left_out:
        log.info("%s", line)
    shown = ", ".join(f"{name}={p}" for name, p in sorted(resources.priorities.items())[:20])
    more = len(resources.priorities) - 20
    rewrites = sorted({rule.rewrite for rule in resources.rewrites})
    log.info(
        "inference resources %s from %s: %d objectives (%s%s), %d model rewrites (%s)",
        verb, path, len(resources.priorities), shown or "none", f", and {more} more" if more > 0 else "",
        len(rewrites), ", ".join(rewrites[:20]) or "none",
    )  # fmt: skip
