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
from dataclasses import dataclass, replace

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
        a, b, c = values[:3]
        if len(values) == 3:
            return cls(prefill_quadratic_ms=a, prefill_linear_ms=b, prefill_constant_ms=c)
        d2, d1, d0 = values[3:]
        return cls(
            prefill_quadratic_ms=a,
            prefill_linear_ms=b,
            prefill_constant_ms=c,
            decode_quadratic_ms=d2,
            decode_linear_ms=d1,
            decode_constant_ms=d0,
        )

    def scaled(self, factor: float) -> PrefillTiming:
        """The same model on a worker whose passes take `factor` times as long (every ms coefficient
        scaled; token budget and KV capacity kept). `extproc.router.pass_time` learns the factor."""
        return replace(
            self,
            prefill_quadratic_ms=self.prefill_quadratic_ms * factor,
            prefill_linear_ms=self.prefill_linear_ms * factor,
            prefill_constant_ms=self.prefill_constant_ms * factor,
            decode_quadratic_ms=self.decode_quadratic_ms * factor,
            decode_linear_ms=self.decode_linear_ms * factor,
            decode_constant_ms=self.decode_constant_ms * factor,
            decode_min_ms=self.decode_min_ms * factor,
        )

    def prefill_ms(self, tokens: float) -> float:
        """One pass computing `tokens` uncached prompt tokens (no decode part)."""
        t = tokens
        return self.prefill_quadratic_ms * t * t + self.prefill_linear_ms * t + self.prefill_constant_ms

    def decode_ms(self, kv_usage: float) -> float:
        """The decode part of a pass at KV usage `kv_usage` (0..1)."""
        u = min(1.0, max(0.0, kv_usage))
        ms = self.decode_quadratic_ms * u * u + self.decode_linear_ms * u + self.decode_constant_ms
        return max(self.decode_min_ms, ms)

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


class PrefillTimeline:
    """One worker's predicted prompt work: a stream of uncached prompt tokens, computed in passes.

    The requests routed to the worker whose first token has not come back, in routing order (the
    engine admits and chunks them in that order). From `anchor_ms` on, the worker runs passes of
    `max_num_batched_tokens` stream tokens, each costing `prefill_ms(tokens)` plus the decode part
    while it also decodes. A new request cannot join the pass in progress, but its tokens share the
    following passes with the rest of the stream, as the engine packs prompts. A first token
    re-anchors the stream to that moment; a request freed before its first token leaves it.
    """

    __slots__ = ("_decode_ms", "_pending", "_timing", "_total", "anchor_ms")

    def __init__(self, timing: PrefillTiming) -> None:
        self._timing = timing
        self._pending: dict[str, int] = {}  # request id -> uncached tokens, routing order
        self._total = 0
        self._decode_ms = 0.0  # decode part of each pass of this stream
        self.anchor_ms = 0.0

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    def _position(self, now_ms: float) -> tuple[float, int, float] | None:
        """(start, committed tokens, end) of the pass in progress, or None if the stream is done."""
        if not self._total:
            return None
        timing = self._timing
        budget = timing.max_num_batched_tokens
        full_ms = timing.prefill_ms(budget) + self._decode_ms
        elapsed = now_ms - self.anchor_ms
        if elapsed < 0:  # the stream starts when the pass in progress ends
            return now_ms, 0, self.anchor_ms
        # passes ended; `/` not `//`: 1.0 // 0.1 is 9.0 (0.1 is a little over a tenth) where 1.0 / 0.1
        # rounds to 10.0, and one pass short a busy stream would read as done at that instant
        k = int(elapsed / full_ms)
        if k * budget >= self._total:
            return None
        committed = min(self._total, (k + 1) * budget)
        start = self.anchor_ms + k * full_ms
        end = start + timing.prefill_ms(committed - k * budget) + self._decode_ms
        return None if end <= now_ms else (start, committed, end)

    @property
    def timing(self) -> PrefillTiming:
        """The pass-time model this stream is predicted with."""
        return self._timing

    @property
    def stream_decode_ms(self) -> float:
        """The decode part each pass of this stream pays."""
        return self._decode_ms

    def finished_by(self, now_ms: float) -> bool:
        """Whether the stream is done at `now_ms` and stays done at every later time (until it
        changes): `ttft_ms` then no longer depends on the clock."""
        if not self._total:
            return True
        elapsed = now_ms - self.anchor_ms
        if elapsed < 0:
            return False
        timing = self._timing
        budget = timing.max_num_batched_tokens
        full_ms = timing.prefill_ms(budget) + self._decode_ms
        k = int(elapsed / full_ms)
        if k * budget >= self._total:
            return True
        if (k + 1) * budget < self._total:
            return False  # not the last pass: `_position` may read None for an instant, not for good
        end = self.anchor_ms + k * full_ms + timing.prefill_ms(self._total - k * budget) + self._decode_ms
        return end <= now_ms

    def running_at(self, now_ms: float) -> bool:
        """Whether prompt work is predicted in progress at `now_ms` (`ttft_ms` waits for it)."""
        return self._position(now_ms) is not None

    def end_ms(self, now_ms: float) -> float:
        """When the stream's last pass ends as predicted (constant while the stream does not
        change; `now_ms` if it is done)."""
        pos = self._position(now_ms)
        if pos is None:
            return now_ms
        _, committed, end = pos
        rest = self._total - committed
        return end + self._timing.prompt_ms(rest, self._decode_ms) if rest > 0 else end

    def ttft_ms(self, uncached_tokens: int, now_ms: float, decode_ms: float) -> float:
        """Predicted time to first token of a request of `uncached_tokens` routed here now.

        `decode_ms`: the decode part each pass pays now (0 when nothing decodes); with prompt work
        queued, the stream's own decode part applies instead.
        """
        pos = self._position(now_ms)
        if pos is None:
            return decode_ms / 2 + self._timing.prompt_ms(uncached_tokens, decode_ms)
        _, committed, end = pos
        rest = self._total - committed + max(1, uncached_tokens)
        return end - now_ms + self._timing.prompt_ms(rest, self._decode_ms)

    def retime(self, timing: PrefillTiming) -> None:
        """Predict with another pass-time model from now on (the worker's learned one: a scaled copy
        of the current, so the stream's decode part scales with it)."""
        self._decode_ms *= timing.prefill_linear_ms / self._timing.prefill_linear_ms
        self._timing = timing

    def remaining_tokens(self, now_ms: float) -> int:
        """Prompt tokens still to compute if the work goes as predicted (the pass in progress pro rata)."""
        pos = self._position(now_ms)
        if pos is None:
            return 0
        start, committed, end = pos
        budget = self._timing.max_num_batched_tokens
        in_pass = committed - (committed - 1) // budget * budget if committed else 0
        progress = (now_ms - start) / (end - start) if end > start else 0.0
        return round(self._total - committed + in_pass * (1.0 - min(1.0, max(0.0, progress))))

    def add(self, request_id: str, uncached_tokens: int, now_ms: float, decode_ms: float) -> None:
        """Append a request routed here now; `decode_ms` as for `ttft_ms`."""
        if request_id in self._pending:
            return
        if self._position(now_ms) is None:  # idle (as predicted): a new stream after the pass in progress
            self._pending.clear()
            self._total = 0
            self._decode_ms = decode_ms
            self.anchor_ms = now_ms + decode_ms / 2
        tokens = max(1, uncached_tokens)
        self._pending[request_id] = tokens
        self._total += tokens

    def complete(self, request_id: str, now_ms: float) -> bool:
        """The first token of `request_id` came back at `now_ms`: it and every request routed here
        before it are done; the rest of the stream starts now. False if it was not pending."""
        if request_id not in self._pending:
            return False
        while self._pending:
            done, tokens = next(iter(self._pending.items()))
            del self._pending[done]
            self._total -= tokens
            if done == request_id:
                break
        self.anchor_ms = now_ms
        return True

    def drop(self, request_id: str) -> bool:
        """The request left before its first token (cancelled, failed): its tokens leave the stream."""
        tokens = self._pending.pop(request_id, None)
        if tokens is None:
            return False
        self._total -= tokens
        return True


@dataclass(frozen=True, slots=True)
class PrefillEstimate:
    """A request's predicted time to first token on one worker."""

    ttft_ms: float
    prefill_ms: float  # its own chunked prefill, were the worker idle
    uncached_tokens: int
    decode_ms: float  # the decode part each of the worker's passes pays now

    @property
    def wait_ms(self) -> float:
        """What the work already there adds (the pass in progress, prompts ahead of it)."""
        return self.ttft_ms - self.prefill_ms


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
    own = timing.prompt_ms(uncached_tokens, decode_part)
    if timeline is None:
        return PrefillEstimate(decode_part / 2 + own, own, uncached_tokens, decode_part)
    ttft = timeline.ttft_ms(uncached_tokens, now_ms, decode_part)
    return PrefillEstimate(ttft, own, uncached_tokens, decode_part)
