"""Fuzz the router-group gRPC servicer with well-typed messages carrying hostile values.

Promise (extproc/groups/router_group.proto, servicer.py): every call answers, or aborts with one of
the documented status codes (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED);
nothing else escapes. Probe and PotentialLoads change no state; once every request a Commit tracked
is freed, the picker is idle again. Each input is a short session of calls on one of two pickers (one
with tight busy thresholds), as bytes off the wire: built from fields or a mutated valid message.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from extproc.groups import RouterGroupServicer
from extproc.groups._generated import router_group_pb2 as pb
from extproc.picker.pipeline import EndpointPicker
from tests.fuzz.gen import chance, floating, pick, text
from tests.fuzz.harness import (
    SHRINKING_SHARE,
    Check,
    LoopRunner,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
    tally,
)
from tests.groups.builders import MODEL, group_config

DOCUMENTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
U32 = 2**32 - 1
METHODS = ("Probe", "Commit", "Commit", "PotentialLoads", "MarkPrefillComplete", "Free")
REQUEST_TYPES = {
    "Probe": pb.ProbeRequest,
    "Commit": pb.CommitRequest,
    "PotentialLoads": pb.PotentialLoadsRequest,
    "MarkPrefillComplete": pb.LifecycleRequest,
    "Free": pb.LifecycleRequest,
}
ENDPOINTS = ("127.0.1.1:8000", "127.0.1.2", "127.0.1.2:9", "[::1]:8000", "", ":", "[", "127.0.1.1:8000:1")

PROMPT = b"".join((i % 97).to_bytes(4, "little") for i in range(20_000))

Call = tuple[str, bytes]  # method, serialized request
Case = tuple[int, list[Call]]  # picker index, calls


def _text(r: random.Random) -> str:
    return text(r, surrogates=False)  # protobuf strings are valid UTF-8 (the wire's are checked)


def _uint32(r: random.Random) -> int:
    return pick(r, (0, 1, 16, 4096, U32, r.randint(0, U32)))


def _routing(r: random.Random, message: pb.RoutingRequest) -> None:
    message.model = pick(r, (MODEL, MODEL, MODEL, "other", "", _text(r)))
    n = pick(r, (0, 1, 15, 16, 160, r.randint(0, 400), 20_000))
    shared = r.randint(0, n)  # a prefix every prompt shares (cache hits), then random token ids
    raw = PROMPT[: 4 * shared] + r.randbytes(4 * (n - shared))
    message.token_ids = raw if chance(r, 0.95) else raw + r.randbytes(r.randint(1, 3))
    if chance(r, 0.1):
        message.lora_name = _text(r)
    if chance(r, 0.3):
        if chance(r, 0.7):
            message.overrides.overlap_score_weight = floating(r) if chance(r, 0.5) else r.uniform(0, 2)
        if chance(r, 0.7):
            message.overrides.temperature = floating(r) if chance(r, 0.5) else r.uniform(0, 1)
    if chance(r, 0.3):
        message.expected_output_tokens = _uint32(r)
    for _ in range(pick(r, (0, 0, 0, 1, 2))):
        message.restrictions.add(endpoints=[pick(r, ENDPOINTS) for _ in range(r.randint(0, 3))])
    if chance(r, 0.2):
        message.isl = _uint32(r)


def _message(r: random.Random, method: str, ids: list[str]) -> Any:
    message = REQUEST_TYPES[method]()
    if method in ("Probe", "Commit", "PotentialLoads"):
        _routing(r, message.request)
    if method == "Commit":
        message.request_id = pick(r, ("a", "a", "req", "", "a@1", _text(r)))
        if chance(r, 0.7):
            message.probed_worker.worker_id = pick(r, ("w0", "w1", "w9", "", _text(r)))
            message.probed_worker.dp_rank = pick(r, (0, 0, 1, U32))
    elif method in ("MarkPrefillComplete", "Free"):
        message.model = pick(r, (MODEL, MODEL, "other", ""))
        message.request_id = pick(r, ids) if ids and chance(r, 0.7) else pick(r, ("a", "", _text(r)))
    return message


def generate(r: random.Random) -> Case:
    calls: list[Call] = []
    ids = ["a", "a@1", "req"]  # request ids Commit is likely to answer with
    for _ in range(r.randint(1, 6)):
        method = pick(r, METHODS)
        data = _message(r, method, ids).SerializeToString()
        if chance(r, 0.1):
            data = bytearray(data)
            for _ in range(r.randint(1, 3)):
                if data:
                    data[r.randrange(len(data))] = r.randrange(256)
            data = bytes(data)
        calls.append((method, data))
    return r.randrange(2), calls


class _Aborted(Exception):
    pass


class _Context:
    """The part of `grpc.aio.ServicerContext` the servicer uses: `abort` raises, as grpc's does."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise _Aborted(details)


def _requests(picker: EndpointPicker) -> int:
    return sum(len(pool.router.sequences) for pool in picker.pools.values())


async def _session(servicer: RouterGroupServicer, picker: EndpointPicker, calls: list[Call]) -> list[str]:
    outcomes = []
    committed: list[str] = []
    for method, data in calls:
        try:
            message = REQUEST_TYPES[method].FromString(data)
        except DecodeError:
            outcomes.append("undecodable")  # gRPC refuses it before the servicer sees it
            continue
        before = _requests(picker)
        context = _Context()
        try:
            answer = await getattr(servicer, method)(message, context)
        except _Aborted:
            assert context.code in DOCUMENTED, context.code
            outcomes.append("rejected")
            assert _requests(picker) == before, f"{method} changed state and failed"
            continue
        outcomes.append("decoded")
        if method == "Commit":
            committed.append(answer.request_id)
            assert _requests(picker) == before + 1
        elif method in ("Probe", "PotentialLoads"):
            assert _requests(picker) == before, f"{method} changed state"
    context = _Context()
    for request_id in committed:
        await servicer.Free(pb.LifecycleRequest(model=MODEL, request_id=request_id), context)
    assert picker.is_idle(), "requests left tracked after every commit was freed"
    return outcomes


def _pickers() -> list[EndpointPicker]:
    return [
        EndpointPicker(group_config("w", 2, dp_ranks=(0, 1))),
        EndpointPicker(group_config("w", 2, active_prefill_tokens_threshold=100)),
    ]


@contextlib.contextmanager
def session() -> Iterator[Check]:
    loop = LoopRunner()
    pickers = _pickers()
    servicers = [RouterGroupServicer(p.local) for p in pickers]

    def check(case: Case) -> Outcome:
        index, calls = case
        try:
            return tally(loop.run(_session(servicers[index], pickers[index], calls)))
        except BaseException:
            pickers[index] = _pickers()[index]  # a fresh picker: what leaked must not fail the next inputs
            servicers[index] = RouterGroupServicer(pickers[index].local)
            raise

    try:
        yield check
    finally:
        loop.close()


def describe(case: Case) -> str:
    index, calls = case
    shown = [(m, REQUEST_TYPES[m].FromString(d) if _parses(m, d) else d) for m, d in calls]
    return f"picker {index}: " + repr(shown)[:3000]


def _parses(method: str, data: bytes) -> bool:
    try:
        REQUEST_TYPES[method].FromString(data)
    except DecodeError:
        return False
    return True


TARGET = Target("group_api", generate, session, describe)
check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_group_api_answers_or_aborts_as_documented(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_group_api_answers_or_aborts_as_documented_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_calls_reach_both_outcomes(check_target: Check) -> None:
    total: dict[str, int] = {}
    for i in range(100):
        for key, n in check_target(generate(random.Random(i))).items():
            total[key] = total.get(key, 0) + n
    assert min(total.get(k, 0) for k in ("decoded", "rejected")) > 50, total
