"""The engine's token counts read from answer bodies, cut into chunks anywhere.

The answers are the bytes vLLM 0.33.0's and SGLang 0.5.23's own serving code writes
(`tests/request/engines/*/answers.json`: a 5-token prompt, 3 tokens generated), and usage objects
built by the `openai` and `anthropic` packages' own response types, as those APIs define them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from anthropic.types import MessageDeltaUsage
from anthropic.types import Usage as AnthropicUsage
from openai.types import CompletionUsage
from openai.types.responses import ResponseUsage

from extproc.epp.usage import MAX_BYTES, Usage

ENGINES = Path(__file__).resolve().parents[1] / "request" / "engines"
ANSWERS = [
    pytest.param(answer.encode(), id=f"{path.parent.name}-{kind}")
    for path in sorted(ENGINES.glob("*/answers.json"))
    for kind, answer in json.loads(path.read_text())["by_model"]["foodreview-v2"].items()
]


def counts(*chunks: bytes) -> tuple[int | None, int | None, int | None]:
    usage = Usage()
    for chunk in chunks:
        usage.feed(chunk)
    return usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens


def test_both_engines_answers_are_read() -> None:
    assert len(ANSWERS) == 8  # two engines x chat and completions x JSON and event stream


@pytest.mark.parametrize("answer", ANSWERS)
def test_an_engines_answer_gives_its_counts_however_it_is_cut(answer: bytes) -> None:
    assert counts(answer) == (5, 3, None)  # the engines say no cached tokens by default (null details)
    for cut in range(1, len(answer)):
        assert counts(answer[:cut], answer[cut:]) == (5, 3, None), cut
    assert counts(*(answer[i : i + 1] for i in range(len(answer)))) == (5, 3, None)  # byte by byte


def test_cached_tokens_and_running_counts_of_an_openai_stream() -> None:
    """vLLM's continuous usage stats: a running usage in every chunk; the largest counts."""
    events = b"".join(
        b"data: %s\n\n"
        % json.dumps(
            {
                "choices": [{"index": 0, "delta": {"content": "x"}}],
                "usage": CompletionUsage(
                    prompt_tokens=40,
                    completion_tokens=n,
                    total_tokens=40 + n,
                    prompt_tokens_details={"cached_tokens": 32},
                ).model_dump(),
            }
        ).encode()
        for n in (1, 2, 3)
    )
    assert counts(events + b"data: [DONE]\n\n") == (40, 3, 32)


def test_the_responses_apis_usage() -> None:
    usage = ResponseUsage(
        input_tokens=12,
        input_tokens_details={"cached_tokens": 8, "cache_write_tokens": 0},
        output_tokens=4,
        output_tokens_details={"reasoning_tokens": 0},
        total_tokens=16,
    )
    completed = {"type": "response.completed", "response": {"id": "r", "usage": usage.model_dump()}}
    event = b"event: response.completed\ndata: " + json.dumps(completed).encode() + b"\n\n"
    assert counts(event) == (12, 4, 8)
    recorded = json.loads((ENGINES / "vllm-0.33.0" / "responses.json").read_text())["answers"]["json"]
    assert counts(recorded.encode()) == (None, None, None)  # vLLM's answer there: "usage":null


def test_anthropics_start_and_delta_usage() -> None:
    start = {"type": "message_start", "message": {"usage": AnthropicUsage(
        input_tokens=20, output_tokens=1, cache_read_input_tokens=16
    ).model_dump()}}  # fmt: skip
    delta = {"type": "message_delta", "usage": MessageDeltaUsage(output_tokens=7).model_dump()}
    stream = b"".join(
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in (start, delta)
    )
    assert counts(stream) == (20, 7, 16)


NOT_USAGE_IDS = ["escaped-in-text", "null", "not-counts", "a-string", "a-list", "no-colon", "deep"]
NOT_USAGE_IDS += ["far", "far-colon"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"choices":[{"message":{"content":"the \\"usage\\": {\\"prompt_tokens\\": 9}"}}]}',  # in text
        b'{"usage":null}',
        b'{"usage":{"prompt_tokens":-1,"completion_tokens":true,"total_tokens":"3"}}',
        b'{"usage":"prompt_tokens"}',
        b'{"usage":[{"prompt_tokens":1}]}',
        b'{"x":"usage","usage" 5}',
        b'data: {"usage":' + b"[" * 100_000 + b"\n\n",  # deeper than any decoder goes
        b'{"usage":' + b" " * MAX_BYTES + b'{"prompt_tokens":1}}',  # its value begins past the bound
        b'{"usage"' + b" " * MAX_BYTES + b':{"prompt_tokens":1}}',  # and its colon
    ],
    ids=NOT_USAGE_IDS,
)
def test_what_is_not_a_usage_object_gives_no_counts(body: bytes) -> None:
    assert counts(body) == (None, None, None)
    assert counts(*(body[i : i + 64] for i in range(0, len(body), 64))) == (None, None, None)


def test_a_value_cut_and_never_finished_carries_a_bounded_tail() -> None:
    usage = Usage()
    usage.feed(b'data: {"usage":{"prompt_tokens":')
    for _ in range(100):
        usage.feed(b"1" * 1000)  # a number that never ends: dropped once over the bound
        assert len(usage._carried) < MAX_BYTES
    usage.feed(b'data: {"usage":{"prompt_tokens":2,"completion_tokens":1}}\n\n')
    assert (usage.prompt_tokens, usage.completion_tokens) == (2, 1)


@pytest.mark.parametrize(("size", "read"), [(MAX_BYTES, True), (MAX_BYTES + 1, False)])
def test_a_member_is_read_up_to_the_bound_however_it_is_cut(size: int, read: bool) -> None:
    """From the key to its value's end: `MAX_BYTES` are read, one more is not."""
    head, tail = b'"usage":{"prompt_tokens":3,', b'"completion_tokens":2}'
    member = head + b" " * (size - len(head) - len(tail)) + tail
    body = b'{"id":"x",' + member + b"}"
    expected = (3, 2, None) if read else (None, None, None)
    assert counts(body) == expected
    for cut in (1, 10, 12, len(head) + 10, len(body) - 3):
        assert counts(body[:cut], body[cut:]) == expected, cut


def test_the_largest_count_stands() -> None:
    """Counts only grow within an answer (a running total, then the final one): a smaller one
    later is an earlier stage of the same count, never a correction."""
    events = b'data: {"usage":{"prompt_tokens":9,"completion_tokens":4}}\n\n'
    events += b'data: {"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
    assert counts(events) == (9, 4, None)


def test_no_cached_tokens_is_a_count_of_zero() -> None:
    usage = CompletionUsage(
        prompt_tokens=8, completion_tokens=1, total_tokens=9, prompt_tokens_details={"cached_tokens": 0}
    )
    assert counts(b'{"usage":%s}' % usage.model_dump_json().encode()) == (8, 1, 0)


def test_every_member_is_read_and_a_usage_string_that_is_no_key_is_passed_over() -> None:
    body = b'{"tags":["usage"],"usage":{"prompt_tokens":5}}\n'
    body += b'{"usage":{"prompt_tokens_details":{"cached_tokens":4}}}\n{"usage":{"completion_tokens":3}}\n'
    assert counts(body) == (5, 3, 4)
    both = b'{"usage":{"prompt_tokens_details":{"cached_tokens":4},"cache_read_input_tokens":6}}'
    assert counts(both) == (None, None, 6)  # both names said: the larger, as for every count
