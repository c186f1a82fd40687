"""The ext_proc servicer: one bidi stream per HTTP request, its phases, body modes and lifecycle.

Speaks only Envoy's `envoy.service.ext_proc.v3` protocol (REFERENCE sections 1-2):
- BUFFERED request bodies: answer request headers with CONTINUE at once (holding them
  deadlocks Envoy until `message_timeout`), route on the body message, and put the header
  mutation on the body answer. In BUFFERED mode Envoy sends the whole body in one message; its
  `end_of_stream` is false when request trailers follow (HTTP/2), and Envoy sends the trailers only
  after that message is answered, so the body is decided on that one message either way. Headers
  then trailers without data (our configs send trailers) is a 400: nothing can route it any more.
- FULL_DUPLEX_STREAMED: hold the headers answer until the body ends (its `end_of_stream`, or the
  request trailers), then send the routing headers answer and echo the body back in chunks of at
  most ~62 KB, the last one ending the stream. An upload (a multipart form to a path other than
  a generation request's: `/v1/audio/transcriptions`) is routed as soon as its form's `model` field
  is read (`extproc.request.form`): the bytes held so far follow the headers answer, and each later
  chunk is echoed as it comes, so the file streams to its worker and is never held whole.
- No body (GET, or body mode NONE): route on the headers. A POST to a routable path without a
  body is decided on an empty body (400 `invalid-request`), never routed untracked.
Paths are decided normalised (`extproc.request.parse.normalize_path`, as our Envoy configs forward
them): `/v1/chat/%63ompletions` is a chat request; an encoded slash is a 400.
Every routing answer removes a client's copies of the headers the picker owns and does not set
(`owned_headers`, see `epp.answers`). Decisions come from a `Picker` (declared here, narrow);
answers are built by `epp.answers`.

Lifecycle: the first response body chunk marks prefill complete; the end of the response, a
non-2xx status, a reset or a cancelled stream frees the request. The `finally` frees whatever
ended the stream, exactly once. A response body chunk is answered first and accounted after (its
first token, output tokens, the free at its end), when gRPC comes back for the next answer: Envoy
forwards the chunk meanwhile, so the bookkeeping is off the client's path (benchmarks/README.md,
`bench_extproc.py`). A stream that goes away right after an answer still accounts that chunk, first
thing in the `finally`. A 2xx answer whose content type is not `text/event-stream` (a
non-streamed request's JSON) comes whole, when generation is over: its first chunk still ends the
prompt's load, but is marked as not the first token, so the learned pass-time model (the default
`timing` prefill load model) does not take the whole answer's time for a time to first token.

Output tokens (`--router-track-output-blocks`, a picker whose `tracks_output_blocks` is true): each
2xx response body chunk of a tracked request goes through `epp.output_tokens.OutputTokens` (SSE
chunks, `usage`, a whole JSON answer; bounded per request) and the tokens generated since the last
chunk go to the picker (`output_tokens`) before the end frees the request. Our Envoy configs send
the response body STREAMED: each chunk passes through the picker as it comes, never held back for
a whole body; with tracking off the chunks are only looked at for the first token.

Per-request series (`objective_metrics.py`, the Inference Extension's `inference_objective_*`):
counted here, where each request and its answer pass: a routed request when routed, an error answer
when given (the picker's, or a worker's non-2xx), a 2xx answer's duration, sizes and tokens when it
ends (the engine's `usage`, read by `epp.usage` from each chunk, off the client's path as the rest of
a chunk's accounting).

Upstream answers: each routed request's response status goes to the picker (`answered`), which
counts it per worker and ejects a worker after a run of 5xx answers (Envoy's 503 when it cannot
connect included); the request itself is freed as any other non-2xx one.

Concurrency limit (`max_concurrent_streams`): a stream opened while that many are open gets its
first message answered with a 429 ImmediateResponse (`TooManyStreams`) and ends. The limit is
checked here rather than with gRPC's `maximum_concurrent_rpcs`, which refuses the stream with
RESOURCE_EXHAUSTED: Envoy would then fail open (route without the picker, under
`failure_mode_allow`) or answer its own 500, neither of which tells the client what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.epp import answers as epp
from extproc.epp import responses_stream, scheduler_metrics
from extproc.epp.asked_model import ModelNameRestorer
from extproc.epp.objective_metrics import MODEL_SERVER_ERROR, ObjectiveMetrics, error_code
from extproc.epp.output_tokens import OutputTokens
from extproc.epp.usage import Usage
from extproc.errors import BodyTooLarge, PickerError, RequestInvalid, TooManyStreams
from extproc.picker.pick import Pick, refusal_labels
from extproc.request.form import FormModel, is_form
from extproc.request.parse import ROUTABLE_PATHS, normalize_path
from extproc.router.errors import RouterError

log = logging.getLogger("extproc.service")

_BodyMode = processing_mode_pb2.ProcessingMode.BodySendMode
BUFFERED = _BodyMode.BUFFERED
DUPLEX = _BodyMode.FULL_DUPLEX_STREAMED


_TRAILERS_WITHOUT_BODY = "a request with trailers but no body cannot be routed (BUFFERED mode); send a body"
_FORM_TOO_LARGE = (
    "before its form's `model` field: send the field before the file (as the OpenAI clients do), "
    "or raise --max-body-bytes"
)
MAX_CACHED_ANSWERS = 4096  # routing answers kept per (endpoint, headers, phase); emptied when full

# A deployment serves a handful of paths: each is normalised once (a failure is not kept).
_normalized_path = functools.lru_cache(maxsize=256)(normalize_path)


class Picker(Protocol):
    """What the stream handler needs from the decision side."""

    async def pick(
        self,
        *,
        body: bytes | None,
        path: str,
        headers: Mapping[str, str],
        subset: list[str] | None,
        client_request_id: str,
        on_queued: Callable[[float], None] | None = None,  # pragma: no mutate
    ) -> Pick: ...

    def first_token(self, pick: Pick, *, at_first_token: bool = True) -> None: ...  # pragma: no mutate

    def finish(self, pick: Pick, cause: str) -> None: ...

    def answered(self, pick: Pick, status: int) -> None: ...

    def response_stored(self, pick: Pick, response_id: str) -> None: ...

    def rejected(self, status: int, reason: str) -> None: ...

    @property
    def may_queue(self) -> bool: ...


@runtime_checkable
class OutputTracker(Protocol):
    """A picker that takes generated tokens (--router-track-output-blocks)."""

    @property
    def tracks_output_blocks(self) -> bool: ...

    def output_tokens(self, pick: Pick, count: int, sequences: int = 1) -> None: ...  # pragma: no mutate


class Phase(enum.Enum):
    REQUEST_HEADERS = "request_headers"
    REQUEST_BODY = "request_body"
    UPSTREAM = "upstream"  # routed; waiting for the response
    RESPONSE_BODY = "response_body"
    DONE = "done"


@dataclass(slots=True)
class _Stream:
    phase: Phase = Phase.REQUEST_HEADERS
    request_body_mode: int = BUFFERED
    response_body_mode: int = 0
    mode_known: bool = False  # Envoy said its body modes (protocol_config)
    headers: dict[str, str] = field(default_factory=dict)
    path: str = ""  # :path, normalised
    request_id: str = ""
    subset: list[str] | None = None
    body: bytearray = field(default_factory=bytearray)
    pick: Pick | None = None
    first_token_seen: bool = False
    # False once the response headers name a type other than an event stream: a whole answer (a
    # non-streamed request), whose first chunk comes when generation is over, not at the first token
    chunks_are_tokens: bool = True
    response_head: bytearray | None = None  # a Responses API answer's first bytes, until its id is read
    output: OutputTokens | None = None  # counting generated tokens (output-block tracking)
    restorer: ModelNameRestorer | None = None  # a rewritten request's answer: the asked model said again
    form: FormModel | None = None  # a duplex form upload's model field, read as the body comes
    echo_body: bool = False  # routed before its body ended (a form): the rest passes through as it comes
    started_ns: int = field(default_factory=time.perf_counter_ns)  # the stream opened: the request came
    response_bytes: int = 0  # a routed request's answer body, as the worker sent it
    usage: Usage | None = None  # the engine's token counts, read from a routed request's 2xx answer
    output_reported: int = 0  # tokens per sequence told to the picker
    output_sequences: int = 1  # sequences told to the picker
    freed: bool = False
    unaccounted: pb.HttpBody | None = None  # a response body chunk answered, not yet accounted
    end_cause: str = "stream_closed"
    notices: list[pb.ProcessingResponse] = field(default_factory=list)  # sent while a message waits
    notice: asyncio.Future[None] | None = None  # resolved when a notice waits to be sent

    @property
    def body_in_one_message(self) -> bool:
        """BUFFERED as Envoy said: the first body message holds the whole body, whatever its
        `end_of_stream` (false when trailers follow)."""
        return self.mode_known and self.request_body_mode == BUFFERED

    @property
    def done(self) -> bool:
        """Whether the stream is over. For a check after an await that may end it: mypy keeps the
        narrowing of `phase` from before the await, this reads it afresh."""
        return self.phase is Phase.DONE


def _learn_modes(stream: _Stream, message: pb.ProcessingRequest) -> None:
    """Read Envoy's body modes from `message`, the stream's first: Envoy sends them (protocol_config)
    once, with whatever comes first. That is the response headers of an answer Envoy made itself
    before the picker saw the request (a path it refused): its body must still be answered in the
    mode Envoy streams it in, or Envoy turns the answer into a 503."""
    if message.HasField("protocol_config"):
        stream.request_body_mode = message.protocol_config.request_body_mode
        stream.response_body_mode = message.protocol_config.response_body_mode
        stream.mode_known = True


def _may_route(stream: _Stream, kind: str | None, message: pb.ProcessingRequest) -> bool:
    """Whether handling `message` (of oneof `kind`) can route the request (and so wait in the
    admission queue): a request-phase message other than a body chunk that does not end the body."""
    if stream.phase not in (Phase.REQUEST_HEADERS, Phase.REQUEST_BODY):
        return False
    if kind != "request_body":
        return True
    return message.request_body.end_of_stream or stream.body_in_one_message


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    """Envoy external processor that routes each request through a Picker."""

    def __init__(
        self,
        picker: Picker,
        *,
        max_body_bytes: int,
        max_concurrent_streams: int | None = None,
        conformance_hooks: bool = False,
        owned_headers: Iterable[str] | None = None,
        track_output_blocks: bool | None = None,
    ) -> None:
        """`owned_headers`: the request headers only the picker may set (default: `epp.owned_headers`
        with the prefill endpoint header of the picker's config, `--prefill-endpoint-header`).
        `track_output_blocks`: count generated tokens in response bodies and give them to the picker
        (default: the picker's `tracks_output_blocks`; never without its `output_tokens`)."""
        if max_concurrent_streams is not None and max_concurrent_streams < 1:
            raise ValueError(f"max_concurrent_streams must be at least 1, got {max_concurrent_streams}")
        self.picker = picker
        self.owned_headers = (
            frozenset(h.strip().lower() for h in owned_headers)
            if owned_headers is not None
            else epp.owned_headers(configured_prefill_header(picker))
        )
        self.max_body_bytes = max_body_bytes
        self.max_concurrent_streams = max_concurrent_streams
        self.conformance_hooks = conformance_hooks
        self.open_streams = 0
        self.output: OutputTracker | None = None
        if isinstance(picker, OutputTracker):
            on = picker.tracks_output_blocks if track_output_blocks is None else track_output_blocks
            self.output = picker if on is True else None
        self.output_lines_skipped = 0  # SSE lines over the bound, over all streams
        self.objectives = ObjectiveMetrics()  # the Inference Extension's per-request series
        self.scheduler = scheduler_metrics.for_picker(picker)  # and its scheduler's
        # Answers are built once per (endpoint, headers) and sent again as they are: a protobuf
        # message is only serialised on the way out, never changed after it is built here.
        self._routing_answers: dict[tuple[str, tuple[tuple[str, str], ...], bool], pb.ProcessingResponse] = {}
        self._served_answers: dict[str, pb.ProcessingResponse] = {}

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = _Stream()
        limit = self.max_concurrent_streams
        if limit is not None and self.open_streams >= limit:
            async for answer in self._refuse(
                stream, request_iterator, TooManyStreams(self.open_streams, limit)
            ):
                yield answer
            return
        self.open_streams += 1
        may_queue = self.picker.may_queue
        try:
            async for message in request_iterator:
                # The oneof is read once per message; the response phases (every streamed chunk
                # passes here) are answered without a coroutine or a list.
                kind = message.WhichOneof("request")
                if kind == "response_body":
                    # answer first, account after: Envoy forwards the chunk while the picker
                    # books its first token, output and free (the stream's end settles a
                    # chunk it answered and never came back for: `_settle_response_body`)
                    stream.unaccounted = body = message.response_body
                    yield self._response_body_answer(stream, body)
                    self._settle_response_body(stream)
                elif kind == "response_headers":
                    if not stream.mode_known:  # the stream's first message: Envoy's own answer
                        _learn_modes(stream, message)
                    yield self._on_response_headers(stream, message.response_headers)
                elif may_queue and _may_route(stream, kind, message):
                    async for answer in self._handle_with_notices(stream, message, kind):
                        yield answer
                else:
                    for answer in await self._handle(stream, message, kind):
                        yield answer
                if stream.phase is Phase.DONE and stream.pick is None:
                    break
        except BaseException:  # cancelled by Envoy or the client, or the servicer failed
            stream.end_cause = "cancelled"
            raise
        finally:
            self.open_streams -= 1
            self._settle_response_body(stream)
            self._free(stream, stream.end_cause)

    async def _refuse(
        self, stream: _Stream, request_iterator: AsyncIterator[pb.ProcessingRequest], error: PickerError
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Answer the stream's first message with `error` and end the stream."""
        async for message in request_iterator:
            if message.WhichOneof("request") == "request_headers":
                stream.request_id = epp.header_map(message.request_headers).get("x-request-id", "")
            yield self._reject(stream, error)
            return

    async def _handle_with_notices(
        self, stream: _Stream, message: pb.ProcessingRequest, kind: str | None
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """`_handle`, sending notices (a queued request's longer deadline) while it waits.

        The handling runs in a task of its own; a notice resolves `stream.notice`, a plain future
        (not a task: nothing is left pending when the stream goes away mid-wait). If the stream
        goes away, the handling task is cancelled and awaited (a queued request leaves the queue)."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(self._handle(stream, message, kind))
        stream.notice = loop.create_future()
        try:
            while not task.done():
                await asyncio.wait((task, stream.notice), return_when=asyncio.FIRST_COMPLETED)
                stream.notice = loop.create_future()  # before yielding: a notice meanwhile wakes it
                while stream.notices:
                    yield stream.notices.pop(0)
            answers = task.result()
        finally:
            stream.notice = None
            if not task.done():  # the stream went away: cancel the decision (leaves the queue)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for answer in answers:
            yield answer

    async def _handle(
        self, stream: _Stream, message: pb.ProcessingRequest, kind: str | None
    ) -> list[pb.ProcessingResponse]:
        """The answers to one message whose oneof is `kind` (`Process` answers the response
        headers and body itself, without this coroutine, unless they may have to wait)."""
        if kind == "request_headers":
            return await self._on_request_headers(stream, message)
        if kind == "request_body":
            return await self._on_request_body(stream, message.request_body)
        if kind == "request_trailers":
            return await self._on_request_trailers(stream)
        if kind == "response_headers":
            return [self._on_response_headers(stream, message.response_headers)]
        if kind == "response_body":
            answer = self._response_body_answer(stream, message.response_body)
            self._on_response_body(stream, message.response_body)
            return [answer]
        if kind == "response_trailers":
            self._count_output(stream, b"", end=True)
            self._free(stream, "complete")
            if stream.restorer is not None and stream.restorer.held:  # the body ended without its end
                held = stream.restorer.feed(b"", end=True)
                if stream.response_body_mode == DUPLEX:  # the bytes held back go out before the trailers
                    return [epp.echo_response_chunk(held, False), epp.CONTINUE_RESPONSE_TRAILERS]
            return [epp.CONTINUE_RESPONSE_TRAILERS]
        log.warning("ignoring ext_proc message without a known phase: %s", kind)
        return []

    # --- request path ------------------------------------------------------------------------

    async def _on_request_headers(
        self, stream: _Stream, message: pb.ProcessingRequest
    ) -> list[pb.ProcessingResponse]:
        if stream.phase is not Phase.REQUEST_HEADERS:  # one request per stream: a repeat changes nothing
            log.warning("ignoring request headers sent again on the stream of %s", stream.request_id)
            return [epp.CONTINUE_REQUEST_HEADERS]
        _learn_modes(stream, message)
        stream.headers = epp.header_map(message.request_headers)
        stream.request_id = stream.headers.get("x-request-id") or uuid.uuid4().hex
        stream.subset = epp.subset_hint(message) if message.HasField("metadata_context") else None
        try:
            stream.path = _normalized_path(stream.headers.get(":path", ""))
        except RequestInvalid as exc:  # an encoded slash, a NUL, a fragment: Envoy's 400 too
            stream.phase = Phase.DONE
            return [self._reject(stream, exc)]
        if message.request_headers.end_of_stream:
            # No body is coming. A POST to a routable path is decided on its empty body (a 400),
            # never sent on untracked; anything else is routed on the headers alone.
            routable = stream.path.partition("?")[0] in ROUTABLE_PATHS
            empty = b"" if routable and stream.headers.get(":method", "").upper() == "POST" else None
            return [await self._route(stream, empty, in_body=False)]
        if stream.request_body_mode not in (BUFFERED, DUPLEX):
            # Envoy will not show us the body: route on the headers alone.
            return [await self._route(stream, None, in_body=False)]
        stream.phase = Phase.REQUEST_BODY
        if stream.request_body_mode == DUPLEX:
            content_type = stream.headers.get("content-type", "")
            if is_form(content_type) and stream.path.partition("?")[0] not in ROUTABLE_PATHS:
                stream.form = FormModel(content_type)  # an upload: routed once its model field is read
            return []  # held until the body ends (or a form's model field)
        return [epp.CONTINUE_REQUEST_HEADERS]

    async def _on_request_body(self, stream: _Stream, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if stream.phase is not Phase.REQUEST_BODY:
            if stream.echo_body:  # a form routed on its model field: the rest of the upload streams on
                return list(epp.streamed_body(body.body, end_of_stream=body.end_of_stream))
            return [epp.CONTINUE_REQUEST_BODY]
        data, held = body.body, stream.body
        if len(held) + len(data) > self.max_body_bytes:
            stream.phase = Phase.DONE
            hint = _FORM_TOO_LARGE if stream.form is not None else ""
            return [self._reject(stream, BodyTooLarge(len(held) + len(data), self.max_body_bytes, hint))]
        if body.end_of_stream or stream.body_in_one_message:
            if held:  # earlier chunks (duplex): the whole body, once
                held += data
                data = bytes(held)
                stream.body = bytearray()
            return await self._body_complete(stream, data, end_of_stream=body.end_of_stream)
        held += data
        if stream.form is not None and stream.form.feed(data):
            return await self._route_form(stream)
        return []

    async def _route_form(self, stream: _Stream) -> list[pb.ProcessingResponse]:
        """Route a form upload (duplex) once its model field is read, or known to be absent: the
        headers answer and the bytes held so far, then each later chunk as it comes (`echo_body`).
        The file streams to its worker as the client sends it, never held whole by the picker."""
        body, stream.body, stream.form = bytes(stream.body), bytearray(), None
        answer = await self._route(stream, body, in_body=False, size=_declared_size(stream.headers, body))
        if answer.HasField("immediate_response"):
            return [answer]
        stream.echo_body = True
        return [answer, *epp.streamed_body(body, end_of_stream=False)]

    async def _on_request_trailers(self, stream: _Stream) -> list[pb.ProcessingResponse]:
        if stream.phase is Phase.REQUEST_BODY and stream.body_in_one_message:
            # BUFFERED, headers then trailers and no data: the headers were answered already and a
            # trailers answer cannot change them (no destination header, no owned headers removed),
            # so such a request is not routed: a 400, as for any body-less POST to a routable path.
            stream.phase = Phase.DONE
            routable = stream.path.partition("?")[0] in ROUTABLE_PATHS
            message = "request body is empty; send the request as a JSON object"
            return [self._reject(stream, RequestInvalid(message if routable else _TRAILERS_WITHOUT_BODY))]
        # Trailers end a duplex body that had no end_of_stream (or no data at all)
        if stream.phase is Phase.REQUEST_BODY:
            body, stream.body = bytes(stream.body), bytearray()
            answers = await self._body_complete(stream, body, end_of_stream=False)
            return [*answers, epp.CONTINUE_REQUEST_TRAILERS] if not stream.done else answers
        return [epp.CONTINUE_REQUEST_TRAILERS]

    async def _body_complete(
        self, stream: _Stream, body: bytes, *, end_of_stream: bool
    ) -> list[pb.ProcessingResponse]:
        duplex = stream.request_body_mode == DUPLEX
        answer = await self._route(stream, body, in_body=not duplex)
        if not duplex or answer.HasField("immediate_response"):
            return [answer]
        if stream.pick is not None and stream.pick.body is not None:  # rewritten: Envoy drops its length
            body, stream.pick.body = stream.pick.body, None  # not held while the answer streams
        return [answer, *epp.streamed_body(body, end_of_stream=end_of_stream)]

    async def _route(
        self, stream: _Stream, body: bytes | None, *, in_body: bool, size: int | None = None
    ) -> pb.ProcessingResponse:
        """Route the request on `body` (None: its headers alone). `size`: the request's size in bytes
        when `body` is only its start (a form routed on its model field), else `body`'s."""
        try:
            pick = await self.picker.pick(
                body=body,
                path=stream.path,
                headers=stream.headers,
                subset=stream.subset,
                client_request_id=stream.request_id,
                # only a stream that can send notices (may queue) has anything to do when queued
                on_queued=functools.partial(self._queued, stream) if stream.notice is not None else None,
            )
        except (PickerError, RouterError) as exc:
            stream.phase = Phase.DONE
            return self._reject(stream, exc)
        except Exception as exc:
            log.exception("picker failed on %s", stream.request_id)
            stream.phase = Phase.DONE
            return self._reject(stream, exc)
        stream.pick = pick
        stream.phase = Phase.UPSTREAM
        if pick.counted:
            self.objectives.routed(pick.labels, size if size is not None else len(body) if body else 0)
            self.scheduler.scheduled(pick)
        if pick.body is not None and in_body:  # a rewritten body: an answer of its own, never cached
            body, pick.body = pick.body, None  # not held while the answer streams
            return epp.route_in_body(pick.endpoint, pick.headers, self.owned_headers, body)
        return self._routing_answer(pick.endpoint, pick.headers, in_body)

    def _routing_answer(
        self, endpoint: str, headers: Mapping[str, str], in_body: bool
    ) -> pb.ProcessingResponse:
        key = (endpoint, tuple(headers.items()), in_body)
        answer = self._routing_answers.get(key)
        if answer is None:
            if len(self._routing_answers) >= MAX_CACHED_ANSWERS:
                self._routing_answers.clear()
            build = epp.route_in_body if in_body else epp.route_in_headers
            answer = self._routing_answers[key] = build(endpoint, headers, self.owned_headers)
        return answer

    def _queued(self, stream: _Stream, wait_s: float) -> None:
        """The request waits in the admission queue: ask Envoy to wait longer for this answer."""
        if stream.notice is not None:
            stream.notices.append(epp.extend_message_timeout(wait_s + 1.0))
            if not stream.notice.done():
                stream.notice.set_result(None)

    def _reject(self, stream: _Stream, exc: BaseException) -> pb.ProcessingResponse:
        status, reason = epp.status_of(exc)
        log.info("rejected %s with %d (%s): %s", stream.request_id, status, reason, exc)
        self.picker.rejected(status, reason)
        self.objectives.failed(refusal_labels(exc), error_code(status))
        self.scheduler.refused(exc)
        return epp.error_answer(exc)

    # --- response path -----------------------------------------------------------------------

    def _on_response_headers(self, stream: _Stream, headers: pb.HttpHeaders) -> pb.ProcessingResponse:
        pick = stream.pick
        status = _status(headers)
        if pick is not None and status.isdigit():
            self.picker.answered(pick, int(status))
        if pick is not None and not status.startswith("2"):
            if pick.counted and not stream.freed:
                self.objectives.failed(pick.labels, MODEL_SERVER_ERROR)
            self._free(stream, f"upstream_status_{status}")
        elif headers.end_of_stream:
            self._free(stream, "complete")
        elif pick is not None and not stream.freed:
            if pick.counted:
                stream.usage = Usage()
            if pick.tracked:
                self._follow_answer(stream, pick, headers)
        stream.phase = Phase.RESPONSE_BODY
        if pick is None:
            return epp.CONTINUE_RESPONSE_HEADERS
        answer = self._served_answers.get(pick.endpoint)
        if answer is None:
            if len(self._served_answers) >= MAX_CACHED_ANSWERS:
                self._served_answers.clear()
            answer = epp.served_answer(pick.endpoint, conformance=self.conformance_hooks)
            self._served_answers[pick.endpoint] = answer
        if pick.renamed is not None and not headers.end_of_stream:
            # its body names the model it was sent as: said again as asked, in every chunk (Envoy
            # drops the content-length of an answer whose streamed body the processor may change)
            stream.restorer = ModelNameRestorer(*pick.renamed)
        return answer

    def _follow_answer(self, stream: _Stream, pick: Pick, headers: pb.HttpHeaders) -> None:
        """A tracked request's 2xx answer begins: what its body is looked at for."""
        content_type = _header(headers, "content-type")
        stream.chunks_are_tokens = not content_type or content_type.lower().startswith("text/event-stream")
        if pick.responses_api and pick.response_id is None:
            stream.response_head = bytearray()
        if self.output is not None:
            stream.output = OutputTokens(content_type)

    @staticmethod
    def _response_body_answer(stream: _Stream, body: pb.HttpBody) -> pb.ProcessingResponse:
        restorer = stream.restorer
        if restorer is not None:
            chunk = restorer.feed(body.body, body.end_of_stream)
            if stream.response_body_mode == DUPLEX:
                return epp.echo_response_chunk(chunk, body.end_of_stream)
            return epp.replace_response_chunk(chunk)
        if stream.response_body_mode == DUPLEX:
            return epp.echo_response_chunk(body.body, body.end_of_stream)
        return epp.CONTINUE_RESPONSE_BODY

    def _settle_response_body(self, stream: _Stream) -> None:
        """Account the response body chunk answered last, once (`_on_response_body`)."""
        body, stream.unaccounted = stream.unaccounted, None
        if body is not None:
            self._on_response_body(stream, body)

    def _on_response_body(self, stream: _Stream, body: pb.HttpBody) -> None:
        pick = stream.pick
        if stream.response_head is not None and pick is not None:
            self._read_response_id(stream, pick, body.body)
        if (
            pick is not None
            and not stream.first_token_seen
            and not stream.freed
            and not (pick.responses_api and _before_generation(stream, body))
        ):
            stream.first_token_seen = True
            self.picker.first_token(pick, at_first_token=stream.chunks_are_tokens)
        usage = stream.usage
        if usage is not None and not stream.freed:
            data = body.body
            stream.response_bytes += len(data)
            usage.feed(data)
        if stream.output is not None:
            self._count_output(stream, body.body, end=body.end_of_stream)
        if body.end_of_stream:
            self._free(stream, "complete")

    def _read_response_id(self, stream: _Stream, pick: Pick, data: bytes) -> None:
        """Look for a Responses API answer's id in its first bytes; tell the picker once found."""
        head = stream.response_head
        assert head is not None
        head += data[: responses_stream.MAX_ID_SCAN_BYTES - len(head)]
        response_id = responses_stream.response_id(bytes(head))
        if response_id is not None:
            self.picker.response_stored(pick, response_id)
        if response_id is not None or len(head) >= responses_stream.MAX_ID_SCAN_BYTES:
            stream.response_head = None

    def _count_output(self, stream: _Stream, data: bytes, *, end: bool) -> None:
        """Count a response body chunk's tokens and tell the picker those new since the last one."""
        counter, tracker, pick = stream.output, self.output, stream.pick
        if counter is None or tracker is None or pick is None or stream.freed:
            return
        skipped = counter.skipped_lines
        try:
            counter.feed(data)
            if end:
                counter.finish()
            count = counter.per_sequence() - stream.output_reported
            sequences = counter.sequences
            if count > 0 or sequences > stream.output_sequences:
                tracker.output_tokens(pick, max(0, count), sequences)
                stream.output_reported += max(0, count)
                stream.output_sequences = sequences
        except Exception:  # never let counting break the stream: stop counting this one
            log.exception("counting output tokens of %s failed; not counted further", stream.request_id)
            stream.output = None
            return
        if counter.skipped_lines > skipped:
            self.output_lines_skipped += counter.skipped_lines - skipped
            log.warning(
                "response of %s: an SSE line over %d bytes skipped (its tokens are not counted)",
                stream.request_id, counter.max_line_bytes,
            )  # fmt: skip
        if end:
            stream.output = None

    def _free(self, stream: _Stream, cause: str) -> None:
        pick = stream.pick
        if pick is not None and not stream.freed:
            stream.freed = True
            self.picker.finish(pick, cause)
            if pick.counted:
                self.objectives.ended(pick.labels)
                if cause == "complete":
                    self._answered(stream, pick)

    def _answered(self, stream: _Stream, pick: Pick) -> None:
        """A routed request's 2xx answer ended: its duration, sizes and tokens (the engine's counts
        where it said them, else the picker's own)."""
        usage = stream.usage or Usage()
        output = usage.completion_tokens
        if output is None and self.output is not None and pick.output_tokens:
            output = pick.output_tokens * stream.output_sequences
        end_ns = time.perf_counter_ns()
        ttft_s = tpot_s = predicted_s = None
        if pick.first_token_ns:  # it streamed its tokens
            ttft_s = (pick.first_token_ns - stream.started_ns) / 1e9
            predicted_s = pick.predicted_ttft_ms / 1000 if pick.predicted_ttft_ms is not None else None
            if output:  # per sequence, rounded up: the answer ends with its longest sequence
                per_sequence = -(-output // max(1, pick.sequences))
                if per_sequence > 1:
                    tpot_s = (end_ns - pick.first_token_ns) / 1e9 / (per_sequence - 1)
        self.objectives.answered(
            pick.labels,
            (end_ns - stream.started_ns) / 1e9,
            stream.response_bytes,
            usage.prompt_tokens if usage.prompt_tokens is not None else pick.prompt_tokens,
            output,
            usage.cached_tokens,
            ttft_s,
            tpot_s,
            predicted_s,
        )


def _status(headers: pb.HttpHeaders) -> str:
    """The `:status` of response headers, as `epp.header_map(headers).get(":status", "200")` reads it
    (the last one wins, `raw_value` preferred) without building the whole map."""
    status = "200"
    for h in headers.headers.headers:
        if h.key == ":status" or h.key.lower() == ":status":
            status = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return status


def _before_generation(stream: _Stream, body: pb.HttpBody) -> bool:
    """A Responses API stream's chunk holding only `response.created` / `in_progress` (sent before
    generation starts): not the first token."""
    return stream.chunks_are_tokens and not body.end_of_stream and responses_stream.only_preamble(body.body)


def _header(headers: pb.HttpHeaders, name: str) -> str:
    """The last value of header `name` (lowercase), `raw_value` preferred; "" without one."""
    value = ""
    for h in headers.headers.headers:
        if h.key == name or h.key.lower() == name:
            value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return value


def configured_prefill_header(picker: object) -> str:
    """The prefill endpoint header the picker's config names (`--prefill-endpoint-header`), else the
    default: a decode side given this header sends the prompt to the address it names."""
    header = getattr(getattr(getattr(picker, "config", None), "disagg", None), "prefill_header", None)
    return header if isinstance(header, str) and header.strip() else epp.DEFAULT_PREFILL_HEADER


def _declared_size(headers: Mapping[str, str], start: bytes) -> int:
    """A request's size from its `content-length`, when it declares one; else its `start`'s."""
    declared = headers.get("content-length", "")
    return int(declared) if declared.isascii() and declared.isdigit() else len(start)
