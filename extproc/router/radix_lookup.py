"""Which blocks an event names, in the runs of the radix tree (`radix.py`): plain list lookups.

Pure and small: the removal's plan by run (`tails`, the common case, by slices; `group_held`, the
general grouping), the common length of two runs (`common`, by slices and a binary search), an
engine id's offset in a run (`index`) and whether another worker names a block alike there
(`named_at`). They read runs (radix.py's `_Node`: their `eids`) and change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby
from operator import itemgetter
from typing import Any

from extproc.router.radix_names import ShardedNames

# A run of the tree (radix.py's _Node): read for its `eids` (slot -> the worker's engine ids there).
# Typed loosely so that this module does not import the tree's (no import cycle).
Run = Any


def tails(
    own: dict[int, Run], names: ShardedNames[Run], slot: int, engine_hashes: Iterable[int]
) -> dict[Run, int] | None:
    """The removal as {run: k}, when it names, leaf first, the last k blocks the worker holds in
    each run (what an engine evicting a request's blocks sends); None otherwise (an unknown id, one
    named twice, a block before others it keeps: the general path decides and counts).

    Compares slices, not ids one by one, so a removal costs about its runs, not its blocks."""
    hs = list(engine_hashes)
    n = len(hs)
    taken: dict[Run, int] = {}
    i = 0
    while i < n:
        node = own.get(hs[i]) if own else None
        if node is None:
            node = names.get(hs[i])
            if node is None:
                return None
        ids = node.eids.get(slot)
        if ids is None:  # the shared name of another worker's block
            return None
        end = len(ids) - taken.get(node, 0)  # what the worker still holds there, once planned cuts are made
        if end <= 0 or ids[end - 1] != hs[i]:
            return None
        k = min(end, n - i)
        tail = ids[end - k : end]
        tail.reverse()
        same = common(tail, 0, hs, i, k)
        taken[node] = len(ids) - end + same
        i += same
    return taken


def group_held(
    own: dict[int, Run], shared: ShardedNames[Run], slot: int, engine_hashes: Iterable[int]
) -> dict[Run, dict[int, None]] | None:
    """The named engine ids by run, or None if the worker does not hold one or one is named twice
    (the slow path counts). `own` and `shared`: the worker's own map and the shared names.

    Lookups and grouping run in C over the runs of consecutive ids in one run (a removal names a
    request's blocks leaf first), so a removal costs what it removes.
    """
    hashes = engine_hashes if type(engine_hashes) is tuple else tuple(engine_hashes)
    try:
        if own:
            nodes = [own[h] if h in own else shared[h] for h in hashes]
        else:
            nodes = list(map(shared.__getitem__, hashes))
    except KeyError:
        return None
    by_node: dict[Run, dict[int, None]] = {}
    for node, group in groupby(zip(nodes, hashes, strict=True), _first):
        names = dict.fromkeys(map(_second, group))
        named = by_node.get(node)
        if named is None:
            by_node[node] = names
        else:
            named.update(names)
    if sum(map(len, by_node.values())) != len(hashes):
        return None
    for node, named in by_node.items():  # a shared name may be another worker's
        ids = node.eids.get(slot)
        if ids is None or not named.keys() <= set(ids):
            return None
    return by_node


_first = itemgetter(0)
_second = itemgetter(1)


def common(run: list[int], a: int, q: list[int], b: int, limit: int) -> int:
    """How many of run[a:a+limit] equal q[b:b+limit] before the first difference."""
    if run[a : a + limit] == q[b : b + limit]:
        return limit
    lo, hi = 0, limit - 1  # run[a:a+lo] matches; the answer is at most hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if run[a + lo : a + mid] == q[b + lo : b + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def index(ids: list[int], engine_hash: int) -> int:
    """Offset of an engine id in a run (most lookups are for its last block)."""
    if ids[-1] == engine_hash:
        return len(ids) - 1
    return ids.index(engine_hash)


def named_at(own: list[dict[int, Run]], node: Run, off: int, engine_hash: int, exclude: int) -> bool:
    """Whether a holder of `node` other than slot `exclude` holds `engine_hash` at offset `off` under
    the shared name (not in its own map)."""
    for slot, ids in node.eids.items():
        if slot != exclude and len(ids) > off and ids[off] == engine_hash and engine_hash not in own[slot]:
            return True
    return False
