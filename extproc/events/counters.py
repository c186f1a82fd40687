"""Event counters shared by every decoder and transport, exported as metrics by the edges.

Keys are short dotted names, `<source>.<what>` (`vllm.unknown_event`, `zmq.gap`,
`nats.reconnect`, ...). Counting is the only side effect: decoders never raise on bad input,
they count it (and log it) and move on.

Messages lost to a full queue (`--event-queue-size`) are also counted per worker and reason in
`drops` (exported as `extproc_kv_events_dropped_total`), and under `<source>.dropped`.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger("extproc.events")


class EventCounters:
    """A named counter set; `loud` counts and logs a warning the first few times a key is hit."""

    LOUD_LOG_LIMIT = 5  # warnings per key before going quiet (the counter keeps counting)

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.drops: Counter[tuple[str, str, str]] = Counter()  # (source, worker, reason) -> messages

    def dropped(self, source: str, worker: str, reason: str, n: int = 1) -> None:
        """Count `n` messages of `worker` (`"*"` when unknown) lost to a full queue or a gap."""
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
