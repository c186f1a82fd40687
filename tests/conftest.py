"""Test-wide settings.

gRPC's fork handlers must be off: tests start Envoy and workers as child processes while an
in-process picker runs gRPC threads, and with the handlers on a forked child can crash before
exec ("Other threads are currently calling into gRPC, skipping fork() handlers", then SIGSEGV).
This must happen before grpc is first imported, hence here.

`refusing_port`: addresses where nothing listens (a dead worker, picker or group), held for the test.
`loop_errors`: what the running event loop's exception handler is given during the test.
`full_collections`: counts Python's full garbage collections (`extproc.runtime.heap`); `grow` makes
what a bulk load makes.

Order: pytest-randomly (the `test` extra) shuffles the modules and the tests within each on every
run, so no test may depend on another having run before it. The seed is printed first, even with
`-q`, and again after a failure: `-p randomly --randomly-seed=N` reruns that order,
`-p no:randomly` runs in file order.
"""

import asyncio
import gc
import os

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"

from collections.abc import AsyncIterator, Callable, Iterator

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


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """[how many generation-2 collections ran]; the collector is left as it was found, unfrozen."""
    count = [0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            count[0] += 1

    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(700, 10, 10)
    gc.collect()
    gc.callbacks.append(callback)
    try:
        yield count
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*thresholds)
        (gc.enable if enabled else gc.disable)()
        gc.unfreeze()


def grow(kept: list[object], n: int) -> None:
    """What a bulk load does to the heap: many new containers that stay."""
    for i in range(n):
        kept.append([i, [i], {i: i}])


def _random_order_seed(config: pytest.Config) -> int | None:
    if not config.pluginmanager.hasplugin("randomly") or not config.getoption("randomly_reorganize", True):
        return None
    seed = config.getoption("randomly_seed", None)
    return seed if isinstance(seed, int) else None


def pytest_sessionstart(session: pytest.Session) -> None:
    """The order's seed on the first line, in every verbosity (the header, which names it too, is
    not shown with -q), so that even a run cut short says how to repeat it."""
    seed = _random_order_seed(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if seed is not None and reporter is not None and session.config.get_verbosity() < 0:
        reporter.write_line(f"random order: -p randomly --randomly-seed={seed}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    seed = _random_order_seed(terminalreporter.config)
    if seed is not None and exitstatus != 0:
        terminalreporter.write_line(f"this order again: -p randomly --randomly-seed={seed}")


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict]]:
    """What the event loop's exception handler is given during the test (errors never retrieved,
    callbacks that fail): a test collects garbage first when it looks for the former."""
    loop = asyncio.get_running_loop()
    seen: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(previous)
