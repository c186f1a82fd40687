"""Every picker a test here builds through `closed_after_test` is closed when the test ends, in its loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from ..picker_fixtures import close_pickers


@pytest_asyncio.fixture(autouse=True)
async def _pickers_closed() -> AsyncIterator[None]:
    yield
    await close_pickers()
