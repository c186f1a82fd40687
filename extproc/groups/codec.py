"""The router-group API's one wire converter: protobuf messages <-> `extproc.groups.types`.

Token ids travel as little-endian uint32 bytes (the layout block hashes are defined on,
`extproc.router.hashing.tokens_as_u32le`); they are decoded into a `<u4` numpy array without a
copy. Worker ids travel as strings. Nothing else in the package sees a protobuf.
"""

from __future__ import annotations

import numpy as np

from extproc.groups._generated import router_group_pb2 as pb
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
from extproc.router.hashing import tokens_as_u32le


class WireError(ValueError):
    """A message cannot be decoded (the servicer answers INVALID_ARGUMENT)."""


# --- requests ----------------------------------------------------------------------------------


def encode_request(request: GroupRequest) -> pb.RoutingRequest:
    """Raises ValueError when a token id is not an integer in [0, 2**32)."""
    message = pb.RoutingRequest(
        model=request.model,
        token_ids=bytes(tokens_as_u32le(request.token_ids)),
        lora_name=request.lora_name or "",
        cache_salt=request.cache_salt or "",
    )
    if request.overrides is not None:
        if request.overrides.overlap_score_weight is not None:
            message.overrides.overlap_score_weight = request.overrides.overlap_score_weight
        if request.overrides.temperature is not None:
            message.overrides.temperature = request.overrides.temperature
    if request.expected_output_tokens is not None:
        message.expected_output_tokens = request.expected_output_tokens
    for endpoints in request.restrictions or ():
        message.restrictions.add(endpoints=list(endpoints))
    if request.isl is not None:
        message.isl = request.isl
    return message


def decode_request(message: pb.RoutingRequest) -> GroupRequest:
    """Raises WireError when the model is missing or the token bytes are not whole uint32s."""
    if not message.model:
        raise WireError("model is required")
    if len(message.token_ids) % 4:
        raise WireError(f"token_ids must be little-endian uint32s; got {len(message.token_ids)} bytes")
    tokens = np.frombuffer(message.token_ids, dtype="<u4")
    overrides = None
    if message.HasField("overrides"):
        o = message.overrides
        overrides = RouterConfigOverride(
            overlap_score_weight=o.overlap_score_weight if o.HasField("overlap_score_weight") else None,
            temperature=o.temperature if o.HasField("temperature") else None,
        )
    restrictions = tuple(tuple(r.endpoints) for r in message.restrictions) or None
    return GroupRequest(
        model=message.model,
        token_ids=tokens,
        lora_name=message.lora_name or None,
        cache_salt=message.cache_salt or None,
        overrides=overrides,
        expected_output_tokens=(
            message.expected_output_tokens if message.HasField("expected_output_tokens") else None
        ),
        restrictions=restrictions,
        isl=message.isl or None,
    )


# --- answers -----------------------------------------------------------------------------------


def encode_worker(worker: Worker) -> pb.Worker:
    return pb.Worker(worker_id=str(worker.worker_id), dp_rank=worker.dp_rank)


def decode_worker(message: pb.Worker) -> Worker:
    return Worker(message.worker_id, message.dp_rank)


def encode_choice(choice: GroupChoice) -> pb.Choice:
    message = pb.Choice(
        worker=encode_worker(choice.worker),
        endpoint=choice.endpoint,
        headers=dict(choice.headers),
        overlap_blocks=choice.overlap_blocks,
        request_blocks=choice.request_blocks,
        cost=choice.cost,
        best_overlap_blocks=choice.best_overlap_blocks,
        prefill_endpoint=choice.prefill_endpoint or "",
        predicted_ttft_ms=choice.predicted_ttft_ms or 0.0,
    )
    if choice.prefill_worker is not None:
        message.prefill_worker.CopyFrom(encode_worker(choice.prefill_worker))
    return message


def decode_choice(message: pb.Choice) -> GroupChoice:
    return GroupChoice(
        worker=decode_worker(message.worker),
        endpoint=message.endpoint,
        headers=dict(message.headers),
        overlap_blocks=message.overlap_blocks,
        request_blocks=message.request_blocks,
        cost=message.cost,
        best_overlap_blocks=message.best_overlap_blocks,
        prefill_worker=decode_worker(message.prefill_worker) if message.HasField("prefill_worker") else None,
        prefill_endpoint=message.prefill_endpoint or None,
        predicted_ttft_ms=message.predicted_ttft_ms or None,
    )


def encode_load(load: GroupLoad) -> pb.GroupLoad:
    return pb.GroupLoad(
        workers=load.workers,
        active_requests=load.active_requests,
        active_prefill_tokens=load.active_prefill_tokens,
        active_decode_blocks=load.active_decode_blocks,
    )


def decode_load(message: pb.GroupLoad) -> GroupLoad:
    return GroupLoad(
        message.workers, message.active_requests, message.active_prefill_tokens, message.active_decode_blocks
    )


def encode_probe(probe: GroupProbe) -> pb.ProbeResponse:
    return pb.ProbeResponse(
        choice=encode_choice(probe.choice),
        load=encode_load(probe.load),
        block_size=probe.block_size,
        saturated=not probe.has_capacity,
    )


def decode_probe(group: str, message: pb.ProbeResponse, latency_s: float) -> GroupProbe:
    return GroupProbe(
        group,
        decode_choice(message.choice),
        decode_load(message.load),
        message.block_size,
        latency_s,
        has_capacity=not message.saturated,
    )


def encode_commit(decision: GroupDecision) -> pb.CommitResponse:
    return pb.CommitResponse(
        choice=encode_choice(decision.choice),
        request_id=decision.request_id,
        redecided=decision.redecided,
    )


def decode_commit(group: str, message: pb.CommitResponse) -> GroupDecision:
    choice = decode_choice(message.choice)
    return GroupDecision(group, message.request_id, choice, message.redecided, choice.best_overlap_blocks)


def encode_loads(loads: GroupLoads) -> pb.PotentialLoadsResponse:
    return pb.PotentialLoadsResponse(
        loads=[
            pb.WorkerLoad(
                worker=encode_worker(w.worker),
                endpoint=w.endpoint,
                prefill_tokens=w.prefill_tokens,
                decode_blocks=w.decode_blocks,
                overlap_blocks=int(w.overlap_blocks),
                overlap_credit=w.overlap_blocks,
            )
            for w in loads.workers
        ],
        load=encode_load(loads.load),
        block_size=loads.block_size,
    )


def decode_loads(group: str, message: pb.PotentialLoadsResponse) -> GroupLoads:
    workers = tuple(
        GroupWorkerLoad(
            decode_worker(w.worker),
            w.endpoint,
            w.prefill_tokens,
            w.decode_blocks,
            w.overlap_credit if w.HasField("overlap_credit") else w.overlap_blocks,  # older groups: whole
        )
        for w in message.loads
    )
    return GroupLoads(group, workers, decode_load(message.load), message.block_size)
