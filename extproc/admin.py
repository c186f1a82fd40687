"""The picker's admin HTTP server: `/metrics` (Prometheus), `/health` and `/debug/workers`.

Off unless `--admin-port` is given (port 0 picks a free one). Runs in the picker's event loop;
every handler only reads state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from extproc.events.sources import EventSources
from extproc.metrics import PickerCollector
from extproc.picker import EndpointPicker

log = logging.getLogger("extproc.admin")


@dataclass
class AdminServer:
    runner: web.AppRunner
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


def make_admin_app(picker: EndpointPicker, sources: EventSources) -> web.Application:
    registry = CollectorRegistry()
    registry.register(PickerCollector(picker, sources))

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def workers(_request: web.Request) -> web.Response:
        out = []
        for model, pool in picker.pools.items():
            router = pool.router
            for worker in router.workers():
                out.append(
                    {
                        "model": model,
                        "worker": str(worker.worker_id),
                        "dp_rank": worker.dp_rank,
                        "endpoint": pool.endpoint_of(worker),
                        "cache_source": sources.feed.state(worker),
                        "cached_blocks": router.indexer.num_blocks(worker),
                        "active_prefill_tokens": router.sequences.prefill_tokens(worker),
                        "active_decode_blocks": router.sequences.decode_blocks(worker),
                    }
                )
        return web.json_response({"workers": out, "kv_event_counters": sources.counters.snapshot()})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/debug/workers", workers)
    return app


async def start_admin(picker: EndpointPicker, sources: EventSources, host: str, port: int) -> AdminServer:
    runner = web.AppRunner(make_admin_app(picker, sources), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info("admin on http://%s:%d (/metrics, /health, /debug/workers)", host, bound)
    return AdminServer(runner, bound)
