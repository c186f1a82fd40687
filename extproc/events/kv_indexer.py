"""A Dynamo standalone KV indexer as the picker's view of the engines' caches (`--kv-indexer-url`).

Dynamo ships its KV indexer as a service of its own: `python -m dynamo.indexer` (ai-dynamo-runtime
1.6.1; `dynamo-kv-indexer` when built from source). It subscribes to each engine's ZMQ KV events
(vLLM's and SGLang's own publishers), keeps Dynamo's radix tree and answers overlap queries over
HTTP. With it, the engines' events are consumed once, by the indexer, however many picker
replicas route: each replica asks the indexer for the prompt's overlaps instead of consuming every
worker's events itself (issue 22; what each costs: benchmarks/README.md, "Picker replicas").

What a decision does (`KvIndexerClient.overlaps`): one `POST /query_by_hash` with the prompt's
local block hashes and the model's name, answered with each (instance, dp rank)'s matched tokens.
A query that fails (refused, timed out after `timeout_s`, an error status, an answer that does not
parse) is counted and logged at most once a minute, and that decision goes by load alone: a
request is never held up longer than the timeout, never refused, and never steered by a guess.

Registration (`KvIndexerRegistrar`): the picker registers each worker it knows with a ZMQ endpoint
(`kv-events:` in the config file, or `--kv-events-port`), one (instance id, dp rank) at a time, under
its model's name and block size, and unregisters the workers it forgets. It reconciles against
`GET /workers` every `interval_s`, so an indexer that restarted empty is filled again. Workers with
no ZMQ endpoint here are left to whoever runs the indexer (its `--workers` flag); their instance ids
must still be the ones this picker knows (`instance-id:`, or a numeric worker id).

The HTTP API as 1.6.1 answers it (read from the running service; its documentation predates some
of it):

- `POST /register {instance_id, endpoint, dp_rank, model_name, block_size, replay_endpoint}`: 201,
  or 409 when that (instance, dp rank) is registered already, or the instance under another model;
- `POST /unregister {instance_id, model_name}`: every dp rank of the instance (404: not there);
- `GET /workers`: `[{instance_id, model_name, block_size, endpoints: {dp_rank: endpoint}, ...}]`;
- `POST /query_by_hash {block_hashes, model_name}`: block hashes as signed 64-bit integers (our
  unsigned local hashes, two's complement); `{"scores": {instance_id: {dp_rank: tokens}}}`, the
  matched prefix in tokens, not blocks.

A model none of whose workers the indexer has registered (1.6.1 answers 404, "no indexer for
model") has nothing cached there: that is an empty answer, not a failure.

Counters (`EventCounters`): kv_indexer.query, kv_indexer.query_failed, kv_indexer.model_unknown,
kv_indexer.registered, kv_indexer.register_conflict, kv_indexer.register_failed,
kv_indexer.unregistered, and from the local group kv_indexer.salted_by_load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from extproc.events.counters import EventCounters
from extproc.router import OverlapScores, Worker, WorkerId

log = logging.getLogger("extproc.events")

_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1
MAX_ANSWER_BYTES = 4 << 20  # an answer names each (instance, rank) once: far below this
CHUNK_BYTES = 64 << 10
LOG_EVERY_S = 60.0
NO_MODEL = "no indexer for model"  # 1.6.1's 404 for a model none of whose workers are registered


def as_i64(hashes: Sequence[int]) -> list[int]:
    """Unsigned 64-bit hashes as the signed integers the indexer's JSON takes (two's complement)."""
    return [h - _U64 if h > _I64_MAX else h for h in hashes]


def parse_scores(
    answer: object, block_size: int, worker_of: Callable[[int], WorkerId | None]
) -> OverlapScores:
    """An answer's `scores` as matched blocks per (worker, dp rank): instances `worker_of` does not
    know (another picker's workers) are left out. Raises ValueError for an answer of another shape."""
    if not isinstance(answer, dict) or not isinstance(scores := answer.get("scores"), dict):
        raise ValueError("no 'scores' object")
    found: OverlapScores = {}
    for instance, ranks in scores.items():
        if not isinstance(ranks, dict):
            raise ValueError(f"scores[{instance!r}] is not an object")
        worker_id = worker_of(int(instance))
        for rank, tokens in ranks.items():
            if type(tokens) is not int or tokens < 0:
                raise ValueError(f"scores[{instance!r}][{rank!r}] is not a token count")
            if worker_id is not None and tokens >= block_size:
                found[Worker(worker_id, int(rank))] = tokens // block_size
    return found


class Refused(ValueError):
    """The indexer answered an error status."""

    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path} answered {status}: {text}")
        self.status = status
        self.text = text


class KvIndexerClient:
    """Queries one standalone KV indexer; one HTTP connection pool, made on first use."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        counters: EventCounters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url.removesuffix("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.counters = counters if counters is not None else EventCounters()
        self.instance_ids: dict[int, WorkerId] = {}  # the indexer's instance id -> our worker id
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._logged_at = -LOG_EVERY_S
        self._failures_unlogged = 0

    def worker_of(self, instance_id: int) -> WorkerId | None:
        return self.instance_ids.get(instance_id)

    async def overlaps(
        self, model: str, block_size: int, local_hashes: Sequence[int]
    ) -> OverlapScores | None:
        """Each worker's cached prefix of `local_hashes`, in blocks; None when the indexer did not answer."""
        self.counters.add("kv_indexer.query")
        body = {"block_hashes": as_i64(local_hashes), "model_name": model}
        try:
            try:
                answer = await self._request("POST", "/query_by_hash", body)
            except aiohttp.ServerDisconnectedError:  # a kept-alive connection the indexer had closed
                answer = await self._request("POST", "/query_by_hash", body)
            return parse_scores(answer, block_size, self.worker_of)
        except Refused as exc:
            if exc.status == 404 and NO_MODEL in exc.text:  # none of the model's workers registered
                self.counters.add("kv_indexer.model_unknown")
                return {}
            self._failed(exc)
            return None
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
            self._failed(exc)
            return None

    async def workers(self) -> list[dict[str, object]]:
        """`GET /workers`: what the indexer has registered. Raises on any failure."""
        answer = await self._request("GET", "/workers")
        if not isinstance(answer, list) or not all(isinstance(w, dict) for w in answer):
            raise ValueError("GET /workers did not answer a list of objects")
        return answer

    async def register(self, r: Registration) -> bool:
        """Register one dp rank's ZMQ endpoints; False when it was registered already (409)."""
        body: dict[str, object] = {
            "instance_id": r.instance_id, "endpoint": r.endpoint, "dp_rank": r.dp_rank, "model_name": r.model,
            "block_size": r.block_size,
        }  # fmt: skip
        if r.replay is not None:
            body["replay_endpoint"] = r.replay
        return await self._request("POST", "/register", body, conflict_ok=True) is not None

    async def unregister(self, instance_id: int, model: str) -> None:
        """Every dp rank of the instance, registered under `model` (404 when it is not: no error)."""
        body = {"instance_id": instance_id, "model_name": model}
        await self._request("POST", "/unregister", body, conflict_ok=True)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self, method: str, path: str, body: object = None, *, conflict_ok: bool = False
    ) -> object:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)  # kept-alive connections
        async with self._session.request(method, self.url + path, json=body) as resp:
            raw = b""
            while chunk := await resp.content.read(CHUNK_BYTES):
                raw += chunk
                if len(raw) > MAX_ANSWER_BYTES:
                    raise ValueError(f"{method} {path} answered more than {MAX_ANSWER_BYTES} bytes")
            if conflict_ok and resp.status in (404, 409):
                return None
            if resp.status >= 300:
                raise Refused(method, path, resp.status, raw[:200].decode(errors="replace"))
            try:
                return json.loads(raw)
            except ValueError as exc:  # not UTF-8, or not JSON
                raise ValueError(f"{method} {path} answered no JSON: {exc}") from exc

    def _failed(self, exc: BaseException) -> None:
        self.counters.add("kv_indexer.query_failed")
        now = self._clock()
        if now - self._logged_at < LOG_EVERY_S:
            self._failures_unlogged += 1
            return
        more = f" ({self._failures_unlogged} more since the last report)" if self._failures_unlogged else ""
        log.warning(
            "the KV indexer at %s did not answer an overlap query (%s)%s: such decisions go by load alone",
            self.url, str(exc) or type(exc).__name__, more,
        )  # fmt: skip
        self._logged_at, self._failures_unlogged = now, 0


@dataclass(frozen=True, slots=True)
class Registration:
    """One worker's dp rank as the indexer should hear it."""

    instance_id: int
    dp_rank: int
    endpoint: str
    model: str
    block_size: int
    replay: str | None = None  # the engine's replay socket: the indexer fills gaps from it


class KvIndexerRegistrar:
    """Keeps the indexer's registrations equal to the workers this picker knows with a ZMQ endpoint."""

    def __init__(self, client: KvIndexerClient, *, interval_s: float = 10.0) -> None:
        self.client = client
        self.interval_s = interval_s
        self.wanted: dict[tuple[int, int], Registration] = {}
        self._forgotten: set[int] = set()  # instances to unregister
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def want(self, registrations: Iterable[Registration], forget: Iterable[int] = ()) -> None:
        """Register these (replacing what an instance had) and unregister `forget`, soon."""
        for iid in forget:
            for key in [k for k in self.wanted if k[0] == iid]:
                del self.wanted[key]
            self._forgotten.add(iid)
        for r in registrations:
            self.wanted[(r.instance_id, r.dp_rank)] = r
            self._forgotten.discard(r.instance_id)
        self._wake.set()

    async def reconcile(self) -> None:
        """One pass: unregister the forgotten, register what the indexer lacks. Raises on failure."""
        counters = self.client.counters
        have = registered(await self.client.workers())

        wanted = self.wanted
        models = {r.instance_id: r.model for r in wanted.values()}
        stale = {  # registered with another endpoint or under another model: start over for those
            iid
            for key, (endpoint, model) in have.items()
            if ((iid := key[0]) in models and model != models[iid])
            or (key in wanted and endpoint != wanted[key].endpoint)
        }
        for iid in sorted(self._forgotten | stale):
            for model in sorted({m for (i, _), (_, m) in have.items() if i == iid}):
                await self.client.unregister(iid, model)
                counters.add("kv_indexer.unregistered")
            have = {k: v for k, v in have.items() if k[0] != iid}
        self._forgotten.clear()
        for key, r in sorted(wanted.items()):
            if have.get(key) == (r.endpoint, r.model):
                continue
            if not await self.client.register(r):  # registered meanwhile (another replica, say)
                counters.add("kv_indexer.register_conflict")
                continue
            counters.add("kv_indexer.registered")
            log.info("registered worker instance %d dp rank %d (%s, model %s) with the KV indexer at %s",
                     r.instance_id, r.dp_rank, r.endpoint, r.model, self.client.url)  # fmt: skip

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kv-indexer-registrar")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        failing = False
        while True:
            self._wake.clear()
            try:
                await self.reconcile()
                if failing:
                    log.info("the KV indexer at %s takes registrations again", self.client.url)
                failing = False
            except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
                self.client.counters.add("kv_indexer.register_failed")
                if not failing:
                    log.warning(
                        "registering workers with the KV indexer at %s failed (%s); retrying every %.0f s",
                        self.client.url, str(exc) or type(exc).__name__, self.interval_s,
                    )  # fmt: skip
                failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)


def registered(workers: list[dict[str, object]]) -> dict[tuple[int, int], tuple[object, str]]:
    """`GET /workers`'s answer as (instance id, dp rank) -> (endpoint, model); entries without
    integer ids are left out (they cannot be ours)."""
    have: dict[tuple[int, int], tuple[object, str]] = {}
    for w in workers:
        endpoints, model = w.get("endpoints"), str(w.get("model_name"))
        if isinstance(endpoints, Mapping):
            for rank, endpoint in endpoints.items():
                with contextlib.suppress(TypeError, ValueError):
                    have[(int(w.get("instance_id")), int(rank))] = (endpoint, model)  # type: ignore[call-overload]
    return have
