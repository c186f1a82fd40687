"""Shared fixtures of the manifest tests (the repository's gateway/ and the CRDs in ../shared/crds) and
of the DNS discovery tests (a DNS server on loopback answering from a zone file the test rewrites).

CI clones this repository next to the shared material (`../shared`); where that directory is
missing the tests that need the CRDs are skipped, the others still run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.devstack.procs import ManagedProcess
from tests.k8s.crds import CrdSchemas
from tests.k8s.dns_zone import Zone

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "gateway"
CRDS_DIR = REPO.parent / "shared" / "crds"
BROKEN = Path(__file__).resolve().parent / "fixtures" / "broken"


@pytest.fixture(scope="session")
def crds() -> CrdSchemas:
    if not CRDS_DIR.is_dir():
        pytest.skip(f"no CRD schemas at {CRDS_DIR} (clone the repository next to ../shared)")
    return CrdSchemas(CRDS_DIR)


@pytest.fixture
def dns_server(tmp_path: Path) -> Iterator[tuple[Zone, int]]:
    zone = Zone(tmp_path / "zone.json")
    server = ManagedProcess(
        [sys.executable, str(Path(__file__).with_name("dns_server.py")), str(zone.path)],
        log_path=tmp_path / "dns.log",
    ).start()
    try:
        deadline = time.monotonic() + 10
        while "PORT " not in server.log_tail():
            assert server.is_running(), server.log_tail()
            assert time.monotonic() < deadline, "the DNS server did not start"
            time.sleep(0.02)
        port = int(server.log_tail().split("PORT ")[1].split()[0])
        yield zone, port
    finally:
        server.stop(grace_s=2)
