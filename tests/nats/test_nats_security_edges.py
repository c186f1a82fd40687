"""The picker's NATS connection, the cases test_nats_security.py leaves out, against real nats-servers:
a token, a server that is not up yet, a TLS certificate that names another host than the URL's, a
tls:// URL alone, and the exact line the picker logs once connected or refused (it says how the
connection is secured and authenticated, never the secret). What `explain_refusal` says for the
errors a real server does not produce on demand is checked on the errors themselves."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import ssl
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest

from extproc.config import ClientTlsConfig, EventsConfig
from extproc.devstack.procs import NatsServer, reserve_port, start_nats_server
from extproc.events import nats_security
from extproc.events.counters import EventCounters
from extproc.events.nats_security import NatsRefused, connect_nats, explain_refusal, nats_connect_options
from extproc.runtime.wakeups import run

from ..certs import TestCa
from .conftest import eventually
from .test_nats_link_edges import SilentServer, listed_connections

TOKEN = "t0ken-secret"
AUTH_REFUSED = "check --nats-user/--nats-password, --nats-token or --nats-creds-file"


def nats_with(tmp_path: Path, conf: str, *extra: str) -> NatsServer:
    config = tmp_path / "nats.conf"
    config.write_text(conf)
    return start_nats_server(
        jetstream=False, store_dir=tmp_path / "nats", extra_args=["-c", str(config), *extra]
    )


@pytest.fixture
def token_nats(tmp_path: Path) -> Iterator[NatsServer]:
    server = nats_with(tmp_path, f'authorization {{ token: "{TOKEN}" }}\n')
    try:
        yield server
    finally:
        server.stop(grace_s=2.0)


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    return TestCa(tmp_path / "ca", "nats-ca")


@contextlib.contextmanager
def failed_attempts_collected() -> Iterator[None]:
    """nats-py leaves the socket of a first attempt that failed (timed out, closed, refused) to the
    garbage collector, which may come by at any point: quietly here, and collected before leaving."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()


def connected_line(events: EventsConfig, caplog: pytest.LogCaptureFixture) -> str:
    """Connect with the picker's own event loop (held reads need it) and return the line it logged."""

    async def main() -> None:
        link = await connect_nats(events, name="edge")
        try:
            await link.nc.flush(timeout=5)
        finally:
            await link.close()

    with caplog.at_level(logging.INFO, logger="extproc.events.nats"):
        run(main())
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("connected to NATS")]
    return line


async def refusal(events: EventsConfig, caplog: pytest.LogCaptureFixture) -> str:
    """Why the picker was refused, after checking the one line it logged and the exception it raised."""
    with failed_attempts_collected():
        with (
            caplog.at_level(logging.ERROR, logger="extproc.events.nats"),
            pytest.raises(NatsRefused) as refused,
        ):
            await connect_nats(events, name="edge")
        reason = refused.value.reason
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            f"NATS at {events.nats_url} refused the picker: {reason}"
        ]
        assert refused.value.url == events.nats_url
        assert str(refused.value) == f"cannot connect to NATS at {events.nats_url}: {reason}"
        del refused  # it holds the attempt's frames, and through them its socket
    return reason


# --- authentication -----------------------------------------------------------------------------------


def test_a_token_connects_and_the_line_says_a_token_and_how_reads_are_held(token_nats, caplog) -> None:
    events = EventsConfig(nats_url=token_nats.url, nats_token=TOKEN)
    assert connected_line(events, caplog) == (
        f"connected to NATS at {token_nats.url} (plaintext, a token); messages read with the picker's "
        "next wake-up, within 200 ms"
    )
    caplog.clear()
    faster = EventsConfig(nats_url=token_nats.url, nats_token=TOKEN, nats_read_delay_s=0.05)
    assert connected_line(faster, caplog).endswith(
        "; messages read with the picker's next wake-up, within 50 ms"
    )
    caplog.clear()
    off = EventsConfig(nats_url=token_nats.url, nats_token=TOKEN, nats_read_delay_s=0)
    assert connected_line(off, caplog).endswith(
        "; messages read as they arrive: off (--nats-read-delay-ms 0)"
    )
    assert TOKEN not in caplog.text


@pytest.mark.parametrize(
    ("credentials", "said"),
    [
        ({"nats_token": "not-the-token"}, "a token"),
        ({"nats_user": "picker", "nats_password": "pass"}, "user 'picker' and a password"),
        ({}, "no credentials"),
    ],
)
async def test_refused_credentials_are_named_by_kind_never_by_value(
    token_nats, caplog, credentials, said
) -> None:
    reason = await refusal(EventsConfig(nats_url=token_nats.url, **credentials), caplog)
    assert reason == f"authentication refused (nats: 'Authorization Violation') with {said}; {AUTH_REFUSED}"
    assert "not-the-token" not in caplog.text and "pass)" not in caplog.text


async def test_the_link_is_named_and_counts_into_the_pickers_counters(tmp_path) -> None:
    with reserve_port() as monitor:
        server = nats_with(tmp_path, f'authorization {{ token: "{TOKEN}" }}\n', "-m", str(monitor.port))
        try:
            counters = EventCounters()
            events = EventsConfig(nats_url=server.url, nats_token=TOKEN)
            link = await connect_nats(events, name="picker-7", counters=counters)
            try:
                assert link.counters is counters
                assert await listed_connections(monitor.port) == ["picker-7"]
            finally:
                await link.close()
        finally:
            server.stop(grace_s=2.0)


@pytest.mark.parametrize("installed", [False, True])
def test_a_creds_file_needs_the_nkeys_package(monkeypatch, installed) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args):
        if name == "nkeys":
            return real("json") if installed else None  # any spec: "installed"
        return real(name, *args)

    monkeypatch.setattr(nats_security.importlib.util, "find_spec", find_spec)
    events = EventsConfig(nats_url="nats://127.0.0.1:4222", nats_creds_file="/secrets/picker.creds")
    if installed:
        assert nats_connect_options(events) == {"user_credentials": "/secrets/picker.creds"}
        return
    with pytest.raises(NatsRefused) as refused:
        nats_connect_options(events)
    assert (refused.value.url, refused.value.reason) == (
        "nats://127.0.0.1:4222",
        "--nats-creds-file needs the nkeys package (pip install 'nats-py[nkeys]'), which the image does not "
        "ship; use --nats-user/--nats-password or --nats-token instead",
    )


def test_each_credential_goes_to_nats_py_under_its_own_name() -> None:
    assert nats_connect_options(EventsConfig(nats_token=TOKEN)) == {"token": TOKEN}
    assert nats_connect_options(EventsConfig(nats_user="u", nats_password="p")) == {
        "user": "u",
        "password": "p",
    }
    assert nats_connect_options(EventsConfig()) == {}


# --- a server that is not up yet ------------------------------------------------------------------------


async def test_a_server_that_is_not_up_yet_is_waited_for_with_one_warning(tmp_path, caplog) -> None:
    with reserve_port() as port:
        url = f"nats://127.0.0.1:{port.port}"
        with caplog.at_level(logging.WARNING, logger="extproc.events.nats"):
            connecting = asyncio.ensure_future(connect_nats(EventsConfig(nats_url=url), name="early"))
            warned = [f"NATS at {url} does not answer yet ([Errno 111] Connect call failed ('127.0.0.1', "
                      f"{port.port})); retrying until it does"]  # fmt: skip

            def lines() -> list[str]:
                return [r.getMessage() for r in caplog.records if r.name == "extproc.events.nats"]

            async def said() -> bool:
                return lines() == warned

            await eventually(said, 10.0, "the warning that the server does not answer yet")
            assert not connecting.done()
            server = start_nats_server(port.port, jetstream=False, store_dir=tmp_path / "nats")
            try:
                link = await asyncio.wait_for(connecting, 15.0)
                await link.close()
            finally:
                server.stop(grace_s=2.0)
        assert lines() == warned  # no refusal, no second warning


async def test_a_server_that_accepts_but_never_answers_is_said_so_after_the_first_attempts_timeout(
    caplog,
) -> None:
    """A hung server (or something else on the port): the first attempt gives up after
    FIRST_ATTEMPT_TIMEOUT_S and says so; the picker goes on waiting, as for a server not up yet."""
    with failed_attempts_collected(), caplog.at_level(logging.WARNING, logger="extproc.events.nats"):
        connecting: asyncio.Future | None = None
        try:
            async with SilentServer() as silent:
                started = time.monotonic()
                connecting = asyncio.ensure_future(
                    connect_nats(EventsConfig(nats_url=silent.url), name="early")
                )

                async def warned() -> bool:
                    return any(r.name == "extproc.events.nats" for r in caplog.records)

                await eventually(warned, 10.0, "the warning that the server does not answer")
                waited = time.monotonic() - started
            # the server closed its connections first: the link's own attempt sees the end of its
            # socket and closes it, so that nothing is left open when it is cancelled below

            async def link_attempt_ended() -> bool:
                return any(r.name == "extproc.events" for r in caplog.records)

            await eventually(link_attempt_ended, 10.0, "the link's attempt ended by the closed server")
        finally:
            if connecting is not None:
                connecting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await connecting
    (line,) = [r.getMessage() for r in caplog.records if r.name == "extproc.events.nats"]
    assert line == f"NATS at {silent.url} does not answer yet (TimeoutError); retrying until it does"
    assert waited >= nats_security.FIRST_ATTEMPT_TIMEOUT_S  # the first attempt waited out its timeout


async def test_something_on_the_port_that_closes_at_once_is_not_a_refusal(caplog) -> None:
    """Not NATS (or a server shutting down): nats-py's own error is no refusal, so the picker waits."""

    async def close_at_once(_reader, writer) -> None:
        writer.close()

    closer = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    url = f"nats://127.0.0.1:{closer.sockets[0].getsockname()[1]}"
    try:
        with failed_attempts_collected(), caplog.at_level(logging.WARNING, logger="extproc.events.nats"):
            connecting = asyncio.ensure_future(connect_nats(EventsConfig(nats_url=url), name="early"))
            try:

                async def warned() -> bool:
                    return any(r.name == "extproc.events.nats" for r in caplog.records)

                await eventually(warned, 10.0, "the warning that the server does not answer")
            finally:
                connecting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await connecting
    finally:
        closer.close()
        await closer.wait_closed()
    assert [r.getMessage() for r in caplog.records if r.name == "extproc.events.nats"] == [
        f"NATS at {url} does not answer yet (nats: empty response from server when expecting INFO message); "
        "retrying until it does"
    ]


# --- TLS ------------------------------------------------------------------------------------------------


@pytest.fixture
def named_tls_nats(tmp_path: Path, ca: TestCa) -> Iterator[NatsServer]:
    """TLS required; the server's certificate names nats.internal only, not the loopback address."""
    cert = ca.issue("nats-server", ("nats.internal",))
    server = nats_with(tmp_path, f'tls {{ cert_file: "{cert.cert_file}", key_file: "{cert.key_file}" }}\n')
    try:
        yield server
    finally:
        server.stop(grace_s=2.0)


def test_a_server_name_verifies_a_certificate_that_names_another_host(named_tls_nats, ca, caplog) -> None:
    named = ClientTlsConfig(ca_file=ca.ca_file, server_name="nats.internal")
    assert nats_connect_options(EventsConfig(nats_tls=named))["tls_hostname"] == "nats.internal"
    events = EventsConfig(nats_url=named_tls_nats.url, nats_tls=named)
    assert connected_line(events, caplog) == (
        f"connected to NATS at {named_tls_nats.url} (TLS, no credentials); messages read as they arrive: "
        "a TLS connection (its transport reads the socket into buffers of its own)"
    )


async def test_without_the_server_name_the_certificate_is_refused_naming_the_ca_file(
    named_tls_nats, ca, caplog
):
    events = EventsConfig(nats_url=named_tls_nats.url, nats_tls=ClientTlsConfig(ca_file=ca.ca_file))
    reason = await refusal(events, caplog)
    assert reason.startswith(
        "the server's TLS certificate was not accepted (IP address mismatch, certificate is not valid for "
        "'127.0.0.1'.)"
    )
    assert reason.endswith(
        f"): it must be signed by a CA in --nats-tls-ca-file {ca.ca_file} and name the host in the URL"
    )


def test_a_tls_url_alone_connects_over_tls_with_the_systems_roots(tmp_path, ca, monkeypatch, caplog) -> None:
    cert = ca.issue("nats-server")
    server = nats_with(tmp_path, f'tls {{ cert_file: "{cert.cert_file}", key_file: "{cert.key_file}" }}\n')
    monkeypatch.setenv("SSL_CERT_FILE", ca.ca_file)  # the system's roots, as OpenSSL finds them
    try:
        url = f"tls://127.0.0.1:{server.port}"
        events = EventsConfig(nats_url=url)
        assert nats_connect_options(events) == {}  # nats.py makes the TLS context itself
        assert connected_line(events, caplog).startswith(
            f"connected to NATS at {url} (TLS, no credentials); "
        )
    finally:
        server.stop(grace_s=2.0)


class AlertLost:
    """A TCP proxy to nats-server that loses what the server sends after the client's second TLS
    flight (TLS 1.3: its verdict on the client certificate, an alert), and closes the connection once
    the client has written its first message after the handshake (CONNECT and PING): the race in
    which the server's close beats its alert, made certain."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> AlertLost:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, client_reader, client_writer) -> None:
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        verdict_due = asyncio.Event()  # set once the client sent its second flight

        async def down() -> None:
            while data := await server_reader.read(65536):
                if not verdict_due.is_set():
                    client_writer.write(data)
                    await client_writer.drain()
                # else: the alert, lost

        downstream = asyncio.ensure_future(down())
        try:
            chunks = 0
            while data := await client_reader.read(65536):
                chunks += 1  # 1: the ClientHello (after the server's plaintext INFO); 2: the second flight
                if chunks == 2:
                    verdict_due.set()
                if chunks > 2:
                    break  # the client's CONNECT and PING: close on them, unanswered
                server_writer.write(data)
                await server_writer.drain()
        finally:
            client_writer.close()
            server_writer.close()
            downstream.cancel()
            await asyncio.gather(downstream, return_exceptions=True)


async def test_a_client_certificate_refused_is_said_even_when_the_servers_alert_is_lost(tmp_path, ca, caplog):
    """Before, nats-py's connect returned without the server's PONG, the close showed as an unexpected
    EOF that was not read as a refusal, and the picker retried the refused certificate forever."""
    cert = ca.issue("nats-server")
    server = nats_with(
        tmp_path,
        f'tls {{ cert_file: "{cert.cert_file}", key_file: "{cert.key_file}", ca_file: "{ca.ca_file}", '
        "verify: true }\n",
    )
    intruder = TestCa(tmp_path / "other", "other-ca").issue("intruder", client=True)
    tls = ClientTlsConfig(ca_file=ca.ca_file, cert_file=intruder.cert_file, key_file=intruder.key_file)
    try:
        async with AlertLost(server.port) as proxy:
            events = EventsConfig(nats_url=f"nats://127.0.0.1:{proxy.port}", nats_tls=tls)
            reason = await asyncio.wait_for(refusal(events, caplog), 10.0)
    finally:
        server.stop(grace_s=2.0)
    assert reason == (
        f"the server ended the TLS handshake: it did not accept the client certificate {intruder.cert_file} "
        "(it must be signed by a CA in the server's tls ca_file)"
    )


# --- what a refusal says, on the errors themselves -------------------------------------------------------


def ssl_error(text: str, reason: str | None = None) -> ssl.SSLError:
    error = ssl.SSLError(1, text)
    error.reason = reason  # the ssl module sets it from OpenSSL's error, None when OpenSSL names none
    return error


@pytest.mark.parametrize(
    ("url", "tls", "error", "said"),
    [
        # TLS 1.3: the server's close may beat its alert; over TLS that is the client certificate refused
        ("tls://h:4222", ClientTlsConfig(), ConnectionResetError(), "requires a client certificate"),
        ("nats://h:4222", ClientTlsConfig(ca_file="ca.pem"), EOFError(), "requires a client certificate"),
        ("nats://h:4222", ClientTlsConfig(ca_file="ca.pem", cert_file="me.pem", key_file="me.key"),
         BrokenPipeError(), "did not accept the client certificate me.pem"),
        ("nats://h:4222", ClientTlsConfig(), ConnectionResetError("reset by peer"),
         "ConnectionResetError: reset by peer"),  # plaintext: nothing to do with certificates
        ("nats://h:4222", ClientTlsConfig(ca_file="ca.pem"),
         ssl_error("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca"), "requires a client certificate"),
        ("nats://h:4222", ClientTlsConfig(ca_file="ca.pem"),
         ssl_error("[SSL: WRONG_VERSION_NUMBER] wrong", "WRONG_VERSION_NUMBER"),
         "TLS failed (WRONG_VERSION_NUMBER); check the --nats-tls-* files"),
        ("nats://h:4222", ClientTlsConfig(), TimeoutError(), "no server answered (TimeoutError)"),
        ("nats://h:4222", ClientTlsConfig(), nats.errors.NoServersError(),
         "no server answered (nats: no servers available for connection)"),
        ("nats://h:4222", ClientTlsConfig(), nats.errors.Error("nats: 'Authorization Violation'"),
         f"authentication refused (nats: 'Authorization Violation') with no credentials; {AUTH_REFUSED}"),
    ],
)  # fmt: skip
def test_explain_refusal_names_the_setting_to_fix(url, tls, error, said) -> None:
    reason = explain_refusal(error, EventsConfig(nats_url=url, nats_tls=tls))
    assert said in reason
    if said.startswith(("requires", "did not")):
        assert reason.startswith("the server ended the TLS handshake: it ")
    if said == "requires a client certificate":
        assert reason.endswith("(tls { verify: true }); set --nats-tls-cert-file and --nats-tls-key-file")
    if said.startswith("did not"):
        assert reason.endswith("(it must be signed by a CA in the server's tls ca_file)")


def test_a_certificate_refused_by_the_systems_roots_says_so() -> None:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_message = "unable to get local issuer certificate"
    assert explain_refusal(error, EventsConfig(nats_url="tls://h:4222")) == (
        "the server's TLS certificate was not accepted (unable to get local issuer certificate): it must be "
        "signed by a CA in the system's CA roots (no --nats-tls-ca-file) and name the host in the URL"
    )
