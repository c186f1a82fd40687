"""The router-group gRPC API on a real server in this event loop, called through RemoteGroup."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from extproc.groups import (
    GroupRefused,
    GroupRouters,
    GroupTimeout,
    GroupUnreachable,
    RemoteGroup,
    RouterGroupServicer,
    start_group_api,
)
from extproc.groups._generated import router_group_pb2 as pb
from extproc.groups._generated import router_group_pb2_grpc as pb_grpc
from extproc.groups.errors import ALL_BUSY, NO_WORKERS, UNKNOWN_MODEL
from extproc.groups.types import GroupRequest
from extproc.picker.pipeline import EndpointPicker

from .builders import MODEL, group_config, loads, prompt, request


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[EndpointPicker, GroupRouters, RemoteGroup]]:
    picker = EndpointPicker(group_config("w", 3, active_prefill_tokens_threshold=1000))
    routers = GroupRouters("g", picker.pools)
    api = await start_group_api(routers, "127.0.0.1", 0)
    remote = RemoteGroup("g", f"127.0.0.1:{api.port}")
    try:
        yield picker, routers, remote
    finally:
        await remote.close()
        await api.stop(0)


async def test_probe_over_the_wire_answers_as_the_routers_do_and_changes_nothing(served):
    _, routers, remote = served
    warm = await remote.commit(
        request(prompt(1)), "warm", await remote.probe(request(prompt(1)), timeout_s=1)
    )
    await remote.mark_prefill_complete(MODEL, warm.request_id)
    before = loads(routers, prompt(1) + prompt(2))
    probe = await remote.probe(request(prompt(1) + prompt(2)), timeout_s=1)
    assert probe.group == "g" and probe.latency_s > 0
    assert probe.choice == routers.probe(request(prompt(1) + prompt(2))).choice
    assert (probe.choice.worker, probe.choice.overlap_blocks, probe.choice.request_blocks) == (
        warm.choice.worker,
        10,
        20,
    )
    assert probe.load.active_requests == 1 and probe.block_size == 16
    assert loads(routers, prompt(1) + prompt(2)) == before


async def test_commit_and_lifecycle_over_the_wire(served):
    picker, _, remote = served
    probe = await remote.probe(request(prompt(1)), timeout_s=1)
    decision = await remote.commit(request(prompt(1)), "r1", probe)
    assert decision.choice.worker == probe.choice.worker and decision.request_id == "r1"
    router = picker.pools[MODEL].router
    assert router.sequences.worker_of("r1") == probe.choice.worker
    assert router.sequences.prefill_tokens(probe.choice.worker) == 160
    assert await remote.mark_prefill_complete(MODEL, "r1")
    assert router.sequences.prefill_tokens(probe.choice.worker) == 0
    assert await remote.free(MODEL, "r1") and not await remote.free(MODEL, "r1")
    assert picker.is_idle()


async def test_commit_redecides_over_the_wire_when_the_probed_worker_left(served):
    picker, _, remote = served
    probe = await remote.probe(request(prompt(1)), timeout_s=1)
    gone = str(probe.choice.worker.worker_id)
    picker.set_workers(MODEL, [w for w in picker.config.workers if w.id != gone])
    decision = await remote.commit(request(prompt(1)), "r1", probe)
    assert decision.redecided and str(decision.choice.worker.worker_id) != gone
    assert decision.choice.endpoint == picker.pools[MODEL].endpoint_of(decision.choice.worker)


async def test_potential_loads_over_the_wire(served):
    _, routers, remote = served
    await remote.commit(request(prompt(1)), "r1", await remote.probe(request(prompt(1)), timeout_s=1))
    answer = await remote.potential_loads(request(prompt(1)))
    assert [(w.worker, w.prefill_tokens, w.decode_blocks, w.overlap_blocks) for w in answer.workers] == loads(
        routers, prompt(1)
    )
    assert {w.endpoint for w in answer.workers} == {"127.0.1.1:8000", "127.0.1.2:8000", "127.0.1.3:8000"}
    assert answer.load.active_requests == 1


@pytest.mark.parametrize(
    "request_, reason",
    [
        (GroupRequest("other-model", [1, 2, 3]), UNKNOWN_MODEL),
        (request(prompt(1), restrictions=(("10.9.9.9",),)), NO_WORKERS),
    ],
)
async def test_refusals_carry_their_reason(served, request_, reason):
    _, _, remote = served
    with pytest.raises(GroupRefused) as caught:
        await remote.probe(request_, timeout_s=1)
    assert caught.value.reason == reason and caught.value.group == "g"


async def test_a_saturated_group_refuses_as_busy(served):
    _, _, remote = served
    for i in range(3):  # 3 x 1600 tokens: every worker over its 1000-token prefill threshold
        await remote.commit(
            request(prompt(i, 1600)), f"r{i}", await remote.probe(request(prompt(i)), timeout_s=1)
        )
    with pytest.raises(GroupRefused) as caught:
        await remote.probe(request(prompt(5)), timeout_s=1)
    assert caught.value.reason == ALL_BUSY


async def test_undecodable_requests_get_invalid_argument(served):
    _, _, remote = served
    stub = remote._stub
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Probe(
            pb.ProbeRequest(request=pb.RoutingRequest(model=MODEL, token_ids=b"\x01\x02")), timeout=1
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_million_token_prompt_passes(served):
    _, _, remote = served
    probe = await remote.probe(request(list(range(1_100_000))), timeout_s=5)  # 4.4 MB of token ids
    assert probe.choice.request_blocks == 1_100_000 // 16


class _HeldServicer(RouterGroupServicer):
    """Answers probes only when released: a slow group."""

    def __init__(self, routers: GroupRouters) -> None:
        super().__init__(routers)
        self.release = asyncio.Event()

    async def Probe(self, request, context):
        await self.release.wait()
        return await super().Probe(request, context)


async def test_a_slow_group_times_out():
    routers = GroupRouters("slow", EndpointPicker(group_config("w", 1)).pools)
    server = grpc.aio.server()
    servicer = _HeldServicer(routers)
    pb_grpc.add_RouterGroupServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    remote = RemoteGroup("slow", f"127.0.0.1:{port}")
    try:
        with pytest.raises(GroupTimeout, match="50 ms"):
            await remote.probe(request(prompt(1)), timeout_s=0.05)
        servicer.release.set()
        assert (await remote.probe(request(prompt(1)), timeout_s=1)).choice.request_blocks == 10
    finally:
        await remote.close()
        await server.stop(0)


async def test_an_unreachable_group_fails_at_once(refusing_port):
    remote = RemoteGroup("gone", f"127.0.0.1:{refusing_port()}")
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(GroupUnreachable, match="UNAVAILABLE"):
            await remote.probe(request(prompt(1)), timeout_s=2)
        assert loop.time() - start < 1.0
        with pytest.raises(GroupUnreachable):
            await remote.free(MODEL, "r1")
    finally:
        await remote.close()
