"""EndpointPicker around its decisions: what answers, ends and run-time changes do, and what the
configuration builds.

- a worker's answer: only a 2xx pins a session or remembers a stored response; failed answers of
  untracked requests feed outlier ejection too; the failure runs are counted per worker and warned
  about on the first and every tenth failure;
- sticky sessions: pin events counted, lapsed pins swept on a timer at most a quarter TTL late (a
  virtual sleep keeps that deterministic), also on the picker's own event loop; close stops it all;
- stored responses (`GET /v1/responses/{id}`): to the worker that stored them, within the
  restrictions, and forgotten with their worker;
- run-time changes: `set_workers` (listeners, other groups' pins and homes), `set_thresholds`;
- first tokens, generated tokens, `is_idle`;
- what the configuration builds: the body parser's inline size, the seed, the admission queue's
  policy and clock, router groups (weights, policy, probe grace, clock, metrics, leases, lifecycle
  failures) and `close` of a local group only served to others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import pytest

from extproc.config import GroupConfig, GroupsConfig, PickerConfig, WorkerConfig
from extproc.epp import answers as epp
from extproc.errors import UnknownModel
from extproc.groups import GroupApiServer, GroupRequest, RemoteGroup, start_group_api
from extproc.groups.errors import GroupUnreachable, NoGroupAvailable
from extproc.groups.types import GroupProbe
from extproc.picker import pipeline
from extproc.picker.local_group import LocalGroup
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.router import SessionPins
from extproc.runtime import wakeups

from ..groups.builders import disagg_config, group_config, prompt, request
from ..picker_fixtures import MODEL, chat_body, picker_config
from ..replica_helpers import until
from ..router.clock import FakeClock
from . import test_sessions as sticky
from . import test_worker_sessions as sglang

sglang_workers = sglang.workers  # three SGLang workers' session routes (a fixture)


async def route(
    picker: EndpointPicker,
    path: str = "/v1/chat/completions",
    body: bytes | None = None,
    *,
    headers: dict[str, str] | None = None,
    subset: list[str] | None = None,
    rid: str = "r",
) -> Pick:
    return await picker.pick(
        body=body, path=path, headers=headers or {}, subset=subset, client_request_id=rid
    )


def sample(picker: EndpointPicker, name: str, **labels: str) -> float | None:
    """A sample of the picker's /metrics (None: never counted)."""
    return picker.metrics.registry.get_sample_value(name, labels)


def responses_body(response_id: str, text: str = "question") -> bytes:
    """A Responses API request whose answer will carry `response_id` (vLLM's `request_id` field)."""
    return json.dumps({"model": MODEL, "input": f"{text} " * 20, "request_id": response_id}).encode()


async def store(picker: EndpointPicker, response_id: str, *, subset: list[str] | None = None) -> Pick:
    """A Responses API request answered 200: its worker stores `response_id`."""
    chosen = await route(picker, "/v1/responses", responses_body(response_id), subset=subset)
    picker.answered(chosen, 200)
    picker.finish(chosen, "complete")
    return chosen


def still_running(before: set[asyncio.Task[object]]) -> set[asyncio.Task[object]]:
    """Tasks started since `before` that have not ended (the calling task aside)."""
    return {t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()}


# --- a worker's answer ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kept"), [(200, True), (299, True), (300, False), (404, False), (503, False)]
)
async def test_only_a_2xx_answer_pins_the_session_and_remembers_the_stored_response(status, kept) -> None:
    picker, clock = sticky.make()
    chat = await route(picker, body=chat_body("hello " * 20, **sticky.session("s")))
    answer = await route(picker, "/v1/responses", responses_body("resp_1"))
    for chosen in (chat, answer):
        picker.answered(chosen, status)
        picker.finish(chosen, "complete")
    assert (picker.sessions(MODEL).get("s", clock()) == chat.worker) is kept
    home = picker.response_homes.get("resp_1", clock())
    assert (home is not None and home.endpoint == answer.endpoint) is kept


async def test_a_failing_worker_is_warned_about_on_its_first_and_every_tenth_failure_and_once_on_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    picker = EndpointPicker(replace(picker_config(1), outlier_consecutive_5xx=0))
    chosen = await route(picker, "/health")

    def levels(status: int) -> list[str]:
        """The levels of what answering `status` logs."""
        caplog.clear()
        picker.answered(chosen, status)
        return [r.levelname for r in caplog.records if r.name == "extproc.picker"]

    with caplog.at_level(logging.INFO, logger="extproc.picker"):
        failures = [levels(503) for _ in range(21)]
        recovered, steady = levels(200), levels(200)
    assert [n for n, logged in enumerate(failures, 1) if logged] == [1, 10, 20]
    assert all(logged in ([], ["WARNING"]) for logged in failures)
    assert (recovered, steady) == (["INFO"], [])
    labels = {"model": MODEL, "worker": "w0"}
    assert sample(picker, "extproc_upstream_responses_total", **labels, status="503") == 21
    assert sample(picker, "extproc_worker_consecutive_failures", **labels) == 0


async def test_failed_answers_to_untracked_requests_eject_their_worker_too() -> None:
    """GET /v1/models, /health, embeddings...: a worker Envoy cannot reach fails those too."""
    picker = EndpointPicker(replace(picker_config(3), outlier_consecutive_5xx=3))
    chosen = []
    for _ in range(30):
        untracked = await route(picker, "/v1/models")
        chosen.append(untracked.worker.worker_id)
        picker.answered(untracked, 503 if untracked.worker.worker_id == "w0" else 200)
    assert chosen.count("w0") == 3, chosen  # three failures, then no more requests
    assert sample(picker, "extproc_worker_ejections_total", model=MODEL, worker="w0") == 1


# --- sticky sessions -----------------------------------------------------------------------------


async def test_pin_events_are_counted_once_and_refreshes_not_at_all() -> None:
    picker, _ = sticky.make()
    for i in range(3):
        await sticky.turn(picker, f"turn {i} " * 20, "s", f"r{i}")
    await sticky.turn(picker, "bye " * 20, "s", "r3", action="close")
    events = {
        event: sample(picker, "extproc_session_pins_total", model=MODEL, event=event)
        for event in ("pinned", "refreshed", "moved", "closed")
    }
    assert events == {"pinned": 1.0, "refreshed": None, "moved": None, "closed": 1.0}


def virtual_sleep(clock: FakeClock) -> Callable[[float, float], Awaitable[None]]:
    """`lazy_sleep` in virtual time: each sleep moves `clock` on by its delay at once."""

    async def sleep(delay_s: float, slack_s: float) -> None:
        clock.advance(delay_s)
        await asyncio.sleep(0)

    return sleep


async def swept(sessions: SessionPins) -> None:
    """Until the sweeper (in virtual time) has dropped every pin; bounded in event-loop steps."""
    for _ in range(10_000):
        if not len(sessions):
            return
        await asyncio.sleep(0)
    raise AssertionError("the sweeper never dropped the lapsed pins")


@pytest.mark.parametrize(("ttl_s", "late_s"), [(0.2, 0.05), (40.0, 10.0), (3600.0, 30.0)])
async def test_a_lapsed_pin_is_swept_at_most_a_quarter_ttl_late(monkeypatch, ttl_s, late_s) -> None:
    """The sweeper wakes every ttl/4, but not more often than every 50 ms nor less than every 30 s:
    a lapsed pin (and the worker session it holds) lingers at most that long without a request."""
    clock = FakeClock(1000.0)
    monkeypatch.setattr(pipeline, "lazy_sleep", virtual_sleep(clock))
    picker = EndpointPicker(replace(picker_config(2), session_ttl_s=ttl_s), clock=clock)
    try:
        await sticky.turn(picker, "hello " * 30, "s", "r0")  # pinned at 1000.0
        await swept(picker.sessions(MODEL))
        assert 1000.0 + ttl_s <= clock() <= 1000.0 + ttl_s + late_s + 1e-6
    finally:
        await picker.close()


async def test_a_pin_made_after_the_sweeper_ended_is_swept_by_a_new_one(monkeypatch) -> None:
    clock = FakeClock(1000.0)
    monkeypatch.setattr(pipeline, "lazy_sleep", virtual_sleep(clock))
    picker = EndpointPicker(replace(picker_config(2), session_ttl_s=1.0), clock=clock)
    try:
        for i in range(2):  # the first sweeper ends with its last pin
            await sticky.turn(picker, f"hello {i} " * 30, f"s{i}", f"r{i}")
            await swept(picker.sessions(MODEL))
        assert picker.sessions(MODEL).expired == 2
    finally:
        await picker.close()


def test_lapsed_pins_are_swept_on_the_pickers_own_event_loop() -> None:
    """The picker's loop (`extproc.runtime.wakeups`) ends the sweeper's sleeps lazily, with slack."""

    async def main() -> None:
        picker = EndpointPicker(replace(picker_config(2), session_ttl_s=0.2))
        try:
            await sticky.turn(picker, "hello " * 30, "s", "r0")
            # no request: only the sweeper drops it
            await until(lambda: not len(picker.sessions(MODEL)), 5.0, "the pin was never swept")
        finally:
            await picker.close()

    wakeups.run(main())


async def test_close_stops_every_sweeper_and_may_be_repeated() -> None:
    before = set(asyncio.all_tasks())
    picker = EndpointPicker(picker_config(2))  # a 300 s TTL: the sweeper sleeps 30 s at a time
    for i in range(3):  # pins made while the sweeper runs
        await sticky.turn(picker, f"hello {i} " * 30, f"s{i}", f"r{i}")
    assert still_running(before)
    await picker.close()
    assert not still_running(before)
    await picker.close()


# --- stored responses ----------------------------------------------------------------------------


def same_host_workers() -> EndpointPicker:
    """w0 and w1 on one host (two engines, two ports), w2 on another."""
    workers = (
        WorkerConfig("w0", "127.0.0.1:8000", MODEL),
        WorkerConfig("w1", "127.0.0.1:8001", MODEL),
        WorkerConfig("w2", "127.0.0.2:8000", MODEL),
    )
    return EndpointPicker(replace(picker_config(), workers=workers))


async def retrievals(picker: EndpointPicker, response_id: str, subset: list[str] | None) -> set[str]:
    """The endpoints eight retrievals of `response_id` went to (untracked, no id of their own)."""
    endpoints = set()
    for i in range(8):
        chosen = await route(picker, f"/v1/responses/{response_id}", subset=subset, rid=f"get{i}")
        assert (chosen.model, chosen.request_id, chosen.tracked) == (MODEL, "", False)
        endpoints.add(chosen.endpoint)
    return endpoints


@pytest.mark.parametrize(
    ("subset", "expected"),
    [
        (None, {"127.0.0.1:8000"}),
        (["127.0.0.1:8000", "127.0.0.2:8000"], {"127.0.0.1:8000"}),
        (["127.0.0.2:8000"], {"127.0.0.2:8000"}),  # on load, where allowed (where it is answered 404)
    ],
    ids=["unrestricted", "its-worker-allowed", "its-worker-not-allowed"],
)
async def test_a_stored_response_is_retrieved_from_its_worker_when_the_restrictions_allow_it(
    subset, expected
) -> None:
    picker = same_host_workers()
    assert (await store(picker, "resp_a", subset=["127.0.0.1:8000"])).worker.worker_id == "w0"
    assert await retrievals(picker, "resp_a", subset) == expected


async def test_a_bare_ip_subset_allows_the_worker_that_stored_the_response() -> None:
    """A bare IP allows every port of its host (`epp.endpoint_matches`), as for any other request;
    the retrieval must not be routed on load to the host's other engine, which does not store it."""
    picker = same_host_workers()
    await store(picker, "resp_a", subset=["127.0.0.1:8000"])
    assert await retrievals(picker, "resp_a", ["127.0.0.1"]) == {"127.0.0.1:8000"}


async def test_an_unknown_response_id_is_routed_on_load() -> None:
    picker = same_host_workers()
    every = {w.endpoint for w in picker.config.workers}
    assert await retrievals(picker, "resp_unknown", None) <= every


async def test_a_removed_worker_takes_its_stored_responses_with_it() -> None:
    picker = same_host_workers()
    await store(picker, "resp_a", subset=["127.0.0.1:8000"])
    picker.set_workers(MODEL, [w for w in picker.config.workers if w.id != "w0"])
    assert len(picker.response_homes) == 0
    assert "127.0.0.1:8000" not in await retrievals(picker, "resp_a", None)


# --- untracked requests --------------------------------------------------------------------------


@pytest.mark.parametrize("selection", ["127.0.0.2:8001,127.0.0.3:8002", " 127.0.0.2:8001 , 127.0.0.3:8002 ,"])
async def test_the_conformance_selection_header_lists_endpoints_separated_by_commas(selection) -> None:
    picker = EndpointPicker(replace(picker_config(4), conformance_hooks=True))
    headers = {epp.CONFORMANCE_SELECTION_HEADER: selection}
    chosen = [await route(picker, "/v1/models", headers=headers) for _ in range(12)]
    assert {p.endpoint for p in chosen} == {"127.0.0.2:8001", "127.0.0.3:8002"}
    assert all(p.request_id == "" and not p.tracked and p.group == "local" for p in chosen)


@pytest.mark.parametrize("call", ["set_workers", "set_thresholds", "route"])
async def test_an_unknown_model_is_refused_naming_it_and_the_models_served(call) -> None:
    picker = EndpointPicker(picker_config())
    with pytest.raises(UnknownModel) as refused:
        if call == "set_workers":
            picker.set_workers("nope", [])
        elif call == "set_thresholds":
            picker.set_thresholds("nope", active_prefill_tokens_threshold=10)
        else:
            await route(picker, "/v1/embeddings", json.dumps({"model": "nope", "input": "x"}).encode())
    assert (refused.value.model, refused.value.known) == ("nope", [MODEL])


# --- run-time changes ----------------------------------------------------------------------------


async def test_worker_set_listeners_hear_each_change_and_nothing_else() -> None:
    picker = EndpointPicker(picker_config(2))
    heard: list[tuple[str, list[str], list[str]]] = []

    class Listener:
        def on_workers_changed(self, model: str, added, removed) -> None:
            heard.append((model, [w.id for w in added], list(removed)))

    picker.worker_listeners.append(Listener())
    w0, w1 = picker.config.workers
    w2 = WorkerConfig("w2", "127.0.0.3:8002", MODEL)
    assert picker.set_workers(MODEL, [w0, w1, w2]) == (["w2"], [])
    assert picker.set_workers(MODEL, [w0, w1, w2]) == ([], [])
    assert picker.set_workers(MODEL, [w0, w2]) == ([], ["w1"])
    assert heard == [(MODEL, ["w2"], []), (MODEL, [], ["w1"])]


async def test_thresholds_change_at_run_time_and_the_full_record_is_returned() -> None:
    picker = EndpointPicker(picker_config())
    record = picker.set_thresholds(MODEL, active_prefill_tokens_threshold=500)
    assert record["active_prefill_tokens_threshold"] == 500
    assert record == picker.pools[MODEL].router.thresholds()


async def test_a_request_on_a_removed_worker_keeps_the_picker_busy_until_its_stream_ends() -> None:
    """The router forgets a removed worker's requests; their streams still run, and end normally."""
    picker = EndpointPicker(picker_config(2))
    chosen = await route(picker, body=chat_body("hello " * 30))
    picker.set_workers(MODEL, [w for w in picker.config.workers if w.id != chosen.worker.worker_id])
    assert not picker.is_idle()
    picker.finish(chosen, "complete")
    assert picker.is_idle()


# --- first and generated tokens ------------------------------------------------------------------


async def test_a_first_token_teaches_the_pass_time_model_unless_it_came_with_a_whole_answer() -> None:
    clock = FakeClock(1000.0)
    picker = EndpointPicker(picker_config(1, prefill_load_model="timing"), clock=clock)
    sequences = picker.pools[MODEL].router.sequences
    whole = await route(picker, body=chat_body("whole " * 100), rid="whole")
    clock.advance(0.2)
    picker.first_token(whole, at_first_token=False)  # a non-streamed answer: seen only complete
    assert sequences.learned_pass_time(whole.worker) is None
    streamed = await route(picker, body=chat_body("streamed " * 100), rid="streamed")
    clock.advance(0.2)
    picker.first_token(streamed)
    learned = sequences.learned_pass_time(streamed.worker)
    assert learned is not None and learned.samples == 1


async def test_generated_tokens_count_for_one_sequence_unless_told_more() -> None:
    picker = EndpointPicker(picker_config(1, router_track_output_blocks=True))
    chosen = await route(picker, body=chat_body("x " * 64))
    picker.first_token(chosen)

    def decode_blocks() -> float:
        return picker.local.potential_loads_now(GroupRequest(MODEL, [])).workers[0].decode_blocks

    before = decode_blocks()
    picker.output_tokens(chosen, 32)  # two blocks of 16 tokens
    assert decode_blocks() == before + 2


# --- what the configuration builds ---------------------------------------------------------------


async def test_bodies_up_to_the_configured_inline_size_are_parsed_on_the_event_loop() -> None:
    picker = EndpointPicker(replace(picker_config(), body_parse_inline_bytes=64 * 1024))
    body = json.dumps({"model": MODEL, "input": "x" * 32 * 1024}).encode()  # over the 16 KiB default
    try:
        assert (await route(picker, "/v1/embeddings", body)).model == MODEL
        assert (picker.bodies.stats.on_loop, picker.bodies.stats.in_worker) == (1, 0)
    finally:
        await picker.close()


def two_local_groups(**groups: object) -> PickerConfig:
    """Groups `a` and `b` over this picker's workers (the same pools): every probe ties."""
    config = GroupsConfig(groups=(GroupConfig("a"), GroupConfig("b")), **groups)
    return replace(picker_config(4), groups=config)


@pytest.mark.parametrize("config", [picker_config(4), two_local_groups()], ids=["plain", "groups"])
async def test_a_seed_makes_every_random_choice_reproducible(config) -> None:
    """Ties between idle workers, and between groups, are broken by the seeded rng."""

    async def choices() -> list[tuple[str | None, str]]:
        picker = EndpointPicker(config)
        picks = [await route(picker, "/v1/models") for _ in range(24)]
        return [(p.group, p.endpoint) for p in picks]

    first = await choices()
    assert len(set(first)) > 1 and await choices() == first


async def test_the_queue_releases_by_the_configured_policy_and_counts_the_wait_on_the_pickers_clock() -> None:
    """wspt: the request with the fewest uncached prompt tokens first, whatever came first."""
    clock = FakeClock(1000.0)
    picker = EndpointPicker(
        picker_config(1, router_queue_threshold=0.01, router_queue_policy="wspt"), clock=clock
    )
    try:
        hog = await route(picker, body=chat_body("hog " * 100), rid="hog")  # in prefill: saturated
        gate = picker.gate(MODEL)
        long = asyncio.create_task(route(picker, body=chat_body("long " * 400), rid="long"))
        await until(lambda: len(gate) == 1, 5.0, "the first request never queued")
        short = asyncio.create_task(route(picker, body=chat_body("short " * 100), rid="short"))
        await until(lambda: len(gate) == 2, 5.0, "the second request never queued")
        clock.advance(2.0)
        picker.first_token(hog)  # room for one: the short one, which saturates the worker again
        released = await short
        assert not long.done() and released.queued_s == 2.0
        picker.first_token(released)
        assert (await long).queued_s == 2.0
    finally:
        await picker.close()


@pytest.mark.parametrize(("policy", "chosen"), [("max-overlap", {"a", "b"}), ("weighted", {"b"})])
async def test_group_weights_count_under_the_weighted_policy_only(policy, chosen) -> None:
    """An untracked request costs nothing in either group: weighted prefers the heavier one, while
    max-overlap, which reads no weight, shares such ties at random."""
    groups = GroupsConfig(groups=(GroupConfig("a", weight=1.0), GroupConfig("b", weight=3.0)), policy=policy)
    picker = EndpointPicker(replace(picker_config(2), groups=groups))
    assert {(await route(picker, "/v1/models")).group for _ in range(12)} == chosen


def slow(group: LocalGroup, delay_s: float) -> None:
    """Make `group` answer its probes after `delay_s` (a loaded machine)."""
    answer = group.probe

    async def probe(request: GroupRequest, *, timeout_s: float = 0.0) -> GroupProbe:
        await asyncio.sleep(delay_s)  # the group's own slowness, not synchronisation
        return await answer(request, timeout_s=timeout_s)

    group.probe = probe


async def test_without_a_probe_grace_no_answer_within_the_deadline_is_a_503() -> None:
    picker = EndpointPicker(two_local_groups(probe_timeout_s=0.01, probe_grace_s=0.0))
    for group in picker.selector.groups:
        slow(group, 0.1)
    with pytest.raises(NoGroupAvailable):
        await route(picker, body=chat_body("hello " * 30))
    assert picker.is_idle()


async def test_a_group_skipped_after_failures_is_probed_again_once_the_pickers_clock_says_so() -> None:
    """Three failed probes in a row skip a group for a second of the picker's clock."""
    clock = FakeClock(1000.0)
    picker = EndpointPicker(two_local_groups(), clock=clock)
    a = picker.selector.groups[0]
    probe = a.probe

    async def unreachable(request: GroupRequest, *, timeout_s: float = 0.0) -> GroupProbe:
        raise GroupUnreachable("a", "connection refused")

    a.probe = unreachable
    for _ in range(3):
        assert (await route(picker, "/v1/models")).group == "b"
    assert sample(picker, "extproc_group_ejected", group="a") == 1
    a.probe = probe
    clock.advance(1.5)
    await route(picker, "/v1/models")
    assert sample(picker, "extproc_group_ejected", group="a") == 0


@dataclass
class Fleet:
    top: EndpointPicker  # requests come here
    group: EndpointPicker  # serves its workers as the remote group `there`
    api: GroupApiServer

    def remote(self) -> RemoteGroup:
        return next(g for g in self.top.selector.groups if isinstance(g, RemoteGroup))


@asynccontextmanager
async def fleet(
    *, here: float | None = 1.0, there: float = 1.0, policy: str = "max-overlap", lease_s: float = 10.0
) -> AsyncIterator[Fleet]:
    """The top picker's own workers w0, w1 (127.0.1.x) as its group `here` of weight `here` (None:
    not a group of its own, only served to others), and another picker's w0, w1 (127.0.2.x) as the
    remote group `there` of weight `there`, served in this event loop."""
    group = EndpointPicker(replace(group_config("w", 2, subnet=2), worker_session_control="off"))
    api = await start_group_api(group.local, "127.0.0.1", 0)
    remote = GroupConfig("there", f"127.0.0.1:{api.port}", there)
    groups = (GroupConfig("here", None, here), remote) if here is not None else (remote,)
    top = EndpointPicker(
        replace(
            group_config("w", 2, subnet=1),
            seed=3,
            worker_session_control="off",
            groups=GroupsConfig(groups=groups, probe_timeout_s=1.0, policy=policy, lease_s=lease_s),
        )
    )
    try:
        yield Fleet(top, group, api)
    finally:
        await top.close()
        await api.stop(0)
        await group.close()


@pytest.mark.parametrize(("here", "there", "chosen"), [(3.0, 1.0, "here"), (1.0, 3.0, "there")])
async def test_weighted_routing_prefers_the_heavier_group_local_or_remote(here, there, chosen) -> None:
    async with fleet(here=here, there=there, policy="weighted") as f:
        assert {(await route(f.top, "/v1/models")).group for _ in range(8)} == {chosen}


@pytest.mark.parametrize("here", [1.0, None], ids=["with-a-local-group", "remote-only"])
async def test_replacing_this_pickers_workers_leaves_other_groups_pins_and_homes_alone(here) -> None:
    """Worker ids are only unique within a group: the remote group's w0 is not this picker's w0."""
    async with fleet(here=here) as f:
        top, now = f.top, time.monotonic
        sides = {"far": "127.0.2.1:8000"} | ({"near": "127.0.1.1:8000"} if here is not None else {})
        for name, endpoint in sides.items():  # a session pinned and a response stored on each w0
            body = chat_body(f"{name} " * 30, **sticky.session(name))
            chat = await route(top, body=body, subset=[endpoint])
            answer = await route(top, "/v1/responses", responses_body(f"resp_{name}"), subset=[endpoint])
            for chosen in (chat, answer):
                assert (chosen.worker.worker_id, chosen.endpoint) == ("w0", endpoint)
                top.answered(chosen, 200)
                top.finish(chosen, "complete")
        top.set_workers(MODEL, [w for w in top.config.workers if w.id != "w0"])
        sessions = top.sessions(MODEL)
        pin = sessions.get_pin("far", now())
        assert pin is not None and (pin.group, pin.worker.worker_id) == ("there", "w0")
        assert (await route(top, "/v1/responses/resp_far")).endpoint == "127.0.2.1:8000"
        if here is not None:  # this picker's own w0 left: its pins and homes go
            assert sessions.get_pin("near", now()) is None
            assert top.response_homes.get("resp_near", now()) is None
        await top.selector.drain()


async def test_a_cut_off_picker_loses_its_requests_in_a_remote_group_after_the_configured_lease() -> None:
    """--group-lease-secs reaches the group with each commit: a picker that stops renewing (dead or
    cut off) has its requests freed there once that lease ran out on the group's clock."""
    clock = FakeClock(1000.0)
    async with fleet(here=None, lease_s=0.3) as f:
        f.api.servicer.clock = clock  # the group's time
        chosen = await route(f.top, body=chat_body("hello " * 30))
        assert chosen.group == "there" and f.group.local.in_flight() == 1
        clock.advance(1.0)  # no renewal came for longer than the lease
        assert f.api.servicer.sweep() == 1
        assert f.group.local.in_flight() == 0
        f.top.finish(chosen, "complete")
        await f.top.selector.drain()


async def test_a_lifecycle_call_a_remote_group_misses_is_counted() -> None:
    async with fleet(here=None) as f:
        f.remote().retries = 1  # not retried: counted at once
        chosen = await route(f.top, body=chat_body("hello " * 30))
        await f.api.stop(0)  # the group went away mid-stream
        f.top.finish(chosen, "complete")
        await f.top.selector.drain()
        assert sample(f.top, "extproc_group_lifecycle_failures_total", group="there", call="free") == 1


async def test_close_stops_the_health_checks_of_a_local_group_only_served_to_others(refusing_port) -> None:
    """With only remote groups, this picker's own workers are still served to other pickers (its
    group API) through its local group; a disaggregated request committed there starts prefill
    health checks, and close must stop them."""
    before = set(asyncio.all_tasks())
    config = disagg_config(2, (f"127.0.0.1:{refusing_port()}",), disagg={"prefill_health_interval_s": 0.05})
    remote_only = GroupsConfig(groups=(GroupConfig("there", f"127.0.0.1:{refusing_port()}"),))
    picker = EndpointPicker(replace(config, worker_session_control="off", groups=remote_only))
    decision = await picker.local.commit(request(prompt(1)), "r1", None)  # as the group API commits
    picker.local.free(MODEL, decision.request_id)
    assert still_running(before)
    await picker.close()
    assert not still_running(before)


# --- worker-side sessions (SGLang) ---------------------------------------------------------------


async def test_a_session_opened_for_a_request_its_worker_refused_is_closed_there(sglang_workers) -> None:
    picker, _ = sglang.make([e for _, e in sglang_workers])
    try:
        chosen = await route(picker, body=chat_body("hello " * 20, **sglang.control("s", "open")))
        assert chosen.session_opened_on == chosen.endpoint
        picker.answered(chosen, 503)
        picker.finish(chosen, "upstream_status_503")
        await picker.worker_sessions.drain()
        served = sglang.served_by(sglang_workers, chosen.endpoint)
        assert served.calls[-1] == ("/close_session", {"session_id": "s"})
        assert "s" not in picker.sessions(MODEL)
    finally:
        await picker.close()


async def test_a_session_already_open_stays_open_when_its_worker_refuses_a_request(sglang_workers) -> None:
    """A second open of a pinned session finds it already open (an earlier request opened it) and
    the worker answers this request 503: the session stays open there, pinned, for its next turn."""
    picker, clock = sglang.make([e for _, e in sglang_workers])
    try:
        first = await sglang.turn(picker, "r0", "s", "open")
        picker.finish(first, "complete")
        again = await route(picker, body=chat_body("again " * 20, **sglang.control("s", "open")))
        assert picker.worker_sessions.calls == {("open", "ok"): 1, ("open", "already_open"): 1}
        assert again.endpoint == first.endpoint and again.session_opened_on == first.endpoint
        picker.answered(again, 503)
        picker.finish(again, "upstream_status_503")
        await picker.worker_sessions.drain()
        served = sglang.served_by(sglang_workers, first.endpoint)
        assert [path for path, _ in served.calls] == ["/open_session", "/open_session"]
        assert served.open_sessions == {"s"}
        assert picker.sessions(MODEL).get_pin("s", clock()) is not None
    finally:
        await picker.close()


async def test_a_session_already_open_on_its_worker_is_closed_there_when_its_pin_lapses(
    sglang_workers,
) -> None:
    """The picker restarted (its pins are gone) while the worker kept the session: an open finds it
    already open; the pin made for it closes it when it lapses, as for one the picker opened."""
    served, endpoint = sglang_workers[0]
    served.open_sessions.add("s")
    picker, clock = sglang.make([endpoint], ttl_s=10.0)
    try:
        chosen = await sglang.turn(picker, "r0", "s", "open")
        assert picker.worker_sessions.calls == {("open", "already_open"): 1}
        assert chosen.session_opened_on == endpoint
        picker.finish(chosen, "complete")
        clock.advance(11.0)
        assert picker.sessions(MODEL).expire(clock()) == 1
        await picker.worker_sessions.drain()
        assert served.calls[-1] == ("/close_session", {"session_id": "s"}) and not served.open_sessions
    finally:
        await picker.close()


async def test_a_session_action_without_a_session_id_is_ignored(sglang_workers) -> None:
    picker, _ = sglang.make([e for _, e in sglang_workers])
    try:
        # no session id: nothing to open, and so no timeout to refuse
        control = {"nvext": {"session_control": {"action": "open", "timeout": -1}}}
        chosen = await route(picker, body=chat_body("hello " * 20, **control))
        assert chosen.session_opened_on is None and not any(s.calls for s, _ in sglang_workers)
        picker.finish(chosen, "complete")
    finally:
        await picker.close()
