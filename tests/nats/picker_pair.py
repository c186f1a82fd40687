"""Two pickers with replica sync over one real nats-server, started in process and stopped at exit.

Used by test_replica_sync_disagg.py and test_replica_sync_routes.py. `two_pickers` yields them
once b hears a: nats-server may drop the first messages on a new subscription
(nats-io/nats-server#5677), so a routes probes until one reaches b, then waits until b is idle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

from extproc.config import PickerConfig
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.runtime.server import RunningPicker, start_picker

from ..picker_fixtures import MODEL
from .conftest import eventually

Probe = Callable[[EndpointPicker, int], Awaitable[Pick]]  # a's i-th probe request


@asynccontextmanager
async def two_pickers(configs: Sequence[PickerConfig], probe: Probe) -> AsyncIterator[list[RunningPicker]]:
    started: list[RunningPicker] = []
    try:
        for config in configs:
            started.append(await start_picker(config))
        await _prime(started[0].picker, started[1].picker, probe)
        yield started
    finally:
        for running in started:
            await running.stop(0)


async def _prime(a: EndpointPicker, b: EndpointPicker, probe: Probe) -> None:
    decode_b = b.pools[MODEL].router.sequences
    for i in range(50):
        sent = await probe(a, i)
        deadline = time.monotonic() + 0.2
        while not decode_b.decode_blocks(sent.worker) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # poll interval
        a.finish(sent, "done")
        if decode_b.decode_blocks(sent.worker):
            break
    await eventually(b.is_idle, 5.0, "b idle")
