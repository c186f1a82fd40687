"""Recovery of Dynamo workers' KV state from their local indexers (Dynamo 1.6.1 `enable_local_indexer`).

A Dynamo worker whose `KvEventPublisher` has `enable_local_indexer=True` keeps its own index of the
blocks it published and its last 1024 events, and serves them on its request plane. Dynamo's router
queries it to rebuild a worker's blocks on start, when a worker appears and when the worker's event
stream shows a gap; this module does the same for the picker, beside Dynamo's event plane on NATS
(`extproc.events.nats_events`) or ZMQ (`extproc.events.dynamo_zmq_plane`). What is spoken, as read
from ai-dynamo-runtime 1.6.1 and checked against its own worker side (tests/nats/test_dynamo_recovery.py):

Discovery (`--discovery-backend file`, Dynamo's file store at DYN_FILE_KV, default
$TMPDIR/dynamo_store_kv): each publisher writes `<root>/v1/event_sources/<key>`, JSON

    {"type": "EventSource", "scope": {"kind": "endpoint", "endpoint": {namespace, component, name}},
     "topic": "kv-events", "publisher_id": u64,
     "metadata": {"worker": {"worker_id": u64, "dp_rank": u32}, "publisher_id": u64,
                  "recovery_target": {"endpoint": "worker_kv_query_source_<publisher_id hex>",
                                      "transport": {"tcp": "host:port/<endpoint path>"},
                                      "request_plane_codec": "msgpack" | "json", ...}}}

(no `recovery_target` without the local indexer), removed when the publisher shuts down; a restarted
publisher writes a new one under a new publisher id. Dynamo's other discovery backends (etcd,
Kubernetes) cannot be read here; `mem` is visible only inside the worker's process.

Request plane (TCP): one connection to host:port carries a frame
`u16 path length, path, u16 headers length, headers (JSON map), u32 payload length, payload`
(lib/runtime/src/pipeline/network/codec.rs, `TcpRequestMessage`), answered on the same connection by
`u32 length, data`: empty is the acknowledgement, `Server unavailable: ...` a refusal. The payload is
one two-part frame (`u64 header length, u64 body length, u64 checksum (0: none), header, body`,
codec/two_part.rs) whose header is the JSON `RequestControlMessage` {id, request_type: single_in,
response_type: many_out, payload_codec, connection_info: {transport: tcp_server, info: JSON string
{address, subject, context, stream_type: response}}} and whose body is the `WorkerKvQueryRequest`
{worker_id, dp_rank, start_event_id, end_event_id} in the payload codec (msgpack with field names).

Response stream (TCP, the caller listens): the worker connects to `address` and sends two-part frames:
the handshake (header {subject, stream_type}), the prologue (header {error: null | text}), data frames
(body: {data: WorkerKvQueryResponse, complete_final: bool} in the payload codec), then the header
"sentinel". The answers (lib/kv-router/src/indexer/types.rs):

    {"TreeDump": {events: [RouterEvent], last_event_id, reset_scope}}   start_event_id nil: every
        block as stored events (event id 0, parents first); last_event_id is the newest real id
    {"Events": {events: [RouterEvent], last_event_id}}   ids start_event_id.. from the buffer (an id
        older than the buffer gets a TreeDump instead)
    {"TooNew": {requested_start, requested_end, newest_available}}, {"InvalidRange": {...}},
    {"TreeDumpFailed": {...}}, {"Error": text}

RouterEvents have the event plane's shape and are decoded by `extproc.events.dynamo_plane`.

Merging with the live stream, as Dynamo's router does (recovery/worker_query_state.rs), per worker
and dp rank: while a query is in flight, live events are held (at most 1024, the oldest dropped); a
tree dump replaces the worker's blocks and sets the cursor to its last_event_id; held events at or
below the cursor are dropped (the dump has them), the next ones applied in order, and a hole among
them asks for the missing ids (`Events` from the cursor). Later, an event at cursor + 1 is applied;
one beyond is a gap (held, the missing ids asked for); one at or below the cursor means the
publisher restarted (Dynamo 1.6.1 numbers a new publisher's events from 1 again): the worker's new
source is found and dumped. The workers advertised at start are dumped then (after the subscription
is made, so nothing falls between a dump and the stream); a worker not recovered yet is looked for
in the store at its first event (which, like those until its dump starts, the subscriber applies as
usual; the dump then replaces them), and every worker added to the picker's list is looked for at
once (`rescan`: one whose events were ignored until then). A stored block under a parent the picker
does not know (the feed's orphan detection, `RouterFeed.set_resync`) dumps the worker again. A
failed query is retried 8 times with backoff from 0.2 s, at most 16 queries in flight (Dynamo's
numbers); then the worker is released to the subscriber's own handling (`dynamo_intake.follow_gap`,
the feed's orphan detection) and taken again after 30 s.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import struct
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from extproc.config.events import EventsConfig
from extproc.events.counters import EventCounters
from extproc.events.dynamo_intake import DynamoEventIntake
from extproc.events.dynamo_plane import TOPIC, decode_envelope
from extproc.events.feed import RouterFeed
from extproc.events.sink import EventSink
from extproc.router.types import KvEvent, Worker, WorkerId

log = logging.getLogger("extproc.events.dynamo_recovery")

PENDING_LIMIT = 1024  # live events held per worker while it is recovered (Dynamo's limit)
RETRIES = 8  # failed queries before a worker is released (Dynamo's RECOVERY_MAX_RETRIES)
CONCURRENCY = 16  # queries in flight at once, over all workers (Dynamo's RECOVERY_CONCURRENCY_LIMIT)
BACKOFF_S = 0.2  # first retry delay, doubled each time (Dynamo's 200 ms)
RELEASE_S = 30.0  # a released worker is not taken again before this long
RESCAN_S = 1.0  # the sources are listed again for workers not recovered at most this often ...
UNADVERTISED_S = 30.0  # ... and a worker not found there is not looked for again before this long
QUERY_TIMEOUT_S = 30.0  # one query, connection to last frame (a tree dump of a large cache)
MAX_FRAME = 256 * 1024 * 1024  # bytes in one response frame


class RecoveryError(Exception):
    """A query that could not be made or answered (refused, closed early, malformed)."""


@dataclass(frozen=True, slots=True)
class QueryTarget:
    """One publisher's local-indexer query endpoint, as its event source advertises it."""

    wire_worker: int  # Dynamo's u64 worker id
    dp_rank: int
    publisher_id: int
    host: str
    port: int
    path: str  # the endpoint path on the worker's request plane server
    codec: str = "msgpack"  # the request plane payload codec: msgpack or json
    mtime: float = 0.0  # when its file was written (the newest wins for one worker and dp rank)


def read_file_sources(root: str, namespace: str, component: str, endpoint: str) -> list[QueryTarget]:
    """The query targets of every publisher on `namespace.component.endpoint` (`*`: any endpoint)
    in Dynamo's file discovery store at `root`; one per worker and dp rank, the newest. Blocking I/O.

    Files that are not such event sources, or advertise no recovery target (local indexer off), are
    skipped; a missing store is no target.
    """
    found: dict[tuple[int, int], QueryTarget] = {}
    directory = Path(root) / "v1" / "event_sources"
    try:
        paths = list(directory.iterdir())
    except OSError:
        return []
    for path in paths:
        try:
            mtime = path.stat().st_mtime
            document = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue  # removed meanwhile, or being written
        target = _target(document, namespace, component, endpoint, mtime)
        if target is None:
            continue
        key = (target.wire_worker, target.dp_rank)
        if key not in found or found[key].mtime <= target.mtime:
            found[key] = target
    return sorted(found.values(), key=lambda t: (t.wire_worker, t.dp_rank))


def _target(document: Any, namespace: str, component: str, endpoint: str, mtime: float) -> QueryTarget | None:
    try:
        scope = document["scope"]["endpoint"]
        if document.get("topic") != TOPIC or scope["namespace"] != namespace:
            return None
        if scope["component"] != component:
            return None
        if endpoint != "*" and scope["name"] != endpoint:
            return None
        metadata = document["metadata"]
        recovery = metadata.get("recovery_target")
        if not recovery:
            return None
        address, path = str(recovery["transport"]["tcp"]).split("/", 1)
        host, port = address.rsplit(":", 1)
        return QueryTarget(
            wire_worker=int(metadata["worker"]["worker_id"]),
            dp_rank=int(metadata["worker"].get("dp_rank", 0)),
            publisher_id=int(metadata.get("publisher_id", document.get("publisher_id", 0))),
            host=host.strip("[]"),
            port=int(port),
            path=path,
            codec=str(recovery.get("request_plane_codec", "msgpack")),
            mtime=mtime,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


# --- one query -------------------------------------------------------------------------------------

TREE_DUMP, EVENTS, TOO_NEW, FAILED = "tree_dump", "events", "too_new", "failed"


@dataclass(frozen=True, slots=True)
class IndexerAnswer:
    """A local indexer's answer: `kind` TREE_DUMP or EVENTS with raw RouterEvents and the newest
    event id, TOO_NEW, or FAILED (`detail` says why: InvalidRange, TreeDumpFailed, Error)."""

    kind: str
    events: list[Any] = field(default_factory=list)
    last_event_id: int | None = None
    detail: str = ""


def _two_part(header: bytes, body: bytes) -> bytes:
    return struct.pack(">QQQ", len(header), len(body), 0) + header + body


async def _read_two_part(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    header_len, body_len, _checksum = struct.unpack(">QQQ", await reader.readexactly(24))
    if header_len + body_len > MAX_FRAME:
        raise RecoveryError(f"a response frame of {header_len + body_len} bytes")
    return await reader.readexactly(header_len), await reader.readexactly(body_len)


def _encode(codec: str, value: Any) -> bytes:
    return json.dumps(value).encode() if codec == "json" else msgpack.packb(value)


def _decode(codec: str, data: bytes) -> Any:
    return json.loads(data) if codec == "json" else msgpack.unpackb(data, raw=False, strict_map_key=False)


async def query_local_indexer(
    target: QueryTarget,
    start_event_id: int | None = None,
    end_event_id: int | None = None,
    *,
    timeout_s: float = QUERY_TIMEOUT_S,
) -> IndexerAnswer:
    """Ask one worker's local indexer for its blocks (`start_event_id` None: a tree dump) or for its
    events from `start_event_id`. Raises RecoveryError, OSError or TimeoutError when no answer came."""
    async with asyncio.timeout(timeout_s):
        return await _query(target, start_event_id, end_event_id)


async def _query(target: QueryTarget, start: int | None, end: int | None) -> IndexerAnswer:
    # frames of the response stream; None: it ended; a RecoveryError: it broke that way
    frames: asyncio.Queue[tuple[bytes, bytes] | RecoveryError | None] = asyncio.Queue()
    handlers: set[asyncio.Task[Any]] = set()  # one per response stream the worker opened
    ended: list[bool] = []  # the query is over: a stream that starts now is closed at once

    async def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            handlers.add(task)
        try:
            if ended:
                return
            while True:
                await frames.put(await _read_two_part(reader))
        except RecoveryError as exc:
            await frames.put(exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            await frames.put(None)  # the stream ended (after the sentinel, or early)
        finally:
            writer.close()  # also when the query ended first (answered, failed or cancelled)

    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        own_host = writer.get_extra_info("sockname")[0]  # where the worker reaches this process
        server = await asyncio.start_server(on_stream, own_host, 0)
        try:
            port = server.sockets[0].getsockname()[1]
            request_id, subject = str(uuid.uuid4()), str(uuid.uuid4())
            address = f"[{own_host}]:{port}" if ":" in own_host else f"{own_host}:{port}"
            info = {"address": address, "subject": subject, "context": request_id, "stream_type": "response"}
            control = {
                "id": request_id,
                "request_type": "single_in",
                "response_type": "many_out",
                "payload_codec": target.codec,
                "connection_info": {"transport": "tcp_server", "info": json.dumps(info)},
            }
            request = {
                "worker_id": target.wire_worker,
                "dp_rank": target.dp_rank,
                "start_event_id": start,
                "end_event_id": end,
            }
            payload = _two_part(json.dumps(control).encode(), _encode(target.codec, request))
            path, headers = target.path.encode(), json.dumps({"request-id": request_id}).encode()
            writer.write(
                struct.pack(">H", len(path)) + path + struct.pack(">H", len(headers)) + headers
                + struct.pack(">I", len(payload)) + payload
            )  # fmt: skip
            await writer.drain()
            try:
                (ack_len,) = struct.unpack(">I", await reader.readexactly(4))
                ack = await reader.readexactly(ack_len)
            except asyncio.IncompleteReadError as exc:
                raise RecoveryError(
                    "the worker closed the connection before acknowledging the query"
                ) from exc
            if ack.startswith(b"Server unavailable:"):
                raise RecoveryError(f"the worker refused the query: {ack.decode(errors='replace')}")
            return await _answer(frames, subject, target.codec)
        finally:
            ended.append(True)
            server.close()  # no stream is accepted after this: end those that were
            for handler in handlers:
                handler.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
    finally:
        writer.close()


async def _answer(
    frames: asyncio.Queue[tuple[bytes, bytes] | RecoveryError | None], subject: str, codec: str
) -> IndexerAnswer:
    async def frame() -> tuple[bytes, bytes] | None:
        got = await frames.get()
        if isinstance(got, RecoveryError):
            raise got
        return got

    first = await frame()
    if first is None:
        raise RecoveryError("the response stream closed before its handshake")
    handshake = json.loads(first[0] or b"null")
    if not isinstance(handshake, dict) or handshake.get("subject") != subject:
        raise RecoveryError(f"unexpected response handshake {handshake!r:.200}")
    answers: list[Any] = []
    prologue = False
    while (next_frame := await frame()) is not None:
        header, body = next_frame
        if header:
            control = json.loads(header)
            if control == "sentinel":
                break
            if isinstance(control, dict) and "error" in control:
                if control["error"] is not None:
                    raise RecoveryError(f"the worker failed the query: {control['error']}")
                prologue = True
                continue
            raise RecoveryError(f"unexpected control frame {control!r:.200}")
        if body:
            wrapper = _decode(codec, body)
            if isinstance(wrapper, dict) and wrapper.get("data") is not None:
                answers.append(wrapper["data"])
            if isinstance(wrapper, dict) and wrapper.get("complete_final"):
                break
    if not prologue or len(answers) != 1:
        raise RecoveryError(f"expected one answer after the prologue, got {len(answers)}")
    return _indexer_answer(answers[0])


def _indexer_answer(data: Any) -> IndexerAnswer:
    """A WorkerKvQueryResponse (serde's externally tagged enum) as an IndexerAnswer."""
    if not isinstance(data, dict) or len(data) != 1:
        raise RecoveryError(f"unexpected answer {data!r:.200}")
    ((tag, value),) = data.items()
    if tag in ("TreeDump", "Events") and isinstance(value, dict) and isinstance(value.get("events"), list):
        last = value.get("last_event_id")
        if not isinstance(last, int):  # a u64 in Dynamo: without it the events cannot be ordered
            raise RecoveryError(f"a {tag} answer without its last_event_id: {last!r:.50}")
        return IndexerAnswer(TREE_DUMP if tag == "TreeDump" else EVENTS, value["events"], last)
    if tag == "TooNew":
        return IndexerAnswer(TOO_NEW, detail=json.dumps(value, default=str))
    return IndexerAnswer(FAILED, detail=f"{tag}: {value!r:.300}")


# --- merging with the live stream ------------------------------------------------------------------

Query = Callable[[QueryTarget, int | None], Awaitable[IndexerAnswer]]
Sources = Callable[[], Sequence[QueryTarget]]  # blocking: run in a thread


@dataclass(slots=True)
class _Rank:
    """One worker and dp rank recovered from its local indexer."""

    target: QueryTarget | None = None
    cursor: int | None = None  # the last event id applied (None: never recovered)
    inflight: bool = False
    pending: deque[tuple[int, KvEvent | None]] = field(default_factory=lambda: deque(maxlen=PENDING_LIMIT))


class LocalIndexerRecovery:
    """Rebuilds Dynamo workers from their local indexers and orders their live events after that.

    The event plane's subscriber (a `DynamoEventIntake`) hands each decoded event to `take` (its
    `gate`): True means this class took it (applied it, held it, or dropped it as already known); False
    leaves it to the subscriber (a worker without a local indexer, or released after failures). `start`
    recovers every worker whose source is advertised then; a worker that appears later is recovered at
    its first event. `sources` lists the advertised targets (blocking: it runs in a thread), `query`
    asks one (tests give their own). `on_owned(worker, owned)` says when a worker is taken and released
    (the feed's `set_resync`: a store under a parent the picker does not know dumps the worker again).
    Counter keys: `recovery.dump` (tree dumps applied), `recovery.catch_up` (event ranges applied),
    `recovery.gap`, `recovery.restart`, `recovery.resync`, and loudly `recovery.query_failed`,
    `recovery.released`.
    """

    def __init__(
        self,
        sink: EventSink,
        sources: Sources,
        *,
        counters: EventCounters | None = None,
        worker_id_of: Callable[[int], WorkerId] = str,
        wanted: Callable[[Worker], bool] = lambda _: True,
        on_owned: Callable[[Worker, bool], None] = lambda worker, owned: None,
        query: Query | None = None,
        retries: int = RETRIES,
        backoff_s: float = BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.sink = sink
        self.sources = sources
        self.counters = counters if counters is not None else EventCounters()
        self.worker_id_of = worker_id_of
        self.wanted = wanted
        self.on_owned = on_owned
        self.query: Query = query or (lambda target, start: query_local_indexer(target, start))
        self.retries = retries
        self.backoff_s = backoff_s
        self.clock = clock
        self.sleep = sleep  # the pause between a failed query and the next
        self._ranks: dict[Worker, _Rank] = {}
        self._released: dict[Worker, float] = {}  # worker -> when it may be taken again
        self._looked_for: set[Worker] = set()  # workers whose source the next listing looks for
        self._listed_at = -RESCAN_S  # when the sources were last listed for them
        self._listing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = asyncio.Semaphore(CONCURRENCY)

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> int:
        """Recover every advertised worker the picker routes to (in the background); returns how many."""
        targets = await asyncio.to_thread(self.sources)
        started = 0
        for target in targets:
            worker = self._worker(target)
            if self.wanted(worker) and worker not in self._ranks:
                self._begin(worker, _Rank(target=target), None)
                started += 1
        log.info("recovering %d Dynamo workers from their local indexers", started)
        return started

    def rescan(self) -> None:
        """Recover every advertised worker not recovered yet (workers were added to the picker's list:
        one whose events were ignored until now is rebuilt without waiting for its next event)."""
        self._spawn(self._adopt_all())

    async def _adopt_all(self) -> None:
        for target in await asyncio.to_thread(self.sources):
            worker = self._worker(target)
            if worker not in self._ranks and self.wanted(worker):
                self._released.pop(worker, None)
                log.info("%s: added; rebuilding it from its local indexer", worker)
                self._begin(worker, _Rank(target=target), None)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def wait_idle(self) -> None:
        """Until every recovery started so far has ended (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def cursor(self, worker: Worker) -> int | None:
        """The last event id applied for `worker` (None: not recovered, or in flight first)."""
        rank = self._ranks.get(worker)
        return rank.cursor if rank is not None else None

    def owns(self, worker: Worker) -> bool:
        return worker in self._ranks

    def resync(self, worker: Worker, reason: str) -> None:
        """Dump `worker` again (the feed found a stored block under a parent it does not know)."""
        rank = self._ranks.get(worker)
        if rank is not None and not rank.inflight:
            log.info("%s: rebuilding it from its local indexer (%s)", worker, reason)
            self.counters.add("recovery.resync")
            self._begin(worker, rank, None)

    def restarted(self, worker: Worker) -> bool:
        """`worker`'s events now come from a new publisher: its new source is dumped. True when this
        class owns the worker (else the subscriber resets it)."""
        rank = self._ranks.get(worker)
        if rank is None:
            return False
        self.counters.add("recovery.restart")
        if not rank.inflight:  # in flight: a held event at or below the cursor asks again when drained
            log.info("%s: its publisher restarted; rebuilding it", worker)
            rank.pending.clear()  # the old publisher's, if any: the dump has what is left of them
            self._begin(worker, rank, None)
        return True

    # --- the gate ----------------------------------------------------------------------------------

    def take(self, worker: Worker, event_id: int, event: KvEvent | None) -> bool:
        """A live event of `worker`; True when this class handles it. Never raises."""
        try:
            return self._take(worker, event_id, event)
        except Exception:  # the subscriber's own handling is still better than nothing
            log.exception("local-indexer recovery failed on event %d of %s", event_id, worker)
            return False

    def _take(self, worker: Worker, event_id: int, event: KvEvent | None) -> bool:
        rank = self._ranks.get(worker)
        if rank is None:
            self._look_for(worker)
            return False
        if rank.inflight:
            rank.pending.append((event_id, event))
            return True
        # a rank owned and not in flight has its cursor: every answer applied names its last event id
        assert rank.cursor is not None
        if event_id == rank.cursor + 1:
            rank.cursor = event_id
            self._apply(worker, [event])
            return True
        rank.pending.append((event_id, event))
        if event_id > rank.cursor:
            self.counters.add("recovery.gap")
            log.info(
                "%s: events %d..%d missing; asking its local indexer", worker, rank.cursor + 1, event_id - 1
            )
            self._begin(worker, rank, rank.cursor + 1)
        else:  # Dynamo numbers a new publisher's events from 1: its new source is dumped
            self.counters.add("recovery.restart")
            log.info(
                "%s: event %d after %d: its publisher restarted; rebuilding it", worker, event_id, rank.cursor
            )
            self._begin(worker, rank, None)
        return True

    def _look_for(self, worker: Worker) -> None:
        """A live event of a worker not recovered: look for its source among the advertised ones.

        One listing (in a thread) at a time, at most every RESCAN_S, for every worker looked for; a
        worker not advertised there (no local indexer) is left alone for UNADVERTISED_S."""
        now = self.clock()
        if now < self._released.get(worker, 0.0) or not self.wanted(worker):
            return
        self._looked_for.add(worker)
        if not self._listing and now - self._listed_at >= RESCAN_S:
            self._listing, self._listed_at = True, now
            self._spawn(self._adopt())

    async def _adopt(self) -> None:
        try:
            targets = await asyncio.to_thread(self.sources)
        finally:
            self._listing = False
        looked_for, self._looked_for = self._looked_for, set()
        by_worker = {self._worker(t): t for t in targets}
        for worker in looked_for:
            target = by_worker.get(worker)
            if target is None:
                self._released[worker] = self.clock() + UNADVERTISED_S
            elif worker not in self._ranks:
                log.info("%s: its source advertises a local indexer; rebuilding it from there", worker)
                self._begin(worker, _Rank(target=target), None)

    # --- recovery ----------------------------------------------------------------------------------

    def _begin(self, worker: Worker, rank: _Rank, start: int | None) -> None:
        if worker not in self._ranks:
            self._ranks[worker] = rank
            self.on_owned(worker, True)
        rank.inflight = True
        self._spawn(self._recover(worker, rank, start))

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover(self, worker: Worker, rank: _Rank, start: int | None) -> None:
        try:
            await self._query_until_current(worker, rank, start)
        except Exception as exc:  # nothing expected it: give the worker back rather than hold its events
            log.exception("%s: its recovery from its local indexer failed", worker)
            self._release(worker, rank, f"{type(exc).__name__}: {exc}")

    async def _query_until_current(self, worker: Worker, rank: _Rank, start: int | None) -> None:
        """Query `worker`'s local indexer from `start` (None: a tree dump) until the held events follow
        on from what it answered; retries with backoff, then gives the worker back."""
        failures = 0
        while True:
            if start is None:  # a dump asks the newest source (a restarted publisher has a new one)
                targets = await asyncio.to_thread(self.sources)
                rank.target = next((t for t in targets if self._worker(t) == worker), rank.target)
            assert rank.target is not None
            try:
                async with self._in_flight:
                    answer = await self.query(rank.target, start)
                if answer.kind == FAILED:
                    raise RecoveryError(answer.detail)
            except (RecoveryError, OSError, TimeoutError, ValueError, struct.error) as exc:
                failures += 1
                why = str(exc) or type(exc).__name__
                self.counters.loud(
                    "recovery.query_failed", "querying %s's local indexer failed (%d of %d): %s",
                    worker, failures, self.retries + 1, why,
                )  # fmt: skip
                if failures > self.retries:
                    self._release(worker, rank, why)
                    return
                await self.sleep(self.backoff_s * 2 ** (failures - 1))
                continue
            failures = 0
            if answer.kind == TOO_NEW:  # the worker has less than was seen: it restarted
                start = None
                continue
            if answer.kind == TREE_DUMP:
                self._apply_dump(worker, answer)
            else:
                after = -1 if rank.cursor is None else rank.cursor
                self._apply(worker, [e for i, e in self._decode(answer.events) if i > after])
                self.counters.add("recovery.catch_up")
            rank.cursor = answer.last_event_id  # an int in every dump and events answer (_indexer_answer)
            start = self._drain(worker, rank)
            if start is None:
                rank.inflight = False
                return

    def _drain(self, worker: Worker, rank: _Rank) -> int | None:
        """Apply the held events that follow the cursor; the first missing id if some are missing."""
        assert rank.cursor is not None
        while rank.pending:
            event_id, event = rank.pending[0]
            if event_id <= rank.cursor:
                rank.pending.popleft()  # the answer had it
            elif event_id == rank.cursor + 1:
                rank.pending.popleft()
                rank.cursor = event_id
                self._apply(worker, [event])
            else:
                return rank.cursor + 1
        return None

    def _apply_dump(self, worker: Worker, answer: IndexerAnswer) -> None:
        events = [e for _, e in self._decode(answer.events)]
        self.sink.stream_state(worker, True, "rebuilt from its local indexer")
        self.sink.reset_worker(worker, f"rebuilt from its local indexer (up to event {answer.last_event_id})")
        self._apply(worker, events)
        self.counters.add("recovery.dump")
        log.info("%s: rebuilt from its local indexer: %d events up to event %s", worker, len(events),
                 answer.last_event_id)  # fmt: skip

    def _apply(self, worker: Worker, events: Sequence[KvEvent | None]) -> None:
        kept = [e for e in events if e is not None and e.worker == worker]
        if kept:
            self.sink.apply_events(kept)

    def _decode(self, raw_events: list[Any]) -> list[tuple[int, KvEvent | None]]:
        """RouterEvents decoded exactly as the event plane's (`dynamo_plane.decode_envelope`)."""
        envelope = msgpack.packb({"payload": msgpack.packb(raw_events)})  # its topic: the default
        return [
            (e.event_id, e.event)
            for e in decode_envelope(envelope, self.counters, worker_id_of=self.worker_id_of)
        ]

    def _release(self, worker: Worker, rank: _Rank, why: str) -> None:
        """Give the worker back to the subscriber's own handling, and take it again later."""
        self._ranks.pop(worker, None)
        self.on_owned(worker, False)
        self._released[worker] = self.clock() + RELEASE_S
        held = [e for _, e in rank.pending]
        rank.pending.clear()
        self.counters.loud(
            "recovery.released", "%s: its local indexer could not be queried (%s); its events are applied "
            "as they come, without recovery, for %.0f s", worker, why, RELEASE_S,
        )  # fmt: skip
        self._apply(worker, held)  # better than nothing: the feed notices what they hang under

    def _worker(self, target: QueryTarget) -> Worker:
        return Worker(self.worker_id_of(target.wire_worker), target.dp_rank)


async def start_recovery(
    events: EventsConfig,
    intakes: Sequence[DynamoEventIntake],
    feed: RouterFeed,
    worker_id_of: Callable[[int], WorkerId],
) -> LocalIndexerRecovery:
    """Recover the workers advertised in Dynamo's file store (`events.dynamo_file_kv`) and order the
    live events of every recovered worker (each intake's `gate`: the NATS subscriber, Dynamo's ZMQ
    event plane); call once they listen."""
    root = events.dynamo_file_kv
    assert root is not None
    where = (root, events.namespace, events.component, events.dynamo_endpoint)
    recovery = LocalIndexerRecovery(
        feed,
        functools.partial(read_file_sources, *where),
        counters=feed.counters,
        worker_id_of=worker_id_of,
        wanted=lambda worker: worker.worker_id in feed.routers,
        on_owned=lambda worker, owned: feed.set_resync(
            worker, functools.partial(recovery.resync, worker) if owned else None
        ),
    )
    for intake in intakes:
        intake.gate = recovery.take
        intake.restarted = recovery.restarted
    started = await recovery.start()
    log.info("local-indexer recovery from Dynamo's file discovery at %s: %d workers found", root, started)
    return recovery
