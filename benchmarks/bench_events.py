"""KV event ingestion: decode+apply throughput per wire format and end-to-end event lag over ZMQ and
NATS under load, on the shared Mooncake trace; prints one JSON object on stdout.

    .venv/bin/python benchmarks/bench_events.py --quick     # about 30 s
    .venv/bin/python benchmarks/bench_events.py             # about 2 minutes, under 3

Workers are "0".."15" (16 of them) on one `KvRouter(RouterConfig(block_size=64, use_kv_events=True))`
fed through `RouterFeed`; trace tokens follow REFERENCE section 6 (hash id h -> 512 copies of token h,
input clamped to len(hash_ids) * 512, engine block size 64).

1. `throughput`, in-process, no transport: the first `--requests` trace requests (those with a full
   block: a shorter prompt stores nothing), request i on worker i % 16, become payloads once
   (engine block ids are the sequence hashes), then each format
   is timed on a fresh router three ways: decode and apply payload by payload (what a subscriber
   does), decode only, apply only (of the decoded events). Formats: `vllm_map` (2026 vLLM: msgpack
   map batch, tagged-map events, token_ids included; the router re-hashes the tokens and that cost
   is in decode), `vllm_array` (older vLLM: array batch, tagged-array events), `sglang` (map events,
   one event per 64-token page, signed int64 block ids, a partial last page when the prompt has one),
   `dynamo_json` (one JSON message per event, `tokens_hash` given: no re-hash). One batch (vLLM,
   SGLang) or one message (Dynamo) per request. Removals: every request's blocks removed again
   (`removed_vllm_map`, `removed_dynamo_json`) from a router holding all the stores.
2. `lag`, over real transports, publisher in a child process (this script with `--publisher`,
   stopped by pid): 16 simulated engines with an LRU prefix cache of 16384 blocks each play the
   whole trace in order (request k on engine (k + k // len(trace)) % 16): the blocks past the
   cached prefix are stored in events of up to 16 blocks (one per 1024-token prefill chunk) and
   each request that evicts publishes one BlockRemoved. A warm-up fills every cache first (about
   21k events, 262k entries in the router) so that every rate runs at steady state, stores and
   removals alike. Then each of `--rates` in turn for `--duration-s`: every 5 ms one batch per
   engine with the events due (at most 20 ticks' worth: a publisher that cannot keep up falls
   behind, which the achieved rate shows). One child and one router per transport.
   - `zmq`: one `ZmqEventPublisher` (PUB + replay) per engine, vLLM map batches with `ts` stamped
     with `time.time()` when the batch is published; 16 `ZmqEventSubscriber`s in this process.
     Lag per batch = `time.time()` when `RouterFeed.apply_events` returned (its blocks visible to
     `find_matches`) minus the batch's `ts`.
   - `nats`: a nats-server (core, no JetStream) on a free port; one `NatsEventPublisher` per engine
     (Dynamo JSON, one message per event) on one connection; one `NatsEventSubscriber` here. Lag per
     event = apply time minus the `time.time()` taken just before `publish` in the child (joined on
     worker and event id after the run, both processes read the same clock).
   Reported per rate: lag p50/p90/p99/max and early vs late in the run (growth means falling
   behind), published vs applied events and rates, time to drain after the publisher stopped,
   gap/reset counters, CPU of both sides, the event loop thread's on-CPU and run-queue-wait
   shares (/proc schedstat: waiting means other processes had the cores), garbage collections,
   and a check that `find_matches` sees each engine's last request in full at the end.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(REPO_ROOT), str(BENCH_DIR)):  # benchmark this checkout; reuse bench_router's helpers
    if _path not in sys.path:
        sys.path.insert(0, _path)

from bench_router import (  # noqa: E402
    DEFAULT_TRACE,
    ENGINE_BLOCK_SIZE,
    TRACE_BLOCK_TOKENS,
    GcWatch,
    TraceRequest,
    load_trace,
    machine_environment,
    percentile,
)

from extproc.events.counters import EventCounters  # noqa: E402
from extproc.events.dynamo_json import decode_event, encode_event, kv_events_subject  # noqa: E402
from extproc.events.feed import RouterFeed  # noqa: E402
from extproc.events.vllm import (  # noqa: E402
    VllmEventDecoder,
    WireBlockRemoved,
    WireBlockStored,
    WireEvent,
    encode_batch,
)
from extproc.router import (  # noqa: E402
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    KvRouter,
    RouterConfig,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
    compute_sequence_hashes,
)

WORKERS = 16
CHUNK_BLOCKS = 16  # lag stream: blocks per stored event (a 1024-token prefill chunk)
CAPACITY_BLOCKS = 16384  # lag stream: each engine's prefix cache (WorkerSpec.total_blocks default)
TICK_S = 0.005  # lag stream: one batch per engine every tick
MAX_BURST_TICKS = 20
WARM_RATE = 10_000  # lag stream: events/s until every engine's cache is full (before measuring)
SUBJECT = kv_events_subject("bench", "backend")
DRAIN_TIMEOUT_S = 15.0  # after the publisher stopped, how long the subscriber may take to catch up
KEPT_UP_DRAIN_S = 0.5
MASK64 = (1 << 64) - 1

clock = time.perf_counter_ns


def log(message: str) -> None:
    print(f"[bench_events {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def wid(w: int) -> str:
    """Worker w as the picker's config names it (Dynamo's u64 id w goes through `str`)."""
    return str(w)


def make_router() -> tuple[KvRouter, RouterFeed]:
    router = KvRouter(
        RouterConfig(block_size=ENGINE_BLOCK_SIZE, use_kv_events=True),
        clock=time.monotonic,
        rng=random.Random(0),
        workers=[WorkerSpec(wid(w)) for w in range(WORKERS)],
    )
    return router, RouterFeed({wid(w): router for w in range(WORKERS)}, EventCounters())


def request_hashes(r: TraceRequest) -> tuple[list[int], list[int]]:
    """(local, sequence) hashes of the request's full engine blocks."""
    local = compute_block_hashes(r.token_array(), ENGINE_BLOCK_SIZE)
    return local, compute_sequence_hashes(local)


def chunk_tokens(r: TraceRequest, start: int, end: int) -> list[int]:
    """Tokens [start, end) of the request, as a list (REFERENCE section 6 mapping)."""
    out: list[int] = []
    for idx in range(start // TRACE_BLOCK_TOKENS, -(-end // TRACE_BLOCK_TOKENS)):
        lo = max(start, idx * TRACE_BLOCK_TOKENS)
        hi = min(end, (idx + 1) * TRACE_BLOCK_TOKENS)
        out += [r.hash_ids[idx]] * (hi - lo)
    return out


def signed64(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


# --- 1: decode + apply throughput --------------------------------------------------------------


@dataclass
class Format:
    name: str
    kind: str  # "msgpack" (VllmEventDecoder) or "dynamo" (decode_event)
    payloads: list[tuple[int, bytes]]  # (worker, payload)
    events: int  # events on the wire
    blocks: int  # full blocks in them
    note: str


def build_formats(requests: Sequence[TraceRequest], rng: random.Random) -> tuple[list[Format], list[Format]]:
    """The stored formats and the removal formats, from the same requests (each one full block or more:
    an engine stores nothing for a shorter prompt)."""
    vmap, varr, sgl, dyn, rem_v, rem_d = [], [], [], [], [], []
    blocks = sgl_events = 0
    bs = ENGINE_BLOCK_SIZE
    event_ids = [0] * WORKERS
    stored_seqs: list[tuple[int, list[int]]] = []
    for r in requests:
        w = r.index % WORKERS
        local, seq = request_hashes(r)
        n = len(local)
        blocks += n
        tokens = r.token_list(r.input_tokens)
        stored = WireBlockStored(seq, None, tokens[: n * bs], bs)
        vmap.append((w, encode_batch([stored], ts=0.0, dp_rank=0, layout="map")))
        varr.append((w, encode_batch([stored], ts=0.0, dp_rank=0, layout="array")))
        pages: list[WireEvent] = [
            WireBlockStored(
                [signed64(seq[j])], signed64(seq[j - 1]) if j else None, tokens[j * bs : (j + 1) * bs], bs
            )
            for j in range(n)
        ]
        if len(tokens) > n * bs:  # SGLang also reports the partial last page (never matchable)
            parent = signed64(seq[-1]) if n else None
            pages.append(WireBlockStored([signed64(rng.getrandbits(64))], parent, tokens[n * bs :], bs))
        sgl_events += len(pages)
        sgl.append((w, encode_batch(pages, ts=0.0, dp_rank=0, layout="map")))
        ev = BlocksStored(Worker(wid(w)), tuple(map(StoredBlock, seq, local)), None)
        dyn.append((w, encode_event(w, ev, event_ids[w], 0)))
        event_ids[w] += 1
        rem_v.append((w, encode_batch([WireBlockRemoved(seq)], ts=0.0, dp_rank=0, layout="map")))
        stored_seqs.append((w, seq))
    for w, seq in stored_seqs:  # removals continue each worker's Dynamo event ids
        removed = BlocksRemoved(Worker(wid(w)), tuple(seq))
        rem_d.append((w, encode_event(w, removed, event_ids[w], 0)))
        event_ids[w] += 1
    n_req = len(requests)
    stored_formats = [
        Format("vllm_map", "msgpack", vmap, n_req, blocks, "msgpack map batch, tagged-map event, re-hash"),
        Format("vllm_array", "msgpack", varr, n_req, blocks, "msgpack array batch, tagged-array event"),
        Format("sglang", "msgpack", sgl, sgl_events, blocks, "map events, one per page, signed int64 ids"),
        Format("dynamo_json", "dynamo", dyn, n_req, blocks, "one JSON message per event, tokens_hash given"),
    ]
    removal_formats = [
        Format("removed_vllm_map", "msgpack", rem_v, n_req, blocks, "BlockRemoved of each request's blocks"),
        Format("removed_dynamo_json", "dynamo", rem_d, n_req, blocks, "removed, one JSON message each"),
    ]
    return stored_formats, removal_formats


def decoder_for(fmt: Format, counters: EventCounters) -> Callable[[int, bytes], Sequence[KvEvent]]:
    if fmt.kind == "msgpack":
        decoders = [VllmEventDecoder(wid(w), ENGINE_BLOCK_SIZE, counters=counters) for w in range(WORKERS)]

        def decode_vllm(w: int, payload: bytes) -> Sequence[KvEvent]:
            return decoders[w].decode(payload).events

        return decode_vllm

    def decode_dynamo(_w: int, payload: bytes) -> Sequence[KvEvent]:
        decoded = decode_event(payload, counters, worker_id_of=str)
        return () if decoded is None else (decoded[2],)

    return decode_dynamo


def parse_only(fmt: Format) -> None:
    if fmt.kind == "msgpack":
        for _, p in fmt.payloads:
            msgpack.unpackb(p, raw=False, strict_map_key=False)
    else:
        for _, p in fmt.payloads:
            json.loads(p)


def rate(count: int, ns: float) -> int:
    return round(count / (ns / 1e9)) if ns > 0 else 0


def run_format(fmt: Format, repeat: int, base: Sequence[Sequence[KvEvent]] = ()) -> dict[str, Any]:
    """Times `fmt` on fresh routers that first hold `base` (applied untimed)."""

    def fresh() -> tuple[KvRouter, RouterFeed]:
        router, feed = make_router()
        for events in base:
            feed.apply_events(events)
        gc.collect()
        return router, feed

    counters = EventCounters()
    decode = decoder_for(fmt, counters)
    warm = fmt.payloads[: min(50, len(fmt.payloads))]
    _, feed = make_router()
    for w, p in warm:  # code paths, allocator
        feed.apply_events(decode(w, p))
    totals, decode_ns, apply_ns, parse_ns = [], [], [], []
    router = None
    for _ in range(repeat):
        router = None
        router, feed = fresh()
        counters.counts.clear()
        t0 = clock()
        for w, p in fmt.payloads:
            feed.apply_events(decode(w, p))
        totals.append(clock() - t0)
        snapshot = counters.snapshot()
        stats = router.indexer.stats
        result_counts = {
            "feed_events": feed.counters["feed.events"],
            "entries_after": router.indexer.num_blocks(),
            "stored_events_seen_by_tree": stats.stored_events,
            "removed_events_seen_by_tree": stats.removed_events,
            "unknown_removals": stats.unknown_removal,
        }
        router = feed = None
        gc.collect()
        t0 = clock()
        decoded = [decode(w, p) for w, p in fmt.payloads]
        decode_ns.append(clock() - t0)
        router, feed = fresh()
        t0 = clock()
        for events in decoded:
            feed.apply_events(events)
        apply_ns.append(clock() - t0)
        del decoded
        router = feed = None
        gc.collect()
        t0 = clock()
        parse_only(fmt)
        parse_ns.append(clock() - t0)
    total = statistics.median(totals)
    dec, app, parse = statistics.median(decode_ns), statistics.median(apply_ns), statistics.median(parse_ns)
    out = {
        "what": fmt.note,
        "events": fmt.events,
        "blocks": fmt.blocks,
        "payload_bytes_mean": round(sum(len(p) for _, p in fmt.payloads) / len(fmt.payloads)),
        "events_per_s": rate(fmt.events, total),
        "blocks_per_s": rate(fmt.blocks, total),
        "s_median": round(total / 1e9, 3),
        "s_all": [round(t / 1e9, 3) for t in totals],
        "decode_only": {
            "s_median": round(dec / 1e9, 3),
            "events_per_s": rate(fmt.events, dec),
            "blocks_per_s": rate(fmt.blocks, dec),
            "of_which_parse_s": round(parse / 1e9, 3),
            "parse": "msgpack.unpackb" if fmt.kind == "msgpack" else "json.loads",
        },
        "apply_only": {
            "s_median": round(app / 1e9, 3),
            "events_per_s": rate(fmt.events, app),
            "blocks_per_s": rate(fmt.blocks, app),
        },
        "decode_share": round(dec / (dec + app), 3),
        "counts": result_counts,
        "decoder_counters": snapshot,
    }
    log(
        f"  {fmt.name}: {out['events_per_s']} events/s, {out['blocks_per_s']} blocks/s "
        f"(decode {dec / 1e9:.3f} s, apply {app / 1e9:.3f} s, parse {parse / 1e9:.3f} s)"
    )
    return out


def run_throughput(requests: Sequence[TraceRequest], repeat: int, rng: random.Random) -> dict[str, Any]:
    log(f"throughput: building payloads for {len(requests)} requests")
    stored_formats, removal_formats = build_formats(requests, rng)
    base_counters = EventCounters()
    decode = decoder_for(stored_formats[0], base_counters)
    stores = [decode(w, p) for w, p in stored_formats[0].payloads]
    gc.collect()
    gc.freeze()  # prebuilt payloads are not what a collection scans in production
    out: dict[str, Any] = {}
    for fmt in stored_formats:
        out[fmt.name] = run_format(fmt, repeat)
    for fmt in removal_formats:
        out[fmt.name] = run_format(fmt, repeat, base=stores)
    gc.unfreeze()
    return out


# --- 2: the lag stream (publisher child) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamEvent:
    worker: int
    stored: bool
    engine_hashes: list[int]
    parent: int | None = None
    local_hashes: list[int] | None = None
    tokens: list[int] | None = None


class EngineStream:
    """Events of 16 engines with LRU prefix caches playing the trace (see the module docstring)."""

    def __init__(self, requests: Sequence[TraceRequest], *, with_tokens: bool) -> None:
        self.requests = requests
        self.with_tokens = with_tokens
        self.caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(WORKERS)]
        self._hashes: dict[int, tuple[list[int], list[int]]] = {}
        # worker -> [trace index of its last request, blocks of it published so far (cached prefix
        # included)]: what find_matches must see on that worker once everything is applied
        self.last_request: dict[int, list[int]] = {}
        self.counts = {"requests": 0, "stored_events": 0, "removed_events": 0, "stored": 0, "removed": 0}

    def full(self) -> bool:
        return all(len(c) >= CAPACITY_BLOCKS for c in self.caches)

    def __iter__(self) -> Iterator[StreamEvent]:
        k = 0
        n = len(self.requests)
        bs = ENGINE_BLOCK_SIZE
        while True:
            index = k % n
            r = self.requests[index]
            w = (k + k // n) % WORKERS
            k += 1
            if index not in self._hashes:
                self._hashes[index] = request_hashes(r)
            local, seq = self._hashes[index]
            cache = self.caches[w]
            hit = 0
            while hit < len(seq) and seq[hit] in cache:
                hit += 1
            self.counts["requests"] += 1
            self.last_request[w] = [index, hit]
            for a in range(hit, len(seq), CHUNK_BLOCKS):
                b = min(a + CHUNK_BLOCKS, len(seq))
                self.last_request[w] = [index, b]
                self.counts["stored_events"] += 1
                self.counts["stored"] += b - a
                yield StreamEvent(
                    w,
                    True,
                    seq[a:b],
                    seq[a - 1] if a else None,
                    local[a:b],
                    chunk_tokens(r, a * bs, b * bs) if self.with_tokens else None,
                )
            for h in reversed(seq):  # the prefix's first block ends up most recent: evicted last
                cache[h] = None
                cache.move_to_end(h)
            evicted = []
            while len(cache) > CAPACITY_BLOCKS:
                evicted.append(cache.popitem(last=False)[0])
            if evicted:
                self.counts["removed_events"] += 1
                self.counts["removed"] += len(evicted)
                yield StreamEvent(w, False, evicted)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


async def wait_path(path: Path, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if not alive():
            raise RuntimeError(f"process exited before {path.name} appeared")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        await asyncio.sleep(0.005)


async def pace(
    stream: Iterator[StreamEvent],
    rate_eps: float,
    duration_s: float,
    send: Callable[[int, list], None],
    until: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Release events at `rate_eps` for `duration_s` (or until `until()`): every tick, one
    `send(worker, events)` per engine with the events due. At most MAX_BURST_TICKS ticks' worth go
    out per tick: a publisher that cannot keep up falls behind (its achieved rate is reported)
    instead of sending ever larger batches."""
    max_burst = max(1, math.ceil(rate_eps * TICK_S * MAX_BURST_TICKS))
    t0 = time.time()
    cpu0 = time.process_time()
    sent = batches = 0
    max_gap = 0.0
    last = t0
    while True:
        now = time.time()
        max_gap = max(max_gap, now - last)
        last = now
        elapsed = now - t0
        if elapsed >= duration_s or until():
            break
        due = min(int(rate_eps * elapsed) - sent, max_burst)
        if due > 0:
            per_worker: dict[int, list[StreamEvent]] = defaultdict(list)
            for _ in range(due):
                ev = next(stream)
                per_worker[ev.worker].append(ev)
            for w, events in per_worker.items():
                send(w, events)
                batches += 1
            sent += due
        await asyncio.sleep(TICK_S)
    t_end = time.time()
    return {
        "t_start": t0,
        "t_end": t_end,
        "events": sent,
        "batches": batches,
        "rate_eps": round(sent / (t_end - t0), 1),
        "max_tick_gap_ms": ms(max_gap),
        "cpu_pct": round(100 * (time.process_time() - cpu0) / (t_end - t0), 1),
    }


async def publisher_main(args: argparse.Namespace) -> int:
    """Child mode: warm the engines' caches up, then publish the lag stream at each `--rates` rate
    for `--duration-s`, each phase on the parent's word (control files); idle until stopped by pid."""
    control = Path(args.control)
    rates = [float(x) for x in args.rates.split(",")]
    requests = load_trace(args.trace)
    gc.collect()
    gc.freeze()
    transport = args.publisher
    engine = EngineStream(requests, with_tokens=transport == "zmq")
    stream = iter(engine)
    closers: list[Callable[[], Any]] = []
    times: list[list[float]] = [[] for _ in range(WORKERS)]  # NATS: publish time per event
    if transport == "zmq":
        from extproc.events.zmq_publisher import ZmqEventPublisher

        pubs = [ZmqEventPublisher(host="127.0.0.1", port=0, replay_port=0) for _ in range(WORKERS)]
        for p in pubs:
            await p.start()
            closers.append(p.stop)
        ready: dict[str, Any] = {
            "pub": [p.endpoint for p in pubs],
            "replay": [p.replay_endpoint for p in pubs],
        }

        def send(w: int, events: list[StreamEvent]) -> None:
            wire: list[WireEvent] = [
                WireBlockStored(e.engine_hashes, e.parent, e.tokens or [], ENGINE_BLOCK_SIZE)
                if e.stored
                else WireBlockRemoved(e.engine_hashes)
                for e in events
            ]
            pubs[w].publish(wire, ts=time.time())

        async def flush() -> None:
            pass

        def next_ids() -> list[int]:
            return [0] * WORKERS

    else:
        from extproc.events.nats_events import NatsEventPublisher, NatsLink

        link = await NatsLink.connect(args.nats_url, name="bench-events-publisher")
        closers.append(link.close)
        nats_pubs = [NatsEventPublisher(link.nc, SUBJECT, w) for w in range(WORKERS)]
        ready = {"nats": args.nats_url}

        def send(w: int, events: list[StreamEvent]) -> None:
            publisher, stamps = nats_pubs[w], times[w]
            worker = Worker(w)
            for e in events:
                ev: KvEvent = (
                    BlocksStored(
                        worker, tuple(map(StoredBlock, e.engine_hashes, e.local_hashes or ())), e.parent
                    )
                    if e.stored
                    else BlocksRemoved(worker, tuple(e.engine_hashes))
                )
                stamps.append(time.time())
                publisher.publish(ev)

        async def flush() -> None:
            for publisher in nats_pubs:
                await publisher.flush(30.0)

        def next_ids() -> list[int]:
            return [p.next_event_id for p in nats_pubs]

    def phase_stats(stats: dict[str, Any], counts_before: dict[str, int]) -> dict[str, Any]:
        stats.update({k: v - counts_before[k] for k, v in engine.counts.items()})
        stats["last_request"] = engine.last_request
        stats["cached_blocks"] = sum(len(c) for c in engine.caches)
        return stats

    try:
        write_json(control / "ready.json", ready)
        await wait_path(control / "warm", 60.0)
        before = dict(engine.counts)
        stats = await pace(stream, WARM_RATE, 300.0, send, until=engine.full)
        await flush()
        write_json(control / "warm.json", phase_stats(stats, before))
        for i, rate_eps in enumerate(rates):
            await wait_path(control / f"go-{i}", 300.0)
            first_ids = next_ids()
            for stamps in times:
                stamps.clear()
            before = dict(engine.counts)
            stats = await pace(stream, rate_eps, args.duration_s, send)
            await flush()
            stats = phase_stats(stats, before)
            if transport == "nats":
                stats["first_event_ids"] = first_ids
                stats["publish_times"] = times
            write_json(control / f"stats-{i}.json", stats)
        while True:  # keep the sockets open (ZMQ drops unsent messages on close) until stopped by pid
            await asyncio.sleep(3600)
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                await close()


# --- 2: the lag measurement (this process) -----------------------------------------------------


class LagSink:
    """The `RouterFeed`, recording when each batch (ZMQ) or event (NATS) became visible."""

    def __init__(self, feed: RouterFeed) -> None:
        self.feed = feed
        self.batch_ts: float | None = None  # set by StampingDecoder just before the batch is applied
        self.batch_lags: list[tuple[float, float, int]] = []  # (applied at, lag s, events)
        self.applied_at: dict[tuple[str, int], float] = {}  # NATS: (worker id, event id) -> time
        self.events = 0
        self.resets = 0

    def apply_events(self, events: Sequence[KvEvent]) -> None:
        self.feed.apply_events(events)
        now = time.time()
        self.events += len(events)
        if self.batch_ts is not None:
            self.batch_lags.append((now, now - self.batch_ts, len(events)))
            self.batch_ts = None
        else:
            for ev in events:
                if ev.event_id is not None:
                    self.applied_at[(str(ev.worker.worker_id), ev.event_id)] = now

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.resets += 1
        self.feed.reset_worker(worker, reason)

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        self.feed.stream_state(worker, up, reason)


class StampingDecoder:
    """Wraps a subscriber's `VllmEventDecoder` to hand each batch's `ts` to the sink."""

    def __init__(self, inner: VllmEventDecoder, sink: LagSink) -> None:
        self.inner = inner
        self.sink = sink

    def decode(self, payload: bytes) -> Any:
        batch = self.inner.decode(payload)
        self.sink.batch_ts = batch.ts
        return batch


def lag_summary(samples: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """samples: (applied at, lag s); percentiles, and the median in the first and last fifth."""
    if not samples:
        return {"samples": 0}
    lags = sorted(lag for _, lag in samples)
    by_time = sorted(samples)
    fifth = max(1, len(by_time) // 5)
    return {
        "samples": len(lags),
        "p50_ms": ms(percentile(lags, 0.50)),
        "p90_ms": ms(percentile(lags, 0.90)),
        "p99_ms": ms(percentile(lags, 0.99)),
        "max_ms": ms(lags[-1]),
        "mean_ms": ms(statistics.fmean(lags)),
        "first_fifth_p50_ms": ms(statistics.median(lag for _, lag in by_time[:fifth])),
        "last_fifth_p50_ms": ms(statistics.median(lag for _, lag in by_time[-fifth:])),
    }


def schedstat() -> tuple[int, int] | None:
    """(ns on CPU, ns waiting on a run queue) of this process's main thread (the event loop's)."""
    try:
        with open("/proc/self/schedstat") as f:
            run_ns, wait_ns, _ = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return run_ns, wait_ns


def visible_check(
    router: KvRouter, requests: Sequence[TraceRequest], last: dict[str, list[int]]
) -> dict[str, Any]:
    """Each engine's last request: does find_matches see every block of it that was published?"""
    full = 0
    for w, (index, published) in last.items():
        local, _ = request_hashes(requests[index])
        depth = router.indexer.find_matches(local[:published]).get(Worker(wid(int(w))), 0)
        full += depth == published
    return {"workers_checked": len(last), "fully_matched": full}


class LagRun:
    """One transport: a child publisher for every rate in turn, the subscribers here, results."""

    def __init__(self, args: argparse.Namespace, transport: str, workdir: Path) -> None:
        self.args = args
        self.transport = transport
        self.control = workdir / transport
        self.control.mkdir(parents=True)
        self.router, feed = make_router()
        self.sink = LagSink(feed)
        self.counters = EventCounters()

    def child(self, nats_url: str | None) -> Any:
        from extproc.devstack.procs import ManagedProcess

        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--publisher",
            self.transport,
            "--control",
            str(self.control),
            "--rates",
            ",".join(str(r) for r in self.args.rate_list),
            "--duration-s",
            str(self.args.duration_s),
            "--trace",
            str(self.args.trace),
        ]
        if nats_url:
            argv += ["--nats-url", nats_url]
        return ManagedProcess(argv, log_path=self.control / "publisher.log").start()

    async def run(self, requests: Sequence[TraceRequest], nats_url: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        proc = self.child(nats_url)
        stop_subscribers: Callable[[], Any] | None = None
        try:
            await wait_path(self.control / "ready.json", 30.0, proc.is_running)
            ready = json.loads((self.control / "ready.json").read_text())
            if self.transport == "zmq":
                stop_subscribers = await self._start_zmq(ready)
            else:
                stop_subscribers = await self._start_nats(nats_url or "")
            (self.control / "warm").touch()
            await wait_path(self.control / "warm.json", 300.0, proc.is_running)
            warm = json.loads((self.control / "warm.json").read_text())
            expected = warm["events"]
            drained = await self._drain(expected)
            out["warm_up"] = {
                "events": warm["events"],
                "stored_blocks": warm["stored"],
                "published_s": round(warm["t_end"] - warm["t_start"], 2),
                "applied": drained is not None,
                "entries_after": self.router.indexer.num_blocks(),
            }
            log(
                f"  {self.transport} warm-up: {warm['events']} events, {warm['stored']} blocks, "
                f"{out['warm_up']['entries_after']} entries"
            )
            for i, rate_eps in enumerate(self.args.rate_list):
                result, published = await self._phase(i, rate_eps, proc, requests)
                expected += published
                out[str(int(rate_eps))] = result
            if stop_subscribers is not None:
                await stop_subscribers()
                stop_subscribers = None
        finally:
            if stop_subscribers is not None:
                with contextlib.suppress(Exception):
                    await stop_subscribers()
            proc.stop(grace_s=2.0)
        return out

    async def _drain(self, expected: int) -> float | None:
        """Wait until `expected` events in all were applied; when, or None after DRAIN_TIMEOUT_S."""
        deadline = time.time() + DRAIN_TIMEOUT_S
        while time.time() < deadline:
            if self.sink.events >= expected:
                return time.time()
            await asyncio.sleep(0.002)
        return None

    async def _phase(
        self, i: int, rate_eps: float, proc: Any, requests: Sequence[TraceRequest]
    ) -> tuple[dict[str, Any], int]:
        sink, counters = self.sink, self.counters
        events_before, resets_before = sink.events, sink.resets
        counts_before = counters.snapshot()
        sink.batch_lags.clear()
        sink.applied_at.clear()
        gc.collect()
        cpu0 = time.process_time()
        sched0 = schedstat()
        with GcWatch() as gcw:
            (self.control / f"go-{i}").touch()
            t_go = time.time()
            await wait_path(self.control / f"stats-{i}.json", self.args.duration_s + 60.0, proc.is_running)
            stats = json.loads((self.control / f"stats-{i}.json").read_text())
            drained_at = await self._drain(events_before + stats["events"])
        t_done = time.time()
        cpu = time.process_time() - cpu0
        sched1 = schedstat()
        loop_thread = None
        if sched0 is not None and sched1 is not None:
            wall_ns = (t_done - t_go) * 1e9
            loop_thread = {
                "on_cpu_pct": round(100 * (sched1[0] - sched0[0]) / wall_ns, 1),
                "runnable_but_waiting_pct": round(100 * (sched1[1] - sched0[1]) / wall_ns, 1),
            }
        t_start, t_end = stats["t_start"], stats["t_end"]
        if self.transport == "zmq":
            samples = [(t, lag) for t, lag, _ in sink.batch_lags]
            applied_in_window = sum(n for t, _, n in sink.batch_lags if t <= t_end)
            lag_unit = "batch (ts stamped at publish -> apply returned)"
        else:
            samples = []
            for w, (first, stamps) in enumerate(
                zip(stats["first_event_ids"], stats["publish_times"], strict=True)
            ):
                for k, t_pub in enumerate(stamps):
                    t_applied = sink.applied_at.get((wid(w), first + k))
                    if t_applied is not None:
                        samples.append((t_applied, t_applied - t_pub))
            applied_in_window = sum(1 for t, _ in samples if t <= t_end)
            lag_unit = "event (time.time() before publish -> apply returned)"
        window = t_end - t_start
        drain_s = None if drained_at is None else max(0.0, drained_at - t_end)
        applied = sink.events - events_before
        lost = stats["events"] - applied
        resets = sink.resets - resets_before
        keys = ("gap", "unfilled_gap", "reset", "restart", "duplicate", "replay", "reconnect", "disconnect")
        delta = {k: v - counts_before.get(k, 0) for k, v in counters.snapshot().items()}
        relevant = {
            k: v
            for k, v in delta.items()
            if v and (k.split(".", 1)[-1] in keys or k.endswith(("malformed", "error", "_failed")))
        }
        result = {
            "target_events_per_s": rate_eps,
            "published": {
                "events": stats["events"],
                "stored_events": stats["stored_events"],
                "removed_events": stats["removed_events"],
                "stored_blocks": stats["stored"],
                "removed_blocks": stats["removed"],
                "zmq_batches" if self.transport == "zmq" else "nats_messages": (
                    stats["batches"] if self.transport == "zmq" else stats["events"]
                ),
                "trace_requests_played": stats["requests"],
                "events_per_s": stats["rate_eps"],
                "blocks_per_s": round((stats["stored"] + stats["removed"]) / window),
                "publisher_cpu_pct": stats["cpu_pct"],
                "publisher_max_tick_gap_ms": stats["max_tick_gap_ms"],
                "go_to_first_publish_ms": ms(t_start - t_go),
            },
            "applied": {
                "events": applied,
                "events_per_s_while_publishing": round(applied_in_window / window, 1),
                "not_applied": lost,
                "drain_s_after_publisher_stopped": None if drain_s is None else round(drain_s, 3),
                "worker_resets": resets,
                "entries_at_end": self.router.indexer.num_blocks(),
                "subscriber_process_cpu_pct": round(100 * cpu / (t_done - t_go), 1),
                "event_loop_thread": loop_thread,
                "gc": {
                    "collections_by_generation": gcw.runs,
                    "full_collections_ms": round(gcw.full_ns / 1e6, 1),
                },
            },
            "lag_unit": lag_unit,
            "lag": lag_summary(samples),
            "counters": relevant,
            "visible_at_end": visible_check(self.router, requests, stats["last_request"]),
        }
        result["kept_up"] = lost == 0 and drain_s is not None and drain_s <= KEPT_UP_DRAIN_S and resets == 0
        lag = result["lag"]
        log(
            f"  {self.transport} @ {rate_eps:g}/s: published {stats['rate_eps']}/s, "
            f"lag p50 {lag.get('p50_ms')} ms p99 {lag.get('p99_ms')} ms max {lag.get('max_ms')} ms, "
            f"not applied {lost}, drain {result['applied']['drain_s_after_publisher_stopped']} s"
        )
        return result, stats["events"]

    async def _start_zmq(self, ready: dict[str, Any]) -> Callable[[], Any]:
        import zmq.asyncio

        from extproc.events.zmq_subscriber import ZmqEndpoint, ZmqEventSubscriber

        ctx = zmq.asyncio.Context()
        subs = []
        for w, (pub, replay) in enumerate(zip(ready["pub"], ready["replay"], strict=True)):
            endpoint = ZmqEndpoint(Worker(wid(w)), pub, replay)
            sub = ZmqEventSubscriber(
                endpoint, self.sink, block_size=ENGINE_BLOCK_SIZE, counters=self.counters, context=ctx
            )
            sub.decoder = StampingDecoder(sub.decoder, self.sink)  # type: ignore[assignment]
            subs.append(sub)
            await sub.start()

        async def stop() -> None:
            for sub in subs:
                await sub.stop()
            ctx.term()

        deadline = time.monotonic() + 15.0
        while not all(s.status.up for s in subs):  # each rebuilt from its (empty) replay buffer
            if time.monotonic() > deadline:
                await stop()
                raise TimeoutError("ZMQ subscribers not up after 15 s")
            await asyncio.sleep(0.01)
        return stop

    async def _start_nats(self, url: str) -> Callable[[], Any]:
        from extproc.events.nats_events import NatsEventSubscriber, NatsLink

        link = await NatsLink.connect(url, name="bench-events-router", counters=self.counters)
        sub = NatsEventSubscriber(link, self.sink, SUBJECT, counters=self.counters)
        await sub.start()

        async def stop() -> None:
            await sub.stop()
            await link.close()

        return stop


def run_lag(args: argparse.Namespace, requests: Sequence[TraceRequest]) -> dict[str, Any]:
    from extproc.devstack.procs import start_nats_server

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp:
        workdir = Path(tmp)
        if "zmq" in args.transport_list:
            log(f"lag over ZMQ at {args.rate_list} events/s, {args.duration_s} s each")
            out["zmq"] = asyncio.run(LagRun(args, "zmq", workdir).run(requests, None))
            gc.collect()
        if "nats" in args.transport_list:
            log(f"lag over NATS core at {args.rate_list} events/s, {args.duration_s} s each")
            server = start_nats_server(jetstream=False, store_dir=workdir / "nats-server")
            try:
                out["nats"] = asyncio.run(LagRun(args, "nats", workdir).run(requests, server.url))
            finally:
                server.stop(grace_s=2.0)
    return out


# --- driver ------------------------------------------------------------------------------------


def environment(args: argparse.Namespace) -> dict[str, Any]:
    from importlib.metadata import version

    import xxhash
    import zmq

    nats_version = None
    with contextlib.suppress(Exception):
        from extproc.devstack.procs import find_nats_server

        nats_version = subprocess.run(
            [find_nats_server(), "--version"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    return {
        **machine_environment(),
        "msgpack": ".".join(map(str, msgpack.version)),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "nats_py": version("nats-py"),
        "nats_server": nats_version,
        "xxhash": xxhash.VERSION,
        "quick": args.quick,
        "repeat": args.repeat,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake trace (JSONL)")
    p.add_argument("--quick", action="store_true", help="fewer requests, rates and seconds; about 35 s")
    p.add_argument(
        "--requests", type=int, default=None, help="throughput: first N requests (1000, quick 500)"
    )
    p.add_argument("--repeat", type=int, default=None, help="throughput: timed rounds (3, quick 1)")
    p.add_argument(
        "--rates", default=None, help="lag: events/s, comma-separated (1000,5000,20000; quick 1000,5000)"
    )
    p.add_argument("--duration-s", type=float, default=None, help="lag: seconds per rate (8, quick 3)")
    p.add_argument("--transports", default="zmq,nats", help="lag: zmq, nats or both; 'none' skips lag")
    p.add_argument("--seed", type=int, default=0)
    # child mode (the lag publisher), started by this script
    p.add_argument("--publisher", choices=("zmq", "nats"), help=argparse.SUPPRESS)
    p.add_argument("--control", help=argparse.SUPPRESS)
    p.add_argument("--nats-url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.publisher:
        return args
    args.requests = args.requests or (500 if args.quick else 1000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.duration_s = args.duration_s or (3.0 if args.quick else 8.0)
    rates = args.rates or ("1000,5000" if args.quick else "1000,5000,20000")
    try:
        args.rate_list = [float(x) for x in rates.split(",") if x.strip()]
    except ValueError:
        p.error(f"--rates must be comma-separated numbers, got {rates!r}")
    if not args.rate_list or min(args.rate_list) <= 0:
        p.error("--rates needs at least one rate > 0")
    args.transport_list = [t for t in args.transports.split(",") if t.strip() and t != "none"]
    if set(args.transport_list) - {"zmq", "nats"}:
        p.error(f"--transports takes zmq and/or nats, got {args.transports!r}")
    if args.requests < 1 or args.repeat < 1 or args.duration_s <= 0:
        p.error("--requests, --repeat and --duration-s must be positive")
    if not args.trace.is_file():
        p.error(f"trace not found: {args.trace} (see REFERENCE section 6)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.publisher:
        return asyncio.run(publisher_main(args))
    wall = time.monotonic()
    rng = random.Random(args.seed)
    env = environment(args)
    log(f"loading {args.trace}")
    requests = load_trace(args.trace)
    first = requests[: args.requests]
    subset = [r for r in first if r.input_tokens >= ENGINE_BLOCK_SIZE]
    throughput = run_throughput(subset, args.repeat, rng)
    gc.collect()
    lag = run_lag(args, requests) if args.transport_list else {}
    result: dict[str, Any] = {
        "benchmark": "events",
        "env": env,
        "trace": {
            "path": str(args.trace),
            "requests": len(requests),
            "mapping": "hash id h -> 512 x token h, input clamped to len(hash_ids)*512, engine block 64",
        },
        "throughput": {
            "requests": len(first),
            "requests_with_a_full_block": len(subset),
            "workers": WORKERS,
            "setup": (
                "trace request i -> worker i % 16, one event per request with at least one full block "
                "(shorter prompts store nothing; sglang: one event per page), engine ids "
                "= sequence hashes; timed: decode + RouterFeed.apply_events payload by payload into a "
                "fresh KvRouter; decode_only / apply_only split the same work; removals start from a "
                "router holding every store"
            ),
            **throughput,
        },
        "lag": {
            "setup": (
                f"{WORKERS} engines, LRU prefix cache of {CAPACITY_BLOCKS} blocks each, playing the trace "
                f"in order; stored events of up to {CHUNK_BLOCKS} blocks past the cached prefix, one "
                f"BlockRemoved per request that evicts; one batch per engine every {TICK_S * 1e3:g} ms; "
                "publisher in a child process"
            ),
            "duration_s": args.duration_s,
            "kept_up_rule": (
                f"every published event applied, within {KEPT_UP_DRAIN_S} s of the publisher stopping, "
                "with no worker reset"
            ),
            **lag,
        },
    }
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    env["wall_s"] = round(time.monotonic() - wall, 1)
    log(f"done in {env['wall_s']} s")
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
