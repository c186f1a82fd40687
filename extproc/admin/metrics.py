"""Prometheus metrics of a running picker, read from its state at scrape time (the request path's
own counters and timings are `pick_metrics.py`).

Per worker (labels `model`, `worker`, `dp_rank`): active prefill tokens, active decode blocks,
cached blocks known to the router, and where its cache state comes from (`source` = predicted,
event-fed or stale, one-hot). Per model: indexer event counters. Per picker: every KV event
transport counter (`key` label, e.g. `zmq.gap`, `nats.reconnect`, `vllm.unknown_event`), and KV
event messages dropped by a full buffer (`source`, `worker`: `*` when unknown, `reason`). Per model:
admission queue depth and how queued requests left it, sticky sessions pinned and pins dropped
(`reason` = expired, evicted: beyond --session-max-pins). Per picker: request bodies parsed on the
event loop or in a parse worker, bodies waiting for a parse worker, and bodies whose prompt was too
large to bring back from one (routed on load alone), and parse workers lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import fields

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.events.feed import EVENT_FED, PREDICTED, STALE
from extproc.events.sources import EventSources
from extproc.picker.body_parser import ParseStats
from extproc.picker.pipeline import EndpointPicker
from extproc.runtime.wakeups import DeferringSelector, HoldStats, deferring_selector

SOURCES = (PREDICTED, EVENT_FED, STALE)


class PickerCollector(Collector):
    """Collects the picker's routers and event sources on each scrape."""

    def __init__(self, picker: EndpointPicker, sources: EventSources) -> None:
        self.picker = picker
        self.sources = sources
        self.selector: DeferringSelector | None = None  # the picker's loop holds NATS reads (wakeups.py)
        with contextlib.suppress(RuntimeError):  # no running loop: nothing is held
            self.selector = deferring_selector()

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "worker", "dp_rank"]
        prefill = GaugeMetricFamily(
            "extproc_worker_active_prefill_tokens",
            "Prompt tokens routed and not yet prefilled.",
            labels=labels,
        )
        decode = GaugeMetricFamily(
            "extproc_worker_active_decode_blocks", "KV blocks held by in-flight requests.", labels=labels
        )
        cached = GaugeMetricFamily(
            "extproc_worker_cached_blocks", "Blocks the router believes the worker caches.", labels=labels
        )
        source = GaugeMetricFamily(
            "extproc_worker_cache_source",
            "Where the router's view of the worker's cache comes from (1 for the current source).",
            labels=[*labels, "source"],
        )
        indexer = CounterMetricFamily(
            "extproc_indexer_events",
            "KV events applied to a model's indexer, by outcome.",
            labels=["model", "what"],
        )
        feed = self.sources.feed
        for model, pool in self.picker.pools.items():
            for router in pool.routers():  # decode/aggregated workers, then prefill workers
                for worker in router.workers():
                    values = [model, str(worker.worker_id), str(worker.dp_rank)]
                    prefill.add_metric(values, router.sequences.prefill_tokens(worker))
                    decode.add_metric(values, router.sequences.decode_blocks(worker))
                    cached.add_metric(values, router.indexer.num_blocks(worker))
                    state = feed.state(worker)
                    for name in SOURCES:
                        source.add_metric([*values, name], 1.0 if name == state else 0.0)
            stats = pool.router.indexer.stats
            for f in fields(stats):
                indexer.add_metric([model, f.name], getattr(stats, f.name))
        queue_depth = GaugeMetricFamily(
            "extproc_queue_depth", "Requests waiting in the admission queue.", labels=["model"]
        )
        queue_events = CounterMetricFamily(
            "extproc_queue_requests",
            "Requests that waited in the admission queue, by how they left it.",
            labels=["model", "outcome"],
        )
        pinned = GaugeMetricFamily(
            "extproc_sessions_pinned", "Sticky sessions currently pinned to a worker.", labels=["model"]
        )
        pins_dropped = CounterMetricFamily(
            "extproc_session_pins_dropped",
            "Sticky-session pins dropped: expired (unused for --session-ttl-secs) or evicted (the least "
            "recently used, for a new session beyond --session-max-pins).",
            labels=["model", "reason"],
        )
        for model in self.picker.pools:
            gate = self.picker.gate(model)
            queue_depth.add_metric([model], len(gate))
            gate_stats = gate.stats
            for outcome in ("queued", "released", "timed_out", "shed", "cancelled", "failed"):
                queue_events.add_metric([model, outcome], getattr(gate_stats, outcome))
            sessions = self.picker.sessions(model)
            pinned.add_metric([model], len(sessions))
            pins_dropped.add_metric([model, "expired"], sessions.expired)
            pins_dropped.add_metric([model, "evicted"], sessions.evicted)
        yield from (prefill, decode, cached, source, indexer, queue_depth, queue_events, pinned, pins_dropped)
        yield from _body_parse_metrics(self.picker.bodies.stats)
        transport = CounterMetricFamily(
            "extproc_kv_event_transport", "KV event transport and decoder counters.", labels=["key"]
        )
        for key, value in sorted(self.sources.counters.snapshot().items()):
            transport.add_metric([key], value)
        yield transport
        dropped = CounterMetricFamily(
            "extproc_kv_events_dropped",
            "KV event messages lost to a full buffer (--event-queue-size) or a seq gap; the worker is "
            "resynchronised after each.",
            labels=["source", "worker", "reason"],
        )
        for (source_name, worker_id, reason), value in sorted(self.sources.counters.drops.items()):
            dropped.add_metric([source_name, worker_id, reason], value)
        yield dropped
        if self.selector is not None:
            yield _held_read_metrics(self.selector.stats)
            yield from _loop_metrics(self.selector.stats)


def _loop_metrics(stats: HoldStats) -> Iterator[Metric]:
    sleeps = CounterMetricFamily(
        "extproc_event_loop_sleeps",
        "Times the picker's event loop had nothing to run and waited for a socket or a timer; each "
        "ends in a wake-up, which costs a picker more CPU than most messages it reads.",
    )
    sleeps.add_metric([], stats.sleeps)
    yield sleeps
    lazy = CounterMetricFamily(
        "extproc_lazy_timers",
        "Periodic tasks (heartbeats, scrapes, sweeps) and replica sync batches run with a wake-up the "
        "event loop had anyway, or at their latest time.",
    )
    lazy.add_metric([], stats.lazy)
    yield lazy


def _held_read_metrics(stats: HoldStats) -> Metric:
    held = CounterMetricFamily(
        "extproc_held_reads",
        "Reads of the NATS socket held after a read (--nats-read-delay-ms), by what let them go: the "
        "loop woke for something else (on_wake), bytes were waiting as it was about to sleep "
        "(waiting), the delay ran out (deadline), the connection closed (closed).",
        labels=["released"],
    )
    for reason in ("on_wake", "waiting", "deadline", "closed"):
        held.add_metric([reason], getattr(stats, reason))
    return held


def _body_parse_metrics(stats: ParseStats) -> Iterator[Metric]:
    parses = CounterMetricFamily(
        "extproc_body_parses",
        "Request bodies parsed on the event loop (where=loop, up to --body-parse-inline-bytes), on the "
        "loop from the messages of a recent body when at most that much of them is new (where=loop_shared: "
        "a chat's next turn), or in a parse worker process (where=worker).",
        labels=["where"],
    )
    parses.add_metric(["loop"], stats.on_loop)
    parses.add_metric(["loop_shared"], stats.shared_on_loop)
    parses.add_metric(["worker"], stats.in_worker)
    yield parses
    yield GaugeMetricFamily(
        "extproc_body_parse_waiting",
        "Request bodies waiting for a parse worker (--body-parse-workers are busy).",
        value=stats.waiting,
    )
    yield CounterMetricFamily(
        "extproc_body_prompts_dropped",
        "Request bodies whose prompt fields held too many JSON values to bring back from a parse "
        "worker: routed on load alone.",
        value=stats.prompt_dropped,
    )
    yield CounterMetricFamily(
        "extproc_body_parse_workers_lost",
        "Parse worker processes that died (the pool is replaced; the body they parsed got a 400).",
        value=stats.workers_lost,
    )
