"""A NATS connection whose socket the picker reads when it is awake anyway (`--nats-read-delay-ms`).

Every KV event and replica sync message used to wake the picker on its own, and the wake-up cost
it several times what the message did (`extproc/runtime/wakeups.py`). Here, after each read of
the connection's socket, the picker's loop holds the socket (`DeferringSelector.hold`) for at
most the delay: what arrives meanwhile is read with the loop's next wake-up for anything else
(an ext_proc message, a timer), at once if it is already waiting when the loop is about to sleep,
and by the delay at the latest. While the picker is idle a NATS message is thus handled up to the
delay later (a request/reply round trip, a `flush`, likewise); while it routes, with the next
ext_proc message; bytes already waiting, at once.

This reaches into nats.py: it wraps the `read` of the client's `TcpTransport` (one object for the
life of a client: nats.py reconnects it in place) and holds the asyncio transport under its
current stream writer. With any other transport (websocket), a TLS connection, or a loop not made
by `extproc.runtime.wakeups.new_event_loop`, nothing is held and `defer_reads` says so.

Held or not, bytes that reach the socket while the picker handles an ext_proc message are parsed
by nats.py a few loop turns after that message, so a decision made on it would not see them.
`catch_up` is for a reader that must: it lets the socket go and gives nats.py the turns it needs
to read, parse and hand each message to its subscription, only when something waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.transport import TcpTransport

from extproc.runtime.wakeups import bytes_waiting, deferring_selector

CATCH_UP_TURNS = 8  # loop turns `catch_up` gives nats.py at most (it needs three: read, parse, hand over)


def defer_reads(nc: NatsClient, max_delay_s: float) -> str | None:
    """Hold `nc`'s socket between reads for up to `max_delay_s`; None when done, else why not."""
    if max_delay_s <= 0:
        return "off (--nats-read-delay-ms 0)"
    selector = deferring_selector()
    if selector is None:
        return "the event loop is not the picker's (extproc.runtime.wakeups)"
    found = getattr(nc, "_transport", None)
    if not isinstance(found, TcpTransport) or not hasattr(found, "_io_writer"):
        return f"nats.py's transport is {type(found).__name__}, not the TcpTransport this knows"
    transport: Any = found
    if transport._io_writer is not None and transport._io_writer.get_extra_info("sslcontext") is not None:
        return "a TLS connection (its transport reads the socket into buffers of its own)"
    read = transport.read

    async def read_then_hold(size: int) -> bytes:
        data: bytes = await read(size)
        writer = transport._io_writer  # the current stream: replaced by a reconnect or a TLS upgrade
        if data and writer is not None:
            selector.hold(writer.transport, max_delay_s)
        return data

    transport.read = read_then_hold
    return None


async def catch_up(nc: NatsClient, pending: Callable[[], int], max_turns: int = CATCH_UP_TURNS) -> int:
    """Read what already waits for `nc` before going on: if bytes wait in its socket or its
    reader, or `pending()` (messages nats.py queued for a subscription) is not 0, let a held socket
    go and yield to the loop until all of it was handed over, `max_turns` turns at most. Returns
    the turns taken (0: nothing waited)."""
    transport: Any = getattr(nc, "_transport", None)
    writer: Any = getattr(transport, "_io_writer", None)
    if writer is None or writer.transport.is_closing():  # reconnecting: nothing to read
        return 0
    sock = writer.get_extra_info("socket")
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return 0
    reader = getattr(transport, "_io_reader", None)

    def behind() -> bool:
        return pending() > 0 or bool(getattr(reader, "_buffer", b"")) or bytes_waiting(fd)

    if not behind():
        return 0
    selector = deferring_selector()
    if selector is not None:
        selector.let_go(writer.transport)
    for turn in range(1, max_turns + 1):
        await asyncio.sleep(0)  # one loop turn: nats.py reads, parses, hands messages over
        if not behind():
            return turn
    return max_turns
