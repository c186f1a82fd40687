"""RadixTree: which worker caches which block, fed only by KV events. No I/O, no clock.

Nodes are keyed by the router's local block hash under their parent, so a path from the root
is a token prefix. Each node holds a bitmask of the worker slots (worker + dp rank) that
reported storing it. A worker matches a prefix only while every node along it is held by that
worker, which `find_matches` computes with one AND per block.

Engines name blocks with their own opaque ids (vLLM's are SHA-256 based, SGLang's signed ints),
and two engines may give the same content different ids, so each worker keeps its own map
engine id -> node; parents and removals resolve through it (Dynamo's tree shares one map and
cannot do this). Bad input never raises: an unknown parent drops the event, an unknown removal
is ignored, and both are counted in `stats` for metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from extproc.router.types import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    StoredBlock,
    Worker,
)

OverlapScores = dict[Worker, int]  # matched prefix blocks per worker; workers with 0 are omitted


class _Node:
    __slots__ = ("children", "local_hash", "parent", "workers")

    def __init__(self, parent: _Node | None, local_hash: int) -> None:
        self.parent = parent
        self.local_hash = local_hash
        self.children: dict[int, _Node] | None = None
        self.workers = 0  # bitmask of worker slots holding this block


@dataclass(slots=True)
class IndexerStats:
    """Event counters, exported as metrics by the edges."""

    stored_events: int = 0
    removed_events: int = 0
    cleared_events: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    unknown_parent: int = 0  # stored events dropped because the parent block was never seen
    unknown_removal: int = 0  # removed engine ids that were not stored


class RadixTree:
    """Prefix index of cached blocks per worker."""

    def __init__(self) -> None:
        self._root = _Node(None, 0)
        self._slot: dict[Worker, int] = {}
        self._worker_at: list[Worker | None] = []
        self._blocks: dict[Worker, dict[int, _Node]] = {}  # per worker: engine id -> node
        self._extra_refs: dict[tuple[int, _Node], int] = {}  # same content under several engine ids
        self._num_nodes = 0
        self.stats = IndexerStats()

    # --- reading ---------------------------------------------------------------------------

    def find_matches(self, local_hashes: Sequence[int] | Iterable[int]) -> OverlapScores:
        """Matched prefix length in blocks, per worker holding at least the first block."""
        scores: OverlapScores = {}
        active = (1 << len(self._worker_at)) - 1
        depth = 0
        children = self._root.children
        worker_at = self._worker_at
        for h in local_hashes:
            if children is None:
                break
            node = children.get(h)
            if node is None:
                break
            held = node.workers & active
            if held != active:
                dropped = active & ~held
                if depth:
                    while dropped:
                        low = dropped & -dropped
                        scores[worker_at[low.bit_length() - 1]] = depth  # type: ignore[index]
                        dropped ^= low
                active = held
                if not held:
                    return scores
            depth += 1
            children = node.children
        if depth:
            while active:
                low = active & -active
                scores[worker_at[low.bit_length() - 1]] = depth  # type: ignore[index]
                active ^= low
        return scores

    def workers(self) -> list[Worker]:
        """Workers that have reported at least one event and were not removed."""
        return list(self._slot)

    def num_blocks(self, worker: Worker | None = None) -> int:
        """(worker, engine block) entries, for one worker or all."""
        if worker is not None:
            return len(self._blocks.get(worker, ()))
        return sum(len(m) for m in self._blocks.values())

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    def entries(self) -> Iterator[tuple[Worker, int, tuple[int, ...]]]:
        """Every (worker, engine id, local-hash path from the root) the tree holds."""
        for worker, blocks in self._blocks.items():
            for engine_hash, node in blocks.items():
                yield worker, engine_hash, _path(node)

    # --- writing -----------------------------------------------------------------------------

    def apply_event(self, event: KvEvent) -> None:
        """Apply one KV event; never raises on inconsistent input (see `stats`)."""
        if isinstance(event, BlocksStored):
            self._store(event)
        elif isinstance(event, BlocksRemoved):
            self.stats.removed_events += 1
            self._remove(event.worker, event.engine_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.stats.cleared_events += 1
            self.clear_worker(event.worker)
        else:
            raise TypeError(f"not a KV event: {type(event).__name__}")

    def clear_worker(self, worker: Worker) -> None:
        """Forget every block of `worker` but keep its slot."""
        blocks = self._blocks.get(worker)
        if not blocks:
            return
        slot = self._slot[worker]
        for key in [k for k in self._extra_refs if k[0] == slot]:
            del self._extra_refs[key]
        clear = ~(1 << slot)
        nodes = list(blocks.values())
        blocks.clear()
        for node in nodes:
            node.workers &= clear
        for node in nodes:
            self._prune(node)

    def remove_worker(self, worker: Worker) -> None:
        """Forget `worker` entirely; its slot is reused by the next new worker."""
        if worker not in self._slot:
            return
        self.clear_worker(worker)
        slot = self._slot.pop(worker)
        del self._blocks[worker]
        self._worker_at[slot] = None
        while self._worker_at and self._worker_at[-1] is None:
            self._worker_at.pop()

    def _slot_of(self, worker: Worker) -> int:
        slot = self._slot.get(worker)
        if slot is None:
            try:
                slot = self._worker_at.index(None)
                self._worker_at[slot] = worker
            except ValueError:
                slot = len(self._worker_at)
                self._worker_at.append(worker)
            self._slot[worker] = slot
            self._blocks[worker] = {}
        return slot

    def _store(self, event: BlocksStored) -> None:
        self.stats.stored_events += 1
        slot = self._slot_of(event.worker)
        blocks = self._blocks[event.worker]
        if event.parent_hash is None:
            parent = self._root
        else:
            found = blocks.get(event.parent_hash)
            if found is None:
                self.stats.unknown_parent += 1
                return
            parent = found
        bit = 1 << slot
        for block in event.blocks:
            children = parent.children
            if children is None:
                children = parent.children = {}
            node = children.get(block.local_hash)
            if node is None:
                node = children[block.local_hash] = _Node(parent, block.local_hash)
                self._num_nodes += 1
            previous = blocks.get(block.engine_hash)
            if previous is not node:
                blocks[block.engine_hash] = node
                if node.workers & bit:
                    key = (slot, node)
                    self._extra_refs[key] = self._extra_refs.get(key, 0) + 1
                else:
                    node.workers |= bit
                if previous is not None:  # the engine reused an id for other content
                    self._release(slot, previous)  # after holding `node`, so it cannot be pruned
                self.stats.stored_blocks += 1
            parent = node

    def _remove(self, worker: Worker, engine_hashes: Iterable[int]) -> None:
        blocks = self._blocks.get(worker)
        for engine_hash in engine_hashes:
            node = blocks.pop(engine_hash, None) if blocks is not None else None
            if node is None:
                self.stats.unknown_removal += 1
                continue
            self.stats.removed_blocks += 1
            self._release(self._slot[worker], node)

    def _release(self, slot: int, node: _Node) -> None:
        key = (slot, node)
        refs = self._extra_refs.get(key)
        if refs:
            if refs == 1:
                del self._extra_refs[key]
            else:
                self._extra_refs[key] = refs - 1
            return
        node.workers &= ~(1 << slot)
        self._prune(node)

    def _prune(self, node: _Node) -> None:
        """Unlink empty leaves upward; a node stays while a worker or a child needs it."""
        root = self._root
        while node is not root and not node.workers and not node.children and node.parent is not None:
            parent = node.parent
            siblings = parent.children
            if siblings is None or siblings.get(node.local_hash) is not node:
                return  # already unlinked
            del siblings[node.local_hash]
            if not siblings:
                parent.children = None
            node.parent = None
            self._num_nodes -= 1
            node = parent

    # --- snapshots ---------------------------------------------------------------------------

    def dump_events(self) -> list[KvEvent]:
        """Events that rebuild an identical tree in an empty RadixTree.

        Parents come before children. A block whose parent this worker does not hold is
        re-created with stand-in ancestors (negative engine ids, never used by engines, whose
        ids are unsigned) that are removed right after, so it stays unreachable as before.
        """
        events: list[KvEvent] = []
        for worker, blocks in self._blocks.items():
            engine_id_of: dict[_Node, int] = {}
            for engine_hash, node in blocks.items():
                engine_id_of.setdefault(node, engine_hash)
            depth: dict[_Node, int] = {}
            ordered = sorted(blocks.items(), key=lambda item: _depth(item[1], depth))
            stand_in = 0
            for engine_hash, node in ordered:
                chain: list[StoredBlock] = []
                parent = node.parent
                while parent is not None and parent is not self._root and parent not in engine_id_of:
                    stand_in -= 1
                    chain.append(StoredBlock(stand_in, parent.local_hash))
                    parent = parent.parent
                parent_hash = None if parent is None or parent is self._root else engine_id_of[parent]
                chain.reverse()
                events.append(
                    BlocksStored(worker, (*chain, StoredBlock(engine_hash, node.local_hash)), parent_hash)
                )
                if chain:
                    events.append(BlocksRemoved(worker, tuple(b.engine_hash for b in chain)))
        return events


def _path(node: _Node) -> tuple[int, ...]:
    path = []
    while node.parent is not None:
        path.append(node.local_hash)
        node = node.parent
    return tuple(reversed(path))


def _depth(node: _Node, memo: dict[_Node, int]) -> int:
    stack = []
    while node.parent is not None and node not in memo:
        stack.append(node)
        node = node.parent
    base = memo.get(node, 0)
    for n in reversed(stack):
        base += 1
        memo[n] = base
    return base
