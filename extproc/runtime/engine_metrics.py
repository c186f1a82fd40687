"""The engines' own load, scraped: each worker's Prometheus endpoint read at an interval, its KV cache
usage, running and waiting requests handed to the router (`KvRouter.set_reported_load`).

Owns the scrape loop, its HTTP client and the per-endpoint scrape state; owns no routing state (the
router keeps the reports and decides freshness, extproc/router/reported.py). Mirrors what the
Inference Extension's pickers read (vLLM's and SGLang's gauges, by name) and stands in for the
`ForwardPassMetrics` Dynamo's workers publish.

Metric names, checked against the engines' code (fixtures: tests/runtime/engine_metrics/):

    vLLM 0.33.0   vllm:kv_cache_usage_perc (0..1; before the V1 engine vllm:gpu_cache_usage_perc),
                  vllm:num_requests_running, vllm:num_requests_waiting; label engine = engine index
    SGLang 0.5.23 sglang:token_usage (0..1), sglang:num_running_reqs, sglang:num_queue_reqs;
                  label dp_rank under DP attention; with priority scheduling the total is the series
                  priority="" and per-priority series sit beside it (skipped here)

A worker with several dp ranks takes each rank's numbers from the series whose rank label is that
rank; otherwise every series of the endpoint is combined (KV usage: mean over engines; requests:
sum), and series repeated per tensor/pipeline rank count once (the highest value).

Bounds, whatever an endpoint does: one GET per endpoint per round, at most MAX_CONCURRENT_SCRAPES
at once; each within `timeout_s` (connect, headers and body); a body over `max_bytes` is not read
further; no redirects, no compression (Accept-Encoding: identity, nothing decompressed); only the
lines that start with the names above are parsed (found with `bytes.find`: a vLLM body of 50 KB in
about 60 us, 170 with one pattern run over every line). An endpoint that fails (refused, a
timeout, 404, a body without these gauges) is logged once, and once more when it recovers; its
workers' reports go stale after STALE_AFTER_INTERVALS intervals and the router falls back to its
own view.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extproc.config import EngineMetricsConfig, WorkerConfig
from extproc.config.engine_metrics import MAX_CONCURRENT_SCRAPES
from extproc.router import KvRouter, Worker
from extproc.runtime.bounded_get import FetchFailed, bounded_get, bounded_session
from extproc.runtime.rounds import Rounds

log = logging.getLogger("extproc.engine_metrics")

KV_USAGE, RUNNING, WAITING = "kv_usage", "running", "waiting"
METRICS: dict[str, tuple[str, str]] = {  # name -> (engine, what)
    "vllm:kv_cache_usage_perc": ("vllm", KV_USAGE),
    "vllm:gpu_cache_usage_perc": ("vllm", KV_USAGE),  # vLLM's V0 engine (up to 0.10)
    "vllm:num_requests_running": ("vllm", RUNNING),
    "vllm:num_requests_waiting": ("vllm", WAITING),
    "sglang:token_usage": ("sglang", KV_USAGE),
    "sglang:num_running_reqs": ("sglang", RUNNING),
    "sglang:num_queue_reqs": ("sglang", WAITING),
}
RANK_LABELS = {"vllm": "engine", "sglang": "dp_rank"}
_SAMPLE = re.compile(
    rb"^(" + b"|".join(re.escape(n.encode()) for n in METRICS) + rb")(?:\{([^}\n]*)\})?[ \t]+([^ \t\r\n]+)",
    re.MULTILINE,
)
_LABEL = re.compile(rb'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\\n]|\\.)*)"')
_NAMES = tuple(name.encode() for name in METRICS)
_LINE_STARTS = tuple(b"\n" + name for name in _NAMES)  # where a wanted sample line may start


def _samples(body: bytes) -> list[re.Match[bytes]]:
    """`_SAMPLE.finditer(body)`, in the same order, without running the pattern at every line of a
    body whose few wanted lines sit among thousands (vLLM's histograms): each name is looked for with
    `bytes.find`, at the start of the body and after a newline, and the pattern runs only there."""
    starts = {0} if body.startswith(_NAMES) else set()
    for needle in _LINE_STARTS:
        at = body.find(needle)
        while at >= 0:
            starts.add(at + 1)
            at = body.find(needle, at + len(needle))
    return [m for m in (_SAMPLE.match(body, at) for at in sorted(starts)) if m is not None]


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's (or one rank's) load as its metrics say; None where a gauge is absent."""

    engine: str  # vllm | sglang
    kv_usage: float | None
    running: int | None
    waiting: int | None


def parse_engine_metrics(body: bytes) -> dict[str, EngineLoad]:
    """The load gauges of a Prometheus text exposition, per rank label value ('' without one).

    Only vLLM's and SGLang's names (METRICS) are read; anything else, malformed lines and values
    that are not finite numbers >= 0 are skipped. Empty when the body has none of them.
    """
    found: dict[tuple[str, str], dict[str, float]] = {}
    legacy_kv: dict[tuple[str, str], float] = {}
    for match in _samples(body):
        name, labels_text, value_text = match.groups()
        try:
            value = float(value_text)
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            continue
        engine, what = METRICS[name.decode()]
        labels = {k.decode(): v.decode(errors="replace") for k, v in _LABEL.findall(labels_text or b"")}
        if labels.get("priority"):
            continue  # SGLang's per-priority breakdown; the total is priority=""
        key = (engine, labels.get(RANK_LABELS[engine], ""))
        if name == b"vllm:gpu_cache_usage_perc":
            legacy_kv[key] = max(value, legacy_kv.get(key, 0.0))
            continue
        values = found.setdefault(key, {})
        values[what] = max(value, values.get(what, 0.0))  # a series per tp/pp rank repeats the numbers
    for key, value in legacy_kv.items():
        found.setdefault(key, {}).setdefault(KV_USAGE, value)
    out = {}
    for (engine, rank), values in found.items():
        out[rank] = EngineLoad(
            engine,
            values.get(KV_USAGE),
            round(values[RUNNING]) if RUNNING in values else None,
            round(values[WAITING]) if WAITING in values else None,
        )
    return out


def loads_by_dp_rank(parsed: Mapping[str, EngineLoad], dp_ranks: Sequence[int]) -> dict[int, EngineLoad]:
    """Each dp rank's load: its own series when the worker has several ranks and the engine labels
    them, else every series combined (KV usage averaged, requests summed) for every rank."""
    if not parsed:
        return {}
    if len(dp_ranks) > 1 and all(str(r) in parsed for r in dp_ranks):
        return {r: parsed[str(r)] for r in dp_ranks}
    loads = list(parsed.values())
    usages = [x.kv_usage for x in loads if x.kv_usage is not None]
    running = [x.running for x in loads if x.running is not None]
    waiting = [x.waiting for x in loads if x.waiting is not None]
    combined = EngineLoad(
        loads[0].engine,
        sum(usages) / len(usages) if usages else None,
        sum(running) if running else None,
        sum(waiting) if waiting else None,
    )
    return dict.fromkeys(dp_ranks, combined)


ScrapeFailed = FetchFailed  # a scrape got no usable load: the message says why (status, timeout, size)


@dataclass
class EndpointState:
    """What the last scrapes of one metrics URL did."""

    url: str
    ok: bool | None = None  # None until the first scrape ends
    engine: str | None = None
    error: str | None = None
    failures: int = 0  # in a row


class WorkerPools(Protocol):
    """What the scraper reads: `EndpointPicker` satisfies it (each pool's `all_workers`, `router_for`)."""

    @property
    def pools(self) -> Mapping[str, Any]: ...


class EngineMetricsScraper(Rounds):
    """Scrapes every worker's metrics endpoint each `config.interval_s` and reports to its router."""

    def __init__(self, target: WorkerPools, config: EngineMetricsConfig) -> None:
        super().__init__("engine-metrics", config.interval_s, log)
        self.config = config
        self._target = target
        self._states: dict[str, EndpointState] = {}
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)

    def url_of(self, worker: WorkerConfig) -> str:
        host = worker.endpoint.rsplit(":", 1)[0]  # an IPv6 address keeps its brackets
        port = self.config.port if self.config.port is not None else worker.endpoint.rsplit(":", 1)[1]
        return f"http://{host}:{port}{self.config.path}"

    def state(self, worker: WorkerConfig) -> EndpointState | None:
        """The scrape state of the worker's metrics URL (None before its first round)."""
        return self._states.get(self.url_of(worker))

    async def one_round(self) -> None:
        await self.scrape_once()

    async def scrape_once(self) -> None:
        """One round: every metrics URL once (at most MAX_CONCURRENT_SCRAPES at a time)."""
        by_url: dict[str, list[tuple[WorkerConfig, KvRouter]]] = {}
        for pool in self._target.pools.values():
            for worker in pool.all_workers().values():
                by_url.setdefault(self.url_of(worker), []).append((worker, pool.router_for(worker)))
        for url in set(self._states) - set(by_url):
            del self._states[url]  # its workers left
        await asyncio.gather(*(self._scrape(url, workers) for url, workers in by_url.items()))

    async def _scrape(self, url: str, workers: list[tuple[WorkerConfig, KvRouter]]) -> None:
        state = self._states.setdefault(url, EndpointState(url))
        async with self._slots:
            try:
                parsed = parse_engine_metrics(await self._fetch(url))
                if not parsed:
                    raise ScrapeFailed("no vLLM or SGLang load gauges in the body")
            except ScrapeFailed as exc:
                self._failed(state, workers, str(exc))
                return
        for worker, router in workers:
            for dp_rank, load in loads_by_dp_rank(parsed, worker.dp_ranks).items():
                router.set_reported_load(
                    Worker(worker.id, dp_rank),
                    kv_usage=load.kv_usage,
                    running=load.running,
                    waiting=load.waiting,
                    max_age_s=self.config.stale_after_s,
                )
        if state.ok is False:
            log.info("engine metrics of %s at %s: reading again", _names(workers), url)
        state.ok, state.error, state.failures = True, None, 0
        state.engine = next(iter(parsed.values())).engine

    async def _fetch(self, url: str) -> bytes:
        """The body at `url`, at most max_bytes, within timeout_s. Raises ScrapeFailed."""
        if self._session is None:
            self._session = bounded_session(self.config.timeout_s, MAX_CONCURRENT_SCRAPES)
        return await bounded_get(
            self._session, url, max_bytes=self.config.max_bytes, accept="text/plain;version=0.0.4"
        )

    def _failed(self, state: EndpointState, workers: list[tuple[WorkerConfig, KvRouter]], error: str) -> None:
        if state.ok is not False:  # once per failing spell, not once per scrape
            log.warning(
                "engine metrics of %s at %s: %s; busy thresholds use the router's own view for it "
                "until it answers (logged again only when it does)",
                _names(workers),
                state.url,
                error,
            )
        state.ok, state.error = False, error
        state.failures += 1


def _names(workers: list[tuple[WorkerConfig, KvRouter]]) -> str:
    return ", ".join(sorted({w.id for w, _ in workers}))


async def start_engine_metrics(
    target: WorkerPools, config: EngineMetricsConfig
) -> EngineMetricsScraper | None:
    """Start scraping when `config.interval_s` > 0; None when it is off."""
    if not config.enabled:
        return None
    scraper = EngineMetricsScraper(target, config)
    scraper.start()
    log.info(
        "engine metrics: each worker's %s every %g s (timeout %g s, at most %d bytes); stale after %g s",
        config.path if config.port is None else f":{config.port}{config.path}",
        config.interval_s,
        config.timeout_s,
        config.max_bytes,
        config.stale_after_s,
    )
    return scraper
