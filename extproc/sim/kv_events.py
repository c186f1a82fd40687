"""Which transport carries the simulated engine's KV events off the mock worker (`--kv-events`).

Owns the choice only: a `KvEventPublisher` exposes the engine's `KvCacheListener` and starts and
stops with the worker; `KV_EVENT_TRANSPORTS` maps each `--kv-events` choice to its factory. The
wire formats and sockets live in `extproc.events` (`zmq`: vLLM's ZMQ PUB + replay, see
`extproc.events.zmq_publisher`). A new transport plugs in by adding a factory here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from extproc.events.dynamo_json import kv_events_subject
from extproc.events.nats_events import NatsEventPublisher, NatsLink
from extproc.events.vllm import WireEvent
from extproc.events.zmq_publisher import (
    DEFAULT_PUB_PORT,
    DEFAULT_REPLAY_PORT,
    VllmEventListener,
    ZmqEventPublisher,
)
from extproc.sim.prefix_cache import KvCacheListener

KV_EVENTS_OFF = "off"
log = logging.getLogger("extproc.sim")


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """`transport`: "off" or a key of `KV_EVENT_TRANSPORTS`. Ports: None = the transport's default
    (zmq: 5557 and 5558, each replaced by a free port when taken, so several workers can share a
    host); an explicit port must be free; 0 picks a free one. The bound ports are logged."""

    transport: str = KV_EVENTS_OFF
    host: str = "127.0.0.1"
    port: int | None = None
    replay_port: int | None = None
    nats_url: str = "nats://127.0.0.1:4222"  # nats: where to publish Dynamo-style JSON events
    instance_id: int = 0  # nats: the worker's u64 id on the wire (the picker maps it to a worker)
    namespace: str = "dynamo"
    component: str = "backend"

    def __post_init__(self) -> None:
        for name in ("port", "replay_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ValueError(f"KvEventsConfig.{name} must be in [0, 65535], got {value}")


class KvEventPublisher(Protocol):
    """One transport's publishing side, as the mock worker drives it."""

    @property
    def listener(self) -> KvCacheListener: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ZmqKvEvents:
    """vLLM's ZMQ KV events: map-format batches, one per engine pass, with a replay socket."""

    def __init__(self, config: KvEventsConfig, block_size: int) -> None:
        defaults = config.port is None and config.replay_port is None
        self.publisher = ZmqEventPublisher(
            host=config.host,
            port=DEFAULT_PUB_PORT if config.port is None else config.port,
            replay_port=DEFAULT_REPLAY_PORT if config.replay_port is None else config.replay_port,
            fallback_to_free_port=defaults,
        )
        self._listener = VllmEventListener(self._publish, block_size)

    @property
    def listener(self) -> KvCacheListener:
        return self._listener

    def _publish(self, events: list[WireEvent]) -> None:
        if self.publisher.started:  # blocks released while shutting down are nobody's business
            self.publisher.publish(events)

    async def start(self) -> None:
        await self.publisher.start()

    async def stop(self) -> None:
        await self.publisher.stop()


class NatsKvEvents:
    """Dynamo-style JSON KV events on NATS core (`namespace.<ns>.component.<c>.kv_events`)."""

    def __init__(self, config: KvEventsConfig, block_size: int) -> None:
        self.config = config
        self.block_size = block_size
        self.link: NatsLink | None = None
        self.publisher: NatsEventPublisher | None = None
        self._listener = _Forward(self)

    @property
    def listener(self) -> KvCacheListener:
        return self._listener

    async def start(self) -> None:
        cfg = self.config
        self.link = await NatsLink.connect(cfg.nats_url, name=f"mock-worker-{cfg.instance_id}")
        subject = kv_events_subject(cfg.namespace, cfg.component)
        self.publisher = NatsEventPublisher(self.link.nc, subject, cfg.instance_id)
        log.info("publishing KV events as instance %d on %s at %s", cfg.instance_id, subject, cfg.nats_url)

    async def stop(self) -> None:
        publisher, self.publisher = self.publisher, None
        if publisher is not None:
            await publisher.stop()
        if self.link is not None:
            await self.link.close()
            self.link = None


class _Forward:
    """The engine's listener: forwards to the NATS publisher once it is connected."""

    def __init__(self, owner: NatsKvEvents) -> None:
        self.owner = owner

    def on_stored(
        self,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        *,
        cache_salt: str | None = None,
    ) -> None:
        if self.owner.publisher is not None:
            self.owner.publisher.on_stored(parent_hash, block_hashes, token_ids, cache_salt=cache_salt)

    def on_removed(self, block_hashes: Sequence[int]) -> None:
        if self.owner.publisher is not None:
            self.owner.publisher.on_removed(block_hashes)

    def on_cleared(self) -> None:
        if self.owner.publisher is not None:
            self.owner.publisher.on_cleared()


KV_EVENT_TRANSPORTS: dict[str, Callable[[KvEventsConfig, int], KvEventPublisher]] = {
    "zmq": ZmqKvEvents,
    "nats": NatsKvEvents,
}


def make_kv_event_publisher(config: KvEventsConfig, block_size: int) -> KvEventPublisher | None:
    """The publisher `config` asks for, or None when KV events are off. Raises ValueError."""
    if config.transport == KV_EVENTS_OFF:
        return None
    factory = KV_EVENT_TRANSPORTS.get(config.transport)
    if factory is None:
        accepted = ", ".join([KV_EVENTS_OFF, *KV_EVENT_TRANSPORTS])
        raise ValueError(f"--kv-events must be one of {accepted}, got {config.transport!r}")
    return factory(config, block_size)
