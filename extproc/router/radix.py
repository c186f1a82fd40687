"""RadixTree: which worker caches which block, fed only by KV events. No I/O, no clock.

A path-compressed radix tree of blocks: a path from the root is a token prefix, one local block
hash per block. Each node is a *run* of consecutive blocks (a list of local hashes, keyed by its
first hash under its parent). Each worker slot (worker + dp rank) holds a prefix of a run: the
run keeps, per holder, the list of that worker's engine ids for its first blocks, and a bitmask
of the slots holding all of it (`workers`) next to one of those holding only a part (`partial`).
A worker that stores or drops blocks at the end of what it holds grows or shrinks its list and
nothing moves; the run is split only where the tree branches or a worker drops a block in the
middle of what it holds, and runs are merged back when a cut is no longer needed. A worker
matches a prefix only while it holds every block along it; `find_matches` does one AND per run
and compares the query against a run with one list compare.

Engines name blocks with their own opaque ids (vLLM's are SHA-256 based, SGLang's signed ints).
Workers of one deployment usually name the same content alike, so one shared map engine id -> run
serves them all (the offset is found in the run's list; a split re-points only the part that
moves), and a worker keeps its own map only for ids the shared one cannot answer for it: two
engines may give the same content different ids, or one id different content. The rule: a worker's
id is in its own map, or else the shared map names the run where it holds it; the shared name
stays while some worker not overriding it holds the id there, all of them at the same offset.
(The per-worker maps alone cost about 52 bytes per (worker, block) entry, two thirds of the tree.)
When a worker stores content it already holds under another engine id, the new id is an
alias of the first one, and the block stays until every id naming it is removed. Parents and
removals resolve through these maps (Dynamo's tree shares one map and cannot do this). Bad input
never raises: an unknown parent drops the event (and `apply_event` says so, so that the caller can
resynchronise that worker), an unknown removal is ignored, and both are counted in `stats`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from extproc.router.radix_dump import dump_events as _dump_events
from extproc.router.radix_dump import entries as _entries
from extproc.router.radix_dump import held_runs as _held_runs
from extproc.router.radix_lookup import common as _common
from extproc.router.radix_lookup import group_held as _group_held
from extproc.router.radix_lookup import index as _index
from extproc.router.radix_lookup import named_at as _named_at
from extproc.router.radix_lookup import tails as _tails
from extproc.router.radix_names import NAME_MASK, ShardedNames
from extproc.router.types import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    Worker,
    columns,
)

OverlapScores = dict[Worker, int]  # matched prefix blocks per worker; workers with 0 are omitted


class _Node:
    """A run of blocks. `eids[slot]` lists a holder's engine ids for the run's first blocks.

    Invariants: `eids` has the slots of `workers | partial`, no list is empty or longer than
    `hashes`, `workers` has the slots whose list is as long, `partial` the others; a leaf's
    last block is held by someone. A dead node (unlinked by a prune or a merge) has `parent`
    None, like the root.
    """

    __slots__ = ("children", "eids", "hashes", "parent", "partial", "workers")

    def __init__(
        self, parent: _Node | None, hashes: list[int], workers: int, eids: dict[int, list[int]]
    ) -> None:
        self.parent = parent
        self.hashes = hashes
        self.workers = workers  # bitmask of worker slots holding every block of the run
        self.partial = 0  # bitmask of worker slots holding only its first blocks
        self.eids = eids
        self.children: dict[int, _Node] | None = None


# New ids' names: (for the shared map, for the worker's own), either None when there is nothing to add.
_Names = tuple["dict[int, _Node] | None", "dict[int, _Node] | None"]


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
        self._root = _Node(None, [], 0, {})
        self._slot: dict[Worker, int] = {}
        self._worker_at: list[Worker | None] = []
        self._names: ShardedNames[_Node] = ShardedNames()  # engine id -> run, for workers naming it alike
        self._shards = self._names.shards  # its dicts, read inline where a lookup is hot
        self._own: list[dict[int, _Node]] = []  # by slot: engine id -> run where the shared map is wrong
        self._aliases: list[dict[int, int]] = []  # by slot: extra engine id -> first one
        self._counts: list[int] = []  # by slot: (worker, engine id) entries, aliases included
        self._num_nodes = 0
        self.stats = IndexerStats()
        self.writes = 0  # calls that may have changed the tree: a dump in slices checks it did not change

    # --- reading ---------------------------------------------------------------------------

    def find_matches(self, local_hashes: Sequence[int] | Iterable[int]) -> OverlapScores:
        """Matched prefix length in blocks, per worker holding at least the first block."""
        q = local_hashes if type(local_hashes) is list else list(local_hashes)
        n = len(q)
        scores: OverlapScores = {}
        children = self._root.children
        if not n or children is None:
            return scores
        # A free slot (None) holds no bit in any run, and the first run narrows `active` to bits
        # it holds, so every slot scored below names a live worker.
        worker_at = cast(list[Worker], self._worker_at)
        active = (1 << len(worker_at)) - 1
        depth = 0
        while True:
            node = children.get(q[depth])
            if node is None:
                if not depth:
                    return scores
                break
            held = node.workers & active
            if held != active:
                dropped = active & ~held
                part = dropped & node.partial
                if part:  # they hold the run's first blocks: as many of those as match count
                    dropped ^= part
                    run = node.hashes
                    matched = _common(run, 0, q, depth, min(len(run), n - depth))
                    while part:
                        low = part & -part
                        slot = low.bit_length() - 1
                        scores[worker_at[slot]] = depth + min(matched, len(node.eids[slot]))
                        part ^= low
                if depth:
                    while dropped:
                        low = dropped & -dropped
                        scores[worker_at[low.bit_length() - 1]] = depth
                        dropped ^= low
                active = held
                if not held:
                    return scores
            run = node.hashes
            end = depth + len(run)
            if end <= n and (end == depth + 1 or q[depth:end] == run):
                depth = end
                children = node.children
                if children is None or depth == n:
                    break
                continue
            depth += _common(run, 0, q, depth, min(len(run), n - depth))
            break
        while active:
            low = active & -active
            scores[worker_at[low.bit_length() - 1]] = depth
            active ^= low
        return scores

    def workers(self) -> list[Worker]:
        """Workers that have reported at least one event and were not removed."""
        return list(self._slot)

    def num_blocks(self, worker: Worker | None = None) -> int:
        """(worker, engine block) entries, for one worker or all."""
        if worker is not None:
            slot = self._slot.get(worker)
            return 0 if slot is None else self._counts[slot]
        return sum(self._counts[s] for s in self._slot.values())

    @property
    def num_nodes(self) -> int:
        """Runs in the tree (not blocks: a run holds any number of consecutive blocks)."""
        return self._num_nodes

    def entries(self) -> Iterator[tuple[Worker, int, tuple[int, ...]]]:
        """Every (worker, engine id, local-hash path from the root) the tree holds."""
        return _entries(self)

    # --- writing -----------------------------------------------------------------------------

    def apply_event(self, event: KvEvent) -> bool:
        """Apply one KV event; never raises on inconsistent input (see `stats`).

        Returns False only for a store whose parent block this worker is not known to hold (an
        orphan, dropped): the view of that worker lost blocks its engine still has.
        """
        if isinstance(event, BlocksStored):
            return self._store(event)
        if isinstance(event, BlocksRemoved):
            self.stats.removed_events += 1
            self._remove(event.worker, event.engine_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.stats.cleared_events += 1
            self.clear_worker(event.worker)
        else:
            raise TypeError(f"not a KV event: {type(event).__name__}")
        return True

    def clear_worker(self, worker: Worker) -> None:
        """Forget every block of `worker` but keep its slot."""
        self.writes += 1
        slot = self._slot.get(worker)
        if slot is None:
            return
        if not self._counts[slot]:
            return
        nodes = _held_runs(self, slot).get(slot, [])
        for node in nodes:
            self._unname(slot, node, 0)
        self._own[slot].clear()
        self._aliases[slot].clear()
        self._counts[slot] = 0
        clear = ~(1 << slot)
        for node in nodes:
            node.workers &= clear
            node.partial &= clear
            del node.eids[slot]
        for node in nodes:
            self._settle(node)

    def remove_worker(self, worker: Worker) -> None:
        """Forget `worker` entirely; its slot is reused by the next new worker."""
        self.writes += 1
        if worker not in self._slot:
            return
        self.clear_worker(worker)
        slot = self._slot.pop(worker)
        self._worker_at[slot] = None
        self._own[slot], self._aliases[slot] = {}, {}
        while self._worker_at and self._worker_at[-1] is None:
            self._worker_at.pop()
            self._own.pop()
            self._aliases.pop()
            self._counts.pop()

    def _slot_of(self, worker: Worker) -> int:
        slot = self._slot.get(worker)
        if slot is None:
            try:
                slot = self._worker_at.index(None)
                self._worker_at[slot] = worker
                self._own[slot] = {}
                self._aliases[slot] = {}
                self._counts[slot] = 0
            except ValueError:
                slot = len(self._worker_at)
                self._worker_at.append(worker)
                self._own.append({})
                self._aliases.append({})
                self._counts.append(0)
            self._slot[worker] = slot
        return slot

    def _store(self, event: BlocksStored) -> bool:
        es, hs = columns(event.blocks)
        return self.store_blocks(event.worker, event.parent_hash, es, hs)

    def store_blocks(self, worker: Worker, parent_hash: int | None, es: list[int], hs: list[int]) -> bool:
        """`apply_event(BlocksStored(...))` for blocks given as engine ids `es` and local hashes `hs`
        (equal lengths; no block objects: what the approximate indexer predicts). Walks them along
        the runs in bulk; anything unusual goes block by block."""
        self.stats.stored_events += 1
        self.writes += 1
        slot = self._slot_of(worker)
        root = self._root
        if parent_hash is None:
            node, end = root, 0
        else:
            found = self._locate(slot, parent_hash)
            if found is None:
                self.stats.unknown_parent += 1
                return False
            node, end = found
            end += 1
        n = len(hs)
        if not n:
            return True
        bit = 1 << slot
        touched: list[_Node] = []
        added = 0
        i = 0
        while i < n:
            run = node.hashes
            if end < len(run):  # inside a run: follow it while it agrees
                k = _common(run, end, hs, i, min(len(run) - end, n - i))
                if not k:  # the event branches off here
                    node = self._split(node, end)[0]
                    touched.append(node)  # may now hold what its parent holds
                    continue
                stop = end + k
                ids = node.eids.get(slot)
                if ids is not None and end < len(ids):  # held already: a repeat, unless ids differ
                    upto = min(len(ids), stop)
                    if ids[end:upto] != es[i : i + upto - end]:
                        break
                    i += upto - end
                    end = upto
                    if end == stop:
                        continue
                # the worker holds the run up to `end` (a held position is in what it holds)
                assert end == (0 if ids is None else len(ids))
                seg = es[i : i + stop - end]
                named = None
                for holder, other in node.eids.items():  # another holder names these blocks alike:
                    if other is not ids and len(other) >= stop:  # keep one copy of the ints
                        if other[end:stop] == seg:
                            seg = other[end:stop]
                            named = self._named_alike(slot, holder, seg)
                        break
                if named is None:
                    named = self._name(slot, node, end, seg)
                    if named is None:
                        break
                if ids is None:
                    node.eids[slot] = seg
                else:
                    ids += seg
                if stop == len(run):
                    node.workers |= bit
                    node.partial &= ~bit
                else:
                    node.partial |= bit
                self._add_names(slot, named)
                touched.append(node)
                added += stop - end
                i += stop - end
                end = stop
                continue
            children = node.children
            child = None if children is None else children.get(hs[i])
            if child is not None:
                node, end = child, 0
                continue
            seg = es[i:] if i else es
            if node is not root and children is None and node.workers & bit:  # extend the leaf
                named = self._name(slot, node, len(node.hashes), seg)
                if named is None:
                    break
                node.hashes += hs[i:] if i else hs
                node.eids[slot] += seg
                if node.workers != bit:  # the other full holders now hold a prefix
                    node.partial |= node.workers ^ bit
                    node.workers = bit
            else:
                new = _Node(node, hs[i:] if i else hs, bit, {})
                named = self._name(slot, new, 0, seg)
                if named is None:
                    break
                new.eids[slot] = seg
                if children is None:
                    node.children = {hs[i]: new}
                else:
                    children[hs[i]] = new
                self._num_nodes += 1
            self._add_names(slot, named)
            added += n - i
            i = n
        self.stats.stored_blocks += added
        self._counts[slot] += added
        if i < n:  # a reused or repeated engine id: the rest block by block, from a stable name
            before = es[i - 1] if i else parent_hash
            for node in touched:
                self._settle(node)
            self._store_slow(slot, before, hs, es, i)
            return True
        for node in touched:
            self._settle(node)
        return True

    def _store_slow(self, slot: int, before: int | None, hs: list[int], es: list[int], i: int) -> None:
        """Stores blocks i.. one at a time after the block the worker names `before` (None: root)."""
        if before is None:
            node, end = self._root, 0
        else:
            node, end = self._locate_held(slot, before)
            end += 1
        for j in range(i, len(hs)):
            node, end = self._store_one(slot, node, end, es[j], hs[j])

    def _store_one(
        self, slot: int, node: _Node, end: int, engine_hash: int, local_hash: int
    ) -> tuple[_Node, int]:
        """Stores one block after position (node, end); returns the position after it."""
        bit = 1 << slot
        own = self._own[slot]
        aliases = self._aliases[slot]
        target: _Node | None = None
        cut = None
        off = 0
        if end < len(node.hashes):
            if node.hashes[end] == local_hash:
                target, off = node, end
            else:
                node = cut = self._split(node, end)[0]
        if target is None and node.children is not None:
            target = node.children.get(local_hash)
        first = engine_hash
        held = 0
        if target is not None:
            held = len(target.eids.get(slot, ()))
            if off < held:
                first = target.eids[slot][off]
                if first == engine_hash or aliases.get(engine_hash) == first:
                    return target, off + 1  # a repeat
        pending = self._detach(slot, engine_hash)  # the engine reused the id: release it after
        if target is None:
            if node is not self._root and node.children is None and node.workers & bit:
                node.hashes.append(local_hash)
                node.eids[slot].append(engine_hash)
                _recount(node)
                target = node
            else:
                target = _Node(node, [local_hash], bit, {slot: [engine_hash]})
                if node.children is None:
                    node.children = {}
                node.children[local_hash] = target
                self._num_nodes += 1
            own[engine_hash] = target  # the worker's own name: this path is rare
        elif off < held:
            aliases[engine_hash] = first
        else:  # the next block of the run after those the worker holds (off == held)
            ids = target.eids.get(slot)
            if ids is None:
                target.eids[slot] = [engine_hash]
            else:
                ids.append(engine_hash)
            own[engine_hash] = target
            _recount(target)
        self.stats.stored_blocks += 1
        self._counts[slot] += 1
        self._settle(target)
        if cut is not None:
            self._settle(cut)
        if pending is not None:
            self._release(slot, {own[pending]: {pending: None}})
        found = self._locate(slot, first)
        assert found is not None
        return found[0], found[1] + 1

    def _detach(self, slot: int, engine_hash: int) -> int | None:
        """Unnames a block (no structural change); returns a stand-in key if the worker loses it."""
        aliases = self._aliases[slot]
        if aliases.pop(engine_hash, None) is not None:
            self._counts[slot] -= 1
            return None
        found = self._held_at(slot, engine_hash)
        if found is None:
            return None
        node, off = found
        if aliases and self._promote(slot, engine_hash, node):
            return None
        # Holds the place until released; splits re-point it like an engine id. Typed as one: it
        # lives only until `_store_one` releases it, so no reader of the maps ever sees it.
        token = cast(int, object())
        self._unname_one(slot, node, engine_hash, off)
        node.eids[slot][off] = token
        self._own[slot][token] = node
        return token

    def _promote(self, slot: int, engine_hash: int, node: _Node) -> bool:
        """If `engine_hash` has aliases, the oldest takes its place; the block stays held."""
        aliases = self._aliases[slot]
        alias = next((a for a, first in aliases.items() if first == engine_hash), None)
        if alias is None:
            return False
        del aliases[alias]
        for other, first in aliases.items():
            if first == engine_hash:
                aliases[other] = alias
        ids = node.eids[slot]
        off = _index(ids, engine_hash)
        self._unname_one(slot, node, engine_hash, off)
        ids[off] = alias
        self._own[slot][alias] = node
        self._counts[slot] -= 1
        return True

    def _remove(self, worker: Worker, engine_hashes: Iterable[int]) -> None:
        self.writes += 1
        slot = self._slot.get(worker)
        if slot is None:
            self.stats.unknown_removal += sum(1 for _ in engine_hashes)
            return
        own = self._own[slot]
        aliases = self._aliases[slot]
        if type(engine_hashes) is tuple and len(engine_hashes) == 1 and not aliases:
            (engine_hash,) = engine_hashes
            node = own.get(engine_hash) if own else None
            shared = node is None
            if shared:
                node = self._shards[engine_hash & NAME_MASK].get(engine_hash)
            ids = None if node is None else node.eids.get(slot)
            if node is not None and ids is not None and ids[-1] == engine_hash:
                # The last block the worker holds there (engines evict leaf first): `_cut_end`
                # and `_unname` inlined for one block (the calls and slices cost 1.2 -> 2.0 us).
                self.stats.removed_blocks += 1
                self._counts[slot] -= 1
                bit = 1 << slot
                if not shared:
                    del own[engine_hash]
                elif not (node.workers | node.partial) & ~bit or not _named_at(
                    self._own, node, len(ids) - 1, engine_hash, slot
                ):
                    del self._shards[engine_hash & NAME_MASK][engine_hash]
                ids.pop()
                node.workers &= ~bit
                if ids:
                    node.partial |= bit
                else:
                    del node.eids[slot]
                    node.partial &= ~bit
                self._settle(node)
                return
        if not aliases:
            tails = _tails(own, self._names, slot, engine_hashes)
            if tails is not None:
                self._cut_tails(slot, tails)
                return
            by_node = _group_held(own, self._names, slot, engine_hashes)
            if by_node is not None:
                self.stats.removed_blocks += sum(map(len, by_node.values()))
                self._release(slot, by_node)
                return
        by_node = {}
        removed = unknown = 0
        for engine_hash in engine_hashes:
            found = self._held_at(slot, engine_hash)
            if found is None:
                if aliases and aliases.pop(engine_hash, None) is not None:
                    self._counts[slot] -= 1
                    removed += 1
                else:
                    unknown += 1
                continue
            node = found[0]
            if aliases and self._promote(slot, engine_hash, node):
                removed += 1
                continue
            named = by_node.get(node)
            if named is None:
                by_node[node] = {engine_hash: None}
            elif engine_hash in named:
                unknown += 1  # named twice in one event
                continue
            else:
                named[engine_hash] = None
            removed += 1
        self.stats.removed_blocks += removed
        self.stats.unknown_removal += unknown
        if by_node:
            self._release(slot, by_node)

    def _cut_tails(self, slot: int, tails: dict[_Node, int]) -> None:
        """The worker stops holding the last `k` blocks it holds in each run (`_tails`' plan):
        `_release` for the common case, where nothing splits."""
        for node, k in tails.items():
            self._cut_end(node, slot, len(node.eids[slot]) - k)
            self.stats.removed_blocks += k
        for node in tails:
            self._settle(node)

    def _cut_end(self, node: _Node, slot: int, lo: int) -> None:
        """The worker stops holding its blocks of `node` from offset `lo` on (the end of what it holds
        there); the caller settles the node."""
        ids = node.eids[slot]
        self._unname(slot, node, lo)
        self._counts[slot] -= len(ids) - lo
        bit = 1 << slot
        node.workers &= ~bit
        if lo:
            del ids[lo:]
            node.partial |= bit
        else:
            del node.eids[slot]
            node.partial &= ~bit

    def _release(self, slot: int, by_node: dict[_Node, dict[int, None]]) -> None:
        """The worker stops holding the named blocks (no aliases left): cut, split, settle.

        Blocks at the end of what the worker holds in a run only shorten its list; a block
        before others it keeps splits the run after it, so the worker holds a prefix of both.
        """
        cleared = []
        for node, names in by_node.items():
            ids = node.eids[slot]
            if len(names) == 1:
                (name,) = names
                lo = _index(ids, name)
                spans = [(lo, lo + 1)]
            elif names.keys() == set(ids[-len(names) :]):
                spans = [(len(ids) - len(names), len(ids))]  # the end of what it holds: leaf first
            else:
                if len(names) <= 4:
                    offsets = sorted(_index(ids, e) for e in names)
                else:
                    where = {e: i for i, e in enumerate(ids)}
                    offsets = sorted(where[e] for e in names)
                spans = []  # maximal ranges of consecutive offsets
                lo = prev = offsets[0]
                for o in offsets[1:]:
                    if o != prev + 1:
                        spans.append((lo, prev + 1))
                        lo = o
                    prev = o
                spans.append((lo, prev + 1))
            for lo, hi in reversed(spans):  # from the end, so `node` keeps the offsets of the rest
                if hi < len(node.eids[slot]):
                    node, lower = self._split(node, hi)
                    cleared.append(lower)  # may hold an earlier cut of this event
                self._cut_end(node, slot, lo)
                cleared.append(node)
        for node in cleared:
            self._settle(node)

    # --- runs --------------------------------------------------------------------------------

    def _locate(self, slot: int, engine_hash: int) -> tuple[_Node, int] | None:
        """(run, offset) of a block the worker names `engine_hash` (its id or an alias), or None."""
        found = self._held_at(slot, engine_hash)
        if found is None:
            first = self._aliases[slot].get(engine_hash)
            if first is None:
                return None
            found = self._held_at(slot, first)
        return found

    def _held_at(self, slot: int, engine_hash: int) -> tuple[_Node, int] | None:
        """(run, offset) where the worker holds `engine_hash` as its own id (not an alias), or None."""
        node = self._own[slot].get(engine_hash)
        if node is None:
            node = self._shards[engine_hash & NAME_MASK].get(engine_hash)
            if node is None:
                return None
        ids = node.eids.get(slot)
        if ids is None:
            return None
        if ids[-1] == engine_hash:
            return node, len(ids) - 1
        try:
            return node, ids.index(engine_hash)
        except ValueError:  # the shared name is another worker's
            return None

    # --- names: where a worker's engine id is (the module docstring's rule) -----------------

    def _name(self, slot: int, node: _Node, pos: int, seg: list[int]) -> _Names | None:
        """Names for the worker's new ids `seg`, about to sit at offsets pos.. of `node`: (shared,
        own) {id: node} maps; None if an id repeats or the worker already holds one."""
        fresh = dict.fromkeys(seg, node)
        if len(fresh) != len(seg) or not self._own[slot].keys().isdisjoint(fresh):
            return None
        aliases = self._aliases[slot]
        if aliases and not aliases.keys().isdisjoint(fresh):
            return None
        names = self._names
        if names.isdisjoint(seg):
            return fresh, None
        shared: dict[int, _Node] = {}
        own: dict[int, _Node] = {}
        for j, engine_hash in enumerate(seg):
            there = names.get(engine_hash)
            if there is None:
                shared[engine_hash] = node
            elif there is not node or not _named_at(self._own, node, pos + j, engine_hash, slot):
                ids = there.eids.get(slot)
                if ids is not None and engine_hash in ids:
                    return None  # the worker holds it under the shared name already
                own[engine_hash] = node
            # else: the holders naming it here do so at this offset: the shared name serves
        return shared, own

    def _named_alike(self, slot: int, holder: int, seg: list[int]) -> _Names | None:
        """`_name` when another holder names the same blocks with `seg` at the same offsets: if it
        does so under the shared names, nothing is added; None as `_name`'s."""
        if self._own[holder] and not self._own[holder].keys().isdisjoint(seg):
            return None  # let `_name` sort it out
        if self._own[slot] and not self._own[slot].keys().isdisjoint(seg):
            return None
        aliases = self._aliases[slot]
        if aliases and not aliases.keys().isdisjoint(seg):
            return None
        return None, None

    def _add_names(self, slot: int, named: _Names) -> None:
        shared, own = named
        if shared:
            self._names.update(shared)
        if own:
            self._own[slot].update(own)

    def _unname(self, slot: int, node: _Node, lo: int) -> None:
        """The worker is about to stop holding its blocks of `node` from offset `lo` on: drop their
        names (a shared one only when no other worker uses it)."""
        ids = node.eids[slot]
        hi = len(ids)
        own_maps = self._own
        # Other holders hold a prefix of the run each, so those naming the blocks alike keep the
        # shared names of offsets lo..kept between them; one naming them its own way: block by block.
        kept = lo
        for other, theirs in node.eids.items():
            top = min(len(theirs), hi)
            if other == slot or top <= kept:
                continue
            if theirs[kept:top] != ids[kept:top] or (
                own_maps[other] and not own_maps[other].keys().isdisjoint(ids[kept:top])
            ):
                kept = -1
                break
            kept = top
            if kept == hi:
                break
        own = own_maps[slot]
        names = self._names
        if kept < 0:
            for j, engine_hash in enumerate(ids[lo:], lo):
                if own.pop(engine_hash, None) is None and not _named_at(own_maps, node, j, engine_hash, slot):
                    del names[engine_hash]
        elif own:
            for engine_hash in ids[lo:kept]:
                own.pop(engine_hash, None)
            for engine_hash in ids[kept:]:
                if own.pop(engine_hash, None) is None:
                    del names[engine_hash]
        else:
            names.drop(ids[kept:])

    def _unname_one(self, slot: int, node: _Node, engine_hash: int, off: int) -> None:
        """`_unname` for one block, wherever it sits in what the worker holds."""
        if self._own[slot].pop(engine_hash, None) is None and not _named_at(
            self._own, node, off, engine_hash, slot
        ):
            del self._names[engine_hash]

    def _repoint(self, moved: list[tuple[int, list[int]]], node: _Node) -> None:
        """Names of the ids that moved to `node` in a split or a merge, as (slot, ids) pairs."""
        names = self._names
        done: list[int] | None = None
        for slot, ids in moved:
            own = self._own[slot]
            if own:
                for engine_hash in ids:
                    if engine_hash in own:
                        own[engine_hash] = node
                    else:
                        names[engine_hash] = node
            elif ids != done:  # holders naming the blocks alike share one update
                names.point(ids, node)
                done = ids

    def _locate_held(self, slot: int, engine_hash: int) -> tuple[_Node, int]:
        """`_locate` for an engine id the worker is known to hold (an alias's first id, a stored parent)."""
        found = self._locate(slot, engine_hash)
        assert found is not None, f"engine id {engine_hash} is not held in slot {slot}"
        return found

    def _split(self, node: _Node, k: int) -> tuple[_Node, _Node]:
        """Cuts `node` after its first k blocks into (upper, lower), one of them `node` itself.

        The cheaper side moves to a new node: its engine ids are re-pointed in every holder's
        map, and moving the tail also re-parents the children.
        """
        run = node.hashes
        eids = node.eids
        tail_ids = sum(max(0, len(ids) - k) for ids in eids.values())
        head_ids = sum(min(len(ids), k) for ids in eids.values())
        if tail_ids + len(node.children or ()) <= head_ids:
            lower = _Node(node, run[k:], 0, {})
            del run[k:]
            for slot, ids in eids.items():
                if len(ids) > k:
                    lower.eids[slot] = ids[k:]
                    del ids[k:]
            self._repoint(list(lower.eids.items()), lower)
            children = lower.children = node.children
            if children is not None:
                for child in children.values():
                    child.parent = lower
            node.children = {lower.hashes[0]: lower}
            upper = node
        else:
            parent = node.parent
            assert parent is not None and parent.children is not None
            upper = _Node(parent, run[:k], 0, {})
            del run[:k]
            for slot, ids in list(eids.items()):
                upper.eids[slot] = ids[:k]
                if len(ids) > k:
                    del ids[:k]
                else:
                    del eids[slot]
            self._repoint(list(upper.eids.items()), upper)
            parent.children[upper.hashes[0]] = upper
            upper.children = {run[0]: node}
            node.parent = upper
            lower = node
        _recount(upper)
        _recount(lower)
        self._num_nodes += 1
        return upper, lower

    def _merge(self, upper: _Node, lower: _Node) -> _Node:
        """Joins `lower`, the only child of `upper`, into one run; the shorter side moves.

        Only when every holder of `lower` holds all of `upper`, so each holder of the joined
        run still holds a prefix of it.
        """
        if len(lower.hashes) <= len(upper.hashes):
            upper.hashes += lower.hashes
            for slot, moved in lower.eids.items():
                upper.eids[slot] += moved
            self._repoint(list(lower.eids.items()), upper)
            children = upper.children = lower.children
            if children is not None:
                for child in children.values():
                    child.parent = upper
            lower.parent = None
            survivor = upper
        else:
            lower.hashes[:0] = upper.hashes
            for slot, moved in upper.eids.items():
                ids = lower.eids.get(slot)
                if ids is None:
                    lower.eids[slot] = moved
                else:
                    ids[:0] = moved
            self._repoint(list(upper.eids.items()), lower)
            grand = upper.parent
            assert grand is not None and grand.children is not None
            grand.children[upper.hashes[0]] = lower
            lower.parent = grand
            upper.parent = None
            survivor = lower
        _recount(survivor)
        self._num_nodes -= 1
        return survivor

    def _settle(self, node: _Node) -> None:
        """After `node`'s holders changed: cut blocks nobody holds off leaves (unlinking empty
        ones, upward), merge runs that need no cut."""
        root = self._root
        while (parent := node.parent) is not None:  # not the root, nor a run already unlinked
            if node.children is None and node.partial and not node.workers:
                del node.hashes[max(map(len, node.eids.values())) :]
                _recount(node)
            if not node.eids and node.children is None:
                assert parent.children is not None
                del parent.children[node.hashes[0]]
                if not parent.children:
                    parent.children = None
                node.parent = None
                self._num_nodes -= 1
                node = parent
                continue
            assert parent.children is not None
            if (
                parent is not root
                and len(parent.children) == 1
                and not (node.workers | node.partial) & ~parent.workers
            ):
                node = self._merge(parent, node)
                continue
            children = node.children
            if children is not None and len(children) == 1:
                (child,) = children.values()
                if not (child.workers | child.partial) & ~node.workers:
                    node = self._merge(node, child)
                    continue
            return

    # --- snapshots ---------------------------------------------------------------------------

    def dump_events(self) -> list[KvEvent]:
        """Events that rebuild an identical tree in an empty RadixTree (`radix_dump.dump_events`; in
        slices: `radix_dump.dump_slices`)."""
        return _dump_events(self)


def _recount(node: _Node) -> None:
    """Recomputes the bitmasks of full and partial holders from the lists."""
    size = len(node.hashes)
    full = part = 0
    for slot, ids in node.eids.items():
        if len(ids) == size:
            full |= 1 << slot
        else:
            part |= 1 << slot
    node.workers, node.partial = full, part
