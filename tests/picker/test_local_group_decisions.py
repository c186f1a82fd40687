"""LocalGroup decisions in detail: what a commit passes to the router and returns, the prefill
worker named for disaggregated models, what listeners hear, uncached tokens and potential loads."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from extproc.picker.local_group import LocalGroup, Routed, group_load
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfigOverride, Worker
from tests.groups.builders import MODEL, RouteListener, disagg_config, prompt, request

from .test_local_group import routers

HEADER = "x-prefill-endpoint"
IGNORE_CACHE = RouterConfigOverride(overlap_score_weight=0)
ENDPOINTS = tuple(f"127.0.5.{i + 1}:8000" for i in range(3))  # of w0..w2 with subnet=5


def disagg_group(n_decode: int = 1, n_prefill: int = 2, **router) -> LocalGroup:
    """Decode workers `w0..` (as `routers`) and prefill workers `p0..` at 127.0.9.<i+1>:8000; a
    prompt goes to a prefill worker from 64 uncached tokens on; no health probes."""
    endpoints = tuple(f"127.0.9.{i + 1}:8000" for i in range(n_prefill))
    config = disagg_config(n_decode, endpoints, disagg={"min_remote_prefill_tokens": 64}, **router)
    picker = EndpointPicker(config)
    return LocalGroup(
        "g", picker.pools, config=config, clock=time.monotonic, metrics=picker.metrics, listeners=[]
    )


GROUPS = pytest.mark.parametrize("make", [routers, disagg_group], ids=["aggregated", "disaggregated"])


def decisions(group: LocalGroup, model: str = MODEL) -> Callable[[str, str], float | None]:
    """The disaggregation decisions counter of `group`, by where and reason."""
    registry = group.metrics.registry
    return lambda where, reason: registry.get_sample_value(
        "extproc_disagg_decisions_total", {"model": model, "where": where, "reason": reason}
    )


def cached_on_one_loaded_worker(group: LocalGroup) -> Worker:
    """prompt(1) cached on one worker that also decodes a 5-block request; returns that worker."""
    holder = group.commit_now(request(prompt(1)), "warm", None).choice.worker
    group.first_token("warm")
    group.finish("warm")
    assert group.commit_now(request(prompt(5, 80)), "load", holder).choice.worker == holder
    group.first_token("load")
    return holder


# --- commits -------------------------------------------------------------------------------------


@GROUPS
def test_a_commit_keeps_to_the_endpoint_restrictions(make: Callable[..., LocalGroup]):
    group = make(3, subnet=5)
    only = ((ENDPOINTS[1], ENDPOINTS[2]), (ENDPOINTS[2],))
    for i in range(5):
        decision = group.commit_now(request(prompt(i), restrictions=only), f"r{i}", None)
        assert decision.choice.worker == Worker("w2")
        assert group.tracked(f"r{i}").worker == Worker("w2")


@GROUPS
def test_a_commit_follows_the_requests_router_overrides(make: Callable[..., LocalGroup]):
    group = make(2)
    holder = cached_on_one_loaded_worker(group)
    assert group.commit_now(request(prompt(1)), "cached", None).choice.worker == holder
    group.finish("cached")
    ignoring = group.commit_now(request(prompt(1), overrides=IGNORE_CACHE), "blind", None).choice
    assert ignoring.worker != holder  # on load alone, the other worker is the lighter
    assert (ignoring.overlap_blocks, ignoring.best_overlap_blocks) == (0, 0)


@GROUPS
def test_a_preferred_worker_takes_the_request_when_eligible(make: Callable[..., LocalGroup]):
    group = make(2)
    holder = cached_on_one_loaded_worker(group)
    other = Worker("w1" if holder == Worker("w0") else "w0")
    decision = group.commit_now(request(prompt(1)), "sticky", other)  # a session's or a probe's
    assert decision.choice.worker == other and not decision.redecided
    assert group.pools[MODEL].router.sequences.worker_of("sticky") == other


@GROUPS
@pytest.mark.parametrize(("expected", "decode_blocks"), [(None, 12.0), (64, 11.0)])
def test_expected_output_tokens_reach_the_decode_router(
    make: Callable[..., LocalGroup], expected: int | None, decode_blocks: float
):
    # 160 prompt tokens + 32 generated: 2 output blocks, half-way to 64 expected ones
    group = make(1, router_track_output_blocks=True)
    decision = group.commit_now(request(prompt(1), expected_output_tokens=expected), "r1", None)
    group.first_token("r1")
    group.add_output_tokens(MODEL, "r1", 32, 1)
    assert group.pools[MODEL].router.sequences.decode_blocks(decision.choice.worker) == decode_blocks


def test_an_aggregated_request_is_heard_without_a_prefill_worker():
    group = routers(2)
    heard = RouteListener()
    group.listeners.append(heard)
    decision = group.commit_now(request(prompt(1)), "r1", None)
    routed = Routed("r1", MODEL, decision.choice.worker, 0)  # no prefill worker, nothing cached there
    assert group.tracked("r1") == routed and heard.routed[0][0] == routed


def test_a_request_id_with_a_nul_is_tracked_without_it():
    """Replica sync shares a prompt on its prefill worker as the id, NUL, "prefill": no tracked id
    may take that form."""
    group = routers(2)
    decision = group.commit_now(request(prompt(1)), "r1\x00prefill", None)
    assert decision.request_id == "r1\ufffdprefill" and group.tracked("r1\ufffdprefill") is not None


def test_a_decision_reports_its_hash_match_and_select_times():
    group = routers(2)
    before = time.perf_counter_ns()
    decision = group.commit_now(request(prompt(1)), "r1", None)
    elapsed = time.perf_counter_ns() - before
    assert set(decision.timings_ns) == {"hash", "match", "select"}
    assert all(0 <= ns <= elapsed for ns in decision.timings_ns.values())
    assert sum(decision.timings_ns.values()) <= elapsed


# --- disaggregated models ------------------------------------------------------------------------


def test_a_remote_prefill_is_named_in_the_choice_tracked_and_heard():
    group = disagg_group(1, 2)
    heard = RouteListener()
    group.listeners.append(heard)
    first = group.commit_now(request(prompt(1)), "r0", None)
    group.first_token("r0")
    group.finish("r0")
    prefiller = first.choice.prefill_worker
    endpoint = "127.0.9.1:8000" if prefiller == Worker("p0") else "127.0.9.2:8000"
    assert first.choice.headers == {HEADER: endpoint} == {HEADER: first.choice.prefill_endpoint}

    long = request(prompt(1) + prompt(2), expected_output_tokens=64)  # half cached on the decode worker
    probe = group.probe_now(long)
    decision = group.commit_now(long, "r1", None)
    assert decision.choice == replace(
        probe.choice, headers={HEADER: endpoint}, prefill_worker=prefiller, prefill_endpoint=endpoint
    )  # the decode worker's choice, with the prefill worker that caches the first half
    routed = Routed("r1", MODEL, Worker("w0"), 10, prefiller, 10)  # the prefill worker caches 10 blocks too
    assert group.tracked("r1") == routed
    hashes = group.pools[MODEL].router.block_hashes(prompt(1) + prompt(2))
    assert heard.routed[-1] == (routed, hashes, 320, 64)
    assert [p.request_id for p in heard.prefilled] == ["r0"]  # r1's prompt is on its prefill worker
    group.first_token("r1")
    assert heard.prefilled[-1] == routed  # now it has left the prefill worker
    assert decisions(group)("remote", "") == 2


@GROUPS
def test_a_commit_carries_the_time_to_first_token_its_router_predicted(make: Callable[..., LocalGroup]):
    timed = make(prefill_load_model="timing")
    decision = timed.commit_now(request(prompt(1) + prompt(2)), "r1", None)
    predicted = timed.pools[MODEL].router.sequences.predicted_ttft_ms("r1")
    assert predicted is not None and decision.choice.predicted_ttft_ms == predicted
    assert timed.probe_now(request(prompt(3))).choice.predicted_ttft_ms is None  # a probe adds nothing
    static = make()  # Dynamo's block count predicts no time
    assert static.commit_now(request(prompt(1)), "r1", None).choice.predicted_ttft_ms is None


def test_a_short_uncached_prompt_is_prefilled_on_its_decode_worker():
    group = disagg_group(1, 2)
    heard = RouteListener()
    group.listeners.append(heard)
    decision = group.commit_now(request(prompt(1, 48)), "short", None)
    assert decision.choice.headers == {} and decision.choice.prefill_worker is None
    assert heard.routed[0][0] == Routed("short", MODEL, Worker("w0"), 0, None) and heard.prefilled == []
    assert decisions(group)("local", "short-uncached") == 1 and decisions(group)("remote", "") is None


@pytest.mark.parametrize(
    ("unhealthy", "named"),
    [({"p0"}, "p1"), ({"p1"}, "p0"), ({"p0", "p1"}, None)],
    ids=["p0-down", "p1-down", "both-down"],  # not str(): a set's order changes with the hash seed
)
def test_only_healthy_prefill_workers_are_named(unhealthy: set[str], named: str | None):
    group = disagg_group(1, 2)
    group.prefill_health.unhealthy.update(unhealthy)
    for i in range(4):
        choice = group.commit_now(request(prompt(i)), f"r{i}", None).choice
        assert choice.prefill_worker == (Worker(named) if named else None)
        assert (HEADER in choice.headers) == (named is not None)
    if named is None:  # prefilled on the decode worker instead
        assert decisions(group)("local", "no-prefill-worker") == 4


# --- uncached tokens and potential loads ---------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "kwargs", "uncached"),
    [
        (prompt(3), {}, 160),  # nothing cached
        (prompt(1) + prompt(2), {}, 160),  # the first half cached
        (prompt(1)[:40], {}, 8),  # 2 whole blocks cached
        (prompt(1), {}, 1),  # all cached: never 0
        ([], {}, 1),
        (prompt(1), {"lora_name": "other"}, 160),  # another adapter's blocks
        (prompt(1), {"cache_salt": "tenant"}, 160),
        (prompt(1), {"isl": 4000}, 4000),  # routed on load: its token ids are not looked up
    ],
)
def test_uncached_tokens_are_the_prompt_minus_its_best_cached_prefix(
    tokens: list[int], kwargs: dict, uncached: int
):
    group = routers(2)
    group.commit_now(request(prompt(1)), "warm", None)
    group.first_token("warm")
    group.commit_now(request(prompt(1), lora_name="adapter"), "lora", None)
    group.first_token("lora")
    assert group.uncached_tokens(request(tokens, **kwargs)) == uncached
    assert group.uncached_tokens(request(prompt(1), lora_name="adapter")) == 1


def test_a_load_only_commit_ignores_its_token_ids():
    group = routers(2)
    group.commit_now(request(prompt(1)), "warm", None)
    group.first_token("warm")
    decision = group.commit_now(request(prompt(1), isl=4000), "r1", None)
    assert (decision.choice.overlap_blocks, decision.choice.request_blocks) == (0, 0)


@pytest.mark.parametrize(
    ("kwargs", "listed", "overlap"),
    [
        ({"lora_name": "adapter"}, {"w0", "w1", "w2"}, 10),
        ({}, {"w0", "w1", "w2"}, 0),  # not the adapter's blocks
        ({"lora_name": "adapter", "overrides": IGNORE_CACHE}, {"w0", "w1", "w2"}, 0),
        ({"lora_name": "adapter", "restrictions": ((ENDPOINTS[1], ENDPOINTS[2]),)}, {"w1", "w2"}, None),
    ],
)
def test_potential_loads_per_allowed_worker(kwargs: dict, listed: set[str], overlap: int | None):
    group = routers(3, subnet=5)
    router = group.pools[MODEL].router
    holder = group.commit_now(request(prompt(1), lora_name="adapter"), "warm", Worker("w0")).choice.worker
    group.first_token("warm")
    loads = group.potential_loads_now(request(prompt(1), **kwargs))
    assert (loads.group, loads.block_size, loads.load) == ("g", 16, group_load(router))
    assert loads.load.active_requests == 1
    by_worker = {str(w.worker): w for w in loads.workers}
    assert set(by_worker) == listed
    for wid, load in by_worker.items():
        held = wid == str(holder)
        assert load.worker == Worker(wid)
        assert load.endpoint == ENDPOINTS[int(wid[1:])]
        assert load.prefill_tokens == 160 - 16 * (overlap if held else 0)
        shared = held and "lora_name" in kwargs  # the warm request's blocks, when the same adapter's
        assert load.decode_blocks == (10 if shared else 20 if held else 10)
        assert load.overlap_blocks == (overlap if held else 0)
