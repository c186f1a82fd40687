"""Event counters shared by every decoder and transport, exported as metrics by the edges.

Keys are short dotted names, `<source>.<what>` (`vllm.unknown_event`, `zmq.gap`,
`nats.reconnect`, ...). Counting is the only side effect: decoders never raise on bad input,
they count it (and log it) and move on.

Messages lost to a full queue (`--event-queue-size`) are also counted per worker and reason in
`drops` (exported as `extproc_kv_events_dropped_total`), and under `<source>.dropped`. A gap's size
comes from numbers on the wire (a ZMQ seq, a NATS event id, both 64-bit): one gap counts at most
`MAX_DROPPED_AT_ONCE` messages, so that one crafted or corrupted number cannot add 2**64 to a counter;
a larger claim is counted as that bound and logged (`<source>.gap_clamped`).
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger("extproc.events")

# About 17 minutes of an engine publishing 1,000 batches/s, lost in one piece: beyond any stall the
# picker survives (a reconnect rebuilds from the replay buffer instead of counting a gap).
MAX_DROPPED_AT_ONCE = 1 << 20


class EventCounters:
    """A named counter set; `loud` counts and logs a warning the first few times a key is hit."""

    LOUD_LOG_LIMIT = 5  # warnings per key before going quiet (the counter keeps counting)

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.drops: Counter[tuple[str, str, str]] = Counter()  # (source, worker, reason) -> messages

    def dropped(self, source: str, worker: str, reason: str, n: int = 1) -> None:
        """Count `n` messages of `worker` (`"*"` when unknown) lost to a full queue or a gap; `n` is
        taken within 0..MAX_DROPPED_AT_ONCE (it may come from the wire)."""
        if not 0 <= n <= MAX_DROPPED_AT_ONCE:
            self.loud(
                f"{source}.gap_clamped",
                "KV events of %s: a gap of %d messages (%s) is implausible; counted as %d",
                worker,
                n,
                reason,
                min(max(n, 0), MAX_DROPPED_AT_ONCE),
            )
            n = min(max(n, 0), MAX_DROPPED_AT_ONCE)
        self.counts[f"{source}.dropped"] += n
        self.drops[(source, worker, reason)] += n

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def loud(self, key: str, message: str, *args: object) -> None:
        """Count `key` and log `message` as a warning (rate-limited per key)."""
        self.counts[key] += 1
        seen = self.counts[key]
        if seen <= self.LOUD_LOG_LIMIT:
            suffix = " (further occurrences counted as %s, not logged)" if seen == self.LOUD_LOG_LIMIT else ""
            log.warning(message + suffix, *args, *((key,) if suffix else ()))

    def __getitem__(self, key: str) -> int:
        return self.counts[key]

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)
