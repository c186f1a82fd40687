"""The picker's admin HTTP server (aiohttp), off unless `--admin-port` is given (0 = a free port).

    GET  /metrics                 Prometheus: request path, routers, queues, sessions, KV events (and
                                  Dynamo's router metric names beside ours: dynamo_metrics.py; the
                                  Inference Extension's pool gauges: inference_extension_metrics.py)
    GET  /healthz                 liveness (the event loop answers); /health is an alias
    GET  /readyz                  200 when ready to route (see readiness.py), else 503 with the reason
    GET  /busy_threshold          {"thresholds": [record per configured model]}
    POST /busy_threshold          {"model": M} reads M's record; with threshold fields, sets them
                                  (a value of null clears that threshold)
    GET  /debug/workers           per worker: endpoint, cache source, cached blocks (offloaded ones per
                                  tier: host_pinned, disk, external), active load, the
                                  engine's own load (scraped: KV usage, running, waiting, age, fresh),
                                  which view the busy thresholds use, and with the timing prefill
                                  load model its learned pass-time model; per model the LoRA
                                  adapters and aliases requests may name (configured or listed by
                                  its workers)
    GET  /debug/dump_events       ?model=M: the KV events that rebuild M's indexer (engine-reported)
    GET  /debug/inference_resources  the InferenceObjectives and model rewrite rules in use (the
                                  last good reading of --inference-resources), in precedence order
    POST /debug/potential_loads   {"model", "prompt" | "messages" | "tokens", "cache_salt"?}: loads if
                                  sent, the credited overlap and the matched blocks per tier; at most
                                  MAX_POTENTIAL_LOADS_TOKENS tokens (400 beyond); a LoRA adapter's
                                  name as model matches its blocks on its base model's workers

A busy-threshold record is {"model", "active_decode_blocks_threshold", "active_prefill_tokens_threshold",
"active_prefill_tokens_threshold_frac"}, null when unset. Setting validates every value (fractions in
[0, 1], counts >= 0, or null to clear) and answers 400 with a message otherwise, 404 for a model not
served here.

Who may call what:
- Setting thresholds needs `Authorization: Bearer <token>` with `--admin-token` (the scheme in any
  case, RFC 7235; 401 otherwise). Without a token it is refused (403) unless
  `--admin-allow-unauthenticated-writes`; the picker says which at start.
- Reads (`GET`, a `POST /busy_threshold` without values) and `/debug/potential_loads` need nothing:
  the latter changes nothing and is bounded (MAX_POTENTIAL_LOADS_TOKENS tokens, its body parsed off
  the event loop when large, the tokenizer's own thread), so a call costs the loop a few ms at most.
Bodies are at most MAX_ADMIN_BODY bytes (413) and parsed like request bodies (`picker.bodies`): off
the event loop when large. The server binds to `--admin-host`, loopback by default.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extproc.admin.dynamo_metrics import DynamoMetricsCollector
from extproc.admin.inference_extension_metrics import InferenceExtensionMetricsCollector
from extproc.admin.metrics import PickerCollector
from extproc.config import WorkerConfig
from extproc.errors import PickerError, UnknownModel
from extproc.events.sources import EventSources
from extproc.picker.pipeline import EndpointPicker
from extproc.request.cache_metrics import TokenCacheCollector
from extproc.router import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    InvalidConfig,
    KvEvent,
    KvRouter,
    PrefillLoadModel,
    Worker,
)
from extproc.router.sequences import ActiveSequences
from extproc.runtime.engine_metrics import EngineMetricsScraper
from extproc.runtime.readiness import Readiness

log = logging.getLogger("extproc.admin")

THRESHOLD_FIELDS = (
    "active_decode_blocks_threshold",
    "active_prefill_tokens_threshold",
    "active_prefill_tokens_threshold_frac",
)
MAX_POTENTIAL_LOADS_TOKENS = 131_072  # a long context; matching it costs the loop ~3 ms
MAX_ADMIN_BODY = 2 * 1024 * 1024  # MAX_POTENTIAL_LOADS_TOKENS token ids written out, with room to spare


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
    allow_unauthenticated_writes: bool | None = None,
    engine_metrics: EngineMetricsScraper | None = None,
) -> web.Application:
    """The admin app. `allow_unauthenticated_writes` None: the picker's config decides
    (`--admin-allow-unauthenticated-writes`). `engine_metrics`: the scraper, for its per-worker state."""
    registry = picker.metrics.registry
    registry.register(PickerCollector(picker, sources))
    registry.register(DynamoMetricsCollector(picker))  # Dynamo's router metric names, same values
    registry.register(InferenceExtensionMetricsCollector(picker))  # the Inference Extension's pool gauges
    registry.register(
        TokenCacheCollector(lambda: {m: p.tokenizer.piece_cache_stats() for m, p in picker.pools.items()})
    )
    readiness = readiness or Readiness(picker, sources)
    if allow_unauthenticated_writes is None:
        allow_unauthenticated_writes = picker.config.admin_allow_unauthenticated_writes

    def check_token(request: web.Request) -> None:
        """With a token configured, the call must carry it (401 otherwise)."""
        if token is not None and not _bearer_matches(request.headers.get("Authorization", ""), token):
            raise _BadRequest(401, "this admin call needs 'Authorization: Bearer <admin token>'")

    def authorize_write(request: web.Request) -> None:
        if token is None and not allow_unauthenticated_writes:
            raise _BadRequest(
                403,
                "admin writes are refused: start the picker with --admin-token (or, to let anyone who "
                "reaches this port change routing, --admin-allow-unauthenticated-writes)",
            )
        check_token(request)

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
        body = await _json_object(request, picker)
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
        changes = {name: body[name] for name in THRESHOLD_FIELDS if name in body}  # null: clear it
        if not changes:
            return web.json_response(_record(model, pool.router.thresholds()))
        authorize_write(request)
        for name, value in changes.items():
            if value is not None:
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
            configs = pool.all_workers()
            roles = {wid: w.role for wid, w in configs.items()}
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
                        "offloaded_blocks": router.tiers.num_blocks(worker),  # per lower tier held
                        "active_prefill_tokens": router.sequences.prefill_tokens(worker),
                        "active_decode_blocks": router.sequences.decode_blocks(worker),
                        "active_requests": router.sequences.num_requests(worker),
                        "sessions_pinned": pins.get(worker, 0),
                        "pass_time": _pass_time(router.sequences, worker),
                        **_engine_load(router, worker, configs.get(str(worker.worker_id)), engine_metrics),
                    }
                )
        queues = {model: len(picker.gate(model)) for model in picker.pools}
        adapters = {model: picker.adapters(model) for model in picker.pools}
        aliases = {model: picker.aliases(model) for model in picker.pools}
        return web.json_response(
            {
                "workers": out,
                "queued": queues,
                "lora_adapters": adapters,
                "model_aliases": aliases,
                "kv_event_counters": sources.counters.snapshot(),
            }
        )

    async def inference_resources(_request: web.Request) -> web.Response:
        return web.json_response(inference_resources_record(picker))

    async def dump_events(request: web.Request) -> web.Response:
        model = request.query.get("model") or (next(iter(picker.pools)) if len(picker.pools) == 1 else None)
        if model is None:
            raise _BadRequest(400, f"give ?model=; known: {', '.join(picker.pools)}")
        pool = picker.pools.get(model)
        if pool is None:
            raise _BadRequest(404, f"model {model!r} is not served here")
        # The dump itself is read on the event loop (the tree must not change under it: 0.15 s at
        # 2^20 entries); its events are the dump's own, so turning them into JSON, 2.3 s of the
        # 2.5 s at that size, runs in a thread, in small steps: routing gets its turns meanwhile.
        events = pool.router.dump_events()
        body = await asyncio.to_thread(_dump_json, model, events)
        return web.Response(text=body, content_type="application/json")

    async def potential_loads(request: web.Request) -> web.Response:
        raw = await _read_body(request)
        try:
            body = await picker.bodies.json_object(
                raw, token_field="tokens", max_tokens=MAX_POTENTIAL_LOADS_TOKENS
            )
        except PickerError as exc:
            raise _BadRequest(400, exc.message) from None
        model = body.get("model")
        if not isinstance(model, str):
            raise _BadRequest(400, f"unknown or missing model {model!r}")
        try:
            pool, lora_name = picker.resolve_model(model)
        except UnknownModel:
            raise _BadRequest(404, f"unknown or missing model {model!r}") from None
        tokens = body.get("tokens")
        cache_salt = body.get("cache_salt")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise _BadRequest(400, "'cache_salt' must be a non-empty string")
        if tokens is None and ("messages" in body or "prompt" in body):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            try:
                parsed = await picker.bodies.request(raw, path)
                if not parsed.has_prompt:
                    raise _BadRequest(400, "the prompt holds too many JSON values to tokenize here")
                tokens = await pool.tokenizer.tokenize(parsed.request)
            except PickerError as exc:
                raise _BadRequest(400, exc.message) from None
            if len(tokens) > MAX_POTENTIAL_LOADS_TOKENS:
                raise _BadRequest(
                    400, f"the prompt has {len(tokens)} tokens; the limit is {MAX_POTENTIAL_LOADS_TOKENS}"
                )
        elif tokens is None:
            raise _BadRequest(400, "give 'tokens', 'messages' or 'prompt'")
        router = pool.router
        loads = router.get_potential_loads(tokens, lora_name=lora_name, cache_salt=cache_salt)
        hashes = router.block_hashes(tokens, lora_name=lora_name, cache_salt=cache_salt)
        tiers = router.tiers.match(router.indexer, hashes, router.find_matches(hashes))
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
                        "overlap_blocks": load.overlap_blocks,  # credited: device + weighted lower tiers
                        "tier_blocks": tiers.blocks(load.worker),  # matched blocks per tier
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
    app.router.add_get("/debug/inference_resources", inference_resources)
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
    engine_metrics: EngineMetricsScraper | None = None,
) -> AdminServer:
    app = make_admin_app(picker, sources, readiness=readiness, token=token, engine_metrics=engine_metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info("admin on http://%s:%d (/metrics, /healthz, /readyz, /busy_threshold, /debug/...)", host, bound)
    if token is not None:
        log.info("admin: changing busy thresholds needs the admin token")
    elif picker.config.admin_allow_unauthenticated_writes:
        log.warning(
            "admin: anyone who reaches http://%s:%d may change busy thresholds "
            "(--admin-allow-unauthenticated-writes, no --admin-token)",
            host,
            bound,
        )
    else:
        log.info("admin: changing busy thresholds is refused (403): no --admin-token")
    return AdminServer(runner, bound)


def _bearer_matches(authorization: str, token: str) -> bool:
    """Whether an Authorization header carries `token` in the Bearer scheme (any case, RFC 7235)."""
    scheme, _, credentials = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), token.encode())


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _BadRequest(413, f"the body is larger than {MAX_ADMIN_BODY} bytes") from None


async def _json_object(request: web.Request, picker: EndpointPicker) -> dict[str, Any]:
    """The request's JSON object body, parsed off the event loop when large."""
    raw = await _read_body(request)
    try:
        return await picker.bodies.json_object(raw)
    except PickerError as exc:
        raise _BadRequest(400, exc.message) from None


def _validate_threshold(name: str, value: Any) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if name == "active_prefill_tokens_threshold":
        if not (isinstance(value, int) and not isinstance(value, bool)) or value < 0:
            raise _BadRequest(400, f"{name} must be a token count (an integer >= 0), not {value!r}")
    elif not is_number or not 0 <= value <= 1:  # NaN and infinities fail the comparison too
        raise _BadRequest(400, f"{name} must be a fraction in [0, 1], not {value!r}")


def _record(model: str, thresholds: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, **{name: thresholds.get(name) for name in THRESHOLD_FIELDS}}


def _dump_json(model: str, events: list[KvEvent]) -> str:
    """`/debug/dump_events`' answer, as `web.json_response` writes it, written event by event: one
    `json.dumps` holds the interpreter for the whole call (1.1 s at 2^20 entries), even in a thread."""
    dumps = json.dumps
    parts = ", ".join([dumps(_event_json(e)) for e in events])
    return f'{{"model": {dumps(model)}, "events": [{parts}]}}'


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


def inference_resources_record(picker: EndpointPicker) -> dict[str, Any]:
    """What `--inference-resources` gave the picker, as it uses it now (the last good reading)."""
    file = picker.inference.file
    if file is None:
        return {"file": None}
    resources = file.resources
    return {
        "file": file.path,
        "pool": {"name": file.pool.name, "namespace": file.pool.namespace, "group": file.pool.group},
        "readings": file.readings,
        "objectives": dict(sorted(resources.priorities.items())),
        "model_rewrites": [
            {
                "rewrite": rule.rewrite,
                "models": sorted(rule.models),
                "targets": [{"model": t.model, "weight": t.weight} for t in rule.targets],
            }
            for rule in resources.rewrites
        ],
        "left_out": list(resources.left_out),
    }


def _engine_load(
    router: KvRouter, worker: Worker, config: WorkerConfig | None, scraper: EngineMetricsScraper | None
) -> dict[str, Any]:
    """The engine's own load as last scraped, and the view the busy thresholds take now: "engine"
    while its report is fresh, else "router" (what this router routed over `total-blocks`)."""
    report = router.reported.get(worker)
    age = router.reported.age_s(worker)
    fresh = router.reported.fresh_kv_usage(worker) is not None
    state = scraper.state(config) if scraper is not None and config is not None else None
    return {
        "engine_load": None
        if report is None
        else {
            "kv_usage": report.kv_usage,
            "running": report.running,
            "waiting": report.waiting,
            "age_s": round(age, 3) if age is not None else None,
            "stale": age is not None and age > report.max_age_s,  # the router's own view is used then
        },
        "engine_metrics": None
        if scraper is None
        else {
            "url": state.url if state else (scraper.url_of(config) if config is not None else None),
            "state": "pending" if state is None or state.ok is None else ("ok" if state.ok else "failing"),
            "engine": state.engine if state else None,
            "error": state.error if state else None,
            "failures_in_a_row": state.failures if state else 0,
        },
        "busy_view": "engine" if fresh else "router",
    }


def _pass_time(sequences: ActiveSequences, worker: Worker) -> dict[str, Any] | None:
    """The pass-time model the timing (or aic) prefill load model predicts `worker` with: the configured
    one scaled by what its first tokens showed (`extproc.router.pass_time`); None with `none`."""
    if sequences.prefill_load_model not in (PrefillLoadModel.TIMING, PrefillLoadModel.AIC):
        return None
    timing = sequences.timing(worker)
    learned = sequences.learned_pass_time(worker)
    return {
        "scale": learned.scale if learned else 1.0,  # x the configured model's pass times
        "samples": learned.samples if learned else 0,
        "last_ratio": learned.last_ratio if learned else None,  # observed / predicted time to first token
        "prefill_ms": [timing.prefill_quadratic_ms, timing.prefill_linear_ms, timing.prefill_constant_ms],
        "decode_ms": [timing.decode_quadratic_ms, timing.decode_linear_ms, timing.decode_constant_ms],
        "full_pass_ms": timing.prefill_ms(timing.max_num_batched_tokens),
        # a fleet learned to mix speeds: costs add the delay a prompt imposes on later arrivals here
        "mixed_fleet": sequences.counts_delay_behind,
        "arrivals_per_s": round(sequences.arrivals_per_s(worker), 3),
    }
