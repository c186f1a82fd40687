"""Disaggregated prefill/decode roles of the mock worker: remote prefill, simulated KV transfer.

Owns what a worker does with the prefill header and with prefill requests. The convention is
vLLM's NIXL connector as its disaggregated proxy drives it (vLLM
`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`; llm-d's routing sidecar does the same
on the decode pod), with the prefill worker named by a request header as llm-d's picker does:

1. The picker sends the request to a decode worker with `x-prefill-endpoint: <ip:port>`.
2. The decode worker (role decode or both) sends that prefill worker the same body on the same path
   with `max_tokens: 1` (and `max_completion_tokens: 1` if set), `stream: false`, no
   `stream_options` and `kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false,
   ...}` (`prefill_request_body`).
3. The prefill worker prefills the prompt in its engine as usual (its blocks are cached and
   published as KV events) and answers one token plus `kv_transfer_params` naming its blocks
   (`prefill_answer_params`: `do_remote_prefill`, `remote_engine_id`, `remote_block_ids` = the
   engine block hashes of its KV events, `remote_host`, `remote_port`, `remote_block_size`,
   `num_blocks`).
4. The decode worker waits the simulated transfer of the blocks it does not cache yet
   (`extproc.sim.transfer.KvTransferModel`, the replay's model too: `--kv-transfer-base-ms` +
   `--kv-transfer-ms-per-block` x blocks, simulated ms: divided by `speedup` like pass times),
   lands them in its own pool (`Engine.receive_blocks`: stored, so it publishes BlockStored for
   them as vLLM's decode side does) and generates; admission then finds them cached and computes
   only the rest of the prompt (at least its last token).

A failed prefill (refused, timed out, non-2xx, no `kv_transfer_params`) is logged and the decode
worker prefills locally; a header naming this very worker, a prefill-role worker and a prefill
request itself are served locally. Every generation answer says which in `x-prefill-source`
(`remote`, `local`, `local-fallback`), counted in `extproc_mock_prefill_requests_total`. A client
that leaves while its prefill is remote cancels that call too (the prefill worker frees it).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.sim.engine import Engine
from extproc.sim.transfer import KvTransferModel, add_kv_transfer_arguments, kv_transfer_from_args

log = logging.getLogger(__name__)

BOTH, PREFILL, DECODE = "both", "prefill", "decode"
ROLES = (BOTH, PREFILL, DECODE)
REMOTE, LOCAL, LOCAL_FALLBACK = "remote", "local", "local-fallback"
PREFILL_SOURCES = (REMOTE, LOCAL, LOCAL_FALLBACK)
PREFILL_SOURCE_HEADER = "x-prefill-source"
DEFAULT_PREFILL_ENDPOINT_HEADER = "x-prefill-endpoint"

TRANSFER_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class DisaggWorkerConfig:
    """A worker's role and its decode side's remote prefill; defaults keep it aggregated."""

    role: str = BOTH  # prefill | decode | both: see the module docstring for what each does
    prefill_endpoint_header: str = DEFAULT_PREFILL_ENDPOINT_HEADER
    kv_transfer: KvTransferModel = field(default_factory=KvTransferModel)  # simulated transfer time
    remote_prefill_timeout_s: float = 60.0  # real seconds for the whole prefill call

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not self.prefill_endpoint_header.strip():
            raise ValueError("prefill_endpoint_header must be a header name, got an empty string")
        if not self.remote_prefill_timeout_s > 0:
            raise ValueError(
                f"remote_prefill_timeout_s must be positive, got {self.remote_prefill_timeout_s!r}"
            )


class PrefillFailed(Exception):
    """The remote prefill gave no usable answer (refused, timed out, non-2xx, no transfer params)."""


class EngineClock(Protocol):
    """What the decode side needs from the worker's engine driver (`EngineDriver` fits)."""

    engine: Engine
    speedup: float

    def now_ms(self) -> float: ...


def wants_remote_decode(body: Mapping[str, Any]) -> bool:
    """The body is a prefill request from a decode side (`kv_transfer_params.do_remote_decode`)."""
    params = body.get("kv_transfer_params")
    return isinstance(params, dict) and params.get("do_remote_decode") is True


def prefill_request_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body a decode worker sends its prefill worker: vLLM's disaggregated proxy's rewrite."""
    out = dict(body)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return out


def _local_address(request: web.Request) -> tuple[str, int] | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        return None
    return str(sockname[0]), int(sockname[1])


def _split_endpoint(value: str) -> tuple[str, int] | None:
    """(host, port) of `ip:port`, `[v6]:port` or a URL; None when it names no host and port."""
    try:
        parts = urllib.parse.urlsplit(value if "://" in value else f"//{value}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    return (host, port) if host and port else None


def _same_endpoint(target: tuple[str, int], here: tuple[str, int]) -> bool:
    """`target` (from the header) is `here` (this connection's local address)."""
    (host, port), (local_host, local_port) = target, here
    if port != local_port:
        return False
    if host in (local_host, "localhost"):
        return True
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(local_host)
    except ValueError:
        return False


class DisaggMetrics:
    """The role and the decode side's prefill sources and transfers, in the worker's registry."""

    def __init__(self, registry: CollectorRegistry, model: str, role: str) -> None:
        labels = ["model_name"]
        Gauge(
            "extproc_mock_worker_role",
            "This worker's disaggregation role (prefill, decode or both), as a label of a constant 1.",
            [*labels, "role"],
            registry=registry,
        ).labels(model, role).set(1)
        sources = Counter(
            "extproc_mock_prefill_requests",
            "Generation requests by where their prompt was prefilled: remote (a prefill worker, then "
            "a KV transfer), local, or local-fallback (the remote prefill failed).",
            [*labels, "source"],
            registry=registry,
        )
        self.sources = {source: sources.labels(model, source) for source in PREFILL_SOURCES}
        self.transfer_blocks = Counter(
            "extproc_mock_kv_transfer_blocks",
            "KV blocks received from prefill workers (those this worker did not cache already).",
            labels,
            registry=registry,
        ).labels(model)
        self.transfer_seconds = Histogram(
            "extproc_mock_kv_transfer_simulated_seconds",
            "Each KV transfer from a prefill worker, in seconds of the worker's simulated clock.",
            labels,
            buckets=TRANSFER_BUCKETS_S,
            registry=registry,
        ).labels(model)


class Disaggregation:
    """One worker's part in disaggregated serving: answers prefill requests, prefills remotely."""

    def __init__(
        self,
        config: DisaggWorkerConfig,
        *,
        worker_id: str,
        model: str,
        block_size: int,
        registry: CollectorRegistry,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.block_size = block_size
        self.metrics = DisaggMetrics(registry, model, config.role)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def prefill_answer_params(self, request: web.Request, token_ids: Sequence[int]) -> dict[str, Any]:
        """The `kv_transfer_params` a prefill answer carries: where its prompt blocks are."""
        block_ids = compute_sequence_hashes(compute_block_hashes(list(token_ids), self.block_size))
        host, port = _local_address(request) or (None, None)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.worker_id,
            "remote_block_ids": block_ids,
            "remote_host": host,
            "remote_port": port,
            "remote_block_size": self.block_size,
            "num_blocks": len(block_ids),
        }

    async def prefill(
        self, request: web.Request, body: Mapping[str, Any], token_ids: Sequence[int], driver: EngineClock
    ) -> str:
        """Get the prompt's KV before it is queued here; returns its prefill source.

        Remote: the prefill worker's call and the simulated transfer are awaited here, then the
        received blocks are in the engine's pool. Local or local-fallback: nothing changed. Holds
        no engine state while it waits, so a cancelled client leaks nothing here.
        """
        endpoint = self._prefill_endpoint(request, body)
        if endpoint is None:
            self.metrics.sources[LOCAL].inc()
            return LOCAL
        try:
            remote_tokens = await self._remote_prefill(endpoint, request.path, body)
        except PrefillFailed as exc:
            log.warning("remote prefill on %s failed (%s); prefilling locally", endpoint, exc)
            self.metrics.sources[LOCAL_FALLBACK].inc()
            return LOCAL_FALLBACK
        start_ms = driver.now_ms()
        salt = body.get("cache_salt")  # the prefill worker hashed the prompt under it too
        salt = salt if isinstance(salt, str) and salt else None
        hashes = driver.engine.transferable_blocks(token_ids, salt)[: remote_tokens // self.block_size]
        missing = len(hashes) - driver.engine.cache.match_prefix(hashes)
        await asyncio.sleep(self.config.kv_transfer.duration_ms(missing) / 1000.0 / driver.speedup)
        elapsed_ms = driver.now_ms() - start_ms
        if not driver.engine.receive_blocks(hashes, token_ids, salt):
            log.warning("no room for %d received blocks; the engine recomputes them", len(hashes))
        self.metrics.transfer_blocks.inc(missing)
        self.metrics.transfer_seconds.observe(elapsed_ms / 1000.0)
        self.metrics.sources[REMOTE].inc()
        log.debug("prefilled on %s: %d blocks moved in %.1f sim ms", endpoint, missing, elapsed_ms)
        return REMOTE

    def _prefill_endpoint(self, request: web.Request, body: Mapping[str, Any]) -> str | None:
        """The prefill worker to use, or None to prefill here."""
        value = request.headers.get(self.config.prefill_endpoint_header, "").strip()
        if not value or self.config.role == PREFILL or wants_remote_decode(body):
            return None
        target, here = _split_endpoint(value), _local_address(request)
        if target is not None and here is not None and _same_endpoint(target, here):
            return None  # the header names this worker
        return value

    async def _remote_prefill(self, endpoint: str, path: str, body: Mapping[str, Any]) -> int:
        """Prefill on `endpoint`; the prompt tokens whose KV it holds. Raises PrefillFailed."""
        base = endpoint if "://" in endpoint else f"http://{endpoint}"
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.config.remote_prefill_timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
        try:
            async with self._session.post(base.rstrip("/") + path, json=prefill_request_body(body)) as resp:
                if resp.status // 100 != 2:
                    raise PrefillFailed(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise PrefillFailed(f"{type(exc).__name__}: {exc}") from exc
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
            raise PrefillFailed("the answer carries no kv_transfer_params with do_remote_prefill")
        num_blocks = params.get("num_blocks")
        block_size = params.get("remote_block_size", self.block_size)
        if num_blocks is None and isinstance(params.get("remote_block_ids"), list):
            num_blocks = len(params["remote_block_ids"])
        if not (
            isinstance(num_blocks, int) and num_blocks >= 0 and isinstance(block_size, int) and block_size > 0
        ):
            raise PrefillFailed(f"unusable kv_transfer_params: {params!r:.200}")
        return num_blocks * block_size


def add_disagg_arguments(parser: argparse.ArgumentParser) -> None:
    """The mock worker's role flags."""
    d = DisaggWorkerConfig()
    parser.add_argument(
        "--role",
        choices=ROLES,
        default=d.role,
        help="both: an ordinary (aggregated) worker; decode: prefills remotely when a request names a "
        "prefill worker in --prefill-endpoint-header; prefill: meant to receive prefill requests only "
        "(it still serves any request, and ignores the header) (default: %(default)s)",
    )
    parser.add_argument(
        "--prefill-endpoint-header",
        default=d.prefill_endpoint_header,
        help="request header naming the prefill worker (ip:port) (default: %(default)s)",
    )
    add_kv_transfer_arguments(parser, "only blocks not cached here")
    parser.add_argument(
        "--remote-prefill-timeout-s",
        type=float,
        default=d.remote_prefill_timeout_s,
        help="real seconds to wait for a prefill worker before prefilling locally (default: %(default)s)",
    )


def disagg_config_from_args(args: argparse.Namespace) -> DisaggWorkerConfig:
    """Raises ValueError naming the bad value."""
    return DisaggWorkerConfig(
        role=args.role,
        prefill_endpoint_header=args.prefill_endpoint_header,
        kv_transfer=kv_transfer_from_args(args),
        remote_prefill_timeout_s=args.remote_prefill_timeout_s,
    )
