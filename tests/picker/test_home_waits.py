"""HomeWaits: a follow-up whose answer's worker is not known yet waits, bounded, for another replica's
word on it, and goes on the moment it comes."""

from __future__ import annotations

import asyncio

import pytest

from extproc.picker.home_waits import HomeWaits

from ..replica_helpers import until

LONG_S = 30.0  # a bound never reached: the test ends by what arrives


async def test_every_request_waiting_for_an_id_goes_on_when_its_home_arrives():
    waits = HomeWaits()
    first = asyncio.ensure_future(waits.wait("resp_1", LONG_S))
    second = asyncio.ensure_future(waits.wait("resp_1", LONG_S))
    other = asyncio.ensure_future(waits.wait("resp_2", LONG_S))
    await until(lambda: len(waits) == 3, LONG_S, "each registered")
    waits.arrive("resp_1")
    assert await first and await second
    assert not other.done() and len(waits) == 1
    waits.arrive("resp_unknown")  # nobody waits for it: nothing happens
    other.cancel()  # its ext_proc stream was cancelled
    with pytest.raises(asyncio.CancelledError):
        await other
    assert len(waits) == 0 and waits._waiting == {}
    assert (waits.arrived, waits.timed_out, waits.refused) == (2, 0, 0)


async def test_a_wait_ends_at_its_bound_and_leaves_nothing_behind():
    waits = HomeWaits()
    assert not await waits.wait("resp_nobody_knows", 0.001)
    assert len(waits) == 0 and waits._waiting == {}
    assert (waits.arrived, waits.timed_out) == (0, 1)
    assert not await waits.wait("resp_nobody_knows", 0.001)
    assert waits.timed_out == 2  # each counted


async def test_past_the_bound_on_waiting_requests_a_request_does_not_wait():
    waits = HomeWaits(max_waiting=2)
    waiting = [asyncio.ensure_future(waits.wait(f"resp_{i}", LONG_S)) for i in range(2)]
    await until(lambda: len(waits) == 2, LONG_S, "both registered")
    assert not await waits.wait("resp_3", LONG_S)  # at once: it would wait LONG_S otherwise
    assert not await waits.wait("resp_0", LONG_S)  # also for an id that others wait for
    assert waits.refused == 2 and len(waits) == 2
    waits.arrive("resp_0")
    assert await waiting[0]
    again = asyncio.ensure_future(waits.wait("resp_3", LONG_S))  # room again
    await until(lambda: len(waits) == 2, LONG_S, "resp_3 registered")
    waits.arrive("resp_3")
    assert await again
    waits.arrive("resp_1")
    assert await waiting[1] and len(waits) == 0
