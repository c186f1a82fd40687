"""Dynamo's `aic` prefill load model: only the oldest active prefill on each worker decays.

Pure: no I/O, no clock of its own; time is an argument everywhere.

Dynamo's semantics (its router guide: "aic predicts one expected prefill duration per admitted
request and lazily decays only the oldest active prefill request on each worker"; its
`PrefillLoadTracker` in lib/kv-router), followed here exactly:

- a request admitted with uncached prompt tokens (`isl - cached`, > 0) gets one expected prefill
  duration, predicted once at admission for a batch of one and never revised;
- per worker the active prefills are kept in admission order; the oldest is the anchor, from the
  moment it became the oldest (its admission, or the removal of the one before it);
- the anchor's load is `ceil(tokens * clamp(1 - elapsed / duration, 0, 1))`, with elapsed never
  below 0 (a clock that went back); a duration of 0 (or less) counts 0; every other active prefill
  counts its full tokens until it becomes the oldest;
- the load is computed when read (lazily): nothing runs as time passes;
- a request leaves at its first token (or when it ends before one); when it was the anchor, the
  next oldest becomes the anchor at that moment.

The difference: Dynamo asks AIConfigurator's performance database for the duration (the
`--aic-*` flags choose its backend, system, model and parallelism); that database cannot run here.
The duration is the pass-time model's instead (`PrefillTiming.prompt_ms`: the prompt's chunked
prefill alone on the worker, no decode part), the worker's learned model when the router learns
pass times (`extproc.router.pass_time`). `extproc.router.sequences` calls this module.
"""

from __future__ import annotations

import math

from extproc.router.prefill_model import PrefillEstimate, PrefillTiming


def expected_prefill_ms(timing: PrefillTiming, uncached_tokens: int) -> float:
    """The expected prefill duration of a prompt with `uncached_tokens` to compute, alone on a
    worker with pass-time model `timing` (what Dynamo asks AIConfigurator for, batch size 1)."""
    return timing.prompt_ms(uncached_tokens)


def decayed_tokens(tokens: int, duration_ms: float, elapsed_ms: float) -> int:
    """What remains of the anchor's `tokens` `elapsed_ms` after it became the oldest prefill."""
    if duration_ms <= 0:
        return 0
    fraction = min(1.0, max(0.0, 1.0 - max(0.0, elapsed_ms) / duration_ms))
    return math.ceil(tokens * fraction)


class OldestPrefillDecay:
    """One worker's active prefills in admission order, the oldest decaying (see the module)."""

    __slots__ = ("_full", "_pending", "anchor_ms")

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int, float]] = {}  # request id -> (tokens, duration ms), in order
        self._full = 0  # every active prefill's full tokens
        self.anchor_ms = 0.0  # when the oldest became the oldest

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    @property
    def full_tokens(self) -> int:
        """Every active prefill's tokens, undecayed."""
        return self._full

    def add(self, request_id: str, tokens: int, duration_ms: float, now_ms: float) -> bool:
        """Admit a prefill of `tokens` (> 0) expected to take `duration_ms`; False (no change) for
        a known id or no tokens."""
        if tokens <= 0 or request_id in self._pending:
            return False
        if not self._pending:
            self.anchor_ms = now_ms
        self._pending[request_id] = (tokens, duration_ms)
        self._full += tokens
        return True

    def remove(self, request_id: str, now_ms: float) -> bool:
        """The prefill ended (first token, or the request left): the next oldest is anchored now if
        it was the oldest. False if it was not active."""
        entry = self._pending.get(request_id)
        if entry is None:
            return False
        oldest = next(iter(self._pending)) == request_id
        del self._pending[request_id]
        self._full -= entry[0]
        if oldest:
            self.anchor_ms = now_ms
        return True

    def active_tokens(self, now_ms: float) -> int:
        """Active prefill tokens at `now_ms`: the others' in full, the oldest's decayed."""
        if not self._pending:
            return 0
        tokens, duration_ms = next(iter(self._pending.values()))
        return self._full - tokens + decayed_tokens(tokens, duration_ms, now_ms - self.anchor_ms)

    def remaining_ms(self, now_ms: float) -> float:
        """Modeled prefill time still ahead at `now_ms`, as Dynamo's: every duration, less the time
        since the anchor (not clipped: an anchor past its duration may eat into the next ones)."""
        if not self._pending:
            return 0.0
        total = sum(duration for _, duration in self._pending.values())
        return total - max(0.0, now_ms - self.anchor_ms)


def admission_estimate(
    decay: OldestPrefillDecay | None, own_ms: float, tokens: int, now_ms: float
) -> PrefillEstimate:
    """The time to first token the aic model implies for a prefill admitted now (the modeled time
    ahead, never below 0, then its own), for the pass-time learner to compare with the first token."""
    wait = max(0.0, decay.remaining_ms(now_ms)) if decay is not None else 0.0
    return PrefillEstimate(wait + own_ms, own_ms, tokens, 0.0)
