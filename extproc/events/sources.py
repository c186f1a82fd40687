"""Starts the KV event sources the config names and feeds them into the picker's routers.

- ZMQ (vLLM / SGLang): one subscriber per worker dp rank, at the worker's `kv-events` endpoint
  or at its endpoint's IP and `--kv-events-port` (+ dp rank), with the replay endpoint likewise.
- NATS (Dynamo): one core subscriber for the JSON subject `namespace.<ns>.component.<c>.kv_events`
  and Dynamo's event plane `namespace.<ns>.component.<c>.endpoint.<--dynamo-endpoint>.kv-events`
  (what Dynamo's own `KvEventPublisher` sends), or a JetStream durable consumer of the JSON stream
  with snapshots when `--router-durable-kv-events`; and replica sync of active requests
  (`extproc.events.replica_sync`: heartbeats and leases, resynchronised after a reconnect, the
  other replicas' requests on a worker applied again when discovery brings it back).
- Dynamo's ZMQ event plane (`--event-plane zmq`): the publishers advertised in Dynamo's file store,
  or its brokers (`extproc.events.dynamo_zmq_plane`); no NATS needed.

With KV events off (`--no-kv-events`) nothing is started and the routers predict cache state
from their own decisions. With a KV indexer (`--kv-indexer-url`) no KV event is consumed here: the
workers with a ZMQ endpoint are registered with the indexer (`extproc.events.kv_indexer`), which
consumes their events, and each decision asks it for overlaps; NATS still carries replica sync.

Every subscription buffers at most `--event-queue-size` messages (`EventsConfig.queue_size`);
what overflows is dropped, counted and the worker concerned resynchronised (see each transport).

The worker set may change while the picker runs (DNS discovery, config reload): a
`WorkerSetFollower` keeps the feed's worker -> router map, the NATS instance-id map and the
per-worker ZMQ subscribers in step with it, and tells replica sync of workers added.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import zmq.asyncio

from extproc.config import PickerConfig, WorkerConfig
from extproc.events.counters import EventCounters
from extproc.events.durable import DurableConfig, DurableKvEvents
from extproc.events.dynamo_json import jetstream_subject, kv_events_subject
from extproc.events.dynamo_plane import component_plane_subject, event_plane_subject
from extproc.events.dynamo_recovery import LocalIndexerRecovery, start_recovery
from extproc.events.dynamo_zmq_plane import DynamoZmqPlaneSubscriber, read_file_channels
from extproc.events.feed import RouterFeed
from extproc.events.kv_indexer import KvIndexerRegistrar, Registration
from extproc.events.nats_events import NatsEventSubscriber, NatsLink
from extproc.events.nats_security import connect_nats
from extproc.events.replica_sync import ReplicaSync, active_sequences_subject
from extproc.events.replica_wire import SharedHome, SharedPin, SharedUnpin, prefill_leg_id
from extproc.events.zmq_subscriber import (
    SubscriberTimings,
    ZmqEndpoint,
    ZmqEventSubscriber,
    ZmqEventSubscribers,
)
from extproc.picker.local_group import Routed
from extproc.picker.pipeline import EndpointPicker
from extproc.router import KvRouter
from extproc.router.types import KvEvent, Worker, WorkerId
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.events")


@dataclass
class EventSources:
    """The running event transports of one picker; `stop()` closes them all."""

    feed: RouterFeed
    counters: EventCounters
    zmq: ZmqEventSubscribers | None = None
    nats: NatsLink | None = None
    nats_events: NatsEventSubscriber | None = None  # core NATS: JSON and event-plane subjects
    zmq_plane: DynamoZmqPlaneSubscriber | None = None  # Dynamo's ZMQ event plane (--event-plane zmq)
    durable: DurableKvEvents | None = None
    recovery: LocalIndexerRecovery | None = None  # Dynamo workers rebuilt from their local indexers
    replica_sync: ReplicaSync | None = None
    kv_indexer: KvIndexerRegistrar | None = None  # --kv-indexer-url: the workers it should consume
    closers: list[Callable[[], Awaitable[object]]] = field(default_factory=list)  # stopped in reverse order
    instance_ids: dict[int, WorkerId] = field(default_factory=dict)  # NATS instance id -> worker id

    def states(self) -> dict[Worker, str]:
        return self.feed.states()

    def worker_id_of(self, instance_id: int) -> WorkerId:
        """The picker's worker of a Dynamo instance id (`instance_ids`, kept current by the
        WorkerSetFollower; else the id as text)."""
        return self.instance_ids.get(instance_id, str(instance_id))

    async def stop(self) -> None:
        for close in reversed(self.closers):
            try:
                await close()
            except Exception:  # stopping must go on for the others
                log.exception("stopping an event source failed")
        self.closers.clear()


def zmq_endpoints(config: PickerConfig) -> list[ZmqEndpoint]:
    """The ZMQ endpoints of every worker that has one (explicitly or through --kv-events-port)."""
    endpoints: list[ZmqEndpoint] = []
    for worker in config.workers:
        pub, replay = _worker_zmq(worker, config)
        if pub is not None:
            endpoints += ZmqEndpoint.for_dp_ranks(worker.id, pub, replay, worker.dp_ranks)
    return endpoints


def _worker_zmq(worker: WorkerConfig, config: PickerConfig) -> tuple[str | None, str | None]:
    events = config.events
    pub = worker.kv_events
    if pub is None and events.kv_events_port is not None:
        pub = f"tcp://{worker.host}:{events.kv_events_port}"
    replay = worker.kv_replay
    if replay is None and events.kv_replay_port is not None:
        replay = f"tcp://{worker.host}:{events.kv_replay_port}"
    return pub, replay


async def start_event_sources(
    config: PickerConfig, picker: EndpointPicker, *, timings: SubscriberTimings | None = None
) -> EventSources:
    """Start every configured source; a source that cannot start is logged and routing goes on."""
    counters = picker.kv_indexer.counters if picker.kv_indexer is not None else EventCounters()
    sources = EventSources(RouterFeed(picker.routers_by_worker(), counters), counters)
    sources.instance_ids = _instance_ids(config.workers)
    try:
        if config.events.nats_url is not None:
            await _start_nats(config, picker, sources)
        if picker.kv_indexer is not None:
            _start_kv_indexer(config, picker, sources)
        elif config.router.use_kv_events:
            if config.events.hears_zmq_plane:
                await _start_zmq_plane(config, sources)
            await _start_zmq(config, sources, timings)
            await _start_recovery(config, sources)
        else:
            log.info("KV events off: every worker's cache is predicted from routing decisions")
    except BaseException:
        await sources.stop()
        raise
    # Last, so that it is the first closer: it detaches before any transport stops.
    follower = WorkerSetFollower(config, picker, sources, timings=timings)
    picker.worker_listeners.append(follower)
    sources.closers.append(follower.stop)
    return sources


async def _start_zmq(config: PickerConfig, sources: EventSources, timings: SubscriberTimings | None) -> None:
    endpoints = zmq_endpoints(config)
    d = config.discovery
    discovering = d.dns_name is not None or d.prefill_dns_name is not None or d.reload_config
    if not endpoints and not (discovering and _zmq_possible(config)):
        return
    block_size = config.router.block_size
    sources.zmq = ZmqEventSubscribers(
        endpoints,
        sources.feed,
        block_size=block_size,
        counters=sources.counters,
        timings=timings,
        queue_size=config.events.queue_size,
    )
    await sources.zmq.start()
    sources.closers.append(sources.zmq.stop)
    for worker, sub in sources.zmq.subscribers.items():  # a lost view is rebuilt from the engine's replay
        sources.feed.set_resync(worker, sub.request_resync)
    log.info(
        "subscribed to ZMQ KV events of %d worker endpoints (%s)",
        len(endpoints),
        ", ".join(f"{e.worker}={e.pub}" for e in endpoints[:8]) + (" ..." if len(endpoints) > 8 else ""),
    )


async def _start_zmq_plane(config: PickerConfig, sources: EventSources) -> None:
    """Dynamo's ZMQ event plane: its brokers, or the publishers listed in Dynamo's file store."""
    events = config.events
    root = events.dynamo_file_kv
    where = (events.namespace, events.component, events.dynamo_endpoint)
    plane = DynamoZmqPlaneSubscriber(
        sources.feed,
        sources.counters,
        event_plane_subject(*where),
        channels=functools.partial(read_file_channels, root, *where) if root is not None else None,
        brokers=events.zmq_brokers,
        worker_id_of=sources.worker_id_of,
        queue_size=events.queue_size,
    )
    await plane.start()
    sources.zmq_plane = plane
    sources.closers.append(plane.stop)
    if events.zmq_brokers:
        log.info("Dynamo's ZMQ event plane: KV events of %s through the brokers at %s",
                 event_plane_subject(*where), ", ".join(events.zmq_brokers))  # fmt: skip
    else:
        log.info("Dynamo's ZMQ event plane: KV events from the publishers advertised in %s (%d now)",
                 root, len(plane.publishers))  # fmt: skip


async def _start_recovery(config: PickerConfig, sources: EventSources) -> None:
    """Dynamo's workers with a local indexer rebuilt from it (the file store names where), ordering the
    live events of both event planes; after they subscribed: nothing falls between a dump and them."""
    intakes = [i for i in (sources.nats_events, sources.zmq_plane) if i is not None]
    if config.events.dynamo_file_kv is None or not intakes:
        return
    sources.recovery = await start_recovery(config.events, intakes, sources.feed, sources.worker_id_of)
    sources.closers.append(sources.recovery.stop)


async def _start_nats(config: PickerConfig, picker: EndpointPicker, sources: EventSources) -> None:
    events = config.events
    router_id = events.router_id or f"{socket.gethostname()}-{os.getpid()}"
    link = await connect_nats(events, name=f"extproc-{router_id}", counters=sources.counters)
    sources.nats = link
    sources.closers.append(link.close)
    worker_id_of = sources.worker_id_of
    if config.router.use_kv_events and picker.kv_indexer is None:
        if events.durable_kv_events:
            durable = DurableKvEvents(
                link.nc,
                sources.feed,
                _AllRouters(picker, sources.feed),
                DurableConfig(
                    events.namespace,
                    events.component,
                    router_id,
                    endpoint=events.dynamo_endpoint,
                    snapshot_threshold=events.snapshot_threshold,
                ),
                counters=sources.counters,
                worker_id_of=worker_id_of,
                lossy=sources.feed.lossy,
            )
            await durable.start(reset_states=events.reset_states)
            sources.durable = durable
            sources.closers.append(durable.stop)
            log.info("durable KV events: JetStream consumer router-%s, snapshots every %d messages",
                     router_id, events.snapshot_threshold)  # fmt: skip
        else:
            subject = kv_events_subject(events.namespace, events.component)
            plane = event_plane_subject(events.namespace, events.component, events.dynamo_endpoint)
            jetstream = jetstream_subject(events.namespace, events.component)
            component_plane = component_plane_subject(events.namespace, events.component)
            subscriber = NatsEventSubscriber(
                link,
                sources.feed,
                subject,
                event_plane_subject=plane,
                jetstream_subject=jetstream,
                component_plane_subject=component_plane,
                counters=sources.counters,
                worker_id_of=worker_id_of,
                queue_size=events.queue_size,
            )
            await subscriber.start()
            sources.nats_events = subscriber
            sources.closers.append(subscriber.stop)
            log.info("subscribed to Dynamo KV events on %s (JSON), %s (event plane), %s (Dynamo 1.0-1.3 "
                     "workers' JetStream stream, heard live) and %s (Dynamo 1.0-1.3 workers with a local "
                     "indexer) at %s", subject, plane, jetstream, component_plane,
                     events.nats_url)  # fmt: skip
    if events.replica_sync:
        subject = active_sequences_subject(events.namespace, events.component)
        routers = _AllRouters(picker, sources.feed)
        sync = ReplicaSync(
            link.nc,
            routers,
            router_id,
            subject,
            counters=sources.counters,
            queue_size=events.queue_size,
            heartbeat_s=events.replica_sync_heartbeat_s,
            lease_s=events.replica_sync_lease_s,
            batch_s=events.replica_sync_batch_s,
            routes=picker,
        )
        await sync.start()
        sources.replica_sync = sync
        sources.closers.append(sync.stop)
        unwatch = link.on_overflow(sync.subscription, sync.overflowed)
        unwatch_link = link.watch(sync.connection_changed)  # back from an outage: resynchronise

        async def stop_watching() -> None:
            unwatch()
            unwatch_link()

        sources.closers.append(stop_watching)
        listener = _SyncListener(sync, picker)
        picker.listeners.append(listener)
        sources.closers.append(listener.detach)
        picker.before_decision = sync.catch_up  # a decision counts what already reached this replica
        picker.route_share = _RouteShare(sync)

        async def stop_catching_up() -> None:
            picker.before_decision = None
            picker.route_share = None

        sources.closers.append(stop_catching_up)
        log.info(
            "replica sync on %s as %s (shared: in-flight load, the workers storing Responses API answers "
            "and sticky-session pins, asked of another replica at start)", subject, router_id,
        )  # fmt: skip


def _start_kv_indexer(config: PickerConfig, picker: EndpointPicker, sources: EventSources) -> None:
    client = picker.kv_indexer
    assert client is not None
    client.instance_ids = sources.instance_ids  # one map, kept current by the WorkerSetFollower
    registrar = KvIndexerRegistrar(client)
    wanted = _registrations(config, sources.feed, config.workers)
    registrar.want(wanted)
    registrar.start()
    sources.kv_indexer = registrar
    sources.closers.append(registrar.stop)
    log.info("overlaps from the KV indexer at %s (no KV events consumed here); registering %d worker "
             "endpoints with it", client.url, len(wanted))  # fmt: skip


def _registrations(
    config: PickerConfig, feed: RouterFeed, workers: Sequence[WorkerConfig]
) -> list[Registration]:
    """What the indexer should consume for `workers`: each dp rank's ZMQ endpoint, when known here.
    They count as event-fed (nothing predicted from decisions: the indexer knows)."""
    wanted: list[Registration] = []
    url = config.events.kv_indexer_url
    for w in workers:
        for rank in w.dp_ranks:
            feed.fed_elsewhere(Worker(w.id, rank), f"its KV events are the KV indexer's at {url}")
        iid = _instance_id(w)
        if iid is None:
            log.warning("worker %s has no instance id (instance-id:, or a numeric id): the KV indexer's "
                        "answers cannot name it, so it is routed by load alone", w.id)  # fmt: skip
            continue
        pub, replay = _worker_zmq(w, config)
        if pub is not None:
            wanted += [
                Registration(iid, e.worker.dp_rank, e.pub, w.model, config.router.block_size, e.replay)
                for e in ZmqEndpoint.for_dp_ranks(w.id, pub, replay, w.dp_ranks)
            ]
    return wanted


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _instance_id(worker: WorkerConfig) -> int | None:
    return worker.instance_id if worker.instance_id is not None else _int_or_none(worker.id)


def _instance_ids(workers: Sequence[WorkerConfig]) -> dict[int, WorkerId]:
    return {iid: w.id for w in workers if (iid := _instance_id(w)) is not None}


def _zmq_possible(config: PickerConfig) -> bool:
    """Whether a worker added later can have ZMQ events: a port for all, or per-worker endpoints."""
    return config.events.kv_events_port is not None or config.discovery.reload_config


class WorkerSetFollower:
    """Keeps the event transports in step with the picker's worker set (a `WorkerSetListener`).

    The feed's worker -> router map and the NATS instance-id map change at once (the call comes
    from `EndpointPicker.set_workers`, on the event loop). ZMQ subscribers of removed or changed
    workers are stopped and those of added or changed workers started in a task, one change after
    the other; a new subscriber rebuilds its worker's blocks from the replay socket as at start.
    """

    def __init__(
        self,
        config: PickerConfig,
        picker: EndpointPicker,
        sources: EventSources,
        *,
        timings: SubscriberTimings | None = None,
    ) -> None:
        self.config = config
        self.picker = picker
        self.sources = sources
        self.timings = timings
        self._lock = asyncio.Lock()
        self._pending: set[asyncio.Task[None]] = set()
        self._ctx: zmq.asyncio.Context | None = None  # for subscribers started here
        self._started_here: set[Worker] = set()

    def on_workers_changed(self, model: str, added: Sequence[WorkerConfig], removed: Sequence[str]) -> None:
        feed, ids = self.sources.feed, self.sources.instance_ids
        pool = self.picker.pools[model]
        forgotten: list[int] = []
        for wid in removed:
            feed.routers.pop(wid, None)
            for gone in [i for i, w in ids.items() if w == wid]:
                del ids[gone]
                forgotten.append(gone)
        for w in added:
            feed.routers[w.id] = pool.router_for(w)  # a prefill worker's events feed the prefill router
            if (iid := _instance_id(w)) is not None:
                ids[iid] = w.id
        if self.sources.replica_sync is not None and added:  # the others' requests on them count again
            self.sources.replica_sync.workers_added({w.id for w in added})
        if self.sources.recovery is not None and added:  # their blocks from their local indexers
            self.sources.recovery.rescan()
        if self.sources.kv_indexer is not None:
            wanted = _registrations(self.config, feed, added)
            self.sources.kv_indexer.want(wanted, forget=forgotten)
        if self.sources.zmq is not None:
            task = asyncio.get_running_loop().create_task(self._resubscribe(list(added), list(removed)))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def wait_idle(self) -> None:
        """Until every subscriber change asked for so far is done (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def _resubscribe(self, added: list[WorkerConfig], removed: list[str]) -> None:
        holder = self.sources.zmq
        assert holder is not None
        async with self._lock:
            gone = {*removed, *(w.id for w in added)}
            for worker in [w for w in holder.subscribers if str(w.worker_id) in gone]:
                self.sources.feed.set_resync(worker, None)
                await holder.subscribers.pop(worker).stop()
                self._started_here.discard(worker)
            endpoints: list[ZmqEndpoint] = []
            for w in added:
                pub, replay = _worker_zmq(w, self.config)
                if pub is not None:
                    endpoints += ZmqEndpoint.for_dp_ranks(w.id, pub, replay, w.dp_ranks)
            if endpoints and self._ctx is None:
                self._ctx = zmq.asyncio.Context()
            for e in endpoints:
                sub = ZmqEventSubscriber(
                    e,
                    self.sources.feed,
                    block_size=self.config.router.block_size,
                    counters=self.sources.counters,
                    timings=self.timings,
                    context=self._ctx,
                    queue_size=self.config.events.queue_size,
                )
                holder.subscribers[e.worker] = sub
                self._started_here.add(e.worker)
                await sub.start()
                self.sources.feed.set_resync(e.worker, sub.request_resync)
            if endpoints or gone:
                log.info("ZMQ KV event subscribers: %d (started %d; stopped for %s)", len(holder.subscribers),
                         len(endpoints), ", ".join(sorted(gone)) or "none")  # fmt: skip

    async def stop_subscribers(self) -> None:
        """Stop the subscribers started here and their ZMQ context."""
        await cancel_and_wait(*self._pending)
        await self.wait_idle()
        holder = self.sources.zmq
        for worker in list(self._started_here):
            sub = holder.subscribers.pop(worker, None) if holder is not None else None
            self.sources.feed.set_resync(worker, None)
            if sub is not None:
                await sub.stop()
        self._started_here.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def stop(self) -> None:
        """Stop following the worker set."""
        if self in self.picker.worker_listeners:
            self.picker.worker_listeners.remove(self)
        await self.stop_subscribers()


class _AllRouters:
    """The picker's routers (one per model) seen as one, for snapshots and replica sync."""

    def __init__(self, picker: EndpointPicker, feed: RouterFeed) -> None:
        self._by_worker = feed.routers  # the live worker -> router map (follows the worker set)
        self._routers: list[KvRouter] = [r for pool in picker.pools.values() for r in pool.routers()]

    def dump_slices(self, blocks_per_slice: int) -> Iterator[list[KvEvent]]:
        for router in self._routers:
            yield from router.dump_slices(blocks_per_slice)

    def add_request(
        self,
        request_id: str,
        worker: Worker,
        local_hashes: Sequence[int],
        isl: int,
        overlap_blocks: int,
        *,
        expected_output_tokens: int | None = None,
    ) -> None:
        router = self._by_worker.get(str(worker.worker_id))
        if router is not None:
            router.add_request(
                request_id,
                worker,
                local_hashes,
                isl,
                overlap_blocks,
                expected_output_tokens=expected_output_tokens,
            )

    def mark_prefill_complete(self, request_id: str) -> bool:
        return any(r.mark_prefill_complete(request_id) for r in self._routers)

    def free(self, request_id: str) -> bool:
        return any(r.free(request_id) for r in self._routers)


class _SyncListener:
    """Publishes this replica's request lifecycle to the others."""

    def __init__(self, sync: ReplicaSync, picker: EndpointPicker) -> None:
        self.sync = sync
        self.picker = picker

    async def detach(self) -> None:
        if self in self.picker.listeners:
            self.picker.listeners.remove(self)

    def on_routed(
        self, routed: Routed, local_hashes: Sequence[int], isl: int, expected_output_tokens: int | None
    ) -> None:
        sync, request_id = self.sync, routed.request_id
        sync.publish_added(
            request_id, routed.worker, local_hashes, isl, routed.overlap_blocks, expected_output_tokens
        )
        if routed.prefill_worker is not None:  # its prompt is the prefill worker's work, not the decode's
            sync.publish_prefill_complete(request_id)
            sync.publish_added(
                prefill_leg_id(request_id),
                routed.prefill_worker,
                local_hashes,
                isl,
                routed.prefill_overlap_blocks,
            )

    def on_prefill_complete(self, routed: Routed) -> None:
        if routed.prefill_worker is None:
            self.sync.publish_prefill_complete(routed.request_id)
        else:  # the first token: the prompt left its prefill worker
            self.sync.publish_freed(prefill_leg_id(routed.request_id))

    def on_freed(self, routed: Routed) -> None:
        self.sync.publish_freed(routed.request_id)
        leg = prefill_leg_id(routed.request_id)
        if routed.prefill_worker is not None and self.sync.publishes(leg):  # ended before its first token
            self.sync.publish_freed(leg)


class _RouteShare:
    """The routes clients name, as the picker learns them, published to the other replicas."""

    def __init__(self, sync: ReplicaSync) -> None:
        self.sync = sync

    def response_home(self, response_id: str, model: str, worker: Worker, endpoint: str, group: str) -> None:
        self.sync.publish_route(response_id, SharedHome(model, worker, endpoint, group))

    def session_pinned(self, session_id: str, model: str, worker: Worker, group: str) -> None:
        self.sync.publish_route(session_id, SharedPin(model, worker, group))

    def session_closed(self, session_id: str, model: str) -> None:
        self.sync.publish_route(session_id, SharedUnpin(model))

    def shared(self) -> bool:
        return self.sync.shares_routes()
