"""BodyParser at its edges (extproc/picker/body_parser.py).

Each bound at its exact value (the body limit, the inline limit, a frame's length, the loop's share of a
chat's turn, the values kept for it and the bytes of the chats kept); the admin API's JSON and the
model of a body in a worker; the counters an operator reads, one per body; the constructor's checks;
what a worker sees (its environment, its pipes); and what happens when a worker dies, cannot start,
or will not stop, and when the parser closes. A constant too large to reach in a test (2 GiB frames,
4 MiB bodies, a 5 s grace) is set small with `monkeypatch` on the module.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import resource
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import extproc
from extproc.errors import BodyTooLarge, RequestInvalid, ShuttingDown
from extproc.picker import body_parser as bp
from extproc.picker.body_parser import WORKER_HEAP_KEEP, BodyParser, ParsedBody, _widen_pipe
from extproc.picker.parse_worker import json_object

from ..picker_fixtures import MODEL, chat_body
from .test_body_parser import CHAT, MiB, big_chat_body, until

INLINE = 1024  # the parsers' inline_max_bytes here: larger bodies go to a worker
PAD = {"role": "system", "content": "be brief " * 5000}  # 45 kB: a chat a recent body can share (>= 32 KiB)


@pytest.fixture
async def parsers() -> AsyncIterator[Callable[..., BodyParser]]:
    """Makes BodyParsers (one worker, INLINE bytes on the loop, unless told) and closes them all."""
    made: list[BodyParser] = []

    def make(**kwargs: Any) -> BodyParser:
        made.append(BodyParser(**{"max_bytes": 64 * MiB, "workers": 1, "inline_max_bytes": INLINE, **kwargs}))
        return made[-1]

    try:
        yield make
    finally:
        for parser in made:
            await parser.close()


def sized(obj: dict[str, Any], size: int) -> bytes:
    """`obj` as JSON of exactly `size` bytes: padded with an ignored `pad` string."""
    bare = json.dumps({**obj, "pad": ""}).encode()
    assert len(bare) <= size, (len(bare), size)
    return json.dumps({**obj, "pad": "x" * (size - len(bare))}).encode()


def sized_chat(size: int) -> bytes:
    return sized({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, size)


def chat_turn(*messages: dict[str, Any], pad: dict[str, Any] = PAD) -> bytes:
    """A chat body whose first message is `pad` (large enough for the loop to keep)."""
    return json.dumps({"model": MODEL, "messages": [pad, *messages]}).encode()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def environ_of(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/environ").read_text()
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


async def whole(body: bytes, path: str = CHAT) -> ParsedBody:
    """`body` parsed whole on the loop: what any parser must answer."""
    return await BodyParser(max_bytes=64 * MiB, workers=0).request(body, path)


# --- the constructor ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "inline_max_bytes", "max_prompt_values", "valid"),
    [
        (0, 0, 1, True),  # each at its lowest
        (-1, 0, 1, False),
        (0, -1, 1, False),
        (0, 0, 0, False),
    ],
)
async def test_the_constructor_takes_each_argument_down_to_its_bound_and_names_them_beyond(
    workers: int, inline_max_bytes: int, max_prompt_values: int, valid: bool
) -> None:
    def make() -> BodyParser:
        return BodyParser(
            max_bytes=MiB,
            workers=workers,
            inline_max_bytes=inline_max_bytes,
            max_prompt_values=max_prompt_values,
        )

    if valid:
        parser = make()
        assert (await parser.request(chat_body("hi"), CHAT)).request.model == MODEL
        await parser.close()  # no worker ever started
        return
    with pytest.raises(ValueError) as refused:
        make()
    for name in ("workers", "inline_max_bytes", "max_prompt_values"):
        assert name in str(refused.value)


# --- bounds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("inline", [INLINE, 4096], ids=["in_worker", "on_loop"])
async def test_a_body_of_max_bytes_is_parsed_and_one_byte_more_refused_naming_both_sizes(
    parsers: Callable[..., BodyParser], inline: int
) -> None:
    parser = parsers(max_bytes=4096, inline_max_bytes=inline)
    assert (await parser.request(sized_chat(4096), CHAT)).request.model == MODEL
    assert await parser.model_of(sized_chat(4096)) == MODEL
    with pytest.raises(BodyTooLarge) as refused:
        await parser.request(sized_chat(4097), CHAT)
    assert (refused.value.size_bytes, refused.value.limit_bytes) == (4097, 4096)
    assert await parser.model_of(sized_chat(4097)) is None
    assert parser.stats.on_loop + parser.stats.in_worker == 2  # the bodies over the limit: not parsed


async def test_a_body_too_long_for_a_frame_is_refused_before_it_reaches_a_worker(
    parsers: Callable[..., BodyParser], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame's length is four bytes: a body must be shorter than MAX_FRAME_BYTES (2 GiB, set small)."""
    monkeypatch.setattr(bp, "MAX_FRAME_BYTES", 4096)
    parser = parsers(max_bytes=MiB)
    assert (await parser.request(sized_chat(4095), CHAT)).request.model == MODEL
    with pytest.raises(BodyTooLarge) as refused:
        await parser.request(sized_chat(4096), CHAT)
    assert (refused.value.size_bytes, refused.value.limit_bytes) == (4096, 4095)


@pytest.mark.parametrize(("size", "where"), [(INLINE, "on_loop"), (INLINE + 1, "in_worker")])
async def test_a_body_of_up_to_inline_max_bytes_is_parsed_on_the_loop(
    parsers: Callable[..., BodyParser], size: int, where: str
) -> None:
    parser = parsers()
    body = sized_chat(size)
    assert parser.on_loop(body) == (where == "on_loop")
    assert await parser.request(body, CHAT) == await whole(body)
    assert getattr(parser.stats, where) == 1 and parser.stats.on_loop + parser.stats.in_worker == 1


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-bound", "one-byte-over"])
async def test_a_chats_next_turn_is_parsed_on_the_loop_up_to_shared_max_body_bytes(
    parsers: Callable[..., BodyParser], monkeypatch: pytest.MonkeyPatch, over: int
) -> None:
    first = chat_turn(user("q1"))
    second = chat_turn(user("q1"), {"role": "assistant", "content": "a1"}, user("q2"))
    monkeypatch.setattr(bp, "SHARED_MAX_BODY_BYTES", len(second) - over)  # 4 MiB in truth
    parser = parsers()
    await parser.request(first, CHAT)
    assert await parser.request(second, CHAT) == await whole(second)
    assert (parser.stats.shared_on_loop, parser.stats.in_worker) == ((0, 2) if over else (1, 1))


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-bound", "one-value-over"])
async def test_a_chat_is_kept_for_the_loop_up_to_shared_max_values(
    parsers: Callable[..., BodyParser], monkeypatch: pytest.MonkeyPatch, over: int
) -> None:
    """A body whose prompt holds at most SHARED_MAX_VALUES values is kept: sent again (a retry), it is
    parsed on the loop; one value more and it goes to a worker again."""
    body = chat_turn({"role": "user", "content": [{"type": "text", "text": "v"}] * 20})
    values = (await whole(body)).prompt_values
    monkeypatch.setattr(bp, "SHARED_MAX_VALUES", values - over)
    parser = parsers()
    for _ in range(2):
        assert await parser.request(body, CHAT) == await whole(body)
    assert (parser.stats.shared_on_loop, parser.stats.in_worker) == ((0, 2) if over else (1, 1))


async def test_the_loop_keeps_recent_chats_within_shared_store_bytes(
    parsers: Callable[..., BodyParser], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SHARED_STORE_BYTES the least recent chat is dropped: its next turn goes to a worker."""
    pads = [{"role": "system", "content": f"chat {name} " * 5000} for name in "ab"]
    turns = [[chat_turn(user(q), pad=pad) for q in ("q1", "q2")] for pad in pads]
    # the store takes about three times a body's bytes for one: room for one chat, not two
    monkeypatch.setattr(bp, "SHARED_STORE_BYTES", 4 * len(turns[0][0]))
    parser = parsers()
    for body in (turns[0][0], turns[1][0]):  # b's first turn pushes a's out
        await parser.request(body, CHAT)
    assert (parser.stats.shared_on_loop, parser.stats.in_worker) == (0, 2)
    await parser.request(turns[1][1], CHAT)
    assert (parser.stats.shared_on_loop, parser.stats.in_worker) == (1, 2)
    await parser.request(turns[0][1], CHAT)
    assert (parser.stats.shared_on_loop, parser.stats.in_worker) == (1, 3)


async def test_an_invalid_turn_found_on_the_loop_is_counted_once_there(
    parsers: Callable[..., BodyParser],
) -> None:
    parser = parsers()
    await parser.request(chat_turn(user("q1")), CHAT)
    with pytest.raises(RequestInvalid, match=r"role must be a string"):
        await parser.request(chat_turn(user("q1"), {"role": 7, "content": "x"}), CHAT)
    assert (parser.stats.shared_on_loop, parser.stats.in_worker) == (1, 1)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": MODEL, "max_tokens": 16, "messages": [PAD, user("hi")]}),
        ("/v1/responses", {"model": MODEL, "input": [PAD, user("hi")]}),
    ],
    ids=["anthropic", "responses"],
)
async def test_a_large_body_of_another_api_with_messages_is_parsed_in_a_worker_as_on_the_loop(
    parsers: Callable[..., BodyParser], path: str, body: dict[str, Any]
) -> None:
    """Its messages are converted ones, not where they lie in the body: the loop does not keep them."""
    parser = parsers()
    raw = json.dumps(body).encode()
    parsed = await parser.request(raw, path)
    assert parsed == await whole(raw, path) and parsed.request.messages is not None
    await parser.request(raw, path)
    assert (parser.stats.in_worker, parser.stats.shared_on_loop) == (2, 0)


# --- what a worker parses besides requests -----------------------------------------------------


def outcome(parse: Callable[[], dict[str, Any]]) -> dict[str, Any] | str:
    """What a JSON-object parse answers: the object, or the message of its RequestInvalid."""
    try:
        return parse()
    except RequestInvalid as exc:
        return exc.message


UP_TO_3 = {"token_field": "tokens", "max_tokens": 3}
ADMIN_BODIES = [
    # (case, fields, json_object's keyword arguments, what the answer says: None for the object)
    ("within the limit", {"tokens": [0, 7, 2**32 - 1]}, UP_TO_3, None),
    ("over the limit", {"tokens": [1, 2, 3, 4]}, UP_TO_3, "the limit is 3"),
    ("no limit given", {"tokens": [5]}, {"token_field": "tokens"}, "the limit is 0"),
    ("not token ids", {"tokens": [1, -1]}, UP_TO_3, "list of token ids"),
    ("no token field asked", {"tokens": [1, 2, 3, 4]}, {}, None),
]


@pytest.mark.parametrize("where", ["on_loop", "in_worker"])
@pytest.mark.parametrize(
    ("fields", "kwargs", "says"),
    [case[1:] for case in ADMIN_BODIES],
    ids=[case[0].replace(" ", "-") for case in ADMIN_BODIES],
)
async def test_the_admin_apis_json_is_parsed_and_checked_alike_on_the_loop_and_in_a_worker(
    parsers: Callable[..., BodyParser],
    where: str,
    fields: dict[str, Any],
    kwargs: dict[str, Any],
    says: str | None,
) -> None:
    parser = parsers()
    body = sized(fields, INLINE if where == "on_loop" else 4 * INLINE)
    expected = outcome(lambda: json_object(body, kwargs.get("token_field"), kwargs.get("max_tokens", 0)))
    try:
        answer: dict[str, Any] | str = await parser.json_object(body, **kwargs)
    except RequestInvalid as exc:
        answer = exc.message
    assert answer == expected
    if says is None:
        assert answer == json.loads(body)
    else:
        assert isinstance(answer, str) and says in answer
    assert getattr(parser.stats, where) == 1 and parser.stats.on_loop + parser.stats.in_worker == 1


async def test_a_body_not_a_json_object_is_refused_by_a_worker_as_on_the_loop(
    parsers: Callable[..., BodyParser],
) -> None:
    parser = parsers()
    for body in (b"[" + b"1," * INLINE + b"1]", b"{not json" + b" " * INLINE):
        with pytest.raises(RequestInvalid) as refused:
            await parser.json_object(body)
        assert refused.value.message == outcome(lambda body=body: json_object(body, None, 0))
    assert parser.stats.in_worker == 2


def vm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmSize for {pid}")


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="sets a worker's address-space limit")
async def test_a_worker_out_of_memory_answers_no_model_and_a_400_and_stays(
    parsers: Callable[..., BodyParser],
) -> None:
    """Under an address-space limit (`ulimit -v`, which workers inherit) a body too large to parse is a
    MemoryError in the worker: it answers that body and takes the next."""
    parser = parsers()
    assert await parser.model_of(sized_chat(4 * INLINE)) == MODEL
    [pid] = parser.worker_pids()
    limit = vm_bytes(pid) + 64 * MiB  # a deeply nested 4 MiB body takes about 50 times its size
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    heavy = big_chat_body(4 * MiB)
    assert await parser.model_of(heavy) is None
    with pytest.raises(RequestInvalid, match="too large to parse"):
        await parser.request(heavy, CHAT)
    assert await parser.model_of(sized_chat(4 * INLINE)) == MODEL and parser.worker_pids() == [pid]


async def test_a_large_body_without_a_non_empty_string_model_has_no_model(
    parsers: Callable[..., BodyParser],
) -> None:
    parser = parsers()
    for model in (3, "", None, ["m"]):
        assert await parser.model_of(sized({"model": model}, 4 * INLINE)) is None
    assert await parser.model_of(b"not json" + b" " * 4 * INLINE) is None
    assert parser.stats.in_worker == 5


# --- counters ----------------------------------------------------------------------------------

ENTRY_POINTS: dict[str, Callable[[BodyParser, bytes], Awaitable[object]]] = {
    "request": lambda parser, body: parser.request(body, CHAT),
    "model_of": lambda parser, body: parser.model_of(body),
    "json_object": lambda parser, body: parser.json_object(body),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
async def test_each_body_is_counted_once_where_it_was_parsed(
    parsers: Callable[..., BodyParser], entry: str
) -> None:
    parser = parsers()
    for size in (INLINE, INLINE, 4 * INLINE, 4 * INLINE):
        await ENTRY_POINTS[entry](parser, sized_chat(size))
    assert (parser.stats.on_loop, parser.stats.in_worker, parser.stats.waiting) == (2, 2, 0)


async def test_each_worker_that_dies_is_counted_once_and_logged_with_its_pid(
    parsers: Callable[..., BodyParser], caplog: pytest.LogCaptureFixture
) -> None:
    parser = parsers()
    for lost in (1, 2):
        await parser.request(sized_chat(4 * INLINE), CHAT)
        [pid] = parser.worker_pids()
        os.kill(pid, signal.SIGKILL)
        # the parser's own view: /proc/<pid> is gone before asyncio records the exit
        await until(lambda: not parser._idle[-1].running, "the killed worker was never reaped")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="extproc.picker"):
            assert (await parser.request(sized_chat(4 * INLINE), CHAT)).request.model == MODEL
        assert parser.stats.workers_lost == lost and parser.worker_pids() != [pid]
        [record] = [r for r in caplog.records if r.name == "extproc.picker"]
        assert record.levelno == logging.WARNING
        assert str(pid) in record.getMessage() and "died" in record.getMessage()


# --- workers dying, failing to start, stopping -------------------------------------------------


async def test_a_body_waiting_for_the_only_worker_is_parsed_when_that_worker_dies(
    parsers: Callable[..., BodyParser],
) -> None:
    parser = parsers()
    first = asyncio.ensure_future(parser.request(big_chat_body(2 * MiB), CHAT))
    second = asyncio.ensure_future(parser.request(sized_chat(4 * INLINE), CHAT))
    await until(lambda: parser.stats.waiting == 1 and parser.worker_pids(), "the second body never waited")
    [pid] = parser.worker_pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RequestInvalid, match="parser process died"):
        await asyncio.wait_for(first, 30)
    assert (await asyncio.wait_for(second, 10)).request.model == MODEL
    assert parser.stats.workers_lost == 1 and len(parser.worker_pids()) == 1


async def test_a_worker_that_cannot_start_fails_its_body_and_the_next_body_starts_one(
    parsers: Callable[..., BodyParser], monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = parsers()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "executable", "/nonexistent/python")
        with pytest.raises(OSError):
            await parser.request(sized_chat(4 * INLINE), CHAT)
    parsed = await asyncio.wait_for(parser.request(sized_chat(4 * INLINE), CHAT), 10)
    assert parsed.request.model == MODEL and len(parser.worker_pids()) == 1


async def test_closing_stops_every_worker_process(parsers: Callable[..., BodyParser]) -> None:
    parser = parsers(workers=2)
    await asyncio.gather(*(parser.request(sized_chat(4 * INLINE), CHAT) for _ in range(2)))  # two workers
    pids = parser.worker_pids()
    assert len(pids) == 2
    await parser.close()
    assert parser.worker_pids() == [] and not any(alive(pid) for pid in pids)


async def test_a_worker_that_does_not_exit_when_told_is_killed_after_the_grace(
    parsers: Callable[..., BodyParser], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bp, "STOP_GRACE_S", 0.2)  # 5 s in truth
    parser = parsers()
    await parser.request(sized_chat(4 * INLINE), CHAT)
    [pid] = parser.worker_pids()
    os.kill(pid, signal.SIGSTOP)  # it cannot read the end of its stdin
    try:
        await asyncio.wait_for(parser.close(), 5)
        assert not alive(pid)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


class _GoneWhenKilled:
    """A worker process still running when its grace ends, and gone when it is killed: asyncio has
    forgotten it by then (ProcessLookupError), as when it exits in the same loop step."""

    returncode = None
    stdin = None

    def __init__(self) -> None:
        self._gone = asyncio.Event()

    async def wait(self) -> int:
        await self._gone.wait()
        return 0

    def kill(self) -> None:
        self._gone.set()
        raise ProcessLookupError


async def test_stopping_a_worker_that_exits_just_as_its_grace_ends_does_not_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bp, "STOP_GRACE_S", 0.01)
    worker = bp._Worker()
    worker.process = _GoneWhenKilled()  # type: ignore[assignment]
    await asyncio.wait_for(worker.stop(), 5)


async def test_a_body_waiting_for_a_worker_when_the_parser_closes_leaves_no_worker_process_running(
    parsers: Callable[..., BodyParser],
) -> None:
    """close() stops the workers; a body that was waiting for one is answered ShuttingDown (503)
    and starts none, and so does a body that comes later (until 2026-11-27 a waiting body started a
    worker after close() returned, which nothing stopped)."""
    parser = parsers()
    first = asyncio.ensure_future(parser.request(big_chat_body(2 * MiB), CHAT))
    waiting = asyncio.ensure_future(parser.request(sized_chat(4 * INLINE), CHAT))
    await until(lambda: parser.stats.waiting == 1 and parser.worker_pids(), "the second body never waited")
    [pid] = parser.worker_pids()
    await parser.close()
    await asyncio.wait([first, waiting], timeout=30)
    assert first.done() and waiting.done()
    assert isinstance(waiting.exception(), ShuttingDown)
    with pytest.raises(ShuttingDown):
        await parser.request(sized_chat(4 * INLINE), CHAT)
    assert not alive(pid)
    assert parser.worker_pids() == [], "a worker process started after close() is still running"
    assert (await parser.request(sized_chat(INLINE // 2), CHAT)).request.model  # small ones: on the loop


# --- what a worker sees, and what the loop is left with -----------------------------------------


async def test_a_worker_imports_this_extproc_and_keeps_its_heap_unless_the_user_says_otherwise(
    parsers: Callable[..., BodyParser], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/site-extra")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # the user's own setting wins
    parser = parsers()
    await parser.request(sized_chat(4 * INLINE), CHAT)
    [pid] = parser.worker_pids()
    environ = environ_of(pid)
    package_root = str(Path(extproc.__file__).resolve().parent.parent)
    assert environ["PYTHONPATH"] == os.pathsep.join([package_root, "/opt/site-extra"])
    assert environ["MALLOC_TRIM_THRESHOLD_"] == str(WORKER_HEAP_KEEP)
    assert environ["MALLOC_MMAP_THRESHOLD_"] == "65536"


async def test_widening_a_pipe_is_best_effort() -> None:
    _widen_pipe(None)  # no stream
    loop = asyncio.get_running_loop()
    with open(os.devnull, "wb") as null:  # a character device: asyncio takes it, F_SETPIPE_SZ does not
        transport, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, null)
        try:
            _widen_pipe(SimpleNamespace(transport=transport))  # type: ignore[arg-type]
        finally:
            transport.close()
            await asyncio.sleep(0)  # its connection_lost: the file is closed there


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
async def test_a_body_from_a_worker_leaves_the_garbage_collector_as_it_was(
    parsers: Callable[..., BodyParser], enabled: bool
) -> None:
    """The answer is built with the collector paused; it runs again after only if it ran before."""
    parser = parsers()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        await parser.request(sized_chat(4 * INLINE), CHAT)
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("how", ["client-left-then-worker-died", "parser-closed-mid-parse"])
async def test_a_parse_nobody_awaits_any_more_logs_no_asyncio_error(
    parsers: Callable[..., BodyParser], caplog: pytest.LogCaptureFixture, how: str
) -> None:
    parser = parsers()
    parse = asyncio.ensure_future(parser.request(big_chat_body(2 * MiB), CHAT))
    await until(lambda: parser.worker_pids() and parser._calls, "the worker never took the body")
    [call] = parser._calls
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        if how == "parser-closed-mid-parse":
            await parser.close()
        else:
            parse.cancel()
            os.kill(parser.worker_pids()[0], signal.SIGKILL)
        await asyncio.wait([parse, call], timeout=30)
        assert parse.done() and call.done()
        del call, parse
        gc.collect()  # "Task exception was never retrieved" is logged when the task is collected
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
