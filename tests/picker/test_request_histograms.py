"""The per-request histograms: their arithmetic (`PickMetrics`), and what the picker observes as a
routed request's answer passes (first token, counted tokens, the end). End to end through Envoy:
tests/e2e/test_output_blocks_e2e.py."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from extproc.picker.body_parser import MAX_PROMPT_VALUES
from extproc.picker.metrics import PickMetrics
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import MODEL, chat_body, picker_config

M = "m"


def observed(metrics: PickMetrics, name: str) -> tuple[int, float]:
    counts, total = getattr(metrics, name).series.get((M,), ([], [0.0]))
    return sum(counts), total[0]


def test_a_routed_request_with_tokens_gives_its_length_and_its_hit_rate():
    metrics = PickMetrics()
    metrics.routed(M, overlap=3, best=4, prompt_tokens=70, blocks=4)
    assert observed(metrics, "input_tokens") == (1, 70)
    assert observed(metrics, "kv_hit_rate") == (1, 0.75)


def test_a_request_routed_on_load_only_gives_neither():
    metrics = PickMetrics()
    metrics.routed(M, overlap=0, best=0)
    assert observed(metrics, "input_tokens") == (0, 0) and observed(metrics, "kv_hit_rate") == (0, 0)


@pytest.mark.parametrize(
    ("tokens", "decode_s", "itl"),
    [(11, 0.5, (1, 0.05)), (1, 0.5, (0, 0)), (0, None, (0, 0)), (40, None, (0, 0))],
)
def test_an_answers_gaps_are_its_decode_time_over_the_tokens_after_the_first(tokens, decode_s, itl):
    metrics = PickMetrics()
    metrics.answered(M, tokens, decode_s)
    assert observed(metrics, "output_tokens") == (1, tokens)
    count, total = observed(metrics, "itl")
    assert (count, pytest.approx(total)) == itl


# --- what the picker observes as a routed request's answer passes ----------------------------------


async def routed(track_output: bool = True):
    picker = EndpointPicker(picker_config(2, router_track_output_blocks=track_output))
    before = time.perf_counter_ns()
    pick = await picker.pick(
        body=chat_body("hello " * 40), path="/v1/chat/completions", headers={}, subset=None,
        client_request_id="r",
    )  # fmt: skip
    return picker, pick, before


def seen(picker: EndpointPicker, name: str) -> tuple[int, float]:
    counts, total = getattr(picker.metrics, name).series.get((MODEL,), ([], [0.0]))
    return sum(counts), total[0]


async def test_a_routed_requests_first_token_is_observed_once_within_the_time_that_passed():
    picker, pick, before = await routed()
    try:
        prompt, hit = seen(picker, "input_tokens"), seen(picker, "kv_hit_rate")
        assert prompt[0] == 1 and prompt[1] > 40 and hit == (1, 0.0)  # nothing cached yet
        picker.first_token(pick)
        picker.first_token(pick)  # later chunks are no first token
        elapsed_s = (time.perf_counter_ns() - before) / 1e9
        count, total = seen(picker, "ttft")
        assert count == 1 and 0 <= total <= elapsed_s
    finally:
        await picker.close()


async def test_a_whole_answers_first_chunk_is_no_first_token():
    picker, pick, _ = await routed()
    try:
        picker.first_token(pick, at_first_token=False)
        assert seen(picker, "ttft") == (0, 0)
        picker.output_tokens(pick, 24)
        picker.finish(pick, "complete")
        assert seen(picker, "output_tokens") == (1, 24) and seen(picker, "itl") == (0, 0)
    finally:
        await picker.close()


async def test_a_completed_streamed_answer_gives_its_length_and_its_mean_gap():
    picker, pick, before = await routed()
    try:
        picker.first_token(pick)
        picker.output_tokens(pick, 3)
        picker.output_tokens(pick, 2)
        picker.finish(pick, "complete")
        elapsed_s = (time.perf_counter_ns() - before) / 1e9
        assert seen(picker, "output_tokens") == (1, 5)
        count, total = seen(picker, "itl")
        assert count == 1 and 0 <= total * 4 <= elapsed_s
    finally:
        await picker.close()


@pytest.mark.parametrize(("track_output", "cause"), [(True, "cancelled"), (False, "complete")])
async def test_no_length_without_a_completed_and_counted_answer(track_output, cause):
    picker, pick, _ = await routed(track_output)
    try:
        picker.first_token(pick)
        picker.output_tokens(pick, 3)
        picker.finish(pick, cause)
        assert seen(picker, "output_tokens") == (0, 0) and seen(picker, "itl") == (0, 0)
    finally:
        await picker.close()


async def test_a_request_routed_on_load_only_gives_no_length_and_no_hit_rate():
    """A chat whose prompt fields hold more JSON values than the picker builds: no prompt, no tokens."""
    config = replace(picker_config(2), body_parse_workers=0)
    picker = EndpointPicker(config)
    body = chat_body("tell me more", nvext={"padding": [0] * (MAX_PROMPT_VALUES + 1)})
    try:
        pick = await picker.pick(
            body=body, path="/v1/chat/completions", headers={}, subset=None, client_request_id="r"
        )
        assert pick.tracked and pick.request_blocks == 0
        assert picker.metrics.requests.values[MODEL, "routed"] == 1
        assert seen(picker, "input_tokens") == (0, 0) and seen(picker, "kv_hit_rate") == (0, 0)
    finally:
        await picker.close()
