"""One GET of a worker's own endpoint (its Prometheus metrics, its model list), bounded whatever the
endpoint does: within a time limit (connect, headers and body), at most a number of bytes (a larger
body is not read further), no redirects, no compression (Accept-Encoding: identity, nothing
decompressed: a small gzip body cannot become a large one)."""

from __future__ import annotations

import aiohttp


class FetchFailed(Exception):
    """The GET gave no body to use: the message says why (status, timeout, size, connection)."""


def bounded_session(timeout_s: float, connections: int) -> aiohttp.ClientSession:
    """A client session for bounded GETs: at most `connections` at once, each within `timeout_s`."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        auto_decompress=False,
        connector=aiohttp.TCPConnector(limit=connections),
    )


async def bounded_get(session: aiohttp.ClientSession, url: str, *, max_bytes: int, accept: str) -> bytes:
    """The 200 body at `url`, at most `max_bytes`, within the session's time limit. Raises FetchFailed."""
    headers = {"Accept": accept, "Accept-Encoding": "identity"}
    try:
        async with session.get(url, headers=headers, allow_redirects=False) as response:
            if response.status != 200:
                raise FetchFailed(f"HTTP {response.status} {response.reason or ''}".rstrip())
            if response.content_length is not None and response.content_length > max_bytes:
                raise FetchFailed(f"body of {response.content_length} bytes, over {max_bytes}")
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > max_bytes:
                    raise FetchFailed(f"body over {max_bytes} bytes")
            return bytes(body)
    except TimeoutError:
        timeout = session.timeout.total
        raise FetchFailed(f"no answer within {timeout:g} s" if timeout else "no answer in time") from None
    except aiohttp.ClientError as exc:
        raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc
