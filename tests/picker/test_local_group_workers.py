"""LocalGroup's candidates, worker set, request ids, lifecycle answers, loads and probes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from extproc.config import PickerConfig, WorkerConfig
from extproc.errors import NoEligibleWorker, UnknownModel
from extproc.groups import GroupRequest
from extproc.picker.local_group import LocalGroup
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfigOverride, Worker
from tests.groups.builders import MODEL, RouteListener, disagg_config, group_config, prompt, request
from tests.router.clock import FakeClock

from .test_local_group import routers

LONG = 480  # prompt tokens: prefilled on a prefill worker (over disagg's 256)


def group_of(
    config: PickerConfig, *, clock: Callable[[], float] | None = None, listener: RouteListener | None = None
) -> LocalGroup:
    """A LocalGroup over a real picker's pools, with its own clock and listener."""
    picker = EndpointPicker(config)
    listeners: list[RouteListener] = [listener] if listener is not None else []
    return LocalGroup(
        "g",
        picker.pools,
        config=config,
        clock=clock or FakeClock(1000.0),
        metrics=picker.metrics,
        listeners=listeners,
    )


def candidates(group: LocalGroup, tokens: Sequence[int] = prompt(1), **kwargs) -> set[str]:
    """The ids of the workers a request may go to (potential loads list exactly those)."""
    return {str(w.worker.worker_id) for w in group.potential_loads_now(request(tokens, **kwargs)).workers}


def endpoint(i: int, subnet: int = 1) -> tuple[str]:
    """A restriction to worker `w<i>` of `group_config`."""
    return (f"127.0.{subnet}.{i + 1}:8000",)


def ejections(group: LocalGroup, wid: str) -> float | None:
    labels = {"model": MODEL, "worker": wid}
    return group.metrics.registry.get_sample_value("extproc_worker_ejections_total", labels)


def fail(group: LocalGroup, wid: str, times: int) -> None:
    for _ in range(times):
        group.answered(MODEL, "r", Worker(wid), 503)


# --- candidates: restrictions and outlier ejection -------------------------------------------------


def test_failed_answers_eject_a_worker_for_the_configured_run_and_time():
    clock = FakeClock(1000.0)
    config = replace(group_config("w", 3), outlier_consecutive_5xx=2, outlier_base_ejection_s=30.0)
    group = group_of(config, clock=clock)
    fail(group, "w1", 1)
    assert candidates(group) == {"w0", "w1", "w2"}
    fail(group, "w1", 1)  # the second failed answer in a row
    assert candidates(group) == {"w0", "w2"} and ejections(group, "w1") == 1
    clock.now += 29.0
    assert candidates(group) == {"w0", "w2"}
    clock.now += 2.0
    assert candidates(group) == {"w0", "w1", "w2"}


def test_a_finished_requests_status_feeds_outlier_ejection():
    group = group_of(replace(group_config("w", 3), outlier_consecutive_5xx=2))
    for i in range(2):
        rid = group.commit_now(request(prompt(i)), f"r{i}", Worker("w2")).request_id
        assert group.finish(rid, 503)
    assert candidates(group) == {"w0", "w1"} and ejections(group, "w2") == 1


@pytest.mark.parametrize(
    ("allowed", "expected"),
    [
        ((0, 1, 2), {"w0", "w2"}),  # no restriction in effect but the ejection
        ((1, 2), {"w2"}),  # the restriction, without the ejected worker
        ((1,), {"w1"}),  # only the ejected one is allowed: it still takes requests
    ],
)
def test_ejection_applies_within_the_endpoint_restrictions(allowed: tuple[int, ...], expected: set[str]):
    group = group_of(replace(group_config("w", 3), outlier_consecutive_5xx=2))
    fail(group, "w1", 2)
    restriction = tuple(endpoint(i)[0] for i in allowed)
    assert candidates(group, restrictions=(restriction,)) == expected
    assert (
        str(group.probe_now(request(prompt(1), restrictions=(restriction,))).choice.worker.worker_id)
        in expected
    )


def test_answers_for_unknown_models_or_removed_workers_eject_nothing():
    config = replace(group_config("w", 3), outlier_consecutive_5xx=2)
    group = group_of(config)
    group.answered("other-model", "r", Worker("w0"), 503)
    group.set_workers(MODEL, config.workers[:2])
    fail(group, "w2", 2)  # late answers of a worker that left
    assert ejections(group, "w2") is None
    group.set_workers(MODEL, config.workers)
    assert candidates(group) == {"w0", "w1", "w2"}


def test_a_removed_workers_ejection_is_forgotten():
    config = replace(group_config("w", 3), outlier_consecutive_5xx=2)
    group = group_of(config)
    fail(group, "w1", 2)
    assert candidates(group) == {"w0", "w2"}
    group.set_workers(MODEL, [config.workers[0], config.workers[2]])
    group.set_workers(MODEL, config.workers)  # it comes back: a new worker, not an outlier
    assert candidates(group) == {"w0", "w1", "w2"}


# --- request ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "tracked"), [("same", "same"), ("", "req")])
def test_an_id_in_use_is_extended_with_a_counter(given: str, tracked: str):
    group = routers(2)
    ids = [group.commit_now(request(prompt(i)), given, None).request_id for i in range(3)]
    assert ids == [tracked, f"{tracked}@1", f"{tracked}@2"]
    assert all(group.tracked(rid) is not None for rid in ids)


def test_an_id_another_replica_routed_is_extended_too():
    group = routers(2)
    router = group.pools[MODEL].router
    router.add_request("r1", Worker("w0"), [], 160, 0)  # as replica sync tracks a remote decision
    assert group.commit_now(request(prompt(1)), "r1", None).request_id == "r1@1"


# --- lifecycle answers -----------------------------------------------------------------------------


def test_tracked_names_the_route_until_the_request_ends():
    group = routers(2)
    decision = group.commit_now(request(prompt(1)), "r1", None)
    routed = group.tracked("r1")
    assert routed is not None and (routed.request_id, routed.model) == ("r1", MODEL)
    assert routed.worker == decision.choice.worker and routed.prefill_worker is None
    group.finish("r1")
    assert group.tracked("r1") is None


def test_output_tokens_answer_whether_the_request_is_tracked():
    group = routers(2, router_track_output_blocks=True)
    worker = group.commit_now(request(prompt(1)), "r1", None).choice.worker
    group.first_token("r1")
    before = group.pools[MODEL].router.sequences.decode_blocks(worker)
    assert group.output_tokens("r1", 64, 1) is True
    assert group.pools[MODEL].router.sequences.decode_blocks(worker) > before
    group.finish("r1")
    assert group.output_tokens("r1", 64, 1) is False and group.output_tokens("never", 1, 1) is False


@pytest.mark.parametrize(
    ("call", "learns"),
    [
        (lambda g, rid: g.first_token(rid), True),
        (lambda g, rid: g.first_token(rid, at_first_token=True), True),
        (lambda g, rid: g.first_token(rid, at_first_token=False), False),
        (lambda g, rid: g.mark_prefill_complete(MODEL, rid), True),
        (lambda g, rid: g.mark_prefill_complete(MODEL, rid, at_first_token=True), True),
        (lambda g, rid: g.mark_prefill_complete(MODEL, rid, at_first_token=False), False),
    ],
    ids=["first-token", "first-token-at", "first-token-later", "complete", "complete-at", "complete-later"],
)
def test_only_a_first_token_teaches_the_pass_time(call: Callable[[LocalGroup, str], object], learns: bool):
    """A prompt's load ends either way; only a first token seen as it came times the prefill."""
    group = routers(2, prefill_load_model="timing", learn_prefill_timing=True)
    worker = group.commit_now(request(prompt(1)), "r1", None).choice.worker
    sequences = group.pools[MODEL].router.sequences
    call(group, "r1")
    assert sequences.prefill_tokens(worker) == 0
    assert (sequences.learned_pass_time(worker) is not None) is learns


# --- loads, capacity and probes --------------------------------------------------------------------


def test_the_group_load_counts_prompts_still_to_prefill():
    group = routers(2)
    group.commit_now(request(prompt(1)), "r1", None)
    assert group.probe_now(request(prompt(2))).load.active_prefill_tokens == 160
    group.first_token("r1")
    assert group.probe_now(request(prompt(2))).load.active_prefill_tokens == 0


def test_capacity_is_answered_for_the_allowed_workers_only():
    """With a queue threshold of 0, a worker with a prompt to prefill has no room for another."""
    group = routers(2, router_queue_threshold=0.0)
    group.commit_now(request(prompt(1)), "r1", Worker("w0"))
    on_w0, on_w1 = (
        request(prompt(2), restrictions=(endpoint(0),)),
        request(prompt(2), restrictions=(endpoint(1),)),
    )
    assert not group.has_capacity_now(on_w0) and group.has_capacity_now(on_w1)
    assert group.has_capacity_now(request(prompt(2)))
    assert not group.probe_now(on_w0).has_capacity and group.probe_now(on_w1).has_capacity


def test_a_probe_decides_with_the_requests_overrides():
    """The holder of the prompt's cache has twice the decode load: the overlap weight decides."""
    group = routers(2)
    holder = group.commit_now(request(prompt(1)), "r1", None).choice.worker
    group.commit_now(request(prompt(9)), "r9", holder)
    group.first_token("r1")
    group.first_token("r9")
    other = next(w for w in group.pools[MODEL].router.workers() if w != holder)

    def weighted(weight: float) -> GroupRequest:
        return request(prompt(1), overrides=RouterConfigOverride(overlap_score_weight=weight))

    assert group.probe_now(weighted(5.0)).choice.worker == holder
    assert group.probe_now(weighted(0.0)).choice.worker == other
    assert group.commit_now(weighted(0.0), "r2", None).choice.worker == other


async def test_the_async_calls_answer_as_the_direct_ones():
    group = routers(2)
    holder = group.commit_now(request(prompt(1)), "r1", None).choice.worker
    group.first_token("r1")
    other = next(w for w in group.pools[MODEL].router.workers() if w != holder)
    probe = await group.probe(request(prompt(1)), timeout_s=0.5)
    assert probe.choice.worker == holder
    loads = await group.potential_loads(request(prompt(1)))
    assert {w.worker: w.overlap_blocks for w in loads.workers} == {holder: 10, other: 0}
    assert await group.has_capacity(request(prompt(1)))
    pinned = await group.commit(request(prompt(1)), "r2", other)  # the caller's choice, though cold
    assert pinned.choice.worker == other and not pinned.redecided


@pytest.mark.parametrize(
    "call",
    [
        lambda g, r: g.probe_now(r),
        lambda g, r: g.commit_now(r, "r1", None),
        lambda g, r: g.has_capacity_now(r),
        lambda g, r: g.potential_loads_now(r),
        lambda g, r: g.set_workers(r.model, []),
    ],
    ids=["probe", "commit", "capacity", "loads", "set_workers"],
)
def test_an_unknown_model_is_named(call: Callable[[LocalGroup, GroupRequest], object]):
    with pytest.raises(UnknownModel, match="other-model") as raised:
        call(routers(1), GroupRequest("other-model", prompt(1)))
    assert raised.value.model == "other-model"


def test_the_default_weight_is_neutral():
    assert routers(1).weight == 1.0


# --- the worker set --------------------------------------------------------------------------------


def test_set_workers_returns_only_what_changed():
    config = group_config("w", 3)
    group = group_of(config)
    assert group.set_workers(MODEL, config.workers) == ([], [])
    moved = replace(config.workers[0], endpoint="127.0.7.7:8000")
    assert group.set_workers(MODEL, [moved, config.workers[1]]) == ([moved], ["w2"])


def test_a_worker_changed_in_place_keeps_its_requests():
    listener = RouteListener()
    config = group_config("w", 2)
    group = group_of(config, listener=listener)
    group.commit_now(request(prompt(1)), "r1", Worker("w0"))
    moved = replace(config.workers[0], endpoint="127.0.7.7:8000")
    group.set_workers(MODEL, [moved, config.workers[1]])
    assert group.tracked("r1") is not None and listener.freed() == []
    assert "r1" in group.pools[MODEL].router.sequences
    probe = group.probe_now(request(prompt(2), restrictions=(("127.0.7.7:8000",),)))
    assert probe.choice.worker == Worker("w0") and probe.choice.endpoint == "127.0.7.7:8000"
    assert group.finish("r1")


def test_a_removed_worker_forgets_its_requests_and_listeners_hear_them_freed():
    listener = RouteListener()
    config = group_config("w", 2)
    group = group_of(config, listener=listener)
    group.commit_now(request(prompt(1)), "r1", Worker("w0"))
    group.commit_now(request(prompt(2)), "r2", Worker("w1"))
    group.pools[MODEL].router.add_request("remote", Worker("w0"), [], 160, 0)  # another replica's
    routed = group.tracked("r1")
    assert group.set_workers(MODEL, [config.workers[1]]) == ([], ["w0"])
    assert listener.freed_routes == [routed]
    assert group.tracked("r1") is None and not group.finish("r1")
    assert group.tracked("r2") is not None and group.in_flight() == 1
    assert set(group.pools[MODEL].all_workers()) == {"w1"}
    with pytest.raises(NoEligibleWorker):  # its endpoint names no worker any more
        group.probe_now(request(prompt(3), restrictions=(endpoint(0),)))


@pytest.mark.parametrize("first_token", [False, True], ids=["failed-before-first-token", "complete"])
def test_a_disaggregated_requests_end_frees_both_workers(first_token: bool):
    listener = RouteListener()
    group = group_of(disagg_config(), listener=listener)
    decision = group.commit_now(request(prompt(1, LONG)), "r1", None)
    pool = group.pools[MODEL]
    assert decision.choice.prefill_worker is not None and not pool.prefill.is_idle()
    if first_token:
        group.first_token("r1")
    assert group.finish("r1") and not group.finish("r1")
    assert pool.prefill.is_idle() and pool.router.is_idle() and listener.freed() == ["r1"]


def test_a_removed_decode_worker_frees_its_requests_prefill_share():
    listener = RouteListener()
    config = disagg_config()
    group = group_of(config, listener=listener)
    decision = group.commit_now(request(prompt(1, LONG)), "r1", Worker("w0"))
    pool = group.pools[MODEL]
    assert decision.choice.prefill_worker is not None and not pool.prefill.is_idle()
    group.set_workers(MODEL, [w for w in config.workers if w.id != "w0"])
    assert pool.prefill.is_idle() and pool.router.is_idle()
    assert listener.freed() == ["r1"] and group.tracked("r1") is None


def test_a_removed_prefill_worker_leaves_its_requests_on_their_decode_worker():
    listener = RouteListener()
    config = disagg_config()
    group = group_of(config, listener=listener)
    decision = group.commit_now(request(prompt(1, LONG)), "r1", None)
    assert decision.choice.prefill_endpoint == "127.0.9.1:8000"
    pool = group.pools[MODEL]
    assert group.set_workers(MODEL, [w for w in config.workers if w.role != "prefill"]) == ([], ["p0"])
    assert not pool.disaggregated and pool.prefill_workers == {} and pool.prefill.is_idle()
    assert group.tracked("r1") is not None and listener.freed() == []
    assert pool.router.sequences.worker_of("r1") == decision.choice.worker
    assert group.commit_now(request(prompt(2, LONG)), "r2", None).choice.prefill_endpoint is None
    assert group.finish("r1") and listener.freed() == ["r1"]


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_an_added_worker_joins_its_roles_pool(role: str):
    config = disagg_config()
    group = group_of(config)
    pool = group.pools[MODEL]
    added = WorkerConfig("x9", "127.0.8.8:8000", MODEL, role=role)
    assert group.set_workers(MODEL, [*config.workers, added]) == ([added], [])
    assert (pool.workers if role == "decode" else pool.prefill_workers)["x9"] is added
    assert "x9" not in (pool.prefill_workers if role == "decode" else pool.workers)
    if role == "decode":
        probe = group.probe_now(request(prompt(1), restrictions=(("127.0.8.8:8000",),)))
        assert probe.choice.worker == Worker("x9") and probe.choice.endpoint == "127.0.8.8:8000"
    else:
        prefill_only = [w for w in config.workers if w.role != "prefill"] + [added]
        group.set_workers(MODEL, prefill_only)  # p0 leaves: x9 is the only prefill worker
        decision = group.commit_now(request(prompt(1, LONG)), "r1", None)
        assert decision.choice.prefill_endpoint == "127.0.8.8:8000"


def test_a_worker_moved_between_roles_leaves_its_old_router():
    config = group_config("w", 2)
    group = group_of(config)
    pool = group.pools[MODEL]
    promoted = replace(config.workers[1], role="prefill")
    assert group.set_workers(MODEL, [config.workers[0], promoted]) == ([promoted], [])
    assert [w.worker_id for w in pool.router.workers()] == ["w0"]
    assert [w.worker_id for w in pool.prefill.workers()] == ["w1"]
    assert set(pool.workers) == {"w0"} and set(pool.prefill_workers) == {"w1"}
