"""The admin HTTP server of a running picker: busy thresholds, token, readiness, debug, metrics."""

from __future__ import annotations

from dataclasses import replace

import aiohttp
import pytest

from extproc.router import AllWorkersBusy
from extproc.runtime.server import start_picker

from ..picker_fixtures import MODEL, chat_body, picker_config

TOKEN = "s3cret"


@pytest.fixture
async def running():
    config = replace(picker_config(2), port=0, health_port=0, admin_port=0, admin_token=TOKEN)
    picker = await start_picker(config)
    try:
        yield picker
    finally:
        await picker.stop(0)


@pytest.fixture
async def http(running):
    base = f"http://127.0.0.1:{running.admin.port}"
    async with aiohttp.ClientSession(base) as session:
        yield session


AUTH = {"Authorization": f"Bearer {TOKEN}"}
UNSET = {
    "active_decode_blocks_threshold": None,
    "active_prefill_tokens_threshold": None,
    "active_prefill_tokens_threshold_frac": None,
}


async def call(http, method, path, *, json=None, headers=None):
    async with http.request(method, path, json=json, headers=headers) as r:
        return r.status, await r.json()


async def test_busy_threshold_get_set_and_list_exactly_as_documented(http) -> None:
    assert await call(http, "POST", "/busy_threshold", json={"model": MODEL}) == (
        200,
        {"model": MODEL, **UNSET},
    )
    body = {"model": MODEL, "active_decode_blocks_threshold": 0.85, "active_prefill_tokens_threshold": 1000}
    status, record = await call(http, "POST", "/busy_threshold", json=body, headers=AUTH)
    assert status == 200
    assert record == {**UNSET, **body}
    # one field more: the others stay
    more = {"model": MODEL, "active_prefill_tokens_threshold_frac": 0.8}
    status, record = await call(http, "POST", "/busy_threshold", json=more, headers=AUTH)
    assert record == {**body, "active_prefill_tokens_threshold_frac": 0.8}
    assert await call(http, "POST", "/busy_threshold", json={"model": MODEL}) == (200, record)
    assert await call(http, "GET", "/busy_threshold") == (200, {"thresholds": [record]})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("active_decode_blocks_threshold", 1.5, "fraction in [0, 1]"),
        ("active_prefill_tokens_threshold_frac", -0.1, "fraction in [0, 1]"),
        ("active_prefill_tokens_threshold", -5, "integer >= 0"),
        ("active_prefill_tokens_threshold", 2.5, "integer >= 0"),
        ("active_decode_blocks_threshold", "high", "fraction in [0, 1]"),
        ("active_decode_blocks_threshold", float("nan"), "fraction in [0, 1]"),
        pytest.param(  # fuzz-found: was a 500
            "active_decode_blocks_threshold", 10**400, "fraction in [0, 1]", id="integer-past-float-range"
        ),
    ],
)
async def test_invalid_threshold_values_get_a_400_and_change_nothing(http, field, value, message) -> None:
    status, answer = await call(
        http, "POST", "/busy_threshold", json={"model": MODEL, field: value}, headers=AUTH
    )
    assert status == 400 and message in answer["error"] and field in answer["error"]
    assert await call(http, "POST", "/busy_threshold", json={"model": MODEL}) == (
        200,
        {"model": MODEL, **UNSET},
    )


async def test_bad_busy_threshold_requests_get_clear_answers(http) -> None:
    assert (await call(http, "POST", "/busy_threshold", json={"model": "nope"}))[0] == 404
    assert (await call(http, "POST", "/busy_threshold", json={}))[0] == 400
    assert (await call(http, "POST", "/busy_threshold", json=[1, 2]))[0] == 400
    status, answer = await call(
        http, "POST", "/busy_threshold", json={"model": MODEL, "typo": 1}, headers=AUTH
    )
    assert status == 400 and "typo" in answer["error"]
    async with http.post("/busy_threshold", data=b"{not json") as r:
        assert r.status == 400


@pytest.mark.parametrize("path", ["/busy_threshold", "/debug/potential_loads"])
@pytest.mark.parametrize("body", [b"[" * 5000 + b"]" * 5000, b'{"model": ' + b"9" * 5000 + b"}"])
async def test_bodies_json_cannot_read_get_a_400_not_a_500(http, path, body) -> None:
    """Fuzz-found: nesting past the recursion limit, or an integer over Python's digit limit, was a 500."""
    async with http.post(path, data=body) as r:
        assert r.status == 400 and "JSON object" in (await r.json())["error"]


async def test_setting_thresholds_needs_the_admin_token_reading_does_not(http) -> None:
    body = {"model": MODEL, "active_prefill_tokens_threshold": 10}
    assert (await call(http, "POST", "/busy_threshold", json=body))[0] == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (await call(http, "POST", "/busy_threshold", json=body, headers=wrong))[0] == 401
    assert (await call(http, "POST", "/busy_threshold", json={"model": MODEL}))[1] == {
        "model": MODEL,
        **UNSET,
    }
    assert (await call(http, "POST", "/busy_threshold", json=body, headers=AUTH))[0] == 200


async def test_thresholds_set_at_run_time_change_routing(running, http) -> None:
    picker = running.picker

    async def route(rid: str, text: str):
        return await picker.pick(
            body=chat_body(text), path="/v1/chat/completions", headers={}, subset=None, client_request_id=rid
        )

    held = await route("held", "long prompt " * 40)  # in prefill until its first token
    body = {"model": MODEL, "active_prefill_tokens_threshold": 0}
    assert (await call(http, "POST", "/busy_threshold", json=body, headers=AUTH))[0] == 200
    other = await route("other", "other " * 40)
    assert other.worker != held.worker  # the held request's worker is now busy
    # every worker is now over the threshold: the next request is refused as overload
    with pytest.raises(AllWorkersBusy):
        await route("refused", "more " * 40)
    for p in (held, other):
        picker.finish(p, "complete")
    assert picker.is_idle()


async def test_health_readiness_and_debug_views(running, http) -> None:
    assert await call(http, "GET", "/healthz") == (200, {"status": "ok"})
    status, ready = await call(http, "GET", "/readyz")
    assert status == 200 and ready["ready"] and ready["workers"] == 2
    status, loads = await call(
        http, "POST", "/debug/potential_loads", json={"model": MODEL, "prompt": "hi " * 40}
    )
    assert status == 200 and len(loads["loads"]) == 2 and loads["tokens"] > 16
    assert all(entry["potential_prefill_tokens"] == loads["tokens"] for entry in loads["loads"])
    status, by_tokens = await call(
        http, "POST", "/debug/potential_loads", json={"model": MODEL, "tokens": list(range(64))}
    )
    assert status == 200 and by_tokens["tokens"] == 64
    assert (await call(http, "POST", "/debug/potential_loads", json={"model": MODEL, "tokens": ["x"]}))[
        0
    ] == 400
    assert (await call(http, "POST", "/debug/potential_loads", json={"model": MODEL}))[0] == 400
    status, dump = await call(http, "GET", f"/debug/dump_events?model={MODEL}")
    assert status == 200 and dump == {"model": MODEL, "events": []}  # predictions are not engine events
    assert (await call(http, "GET", "/debug/dump_events?model=nope"))[0] == 404


async def test_metrics_are_present_and_move_with_traffic(running, http) -> None:
    picker = running.picker

    async def scrape() -> str:
        async with http.get("/metrics") as r:
            return await r.text()

    def value(text: str, prefix: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    before = await scrape()
    for i in range(3):
        p = await picker.pick(
            body=chat_body("same system prompt " * 30 + str(i)),
            path="/v1/chat/completions",
            headers={"x-session-id": f"s{i}"},
            subset=None,
            client_request_id=f"m{i}",
        )
        picker.answered(p, 200)  # a session is pinned once its worker answered 2xx
        picker.first_token(p)
        picker.finish(p, "complete")
    after = await scrape()
    assert value(after, 'extproc_requests_total{model="demo-model",outcome="routed"}') == 3
    assert value(after, 'extproc_requests_total{model="demo-model",outcome="completed"}') == 3
    for stage in ("parse", "tokenize", "hash", "match", "select", "queue"):
        key = f'extproc_decision_stage_seconds_count{{stage="{stage}"}}'
        assert value(after, key) - value(before, key) == 3, stage
    assert value(after, 'extproc_overlap_blocks_total{model="demo-model",which="best"}') > 0
    assert value(after, "extproc_overlap_regret_blocks_count") == 3
    assert value(after, 'extproc_sessions_pinned{model="demo-model"}') == 3
    assert 'extproc_queue_depth{model="demo-model"} 0.0' in after
    assert "extproc_worker_active_prefill_tokens" in after and "extproc_indexer_events" in after
