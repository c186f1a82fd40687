"""ZMQ KV event subscribers: one per worker endpoint, keeping the router's view of that cache exact.

Owns the receiving side of the vLLM / SGLang stream (`extproc.events.zmq_publisher` is the sending
side): a SUB socket per (worker, dp rank), sequence tracking, replay requests and the `EventSink`
calls. Decoding is `extproc.events.vllm`'s (one decoder per endpoint, reset with the worker). Does
what vLLM's `examples/online_serving/kv_events_subscriber.py` sketches, and what Dynamo's ZMQ relay
does, with the failure cases spelled out:

- start, or a publisher restart (its seq goes back, a reconnect after the TCP connection dropped,
  or a replayed seq arriving with other content): `sink.reset_worker`, then replay the whole
  buffer from seq 0 (a *rebuild*). While the replay socket does not answer, live batches are
  applied to the emptied view (partial knowledge) and the rebuild is retried with backoff;
- a gap (seq jumps): replay the missing range and apply it in order, deduplicated by seq. When
  the replay buffer no longer holds it, reset the worker and carry on from what it still holds
  (marked incomplete); when the replay socket does not answer, reset and rebuild as at start;
- `request_resync(reason)`: others learnt that the view is incomplete (the feed saw a store under
  an unknown parent). A rebuild is scheduled, at most one per `min_resync_interval_s` (a worker
  whose replay buffer no longer reaches seq 0 cannot cause a replay loop); the view is kept, and
  live batches applied, until the replay has answered: then it is replaced in one step;
- liveness: vLLM sends no heartbeat and an idle engine publishes nothing, so silence alone proves
  nothing. After `silence_s` without a batch the replay socket is asked for everything after the
  last seq (a probe that also catches up on missed batches). A probe without an answer, or a
  dropped connection, reports the stream down.

Replay replies (vllm/distributed/kv_events.py and sglang/srt/disaggregation/kv_events.py, vLLM
0.33.0 and SGLang 0.5.23): after the DEALER's empty delimiter, `[topic, seq, payload]` per batch
and `[b"", END_SEQ, b""]` at the end; older vLLM sent `[seq, payload]` and `[END_SEQ, b""]`. Both
are accepted (`parse_replay_reply`); anything else is a malformed reply, and a replay with one is
a failed replay (a batch would be missing).

Stream state, as the sink hears it (`stream_state(worker, up, reason)`, once per change of state
or cause, logged likewise; `StreamStatus` keeps the reason for /debug/workers):

- up only once a replay rebuilt the worker (`rebuilt from replay ...`), or, without a replay
  socket, once a batch decoded (`following live batches only ...: blocks cached before connecting
  are unknown`). A gap the replay buffer no longer holds keeps it up, marked incomplete;
- down while a rebuild is pending or failing, naming the cause (`replay socket ... does not
  answer`, `answered N malformed replies`), while every batch since the last reset was
  undecodable (`all N batches undecodable`), after a probe went unanswered (a rebuild follows),
  and while the connection is lost. Live batches are still applied to the partial view meanwhile.

Bounded buffers (`queue_size`, `--event-queue-size`): the SUB socket holds at most that many
batches (ZMQ_RCVHWM) while the picker is busy; beyond it ZMQ stops reading, TCP pushes back and the
publisher drops at its own high-water mark, as vLLM's does. A dropped batch is a seq gap: counted
as dropped (`drops[("zmq", worker, "seq-gap")]`) and filled from the replay socket (the
resynchronisation), or the worker is reset when the replay cannot fill it. A replay is read in
parts of at most `queue_size` batches, each applied before the next is asked for. A gap is counted
as at most `MAX_DROPPED_AT_ONCE` batches (extproc/events/counters.py): seqs come from the wire.

One socket, one dp rank: the engine binds rank r's at the event port + r and stamps r on its
batches. A batch naming another rank is dropped before it is decoded (`drops[("zmq", worker,
"other-dp-rank")]`, `zmq.dp_rank_mismatch`, logged): everything a subscriber applies belongs to its
own (worker, rank), so that rank's reset takes all of it; such a batch means the config's ports or
dp ranks do not match the engine's.

Counters (`EventCounters`): zmq.batch, zmq.undecodable, zmq.event, zmq.gap, zmq.dropped, zmq.replay,
zmq.replay_failed, zmq.replay_malformed, zmq.replay_truncated, zmq.reset, zmq.restart,
zmq.reconnect, zmq.duplicate, zmq.probe, zmq.probe_failed, zmq.unfilled_gap, zmq.rebuild,
zmq.resync_requested, zmq.resync_deferred, zmq.resync_unavailable, zmq.dp_rank_mismatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from extproc.events.counters import EventCounters
from extproc.events.sink import EventSink
from extproc.events.vllm import END_SEQ, VllmEventDecoder, encode_seq, parse_frames, parse_replay_reply
from extproc.router.types import Worker
from extproc.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Batch = tuple[int, bytes]  # (seq, msgpack payload)

DEFAULT_QUEUE_SIZE = 10_000  # batches buffered per subscriber (--event-queue-size)


@dataclass(frozen=True, slots=True)
class ZmqEndpoint:
    """Where one worker's dp rank publishes: `tcp://ip:port` of its PUB socket and of its replay socket."""

    worker: Worker
    pub: str
    replay: str | None = None
    topic: str = ""

    @staticmethod
    def for_dp_ranks(
        worker_id: int | str, pub: str, replay: str | None, dp_ranks: Sequence[int] = (0,), topic: str = ""
    ) -> list[ZmqEndpoint]:
        """One endpoint per dp rank, ports offset by the rank as vLLM binds them.

        vLLM 0.33 and SGLang 0.5.23 bind rank r's PUB socket at the endpoint's port + r and its replay
        socket at the replay port + r: the two ranges must not overlap, or the engine fails to start
        ("Address already in use"). Such a layout is logged, since it cannot be what the engine runs.
        """
        endpoints = [
            ZmqEndpoint(Worker(worker_id, r), offset_port(pub, r), replay and offset_port(replay, r), topic)
            for r in dp_ranks
        ]
        pubs = {e.pub for e in endpoints}
        clash = sorted(e.replay for e in endpoints if e.replay in pubs)
        if clash:
            log.warning(
                "worker %s: its dp ranks' KV event ports and replay ports overlap at %s: the engine binds "
                "both at port + dp rank and cannot start so; give the replay port at least the event "
                "port + the dp size",
                worker_id, ", ".join(clash),
            )  # fmt: skip
        return endpoints


def offset_port(endpoint: str, dp_rank: int) -> str:
    """`tcp://host:port` with port + dp_rank (vLLM's `offset_endpoint_port`). Raises ValueError."""
    if dp_rank == 0:
        return endpoint
    base, sep, port = endpoint.rpartition(":")
    if not (endpoint.startswith("tcp://") and sep and port.isdigit()):
        raise ValueError(f"endpoint must be tcp://host:port to offset by dp rank, got {endpoint!r}")
    return f"{base}:{int(port) + dp_rank}"


@dataclass(frozen=True, slots=True)
class SubscriberTimings:
    """Seconds. `silence_s`: quiet time before probing the replay socket; `replay_timeout_s`: wait for
    each replay message; `backoff_*`: between reconnects and retried rebuilds;
    `min_resync_interval_s`: at least this long between rebuilds that `request_resync` asks for."""

    silence_s: float = 10.0
    replay_timeout_s: float = 1.0
    backoff_min_s: float = 0.05
    backoff_max_s: float = 5.0
    min_resync_interval_s: float = 30.0


@dataclass(slots=True)
class StreamStatus:
    """What a subscriber knows of its stream. `up`: as last reported to the sink; `complete`: rebuilt
    from seq 0 with no unfilled gap since; `reason`: why the state is what it is (/debug/workers)."""

    up: bool = False
    complete: bool = False
    last_seq: int | None = None
    reason: str = "not started"


@dataclass(frozen=True, slots=True)
class ReplayFailed:
    """A replay that did not give every batch asked for: `cause` "no-answer" or "malformed"."""

    cause: str
    reason: str


@dataclass(slots=True)
class _Stream:
    last_applied: int | None = None  # seq of the last batch applied; None: take the next as baseline
    last_sub_seq: int = -1  # last seq seen on SUB (in order from one publisher)
    replayed: dict[int, int] = field(default_factory=dict)  # replayed seq -> hash(payload), not yet on SUB
    resync_reason: str | None = None  # a rebuild is pending
    resync_at: float = 0.0
    resync_reset: bool = False  # the view was reset when the rebuild was asked for
    resync_failed: bool = False  # the last attempt failed: apply live batches meanwhile
    backoff_s: float = 0.0
    disconnected: bool = False
    last_rx: float = 0.0  # loop time of the last message on SUB
    clean: bool = False  # nothing applied since the last reset
    decoded: int = 0  # batches since the last reset that decoded
    undecodable: int = 0  # and those that did not


class ZmqEventSubscriber:
    """Follows one endpoint and feeds `sink`; `start`/`stop` run it as an asyncio task."""

    def __init__(
        self,
        endpoint: ZmqEndpoint,
        sink: EventSink,
        *,
        block_size: int,
        counters: EventCounters,
        timings: SubscriberTimings | None = None,
        context: zmq.asyncio.Context | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        self.endpoint = endpoint
        self.queue_size = queue_size
        self.worker = endpoint.worker
        self.sink = sink
        self.counters = counters
        self.timings = timings or SubscriberTimings()
        self.decoder = VllmEventDecoder(
            endpoint.worker.worker_id,
            block_size,
            counters=counters,
            default_dp_rank=endpoint.worker.dp_rank,
            strict_dp_rank=True,
        )
        self.status = StreamStatus()
        self._cause = "not started"
        self._ctx = context
        self._own_ctx = context is None
        self._task: asyncio.Task[None] | None = None
        self._s = _Stream()
        self._wake_tx: zmq.Socket | None = None
        self._last_rebuild_at: float | None = None  # loop time of the last successful rebuild
        self._rebuild_truncated = False  # the last rebuild's replay no longer reached seq 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"subscriber for {self.worker} already started")
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        self._task = asyncio.create_task(self.run(), name=f"kv-events-{self.worker}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._own_ctx and self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def run(self) -> None:
        """Follow the stream until cancelled, reconnecting with backoff after errors."""
        loop = asyncio.get_running_loop()
        backoff = self.timings.backoff_min_s
        first = True
        while True:
            if not first:
                self.counters.add("zmq.reconnect")
            first = False
            started = loop.time()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an edge loop: log, report, retry
                log.exception("KV event stream of %s failed", self.worker)
                self._set_state(False, f"error: {exc!r}", "error")
            if loop.time() - started > self.timings.backoff_max_s:
                backoff = self.timings.backoff_min_s  # it ran a while: failing again is news
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.timings.backoff_max_s)

    def request_resync(self, reason: str) -> None:
        """Rebuild the worker's view from the replay buffer: it is known to be incomplete (e.g. a
        store's parent is unknown). Call from the event loop; it only schedules. At most one rebuild
        per `min_resync_interval_s`; the view is kept, and live batches applied, until the replay
        answers; a rebuild already pending absorbs the request. None after a rebuild whose replay no
        longer reached seq 0: what the view lacks is older than the buffer (the feed predicts it)."""
        self.counters.add("zmq.resync_requested")
        if self._task is None or self.endpoint.replay is None:
            self.counters.loud(
                "zmq.resync_unavailable",
                "KV events of %s: cannot resync (%s): not running or no replay socket",
                self.worker,
                reason,
            )
            return
        s = self._s
        if s.resync_reason is not None:
            return
        if self._rebuild_truncated:  # what it lacks is older than the buffer: a rebuild cannot bring it
            self.counters.add("zmq.resync_futile")
            log.info("KV events of %s: no rebuild (%s): the replay buffer no longer reaches seq 0",
                     self.worker, reason)  # fmt: skip
            return
        now = asyncio.get_running_loop().time()
        at = now
        if self._last_rebuild_at is not None:
            at = max(now, self._last_rebuild_at + self.timings.min_resync_interval_s)
        if at > now:
            self.counters.add("zmq.resync_deferred")
        log.info("KV events of %s: rebuild from replay in %.1f s (%s)", self.worker, at - now, reason)
        self._schedule(f"resync requested: {reason}", at, reset=False, failed=False)
        self.status.complete = False
        self._wake()

    # --- one connection ----------------------------------------------------------------------

    async def _session(self) -> None:
        assert self._ctx is not None
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.queue_size)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        wakers: tuple[zmq.asyncio.Socket, ...] = ()
        try:
            wakers = self._waker()
            wake_rx = wakers[0]
            sub.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
            sub.connect(self.endpoint.pub)
            self._s = _Stream()
            self._request_resync("subscriber started")
            poller = zmq.asyncio.Poller()
            for sock in (sub, monitor, wake_rx):
                poller.register(sock, zmq.POLLIN)
            loop = asyncio.get_running_loop()
            probe_at = loop.time() + self.timings.silence_s
            while True:
                s = self._s
                if s.resync_reason is not None and loop.time() >= s.resync_at:
                    await self._resync()
                deadlines = [probe_at]
                if s.resync_reason is not None:
                    deadlines.append(s.resync_at)
                timeout_ms = max(0, int((min(deadlines) - loop.time()) * 1000)) + 1
                ready = dict(await poller.poll(timeout_ms))
                if wake_rx in ready:
                    await self._drain_wakes(wake_rx)
                if monitor in ready:
                    await self._monitor_events(monitor)
                if sub in ready:
                    self._s.last_rx = loop.time()
                    probe_at = self._s.last_rx + self.timings.silence_s
                    await self._drain(sub)
                elif loop.time() >= probe_at:
                    probe_at = loop.time() + self.timings.silence_s
                    await self._probe()
        finally:
            self._wake_tx = None
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            for sock in (monitor, sub, *wakers):
                sock.close(linger=0)

    def _waker(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        """An inproc pair: `request_resync` sends a byte so that the poll wakes up at once."""
        assert self._ctx is not None
        address = f"inproc://kv-events-wake-{id(self):x}"
        rx = self._ctx.socket(zmq.PAIR)
        rx.bind(address)
        tx = self._ctx.socket(zmq.PAIR)
        tx.connect(address)
        self._wake_tx = zmq.Socket.shadow(tx.underlying)
        return rx, tx

    def _wake(self) -> None:
        if self._wake_tx is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._wake_tx.send(b"", zmq.NOBLOCK)

    async def _drain_wakes(self, rx: zmq.asyncio.Socket) -> None:
        with contextlib.suppress(zmq.Again):
            while True:
                await rx.recv(flags=zmq.NOBLOCK)

    async def _monitor_events(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await monitor.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._s.disconnected = True
                self._set_state(False, "connection to the publisher lost", "disconnected")
            elif event == zmq.EVENT_CONNECTED and self._s.disconnected:
                self._s.disconnected = False
                self.counters.add("zmq.reconnect")
                self._request_resync("reconnected to the publisher (it may have restarted)")

    async def _drain(self, sub: zmq.asyncio.Socket) -> None:
        for _ in range(1000):  # bounded, so monitor events and timers get their turn
            try:
                frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            frame = parse_frames(frames, self.counters)
            if frame is not None:
                await self._on_batch(frame.seq, frame.payload)

    async def _on_batch(self, seq: int, payload: bytes) -> None:
        s = self._s
        restarted = None
        if seq <= s.last_sub_seq:
            restarted = f"publisher restarted (seq {seq} after {s.last_sub_seq})"
        elif s.last_applied is not None and seq <= s.last_applied:
            digest = s.replayed.get(seq)
            if digest is not None and digest != hash(payload):
                restarted = f"publisher restarted (seq {seq} came back with other content)"
        if restarted is not None:
            self.counters.add("zmq.restart")
            self._request_resync(restarted)
        s.last_sub_seq = seq
        while s.replayed and next(iter(s.replayed)) <= seq:
            s.replayed.pop(next(iter(s.replayed)))
        if s.resync_reason is not None and s.resync_reset and not s.resync_failed:
            return  # the rebuild about to run replays this batch too
        if s.last_applied is None:
            s.last_applied = seq - 1  # following live batches only: this one is the baseline
        if seq <= s.last_applied:
            self.counters.add("zmq.duplicate")
            return
        if seq > s.last_applied + 1:
            await self._fill_gap(seq)
        self._apply(seq, payload)

    # --- rebuilds ----------------------------------------------------------------------------

    def _schedule(self, reason: str, at: float, *, reset: bool, failed: bool) -> None:
        s = self._s
        s.resync_reason, s.resync_at, s.resync_reset, s.resync_failed = reason, at, reset, failed
        s.backoff_s = self.timings.backoff_min_s

    def _request_resync(self, reason: str) -> None:
        """Forget the worker's cache now; rebuild it from the replay buffer as soon as it answers."""
        self._reset(reason)
        s = self._s
        s.last_applied, s.last_sub_seq = None, -1
        s.replayed.clear()
        self._schedule(reason, 0.0, reset=True, failed=False)
        if self.endpoint.replay is not None:
            self._set_state(False, f"{reason}; rebuilding from the replay socket", "rebuilding")

    async def _resync(self) -> None:
        s = self._s
        reason = s.resync_reason
        assert reason is not None
        if self.endpoint.replay is None:
            s.resync_reason = None
            self._set_state(False, f"{reason}; no replay socket: waiting for live batches", "live-only")
            return
        batches = await self._replay_from(0)
        if isinstance(batches, ReplayFailed):
            self._rebuild_failed(f"{reason}; {batches.reason}", batches.cause)
            return
        if not s.clean:  # the view is replaced by the replay in one step
            self._reset(f"{reason}; rebuilding from replay")
        self.counters.add("zmq.rebuild")
        # from now: a request that the replayed batches themselves cause (a buffer that no longer
        # reaches seq 0 holds stores under lost parents) waits for the interval too
        self._last_rebuild_at = asyncio.get_running_loop().time()
        s.resync_reason = None
        s.last_applied = -1
        self.status.complete = True
        incomplete = ""
        self._rebuild_truncated = bool(batches) and batches[0][0] != 0
        if batches and batches[0][0] != 0:
            first = batches[0][0]
            self._unfilled(0, first, "the replay buffer no longer starts at seq 0", reset=False, report=False)
            incomplete = f"; incomplete: the replay buffer starts at seq {first}"
        self._apply_replayed(batches, None)
        replayed = len(batches)
        while len(batches) >= self.queue_size:  # read in parts: ask for the rest
            assert s.last_applied is not None
            more = await self._replay_from(s.last_applied + 1)
            if isinstance(more, ReplayFailed):
                break  # the next live batch's gap, or the next probe, asks again
            batches = more
            self._apply_replayed(batches, None)
            replayed += len(batches)
        if not self._all_undecodable():
            self._set_state(True, f"rebuilt from replay ({replayed} batches){incomplete}", "rebuilt")

    def _rebuild_failed(self, why: str, cause: str) -> None:
        """The replay did not give the view back: down, live batches applied meanwhile, retried."""
        s = self._s
        s.resync_failed = True
        s.resync_at = asyncio.get_running_loop().time() + s.backoff_s
        s.backoff_s = min(s.backoff_s * 2, self.timings.backoff_max_s)
        self._set_state(False, why, cause)

    async def _fill_gap(self, seq: int) -> None:
        """Apply the missing batches before `seq` from the replay socket, or reset the worker."""
        s = self._s
        assert s.last_applied is not None
        self.counters.add("zmq.gap")
        self.counters.dropped("zmq", str(self.worker), "seq-gap", seq - s.last_applied - 1)
        if self.endpoint.replay is None:
            self._unfilled(s.last_applied + 1, seq, "no replay socket")
            return
        while s.last_applied + 1 < seq:  # each round applies at least one batch, or gives up
            start = s.last_applied + 1
            batches = await self._replay_from(start)
            if isinstance(batches, ReplayFailed):
                self._unfilled(start, seq, batches.reason, report=False)
                self._schedule(f"gap {start}..{seq - 1}", 0.0, reset=True, failed=True)
                self._rebuild_failed(f"gap {start}..{seq - 1} not replayed: {batches.reason}", batches.cause)
                return
            wanted = [b for b in batches if start <= b[0] < seq]
            if not wanted:
                self._unfilled(start, seq, "the replay buffer no longer holds it")
                return
            if wanted[0][0] != start:
                self._unfilled(start, wanted[0][0], "the replay buffer no longer holds it")
            self._apply_replayed(wanted, seq)

    def _apply_replayed(self, batches: list[Batch], stop: int | None) -> bool:
        """Apply replayed batches in seq order; a hole inside them counts as an unfilled gap.
        Returns whether one of them decoded (the stream state is the caller's to report)."""
        s = self._s
        decoded = False
        for seq, payload in batches:
            assert s.last_applied is not None
            if seq <= s.last_applied or (stop is not None and seq >= stop):
                continue
            if seq > s.last_applied + 1:
                self._unfilled(s.last_applied + 1, seq, "the replay skipped it")
            decoded |= self._apply(seq, payload, live=False)
            if seq > s.last_sub_seq:
                s.replayed[seq] = hash(payload)
        return decoded

    def _unfilled(self, start: int, seq: int, why: str, *, reset: bool = True, report: bool = True) -> None:
        """Batches start..seq-1 are lost: reset (unless told not to) and carry on from `seq`."""
        self.counters.loud(
            "zmq.unfilled_gap",
            "KV events %d..%d of %s are lost (%s): cache view reset, continuing from %d",
            start,
            seq - 1,
            self.worker,
            why,
            seq,
        )
        if reset:
            self._reset(f"gap {start}..{seq - 1} not replayable: {why}")
        self._s.last_applied = seq - 1
        self.status.complete = False
        if report and self.status.up:
            self._set_state(True, f"incomplete since gap {start}..{seq - 1} ({why})", "incomplete")

    async def _probe(self) -> None:
        """After silence: ask for anything after the last seq; no answer means the stream is down
        (and the worker is rebuilt once the replay answers again)."""
        if self.endpoint.replay is None or self._s.resync_reason is not None:
            return
        s = self._s
        self.counters.add("zmq.probe")
        start = 0 if s.last_applied is None else s.last_applied + 1
        batches = await self._replay_from(start)
        if isinstance(batches, ReplayFailed):
            self.counters.add("zmq.probe_failed")
            self._schedule("the silence probe failed", 0.0, reset=False, failed=True)
            self._rebuild_failed(
                f"no events for {self.timings.silence_s:g} s and {batches.reason}", batches.cause
            )
            return
        if batches:
            if s.last_applied is None:
                s.last_applied = batches[0][0] - 1
            else:  # a silent SUB socket: these never arrived live
                self.counters.dropped("zmq", str(self.worker), "seq-gap", batches[-1][0] - start + 1)
                if batches[0][0] > start:
                    self._unfilled(start, batches[0][0], "the replay buffer no longer holds it")
            self._after_batch(self._apply_replayed(batches, None))

    async def _replay_from(self, start: int) -> list[Batch] | ReplayFailed:
        """The buffered batches from `start` on, in order, at most `queue_size` of them (a full list
        may have been cut short: ask again after its last seq); a `ReplayFailed` when the socket
        does not answer to the end marker or answers with malformed replies."""
        assert self._ctx is not None and self.endpoint.replay is not None
        self.counters.add("zmq.replay")
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.queue_size)
        out: list[Batch] = []
        malformed = 0
        try:
            sock.connect(self.endpoint.replay)
            await sock.send_multipart((b"", encode_seq(start)))
            while len(out) + malformed < self.queue_size:
                async with asyncio.timeout(self.timings.replay_timeout_s):
                    frames = await sock.recv_multipart()
                frame = parse_replay_reply(frames)
                if frame is None:
                    malformed += 1
                    self.counters.loud(
                        "zmq.replay_malformed",
                        "malformed replay reply (%d frames) from %s for %s: not [topic, seq, payload]",
                        len(frames),
                        self.endpoint.replay,
                        self.worker,
                    )
                elif frame.seq == END_SEQ:
                    break
                else:
                    out.append((frame.seq, frame.payload))
            else:
                if not malformed:
                    self.counters.add("zmq.replay_truncated")
                    return out  # the rest is discarded with the socket
        except TimeoutError:
            if not malformed:
                self.counters.add("zmq.replay_failed")
                answered = f" after {len(out)} batches" if out else ""
                return ReplayFailed(
                    "no-answer", f"replay socket {self.endpoint.replay} does not answer{answered}"
                )
        finally:
            sock.close(linger=0)
        if malformed:
            self.counters.add("zmq.replay_failed")
            return ReplayFailed(
                "malformed", f"replay socket {self.endpoint.replay} answered {malformed} malformed replies"
            )
        return out

    # --- applying ----------------------------------------------------------------------------

    def _apply(self, seq: int, payload: bytes, *, live: bool = True) -> bool:
        """Decode and apply one batch; returns whether it decoded. A live batch also updates the
        stream state (replayed ones leave it to whoever asked for the replay)."""
        s = self._s
        batch = self.decoder.decode(payload)
        if batch.dp_rank != self.worker.dp_rank:  # decoded to nothing (strict_dp_rank)
            self.counters.dropped("zmq", str(self.worker), "other-dp-rank")
            self.counters.loud(
                "zmq.dp_rank_mismatch",
                "KV event batch %d from %s names dp rank %d, but that socket is %s's: dropped (the engine "
                "binds rank r's socket at the event port + r; check the worker's ports and dp ranks)",
                seq,
                self.endpoint.pub,
                batch.dp_rank,
                self.worker,
            )
        self.counters.add("zmq.batch")
        self.counters.add("zmq.event", len(batch.events))
        if batch.valid:
            s.decoded += 1
        else:
            s.undecodable += 1
            self.counters.add("zmq.undecodable")
        s.clean = False
        if batch.events:
            self.sink.apply_events(batch.events)
        s.last_applied = seq
        self.status.last_seq = seq
        if live:
            self._after_batch(batch.valid)
        return batch.valid

    def _after_batch(self, valid: bool) -> None:
        """What one applied batch says about the stream (never up while a rebuild is pending)."""
        if self._s.resync_reason is not None:
            return
        if self._all_undecodable():
            return
        if self.endpoint.replay is None and valid and not self.status.up:
            self._set_state(
                True,
                "following live batches only (no replay socket): blocks cached before connecting are unknown",
                "live-only",
            )
        elif valid and self._cause == "undecodable":
            self.status.complete = False
            self._set_state(True, "batches decode again; the undecodable ones are lost", "incomplete")

    def _all_undecodable(self) -> bool:
        """Every batch since the last reset was undecodable: report down (a stream of garbage)."""
        s = self._s
        if s.undecodable and not s.decoded:
            self._set_state(False, f"all {s.undecodable} batches undecodable", "undecodable")
            return True
        return False

    def _reset(self, reason: str) -> None:
        self.counters.add("zmq.reset")
        self.status.complete = False
        s = self._s
        s.clean, s.decoded, s.undecodable = True, 0, 0
        self.decoder.reset()
        log.info("KV events of %s: resetting the cache view (%s)", self.worker, reason)
        self.sink.reset_worker(self.worker, reason)

    def _set_state(self, up: bool, reason: str, cause: str) -> None:
        """Record the state; the sink hears (and the log says) it only when `up` or the cause changes."""
        self.status.reason = reason
        if up == self.status.up and cause == self._cause:
            return
        self.status.up, self._cause = up, cause
        log.info("KV event stream of %s %s: %s", self.worker, "up" if up else "down", reason)
        self.sink.stream_state(self.worker, up, reason)


class ZmqEventSubscribers:
    """One `ZmqEventSubscriber` per endpoint, sharing a ZMQ context; started and stopped together."""

    def __init__(
        self,
        endpoints: Iterable[ZmqEndpoint],
        sink: EventSink,
        *,
        block_size: int,
        counters: EventCounters,
        timings: SubscriberTimings | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        self.endpoints = list(endpoints)
        workers = [e.worker for e in self.endpoints]
        if len(set(workers)) != len(workers):
            raise ValueError(f"each (worker, dp rank) needs exactly one endpoint, got {workers}")
        self.queue_size = queue_size
        self._args = (sink, block_size, counters, timings)
        self._ctx: zmq.asyncio.Context | None = None
        self.subscribers: dict[Worker, ZmqEventSubscriber] = {}

    async def start(self) -> None:
        sink, block_size, counters, timings = self._args
        self._ctx = zmq.asyncio.Context()
        for e in self.endpoints:
            sub = ZmqEventSubscriber(
                e,
                sink,
                block_size=block_size,
                counters=counters,
                timings=timings,
                context=self._ctx,
                queue_size=self.queue_size,
            )
            self.subscribers[e.worker] = sub
            await sub.start()

    async def stop(self) -> None:
        for sub in self.subscribers.values():
            await sub.stop()
        self.subscribers.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def status(self) -> dict[Worker, StreamStatus]:
        return {w: s.status for w, s in self.subscribers.items()}
