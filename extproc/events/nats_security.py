"""NATS credentials and TLS: the `nats.connect` options of `EventsConfig`, and why a connection was refused.

One NATS connection per picker carries KV events, durable state and replica sync
(`events/sources.py`), so these options secure all of them. Authentication (at most one, checked
in config.py): a .creds file (user JWT and nkey seed; nats-py signs with the `nkeys` package, which
ships no wheel and so is not in the image: install `nats-py[nkeys]` to use it), user and password,
or a token; credentials in the URL (nats://user:pass@host) work too. TLS: with a CA file, a
client certificate or a tls:// URL (system roots), the server's certificate is verified; a client
certificate answers servers with `tls { verify: true }`. Names follow Dynamo's runtime, whose
environment variables (NATS_AUTH_*, NATS_TLS_*) config.py also reads.

`connect_nats` opens the picker's connection. nats-py retries a first connection that fails
forever (the link reconnects without limit), which suits a server that is not up yet but hides a
refusal: a certificate that does not verify, a client certificate the server rejects, wrong
credentials. So one attempt without retries comes first; a refusal stops the start with one log
line saying which setting to check (nats-py's own errors are terse: a server that rejects the
client certificate just closes the connection, seen as "Connection lost").
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import ssl
from typing import Any, NoReturn

import nats
import nats.errors

from extproc.config import EventsConfig
from extproc.events.counters import EventCounters
from extproc.events.nats_events import NatsLink
from extproc.events.nats_reads import defer_reads
from extproc.runtime.tls import client_ssl_context

log = logging.getLogger("extproc.events.nats")

FIRST_ATTEMPT_TIMEOUT_S = 2.0


class NatsRefused(RuntimeError):
    """The first connection to NATS failed; the message says why and which setting to check."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to NATS at {url}: {reason}")
        self.url = url
        self.reason = reason


async def connect_nats(events: EventsConfig, *, name: str, counters: EventCounters | None = None) -> NatsLink:
    """The picker's NATS link to `events.nats_url` with its credentials and TLS.

    Raises NatsRefused (logged once, with the reason) when the server refuses this client, and
    TlsError for unusable certificate files. A server that does not answer yet is waited for.
    """
    url = events.nats_url or ""
    options = nats_connect_options(events)
    await _first_attempt(url, events, options)
    link = await NatsLink.connect(url, name=name, counters=counters, **options)
    not_deferred = defer_reads(link.nc, events.nats_read_delay_s)
    log.info(
        "connected to NATS at %s (%s, %s); %s",
        url,
        "TLS" if "tls" in options or url.startswith("tls://") else "plaintext",
        authentication(events),
        f"messages read as they arrive: {not_deferred}"
        if not_deferred
        else f"messages read with the picker's next wake-up, within {1000 * events.nats_read_delay_s:g} ms",
    )
    return link


async def _first_attempt(url: str, events: EventsConfig, options: dict[str, Any]) -> None:
    """Connect once without retrying; raise NatsRefused if the server refuses us."""

    failures: list[Exception] = []

    async def quiet(exc: Exception) -> None:  # the reason is logged below, once
        failures.append(exc)

    try:
        # nats-py retries a server it cannot reach inside one connect, forever with
        # max_reconnect_attempts=0 (allow_reconnect=False bails only after it was reached); 1 lets it
        # try twice, at once, then give up with NoServersError
        nc = await nats.connect(
            url,
            connect_timeout=FIRST_ATTEMPT_TIMEOUT_S,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0,
            error_cb=quiet,
            **options,
        )
    except Exception as exc:  # (nats-py may leave a refused TLS socket for the collector to close)
        if isinstance(exc, nats.errors.NoServersError) and failures:
            exc = failures[-1]  # why the server could not be reached: refused, no such host, ...
        if not _is_refusal(exc, events):
            log.warning(
                "NATS at %s does not answer yet (%s); retrying until it does",
                url,
                str(exc) or type(exc).__name__,
            )
            return
        _refused(url, exc, events)
    # TLS 1.3: the server's verdict on our certificate comes after our side of the handshake. When its
    # alert is lost to the close, nats-py's connect returns without the server's PONG (not connected)
    # and the close shows only as an unexpected EOF; so make one round trip before calling the
    # connection good (otherwise the link would retry forever).
    answered = nc.is_connected
    with contextlib.suppress(Exception):
        # nats-py annotates the timeout as int; a float goes to asyncio.wait_for as is
        await nc.flush(timeout=FIRST_ATTEMPT_TIMEOUT_S)  # type: ignore[arg-type]
    error = nc.last_error
    await nc.close()
    if error is None or (answered and isinstance(error, nats.errors.UnexpectedEOF)):
        return  # good, or a server that answered and then went away: it did not refuse us
    if _is_refusal(error, events):
        _refused(url, error, events)


def _refused(url: str, exc: BaseException, events: EventsConfig) -> NoReturn:
    reason = explain_refusal(exc, events)
    log.error("NATS at %s refused the picker: %s", url, reason)
    raise NatsRefused(url, reason) from exc


def _is_refusal(exc: BaseException, events: EventsConfig) -> bool:
    """Whether `exc` is the server refusing this client (settings to fix), not the server being away."""
    if isinstance(exc, ssl.SSLError | nats.errors.AuthorizationError):
        return True
    if isinstance(exc, nats.errors.Error) and "authorization" in str(exc).lower():
        return True
    return _client_certificate_refused(exc, events)


def nats_connect_options(events: EventsConfig) -> dict[str, Any]:
    """Keyword arguments for `nats.connect` (through `NatsLink.connect`): credentials and TLS.

    Raises TlsError for unusable certificate files and NatsRefused when a creds file is given
    without the `nkeys` package.
    """
    options: dict[str, Any] = {}
    if events.nats_creds_file is not None:
        if importlib.util.find_spec("nkeys") is None:
            raise NatsRefused(
                events.nats_url or "",
                "--nats-creds-file needs the nkeys package (pip install 'nats-py[nkeys]'), which the "
                "image does not ship; use --nats-user/--nats-password or --nats-token instead",
            )
        options["user_credentials"] = events.nats_creds_file
    if events.nats_user is not None:
        options["user"] = events.nats_user
        options["password"] = events.nats_password
    if events.nats_token is not None:
        options["token"] = events.nats_token
    context = client_ssl_context(events.nats_tls)
    if context is not None:
        options["tls"] = context
        if events.nats_tls.server_name:
            options["tls_hostname"] = events.nats_tls.server_name
    return options


def authentication(events: EventsConfig) -> str:
    """How the picker authenticates to NATS, for log lines (never the secret itself)."""
    if events.nats_creds_file is not None:
        return f"credentials file {events.nats_creds_file}"
    if events.nats_user is not None:
        return f"user {events.nats_user!r} and a password"
    if events.nats_token is not None:
        return "a token"
    return "no credentials"


def explain_refusal(exc: BaseException, events: EventsConfig) -> str:
    """Why connecting failed, in terms of the picker's settings."""
    tls = events.nats_tls
    if isinstance(exc, ssl.SSLCertVerificationError):
        ca = (
            f"--nats-tls-ca-file {tls.ca_file}"
            if tls.ca_file
            else "the system's CA roots (no --nats-tls-ca-file)"
        )
        return (
            f"the server's TLS certificate was not accepted ({exc.verify_message}): "
            f"it must be signed by a CA in {ca} and name the host in the URL"
        )
    if _client_certificate_refused(exc, events):
        if tls.cert_file is None:
            return (
                "the server ended the TLS handshake: it requires a client certificate "
                "(tls { verify: true }); set --nats-tls-cert-file and --nats-tls-key-file"
            )
        return (
            f"the server ended the TLS handshake: it did not accept the client certificate {tls.cert_file} "
            "(it must be signed by a CA in the server's tls ca_file)"
        )
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc}); check the --nats-tls-* files"
    text = str(exc)
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in text.lower():
        return (
            f"authentication refused ({text}) with {authentication(events)}; "
            "check --nats-user/--nats-password, --nats-token or --nats-creds-file"
        )
    if isinstance(exc, nats.errors.NoServersError | ConnectionRefusedError | TimeoutError):
        return f"no server answered ({text or type(exc).__name__})"
    return f"{type(exc).__name__}: {text}"


# TLS alerts a server sends when it rejects the client's certificate (or its absence).
_CLIENT_CERTIFICATE_ALERTS = ("ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE_REQUIRED",
                              "ALERT_CERTIFICATE_UNKNOWN", "ALERT_HANDSHAKE_FAILURE")  # fmt: skip


def _client_certificate_refused(exc: BaseException, events: EventsConfig) -> bool:
    """The server rejected our client certificate: it sent an alert, or (TLS 1.3, when the alert
    loses the race with the close) just closed the connection during the handshake: a reset, a
    broken pipe or an EOF (nats-py's own after its connect returned), depending on which write or
    read meets the close first."""
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLCertVerificationError):
        return any(alert in str(exc.reason or exc) for alert in _CLIENT_CERTIFICATE_ALERTS)
    tls = events.nats_tls.enabled or (events.nats_url or "").startswith("tls://")
    closed = ConnectionResetError | BrokenPipeError | EOFError | nats.errors.UnexpectedEOF
    return tls and isinstance(exc, closed)
