"""RemoteGroup's less travelled paths against the real group API server, whose servicer records every
message it receives and can hold or refuse a call: what each call carries (the model, the owner's
sequence and lease, the worker's status with its free), output tokens coalesced and clamped, a group
that does not serve them, retries and their pauses, renewals and what they settle, gRPC codes read
as the selector's reasons, and the order of a request's lifecycle calls.

Pauses between attempts and renewals go through the group's `sleep`, which the tests record (and
shorten): nothing here waits for a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from extproc.groups import RemoteGroup
from extproc.groups._generated import router_group_pb2_grpc as pb_grpc
from extproc.groups.errors import GroupRefused, GroupTimeout, GroupUnreachable
from extproc.groups.remote import DEFAULT_LEASE_S, RETRIES, RETRY_BASE_S
from extproc.groups.servicer import RouterGroupServicer
from extproc.picker.pipeline import EndpointPicker
from tests.replica_helpers import until

from .builders import MODEL, group_config, prompt, request

CALLS = ("Probe", "Commit", "MarkPrefillComplete", "Free", "AddOutputTokens", "PotentialLoads", "Renew")


class Recorder(RouterGroupServicer):
    """The real servicer, recording each message as it arrives (and when each call ends); a call can be
    held until an event is set, or refused with status codes, one per call, in order."""

    def __init__(self, group) -> None:
        super().__init__(group)
        self.received: list[tuple[str, object]] = []
        self.ended: list[str] = []
        self.holds: dict[str, asyncio.Event] = {}
        self.refusals: dict[str, list[tuple[grpc.StatusCode, str]]] = {}

    def __getattribute__(self, name: str):
        if name in CALLS:
            real = super().__getattribute__(name)

            async def recorded(message, context):
                self.received.append((name, message))
                hold = self.holds.get(name)
                if hold is not None:
                    await hold.wait()
                refusals = self.refusals.get(name)
                if refusals:
                    code, details = refusals.pop(0)
                    await context.abort(code, details)
                try:
                    return await real(message, context)
                finally:
                    self.ended.append(name)

            return recorded
        return super().__getattribute__(name)

    def messages(self, name: str) -> list:
        return [message for call, message in self.received if call == name]


class Sleeps:
    """A group's `sleep`: records each pause and yields once."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def recorded(**remote) -> AsyncIterator[tuple[Recorder, RemoteGroup, EndpointPicker]]:
    """A picker's group API on a free port, served by a `Recorder`, and a RemoteGroup "g" calling it."""
    picker = EndpointPicker(group_config("w", 2))
    servicer = Recorder(picker.local)
    server = grpc.aio.server()
    pb_grpc.add_RouterGroupServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        group = RemoteGroup("g", f"127.0.0.1:{port}", **remote)
        try:
            yield servicer, group, picker
        finally:
            await group.close()
    finally:
        await server.stop(0)


def messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


# --- what each call carries ---------------------------------------------------------------------------


async def test_commits_carry_the_owner_its_sequence_the_lease_and_the_probed_worker():
    async with recorded(owner="top-1", lease_s=4.0, sleep=Sleeps()) as (servicer, group, _):
        probe = await group.probe(request(prompt(1)), timeout_s=1)
        await group.commit(request(prompt(1)), "r1", probe.choice.worker)
        await group.commit(request(prompt(2)), "r2", None)
        first, second = servicer.messages("Commit")
        assert (first.owner, first.owner_seq, first.lease_s, first.request_id) == ("top-1", 1, 4.0, "r1")
        assert first.probed_worker.worker_id == str(probe.choice.worker.worker_id)
        assert (second.owner_seq, second.request_id, second.HasField("probed_worker")) == (2, "r2", False)
        assert group.live() == 2
        assert 0 < probe.latency_s < 60


async def test_lifecycle_calls_carry_the_model_and_a_free_carries_the_workers_status():
    async with recorded() as (servicer, group, _):
        decision = await group.commit(request(prompt(1)), "r1", None)
        rid, worker = decision.request_id, decision.choice.worker
        group.mark_prefill_complete(MODEL, rid, at_first_token=False)
        group.answered(MODEL, rid, worker, 503)
        group.free(MODEL, rid)
        other = (await group.commit(request(prompt(2)), "r2", None)).request_id
        group.free(MODEL, other)  # no status heard: 0
        group.answered(MODEL, other, worker, 500)  # after its free: not kept for anything
        await group.drain()
        (prefilled,) = servicer.messages("MarkPrefillComplete")
        assert (prefilled.model, prefilled.request_id, prefilled.after_first_token) == (MODEL, rid, True)
        frees = [(m.model, m.request_id, m.status) for m in servicer.messages("Free")]
        assert sorted(frees) == [(MODEL, rid, 503), (MODEL, other, 0)]  # r1's waited for its first token
        assert group.live() == 0 and group._status == {} and group._last_call == {}


async def test_calls_for_a_request_not_held_here_are_not_sent():
    async with recorded() as (servicer, group, _):
        group.mark_prefill_complete(MODEL, "never")
        group.add_output_tokens(MODEL, "never", 5, 1)
        await group.drain()
        assert servicer.received == []


async def test_loads_name_the_group():
    async with recorded() as (_, group, _):
        loads = await group.potential_loads(request(prompt(1)))
        assert loads.group == "g" and len(loads.workers) == 2


# --- output tokens ------------------------------------------------------------------------------------


async def test_output_tokens_are_sent_with_the_model_and_coalesced_while_one_call_is_on_its_way():
    async with recorded() as (servicer, group, _):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.holds["AddOutputTokens"] = hold = asyncio.Event()
        group.add_output_tokens(MODEL, rid, 5, 1)
        await until(lambda: servicer.messages("AddOutputTokens"), 5, "the first call arrived")
        group.add_output_tokens(MODEL, rid, 3, 1)
        group.add_output_tokens(MODEL, rid, 2, 2)
        hold.set()
        await group.drain()
        sent = [(m.model, m.request_id, m.tokens, m.sequences) for m in servicer.messages("AddOutputTokens")]
        assert sent == [(MODEL, rid, 5, 1), (MODEL, rid, 5, 2)]


@pytest.mark.parametrize(
    ("count", "sequences", "sent"),
    [(0, 1, False), (-3, 1, False), (0, 0, False), (1, 1, True), (0, 2, True)],
)
async def test_output_tokens_are_sent_when_there_are_tokens_or_more_sequences(count, sequences, sent):
    async with recorded() as (servicer, group, _):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        group.add_output_tokens(MODEL, rid, count, sequences)
        await group.drain()
        assert len(servicer.messages("AddOutputTokens")) == int(sent)


async def test_output_counts_past_32_bits_are_sent_as_the_largest_32_bit_count():
    async with recorded() as (servicer, group, _):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        group.add_output_tokens(MODEL, rid, 2**32 + 5, 2**32 + 7)
        await group.drain()
        (message,) = servicer.messages("AddOutputTokens")
        assert (message.tokens, message.sequences) == (2**32 - 1, 2**32 - 1)
        group.add_output_tokens(MODEL, rid, 2**32 - 1, 2**32 - 1)
        await group.drain()
        assert (
            servicer.messages("AddOutputTokens")[1].tokens,
            servicer.messages("AddOutputTokens")[1].sequences,
        ) == (
            2**32 - 1,
            2**32 - 1,
        )


async def test_a_group_that_does_not_serve_output_tokens_is_said_once_and_not_asked_again(caplog):
    failures: list[tuple[str, str]] = []
    async with recorded(on_lifecycle_failure=lambda *f: failures.append(f)) as (
        servicer,
        group,
        _,
    ):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.refusals["AddOutputTokens"] = [(grpc.StatusCode.UNIMPLEMENTED, "")]
        with caplog.at_level(logging.WARNING, "extproc.groups"):
            group.add_output_tokens(MODEL, rid, 5, 1)
            await group.drain()
            group.add_output_tokens(MODEL, rid, 5, 1)
            await group.drain()
        assert len(servicer.messages("AddOutputTokens")) == 1 and failures == []
        assert messages(caplog) == [
            "group g does not serve AddOutputTokens (an older picker): its requests' output blocks are not "
            "counted there"
        ]
        assert group._sends_output_tokens is False


async def test_an_output_tokens_call_that_fails_is_counted_and_the_next_one_sent(caplog):
    failures: list[tuple[str, str]] = []
    async with recorded(on_lifecycle_failure=lambda *f: failures.append(f)) as (
        servicer,
        group,
        _,
    ):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.refusals["AddOutputTokens"] = [(grpc.StatusCode.INTERNAL, "boom")]
        with caplog.at_level(logging.DEBUG, "extproc.groups"):
            group.add_output_tokens(MODEL, rid, 5, 1)
            await group.drain()
        assert f"output tokens of {rid} in group g not sent: INTERNAL" in messages(caplog)
        group.add_output_tokens(MODEL, rid, 2, 1)
        await group.drain()
        assert failures == [("g", "output_tokens")] and len(servicer.messages("AddOutputTokens")) == 2


async def test_an_output_tokens_call_past_its_deadline_is_given_up():
    failures: list[tuple[str, str]] = []
    async with recorded(lifecycle_timeout_s=0.05, on_lifecycle_failure=lambda *f: failures.append(f)) as (
        servicer,
        group,
        _,
    ):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.holds["AddOutputTokens"] = asyncio.Event()  # never set
        group.add_output_tokens(MODEL, rid, 5, 1)
        await asyncio.wait_for(group.drain(), 5)
        assert failures == [("g", "output_tokens")]


async def test_a_free_waits_for_the_requests_output_tokens_call_before_it():
    async with recorded() as (servicer, group, _):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.holds["AddOutputTokens"] = hold = asyncio.Event()
        group.add_output_tokens(MODEL, rid, 5, 1)
        await until(lambda: servicer.messages("AddOutputTokens"), 5, "the output tokens arrived")
        group.free(MODEL, rid)
        asyncio.get_running_loop().call_later(0.3, hold.set)
        await group.drain()
        assert servicer.ended[-2:] == ["AddOutputTokens", "Free"]
        assert [name for name, _ in servicer.received][-2:] == ["AddOutputTokens", "Free"]
        assert group._last_call == {}


async def test_output_tokens_of_a_request_freed_before_they_went_are_not_sent():
    async with recorded() as (servicer, group, _):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        other = (await group.commit(request(prompt(2)), "r2", None)).request_id
        servicer.holds["MarkPrefillComplete"] = hold = asyncio.Event()
        group.mark_prefill_complete(MODEL, rid)  # holds the request's calls behind it
        group.add_output_tokens(MODEL, rid, 5, 1)
        group.add_output_tokens(MODEL, other, 5, 1)  # another request's: not held behind it
        await until(lambda: servicer.messages("AddOutputTokens"), 5, "the other request's tokens arrived")
        group.free(MODEL, rid)
        hold.set()
        await group.drain()
        assert [m.request_id for m in servicer.messages("AddOutputTokens")] == [other]


# --- retries, renewals --------------------------------------------------------------------------------


async def test_a_lifecycle_call_is_tried_its_number_of_times_with_doubling_pauses_then_left_to_a_renewal(
    caplog,
):
    failures: list[tuple[str, str]] = []
    sleeps = Sleeps()
    async with recorded(
        sleep=sleeps,
        retries=3,
        retry_base_s=0.5,
        lease_s=9.0,
        on_lifecycle_failure=lambda *f: failures.append(f),
    ) as (servicer, group, picker):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.refusals["Free"] = [(grpc.StatusCode.UNAVAILABLE, "down")] * 3
        with caplog.at_level(logging.WARNING, "extproc.groups"):
            group.free(MODEL, rid)
            await group.drain()
        assert len(servicer.messages("Free")) == 3 and failures == [("g", "free")] * 3
        assert sleeps.pauses[:2] == [0.5, 1.0]
        assert messages(caplog) == [
            "free in group g failed 3 times (router group 'g': unreachable (UNAVAILABLE: down)); the next "
            "renewal settles it"
        ]
        await until(lambda: servicer.messages("Renew"), 5, "the renewal that settles it")
        assert sleeps.pauses[2] == 3.0  # a third of the lease
        renewal = servicer.messages("Renew")[0]
        assert (list(renewal.live), renewal.up_to_seq) == ([], 1)
        await until(lambda: picker.is_idle(), 5, "the group freed what its owner no longer holds")


async def test_a_renewal_lists_what_is_held_up_to_the_commits_still_unanswered(caplog):
    async with recorded(owner="top", lease_s=6.0) as (servicer, group, picker):
        first = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.holds["Commit"] = hold = asyncio.Event()
        pending = asyncio.ensure_future(group.commit(request(prompt(2)), "r2", None))
        await until(lambda: len(servicer.messages("Commit")) == 2, 5, "the second commit arrived")
        with caplog.at_level(logging.INFO, "extproc.groups"):
            assert await group.renew() == 0
        renewal = servicer.messages("Renew")[-1]
        assert (renewal.owner, renewal.lease_s, list(renewal.live), renewal.up_to_seq) == (
            "top",
            6.0,
            [first],
            1,
        )
        hold.set()
        second = (await pending).request_id
        group._live.pop(first)  # as if its free never arrived
        with caplog.at_level(logging.INFO, "extproc.groups"):
            assert await group.renew() == 1
        assert (list(servicer.messages("Renew")[-1].live), servicer.messages("Renew")[-1].up_to_seq) == (
            [second],
            2,
        )
        assert [m for m in messages(caplog) if m.startswith("router group g")] == [
            "router group g freed 1 requests this picker no longer holds"
        ]
        assert picker.local.tracked(first) is None and picker.local.tracked(second) is not None
        assert group._reconcile is False


async def test_a_commit_that_failed_is_settled_by_a_renewal():
    sleeps = Sleeps()
    async with recorded(sleep=sleeps, commit_timeout_s=0.05, lease_s=3.0) as (servicer, group, picker):
        servicer.holds["Commit"] = hold = asyncio.Event()
        with pytest.raises(GroupTimeout, match="50 ms"):
            await group.commit(request(prompt(1)), "r1", None)
        hold.set()
        await until(lambda: servicer.messages("Renew"), 5, "a renewal")  # in case the group tracked it
        renewal = servicer.messages("Renew")[0]
        assert sleeps.pauses[0] == 1.0 and (list(renewal.live), renewal.up_to_seq) == ([], 1)
        assert picker.is_idle()


async def test_a_renewal_that_fails_is_counted_logged_and_tried_again(caplog):
    failures: list[tuple[str, str]] = []
    sleeps = Sleeps()
    async with recorded(sleep=sleeps, lease_s=3.0, on_lifecycle_failure=lambda *f: failures.append(f)) as (
        servicer,
        group,
        _,
    ):
        servicer.refusals["Renew"] = [(grpc.StatusCode.UNAVAILABLE, "down")]
        with caplog.at_level(logging.WARNING, "extproc.groups"):
            rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
            await until(lambda: len(servicer.messages("Renew")) >= 2, 5, "a second renewal")
        assert failures[0] == ("g", "renew")
        failed = "renewing the lease of 1 requests in group g failed: router group 'g': unreachable"
        assert messages(caplog)[0] == f"{failed} (UNAVAILABLE: down)"
        assert list(servicer.messages("Renew")[1].live) == [rid]
        group.free(MODEL, rid)


async def test_the_renewer_stops_once_nothing_is_held_and_close_cancels_it():
    sleeps = Sleeps()
    async with recorded(sleep=sleeps, lease_s=3.0) as (servicer, group, _):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        await until(lambda: servicer.messages("Renew"), 5, "a renewal")
        group.free(MODEL, rid)
        await group.drain()
        await until(lambda: group._renewer is not None and group._renewer.done(), 5, "the renewer ended")
        await group.commit(request(prompt(2)), "r2", None)
        renewer = group._renewer
        assert renewer is not None and not renewer.done()  # a new one
        await group.close()
        assert group._renewer is None and renewer.cancelled()
        await group.close()  # twice: nothing left to do
        assert (await group.probe(request(prompt(3)), timeout_s=1)).group == "g"  # a new channel


# --- gRPC codes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "details", "error", "text"),
    [
        (
            grpc.StatusCode.NOT_FOUND,
            "no such model",
            GroupRefused,
            "router group 'g': unknown-model (no such model)",
        ),
        (grpc.StatusCode.FAILED_PRECONDITION, "", GroupRefused, "router group 'g': no-workers"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", GroupRefused, "router group 'g': all-busy (busy)"),
        (grpc.StatusCode.INVALID_ARGUMENT, "bad", GroupRefused, "router group 'g': invalid-request (bad)"),
        (
            grpc.StatusCode.INTERNAL,
            "boom",
            GroupUnreachable,
            "router group 'g': unreachable (INTERNAL: boom)",
        ),
        (grpc.StatusCode.UNAVAILABLE, "", GroupUnreachable, "router group 'g': unreachable (UNAVAILABLE:)"),
    ],
)
async def test_grpc_codes_are_read_as_the_selectors_reasons(code, details, error, text):
    async with recorded() as (servicer, group, _):
        servicer.refusals["Probe"] = [(code, details)]
        with pytest.raises(error) as raised:
            await group.probe(request(prompt(1)), timeout_s=1)
        assert str(raised.value) == text


@pytest.mark.parametrize("call", ["has_capacity", "potential_loads", "renew"])
async def test_every_call_has_its_deadline(call):
    rpc = {"has_capacity": "Probe", "potential_loads": "PotentialLoads", "renew": "Renew"}[call]
    async with recorded(commit_timeout_s=0.05, lifecycle_timeout_s=0.05) as (servicer, group, _):
        servicer.holds[rpc] = asyncio.Event()  # never set
        method = getattr(group, call)
        awaited = method(request(prompt(1))) if call != "renew" else method()
        with pytest.raises(GroupTimeout, match=r"^router group 'g': timeout \(no answer within 50 ms\)$"):
            await asyncio.wait_for(awaited, 5)


async def test_a_lifecycle_attempt_has_its_deadline():
    failures: list[tuple[str, str]] = []
    async with recorded(
        sleep=Sleeps(),
        lifecycle_timeout_s=0.05,
        retries=2,
        on_lifecycle_failure=lambda *f: failures.append(f),
    ) as (servicer, group, _):
        rid = (await group.commit(request(prompt(1)), "r1", None)).request_id
        servicer.holds["MarkPrefillComplete"] = asyncio.Event()  # never set
        group.mark_prefill_complete(MODEL, rid)
        await asyncio.wait_for(group.drain(), 5)
        assert failures == [("g", "prefill_complete")] * 2


# --- configuration --------------------------------------------------------------------------------------


def test_the_defaults_are_the_documented_ones():
    group = RemoteGroup("g", "127.0.0.1:1")
    assert (group.weight, group.commit_timeout_s, group.lifecycle_timeout_s) == (1.0, 1.0, 2.0)
    assert (group.lease_s, group.retries, group.retry_base_s) == (DEFAULT_LEASE_S, RETRIES, RETRY_BASE_S)
    assert (DEFAULT_LEASE_S, RETRIES, RETRY_BASE_S) == (10.0, 6, 0.2)
    assert group.live() == 0 and group._reconcile is False and len(group.owner) == 32


@pytest.mark.parametrize("lease_s", [0.0, -1.0])
def test_a_lease_must_be_positive(lease_s):
    with pytest.raises(ValueError, match=rf"^lease_s must be positive, got {lease_s!r}$"):
        RemoteGroup("g", "127.0.0.1:1", lease_s=lease_s)
