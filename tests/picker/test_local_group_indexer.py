"""A local group that asks Dynamo 1.6.1's own KV indexer (`python -m dynamo.indexer`) for overlaps.

Worker w1's cache is told to the real indexer as vLLM-format ZMQ events (our publisher, whose bytes
tests/events/test_engine_fixtures.py checks against vLLM's); the group's decisions, potential loads
and queue estimate must then count what the indexer answers, ask it once per request, keep nothing
after the request is committed, and never ask for salted requests, unknown models or modes that
route without overlaps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from extproc.config import EventsConfig, PickerConfig
from extproc.devstack.dynamo_indexer import DynamoIndexer, start_dynamo_indexer
from extproc.errors import UnknownModel
from extproc.events.kv_indexer import KvIndexerClient, Registration
from extproc.events.vllm import WireBlockStored
from extproc.events.zmq_publisher import ZmqEventPublisher
from extproc.groups import GroupRequest
from extproc.picker import local_group as local_group_module
from extproc.picker.local_group import FETCHED_FOR_S, LocalGroup
from extproc.picker.pipeline import EndpointPicker
from extproc.request.parse import parse_openai_body
from extproc.router import Worker
from extproc.router.hashing import compute_block_hashes
from tests.groups.builders import BLOCK, MODEL, disagg_config, group_config, prompt, request
from tests.picker.test_pipeline_lifecycle import route
from tests.picker_fixtures import chat_body, picker_config
from tests.replica_helpers import until

in_module_loop = pytest.mark.asyncio(loop_scope="module")

CACHED = prompt(1)  # 10 blocks, all cached on w1 (the indexer knows)
W1 = Worker("w1")


@pytest.fixture(scope="module")
def indexer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoIndexer]:
    started = start_dynamo_indexer(tmp_path_factory.mktemp("group-indexer") / "indexer.log")
    yield started
    started.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def told(indexer: DynamoIndexer) -> AsyncIterator[str]:
    """The indexer holds CACHED's blocks on w1 (instance 1)."""
    publisher = ZmqEventPublisher(port=0, replay_port=0)
    await publisher.start()
    client = KvIndexerClient(indexer.url, timeout_s=2.0)
    client.instance_ids[1] = "w1"
    try:
        await tell(client, publisher, 1, CACHED, W1)
        yield indexer.url
    finally:
        await client.close()
        await publisher.stop()


async def tell(
    client: KvIndexerClient, publisher: ZmqEventPublisher, instance_id: int, tokens: list[int], worker: Worker
) -> None:
    """Register `publisher` as `instance_id` and publish `tokens`' blocks from it (again, until the
    indexer's listener has connected) until the indexer answers them all cached on `worker`."""
    await client.register(Registration(instance_id, 0, publisher.endpoint, MODEL, BLOCK))
    blocks = len(tokens) // BLOCK
    stored = [WireBlockStored([1000 * instance_id + i for i in range(blocks)], None, tokens, BLOCK)]
    hashes = compute_block_hashes(tokens, BLOCK)

    async def held() -> bool:
        publisher.publish(stored)
        return await client.overlaps(MODEL, BLOCK, hashes) == {worker: blocks}

    await until(held, 15.0, f"the indexer holds {worker}'s {blocks} blocks")


def asking(url: str, config: PickerConfig | None = None, **router) -> tuple[LocalGroup, KvIndexerClient]:
    """A local group over `config`'s pools (else workers w0..w2) asking the indexer at `url`, which
    names each worker by the number in its id (w1: instance 1, p0: instance 10, p1: 11)."""
    config = config or group_config("w", 3, use_kv_events=True, **router)
    picker = EndpointPicker(config)
    client = KvIndexerClient(url, timeout_s=2.0)
    client.instance_ids.update({0: "w0", 1: "w1", 2: "w2", 10: "p0", 11: "p1"})
    group = LocalGroup(
        "g", picker.pools, config=config, clock=time.monotonic, metrics=picker.metrics, listeners=[],
        kv_indexer=client,
    )  # fmt: skip
    return group, client


@in_module_loop
async def test_probe_commit_loads_and_the_queue_estimate_count_the_indexers_overlaps_asked_once(told):
    group, client = asking(told)
    try:
        assert not group.decides_now
        asked = request(CACHED + prompt(2, 32))  # 12 blocks, the first 10 cached on w1
        probe = await group.probe(asked)
        assert (probe.choice.worker, probe.choice.overlap_blocks, probe.choice.request_blocks) == (W1, 10, 12)
        assert group.uncached_tokens(asked) == 192 - 10 * BLOCK
        loads = await group.potential_loads(asked)
        overlaps = {w.worker: w.overlap_blocks for w in loads.workers}
        assert overlaps == {Worker("w0"): 0, W1: 10, Worker("w2"): 0}
        decision = await group.commit(asked, "r1", probe.choice.worker)
        assert (decision.choice.worker, decision.choice.overlap_blocks) == (W1, 10)
        assert client.counters["kv_indexer.query"] == 1  # the probe's answer served all four
        assert not group._found  # nothing held once the request is committed

        fresh = request(CACHED)
        decision = await group.commit(fresh, "r2", None)  # no probe: the commit asks
        assert (decision.choice.overlap_blocks, client.counters["kv_indexer.query"]) == (10, 2)
        assert group.pools[MODEL].router.sequences.worker_of("r2") == W1
    finally:
        await client.close()


@in_module_loop
async def test_without_an_answer_a_decision_goes_by_load_and_the_queue_counts_every_token(told):
    group, client = asking("http://127.0.0.1:9")  # nothing listens
    try:
        await group.commit(request(CACHED), "warm", None)  # what the router itself predicts: not used
        asked = request(CACHED)
        probe = await group.probe(asked)
        assert probe.choice.overlap_blocks == 0 and client.counters["kv_indexer.query_failed"] == 2
        assert group.uncached_tokens(asked) == 160
        untold = request(CACHED)  # never fetched (a synchronous caller): nothing known cached either
        assert group.probe_now(untold).choice.overlap_blocks == 0
        assert group.uncached_tokens(untold) == 160
    finally:
        await client.close()


@in_module_loop
async def test_salted_requests_unknown_models_and_modes_without_overlaps_ask_nothing(told):
    group, client = asking(told)
    round_robin, rr_client = asking(told, mode="round-robin")
    try:
        salted = request(CACHED, cache_salt="tenant-a")
        assert (await group.probe(salted)).choice.overlap_blocks == 0
        assert client.counters["kv_indexer.salted_by_load"] == 1
        await group.fetch_overlaps(GroupRequest("no-such-model", CACHED))  # the decision says 404, not this
        with pytest.raises(UnknownModel):
            await group.probe(GroupRequest("no-such-model", CACHED))
        await round_robin.probe(request(CACHED))
        assert client.counters["kv_indexer.query"] == rr_client.counters["kv_indexer.query"] == 0
    finally:
        await client.close()
        await rr_client.close()


@in_module_loop
async def test_answers_held_for_requests_never_committed_are_bounded(told, monkeypatch):
    monkeypatch.setattr(local_group_module, "MAX_FETCHED", 2)
    group, client = asking(told)
    try:
        probed = [request([*CACHED, i]) for i in range(3)]  # three probes another group won
        for r in probed:
            await group.probe(r)
        assert [held for held, _, _ in group._found.values()] == probed[1:]  # the oldest went
        await group.commit(probed[0], "r0", None)  # asked again: its answer was let go
        assert client.counters["kv_indexer.query"] == 4
    finally:
        await client.close()


def test_a_group_without_an_indexer_decides_at_once():
    picker = EndpointPicker(group_config("w", 2))
    assert picker.local.decides_now and picker.kv_indexer is None


@in_module_loop
async def test_an_answer_is_asked_again_once_it_is_older_than_a_decision_takes(told):
    """A probe and its commit share one answer; a request that waited in the admission queue is
    decided with a new one."""
    group, client = asking(told)
    now = [100.0]
    group._clock = lambda: now[0]
    try:
        asked = request(CACHED)
        await group.probe(asked)
        now[0] += FETCHED_FOR_S  # still the same decision
        await group.probe(asked)
        assert client.counters["kv_indexer.query"] == 1
        now[0] += 0.001
        decision = await group.commit(asked, "r1", None)
        assert client.counters["kv_indexer.query"] == 2 and decision.choice.overlap_blocks == 10
    finally:
        await client.close()


@in_module_loop
async def test_a_request_queued_under_wspt_is_estimated_with_the_indexers_answer(told, indexer):
    """The admission queue's shortest-first order counts a waiting request's uncached tokens: with
    an indexer, those the indexer does not know cached."""
    config = picker_config(1, router_queue_threshold=0.01, router_queue_policy="wspt", use_kv_events=True)
    config = dataclasses.replace(config, events=EventsConfig(kv_indexer_url=told))
    picker = EndpointPicker(config)
    assert picker.kv_indexer is not None
    picker.kv_indexer.instance_ids[5] = "w0"
    publisher = ZmqEventPublisher(port=0, replay_port=0)
    await publisher.start()
    try:
        body = chat_body("a long prompt the indexer knows of " * 8)
        parsed = parse_openai_body(body, "/v1/chat/completions", max_bytes=1 << 20)
        tokens = list(await picker.pools[MODEL].tokenizer.tokenize(parsed))
        cached = len(tokens) // BLOCK - 1  # all but the last full block
        await tell(picker.kv_indexer, publisher, 5, tokens[: cached * BLOCK], Worker("w0"))
        hog = await route(picker, body=chat_body("hog " * 100), rid="hog")  # in prefill: saturated
        waiting = asyncio.create_task(route(picker, body=body, rid="known"))
        gate = picker.gate(MODEL)
        await until(lambda: len(gate) == 1, 5.0, "the request never queued")
        (entry,) = gate.queue.in_order()
        assert entry.new_tokens == len(tokens) - cached * BLOCK
        picker.first_token(hog)
        assert (await waiting).endpoint == picker.pools[MODEL].endpoint_of(Worker("w0"))
    finally:
        await publisher.stop()
        await picker.close()


@in_module_loop
async def test_an_answer_asked_again_is_the_last_to_go(told, monkeypatch):
    monkeypatch.setattr(local_group_module, "MAX_FETCHED", 3)
    group, client = asking(told)
    now = [100.0]
    group._clock = lambda: now[0]
    a, b, c, d = (request([*CACHED, i]) for i in range(4))
    try:
        await group.probe(a)
        await group.probe(b)
        now[0] += 1.0
        await group.probe(a)  # asked again: now the newest
        await group.probe(c)
        await group.probe(d)  # one must go: b, the oldest answer
        assert [held for held, _, _ in group._found.values()] == [a, c, d]
    finally:
        await client.close()


@in_module_loop
async def test_a_disaggregated_model_chooses_both_workers_by_the_indexers_answer(told):
    """One answer names decode and prefill workers alike: the decode router reads its workers' part
    (a decode worker caching most of the prompt prefills it itself), the prefill router its own
    (the prefill worker caching the prompt's prefix prefills it)."""
    prefill = ("127.0.9.1:8000", "127.0.9.2:8000")
    config = disagg_config(2, prefill, disagg={"min_remote_prefill_tokens": 16}, use_kv_events=True)
    group, client = asking(told, config)
    on_p0, on_p1 = prompt(20), prompt(21)
    publishers = [ZmqEventPublisher(port=0, replay_port=0) for _ in range(2)]
    try:
        for publisher, instance, tokens, worker in zip(
            publishers, (10, 11), (on_p0, on_p1), (Worker("p0"), Worker("p1")), strict=True
        ):
            await publisher.start()
            await tell(client, publisher, instance, tokens, worker)
        for n, (tokens, prefill) in enumerate([(on_p1, "p1"), (on_p0, "p0"), (on_p1, "p1"), (on_p0, "p0")]):
            asked = request(tokens + prompt(30 + n, 320))  # 30 blocks, 10 cached on the prefill worker
            decision = await group.commit(asked, f"r{n}", None)
            routed = group.tracked(decision.request_id)
            assert routed is not None and routed.prefill_worker == Worker(prefill), (n, routed)
            assert routed.prefill_overlap_blocks == 10
            group.free(MODEL, decision.request_id)

        decision = await group.commit(request(CACHED + prompt(40, 32)), "local", None)  # 10 of 12 on w1
        routed = group.tracked(decision.request_id)
        assert routed is not None
        assert (routed.worker, routed.prefill_worker, routed.overlap_blocks) == (W1, None, 10)
        local = {"model": MODEL, "where": "local", "reason": "decode-cached"}
        assert group.metrics.registry.get_sample_value("extproc_disagg_decisions_total", local) == 1
        assert client.counters["kv_indexer.query"] >= 5 and client.counters["kv_indexer.query_failed"] == 0
    finally:
        await client.close()
        for publisher in publishers:
            await publisher.stop()
