"""Runs the picker: the ext_proc gRPC server and the gRPC health server, until told to stop.

Health answers the services the Inference Extension expects on its health port: overall (""),
`liveness`, `readiness`, `envoy.service.ext_proc.v3.ExternalProcessor` and
`inference-extension`. Readiness goes NOT_SERVING as soon as shutdown starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.admin import AdminServer, start_admin
from extproc.config import PickerConfig
from extproc.discovery import WorkerDiscovery, start_discovery
from extproc.events.sources import EventSources, start_event_sources
from extproc.groups import GroupApiServer, GroupRouters, start_group_api
from extproc.picker import EndpointPicker
from extproc.readiness import Readiness
from extproc.service import ExtProcService

log = logging.getLogger("extproc.server")

HEALTH_SERVICES = (
    "",
    "liveness",
    "readiness",
    "envoy.service.ext_proc.v3.ExternalProcessor",
    "inference-extension",
)
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),  # grpcio's 4 MiB default is below Envoy's bodies
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


@dataclass
class RunningPicker:
    picker: EndpointPicker
    service: ExtProcService
    server: grpc.aio.Server
    health_server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    health_port: int
    sources: EventSources
    admin: AdminServer | None = None
    discovery: WorkerDiscovery | None = None  # DNS / config-file workers, when configured
    readiness: Readiness | None = None
    readiness_task: asyncio.Task | None = None
    group_api: GroupApiServer | None = None  # --group-api-port: this picker's routers as a router group

    async def stop(self, grace_s: float = 5.0) -> None:
        if self.readiness is not None:
            self.readiness.draining = True
        if self.readiness_task is not None:
            self.readiness_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.readiness_task
        for name in HEALTH_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)
        if self.group_api is not None:
            await self.group_api.stop(min(grace_s, 1.0))
        await self.health_server.stop(0)
        if self.admin is not None:
            await self.admin.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        await self.sources.stop()
        await self.picker.close()


async def start_picker(config: PickerConfig) -> RunningPicker:
    """Start the event sources and both servers (port 0 picks free ports); mark health SERVING."""
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker)
    service = ExtProcService(
        picker, max_body_bytes=config.max_body_bytes, conformance_hooks=config.conformance_hooks
    )
    server = grpc.aio.server(options=GRPC_OPTIONS)
    pb_grpc.add_ExternalProcessorServicer_to_server(service, server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    health_server = grpc.aio.server(options=GRPC_OPTIONS)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
    health_port = health_server.add_insecure_port(f"{config.host}:{config.health_port}")
    if not port or not health_port:
        await sources.stop()
        raise OSError(f"cannot listen on {config.host}:{config.port} / {config.health_port}")
    await server.start()
    await health_server.start()
    readiness = Readiness(picker, sources)
    for name in HEALTH_SERVICES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = RunningPicker(
        picker, service, server, health_server, health_servicer, port, health_port, sources
    )
    running.readiness = readiness
    try:
        running.discovery = await start_discovery(config, picker)
        if config.groups.api_port is not None:
            routers = GroupRouters(f"{config.host}:{config.port}", picker.pools)
            running.group_api = await start_group_api(routers, config.host, config.groups.api_port)
        await _report_readiness(health_servicer, readiness)
        running.readiness_task = asyncio.get_running_loop().create_task(
            _follow_readiness(health_servicer, readiness)
        )
        if config.admin_port is not None:
            running.admin = await start_admin(
                picker,
                sources,
                config.admin_host,
                config.admin_port,
                readiness=readiness,
                token=config.admin_token,
            )
    except BaseException:
        await running.stop(0)
        raise
    return running


async def _report_readiness(servicer: health.aio.HealthServicer, readiness: Readiness) -> bool:
    report = readiness.check()
    status = (
        health_pb2.HealthCheckResponse.SERVING if report.ready else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    await servicer.set("readiness", status)
    return report.ready


async def _follow_readiness(servicer: health.aio.HealthServicer, readiness: Readiness) -> None:
    """The gRPC `readiness` service follows `Readiness` (first KV sync, workers known)."""
    last = None
    while True:
        ready = await _report_readiness(servicer, readiness)
        if ready != last:
            log.info("readiness: %s (%s)", "ready" if ready else "not ready", readiness.check().reason)
            last = ready
        await asyncio.sleep(0.5)  # a timer: readiness changes with no event to wait on


async def serve(config: PickerConfig) -> None:
    """Run until SIGINT/SIGTERM."""
    running = await start_picker(config)
    mode = "KV events" if config.router.use_kv_events else "predicted from routing decisions (no KV events)"
    log.info(
        "ext_proc on %s:%d, health on %s:%d; %d workers over %d models; router mode %s, cache state %s",
        config.host,
        running.port,
        config.host,
        running.health_port,
        len(config.workers),
        len(config.models),
        config.router.mode,
        mode,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: not ready, finishing in-flight streams")
    await running.stop()
