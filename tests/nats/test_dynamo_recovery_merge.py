"""How local-indexer answers and live events merge (extproc.events.dynamo_recovery), one case at a time.

The worker side is scripted here (its answers in Dynamo's WorkerKvQueryResponse shapes, its advertised
sources as Dynamo's file discovery writes them); tests/nats/test_dynamo_recovery.py runs the same code
against Dynamo's own worker. What is asserted is what reaches the event sink: which events, in which
order, once each, and when the worker is reset.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from extproc.events.counters import EventCounters
from extproc.events.dynamo_recovery import (
    EVENTS,
    TOO_NEW,
    TREE_DUMP,
    IndexerAnswer,
    LocalIndexerRecovery,
    QueryTarget,
    read_file_sources,
)
from extproc.router.types import BlocksStored, KvEvent, StoredBlock, Worker

W8 = Worker("8")
TARGET = QueryTarget(wire_worker=8, dp_rank=0, publisher_id=1, host="127.0.0.1", port=1, path="p")


class Sink:
    """Records what the recovery hands to the router, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def apply_events(self, events: Iterable[KvEvent]) -> None:
        self.log += [("apply", e.event_id) for e in events]

    def reset_worker(self, worker: Worker, reason: str) -> None:
        self.log.append(("reset", worker))

    def stream_state(self, worker: Worker, up: bool, reason: str) -> None:
        self.log.append(("up" if up else "down", worker))

    def applied(self) -> list[int | None]:
        return [x for kind, x in self.log if kind == "apply"]


def raw(event_id: int, block: int) -> dict[str, Any]:
    """A RouterEvent of worker 8 storing one block (Dynamo's shape)."""
    stored = {
        "parent_hash": None,
        "start_position": None,
        "blocks": [{"block_hash": block, "tokens_hash": block}],
    }
    return {
        "worker_id": 8,
        "storage_tier": "device",
        "event": {"event_id": event_id, "data": {"stored": stored}},
    }


def live(event_id: int) -> BlocksStored:
    return BlocksStored(W8, (StoredBlock(event_id, event_id),), None, event_id)


def dump(last: int, *blocks: int) -> IndexerAnswer:
    return IndexerAnswer(TREE_DUMP, [raw(0, b) for b in blocks], last)


def events(first: int, last: int) -> IndexerAnswer:
    return IndexerAnswer(EVENTS, [raw(i, i) for i in range(first, last + 1)], last)


class Worker8:
    """The scripted worker: answers queries in turn, each only once the test lets it."""

    def __init__(self, *answers: IndexerAnswer | Exception) -> None:
        self.answers = list(answers)
        self.starts: list[int | None] = []
        self.released = asyncio.Event()
        self.released.set()
        self.advertised = [TARGET]

    async def query(self, target: QueryTarget, start: int | None) -> IndexerAnswer:
        self.starts.append(start)
        await self.released.wait()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def recovery_of(worker: Worker8, sink: Sink, **kw: Any) -> LocalIndexerRecovery:
    return LocalIndexerRecovery(
        sink, lambda: worker.advertised, worker_id_of=str, query=worker.query, backoff_s=0.0, **kw
    )


async def test_events_held_during_the_dump_are_dropped_up_to_its_last_id_and_the_rest_applied_in_order():
    worker, sink = Worker8(dump(5, 101, 102)), Sink()
    worker.released.clear()
    recovery = recovery_of(worker, sink)
    assert await recovery.start() == 1
    assert all(recovery.take(W8, i, live(i)) for i in (4, 5, 6, 7))
    assert sink.log == []
    worker.released.set()
    await recovery.wait_idle()
    assert sink.log == [("up", W8), ("reset", W8), ("apply", 0), ("apply", 0), ("apply", 6), ("apply", 7)]
    assert recovery.cursor(W8) == 7 and worker.starts == [None]
    assert recovery.take(W8, 8, live(8)) and sink.applied()[-1] == 8  # then in order, at once


async def test_a_hole_among_the_held_events_is_asked_for_and_nothing_applies_twice():
    worker, sink = Worker8(dump(5, 101), events(7, 9)), Sink()
    worker.released.clear()
    recovery = recovery_of(worker, sink)
    await recovery.start()
    for i in (6, 8, 9):
        recovery.take(W8, i, live(i))
    worker.released.set()
    await recovery.wait_idle()
    assert worker.starts == [None, 7]
    assert sink.applied() == [0, 6, 7, 8, 9] and recovery.cursor(W8) == 9


async def test_a_live_gap_asks_from_the_cursor_and_an_id_going_back_dumps_the_restarted_publisher():
    counters = EventCounters()
    worker, sink = Worker8(dump(3, 101), events(5, 6), dump(1, 201)), Sink()
    recovery = recovery_of(worker, sink, counters=counters)
    await recovery.start()
    await recovery.wait_idle()
    recovery.take(W8, 4, live(4))
    recovery.take(W8, 6, live(6))  # 5 was lost
    await recovery.wait_idle()
    assert worker.starts == [None, 5] and sink.applied() == [0, 4, 5, 6]
    recovery.take(W8, 1, live(1))  # a new publisher counts from 1
    await recovery.wait_idle()
    assert worker.starts == [None, 5, None] and sink.log[-2:] == [("reset", W8), ("apply", 0)]
    assert recovery.cursor(W8) == 1
    assert (counters["recovery.gap"], counters["recovery.restart"], counters["recovery.dump"]) == (1, 1, 2)


async def test_too_new_an_answer_to_a_gap_means_the_worker_restarted_and_is_dumped():
    worker, sink = Worker8(dump(3), IndexerAnswer(TOO_NEW, detail="newest 2"), dump(6, 7)), Sink()
    recovery = recovery_of(worker, sink)
    await recovery.start()
    await recovery.wait_idle()
    recovery.take(W8, 6, live(6))  # 4 and 5 missing, which the worker no longer has
    await recovery.wait_idle()
    assert worker.starts == [None, 4, None] and recovery.cursor(W8) == 6
    assert sink.log[-2:] == [("reset", W8), ("apply", 0)]  # the held 6 was in the dump


async def test_a_worker_whose_local_indexer_keeps_failing_is_released_to_the_subscriber():
    counters = EventCounters()
    worker, sink = Worker8(OSError("refused"), OSError("refused"), OSError("refused")), Sink()
    worker.released.clear()
    recovery = recovery_of(worker, sink, counters=counters, retries=2)
    await recovery.start()
    assert recovery.take(W8, 1, live(1))
    worker.released.set()
    await recovery.wait_idle()
    assert counters["recovery.query_failed"] == 3 and counters["recovery.released"] == 1
    assert sink.applied() == [1]  # what was held is applied rather than lost
    assert not recovery.take(W8, 2, live(2)) and not recovery.owns(W8)  # the subscriber's again


async def test_a_worker_seen_after_start_is_dumped_and_one_without_a_local_indexer_is_left_alone():
    now = [0.0]
    worker, sink = Worker8(dump(1, 101)), Sink()
    worker.advertised = []
    listed = []

    def sources() -> list[QueryTarget]:
        listed.append(1)
        return worker.advertised

    recovery = LocalIndexerRecovery(sink, sources, query=worker.query, clock=lambda: now[0])
    assert await recovery.start() == 0
    assert not recovery.take(Worker("9"), 1, None)  # not advertised: the subscriber applies it
    await recovery.wait_idle()
    now[0] += 5.0
    assert not recovery.take(Worker("9"), 2, None)
    await recovery.wait_idle()
    assert len(listed) == 2  # at start, then once for worker 9, not again within 30 s
    worker.advertised = [TARGET]
    assert not recovery.take(W8, 1, live(1))  # passes while its source is looked for ...
    await recovery.wait_idle()
    assert recovery.cursor(W8) == 1 and sink.log[-3:] == [("up", W8), ("reset", W8), ("apply", 0)]
    assert recovery.take(W8, 2, live(2))  # ... then ordered here


def _source(root: Path, name: str, worker: int, *, endpoint: str = "generate", target: bool = True) -> Path:
    """An event source as Dynamo 1.6.1's file discovery writes it (captured from the real worker)."""
    recovery = {
        "component": "backend",
        "endpoint": f"worker_kv_query_source_{name}",
        "namespace": "ns1",
        "instance_id": 165,
        "transport": {"tcp": f"127.0.0.1:44141/e6070a89e503af91/ns1/backend/worker_kv_query_source_{name}"},
        "device_type": "cuda",
        "request_plane_codec": "msgpack",
    }
    metadata: dict[str, Any] = {
        "kv_state_endpoint": {"namespace": "ns1", "component": "backend", "name": endpoint},
        "worker": {"worker_id": worker, "dp_rank": 0},
        "publisher_id": int(name, 16),
    }
    if target:
        metadata["recovery_target"] = recovery
    document = {
        "type": "EventSource",
        "scope": {
            "kind": "endpoint",
            "endpoint": {"namespace": "ns1", "component": "backend", "name": endpoint},
        },
        "topic": "kv-events",
        "publisher_id": int(name, 16),
        "metadata": metadata,
    }
    path = root / "v1" / "event_sources" / f"namespace%2Fns1%2Fcomponent%2Fbackend%2F{name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def test_the_file_store_gives_each_advertised_local_indexer_and_the_newest_of_a_restarted_worker(tmp_path):
    old = _source(tmp_path, "1fcced3334b2fa", 7)
    os.utime(old, (1, 1))
    _source(tmp_path, "2abc", 7)  # the same worker's newer publisher
    _source(tmp_path, "3abc", 8, target=False)  # no local indexer
    _source(tmp_path, "4abc", 9, endpoint="other")
    (tmp_path / "v1" / "event_sources" / "garbage").write_text("{not json")
    (target,) = read_file_sources(str(tmp_path), "ns1", "backend", "generate")
    assert (target.wire_worker, target.dp_rank, target.publisher_id) == (7, 0, 0x2ABC)
    assert (target.host, target.port, target.codec) == ("127.0.0.1", 44141, "msgpack")
    assert target.path == "e6070a89e503af91/ns1/backend/worker_kv_query_source_2abc"
    assert [t.wire_worker for t in read_file_sources(str(tmp_path), "ns1", "backend", "*")] == [7, 9]
    assert read_file_sources(str(tmp_path), "ns2", "backend", "*") == []
    assert read_file_sources(str(tmp_path / "missing"), "ns1", "backend", "*") == []


@pytest.mark.parametrize(
    ("argv", "environ", "store"),
    [
        (["--nats-url", "nats://127.0.0.1:4222", "--discovery-backend", "file", "--file-kv", "/s"], {}, "/s"),
        (["--nats-url", "nats://127.0.0.1:4222", "--discovery-backend", "file"], {"DYN_FILE_KV": "/e"}, "/e"),
        (
            ["--nats-url", "nats://h:4222", "--discovery-backend", "file"],
            {"TMPDIR": "/t"},
            "/t/dynamo_store_kv",
        ),
        (
            ["--nats-url", "nats://h:4222", "--discovery-backend", "file", "--router-durable-kv-events"],
            {},
            None,
        ),
        (["--discovery-backend", "file"], {}, None),  # no KV events over NATS
        (["--nats-url", "nats://h:4222", "--discovery-backend", "etcd"], {}, None),
    ],
)
def test_discovery_backend_file_names_the_store_recovery_reads(argv, environ, store):
    from extproc.config import load_config

    config = load_config(argv, environ=environ)
    assert config.events.dynamo_file_kv == store
    (line,) = [n for n in config.notices if "--discovery-backend" in n or "DYN_DISCOVERY_BACKEND" in n]
    assert ("no effect here" in line) == (store is None), line


async def test_the_feed_asks_for_a_dump_of_a_worker_it_finds_blocks_missing_from():
    owned: list[tuple[Worker, bool]] = []
    worker, sink = Worker8(dump(2, 101), dump(4, 101, 102), OSError("gone")), Sink()
    recovery = recovery_of(worker, sink, retries=0, on_owned=lambda w, o: owned.append((w, o)))
    await recovery.start()
    await recovery.wait_idle()
    recovery.take(W8, 3, live(3))
    recovery.take(W8, 4, live(4))
    recovery.resync(W8, "a stored block's parent 77 is unknown")
    await recovery.wait_idle()
    assert worker.starts == [None, None] and sink.log[-3:] == [("reset", W8), ("apply", 0), ("apply", 0)]
    assert recovery.cursor(W8) == 4 and owned == [(W8, True)]
    recovery.resync(W8, "again")  # and a worker whose local indexer is gone is given back
    await recovery.wait_idle()
    assert owned == [(W8, True), (W8, False)] and not recovery.owns(W8)
    recovery.resync(W8, "not owned")  # nothing to do
    assert worker.starts == [None, None, None]
