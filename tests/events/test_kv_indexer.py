"""The picker's KV indexer client against Dynamo's own standalone indexer (`python -m dynamo.indexer`,
ai-dynamo-runtime 1.6.1, the `compat` extra `make test` installs), fed the engines' own bytes.

- each recorded engine stream (`tests/events/engines/`: vLLM 0.33.0 and SGLang 0.5.23, frames as the
  engines' `ZmqEventPublisher` sent them) goes to the real indexer, registered by our registrar;
  our client's overlaps, asked with our block hashes, must then be the prefix the manifest says the
  engine holds for each chain (plain, LoRA, partial pages, SGLang's salts), except where Dynamo
  1.6.1's indexer reads vLLM's events otherwise (`DYNAMO_1_6_1_READS_OTHERWISE`: vLLM's cache salt,
  multimodal blocks, 32-byte block ids), asserted as it answers so that a fix shows;
- registration: 409s are "already there", an indexer that restarts empty is filled again, a worker
  the picker forgets is unregistered;
- an indexer that is down, stalls or answers nonsense gives no overlaps (a decision by load), is
  counted, and is logged once a minute at most.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from extproc.config import EventsConfig, WorkerConfig
from extproc.devstack.dynamo_indexer import DynamoIndexer, start_dynamo_indexer
from extproc.events.counters import EventCounters
from extproc.events.kv_indexer import (
    KvIndexerClient,
    KvIndexerRegistrar,
    Registration,
    as_i64,
    parse_scores,
)
from extproc.events.sources import start_event_sources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker
from extproc.router.hashing import compute_block_hashes
from tests.events.test_engine_fixtures import BS, FIXTURES, live, manifest
from tests.replica_helpers import until

in_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def indexer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoIndexer]:
    started = start_dynamo_indexer(tmp_path_factory.mktemp("dynamo-indexer") / "indexer.log")
    yield started
    started.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def client(indexer: DynamoIndexer) -> AsyncIterator[KvIndexerClient]:
    made = KvIndexerClient(indexer.url, timeout_s=2.0)
    yield made
    await made.close()


# Where Dynamo 1.6.1's indexer answers otherwise than the engine holds: fixture -> chain note -> the
# blocks it answers. It hashes vLLM's blocks from their tokens and LoRA name alone: vLLM's cache salt
# and a multimodal block's media hash (both in the event's extra_keys) are left out, so salted and
# plain copies of the same tokens are one node there (evicting one loses the other), a prompt with
# another image matches, and a salted prompt hashed as the engine hashes it (our query) matches
# nothing. SGLang's salts reach it (SGLang hashes them into the tokens' page hashes). And it cannot
# decode vLLM's 32-byte block ids (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): nothing is indexed.
DYNAMO_1_6_1_READS_OTHERWISE: dict[str, dict[str, int]] = {
    "vllm/standard": {
        "request s": 0,  # salted: our query carries the salt, the indexer's tree does not
        "request u": 1,  # plain: its first block was one node with the salted one, evicted with it
        "request ls": 0,  # LoRA + salt
        "request ls without its salt": 2,  # a hit the engine cannot use: those blocks are salted
        "request m": 2,  # the image's blocks match whatever the image
    },
    "vllm/digests-lookahead-dp1": {"request k": 0, "request ks": 0},
}


async def wait_for_subscriber(xpub: zmq.asyncio.Socket, timeout_s: float = 10.0) -> None:
    """An XPUB hears each SUB that subscribes: the engine's frames are sent only once one has."""
    assert await asyncio.wait_for(xpub.recv(), timeout_s) == b"\x01"  # subscribe to every topic


# --- the engines' streams through Dynamo's indexer -----------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
@in_module_loop
async def test_the_indexer_fed_an_engines_own_frames_answers_our_hashes_with_what_it_cached(
    name, indexer, client
):
    fixture = manifest()["fixtures"][name]
    instance, rank, model = 100 + FIXTURES.index(name), fixture["dp_rank"], f"model-{name}"
    ctx = zmq.asyncio.Context()
    xpub = ctx.socket(zmq.XPUB)  # on the wire a PUB: the indexer's SUB cannot tell them apart
    port = xpub.bind_to_random_port("tcp://127.0.0.1")
    try:
        registrar = KvIndexerRegistrar(client)
        registrar.want([Registration(instance, rank, f"tcp://127.0.0.1:{port}", model, BS)])
        await registrar.reconcile()
        await wait_for_subscriber(xpub)
        for frames in live(name):
            await xpub.send_multipart(frames)
        client.instance_ids[instance] = "w0"
        chains = fixture["final"]["chains"]
        otherwise = DYNAMO_1_6_1_READS_OTHERWISE.get(name, {})
        assert set(otherwise) <= {c["note"] for c in chains}

        async def answers() -> list[dict[Worker, int] | None]:
            return [
                await client.overlaps(
                    model, BS, compute_block_hashes(c["tokens"], BS, lora_name=c["lora_name"],
                                                    namespace=c["cache_salt"])
                )
                for c in chains
            ]  # fmt: skip

        blocks = [otherwise.get(c["note"], c["blocks"]) for c in chains]
        want = [{Worker("w0", rank): n} if n else {} for n in blocks]
        last: list[object] = []

        async def same() -> bool:
            last[:] = await answers()
            return last == want

        await until(same, 10.0, lambda: f"{name}: the indexer answered {last}, the engine holds {want}")
    finally:
        xpub.close(linger=0)
        ctx.term()


def test_the_fixtures_hold_lora_salted_uncached_and_dp_rank_1_chains():
    chains = [c for name in FIXTURES for c in manifest()["fixtures"][name]["final"]["chains"]]
    assert any(c["lora_name"] and c["blocks"] for c in chains)
    assert any(c["cache_salt"] and c["blocks"] for c in chains)
    assert any(not c["blocks"] for c in chains)
    assert any(manifest()["fixtures"][name]["dp_rank"] == 1 for name in FIXTURES)


@in_module_loop
async def test_a_model_the_indexer_has_no_worker_of_has_nothing_cached_and_is_no_failure(client, caplog):
    caplog.set_level(logging.WARNING, logger="extproc.events")
    assert await client.overlaps("a-model-nobody-registered", BS, [1, 2, 3]) == {}
    assert client.counters["kv_indexer.model_unknown"] == 1
    assert client.counters["kv_indexer.query_failed"] == 0
    assert not caplog.records


# --- registration --------------------------------------------------------------------------------


async def registered(client: KvIndexerClient) -> dict[tuple[int, int], tuple[str, str]]:
    return {
        (int(w["instance_id"]), int(rank)): (endpoint, w["model_name"])  # type: ignore[call-overload]
        for w in await client.workers()
        for rank, endpoint in w["endpoints"].items()  # type: ignore[union-attr]
    }


@in_module_loop
async def test_registration_is_idempotent_follows_changes_and_refills_a_restarted_indexer(tmp_path):
    indexer = start_dynamo_indexer(tmp_path / "indexer.log")
    client = KvIndexerClient(indexer.url, timeout_s=2.0)
    registrar = KvIndexerRegistrar(client, interval_s=0.2)
    try:
        a0, a1 = (Registration(7, r, f"tcp://127.0.0.1:{41000 + r}", "m", 16) for r in (0, 1))
        b = Registration(8, 0, "tcp://127.0.0.1:42000", "m", 16)
        registrar.want([a0, a1, b])
        await registrar.reconcile()
        await registrar.reconcile()  # nothing to do: the indexer has them all (no 409 raised)
        assert await registered(client) == {
            (7, 0): (a0.endpoint, "m"), (7, 1): (a1.endpoint, "m"), (8, 0): (b.endpoint, "m")
        }  # fmt: skip
        assert client.counters["kv_indexer.registered"] == 3

        moved = Registration(8, 0, "tcp://127.0.0.1:42001", "m", 16)  # the worker came back elsewhere
        registrar.want([moved], forget=[7])
        await registrar.reconcile()
        assert await registered(client) == {(8, 0): (moved.endpoint, "m")}
        assert client.counters["kv_indexer.unregistered"] == 2  # 7 forgotten, 8 moved

        registrar.start()
        indexer.restart()  # empty again: the next reconciliation registers what it lost
        await until(lambda: registered(client), 10.0, "the restarted indexer is registered the worker again")
        assert await registered(client) == {(8, 0): (moved.endpoint, "m")}
    finally:
        await registrar.stop()
        await client.close()
        indexer.stop()


@in_module_loop
async def test_a_registrar_that_cannot_reach_the_indexer_retries_and_says_so_once(caplog):
    client = KvIndexerClient("http://127.0.0.1:9", timeout_s=0.5)  # discard: nothing listens
    registrar = KvIndexerRegistrar(client, interval_s=0.05)
    registrar.want([Registration(1, 0, "tcp://127.0.0.1:5557", "m", 16)])
    caplog.set_level(logging.INFO, logger="extproc.events")
    registrar.start()
    try:
        await until(lambda: client.counters["kv_indexer.register_failed"] >= 3, 10.0, "three failed passes")
    finally:
        await registrar.stop()
        await client.close()
    said = [r.getMessage() for r in caplog.records if "registering workers" in r.getMessage()]
    assert len(said) == 1 and "retrying every" in said[0]


# --- an indexer that does not answer --------------------------------------------------------------


async def stalled_server() -> tuple[asyncio.Server, str]:
    """Accepts connections and reads forever, never answering."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def answering(status: int, body: bytes) -> tuple[asyncio.Server, str]:
    """Answers every request with `status` and `body` (HTTP/1.1, then closes)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        lengths = [int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length")]
        await reader.readexactly(sum(lengths))
        writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@in_module_loop
async def test_a_stalled_indexer_costs_a_decision_its_timeout_and_no_more(caplog):
    server, url = await stalled_server()
    clock = [0.0]
    client = KvIndexerClient(url, timeout_s=0.1, clock=lambda: clock[0])
    caplog.set_level(logging.WARNING, logger="extproc.events")
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await client.overlaps("m", 16, [1, 2, 3]) is None
        assert loop.time() - started < 2.0  # the timeout, not the server, ended it
        for _ in range(3):
            assert await client.overlaps("m", 16, [1, 2, 3]) is None
        clock[0] = 61.0
        assert await client.overlaps("m", 16, [1]) is None
    finally:
        await client.close()
        server.close()
    assert client.counters["kv_indexer.query_failed"] == client.counters["kv_indexer.query"] == 5
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "by load alone" in said[0] and "3 more since the last report" in said[1]


@in_module_loop
@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, b"internal error"),
        (200, b"not json"),
        (200, b'{"scores": [1, 2]}'),
        (200, b'{"scores": {"1": {"0": "many"}}}'),
        (200, b'{"scores": {"x": {"0": 16}}}'),
        (200, b'{"scores": {"1": {"0": -16}}}'),
        (200, b"[]"),
    ],
)
async def test_an_answer_of_another_shape_is_no_answer(status, body):
    server, url = await answering(status, body)
    client = KvIndexerClient(url, timeout_s=2.0, counters=EventCounters())
    client.instance_ids[1] = "w1"
    try:
        assert await client.overlaps("m", 16, [5]) is None
    finally:
        await client.close()
        server.close()
    assert client.counters["kv_indexer.query_failed"] == 1


def test_scores_are_tokens_turned_into_whole_blocks_of_known_workers():
    answer = {"scores": {"7": {"0": 48, "1": 15}, "8": {"0": 32}, "9": {"2": 160}}}
    known = {7: "w7", 9: "w9"}.get  # 8 is another picker's
    assert parse_scores(answer, 16, known) == {Worker("w7", 0): 3, Worker("w9", 2): 10}


def test_hashes_go_out_as_the_signed_integers_the_indexer_parses():
    assert as_i64([0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]) == [0, 1, (1 << 63) - 1, -(1 << 63), -1]


# --- the picker's worker set ----------------------------------------------------------------------


@in_module_loop
async def test_the_indexer_follows_the_pickers_worker_set(indexer):
    """Workers discovery adds, moves and removes are registered, moved and unregistered; their
    routers take them as event-fed (nothing predicted from decisions), and the picker subscribes to
    no ZMQ socket itself."""
    from tests.events.test_worker_set import events_config
    from tests.picker_fixtures import MODEL

    def worker(wid: str, iid: int, port: int) -> WorkerConfig:
        endpoint = f"tcp://127.0.0.1:{port}"
        return WorkerConfig(wid, "127.0.0.1:8000", MODEL, kv_events=endpoint, instance_id=iid)

    config = events_config((worker("w0", 500, 45000),))
    config = dataclasses.replace(config, events=EventsConfig(kv_indexer_url=indexer.url))
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker)
    client = picker.kv_indexer
    assert client is not None and sources.kv_indexer is not None and sources.zmq is None
    sources.kv_indexer.interval_s = 0.1
    mine = {500, 501}

    async def ours() -> dict[tuple[int, int], tuple[str, str]]:
        return {k: v for k, v in (await registered(client)).items() if k[0] in mine}

    try:
        first = {(500, 0): ("tcp://127.0.0.1:45000", MODEL)}
        await until(lambda: _same(ours(), first), 10.0, "w0 registered")
        router = picker.pools[MODEL].router
        assert router.is_event_fed(Worker("w0"))
        picker.set_workers(MODEL, [worker("w0", 500, 45001), worker("w1", 501, 45002)])
        want = {(500, 0): ("tcp://127.0.0.1:45001", MODEL), (501, 0): ("tcp://127.0.0.1:45002", MODEL)}
        await until(lambda: _same(ours(), want), 10.0, "w0 moved and w1 added")
        assert router.is_event_fed(Worker("w1")) and client.worker_of(501) == "w1"
        picker.set_workers(MODEL, [worker("w1", 501, 45002)])
        await until(lambda: _same(ours(), {(501, 0): want[(501, 0)]}), 10.0, "w0 unregistered")
        assert client.worker_of(500) is None
    finally:
        await sources.stop()
        await picker.close()


async def _same(value: object, want: object) -> bool:
    return await value == want  # type: ignore[misc]
