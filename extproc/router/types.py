"""Shared router nouns: workers, KV events, loads and decisions. Frozen dataclasses (a worker: a
named tuple), no logic.

The one event model of the product lives here because the router core may import nothing from
the rest of the package; `extproc/events/` decodes every wire format (vLLM/SGLang ZMQ, Dynamo
JSON on NATS, JetStream replay) into these classes. Mirrors Dynamo's `RouterEvent` /
`KvCacheEvent` (lib/kv-router/src/protocols.rs) with one difference: a stored block carries the
engine's own opaque block id and the router's local hash separately, because engines may name the
same content differently.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias, overload

WorkerId: TypeAlias = int | str


class Worker(NamedTuple):
    """One routing target: an engine instance and its data-parallel rank.

    A named tuple, not a dataclass: every map of the router is keyed by it, and a tuple hashes and
    compares in C where a dataclass runs Python methods (about 48 hashes per request at 4 workers,
    more per worker in a decision). Immutable, ordered by (worker_id, dp_rank), as the dataclass was.
    """

    worker_id: WorkerId
    dp_rank: int = 0

    def __str__(self) -> str:
        return f"{self.worker_id}" if self.dp_rank == 0 else f"{self.worker_id}/dp{self.dp_rank}"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the router must know about a worker: capacity for busy filters and the queue.

    `total_blocks` is the engine's KV cache size in blocks (per dp rank);
    `max_num_batched_tokens` its prefill budget per step.
    """

    worker_id: WorkerId
    dp_ranks: tuple[int, ...] = (0,)
    total_blocks: int = 16384
    max_num_batched_tokens: int = 8192
    device: str = "cuda"  # device class: cuda (any accelerator) or cpu (device-aware-weighted mode)

    def workers(self) -> list[Worker]:
        return [Worker(self.worker_id, r) for r in self.dp_ranks]


# --- KV events (the only way indexer state changes) -------------------------------------------

# Dynamo's StorageTier names (lib/kv-router protocols.rs, serde snake_case): where a block lives.
# Device blocks are the engine's GPU prefix cache (the radix tree); the others are offloaded copies
# (vLLM's CPU offloading, SGLang's HiCache, KVBM, LMCache), indexed apart (extproc/router/tiers.py).
DEVICE_TIER = "device"
HOST_PINNED_TIER = "host_pinned"
DISK_TIER = "disk"
EXTERNAL_TIER = "external"


class StoredBlock(NamedTuple):
    """A full block an engine stored: its opaque engine id and the router's local hash of its tokens.

    A named tuple, not a dataclass: events carry tens of them each, and a tuple is made in a third
    of the time (`benchmarks/bench_replicas.py`, `kv_event_64_blocks_us`)."""

    engine_hash: int
    local_hash: int


class StoredBlocks(Sequence[StoredBlock]):
    """A stored event's blocks as the decoders read them: two columns, engine ids and local hashes.

    The radix tree takes copies of the two lists (`columns`); anything else sees a sequence of
    `StoredBlock`s, equal to (and hashed as) the tuple of them. Making a named tuple per block was a
    fifth of a 64-block event's decoding (`benchmarks/bench_replicas.py`, `kv_event_64_blocks_us`).
    The lists are the caller's to give up: nothing changes them after.
    """

    __slots__ = ("engine_hashes", "local_hashes")

    def __init__(self, engine_hashes: list[int], local_hashes: list[int]) -> None:
        if len(engine_hashes) != len(local_hashes):
            raise ValueError(f"{len(engine_hashes)} engine ids for {len(local_hashes)} local hashes")
        self.engine_hashes = engine_hashes
        self.local_hashes = local_hashes

    def __len__(self) -> int:
        return len(self.engine_hashes)

    @overload
    def __getitem__(self, index: int) -> StoredBlock: ...

    @overload
    def __getitem__(self, index: slice) -> StoredBlocks: ...

    def __getitem__(self, index: int | slice) -> StoredBlock | StoredBlocks:
        if isinstance(index, slice):
            return StoredBlocks(self.engine_hashes[index], self.local_hashes[index])
        return StoredBlock(self.engine_hashes[index], self.local_hashes[index])

    def __iter__(self) -> Iterator[StoredBlock]:
        return map(StoredBlock, self.engine_hashes, self.local_hashes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StoredBlocks):
            return self.engine_hashes == other.engine_hashes and self.local_hashes == other.local_hashes
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"StoredBlocks({self.engine_hashes!r}, {self.local_hashes!r})"


def engine_ids(blocks: Sequence[StoredBlock]) -> Sequence[int]:
    """The engine ids of `blocks`, to read only: `StoredBlocks`' own column, else a new list."""
    if isinstance(blocks, StoredBlocks):
        return blocks.engine_hashes
    return [b.engine_hash for b in blocks]


def columns(blocks: Sequence[StoredBlock]) -> tuple[list[int], list[int]]:
    """(engine ids, local hashes) of `blocks` as new lists, the receiver's to keep and grow: one event
    may be applied to several trees (a model's routers, a dump), and a tree keeps the lists it is
    given. For `StoredBlocks` that is two list slices, far cheaper than reading the blocks one by one."""
    if isinstance(blocks, StoredBlocks):
        return blocks.engine_hashes[:], blocks.local_hashes[:]
    return [b.engine_hash for b in blocks], [b.local_hash for b in blocks]


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Consecutive blocks stored after `parent_hash` (the engine id of the block before; None = root).
    `blocks` is a tuple of `StoredBlock`s or, from the decoders, `StoredBlocks` (equal to that tuple)."""

    worker: Worker
    blocks: Sequence[StoredBlock]
    parent_hash: int | None = None
    event_id: int | None = None
    tier: str = DEVICE_TIER  # a lower tier's blocks go to its own index, never into the device tree


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    """Blocks an engine evicted from `tier`, named by their engine ids."""

    worker: Worker
    engine_hashes: tuple[int, ...]
    event_id: int | None = None
    tier: str = DEVICE_TIER


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (of `tier`)."""

    worker: Worker
    event_id: int | None = None
    tier: str = DEVICE_TIER


KvEvent: TypeAlias = BlocksStored | BlocksRemoved | AllBlocksCleared


# --- loads and decisions -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A worker's load if the request went there (Dynamo's potential loads).

    `prefill_tokens` = active prefill tokens + this request's uncached tokens;
    `decode_blocks` = active decode blocks + this request's blocks not already active there;
    `overlap_blocks` = its cached blocks as credited (device, plus offloaded ones at their weight).
    """

    worker: Worker
    prefill_tokens: int
    decode_blocks: float
    overlap_blocks: float


@dataclass(frozen=True, slots=True)
class WorkerCost:
    """One line of a decision's formula: cost = weight * prefill_blocks + decode_blocks."""

    worker: Worker
    cost: float
    prefill_blocks: float
    decode_blocks: float
    overlap_blocks: float  # as credited (WorkerLoad)

    def formula(self, weight: float) -> str:
        return (
            f"Formula for worker_{self.worker}: {self.cost:.1f} = {weight:.1f} * {self.prefill_blocks:.1f}"
            f" + {self.decode_blocks:.1f} (cached_blocks: {self.overlap_blocks})"
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """The router's answer: the chosen worker, its overlap, and the costs of every candidate."""

    worker: Worker
    overlap_blocks: int
    request_blocks: int
    costs: tuple[WorkerCost, ...] = field(default=())
    cost: float = 0.0
    best_overlap_blocks: int = 0  # the largest overlap any candidate had (regret = best - chosen)
    match_ns: int = 0  # indexer lookup time, when the router was given a `timer`
    select_ns: int = 0  # load, cost and pick time, likewise

    @property
    def worker_id(self) -> WorkerId:
        return self.worker.worker_id

    @property
    def dp_rank(self) -> int:
        return self.worker.dp_rank

    def __iter__(self) -> Iterator[WorkerId]:
        """(worker_id, dp_rank, overlap_blocks), as Dynamo's best_worker returns (the last two are ints)."""
        return iter((self.worker.worker_id, self.worker.dp_rank, self.overlap_blocks))
