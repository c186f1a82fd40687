"""Each kind of child binds port 0 itself and reports the port it got, and answers there; a port
that must be known before its process starts is held with `reserve_port`.

    serve, mock-worker, the no-op picker, the echo worker   --ports-file (JSON)
    nats-server                                             -p -1 and its --ports_file_dir file
    Envoy                                                   --admin-address-path, then /listeners
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import grpc
import pytest
import yaml
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.devstack.envoy_config import render_envoy_config
from extproc.devstack.procs import (
    ManagedProcess,
    ProcessFailed,
    http_status,
    port_is_open,
    reserve_port,
    start_envoy,
    start_nats_server,
    wait_http_ok,
)
from extproc.runtime.ports_file import write_ports_file

MODEL = "demo-model"


def serve_argv(tmp_path: Path, *flags: str) -> list[str]:
    config = tmp_path / "picker.yaml"
    config.write_text(yaml.safe_dump({"workers": [{"id": "w0", "endpoint": "127.0.0.1:9", "model": MODEL}]}))
    return [sys.executable, "-m", "extproc", "serve", "--config", str(config), "--no-kv-events", *flags]


def test_write_ports_file_is_one_json_object_without_the_unset_ports(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    write_ports_file(path, {"port": 1234, "admin_port": None})
    assert json.loads(path.read_text()) == {"port": 1234}
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # the temporary file was renamed


async def test_serve_reports_each_port_it_bound_and_answers_on_each(tmp_path: Path) -> None:
    ports_file = tmp_path / "serve.ports.json"
    argv = serve_argv(
        tmp_path, "--port", "0", "--health-port", "0", "--admin-port", "0", "--group-api-port", "0",
        "--ports-file", str(ports_file),
    )  # fmt: skip
    with ManagedProcess(argv, log_path=tmp_path / "serve.log", ports_file=ports_file) as picker:
        ports = await asyncio.to_thread(picker.ports, 30.0)
        assert set(ports) == {"port", "health_port", "admin_port", "group_api_port"}
        assert 0 not in ports.values() and len(set(ports.values())) == 4
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['health_port']}") as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="liveness"), timeout=5
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert http_status(f"http://127.0.0.1:{ports['admin_port']}/healthz")[0] == 200
        for name in ("port", "group_api_port"):  # gRPC servers: a connection is accepted
            assert port_is_open("127.0.0.1", ports[name]), name
        assert f"ext_proc on 127.0.0.1:{ports['port']}" in picker.log_tail()
        assert picker.stop() == 0


def test_serve_reports_only_the_servers_it_runs(tmp_path: Path) -> None:
    ports_file = tmp_path / "serve.ports.json"
    argv = serve_argv(tmp_path, "--port", "0", "--health-port", "0", "--ports-file", str(ports_file))
    with ManagedProcess(argv, log_path=tmp_path / "serve.log", ports_file=ports_file) as picker:
        assert set(picker.ports()) == {"port", "health_port"}


def test_mock_worker_reports_its_http_and_zmq_ports_and_answers_there(tmp_path: Path) -> None:
    ports_file = tmp_path / "worker.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "mock-worker", "--port", "0", "--kv-events", "zmq",
        "--kv-events-port", "0", "--kv-replay-port", "0", "--ports-file", str(ports_file),
    ]  # fmt: skip
    with ManagedProcess(argv, log_path=tmp_path / "worker.log", ports_file=ports_file) as worker:
        ports = worker.ports()
        assert set(ports) == {"port", "kv_events_port", "kv_replay_port"}
        wait_http_ok(f"http://127.0.0.1:{ports['port']}/health", 10.0, process=worker)
        assert port_is_open("127.0.0.1", ports["kv_events_port"])  # ZMQ PUB
        assert port_is_open("127.0.0.1", ports["kv_replay_port"])  # ZMQ ROUTER
        assert worker.stop() == 0


def test_mock_worker_without_zmq_events_reports_its_http_port_only(tmp_path: Path) -> None:
    ports_file = tmp_path / "worker.ports.json"
    argv = [
        sys.executable, "-m", "extproc", "mock-worker", "--port", "0", "--kv-events", "off",
        "--ports-file", str(ports_file),
    ]  # fmt: skip
    with ManagedProcess(argv, log_path=tmp_path / "worker.log", ports_file=ports_file) as worker:
        assert list(worker.ports()) == ["port"]


def test_a_child_that_exits_without_reporting_fails_at_once_with_its_log(tmp_path: Path) -> None:
    ports_file = tmp_path / "never.ports.json"
    ports_file.write_text('{"port": 1}')  # a previous life's report is removed at start
    argv = [sys.executable, "-c", "import sys; print('no ports for you'); sys.exit(3)"]
    with (
        ManagedProcess(argv, log_path=tmp_path / "child.log", ports_file=ports_file) as child,
        pytest.raises(ProcessFailed, match="no ports for you"),
    ):
        child.ports(timeout_s=30.0)
    assert not ports_file.exists()


def test_nats_server_picks_its_port_and_reports_it_in_its_ports_file(tmp_path: Path) -> None:
    server = start_nats_server(jetstream=False, store_dir=tmp_path / "nats")
    try:
        assert server.port != 0 and server.url == f"nats://127.0.0.1:{server.port}"
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            assert conn.recv(4096).startswith(b"INFO {")  # a NATS server greets every client
        assert "-p" in server.argv and server.argv[server.argv.index("-p") + 1] == "-1"
    finally:
        server.stop(grace_s=2.0)


def test_envoy_binds_port_0_for_admin_and_listener_and_reports_both(tmp_path: Path) -> None:
    with reserve_port() as picker:  # nothing listens: the fail-closed template answers 5xx itself
        config = render_envoy_config("buffered", picker_address=picker.address)
        assert "port_value: 0 }" in config
        envoy = start_envoy(config, log_path=tmp_path / "envoy.log")
        try:
            assert envoy.admin_port != 0 and list(envoy.listeners) == ["inference"]
            assert http_status(f"{envoy.admin_url}/ready") == (200, "LIVE\n")
            status, _ = http_status(f"{envoy.url}/v1/models", timeout_s=10.0)
            assert 500 <= status < 600  # Envoy's own answer on the listener it reported
        finally:
            envoy.stop()


@pytest.mark.skipif(sys.platform != "linux", reason="the reservation holds its port on Linux only")
async def test_a_reserved_port_refuses_connections_is_never_handed_out_and_our_servers_bind_it() -> None:
    with reserve_port() as reserved:
        port = reserved.port
        assert not port_is_open("127.0.0.1", port)
        handed_out = []
        for _ in range(200):  # the kernel's own choices skip it
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                handed_out.append(sock.getsockname()[1])
        assert port not in handed_out
        with socket.socket() as other, pytest.raises(OSError):  # a bind without SO_REUSEADDR fails
            other.bind(("127.0.0.1", port))
        for _ in range(2):  # our servers (SO_REUSEADDR) can bind it, and again after a restart
            runner = web.AppRunner(web.Application())
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            assert port_is_open("127.0.0.1", port)
            await runner.cleanup()
            assert not port_is_open("127.0.0.1", port)
