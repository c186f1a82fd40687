"""A rewritten request's answer names the asked model again, whatever the chunks' boundaries."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from extproc.epp.asked_model import ModelNameRestorer

SENT, ASKED = "foodreview-v2", "foodreview"
CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": SENT}
STREAM = b"".join(
    b"data: " + json.dumps({**CHUNK, "choices": [{"delta": {"content": w}}]}, separators=(",", ":")).encode()
    + b"\n\n"
    for w in ["Hel", "lo", "!"]
) + b"data: [DONE]\n\n"  # fmt: skip


def restored(body: bytes, cuts: list[int], sent: str = SENT, asked: str = ASKED) -> bytes:
    """`body` fed in the pieces `cuts` make, the last one ending the body."""
    restorer = ModelNameRestorer(sent, asked)
    bounds = [0, *sorted(cuts), len(body)]
    pieces = [body[a:b] for a, b in itertools.pairwise(bounds)]
    out = b"".join(restorer.feed(p) for p in pieces[:-1]) + restorer.feed(pieces[-1], end=True)
    assert restorer.held == 0
    return out


def test_every_chunk_of_an_event_stream_names_the_asked_model_at_every_single_cut() -> None:
    expected = STREAM.replace(b'"model":"foodreview-v2"', b'"model":"foodreview"')
    assert expected.count(b'"model":"foodreview"') == 3
    for cut in range(len(STREAM) + 1):
        assert restored(STREAM, [cut]) == expected, cut


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_bytes(cuts: list[int]) -> None:
    assert restored(STREAM, cuts) == restored(STREAM, [])


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        (b'{"model": "foodreview-v2"}', b'{"model": "foodreview"}'),  # json.dumps' default separator
        (b'{"model":"foodreview-v2"}', b'{"model":"foodreview"}'),
        (b'{"model":"foodreview-v2-large"}', b'{"model":"foodreview-v2-large"}'),  # another name
        (b'{"base_model":"foodreview-v2"}', b'{"base_model":"foodreview-v2"}'),  # another member
        (b'{"content":"my model:\\"foodreview-v2\\""}', b'{"content":"my model:\\"foodreview-v2\\""}'),
        (b'{"model"  :  "foodreview-v2"}', b'{"model"  :  "foodreview-v2"}'),  # left as served
    ],
)
def test_only_the_model_member_with_the_sent_name_is_replaced(written: bytes, expected: bytes) -> None:
    assert restored(written, []) == expected


def test_a_name_with_non_ascii_characters_is_found_raw_or_escaped_and_written_alike() -> None:
    sent, asked = "crème-v2", "crème"
    for ensure_ascii in (False, True):
        body = json.dumps({"model": sent}, ensure_ascii=ensure_ascii).encode()
        expected = json.dumps({"model": asked}, ensure_ascii=ensure_ascii).encode()
        assert restored(body, [len(body) // 2], sent, asked) == expected


def test_a_name_needing_escapes_is_matched_as_json_writes_it() -> None:
    sent, asked = 'org/"quoted"\\model', "plain"
    body = json.dumps({"id": 1, "model": sent}, separators=(",", ":")).encode()
    assert json.loads(restored(body, [9, 20])) == {"id": 1, "model": sent}  # not this pair's name
    assert json.loads(restored(body, [9, 20], sent, asked)) == {"id": 1, "model": asked}


def test_only_a_possible_beginning_is_held_back_and_never_a_line_end() -> None:
    restorer = ModelNameRestorer(SENT, ASKED)
    assert restorer.feed(b'data: {"id":1,"mod') == b'data: {"id":1,'
    assert restorer.held == len(b'"mod')
    assert restorer.feed(b'el":"foodreview-v2"}\n\n') == b'"model":"foodreview"}\n\n'
    assert restorer.held == 0
    assert restorer.feed(b'{"x":"a"}\n\n') == b'{"x":"a"}\n\n'  # nothing that could begin one
    assert restorer.feed(b'"') == b""  # a quote could
    assert restorer.feed(b"", end=True) == b'"'


def test_a_tail_longer_than_any_pattern_is_sent() -> None:
    restorer = ModelNameRestorer(SENT, ASKED)
    chunk = b'{"' + b"m" * 40
    assert restorer.feed(chunk) == chunk


def test_the_same_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^nothing to restore: the model was sent as asked$"):
        ModelNameRestorer(SENT, SENT)


def test_nothing_is_held_before_the_first_chunk() -> None:
    assert ModelNameRestorer(SENT, ASKED).held == 0


# any bytes, not only JSON: pieces of the patterns, quotes and filler, cut anywhere
PIECES = st.sampled_from(
    [
        b'"model":"foodreview-v2"',
        b'"model": "foodreview-v2"',
        b'"model',
        b'":"foodreview',
        b'"',
        b'""',
        b"x",
        b"-v2",
    ]
)


@given(st.lists(PIECES, max_size=12).map(b"".join), st.lists(st.integers(0, 300), max_size=6))
@example(b'"model":"foodreview-v2"model":"foodreview-v2"', [23])  # two sharing a quote, cut between
def test_any_bytes_cut_anywhere_give_what_the_whole_body_gives(body: bytes, cuts: list[int]) -> None:
    assert restored(body, [min(c, len(body)) for c in cuts]) == restored(body, [])


def test_the_longest_beginning_of_a_pattern_is_held() -> None:
    """A chunk that ends one byte short of the longest form (one space after the colon)."""
    body = b'{"model": "foodreview-v2"}'
    assert restored(body, [len(body) - 2]) == b'{"model": "foodreview"}'


# --- vLLM 0.33.0's own Responses API bytes (tests/request/engines/vllm-0.33.0/responses.json, model "m")

VLLM_RESPONSES = json.loads(
    (Path(__file__).parents[1] / "request" / "engines" / "vllm-0.33.0" / "responses.json").read_text()
)["answers"]


@pytest.mark.parametrize("answer", ["json", "sse_created", "sse_in_progress"])
def test_vllms_responses_answers_name_the_asked_model(answer: str) -> None:
    body = VLLM_RESPONSES[answer].encode()
    out = restored(body, [len(body) // 3, len(body) // 2], sent="m", asked="my-alias")
    assert out.count(b'"model":"my-alias"') == 1
    assert out.replace(b'"model":"my-alias"', b'"model":"m"') == body  # nothing else changed
