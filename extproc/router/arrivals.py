"""Arrival rates per worker, and the delay a prompt's work adds to the requests that arrive behind it.

Pure: no I/O, no clock; times come in as arguments (milliseconds).

Why (issue 24, a fleet that mixes GPU generations). The timing model picks the worker where a
request's own first token comes soonest. Each such choice is right on its own and the sum is not:
on a fleet of four workers at full speed and four at half speed, a new session costs its whole
prompt at half speed on an idle slow worker against the queue plus the prompt on a fast one, so
it goes fast, its follow-ups stay where their prefix is, and the fast workers end up with nearly
every request (3,905 of 3,993 on the shared trace) while the slow ones idle: the fleet runs as
four workers. What the choice leaves out is what its work does to the requests that come to the
same worker after it: each that arrives while the queue ahead and this prompt are being worked
through waits for this prompt. With `rate` requests per millisecond arriving at the worker, own
prefill `own` and wait `wait` ahead of it, the arrivals during the wait wait `own` each and those
during its own work half of it on average: rate x own x (wait + own / 2), to first order. The
requests it delays delay those behind them in turn, so the cost counts rate x own x (wait + own).
(Replaying the shared trace on that mixed fleet, seeds 0-2: with own / 2, 220.9 ms; with own,
209.3 ms, 0.84x of Dynamo's cost; on another trace, `extproc.sim.synth --seed 7`, 69.1 and 69.4.)

It is counted only where the fleet's workers are known to differ in speed (`PassTimeLearner.mixed`:
a worker learned 1.25x faster or slower than the fleet): on identical workers, future requests
have equally good places to go, and the delay charged here would move follow-ups off their cached
prefixes for nothing (measured: 1-8 % worse time to first token on four identical workers).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

ARRIVAL_WINDOW_MS = 60_000.0  # the rate is an exponential average over about this long


class ArrivalRates(Generic[K]):
    """Requests routed to each worker per millisecond, averaged exponentially over `window_ms`."""

    __slots__ = ("_counts", "window_ms")

    def __init__(self, window_ms: float = ARRIVAL_WINDOW_MS) -> None:
        if not window_ms > 0:
            raise ValueError(f"window_ms must be > 0, got {window_ms!r}")
        self.window_ms = window_ms
        self._counts: dict[K, tuple[float, float]] = {}  # worker -> (decayed count, at ms)

    def add(self, worker: K, now_ms: float) -> None:
        """One request routed to `worker` at `now_ms`."""
        count = self._decayed(worker, now_ms)
        self._counts[worker] = (count + 1.0, now_ms)

    def per_ms(self, worker: K, now_ms: float) -> float:
        """`worker`'s arrival rate at `now_ms` (0 for a worker nothing was routed to)."""
        return self._decayed(worker, now_ms) / self.window_ms

    def forget(self, worker: K) -> None:
        self._counts.pop(worker, None)

    def _decayed(self, worker: K, now_ms: float) -> float:
        entry = self._counts.get(worker)
        if entry is None:
            return 0.0
        count, at = entry
        return count * math.exp(-max(0.0, now_ms - at) / self.window_ms)


def delay_behind_ms(rate_per_ms: float, own_ms: float, wait_ms: float) -> float:
    """The delay a prompt whose own prefill takes `own_ms`, after `wait_ms` of work ahead of it,
    adds to the requests arriving at its worker at `rate_per_ms` (module docstring)."""
    return rate_per_ms * own_ms * (wait_ms + own_ms)
