"""Top-level picker replicas in front of a remote router group share the routes clients name.

The scale-out shape of the guides: several top-level pickers (replica sync over a real nats-server)
decide through one router group that another picker serves over its group API (gRPC). A home or a
pin names the group as well as the worker. A follow-up, a retrieval or a session's next turn sent
through the other replica reaches the same group and worker, and a follow-up sent the instant the
answer was read waits for the word (`HomeWaits`) there as it does without groups
(tests/nats/test_replica_sync_routes.py). A replica started after the answers is handed them, group
included (`want_routes`, extproc/events/route_catchup.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from extproc.config import EventsConfig, GroupConfig, GroupsConfig, PickerConfig
from extproc.groups import GroupApiServer, start_group_api
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker, start_picker

from ..groups.builders import BLOCK, MODEL, group_config
from .conftest import eventually

pytestmark = pytest.mark.asyncio
GROUP = "there"


def top_config(nats_url: str, router_id: str, group_port: int, like: PickerConfig) -> PickerConfig:
    """A top-level picker with no workers of its own: it decides through the remote group."""
    return PickerConfig(
        router=RouterConfig(block_size=BLOCK, use_kv_events=False, prefill_load_model="none"),
        workers=(),
        models=like.models,
        seed=3,
        port=0,
        health_port=0,
        groups=GroupsConfig(groups=(GroupConfig(GROUP, f"127.0.0.1:{group_port}"),), probe_timeout_s=2.0),
        events=EventsConfig(nats_url=nats_url, namespace="groups", replica_sync=True, router_id=router_id),
    )


class Cluster:
    """One remote group (a picker serving its workers over the group API) and the top-level replicas
    started in front of it."""

    def __init__(self, nats_url: str) -> None:
        # load only (weight 0): a follow-up decided on load would leave the answer's worker, which holds it
        self.group_cfg = group_config("w", 3, overlap_score_weight=0.0)
        self.group = EndpointPicker(self.group_cfg)
        self.nats_url = nats_url
        self.api: GroupApiServer | None = None
        self.tops: list[RunningPicker] = []

    async def start_group(self) -> None:
        self.api = await start_group_api(self.group.local, "127.0.0.1", 0)

    async def start_top(self, name: str) -> EndpointPicker:
        """A top-level replica, once it shares routes with the others and was handed theirs."""
        assert self.api is not None
        running = await start_picker(top_config(self.nats_url, name, self.api.port, self.group_cfg))
        self.tops.append(running)
        syncs = [r.sources.replica_sync for r in self.tops]
        if len(syncs) > 1:
            await eventually(
                lambda: all(s is not None and s.shares_routes() for s in syncs), 5.0, "heartbeats"
            )
        await eventually(
            lambda: not any(s is not None and s.awaiting_routes() for s in syncs), 15.0, "handover"
        )
        return running.picker

    async def close(self) -> None:
        for running in self.tops:
            await running.stop(0)
        if self.api is not None:
            await self.api.stop(0)
        await self.group.close()


@pytest_asyncio.fixture
async def cluster(nats_server) -> AsyncIterator[Cluster]:
    started = Cluster(nats_server.url)
    try:
        await started.start_group()
        yield started
    finally:
        await started.close()


@pytest_asyncio.fixture
async def tops(cluster: Cluster) -> tuple[EndpointPicker, EndpointPicker]:
    return await cluster.start_top("a"), await cluster.start_top("b")


async def pick(
    picker: EndpointPicker, request_id: str, path: str = "/v1/responses", session: str | None = None, **fields
) -> Pick:
    body = json.dumps({"model": MODEL, **fields}).encode() if fields else None
    headers = {"x-session-id": session} if session else {}
    return await picker.pick(body=body, path=path, headers=headers, subset=None, client_request_id=request_id)


async def finish(picker: EndpointPicker, picks: list[Pick]) -> None:
    """End `picks` as their streams would, and wait until the group has heard every end."""
    for chosen in picks:
        picker.finish(chosen, "complete")
    await picker.selector.drain()


async def test_a_follow_up_sent_the_instant_the_answer_was_read_reaches_its_group_and_worker(tops):
    a, b = tops
    first = await pick(a, "r1", input="the first turn of a conversation " * 20)
    a.response_stored(first, "resp_first")  # the answer's id, as the ext_proc stream reads it
    assert first.group == GROUP
    # a's request still decodes on its worker: on load alone the group would send the follow-up elsewhere
    follow_up = await pick(b, "r2", input="and then?", previous_response_id="resp_first")
    assert (follow_up.group, follow_up.worker, follow_up.endpoint) == (GROUP, first.worker, first.endpoint)
    assert (b.home_waits.arrived, b.home_waits.timed_out) == (1, 0)
    retrieval = await pick(b, "r3", path="/v1/responses/resp_first")
    assert (retrieval.group, retrieval.worker, retrieval.tracked) == (GROUP, first.worker, False)
    await finish(b, [follow_up])
    await finish(a, [first])


async def test_a_session_pinned_through_one_replica_stays_on_its_group_and_worker_through_the_other(tops):
    a, b = tops
    first = await pick(a, "s1", input="a session's first turn " * 20, session="sess-1")
    a.answered(first, 200)  # the worker took the session's first turn: the pin is told
    await eventually(
        lambda: b._sessions[MODEL].get_pin("sess-1", b._clock()) is not None, 5.0, "b learns the pin"
    )
    turns = [await pick(b, f"s{i}", input=f"turn {i} " * 20, session="sess-1") for i in range(2, 5)]
    assert {(t.group, t.worker) for t in turns} == {(GROUP, first.worker)}
    await finish(b, turns)
    await finish(a, [first])


async def test_without_the_other_replicas_word_a_follow_up_waits_its_bound_then_routes_on_load(tops):
    """An id nobody stored (lapsed, made up) costs the bounded wait once, then a decision on load."""
    _, b = tops
    follow_up = await pick(b, "r9", input="and then?", previous_response_id="resp_nobody_stored")
    assert follow_up.group == GROUP and (b.home_waits.arrived, b.home_waits.timed_out) == (0, 1)
    await finish(b, [follow_up])


async def test_a_replica_started_after_the_answers_is_handed_their_groups_and_workers(cluster: Cluster):
    """The handover (`want_routes`) carries the group with the worker: a replica that was not there
    when the answers were stored sends their follow-ups and retrievals where they are."""
    a = await cluster.start_top("a")
    b = await cluster.start_top("b")  # so that a shares its routes: it has heard another replica
    firsts = [await pick(a, f"r{i}", input=f"conversation {i} " * 20) for i in range(3)]
    for i, first in enumerate(firsts):
        a.response_stored(first, f"resp_{i}")
    await eventually(lambda: len(b.response_homes) == 3, 5.0, "a's homes went out")  # before c listens
    late = await cluster.start_top("c")  # handed what a and b keep before it is ready
    assert cluster.tops[-1].sources.replica_sync.counters["sync.routes_learned"] == 3
    follow_ups = []
    for i, first in enumerate(firsts):
        follow_ups.append(await pick(late, f"f{i}", input="and then?", previous_response_id=f"resp_{i}"))
        assert (follow_ups[-1].group, follow_ups[-1].worker) == (GROUP, first.worker)
        retrieval = await pick(late, f"g{i}", path=f"/v1/responses/resp_{i}")
        assert (retrieval.group, retrieval.worker) == (GROUP, first.worker)
    assert late.home_waits.arrived == late.home_waits.timed_out == 0  # known at once: handed over
    await finish(late, follow_ups)
    await finish(a, firsts)
