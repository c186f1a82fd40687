"""Every feature works with router groups on, through a local group and through a remote one.

One decision pipeline: a top-level picker decides through its groups; a group (a picker serving its
local group over `--group-api-port`, here in this event loop) makes the same decision for a remote
owner as for its own traffic. Each test runs twice: the group is this picker's local group
(`groups:` naming it), or another picker's group reached over gRPC.
- sticky sessions pin a group and a worker, and move when the worker leaves;
- the admission queue holds a request while every group is saturated, releases it when capacity
  frees, and answers 503 (or 429 for sheddable requests) after its bound;
- disaggregated prefill/decode: the prefill worker is named, and first token and end reach the
  group's prefill and decode routers;
- outlier ejection: the worker's failed answers travel to its group, which ejects it;
- replica sync: the group's listeners hear of every request it tracks;
- Responses API follow-ups and retrievals reach the group and worker that stored the answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

import pytest
import pytest_asyncio

from extproc.config import DisaggConfig, GroupConfig, GroupsConfig, ModelConfig, PickerConfig, WorkerConfig
from extproc.config.inference_extension import InferenceExtensionConfig, Pool, read_resources
from extproc.errors import PickerError
from extproc.groups import GroupApiServer, start_group_api
from extproc.picker.inference_extension import FAIRNESS_HEADER, OBJECTIVE_HEADER
from extproc.picker.local_group import Routed
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.router import QueueTimeout, RouterConfig

from ..config.test_inference_extension import objective, rewrite
from ..replica_helpers import until
from .builders import BLOCK, MODEL, group_config

LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~1,800 byte-level tokens


def chat(text: str, **extra) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}).encode()


class Recorder:
    """A route listener, as replica sync attaches one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_routed(self, routed: Routed, local_hashes: Sequence[int], isl: int, expected: int | None) -> None:
        self.events.append(("routed", routed.request_id))

    def on_prefill_complete(self, routed: Routed) -> None:
        self.events.append(("prefill_complete", routed.request_id))

    def on_freed(self, routed: Routed) -> None:
        self.events.append(("freed", routed.request_id))


@dataclass
class Setup:
    top: EndpointPicker  # the picker requests come to
    group: EndpointPicker  # the picker whose local group decides
    api: GroupApiServer | None  # its group API, when it is remote

    async def settle(self) -> None:
        """Until every lifecycle call the top-level picker sent has been answered."""
        await self.top.selector.drain()

    async def close(self) -> None:
        """The top-level picker, then the group's API and picker, each also when the one before failed."""
        try:
            await self.top.close()
        finally:
            if self.api is not None:
                try:
                    await self.api.stop(0)
                finally:
                    await self.group.close()


async def build(
    mode: str,
    group_cfg: PickerConfig,
    inference_extension: InferenceExtensionConfig | None = None,
    **top_router,
) -> Setup:
    """`local`: the top-level picker's own workers form its group `here`; `remote`: another picker
    serves them and the top-level picker reaches it over gRPC. `inference_extension`: the top-level
    picker's resources file."""
    groups_kw = {"probe_timeout_s": 1.0}
    extension = inference_extension or InferenceExtensionConfig()
    if mode == "local":
        config = replace(
            group_cfg,
            router=replace(group_cfg.router, **top_router),
            groups=GroupsConfig(groups=(GroupConfig("here", None),), **groups_kw),
            inference_extension=extension,
        )
        top = EndpointPicker(config)
        return Setup(top, top, None)
    group = EndpointPicker(group_cfg)
    api = await start_group_api(group.local, "127.0.0.1", 0)
    try:
        top = top_picker(group_cfg, api.port, extension, groups_kw, top_router)
    except BaseException:
        await api.stop(0)  # no server left running when the top-level picker cannot be made
        raise
    return Setup(top, group, api)


def top_picker(
    group_cfg: PickerConfig, port: int, extension: InferenceExtensionConfig, groups_kw: dict, top_router: dict
) -> EndpointPicker:
    """A picker with no workers of its own, whose one group is the remote one at `port`."""
    return EndpointPicker(
        PickerConfig(
            router=RouterConfig(
                block_size=BLOCK, use_kv_events=False, prefill_load_model="none", **top_router
            ),
            workers=(),
            models=group_cfg.models,
            seed=3,
            session_ttl_s=group_cfg.session_ttl_s,
            queue_max_wait_s=group_cfg.queue_max_wait_s,
            groups=GroupsConfig(groups=(GroupConfig("there", f"127.0.0.1:{port}"),), **groups_kw),
            inference_extension=extension,
        )
    )


@pytest.fixture(params=["local", "remote"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


async def pick(
    picker: EndpointPicker, body: bytes, request_id: str, headers: dict[str, str] | None = None, **kwargs
) -> Pick:
    return await picker.pick(
        body=body,
        path="/v1/chat/completions",
        headers=headers or {},
        subset=None,
        client_request_id=request_id,
        **kwargs,
    )


async def end(setup: Setup, chosen: Pick, status: int = 200) -> None:
    setup.top.answered(chosen, status)
    setup.top.first_token(chosen)
    setup.top.finish(chosen, "complete" if status < 400 else f"upstream_status_{status}")
    await setup.settle()


def group_idle(setup: Setup) -> bool:
    return setup.group.local.in_flight() == 0 and all(p.disagg.is_idle() for p in setup.group.pools.values())


@pytest_asyncio.fixture
async def closing() -> AsyncIterator[list[Setup]]:
    setups: list[Setup] = []
    yield setups
    failures = []
    for setup in setups:  # every one, also after one failed to close
        try:
            await setup.close()
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


async def test_sticky_sessions_pin_a_group_and_worker_and_move_when_it_leaves(mode, closing):
    setup = await build(mode, group_config("w", 3))
    closing.append(setup)
    session = {"nvext": {"session_control": {"session_id": "chat-1"}}}
    first = await pick(setup.top, chat("turn one " * 30, **session), "t1")
    await end(setup, first)
    for turn in range(2, 5):  # unrelated prompts: only the session keeps them on one worker
        chosen = await pick(setup.top, chat(f"turn {turn} about something else " * 20, **session), f"t{turn}")
        assert (chosen.group, chosen.worker) == (first.group, first.worker)
        await end(setup, chosen)
    gone = str(first.worker.worker_id)
    setup.group.set_workers(MODEL, [w for w in setup.group.config.workers if w.id != gone])
    moved = await pick(setup.top, chat("after the worker left " * 20, **session), "t5")
    assert moved.group == first.group and moved.worker != first.worker
    await end(setup, moved)
    sessions = setup.top.metrics.sessions
    # a local group's picker drops the pin when its worker leaves; a remote group's owner finds out
    moves = sessions.labels(MODEL, "moved")._value.get() + sessions.labels(MODEL, "pinned")._value.get()
    assert moves == 2
    again = await pick(setup.top, chat("and the next turn " * 20, **session), "t6")
    assert again.worker == moved.worker
    await end(setup, again)
    assert group_idle(setup) and setup.top.is_idle()


async def test_the_queue_holds_requests_while_every_group_is_saturated(mode, closing):
    threshold = {"router_queue_threshold": 0.01}  # one prompt in prefill saturates a worker
    cfg = replace(group_config("w", 2, **threshold), queue_max_wait_s=0.3)
    setup = await build(mode, cfg, **threshold)
    closing.append(setup)
    busy = [await pick(setup.top, chat(f"background {i} " * 30), f"bg{i}") for i in range(2)]
    queued: list[float] = []
    waiting = asyncio.ensure_future(pick(setup.top, chat("waits " * 30), "w1", on_queued=queued.append))
    for _ in range(200):  # until it is held (a poll with a bound)
        if queued:
            break
        await asyncio.sleep(0.005)
    assert queued == [0.3] and not waiting.done()
    setup.top.first_token(busy[0])  # its worker has room again
    chosen = await asyncio.wait_for(waiting, 5)
    assert chosen.worker == busy[0].worker and chosen.queued_s > 0
    # still saturated: the bounded wait ends in 503, or 429 for a sheddable request
    with pytest.raises(QueueTimeout) as normal:
        await pick(setup.top, chat("too late " * 30), "late")
    sheddable = {"nvext": {"agent_hints": {"priority": -1}}}
    with pytest.raises(QueueTimeout) as shed:
        await pick(setup.top, chat("too late, sheddable " * 30, **sheddable), "late-shed")
    assert not normal.value.sheddable and shed.value.sheddable
    for p in (*busy, chosen):
        await end(setup, p)
    assert group_idle(setup) and setup.top.is_idle()


async def test_objectives_and_model_rewrites_are_decided_before_the_groups(mode, closing, tmp_path):
    """The top-level picker rewrites the model (the group routes the adapter) and takes the
    objective's priority into its queue in front of every group (a negative one is shed, 429)."""
    path = tmp_path / "resources.yaml"
    rules = "  - matches:\n    - model: {value: asked}\n    targets:\n    - modelRewrite: lora-a\n"
    path.write_text(objective("batch", -1) + "---\n" + rewrite("to-a", rules))
    extension = InferenceExtensionConfig(str(path), Pool(), read_resources(str(path), Pool()))
    threshold = {"router_queue_threshold": 0.01}  # one prompt in prefill saturates the worker
    models = (ModelConfig(MODEL, lora_adapters=("lora-a",)),)
    cfg = replace(group_config("w", 1, **threshold), queue_max_wait_s=0.2, models=models)
    setup = await build(mode, cfg, extension, **threshold)
    closing.append(setup)
    body = json.dumps({"model": "asked", "messages": [{"role": "user", "content": "a review " * 30}]})
    rewritten = await pick(setup.top, body.encode(), "r1")
    assert rewritten.body is not None and json.loads(rewritten.body)["model"] == "lora-a"
    assert rewritten.model == MODEL and setup.top.metrics.lora_requests.values[(MODEL, "lora-a")] == 1
    with pytest.raises(QueueTimeout) as shed:
        await pick(setup.top, chat("batch work " * 30), "b1", {OBJECTIVE_HEADER: "batch"})
    assert shed.value.sheddable
    await end(setup, rewritten)
    assert group_idle(setup) and setup.top.is_idle()


async def test_tenants_take_turns_in_front_of_every_group(mode, closing):
    """Round-robin fairness is the top-level picker's queue: tenant b's request is routed after one
    request of tenant a's earlier burst, whatever group serves them."""
    threshold = {"router_queue_threshold": 0.01, "router_queue_fairness": "round-robin"}
    cfg = replace(group_config("w", 1, **threshold), queue_max_wait_s=5.0)
    setup = await build(mode, cfg, **threshold)
    closing.append(setup)
    background = previous = await pick(setup.top, chat("background " * 30), "bg")
    waiting = {}
    for name, tenant in (("a0", "a"), ("a1", "a"), ("b0", "b")):
        waiting[name] = asyncio.ensure_future(
            pick(setup.top, chat(f"{name} " * 30), name, {FAIRNESS_HEADER: tenant})
        )
        await until(lambda: len(setup.top.gate(MODEL)) == len(waiting), 5.0, f"{name} held")
    order: list[str] = []

    def routed() -> list[str]:
        return [name for name, task in waiting.items() if task.done() and name not in order]

    for _ in range(3):
        setup.top.first_token(previous)  # room for one more
        await until(routed, 5.0, "a held request routed")
        (name,) = routed()
        order.append(name)
        previous = waiting[name].result()
    assert order == ["a0", "b0", "a1"]
    for chosen in (background, *(task.result() for task in waiting.values())):
        await end(setup, chosen)
    assert group_idle(setup) and setup.top.is_idle()


async def test_disaggregation_names_the_prefill_worker_and_the_lifecycle_reaches_both_routers(mode, closing):
    base = group_config("d", 2)
    prefill = WorkerConfig("p0", "127.0.9.9:8009", MODEL, role="prefill")
    decode = tuple(replace(w, role="decode") for w in base.workers)
    cfg = replace(base, workers=(*decode, prefill), disagg=DisaggConfig(prefill_health_interval_s=0.0))
    setup = await build(mode, cfg)
    closing.append(setup)
    chosen = await pick(setup.top, chat(LONG), "r1")
    assert chosen.headers["x-prefill-endpoint"] == "127.0.9.9:8009" == chosen.prefill_endpoint
    assert str(chosen.prefill_worker.worker_id) == "p0"
    pool = setup.group.pools[MODEL]
    assert pool.prefill.sequences.prefill_tokens(chosen.prefill_worker) > 1000
    setup.top.first_token(chosen)
    await setup.settle()
    assert pool.prefill.is_idle() and not pool.router.is_idle()
    setup.top.finish(chosen, "complete")
    await setup.settle()
    assert group_idle(setup) and setup.top.is_idle()


async def test_a_workers_failed_answers_eject_it_in_its_group(mode, closing):
    setup = await build(mode, replace(group_config("w", 3), outlier_consecutive_5xx=3))
    closing.append(setup)
    victim = None
    for i in range(40):  # Envoy's 503s for a dead worker, as each request to it ends
        chosen = await pick(setup.top, chat(f"request {i} " * 20), f"r{i}")
        victim = victim or chosen.worker
        await end(setup, chosen, 503 if chosen.worker == victim else 200)
        if str(victim.worker_id) in setup.group.local.outliers.ejected(
            setup.group._clock(), setup.group.pools[MODEL].workers
        ):
            break
    else:
        pytest.fail("the failing worker was never ejected")
    for i in range(6):
        chosen = await pick(setup.top, chat(f"after the ejection {i} " * 20), f"after{i}")
        assert chosen.worker != victim
        await end(setup, chosen)
    assert setup.group.metrics.ejections.labels(MODEL, str(victim.worker_id))._value.get() == 1


async def test_replica_sync_listeners_hear_every_request_the_group_tracks(mode, closing):
    setup = await build(mode, group_config("w", 2))
    closing.append(setup)
    recorder = Recorder()
    setup.group.listeners.append(recorder)
    chosen = await pick(setup.top, chat("heard by the other replicas " * 20), "r1")
    await end(setup, chosen)
    tracked = [rid for event, rid in recorder.events if event == "routed"]
    assert len(tracked) == 1
    assert recorder.events == [
        ("routed", tracked[0]),
        ("prefill_complete", tracked[0]),
        ("freed", tracked[0]),
    ]


async def test_an_invalid_request_is_refused_before_any_group_is_asked(mode, closing):
    setup = await build(mode, group_config("w", 2))
    closing.append(setup)
    with pytest.raises(PickerError):
        await pick(setup.top, b"{not json", "bad")
    assert setup.top.selector.metrics.outcomes["routed"] == 0


async def test_generated_tokens_add_output_blocks_in_the_group_that_serves_the_request(mode, closing):
    """--router-track-output-blocks: the owner's generated-token counts reach the group's router,
    coalesced (a remote group gets at most one call in flight per request), and the free takes the
    output blocks back."""
    track = {"router_track_output_blocks": True}
    setup = await build(mode, group_config("o", 2, **track), **track)
    closing.append(setup)
    chosen = await pick(setup.top, chat(LONG, n=2), "r1")
    setup.top.answered(chosen, 200)
    setup.top.first_token(chosen)
    await setup.settle()
    router = setup.group.pools[MODEL].router
    worker = chosen.worker
    before = router.sequences.decode_blocks(worker)
    for _ in range(40):  # 40 chunks of 4 tokens per sequence: 160 tokens = 10 blocks of 16, twice (n=2)
        setup.top.output_tokens(chosen, 4, 2)
    await setup.settle()
    assert router.sequences.decode_blocks(worker) - before == pytest.approx(20, abs=2)
    setup.top.finish(chosen, "complete")
    await setup.settle()
    assert router.sequences.decode_blocks(worker) == 0
    assert group_idle(setup) and setup.top.is_idle()


async def test_a_group_that_does_not_serve_output_tokens_is_asked_once(closing, monkeypatch, caplog):
    """An older picker's group API has no AddOutputTokens (gRPC answers UNIMPLEMENTED): the owner
    says so once and stops sending (the calls already on their way, at most one per request, are all
    there is: a request's call waits for its first-token call, so whether the second request's went
    out before the first answer came back is timing); the requests' lifecycle is unaffected."""
    import grpc

    from extproc.groups.servicer import RouterGroupServicer

    asked: list[str] = []

    async def unimplemented(self, request, context):
        asked.append(request.request_id)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")

    monkeypatch.setattr(RouterGroupServicer, "AddOutputTokens", unimplemented)
    track = {"router_track_output_blocks": True}
    setup = await build("remote", group_config("u", 2, **track), **track)
    closing.append(setup)
    chosen = [await pick(setup.top, chat(f"{i} {LONG}"), f"r{i}") for i in range(2)]
    for p in chosen:
        setup.top.answered(p, 200)
        setup.top.first_token(p)
    for _ in range(5):
        for p in chosen:
            setup.top.output_tokens(p, 16, 1)
        await setup.settle()
    assert asked and len(asked) == len(set(asked)) and set(asked) <= {"r0", "r1"}  # 10 if asked again
    assert len([r for r in caplog.records if "does not serve AddOutputTokens" in r.getMessage()]) == 1
    for p in chosen:
        setup.top.finish(p, "complete")
    await setup.settle()
    assert group_idle(setup) and setup.top.is_idle()


async def test_responses_follow_ups_and_retrievals_reach_the_group_and_worker_that_stored_the_answer(
    mode, closing
):
    setup = await build(
        mode, group_config("w", 3, overlap_score_weight=0.0)
    )  # load only: follow-ups would spread
    closing.append(setup)
    homes = {}
    for i in range(4):
        body = json.dumps({"model": MODEL, "input": f"question {i} " * 20}).encode()
        chosen = await setup.top.pick(
            body=body, path="/v1/responses", headers={}, subset=None, client_request_id=f"r{i}"
        )
        setup.top.response_stored(chosen, f"resp_{i}")  # what the service reads from the answer
        homes[f"resp_{i}"] = (chosen.group, chosen.worker, chosen.endpoint)
        await end(setup, chosen)
    for rid, home in homes.items():
        for turn in range(3):
            body = json.dumps({"model": MODEL, "input": "and then?", "previous_response_id": rid}).encode()
            follow_up = await setup.top.pick(
                body=body, path="/v1/responses", headers={}, subset=None, client_request_id=f"{rid}-{turn}"
            )
            assert (follow_up.group, follow_up.worker, follow_up.endpoint) == home
            await end(setup, follow_up)
        retrieval = await setup.top.pick(
            body=None, path=f"/v1/responses/{rid}", headers={}, subset=None, client_request_id=f"{rid}-get"
        )
        assert (retrieval.group, retrieval.worker, retrieval.endpoint, retrieval.tracked) == (*home, False)
    assert group_idle(setup) and setup.top.is_idle()
