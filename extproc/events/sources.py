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
from dataclasses import dataclass, field

from extproc.config import PickerConfig, WorkerConfig
from extproc.events.counters import EventCounters
from extproc.events.feed import RouterFeed
from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscribers
from extproc.picker import EndpointPicker
from extproc.router.types import Worker

log = logging.getLogger("extproc.events")


@dataclass
class EventSources:
    """The running event transports of one picker; `stop()` closes them all."""

    feed: RouterFeed
    counters: EventCounters
    zmq: ZmqEventSubscribers | None = None
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
    if not config.router.use_kv_events:
        log.info("KV events off: every worker's cache is predicted from routing decisions")
        return sources
    try:
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
