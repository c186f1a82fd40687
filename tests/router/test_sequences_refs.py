"""ActiveSequences' blocks in flight follow the requests exactly, however they come and go.

A worker's active blocks (each counted once, KV reuse assumed), the request's new blocks on it and
the workers holding a prompt's first block, against a model computed from scratch over the
requests in flight: shared prefixes, a worker's last request leaving, workers removed.
"""

import random

import pytest

from extproc.router import ActiveSequences, Worker
from extproc.router.hashing import compute_sequence_hashes

B = 16


@pytest.mark.parametrize("seed", range(8))
def test_blocks_in_flight_match_the_requests_in_flight(seed):
    rng = random.Random(seed)
    workers = [Worker(w) for w in range(3)]
    seqs = ActiveSequences(B)
    stems = [[rng.randrange(4)] for _ in range(3)]
    paths = [
        compute_sequence_hashes(s + [rng.randrange(5) for _ in range(rng.randint(0, 8))]) for s in stems * 8
    ]
    sent = [*paths, []]  # and prompts shorter than a block, which hold none
    live: dict[str, tuple[Worker, list[int]]] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.45 and live:
            request_id = rng.choice(sorted(live))
            assert seqs.free(request_id)
            del live[request_id]
        elif op < 0.5:
            worker = rng.choice(workers)
            assert sorted(seqs.remove_worker(worker)) == sorted(
                r for r, (w, _) in live.items() if w == worker
            )
            live = {r: v for r, v in live.items() if v[0] != worker}
        else:
            worker, keys = rng.choice(workers), rng.choice(sent)
            assert seqs.add_request(f"r{step}", worker, keys, len(keys) * B + 3, 0)
            live[f"r{step}"] = (worker, keys)
        for worker in workers:
            held = {k for w, keys in live.values() if w == worker for k in keys}
            tails = sum(w == worker for w, _ in live.values())  # each request's own partial block
            assert seqs.decode_blocks(worker) == len(held) + tails
            assert seqs.num_requests(worker) == sum(w == worker for w, _ in live.values())
            for probe in paths[:6]:
                n = 0
                while n < len(probe) and probe[n] in held:
                    n += 1
                assert seqs.new_blocks(worker, probe, len(probe) * B + 1) == len(probe) - n + 1
        for probe in paths[:6]:
            want = {w for w, keys in live.values() if keys and keys[0] == probe[0]}
            assert set(seqs.holders_of(probe)) == want
    assert all(seqs.free(r) for r in list(live))
    assert seqs.is_idle() and all(seqs.decode_blocks(w) == 0 for w in workers)
