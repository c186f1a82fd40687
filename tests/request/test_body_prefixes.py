"""BodyPrefixes: a body that begins as a stored one parses to what `json.loads` gives, error for error."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.errors import RequestInvalid
from extproc.request import body_prefixes as bp
from extproc.request.body_prefixes import BodyPrefixes, MessagesSpans, _common_prefix
from extproc.request.parse import (
    _DECODER,
    _SURROGATE_ESCAPE,
    body_prefixes,
    parse_openai_body,
    parse_shared_body,
)
from tests.request.chat_generator import ChatGenerator

CHAT = "/v1/chat/completions"
STEP = 64  # small checkpoints: bodies of a few hundred bytes go through the walk


def store(max_bytes: int = 1 << 20) -> BodyPrefixes:
    return BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, max_bytes, checkpoint_bytes=STEP)


def expected(text: str) -> tuple[str, Any]:
    """What json.loads says: ("ok", value) or (error type, message)."""
    try:
        return "ok", json.loads(text, parse_constant=_reject)
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


def got(prefixes: BodyPrefixes, text: str) -> tuple[str, Any]:
    try:
        value, escaped = prefixes.loads(text, text.encode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)
    assert escaped == (_SURROGATE_ESCAPE.search(text) is not None), text
    return "ok", value


def _reject(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def assert_parses_alike(prefixes: BodyPrefixes, *texts: str) -> None:
    for text in texts:
        assert got(prefixes, text) == expected(text), text


def chat_body(messages: list[Any], **fields: Any) -> str:
    return json.dumps({"model": "m", "messages": messages, **fields})


def test_a_growing_chat_parses_only_its_new_messages():
    prefixes = body_prefixes()  # the parse worker's, at its real checkpoint size
    conversation = ChatGenerator("llama3_1", seed=3).conversation(0)
    words = [f"word{i}" for i in range(50)]
    history: list[dict[str, Any]] = []
    turns = 0
    while len(json.dumps(history)) < 200_000:
        history = [
            *history,
            {"role": "user", "content": " ".join(random.Random(turns).choices(words, k=2000))},
        ]
        history.append({"role": "assistant", "content": f"answer {turns} é ☃"})  # not ASCII
        body = chat_body(history, tools=conversation.tools, stream=True).encode()
        request = parse_openai_body(body, CHAT, max_bytes=1 << 30, prefixes=prefixes)
        assert request == parse_openai_body(body, CHAT, max_bytes=1 << 30)
        turns += 1
    stats = prefixes.stats()
    assert stats.hits >= stats.lookups - 1 > 5  # each turn from the one before
    assert stats.reused_bytes > 0.8 * len(body) * (stats.hits / 2)  # most of each body, on average
    assert stats.entries == 1  # each turn replaced the one it extends


@pytest.mark.parametrize(
    "first, second",
    [
        # the character after a shared number extends it: parsed whole, same value
        ('{"messages":[{"r":1}],"n":12,"pad":"%s"}', '{"messages":[{"r":1}],"n":123,"pad":"%s"}'),
        ('{"messages":[1,2],"pad":"%s"}', '{"messages":[1,23],"pad":"%s"}'),
        ('{"messages":[1,2.5],"pad":"%s"}', '{"messages":[1,2.5e3],"pad":"%s"}'),
        ('{"messages":[true],"pad":"%s"}', '{"messages":[truex],"pad":"%s"}'),
        ('{"pad":"%s","messages":[null,"a"]}', '{"pad":"%s","messages":[nullnull]}'),
        # a value that differs only in its last characters is not taken
        ('{"pad":"%s","x":"ab","messages":[]}', '{"pad":"%s","x":"ac","messages":[]}'),
        ('{"pad":"%s","x":"ab","messages":[]}', '{"pad":"%s","x":"a","messages":[]}'),
        ('{"pad":"%s","x":[1,2],"messages":[]}', '{"pad":"%s","x":[1,3],"messages":[]}'),
        ('{"pad":"%s","x":1,"messages":[]}', '{"pad":"%s","x":2,"messages":[]}'),
        ('{"pad":"%s","messages":["ab","c"]}', '{"pad":"%s","messages":["ac","c"]}'),
        ('{"pad":"%s","messages":["a",1]}', '{"pad":"%s","messages":["a",2]}'),
        ('{"pad":"%s","messages":[{"a":[1]}]}', '{"pad":"%s","messages":[{"a":[2]}]}'),
        # the array moved: nothing of it is taken
        (
            '{"model":"a","pad":"%s","messages":[{"a":1},{"b":2}]}',
            '{"model":"ab","pad":"%s","messages":[{"a":1}]}',
        ),
        # a second `messages`: the last wins, as in json.loads
        ('{"pad":"%s","messages":[1,2],"messages":[3]}', '{"pad":"%s","messages":[1,2],"messages":[3,4]}'),
        ('{"pad":"%s","messages":[{"x":1}]}', '{"pad":"%s","messages":[{"x":1}],"messages":{"y":2}}'),
        # white space everywhere JSON allows it
        (
            ' {\n "pad" : "%s" ,\t"messages" : [ {"a" : 1} , {"b":2}\r] } ',
            ' {\n "pad" : "%s" ,\t"messages" : [ {"a" : 1} , {"b":2} , [] ] }\n',
        ),
        # errors after the shared part, and at its edge
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1}],}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1},]}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1}]} x'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1},NaN]}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1},-Infinity]}'),
        (
            '{"pad":"%s","messages":[{"a":1}]}',
            '{"pad":"%s","messages":[{"a":1},' + "[" * 100_000 + "]" * 100_000 + "]}",
        ),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1},"\\x"]}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1}]}\ufeff'),
        ('{"pad":"%s","messages":[{"a":1}]}', '["pad","%s"]'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s"}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[]}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":"[]"}'),
        ('{"pad":"%s","messages":[{"a":1}]}', '{"pad":"%s","messages":[{"a":1}],"n":1' + "0" * 5000 + "}"),
        # not ASCII before, in and after the shared part (offsets in bytes differ from characters)
        (
            '{"pad":"%s","messages":[{"a":"é☃😀"},{"b":"ü"}]}',
            '{"pad":"%s","messages":[{"a":"é☃😀"},{"b":"ü"},{"c":"ß"}]}',
        ),
        (
            '{"pad":"%s","messages":[{"a":"é☃😀"},{"b":"ü"}]}',
            '{"pad":"%s","messages":[{"a":"é☃😀"},{"b":"üü"}]}',
        ),
        # a member after the messages, taken, with multi-byte text before it and an escape after it
        (
            '{"messages":[{"a":"%s' + "é" * 40 + '"}],"x":"y","z":"' + "w" * 100 + '"}',
            '{"messages":[{"a":"%s' + "é" * 40 + '"}],"x":"y","z":"\\ud800"}',
        ),
        # the surrogate-escape watch, with escapes before, across and after the shared part
        ('{"pad":"%s","messages":["\\ud83d\\ude00"]}', '{"pad":"%s","messages":["\\ud83d\\ude00","x"]}'),
        ('{"pad":"%s","messages":["a"]}', '{"pad":"%s","messages":["a","\\ud800"]}'),
        ('{"pad":"%s","messages":["a\\\\"]}', '{"pad":"%s","messages":["a\\\\","\\udc00x"]}'),
        ('{"pad":"%s","messages":["ab"],"x":"\\u"}', '{"pad":"%s","messages":["ab"],"x":"\\uD800"}'),
    ],
)
def test_a_body_after_a_stored_one_parses_as_json_loads_does(first: str, second: str):
    pad = "p" * (3 * STEP)
    prefixes = store()
    assert_parses_alike(prefixes, first.replace("%s", pad), second.replace("%s", pad))
    assert_parses_alike(prefixes, second.replace("%s", pad), first.replace("%s", pad))


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text()}),
        json_values,
    ),
    max_size=8,
)


@st.composite
def body_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """A body and a later one: more messages, a change somewhere, other white space, or bytes changed."""
    first = draw(messages)
    extra = draw(
        st.dictionaries(st.sampled_from(["model", "tools", "stream", "n", "z"]), json_values, max_size=3)
    )
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (",\n", " : ")]))
    pad = "p" * draw(st.integers(0, 4 * STEP))
    order = draw(st.booleans())

    def dump(msgs: list[Any], fields: dict[str, Any]) -> str:
        obj = {"pad": pad, "messages": msgs, **fields} if order else {**fields, "messages": msgs, "pad": pad}
        return json.dumps(obj, separators=separators, ensure_ascii=draw(st.booleans()))

    a = dump(first, extra)
    kind = draw(st.sampled_from(["grow", "change", "fields", "bytes"]))
    if kind == "grow":
        b = dump(first + draw(messages), extra)
    elif kind == "change" and first:
        second = list(first)
        second[draw(st.integers(0, len(first) - 1))] = draw(json_values)
        b = dump(second, extra)
    elif kind == "fields":
        b = dump(first, {**extra, **draw(st.dictionaries(st.sampled_from(["model", "n", "q"]), json_values))})
    else:
        at = draw(st.integers(0, len(a)))
        b = (
            a[:at]
            + draw(st.sampled_from(["", ",", "]", "}", "1", " ", '"', "\\", "é", "\\ud800", "[", "e5"]))
            + a[at + draw(st.integers(0, 3)) :]
        )
    return a, b


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=st.lists(body_pairs(), min_size=1, max_size=3))
def test_random_bodies_after_stored_ones_parse_as_json_loads_does(pairs):
    prefixes = store()
    for a, b in pairs:
        assert_parses_alike(prefixes, a, b, a)


def test_a_long_messages_array_is_parsed_whole():
    prefixes = store()
    text = chat_body([{"role": "user", "content": "x"}] * (bp.MAX_ELEMENTS + 1))
    assert_parses_alike(prefixes, text, text)
    assert prefixes.stats().whole == 2 and prefixes.stats().entries == 0


def test_the_store_stays_within_its_bytes_and_short_bodies_are_not_kept():
    prefixes = store(max_bytes=20_000)
    for i in range(50):
        assert_parses_alike(prefixes, chat_body([{"role": "user", "content": f"{i} " * 300}]))
        assert prefixes.stats().bytes <= 20_000
    assert 0 < prefixes.stats().entries < 50
    assert_parses_alike(prefixes, chat_body([{"role": "user", "content": "x" * 30_000}]))  # over the bound
    assert_parses_alike(prefixes, '{"messages":[]}')  # under two checkpoints: parsed whole, not looked up
    assert prefixes.stats().lookups == 51
    with pytest.raises(ValueError):
        BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, -1)


def test_a_stored_bodys_unpaired_surrogate_is_refused_in_the_next_one_too():
    prefixes = body_prefixes(max_bytes=1 << 20)
    pad = "p" * 40_000
    bad = chat_body([{"role": "user", "content": "\ud800" + pad}]).encode()  # json.dumps escapes it
    for body in (
        bad,
        chat_body([{"role": "user", "content": "\ud800" + pad}, {"role": "user", "content": "x"}]).encode(),
    ):
        with pytest.raises(RequestInvalid, match="unpaired UTF-16 surrogate"):
            parse_openai_body(body, CHAT, max_bytes=1 << 30, prefixes=prefixes)
    fine = chat_body([{"role": "user", "content": "😀" + pad}])  # escaped as a pair
    for body in (fine, fine[:-2] + ',{"role":"user","content":"\\udfff"}]}'):
        want = "ok"
        try:
            parse_openai_body(body.encode(), CHAT, max_bytes=1 << 30)
        except RequestInvalid as exc:
            want = exc.message
        try:
            parse_openai_body(body.encode(), CHAT, max_bytes=1 << 30, prefixes=prefixes)
            have = "ok"
        except RequestInvalid as exc:
            have = exc.message
        assert have == want
    assert prefixes.stats().hits >= 2


def test_a_byte_order_mark_is_refused_as_json_loads_refuses_it():
    prefixes = body_prefixes(max_bytes=1 << 20)
    body = ("\ufeff" + chat_body([{"role": "user", "content": "x" * 40_000}])).encode()
    with pytest.raises(RequestInvalid) as with_store:
        parse_openai_body(body, CHAT, max_bytes=1 << 30, prefixes=prefixes)
    with pytest.raises(RequestInvalid) as without:
        parse_openai_body(body, CHAT, max_bytes=1 << 30)
    assert with_store.value.message == without.value.message


def test_a_bounded_parse_parses_only_a_short_new_part_and_nothing_else():
    prefixes = store()
    pad = "p" * (3 * STEP)
    first = chat_body([{"role": "system", "content": pad}, {"role": "user", "content": "a"}])
    assert prefixes.loads_shared(first.encode(), 100) is None  # nothing stored: not parsed
    assert prefixes.stats().entries == 0
    assert_parses_alike(prefixes, first)
    grown = first[:-2] + ', {"role": "user", "content": "b"}]}'
    assert got_shared(prefixes, grown, 100) == expected(grown)
    longer = grown[:-2] + ', {"role": "user", "content": "' + "c" * 200 + '"}]}'
    assert prefixes.loads_shared(longer.encode(), 100) is None  # 200 bytes new: not here
    broken = grown[:-2] + ", NaN]}"
    assert prefixes.loads_shared(broken.encode(), 100) is None  # the error is the worker's
    assert prefixes.loads_shared(grown.encode()[:-3] + b'\xff"]}', 100) is None  # not UTF-8 either
    assert prefixes.stats().whole == 1
    moved = grown.replace('"model": "m"', '"model": "mm"')
    assert prefixes.loads_shared(moved.encode(), 100) is None  # the array moved: all of it new


def got_shared(prefixes: BodyPrefixes, text: str, max_unshared: int) -> tuple[str, Any]:
    loaded = prefixes.loads_shared(text.encode(), max_unshared)
    assert loaded is not None
    assert loaded[1] == (_SURROGATE_ESCAPE.search(text) is not None)
    return "ok", loaded[0]


def test_messages_parsed_elsewhere_are_taken_where_they_lie_and_can_be_forgotten():
    worker, loop = store(), store()
    messages = [{"role": "system", "content": "p" * (3 * STEP) + "é☃"}, {"role": "user", "content": "😀"}]
    first = json.dumps({"model": "m", "messages": messages}, ensure_ascii=False)  # bytes != characters
    value, _ = worker.loads(first, first.encode())
    assert worker.last is not None and len(worker.last.element_ends) == 2
    body = first.encode()
    loop.remember(body, value["messages"], worker.last)
    grown = first[:-2] + ', {"role": "user", "content": "ü"}]}'
    assert got_shared(loop, grown, 100) == expected(grown)
    assert loop.stats().hits == 1
    loop.remember(body, value["messages"], worker.last)
    changed = first.replace("😀", "😁")  # differs in the emoji's last byte: its element is new
    assert got_shared(loop, changed, 100) == expected(changed)
    loop.forget(grown.encode())  # not that object: nothing dropped
    assert loop.stats().entries >= 1
    again = store()
    again.remember(body, value["messages"], worker.last)
    again.forget(body)
    assert again.stats().entries == 0 and again.loads_shared(grown.encode(), 100) is None
    short = '{"messages": [1]}'
    worker.loads(short, short.encode())
    assert worker.last is None  # under two checkpoints: not walked


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_grown_body_takes_exactly_what_it_shares_and_the_store_counts_it(separators, ascii_only):
    prefixes = store()
    assert prefixes.last is None

    def dump(messages: list[Any]) -> str:
        obj = {"model": "m", "tools": [1, 2], "messages": messages, "stream": True}
        return json.dumps(obj, separators=separators, ensure_ascii=ascii_only)

    def ends(text: str, messages: list[Any]) -> tuple[list[int], list[int]]:
        at, chars = 0, []
        for m in messages:
            piece = json.dumps(m, separators=separators, ensure_ascii=ascii_only)
            at = text.index(piece, at) + len(piece)
            chars.append(at)
        return chars, [len(text[:c].encode()) for c in chars]

    messages = [{"role": "system", "content": "p" * 3 * STEP + "é☃"}, {"role": "user", "content": "a"}]
    first = dump(messages)
    assert_parses_alike(prefixes, first)
    assert prefixes.last is not None and prefixes.stats().whole == 0
    chars, byte_ends = ends(first, messages)
    assert list(prefixes.last.element_ends) == chars and list(prefixes.last.element_byte_ends) == byte_ends
    assert prefixes.last.array_start == first.index("[", first.index('"messages"'))
    assert prefixes.last.clean == len(first)

    grown = [*messages, {"role": "user", "content": "b"}]
    second = dump(grown)
    body = second.encode()
    assert ("ok", prefixes.loads(second, body)[0]) == expected(second)
    chars2, byte_ends2 = ends(second, grown)
    stats = prefixes.stats()
    assert (stats.lookups, stats.hits, stats.whole) == (2, 1, 0)
    assert stats.reused_bytes == byte_ends[-1]  # up to the last message they share, members included
    assert list(prefixes.last.element_ends) == chars2 and list(prefixes.last.element_byte_ends) == byte_ends2

    def size(data: bytes, elements: int) -> int:  # model, tools and stream are kept members too
        return 3 * len(data) + (3 + elements) * 120 + 64 * (len(data) // STEP)

    # the first body stays only if its last checkpoint lies past what the second shares with it
    kept_first = len(first.encode()) // STEP * STEP > byte_ends[-1]
    assert stats.entries == 1 + kept_first
    assert stats.bytes == size(body, 3) + kept_first * size(first.encode(), 2)
    assert stats.capacity_bytes == 1 << 20
    prefixes.forget(second.encode())  # an equal body, not that one: kept
    assert prefixes.stats().entries == 1 + kept_first
    prefixes.forget(body)
    assert prefixes.stats().entries == kept_first
    assert prefixes.stats().bytes == kept_first * size(first.encode(), 2)


def test_the_bounds_of_a_store_and_of_a_bounded_parse_are_exact():
    with pytest.raises(ValueError, match="checkpoint_bytes"):
        BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, 10, checkpoint_bytes=0)
    off = BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, 0, checkpoint_bytes=STEP)  # nothing stored
    text = chat_body([{"role": "user", "content": "x" * 4 * STEP}])
    assert_parses_alike(off, text, text)
    assert off.stats().lookups == 0 and off.loads_shared(text.encode(), 10**9) is None
    exact = '{"messages": [' + '"' + "y" * (2 * STEP - 18) + '"]}'
    assert len(exact) == 2 * STEP
    prefixes = store()
    assert_parses_alike(prefixes, exact, exact[:-3] + "]}")  # two checkpoints exactly: looked up
    assert prefixes.stats().lookups == 1  # (the second is shorter: parsed whole)

    base = chat_body([{"role": "system", "content": "p" * 3 * STEP}])
    prefixes.loads(base, base.encode())
    shared = prefixes.last.element_byte_ends[-1] - prefixes.last.array_byte_start
    grown = base[:-2] + ', "z"]}'
    unshared = len(grown.encode()) - shared
    assert prefixes.loads_shared(grown.encode(), unshared - 1) is None
    assert got_shared(prefixes, grown, unshared) == expected(grown)


def test_messages_from_elsewhere_are_kept_only_when_they_fit():
    worker, loop = store(), store()
    text = chat_body([{"role": "system", "content": "p" * 3 * STEP}, {"role": "user", "content": "a"}])
    value, _ = worker.loads(text, text.encode())
    spans = worker.last
    assert spans is not None
    loop.remember(text.encode(), value["messages"][:1], spans)  # not the messages the spans name
    small = BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, 1 << 20, checkpoint_bytes=STEP, max_elements=1)
    small.remember(text.encode(), value["messages"], spans)  # more messages than it takes
    short = chat_body([{"role": "user", "content": "a"}])
    loop.remember(short.encode(), [{"role": "user", "content": "a"}], spans)  # under two checkpoints
    assert loop.stats().entries == 0 and small.stats().entries == 0
    loop.remember(text.encode(), value["messages"], spans)
    exact = BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, 1 << 20, checkpoint_bytes=STEP, max_elements=2)
    exact.remember(text.encode(), value["messages"], spans)
    assert loop.stats().entries == 1 and exact.stats().entries == 1


def test_a_shared_chat_body_parses_as_a_whole_one_or_not_at_all():
    prefixes = body_prefixes(max_bytes=1 << 20, max_elements=3)
    assert prefixes.stats().capacity_bytes == 1 << 20
    pad = {"role": "system", "content": "p" * 40_000}
    first = json.dumps({"model": "m", "messages": [pad, {"role": "user", "content": "a"}]}).encode()
    assert parse_shared_body(first, CHAT, max_bytes=1 << 30, prefixes=prefixes, max_unshared=100) is None
    whole = parse_openai_body(first, CHAT, max_bytes=1 << 30, prefixes=prefixes)
    assert whole == parse_openai_body(first, CHAT, max_bytes=1 << 30)

    def grown(message: str) -> bytes:
        return first[:-2] + b", " + message.encode() + b"]}"

    body = grown('{"role": "user", "content": "b"}')
    shared = parse_shared_body(body, CHAT + "?x=1", max_bytes=1 << 30, prefixes=prefixes, max_unshared=100)
    assert shared is not None and shared.new_bytes == 100  # what the tokenizer then finds cached
    assert shared == parse_openai_body(body, CHAT, max_bytes=1 << 30)  # how it was parsed aside
    for path, limit in (("/v1/completions", 1 << 30), (CHAT, len(body) - 1)):
        assert parse_shared_body(body, path, max_bytes=limit, prefixes=prefixes, max_unshared=100) is None
    at_limit = parse_shared_body(body, CHAT, max_bytes=len(body), prefixes=prefixes, max_unshared=100)
    assert at_limit == shared
    for bad, message in (
        (
            grown('{"role": "user", "content": "\\ud800"}'),
            "^request body contains an unpaired UTF-16 surrogate",
        ),
        (grown('{"role": 7}'), r"messages\[2\]\.role must be a string"),
    ):
        with pytest.raises(RequestInvalid, match=message):
            parse_shared_body(bad, CHAT, max_bytes=1 << 30, prefixes=prefixes, max_unshared=100)
    too_many = grown('{"role": "user", "content": "b"}, {"role": "user", "content": "c"}')
    assert parse_shared_body(too_many, CHAT, max_bytes=1 << 30, prefixes=prefixes, max_unshared=100) is None
    assert prefixes.stats().whole == 1  # four messages: more than the store walks


@pytest.mark.parametrize(
    "first, second",
    [
        ("{" + " " * 3 * STEP + "}", "{" + " " * 3 * STEP + "}"),  # an empty object, white space around
        ('{"pad":"%s","messages":[{"a":1},{"b":2},{"c":3}]}', '{"pad":"%s","messages":[{"a":1},{"b":2}]}'),
        ('{"pad":"%s","messages":[{"a":1},{"b":2}]}', '{"pad":"%s","messages":[{"a":1},{"b":2}],"n":1}'),
        ('{"pad":"%s","messages":[]}', '{"pad":"%s","messages":[ ],"n":[1]}'),
        ('{ "pad" : "%s" , "messages" : [ {"a":1} ] }', '{ "pad" : "%s" , "messages" : [ {"a":1} , 2 ] }'),
        ('{"messages":[{"a":"%s"}],"x":{"y":[1]}}', '{"messages":[{"a":"%s"}],"x":{"y":[1]},"z":1}'),
        (  # a member taken after text whose characters are several bytes each
            '{"messages":[{"a":"%s' + "é" * 40 + '"}],"x":"y","z":"' + "w" * 100 + '"}',
            '{"messages":[{"a":"%s' + "é" * 40 + '"}],"x":"y","z":"v"}',
        ),
    ],
)
def test_well_formed_bodies_are_walked_not_handed_to_the_decoder(first: str, second: str):
    pad = "p" * (3 * STEP)
    prefixes = store()
    assert_parses_alike(prefixes, first.replace("%s", pad), second.replace("%s", pad))
    assert prefixes.stats().whole == 0
    if "messages" in first:
        assert prefixes.stats().hits == 1


def test_what_a_bounded_parse_counts_as_new_and_the_exact_edges_of_the_store():
    prefixes = store()
    base = chat_body([{"role": "system", "content": "p" * 3 * STEP}, {"role": "user", "content": "a"}])
    prefixes.loads(base, base.encode())
    edited = base[:150] + "q" + base[151:]  # past the first checkpoint, inside the first message
    assert base[150] == "p"
    assert prefixes.loads_shared(edited.encode(), len(edited.encode()) - 1) is None
    members_only = '{"pad":"' + "p" * 3 * STEP + '","n":1}'
    bare = store()
    bare.loads(members_only, members_only.encode())  # no messages at all
    assert bare.loads_shared((members_only[:-1] + ',"m":2}').encode(), 10) is None

    BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, 10, checkpoint_bytes=1)  # one byte: allowed
    one = '"' + "x" * (2 * STEP - 2) + '"'
    spans = MessagesSpans(0, 0, (len(one),), (len(one),), len(one))
    exact = store()
    exact.remember(one.encode(), ["x" * (2 * STEP - 2)], spans)  # two checkpoints exactly: kept
    assert exact.stats().entries == 1
    short = store()
    short.remember(b"[1]", [1], MessagesSpans(0, 0, (3,), (3,), 3))  # under two checkpoints: not kept
    assert short.stats().entries == 0
    size = exact.stats().bytes
    tight = BodyPrefixes(_DECODER, _SURROGATE_ESCAPE, size, checkpoint_bytes=STEP)
    tight.remember(one.encode(), ["x" * (2 * STEP - 2)], spans)  # its size exactly the bound: kept
    assert tight.stats().entries == 1 and tight.stats().bytes == size


def test_common_prefix_counts_every_shared_byte():
    rng = random.Random(11)
    for _ in range(300):
        n = rng.choice([0, 1, 5, 4095, 4096, 4097, 20_000])
        a = bytes(rng.randrange(3) for _ in range(n))
        b = bytearray(a[: rng.randrange(n + 1)]) + bytes(rng.randrange(3) for _ in range(rng.randrange(3)))
        want = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert _common_prefix(a, bytes(b)) == want
