"""TtlTable: entries keyed by ids that clients or engines choose, bounded in number and in time. Pure.

What sticky-session pins (`extproc.router.sessions`) and the homes of stored answers
(`extproc.picker.response_homes`) have in common; each keeps its own rules for what a use is.

- At most `max_entries` (None: no bound): a new key beyond it evicts the least recently used entry
  (`evicted`).
- An entry lapses `ttl_s` after its last use (`last_used_s`, in seconds of the caller's clock). Lapsed
  entries are dropped when looked up and by `expire(now)`, oldest first, so a sweep costs what it
  drops and memory never waits for a lookup (`expired`).
- Entries handed over by another replica keep their last use there, so an entry can be older than
  the ones used after it: `get` checks each entry's own time, not only the sweep's order.
- `on_drop(key, entry)` hears of every entry that leaves other than by `pop` (lapsed, evicted,
  dropped by `drop_where`): the caller may have something to undo.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Timed(Protocol):
    last_used_s: float


E = TypeVar("E", bound=Timed)


class TtlTable(Generic[E]):
    """key -> entry, least recently used first, each lapsing `ttl_s` after its last use."""

    def __init__(
        self,
        ttl_s: float,
        max_entries: int | None = None,
        on_drop: Callable[[str, E], None] | None = None,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, not {ttl_s!r}")
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries!r}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.on_drop = on_drop
        self._entries: OrderedDict[str, E] = OrderedDict()  # least recently used first
        self.expired = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def live(self, now: float) -> Iterator[tuple[str, E]]:
        """Every entry not lapsed at `now`, least recently used first: the table as it is now, read
        as the iterator is (the table may change meanwhile)."""
        self.expire(now)
        entries, keys = self._entries, list(self._entries)
        return (
            (key, e)
            for key in keys
            if (e := entries.get(key)) is not None and now - e.last_used_s < self.ttl_s
        )

    def get(self, key: str, now: float) -> E | None:
        """The entry, or None when there is none or it lapsed (then dropped). Not a use: see `used`."""
        self.expire(now)
        entry = self._entries.get(key)
        if entry is not None and now - entry.last_used_s >= self.ttl_s:
            del self._entries[key]
            self.expired += 1
            self._dropped(key, entry)
            return None
        return entry

    def peek(self, key: str) -> E | None:
        """The entry as it is, lapsed or not (no sweep, not a use)."""
        return self._entries.get(key)

    def used(self, key: str, now: float) -> None:
        """The entry was used at `now`: its TTL restarts and it becomes the most recently used."""
        self._entries[key].last_used_s = now
        self._entries.move_to_end(key)

    def put(self, key: str, entry: E) -> None:
        """Add or replace the entry under `key`, as the most recently used; a new key beyond
        `max_entries` evicts the least recently used one."""
        bound = self.max_entries
        replaced = self._entries.pop(key, None) is not None
        if not replaced and bound is not None and len(self._entries) >= bound:
            self._dropped(*self._entries.popitem(last=False))
            self.evicted += 1
        self._entries[key] = entry

    def pop(self, key: str) -> E | None:
        """Take the entry out (nobody is told); None when there is none."""
        return self._entries.pop(key, None)

    def drop_where(self, gone: Callable[[E], bool]) -> int:
        """Drop every entry `gone` says has to go (its worker left); returns how many."""
        keys = [key for key, e in self._entries.items() if gone(e)]
        for key in keys:
            self._dropped(key, self._entries.pop(key))
        return len(keys)

    def expire(self, now: float) -> int:
        """Drop the entries unused for `ttl_s`, oldest first, until one is not; returns how many."""
        entries = self._entries
        dropped = 0
        while entries:
            key, entry = next(iter(entries.items()))
            if now - entry.last_used_s < self.ttl_s:
                break
            del entries[key]
            dropped += 1
            self._dropped(key, entry)
        self.expired += dropped
        return dropped

    def entries(self) -> Iterator[E]:
        """Every entry, lapsed or not, least recently used first."""
        return iter(self._entries.values())

    def _dropped(self, key: str, entry: E) -> None:
        if self.on_drop is not None:
            self.on_drop(key, entry)
