"""Prefill load in time: how long each worker still needs for the prompts routed to it.

Pure: no I/O, no clock of its own; time is an argument everywhere.

The `timing` prefill load model (`--router-prefill-load-model timing`). With `none`, a routed
prompt's uncached tokens load its worker, unchanged, until its first token comes back. Here the
router instead predicts each prompt's prefill duration from a timing model of the worker and keeps,
per worker, a timeline of predicted prefill work: the load decays as time passes, and every first
token re-anchors the timeline to what really happened.

Why time: under the engine's pass-time model (REFERENCE section 6) one more prefill block costs
about 0.97 ms once, while one more decoding block slows a pass by about 0.003 ms. Dynamo's cost
adds both as 1. A prediction of the request's time to first token on each worker, the wait for the
work already there plus its own chunked prefill, ranks workers by what the user waits for.

- `PrefillTiming`: the worker's pass-time model. The default is the polynomial of Dynamo's mocker
  (REFERENCE section 6; the simulator's copy is `extproc/sim/timing.py`, a test keeps both equal).
  A deployment fits its own coefficients; nothing here depends on one trace.
- `PrefillTimeline`: one worker's routed prompts, first-token order assumed FIFO (engines admit
  waiting requests in arrival order and chunk them in that order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from extproc.router.errors import InvalidConfig


@dataclass(frozen=True, slots=True)
class PrefillTiming:
    """A worker's pass time: prefill_ms(T) = a T^2 + b T + c; decode_ms(u) = max(min, d2 u^2 + d1 u + d0).

    T is the number of uncached prompt tokens a pass computes (at most `max_num_batched_tokens`),
    u the fraction of the KV cache (`kv_capacity_tokens`) held by decoding requests. A pass that
    holds decoding requests costs both parts, added.
    """

    prefill_quadratic_ms: float = 4.209989e-7  # per token^2
    prefill_linear_ms: float = 0.01518344  # per token
    prefill_constant_ms: float = 16.50142  # per pass
    decode_quadratic_ms: float = -25.74  # per usage^2
    decode_linear_ms: float = 54.01  # per usage
    decode_constant_ms: float = 5.74
    decode_min_ms: float = 1.0
    max_num_batched_tokens: int = 8192
    kv_capacity_tokens: int = 16_384 * 64

    def __post_init__(self) -> None:
        for name in (
            "prefill_quadratic_ms",
            "prefill_linear_ms",
            "prefill_constant_ms",
            "decode_quadratic_ms",
            "decode_linear_ms",
            "decode_constant_ms",
            "decode_min_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise InvalidConfig(f"prefill_timing.{name}", value, "a finite number")
        if not self.prefill_linear_ms > 0:
            raise InvalidConfig("prefill_timing.prefill_linear_ms", self.prefill_linear_ms, "a number > 0")
        for name in ("max_num_batched_tokens", "kv_capacity_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidConfig(f"prefill_timing.{name}", value, "an integer >= 1")

    @classmethod
    def parse(cls, text: str) -> PrefillTiming:
        """`a,b,c` (prefill polynomial, ms) or `a,b,c,d2,d1,d0` (and the decode one). Raises InvalidConfig."""
        try:
            values = [float(part) for part in text.split(",")]
        except ValueError:
            raise InvalidConfig("prefill_timing", text, "3 or 6 comma-separated numbers") from None
        if len(values) not in (3, 6):
            raise InvalidConfig("prefill_timing", text, "3 or 6 comma-separated numbers")
        names = (
            "prefill_quadratic_ms",
            "prefill_linear_ms",
            "prefill_constant_ms",
            "decode_quadratic_ms",
            "decode_linear_ms",
            "decode_constant_ms",
        )
        return cls(**dict(zip(names, values, strict=False)))

    def prefill_ms(self, tokens: float) -> float:
        """One pass computing `tokens` uncached prompt tokens (no decode part)."""
        t = tokens
        return self.prefill_quadratic_ms * t * t + self.prefill_linear_ms * t + self.prefill_constant_ms

    def decode_ms(self, kv_usage: float) -> float:
        """The decode part of a pass at KV usage `kv_usage` (0..1)."""
        u = min(1.0, max(0.0, kv_usage))
        ms = self.decode_quadratic_ms * u * u + self.decode_linear_ms * u + self.decode_constant_ms
        return max(self.decode_min_ms, ms)

    def decode_ms_per_block(self, kv_usage: float, block_size: int) -> float:
        """How much one more decoding block lengthens every pass, at KV usage `kv_usage`."""
        u = min(1.0, max(0.0, kv_usage))
        slope = max(0.0, 2 * self.decode_quadratic_ms * u + self.decode_linear_ms)
        return slope * block_size / self.kv_capacity_tokens

    def prompt_ms(self, uncached_tokens: int, decode_part_ms: float = 0.0) -> float:
        """A prompt's prefill alone on the worker: chunks of `max_num_batched_tokens`, each a pass
        that also pays `decode_part_ms` when the worker is decoding other requests."""
        budget = self.max_num_batched_tokens
        full, rest = divmod(max(1, uncached_tokens), budget)
        total = full * (self.prefill_ms(budget) + decode_part_ms)
        if rest:
            total += self.prefill_ms(rest) + decode_part_ms
        return total

    @property
    def ms_per_token(self) -> float:
        """The unit that turns time back into prefill tokens (the linear coefficient)."""
        return self.prefill_linear_ms


@dataclass(slots=True)
class _Pending:
    duration_ms: float
    tokens: int


class PrefillTimeline:
    """One worker's predicted prefill work: requests routed there whose first token has not come back.

    `busy_until_ms` is when the worker should finish the last of them. A new request queues behind
    them; a first token re-anchors the rest to that moment; a request freed before its first token
    takes its predicted time with it.
    """

    __slots__ = ("_pending", "busy_until_ms")

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}  # routing order
        self.busy_until_ms = 0.0

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    def remaining_ms(self, now_ms: float) -> float:
        return max(0.0, self.busy_until_ms - now_ms) if self._pending else 0.0

    def remaining_tokens(self, now_ms: float) -> int:
        """Prompt tokens still to compute, if the work goes as predicted (the newest request last)."""
        left = self.remaining_ms(now_ms)
        tokens = 0.0
        for p in reversed(self._pending.values()):
            if left <= 0:
                break
            share = min(p.duration_ms, left)
            tokens += p.tokens * (share / p.duration_ms if p.duration_ms > 0 else 1.0)
            left -= share
        return round(tokens)

    def add(self, request_id: str, start_ms: float, duration_ms: float, tokens: int) -> None:
        """Queue a request whose prefill is predicted to start at `start_ms` at the earliest."""
        if request_id in self._pending:
            return
        self._pending[request_id] = _Pending(duration_ms, tokens)
        self.busy_until_ms = max(self.busy_until_ms, start_ms) + duration_ms

    def complete(self, request_id: str, now_ms: float) -> bool:
        """The first token of `request_id` came back at `now_ms`: it and every request routed to this
        worker before it are done; the rest start now. False if it was not pending."""
        if request_id not in self._pending:
            return False
        while self._pending:
            done = next(iter(self._pending))
            del self._pending[done]
            if done == request_id:
                break
        self.busy_until_ms = now_ms + sum(p.duration_ms for p in self._pending.values())
        return True

    def drop(self, request_id: str, now_ms: float) -> bool:
        """The request left before its first token (cancelled, failed); its predicted time goes too."""
        p = self._pending.pop(request_id, None)
        if p is None:
            return False
        self.busy_until_ms = max(now_ms, self.busy_until_ms - p.duration_ms)
        return True


@dataclass(frozen=True, slots=True)
class PrefillEstimate:
    """A request's predicted time to first token on one worker."""

    wait_ms: float  # the worker's work ahead of it (or the rest of the pass in progress)
    prefill_ms: float  # its own chunked prefill there
    uncached_tokens: int

    @property
    def ttft_ms(self) -> float:
        return self.wait_ms + self.prefill_ms


def estimate(
    timing: PrefillTiming,
    timeline: PrefillTimeline | None,
    uncached_tokens: int,
    *,
    decoding: bool,
    kv_usage: float,
    now_ms: float,
) -> PrefillEstimate:
    """Predict the time to first token of a prompt with `uncached_tokens` to compute on a worker.

    `decoding`: the worker holds requests past their first token, so every pass also pays the
    decode part at `kv_usage`, and a request arriving while it has no prompt work waits on average
    for half a pass to end.
    """
    decode_part = timing.decode_ms(kv_usage) if decoding else 0.0
    wait = timeline.remaining_ms(now_ms) if timeline is not None else 0.0
    if wait == 0.0 and decoding:
        wait = decode_part / 2
    own = timing.prompt_ms(uncached_tokens, decode_part)
    return PrefillEstimate(wait, own, uncached_tokens)
