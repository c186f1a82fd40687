"""Soak and fault test: many requests through real Envoy and the picker while processes are killed.

    nice -n 10 .venv/bin/python benchmarks/soak.py      # 20,000 requests at 150 req/s: about 2.5 minutes
    .venv/bin/python benchmarks/soak.py --requests 600 --rate 40 --faults kill:w0,picker,nats
                                         # the CI size (tests/e2e/test_soak_e2e.py): about 25 s

Everything runs on 127.0.0.1 as child processes stopped by pid: a nats-server, mock workers
(`python -m extproc mock-worker`; w0 and w1 publish KV events over ZMQ, the others over NATS core),
the picker (`python -m extproc serve` with --admin-port, --max-body-bytes, --max-prompt-tokens,
--session-max-pins) and Envoy's `failopen` variant, so that while the picker restarts Envoy serves
round robin instead of failing. --concurrency clients, paced to --rate req/s in all (0: as fast as
they go), send a mix: chat and completion requests, streamed and not; streams the client closes
after the first chunk; requests whose connection the client closes before any answer; invalid
bodies; an unknown model; bodies over the picker's limit, prompts over its token limit, and bodies
over Envoy's buffer limit; and hostile ones (`soak_requests.py`): headers the picker owns sent by
the client, percent-encoded and dotted paths, an encoded slash, HTTP/2 request trailers, 3 MiB
bodies nested in an ignored field, many and over-long session ids, colliding request ids.

Faults (--faults, spread over 20-65 % of the requests, one at a time, traffic going on):
    kill:<worker>  SIGKILL the worker by pid, restart it on the same ports --worker-down-s later;
                   recovered once the picker has reset its view of the worker's cache (feed.reset)
                   and takes it from the worker's events again
    nats           SIGKILL nats-server, restart it on the same port --nats-down-s later; recovered
                   once the picker has reconnected (nats.reconnect) and the NATS workers' events
                   feed it again
    picker         SIGTERM the picker (graceful drain); as soon as it has released its ports start
                   the new one on them (the old one may still be draining), then wait for the old
                   one's exit (code 0); recovered once the new one's /readyz says ready
    picker:crash   the same with SIGKILL: no drain, the in-flight ext_proc streams break
A recovery check sends the workers it waits for a request of its own (straight to the worker), as
the router may send them nothing meanwhile. The last 20 % of the requests start only once every
fault has been recovered from (a fault that slipped past that point, its predecessors slow to
recover, still gets MIN_REQUESTS_DURING_FAULT requests first).

Every request must get an answer that is documented for it (`EXPECTED`: the status and who gives
it, the reason header naming the picker's or Envoy's refusal, or a worker's own answer), or one
documented for a fault it overlapped: Envoy's 503 or a cut stream while a worker is down
(`WORKER_FAULT_STATUSES`), the worker's own answer to a request the bypassed picker would have
refused (`PICKER_BYPASSED`). A client cancel is counted as such. No answer of a small request may
take longer than Envoy's message timeout (`STALL_S`: a picker held by a big body would show here).
Afterwards, with no traffic: every worker's active load in the picker, the picker's queue and the
workers' running/waiting gauges must reach zero (polled, bounded); the picker must have finished
every request it routed and hold at most --session-max-pins sessions; each picker process's RSS
and open file descriptors at its end must be within --rss-bound-mib / --fd-bound of their values
after warm-up (its body parse workers are reported beside it).

Prints progress on stderr and one JSON summary on stdout; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_requests import MIX, SLACK_S, SMALL_KINDS, STALL_S, Fault, Result, judge, send
from soak_stack import (
    ENVOY_MAX_BODY_BYTES,
    MAX_BODY_BYTES,
    MAX_PROMPT_TOKENS,
    SESSION_MAX_PINS,
    SHUTDOWN_GRACE_S,
    ZMQ_WORKERS,
    PickerLife,
    SoakStack,
    http_status,
    sample_process,
)

FAULT_SPAN = (0.2, 0.65)  # faults start between these fractions of the requests
TAIL_FRACTION = 0.8  # requests past this start only after every faulted process is back (see _tail_waits)
WARMUP_FRACTION = 0.2  # the first picker's RSS/fd baseline is taken once this many requests are done
RESTART_WARMUP_FRACTION = 0.05  # a restarted picker's baseline: this many more requests after it is up
RECOVERY_TIMEOUT_S = 45.0
SETTLE_TIMEOUT_S = 30.0
POLL_S = 0.1
MIN_REQUESTS_DURING_FAULT = 10  # a fault with fewer requests in flight during it proves nothing


@dataclass
class SoakConfig:
    """One run's settings (the command line's flags)."""

    requests: int = 20_000
    concurrency: int = 32
    rate: float = 150.0  # requests/s started at most; 0: as fast as the clients go
    workers: int = 4
    speedup: float = 50.0
    faults: tuple[str, ...] = ("kill:w0", "nats", "kill:w2", "picker", "kill:w1", "nats", "picker:crash")
    worker_down_s: float = 2.0
    nats_down_s: float = 1.0
    rss_bound_mib: float = 50.0
    fd_bound: int = 20
    seed: int = 7
    log_dir: Path | None = None


class Soak:
    """One run: the clients, the fault injector and the samplers over a started `SoakStack`, then
    the checks once traffic has stopped, and the JSON summary."""

    def __init__(self, config: SoakConfig, stack: SoakStack, t0: float) -> None:
        self.config = config
        self.stack = stack
        self.t0 = t0  # when the stack started
        self.started = 0  # requests handed to a client
        self.results: list[Result] = []
        self.faults = plan_faults(config.faults, config.requests)
        self.faults_done = asyncio.Event()  # every fault applied and recovered from
        self.t_traffic = self.t0
        self.tail_waiting = False
        self.started_at_last_fault: int | None = None  # requests started when the last fault was injected
        self.tail_released = False  # the tail's wait ended (every fault recovered, or its bound ran out)
        self.next_slot = 0.0  # when the next request may start, with --rate
        self.lives: list[PickerLife] = []
        self.checks: dict[str, Any] = {}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def log(self, message: str) -> None:
        print(f"[soak {self.now():7.1f} s] {message}", file=sys.stderr, flush=True)

    async def run(self) -> dict[str, Any]:
        assert self.stack.picker is not None
        self.lives.append(PickerLife(self.stack.picker.pid, 0))
        n = self.config.requests
        tail_start = int(n * TAIL_FRACTION)
        base = f"http://127.0.0.1:{self.stack.listen_port}"
        connector = aiohttp.TCPConnector(limit=self.config.concurrency, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def client() -> None:
                while self.started < n:
                    index = self.started
                    if index >= tail_start and self._tail_waits():
                        if not self.tail_waiting:
                            self.tail_waiting = True
                            self.log("the last requests wait until every faulted process is back")
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.faults_done.wait(), RECOVERY_TIMEOUT_S * 4)
                        self.tail_released = True  # once: a fault never recovered fails its check
                        if self.started != index:
                            continue
                    self.started += 1
                    if self.config.rate > 0:  # pacing the offered load (no catching up after a pause)
                        now = time.monotonic()
                        slot = max(self.next_slot, now)
                        self.next_slot = slot + 1.0 / self.config.rate
                        await asyncio.sleep(slot - now)
                    port, dead = self.stack.listen_port, f"127.0.0.1:{self.stack.dead_port}"
                    result = await send(session, base, index, self.config.seed, "127.0.0.1", port, dead)
                    self.results.append(result)

            self.t_traffic = time.monotonic()
            tasks = [asyncio.create_task(self.inject_faults()), asyncio.create_task(self.report_progress())]
            tasks.append(asyncio.create_task(self.sample_pickers()))
            await asyncio.gather(*(client() for _ in range(self.config.concurrency)))
            traffic_s = time.monotonic() - self.t_traffic
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.log(f"traffic done: {len(self.results)} requests in {traffic_s:.1f} s; checking for leaks")
        await self.settle()
        return self.summary(traffic_s)

    def _tail_waits(self) -> bool:
        """Whether the next request past the tail waits for every faulted process to be back. A fault
        still to come when traffic reaches the tail (the ones before it took long to recover) is
        injected under traffic all the same: the tail waits only once the last fault is in, with
        MIN_REQUESTS_DURING_FAULT requests started since. The tail waits once."""
        if self.faults_done.is_set() or self.tail_released:
            return False
        since = self.started_at_last_fault
        return since is not None and self.started >= since + MIN_REQUESTS_DURING_FAULT

    async def inject_faults(self) -> None:
        try:
            for fault in self.faults:
                while self.started < fault.at_request:
                    await asyncio.sleep(POLL_S)
                await self.inject(fault)
        finally:
            self.faults_done.set()

    async def inject(self, fault: Fault) -> None:
        """Apply `fault`, bring the process back and check that the picker resynchronised with it
        (bounded); traffic goes on meanwhile."""
        stack = self.stack
        self.log(f"fault: {fault.kind} {fault.target} at request {self.started}")
        if fault is self.faults[-1]:
            self.started_at_last_fault = self.started
        check: Any = None
        try:
            if fault.kind == "kill":
                resets = (await asyncio.to_thread(stack.event_counters)).get("feed.reset", 0)
                fault.injected_s = time.monotonic()
                await asyncio.to_thread(stack.kill_worker, fault.target)
                await asyncio.sleep(self.config.worker_down_s)  # how long the worker stays down
                await asyncio.to_thread(stack.restart_worker, fault.target)
                check = self.until_resynced([fault.target], "feed.reset", resets)
            elif fault.kind == "nats":
                reconnects = (await asyncio.to_thread(stack.event_counters)).get("nats.reconnect", 0)
                fault.injected_s = time.monotonic()
                await asyncio.to_thread(stack.kill_nats)
                await asyncio.sleep(self.config.nats_down_s)  # how long NATS stays down
                await asyncio.to_thread(stack.start_nats)
                nats_workers = [w.worker_id for w in stack.workers if w.transport == "nats"]
                check = self.until_resynced(nats_workers, "nats.reconnect", reconnects)
            elif fault.kind == "picker":
                life = self.lives[-1]
                life.end = await asyncio.to_thread(sample_process, life.pid, self.t0)
                fault.injected_s = time.monotonic()
                life.crashed = fault.target == "crash"
                if life.crashed:
                    life.exit_code, life.drain_log = await asyncio.to_thread(stack.crash_picker)
                    stopped = time.monotonic()
                    await asyncio.to_thread(stack.start_picker)
                    started = time.monotonic()
                else:  # the new one starts on the ports the old one released; the old one drains on
                    old = await asyncio.to_thread(stack.terminate_picker)
                    stopped = time.monotonic()
                    await asyncio.to_thread(stack.start_picker)
                    started = time.monotonic()
                    fault.recovery["old_still_draining_when_new_started"] = old.is_running()
                    life.exit_code, life.drain_log = await asyncio.to_thread(stack.reap_picker, old)
                fault.recovery |= {
                    "exit_code": life.exit_code,
                    "drain": life.drain_log,
                    "ports_free_s": round(stopped - fault.injected_s, 2),
                    "start_s": round(started - stopped, 2),
                }
                assert stack.picker is not None
                self.lives.append(PickerLife(stack.picker.pid, self.done))
                check = self.until_ready()
        except Exception as exc:  # a fault that cannot be applied or recovered fails the run
            fault.error = f"{type(exc).__name__}: {exc}"
            self.log(f"fault {fault.kind} {fault.target} failed: {fault.error}")
        fault.recovered_s = time.monotonic()
        if check is not None:
            fault.recovery |= await check
        self.log(f"fault {fault.kind} {fault.target} recovered: {fault.recovery}")

    async def until_ready(self) -> dict[str, Any]:
        """Seconds until the restarted picker's /readyz says ready. Workers it has not heard from yet
        get a request straight from us (not through Envoy) each poll, so that they publish events."""

        def ready() -> bool:
            status, text = http_status(f"{self.stack.admin_url}/readyz")
            if status != 200:
                with contextlib.suppress(ValueError):
                    self.stack.poke(json.loads(text).get("unsynced") or [])
            return status == 200

        return {"ready_after_s": await self.until(ready, RECOVERY_TIMEOUT_S)}

    async def until(self, condition: Callable[[], bool], timeout_s: float) -> float | None:
        """Seconds until `condition()` (run in a thread) held, polled; None if it never did."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if await asyncio.to_thread(condition):
                return round(time.monotonic() - start, 2)
            await asyncio.sleep(POLL_S)
        return None

    async def until_resynced(self, worker_ids: list[str], counter: str, before: int) -> dict[str, Any]:
        """Seconds until the picker's KV event `counter` has moved past `before` and it takes every
        one of `worker_ids`' events again. A killed worker (`feed.reset`, ZMQ): its cache view reset
        and rebuilt from its replay, so it is `event-fed`. NATS reconnected (`nats.reconnect`): NATS
        events apply again (`nats.event` grows after the reconnect) and no NATS worker's stream is
        down any more; whether its view is whole is another matter (a picker restarted before has a
        view that lost the blocks stored before it started, `stale` until it has seen enough stores:
        reported as `event_fed`, not waited for). The router may send them nothing meanwhile, so
        each poll sends them a request straight from us (not through Envoy): its new blocks make
        them publish (a restarted NATS publisher's first event shows the id gap)."""
        applied_at_reconnect: list[int] = []  # nats.event when the counter was first seen moved

        def resynced() -> bool:
            state = self.stack.debug_workers()
            if state is None:
                return False
            workers = {w["worker"]: w for w in state["workers"]}
            counters = state["kv_event_counters"]
            moved = counters.get(counter, 0) > before
            if moved and not applied_at_reconnect:
                applied_at_reconnect.append(counters.get("nats.event", 0))

            def done(wid: str) -> bool:
                if not moved or wid not in workers:
                    return False
                if counter == "nats.reconnect":
                    down = "NATS connection" in workers[wid]["cache_source_reason"]
                    return not down and counters.get("nats.event", 0) > applied_at_reconnect[0]
                return workers[wid]["cache_source"] == "event-fed"

            waiting = [wid for wid in worker_ids if not done(wid)]
            self.stack.poke(waiting)
            return not waiting

        seconds = await self.until(resynced, RECOVERY_TIMEOUT_S)
        state = self.stack.debug_workers() or {"workers": []}
        fed = {w["worker"]: w["cache_source"] for w in state["workers"] if w["worker"] in worker_ids}
        return {"resynced_after_s": seconds, "workers": worker_ids, "counter": counter, "event_fed": fed}

    async def sample_pickers(self) -> None:
        """Take each picker process's baseline once it is warm: the first after WARMUP_FRACTION of
        the requests, a restarted one after RESTART_WARMUP_FRACTION more."""
        n = self.config.requests
        while True:
            life = self.lives[-1]
            share = WARMUP_FRACTION if len(self.lives) == 1 else RESTART_WARMUP_FRACTION
            if life.warm is None and self.done >= life.started_at_request + int(n * share):
                with contextlib.suppress(OSError):
                    life.warm = await asyncio.to_thread(sample_process, life.pid, self.t0)
                    self.log(f"picker pid {life.pid} warm: {asdict(life.warm)}")
            await asyncio.sleep(POLL_S)

    @property
    def done(self) -> int:
        return len(self.results)

    async def report_progress(self) -> None:
        last_done, last_t = 0, time.monotonic()
        while True:
            await asyncio.sleep(5.0)  # a progress line every 5 s
            now = time.monotonic()
            rate = (self.done - last_done) / (now - last_t)
            last_done, last_t = self.done, now
            outcomes = Counter(f"{r.outcome}:{r.status}" if r.status else r.outcome for r in self.results)
            injected = sum(f.injected_s is not None for f in self.faults)
            self.log(
                f"{self.done}/{self.config.requests} done, {rate:.0f} req/s, faults {injected}/"
                f"{len(self.faults)}, outcomes {dict(outcomes.most_common(6))}"
            )

    async def settle(self) -> None:
        """With traffic stopped: poll until no load, queue or running request is left anywhere."""
        stack = self.stack

        def picker_idle() -> bool:
            state = stack.debug_workers()
            if state is None:
                return False
            self.checks["picker_state"] = {
                "workers": {
                    w["worker"]: {k: w[k] for k in ("active_prefill_tokens", "active_decode_blocks")}
                    for w in state["workers"]
                },
                "queued": state["queued"],
            }
            busy = [w for w in state["workers"] if w["active_prefill_tokens"] or w["active_decode_blocks"]]
            return not busy and not any(state["queued"].values())

        def workers_idle() -> bool:
            gauges = stack.worker_gauges()
            self.checks["worker_running_waiting"] = gauges
            return all(v == 0 for v in gauges.values())

        self.checks["picker_idle_after_s"] = await self.until(picker_idle, SETTLE_TIMEOUT_S)
        self.checks["workers_idle_after_s"] = await self.until(workers_idle, SETTLE_TIMEOUT_S)
        requests = await asyncio.to_thread(stack.picker_metric, "extproc_requests_total")
        by_outcome = {re.sub(r'.*outcome="([^"]*)".*', r"\1", k): v for k, v in requests.items()}
        routed = by_outcome.pop("routed", 0.0)
        self.checks["last_picker_requests"] = {"routed": routed, "finished": by_outcome}
        pinned = await asyncio.to_thread(stack.picker_metric, "extproc_sessions_pinned")
        dropped = await asyncio.to_thread(stack.picker_metric, "extproc_session_pins_dropped_total")
        self.checks["last_picker_sessions"] = {
            "pinned": sum(pinned.values()) if pinned else None,
            "dropped": {re.sub(r'.*reason="([^"]*)".*', r"\1", k): v for k, v in dropped.items()},
        }
        life = self.lives[-1]
        with contextlib.suppress(OSError):
            life.end = await asyncio.to_thread(sample_process, life.pid, self.t0)

    def summary(self, traffic_s: float) -> dict[str, Any]:
        cfg = self.config
        verdicts = [(r, judge(r, self.faults)) for r in self.results]
        during = {id(f): sum(f.overlaps(r, 0.0) for r in self.results) for f in self.faults}
        excused = {id(f): Counter() for f in self.faults}  # answers accepted only because of a fault
        for r, verdict in verdicts:
            if verdict in ("worker-fault", "picker-bypassed"):
                for f in self.faults:
                    if f.overlaps(r, SLACK_S):
                        excused[id(f)][r.outcome if r.outcome == "truncated" else str(r.status)] += 1
        unexpected = [r for r, v in verdicts if v is None]
        by_kind: dict[str, Counter[str]] = {}
        for r in self.results:
            label = f"{r.status}" if r.outcome in ("ok", "status") else r.outcome
            if r.outcome not in ("ok", "status") and r.status is not None:
                label += f" ({r.status})"
            by_kind.setdefault(r.kind, Counter())[label] += 1
        statuses = Counter(str(r.status) for r in self.results if r.outcome in ("ok", "status"))
        lives = []
        for life in self.lives:
            entry: dict[str, Any] = asdict(life)
            if life.warm is not None and life.end is not None:
                entry["rss_growth_mib"] = round((life.end.rss_kib - life.warm.rss_kib) / 1024, 1)
                entry["fd_growth"] = life.end.fds - life.warm.fds
            lives.append(entry)
        last = self.checks.get("last_picker_requests", {})
        sessions = self.checks.get("last_picker_sessions", {})
        latency = _latency_by_kind(self.results)
        stalled = [
            r for r in self.results
            if r.kind in SMALL_KINDS and r.outcome in ("ok", "status") and r.end_s - r.start_s > STALL_S
        ]  # fmt: skip
        checks = {
            "every_request_answered": len(self.results) == cfg.requests
            and not any(r.outcome == "unanswered" for r in self.results),
            "every_answer_documented": not unexpected,
            "faults_under_traffic": all(n >= MIN_REQUESTS_DURING_FAULT for n in during.values()),
            "faults_recovered": all(
                f.injected_s is not None and f.error is None and _recovered(f) for f in self.faults
            ),
            "no_active_load_left_in_picker": self.checks.get("picker_idle_after_s") is not None,
            "no_request_left_on_workers": self.checks.get("workers_idle_after_s") is not None,
            "picker_finished_every_routed_request": bool(last)
            and last["routed"] == sum(last["finished"].values()),
            "restarted_picker_routes": bool(last) and last["routed"] > 0,
            "pickers_exited_cleanly": all(
                life.exit_code == 0 for life in self.lives[:-1] if not life.crashed
            ),
            "no_small_request_stalled": not stalled,
            "sessions_bounded": sessions.get("pinned") is not None and sessions["pinned"] <= SESSION_MAX_PINS,
            "rss_within_bound": all(
                "rss_growth_mib" in life and life["rss_growth_mib"] <= cfg.rss_bound_mib for life in lives
            ),
            "fds_within_bound": all(
                "fd_growth" in life and life["fd_growth"] <= cfg.fd_bound for life in lives
            ),
        }
        return {
            "benchmark": "soak",
            "config": {
                "requests": cfg.requests,
                "concurrency": cfg.concurrency,
                "rate": cfg.rate,
                "workers": cfg.workers,
                "speedup": cfg.speedup,
                "faults": list(cfg.faults),
                "worker_down_s": cfg.worker_down_s,
                "nats_down_s": cfg.nats_down_s,
                "seed": cfg.seed,
                "envoy_variant": "failopen",
                "picker_limits": {
                    "max_body_bytes": MAX_BODY_BYTES,
                    "max_prompt_tokens": MAX_PROMPT_TOKENS,
                    "shutdown_grace_secs": SHUTDOWN_GRACE_S,
                },
                "envoy_max_body_bytes": ENVOY_MAX_BODY_BYTES,
                "session_max_pins": SESSION_MAX_PINS,
                "mix": MIX,
            },
            "bounds": {"rss_growth_mib": cfg.rss_bound_mib, "fd_growth": cfg.fd_bound},
            "elapsed_s": self.now(),
            "startup_s": round(self.t_traffic - self.t0, 1),
            "traffic_s": round(traffic_s, 1),
            "throughput_rps": round(len(self.results) / traffic_s, 1) if traffic_s else None,
            "requests": len(self.results),
            "answers": {
                "by_status": dict(sorted(statuses.items())),
                "cancelled_by_client": sum(r.outcome == "cancelled" for r in self.results),
                "truncated": sum(r.outcome == "truncated" for r in self.results),
                "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
                "accepted_as": dict(Counter(v or "unexpected" for _, v in verdicts)),
                "unexpected": [
                    asdict(r) | {"start_s": _rel(r.start_s, self.t0), "end_s": _rel(r.end_s, self.t0)}
                    for r in unexpected[:20]
                ],
                "latency_ms_by_kind": latency,
                "stalled": [asdict(r) for r in stalled[:10]],
            },
            "faults": [
                {
                    "requests_during": during[id(f)],
                    "answers_excused_by_it": dict(excused[id(f)]),
                    "kind": f.kind,
                    "target": f.target,
                    "at_request": f.at_request,
                    "injected_s": _rel(f.injected_s, self.t0),
                    "recovered_s": _rel(f.recovered_s, self.t0),
                    "recovery": f.recovery,
                    "error": f.error,
                }
                for f in self.faults
            ],
            "leaks": {
                "picker_idle_after_s": self.checks.get("picker_idle_after_s"),
                "picker_state": self.checks.get("picker_state"),
                "workers_idle_after_s": self.checks.get("workers_idle_after_s"),
                "worker_running_waiting": self.checks.get("worker_running_waiting"),
                "last_picker_requests": last,
                "last_picker_sessions": sessions,
            },
            "direct_worker_requests_by_recovery_checks": self.stack.pokes,
            "picker_processes": lives,
            "checks": checks,
            "pass": all(checks.values()),
            "log_dir": str(self.stack.log_dir),
        }


def _recovered(fault: Fault) -> bool:
    if fault.kind == "picker":
        stopped_as_told = fault.recovery.get("exit_code") == (-9 if fault.target == "crash" else 0)
        return stopped_as_told and fault.recovery.get("ready_after_s") is not None
    return fault.recovery.get("resynced_after_s") is not None


def _latency_by_kind(results: Sequence[Result]) -> dict[str, dict[str, float]]:
    """Per kind, the answered requests' latency: p50, p99 and max in ms."""
    by_kind: dict[str, list[float]] = {}
    for r in results:
        if r.outcome in ("ok", "status"):
            by_kind.setdefault(r.kind, []).append((r.end_s - r.start_s) * 1000)
    out = {}
    for kind, values in sorted(by_kind.items()):
        values.sort()
        out[kind] = {
            "p50": round(values[len(values) // 2], 1),
            "p99": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1),
            "max": round(values[-1], 1),
        }
    return out


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 2)


def plan_faults(specs: Sequence[str], requests: int) -> list[Fault]:
    """Faults at evenly spread request counts within FAULT_SPAN; raises ValueError for a bad spec."""
    faults = []
    lo, hi = FAULT_SPAN
    for i, spec in enumerate(specs):
        kind, _, target = spec.partition(":")
        valid = {"kill": bool(target), "nats": not target, "picker": target in ("", "crash")}
        if not valid.get(kind, False):
            raise ValueError(f"bad fault {spec!r}; accepted: kill:<worker id>, nats, picker, picker:crash")
        share = lo + (hi - lo) * (i / (len(specs) - 1) if len(specs) > 1 else 0.5)
        default_target = {"nats": "nats-server", "picker": "restart"}
        faults.append(Fault(kind, target or default_target[kind], int(requests * share)))
    return faults


def parse_args(argv: Sequence[str] | None) -> SoakConfig:
    defaults = SoakConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=defaults.requests)
    p.add_argument("--concurrency", type=int, default=defaults.concurrency)
    p.add_argument("--rate", type=float, default=defaults.rate, help="req/s started at most; 0: closed loop")
    p.add_argument("--workers", type=int, default=defaults.workers, help="mock workers (at least 3)")
    p.add_argument("--speedup", type=float, default=defaults.speedup, help="the mock workers' --speedup")
    p.add_argument("--faults", default=",".join(defaults.faults), help="comma list; '' for none")
    p.add_argument("--worker-down-s", type=float, default=defaults.worker_down_s)
    p.add_argument("--nats-down-s", type=float, default=defaults.nats_down_s)
    p.add_argument("--rss-bound-mib", type=float, default=defaults.rss_bound_mib)
    p.add_argument("--fd-bound", type=int, default=defaults.fd_bound)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    a = p.parse_args(argv)
    if a.workers < ZMQ_WORKERS + 1 or a.requests < 100 or a.concurrency < 1:
        p.error("need --workers >= 3, --requests >= 100 and --concurrency >= 1")
    faults = tuple(f.strip() for f in a.faults.split(",") if f.strip())
    try:
        plan_faults(faults, a.requests)
    except ValueError as exc:
        p.error(str(exc))
    for f in faults:
        if f.startswith("kill:") and f[5:] not in {f"w{i}" for i in range(a.workers)}:
            p.error(f"--faults {f}: no such worker (w0..w{a.workers - 1})")
    return SoakConfig(
        requests=a.requests,
        concurrency=a.concurrency,
        rate=a.rate,
        workers=a.workers,
        speedup=a.speedup,
        faults=faults,
        worker_down_s=a.worker_down_s,
        nats_down_s=a.nats_down_s,
        rss_bound_mib=a.rss_bound_mib,
        fd_bound=a.fd_bound,
        seed=a.seed,
        log_dir=a.log_dir,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    with contextlib.ExitStack() as cleanup:
        log_dir = config.log_dir or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        log_dir.mkdir(parents=True, exist_ok=True)
        stack = SoakStack(log_dir, config.workers, config.speedup, config.seed)
        try:
            print(f"[soak] starting the stack (logs in {log_dir})", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            stack.start()
            summary = asyncio.run(Soak(config, stack, t0).run())
        finally:
            stack.stop()
    print(json.dumps(summary, indent=2))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
