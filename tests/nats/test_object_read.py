"""`read_object` against a real nats-server's object store, written by nats.py's own `put`.

A writer on another connection and thread changes the object while the read is under way: the
reader's event loop waits for it (the thread is joined from the reader's progress callback), so
the server cannot send the rest of the old chunks before they are gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import nats
import pytest
from nats.js.errors import ObjectNotFoundError

from extproc.events.object_read import (
    ObjectDigestMismatch,
    ObjectReadError,
    ObjectReplaced,
    ObjectStalled,
    read_object,
)

from .conftest import on_first_chunk

BUCKET = "snapshots"
CHUNK = 128 * 1024  # nats.py's chunk size
BIG = 4 * 1024 * 1024  # more than the server sends ahead of a reader that stops (about 2 MB)


async def store_with(server, data: bytes):
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    store = await js.create_object_store(BUCKET)
    await store.put("obj", data)
    return nc, js, store


async def test_an_object_of_many_chunks_is_read_whole_and_its_progress_told(nats_server):
    data = os.urandom(24 * CHUNK + 5)
    nc, js, store = await store_with(nats_server, data)
    try:
        seen: list[tuple[int, int]] = []
        got = await read_object(
            js, store, BUCKET, "obj", chunk_timeout_s=10, on_chunk=lambda *a: seen.append(a)
        )
        assert got == data
        assert [read for read, _ in seen] == [min(len(data), CHUNK * k) for k in range(1, 26)]
        assert {size for _, size in seen} == {len(data)}

        await store.put("empty", b"")
        assert await read_object(js, store, BUCKET, "empty", chunk_timeout_s=10) == b""
    finally:
        await nc.close()


async def test_a_missing_object_is_not_found(nats_server):
    nc, js, store = await store_with(nats_server, b"x")
    try:
        with pytest.raises(ObjectNotFoundError):
            await read_object(js, store, BUCKET, "other", chunk_timeout_s=10)
    finally:
        await nc.close()


async def test_an_object_replaced_while_read_is_told_before_the_chunk_limit(nats_server):
    """nats.py's own `get` waits forever here: the writer purged the chunks it was reading."""
    nc, js, store = await store_with(nats_server, os.urandom(BIG))
    try:

        async def replace(js) -> None:
            await (await js.object_store(BUCKET)).put("obj", b"the new version")

        replaced = on_first_chunk(nats_server, replace)
        # A limit of 60 s per chunk: the test would take that long if it waited for it
        with pytest.raises(ObjectReplaced, match="replaced after"):
            await read_object(js, store, BUCKET, "obj", chunk_timeout_s=60, on_chunk=replaced)
        assert await read_object(js, store, BUCKET, "obj", chunk_timeout_s=10) == b"the new version"
    finally:
        await nc.close()


async def test_chunks_gone_under_a_read_of_the_same_version_stall_it(nats_server):
    nc, js, store = await store_with(nats_server, os.urandom(BIG))
    try:
        nuid = (await store.get_info("obj")).nuid

        async def purge_chunks(js) -> None:
            await js.purge_stream(f"OBJ_{BUCKET}", subject=f"$O.{BUCKET}.C.{nuid}")

        with pytest.raises(ObjectStalled, match=r"no chunk of object 'obj' for 1\.5 s"):
            await read_object(
                js,
                store,
                BUCKET,
                "obj",
                chunk_timeout_s=1.5,
                on_chunk=on_first_chunk(nats_server, purge_chunks),
            )
    finally:
        await nc.close()


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"digest": "SHA-256=" + "A" * 43 + "="}, ObjectDigestMismatch, "do not match its digest"),
        ({"digest": "no digest here"}, ObjectDigestMismatch, "do not match its digest"),
        ({"digest": None}, ObjectDigestMismatch, "do not match its digest"),
        ({"nuid": ""}, ObjectReadError, "is a link or has no chunks id"),
        ({"options": {"link": {"bucket": BUCKET, "name": "other"}}}, ObjectReadError, "is a link"),
    ],
)
async def test_metadata_that_does_not_describe_the_chunks_is_refused(nats_server, change, error, message):
    nc, js, store = await store_with(nats_server, os.urandom(3 * CHUNK))
    try:
        meta_subject = f"$O.{BUCKET}.M.b2Jq"  # base64url("obj")
        meta = json.loads((await js.get_last_msg(f"OBJ_{BUCKET}", meta_subject)).data)
        meta.update(change)
        await js.publish(meta_subject, json.dumps(meta).encode(), headers={"Nats-Rollup": "sub"})
        with pytest.raises(error, match=message):
            await read_object(js, store, BUCKET, "obj", chunk_timeout_s=10)
    finally:
        await nc.close()


async def test_an_object_whose_chunks_are_all_gone_stalls_from_the_start(nats_server):
    """An operator purged the bucket's chunks but not its metadata: no chunk ever comes."""
    nc, js, store = await store_with(nats_server, os.urandom(2 * CHUNK))
    try:
        nuid = (await store.get_info("obj")).nuid
        await js.purge_stream(f"OBJ_{BUCKET}", subject=f"$O.{BUCKET}.C.{nuid}")
        with pytest.raises(ObjectStalled, match=r"for 1\.5 s after 0 of 262144 bytes"):
            await read_object(js, store, BUCKET, "obj", chunk_timeout_s=1.5)
    finally:
        await nc.close()


async def test_a_server_that_pauses_mid_read_under_the_chunk_limit_does_not_stall_it(nats_server):
    """The server is stopped (SIGSTOP) for 1.5 s after the first chunk, longer than the reader's
    one-second metadata check and shorter than its 10 s limit: the read goes on to the end."""
    data = os.urandom(BIG)
    nc, js, store = await store_with(nats_server, data)
    resume = threading.Timer(1.5, os.kill, (nats_server.pid, signal.SIGCONT))
    paused: list[bool] = []

    def pause_once(read: int, size: int) -> None:
        if not paused:
            paused.append(True)
            os.kill(nats_server.pid, signal.SIGSTOP)
            resume.start()

    try:
        assert await read_object(js, store, BUCKET, "obj", chunk_timeout_s=10, on_chunk=pause_once) == data
        assert paused
    finally:
        resume.cancel()
        os.kill(nats_server.pid, signal.SIGCONT)
        await nc.close()


async def test_a_connection_closed_under_the_read_ends_it_with_the_connections_error(nats_server):
    nc, js, store = await store_with(nats_server, os.urandom(BIG))
    closing: list[asyncio.Task] = []

    def close_once(read: int, size: int) -> None:
        if not closing:
            closing.append(asyncio.ensure_future(nc.close()))

    with pytest.raises(nats.errors.ConnectionClosedError):
        await read_object(js, store, BUCKET, "obj", chunk_timeout_s=10, on_chunk=close_once)
    await closing[0]
