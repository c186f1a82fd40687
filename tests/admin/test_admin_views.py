"""What the admin views show, field by field, as an operator reads them: `/debug/workers` (each
worker's cache source, blocks, load, session pins, the engine's scraped load and the learned pass
time), `/debug/dump_events` (every event kind), `/debug/potential_loads` (salted and adapter prompts,
chat against completion prompts, its bounds), the busy-threshold answers, `/readyz`, `/metrics`, and
what `start_admin` binds and says. The app runs on aiohttp's test server (127.0.0.1, a free port);
the picker's clock is a fake one, so ages and rates are exact."""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST

from extproc.admin.api import MAX_ADMIN_BODY, MAX_POTENTIAL_LOADS_TOKENS, make_admin_app, start_admin
from extproc.config import EngineMetricsConfig, ModelConfig
from extproc.devstack.procs import reserve_port
from extproc.events.counters import EventCounters
from extproc.events.feed import RouterFeed
from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker
from extproc.router.types import HOST_PINNED_TIER, AllBlocksCleared, BlocksRemoved, BlocksStored, StoredBlock
from extproc.runtime.engine_metrics import EngineMetricsScraper
from extproc.runtime.readiness import Readiness

from ..picker_fixtures import MODEL, chat_body, picker_config
from ..router.clock import FakeClock

W0, W1 = Worker("w0"), Worker("w1")
ADAPTER = "sql-lora"
WRITE = {"model": MODEL, "active_prefill_tokens_threshold": 1}


def sources_of(picker: EndpointPicker) -> EventSources:
    counters = EventCounters()
    return EventSources(RouterFeed(picker.routers_by_worker(), counters), counters)


@asynccontextmanager
async def admin(
    picker: EndpointPicker, sources: EventSources | None = None, **options
) -> AsyncIterator[TestClient]:
    app = make_admin_app(picker, sources or sources_of(picker), **options)
    async with TestClient(TestServer(app)) as client:
        yield client


async def get(client: TestClient, path: str) -> tuple[int, dict]:
    async with client.get(path) as r:
        return r.status, await r.json()


async def post(client: TestClient, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    async with client.post(path, json=body, headers=headers) as r:
        return r.status, await r.json()


def timing_picker(clock: FakeClock, n_workers: int = 2, **router) -> EndpointPicker:
    return EndpointPicker(picker_config(n_workers, prefill_load_model="timing", **router), clock=clock)


async def routed(picker: EndpointPicker, text: str, request_id: str, **headers: str):
    return await picker.pick(
        body=chat_body(text), path="/v1/chat/completions", headers=headers, subset=None,
        client_request_id=request_id,
    )  # fmt: skip


# --- /debug/workers ---------------------------------------------------------------------------------


async def test_debug_workers_shows_each_workers_own_cache_source_blocks_load_and_pins() -> None:
    clock = FakeClock(100.0)
    picker = timing_picker(clock)
    sources = sources_of(picker)
    router = picker.pools[MODEL].router
    sources.feed.stream_state(W1, True, "w1's stream is up")
    sources.feed.apply_events(
        [BlocksStored(W1, (StoredBlock(1, 11), StoredBlock(2, 12), StoredBlock(3, 13)), None)]
    )
    pick = await routed(picker, "a question " * 20, "r1", **{"x-session-id": "s1"})
    picker.answered(pick, 200)  # pins the session
    busy, idle = pick.worker, W1 if pick.worker == W0 else W0
    async with admin(picker, sources) as client:
        status, answer = await get(client, "/debug/workers")
    assert status == 200
    by_worker = {w["worker"]: w for w in answer["workers"]}
    assert set(by_worker) == {"w0", "w1"}
    for worker in (W0, W1):
        entry = by_worker[worker.worker_id]
        shown = {
            k: entry[k] for k in entry if k not in ("pass_time", "engine_load", "engine_metrics", "busy_view")
        }
        assert shown == {
            "model": MODEL,
            "worker": worker.worker_id,
            "role": "both",
            "dp_rank": 0,
            "endpoint": {"w0": "127.0.0.1:8000", "w1": "127.0.0.2:8001"}[worker.worker_id],
            "cache_source": sources.feed.state(worker),
            "cache_source_reason": sources.feed.reason(worker),
            "cached_blocks": router.indexer.num_blocks(worker),
            "offloaded_blocks": {},
            "active_prefill_tokens": router.sequences.prefill_tokens(worker),
            "active_decode_blocks": router.sequences.decode_blocks(worker),
            "active_requests": 1 if worker == busy else 0,
            "sessions_pinned": 1 if worker == busy else 0,
        }
    # the two workers differ in every field that reads the worker itself
    assert by_worker["w1"]["cache_source"] != by_worker["w0"]["cache_source"]
    assert by_worker["w1"]["cache_source_reason"] == "w1's stream is up"
    assert by_worker["w1"]["cached_blocks"] >= 3  # its engine's blocks (and what routing there predicts)
    assert by_worker["w1"]["cached_blocks"] != by_worker["w0"]["cached_blocks"]
    for field in ("active_prefill_tokens", "active_decode_blocks"):
        assert by_worker[busy.worker_id][field] > 0 and by_worker[idle.worker_id][field] == 0, field
    assert answer["queued"] == {MODEL: 0}
    assert answer["kv_event_counters"] == sources.counters.snapshot() != {}
    assert answer["lora_adapters"] == {MODEL: []}
    assert answer["model_aliases"] == {MODEL: picker.aliases(MODEL)}


async def test_debug_workers_names_each_workers_role() -> None:
    config = picker_config(2)
    prefill, decode = (replace(w, role=r) for w, r in zip(config.workers, ("prefill", "decode"), strict=True))
    picker = EndpointPicker(replace(config, workers=(prefill, decode)))
    async with admin(picker) as client:
        _, answer = await get(client, "/debug/workers")
    assert {w["worker"]: w["role"] for w in answer["workers"]} == {"w0": "prefill", "w1": "decode"}


async def test_debug_workers_shows_what_the_pass_time_model_learned_of_each_worker() -> None:
    clock = FakeClock(100.0)
    picker = timing_picker(clock, 3)
    router = picker.pools[MODEL].router
    # w0's first tokens come far later than predicted, w1's sooner, again and again; w2 gets nothing
    for i in range(16):
        endpoint, wait_s = ("127.0.0.1:8000", 0.5) if i % 2 else ("127.0.0.2:8001", 0.002)
        pick = await picker.pick(
            body=chat_body(f"teach me {i} " * 40), path="/v1/chat/completions", headers={},
            subset=[endpoint], client_request_id=f"r{i}",
        )  # fmt: skip
        assert pick.endpoint == endpoint
        clock.advance(wait_s)
        picker.first_token(pick)
        picker.finish(pick, "complete")
    learned = router.sequences.learned_pass_time(W0)
    assert learned is not None and learned.samples == 8 and learned.scale > 1.5 and learned.last_ratio > 1.5
    arrivals = router.sequences.arrivals_per_s(W0)
    assert round(arrivals, 3) != round(arrivals, 4)  # shown to three places
    async with admin(picker) as client:
        _, answer = await get(client, "/debug/workers")
    by_worker = {w["worker"]: w["pass_time"] for w in answer["workers"]}
    own, fleet = router.sequences.timing(W0), router.sequences.timing(Worker("w2"))
    assert by_worker["w0"] == {
        "scale": learned.scale,
        "samples": 8,
        "last_ratio": learned.last_ratio,
        "prefill_ms": [own.prefill_quadratic_ms, own.prefill_linear_ms, own.prefill_constant_ms],
        "decode_ms": [own.decode_quadratic_ms, own.decode_linear_ms, own.decode_constant_ms],
        "full_pass_ms": own.prefill_ms(own.max_num_batched_tokens),
        "mixed_fleet": router.sequences.counts_delay_behind,
        "arrivals_per_s": round(arrivals, 3),
    }
    assert by_worker["w2"] == {  # nothing observed: the fleet's model, no arrivals
        "scale": 1.0,
        "samples": 0,
        "last_ratio": None,
        "prefill_ms": [fleet.prefill_quadratic_ms, fleet.prefill_linear_ms, fleet.prefill_constant_ms],
        "decode_ms": [fleet.decode_quadratic_ms, fleet.decode_linear_ms, fleet.decode_constant_ms],
        "full_pass_ms": fleet.prefill_ms(fleet.max_num_batched_tokens),
        "mixed_fleet": router.sequences.counts_delay_behind,
        "arrivals_per_s": 0.0,
    }
    assert by_worker["w0"]["prefill_ms"] != by_worker["w2"]["prefill_ms"]  # each worker's own model
    assert by_worker["w0"]["decode_ms"] != by_worker["w2"]["decode_ms"]
    assert by_worker["w0"]["full_pass_ms"] > by_worker["w2"]["full_pass_ms"] > by_worker["w1"]["full_pass_ms"]


async def test_debug_workers_has_no_pass_time_without_the_timing_model() -> None:
    picker = EndpointPicker(picker_config(1))  # prefill_load_model none: Dynamo's block counting
    async with admin(picker) as client:
        _, answer = await get(client, "/debug/workers")
    assert answer["workers"][0]["pass_time"] is None


async def test_debug_workers_shows_the_engines_reported_load_its_age_and_when_it_goes_stale() -> None:
    clock = FakeClock(100.0)
    picker = timing_picker(clock)
    reported = picker.pools[MODEL].router.reported
    reported.set(W0, kv_usage=0.5, running=3, waiting=2, max_age_s=2.0, at=98.76543)
    async with admin(picker) as client:
        _, answer = await get(client, "/debug/workers")
        by_worker = {w["worker"]: w for w in answer["workers"]}
        assert by_worker["w0"]["engine_load"] == {
            "kv_usage": 0.5, "running": 3, "waiting": 2, "age_s": 1.235, "stale": False,
        }  # fmt: skip
        assert by_worker["w0"]["busy_view"] == "engine"
        assert by_worker["w1"]["engine_load"] is None and by_worker["w1"]["busy_view"] == "router"
        assert by_worker["w0"]["engine_metrics"] is None  # no scraper: nothing about scrapes
        clock.now = 98.76543 + 2.0  # exactly its max age: still fresh
        _, answer = await get(client, "/debug/workers")
        assert (
            answer["workers"][0]["engine_load"]["stale"] is False
            and answer["workers"][0]["busy_view"] == "engine"
        )
        clock.advance(0.001)
        _, answer = await get(client, "/debug/workers")
        assert (
            answer["workers"][0]["engine_load"]["stale"] is True
            and answer["workers"][0]["busy_view"] == "router"
        )
        assert answer["workers"][0]["engine_load"]["age_s"] == 2.001


async def test_debug_workers_shows_each_metrics_scrape_pending_failing_then_ok() -> None:
    warming = [True]
    vllm = b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'

    async def metrics(_request: web.Request) -> web.Response:
        if warming:
            return web.Response(status=503, text="warming up")
        return web.Response(body=vllm, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app) as server:
        config = picker_config(2)
        engine = replace(config.workers[0], endpoint=f"127.0.0.1:{server.port}")
        picker = EndpointPicker(replace(config, workers=(engine, config.workers[1])))
        scraper = EngineMetricsScraper(picker, EngineMetricsConfig(interval_s=60.0, timeout_s=2.0))
        url = f"http://127.0.0.1:{server.port}/metrics"
        try:
            async with admin(picker, engine_metrics=scraper) as client:

                async def shown() -> dict:
                    _, answer = await get(client, "/debug/workers")
                    return next(w["engine_metrics"] for w in answer["workers"] if w["worker"] == "w0")

                pending = {
                    "url": url,
                    "state": "pending",
                    "engine": None,
                    "error": None,
                    "failures_in_a_row": 0,
                }
                assert await shown() == pending
                await scraper.scrape_once()
                await scraper.scrape_once()
                failing = await shown()
                assert failing["state"] == "failing" and failing["failures_in_a_row"] == 2
                assert failing["url"] == url and failing["engine"] is None and "503" in failing["error"]
                warming.clear()
                await scraper.scrape_once()
                ok = {"url": url, "state": "ok", "engine": "vllm", "error": None, "failures_in_a_row": 0}
                assert await shown() == ok
                _, answer = await get(client, "/debug/workers")
                w1 = next(w for w in answer["workers"] if w["worker"] == "w1")
                assert (
                    w1["engine_metrics"]["url"] == "http://127.0.0.2:8001/metrics"
                )  # its own, never answered
        finally:
            await scraper.stop()


# --- /debug/dump_events -----------------------------------------------------------------------------


async def test_dump_events_writes_removals_and_clears_too_and_needs_no_model_with_one() -> None:
    picker = EndpointPicker(picker_config(2))
    router = picker.pools[MODEL].router
    router.apply_event(BlocksStored(W0, (StoredBlock(7, 70), StoredBlock(8, 80)), None))
    router.apply_event(BlocksRemoved(W0, (8,)))
    router.apply_event(BlocksStored(W1, (StoredBlock(9, 90),), None))
    async with admin(picker) as client:
        status, dump = await get(client, "/debug/dump_events")  # one model: ?model= may be left out
    assert status == 200 and dump["model"] == MODEL
    assert {(e["type"], e["worker"]) for e in dump["events"]} == {("stored", "w0"), ("stored", "w1")}
    stored = next(e for e in dump["events"] if e["worker"] == "w0")
    assert stored["blocks"] == [{"block_hash": 7, "tokens_hash": 70}]  # the removed block is gone


def test_every_event_kind_is_written_as_documented() -> None:
    from extproc.admin import api

    assert api._event_json(BlocksRemoved(Worker("w0", 1), (4, 5))) == {
        "type": "removed", "worker": "w0", "dp_rank": 1, "block_hashes": [4, 5],
    }  # fmt: skip
    assert api._event_json(AllBlocksCleared(Worker("w1", 2))) == {
        "type": "cleared",
        "worker": "w1",
        "dp_rank": 2,
    }
    removed = api._dump_json(MODEL, [BlocksRemoved(W0, (4,)), AllBlocksCleared(W1)])
    assert removed == (
        '{"model": "demo-model", "events": ['
        '{"type": "removed", "worker": "w0", "dp_rank": 0, "block_hashes": [4]}, '
        '{"type": "cleared", "worker": "w1", "dp_rank": 0}]}'
    )


async def test_dump_events_with_several_models_asks_which() -> None:
    config = picker_config(2)
    other = replace(config.workers[1], model="other-model")
    picker = EndpointPicker(
        replace(
            config,
            workers=(config.workers[0], other),
            models=(ModelConfig(MODEL), ModelConfig("other-model")),
        )
    )
    async with admin(picker) as client:
        assert await get(client, "/debug/dump_events") == (
            400,
            {"error": f"give ?model=; known: {MODEL}, other-model"},
        )
        assert await get(client, "/debug/dump_events?model=other-model") == (
            200, {"model": "other-model", "events": []},
        )  # fmt: skip
        assert await post(client, "/busy_threshold", {"model": "nope"}) == (
            404, {"error": f"model 'nope' is not served here; known: {MODEL}, other-model"},
        )  # fmt: skip
        assert await get(client, "/debug/dump_events?model=nope") == (
            404, {"error": "model 'nope' is not served here"},
        )  # fmt: skip


# --- /debug/potential_loads -------------------------------------------------------------------------


async def test_potential_loads_matches_salted_blocks_only_with_their_salt() -> None:
    picker = EndpointPicker(picker_config(2))
    router = picker.pools[MODEL].router
    tokens = list(range(64))
    salted = router.block_hashes(tokens, cache_salt="tenant-a")
    router.apply_event(BlocksStored(W0, tuple(StoredBlock(i + 1, h) for i, h in enumerate(salted)), None))

    def overlap(answer: dict) -> dict[str, float]:
        return {e["worker"]: e["overlap_blocks"] for e in answer["loads"]}

    async with admin(picker) as client:
        status, with_salt = await post(
            client, "/debug/potential_loads", {"model": MODEL, "tokens": tokens, "cache_salt": "tenant-a"}
        )
        assert status == 200 and overlap(with_salt) == {"w0": 4, "w1": 0}
        w0 = next(e for e in with_salt["loads"] if e["worker"] == "w0")
        assert w0["tier_blocks"] == {"device": 4}
        _, unsalted = await post(client, "/debug/potential_loads", {"model": MODEL, "tokens": tokens})
        assert overlap(unsalted) == {"w0": 0, "w1": 0}
        _, other = await post(
            client, "/debug/potential_loads", {"model": MODEL, "tokens": tokens, "cache_salt": "b"}
        )
        assert overlap(other) == {"w0": 0, "w1": 0}
        for bad in ("", 7):
            salted_badly = {"model": MODEL, "tokens": tokens, "cache_salt": bad}
            assert await post(client, "/debug/potential_loads", salted_badly) == (
                400, {"error": "'cache_salt' must be a non-empty string"},
            )  # fmt: skip


async def test_potential_loads_of_an_adapter_matches_the_adapters_blocks_in_every_tier_view() -> None:
    config = picker_config(2)
    picker = EndpointPicker(replace(config, models=(ModelConfig(MODEL, lora_adapters=(ADAPTER,)),)))
    router = picker.pools[MODEL].router
    tokens = list(range(48))
    hashes = router.block_hashes(tokens, lora_name=ADAPTER)
    router.apply_event(BlocksStored(W1, tuple(StoredBlock(i + 1, h) for i, h in enumerate(hashes)), None))
    async with admin(picker) as client:
        _, answer = await post(client, "/debug/potential_loads", {"model": ADAPTER, "tokens": tokens})
        _, base = await post(client, "/debug/potential_loads", {"model": MODEL, "tokens": tokens})
    w1 = next(e for e in answer["loads"] if e["worker"] == "w1")
    assert (w1["overlap_blocks"], w1["tier_blocks"]) == (3, {"device": 3}) and answer["model"] == ADAPTER
    assert all(e["overlap_blocks"] == 0 and e["tier_blocks"] == {} for e in base["loads"])


async def test_potential_loads_shows_a_prompt_held_on_the_device_then_continued_in_host_memory() -> None:
    picker = EndpointPicker(picker_config(2))
    router = picker.pools[MODEL].router
    tokens = list(range(64))
    hashes = router.block_hashes(tokens)
    router.apply_event(BlocksStored(W0, (StoredBlock(1, hashes[0]), StoredBlock(2, hashes[1])), None))
    continued = (StoredBlock(3, hashes[2]), StoredBlock(4, hashes[3]))
    router.apply_event(BlocksStored(W0, continued, 2, tier=HOST_PINNED_TIER))
    async with admin(picker) as client:
        _, answer = await post(client, "/debug/potential_loads", {"model": MODEL, "tokens": tokens})
    w0 = next(e for e in answer["loads"] if e["worker"] == "w0")
    assert w0["tier_blocks"] == {"device": 2, "host_pinned": 2} and w0["overlap_blocks"] == 2 + 2 * 0.75


async def test_potential_loads_answers_every_documented_field() -> None:
    picker = EndpointPicker(picker_config(2, dp_ranks=(0, 1)))
    router = picker.pools[MODEL].router
    busy = await routed(picker, "load " * 100, "r1")
    async with admin(picker) as client:
        status, answer = await post(
            client, "/debug/potential_loads", {"model": MODEL, "tokens": list(range(40))}
        )
    assert status == 200 and (answer["model"], answer["tokens"], answer["block_size"]) == (MODEL, 40, 16)
    loads = {(e["worker"], e["dp_rank"]): e for e in answer["loads"]}
    assert set(loads) == {("w0", 0), ("w0", 1), ("w1", 0), ("w1", 1)}
    for load in router.get_potential_loads(list(range(40))):
        entry = loads[(load.worker.worker_id, load.worker.dp_rank)]
        assert entry["endpoint"] == {"w0": "127.0.0.1:8000", "w1": "127.0.0.2:8001"}[load.worker.worker_id]
        assert (entry["potential_prefill_tokens"], entry["potential_decode_blocks"]) == (
            load.prefill_tokens, load.decode_blocks,
        )  # fmt: skip
    busy_entry = loads[(busy.worker.worker_id, busy.worker.dp_rank)]
    assert busy_entry["potential_decode_blocks"] > min(e["potential_decode_blocks"] for e in loads.values())


async def test_potential_loads_takes_given_tokens_over_a_prompt_and_a_chat_through_its_template() -> None:
    picker = EndpointPicker(picker_config(1))
    tokenizer = picker.pools[MODEL].tokenizer
    async with admin(picker) as client:
        _, given = await post(
            client, "/debug/potential_loads", {"model": MODEL, "tokens": [1, 2, 3], "prompt": "x" * 50}
        )
        assert given["tokens"] == 3
        _, prompt = await post(client, "/debug/potential_loads", {"model": MODEL, "prompt": "hello"})
        _, chat = await post(
            client,
            "/debug/potential_loads",
            {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]},
        )
    parsed_prompt = await picker.bodies.request(
        b'{"model": "demo-model", "prompt": "hello"}', "/v1/completions"
    )
    parsed_chat = await picker.bodies.request(chat_body("hello"), "/v1/chat/completions")
    assert prompt["tokens"] == len(await tokenizer.tokenize(parsed_prompt.request))
    assert chat["tokens"] == len(await tokenizer.tokenize(parsed_chat.request))
    assert chat["tokens"] != prompt["tokens"]  # the chat went through the chat template


async def test_potential_loads_takes_a_prompt_of_exactly_its_bound_and_refuses_oversized_json() -> None:
    picker = EndpointPicker(picker_config(1))
    async with admin(picker) as client:
        _, small = await post(client, "/debug/potential_loads", {"model": MODEL, "prompt": "x" * 10})
        around = small["tokens"] - 10  # what the tokenizer adds around the text
        exact = {"model": MODEL, "prompt": "x" * (MAX_POTENTIAL_LOADS_TOKENS - around)}
        status, answer = await post(client, "/debug/potential_loads", exact)
        assert status == 200 and answer["tokens"] == MAX_POTENTIAL_LOADS_TOKENS
        picker.bodies.max_prompt_values = 2
        many = {"model": MODEL, "messages": [{"role": "user", "content": str(i)} for i in range(3)]}
        assert await post(client, "/debug/potential_loads", many) == (
            400, {"error": "the prompt holds too many JSON values to tokenize here"},
        )  # fmt: skip
        assert await post(client, "/debug/potential_loads", {"model": MODEL}) == (
            400, {"error": "give 'tokens', 'messages' or 'prompt'"},
        )  # fmt: skip
        async with client.post("/debug/potential_loads", data=io.BytesIO(b" " * (MAX_ADMIN_BODY + 1))) as r:
            assert (r.status, await r.json()) == (
                413,
                {"error": f"the body is larger than {MAX_ADMIN_BODY} bytes"},
            )


# --- busy thresholds ----------------------------------------------------------------------------------


async def test_busy_threshold_answers_say_what_is_wrong_and_what_is_accepted(caplog) -> None:
    picker = EndpointPicker(picker_config(1))
    auth = {"Authorization": "Bearer t"}
    async with admin(picker, token="t") as client:
        assert await post(client, "/busy_threshold", {"model": 3}) == (
            400, {"error": "'model' must be a non-empty string"},
        )  # fmt: skip
        assert await post(client, "/busy_threshold", {"model": "nope"}) == (
            404, {"error": f"model 'nope' is not served here; known: {MODEL}"},
        )  # fmt: skip
        assert await post(client, "/busy_threshold", {"model": MODEL, "limit": 1, "busy": 2}) == (
            400,
            {"error": "unknown fields ['busy', 'limit']; accepted: model, active_decode_blocks_threshold, "
             "active_prefill_tokens_threshold, active_prefill_tokens_threshold_frac"},
        )  # fmt: skip
        assert await post(client, "/busy_threshold", WRITE) == (
            401, {"error": "this admin call needs 'Authorization: Bearer <admin token>'"},
        )  # fmt: skip
        with caplog.at_level(logging.INFO, logger="extproc.admin"):
            for bound in (0, 1):  # both ends of a fraction are allowed
                body = {
                    "model": MODEL,
                    "active_decode_blocks_threshold": bound,
                    "active_prefill_tokens_threshold_frac": bound,
                }
                status, record = await post(client, "/busy_threshold", body, auth)
                assert status == 200 and record["active_decode_blocks_threshold"] == bound
                assert record["active_prefill_tokens_threshold_frac"] == bound
    said = [r.getMessage() for r in caplog.records if r.name == "extproc.admin"]
    assert said[-1] == (
        f"admin: busy thresholds of {MODEL} set to {{'active_decode_blocks_threshold': 1, "
        "'active_prefill_tokens_threshold': None, 'active_prefill_tokens_threshold_frac': 1}"
    )


async def test_without_a_token_a_write_is_refused_with_how_to_allow_it() -> None:
    picker = EndpointPicker(picker_config(1))
    async with admin(picker, allow_unauthenticated_writes=False) as client:
        assert await post(client, "/busy_threshold", WRITE) == (
            403,
            {"error": "admin writes are refused: start the picker with --admin-token (or, to let anyone who "
             "reaches this port change routing, --admin-allow-unauthenticated-writes)"},
        )  # fmt: skip


# --- readiness, metrics, health -----------------------------------------------------------------------


async def test_readyz_is_503_with_its_reason_until_ready_and_health_answers_on_both_paths() -> None:
    picker = EndpointPicker(picker_config(1, use_kv_events=True))
    sources = sources_of(picker)
    async with admin(picker, sources) as client:  # no readiness given: the app makes its own
        status, report = await get(client, "/readyz")
        assert status == 503
        assert report == {
            "ready": False, "reason": "waiting for the first KV event sync of 1 workers", "workers": 1,
            "unsynced": ["w0"],
        }  # fmt: skip
        sources.feed.stream_state(W0, True, "up")
        sources.feed.apply_events([AllBlocksCleared(W0)])
        assert await get(client, "/readyz") == (
            200,
            {
                "ready": True, "reason": "workers known; every KV event stream synced", "workers": 1,
                "unsynced": [],
            },
        )  # fmt: skip
        for path in ("/healthz", "/health"):
            assert await get(client, path) == (200, {"status": "ok"})


async def test_metrics_answer_in_prometheus_text_format() -> None:
    picker = EndpointPicker(picker_config(1))
    async with admin(picker) as client, client.get("/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"] == CONTENT_TYPE_LATEST
        assert "extproc_requests_total" in await r.text()


# --- start_admin --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "allow", "level", "said"),
    [
        ("t", False, "INFO", "admin: changing busy thresholds needs the admin token"),
        (None, False, "INFO", "admin: changing busy thresholds is refused (403): no --admin-token"),
        (None, True, "WARNING", "admin: anyone who reaches http://127.0.0.1:{port} may change busy "
         "thresholds (--admin-allow-unauthenticated-writes, no --admin-token)"),
    ],
)  # fmt: skip
async def test_start_admin_binds_the_port_given_and_says_where_and_who_may_write(
    caplog, token, allow, level, said
) -> None:
    picker = EndpointPicker(replace(picker_config(1), admin_allow_unauthenticated_writes=allow))
    with reserve_port() as reserved:  # held for this process until the admin server binds it
        port = reserved.port
        with caplog.at_level(logging.INFO, logger="extproc.admin"):
            server = await start_admin(picker, sources_of(picker), "127.0.0.1", port, token=token)
        try:
            assert server.port == port
            async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200
        finally:
            await server.stop()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "extproc.admin"]
    assert lines == [
        (
            "INFO",
            f"admin on http://127.0.0.1:{port} (/metrics, /healthz, /readyz, /busy_threshold, /debug/...)",
        ),
        (level, said.format(port=port)),
    ]


async def test_start_admin_uses_the_readiness_and_scraper_it_is_given() -> None:
    picker = EndpointPicker(picker_config(1))
    sources = sources_of(picker)
    readiness = Readiness(picker, sources)
    readiness.draining = True
    scraper = EngineMetricsScraper(picker, EngineMetricsConfig(interval_s=60.0, timeout_s=1.0))
    server = await start_admin(picker, sources, "127.0.0.1", 0, readiness=readiness, engine_metrics=scraper)
    try:
        async with ClientSession(f"http://127.0.0.1:{server.port}") as session:
            async with session.get("/readyz") as r:
                assert r.status == 503 and (await r.json())["reason"] == "shutting down"
            async with session.get("/debug/workers") as r:
                (worker,) = (await r.json())["workers"]
                assert worker["engine_metrics"]["state"] == "pending"
    finally:
        await server.stop()
        await scraper.stop()
