"""ApproxIndexer: predicted cache state for engines that publish no KV events.

After each routing decision the chosen worker is assumed to cache the request's blocks for
`ttl_s` seconds (refreshed when routed again). When the tree holds more than `max_tree_size`
(worker, block) entries, the least recently routed entries are pruned down to
`prune_target_ratio * max_tree_size`. The predictions go into the same RadixTree as real events,
as synthetic stored/removed events whose engine ids are the blocks' sequence hashes (as
Dynamo's approximate indexer does). No I/O; `now` is always passed in.

Blocks of one request are recorded leaf first, so expiry and pruning remove a path from its
tail and never leave an unreachable block behind a removed parent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from extproc.router.hashing import compute_sequence_hashes
from extproc.router.radix import RadixTree
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker


class ApproxIndexer:
    """TTL and size-bounded predictions of what each worker caches."""

    def __init__(
        self,
        tree: RadixTree,
        *,
        ttl_s: float = 120.0,
        max_tree_size: int = 2**20,
        prune_target_ratio: float = 0.8,
    ) -> None:
        self.tree = tree
        self.ttl_s = ttl_s
        self.max_tree_size = max_tree_size
        self.prune_target_size = int(max_tree_size * prune_target_ratio)
        # (worker, sequence hash) -> expiry time; order = least recently routed first
        self._expiry: OrderedDict[tuple[Worker, int], float] = OrderedDict()
        self.expired_blocks = 0
        self.pruned_blocks = 0

    def __len__(self) -> int:
        return len(self._expiry)

    def record_routing(
        self,
        worker: Worker,
        local_hashes: Sequence[int],
        now: float,
        *,
        seq_hashes: Sequence[int] | None = None,
    ) -> None:
        """Predict that `worker` now caches the blocks `local_hashes` (prefix from the root).

        `seq_hashes` (the chained hashes of `local_hashes`) may be passed to avoid recomputing.
        """
        self.expire(now)
        if not local_hashes:
            return
        if seq_hashes is None:
            seq_hashes = compute_sequence_hashes(local_hashes)
        self.tree.apply_event(
            BlocksStored(worker, tuple(map(StoredBlock, seq_hashes, local_hashes)), parent_hash=None)
        )
        expiry = now + self.ttl_s
        table = self._expiry
        for seq_hash in reversed(seq_hashes):
            key = (worker, seq_hash)
            table[key] = expiry
            table.move_to_end(key)
        if len(table) > self.max_tree_size:
            self.pruned_blocks += self._pop_oldest(len(table) - self.prune_target_size)

    def expire(self, now: float) -> None:
        """Drop every prediction whose TTL has passed."""
        table = self._expiry
        count = 0
        for expiry in table.values():
            if expiry > now:
                break
            count += 1
        if count:
            self.expired_blocks += self._pop_oldest(count)

    def remove_worker(self, worker: Worker) -> None:
        for key in [k for k in self._expiry if k[0] == worker]:
            del self._expiry[key]

    def _pop_oldest(self, count: int) -> int:
        removed: dict[Worker, list[int]] = {}
        table = self._expiry
        for _ in range(min(count, len(table))):
            (worker, seq_hash), _expiry = table.popitem(last=False)
            removed.setdefault(worker, []).append(seq_hash)
        for worker, hashes in removed.items():
            self.tree.apply_event(BlocksRemoved(worker, tuple(hashes)))
        return sum(len(h) for h in removed.values())
