"""The simulated engine's scheduler core: vLLM-style continuous batching over a prefix-cached block pool.

Owns requests (waiting and running queues, computed and generated tokens) and builds passes. Pure:
no I/O, no clock, no randomness; time comes in as `now_ms`, so the real-time mock worker and a
virtual-time trace replayer drive the same core. Mirrors Dynamo 1.6.1's mocker (REFERENCE section 6):

1. One pass at a time: `next_pass(now_ms)` builds it, the caller waits `duration_ms` (real or
   virtual), then `finish_pass(p)` applies it. Every token of a pass is emitted at its end.
2. Running requests first, in admission order, each taking min(remaining tokens, budget left) (a
   prefill chunk, or 1 token for a decode); then waiting requests are admitted FIFO into what is
   left of `max_num_batched_tokens` (at most `max_num_seqs` running).
3. Duration = prefill_ms(T) + decode_ms(u); the decode part only when the pass holds a request that
   had already emitted a token. T is priced from per-request means (see `_prefill_tokens`) over
   prompt tokens only: generated tokens recomputed after a preemption are not priced, and an entry
   recomputing nothing but generated tokens does not count in the means.
4. Cached prefix = longest run of pooled blocks, capped at floor((len - 1) / B) * B tokens. A request
   takes blocks as its tokens are scheduled, chunk by chunk, and a block is matchable from then on.
5. Admission only if the blocks of its whole prompt fit (not counting those running requests hold);
   otherwise the queue waits. A running request that cannot get a block preempts the most recently
   admitted one (LIFO), which releases tail first, returns to the front of the queue and later
   recomputes its prompt and generated tokens.

Checked against the real mocker request by request: round robin on the shared Mooncake trace at
1x, 2x and 4x with 4 and 8 workers gives identical TTFT, end time and reuse for every request, as
do random micro traces with pools of a few hundred blocks. With pools of a few dozen blocks, where
preemptions cascade, some end times still differ (tests/sim/test_replay_rules.py pins one that
agrees).

Host tier (`num_host_blocks` > 0, not in the mocker): blocks evicted from the pool are offloaded to
host memory (`extproc.sim.prefix_cache`), and a request admitted with blocks that follow its cached
prefix there loads them back instead of computing them. Loading costs a fraction of computing:
`host_load_speedup` (4 by default) loaded tokens price as one computed token in the pass's prefill
(a PCIe transfer of a block's KV against its attention and MLP compute: a few times cheaper; LMCache
and vLLM's offloading report 3-10x lower TTFT for prefixes served from CPU memory). The factor
matches Dynamo's default host credit: a host block saves 0.75 of its recompute. Loaded tokens
count as cached tokens of the admission (served from a cache tier).

A request whose prompt alone is larger than the pool is refused by `add_request`. Disaggregated
serving (not in the mocker's checks): `receive_blocks` lands a prompt's KV computed by a prefill
worker as cached blocks, so the request then prefills only the rest.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from extproc.router.hashing import compute_block_hashes, compute_sequence_hashes
from extproc.sim.prefix_cache import BlockTable, KvCacheListener, PrefixCache
from extproc.sim.timing import decode_ms, prefill_ms


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine shape; defaults are Dynamo's mocker defaults."""

    block_size: int = 64
    num_gpu_blocks: int = 16_384
    max_num_batched_tokens: int = 8_192
    max_num_seqs: int = 256
    output_token_id: int = 0  # the id every generated token gets (its blocks are hashed per request)
    speed: float = 1.0  # a pass takes 1 / speed of the pass-time model's time (a mixed fleet's GPUs)
    num_host_blocks: int = 0  # host-memory tier for blocks evicted from the pool (0: none, the mocker)
    host_load_speedup: float = 4.0  # loaded tokens priced at 1 / this of computed ones

    def __post_init__(self) -> None:
        for name in ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {value!r}")
        for name in ("speed", "host_load_speedup"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ValueError(f"EngineConfig.{name} must be a number > 0, got {value!r}")
        if not isinstance(self.num_host_blocks, int) or self.num_host_blocks < 0:
            raise ValueError(
                f"EngineConfig.num_host_blocks must be an integer >= 0, got {self.num_host_blocks!r}"
            )

    @property
    def capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


class RequestTooLarge(ValueError):
    """The prompt needs more blocks than the whole pool holds; the engine can never run it."""

    def __init__(self, request_id: str, prompt_blocks: int, num_gpu_blocks: int) -> None:
        super().__init__(
            f"request {request_id}: prompt needs {prompt_blocks} blocks, pool has {num_gpu_blocks}"
        )
        self.request_id = request_id
        self.prompt_blocks = prompt_blocks
        self.num_gpu_blocks = num_gpu_blocks


@dataclass(frozen=True, slots=True)
class PassEntry:
    """One request's share of a pass."""

    request_id: str
    new_tokens: int  # tokens computed in this pass (prefill chunk, recompute, or 1 decode token)
    cached_tokens: int | None  # prefix served from cache when admitted in this pass, else None
    emits_token: bool  # a token is emitted at the pass end
    finished: bool  # that token is the request's last


@dataclass(frozen=True, slots=True)
class Pass:
    """One forward pass: when it starts, how long it takes, and what each request gets from it."""

    start_ms: float
    duration_ms: float
    prefill_tokens: int  # T, the priced uncached prefill tokens
    kv_usage: float | None  # u, when the decode part was charged
    entries: tuple[PassEntry, ...]
    preempted: tuple[str, ...] = ()

    @property
    def end_ms(self) -> float:
        return self.start_ms + self.duration_ms


@dataclass(slots=True, eq=False)
class _Request:
    request_id: str
    serial: int
    tokens: list[int]  # prompt then generated tokens: everything known so far
    prompt_len: int
    max_tokens: int
    arrival_ms: float  # kept for drivers and debugging; scheduling is FIFO by queue position
    block_hashes: list[int]  # sequence hashes of every full block of `tokens`
    cache_salt: str | None = None  # the request's cache_salt: its blocks are hashed under it
    table: BlockTable = field(default_factory=BlockTable)
    num_computed: int = 0
    num_output: int = 0


class Engine:
    """Continuous-batching scheduler of one simulated worker (one data-parallel rank)."""

    def __init__(self, config: EngineConfig | None = None, listener: KvCacheListener | None = None) -> None:
        self.config = config or EngineConfig()
        cfg = self.config
        self.cache = PrefixCache(
            cfg.num_gpu_blocks, cfg.block_size, listener, num_host_blocks=cfg.num_host_blocks
        )
        self._requests: dict[str, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._in_flight: Pass | None = None
        self._serial = 0
        self.num_preemptions = 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def add_request(
        self,
        request_id: str,
        token_ids: Sequence[int],
        max_tokens: int,
        now_ms: float,
        *,
        local_block_hashes: Sequence[int] | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request at the back of the waiting queue. Raises RequestTooLarge, ValueError.

        `local_block_hashes` (those of `token_ids` at this engine's block size, under `cache_salt`)
        spare hashing the prompt again when the caller already has them. A salted request shares
        blocks only with requests of the same salt, as vLLM's and SGLang's `cache_salt` isolate.
        """
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if max_tokens < 1 or not token_ids:
            raise ValueError("a request needs at least one prompt token and max_tokens >= 1")
        bs = self.config.block_size
        prompt_blocks = -(-len(token_ids) // bs)
        if prompt_blocks > self.config.num_gpu_blocks:
            raise RequestTooLarge(request_id, prompt_blocks, self.config.num_gpu_blocks)
        tokens = list(token_ids)
        self._serial += 1
        if local_block_hashes is None:
            local_block_hashes = compute_block_hashes(tokens, bs, namespace=cache_salt)
        elif len(local_block_hashes) != len(tokens) // bs:
            n = len(local_block_hashes)
            raise ValueError(f"{len(tokens)} tokens have {len(tokens) // bs} full blocks, got {n} hashes")
        hashes = compute_sequence_hashes(local_block_hashes)
        req = _Request(request_id, self._serial, tokens, len(tokens), max_tokens, now_ms, hashes, cache_salt)
        self._requests[request_id] = req
        self._waiting.append(req)

    def transferable_blocks(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """Sequence hashes of the prompt blocks a KV transfer can bring in: its full blocks up to the
        cached-prefix cap floor((len - 1) / B), so that admission still computes at least one token."""
        bs = self.config.block_size
        cap = max(0, len(token_ids) - 1) // bs
        return compute_sequence_hashes(
            compute_block_hashes(list(token_ids[: cap * bs]), bs, namespace=cache_salt)
        )

    def receive_blocks(
        self, block_hashes: Sequence[int], token_ids: Sequence[int], cache_salt: str | None = None
    ) -> bool:
        """Store a prompt's leading full blocks computed elsewhere (received by KV transfer from a
        prefill worker) as cached blocks; False, and nothing changed, when the pool cannot hold them.

        The decode side of vLLM's disaggregated serving: the blocks enter the pool like computed ones
        (new ones are reported stored; ones already there are refreshed) and are released at once,
        tail first, to the most recent end of the LRU order, so a request for this prompt added next
        is admitted with them as its cached prefix and prefills only the rest. Nothing else moves: no
        request, no pass. `block_hashes` are the first of `transferable_blocks(token_ids)`.
        """
        table = BlockTable()
        if not self.cache.allocate(
            table, block_hashes, len(block_hashes) * self.config.block_size, token_ids, cache_salt=cache_salt
        ):
            return False
        self.cache.release(table)
        return True

    def cancel(self, request_id: str) -> bool:
        """Drop a request wherever it is and release its blocks; False if it is unknown or done."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return False
        if req in self._running:
            self._running.remove(req)
        else:
            self._waiting.remove(req)
        self.cache.release(req.table)
        return True

    def next_pass(self, now_ms: float) -> Pass | None:
        """Build the next pass starting at `now_ms`, or None when nothing can run."""
        if self._in_flight is not None:
            raise RuntimeError("next_pass called before finish_pass of the pass in flight")
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[_Request, int, int, int | None]] = []  # request, prefix, new, cached
        preempted: list[str] = []
        loaded = 0  # tokens loaded back from the host tier in this pass
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            new = min(len(req.tokens) - req.num_computed, budget)
            if not self._allocate_or_preempt(req, req.num_computed + new, preempted):
                break
            scheduled.append((req, req.num_computed, new, None))
            req.num_computed += new
            budget -= new
            i += 1
        while (
            not preempted and self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs
        ):
            req = self._waiting[0]
            cached = self._match(req)
            host = self._match_host(req, cached)
            new = min(len(req.tokens) - cached - host, budget)
            cache = self.cache
            if cache.blocks_needed(req.table, req.block_hashes, len(req.tokens)) > cache.num_free_blocks:
                break  # the whole prompt must fit, though only this chunk's blocks are taken now
            if host:  # before the allocation, whose evictions offload blocks that may push them out
                bs = self.config.block_size
                cache.touch_host(req.block_hashes[cached // bs : (cached + host) // bs])
            if not cache.allocate(
                req.table, req.block_hashes, cached + host + new, req.tokens, cache_salt=req.cache_salt
            ):
                break
            loaded += host
            self.cache.record_query(len(req.tokens), cached)
            self._waiting.popleft()
            self._running.append(req)
            scheduled.append((req, cached + host, new, cached + host))
            req.num_computed = cached + host + new
            budget -= new
        if not scheduled:
            return None
        self._in_flight = self._price(now_ms, scheduled, tuple(preempted), loaded)
        return self._in_flight

    def finish_pass(self, p: Pass) -> list[PassEntry]:
        """Apply a pass at its end: emit tokens, retire finished requests. Returns the entries applied
        (those of requests cancelled meanwhile are left out)."""
        if p is not self._in_flight:
            raise RuntimeError("finish_pass called with a pass that is not in flight")
        self._in_flight = None
        applied = []
        for entry in p.entries:
            req = self._requests.get(entry.request_id)
            if req is None:
                continue
            applied.append(entry)
            if not entry.emits_token:
                continue
            req.num_output += 1
            if entry.finished:
                del self._requests[req.request_id]
                self._running.remove(req)
                self.cache.release(req.table)
            else:
                req.tokens.append(self.config.output_token_id)
                self._extend_hashes(req)
        return applied

    def _match(self, req: _Request) -> int:
        """Cached prefix tokens of a waiting request, capped so at least one token is computed."""
        bs = self.config.block_size
        cap_blocks = (len(req.tokens) - 1) // bs
        return self.cache.match_prefix(req.block_hashes[:cap_blocks]) * bs

    def _match_host(self, req: _Request, cached: int) -> int:
        """Tokens of the blocks right after the cached prefix the host tier holds (the same cap)."""
        if not self.config.num_host_blocks:
            return 0
        bs = self.config.block_size
        return self.cache.match_host(req.block_hashes, cached // bs, (len(req.tokens) - 1) // bs) * bs

    def _allocate_or_preempt(self, req: _Request, num_tokens: int, preempted: list[str]) -> bool:
        """Give a running request blocks for `num_tokens`, preempting the newest running ones (LIFO)
        until it fits; False when it had to preempt itself."""
        while not self.cache.allocate(
            req.table, req.block_hashes, num_tokens, req.tokens, cache_salt=req.cache_salt
        ):
            victim = self._running.pop()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return False
        return True

    def _preempt(self, req: _Request) -> None:
        self.cache.release(req.table)
        req.num_computed = 0
        self._waiting.appendleft(req)
        self.num_preemptions += 1

    def _extend_hashes(self, req: _Request) -> None:
        """Hash newly full blocks; any block holding generated tokens is salted with the request serial."""
        bs = self.config.block_size
        while len(req.block_hashes) < len(req.tokens) // bs:
            k = len(req.block_hashes)
            salt = f"gen-{req.serial}" if (k + 1) * bs > req.prompt_len else None
            local = compute_block_hashes(req.tokens[k * bs : (k + 1) * bs], bs, namespace=salt)[0]
            req.block_hashes.append(compute_sequence_hashes([req.block_hashes[-1], local])[1] if k else local)

    def _price(
        self,
        now_ms: float,
        scheduled: list[tuple[_Request, int, int, int | None]],
        preempted: tuple[str, ...],
        loaded: int = 0,
    ) -> Pass:
        # Recomputed generated tokens (after a preemption) are not priced: only prompt tokens are.
        prefills: list[tuple[int, int]] = []
        decoding_tokens = 0
        decoding = False
        entries = []
        for req, prefix, new, cached in scheduled:
            n_tokens = len(req.tokens)
            if req.num_output > 0:
                decoding = True
                decoding_tokens += n_tokens
            if not (req.num_output > 0 and new == 1 and prefix == n_tokens - 1):  # not a plain decode
                p = req.prompt_len
                start = prefix if prefix < p else p
                end = prefix + new if prefix + new < p else p
                if end > start:  # a recompute of generated tokens alone is not a prefill
                    prefills.append((start, end - start))
            emits = req.num_computed == n_tokens
            finished = emits and req.num_output + 1 >= req.max_tokens
            entries.append(PassEntry(req.request_id, new, cached, emits, finished))
        t = _prefill_tokens(prefills) + math.ceil(loaded / self.config.host_load_speedup)
        duration = prefill_ms(t) if t > 0 else 0.0
        usage = None
        if decoding:
            usage = min(1.0, decoding_tokens / self.config.capacity_tokens)
            duration += decode_ms(usage)
        if self.config.speed != 1.0:
            duration /= self.config.speed
        return Pass(now_ms, duration, t, usage, tuple(entries), preempted)


def _prefill_tokens(prefills: list[tuple[int, int]]) -> int:
    """T priced from per-request means, as the mocker does: n * (floor(sum(prefix + new) / n) -
    floor(sum(prefix) / n)); for one request it is simply its new tokens."""
    n = len(prefills)
    if n == 0:
        return 0
    total_prefix = sum(prefix for prefix, _ in prefills)
    total_new = sum(new for _, new in prefills)
    return n * ((total_prefix + total_new) // n - total_prefix // n)
