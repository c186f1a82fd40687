"""LocalGroup: this picker's own routers as a `RouterGroup` of its selector (no network).

Calls `GroupRouters` directly in the event loop (a local probe costs one router decision and
cannot time out) and turns its errors into the `GroupError`s a remote group would raise, so the
selector treats both kinds alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from extproc.errors import UnknownModel
from extproc.groups.errors import ALL_BUSY, NO_WORKERS, UNKNOWN_MODEL, GroupRefused
from extproc.groups.routers import GroupPool, GroupRouters
from extproc.groups.types import GroupDecision, GroupLoads, GroupProbe, GroupRequest
from extproc.router import AllWorkersBusy, NoWorkers


class LocalGroup:
    """A router group over pools of this process (`EndpointPicker.pools`)."""

    def __init__(self, name: str, pools: Mapping[str, GroupPool], *, weight: float = 1.0) -> None:
        self.routers = GroupRouters(name, pools)
        self._weight = weight

    @property
    def name(self) -> str:
        return self.routers.name

    @property
    def weight(self) -> float:
        return self._weight

    async def probe(self, request: GroupRequest, *, timeout_s: float) -> GroupProbe:
        with self._refusals():
            return self.routers.probe(request)

    async def commit(self, request: GroupRequest, request_id: str, probe: GroupProbe) -> GroupDecision:
        with self._refusals():
            return self.routers.commit(request, request_id, probe.choice.worker)

    async def mark_prefill_complete(self, model: str, request_id: str) -> bool:
        return self.routers.mark_prefill_complete(model, request_id)

    async def free(self, model: str, request_id: str) -> bool:
        return self.routers.free(model, request_id)

    async def potential_loads(self, request: GroupRequest) -> GroupLoads:
        with self._refusals():
            return self.routers.potential_loads(request)

    async def close(self) -> None:
        return None

    @contextmanager
    def _refusals(self) -> Iterator[None]:
        try:
            yield
        except UnknownModel as exc:
            raise GroupRefused(self.name, UNKNOWN_MODEL, exc.message) from exc
        except NoWorkers as exc:
            raise GroupRefused(self.name, NO_WORKERS, str(exc)) from exc
        except AllWorkersBusy as exc:
            raise GroupRefused(self.name, ALL_BUSY, str(exc)) from exc
