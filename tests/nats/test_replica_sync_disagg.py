"""Replica sync with disaggregated serving: two pickers over a real nats-server share the prompts
they send to prefill workers, not only the decode side's load.

Before, a replica published only the decode half of a request prefilled on a prefill worker, so
every other replica saw that prefill worker idle while it computed long prompts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio

from extproc.config import DisaggConfig, EventsConfig, WorkerConfig
from extproc.events.replica_wire import prefill_leg_id
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker

from ..picker_fixtures import MODEL, chat_body, picker_config
from .conftest import eventually
from .picker_pair import two_pickers

pytestmark = pytest.mark.asyncio

LONG = "the quick brown fox jumps over the lazy dog "  # x 40: about 1,800 byte-level tokens
P0, P1 = Worker("p0"), Worker("p1")


def config(nats_url: str, router_id: str):
    base = picker_config(2)  # Dynamo's cost: a prompt counts in full until its first token
    prefill = tuple(WorkerConfig(f"p{i}", f"127.0.9.{i + 1}:8000", MODEL, role="prefill") for i in range(2))
    decode = tuple(replace(w, role="decode") for w in base.workers)
    return replace(
        base,
        workers=decode + prefill,
        disagg=DisaggConfig(prefill_health_interval_s=0.0),
        port=0,
        health_port=0,
        events=EventsConfig(nats_url=nats_url, namespace="test", replica_sync=True, router_id=router_id),
    )


@pytest_asyncio.fixture
async def pickers(nats_server) -> AsyncIterator[tuple[EndpointPicker, EndpointPicker]]:
    configs = [config(nats_server.url, name) for name in ("a", "b")]
    async with two_pickers(configs, lambda a, i: pick(a, f"probe-{i}", f"probe {i} ")) as (a, b):
        yield a.picker, b.picker


async def pick(picker: EndpointPicker, request_id: str, text: str):
    return await picker.pick(
        body=chat_body(text * 40),
        path="/v1/chat/completions",
        headers={},
        subset=None,
        client_request_id=request_id,
    )


def prefill_tokens(picker: EndpointPicker) -> dict[Worker, int]:
    prefill = picker.pools[MODEL].prefill
    return {w: prefill.sequences.prefill_tokens(w) for w in (P0, P1)}


async def test_a_prompt_on_a_prefill_worker_counts_there_in_the_other_replica_until_its_first_token(pickers):
    a, b = pickers
    first = await pick(a, "r1", LONG)
    assert first.prefill_worker is not None
    on_a = prefill_tokens(a)
    assert on_a[first.prefill_worker] > 1000
    await eventually(lambda: prefill_tokens(b) == on_a, 5.0, lambda: f"b: {prefill_tokens(b)}, a: {on_a}")
    # the decode worker holds the request's blocks, not its prompt, in both views
    decode_b = b.pools[MODEL].router.sequences
    assert decode_b.prefill_tokens(first.worker) == 0 and decode_b.decode_blocks(first.worker) > 0

    # b's next long prompt goes to the prefill worker that is not busy with a's
    second = await pick(b, "r2", "a different prompt altogether ")
    assert second.prefill_worker is not None and second.prefill_worker != first.prefill_worker

    a.first_token(first)  # the prompt left its prefill worker
    await eventually(
        lambda: prefill_tokens(b)[first.prefill_worker] == 0, 5.0, "a's prompt gone from b's view"
    )
    assert b.pools[MODEL].router.sequences.decode_blocks(first.worker) > 0  # still decoding
    a.finish(first, "complete")
    b.finish(second, "complete")
    await eventually(lambda: a.is_idle() and b.is_idle(), 5.0, "both idle")


async def test_a_request_that_ends_before_its_first_token_leaves_no_prompt_on_the_other_replica(pickers):
    a, b = pickers
    failed = await pick(a, "r1", LONG)
    assert failed.prefill_worker is not None
    await eventually(lambda: prefill_tokens(b)[failed.prefill_worker] > 0, 5.0, "b sees the prompt")
    a.finish(failed, "upstream_status_503")
    await eventually(lambda: b.is_idle(), 5.0, lambda: f"b: {prefill_tokens(b)}")
    assert a.is_idle()


async def test_a_request_id_with_a_nul_cannot_pose_as_another_requests_prompt(pickers):
    a, b = pickers
    first = await pick(a, "r1", LONG)
    assert first.prefill_worker is not None
    # NUL never comes in a header, but the APIs may send it: this request must not replace r1's prompt
    clash = await pick(a, prefill_leg_id("r1"), "another long prompt ")
    await eventually(
        lambda: prefill_tokens(b) == prefill_tokens(a),
        5.0,
        lambda: f"{prefill_tokens(b)} vs {prefill_tokens(a)}",
    )
    a.finish(clash, "complete")
    a.first_token(first)
    a.finish(first, "complete")
    await eventually(lambda: b.is_idle(), 5.0, lambda: f"b: {prefill_tokens(b)}")
