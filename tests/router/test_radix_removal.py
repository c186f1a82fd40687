"""Removal events cost what they remove (issue 22): a removal that names, leaf first, the last blocks a
worker holds in each run takes the sliced path (`_tails` / `_cut_tails`), and must leave exactly the
tree, maps and counters the general path leaves, for every shape of event an engine or an attacker
can send (runs cut short, ids named twice, unknown ids, blocks before others the worker keeps)."""

from __future__ import annotations

import random

from extproc.router import radix
from extproc.router.radix import RadixTree
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, Worker

WORKERS = [Worker(f"w{i}") for i in range(3)]


def stored(worker: Worker, pairs) -> BlocksStored:
    return BlocksStored(worker, tuple(StoredBlock(e, h) for e, h in pairs))


def build(rng: random.Random) -> tuple[list[BlocksStored], dict[Worker, list[list[int]]]]:
    """Stored events of chats sharing prefixes over three workers; each worker's requests' engine ids."""
    events: list[BlocksStored] = []
    requests: dict[Worker, list[list[int]]] = {w: [] for w in WORKERS}
    prompts: list[list[int]] = []
    next_id = 1
    for _ in range(rng.randint(4, 10)):
        if prompts and rng.random() < 0.7:  # a later turn: a prefix of an earlier prompt, then more
            base = rng.choice(prompts)
            prompt = base[: rng.randint(1, len(base))] + [
                rng.randint(1, 50) for _ in range(rng.randint(0, 6))
            ]
        else:
            prompt = [rng.randint(1, 50) for _ in range(rng.randint(1, 8))]
        prompts.append(prompt)
        worker = rng.choice(WORKERS)
        ids = list(range(next_id, next_id + len(prompt)))
        next_id += len(prompt)
        events.append(
            BlocksStored(worker, tuple(StoredBlock(e, h) for e, h in zip(ids, prompt, strict=True)))
        )
        requests[worker].append(ids)
    return events, requests


def removal(rng: random.Random, worker: Worker, requests: list[list[int]]) -> BlocksRemoved:
    """A removal of one of the shapes engines send (a request's blocks leaf first, or some of them)
    or that only a broken or hostile sender would (shuffled, repeated, unknown ids)."""
    ids = rng.choice(requests) if requests else [999_999]
    shape = rng.randrange(6)
    if shape == 0:
        named = ids[::-1]  # the whole request, leaf first
    elif shape == 1:
        named = ids[::-1][: rng.randint(1, len(ids))]  # its last blocks
    elif shape == 2:
        named = [rng.choice(ids)]  # one block, maybe in the middle
    elif shape == 3:
        named = [*ids[::-1], ids[-1]]  # a block named twice
    elif shape == 4:
        named = [*ids[::-1][: rng.randint(1, len(ids))], 10**9 + rng.randint(0, 9)]  # an unknown id
    else:
        named = rng.sample(ids, rng.randint(1, len(ids)))  # any order
    return BlocksRemoved(worker, tuple(named))


def state(tree: RadixTree, events: list[BlocksStored]) -> tuple:
    matches = [tree.find_matches([b.local_hash for b in ev.blocks]) for ev in events]
    return (matches, tree.dump_events(), tree.num_nodes, tree.stats, sorted(tree.entries(), key=repr))


def test_the_sliced_removal_leaves_what_the_general_path_leaves(monkeypatch) -> None:
    real = radix._tails
    planned = refused = 0

    def counted(*args):
        nonlocal planned, refused
        plan = real(*args)
        planned += plan is not None
        refused += plan is None
        return plan

    for seed in range(150):
        rng = random.Random(seed)
        events, requests = build(rng)
        removals = [
            removal(rng, w, requests[w]) for w in (rng.choice(WORKERS) for _ in range(rng.randint(1, 8)))
        ]
        monkeypatch.setattr(radix, "_tails", counted)
        sliced = RadixTree()
        for ev in [*events, *removals]:
            sliced.apply_event(ev)
        monkeypatch.setattr(radix, "_tails", lambda *_: None)  # every removal on the general path
        general = RadixTree()
        for ev in [*events, *removals]:
            general.apply_event(ev)
        assert state(sliced, events) == state(general, events), f"seed {seed}"
    assert planned > 30 and refused > 30  # both paths were taken, many times (one-block events: neither)


def test_a_request_removed_leaf_first_across_runs_takes_the_sliced_path(monkeypatch) -> None:
    tree = RadixTree()
    w0, w1 = WORKERS[0], WORKERS[1]
    tree.apply_event(stored(w0, [(1, 7), (2, 8), (3, 9), (4, 10)]))
    tree.apply_event(stored(w1, [(11, 7), (12, 8), (13, 20)]))  # diverges after two blocks: splits w0's run
    calls: list[list | None] = []
    real = radix._tails

    def spy(*args):
        plan = real(*args)
        calls.append([(list(node.hashes), k) for node, k in plan.items()] if plan is not None else None)
        return plan

    monkeypatch.setattr(radix, "_tails", spy)
    tree.apply_event(BlocksRemoved(w0, (4, 3, 2)))  # the tail of the lower run, then one of the upper
    assert calls == [[([9, 10], 2), ([7, 8], 1)]]  # both cuts planned from slices, leaf first
    assert tree.find_matches([7, 8, 9, 10]) == {w0: 1, w1: 2}
    assert tree.find_matches([7, 8, 20]) == {w0: 1, w1: 3}
    assert tree.stats.removed_blocks == 3 and tree.stats.unknown_removal == 0
    tree.apply_event(BlocksRemoved(w0, (2, 1)))  # 2 is gone already: refused here, counted there
    assert calls[-1] is None and len(calls) == 2
    assert tree.stats.unknown_removal == 1 and tree.stats.removed_blocks == 4
    assert tree.find_matches([7, 8, 20]) == {w1: 3}
