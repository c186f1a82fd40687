"""Fuzz replica sync: other replicas' msgpack messages with hostile fields: format 1 lifecycle
(add, prefill, free, bye) without a sequence, as a version-1 replica sends it, and sequenced
messages (format 1 and 2: also heartbeats, wants and state parts, numbers skipped and repeated,
incarnations changing), and format 3 batches of lifecycle ops (hashes packed or listed).

Promise (extproc/events/replica_sync.py): `handle` never raises; each message is applied (counted
`sync.applied`; a batch may also count `sync.apply_failed` once per op the router refused, as
single messages would), dropped as `sync.malformed` or `sync.apply_failed`, or ignored as this
replica's own. No state leaks: no worker's load goes negative, and once every other replica said `bye` the
router tracks nothing and is idle again.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from extproc.events.counters import EventCounters
from extproc.events.replica_sync import ReplicaSync
from extproc.events.replica_wire import V1, V3, VERSION
from extproc.router import KvRouter, WorkerSpec
from tests.fuzz.gen import chance, integer, msgpack_value, mutate, pack, pick
from tests.fuzz.harness import (
    SHRINKING_SHARE,
    Check,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
    sync_session,
    tally,
)
from tests.fuzz.router_checks import check_loads, make_router

ME = "me"
ORIGINS = ("r1", "r1", "r2", ME, "r1:a", "")  # "r1:a" + id "b" and "r1" + id "a:b" name one key
OPS = (
    "add",
    "add",
    "add",
    "prefill",
    "free",
    "free",
    "bye",
    "other",
    "hb",
    "want",
    "state",
    "batch",
    "batch",
)
LEGACY_OPS = ("add", "prefill", "free", "bye")
WORDS = ("v", "router", "op", "id", "worker", "dp", "hashes", "isl", "overlap", "eot", "boot", "seq", "n",
         "digest", "lease_s", "from", "part", "parts", "reqs", "ops", *OPS, *ORIGINS)  # fmt: skip
OUTCOME_KEYS = ("sync.applied", "sync.malformed", "sync.apply_failed")
CONFIGS = ({}, {"prefill_load_model": "timing"}, {"router_track_output_blocks": True, "block_size": 1})

OUTCOMES = {
    "sync.applied": "decoded",
    "sync.malformed": "rejected",
    "sync.apply_failed": "rejected",
    "": "own",
}

Case = tuple[int, list[bytes]]  # router config index, messages


class _Messages:
    def __init__(self, r: random.Random, hostility: float) -> None:
        self.r = r
        self.hostility = hostility
        self.seqs: dict[str, dict[int, int]] = {}  # origin -> boot -> last seq

    def value(self, good: Any) -> Any:
        r = self.r
        return (
            (integer(r) if chance(r, 0.5) else msgpack_value(r, WORDS)) if chance(r, self.hostility) else good
        )

    def batch_op(self) -> list[Any]:
        r = self.r
        code = pick(r, (0, 0, 1, 2, 2))
        request_id = self.value(pick(r, ("a", "b", "a:b", "")))
        if code != 0:
            return [self.value(code), request_id]
        hashes = [r.randint(0, 9) for _ in range(r.randint(0, 4))]
        wire = b"".join(h.to_bytes(8, "little") for h in hashes) if chance(r, 0.7) else hashes
        return [code, request_id, self.value(pick(r, ("w0", "w1", "w2"))), self.value(pick(r, (0, 0, 1))),
                self.value(wire), self.value(r.randint(0, 300)), self.value(r.randint(0, 4)),
                self.value(None if chance(r, 0.5) else r.randint(0, 100))]  # fmt: skip

    def message(self) -> dict[str, Any]:
        r = self.r
        origin = pick(r, ORIGINS)
        sequenced = chance(r, 0.6)
        op = pick(r, OPS if sequenced else LEGACY_OPS)
        message: dict[str, Any] = {
            "v": self.value(
                V3 if op == "batch" else VERSION if op in ("hb", "want", "state") or chance(r, 0.2) else V1
            ),
            "router": self.value(origin),
            "op": self.value(op),
        }
        if sequenced:
            boots = self.seqs.setdefault(origin, {})
            boot = pick(r, (1, 1, 1, 2))
            seq = boots.get(boot, 0) + pick(r, (1, 1, 1, 1, 2, 0, -3))
            boots[boot] = max(seq, 0)
            message.update(boot=self.value(boot), seq=self.value(seq))
        if op in ("add", "prefill", "free", "other"):
            message["id"] = self.value(pick(r, ("a", "b", "a:b", "")))
        if op == "add":
            message.update(
                worker=self.value(pick(r, ("w0", "w1", "w2"))),
                dp=self.value(pick(r, (0, 0, 1))),
                hashes=self.value([r.randint(0, 9) for _ in range(r.randint(0, 4))]),
                isl=self.value(r.randint(0, 300)),
                overlap=self.value(r.randint(0, 4)),
                eot=self.value(None if chance(r, 0.5) else r.randint(0, 100)),
            )
        elif op == "hb":
            message.update(n=self.value(r.randint(0, 3)), digest=self.value(integer(r)),
                           lease_s=self.value(pick(r, (5.0, 0.0, 1e308, -1))))  # fmt: skip
        elif op == "want":
            message["from"] = self.value(pick(r, (ME, "*", "r1")))
        elif op == "batch":
            message["ops"] = self.value([self.batch_op() for _ in range(r.randint(0, 6))])
        elif op == "state":
            parts = pick(r, (1, 1, 2))
            reqs = [
                [pick(r, ("a", "b", "c")), pick(r, ("w0", "w1", "w9")), pick(r, (0, 1)),
                 [r.randint(0, 9) for _ in range(r.randint(0, 3))], r.randint(0, 300), r.randint(0, 2),
                 None, chance(r, 0.5)]
                for _ in range(r.randint(0, 3))
            ]  # fmt: skip
            message.update(
                part=self.value(pick(r, (0, 0, 1))), parts=self.value(parts), reqs=self.value(reqs)
            )
        for key in list(message):
            if chance(r, self.hostility / 4):
                del message[key]
        return message


def generate(r: random.Random) -> Case:
    messages = _Messages(r, pick(r, (0.0, 0.03, 0.15)))
    out = []
    for _ in range(r.randint(1, 10)):
        roll = r.random()
        if roll < 0.85:
            out.append(pack(messages.message()))
        elif roll < 0.93:
            out.append(mutate(r, pack(messages.message())))
        elif roll < 0.97:
            out.append(pack(msgpack_value(r, WORDS)))
        else:
            out.append(r.randbytes(r.randint(0, 30)))
    return r.randrange(len(CONFIGS)), out


def _router(config: int) -> KvRouter:
    settings = dict(CONFIGS[config])
    block = settings.pop("block_size", 16)
    return make_router([WorkerSpec("w0", dp_ranks=(0, 1)), WorkerSpec("w1")], block, **settings)


def check(case: Case) -> Outcome:
    config, messages = case
    router = _router(config)
    counters = EventCounters()
    sync = ReplicaSync(None, router, ME, "active_sequences", counters=counters)  # type: ignore[arg-type]
    outcomes = []
    for data in messages:
        before = counters.snapshot()
        sync.handle(data, now=0.0)
        after = counters.snapshot()
        rose = {k: after[k] - before.get(k, 0) for k in OUTCOME_KEYS if after.get(k, 0) != before.get(k, 0)}
        failed_ops = {"sync.applied": 1, "sync.apply_failed": rose.get("sync.apply_failed", 0)}
        assert rose in (
            {},
            {"sync.applied": 1},
            {"sync.malformed": 1},
            {"sync.apply_failed": 1},
            failed_ops,
        ), rose
        outcomes.append(OUTCOMES[next(iter(rose), "")])
        check_loads(router)
    for origin in {*ORIGINS, *sync.tracked_remote()}:
        sync.handle(pack({"v": V1, "router": origin, "op": "bye"}))
    assert not sync.tracked_remote(), sync.tracked_remote()
    assert router.is_idle(), "a remote request outlived every replica's bye"
    return tally(outcomes)


TARGET = Target("replica_sync", generate, sync_session(check), lambda case: repr(case)[:2000])
check_target = session_fixture(TARGET)


@fuzz_settings()
@given(seed=st.integers(min_value=0))
def test_replica_sync_applies_or_counts_and_leaks_nothing(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE)
@given(st.randoms(use_true_random=False))
def test_replica_sync_applies_or_counts_and_leaks_nothing_shrinking(
    check_target: Check, r: random.Random
) -> None:
    check_target(TARGET.generate(r))


def test_generated_messages_reach_every_outcome() -> None:
    total: dict[str, int] = {}
    for i in range(200):
        for key, n in check(generate(random.Random(i))).items():
            total[key] = total.get(key, 0) + n
    assert min(total.get(k, 0) for k in ("decoded", "rejected", "own")) > 50, total
