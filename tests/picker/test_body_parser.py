"""BodyParser: small bodies on the event loop, large ones in worker processes, the same answers
either way; the loop keeps running while a large body is parsed; the prompt brought back is bounded."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import platform
import signal
import time
from pathlib import Path

import pytest

from extproc.errors import BodyTooLarge, RequestInvalid
from extproc.picker import body_parser as bp_limits
from extproc.picker.body_parser import PIPE_BYTES, WORKER_MMAP_THRESHOLD, BodyParser
from extproc.picker.pipeline import EndpointPicker

from ..picker_fixtures import MODEL, chat_body, picker_config
from ..request.test_form import openai_upload

CHAT = "/v1/chat/completions"
MiB = 1024 * 1024


def nested_junk(size: int, depth: int = 20) -> str:
    """`size` bytes of legal JSON that is slow to parse: many small, deeply nested arrays."""
    unit = "[" * depth + "]" * depth
    return "[" + ",".join([unit] * (size // len(unit))) + "]"


def big_chat_body(size: int, text: str = "hi") -> bytes:
    """A chat body of about `size` bytes whose bulk is an ignored field (legal, slow to parse)."""
    return chat_body(text)[:-1] + b', "x": ' + nested_junk(size).encode() + b"}"


@pytest.fixture
async def parser():
    parser = BodyParser(max_bytes=64 * MiB, workers=1, inline_max_bytes=1024)
    try:
        yield parser
    finally:
        await parser.close()


BODIES = [
    chat_body("hello " * 400),
    chat_body(
        "x", nvext={"session_control": {"session_id": "s"}, "agent_hints": {"priority": 3}}, pad="x" * 2000
    ),
    json.dumps({"model": MODEL, "prompt": list(range(500)), "cache_salt": "t", "max_tokens": 3}).encode(),
    json.dumps({"model": MODEL, "prompt": "text " * 500, "stream": True}).encode(),
    chat_body("x", tools=[{"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2]}}}] * 40),
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
async def test_a_body_parsed_in_a_worker_equals_one_parsed_on_the_loop(parser, body) -> None:
    assert not parser.on_loop(body)
    in_worker = await parser.request(body, CHAT if b"messages" in body else "/v1/completions")
    on_loop = BodyParser(max_bytes=64 * MiB, workers=0)
    inline = await on_loop.request(body, CHAT if b"messages" in body else "/v1/completions")
    assert in_worker == inline and in_worker.prompt_dropped == 0 and in_worker.has_prompt
    assert parser.stats.in_worker == 1 and on_loop.stats.on_loop == 1


async def test_a_chat_growing_turn_by_turn_parses_as_on_the_loop_wherever_it_is_parsed(parser) -> None:
    """Each turn takes the messages of the turn before: in the worker (`BodyPrefixes`), or on the loop
    when at most `inline_max_bytes` of it are new. The answers stay those of a whole parse, including
    turns that edit an earlier message or bring a long one."""
    on_loop = BodyParser(max_bytes=64 * MiB, workers=0)
    history = [{"role": "system", "content": "be brief " * 8000}]  # about 72 kB
    for turn in range(12):
        words = 4000 if turn in (3, 7) else 20  # a long message: beyond the loop's share
        history.append({"role": "user", "content": f"question {turn} é " + "word " * words})
        if turn == 9:
            history[2] = {"role": "assistant", "content": "an earlier answer, edited"}
        body = json.dumps({"model": MODEL, "messages": history, "stream": True}).encode()
        assert await parser.request(body, CHAT) == await on_loop.request(body, CHAT)
        history.append({"role": "assistant", "content": f"answer {turn} \ud83d\ude00"})
    stats = parser.stats
    assert stats.in_worker + stats.shared_on_loop == 12
    assert stats.in_worker >= 4  # the first turn, both long messages, the edit
    assert stats.shared_on_loop >= 6


async def test_what_the_loop_parses_from_a_recent_body_stays_bounded() -> None:
    """Past SHARED_MAX_MESSAGES messages or SHARED_MAX_VALUES values, or with a new part larger than
    `inline_max_bytes`, a chat's turns are parsed in a worker again; errors in the new part are the
    worker's errors."""
    parser = BodyParser(max_bytes=64 * MiB, workers=1, inline_max_bytes=1024)
    on_loop = BodyParser(max_bytes=64 * MiB, workers=0)
    try:
        many = [{"role": "user", "content": "x" * 40}] * (bp_limits.SHARED_MAX_MESSAGES + 1)
        pad = {"role": "system", "content": "p" * 40_000}
        for grown in (1, 2):
            body = json.dumps({"model": MODEL, "messages": [pad, *many[:-1], *many[:grown]]}).encode()
            assert await parser.request(body, CHAT) == await on_loop.request(body, CHAT)
        assert parser.stats.shared_on_loop == 0 and parser.stats.in_worker == 2

        values = [{"role": "user", "content": [{"type": "text", "text": "v"}] * 3000}]  # ~9,000 values
        for grown in range(3):
            messages = [pad, *values, *[{"role": "user", "content": "y"}] * grown]
            body = json.dumps({"model": MODEL, "messages": messages}).encode()
            assert await parser.request(body, CHAT) == await on_loop.request(body, CHAT)
        assert parser.stats.shared_on_loop == 0 and parser.stats.in_worker == 5

        parts = {"role": "user", "content": [{"type": "text", "text": "v"}] * 300}  # ~900 values, 8 kB
        growing: list[dict] = [pad]
        roomy = BodyParser(max_bytes=64 * MiB, workers=1)  # new parts up to 16 KiB on the loop
        try:
            for turn in range(12):  # on the loop from the second turn until the values pass the bound
                growing.append(parts)
                body = json.dumps({"model": MODEL, "messages": growing}).encode()
                before = roomy.stats.shared_on_loop
                whole = await on_loop.request(body, CHAT)
                assert await roomy.request(body, CHAT) == whole
                on_the_loop = turn >= 1 and whole.prompt_values <= bp_limits.SHARED_MAX_VALUES
                assert (roomy.stats.shared_on_loop > before) == on_the_loop, turn
            assert 3 <= roomy.stats.shared_on_loop < 11
        finally:
            await roomy.close()
        few = BodyParser(max_bytes=64 * MiB, workers=1, max_prompt_values=1000)
        few_on_loop = BodyParser(max_bytes=64 * MiB, workers=0, max_prompt_values=1000)
        try:  # under a lower limit the loop's answer is the limit's: the prompt dropped
            small = {"role": "user", "content": [{"type": "text", "text": "v"}] * 100}  # ~500 values
            for turn in range(3):
                body = json.dumps({"model": MODEL, "messages": [pad, *[small] * (turn + 1)]}).encode()
                assert await few.request(body, CHAT) == await few_on_loop.request(body, CHAT)
            assert few.stats.shared_on_loop == 1 and few.stats.prompt_dropped == 2
        finally:
            await few.close()

        base = [pad, {"role": "user", "content": "z"}]
        body = json.dumps({"model": MODEL, "messages": base}).encode()
        await parser.request(body, CHAT)
        for tail, message in [
            ('{"role":"user","content":"\\ud800"}', "unpaired UTF-16 surrogate"),
            ('{"role":"user","content":NaN}', "not valid JSON"),
            ('{"role":7}', r"messages\[2\]\.role must be a string"),
            ("[" * 600 + "]" * 600, "must be a message object"),
        ]:
            bad = body[:-2] + b"," + tail.encode() + b"]}"
            for side in (parser, on_loop):
                with pytest.raises(RequestInvalid, match=message):
                    await side.request(bad, CHAT)
        assert parser.stats.shared_on_loop >= 2  # the surrogate and the role: found on the loop
    finally:
        await parser.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json" + b" " * 2000, "not valid JSON"),
        (json.dumps({"model": MODEL, "messages": "no", "pad": "x" * 2000}).encode(), "messages must be"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    ],
)
async def test_a_worker_refuses_what_the_loop_refuses_with_the_same_message(parser, body, message) -> None:
    with pytest.raises(RequestInvalid) as in_worker:
        await parser.request(body, CHAT)
    with pytest.raises(RequestInvalid) as inline:
        await BodyParser(max_bytes=64 * MiB, workers=0).request(body, CHAT)
    assert in_worker.value.message == inline.value.message and message in inline.value.message


async def test_a_body_over_the_limit_is_refused_before_any_parse(parser) -> None:
    small = BodyParser(max_bytes=2048, workers=1, inline_max_bytes=1024)
    with pytest.raises(BodyTooLarge):
        await small.request(b"x" * 4096, CHAT)
    assert small.stats.in_worker == small.stats.on_loop == 0


async def test_the_event_loop_keeps_running_while_a_large_body_is_parsed(parser) -> None:
    """Issue 19: a 3.9 MiB body nested in an ignored field held the loop ~850 ms when parsed on it
    (a thread holds the GIL just as long). Parsed in a worker, the loop's longest pause stays small."""
    body = big_chat_body(int(3.9 * MiB))
    await parser.request(chat_body("warm up " * 200), CHAT)  # the worker process is started
    worst = 0.0
    parse = asyncio.ensure_future(parser.request(body, CHAT))
    last = time.perf_counter()
    while not parse.done():
        await asyncio.sleep(0.002)
        now = time.perf_counter()
        worst = max(worst, now - last)
        last = now
    parsed = parse.result()
    assert parsed.request.model == MODEL and parsed.has_prompt
    assert worst < 0.25, f"the event loop was held {worst * 1000:.0f} ms"


async def test_at_most_workers_bodies_are_parsed_at_once_the_others_wait_in_order(parser) -> None:
    body = big_chat_body(2 * MiB)
    tasks = [asyncio.ensure_future(parser.request(body, CHAT)) for _ in range(3)]
    deadline = time.monotonic() + 10
    while parser.stats.waiting < 2:  # one in the worker's hands, two waiting for it
        assert time.monotonic() < deadline, "the bodies never queued for the worker"
        await asyncio.sleep(0.001)
    parsed = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [p.request.model for p in parsed] == [MODEL] * 3
    assert parser.stats.waiting == 0 and parser.stats.in_worker == 3


async def test_a_client_that_leaves_keeps_its_worker_busy_until_the_parse_is_done(parser) -> None:
    first = asyncio.ensure_future(parser.request(big_chat_body(2 * MiB), CHAT))
    deadline = time.monotonic() + 10
    while not parser.worker_pids() or parser._idle:  # the worker has the first body
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    first.cancel()
    second = await asyncio.wait_for(parser.request(big_chat_body(64 * 1024), CHAT), 30)
    assert second.request.model == MODEL and len(parser.worker_pids()) == 1


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


async def test_a_worker_killed_while_idle_is_replaced_and_the_next_body_parsed(parser) -> None:
    await parser.request(chat_body("warm up " * 200), CHAT)
    [pid] = parser.worker_pids()
    os.kill(pid, signal.SIGKILL)
    await until(lambda: not parser._idle[-1].running, "the killed worker was never reaped")
    parsed = await parser.request(chat_body("after " * 300), CHAT)
    assert parsed.request.model == MODEL and parser.stats.workers_lost == 1
    assert parser.worker_pids() != [pid]


async def test_a_worker_that_dies_mid_parse_costs_that_body_a_400_and_is_replaced(parser) -> None:
    parse = asyncio.ensure_future(parser.request(big_chat_body(4 * MiB), CHAT))
    await until(lambda: parser.worker_pids() and not parser._idle, "the worker never took the body")
    os.kill(parser.worker_pids()[0], signal.SIGKILL)
    with pytest.raises(RequestInvalid, match="parser process died"):
        await asyncio.wait_for(parse, 30)
    assert parser.stats.workers_lost == 1 and parser.worker_pids() == []
    assert (await parser.request(chat_body("after " * 300), CHAT)).request.model == MODEL


@pytest.mark.parametrize("junk", [[[i] for i in range(2000)], ["x"] * 2000], ids=["lists", "strings"])
async def test_a_prompt_too_large_to_bring_back_is_dropped_and_the_request_routed_on_load(junk) -> None:
    """The prompt fields come back to the loop; beyond max_prompt_values JSON values they are left in
    the body (the worker gets them) and the picker routes on load alone, keeping session and hints."""
    parser = BodyParser(max_bytes=64 * MiB, workers=1, inline_max_bytes=1024, max_prompt_values=1000)
    try:
        junk_message = {"role": "user", "content": "hi", "junk": junk}
        body = json.dumps(
            {
                "model": MODEL,
                "messages": [junk_message],
                "nvext": {"session_control": {"session_id": "s"}, "agent_hints": {"priority": 2, "x": [1]}},
            }
        ).encode()
        parsed = await parser.request(body, CHAT)
        assert not parsed.has_prompt and parsed.prompt_dropped > 1000
        assert parsed.request.session_id == "s" and dict(parsed.request.agent_hints) == {"priority": 2}
        assert parser.stats.prompt_dropped == 1
    finally:
        await parser.close()
    picker = EndpointPicker(picker_config())
    picker.bodies = BodyParser(max_bytes=64 * MiB, workers=1, inline_max_bytes=1024, max_prompt_values=1000)
    try:
        chosen = await picker.pick(body=body, path=CHAT, headers={}, subset=None, client_request_id="junk")
        assert chosen.tracked and chosen.request_blocks == 0  # routed on load alone
        picker.finish(chosen, "complete")
        assert picker.is_idle()
    finally:
        await picker.close()


async def test_the_model_of_a_large_body_is_read_in_a_worker(parser) -> None:
    body = json.dumps({"model": "embedder", "input": ["x" * 100] * 100}).encode()
    assert await parser.model_of(body) == "embedder" and parser.stats.in_worker == 1
    assert await parser.model_of(b'{"input": "no model"}') is None
    assert await parser.model_of(b"not json at all") is None
    assert await parser.model_of(b'{"model": 3}') is None


async def test_out_of_memory_the_kernel_kills_a_parse_worker_before_the_picker(parser) -> None:
    await parser.request(chat_body("warm up " * 200), CHAT)
    [pid] = parser.worker_pids()
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"


async def test_a_workers_pipes_hold_a_long_chat_body_at_once(parser) -> None:
    """A 100k-token chat body (about 400 KB) and its answer cross each pipe in one write, not a loop
    wake-up per 64 KiB (Linux's default pipe size)."""
    body = chat_body("a long conversation " * 20_000)
    assert 300_000 < len(body) < PIPE_BYTES
    parsed = await parser.request(body, CHAT)
    assert parsed.request.messages is not None and parser.stats.in_worker == 1
    [pid] = parser.worker_pids()
    for fd in (0, 1):  # the worker's stdin and stdout: the pipes to and from this process
        pipe = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert fcntl.fcntl(pipe, fcntl.F_GETPIPE_SZ) == PIPE_BYTES
        finally:
            os.close(pipe)


def _minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc malloc's")
async def test_a_worker_keeps_its_heap_between_long_bodies(parser) -> None:
    """glibc maps buffers over 128 KiB afresh and returns them at free: each 400 kB body cost the
    worker ~260 page faults (its bytes, text and answer; ~0.5 ms on a VM). The worker keeps them."""
    body = chat_body("a long conversation " * 20_000)
    for _ in range(4):  # the heap grows to what such a body needs
        await parser.request(body, CHAT)
    [pid] = parser.worker_pids()
    before = _minor_faults(pid)
    await parser.request(body, CHAT)
    assert _minor_faults(pid) - before < 30


async def test_a_users_malloc_settings_reach_the_worker(monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    parser = BodyParser(max_bytes=MiB, workers=1, inline_max_bytes=16)
    try:
        await parser.request(chat_body("x" * 100), CHAT)
        [pid] = parser.worker_pids()
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
        )
        assert environ["MALLOC_TRIM_THRESHOLD_"] == "0"
        assert environ["MALLOC_MMAP_THRESHOLD_"] == str(WORKER_MMAP_THRESHOLD)
    finally:
        await parser.close()


async def test_a_forms_model_is_read_on_the_loop_at_any_size() -> None:
    """An upload's form (`extproc.request.form`): read on the loop, never sent to a worker process,
    and not bound by the JSON limit (the field comes first; the file is skipped, not parsed)."""
    small = BodyParser(max_bytes=2048, workers=1, inline_max_bytes=1024)
    content_type, body = openai_upload({"model": "whisper"}, audio=b"\0" * 8192)
    assert await small.model_of(body, content_type) == "whisper"
    assert await small.model_of(body) is None  # without its content type: not JSON, no model
    assert await small.model_of(body, "application/json") is None
    assert small.stats.in_worker == 0


async def test_a_model_is_read_and_rewritten_where_the_bodys_size_says(parser) -> None:
    """Small bodies on the loop, large ones in the worker (the fixture's inline bound: 1 KiB); a
    rewrite (an InferenceModelRewrite) changes the model and nothing else, wherever it is written."""
    small, large = chat_body("hi"), chat_body("x" * 5000)
    assert await parser.model_of(small) == MODEL
    assert (parser.stats.on_loop, parser.stats.in_worker) == (1, 0)
    assert await parser.model_of(large) == MODEL
    assert (parser.stats.on_loop, parser.stats.in_worker) == (1, 1)
    for body, counts in ((small, (2, 1)), (large, (2, 2))):
        rewritten = await parser.with_model(body, "other-model")
        assert json.loads(rewritten) == {**json.loads(body), "model": "other-model"}
        assert (parser.stats.on_loop, parser.stats.in_worker) == counts
