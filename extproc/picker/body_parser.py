"""BodyParser: request bodies -> `ParsedRequest` (and the admin API's JSON) without holding the event loop.

JSON parsing is C code that holds Python's GIL from start to end: from a thread it stalls the event
loop exactly as much as on it (measured: a 3.9 MiB body nested in an ignored field held the loop
about 1 s either way). So bodies are parsed where their size says:

- up to `inline_max_bytes` (`--body-parse-inline-bytes`, 16 KiB): on the event loop. The worst
  shape of that size (many small nested arrays) parses in about 0.5 ms (64 KiB: 2.3 ms, 256 KiB:
  29 ms, the collector's passes growing with it), a chat body of that size in 0.03 ms: less than
  a round trip to a worker (0.2 ms);
- larger: in one of `workers` worker processes (`--body-parse-workers`, 1; `parse_worker.py`,
  started on the first large body), one body each at a time; the others wait in order (`waiting`).
  The loop only writes the bytes to a pipe and reads back what routing needs. A worker's memory
  peaks at about 50x the body for the worst shape (deep nesting); all but 32 MiB of its heap
  (`WORKER_HEAP_KEEP`, kept for the next body: `_worker_env`) is given back after each body.

A chat client re-sends its whole conversation every turn. A worker parses only what a body adds
to a recent one (`BodyPrefixes`) and says where the body's messages lie; the loop keeps those
messages, and parses a chat's next turn itself when all but `inline_max_bytes` of it are messages
it holds (`_shared_on_loop`: bounded, see there). Those message objects are then shared by the
requests of one chat: nothing downstream changes them (the template builds its own conversation).

What comes back is built on the loop, so its size is bounded too: the prompt fields (messages,
tools, documents, chat_template_kwargs, nvext) may hold at most `max_prompt_values` JSON values
(100,000: about 10 ms to build in the worst shape). A body beyond that comes back without them
(`ParsedBody.prompt_dropped`): the picker keeps its model, session, scalar hints and a completion's
prompt, a chat request is routed on load alone, and the worker still gets the whole body.

A worker that dies (out of memory, killed) is replaced on the next body; the body it was parsing is
answered as invalid (400). A client that leaves does not stop its body's parse: the worker is busy
until it is done, so at most `workers` bodies are ever being parsed. After `close` no worker
starts: a body that waits for one, or comes later, is answered `ShuttingDown` (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import marshal
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import extproc
from extproc.errors import BodyTooLarge, RequestInvalid, ShuttingDown
from extproc.picker.parse_worker import (
    MAX_FRAME_BYTES,
    ParsedBody,
    json_object,
    limit_prompt,
    model_of,
    read_request_answer,
    with_model,
)
from extproc.request.form import form_model, is_form
from extproc.request.parse import body_prefixes, parse_openai_body, parse_shared_body

log = logging.getLogger("extproc.picker")

INLINE_MAX_BYTES = 16 * 1024
MAX_PROMPT_VALUES = 100_000
# A large chat body whose messages but its last `inline_max_bytes` a recent body holds is parsed on
# the loop (`_shared_on_loop`) within these bounds; the bodies kept for it take SHARED_STORE_BYTES.
SHARED_MAX_BODY_BYTES = 4 << 20  # digest and comparison: about 0.3 ms at this size
SHARED_MAX_MESSAGES = 512
SHARED_MAX_VALUES = 8192  # the prompt's JSON values checked and counted on the loop
SHARED_STORE_BYTES = 16 << 20
PIPE_BYTES = 1 << 20  # a worker's pipes, each way (the kernel's default limit for unprivileged users)
# glibc's malloc in a worker: buffers up to this size come from its heap (not fresh mmaps), and up to
# WORKER_HEAP_KEEP of free heap stays mapped between bodies (see `_worker_env`)
WORKER_MMAP_THRESHOLD = 4 << 20
WORKER_HEAP_KEEP = 32 << 20
STOP_GRACE_S = 5.0  # a worker that has not exited this long after its stdin closed is killed
_PACKAGE_ROOT = str(Path(extproc.__file__).resolve().parent.parent)

__all__ = ["INLINE_MAX_BYTES", "MAX_PROMPT_VALUES", "BodyParser", "ParseStats", "ParsedBody"]


@dataclass(slots=True)
class ParseStats:
    on_loop: int = 0  # bodies parsed on the event loop
    in_worker: int = 0  # bodies parsed in a worker process
    shared_on_loop: int = 0  # large bodies parsed on the loop from a recent body's messages
    waiting: int = 0  # bodies waiting for a free worker now
    prompt_dropped: int = 0  # bodies routed without their prompt fields: too many values
    workers_lost: int = 0  # worker processes that died


class WorkerDied(Exception):
    """A parse worker exited (or broke its pipe) while it had a body."""


class BodyParser:
    """Parses request bodies on the loop when small, in worker processes when large."""

    def __init__(
        self,
        *,
        max_bytes: int,
        workers: int,
        inline_max_bytes: int = INLINE_MAX_BYTES,
        max_prompt_values: int = MAX_PROMPT_VALUES,
    ) -> None:
        if workers < 0 or inline_max_bytes < 0 or max_prompt_values < 1:
            raise ValueError(
                f"need workers >= 0, inline_max_bytes >= 0 and max_prompt_values >= 1, got "
                f"{workers}, {inline_max_bytes}, {max_prompt_values}"
            )
        self.max_bytes = max_bytes
        self.workers = workers
        self.inline_max_bytes = inline_max_bytes
        self.max_prompt_values = max_prompt_values
        self.stats = ParseStats()
        # chat bodies a worker (or this loop) parsed, whose messages the next turn may take
        self._shared = body_prefixes(SHARED_STORE_BYTES, max_elements=SHARED_MAX_MESSAGES)
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._freed: asyncio.Condition | None = None
        self._calls: set[asyncio.Task[bytes]] = set()
        self._closed = False

    def on_loop(self, body: bytes) -> bool:
        """Whether `body` is parsed on the event loop."""
        return self.workers == 0 or len(body) <= self.inline_max_bytes

    def worker_pids(self) -> list[int]:
        """The running worker processes (for a look from outside: tests, debugging)."""
        return [w.pid for w in self._all if w.pid is not None]

    async def request(self, body: bytes, path: str) -> ParsedBody:
        """Parse an OpenAI request body sent to `path`. Raises BodyTooLarge or RequestInvalid."""
        if len(body) > self.max_bytes:
            raise BodyTooLarge(len(body), self.max_bytes)
        if self.on_loop(body):
            self.stats.on_loop += 1
            parsed = limit_prompt(
                parse_openai_body(body, path, max_bytes=self.max_bytes), self.max_prompt_values
            )
        elif (shared := self._shared_on_loop(body, path)) is not None:
            parsed = shared
        else:
            self.stats.in_worker += 1
            answer = await self._in_worker("request", body, (path, self.max_bytes, self.max_prompt_values))
            parsed, spans = read_request_answer(answer)
            messages = parsed.request.messages
            if spans is not None and messages is not None and parsed.prompt_values <= SHARED_MAX_VALUES:
                self._shared.remember(body, messages, spans)
        if parsed.prompt_dropped:
            self.stats.prompt_dropped += 1
        return parsed

    def _shared_on_loop(self, body: bytes, path: str) -> ParsedBody | None:
        """A large chat body parsed on the loop when all but `inline_max_bytes` of it are the
        messages of a recent body (the chat's turn before: `BodyPrefixes`), else None. What the loop
        then does is bounded: a digest and a comparison of at most SHARED_MAX_BODY_BYTES, the parse
        of what is new, the checks of at most SHARED_MAX_MESSAGES messages, and the values of
        the prompt counted up to SHARED_MAX_VALUES (about 2 ms at worst, 0.2-0.3 ms for a chat's
        turn of 400 kB, against a round trip to a worker: 0.4 ms of the loop and 0.8 of the worker)."""
        if len(body) > SHARED_MAX_BODY_BYTES:
            return None
        try:
            request = parse_shared_body(
                body,
                path,
                max_bytes=self.max_bytes,
                prefixes=self._shared,
                max_unshared=self.inline_max_bytes,
            )
        except RequestInvalid:
            self.stats.shared_on_loop += 1
            raise
        if request is None:
            return None
        cap = min(SHARED_MAX_VALUES, self.max_prompt_values)
        parsed = limit_prompt(request, cap)  # counts at most `cap` + 1 values
        if parsed.prompt_dropped:
            self._shared.forget(body)  # its next turn goes to a worker too
            if cap < self.max_prompt_values:
                return None  # within the limit or not: a worker counts them
        self.stats.shared_on_loop += 1
        return parsed

    async def model_of(self, body: bytes, content_type: str = "") -> str | None:
        """The `model` of a JSON object body (any path: embeddings, ...) or of a multipart form
        (`content_type`'s; an audio upload: `extproc.request.form`), or None when the body names no
        model (not a JSON object with a non-empty string `model`, or a form without the field).

        A form is read on the loop: python-multipart finds its field in the first bytes (the OpenAI
        clients send fields before files) and skips a file at about 5 GB/s."""
        if is_form(content_type):
            return form_model(body, content_type)
        if len(body) > self.max_bytes:
            return None
        if self.on_loop(body):
            self.stats.on_loop += 1
            return model_of(body)
        self.stats.in_worker += 1
        model = await self._in_worker("model", body, ())
        return model if isinstance(model, str) else None

    async def with_model(self, body: bytes, model: str) -> bytes:
        """`body`, a request body `request` accepted, with its `model` set to `model` (a model
        rewrite), written where its size says, as it was parsed."""
        if self.on_loop(body):
            self.stats.on_loop += 1
            return with_model(body, model)
        self.stats.in_worker += 1
        rewritten: bytes = await self._in_worker("with_model", body, (model,))
        return rewritten

    async def json_object(
        self, body: bytes, *, token_field: str | None = None, max_tokens: int = 0
    ) -> dict[str, Any]:
        """A JSON object body (the admin API's). With `token_field`, that field, when present, must be
        a list of at most `max_tokens` token ids (integers in [0, 2**32)), checked where it is parsed.
        Raises RequestInvalid naming the problem."""
        if self.on_loop(body):
            self.stats.on_loop += 1
            return json_object(body, token_field, max_tokens)
        self.stats.in_worker += 1
        answer = await self._in_worker("json_object", body, (token_field, max_tokens))
        if answer[0] != "ok":
            raise RequestInvalid(answer[1])
        value: dict[str, Any] = answer[1]
        return value

    async def close(self) -> None:
        """Stop the worker processes (each finishes the body it has, within STOP_GRACE_S); bodies
        waiting for one are answered ShuttingDown."""
        self._closed = True
        for call in list(self._calls):
            call.cancel()
        workers, self._all, self._idle = list(self._all), set(), []
        if self._freed is not None:
            async with self._freed:
                self._freed.notify_all()
        await asyncio.gather(*(w.stop() for w in workers))

    # --- internals ---------------------------------------------------------------------------

    async def _in_worker(self, function: str, body: bytes, args: tuple[Any, ...]) -> Any:
        """`function(body, *args)` in a free worker (waiting for one); its answer, unmarshalled."""
        if len(body) >= MAX_FRAME_BYTES:
            raise BodyTooLarge(len(body), MAX_FRAME_BYTES - 1)
        worker = await self._take()
        # The call runs to its end even if our caller leaves: the worker is busy until then, and
        # its answer must be read before it takes another body.
        call = asyncio.ensure_future(self._call(worker, marshal.dumps((function, args)), body))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        call.add_done_callback(_retrieve)
        try:
            answer = await asyncio.shield(call)
        except WorkerDied:
            raise RequestInvalid("the request body could not be parsed: its parser process died") from None
        return _loads(answer)

    async def _take(self) -> _Worker:
        if self._freed is None:
            self._freed = asyncio.Condition()
        self.stats.waiting += 1
        try:
            async with self._freed:
                while True:
                    if self._closed:
                        raise ShuttingDown("the endpoint picker is shutting down")
                    while self._idle and not self._idle[-1].running:  # died while idle (killed)
                        self._forget(self._idle.pop())
                    if self._idle:
                        return self._idle.pop()
                    if len(self._all) < self.workers:
                        break
                    await self._freed.wait()
                worker = _Worker()
                self._all.add(worker)
        finally:
            self.stats.waiting -= 1
        try:
            await worker.start()
        except BaseException:
            await self._lose(worker)
            raise
        if self._closed:  # closed while it started: close() did not see its process
            await worker.stop()
            raise ShuttingDown("the endpoint picker is shutting down")
        return worker

    async def _call(self, worker: _Worker, request: bytes, body: bytes) -> bytes:
        try:
            answer = await worker.call(request, body)
        except BaseException:  # it died, or we were stopped with it busy: it cannot be reused
            await self._lose(worker)
            raise
        await self._give_back(worker)
        return answer

    async def _give_back(self, worker: _Worker) -> None:
        assert self._freed is not None
        async with self._freed:
            if self._closed or worker not in self._all:
                return
            self._idle.append(worker)
            self._freed.notify()

    async def _lose(self, worker: _Worker) -> None:
        self._forget(worker)
        await worker.stop()
        if self._freed is not None:
            async with self._freed:
                self._freed.notify()

    def _forget(self, worker: _Worker) -> None:
        if worker in self._all:
            self.stats.workers_lost += 1
            log.warning(
                "a body parser process (pid %s) died; a new one starts with the next body", worker.pid
            )
        self._all.discard(worker)


class _Worker:
    """One `python -m extproc.picker.parse_worker` child and its pipes."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        # the worker imports the same extproc as this process, wherever that came from
        path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "extproc.picker.parse_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_worker_env(path),
        )
        for stream in (self.process.stdin, self.process.stdout):
            _widen_pipe(stream)

    async def call(self, request: bytes, body: bytes) -> bytes:
        process = self.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            for frame in (request, body):
                process.stdin.write(len(frame).to_bytes(4, "big"))
                process.stdin.write(frame)
            await process.stdin.drain()
            header = await process.stdout.readexactly(4)
            return await process.stdout.readexactly(int.from_bytes(header, "big"))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WorkerDied(f"parse worker {process.pid} exited ({process.returncode})") from exc

    async def stop(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            with contextlib.suppress(ConnectionError):
                process.stdin.close()
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def _worker_env(python_path: str) -> dict[str, str]:
    """This process's environment for a worker, with its PYTHONPATH and glibc malloc's thresholds (a
    user's own MALLOC_* settings win; other C libraries ignore them). By default glibc maps each
    buffer over 128 KiB afresh and returns it at free, and the heap's top over 128 KiB too: a 400 kB
    body then costs its bytes, its text and its answer ~100 page faults each (about 1-2.5 us each on
    a VM), 0.25-0.5 ms of a 1.3-1.5 ms parse. Kept mapped, they cost nothing the next time."""
    return {
        "MALLOC_MMAP_THRESHOLD_": str(WORKER_MMAP_THRESHOLD),
        "MALLOC_TRIM_THRESHOLD_": str(WORKER_HEAP_KEEP),
        **os.environ,
        "PYTHONPATH": python_path,
    }


def _widen_pipe(stream: asyncio.StreamWriter | asyncio.StreamReader | None) -> None:
    """Give a worker's pipe PIPE_BYTES of buffer (Linux's default: 64 KiB), best effort: a body or
    answer of a few hundred kilobytes then crosses in one write and one or two reads instead of a
    loop wake-up per 64 KiB."""
    transport = getattr(stream, "transport", None) or getattr(stream, "_transport", None)
    pipe = transport.get_extra_info("pipe") if transport is not None else None
    if pipe is None or not hasattr(fcntl, "F_SETPIPE_SZ"):
        return
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size, or not a pipe
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _loads(data: bytes) -> Any:
    """marshal.loads with the garbage collector paused: building many containers otherwise runs
    collections that cost several times the building itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return marshal.loads(data)
    finally:
        if enabled:
            gc.enable()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read a finished call's outcome so that one nobody awaited any more is not reported."""
    if not task.cancelled():
        task.exception()
