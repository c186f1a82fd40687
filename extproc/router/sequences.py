"""ActiveSequences: the write model of each worker's in-flight load. No I/O, no clock.

Per worker it owns two numbers the cost function reads:
- active prefill tokens: uncached prompt tokens of requests whose prefill has not completed;
- active decode blocks: KV blocks held by in-flight requests. With KV reuse assumed (the
  default) a block shared by several requests counts once (blocks are named by their sequence
  hash); otherwise every request's blocks count separately. A partial last block is always the
  request's own.
With output-block tracking on, generated tokens add placeholder blocks, weighted by
`1 - progress` toward the expected output length when one is given (a request near its end will
soon release its blocks).

Every call is idempotent: adding a known request id, completing prefill twice or freeing an
unknown id changes nothing, so edges may call `free` from every path that ends a stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from extproc.router.types import Worker


@dataclass(slots=True)
class _Request:
    worker: Worker
    block_keys: tuple[int, ...]
    own_blocks: int  # blocks never shared: the partial tail, or all blocks without KV reuse
    prefill_tokens: int
    isl: int
    expected_output_tokens: int | None
    output_tokens: int = 0
    output_weight: float = 0.0  # placeholder output blocks, decayed


@dataclass(slots=True)
class _WorkerLoad:
    prefill_tokens: int = 0
    own_blocks: float = 0.0
    block_refs: dict[int, int] = field(default_factory=dict)
    requests: int = 0

    @property
    def decode_blocks(self) -> float:
        return len(self.block_refs) + self.own_blocks


class ActiveSequences:
    """In-flight requests and the load they put on each worker."""

    def __init__(
        self,
        block_size: int,
        *,
        assume_kv_reuse: bool = True,
        track_active_blocks: bool = True,
        track_prefill_tokens: bool = True,
        track_output_blocks: bool = False,
    ) -> None:
        self.block_size = block_size
        self.assume_kv_reuse = assume_kv_reuse
        self.track_active_blocks = track_active_blocks
        self.track_prefill_tokens = track_prefill_tokens
        self.track_output_blocks = track_output_blocks
        self._requests: dict[str, _Request] = {}
        self._loads: dict[Worker, _WorkerLoad] = {}

    # --- reading -----------------------------------------------------------------------------

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def worker_of(self, request_id: str) -> Worker | None:
        request = self._requests.get(request_id)
        return request.worker if request else None

    def prefill_tokens(self, worker: Worker) -> int:
        load = self._loads.get(worker)
        return load.prefill_tokens if load else 0

    def decode_blocks(self, worker: Worker) -> float:
        load = self._loads.get(worker)
        return load.decode_blocks if load else 0.0

    def potential(self, worker: Worker, block_keys: Sequence[int], isl: int) -> tuple[int, float]:
        """(active prefill tokens, active decode blocks + this request's new blocks) on `worker`."""
        load = self._loads.get(worker)
        new = self.new_blocks(worker, block_keys, isl)
        if load is None:
            return 0, float(new)
        return load.prefill_tokens, load.decode_blocks + new

    def num_requests(self, worker: Worker) -> int:
        load = self._loads.get(worker)
        return load.requests if load else 0

    def new_blocks(self, worker: Worker, block_keys: Sequence[int], isl: int) -> int:
        """Blocks this request would add on `worker` (its full blocks not active there + tail).

        `block_keys` must be chained (sequence) hashes, as everywhere in this class.
        """
        if not self.track_active_blocks:
            return 0
        tail = 1 if isl % self.block_size else 0
        load = self._loads.get(worker)
        if not self.assume_kv_reuse or load is None or not load.block_refs:
            return len(block_keys) + tail
        # Keys are chained sequence hashes, so the blocks active on a worker always form a prefix
        # of the request (a request holding block i holds every block before it): binary search
        # for the first missing one instead of testing every key.
        refs = load.block_refs
        lo, hi = 0, len(block_keys)
        while lo < hi:
            mid = (lo + hi) // 2
            if block_keys[mid] in refs:
                lo = mid + 1
            else:
                hi = mid
        return len(block_keys) - lo + tail

    def is_idle(self) -> bool:
        """True when nothing is in flight and every counter is back at zero."""
        return not self._requests and all(
            load.prefill_tokens == 0 and not load.block_refs and load.own_blocks < 1e-9 and load.requests == 0
            for load in self._loads.values()
        )

    # --- writing -----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        worker: Worker,
        block_keys: Sequence[int],
        isl: int,
        overlap_blocks: int,
        *,
        expected_output_tokens: int | None = None,
    ) -> bool:
        """Track a routed request; False (and no change) if the id is already tracked."""
        if request_id in self._requests:
            return False
        prefill = max(0, isl - overlap_blocks * self.block_size) if self.track_prefill_tokens else 0
        keys = tuple(block_keys) if self.track_active_blocks and self.assume_kv_reuse else ()
        own = 0
        if self.track_active_blocks:
            own = (1 if isl % self.block_size else 0) + (0 if self.assume_kv_reuse else len(block_keys))
        request = _Request(worker, keys, own, prefill, isl, expected_output_tokens)
        self._requests[request_id] = request
        load = self._loads.setdefault(worker, _WorkerLoad())
        load.requests += 1
        load.prefill_tokens += prefill
        load.own_blocks += own
        refs = load.block_refs
        for k in keys:
            refs[k] = refs.get(k, 0) + 1
        return True

    def mark_prefill_complete(self, request_id: str) -> bool:
        request = self._requests.get(request_id)
        if request is None or request.prefill_tokens == 0:
            return False
        self._loads[request.worker].prefill_tokens -= request.prefill_tokens
        request.prefill_tokens = 0
        return True

    def add_output_tokens(self, request_id: str, count: int) -> None:
        """Record generated tokens (output-block tracking only)."""
        request = self._requests.get(request_id)
        if request is None or not self.track_output_blocks or not self.track_active_blocks or count <= 0:
            return
        request.output_tokens += count
        bs = self.block_size
        blocks = (request.isl + request.output_tokens) // bs - request.isl // bs
        weight = float(blocks)
        if request.expected_output_tokens:
            weight *= max(0.0, 1.0 - request.output_tokens / request.expected_output_tokens)
        load = self._loads[request.worker]
        load.own_blocks += weight - request.output_weight
        request.output_weight = weight

    def free(self, request_id: str) -> bool:
        """Forget a request; False if it was not tracked."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        load = self._loads[request.worker]
        load.requests -= 1
        load.prefill_tokens -= request.prefill_tokens
        load.own_blocks -= request.own_blocks + request.output_weight
        refs = load.block_refs
        for k in request.block_keys:
            n = refs[k]
            if n == 1:
                del refs[k]
            else:
                refs[k] = n - 1
        if load.requests == 0:
            del self._loads[request.worker]  # exact zero, no float drift left behind
        return True

    def remove_worker(self, worker: Worker) -> list[str]:
        """Drop every request on `worker`; returns their ids."""
        ids = [rid for rid, r in self._requests.items() if r.worker == worker]
        for rid in ids:
            self.free(rid)
        return ids
