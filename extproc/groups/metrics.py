"""Per-group metrics of hierarchical routing: recorded by the selector, exposed as a Prometheus Collector.

Recording is plain arithmetic on the request path; `GroupCollector` renders the numbers at scrape
time (register it on the admin server's registry). Per group (label `group`):

    extproc_group_probe_latency_seconds           histogram of answered probes
    extproc_group_probe_failures_total{reason}    timeout, unreachable, ejected, unknown-model, no-workers,
                                                  all-busy, invalid-request, error
    extproc_group_probes_late_total               probes answered after the deadline, within the grace,
                                                  when no group had answered in time (a loaded machine)
    extproc_group_chosen_total                    requests committed to the group
    extproc_group_overlap_won_blocks_total        cached prompt blocks on the workers it committed to
    extproc_group_overlap_wins_total              requests it won with strictly more overlap than every
                                                  other group that answered
    extproc_group_commit_redecided_total          commits whose probed worker had become ineligible or left
    extproc_group_commit_failures_total           commits that failed (the next group was tried)
    extproc_group_lifecycle_failures_total{call}  prefill-complete / free / output-tokens calls that failed
    extproc_group_ejected                         1 while the group is skipped after repeated failures
    extproc_group_in_flight                       requests committed to the group and not yet freed
and per picker `extproc_group_requests_total{outcome}`: routed, fallback, rejected.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

PROBE_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(slots=True)
class GroupStats:
    """One group's counters."""

    probe_buckets: list[int] = field(default_factory=lambda: [0] * (len(PROBE_LATENCY_BUCKETS_S) + 1))
    probe_latency_sum_s: float = 0.0
    probes_answered: int = 0
    probes_late: int = 0
    probe_failures: Counter[str] = field(default_factory=Counter)
    chosen: int = 0
    overlap_won_blocks: int = 0
    overlap_wins: int = 0
    commit_redecided: int = 0
    commit_failures: int = 0
    lifecycle_failures: Counter[str] = field(default_factory=Counter)
    ejected: bool = False
    in_flight: int = 0


class GroupMetrics:
    """Counters of every configured group, plus the selector's outcomes."""

    def __init__(self, groups: list[str]) -> None:
        self.groups: dict[str, GroupStats] = {name: GroupStats() for name in groups}
        self.outcomes: Counter[str] = Counter()

    def probe_answered(self, group: str, latency_s: float) -> None:
        stats = self.groups[group]
        stats.probes_answered += 1
        stats.probe_latency_sum_s += latency_s
        stats.probe_buckets[bisect.bisect_left(PROBE_LATENCY_BUCKETS_S, latency_s)] += 1

    def probe_late(self, group: str) -> None:
        self.groups[group].probes_late += 1

    def probe_failed(self, group: str, reason: str) -> None:
        self.groups[group].probe_failures[reason] += 1

    def chosen(self, group: str, overlap_blocks: int, *, won_on_overlap: bool) -> None:
        stats = self.groups[group]
        stats.chosen += 1
        stats.overlap_won_blocks += overlap_blocks
        stats.overlap_wins += won_on_overlap

    def owned(self, group: str, delta: int) -> None:
        self.groups[group].in_flight += delta

    def commit_redecided(self, group: str) -> None:
        self.groups[group].commit_redecided += 1

    def commit_failed(self, group: str) -> None:
        self.groups[group].commit_failures += 1

    def lifecycle_failed(self, group: str, call: str) -> None:
        self.groups[group].lifecycle_failures[call] += 1

    def set_ejected(self, group: str, ejected: bool) -> None:
        self.groups[group].ejected = ejected

    def outcome(self, what: str) -> None:
        self.outcomes[what] += 1


class GroupCollector(Collector):
    """Renders `GroupMetrics` on each scrape."""

    def __init__(self, metrics: GroupMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        latency = HistogramMetricFamily(
            "extproc_group_probe_latency_seconds",
            "Latency of answered router-group probes.",
            labels=["group"],
        )
        failures = CounterMetricFamily(
            "extproc_group_probe_failures",
            "Router-group probes skipped, by reason.",
            labels=["group", "reason"],
        )
        late = CounterMetricFamily(
            "extproc_group_probes_late",
            "Probes answered after the deadline, within the grace, when no group had answered in time.",
            labels=["group"],
        )
        chosen = CounterMetricFamily(
            "extproc_group_chosen", "Requests committed to the group.", labels=["group"]
        )
        won_blocks = CounterMetricFamily(
            "extproc_group_overlap_won_blocks",
            "Cached prompt blocks on the workers the group committed to.",
            labels=["group"],
        )
        wins = CounterMetricFamily(
            "extproc_group_overlap_wins",
            "Requests the group won with strictly more overlap than every other group that answered.",
            labels=["group"],
        )
        redecided = CounterMetricFamily(
            "extproc_group_commit_redecided",
            "Commits whose probed worker had become ineligible or left (the group decided again).",
            labels=["group"],
        )
        commit_failures = CounterMetricFamily(
            "extproc_group_commit_failures",
            "Commits that failed; the next group was tried.",
            labels=["group"],
        )
        lifecycle = CounterMetricFamily(
            "extproc_group_lifecycle_failures",
            "Prefill-complete, free and output-tokens calls to the group that failed.",
            labels=["group", "call"],
        )
        ejected = GaugeMetricFamily(
            "extproc_group_ejected", "1 while the group is skipped after repeated failures.", labels=["group"]
        )
        in_flight = GaugeMetricFamily(
            "extproc_group_in_flight", "Requests committed to the group and not yet freed.", labels=["group"]
        )
        for name, s in self.metrics.groups.items():
            cumulative, buckets = 0, []
            for bound, n in zip((*PROBE_LATENCY_BUCKETS_S, float("inf")), s.probe_buckets, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            latency.add_metric([name], buckets, s.probe_latency_sum_s)
            for reason, n in sorted(s.probe_failures.items()):
                failures.add_metric([name, reason], n)
            late.add_metric([name], s.probes_late)
            chosen.add_metric([name], s.chosen)
            won_blocks.add_metric([name], s.overlap_won_blocks)
            wins.add_metric([name], s.overlap_wins)
            redecided.add_metric([name], s.commit_redecided)
            commit_failures.add_metric([name], s.commit_failures)
            for call, n in sorted(s.lifecycle_failures.items()):
                lifecycle.add_metric([name, call], n)
            ejected.add_metric([name], 1.0 if s.ejected else 0.0)
            in_flight.add_metric([name], s.in_flight)
        outcomes = CounterMetricFamily(
            "extproc_group_requests", "Requests routed through router groups, by outcome.", labels=["outcome"]
        )
        for what in ("routed", "fallback", "rejected"):
            outcomes.add_metric([what], self.metrics.outcomes[what])
        yield from (latency, failures, late, chosen, won_blocks, wins, redecided, commit_failures, lifecycle)
        yield from (ejected, in_flight, outcomes)
