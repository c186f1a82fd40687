"""The router-group gRPC API on a real server in this event loop, called through RemoteGroup."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from extproc.groups import (
    GroupRefused,
    GroupTimeout,
    GroupUnreachable,
    RemoteGroup,
    RouterGroupServicer,
    start_group_api,
)
from extproc.groups._generated import router_group_pb2 as pb
from extproc.groups._generated import router_group_pb2_grpc as pb_grpc
from extproc.groups.codec import encode_request
from extproc.groups.errors import ALL_BUSY, NO_WORKERS, UNKNOWN_MODEL
from extproc.groups.types import GroupRequest
from extproc.picker.local_group import LocalGroup
from extproc.picker.pipeline import EndpointPicker

from .builders import MODEL, group_config, loads, prompt, request


@contextlib.asynccontextmanager
async def served_by(local: LocalGroup, **api_kwargs) -> AsyncIterator[RemoteGroup]:
    """`local`'s group API on a free port and a RemoteGroup calling it; both closed after, the server
    also when the client could not be made or closed (no server is left running)."""
    api = await start_group_api(local, "127.0.0.1", 0, **api_kwargs)
    try:
        remote = RemoteGroup("g", f"127.0.0.1:{api.port}")
        try:
            yield remote
        finally:
            await remote.close()
    finally:
        await api.stop(0)


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[EndpointPicker, LocalGroup, RemoteGroup]]:
    picker = EndpointPicker(group_config("w", 3, active_prefill_tokens_threshold=1000))
    async with served_by(picker.local) as remote:
        yield picker, picker.local, remote


async def test_probe_over_the_wire_answers_as_the_routers_do_and_changes_nothing(served):
    _, routers, remote = served
    probed = await remote.probe(request(prompt(1)), timeout_s=1)
    warm = await remote.commit(request(prompt(1)), "warm", probed.choice.worker)
    remote.mark_prefill_complete(MODEL, warm.request_id)
    await remote.drain()
    before = loads(routers, prompt(1) + prompt(2))
    probe = await remote.probe(request(prompt(1) + prompt(2)), timeout_s=1)
    assert probe.group == "g" and probe.latency_s > 0
    assert probe.choice == routers.probe_now(request(prompt(1) + prompt(2))).choice
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
    decision = await remote.commit(request(prompt(1)), "r1", probe.choice.worker)
    assert decision.choice.worker == probe.choice.worker and decision.request_id == "r1"
    router = picker.pools[MODEL].router
    assert router.sequences.worker_of("r1") == probe.choice.worker
    assert router.sequences.prefill_tokens(probe.choice.worker) == 160
    remote.mark_prefill_complete(MODEL, "r1")
    await remote.drain()
    assert router.sequences.prefill_tokens(probe.choice.worker) == 0
    remote.free(MODEL, "r1")
    remote.free(MODEL, "r1")  # idempotent
    await remote.drain()
    assert picker.is_idle() and picker.local.in_flight() == 0


async def test_a_remote_groups_predicted_time_to_first_token_reaches_the_picker_that_committed() -> None:
    """Its router's timing model predicted it when it chose; the committing picker observes it beside
    the measured one (`inference_objective_request_predicted_ttft_seconds`)."""
    picker = EndpointPicker(group_config("w", 2, prefill_load_model="timing"))
    async with served_by(picker.local) as remote:
        probe = await remote.probe(request(prompt(1)), timeout_s=1)
        decision = await remote.commit(request(prompt(1)), "r1", probe.choice.worker)
        predicted = picker.pools[MODEL].router.sequences.predicted_ttft_ms("r1")
        assert predicted is not None and decision.choice.predicted_ttft_ms == predicted
        assert probe.choice.predicted_ttft_ms is None  # a probe adds nothing, so predicts nothing kept
        remote.free(MODEL, "r1")
        await remote.drain()


async def test_a_prefill_complete_after_the_first_token_crosses_the_wire():
    """A non-streamed answer's end (`at_first_token=False`) ends the prompt's load in the remote group
    and teaches its pass-time model (the default timing model, learning) nothing; a first token does."""
    picker = EndpointPicker(group_config("w", 2, prefill_load_model="timing", learn_prefill_timing=True))
    async with served_by(picker.local) as remote:
        router = picker.pools[MODEL].router
        whole = await remote.commit(request(prompt(1)), "whole", None)
        worker = whole.choice.worker
        assert router.sequences.prefill_tokens(worker) > 0
        remote.mark_prefill_complete(MODEL, "whole", at_first_token=False)
        await remote.drain()
        assert router.sequences.prefill_tokens(worker) == 0
        assert router.sequences.learned_pass_time(worker) is None
        remote.free(MODEL, "whole")
        await remote.commit(request(prompt(1)), "streamed", worker)
        remote.mark_prefill_complete(MODEL, "streamed")
        await remote.drain()
        assert router.sequences.learned_pass_time(worker) is not None


async def test_commit_redecides_over_the_wire_when_the_probed_worker_left(served):
    picker, _, remote = served
    probe = await remote.probe(request(prompt(1)), timeout_s=1)
    gone = str(probe.choice.worker.worker_id)
    picker.set_workers(MODEL, [w for w in picker.config.workers if w.id != gone])
    decision = await remote.commit(request(prompt(1)), "r1", probe.choice.worker)
    assert decision.redecided and str(decision.choice.worker.worker_id) != gone
    assert decision.choice.endpoint == picker.pools[MODEL].endpoint_of(decision.choice.worker)


async def test_potential_loads_over_the_wire(served):
    _, routers, remote = served
    await remote.commit(request(prompt(1)), "r1", None)
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
        await remote.commit(request(prompt(i, 1600)), f"r{i}", None)
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

    def __init__(self, group: LocalGroup) -> None:
        super().__init__(group)
        self.release = asyncio.Event()

    async def Probe(self, request, context):
        await self.release.wait()
        return await super().Probe(request, context)


async def test_a_slow_group_times_out():
    server = grpc.aio.server()
    servicer = _HeldServicer(EndpointPicker(group_config("w", 1)).local)
    pb_grpc.add_RouterGroupServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        remote = RemoteGroup("slow", f"127.0.0.1:{port}")
        try:
            with pytest.raises(GroupTimeout, match="50 ms"):
                await remote.probe(request(prompt(1)), timeout_s=0.05)
            servicer.release.set()
            assert (await remote.probe(request(prompt(1)), timeout_s=1)).choice.request_blocks == 10
        finally:
            await remote.close()
    finally:
        await server.stop(0)


async def test_an_unreachable_group_fails_at_once(refusing_port):
    failed: list[tuple[str, str]] = []
    remote = RemoteGroup(
        "gone", f"127.0.0.1:{refusing_port()}", retries=3, retry_base_s=0.01,
        on_lifecycle_failure=lambda *call: failed.append(call),
    )  # fmt: skip
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(GroupUnreachable, match="UNAVAILABLE"):
            await remote.probe(request(prompt(1)), timeout_s=2)
        assert loop.time() - start < 1.0
        remote.free(MODEL, "r1")  # never raises: retried in the background, then left to a renewal
        await remote.drain()
        assert failed == [("gone", "free")] * 3
    finally:
        await remote.close()


async def until(condition, what: str, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)


async def test_an_owner_that_stops_renewing_has_its_requests_freed_when_the_lease_runs_out(served):
    """A top-level picker that dies mid-stream never frees: the group does it when its lease ends."""
    picker, group, remote = served
    stub = remote._stub
    for i in range(3):
        commit = pb.CommitRequest(
            request=encode_request(request(prompt(i))), request_id=f"d{i}", owner="dead", owner_seq=i + 1,
            lease_s=0.3,
        )  # fmt: skip
        await stub.Commit(commit, timeout=1)
    live = await remote.commit(request(prompt(9)), "live", None)  # another owner, renewing
    assert group.in_flight() == 4
    await until(lambda: group.in_flight() == 1, "the dead owner's lease ran out")
    assert group.tracked(live.request_id) is not None
    remote.free(MODEL, live.request_id)
    await remote.drain()
    assert picker.is_idle()


async def test_a_renewal_frees_what_its_owner_no_longer_holds_but_not_what_it_is_committing(served):
    """A Free that never arrived (the group was paused when the stream ended) is settled by the
    owner's next renewal; a commit still on its way is not."""
    picker, group, remote = served
    kept = await remote.commit(request(prompt(1)), "kept", None)
    lost = await remote.commit(request(prompt(2)), "lost", None)
    remote._live.pop(lost.request_id)  # its stream ended and the Free was lost
    remote._committing.add(remote._seq + 1)  # a commit sent and not yet answered
    stub = remote._stub
    pending = pb.CommitRequest(
        request=encode_request(request(prompt(3))), request_id="pending", owner=remote.owner,
        owner_seq=remote._seq + 1, lease_s=remote.lease_s,
    )  # fmt: skip
    await stub.Commit(pending, timeout=1)  # it arrived; its answer has not reached the owner yet
    assert await remote.renew() == 1
    assert group.tracked(lost.request_id) is None
    assert group.tracked(kept.request_id) is not None and group.tracked("pending") is not None
    remote._committing.clear()
    remote._live["pending"] = remote._seq = remote._seq + 1
    remote.free(MODEL, kept.request_id)
    remote.free(MODEL, "pending")
    await remote.drain()
    assert picker.is_idle()


async def test_renewals_keep_an_owners_requests_alive_past_the_lease(served):
    picker, group, _ = served
    short = RemoteGroup("g", f"127.0.0.1:{served_port(served)}", lease_s=0.3)
    try:
        decision = await short.commit(request(prompt(1)), "r1", None)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await until(lambda: loop.time() - start > 1.0, "three leases passed")  # deliberately past the lease
        assert group.tracked(decision.request_id) is not None
        short.free(MODEL, decision.request_id)
        await short.drain()
        assert picker.is_idle()
    finally:
        await short.close()


def served_port(served) -> int:
    return int(served[2].address.rsplit(":", 1)[1])


async def test_probes_and_commits_first_hear_what_the_serving_picker_must_hear_before_deciding():
    """A replica serving its routers as a group catches up on replica sync before a remote
    caller's probe or commit, as before its own decisions (EndpointPicker.hear_before_deciding)."""
    picker = EndpointPicker(group_config("w", 3))
    heard: list[int] = []

    async def before() -> None:
        heard.append(picker.local.in_flight())

    picker.before_decision = before
    async with served_by(picker.local, before_decision=picker.hear_before_deciding) as remote:
        probed = await remote.probe(request(prompt(1)), timeout_s=1)
        await remote.commit(request(prompt(1)), "r1", probed.choice.worker)
        await remote.probe(request(prompt(2)), timeout_s=1)
        assert heard == [0, 0, 1]  # before each decision, the commit's own request not yet counted
