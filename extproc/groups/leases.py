"""Leases: a group frees the requests of a top-level picker that stopped renewing them. Pure.

A top-level picker (the owner, named by an id it draws at start) commits requests to a remote group
and frees them when their streams end. If it dies or is cut off, its frees never come: without a
lease those requests would stay counted in the group forever. So every commit names its owner, a
sequence number and a lease, and the owner renews all its requests in that group every third of the
lease with one message that lists the ones it still holds:

- an owner silent for longer than its lease has all its requests freed (`expired`);
- a renewal frees the owner's requests it no longer lists (their Free was lost: a group paused or
  unreachable when the stream ended), except those committed after the renewal was written (a
  sequence number above `up_to_seq`), which the owner could not list yet.

Owner ids come from the network: the table holds at most `max_owners` of them (the least recently
renewed is dropped first, its requests freed); requests are bounded by what the group tracks.
The caller passes the time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field

MAX_OWNERS = 1024


@dataclass(slots=True)
class _Owner:
    expires_at: float
    requests: dict[str, int] = field(default_factory=dict)  # request id -> commit sequence number


class LeaseTable:
    """Which owner holds which committed request, and until when."""

    def __init__(self, *, max_owners: int = MAX_OWNERS) -> None:
        self.max_owners = max_owners
        self._owners: OrderedDict[str, _Owner] = OrderedDict()  # least recently renewed first
        self._owner_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._owner_of)

    def owners(self) -> int:
        return len(self._owners)

    def track(self, owner: str, request_id: str, seq: int, lease_s: float, now: float) -> list[str]:
        """A committed request of `owner`; returns requests freed to make room for a new owner."""
        evicted: list[str] = []
        entry = self._owners.get(owner)
        if entry is None:
            while len(self._owners) >= self.max_owners:
                _, oldest = self._owners.popitem(last=False)
                evicted += self._drop(oldest)
            entry = self._owners[owner] = _Owner(now + lease_s)
        entry.expires_at = max(entry.expires_at, now + lease_s)
        entry.requests[request_id] = seq
        self._owner_of[request_id] = owner
        return evicted

    def untrack(self, request_id: str) -> None:
        """The request was freed (by its owner or otherwise)."""
        owner = self._owner_of.pop(request_id, None)
        if owner is not None and owner in self._owners:
            self._owners[owner].requests.pop(request_id, None)

    def renew(
        self, owner: str, lease_s: float, live: Collection[str], up_to_seq: int, now: float
    ) -> list[str]:
        """Extend `owner`'s lease; returns its requests to free: committed at or before `up_to_seq`
        and not in `live`."""
        entry = self._owners.get(owner)
        if entry is None:  # its requests expired meanwhile (or it has none here): nothing to keep
            return []
        entry.expires_at = now + lease_s
        self._owners.move_to_end(owner)
        live_set = live if isinstance(live, set | frozenset) else set(live)
        stale = [r for r, seq in entry.requests.items() if seq <= up_to_seq and r not in live_set]
        for request_id in stale:
            self.untrack(request_id)
        return stale

    def expired(self, now: float) -> dict[str, list[str]]:
        """Owners whose lease ran out, with their requests (all to free); they are forgotten."""
        gone = [owner for owner, entry in self._owners.items() if entry.expires_at <= now]
        return {owner: self._drop(self._owners.pop(owner)) for owner in gone}

    def _drop(self, entry: _Owner) -> list[str]:
        requests = list(entry.requests)
        for request_id in requests:
            self._owner_of.pop(request_id, None)
        return requests
