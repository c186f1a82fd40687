"""The picker's admin HTTP server (aiohttp), off unless `--admin-port` is given (0 = a free port).

    GET  /metrics                 Prometheus: request path, routers, queues, sessions, KV events
    GET  /healthz                 liveness (the event loop answers); /health is an alias
    GET  /readyz                  200 when ready to route (see readiness.py), else 503 with the reason
    GET  /busy_threshold          {"thresholds": [record per configured model]}
    POST /busy_threshold          {"model": M} reads M's record; with threshold fields, sets them
    GET  /debug/workers           per worker: endpoint, cache source, cached blocks, active load
    GET  /debug/dump_events       ?model=M: the KV events that rebuild M's indexer (engine-reported)
    POST /debug/potential_loads   {"model", "prompt" | "messages" | "tokens", "cache_salt"?}: loads if sent

A busy-threshold record is {"model", "active_decode_blocks_threshold", "active_prefill_tokens_threshold",
"active_prefill_tokens_threshold_frac"}, null when unset. Setting validates every value (fractions in
[0, 1], counts >= 0) and answers 400 with a message otherwise, 404 for a model not served here.
With `--admin-token`, mutating calls need `Authorization: Bearer <token>` (401 otherwise). The
server binds to `--admin-host`, loopback by default.
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extproc.admin.metrics import PickerCollector
from extproc.errors import PickerError, UnknownModel
from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker
from extproc.request.parse import parse_openai_body
from extproc.router import AllBlocksCleared, BlocksRemoved, BlocksStored, InvalidConfig, KvEvent
from extproc.runtime.readiness import Readiness

log = logging.getLogger("extproc.admin")

THRESHOLD_FIELDS = (
    "active_decode_blocks_threshold",
    "active_prefill_tokens_threshold",
    "active_prefill_tokens_threshold_frac",
)
MAX_ADMIN_BODY = 8 * 1024 * 1024


@dataclass
class AdminServer:
    runner: web.AppRunner
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def make_admin_app(
    picker: EndpointPicker,
    sources: EventSources,
    *,
    readiness: Readiness | None = None,
    token: str | None = None,
) -> web.Application:
    registry = picker.metrics.registry
    registry.register(PickerCollector(picker, sources))
    readiness = readiness or Readiness(picker, sources)

    def authorize(request: web.Request) -> None:
        if token is None:
            return
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise _BadRequest(401, "this admin call needs 'Authorization: Bearer <admin token>'")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        report = readiness.check()
        return web.json_response(report.as_json(), status=200 if report.ready else 503)

    async def list_thresholds(_request: web.Request) -> web.Response:
        records = [_record(model, pool.router.thresholds()) for model, pool in picker.pools.items()]
        return web.json_response({"thresholds": records})

    async def busy_threshold(request: web.Request) -> web.Response:
        body = await _json_object(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _BadRequest(400, "'model' must be a non-empty string")
        pool = picker.pools.get(model)
        if pool is None:
            raise _BadRequest(404, f"model {model!r} is not served here; known: {', '.join(picker.pools)}")
        unknown = sorted(set(body) - {"model", *THRESHOLD_FIELDS})
        if unknown:
            accepted = ", ".join(("model", *THRESHOLD_FIELDS))
            raise _BadRequest(400, f"unknown fields {unknown}; accepted: {accepted}")
        changes = {name: body[name] for name in THRESHOLD_FIELDS if body.get(name) is not None}
        if not changes:
            return web.json_response(_record(model, pool.router.thresholds()))
        authorize(request)
        for name, value in changes.items():
            _validate_threshold(name, value)
        try:
            record = picker.set_thresholds(model, **changes)
        except InvalidConfig as exc:
            raise _BadRequest(400, str(exc)) from None
        log.info("admin: busy thresholds of %s set to %s", model, record)
        return web.json_response(_record(model, record))

    async def workers(_request: web.Request) -> web.Response:
        out = []
        for model, pool in picker.pools.items():
            pins = picker.sessions(model).by_worker()
            roles = {wid: w.role for wid, w in pool.all_workers().items()}
            for router, worker in [(r, w) for r in pool.routers() for w in r.workers()]:
                out.append(
                    {
                        "model": model,
                        "worker": str(worker.worker_id),
                        "role": roles.get(str(worker.worker_id), "both"),
                        "dp_rank": worker.dp_rank,
                        "endpoint": pool.endpoint_of(worker),
                        "cache_source": sources.feed.state(worker),
                        "cache_source_reason": sources.feed.reason(worker),
                        "cached_blocks": router.indexer.num_blocks(worker),
                        "active_prefill_tokens": router.sequences.prefill_tokens(worker),
                        "active_decode_blocks": router.sequences.decode_blocks(worker),
                        "sessions_pinned": pins.get(worker, 0),
                    }
                )
        queues = {model: len(picker.gate(model)) for model in picker.pools}
        return web.json_response(
            {"workers": out, "queued": queues, "kv_event_counters": sources.counters.snapshot()}
        )

    async def dump_events(request: web.Request) -> web.Response:
        model = request.query.get("model") or (next(iter(picker.pools)) if len(picker.pools) == 1 else None)
        if model is None:
            raise _BadRequest(400, f"give ?model=; known: {', '.join(picker.pools)}")
        pool = picker.pools.get(model)
        if pool is None:
            raise _BadRequest(404, f"model {model!r} is not served here")
        events = [_event_json(e) for e in pool.router.dump_events()]
        return web.json_response({"model": model, "events": events})

    async def potential_loads(request: web.Request) -> web.Response:
        body = await _json_object(request)
        model = body.get("model")
        pool = picker.pools.get(model) if isinstance(model, str) else None
        if pool is None:
            raise _BadRequest(404 if isinstance(model, str) else 400, f"unknown or missing model {model!r}")
        tokens = body.get("tokens")
        cache_salt = body.get("cache_salt")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise _BadRequest(400, "'cache_salt' must be a non-empty string")
        if tokens is not None:
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in tokens
            ):
                raise _BadRequest(400, "'tokens' must be a list of token ids (integers in [0, 2**32))")
        elif "messages" in body or "prompt" in body:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            try:
                parsed = parse_openai_body(json.dumps(body).encode(), path, max_bytes=MAX_ADMIN_BODY)
                tokens = await pool.tokenizer.tokenize(parsed)
            except PickerError as exc:
                raise _BadRequest(400, exc.message) from None
        else:
            raise _BadRequest(400, "give 'tokens', 'messages' or 'prompt'")
        loads = pool.router.get_potential_loads(tokens, cache_salt=cache_salt)
        return web.json_response(
            {
                "model": model,
                "tokens": len(tokens),
                "block_size": pool.router.config.block_size,
                "loads": [
                    {
                        "worker": str(load.worker.worker_id),
                        "dp_rank": load.worker.dp_rank,
                        "endpoint": pool.endpoint_of(load.worker),
                        "overlap_blocks": load.overlap_blocks,
                        "potential_prefill_tokens": load.prefill_tokens,
                        "potential_decode_blocks": load.decode_blocks,
                    }
                    for load in loads
                ],
            }
        )

    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except _BadRequest as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
        except UnknownModel as exc:
            return web.json_response({"error": exc.message}, status=404)

    app = web.Application(middlewares=[errors], client_max_size=MAX_ADMIN_BODY)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/health", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/busy_threshold", list_thresholds)
    app.router.add_post("/busy_threshold", busy_threshold)
    app.router.add_get("/debug/workers", workers)
    app.router.add_get("/debug/dump_events", dump_events)
    app.router.add_post("/debug/potential_loads", potential_loads)
    return app


async def start_admin(
    picker: EndpointPicker,
    sources: EventSources,
    host: str,
    port: int,
    *,
    readiness: Readiness | None = None,
    token: str | None = None,
) -> AdminServer:
    app = make_admin_app(picker, sources, readiness=readiness, token=token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info(
        "admin on http://%s:%d (/metrics, /healthz, /readyz, /busy_threshold, /debug/...)%s",
        host,
        bound,
        "; mutations need the admin token" if token else "",
    )
    return AdminServer(runner, bound)


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply, too many digits
        raise _BadRequest(400, "the body must be a JSON object") from None
    except web.HTTPRequestEntityTooLarge:
        raise _BadRequest(413, f"the body is larger than {MAX_ADMIN_BODY} bytes") from None
    if not isinstance(body, dict):
        raise _BadRequest(400, "the body must be a JSON object")
    return body


def _validate_threshold(name: str, value: Any) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if name == "active_prefill_tokens_threshold":
        if not (isinstance(value, int) and not isinstance(value, bool)) or value < 0:
            raise _BadRequest(400, f"{name} must be a token count (an integer >= 0), not {value!r}")
    elif not is_number or not 0 <= value <= 1:  # NaN and infinities fail the comparison too
        raise _BadRequest(400, f"{name} must be a fraction in [0, 1], not {value!r}")


def _record(model: str, thresholds: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, **{name: thresholds.get(name) for name in THRESHOLD_FIELDS}}


def _event_json(event: KvEvent) -> dict[str, Any]:
    worker = {"worker": str(event.worker.worker_id), "dp_rank": event.worker.dp_rank}
    if isinstance(event, BlocksStored):
        return {
            "type": "stored",
            **worker,
            "parent_hash": event.parent_hash,
            "blocks": [{"block_hash": b.engine_hash, "tokens_hash": b.local_hash} for b in event.blocks],
        }
    if isinstance(event, BlocksRemoved):
        return {"type": "removed", **worker, "block_hashes": list(event.engine_hashes)}
    assert isinstance(event, AllBlocksCleared)
    return {"type": "cleared", **worker}
