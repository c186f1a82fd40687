"""HomeWaits: a follow-up whose answer's worker is not known yet waits a moment for another replica's word.

Behind several picker replicas, the answer a follow-up names (`previous_response_id`) or a retrieval
fetches (`GET /v1/responses/{id}`) often passed through another replica, which shares its worker
(replica sync) as soon as it reads the answer's id. A fast client can send the next request before
that word arrives: the other replica gathers it into a batch (up to 10 ms), NATS carries it, and this
replica reads it with its next catch-up. Routed on load instead, the request meets the engine's 404.

So while other replicas share routes, the pipeline waits for an id it does not know, up to
`HOME_WAIT_S`, and is woken the moment the id's home is remembered (`arrived`). An id that nobody
knows (lapsed, made up) costs that wait once per request. Bounded, as the ids come from clients: at
most `MAX_WAITING` requests wait at once; beyond that a request does not wait (`refused`).
"""

from __future__ import annotations

import asyncio
from typing import Final

HOME_WAIT_S: Final = 0.1  # a batch window (10 ms) and a NATS hop, with room for a busy loop on either side
MAX_WAITING: Final = 1024


class HomeWaits:
    """Requests waiting, each up to a bound, for the home of a response id to be remembered."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self.max_waiting = max_waiting
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._count = 0
        self.arrived = 0  # waits that ended with the home
        self.timed_out = 0  # waits that ran their whole bound
        self.refused = 0  # requests that did not wait: `max_waiting` waited already

    def __len__(self) -> int:
        return self._count

    async def wait(self, response_id: str, timeout_s: float = HOME_WAIT_S) -> bool:
        """Wait until `arrive(response_id)` or `timeout_s`; True if it arrived. False at once when
        `max_waiting` requests wait already."""
        if self._count >= self.max_waiting:
            self.refused += 1
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(response_id, []).append(future)
        self._count += 1
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self.timed_out += 1
            return False
        finally:
            self._forget(response_id, future)
        self.arrived += 1
        return True

    def arrive(self, response_id: str) -> None:
        """The home of `response_id` is known now: every request waiting for it goes on."""
        for future in self._waiting.get(response_id, ()):
            if not future.done():
                future.set_result(None)

    def _forget(self, response_id: str, future: asyncio.Future[None]) -> None:
        waiting = self._waiting[response_id]
        waiting.remove(future)
        self._count -= 1
        if not waiting:
            del self._waiting[response_id]
