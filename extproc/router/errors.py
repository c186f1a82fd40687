"""Errors of the router core, named by situation. They know no HTTP status; `epp.py` maps them.

RouterError
├── InvalidConfig             a config value is out of range (names field, value, accepted)
├── NoWorkers                 no worker is registered (or none is allowed for this request)
├── AllWorkersBusy            every candidate is over a busy threshold
├── PinnedWorkerUnavailable   the pinned worker is unknown or busy
├── QueueTimeout              a queued request waited its whole bound without capacity
└── UnknownRequest            a lifecycle call named a request the router does not track
"""

from __future__ import annotations


class RouterError(Exception):
    """Base class of the router core's errors."""


class InvalidConfig(RouterError, ValueError):
    def __init__(self, name: str, value: object, accepted: str) -> None:
        super().__init__(f"invalid {name}={value!r}: expected {accepted}")
        self.name = name
        self.value = value
        self.accepted = accepted


class NoWorkers(RouterError):
    def __init__(self, reason: str = "no worker is registered") -> None:
        super().__init__(reason)


class AllWorkersBusy(RouterError):
    def __init__(self, candidates: int) -> None:
        super().__init__(f"all {candidates} candidate workers are over a busy threshold")
        self.candidates = candidates


class PinnedWorkerUnavailable(RouterError):
    def __init__(self, worker: object, reason: str) -> None:
        super().__init__(f"pinned worker {worker} is {reason}")
        self.worker = worker
        self.reason = reason


class QueueTimeout(RouterError):
    def __init__(self, waited_s: float, *, sheddable: bool = False) -> None:
        super().__init__(
            f"every worker stayed saturated for {waited_s:.1f} s while the request was queued"
            + ("; the request is sheddable and was shed" if sheddable else "")
        )
        self.waited_s = waited_s
        self.sheddable = sheddable


class UnknownRequest(RouterError):
    def __init__(self, request_id: str) -> None:
        super().__init__(f"request {request_id!r} is not tracked")
        self.request_id = request_id
