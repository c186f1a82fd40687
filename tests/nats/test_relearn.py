"""A worker's cache relearned after its blocks were lost to the picker: one test per loss trigger.

Every prompt starts with the same "chat template" (`TEMPLATE`, 3 blocks), which each engine stores
once; a new prompt then stores only its continuation, under the template's last block (parent = that
block's engine hash), as a real engine does (`Engine`: the simulator's prefix cache). Once the
picker has lost the template's blocks, those continuations hang under a block it does not know and
are dropped (orphans). Without relearning (the feed's orphan branch disabled) these tests see 0 of 6
new prompts learned after an unreadable snapshot, a reset or a late picker, 0 of 3 prompts whose
stores a NATS restart lost, and the lossy view written over the good snapshot.

Each test triggers one loss, then routes 6 new prompts (the template and a distinct suffix) through
the picker's decision path (`EndpointPicker.pick`, `first_token`, `finish`), lets the chosen worker's
engine store their continuations, waits until the picker handled those stores, and routes each
prompt again: it must go to the same worker with its whole prompt cached (6 of 6 learned), while
the worker's cache source is `stale` with the loss as its reason, and the counters say what
happened (`feed.orphaned`, the drops per worker and reason).

The picker is built as `serve` builds it: a config from flags and a config file, `EndpointPicker`,
`start_event_sources`, on a real nats-server (loopback, stopped by pid). Prompts are completions
with token ids (the template is a token prefix), so no tokenizer is involved.

Engine sides:
- the NATS restart: our `NatsEventPublisher` on Dynamo's JSON subject. It drops (and counts) what it
  publishes while its connection is down, so killing the server makes the event-id gap under test.
- the corrupt or deleted snapshot, `--router-reset-states`, the new picker and the snapshot guard:
  Dynamo 1.6.1's own `KvEventPublisher` (`tests/nats/dynamo_worker.py`, a child process stopped by
  pid) on its event-plane subject, which durable mode captures too (`DurableConfig.subjects`); the
  loss comes from the picker's side there, so the engine side may as well be Dynamo's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from extproc.config import load_config
from extproc.events.counters import EventCounters
from extproc.events.durable import SNAPSHOT_OBJECT, DurableConfig, DurableKvEvents
from extproc.events.dynamo_json import encode_event, kv_events_subject
from extproc.events.dynamo_plane import decode_envelope, event_plane_subject
from extproc.events.feed import EVENT_FED, STALE, RouterFeed
from extproc.events.nats_events import NatsEventPublisher, NatsLink
from extproc.events.snapshot import decode_snapshot
from extproc.events.sources import EventSources, start_event_sources
from extproc.picker.pipeline import EndpointPicker, Pick
from extproc.router import compute_block_hashes
from extproc.router.hashing import compute_sequence_hashes
from extproc.router.types import AllBlocksCleared, Worker
from extproc.sim.prefix_cache import BlockTable, PrefixCache

from .conftest import PROBE_WORKER_BASE, connect, eventually
from .conftest import prime as prime_with
from .dynamo_helpers import BS, ENDPOINT, PROBE_ID, DynamoWorker, primed

MODEL = "m"
W7, W8 = Worker("w7"), Worker("w8")
INSTANCE = {W7: 7, W8: 8}  # Dynamo's worker ids, as the config maps them
JSON_SUBJECT = kv_events_subject("ns1", "backend")
PLANE_SUBJECT = event_plane_subject("ns1", "backend", "generate")
NAMES = DurableConfig("ns1", "backend", "names-only")  # the stream and bucket names, for the checks
TEMPLATE = list(range(1, 1 + 3 * BS))  # the chat template: 3 blocks at the start of every prompt
PROMPT_BLOCKS = 5  # the template and a 2-block suffix
NEW = 6  # new prompts routed after each trigger

CONFIG = """\
workers:
  - {id: w7, endpoint: "127.0.0.1:8001", model: m, instance-id: 7}
  - {id: w8, endpoint: "127.0.0.1:8002", model: m, instance-id: 8}
"""


def prompt(n: int) -> list[int]:
    """The template, then a 2-block suffix of its own."""
    start = 100_000 + 1000 * n
    return [*TEMPLATE, *range(start, start + (PROMPT_BLOCKS - 3) * BS)]


def engine_hashes(tokens: list[int]) -> list[int]:
    """The engine's block ids: the chained hashes, as signed 64-bit values (what Dynamo takes)."""
    return [s & ((1 << 63) - 1) for s in compute_sequence_hashes(compute_block_hashes(tokens, BS))]


Publish = Callable[[int | None, list[int], list[list[int]]], Awaitable[None]]


class Engine:
    """One worker's engine: a prefix cache (`extproc.sim.prefix_cache`) that stores each block once,
    under its parent's engine hash, and publishes each store."""

    def __init__(self, publish: Publish) -> None:
        self.publish = publish
        self.cache = PrefixCache(4096, BS, listener=self)
        self._stored: list[tuple[int | None, list[int], list[list[int]]]] = []

    def on_stored(
        self, parent_hash: int | None, block_hashes: Sequence[int], token_ids, *, cache_salt=None
    ) -> None:
        assert cache_salt is None
        self._stored.append((parent_hash, list(block_hashes), [list(t) for t in token_ids]))

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        raise AssertionError("the pool is large enough: nothing is evicted")

    def on_cleared(self) -> None:
        raise AssertionError("the cache is never cleared here")

    async def serve(self, tokens: list[int]) -> int:
        """Prefill `tokens` (blocks already cached are reused) and publish the new blocks' stores;
        returns how many events were published."""
        table = BlockTable()
        assert self.cache.allocate(table, engine_hashes(tokens), len(tokens), tokens)
        self.cache.release(table)
        stored, self._stored = self._stored, []
        for parent, hashes, blocks in stored:
            await self.publish(parent, hashes, blocks)
        return len(stored)

    def restart(self) -> None:
        """The engine process restarted: its cache is empty."""
        self.cache = PrefixCache(4096, BS, listener=self)


def nats_engine(publisher: NatsEventPublisher) -> Engine:
    async def publish(parent: int | None, hashes: list[int], blocks: list[list[int]]) -> None:
        publisher.on_stored(parent, hashes, blocks)

    return Engine(publish)


def dynamo_engine(dynamo: DynamoWorker, name: str) -> Engine:
    async def publish(parent: int | None, hashes: list[int], blocks: list[list[int]]) -> None:
        await dynamo.stored(name, [t for block in blocks for t in block], hashes, parent)

    return Engine(publish)


async def dynamo_engines(dynamo: DynamoWorker) -> dict[Worker, Engine]:
    for worker, instance in INSTANCE.items():
        await dynamo.publisher(str(worker), instance)
    return {worker: dynamo_engine(dynamo, str(worker)) for worker in INSTANCE}


async def restart_engines(dynamo: DynamoWorker, engines: dict[Worker, Engine]) -> None:
    """The workers restart: their engines start empty, their publishers count from 1 again."""
    for worker, instance in INSTANCE.items():
        await dynamo.call("shutdown", name=str(worker))
        await dynamo.publisher(str(worker), instance)
        engines[worker].restart()


WARM = [(W7, prompt(0)), (W8, prompt(1)), (W7, prompt(2)), (W8, prompt(3))]


async def warm_up(engines: dict[Worker, Engine]) -> int:
    """Traffic served before the trigger: each engine stores the template and two prompts (4 events)."""
    return sum([await engines[worker].serve(tokens) for worker, tokens in WARM])


def warm_hits(picks: list[Pick]) -> int:
    """How many of the `WARM` prompts went to their worker with the whole prompt cached."""
    pairs = zip(picks, WARM, strict=True)
    return sum(1 for p, (w, _) in pairs if p.worker == w and p.overlap_blocks == PROMPT_BLOCKS)


class Picker:
    """A picker as `serve` builds it, from flags and a config file."""

    def __init__(self, picker: EndpointPicker, sources: EventSources) -> None:
        self.picker = picker
        self.sources = sources
        self._requests = 0
        self._stopped = False

    @classmethod
    async def start(cls, nats_url: str, tmp_path: Path, *flags: str) -> Picker:
        path = tmp_path / "picker.yaml"
        path.write_text(CONFIG)
        argv = ["--config", str(path), "--nats-url", nats_url, "--kv-cache-block-size", str(BS),
                "--dynamo-endpoint", ENDPOINT, "--seed", "0", *flags]  # fmt: skip
        config = load_config(argv, environ={})
        picker = EndpointPicker(config)
        return cls(picker, await start_event_sources(config, picker))

    async def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            await self.sources.stop()
            await self.picker.close()

    @property
    def feed(self) -> RouterFeed:
        return self.sources.feed

    @property
    def durable(self) -> DurableKvEvents:
        assert self.sources.durable is not None
        return self.sources.durable

    def count(self, key: str) -> int:
        return self.sources.counters[key]

    def drops(self, source: str, worker: Worker, reason: str) -> int:
        return self.sources.counters.drops[(source, str(worker), reason)]

    def processed(self) -> int:
        """Events the transport has handed to the feed (applied, or dropped as orphans)."""
        return self.count("nats.event") + self.count("durable.event")

    async def serve(self, engines: dict[Worker, Engine], tokens: list[int]) -> tuple[Pick, int]:
        """One request: routed, prefilled by the chosen worker's engine, ended; and the number of
        events that engine published for it."""
        self._requests += 1
        body = json.dumps({"model": MODEL, "prompt": tokens, "max_tokens": 1}).encode()
        pick = await self.picker.pick(
            body=body, path="/v1/completions", headers={}, subset=None,
            client_request_id=f"req-{self._requests}",
        )  # fmt: skip
        sent = await engines[pick.worker].serve(tokens)
        self.picker.first_token(pick)
        self.picker.finish(pick, "done")
        return pick, sent

    async def serve_all(self, engines: dict[Worker, Engine], prompts: list[list[int]]) -> list[Pick]:
        """Serve each prompt in turn; returns once the picker handled every event they caused."""
        start, sent, picks = self.processed(), 0, []
        for tokens in prompts:
            pick, n = await self.serve(engines, tokens)
            picks.append(pick)
            sent += n
        await self.handled(start, sent)
        return picks

    async def handled(self, start: int, sent: int) -> None:
        """Until the picker handled `sent` events more than `start` (a `processed()` reading)."""
        await eventually(
            lambda: self.processed() >= start + sent,
            what=lambda: f"{sent} events handled by the picker (handled {self.processed() - start})",
        )


async def relearn(picker: Picker, engines: dict[Worker, Engine], prompts: list[list[int]]) -> int:
    """Route each new prompt and let its engine store it, then route each again: how many went to
    the same worker with their whole prompt cached (learned). Fails naming each second routing."""
    first = await picker.serve_all(engines, prompts)
    again = await picker.serve_all(engines, prompts)  # the engines hold them: nothing is stored
    pairs = list(zip(first, again, strict=True))
    learned = sum(1 for a, b in pairs if b.worker == a.worker and b.overlap_blocks == PROMPT_BLOCKS)
    routes = [(str(a.worker), str(b.worker), b.overlap_blocks) for a, b in pairs]
    assert learned == len(prompts), f"{learned} of {len(prompts)} learned; (first, again, overlap): {routes}"
    return learned


def hits(picks: list[Pick], worker: Worker) -> int:
    """How many routings went to `worker` with the whole prompt cached."""
    return sum(1 for p in picks if p.worker == worker and p.overlap_blocks == PROMPT_BLOCKS)


def assert_lost(picker: Picker) -> Worker:
    """The one worker whose view the picker knows to be lost, checked as /debug/workers shows it."""
    feed = picker.feed
    lossy = feed.lossy()
    assert len(lossy) == 1, f"lost: {lossy}"
    worker = lossy[0]
    assert feed.state(worker) == STALE, feed.reason(worker)
    assert "is unknown: blocks the engine holds were lost to the picker" in feed.reason(worker)
    return worker


# --- 1. NATS restart with an event-id gap --------------------------------------------------------


async def test_a_nats_restart_with_an_event_id_gap_keeps_the_known_blocks_and_relearns(
    nats_server, restart_nats, tmp_path
):
    picker = await Picker.start(nats_server.url, tmp_path)
    links: dict[Worker, NatsLink] = {}
    publishers: dict[Worker, NatsEventPublisher] = {}
    restarted = None
    try:
        for worker, instance in INSTANCE.items():
            links[worker] = await connect(nats_server, f"engine-{worker}")
            publishers[worker] = NatsEventPublisher(links[worker].nc, JSON_SUBJECT, instance)
        engines = {w: nats_engine(p) for w, p in publishers.items()}

        probes = iter(range(PROBE_WORKER_BASE, PROBE_WORKER_BASE + 10_000))

        async def prime() -> None:  # nats-server may drop what follows a new subscription
            for link in links.values():
                seen = picker.count("feed.unknown_worker")

                async def probe(_: int, nc=link.nc) -> None:  # a clear from a worker nobody knows
                    worker = next(probes)
                    cleared = AllBlocksCleared(Worker(str(worker)))
                    await nc.publish(JSON_SUBJECT, encode_event(worker, cleared, 0, 0))
                    await nc.flush()

                await prime_with(probe, lambda seen=seen: picker.count("feed.unknown_worker") > seen)

        await prime()
        known = [prompt(i) for i in range(12)]
        picks = await picker.serve_all(engines, known)
        x = picks[0].worker  # the worker that stored the template first takes every prompt after it
        assert [p.worker for p in picks] == [x] * 12
        assert hits(await picker.serve_all(engines, known), x) == 12
        assert picker.feed.state(x) == EVENT_FED

        os.kill(nats_server.pid, signal.SIGKILL)  # the engines go on serving and publishing
        nats_server.stop()  # reaps it
        await eventually(lambda: picker.feed.state(x) == STALE, what="the stream reported down")
        await eventually(lambda: not any(link.nc.is_connected for link in links.values()), what="engines cut")
        during = [prompt(100 + i) for i in range(3)]  # served meanwhile; their stores are dropped
        for tokens in during:
            pick, _ = await picker.serve(engines, tokens)
            assert pick.worker == x
        dropped = publishers[x].counters
        await eventually(lambda: dropped["nats.publish_dropped"] == 3, what="the 3 stores dropped")

        restarted = restart_nats(nats_server.port)
        await eventually(
            lambda: picker.sources.nats is not None and picker.sources.nats.up and all(
                link.nc.is_connected for link in links.values()), timeout_s=8.0, what="all reconnected",
        )  # fmt: skip
        await prime()
        # the conversation of a prompt served during the outage goes on: its new block hangs under
        # one whose store was lost in the gap
        await picker.serve_all(engines, [during[0] + list(range(900_000, 900_000 + BS))])

        kept = hits(await picker.serve_all(engines, known), x)
        assert kept == 12, f"{kept} of 12 prefix hits kept across the gap"
        assert await relearn(picker, engines, [prompt(200 + i) for i in range(NEW)]) == NEW
        # the prompts served during the outage: the engine holds them and stores nothing when they
        # come again, so only the routing can teach them
        await picker.serve_all(engines, during)
        again = hits(await picker.serve_all(engines, during), x)
        assert again == 3, f"{again} of 3 prompts whose stores were lost in the gap learned again"

        assert picker.drops("nats", x, "event-id-gap") == 3 and picker.count("feed.reset") == 0
        # one orphan: the turn above; the new prompts' continuations hung under the known template
        assert picker.count("feed.orphaned") == 1 and picker.drops("feed", x, "unknown-parent") == 1
        assert assert_lost(picker) == x  # until a reset, a clear or `recover_after_stores` stores in a row
    finally:
        for publisher in publishers.values():
            await publisher.stop()
        for link in links.values():
            await link.close()
        await picker.stop()
        if restarted is not None:
            restarted.stop()


# --- 2. a corrupt or deleted snapshot ---------------------------------------------------------------


async def snapshot_store(link: NatsLink):
    return await link.nc.jetstream().object_store(NAMES.snapshot_bucket)


async def test_a_corrupt_snapshot_is_relearned(nats_server, dynamo, tmp_path):
    await lost_snapshot(nats_server, dynamo, tmp_path, corrupt=True)


async def test_a_deleted_snapshot_is_relearned(nats_server, dynamo, tmp_path):
    await lost_snapshot(nats_server, dynamo, tmp_path, corrupt=False)


async def lost_snapshot(nats_server, dynamo: DynamoWorker, tmp_path: Path, *, corrupt: bool) -> None:
    engines = await dynamo_engines(dynamo)
    first = await Picker.start(nats_server.url, tmp_path, "--router-durable-kv-events", "--router-id", "r1")
    try:
        await primed(dynamo, first.sources)
        await first.handled(first.processed(), await warm_up(engines))
        assert warm_hits(await first.serve_all(engines, [tokens for _, tokens in WARM])) == 4
        assert await first.durable.snapshot_now()  # written, and the stream purged up to it
    finally:
        await first.stop()
    link = await connect(nats_server, "operator")
    try:
        store = await snapshot_store(link)
        if corrupt:
            await store.put(SNAPSHOT_OBJECT, b"\x93garbage, not a snapshot")
        else:
            await store.delete(SNAPSHOT_OBJECT)
    finally:
        await link.close()

    second = await Picker.start(nats_server.url, tmp_path, "--router-durable-kv-events", "--router-id", "r2")
    try:
        assert second.count("durable.bad_snapshot") == int(corrupt)
        assert second.count("durable.snapshot_loaded") == 0
        assert await relearn(second, engines, [prompt(200 + i) for i in range(NEW)]) == NEW
        x = assert_lost(second)
        assert second.count("feed.orphaned") == NEW and second.drops("feed", x, "unknown-parent") == NEW
    finally:
        await second.stop()


# --- 3. --router-reset-states ----------------------------------------------------------------------


async def test_router_reset_states_while_workers_run_is_relearned(nats_server, dynamo, tmp_path):
    engines = await dynamo_engines(dynamo)
    first = await Picker.start(nats_server.url, tmp_path, "--router-durable-kv-events", "--router-id", "r1")
    try:
        await primed(dynamo, first.sources)
        await first.handled(first.processed(), await warm_up(engines))
        assert warm_hits(await first.serve_all(engines, [tokens for _, tokens in WARM])) == 4
    finally:
        await first.stop()

    flags = ("--router-durable-kv-events", "--router-id", "r2", "--router-reset-states")
    second = await Picker.start(nats_server.url, tmp_path, *flags)
    try:
        assert second.count("durable.reset_states") == 1
        assert await relearn(second, engines, [prompt(200 + i) for i in range(NEW)]) == NEW
        x = assert_lost(second)
        assert second.count("feed.orphaned") == NEW and second.drops("feed", x, "unknown-parent") == NEW
    finally:
        await second.stop()


# --- 4. a new picker joining running workers -------------------------------------------------------


async def test_a_new_picker_joining_running_workers_relearns(nats_server, dynamo, tmp_path):
    engines = await dynamo_engines(dynamo)
    async with sent_out(nats_server, dynamo, 4):
        assert await warm_up(engines) == 4  # traffic before this picker: both hold the template
    picker = await Picker.start(nats_server.url, tmp_path)
    try:
        await primed(dynamo, picker.sources)
        assert await relearn(picker, engines, [prompt(200 + i) for i in range(NEW)]) == NEW
        x = assert_lost(picker)
        assert picker.count("feed.orphaned") == NEW and picker.drops("feed", x, "unknown-parent") == NEW
        assert picker.count("nats.gap") == 0  # nothing was lost in transit: the picker came late
    finally:
        await picker.stop()


@contextlib.asynccontextmanager
async def sent_out(nats_server, dynamo: DynamoWorker, events: int) -> AsyncIterator[None]:
    """Until `events` events of the known workers went out on the event plane (Dynamo publishes in
    the background): a picker subscribing afterwards cannot hear them."""
    link = await connect(nats_server, "watcher")
    heard: list[Worker] = []

    async def keep(msg) -> None:
        heard.extend(e.worker for e in decode_envelope(msg.data, EventCounters(), worker_id_of=str))

    try:
        await link.nc.subscribe(PLANE_SUBJECT, cb=keep)
        await link.nc.flush()
        await dynamo.publisher("watch-probe", PROBE_ID)
        probe = Worker(str(PROBE_ID))
        await prime_with(lambda _: dynamo.call("removed", name="watch-probe", block_hashes=[0]),
                         lambda: probe in heard)  # fmt: skip
        await dynamo.call("shutdown", name="watch-probe")
        yield
        known = {str(i) for i in INSTANCE.values()}
        await eventually(lambda: sum(str(w.worker_id) in known for w in heard) >= events, what="sent out")
    finally:
        await link.close()


# --- 5. a lossy view never replaces a good snapshot -----------------------------------------------


async def test_a_lossy_view_never_replaces_a_good_snapshot(nats_server, dynamo, tmp_path):
    engines = await dynamo_engines(dynamo)
    durable = ("--router-durable-kv-events",)
    whole = await Picker.start(nats_server.url, tmp_path, *durable, "--router-id", "r1")
    lossy: Picker | None = None
    link = await connect(nats_server, "operator")
    try:
        store = await snapshot_store(link)
        await primed(dynamo, whole.sources)
        await whole.handled(whole.processed(), await warm_up(engines))
        assert await whole.durable.snapshot_now()
        await store.delete(SNAPSHOT_OBJECT)  # lost: the next replica starts from nothing
        lossy = await Picker.start(nats_server.url, tmp_path, *durable, "--router-id", "r2",
                                   "--router-snapshot-threshold", "1")  # fmt: skip
        assert await relearn(lossy, engines, [prompt(200 + i) for i in range(NEW)]) == NEW
        x = assert_lost(lossy)
        await eventually(
            lambda: whole.durable.applied_seq == lossy.durable.applied_seq, what="both caught up"
        )
        assert await whole.durable.snapshot_now()  # the whole replica's view: a good snapshot
        await whole.stop()
        good = await store.get(SNAPSHOT_OBJECT)
        assert decode_snapshot(good.data).created_by == "r1" and decode_snapshot(good.data).events

        async def unchanged() -> bool:
            now = await store.get(SNAPSHOT_OBJECT)
            return now.info.digest == good.info.digest and now.data == good.data

        withheld = lossy.count("durable.snapshot_withheld")
        assert not await lossy.durable.snapshot_now()
        assert lossy.count("durable.snapshot_withheld") == withheld + 1 and await unchanged()
        # more traffic: the periodic check (threshold 1) tries, and is withheld too
        await lossy.serve_all(engines, [prompt(300 + i) for i in range(2)])
        await eventually(lambda: lossy.count("durable.snapshot_withheld") >= withheld + 2, what="checked")
        assert await unchanged() and lossy.count("durable.snapshot") == 0
        assert assert_lost(lossy) == x

        # the workers restart (their engines start empty, their publishers count from 1 again): the
        # picker resets each at its next event, its view is whole, and the next check writes
        await restart_engines(dynamo, engines)
        await lossy.serve_all(engines, [prompt(400 + i) for i in range(2)])
        assert lossy.feed.lossy() == [] and lossy.feed.state(x) == EVENT_FED
        await eventually(lambda: lossy.count("durable.snapshot") >= 1, what="a snapshot once whole")
        written = await store.get(SNAPSHOT_OBJECT)
        assert decode_snapshot(written.data).created_by == "r2" and written.info.digest != good.info.digest
    finally:
        await link.close()
        if lossy is not None:
            await lossy.stop()
        await whole.stop()
