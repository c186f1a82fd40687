"""The edges of output-token counting that its mutants showed unasserted (benchmarks/mutation.py).

Content types as engines send them (case, parameters, none at all: the body sniffed), `[DONE]` and
`data:` with and without a space, SSE lines and JSON bodies exactly at their bounds and one byte past,
`usage` of 0 and of values that are not counts, choice indices at and past their bounds and in the order
sequences finish, and what `finish` does with the body's end. Bodies are shaped as vLLM writes them
(the helpers of test_output_tokens.py), OpenAI's where vLLM has no such answer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.epp.output_tokens import MAX_SEQUENCES, OutputTokens

from .test_output_tokens import MODEL, chat_chunk, count, fed, sse, text_chunk, usage_chunk, vllm_chat_stream

DONE = b"data: [DONE]\n\n"


def chat_answer(completion: int, *, n: int = 1) -> bytes:
    """vLLM's non-streamed chat completion, as its JSONResponse writes it (compact)."""
    message = {"role": "assistant", "content": "Hello!", "tool_calls": [], "reasoning_content": None}
    choice = {"message": message, "logprobs": None, "finish_reason": "stop", "stop_reason": None}
    choices = [{"index": i, **choice} for i in range(n)]
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
              "choices": choices, "usage": {"prompt_tokens": 12, "total_tokens": 12 + completion,
                                            "completion_tokens": completion, "prompt_tokens_details": None},
              "prompt_logprobs": None}  # fmt: skip
    return json.dumps(answer, separators=(",", ":")).encode()


def completions_answer(texts: list[str], usage: dict[str, Any] | None) -> bytes:
    """vLLM's non-streamed completion (`n` = len(texts)); `usage` None: an answer without one."""
    choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": "length", "stop_reason": None,
                "prompt_logprobs": None} for i, t in enumerate(texts)]  # fmt: skip
    answer: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
                              "choices": choices}  # fmt: skip
    if usage is not None:
        answer["usage"] = usage
    return json.dumps(answer, separators=(",", ":")).encode()


def chunk_with_usage(content: str, usage: dict[str, Any]) -> bytes:
    """A chat chunk carrying `usage` (vLLM's `continuous_usage_stats`)."""
    obj = json.loads(chat_chunk(content)[len(b"data: ") :])
    obj["usage"] = usage
    return sse(obj)


# --- which bodies are read as SSE, which as JSON ---


@pytest.mark.parametrize(
    "content_type",
    ["text/event-stream", "text/event-stream; charset=utf-8", "Text/Event-Stream;charset=UTF-8"],
)
def test_a_declared_event_stream_is_read_as_events_whatever_its_first_bytes(content_type):
    # a first line that is no `data:` field is ignored, never taken for the start of a JSON answer
    # (the sniff would read this body as JSON: only the declared type makes it events)
    body = b'{"note":"not an event"}\n' + vllm_chat_stream(["Hel", "lo"])
    counter = count(body, content_type=content_type)
    assert (counter.tokens, counter.bad_events, counter.skipped_lines) == (2, 0, 0)


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
@pytest.mark.parametrize("body", [b"Internal Server Error", b"null", b'"overloaded"'])
def test_a_declared_json_body_that_is_not_an_object_is_one_bad_event(content_type, body):
    counter = count(body, content_type=content_type)
    assert (counter.tokens, counter.bad_events, counter.oversize) == (0, 1, False)


@pytest.mark.parametrize("content_type", ["", "text/plain; charset=utf-8"])
def test_a_body_without_a_known_type_is_sniffed_an_event_stream_as_sse(content_type):
    counter = count(vllm_chat_stream(["a", "b", "c"]), content_type=content_type)
    assert (counter.tokens, counter.bad_events) == (3, 0)


@pytest.mark.parametrize("content_type", ["", "text/plain; charset=utf-8"])
def test_a_body_without_a_known_type_is_sniffed_json_after_leading_whitespace(content_type):
    counter = count(b"\r\n  " + chat_answer(9), content_type=content_type)
    assert (counter.tokens, counter.bad_events) == (9, 0)


def test_a_sniffed_body_opening_with_a_bracket_is_json_and_an_array_is_a_bad_event():
    counter = count(b'[{"choices":[],"usage":{"completion_tokens":4}}]', content_type="")
    assert (counter.tokens, counter.bad_events) == (0, 1)


# --- `data:` lines ---


def test_done_is_the_end_not_a_bad_event():
    counter = count(vllm_chat_stream(["a", "b"], usage=True))
    assert (counter.tokens, counter.bad_events) == (2, 0)


def test_data_without_a_space_after_the_colon_counts():
    # `data:{...}`: the space after the colon is optional in SSE, and some servers leave it out
    body = b"".join(chat_chunk(w).replace(b"data: ", b"data:", 1) for w in ["Hel", "lo", "!"])
    counter = count(body + b"data:[DONE]\n\n")
    assert (counter.tokens, counter.bad_events) == (3, 0)


# --- bounds: exactly at the bound is kept, one byte past is not ---


def test_an_sse_line_of_exactly_max_line_bytes_counts_in_one_chunk_or_split_at_its_newline():
    line = chat_chunk("Hello")[:-2]  # without its "\n\n"
    bound = len(line)
    whole = fed(OutputTokens("text/event-stream", max_line_bytes=bound), line + b"\n\n")
    split = fed(OutputTokens("text/event-stream", max_line_bytes=bound), line, b"\n\n")
    unended = fed(OutputTokens("text/event-stream", max_line_bytes=bound), line)  # finish counts it
    for counter in (whole, split, unended):
        assert (counter.tokens, counter.skipped_lines) == (1, 0)


def test_an_sse_line_one_byte_over_max_line_bytes_is_skipped_however_it_arrives():
    line = chat_chunk("Hello")[:-2]
    bound = len(line) - 1
    whole = fed(OutputTokens("text/event-stream", max_line_bytes=bound), line + b"\n\n")
    split = fed(OutputTokens("text/event-stream", max_line_bytes=bound), line, b"\n\n")
    unended = fed(OutputTokens("text/event-stream", max_line_bytes=bound), line)  # not kept for finish
    for counter in (whole, split, unended):
        assert (counter.tokens, counter.skipped_lines) == (0, 1)
    after = fed(OutputTokens("text/event-stream", max_line_bytes=bound), line, b"\n\n" + chat_chunk("a"))
    assert (after.tokens, after.skipped_lines) == (1, 1)


def test_a_json_body_of_exactly_max_json_bytes_is_counted_one_byte_more_is_not():
    raw = chat_answer(24, n=2)
    at = count(raw, content_type="application/json", max_json_bytes=len(raw))
    assert (at.tokens, at.per_sequence(), at.oversize) == (24, 12, False)
    for piece in (None, 10):
        over = count(raw, content_type="application/json", piece=piece, max_json_bytes=len(raw) - 1)
        assert (over.tokens, over.oversize, over.bad_events) == (0, True, 0)
        assert not over._buf


# --- usage ---


def test_usage_of_zero_is_exact_and_replaces_the_count():
    # 0 is the engine's word, not "no usage": it wins over the deltas counted before it
    usage = {"prompt_tokens": 6, "total_tokens": 6, "completion_tokens": 0}
    usage_event = sse({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
                       "choices": [], "usage": usage})  # fmt: skip
    body = text_chunk("The capital of France is", finish="length") + usage_event + DONE
    counter = count(body)
    assert (counter.counted, counter.usage, counter.tokens, counter.per_sequence()) == (1, 0, 0, 0)


def test_usage_of_zero_in_a_json_answer_is_exact():
    counter = count(chat_answer(0), content_type="application/json")
    assert (counter.usage, counter.tokens) == (0, 0)


def test_continuous_usage_starting_at_zero_follows_the_engine():
    # vLLM's continuous_usage_stats: the role chunk says 0, then each token chunk its running total
    body = chunk_with_usage("", {"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0})
    counter = fed(OutputTokens("text/event-stream"), body, finish=False)
    assert (counter.usage, counter.tokens) == (0, 0)
    for n in (1, 2):
        usage = {"prompt_tokens": 5, "total_tokens": 5 + n, "completion_tokens": n}
        counter.feed(chunk_with_usage("x", usage))
        assert (counter.usage, counter.tokens) == (n, n)


def test_a_usage_without_a_completion_count_counts_nothing_and_never_raises():
    # OpenAI's embeddings answer: usage has prompt and total tokens only
    data = [{"object": "embedding", "index": 0, "embedding": [0.0023, -0.0093]}]
    usage = {"prompt_tokens": 8, "total_tokens": 8}
    embeddings = {"object": "list", "data": data, "model": "text-embedding-3-small", "usage": usage}
    counter = count(json.dumps(embeddings).encode(), content_type="application/json")
    assert (counter.usage, counter.tokens, counter.bad_events, counter.sequences) == (None, 0, 0, 1)
    body = chat_chunk("a") + chunk_with_usage("b", {"prompt_tokens": 5, "total_tokens": 5}) + DONE
    streamed = count(body)
    assert (streamed.usage, streamed.tokens) == (None, 2)


@pytest.mark.parametrize("value", [True, False, -1, "5", 2.0, None])
def test_a_completion_count_that_is_not_a_count_is_ignored(value):
    body = chat_chunk("a") + chat_chunk("b") + chat_chunk("c")
    body += sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                 "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": value}})  # fmt: skip
    counter = count(body + DONE)
    assert (counter.usage, counter.tokens) == (None, 3)


# --- choices and sequences ---


def test_sequences_are_the_highest_index_when_sequence_zero_finishes_last():
    # n=2 as vLLM streams it: a role chunk per choice, then each choice's tokens; here choice 1
    # stops first and choice 0 writes the last chunk
    body = chat_chunk("", index=0, role=True) + chat_chunk("", index=1, role=True)
    body += chat_chunk("A", index=0) + chat_chunk("B", index=1) + chat_chunk("", index=1, finish="stop")
    body += chat_chunk("C", index=0) + chat_chunk("D", index=0) + chat_chunk("", index=0, finish="length")
    counter = count(body + DONE)
    assert (counter.sequences, counter.tokens, counter.per_sequence()) == (2, 4, 2)
    with_usage = count(body + usage_chunk(5) + DONE)
    assert (with_usage.sequences, with_usage.tokens, with_usage.per_sequence()) == (2, 5, 3)


@pytest.mark.parametrize(("index", "sequences"), [(0, 1), (1, 2), (MAX_SEQUENCES - 1, MAX_SEQUENCES)])
def test_a_choice_index_below_max_sequences_sets_the_sequences(index, sequences):
    counter = count(chat_chunk("x", index=index) + usage_chunk(2 * sequences))
    assert (counter.sequences, counter.per_sequence()) == (sequences, 2)


@pytest.mark.parametrize("index", [-1, True, None, "1", 1.0, MAX_SEQUENCES, MAX_SEQUENCES + 1])
def test_a_choice_index_that_is_not_believed_leaves_one_sequence_and_still_counts(index):
    counter = count(chat_chunk("x", index=index) + chat_chunk("y", index=index) + DONE)
    assert (counter.sequences, counter.tokens, counter.per_sequence()) == (1, 2, 2)


def test_a_choice_that_is_not_an_object_does_not_hide_the_choices_after_it():
    choice = {"index": 1, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}
    body = sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                "choices": [None, "x", choice]})  # fmt: skip
    counter = count(body + DONE)
    assert (counter.tokens, counter.sequences) == (1, 2)


# --- finish: the body's end ---


@pytest.mark.parametrize("content_type", ["text/event-stream", ""])
def test_finish_counts_a_last_line_without_a_newline_declared_or_sniffed(content_type):
    body = vllm_chat_stream(["a", "b"])[: -len(DONE)] + chat_chunk("c").rstrip(b"\n")
    counter = fed(OutputTokens(content_type), body, finish=False)
    assert counter.tokens == 2
    counter.finish()
    assert (counter.tokens, counter.bad_events, counter.skipped_lines) == (3, 0, 0)


def test_finish_reads_a_json_answer_only_once_it_is_whole():
    raw = chat_answer(7)
    counter = fed(OutputTokens("application/json"), raw[:20], raw[20:], finish=False)
    assert counter.tokens == 0
    counter.finish()
    assert (counter.tokens, counter.bad_events) == (7, 0)


def test_finish_of_an_empty_json_body_is_no_bad_event():
    for chunks in ((), (b"",)):
        counter = fed(OutputTokens("application/json; charset=utf-8"), *chunks)
        assert (counter.tokens, counter.bad_events, counter.oversize) == (0, 0, False)


def test_a_non_streamed_completions_answer_counts_its_usage_not_its_choices():
    usage = {"prompt_tokens": 5, "total_tokens": 25, "completion_tokens": 20}
    counter = count(completions_answer([" Paris.", " Lyon."], usage), content_type="application/json")
    assert (counter.counted, counter.tokens, counter.sequences, counter.per_sequence()) == (0, 20, 2, 10)
    # without usage the answer's tokens are unknown: nothing is counted from its texts
    counter = count(completions_answer([" Paris.", " Lyon."], None), content_type="application/json")
    assert (counter.counted, counter.tokens, counter.sequences) == (0, 0, 2)
