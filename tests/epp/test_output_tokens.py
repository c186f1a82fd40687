"""Counting generated tokens in response bodies: vLLM-shaped SSE chunks, usage, JSON answers, bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc.epp.output_tokens import MAX_SEQUENCES, OutputTokens

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chat_chunk(content, *, index=0, finish=None, role=False, **delta_extra):
    delta = {"role": "assistant", "content": content} if role else {"content": content}
    delta |= delta_extra
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                "choices": [choice]})  # fmt: skip


def text_chunk(text, *, index=0, finish=None):
    choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    return sse(
        {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL, "choices": [choice]}
    )


def usage_chunk(completion, prompt=12):
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                "choices": [], "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                         "completion_tokens": completion}})  # fmt: skip


def vllm_chat_stream(words, *, usage=False) -> bytes:
    """What vLLM streams for a chat completion: a role chunk with empty content, one chunk per token,
    an empty last delta with the finish reason, the usage chunk when asked, [DONE]."""
    out = chat_chunk("", role=True)
    out += b"".join(chat_chunk(w) for w in words)
    out += chat_chunk("", finish="stop")
    if usage:
        out += usage_chunk(len(words))
    return out + b"data: [DONE]\n\n"


def fed(counter: OutputTokens, *chunks: bytes, finish: bool = True) -> OutputTokens:
    """Feed the body chunk by chunk, the buffer within its bound after each; then end the body."""
    for chunk in chunks:
        counter.feed(chunk)
        bound = counter.max_json_bytes if counter._mode == "json" else counter.max_line_bytes
        assert len(counter._buf) <= bound
    if finish:
        counter.finish()
    return counter


def count(body: bytes, *, content_type="text/event-stream", piece=None, **bounds) -> OutputTokens:
    step = piece or len(body) or 1
    return fed(OutputTokens(content_type, **bounds), *(body[i : i + step] for i in range(0, len(body), step)))


def test_a_vllm_chat_stream_counts_one_token_per_content_delta():
    counter = count(vllm_chat_stream(["Hel", "lo", ",", " world", "!"]))
    assert (counter.tokens, counter.usage, counter.sequences) == (5, None, 1)


@pytest.mark.parametrize("piece", [1, 7, 64, None])
def test_chunk_boundaries_anywhere_change_nothing(piece):
    body = vllm_chat_stream([f"w{i}" for i in range(40)])
    assert count(body, piece=piece).tokens == 40


def test_the_usage_chunk_is_exact_and_replaces_the_count():
    body = chat_chunk("", role=True) + chat_chunk("ab") + usage_chunk(7) + b"data: [DONE]\n\n"
    counter = count(body)
    assert (counter.counted, counter.usage, counter.tokens) == (1, 7, 7)


def test_continuous_usage_stats_are_followed_chunk_by_chunk():
    counter = OutputTokens("text/event-stream")
    for n in range(1, 4):
        obj = json.loads(chat_chunk("x")[6:])
        obj["usage"] = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        counter.feed(sse(obj))
        assert counter.tokens == n


def test_completions_stream_counts_text_chunks():
    body = b"".join(text_chunk(t) for t in ["a", "b", "", "c"]) + b"data: [DONE]\n\n"
    assert count(body).tokens == 3


def test_reasoning_and_tool_call_deltas_count():
    body = chat_chunk(None, reasoning_content="think") + chat_chunk(
        None, tool_calls=[{"index": 0, "function": {"arguments": "{"}}]
    )
    assert count(body).tokens == 2


def test_n_choices_are_sequences_and_usage_is_their_total():
    body = b"".join(chat_chunk(f"t{i}", index=i % 3) for i in range(9)) + usage_chunk(10)
    counter = count(body)
    assert (counter.sequences, counter.tokens, counter.per_sequence()) == (3, 10, 4)


def test_a_choice_index_past_the_bound_is_not_believed():
    counter = count(chat_chunk("x", index=MAX_SEQUENCES) + chat_chunk("y", index=1))
    assert counter.sequences == 2


def test_a_non_streamed_json_answer_reads_usage_and_choices():
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
              "choices": [{"index": i, "message": {"role": "assistant", "content": "hi"},
                           "finish_reason": "stop"} for i in range(2)],
              "usage": {"prompt_tokens": 9, "completion_tokens": 24, "total_tokens": 33}}  # fmt: skip
    raw = json.dumps(answer).encode()
    for content_type in ("application/json", ""):
        counter = count(raw, content_type=content_type, piece=10)
        assert (counter.tokens, counter.sequences, counter.per_sequence()) == (24, 2, 12)


def test_a_json_body_over_its_bound_is_not_counted_and_not_kept():
    raw = json.dumps({"choices": [], "usage": {"completion_tokens": 5}, "pad": "x" * 200}).encode()
    counter = count(raw, content_type="application/json", piece=50, max_json_bytes=100)
    assert counter.oversize and counter.tokens == 0  # and nothing kept past the bound (`fed`)


def test_an_sse_line_over_the_bound_is_skipped_counted_and_the_stream_goes_on():
    long_line = chat_chunk("z" * 500)
    body = chat_chunk("a") + long_line + chat_chunk("b") + long_line + chat_chunk("c")
    for piece in (1, 33, None):
        counter = count(body, piece=piece, max_line_bytes=200)
        assert (counter.tokens, counter.skipped_lines) == (3, 2)  # never more than 200 bytes kept (`fed`)


def test_garbage_and_other_sse_fields_count_nothing_and_never_raise():
    body = b": keep-alive\n\nevent: x\nid: 3\ndata: {not json\n\ndata: [1,2]\n\ndata: \n\n" + chat_chunk("a")
    counter = count(body)
    assert (counter.tokens, counter.bad_events) == (1, 2)


def test_crlf_lines_and_a_last_line_without_newline():
    body = chat_chunk("a").replace(b"\n", b"\r\n") + chat_chunk("b").rstrip(b"\n")
    assert count(body).tokens == 2


# --- the Responses API, as vLLM 0.33.0 writes it (tests/request/engines/vllm-0.33.0/responses.json) ---

_ANSWERS = json.loads(
    (Path(__file__).parents[1] / "request" / "engines" / "vllm-0.33.0" / "responses.json").read_text()
)["answers"]


def responses_stream(deltas: int, *, completed_tokens: int | None = None) -> bytes:
    out = (_ANSWERS["sse_created"] + _ANSWERS["sse_in_progress"]).encode()
    out += _ANSWERS["sse_first_delta"].encode() * deltas
    if completed_tokens is not None:
        response = {"id": "resp_1", "status": "completed", "usage": {"output_tokens": completed_tokens}}
        done = {"response": response, "sequence_number": 9, "type": "response.completed"}
        out += b"event: response.completed\n" + sse(done)
    return out


@pytest.mark.parametrize("piece", [1, 97, None])
def test_a_responses_stream_counts_its_text_deltas_then_takes_the_completed_usage(piece):
    assert count(responses_stream(5), piece=piece).tokens == 5  # created and in_progress count nothing
    counter = count(responses_stream(5, completed_tokens=7), piece=piece)
    assert (counter.counted, counter.usage, counter.tokens) == (5, 7, 7)


def test_a_non_streamed_responses_answer_reads_its_output_tokens():
    answer = json.loads(_ANSWERS["json"])
    answer["usage"] = {"input_tokens": 3, "output_tokens": 11, "total_tokens": 14}
    counter = count(json.dumps(answer).encode(), content_type="application/json")
    assert (counter.tokens, counter.counted) == (11, 0)


def anthropic_event(kind: str, **data) -> bytes:
    return f"event: {kind}\n".encode() + sse({"type": kind, **data})


def test_an_anthropic_messages_stream_counts_its_deltas_then_takes_the_message_delta_usage():
    start = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "usage": {"input_tokens": 9},
    }
    body = anthropic_event("message_start", message=start)
    body += anthropic_event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    body += anthropic_event("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}) * 4
    assert count(body).tokens == 4
    body += anthropic_event("content_block_stop", index=0)
    body += anthropic_event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 5})
    counter = count(body + anthropic_event("message_stop"))
    assert (counter.counted, counter.usage, counter.tokens) == (4, 5, 5)
