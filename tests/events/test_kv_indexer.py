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
import contextlib
import dataclasses
import json
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
    registered,
)
from extproc.events.sources import start_event_sources
from extproc.picker.pipeline import EndpointPicker
from extproc.router import Worker
from extproc.router.hashing import compute_block_hashes
from tests.events.test_engine_fixtures import BS, FIXTURES, live, manifest
from tests.replica_helpers import until

in_module_loop = pytest.mark.asyncio(loop_scope="module")
QUERY = "POST /query_by_hash"
TOO_BIG = b'{"scores": {}, "pad": "' + b"x" * (4 << 20) + b'"}'  # over MAX_ANSWER_BYTES


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


async def indexer_has(client: KvIndexerClient) -> dict[tuple[int, int], tuple[object, str]]:
    return registered(await client.workers())


@in_module_loop
async def test_registration_is_idempotent_follows_changes_and_refills_a_restarted_indexer(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="extproc.events")
    indexer = start_dynamo_indexer(tmp_path / "indexer.log")
    client = KvIndexerClient(indexer.url, timeout_s=2.0)
    registrar = KvIndexerRegistrar(client, interval_s=0.2)
    counters = client.counters
    try:
        a0, a1 = (Registration(7, r, f"tcp://127.0.0.1:{41000 + r}", "m", 16) for r in (0, 1))
        b = Registration(8, 0, "tcp://127.0.0.1:42000", "m", 16, replay="tcp://127.0.0.1:42100")
        registrar.want([a0])
        await registrar.reconcile()
        registrar.want([a1, b])  # a0 is held already: the pass goes on past it
        await registrar.reconcile()
        await registrar.reconcile()  # nothing to do: the indexer has them all
        assert await indexer_has(client) == {
            (7, 0): (a0.endpoint, "m"), (7, 1): (a1.endpoint, "m"), (8, 0): (b.endpoint, "m")
        }  # fmt: skip
        assert (counters["kv_indexer.registered"], counters["kv_indexer.register_conflict"]) == (3, 0)
        said = [r.getMessage() for r in caplog.records]
        line = f"registered worker instance 8 dp rank 0 ({b.endpoint}, model m) with the KV indexer at "
        assert line + indexer.url in said

        registrar.want([], forget=[8])
        registrar.want([b])  # wanted again before the pass: not unregistered
        moved = Registration(7, 1, "tcp://127.0.0.1:41009", "m", 16)  # one rank of 7 came back elsewhere
        registrar.want([moved])
        await registrar.reconcile()  # 7 is registered anew, both ranks, in one pass
        assert await indexer_has(client) == {
            (7, 0): (a0.endpoint, "m"), (7, 1): (moved.endpoint, "m"), (8, 0): (b.endpoint, "m")
        }  # fmt: skip
        assert counters["kv_indexer.unregistered"] == 1

        registrar.want([], forget=[7, 8])
        other = Registration(8, 0, b.endpoint, "m2", 16)  # 8 serves another model now
        registrar.want([other])
        await registrar.reconcile()
        assert await indexer_has(client) == {(8, 0): (b.endpoint, "m2")}

        registrar.want([c := Registration(9, 0, "tcp://127.0.0.1:42900", "m2", 16)])
        done = counters["kv_indexer.registered"]
        registrar.start()
        await until(lambda: counters["kv_indexer.registered"] > done, 10.0, "a first pass, which succeeds")
        indexer.stop()
        await until(lambda: counters["kv_indexer.register_failed"] >= 1, 10.0, "a pass fails")
        failed = f"registering workers with the KV indexer at {indexer.url} failed"
        assert sum(r.getMessage().startswith(failed) for r in caplog.records) == 1
        indexer.restart()  # empty again: the next reconciliation registers what it lost
        again = {(8, 0): (b.endpoint, "m2"), (9, 0): (c.endpoint, "m2")}
        await until(lambda: _same(indexer_has(client), again), 10.0, "registered again")
        said = [r.getMessage() for r in caplog.records]
        assert f"the KV indexer at {indexer.url} takes registrations again" in said
    finally:
        await registrar.stop()
        await client.close()
        indexer.stop()


@in_module_loop
async def test_a_second_registration_is_a_conflict_and_a_missing_one_unregisters_quietly(client):
    r = Registration(900, 0, "tcp://127.0.0.1:43000", "conflicts", 16)
    assert await client.register(r) is True
    assert await client.register(r) is False  # 409: someone registered it first
    await client.unregister(900, "conflicts")
    await client.unregister(900, "conflicts")  # 404: nothing left, no error
    assert registered(await client.workers()).get((900, 0)) is None


@in_module_loop
async def test_a_registrar_whose_indexer_stalls_names_the_timeout(caplog):
    server, url = await stalled_server()
    client = KvIndexerClient(url, timeout_s=0.05)
    registrar = KvIndexerRegistrar(client, interval_s=0.05)
    caplog.set_level(logging.WARNING, logger="extproc.events")
    registrar.start()
    try:
        await until(lambda: client.counters["kv_indexer.register_failed"] >= 1, 10.0, "a failed pass")
    finally:
        await registrar.stop()
        await client.close()
        server.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"registering workers with the KV indexer at {url} failed (TimeoutError); retrying every 0 s"
    ]


@in_module_loop
async def test_a_registrar_that_cannot_reach_the_indexer_retries_and_says_so_once(caplog):
    client = KvIndexerClient("http://127.0.0.1:9", timeout_s=0.5)  # discard: nothing listens
    registrar = KvIndexerRegistrar(client, interval_s=0.05)
    registrar.want([Registration(1, 0, "tcp://127.0.0.1:5557", "m", 16)])
    caplog.set_level(logging.INFO, logger="extproc.events")
    await registrar.stop()  # never started: nothing to stop
    registrar.start()
    task = registrar._task
    try:
        await until(lambda: client.counters["kv_indexer.register_failed"] >= 3, 10.0, "three failed passes")
    finally:
        await registrar.stop()
        await registrar.stop()
        await client.close()
    assert task is not None and task.done()
    said = [r.getMessage() for r in caplog.records if "registering workers" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "registering workers with the KV indexer at http://127.0.0.1:9 failed (Cannot connect to host"
    ) and said[0].endswith("retrying every 0 s")  # fmt: skip
    assert KvIndexerRegistrar(client).interval_s == 10.0  # what --help and the README promise


def test_the_indexers_worker_list_is_read_by_instance_and_rank_leaving_out_what_is_not_ours():
    workers = [
        {"instance_id": 7, "model_name": "m", "endpoints": {"0": "tcp://a:1", "1": "tcp://a:2"}},
        {"instance_id": "x", "model_name": "m", "endpoints": {"0": "tcp://b:1"}},
        {"instance_id": 8, "model_name": "m", "endpoints": {"r": "tcp://c:1", "2": "tcp://c:3"}},
        {"instance_id": 9, "model_name": "m", "endpoints": ["tcp://d:1"]},
        {"instance_id": None, "model_name": "m", "endpoints": {"0": "tcp://e:1"}},
    ]
    assert registered(workers) == {  # type: ignore[arg-type]
        (7, 0): ("tcp://a:1", "m"), (7, 1): ("tcp://a:2", "m"), (8, 2): ("tcp://c:3", "m")
    }  # fmt: skip


# --- an indexer that does not answer --------------------------------------------------------------


async def stalled_server() -> tuple[asyncio.Server, str]:
    """Accepts connections and reads forever, never answering."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def answering(
    status: int,
    body: bytes,
    *,
    seen: list[bytes] | None = None,
    dropped: list[bytes] | None = None,
    answers_per_connection: int = 1,
    routes: dict[bytes, tuple[int, bytes]] | None = None,
) -> tuple[asyncio.Server, str]:
    """Answers each request with `status` and `body` over HTTP/1.1 keep-alive (no `connection:
    close`), and closes a connection at its next request after `answers_per_connection` answers, as a
    server whose idle timeout ran out does. Request lines and bodies (`POST /path {...}`) are appended
    to `seen`, the heads of the requests it closed on to `dropped`. `routes`: request line (`GET
    /workers`) -> another status and body."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(answers_per_connection):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            lengths = [int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length")]
            request = await reader.readexactly(sum(lengths))
            line = b" ".join(head.split(b" ")[:2])
            if seen is not None:
                seen.append(line + b" " + request)
            code, text = (routes or {}).get(line, (status, body))
            writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (code, len(text), text))
            await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            head = await reader.readuntil(b"\r\n\r\n")
            if dropped is not None:
                dropped.append(head)
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
    start = f"the KV indexer at {url} did not answer an overlap query (TimeoutError)"
    assert [r.getMessage() for r in caplog.records] == [
        f"{start}: such decisions go by load alone",
        f"{start} (3 more since the last report): such decisions go by load alone",
    ]


@in_module_loop
@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (500, b"internal error", "POST /query_by_hash answered 500: internal error"),
        (500, b"\xff\xfe", "POST /query_by_hash answered 500: \ufffd\ufffd"),
        (404, b"not found", "POST /query_by_hash answered 404: not found"),  # not 'no indexer for model'
        (300, b'{"scores": {}}', 'POST /query_by_hash answered 300: {"scores": {}}'),
        (200, b"not json", "POST /query_by_hash answered no JSON: *"),
        (200, b"", "POST /query_by_hash answered no JSON: *"),
        (200, b"\xff", "POST /query_by_hash answered no JSON: *"),
        (200, b'{"scores": [1, 2]}', "no 'scores' object"),
        (200, b'{"scores": {"1": {"0": "many"}}}', "scores['1']['0'] is not a token count"),
        (200, b'{"scores": {"x": {"0": 16}}}', "invalid literal for int() with base 10: 'x'"),
        (200, b'{"scores": {"1": {"0": -16}}}', "scores['1']['0'] is not a token count"),
        (200, b'{"scores": {"1": 16}}', "scores['1'] is not an object"),
        (200, b"[]", "no 'scores' object"),
        (200, TOO_BIG, f"{QUERY} answered more than 4194304 bytes"),
    ],
)
async def test_an_answer_of_another_shape_is_no_answer(status, body, why, caplog):
    server, url = await answering(status, body)
    counters = EventCounters()
    client = KvIndexerClient(url, timeout_s=5.0, counters=counters)
    client.instance_ids[1] = "w1"
    caplog.set_level(logging.WARNING, logger="extproc.events")
    try:
        assert await client.overlaps("m", 16, [5]) is None
    finally:
        await client.close()
        server.close()
    assert counters["kv_indexer.query_failed"] == 1
    (said,) = [r.getMessage() for r in caplog.records]
    assert (f"({why[:-1]}" if why.endswith("*") else f"({why}): ") in said, said


@in_module_loop
async def test_a_large_answer_a_trailing_slash_a_closed_connection_and_a_closed_client_are_all_fine():
    scores = {str(i): {"0": 16 * (i % 5)} for i in range(6000)}  # over 64 KiB: read in several chunks
    body = json.dumps({"scores": scores}).encode()
    assert len(body) > 64 << 10
    seen: list[bytes] = []
    dropped: list[bytes] = []
    server, url = await answering(200, body, seen=seen, dropped=dropped, answers_per_connection=1)
    client = KvIndexerClient(url + "/", timeout_s=5.0)
    client.instance_ids.update({4: "w4", 5999: "w5999"})
    try:
        want = {Worker("w4", 0): 4, Worker("w5999", 0): 4}
        assert await client.overlaps("m", 16, [1 << 63]) == want
        # the kept-alive connection is closed by the server at the next request: asked again on a new one
        assert await client.overlaps("m", 16, [2]) == want
        await client.close()
        assert await client.overlaps("m", 16, [3]) == want  # a new session after close
    finally:
        await client.close()
        server.close()
    assert client.counters["kv_indexer.query_failed"] == 0
    assert [_request(b) for b in seen] == [
        ("POST /query_by_hash", {"block_hashes": [-(1 << 63)], "model_name": "m"}),
        ("POST /query_by_hash", {"block_hashes": [2], "model_name": "m"}),  # again: the first was closed on
        ("POST /query_by_hash", {"block_hashes": [3], "model_name": "m"}),
    ]
    assert [h.split(b" ")[:2] for h in dropped] == [[b"POST", b"/query_by_hash"]]


@in_module_loop
async def test_registrations_carry_the_replay_socket_when_there_is_one():
    seen: list[bytes] = []
    server, url = await answering(201, b'{"status":"ok"}', seen=seen, answers_per_connection=8)
    client = KvIndexerClient(url, timeout_s=5.0)
    try:
        await client.register(Registration(3, 1, "tcp://h:5558", "m", 16, replay="tcp://h:5601"))
        await client.register(Registration(4, 0, "tcp://h:5557", "m", 32))
    finally:
        await client.close()
        server.close()
    assert [_request(b) for b in seen] == [
        ("POST /register", {"instance_id": 3, "endpoint": "tcp://h:5558", "dp_rank": 1, "model_name": "m",
                            "block_size": 16, "replay_endpoint": "tcp://h:5601"}),
        ("POST /register", {"instance_id": 4, "endpoint": "tcp://h:5557", "dp_rank": 0, "model_name": "m",
                            "block_size": 32}),
    ]  # fmt: skip


def _request(seen: bytes) -> tuple[str, object]:
    method, path, body = seen.split(b" ", 2)
    return f"{method.decode()} {path.decode()}", json.loads(body)


@in_module_loop
async def test_a_registration_someone_made_meanwhile_is_a_conflict_not_an_error(caplog):
    """GET /workers did not list them, POST /register says 409: each is counted and the pass goes on."""
    routes = {b"GET /workers": (200, b"[]")}
    seen: list[bytes] = []
    server, url = await answering(409, b'{"error":"already registered"}', seen=seen, routes=routes,
                                  answers_per_connection=8)  # fmt: skip
    client = KvIndexerClient(url, timeout_s=5.0)
    registrar = KvIndexerRegistrar(client)
    registrar.want([Registration(i, 0, f"tcp://h:{5557 + i}", "m", 16) for i in (1, 2)])
    try:
        await registrar.reconcile()
    finally:
        await client.close()
        server.close()
    assert [b.split(b" ")[:2] for b in seen] == [
        [b"GET", b"/workers"], [b"POST", b"/register"], [b"POST", b"/register"]
    ]  # fmt: skip
    counters = client.counters
    assert (counters["kv_indexer.register_conflict"], counters["kv_indexer.registered"]) == (2, 0)


@in_module_loop
async def test_the_workers_list_must_be_a_list_of_objects():
    for body in (b"{}", b'[1, {"instance_id": 1}]'):
        server, url = await answering(200, body)
        client = KvIndexerClient(url, timeout_s=5.0)
        try:
            with pytest.raises(ValueError, match=r"^GET /workers did not answer a list of objects$"):
                await client.workers()
        finally:
            await client.close()
            server.close()


@in_module_loop
async def test_an_answer_of_the_size_limit_is_read():
    body = b'{"scores": {}, "pad": "'
    body += b"x" * ((4 << 20) - len(body) - 2) + b'"}'
    assert len(body) == 4 << 20
    server, url = await answering(200, body)
    client = KvIndexerClient(url, timeout_s=5.0)
    try:
        assert await client.overlaps("m", 16, [5]) == {}
    finally:
        await client.close()
        server.close()


def test_scores_are_tokens_turned_into_whole_blocks_of_known_workers():
    answer = {"scores": {"7": {"0": 56, "1": 15, "2": 0}, "8": {"0": 32}, "9": {"2": 160}}}
    known = {7: "w7", 9: "w9"}.get  # 8 is another picker's
    assert parse_scores(answer, 16, known) == {Worker("w7", 0): 3, Worker("w9", 2): 10}


def test_a_client_uses_the_counters_it_is_given():
    counters = EventCounters()
    assert KvIndexerClient("http://i:1", timeout_s=1.0, counters=counters).counters is counters


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

    async def ours() -> dict[tuple[int, int], tuple[object, str]]:
        return {k: v for k, v in (await indexer_has(client)).items() if k[0] in mine}

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
