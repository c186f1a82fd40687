"""Where workers come from while the picker runs: a headless Service's DNS records and the config file.

Two sources, each owning its share of every model's worker set:

- DNS (`--discovery-dns NAME`): the A and AAAA records of NAME, typically a Kubernetes headless
  Service (`clusterIP: None`), whose records are the IPs of its ready pods. Asked every
  `--discovery-refresh-secs`; each address becomes a worker `ip:port` (id = endpoint) serving
  `--discovery-model`, with role `--discovery-role` and device class `--discovery-device`. A
  lookup that fails (timeout, SERVFAIL, refused, no route) keeps the last known set and logs it;
  an authoritative answer with no address (NXDOMAIN, no records: a Service with no ready pod)
  empties it, as the cluster says there is nobody to route to. With `--discovery-prefill-dns
  PREFILL` a second name is looked up the same way, on its own (one failing keeps only its own
  last set); its addresses become workers with role `prefill` (same port, model and device class).
  An address under both names is a prefill worker: the prefill name is the more specific one (a
  Service selecting every pod of the model beside one selecting the prefill pods).
- The config file (`--reload-config`): polled for a change of its bytes (a ConfigMap volume is
  updated by swapping a symlink, so mtime alone is not enough), then re-read with
  `extproc.config.load_config`; its `workers:` become the file's share. A file that does not load
  is logged and ignored (the previous share stays). Other sections are read once at start: a
  change to them is logged as needing a restart.

A model's workers are the union of the shares (the file wins on an id present in more), applied
with `EndpointPicker.set_workers`, which tells `worker_listeners` (the KV event transports). Runs
on the event loop; the picker is only touched from there. Owns no routing state.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import dns.asyncresolver
import dns.exception
import dns.resolver
import yaml

from extproc.config import (
    ConfigError,
    DiscoveryConfig,
    PickerConfig,
    WorkerConfig,
    load_config,
    worker_device,
    worker_role,
)
from extproc.runtime.wakeups import lazy_sleep
from extproc.tasks import cancel_and_wait

log = logging.getLogger("extproc.discovery")

DNS_LOOKUP_TIMEOUT_S = 5.0  # per lookup (both record types), capped by the refresh interval
CONFIG_POLL_S = 2.0  # at most this long between two looks at the config file


class WorkerSetTarget(Protocol):
    """What discovery drives: `EndpointPicker` satisfies it."""

    @property
    def pools(self) -> Mapping[str, Any]: ...

    def set_workers(self, model: str, workers: Sequence[WorkerConfig]) -> tuple[list[str], list[str]]: ...


class LookupFailed(Exception):
    """The DNS lookup got no usable answer (as opposed to an answer saying there is no address)."""


def parse_dns_server(text: str) -> tuple[str, int]:
    """`ip`, `ip:port`, `[v6]:port` or a bare IPv6 address -> (ip, port). Raises ConfigError."""
    host, port = text.strip(), 53
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        if rest:
            port = _port(text, rest.removeprefix(":"))
    elif host.count(":") == 1:
        host, _, port_text = host.partition(":")
        port = _port(text, port_text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"invalid discovery-dns-server={text!r}: expected ip[:port]") from None
    return host, port


def _port(text: str, port_text: str) -> int:
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"invalid discovery-dns-server={text!r}: expected ip[:port]")
    return int(port_text)


def endpoint_of(address: str, port: int) -> str:
    """`ip:port`, with IPv6 addresses bracketed as the endpoint-picker protocol writes them."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class DnsWorkers:
    """Resolves one name into workers: every A/AAAA address at `port`, serving `model` in `role`
    on `device` (a worker's role and device class, as `workers:` entries of the config file have).
    Raises ConfigError for an unknown role or device."""

    def __init__(
        self,
        name: str,
        *,
        port: int,
        model: str,
        server: str | None = None,
        timeout_s: float = 5.0,
        role: str = "both",
        device: str = "cuda",
    ) -> None:
        self.name = name
        self.port = port
        self.model = model
        self.role = worker_role(role, "discovery-role")
        self.device = worker_device(device, "discovery-device")
        if server is None:
            self._resolver = dns.asyncresolver.Resolver()  # /etc/resolv.conf: search domains, ndots
        else:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            ip, dns_port = parse_dns_server(server)
            self._resolver.nameservers = [ip]
            self._resolver.port = dns_port
        self._resolver.lifetime = timeout_s
        self._resolver.cache = None  # every refresh asks: pods come and go faster than TTLs say

    async def lookup(self) -> tuple[WorkerConfig, ...]:
        """The workers behind the name now, sorted by endpoint. Raises LookupFailed."""
        answers = await asyncio.gather(self._addresses("A"), self._addresses("AAAA"))
        addresses = sorted({a for found in answers for a in found})
        return tuple(
            WorkerConfig(id=endpoint, endpoint=endpoint, model=self.model, role=self.role, device=self.device)
            for endpoint in (endpoint_of(a, self.port) for a in addresses)
        )

    async def _addresses(self, rdtype: str) -> list[str]:
        try:
            answer = await self._resolver.resolve(self.name, rdtype, search=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except (dns.exception.DNSException, OSError) as exc:
            raise LookupFailed(f"{rdtype} {self.name}: {type(exc).__name__}: {exc}") from exc
        return [rdata.address for rdata in answer]


class ConfigFileWorkers:
    """The config file's `workers:`, re-read when the file's bytes change."""

    def __init__(self, path: str, *, environ: Mapping[str, str]) -> None:
        self.path = path
        self._environ = environ
        self._digest = self._read_digest()
        self._other_sections = self._sections()

    def changed_workers(self) -> tuple[WorkerConfig, ...] | None:
        """The new worker list if the file changed and loads; None otherwise (a failure is logged)."""
        digest = self._read_digest()
        if digest is None or digest == self._digest:
            return None
        self._digest = digest
        try:
            config = load_config(["--config", self.path], environ=self._environ)
        except ConfigError as exc:
            log.error("config file %s changed but does not load (%s): keeping its previous workers",
                      self.path, exc)  # fmt: skip
            return None
        sections = self._sections()
        if sections is not None and sections != self._other_sections:
            log.warning("config file %s: only `workers:` is applied without a restart; the other "
                        "changes take effect when the picker restarts", self.path)  # fmt: skip
            self._other_sections = sections
        return config.workers

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(Path(self.path).read_bytes()).digest()
        except OSError as exc:
            log.warning("cannot read config file %s (%s): keeping its previous workers", self.path, exc)
            return None

    def _sections(self) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, yaml.YAMLError, AttributeError):
            document = yaml.safe_load(Path(self.path).read_text()) or {}
            return {k: v for k, v in document.items() if k != "workers"}
        return None


class DnsShare:
    """One name's share of the worker set: its last answer and whether its lookups fail."""

    def __init__(self, source: DnsWorkers) -> None:
        self.source = source
        self.workers: tuple[WorkerConfig, ...] = ()
        self._failing = False
        self._answered = False

    async def refresh(self) -> bool:
        """One lookup; True when the share changed. A failed lookup keeps the last share."""
        name = self.source.name
        try:
            workers = await self.source.lookup()
        except LookupFailed as exc:
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(level, "DNS lookup failed (%s): keeping the last %d discovered workers of %s",
                    exc, len(self.workers), name)  # fmt: skip
            self._failing = True
            return False
        if self._failing:
            log.info("DNS lookup of %s answers again", name)
            self._failing = False
        if not workers and (self.workers or not self._answered):
            log.warning("DNS %s has no address (no ready pod?): no discovered worker", name)
        self._answered = True
        if workers == self.workers:
            return False
        self.workers = workers
        return True


class WorkerDiscovery:
    """Merges the DNS and config-file shares into each model's worker set and keeps them fresh."""

    def __init__(
        self,
        picker: WorkerSetTarget,
        static_workers: Sequence[WorkerConfig],
        *,
        dns: DnsWorkers | None = None,
        prefill_dns: DnsWorkers | None = None,
        config_file: ConfigFileWorkers | None = None,
        refresh_s: float = 10.0,
        config_poll_s: float = CONFIG_POLL_S,
    ) -> None:
        """`dns`: the main name; `prefill_dns`: the prefill workers' name (its own role, normally prefill)."""
        self.picker = picker
        self.dns = dns
        self.prefill_dns = prefill_dns
        self.config_file = config_file
        self.refresh_s = refresh_s
        self.config_poll_s = config_poll_s
        self._file_workers: tuple[WorkerConfig, ...] = tuple(static_workers)
        # in merge order: a later share wins on a shared id (the prefill name over the main one)
        self._dns_shares = [DnsShare(source) for source in (dns, prefill_dns) if source is not None]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Look the names up once (so the picker starts with its workers), then refresh in the background."""
        if self._dns_shares:
            await self.refresh_dns()
            self._tasks.append(self._every(self.refresh_s, self.refresh_dns, "DNS refresh"))
        if self.config_file is not None:
            self._tasks.append(self._every(self.config_poll_s, self.reload_config_file, "config reload"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()

    async def refresh_dns(self) -> None:
        """One lookup of each name (at once); applies the answers, keeping a failed name's last set."""
        assert self._dns_shares
        changed = await asyncio.gather(*(share.refresh() for share in self._dns_shares))
        if any(changed):
            self._apply()

    async def reload_config_file(self) -> None:
        """Apply the config file's workers if the file changed and loads."""
        assert self.config_file is not None
        workers = self.config_file.changed_workers()
        if workers is not None and workers != self._file_workers:
            self._file_workers = workers
            self._apply()

    def _apply(self) -> None:
        by_model: dict[str, dict[str, WorkerConfig]] = {model: {} for model in self.picker.pools}
        dns_workers = [w for share in self._dns_shares for w in share.workers]
        if len(self._dns_shares) == 2:
            main, prefill = ({w.id for w in share.workers} for share in self._dns_shares)
            if both := main & prefill:
                log.info("%d addresses are under both DNS names: they are prefill workers", len(both))
        for w in (*dns_workers, *self._file_workers):  # the file wins on a shared id
            if w.model not in by_model:
                log.error("worker %s serves model %r, which the picker was not started with "
                          "(known: %s): ignored", w.id, w.model, ", ".join(by_model))  # fmt: skip
                continue
            by_model[w.model][w.id] = w
        for model, workers in by_model.items():
            added, removed = self.picker.set_workers(model, list(workers.values()))
            if added or removed:
                log.info("workers of %s: %d (+%d -%d)", model, len(workers), len(added), len(removed))

    def _every(self, interval_s: float, step: Callable[[], Awaitable[None]], what: str) -> asyncio.Task[None]:
        async def loop() -> None:
            while True:
                await lazy_sleep(interval_s, interval_s / 4)
                try:
                    await step()
                except Exception:  # an edge loop: log and keep going
                    log.exception("%s failed", what)

        return asyncio.create_task(loop(), name=f"discovery-{what}")


def discovery_model(config: PickerConfig) -> str:
    """The model DNS-discovered workers serve: --discovery-model, else the only model. Raises ConfigError."""
    names = [m.name for m in config.models]
    model = config.discovery.dns_model
    if model is None:
        if len(names) != 1:
            raise ConfigError(
                "--discovery-dns needs --discovery-model when the picker serves "
                f"{len(names)} models ({', '.join(names) or 'none: add a models: entry'})"
            )
        return names[0]
    if model not in names:
        raise ConfigError(
            f"invalid discovery-model={model!r}: expected one of the configured models "
            f"({', '.join(names) or 'none: add a models: entry'})"
        )
    return model


async def start_discovery(
    config: PickerConfig, picker: WorkerSetTarget, *, environ: Mapping[str, str] | None = None
) -> WorkerDiscovery | None:
    """Start what `config.discovery` asks for; None when it asks for nothing. Raises ConfigError."""
    settings: DiscoveryConfig = config.discovery
    if settings.dns_name is None and settings.prefill_dns_name is None and not settings.reload_config:
        return None

    def dns_workers(name: str | None, role: str) -> DnsWorkers | None:
        if name is None:
            return None
        return DnsWorkers(
            name,
            port=settings.dns_port,
            model=discovery_model(config),
            server=settings.dns_server,
            timeout_s=min(DNS_LOOKUP_TIMEOUT_S, settings.refresh_s),
            role=role,
            device=settings.device,
        )

    dns_source = dns_workers(settings.dns_name, settings.role)
    prefill_source = dns_workers(settings.prefill_dns_name, "prefill")
    file_source = None
    if settings.reload_config:
        assert config.config_path is not None  # load_config refuses --reload-config without a file
        file_source = ConfigFileWorkers(
            config.config_path, environ=os.environ if environ is None else environ
        )
    discovery = WorkerDiscovery(
        picker,
        config.workers,
        dns=dns_source,
        prefill_dns=prefill_source,
        config_file=file_source,
        refresh_s=settings.refresh_s,
        config_poll_s=min(CONFIG_POLL_S, settings.refresh_s),
    )
    await discovery.start()
    for source in (dns_source, prefill_source):
        if source is not None:
            log.info("discovering %s workers (%s) of %s from DNS %s (port %d, every %.3g s)", source.role,
                     source.device, source.model, source.name, source.port, settings.refresh_s)  # fmt: skip
    if file_source is not None:
        log.info("watching %s for worker changes", file_source.path)
    return discovery
