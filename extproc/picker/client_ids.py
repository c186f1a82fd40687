"""Ids that come from clients: request ids, session ids, and the form in which logs show them.

- Request ids (`RequestIds`): a request is tracked under its `x-request-id` when that id is free,
  at most `MAX_REQUEST_ID_CHARS` long and has no `#`. Otherwise the picker makes one, in its own
  namespace: `<client id, cut to 64 characters, or "req">#<n>`, with n from this picker's counter.
  Every id the picker makes has a `#` and no client id used as is has one, so a made id can never
  equal a client's (however the client spells it), nor another made id (n differs, and it is
  what follows the last `#`). A client that sends `x#1` while another sends `x` twice gets its
  own id, not the load of someone else's request.
- Session ids (`session_id`): `nvext.session_control.session_id`, else the `x-session-id` header.
  Longer than the limit (`--session-id-max-length`, 256 characters) is a 400: the id keys a pin
  the picker keeps for minutes, and a client that needs more can send a hash of its own.
- Logs (`loggable`): a client's id is logged escaped (no newline can forge a log line) and cut to
  64 characters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import count

from extproc.errors import RequestInvalid

MADE_ID_MARK = "#"  # every request id the picker makes has it; a client id with it is never used as is
MAX_REQUEST_ID_CHARS = 128  # longer client request ids are cut (64 characters) and numbered
SESSION_HEADER = "x-session-id"  # sticky session, when the body has no nvext.session_control
LOG_ID_CHARS = 64


class RequestIds:
    """Makes the picker's id of each request (unique among the requests it tracks)."""

    def __init__(self) -> None:
        self._numbers = count(1)

    def make(self, client_id: str, in_use: Callable[[str], bool]) -> str:
        """`client_id` itself when it is free and plain, else a made id (`<id>#<n>`)."""
        if (
            client_id
            and len(client_id) <= MAX_REQUEST_ID_CHARS
            and MADE_ID_MARK not in client_id
            and not in_use(client_id)
        ):
            return client_id
        return f"{client_id[:64] or 'req'}{MADE_ID_MARK}{next(self._numbers)}"


def session_id(body_session_id: str | None, headers: Mapping[str, str], max_length: int) -> str | None:
    """The request's sticky-session id (None: no session). Raises RequestInvalid when it is longer
    than `max_length` characters."""
    value = body_session_id or headers.get(SESSION_HEADER) or None
    if value is not None and len(value) > max_length:
        where = "nvext.session_control.session_id" if body_session_id else SESSION_HEADER
        raise RequestInvalid(
            f"{where} is {len(value)} characters long; the limit is {max_length} (send a hash of a longer id)"
        )
    return value


def loggable(text: str, limit: int = LOG_ID_CHARS) -> str:
    """`text` for a log line: non-printable and non-ASCII characters escaped, cut to `limit`."""
    head = text[:limit].encode("unicode_escape").decode("ascii")
    return head if len(text) <= limit else f"{head}...(+{len(text) - limit} chars)"
