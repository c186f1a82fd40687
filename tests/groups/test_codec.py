"""codec.py: the router-group API's wire form round-trips, token ids as little-endian uint32s."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from extproc.groups._generated import router_group_pb2 as pb
from extproc.groups.codec import (
    WireError,
    decode_commit,
    decode_loads,
    decode_probe,
    decode_request,
    encode_commit,
    encode_loads,
    encode_probe,
    encode_request,
)
from extproc.groups.types import (
    GroupChoice,
    GroupDecision,
    GroupLoad,
    GroupLoads,
    GroupProbe,
    GroupRequest,
    GroupWorkerLoad,
)
from extproc.router import RouterConfigOverride, Worker


def test_token_ids_travel_as_little_endian_uint32_bytes():
    message = encode_request(GroupRequest("m", [1, 256, 2**32 - 1]))
    assert message.token_ids == b"\x01\x00\x00\x00" + b"\x00\x01\x00\x00" + b"\xff\xff\xff\xff"


@pytest.mark.parametrize(
    "request_",
    [
        GroupRequest("m", [1, 2, 3]),
        GroupRequest(
            "m",
            list(range(100)),
            lora_name="my-lora",
            cache_salt="tenant-a",
            overrides=RouterConfigOverride(overlap_score_weight=0.0, temperature=0.5),
            expected_output_tokens=64,
            restrictions=(("10.0.0.1:8000", "10.0.0.2"), ()),
        ),
        GroupRequest("m", [], overrides=RouterConfigOverride(temperature=1.0), isl=4000),
    ],
)
def test_requests_round_trip(request_):
    wire = pb.RoutingRequest.FromString(encode_request(request_).SerializeToString())
    decoded = decode_request(wire)
    assert isinstance(decoded.token_ids, np.ndarray) and decoded.token_ids.dtype == np.dtype("<u4")
    assert list(decoded.token_ids) == list(request_.token_ids)
    assert (decoded.model, decoded.lora_name, decoded.cache_salt, decoded.overrides) == (
        request_.model,
        request_.lora_name,
        request_.cache_salt,
        request_.overrides,
    )
    assert decoded.expected_output_tokens == request_.expected_output_tokens
    assert decoded.restrictions == request_.restrictions
    assert decoded.isl == request_.isl


def test_an_override_left_unset_stays_unset():
    decoded = decode_request(
        encode_request(GroupRequest("m", [1], overrides=RouterConfigOverride(temperature=0.0)))
    )
    assert decoded.overrides == RouterConfigOverride(overlap_score_weight=None, temperature=0.0)


@pytest.mark.parametrize(
    "message, complaint",
    [
        (pb.RoutingRequest(model="", token_ids=b""), "model is required"),
        (pb.RoutingRequest(model="m", token_ids=b"\x01\x02\x03"), "uint32"),
    ],
)
def test_unreadable_requests_are_refused(message, complaint):
    with pytest.raises(WireError, match=complaint):
        decode_request(message)


@pytest.mark.parametrize("bad", [[-1], [2**32]])
def test_token_ids_outside_uint32_cannot_be_encoded(bad):
    with pytest.raises(ValueError, match="2\\*\\*32"):
        encode_request(GroupRequest("m", bad))


CHOICE = GroupChoice(Worker("w1", 2), "10.0.0.2:8000", {"x-data-parallel-rank": "2"}, 7, 10, 12.5, 9)
LOAD = GroupLoad(workers=4, active_requests=3, active_prefill_tokens=900, active_decode_blocks=41.5)


def test_answers_round_trip():
    probe = GroupProbe("g", CHOICE, LOAD, 16)
    assert (
        decode_probe("g", pb.ProbeResponse.FromString(encode_probe(probe).SerializeToString()), 0.0) == probe
    )
    decision = GroupDecision("g", "rid@1", CHOICE, redecided=True, best_overlap_blocks=9)
    assert decode_commit("g", encode_commit(decision)) == decision
    loads = GroupLoads("g", (GroupWorkerLoad(Worker("w0"), "10.0.0.1:8000", 320, 20.0, 3),), LOAD, 64)
    assert decode_loads("g", encode_loads(loads)) == loads


def test_a_choices_predicted_time_to_first_token_travels_and_none_stays_none() -> None:
    predicted = dataclasses.replace(CHOICE, predicted_ttft_ms=123.25)
    for choice in (predicted, CHOICE):
        decision = GroupDecision("g", "rid@1", choice)
        wire = pb.CommitResponse.FromString(encode_commit(decision).SerializeToString())
        assert decode_commit("g", wire).choice.predicted_ttft_ms == choice.predicted_ttft_ms
    assert CHOICE.predicted_ttft_ms is None


def test_potential_loads_carry_a_credited_overlap_and_an_older_groups_whole_one() -> None:
    """Offloaded tiers make a worker's overlap fractional (device + 0.75 x host ...): it travels
    exact, with its whole part where an older owner reads it; an older group's answer has no
    credit, and its whole overlap is read."""
    loads = GroupLoads("g", (GroupWorkerLoad(Worker("w0"), "10.0.0.1:8000", 320, 20.0, 5.75),), LOAD, 64)
    message = encode_loads(loads)
    assert message.loads[0].overlap_blocks == 5
    assert decode_loads("g", message) == loads
    message.loads[0].ClearField("overlap_credit")  # what a group from before tiers sends
    assert decode_loads("g", message).workers[0].overlap_blocks == 5
