"""EndpointPicker with prefill workers: the prefill header, conditional disaggregation, lifecycle,
worker-set changes between roles, and unhealthy prefill workers left out."""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from extproc.config import DisaggConfig, WorkerConfig
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import MODEL, chat_body, picker_config

LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~1,800 byte-level tokens
HEADER = "x-prefill-endpoint"


def disagg_config(prefill_endpoints=("127.0.0.9:8009",), **disagg):
    config = picker_config(2)
    prefill = tuple(
        WorkerConfig(f"p{i}", endpoint, MODEL, role="prefill") for i, endpoint in enumerate(prefill_endpoints)
    )
    decode = tuple(replace(w, role="decode") for w in config.workers)
    disagg.setdefault("prefill_health_interval_s", 0.0)
    return replace(config, workers=decode + prefill, disagg=DisaggConfig(**disagg))


async def pick(picker, text, request_id="r", headers=None):
    return await picker.pick(
        body=chat_body(text),
        path="/v1/chat/completions",
        headers=headers or {},
        subset=None,
        client_request_id=request_id,
    )


async def test_a_long_prompt_names_the_prefill_worker_in_a_header_and_goes_to_a_decode_worker():
    picker = EndpointPicker(disagg_config())
    chosen = await pick(picker, LONG)
    assert chosen.endpoint in ("127.0.0.1:8000", "127.0.0.2:8001")
    assert chosen.headers[HEADER] == "127.0.0.9:8009" == chosen.prefill_endpoint
    pool = picker.pools[MODEL]
    assert pool.prefill.sequences.prefill_tokens(chosen.prefill_worker) > 1000
    assert pool.router.sequences.prefill_tokens(chosen.worker) == 0  # the prompt is not its work
    picker.first_token(chosen)
    assert pool.prefill.is_idle() and not pool.router.is_idle()
    picker.finish(chosen, "complete")
    assert picker.is_idle()


async def test_a_request_that_fails_before_its_first_token_frees_both_workers():
    picker = EndpointPicker(disagg_config())
    chosen = await pick(picker, LONG)
    picker.finish(chosen, "upstream_status_503")
    assert picker.is_idle()


async def test_short_prompts_and_decode_cached_prompts_are_prefilled_on_the_decode_worker():
    picker = EndpointPicker(disagg_config())
    short = await pick(picker, "hi there", request_id="short")
    assert HEADER not in short.headers and short.prefill_worker is None
    first = await pick(picker, LONG, request_id="a")
    picker.first_token(first)
    picker.finish(first, "complete")
    again = await pick(picker, LONG, request_id="b")  # the decode worker got the whole prompt's KV
    assert again.worker == first.worker and HEADER not in again.headers
    picker.finish(short, "complete")
    picker.finish(again, "complete")
    assert picker.is_idle()
    count = picker.metrics.registry.get_sample_value
    assert count("extproc_disagg_decisions_total", {"model": MODEL, "where": "remote", "reason": ""}) == 1
    # both local ones have a short uncached part (the second's prompt is all cached on its worker)
    local = {"model": MODEL, "where": "local", "reason": "short-uncached"}
    assert count("extproc_disagg_decisions_total", local) == 2


async def test_the_header_name_is_configurable():
    picker = EndpointPicker(disagg_config(prefill_header="x-prefiller-host-port"))
    chosen = await pick(picker, LONG)
    assert chosen.headers["x-prefiller-host-port"] == "127.0.0.9:8009" and HEADER not in chosen.headers


async def test_without_prefill_workers_the_model_is_served_aggregated():
    picker = EndpointPicker(disagg_config(prefill_endpoints=()))
    chosen = await pick(picker, LONG)
    assert HEADER not in chosen.headers and chosen.prefill_worker is None
    assert picker.pools[MODEL].router.sequences.prefill_tokens(chosen.worker) > 1000


async def test_workers_move_between_roles_at_run_time():
    config = disagg_config()
    picker = EndpointPicker(config)
    pool = picker.pools[MODEL]
    decode_only = [w for w in config.workers if w.role != "prefill"]
    picker.set_workers(MODEL, decode_only)  # the prefill worker leaves: aggregated serving
    assert not pool.disaggregated and not pool.prefill.workers()
    chosen = await pick(picker, LONG, request_id="agg")
    assert HEADER not in chosen.headers
    promoted = replace(decode_only[1], role="prefill")  # w1 becomes a prefill worker
    added, removed = picker.set_workers(MODEL, [decode_only[0], promoted])
    assert added == ["w1"] and removed == []
    assert [w.worker_id for w in pool.prefill.workers()] == ["w1"]
    assert [w.worker_id for w in pool.router.workers()] == ["w0"]
    assert picker.routers_by_worker() == {"w0": pool.router, "w1": pool.prefill}
    moved = await pick(picker, LONG.upper(), request_id="disagg")
    assert moved.worker.worker_id == "w0" and moved.headers[HEADER] == promoted.endpoint
    for p in (chosen, moved):
        picker.finish(p, "complete")
    assert picker.is_idle()


async def test_an_unhealthy_prefill_worker_is_not_named_until_it_answers_again(refusing_port):
    app = web.Application()
    app.router.add_get("/health", lambda _request: web.Response(text="ok"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    healthy_port, dead_port = runner.addresses[0][1], refusing_port()
    config = disagg_config(
        prefill_endpoints=(f"127.0.0.1:{dead_port}", f"127.0.0.1:{healthy_port}"),
        prefill_health_interval_s=30.0,  # rounds are driven by hand below
    )
    picker = EndpointPicker(config)
    try:
        await picker.local.prefill_health.probe_all()
        assert picker.local.prefill_health.unhealthy == {"p0"}
        for i in range(4):
            chosen = await pick(picker, f"{i} {LONG}", request_id=f"r{i}")
            assert chosen.headers[HEADER] == f"127.0.0.1:{healthy_port}"
            picker.finish(chosen, "complete")
        await site.stop()  # now every prefill worker is down: serve aggregated
        await picker.local.prefill_health.probe_all()
        assert picker.local.prefill_health.unhealthy == {"p0", "p1"}
        chosen = await pick(picker, f"x {LONG}", request_id="x")
        assert HEADER not in chosen.headers
        picker.finish(chosen, "complete")
        assert picker.is_idle()
    finally:
        await runner.cleanup()
        await picker.close()


async def test_replica_listeners_hear_a_remote_prompt_on_its_prefill_worker_until_its_first_token():
    events: list[tuple[str, str, object]] = []

    class Listener:
        def on_routed(self, pick, local_hashes, isl, expected_output_tokens):
            events.append(("routed", pick.request_id, (pick.prefill_worker, pick.prefill_overlap_blocks)))

        def on_prefill_complete(self, pick):
            events.append(("prefill_complete", pick.request_id, None))

        def on_freed(self, pick):
            events.append(("freed", pick.request_id, None))

    picker = EndpointPicker(disagg_config())
    picker.listeners.append(Listener())
    remote = await pick(picker, LONG, request_id="remote")
    assert remote.prefill_worker is not None
    # the routing says where the prompt is prefilled: other replicas count it there, not on the decode worker
    assert events == [("routed", "remote", (remote.prefill_worker, 0))]
    picker.first_token(remote)  # the prompt left the prefill worker
    assert events[-1] == ("prefill_complete", "remote", None)
    picker.finish(remote, "complete")
    assert events[-1] == ("freed", "remote", None) and picker.is_idle()
