"""DNS discovery against a real DNS server on loopback, while the picker runs.

The server (tests/k8s/dns_server.py, dnslib) is a child process answering from a zone file the
test rewrites: records added and removed change the running picker's worker set; a failing server
leaves it as it was; a name that no longer exists empties it. Discovered workers carry the role and
device class the flags give them; a second (prefill) name adds prefill workers and fails on its
own. Conditions are polled with a deadline, never slept for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from extproc.config import ConfigError, PickerConfig, load_config
from extproc.picker.pipeline import EndpointPicker
from extproc.runtime.discovery import (
    DnsWorkers,
    discovery_model,
    endpoint_of,
    parse_dns_server,
    start_discovery,
)
from extproc.runtime.server import RunningPicker, start_picker

from .dns_zone import NAME, PREFILL_NAME, Zone

MODEL = "demo-model"


def discovery_config(port: int, tmp_path: Path, *flags: str) -> PickerConfig:
    config_file = tmp_path / "picker.yaml"
    config_file.write_text(f"models:\n- name: {MODEL}\ndiscovery:\n  discovery-refresh-secs: 0.05\n")
    return load_config(
        ["--config", str(config_file), "--port", "0", "--health-port", "0",
         "--discovery-dns-server", f"127.0.0.1:{port}", "--discovery-port", "8000", *flags],
        environ={},
    )  # fmt: skip


@pytest.fixture
async def picker(dns_server, tmp_path) -> AsyncIterator[tuple[RunningPicker, Zone]]:
    zone, port = dns_server
    running = await start_picker(discovery_config(port, tmp_path, "--discovery-dns", NAME))
    try:
        yield running, zone
    finally:
        await running.stop(0)


@contextlib.asynccontextmanager
async def discovering(port: int, tmp_path: Path, *flags: str) -> AsyncIterator[EndpointPicker]:
    """An in-memory picker (no gRPC server) whose workers discovery keeps; `flags` add to the command line."""
    config = discovery_config(port, tmp_path, *flags)
    picker = EndpointPicker(config)
    discovery = await start_discovery(config, picker)
    assert discovery is not None
    try:
        yield picker
    finally:
        await discovery.stop()
        await picker.close()


def endpoints(running: RunningPicker) -> set[str]:
    return {w.endpoint for w in running.picker.pools[MODEL].workers.values()}


def roles(picker: EndpointPicker) -> dict[str, str]:
    return {w.endpoint: w.role for w in picker.pools[MODEL].all_workers().values()}


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        await asyncio.sleep(0.01)


async def test_records_added_and_removed_change_the_running_pickers_workers(picker):
    running, zone = picker
    assert endpoints(running) == {"10.1.0.1:8000", "10.1.0.2:8000"}  # looked up before start returned

    zone.set(["10.1.0.2", "10.1.0.3"])  # a pod went, another came
    await wait_until(lambda: endpoints(running) == {"10.1.0.2:8000", "10.1.0.3:8000"}, "pod replaced")
    worker = running.picker.pools[MODEL].workers["10.1.0.3:8000"]
    assert (worker.id, worker.model) == ("10.1.0.3:8000", MODEL)

    zone.set(["10.1.0.2", "10.1.0.3"], ["fd00::7"])  # a dual-stack pod
    await wait_until(lambda: "[fd00::7]:8000" in endpoints(running), "IPv6 worker added")

    zone.set(["10.1.0.3"])
    await wait_until(lambda: endpoints(running) == {"10.1.0.3:8000"}, "workers removed")


async def test_a_failing_lookup_keeps_the_last_known_workers(picker, caplog):
    running, zone = picker
    caplog.set_level(logging.DEBUG, logger="extproc.discovery")
    zone.set(["10.1.0.1", "10.1.0.2"], mode="servfail")

    def failures() -> int:
        return sum("DNS lookup failed" in r.getMessage() for r in caplog.records)

    await wait_until(lambda: failures() >= 3, "three failed lookups")
    assert endpoints(running) == {"10.1.0.1:8000", "10.1.0.2:8000"}
    assert (
        sum(r.levelno == logging.WARNING for r in caplog.records if "DNS lookup failed" in r.getMessage())
        == 1
    )

    zone.set(["10.1.0.9"])  # the server answers again
    await wait_until(lambda: endpoints(running) == {"10.1.0.9:8000"}, "recovered")


async def test_a_name_that_no_longer_exists_empties_the_set(picker):
    running, zone = picker
    zone.set([], exists=False)  # NXDOMAIN: a headless Service without ready pods
    await wait_until(lambda: endpoints(running) == set(), "no worker left")
    zone.set(["10.1.0.4"])
    await wait_until(lambda: endpoints(running) == {"10.1.0.4:8000"}, "a pod is ready again")


@pytest.mark.parametrize(
    "text, expected",
    [("10.96.0.10", ("10.96.0.10", 53)), ("127.0.0.1:5353", ("127.0.0.1", 5353)),
     ("[fd00::a]:53", ("fd00::a", 53)), ("fd00::a", ("fd00::a", 53))],
)  # fmt: skip
def test_dns_server_setting(text, expected):
    assert parse_dns_server(text) == expected


@pytest.mark.parametrize("text", ["kube-dns", "10.0.0.1:0", "10.0.0.1:x", "[fd00::1]:99999"])
def test_bad_dns_server_setting_names_it(text):
    with pytest.raises(ConfigError, match="discovery-dns-server"):
        parse_dns_server(text)


def test_endpoints_bracket_ipv6():
    assert endpoint_of("10.0.0.1", 8000) == "10.0.0.1:8000"
    assert endpoint_of("fd00::1", 8000) == "[fd00::1]:8000"


def test_the_discovered_model_must_be_known(tmp_path):
    config_file = tmp_path / "picker.yaml"
    config_file.write_text("models: [{name: a}, {name: b}]\n")
    base = ["--config", str(config_file), "--discovery-dns", NAME]
    with pytest.raises(ConfigError, match="needs --discovery-model"):
        discovery_model(load_config(base, environ={}))
    with pytest.raises(ConfigError, match="invalid discovery-model='c'"):
        discovery_model(load_config([*base, "--discovery-model", "c"], environ={}))
    assert discovery_model(load_config([*base, "--discovery-model", "b"], environ={})) == "b"


async def test_discovered_workers_have_the_flags_role_and_device(dns_server, tmp_path):
    zone, port = dns_server
    flags = ("--discovery-dns", NAME, "--discovery-role", "decode", "--discovery-device", "cpu")
    async with discovering(port, tmp_path, *flags) as picker:
        pool = picker.pools[MODEL]
        assert {(w.endpoint, w.role, w.device) for w in pool.workers.values()} == {
            ("10.1.0.1:8000", "decode", "cpu"),
            ("10.1.0.2:8000", "decode", "cpu"),
        }
        # the routers' worker specs carry it too: device-aware-weighted routing reads it there
        assert {pool.router.spec(wid).device for wid in pool.workers} == {"cpu"}
        zone.set(["10.1.0.3"])
        await wait_until(lambda: roles(picker) == {"10.1.0.3:8000": "decode"}, "pod replaced")
        assert pool.router.spec("10.1.0.3:8000").device == "cpu"


async def test_a_prefill_name_adds_prefill_workers(dns_server, tmp_path):
    zone, port = dns_server
    zone.set(["10.1.0.1", "10.1.0.2"], prefill=["10.2.0.1"])
    flags = ("--discovery-dns", NAME, "--discovery-role", "decode", "--discovery-prefill-dns", PREFILL_NAME)
    async with discovering(port, tmp_path, *flags) as picker:
        assert roles(picker) == {
            "10.1.0.1:8000": "decode",
            "10.1.0.2:8000": "decode",
            "10.2.0.1:8000": "prefill",
        }
        pool = picker.pools[MODEL]
        assert set(pool.prefill_workers) == {"10.2.0.1:8000"}  # the picker's prefill pool
        worker = pool.prefill_workers["10.2.0.1:8000"]
        assert (worker.model, worker.device) == (MODEL, "cuda")  # the main name's model and device

        zone.set(["10.1.0.1", "10.1.0.2"], prefill=["10.2.0.1", "10.2.0.2"])  # a prefill pod came
        await wait_until(lambda: roles(picker).get("10.2.0.2:8000") == "prefill", "prefill pod added")

        zone.set(["10.1.0.1", "10.1.0.2"], prefill=["10.1.0.2"])  # an address under both names
        await wait_until(
            lambda: roles(picker) == {"10.1.0.1:8000": "decode", "10.1.0.2:8000": "prefill"},
            "the prefill name wins a shared address",
        )

        zone.set(["10.1.0.1"])  # the prefill Service has no ready pod: NXDOMAIN
        await wait_until(lambda: roles(picker) == {"10.1.0.1:8000": "decode"}, "prefill workers gone")


async def test_each_name_fails_on_its_own(dns_server, tmp_path, caplog):
    zone, port = dns_server
    caplog.set_level(logging.DEBUG, logger="extproc.discovery")
    zone.set(["10.1.0.1"], prefill=["10.2.0.1"])
    async with discovering(
        port, tmp_path, "--discovery-dns", NAME, "--discovery-prefill-dns", PREFILL_NAME
    ) as picker:
        assert roles(picker) == {"10.1.0.1:8000": "both", "10.2.0.1:8000": "prefill"}

        zone.set(["10.1.0.1", "10.1.0.5"], prefill=[], failing=(PREFILL_NAME,))
        await wait_until(lambda: "10.1.0.5:8000" in set(roles(picker)), "the main name still applies")
        await wait_until(
            lambda: any(
                "DNS lookup failed" in r.getMessage() and PREFILL_NAME in r.getMessage()
                for r in caplog.records
            ),
            "the prefill lookup fails",
        )
        assert roles(picker)["10.2.0.1:8000"] == "prefill"  # its last answer is kept

        zone.set(["10.1.0.1", "10.1.0.5"], prefill=["10.2.0.7"])  # the prefill name answers again
        await wait_until(lambda: "10.2.0.7:8000" in set(roles(picker)), "prefill recovered")
        assert "10.2.0.1:8000" not in set(roles(picker))


async def test_a_prefill_name_alone_discovers_prefill_workers(dns_server, tmp_path):
    zone, port = dns_server
    zone.set([], prefill=["10.2.0.1"])
    async with discovering(port, tmp_path, "--discovery-prefill-dns", PREFILL_NAME) as picker:
        assert roles(picker) == {"10.2.0.1:8000": "prefill"}


def test_an_unknown_discovered_role_or_device_is_refused():
    with pytest.raises(ConfigError, match=r"^invalid discovery-role='encode': expected one of "):
        DnsWorkers(NAME, port=8000, model=MODEL, server="127.0.0.1", role="encode")
    with pytest.raises(ConfigError, match=r"^invalid discovery-device='tpu-pod': expected cuda "):
        DnsWorkers(NAME, port=8000, model=MODEL, server="127.0.0.1", device="tpu-pod")
    workers = DnsWorkers(NAME, port=8000, model=MODEL, server="127.0.0.1", role="aggregated", device="gpu")
    assert (workers.role, workers.device) == ("both", "cuda")
