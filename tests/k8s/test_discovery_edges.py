"""Discovery's less travelled paths: DNS server addresses and ports at their bounds, a relative name
under the resolver's search domains and a failed lookup's reason (against the real DNS server of
`test_discovery_dns.py`), the config file's changes (unreadable, not loading, other sections, the
environment it is read with), one name's share as its lookups fail and recover (a scripted source:
the log lines and their levels), the merged worker set and its log lines, and the loops' errors.
"""

from __future__ import annotations

import logging
from pathlib import Path

import dns.name
import pytest

from extproc.config import ConfigError, ModelConfig, PickerConfig, WorkerConfig, load_config
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig
from extproc.runtime.discovery import (
    ConfigFileWorkers,
    DnsShare,
    DnsWorkers,
    LookupFailed,
    WorkerDiscovery,
    discovery_model,
    parse_dns_server,
    start_discovery,
)

from .dns_zone import NAME, PREFILL_NAME
from .test_discovery_dns import MODEL, wait_until

LOGGER = "extproc.discovery"


def messages(caplog, level: int = logging.DEBUG) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


def records(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


# --- the DNS server's address -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[::1]:5353", ("::1", 5353)),
        ("[::1]", ("::1", 53)),
        ("::1", ("::1", 53)),
        ("127.0.0.1:1", ("127.0.0.1", 1)),
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
        (" 10.0.0.10 ", ("10.0.0.10", 53)),
    ],
)
def test_dns_server_addresses_and_ports_at_their_bounds(text, expected):
    assert parse_dns_server(text) == expected


@pytest.mark.parametrize(
    "text", ["127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:x", "[::1]:x", "[::1]:", "dns:53"]
)
def test_a_dns_server_that_is_not_ip_and_port_is_refused_naming_what_was_given(text):
    with pytest.raises(ConfigError) as raised:
        parse_dns_server(text)
    assert str(raised.value) == f"invalid discovery-dns-server={text!r}: expected ip[:port]"


# --- DnsWorkers against the real server ---------------------------------------------------------------


async def test_a_relative_name_is_looked_up_under_the_resolvers_search_domains(dns_server):
    """As in a pod, whose resolv.conf searches `<namespace>.svc.cluster.local`: `llm-workers` names the
    Service of the pod's namespace."""
    _, port = dns_server
    workers = DnsWorkers("llm-workers", port=8000, model=MODEL, server=f"127.0.0.1:{port}")
    workers._resolver.search = [dns.name.from_text("default.svc.cluster.local.")]
    assert [w.endpoint for w in await workers.lookup()] == ["10.1.0.1:8000", "10.1.0.2:8000"]


async def test_a_named_server_reads_no_search_domains_and_the_defaults_are_the_documented_ones(dns_server):
    _, port = dns_server
    named = DnsWorkers(NAME, port=8000, model=MODEL, server=f"127.0.0.1:{port}")
    assert named._resolver.search == [] and named._resolver.nameservers == ["127.0.0.1"]
    assert (named._resolver.port, named._resolver.lifetime, named.role, named.device) == (
        port,
        5.0,
        "both",
        "cuda",
    )
    system = DnsWorkers(NAME, port=8000, model=MODEL)  # the host's resolv.conf
    assert system._resolver.lifetime == 5.0 and system._resolver.cache is None


async def test_a_failed_lookup_says_which_record_type_name_and_error(dns_server):
    zone, port = dns_server
    zone.set(["10.1.0.1"], failing=(NAME,))
    workers = DnsWorkers(NAME, port=8000, model=MODEL, server=f"127.0.0.1:{port}", timeout_s=2.0)
    with pytest.raises(LookupFailed) as raised:
        await workers.lookup()
    reason = str(raised.value)
    assert reason.startswith((f"A {NAME}: NoNameservers: ", f"AAAA {NAME}: NoNameservers: ")), reason


# --- the config file ----------------------------------------------------------------------------------


def write(path: Path, workers: list[str], *, log_level: str = "info") -> None:
    lines = [f"log-level: {log_level}", "models:", f"- name: {MODEL}", "workers:"]
    lines += [
        f"- {{id: {w}, endpoint: '127.0.0.1:{8000 + i}', model: {MODEL}}}" for i, w in enumerate(workers)
    ]
    path.write_text("\n".join(lines) + "\n")


def ids(workers) -> list[str]:
    return [w.id for w in workers]


@pytest.fixture
def watched(tmp_path) -> tuple[Path, ConfigFileWorkers]:
    """A config file with worker `a`, and its source as discovery reads it (no environment)."""
    path = tmp_path / "picker.yaml"
    write(path, ["a"])
    return path, ConfigFileWorkers(str(path), environ={})


def test_the_config_file_is_read_again_only_when_its_bytes_change(watched, caplog):
    path, source = watched
    assert source.changed_workers() is None  # unchanged since it was made
    write(path, ["a", "b"])
    with caplog.at_level(logging.DEBUG, LOGGER):
        assert ids(source.changed_workers()) == ["a", "b"]
        assert source.changed_workers() is None  # read once per change
    assert messages(caplog) == []  # only `workers:` changed: nothing to say


def test_a_change_to_other_sections_is_said_once_to_need_a_restart(watched, caplog):
    path, source = watched
    write(path, ["a"], log_level="debug")
    with caplog.at_level(logging.DEBUG, LOGGER):
        assert ids(source.changed_workers()) == ["a"]
        write(path, ["a", "b"], log_level="debug")  # then only the workers
        assert ids(source.changed_workers()) == ["a", "b"]
    assert records(caplog) == [
        (
            logging.WARNING,
            f"config file {path}: only `workers:` is applied without a restart; the other changes take "
            "effect when the picker restarts",
        )
    ]


def test_a_file_that_does_not_load_keeps_the_previous_workers_and_says_why(watched, caplog):
    path, source = watched
    path.write_text("workers: [{id: a}]\n")  # no endpoint
    with caplog.at_level(logging.DEBUG, LOGGER):
        assert source.changed_workers() is None
    ((level, message),) = records(caplog)
    assert level == logging.ERROR
    assert message.startswith(f"config file {path} changed but does not load (")
    assert message.endswith("): keeping its previous workers")


def test_the_file_is_loaded_with_the_environment_discovery_was_given(tmp_path, caplog):
    path = tmp_path / "picker.yaml"
    write(path, ["a"])
    source = ConfigFileWorkers(str(path), environ={"DYN_KV_EVENTS": "sometimes"})  # not a boolean
    write(path, ["a", "b"])
    with caplog.at_level(logging.ERROR, LOGGER):
        assert source.changed_workers() is None
    assert "DYN_KV_EVENTS" in messages(caplog)[0]


def test_an_unreadable_file_keeps_the_previous_workers_and_says_why(watched, caplog):
    path, source = watched
    path.unlink()
    with caplog.at_level(logging.DEBUG, LOGGER):
        assert source.changed_workers() is None
    ((level, message),) = records(caplog)
    assert level == logging.WARNING
    assert message.startswith(f"cannot read config file {path} ([Errno 2] No such file or directory: ")
    assert message.endswith("): keeping its previous workers")


@pytest.mark.parametrize("text", ["- a list\n- not a mapping\n", "key: [unclosed\n", None])
def test_a_file_whose_other_sections_cannot_be_read_has_none(watched, text):
    path, source = watched
    if text is None:
        path.unlink()
    else:
        path.write_text(text)
    assert source._sections() is None


# --- one name's share -----------------------------------------------------------------------------------


class Scripted:
    """A DNS source whose next answers the test sets: a tuple of workers, or LookupFailed."""

    def __init__(self, name: str = NAME) -> None:
        self.name = name
        self.answers: list[tuple[WorkerConfig, ...] | LookupFailed] = []

    async def lookup(self) -> tuple[WorkerConfig, ...]:
        answer = self.answers.pop(0)
        if isinstance(answer, LookupFailed):
            raise answer
        return answer


def worker(ip: str) -> WorkerConfig:
    return WorkerConfig(id=f"{ip}:8000", endpoint=f"{ip}:8000", model=MODEL)


async def test_a_share_says_a_failing_name_once_then_quietly_and_when_it_answers_again(caplog):
    source = Scripted()
    share = DnsShare(source)  # type: ignore[arg-type]
    source.answers = [
        (worker("10.0.0.1"),),
        LookupFailed("A x: Timeout"),
        LookupFailed("A x: Timeout"),
        (worker("10.0.0.1"),),
        LookupFailed("A x: Timeout"),
        (worker("10.0.0.1"),),
    ]
    with caplog.at_level(logging.DEBUG, LOGGER):
        assert await share.refresh() is True
        assert await share.refresh() is False
        assert await share.refresh() is False
        assert await share.refresh() is False  # the same set as before the failures
        assert await share.refresh() is False  # failing again after an answer: said again
        assert await share.refresh() is False
    failed = f"DNS lookup failed (A x: Timeout): keeping the last 1 discovered workers of {NAME}"
    again = f"DNS lookup of {NAME} answers again"
    assert records(caplog) == [
        (logging.WARNING, failed),
        (logging.DEBUG, failed),
        (logging.INFO, again),
        (logging.WARNING, failed),
        (logging.INFO, again),
    ]
    assert share.workers == (worker("10.0.0.1"),)


async def test_a_share_whose_first_lookup_fails_says_so_at_once(caplog):
    source = Scripted()
    share = DnsShare(source)  # type: ignore[arg-type]
    source.answers = [LookupFailed("A x: Timeout")]
    with caplog.at_level(logging.DEBUG, LOGGER):
        assert await share.refresh() is False
    assert records(caplog) == [
        (
            logging.WARNING,
            f"DNS lookup failed (A x: Timeout): keeping the last 0 discovered workers of {NAME}",
        )
    ]


async def test_a_name_without_addresses_is_said_first_and_when_it_empties_not_while_it_stays_empty(caplog):
    source = Scripted()
    share = DnsShare(source)  # type: ignore[arg-type]
    source.answers = [(), (), (worker("10.0.0.1"),), (), ()]
    with caplog.at_level(logging.DEBUG, LOGGER):
        changed = [await share.refresh() for _ in range(5)]
    assert changed == [False, False, True, True, False]
    empty = (logging.WARNING, f"DNS {NAME} has no address (no ready pod?): no discovered worker")
    assert records(caplog) == [empty, empty]


# --- the merged worker set -------------------------------------------------------------------------------


def _picker(models) -> EndpointPicker:
    """A picker serving `models` (demo-model when none), no worker yet."""
    models = tuple(ModelConfig(m) for m in (models or (MODEL,)))
    return EndpointPicker(PickerConfig(router=RouterConfig(use_kv_events=False), workers=(), models=models))


def discovery_of(target: EndpointPicker, *shares: Scripted, static=(), **kwargs) -> WorkerDiscovery:
    discovery = WorkerDiscovery(target, static, **kwargs)
    discovery._dns_shares = [DnsShare(s) for s in shares]  # type: ignore[arg-type]
    return discovery


async def test_workers_added_and_removed_are_logged_per_model(caplog):
    target = _picker(())
    main = Scripted()
    discovery = discovery_of(target, main)
    main.answers = [(worker("10.0.0.1"), worker("10.0.0.2")), (worker("10.0.0.2"),)]
    with caplog.at_level(logging.INFO, LOGGER):
        await discovery.refresh_dns()
        await discovery.refresh_dns()
    assert messages(caplog, logging.INFO) == [
        f"workers of {MODEL}: 2 (+2 -0)",
        f"workers of {MODEL}: 1 (+0 -1)",
    ]


async def test_addresses_under_both_names_are_prefill_workers_and_counted_in_the_log(caplog):
    target = _picker(())
    main, prefill = Scripted(), Scripted(PREFILL_NAME)
    discovery = discovery_of(target, main, prefill)
    both = WorkerConfig(id="10.0.0.2:8000", endpoint="10.0.0.2:8000", model=MODEL, role="prefill")
    main.answers = [(worker("10.0.0.1"), worker("10.0.0.2"))]
    prefill.answers = [(both,)]
    with caplog.at_level(logging.INFO, LOGGER):
        await discovery.refresh_dns()
    assert (
        messages(caplog, logging.INFO)[0] == "1 addresses are under both DNS names: they are prefill workers"
    )
    assert target.pools[MODEL].all_workers()["10.0.0.2:8000"].role == "prefill"


async def test_names_without_shared_addresses_say_nothing_of_it(caplog):
    target = _picker(())
    main, prefill = Scripted(), Scripted(PREFILL_NAME)
    discovery = discovery_of(target, main, prefill)
    main.answers = [(worker("10.0.0.1"),)]
    prefill.answers = [(worker("10.0.0.3"),)]
    with caplog.at_level(logging.INFO, LOGGER):
        await discovery.refresh_dns()
    assert messages(caplog, logging.INFO) == [f"workers of {MODEL}: 2 (+2 -0)"]


async def test_a_worker_of_a_model_the_picker_does_not_serve_is_ignored_and_named(caplog):
    target = _picker(("a", "b"))
    main = Scripted()
    discovery = discovery_of(target, main)
    stray = WorkerConfig(id="10.0.0.9:8000", endpoint="10.0.0.9:8000", model="other")
    good = WorkerConfig(id="10.0.0.1:8000", endpoint="10.0.0.1:8000", model="b")
    main.answers = [(stray, good)]  # the stray one first
    with caplog.at_level(logging.ERROR, LOGGER):
        await discovery.refresh_dns()
    said = "worker 10.0.0.9:8000 serves model 'other', which the picker was not started with"
    assert messages(caplog, logging.ERROR) == [f"{said} (known: a, b): ignored"]
    assert list(target.pools["b"].all_workers()) == ["10.0.0.1:8000"]  # the workers after it still count


async def test_an_unchanged_config_file_applies_nothing(watched, caplog):
    target = _picker(())
    discovery = WorkerDiscovery(target, (), config_file=watched[1])
    with caplog.at_level(logging.INFO, LOGGER):
        await discovery.reload_config_file()
    assert messages(caplog) == [] and target.pools[MODEL].all_workers() == {}


async def test_a_loop_step_that_fails_is_logged_with_what_it_was_and_the_loop_goes_on(caplog):
    target = _picker(())
    main = Scripted()
    discovery = discovery_of(target, main, refresh_s=0.01)
    main.answers = [(), RuntimeError("boom"), RuntimeError("boom"), ()]  # type: ignore[list-item]

    async def lookup():
        answer = main.answers.pop(0) if main.answers else ()
        if isinstance(answer, RuntimeError):
            raise answer
        return answer

    main.lookup = lookup  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, LOGGER):
        await discovery.start()
        try:
            await wait_until(lambda: not main.answers, "every answer taken")
        finally:
            await discovery.stop()
    failed = [r for r in caplog.records if r.getMessage() == "DNS refresh failed"]
    assert len(failed) == 2 and all(r.exc_info is not None for r in failed)


def test_the_refresh_default_is_ten_seconds():
    assert WorkerDiscovery(_picker(()), ()).refresh_s == 10.0


# --- start_discovery and its model -------------------------------------------------------------------------


def config(tmp_path: Path, text: str, *flags: str):
    path = tmp_path / "picker.yaml"
    path.write_text(text)
    return load_config(["--config", str(path), *flags], environ={})


def test_the_discovery_model_is_the_only_one_or_the_one_named(tmp_path):
    one = config(tmp_path, f"models:\n- name: {MODEL}\n")
    assert discovery_model(one) == MODEL
    two = config(tmp_path, "models:\n- name: a\n- name: b\n")
    with pytest.raises(ConfigError) as raised:
        discovery_model(two)
    assert (
        str(raised.value) == "--discovery-dns needs --discovery-model when the picker serves 2 models (a, b)"
    )
    none = config(tmp_path, "log-level: info\n")
    with pytest.raises(ConfigError) as raised:
        discovery_model(none)
    assert str(raised.value) == (
        "--discovery-dns needs --discovery-model when the picker serves 0 models (none: add a models: entry)"
    )
    with pytest.raises(ConfigError) as raised:
        discovery_model(config(tmp_path, "models:\n- name: a\n- name: b\n", "--discovery-model", "x"))
    assert str(raised.value) == "invalid discovery-model='x': expected one of the configured models (a, b)"
    named = config(tmp_path, "log-level: info\n", "--discovery-model", "x")
    with pytest.raises(ConfigError) as raised:
        discovery_model(named)
    assert str(raised.value) == (
        "invalid discovery-model='x': expected one of the configured models (none: add a models: entry)"
    )


async def test_start_discovery_says_what_it_watches(dns_server, tmp_path, caplog):
    _, port = dns_server
    path = tmp_path / "picker.yaml"
    write(path, ["a"])
    settings = load_config(
        ["--config", str(path), "--discovery-dns", NAME, "--discovery-prefill-dns", PREFILL_NAME,
         "--discovery-dns-server", f"127.0.0.1:{port}", "--discovery-port", "8000", "--reload-config",
         "--discovery-refresh-secs", "0.25"],
        environ={},
    )  # fmt: skip
    target = EndpointPicker(settings)
    with caplog.at_level(logging.INFO, LOGGER):
        discovery = await start_discovery(settings, target, environ={"DYN_KV_EVENTS": "sometimes"})
    assert discovery is not None
    try:
        said = messages(caplog, logging.INFO)
        assert f"discovering both workers (cuda) of {MODEL} from DNS {NAME} (port 8000, every 0.25 s)" in said
        assert (
            f"discovering prefill workers (cuda) of {MODEL} from DNS {PREFILL_NAME} (port 8000, every 0.25 s)"
            in said
        )
        assert said[-1] == f"watching {path} for worker changes"
        assert discovery.dns is not None and discovery.prefill_dns is not None
        assert discovery.dns._resolver.lifetime == 0.25  # capped by the refresh interval
        assert discovery.config_poll_s == 0.25
        write(path, ["a", "b"])
        with caplog.at_level(logging.ERROR, LOGGER):
            await wait_until(
                lambda: any("DYN_KV_EVENTS" in m for m in messages(caplog, logging.ERROR)),
                "the reload read with the given environment",
            )
    finally:
        await discovery.stop()
        await target.close()


class FailingFile:
    """A config-file source whose look at the file raises (a bug): the reload loop logs it, goes on."""

    path = "picker.yaml"

    def __init__(self) -> None:
        self.looks = 0

    def changed_workers(self):
        self.looks += 1
        raise RuntimeError("boom")


async def test_a_config_reload_that_fails_is_logged_as_such_and_the_loop_goes_on(caplog):
    source = FailingFile()
    discovery = WorkerDiscovery(_picker(()), (), config_file=source, config_poll_s=0.01)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, LOGGER):
        await discovery.start()
        try:
            await wait_until(lambda: source.looks >= 2, "two looks at the file")
        finally:
            await discovery.stop()
    assert [r.getMessage() for r in caplog.records][:2] == ["config reload failed"] * 2
