"""Starts the KV event sources the config names and feeds them into the picker's routers.

- ZMQ (vLLM / SGLang): one subscriber per worker dp rank, at the worker's `kv-events` endpoint
  or at its endpoint's IP and `--kv-events-port` (+ dp rank), with the replay endpoint likewise.
- NATS (Dynamo-style JSON): core subscriber, or a JetStream durable consumer with snapshots
  when `--router-durable-kv-events`; and replica sync of active requests.

With KV events off (`--no-kv-events`) nothing is started and the routers predict cache state
from their own decisions.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from extproc.config import PickerConfig, WorkerConfig
from extproc.events.counters import EventCounters
from extproc.events.durable import DurableConfig, DurableKvEvents
from extproc.events.dynamo_json import kv_events_subject
from extproc.events.feed import RouterFeed
from extproc.events.nats_events import NatsEventSubscriber, NatsLink
from extproc.events.replica_sync import ReplicaSync, active_sequences_subject
from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscribers
from extproc.picker import EndpointPicker, Pick
from extproc.router import KvRouter
from extproc.router.types import KvEvent, Worker, WorkerId

log = logging.getLogger("extproc.events")


@dataclass
class EventSources:
    """The running event transports of one picker; `stop()` closes them all."""

    feed: RouterFeed
    counters: EventCounters
    zmq: ZmqEventSubscribers | None = None
    nats: NatsLink | None = None
    durable: DurableKvEvents | None = None
    replica_sync: ReplicaSync | None = None
    closers: list = field(default_factory=list)  # async callables, stopped in reverse order

    def states(self) -> dict[Worker, str]:
        return self.feed.states()

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
    counters = EventCounters()
    sources = EventSources(RouterFeed(picker.routers_by_worker(), counters), counters)
    try:
        if config.events.nats_url is not None:
            await _start_nats(config, picker, sources)
        if not config.router.use_kv_events:
            log.info("KV events off: every worker's cache is predicted from routing decisions")
            return sources
        endpoints = zmq_endpoints(config)
        if endpoints:
            sources.zmq = ZmqEventSubscribers(
                endpoints,
                sources.feed,
                block_size=config.router.block_size,
                counters=counters,
                timings=timings,
            )
            await sources.zmq.start()
            sources.closers.append(sources.zmq.stop)
            log.info(
                "subscribed to ZMQ KV events of %d worker endpoints (%s)",
                len(endpoints),
                ", ".join(f"{e.worker}={e.pub}" for e in endpoints[:8])
                + (" ..." if len(endpoints) > 8 else ""),
            )
    except BaseException:
        await sources.stop()
        raise
    return sources


async def _start_nats(config: PickerConfig, picker: EndpointPicker, sources: EventSources) -> None:
    events = config.events
    router_id = events.router_id or f"{socket.gethostname()}-{os.getpid()}"
    link = await NatsLink.connect(events.nats_url, name=f"extproc-{router_id}", counters=sources.counters)
    sources.nats = link
    sources.closers.append(link.close)
    ids = {w.instance_id if w.instance_id is not None else _int_or_none(w.id): w.id for w in config.workers}
    ids.pop(None, None)

    def worker_id_of(instance_id: int) -> WorkerId:
        return ids.get(instance_id, str(instance_id))

    if config.router.use_kv_events:
        if events.durable_kv_events:
            durable = DurableKvEvents(
                link.nc,
                sources.feed,
                _AllRouters(picker),
                DurableConfig(
                    events.namespace,
                    events.component,
                    router_id,
                    snapshot_threshold=events.snapshot_threshold,
                ),
                counters=sources.counters,
                worker_id_of=worker_id_of,
            )
            await durable.start(reset_states=events.reset_states)
            sources.durable = durable
            sources.closers.append(durable.stop)
            log.info("durable KV events: JetStream consumer router-%s, snapshots every %d messages",
                     router_id, events.snapshot_threshold)  # fmt: skip
        else:
            subject = kv_events_subject(events.namespace, events.component)
            subscriber = NatsEventSubscriber(
                link, sources.feed, subject, counters=sources.counters, worker_id_of=worker_id_of
            )
            await subscriber.start()
            sources.closers.append(subscriber.stop)
            log.info("subscribed to Dynamo KV events on %s at %s", subject, events.nats_url)
    if events.replica_sync:
        subject = active_sequences_subject(events.namespace, events.component)
        sync = ReplicaSync(link.nc, _AllRouters(picker), router_id, subject, counters=sources.counters)
        await sync.start()
        sources.replica_sync = sync
        sources.closers.append(sync.stop)
        listener = _SyncListener(sync, picker)
        picker.listeners.append(listener)
        sources.closers.append(listener.detach)
        log.info("replica sync on %s as %s", subject, router_id)


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None


class _AllRouters:
    """The picker's routers (one per model) seen as one, for snapshots and replica sync."""

    def __init__(self, picker: EndpointPicker) -> None:
        self._by_worker = picker.routers_by_worker()
        self._routers: list[KvRouter] = [pool.router for pool in picker.pools.values()]

    def dump_events(self) -> list[KvEvent]:
        return [e for r in self._routers for e in r.dump_events()]

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
        self, pick: Pick, local_hashes: Sequence[int], isl: int, expected_output_tokens: int | None
    ) -> None:
        self.sync.publish_added(
            pick.request_id, pick.worker, local_hashes, isl, pick.overlap_blocks, expected_output_tokens
        )

    def on_prefill_complete(self, pick: Pick) -> None:
        self.sync.publish_prefill_complete(pick.request_id)

    def on_freed(self, pick: Pick) -> None:
        self.sync.publish_freed(pick.request_id)
