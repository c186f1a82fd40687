"""Runs the picker: the ext_proc gRPC server and the gRPC health server, until told to stop.

Health answers the services the Inference Extension expects on its health port: overall (""),
`liveness`, `readiness`, `envoy.service.ext_proc.v3.ExternalProcessor` and
`inference-extension`.

Listening (every address defaults to 127.0.0.1; `--host` / `--admin-host` widen it):
    ext_proc          --host:--port (9002)            TLS with --tls-*, else plaintext
    router-group API  --host:--group-api-port          same credentials as ext_proc; off by default
    gRPC health       --host:--health-port (9003)      always plaintext: kubelet's gRPC probes cannot
                                                       use TLS (the Inference Extension does the same)
    admin HTTP        --admin-host:--admin-port        plaintext; off by default; mutating endpoints
                                                       need --admin-token

Graceful shutdown (`RunningPicker.stop`, on SIGTERM or SIGINT): with `--shutdown-delay-secs`, the
picker first reports not ready while it still routes new streams for that long (the gateway takes
it out before it refuses anything); then every listening port closes at
once, so that a replacement can start on the same ports while this process drains; in-flight
ext_proc and group API calls get `--shutdown-grace-secs` to finish and are then cancelled (the
service frees their requests; Envoy with failure_mode_allow carries on without the picker), then
discovery, the event sources and the picker stop and the process exits 0. A second signal cancels
at once. In detail: health turns NOT_SERVING (readiness, "", the ext_proc and inference-extension
services; a Watch hears it) and /readyz 503, then the health server stops and the admin server
stops listening; admin connections already open (a Prometheus scrape's keep-alive) are still
served, /readyz 503, until the end.

Why the ports close rather than say "not ready" for the whole drain: a replacement on the same host
(a supervisor restarting the picker, the soak) could otherwise not bind the health and admin ports
until the old process exits, up to the grace later. A probe now gets "connection refused", which
kubelet and load balancers take as not ready just as NOT_SERVING (kubelet does not run liveness
probes on a terminating pod, and each pod has its own ports); what is lost is only scraping
/metrics on a new connection during the drain, whose end is logged instead. SO_REUSEPORT was the
other way: old and new would listen side by side, and a probe or an admin call (a threshold set
through POST /busy_threshold) would land on either process at the kernel's choice, and any process
of the same user could take a share of the port; gRPC's default SO_REUSEPORT stays off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.admin.api import AdminServer, start_admin
from extproc.config import PickerConfig
from extproc.epp.service import ExtProcService
from extproc.epp.service_metrics import ServiceCollector
from extproc.events.sources import EventSources, start_event_sources
from extproc.groups import GroupApiServer, start_group_api
from extproc.picker.pipeline import EndpointPicker
from extproc.runtime.discovery import WorkerDiscovery, start_discovery
from extproc.runtime.engine_metrics import EngineMetricsScraper, start_engine_metrics
from extproc.runtime.h2_server import DEFAULT_MAX_STREAMS, H2GrpcServer
from extproc.runtime.lora_discovery import AdapterDiscovery, start_lora_discovery
from extproc.runtime.ports_file import write_ports_file
from extproc.runtime.readiness import Readiness
from extproc.runtime.tls import describe, server_credentials, server_pair, server_ssl_context
from extproc.runtime.wakeups import lazy_sleep
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.server")

HEALTH_SERVICES = (
    "",
    "liveness",
    "readiness",
    "envoy.service.ext_proc.v3.ExternalProcessor",
    "inference-extension",
)
EXT_PROC_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # grpcio's 4 MiB default is below Envoy's bodies
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a graceful stop did: ext_proc streams open when it began, and those cancelled at its end."""

    draining: int
    cancelled: int
    seconds: float


@dataclass
class RunningPicker:
    picker: EndpointPicker
    service: ExtProcService
    server: grpc.aio.Server | H2GrpcServer  # ext_proc's (--ext-proc-server)
    health_server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    health_port: int
    sources: EventSources
    admin: AdminServer | None = None
    discovery: WorkerDiscovery | None = None  # DNS / config-file workers, when configured
    engine_metrics: EngineMetricsScraper | None = None  # the workers' own load, when scraped
    lora_discovery: AdapterDiscovery | None = None  # the workers' LoRA adapters, when read
    readiness: Readiness | None = None
    readiness_task: asyncio.Task | None = None
    group_api: GroupApiServer | None = None  # --group-api-port: this picker's routers as a router group
    tls: str = "plaintext"  # how ext_proc and the group API listen (tls.describe)

    async def stop(
        self, grace_s: float = 5.0, *, delay_s: float = 0.0, cut_short: asyncio.Event | None = None
    ) -> DrainReport:
        """Stop gracefully: not ready at once; new ext_proc streams still routed for `delay_s`
        seconds (cut short by `cut_short`); then every listener closed at once, in-flight ext_proc
        streams given `grace_s` seconds (or until `cut_short` is set) to finish, the rest cancelled;
        then the admin server, discovery, the engine metrics scraper, LoRA discovery, the event
        sources and the picker stop."""
        started = time.monotonic()
        await self._report_draining()
        if delay_s > 0:
            await self._serve_not_ready(delay_s, cut_short)
        await self._release_side_ports()
        draining, cancelled = await self._drain(grace_s, cut_short)
        if self.admin is not None:
            await self.admin.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        if self.engine_metrics is not None:
            await self.engine_metrics.stop()
        if self.lora_discovery is not None:
            await self.lora_discovery.stop()
        await self.sources.stop()
        await self.picker.close()
        return DrainReport(draining, cancelled, time.monotonic() - started)

    async def _drain(self, grace_s: float, cut_short: asyncio.Event | None) -> tuple[int, int]:
        """Refuse new ext_proc and group API calls, wait up to `grace_s` (or until `cut_short`) for
        the open ones, then cancel the rest. Returns (ext_proc streams open at the start, cancelled)."""
        draining = self.service.open_streams
        if draining:
            log.info("draining %d ext_proc streams (grace %.0f s); new ones are refused", draining, grace_s)
        servers: list[grpc.aio.Server | H2GrpcServer] = [self.server]
        servers += [self.group_api.server] if self.group_api is not None else []
        # One stop per server at a time: grpc.aio can crash (SIGSEGV) when a second stop() overlaps
        # a pending one, so the grace is the stop's own; only a second signal stops again early.
        stopping = asyncio.ensure_future(self._stop_servers(servers, grace_s))
        hurry = asyncio.ensure_future(cut_short.wait()) if cut_short is not None else None
        await asyncio.wait(
            [stopping, *([hurry] if hurry else [])], timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
        )
        cancelled = 0
        if not stopping.done():
            cancelled = self.service.open_streams
            hurried = hurry is not None and hurry.done()
            if cancelled:
                why = "on a second signal" if hurried else f"after the {grace_s:.0f} s grace"
                log.warning("%d ext_proc streams cancelled %s; their requests are freed", cancelled, why)
            if hurried:
                await self._stop_servers(servers, None)  # a shorter grace wins: cancel the rest now
        await stopping
        if hurry is not None:
            hurry.cancel()
        if draining and not cancelled:
            log.info("all %d in-flight ext_proc streams finished", draining)
        return draining, cancelled

    async def _serve_not_ready(self, delay_s: float, cut_short: asyncio.Event | None) -> None:
        """Keep every server up for `delay_s` while health says NOT_SERVING: load balancers and the
        gateway stop sending here, and what they still send is routed, not refused."""
        log.info(
            "not ready; still routing new ext_proc streams for %.1f s (--shutdown-delay-secs) so that "
            "the gateway stops sending here first",
            delay_s,
        )
        hurry = cut_short if cut_short is not None else asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await hurry.wait()
        if hurry.is_set():
            log.warning("second signal: the shutdown delay is cut short")

    @staticmethod
    async def _stop_servers(servers: list[grpc.aio.Server | H2GrpcServer], grace_s: float | None) -> None:
        """Stop each (its listener closes at once), all at the same time: each server's grace is
        its in-flight calls', and no port waits for another server's drain."""
        await asyncio.gather(*(server.stop(grace_s) for server in servers))

    async def _release_side_ports(self) -> None:
        """Close the health and admin listeners (a replacement can bind them now); admin
        connections already open are still served until the admin server stops."""
        await self.health_server.stop(0)
        if self.admin is not None:
            for site in list(self.admin.runner.sites):
                await site.stop()

    async def _report_draining(self) -> None:
        """Readiness NOT_SERVING (gRPC health and /readyz); liveness stays SERVING until the end."""
        if self.readiness is not None:
            self.readiness.draining = True
        if self.readiness_task is not None:
            await cancel_and_wait(self.readiness_task)
        for name in HEALTH_SERVICES:
            if name != "liveness":
                await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)


async def start_picker(config: PickerConfig) -> RunningPicker:
    """Start the event sources and both servers (port 0 picks free ports); mark health SERVING.

    Raises TlsError (extproc.tls) for unusable certificate files, before anything starts.
    """
    pair = server_pair(config.tls, host=config.host)
    credentials = server_credentials(config.tls, pair)
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker)
    service = ExtProcService(
        picker,
        max_body_bytes=config.max_body_bytes,
        max_concurrent_streams=config.max_concurrent_streams,
        conformance_hooks=config.conformance_hooks,
    )
    picker.metrics.registry.register(ServiceCollector(service))
    health_server = grpc.aio.server(options=GRPC_OPTIONS)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
    health_port = _bind(health_server, f"{config.host}:{config.health_port}", None)
    server: grpc.aio.Server | H2GrpcServer
    if config.ext_proc_server == "h2":
        server = H2GrpcServer(
            EXT_PROC_METHOD,
            service.Process,
            pb.ProcessingRequest.FromString,
            max_message_bytes=max(MAX_MESSAGE_BYTES, config.max_body_bytes + (1 << 20)),
            max_concurrent_streams=max(DEFAULT_MAX_STREAMS, 2 * (config.max_concurrent_streams or 0)),
        )
        try:
            tls = server_ssl_context(config.tls, pair)
            port = await server.start(config.host, config.port, ssl_context=tls)
        except OSError:
            port = 0
    else:
        server = grpc.aio.server(options=GRPC_OPTIONS)
        pb_grpc.add_ExternalProcessorServicer_to_server(service, server)
        port = _bind(server, f"{config.host}:{config.port}", credentials)
    if not port or not health_port:
        if isinstance(server, H2GrpcServer):
            await server.stop(None)
        await sources.stop()
        raise OSError(f"cannot listen on {config.host}:{config.port} / {config.health_port}")
    if not isinstance(server, H2GrpcServer):
        await server.start()
    await health_server.start()
    readiness = Readiness(picker, sources)
    for name in HEALTH_SERVICES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = RunningPicker(
        picker, service, server, health_server, health_servicer, port, health_port, sources
    )
    running.readiness = readiness
    running.tls = describe(config.tls)
    try:
        running.discovery = await start_discovery(config, picker)
        running.engine_metrics = await start_engine_metrics(picker, config.engine_metrics)
        running.lora_discovery = await start_lora_discovery(picker, config.discovery)
        if running.lora_discovery is not None and picker.hierarchical:
            log.info("LoRA discovery reads this picker's own workers only: the adapters and other served "
                     "names of the router groups' workers are names here only when listed in "
                     "models[].lora-adapters or models[].aliases")  # fmt: skip
        if config.groups.api_port is not None:
            running.group_api = await start_group_api(
                picker.local, config.host, config.groups.api_port, credentials=credentials,
                before_decision=picker.hear_before_deciding,
            )  # fmt: skip
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
                engine_metrics=running.engine_metrics,
            )
    except BaseException:
        await running.stop(0)
        raise
    return running


def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Add a listening port (TLS with `credentials`); 0 when it cannot be bound."""
    try:
        if credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, credentials)
    except RuntimeError:  # newer grpcio raises instead of returning 0
        return 0


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
        await lazy_sleep(0.5, 0.5)  # a timer: readiness changes with no event to wait on


async def serve(config: PickerConfig, *, ports_file: str | None = None) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully within `config.shutdown_grace_s`.

    With `ports_file` (`serve --ports-file`), the bound ports are written there once every server
    listens (extproc.runtime.ports_file), for a parent that started this process with port 0.
    """
    running = await start_picker(config)
    if ports_file:
        write_ports_file(
            ports_file,
            {
                "port": running.port,
                "health_port": running.health_port,
                "admin_port": running.admin.port if running.admin is not None else None,
                "group_api_port": running.group_api.port if running.group_api is not None else None,
            },
        )
    mode = "KV events" if config.router.use_kv_events else "predicted from routing decisions (no KV events)"
    group_api = (
        f", router-group API on {config.host}:{running.group_api.port} ({running.tls})"
        if running.group_api is not None
        else ""
    )
    log.info(
        "ext_proc on %s:%d (%s, %s), health on %s:%d (plaintext)%s; %d workers over %d models; "
        "router mode %s, cache state %s",
        config.host,
        running.port,
        running.tls,
        "own HTTP/2 server" if config.ext_proc_server == "h2" else "grpcio",
        config.host,
        running.health_port,
        group_api,
        len(config.workers),
        len(config.models),
        config.router.mode,
        mode,
    )
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal(name: str) -> None:
        if not stop.is_set():
            delay = f"delay {config.shutdown_delay_s:g} s, " if config.shutdown_delay_s else ""
            log.info(
                "%s: shutting down (%sgrace %.0f s); not ready from now on",
                name, delay, config.shutdown_grace_s,
            )  # fmt: skip
            stop.set()
        else:
            log.warning("%s again: cancelling the remaining streams now", name)
            hurry.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    await stop.wait()
    report = await running.stop(config.shutdown_grace_s, delay_s=config.shutdown_delay_s, cut_short=hurry)
    log.info(
        "stopped in %.1f s: %d ext_proc streams were in flight, %d cancelled",
        report.seconds,
        report.draining,
        report.cancelled,
    )
