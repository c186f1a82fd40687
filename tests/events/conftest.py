"""Fixtures of the ZMQ subscriber tests: a scripted engine on loopback, and a subscriber following it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.events.zmq_fakes import FakeEngine


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    """A `FakeEngine` (PUB and replay sockets on 127.0.0.1, OS-chosen ports), closed at teardown."""
    fake = FakeEngine()
    fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def harness(engine: FakeEngine) -> AsyncIterator:
    """A `test_zmq_state.Harness` (router, sink, subscriber) on `engine`, stopped at teardown."""
    from tests.events.test_zmq_state import Harness  # a test module: imported when a test asks for it

    h = Harness(engine)
    yield h
    await h.sub.stop()
