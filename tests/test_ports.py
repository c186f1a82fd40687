"""Ports that must be known before their process starts are held with `reserve_port`; the
`--ports-file` a child writes is one JSON object.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from aiohttp import web

from extproc.devstack.procs import port_is_open, reserve_port
from extproc.runtime.ports_file import write_ports_file


def test_write_ports_file_is_one_json_object_without_the_unset_ports(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    write_ports_file(path, {"port": 1234, "admin_port": None})
    assert json.loads(path.read_text()) == {"port": 1234}
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # the temporary file was renamed


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
