"""A radix tree read whole: the runs each worker holds, its entries, the events that rebuild it.

Pure, like `radix.py`, whose runs (`_Node`: `hashes`, `eids`, `workers`, `partial`, `children`) and
per-worker state these functions read and never change. Snapshots (`dump_events`: durable state,
replica catch-up, `/debug`), tests (`entries`) and a worker's departure (`held_runs`) use them; a
route never does.

A durable replica writes its snapshot on the event loop that routes, so it dumps the tree in slices
(`dump_slices`) and lets routing run between them. Nothing between two slices may change the tree:
the tree counts the calls that write it (`RadixTree.writes`) and the dump raises `TreeChanged` when
that count moved, rather than hand out slices of two different trees.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator
from typing import Any

from extproc.router.types import BlocksRemoved, BlocksStored, KvEvent, StoredBlock, StoredBlocks, Worker

# radix.py's RadixTree and its runs (`_Node`), typed loosely so that this module does not import the
# tree's (radix.py imports this one: no import cycle), as radix_lookup.py does.
RadixTree = Any
Run = Any


class TreeChanged(RuntimeError):
    """The tree was written to between two slices of a dump: together they would describe no tree."""


def held_runs(tree: RadixTree, slot: int | None = None) -> dict[int, list[Run]]:
    """Runs each worker slot (or only `slot`) holds part of, parents before children.

    Walks every run: a worker may hold a run without its parent (after a removal in the middle).
    """
    return _step(_walk_held(tree, slot, 0)) or {}  # step 0: the walk ends in its first step


def _walk_held(tree: RadixTree, slot: int | None, step: int) -> Generator[None, None, dict[int, list[Run]]]:
    """`held_runs`, pausing (yielding) after every `step` runs visited (never when `step` is 0)."""
    held: dict[int, list[Run]] = {}
    stack = list((tree._root.children or {}).values())
    stack.reverse()
    visited = 0
    while stack:
        node = stack.pop()
        holders = node.workers | node.partial
        if slot is not None:
            if holders >> slot & 1:
                held.setdefault(slot, []).append(node)
        else:
            while holders:
                low = holders & -holders
                held.setdefault(low.bit_length() - 1, []).append(node)
                holders ^= low
        if node.children is not None:
            stack.extend(reversed(node.children.values()))
        visited += 1
        if visited == step:
            visited = 0
            yield
    return held


def entries(tree: RadixTree) -> Iterator[tuple[Worker, int, tuple[int, ...]]]:
    """Every (worker, engine id, local-hash path from the root) the tree holds."""
    held = held_runs(tree)
    for worker, slot in list(tree._slot.items()):
        for node in held.get(slot, ()):
            base = _path(node.parent)
            run = node.hashes
            for i, engine_hash in enumerate(node.eids[slot]):
                yield worker, engine_hash, base + tuple(run[: i + 1])
        for alias, first in tree._aliases[slot].items():
            node, off = tree._locate_held(slot, first)
            yield worker, alias, _path(node.parent) + tuple(node.hashes[: off + 1])


def dump_events(tree: RadixTree) -> list[KvEvent]:
    """Events that rebuild an identical tree in an empty RadixTree.

    One stored event per run a worker holds, then one per alias; parents come before
    children. A run whose parent block this worker does not hold is re-created after
    stand-in ancestors (negative engine ids, never used by engines, whose ids are unsigned,
    nor by the worker: a snapshot may have stored some) that are removed right after, so it
    stays unreachable as before.
    """
    return next(dump_slices(tree, sys.maxsize))  # one slice: nothing runs before it is whole


def dump_slices(tree: RadixTree, blocks_per_slice: int) -> Iterator[list[KvEvent]]:
    """`dump_events`' events in order, in lists of about `blocks_per_slice` blocks each.

    The walk that finds the held runs pauses too, every `blocks_per_slice` runs, handing out an
    empty list; a store and the removal of its stand-ins always share a slice. The last slice may be
    empty. Each resumption raises `TreeChanged` if the tree was written to since the dump started.
    """
    writes = tree.writes
    walk = _walk_held(tree, None, blocks_per_slice)
    while (held := _step(walk)) is None:
        yield []
        _unchanged(tree, writes)
    events: list[KvEvent] = []
    blocks = 0
    for worker, slot in list(tree._slot.items()):
        for chain, parent, ids, hashes in _held_blocks(tree, slot, held.get(slot, [])):
            blocks += _emit(events, worker, chain, ids, hashes, parent)
            if blocks >= blocks_per_slice:
                yield events
                _unchanged(tree, writes)
                events, blocks = [], 0
    yield events


def _held_blocks(
    tree: RadixTree, slot: int, runs: list[Run]
) -> Iterator[tuple[list[StoredBlock], int | None, list[int], list[int]]]:
    """What one stored event re-creates, for each of the slot's runs (parents first), then each alias:
    the stand-in chain, the parent engine id, the engine ids and their local hashes."""
    stand_ins = [0]
    for node in runs:
        chain, parent = _dump_parent(tree, slot, node, 0, stand_ins)
        ids = node.eids[slot]  # a prefix of the run
        yield chain, parent, list(ids), node.hashes[: len(ids)]
    for alias, first in tree._aliases[slot].items():
        node, off = tree._locate_held(slot, first)
        chain, parent = _dump_parent(tree, slot, node, off, stand_ins)
        yield chain, parent, [alias], [node.hashes[off]]


def _step(walk: Generator[None, None, dict[int, list[Run]]]) -> dict[int, list[Run]] | None:
    """One step of a walk: None where it paused, the held runs where it ended."""
    try:
        next(walk)
    except StopIteration as done:
        held: dict[int, list[Run]] = done.value
        return held
    return None


def _unchanged(tree: RadixTree, writes: int) -> None:
    if tree.writes != writes:
        raise TreeChanged(f"the tree was written to {tree.writes - writes} times during its dump")


def _dump_parent(
    tree: RadixTree, slot: int, node: Run, off: int, stand_ins: list[int]
) -> tuple[list[StoredBlock], int | None]:
    """Stand-in chain and parent engine id to re-store the block at `off` in `node`."""
    if off:
        return [], node.eids[slot][off - 1]
    chain: list[StoredBlock] = []
    up = node.parent
    parent = None
    aliases = tree._aliases[slot]
    while up is not None and up is not tree._root:
        ids = up.eids.get(slot, ())
        for h in reversed(up.hashes[len(ids) :]):
            stand_ins[0] -= 1
            # skip a negative id a snapshot stored
            while tree._held_at(slot, stand_ins[0]) or stand_ins[0] in aliases:
                stand_ins[0] -= 1
            chain.append(StoredBlock(stand_ins[0], h))
        if ids:
            parent = ids[-1]
            break
        up = up.parent
    chain.reverse()
    return chain, parent


def _emit(
    events: list[KvEvent],
    worker: Worker,
    chain: list[StoredBlock],
    engine_ids: list[int],
    local_hashes: list[int],
    parent: int | None,
) -> int:
    """One stored event of the blocks (new lists, the event's own) after their stand-in chain, and
    the chain's removal; returns the blocks stored. The blocks go as `StoredBlocks`: a named tuple
    per block was three quarters of dumping a tree of 2^20 entries (`benchmarks/bench_snapshot.py`)."""
    if not chain:
        events.append(BlocksStored(worker, StoredBlocks(engine_ids, local_hashes), parent))
        return len(engine_ids)
    stand_ins = [b.engine_hash for b in chain]
    blocks = StoredBlocks(stand_ins + engine_ids, [b.local_hash for b in chain] + local_hashes)
    events.append(BlocksStored(worker, blocks, parent))
    events.append(BlocksRemoved(worker, tuple(stand_ins)))
    return len(stand_ins) + len(engine_ids)


def _path(node: Run | None) -> tuple[int, ...]:
    runs = []
    while node is not None and node.parent is not None:
        runs.append(node.hashes)
        node = node.parent
    return tuple(h for run in reversed(runs) for h in run)
