"""Router-group nouns: what a picker asks a group and what the group answers.

Plain frozen dataclasses, no logic and no protobuf (`codec.py` converts them at the gRPC edge).
`RouterGroup` is the interface every decision goes through: `extproc.picker.local_group.LocalGroup`
(this process's workers; a plain deployment is one of them) and `RemoteGroup` (another picker's
group API) both satisfy it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from extproc.router import RouterConfigOverride, Worker

TokenIds = Sequence[int] | np.ndarray


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """One request as every group sees it: the model, its prompt's token ids and its routing hints.

    `restrictions` are endpoint lists (subset hint, conformance header); a worker must match every
    list (`epp.endpoint_matches`). `isl` is set only to route on load alone (the tokenizer failed):
    the prompt's length in tokens, with no block hashes (any token ids are then ignored).
    """

    model: str
    token_ids: TokenIds
    lora_name: str | None = None
    cache_salt: str | None = None
    overrides: RouterConfigOverride | None = None
    expected_output_tokens: int | None = None
    restrictions: tuple[tuple[str, ...], ...] | None = None
    isl: int | None = None

    @property
    def input_tokens(self) -> int:
        return self.isl if self.isl is not None else len(self.token_ids)


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """A group's current load, summed over its (worker, dp rank) pairs."""

    workers: int = 0
    active_requests: int = 0
    active_prefill_tokens: int = 0
    active_decode_blocks: float = 0.0


@dataclass(frozen=True, slots=True)
class GroupChoice:
    """A worker a group chose, where Envoy reaches it, and the numbers behind the choice."""

    worker: Worker
    endpoint: str
    headers: Mapping[str, str] = field(default_factory=dict)
    overlap_blocks: int = 0
    request_blocks: int = 0
    cost: float = 0.0
    best_overlap_blocks: int = 0  # the largest overlap of any candidate in the group (regret = best - chosen)
    prefill_worker: Worker | None = None  # disaggregated: the worker that prefills the prompt
    prefill_endpoint: str | None = None  # its ip:port (also in `headers`, under the prefill header)
    # the time to first token the group's router predicted for it there when it was added (its
    # timing or aic prefill model; None: no prediction, as for a probe, which adds nothing)
    predicted_ttft_ms: float | None = None


@dataclass(frozen=True, slots=True)
class GroupProbe:
    """A group's answer to a probe: its choice, its load and its block size (tokens per block)."""

    group: str
    choice: GroupChoice
    load: GroupLoad
    block_size: int
    latency_s: float = 0.0
    has_capacity: bool = True  # some candidate is under the queue threshold (the admission queue's test)

    @property
    def overlap_tokens(self) -> int:
        """Cached prompt tokens on the chosen worker (comparable across block sizes)."""
        return self.choice.overlap_blocks * self.block_size

    @property
    def overlap_fraction(self) -> float:
        blocks = self.choice.request_blocks
        return self.choice.overlap_blocks / blocks if blocks else 0.0


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """A committed request: the group that owns it, the id it tracks it under, and the final worker.

    `redecided` means the probed worker had become ineligible or had left, so `choice` is a new
    decision of that group. `best_overlap_blocks` is the largest overlap any group reported for any
    of its candidates (set by the selector; the group's own when it comes straight from a group).
    """

    group: str
    request_id: str
    choice: GroupChoice
    redecided: bool = False
    best_overlap_blocks: int = 0
    timings_ns: Mapping[str, int] = field(default_factory=dict)  # a local group's hash/match/select times


@dataclass(frozen=True, slots=True)
class GroupWorkerLoad:
    """One worker's load if the request went there (`KvRouter.get_potential_loads`), with its endpoint."""

    worker: Worker
    endpoint: str
    prefill_tokens: int
    decode_blocks: float
    overlap_blocks: float  # credited: device blocks plus offloaded ones at their tier's weight


@dataclass(frozen=True, slots=True)
class GroupLoads:
    """A group's potential loads for one request, its current load and its block size."""

    group: str
    workers: tuple[GroupWorkerLoad, ...]
    load: GroupLoad
    block_size: int


class RouterGroup(Protocol):
    """What the selector needs from a group, local or remote.

    Decisions raise `GroupError` (a remote group) or the decision's own error (a local group:
    UnknownModel, NoEligibleWorker, NoWorkers, AllWorkersBusy), which the selector reads alike.
    Lifecycle calls never wait and never raise: a local group applies them at once, a remote one
    sends them in the background, retried until acknowledged.
    """

    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...

    @property
    def in_process(self) -> bool:
        """Whether its decisions run in this process (they then need no probe and no deadline)."""
        ...

    async def probe(self, request: GroupRequest, *, timeout_s: float) -> GroupProbe:
        """Which worker the group would choose, and whether it has room; changes no state."""
        ...

    async def commit(self, request: GroupRequest, request_id: str, worker: Worker | None) -> GroupDecision:
        """Track the request on `worker` (probed, or a session's), or on a new decision when it is
        None or cannot take it any more."""
        ...

    async def has_capacity(self, request: GroupRequest) -> bool:
        """Whether a worker that may take the request is under the queue threshold."""
        ...

    async def potential_loads(self, request: GroupRequest) -> GroupLoads: ...

    def mark_prefill_complete(self, model: str, request_id: str, *, at_first_token: bool = True) -> None:
        """The request's first token arrived: its prompt no longer loads prefill. `at_first_token`
        False: the call comes later (a non-streamed answer, seen whole): no pass time is learned."""
        ...

    def add_output_tokens(self, model: str, request_id: str, count: int, sequences: int) -> None:
        """`count` more tokens generated per sequence, of `sequences` (--router-track-output-blocks)."""
        ...

    def answered(self, model: str, request_id: str, worker: Worker, status: int) -> None:
        """The worker's response status for the request (outlier ejection reads it)."""
        ...

    def free(self, model: str, request_id: str) -> None:
        """The request ended (complete, error or cancel). Idempotent."""
        ...

    async def close(self) -> None: ...
