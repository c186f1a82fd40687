"""Through the picker (issue 23): `--router-prefill-load-model aic` decides on the decayed prompt loads,
and a request's `n` is tracked as n decoding sequences, given back once; an invalid `n` is a 400."""

from __future__ import annotations

import json

import pytest

from extproc.admin.api import _pass_time
from extproc.epp import answers as epp
from extproc.errors import RequestInvalid
from extproc.picker.pipeline import EndpointPicker
from extproc.router.prefill_model import PrefillTiming

from ..picker_fixtures import MODEL, picker_config
from ..router.clock import FakeClock

LINEAR = PrefillTiming(prefill_quadratic_ms=0.0, prefill_linear_ms=0.1, prefill_constant_ms=0.0)  # n/10 ms


def completion(first: int, tokens: int, **extra) -> bytes:
    return json.dumps({"model": MODEL, "prompt": list(range(first, first + tokens)), **extra}).encode()


async def pick(picker: EndpointPicker, body: bytes, request_id: str):
    return await picker.pick(
        body=body, path="/v1/completions", headers={}, subset=None, client_request_id=request_id
    )


async def test_aic_routes_on_the_oldest_prefill_decaying_per_worker():
    clock = FakeClock()
    config = picker_config(
        prefill_load_model="aic",
        prefill_timing=LINEAR,
        learn_prefill_timing=False,
        router_track_active_blocks=False,  # the prompt loads alone decide
    )
    picker = EndpointPicker(config, clock=clock)
    sequences = picker.pools[MODEL].router.sequences
    a = await pick(picker, completion(0, 1000), "a")  # 100 ms expected, on x
    b = await pick(picker, completion(10_000, 10), "b")  # 1 ms, on y: y's oldest
    c = await pick(picker, completion(20_000, 600), "c")  # y again (10 < 1000), held in full behind b
    x, y = a.worker, b.worker
    assert x != y and c.worker == y
    assert (sequences.prefill_tokens(x), sequences.prefill_tokens(y)) == (1000, 610)
    clock.advance(0.05)
    assert (sequences.prefill_tokens(x), sequences.prefill_tokens(y)) == (500, 600)
    d = await pick(picker, completion(30_000, 160), "d")
    assert d.worker == x  # Dynamo's none would send it to y (610 + 160 < 1000 + 160)
    picker.first_token(a)  # the oldest on x leaves: d is anchored now, at its full 160
    assert sequences.prefill_tokens(x) == 160
    shown = _pass_time(sequences, x)  # /debug/workers: the pass-time model aic predicts durations with
    assert shown is not None and shown["prefill_ms"] == [0.0, 0.1, 0.0] and shown["scale"] == 1.0
    for p in (a, b, c, d):
        picker.finish(p, "complete")
    assert picker.is_idle()
    await picker.close()


async def test_n_is_counted_as_n_sequences_and_given_back_once():
    picker = EndpointPicker(picker_config())
    sequences = picker.pools[MODEL].router.sequences
    chosen = await pick(picker, completion(0, 70, n=3), "n3")  # 4 full blocks and a partial one
    assert sequences.prefill_tokens(chosen.worker) == 70  # one prefill
    assert sequences.decode_blocks(chosen.worker) == 4 + 3  # each sequence its own partial block
    picker.finish(chosen, "complete")
    picker.finish(chosen, "complete")
    assert picker.is_idle() and sequences.decode_blocks(chosen.worker) == 0
    with pytest.raises(RequestInvalid) as refused:
        await pick(picker, completion(0, 70, n=129), "too-many")
    assert epp.status_of(refused.value) == (400, "invalid-request")
    assert refused.value.message == "n must be an integer in [1, 128], not the number 129"
    assert picker.is_idle()
    await picker.close()
