"""The admin HTTP server of a running picker: busy thresholds (set, cleared), who may change them
(token, its scheme in any case, the opt-out), readiness, debug views and their bounds, metrics."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from dataclasses import replace

import aiohttp
import pytest

from extproc.admin import api
from extproc.admin.api import MAX_ADMIN_BODY, MAX_POTENTIAL_LOADS_TOKENS
from extproc.router import AllWorkersBusy
from extproc.router.types import HOST_PINNED_TIER, BlocksStored, StoredBlock
from extproc.runtime.server import start_picker

from ..picker_fixtures import MODEL, chat_body, picker_config

TOKEN = "s3cret"


@pytest.fixture
async def running():
    config = replace(
        picker_config(2, prefill_load_model="timing"), port=0, health_port=0, admin_port=0, admin_token=TOKEN
    )
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
    # the timing prefill load model (the default): a time to first token in prefill-token units, alike
    # on idle workers
    assert len({entry["potential_prefill_tokens"] for entry in loads["loads"]}) == 1
    status, workers = await call(http, "GET", "/debug/workers")
    assert status == 200 and len(workers["workers"]) == 2
    for worker in workers["workers"]:  # nothing learned yet: the configured pass-time model
        pass_time = worker["pass_time"]
        assert (pass_time["scale"], pass_time["samples"], pass_time["last_ratio"]) == (1.0, 0, None)
        assert pass_time["prefill_ms"] == [4.209989e-7, 0.01518344, 16.50142]
        assert pass_time["mixed_fleet"] is False and pass_time["arrivals_per_s"] == 0.0
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


async def test_dump_events_answers_the_engines_blocks_turned_into_json_off_the_event_loop(
    running, http, monkeypatch
) -> None:
    """At 2^20 entries the JSON of a dump is 2.3 s of work: on the event loop, routing waited."""
    router = running.picker.pools[MODEL].router
    (worker, *_) = router.workers()
    router.apply_event(BlocksStored(worker, (StoredBlock(7, 70), StoredBlock(8, 80)), None))
    threads: list[bool] = []
    made = api._event_json

    def event_json(event):
        threads.append(threading.current_thread() is threading.main_thread())
        return made(event)

    monkeypatch.setattr(api, "_event_json", event_json)
    async with http.get(f"/debug/dump_events?model={MODEL}") as r:
        assert r.status == 200 and r.content_type == "application/json"
        dump = await r.json()
    assert dump == {
        "model": MODEL,
        "events": [
            {
                "type": "stored",
                "worker": str(worker.worker_id),
                "dp_rank": 0,
                "parent_hash": None,
                "blocks": [{"block_hash": 7, "tokens_hash": 70}, {"block_hash": 8, "tokens_hash": 80}],
            }
        ],
    }
    assert threads == [False]


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
    for outcome in ("queued", "released", "timed_out", "shed", "cancelled", "failed"):  # every way out
        assert f'extproc_queue_requests_total{{model="demo-model",outcome="{outcome}"}} 0.0' in after
    assert "extproc_worker_active_prefill_tokens" in after and "extproc_indexer_events" in after
    assert "extproc_streams_open 0.0" in after and "extproc_output_sse_lines_skipped_total 0.0" in after


@pytest.fixture
async def open_admin(request):
    """A picker whose admin has no token; `request.param` is --admin-allow-unauthenticated-writes."""
    config = replace(
        picker_config(2),
        port=0,
        health_port=0,
        admin_port=0,
        admin_allow_unauthenticated_writes=getattr(request, "param", False),
    )
    picker = await start_picker(config)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{picker.admin.port}") as session:
            yield session
    finally:
        await picker.stop(0)


async def test_without_a_token_setting_thresholds_is_refused_and_reading_is_not(open_admin, caplog) -> None:
    """Issue 19: without --admin-token anyone could change thresholds, though the README said a token
    was needed. Now admin writes need the token, or an explicit opt-out."""
    body = {"model": MODEL, "active_prefill_tokens_threshold": 10}
    status, answer = await call(open_admin, "POST", "/busy_threshold", json=body)
    assert status == 403 and "--admin-token" in answer["error"]
    assert await call(open_admin, "POST", "/busy_threshold", json={"model": MODEL}) == (
        200,
        {"model": MODEL, **UNSET},
    )
    assert (await call(open_admin, "GET", "/busy_threshold"))[0] == 200


@pytest.mark.parametrize("open_admin", [True], indirect=True)
async def test_the_opt_out_flag_lets_anyone_set_thresholds(open_admin) -> None:
    body = {"model": MODEL, "active_prefill_tokens_threshold": 10}
    assert await call(open_admin, "POST", "/busy_threshold", json=body) == (200, {**UNSET, **body})


@pytest.mark.parametrize(
    ("allow", "token", "said"),
    [
        (False, None, "changing busy thresholds is refused (403): no --admin-token"),
        (True, None, "anyone who reaches"),
        (False, TOKEN, "changing busy thresholds needs the admin token"),
    ],
)
async def test_the_picker_says_at_start_who_may_change_thresholds(caplog, allow, token, said) -> None:
    config = replace(
        picker_config(2), port=0, health_port=0, admin_port=0, admin_token=token,
        admin_allow_unauthenticated_writes=allow,
    )  # fmt: skip
    with caplog.at_level("INFO", logger="extproc.admin"):
        picker = await start_picker(config)
        await picker.stop(0)
    assert any(said in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    if allow:
        assert any(r.levelname == "WARNING" and said in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (f"bearer {TOKEN}", 200),  # issue 19: the lowercase scheme was refused
        (f"BEARER {TOKEN}", 200),
        (f"Bearer   {TOKEN} ", 200),
        (f"Basic {TOKEN}", 401),
        (f"Bearer {TOKEN}x", 401),
        (TOKEN, 401),
        ("", 401),
    ],
)
async def test_the_bearer_scheme_is_matched_in_any_case(http, authorization, status) -> None:
    body = {"model": MODEL, "active_prefill_tokens_threshold": 10}
    headers = {"Authorization": authorization} if authorization else None
    assert (await call(http, "POST", "/busy_threshold", json=body, headers=headers))[0] == status


async def test_a_threshold_set_at_run_time_can_be_cleared_with_null(running, http) -> None:
    """Issue 19: null was read as "not given", so a threshold once set could never be cleared."""
    router = running.picker.pools[MODEL].router
    body = {"model": MODEL, "active_prefill_tokens_threshold": 10, "active_decode_blocks_threshold": 0.5}
    assert (await call(http, "POST", "/busy_threshold", json=body, headers=AUTH))[0] == 200
    clear = {"model": MODEL, "active_prefill_tokens_threshold": None}
    assert (await call(http, "POST", "/busy_threshold", json=clear))[0] == 401  # clearing is a write
    assert await call(http, "POST", "/busy_threshold", json=clear, headers=AUTH) == (
        200,
        {**UNSET, "model": MODEL, "active_decode_blocks_threshold": 0.5},
    )
    assert router.config.active_prefill_tokens_threshold is None
    assert router.config.active_decode_blocks_threshold == 0.5


async def test_potential_loads_refuses_more_tokens_than_its_bound(http) -> None:
    too_many = {"model": MODEL, "tokens": [1] * (MAX_POTENTIAL_LOADS_TOKENS + 1)}
    status, answer = await call(http, "POST", "/debug/potential_loads", json=too_many)
    assert status == 400 and f"the limit is {MAX_POTENTIAL_LOADS_TOKENS}" in answer["error"]
    long_prompt = {"model": MODEL, "prompt": "x" * (MAX_POTENTIAL_LOADS_TOKENS + 10)}  # bytes are tokens here
    status, answer = await call(http, "POST", "/debug/potential_loads", json=long_prompt)
    assert status == 400 and "tokens; the limit is" in answer["error"]
    at_the_bound = {"model": MODEL, "tokens": [1] * MAX_POTENTIAL_LOADS_TOKENS}
    status, answer = await call(http, "POST", "/debug/potential_loads", json=at_the_bound)
    assert status == 200 and answer["tokens"] == MAX_POTENTIAL_LOADS_TOKENS
    async with http.post("/debug/potential_loads", data=io.BytesIO(b" " * (MAX_ADMIN_BODY + 1))) as r:
        assert r.status == 413


async def test_a_million_token_potential_loads_call_does_not_hold_the_event_loop(http) -> None:
    """Issue 19: a 1M-token body stalled routing ~180 ms per call (parsed, checked and matched on the
    loop). Its body is parsed and checked in a parse worker now, and refused there."""
    body = b'{"model": "%s", "tokens": [%s]}' % (MODEL.encode(), b",".join([b"1"] * 1_000_000))
    assert len(body) <= MAX_ADMIN_BODY
    async with http.post("/debug/potential_loads", data=b'{"model": "x", "tokens": [1]}' + b" " * 20000) as r:
        assert r.status == 404  # the parse worker is started
    worst = 0.0
    posting = asyncio.ensure_future(_post(http, body))
    last = time.perf_counter()
    while not posting.done():
        await asyncio.sleep(0.002)
        now = time.perf_counter()
        worst = max(worst, now - last)
        last = now
    status, answer = posting.result()
    assert status == 400 and "the limit is" in answer["error"]
    assert worst < 0.1, f"the event loop was held {worst * 1000:.0f} ms"  # before: ~150 ms


async def _post(http, body: bytes):
    async with http.post("/debug/potential_loads", data=io.BytesIO(body)) as r:
        return r.status, await r.json()


async def test_the_debug_views_show_offloaded_blocks_per_tier(running, http) -> None:
    """Issue 23: blocks an engine offloaded (here to host memory) show per tier in /debug/workers and
    in /debug/potential_loads, whose overlap is the credited one (0.75 per host block)."""
    router = running.picker.pools[MODEL].router
    worker = router.workers()[0]
    tokens = list(range(64))
    hashes = router.block_hashes(tokens)
    stored = tuple(StoredBlock(i + 1, h) for i, h in enumerate(hashes[:2]))
    router.apply_event(BlocksStored(worker, stored, None, tier=HOST_PINNED_TIER))
    status, loads = await call(
        http, "POST", "/debug/potential_loads", json={"model": MODEL, "tokens": tokens}
    )
    (mine,) = [e for e in loads["loads"] if e["worker"] == str(worker.worker_id)]
    assert status == 200 and mine["tier_blocks"] == {"host_pinned": 2} and mine["overlap_blocks"] == 1.5
    assert all(e["tier_blocks"] == {} for e in loads["loads"] if e is not mine)
    status, workers = await call(http, "GET", "/debug/workers")
    offloaded = {w["worker"]: w["offloaded_blocks"] for w in workers["workers"]}
    assert offloaded[str(worker.worker_id)] == {"host_pinned": 2}
