"""Read one object from a NATS object store: into one buffer, and told apart from a stalled read.

nats.py's `ObjectStore.get` has two traits that hurt a large KV snapshot (durable mode):

- It grows a `bytes` object by each 128 KB chunk, copying everything read so far every time, so
  its time grows with the square of the size: a 76 MB snapshot took 16.8 s to read that way on a
  2-core host, against 0.67 s into one buffer (`benchmarks/bench_snapshot.py`).
- When the object is replaced while it is read, the writer purges the old chunks and the read waits
  for them forever. Only a timeout around the whole read ends it, and a whole-read timeout long
  enough for a large object leaves a replica stalled that long for a small one.

`read_object` does what `get` does for a plain object (no links) with both fixed: chunks go into
one buffer, and the limit is on the wait for the next chunk, not on the whole read. While it waits
it checks the object's metadata each second; if a new version has replaced the one it reads, it
says so at once (`ObjectReplaced`) rather than after the limit. The caller reads again.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import time
from collections.abc import Callable

import nats.errors
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore

CHECK_EVERY_S = 1.0  # while no chunk comes: how often the object's metadata is checked


class ObjectReadError(Exception):
    """The read did not finish with the object's bytes; reading again may succeed."""


class ObjectReplaced(ObjectReadError):
    """A new version of the object was written while it was read (its old chunks are gone)."""


class ObjectStalled(ObjectReadError):
    """No chunk arrived within the limit, and the object was not replaced."""


class ObjectDigestMismatch(ObjectReadError):
    """The chunks read do not hash to the object's digest."""


Progress = Callable[[int, int], None]  # (bytes read, object size), after each chunk


async def read_object(
    js: JetStreamContext,
    store: ObjectStore,
    bucket: str,
    name: str,
    *,
    chunk_timeout_s: float,
    on_chunk: Progress | None = None,
) -> bytes:
    """The object's bytes. Raises `nats.js.errors.ObjectNotFoundError` when there is none, and an
    `ObjectReadError` when this read cannot finish (replaced, stalled, bad digest)."""
    info = await store.get_info(name)
    if info.nuid is None or info.nuid == "" or info.is_link():
        raise ObjectReadError(f"object {name!r} in bucket {bucket!r} is a link or has no chunks id")
    size = info.size or 0
    if size == 0:
        return b""
    buffer = io.BytesIO()
    digest = hashlib.sha256()
    sub = await js.subscribe(f"$O.{bucket}.C.{info.nuid}", ordered_consumer=True)
    try:
        last_chunk_s = time.monotonic()
        while True:
            try:
                msg = await sub.next_msg(timeout=min(CHECK_EVERY_S, chunk_timeout_s))
            except nats.errors.TimeoutError:
                now_info = await store.get_info(name)
                if now_info.nuid != info.nuid:
                    raise ObjectReplaced(
                        f"object {name!r} replaced after {buffer.tell()} of {size} bytes were read"
                    ) from None
                if time.monotonic() - last_chunk_s >= chunk_timeout_s:
                    raise ObjectStalled(
                        f"no chunk of object {name!r} for {chunk_timeout_s:g} s after {buffer.tell()} "
                        f"of {size} bytes"
                    ) from None
                continue
            last_chunk_s = time.monotonic()
            buffer.write(msg.data)
            digest.update(msg.data)
            if on_chunk is not None:
                on_chunk(buffer.tell(), size)
            if msg.metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(nats.errors.Error):  # a closed connection: nothing left to free
            await sub.unsubscribe()
    if digest.digest() != _digest_bytes(info.digest):
        raise ObjectDigestMismatch(f"object {name!r}: the chunks read do not match its digest")
    return buffer.getvalue()


def _digest_bytes(text: str | None) -> bytes:
    """The SHA-256 an object's metadata gives as "SHA-256=<urlsafe base64>"; b"" when unreadable."""
    try:
        return base64.urlsafe_b64decode((text or "").partition("=")[2])
    except ValueError:  # binascii.Error: not base64
        return b""
