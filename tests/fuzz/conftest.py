"""Fuzz tests: the decoders' warnings about bad input are expected by the thousand; keep them quiet."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _quiet_decoders() -> Iterator[None]:
    logger = logging.getLogger("extproc")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
