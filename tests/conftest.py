"""Test-wide settings.

gRPC's fork handlers must be off: tests start Envoy and workers as child processes while an
in-process picker runs gRPC threads, and with the handlers on a forked child can crash before
exec ("Other threads are currently calling into gRPC, skipping fork() handlers", then SIGSEGV).
This must happen before grpc is first imported, hence here.

`refusing_port`: addresses where nothing listens (a dead worker, picker or group), held for the test.
"""

import os

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"

from collections.abc import Callable, Iterator

import pytest

from extproc.devstack.procs import PortReservation, reserve_port


@pytest.fixture
def refusing_port() -> Iterator[Callable[[], int]]:
    """Call it for a loopback port that refuses connections until the test ends: held by this
    process (`reserve_port`), so no other process can listen there meanwhile."""
    held: list[PortReservation] = []

    def reserve() -> int:
        held.append(reserve_port())
        return held[-1].port

    yield reserve
    for reservation in held:
        reservation.release()
