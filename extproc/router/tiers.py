"""Tiered KV: offloaded blocks indexed per tier beside the device tree, and credited in the cost.

Engines that offload KV (vLLM's CPU offloading connector, SGLang's HiCache, Dynamo's KVBM, LMCache)
report the copies they keep in host memory, on disk or in an external store as KV events of another
medium (vLLM `medium: "CPU"`, Dynamo `storage_tier: "host_pinned"`). Loading such a prefix back is
much cheaper than recomputing it, so, as Dynamo's router does (lib/kv-router: indexer/lower_tier.rs,
the tiered query in the indexer, the selector's cache-hit estimates), the router credits them:

- Tiers: Dynamo's `StorageTier` names. The device tier is the radix tree (`extproc.router.radix`);
  each lower tier (`host_pinned`, `disk`, `external`) has its own `TierIndex`. Media map as Dynamo's
  `StorageTier::from_kv_medium` (`tier_of_medium`).
- A lower tier indexes continuation edges, per worker: (parent engine id or None, local hash) ->
  engine id. A store needs no known parent: vLLM's connector emits each offloaded chunk with its
  own parent, in any order, and that parent is often still on the device only. Stores are
  idempotent (a block stored again, or under another parent, changes nothing: Dynamo's "existing
  mapping wins"); a removal forgets the block in its tier only; a tier's AllBlocksCleared clears
  that tier; removing or resetting a worker clears every tier.
- A match is one prefix across tiers: the device tree's match first, then for each worker the host
  tier continues from the device's last matched block (or from the root when the device matched
  nothing) for as long as its blocks follow one another, then disk continues from where host
  stopped, then external. A block held on the device and in host memory counts as device; a host
  block past a gap in the prefix counts nothing. Hits are these extensions, per tier.
- Credit: cached blocks = device + host_cache_hit_weight * host + disk_cache_hit_weight * (disk +
  external) (Dynamo's `--router-host-cache-hit-weight`, default 0.75, and
  `--router-disk-cache-hit-weight`, default 0.25; a weight of 0 credits nothing). The cost then
  treats the credit as cached blocks: the uncached tokens are the prompt's minus round(credit *
  block size) (Dynamo's cached-token estimate), under every prefill load model.

vLLM's connector re-announces a block shared by two unaligned chunks once per chunk and asks
consumers to count references; stores here are idempotent (Dynamo's choice), so the first of the
two removals forgets the block: an under-credit, never a credit for a block gone.

Not kept: the tiers are rebuilt from live events only (`KvRouter.dump_events`, the durable
snapshot and the replica sync carry the device tree); Dynamo's lower tiers are not dumped either.
The device walk reads the radix tree's runs (read only) to find each worker's last matched engine id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from extproc.router.radix import OverlapScores, RadixTree
from extproc.router.types import (
    DEVICE_TIER,
    DISK_TIER,
    EXTERNAL_TIER,
    HOST_PINNED_TIER,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    Worker,
)

LOWER_TIERS = (HOST_PINNED_TIER, DISK_TIER, EXTERNAL_TIER)  # query order: each continues the one before
DEFAULT_HOST_CACHE_HIT_WEIGHT = 0.75  # Dynamo's defaults
DEFAULT_DISK_CACHE_HIT_WEIGHT = 0.25

# Dynamo's StorageTier::from_kv_medium (vLLM "CPU"/"STORAGE", SGLang "CPU_PINNED"/"DISK"/"EXTERNAL")
_MEDIA = {
    "GPU": DEVICE_TIER,
    "DEVICE": DEVICE_TIER,
    "CPU": HOST_PINNED_TIER,
    "CPU_PINNED": HOST_PINNED_TIER,
    "CPU_TIER1": HOST_PINNED_TIER,
    "CPU_TIER2": DISK_TIER,
    "DISK": DISK_TIER,
    "NVME": DISK_TIER,
    "STORAGE": DISK_TIER,
    "EXTERNAL": EXTERNAL_TIER,
    "NETWORK": EXTERNAL_TIER,
    "REMOTE": EXTERNAL_TIER,
    "SHARED": EXTERNAL_TIER,
}
_TIERS = frozenset((DEVICE_TIER, *LOWER_TIERS))

Edge = tuple[int | None, int]  # (parent engine id, local hash)
Point = tuple[int, int | None]  # where a worker's match stands: (blocks matched, last engine id)


def tier_of_medium(medium: str) -> str | None:
    """The tier of an engine's medium name (any case); None for a medium no tier names."""
    return _MEDIA.get(medium.upper())


def tier_of_name(name: str) -> str | None:
    """A Dynamo `storage_tier` value as a tier; None for an unknown one."""
    return name if name in _TIERS else None


class TierIndex:
    """One lower tier's blocks: per worker, continuation edges (see the module docstring)."""

    def __init__(self) -> None:
        self._edges: dict[Edge, dict[Worker, int]] = {}  # edge -> holder -> its engine id for the block
        self._blocks: dict[Worker, dict[int, Edge]] = {}  # worker -> engine id -> its edge

    def __len__(self) -> int:
        """(worker, block) entries."""
        return sum(len(m) for m in self._blocks.values())

    def num_blocks(self, worker: Worker) -> int:
        return len(self._blocks.get(worker, ()))

    def workers(self) -> list[Worker]:
        """Workers holding at least one block of this tier."""
        return list(self._blocks)

    def apply_event(self, event: KvEvent) -> None:
        if isinstance(event, BlocksStored):
            self._store(event)
        elif isinstance(event, BlocksRemoved):
            self._remove(event.worker, event.engine_hashes)
        else:
            self.clear_worker(event.worker)

    def _store(self, event: BlocksStored) -> None:
        worker = event.worker
        held = self._blocks.setdefault(worker, {})
        parent = event.parent_hash
        for block in event.blocks:
            engine_id = block.engine_hash
            if engine_id not in held:
                edge = (parent, block.local_hash)
                holders = self._edges.setdefault(edge, {})
                if worker not in holders:  # else the worker holds this block under another id
                    holders[worker] = engine_id
                    held[engine_id] = edge
            parent = engine_id
        if not held:
            del self._blocks[worker]

    def _remove(self, worker: Worker, engine_ids: Iterable[int]) -> None:
        held = self._blocks.get(worker)
        if held is None:
            return
        for engine_id in engine_ids:
            edge = held.pop(engine_id, None)
            if edge is None:
                continue  # not held here (a placeholder, another tier's, a repeated removal)
            holders = self._edges[edge]
            del holders[worker]
            if not holders:
                del self._edges[edge]
        if not held:
            del self._blocks[worker]

    def clear_worker(self, worker: Worker) -> None:
        """Forget every block of `worker` in this tier."""
        held = self._blocks.pop(worker, None)
        if held is None:
            return
        for edge in held.values():
            holders = self._edges[edge]
            del holders[worker]
            if not holders:
                del self._edges[edge]

    def walk(self, local_hashes: Sequence[int], starts: dict[Worker, Point]) -> dict[Worker, Point]:
        """Where each worker's match stands after this tier's consecutive blocks from its start.

        Workers starting at the same point are walked together, one edge lookup per block; they
        split where their engine ids differ and drop out where they hold no next block.
        """
        groups: dict[Point, list[Worker]] = {}
        for worker, point in starts.items():
            groups.setdefault(point, []).append(worker)
        ends: dict[Worker, Point] = {}
        edges, n = self._edges, len(local_hashes)
        todo = [(pos, parent, workers) for (pos, parent), workers in groups.items()]
        while todo:
            pos, parent, workers = todo.pop()
            while True:
                holders = edges.get((parent, local_hashes[pos])) if pos < n else None
                moved: dict[int, list[Worker]] = {}
                for worker in workers:
                    child = holders.get(worker) if holders is not None else None
                    if child is None:
                        ends[worker] = (pos, parent)
                    else:
                        moved.setdefault(child, []).append(worker)
                if not moved:
                    break
                pos += 1
                branches = iter(moved.items())
                parent, workers = next(branches)
                todo.extend((pos, child, group) for child, group in branches)
        return ends


class TierMatch(dict[Worker, float]):
    """Credited cached blocks per worker (device + weighted lower-tier hits; workers with none are
    omitted), with the device tree's own match (`device`) and each lower tier's hits (`tiers`)."""

    def __init__(self, device: OverlapScores, tiers: dict[str, dict[Worker, int]]) -> None:
        super().__init__(device)
        self.device = device
        self.tiers = tiers

    def blocks(self, worker: Worker) -> dict[str, int]:
        """`worker`'s matched blocks per tier (device first), tiers it holds none of omitted."""
        out = {DEVICE_TIER: self.device[worker]} if worker in self.device else {}
        for tier, hits in self.tiers.items():
            if worker in hits:
                out[tier] = hits[worker]
        return out


class LowerTiers:
    """The lower tiers' indexes, and the tiered match and credit (module docstring)."""

    def __init__(self) -> None:
        self._tiers: dict[str, TierIndex] = {}

    def __len__(self) -> int:
        """(worker, block) entries over every lower tier."""
        return sum(len(index) for index in self._tiers.values())

    def index(self, tier: str) -> TierIndex | None:
        return self._tiers.get(tier)

    def num_blocks(self, worker: Worker) -> dict[str, int]:
        """`worker`'s blocks per lower tier it holds any of."""
        counts = {tier: index.num_blocks(worker) for tier, index in self._tiers.items()}
        return {tier: n for tier, n in counts.items() if n}

    @property
    def active(self) -> bool:
        """Whether any lower tier holds a block (else a match is the device tree's alone)."""
        return any(index._blocks for index in self._tiers.values())

    def apply_event(self, event: KvEvent) -> bool:
        """Apply an event of a lower tier (its `tier`); one of an unknown tier is ignored. True: a
        lower tier has no orphans (a store needs no known parent)."""
        if event.tier in LOWER_TIERS:
            index = self._tiers.get(event.tier)
            if index is None:
                index = self._tiers[event.tier] = TierIndex()
            index.apply_event(event)
        return True

    def clear_worker(self, worker: Worker) -> None:
        """Forget `worker`'s blocks in every lower tier (a worker reset or removal)."""
        for index in self._tiers.values():
            index.clear_worker(worker)

    def match(self, tree: RadixTree, local_hashes: Sequence[int], device: OverlapScores) -> TierMatch:
        """The tiered match of `local_hashes`, `device` being the device tree's, with every lower tier
        credited 1 per block (`credit` weighs them)."""
        hits: dict[str, dict[Worker, int]] = {}
        points: dict[Worker, Point] | None = None
        for tier in LOWER_TIERS:
            index = self._tiers.get(tier)
            if index is None or not index._blocks:
                continue
            if points is None:
                points = _device_points(tree, local_hashes, device, self._holders())
            members = {w: points[w] for w in index.workers() if w in points}
            ends = index.walk(local_hashes, members)
            found = {w: end[0] - members[w][0] for w, end in ends.items() if end[0] > members[w][0]}
            if found:
                hits[tier] = found
            points.update(ends)
        return TierMatch(device, hits)

    def credit(
        self,
        tree: RadixTree,
        local_hashes: Sequence[int],
        device: OverlapScores,
        host_weight: float = DEFAULT_HOST_CACHE_HIT_WEIGHT,
        disk_weight: float = DEFAULT_DISK_CACHE_HIT_WEIGHT,
    ) -> TierMatch:
        """`match`, each worker credited device + host_weight * host + disk_weight * (disk + external)."""
        found = self.match(tree, local_hashes, device)
        for tier, hits in found.tiers.items():
            weight = host_weight if tier == HOST_PINNED_TIER else disk_weight
            if weight > 0:
                for worker, n in hits.items():
                    found[worker] = found.get(worker, 0) + n * weight
        return found

    def _holders(self) -> set[Worker]:
        return {w for index in self._tiers.values() for w in index._blocks}


def _device_points(
    tree: RadixTree, local_hashes: Sequence[int], device: OverlapScores, workers: set[Worker]
) -> dict[Worker, Point]:
    """Where each of `workers` stands after its device match: (blocks, engine id of its last matched
    device block), or (0, None) at the root. A block the worker stored twice under two ids is named
    by the first: a lower-tier block whose parent is the second does not continue the match."""
    points: dict[Worker, Point] = {}
    deep: dict[Worker, int] = {}
    for worker in workers:
        d = device.get(worker, 0)
        if d > 0:
            deep[worker] = d
        else:
            points[worker] = (0, None)
    if not deep:
        return points
    # the runs along the prompt, with the position of their first block (read only)
    runs = []
    depth, limit = 0, max(deep.values())
    children = tree._root.children
    while children is not None and depth < limit:
        node = children[local_hashes[depth]]  # find_matches walked this far: the run is there
        runs.append((depth, node))
        depth += len(node.hashes)
        children = node.children
    slots = tree._slot
    for worker, d in deep.items():
        # find_matches scored d along these runs, so the run holding block d - 1 lists the worker's ids
        start, node = next((start, node) for start, node in reversed(runs) if start < d)
        points[worker] = (d, node.eids[slots[worker]][d - 1 - start])
    return points
