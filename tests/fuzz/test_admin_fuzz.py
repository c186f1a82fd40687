"""Fuzz the admin API's JSON bodies: POST /busy_threshold and POST /debug/potential_loads.

Promise (extproc/admin.py): every body gets a JSON answer, 200 or a documented error (400 invalid,
401 without the admin token, 404 unknown model, 413 too large); never a 500. A refused call changes
nothing; an accepted threshold change sets exactly what was asked; potential loads change nothing.
Requests go over loopback to the real aiohttp app (aiohttp's test server), one per input.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from extproc.admin.api import THRESHOLD_FIELDS, make_admin_app
from extproc.events.counters import EventCounters
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker
from tests.fuzz.gen import chance, deep, floating, integer, json_bytes, json_value, mutate, pick
from tests.fuzz.harness import (
    DECODED,
    REJECTED,
    SHRINKING_SHARE,
    Check,
    LoopRunner,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
)
from tests.fuzz.test_request_fuzz import openai_object
from tests.picker_fixtures import MODEL, picker_config

TOKEN = "fuzz-token"
DOCUMENTED = {200, 400, 401, 404, 413}
PATHS = ("/busy_threshold", "/debug/potential_loads")
WORDS = ("model", "tokens", "prompt", "messages", *THRESHOLD_FIELDS, MODEL)


@dataclass(frozen=True)
class Call:
    path: str
    body: bytes
    auth: str | None  # the Authorization header, if any


def _threshold(r: random.Random, name: str) -> Any:
    roll = r.random()
    if roll < 0.5:
        return r.randint(0, 5000) if name == "active_prefill_tokens_threshold" else r.random()
    if roll < 0.8:
        return pick(r, (integer, floating))(r)
    return json_value(r, WORDS)


def _body_object(r: random.Random, path: str) -> dict[str, Any]:
    model = pick(r, (MODEL, MODEL, MODEL, "other", "", None, 3))
    if path == "/busy_threshold":
        body: dict[str, Any] = {"model": model}
        for name in THRESHOLD_FIELDS:
            if chance(r, 0.4):
                body[name] = _threshold(r, name)
    else:
        roll = r.random()
        if roll < 0.4:
            tokens = [r.randint(0, 300) if chance(r, 0.95) else integer(r) for _ in range(r.randint(0, 80))]
            body = {"model": model, "tokens": tokens if chance(r, 0.9) else json_value(r, WORDS)}
        elif roll < 0.9:
            body = {**openai_object(r, "chat" if chance(r, 0.5) else "completion"), "model": model}
        else:
            body = {"model": model}
    if chance(r, 0.1):
        body[pick(r, WORDS)] = json_value(r, WORDS)
    if chance(r, 0.03):
        body[pick(r, WORDS)] = deep(r)
    return body


def generate(r: random.Random) -> Call:
    path = pick(r, PATHS)
    roll = r.random()
    if roll < 0.75:
        body = json_bytes(r, _body_object(r, path))
    elif roll < 0.9:
        body = mutate(r, json_bytes(r, _body_object(r, path)))
    elif roll < 0.95:
        body = json_bytes(r, json_value(r, WORDS))
    else:
        body = r.randbytes(r.randint(0, 40))
    auth = pick(r, (f"Bearer {TOKEN}", f"Bearer {TOKEN}", None, "Bearer wrong", f"bearer {TOKEN}"))
    return Call(path, body, auth)


def _sent_changes(body: bytes) -> dict[str, Any] | None:
    """The threshold fields a /busy_threshold body asks to set, null to clear (None: not a JSON object)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    return {name: value[name] for name in THRESHOLD_FIELDS if name in value}


async def _client(app: web.Application) -> TestClient:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@contextlib.contextmanager
def session() -> Iterator[Check]:
    loop = LoopRunner()
    picker = EndpointPicker(picker_config(2))
    counters = EventCounters()
    sources = EventSources(RouterFeed(picker.routers_by_worker(), counters), counters)
    client = loop.run(_client(make_admin_app(picker, sources, token=TOKEN)))
    router = picker.pools[MODEL].router

    async def call(c: Call) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if c.auth is not None:
            headers["Authorization"] = c.auth
        async with client.post(c.path, data=c.body, headers=headers) as response:
            text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            raise AssertionError(f"answer {response.status} is not JSON: {text[:200]!r}") from None

    def check(c: Call) -> Outcome:
        before = router.thresholds()
        status, answer = loop.run(call(c))
        assert status in DOCUMENTED, (status, answer)
        after = router.thresholds()
        assert picker.is_idle()
        if status != 200:
            assert isinstance(answer, dict) and isinstance(answer.get("error"), str), answer
            assert after == before, "a refused call changed the thresholds"
            if status == 401:
                assert c.auth != f"Bearer {TOKEN}"
            return REJECTED
        if c.path == "/busy_threshold":
            changes = _sent_changes(c.body)
            assert changes is not None
            assert after == {**before, **changes}, (before, changes, after)
            assert answer == {"model": MODEL, **after}
        else:
            assert after == before
            assert answer["model"] == MODEL and len(answer["loads"]) == 2
        return DECODED

    try:
        yield check
    finally:
        loop.run(client.close())
        loop.run(picker.close())
        loop.close()


TARGET = Target("admin_api", generate, session, lambda c: repr(c)[:2000])
check_target = session_fixture(TARGET)


@fuzz_settings(0.5)
@given(seed=st.integers(min_value=0))
def test_admin_bodies_get_a_documented_answer(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE / 2)
@given(st.randoms(use_true_random=False))
def test_admin_bodies_get_a_documented_answer_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_calls_reach_both_outcomes(check_target: Check) -> None:
    outcomes = [next(iter(check_target(generate(random.Random(i))))) for i in range(100)]
    assert 0.1 < outcomes.count("decoded") / len(outcomes) < 0.9
