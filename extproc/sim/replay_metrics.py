"""Replay summaries: latency percentiles, throughput, prefix reuse, overlap regret, balance. Pure.

The definitions follow Dynamo's mocker replay (REFERENCE section 6, semantics 7), so a summary
compares with its reports:

- TTFT from arrival (a request queued in the router waits inside its TTFT); percentile q is
  sorted[round_half_up(q * (n - 1))], so an even count's median is the upper middle value.
- ITL: every gap between consecutive tokens of a request (Dynamo's ITL; its mean is token
  weighted). TPOT per request: (last token - first token) / (output tokens - 1), 2+ tokens.
- Reuse: the largest cached prefix over all of a request's admissions, summed, over input tokens.
- Rejected requests (a prompt larger than a worker's pool) are left out of every figure.
- Disaggregated replays: TTFT and ITL are the decode workers' (a remotely prefilled request's first
  token comes from its decode worker); reuse is counted where each prompt was computed; imbalance is
  over the decode workers. A `disagg` section adds where prompts were prefilled and why, the prefill
  workers' reuse and the transfer times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from extproc.sim.replay import ReplayResult, RequestRecord


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Dynamo's percentile: sorted[round_half_up(q * (n - 1))]; nan for no values."""
    if not sorted_values:
        return math.nan
    return sorted_values[math.floor(q * (len(sorted_values) - 1) + 0.5)]


def distribution(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    mean = sum(ordered) / len(ordered) if ordered else math.nan
    return {
        "mean": mean,
        "p50": percentile(ordered, 0.5),
        "p90": percentile(ordered, 0.9),
        "p99": percentile(ordered, 0.99),
    }


def summarize(result: ReplayResult) -> dict[str, Any]:
    """The replay's summary as plain JSON-able data."""
    records = [r for r in result.records if not r.rejected]
    done = [r for r in records if r.end_ms is not None]
    ttft = [r.ttft_ms for r in records if r.ttft_ms is not None]
    tpot = [r.tpot_ms for r in done if r.tpot_ms is not None]
    e2e = [r.e2e_ms for r in done if r.e2e_ms is not None]
    input_tokens = sum(r.input_tokens for r in records)
    output_tokens = sum(r.output_tokens for r in done)
    start = min((r.arrival_ms for r in records), default=0.0)
    end = max((r.end_ms for r in done if r.end_ms is not None), default=start)
    duration_s = max(1e-9, (end - start) / 1000.0)
    num_decode = result.num_workers - result.num_prefill_workers
    per_worker = [0] * num_decode
    for r in records:
        per_worker[r.worker] += 1
    mean_requests = len(records) / num_decode if num_decode else 0.0
    chosen = sum(r.overlap_blocks for r in records)
    best = sum(r.best_overlap_blocks for r in records)
    queued = [r.queued_ms for r in records if r.queued_ms > 0]
    summary = {
        "requests": len(result.records),
        "completed": len(done),
        "rejected": len(result.records) - len(records),
        "ttft_ms": distribution(ttft),
        "itl_ms": distribution(result.token_gaps_ms),
        "tpot_ms": distribution(tpot),
        "e2e_ms": distribution(e2e),
        "duration_s": duration_s,
        "throughput": {
            "requests_per_s": len(done) / duration_s,
            "output_tokens_per_s": output_tokens / duration_s,
            "input_tokens_per_s": input_tokens / duration_s,
        },
        "reuse": sum(r.cached_tokens for r in records) / input_tokens if input_tokens else 0.0,
        "overlap": {
            "chosen_blocks_mean": chosen / len(records) if records else 0.0,
            "best_blocks_mean": best / len(records) if records else 0.0,
            "chosen_over_best": chosen / best if best else 1.0,
            "requests_below_best": sum(1 for r in records if r.overlap_blocks < r.best_overlap_blocks),
        },
        "imbalance": {
            "requests_per_worker": per_worker,
            "max_over_mean": max(per_worker) / mean_requests if mean_requests else 0.0,
        },
        "queue": {
            "queued_requests": len(queued),
            "wait_ms_mean": sum(queued) / len(queued) if queued else 0.0,
        },
        "engine": {"passes": result.passes, "preemptions": result.preemptions, "kv_events": result.kv_events},
        "wall_s": result.wall_s,
    }
    if result.disaggregated:
        summary["disagg"] = disagg_summary(result, records)
    return summary


def disagg_summary(result: ReplayResult, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Where the prompts of a disaggregated replay were computed and what the transfers cost."""
    remote = [r for r in records if r.remote_prefill]
    local = [r for r in records if not r.remote_prefill]
    reasons: dict[str, int] = {}
    for r in local:
        key = r.local_reason or "unknown"
        reasons[key] = reasons.get(key, 0) + 1
    num_decode = result.num_workers - result.num_prefill_workers
    per_prefill = [0] * result.num_prefill_workers
    for r in remote:
        per_prefill[r.prefill_worker - num_decode] += 1
    remote_input = sum(r.input_tokens for r in remote)
    transfer = sum((r.transfer_ms for r in remote), 0.0)

    def ttft_mean(rs: Sequence[RequestRecord]) -> float:
        values = [r.ttft_ms for r in rs if r.ttft_ms is not None]
        return sum(values) / len(values) if values else math.nan

    return {
        "prefill_workers": result.num_prefill_workers,
        "decode_workers": num_decode,
        "remote_prefill": len(remote),
        "local_prefill": len(local),
        "local_reasons": dict(sorted(reasons.items())),
        "ttft_mean_ms": {"remote": ttft_mean(remote), "local": ttft_mean(local)},
        "prefill_reuse": sum(r.cached_tokens for r in remote) / remote_input if remote_input else 0.0,
        "prefill_requests_per_worker": per_prefill,
        "transfer_ms": {"total": transfer, "mean": transfer / len(remote) if remote else 0.0},
        "transfers_not_landed": result.transfers_not_landed,
    }


def format_summary(label: str, summary: dict[str, Any]) -> str:
    """A few human lines for one replay."""
    t, i, e, p = summary["ttft_ms"], summary["itl_ms"], summary["e2e_ms"], summary["tpot_ms"]
    o, imb, thr = summary["overlap"], summary["imbalance"], summary["throughput"]
    lines = [
        f"{label}: {summary['completed']}/{summary['requests']} requests"
        + (f" ({summary['rejected']} rejected)" if summary["rejected"] else "")
        + f", {summary['duration_s']:.1f} s simulated in {summary['wall_s']:.1f} s",
        f"  TTFT ms  mean {t['mean']:8.1f}  p50 {t['p50']:8.1f}  p90 {t['p90']:8.1f}  p99 {t['p99']:8.1f}",
        f"  ITL ms   mean {i['mean']:8.2f}  p50 {i['p50']:8.2f}  p90 {i['p90']:8.2f}  p99 {i['p99']:8.2f}",
        f"  TPOT ms  mean {p['mean']:8.2f}  p50 {p['p50']:8.2f}  p90 {p['p90']:8.2f}  p99 {p['p99']:8.2f}",
        f"  E2E ms   mean {e['mean']:8.1f}  p50 {e['p50']:8.1f}  p90 {e['p90']:8.1f}  p99 {e['p99']:8.1f}",
        f"  throughput {thr['requests_per_s']:.2f} req/s, {thr['output_tokens_per_s']:.0f} output tok/s;"
        f" prefix reuse {summary['reuse']:.3f}",
        f"  overlap chosen/best {o['chosen_over_best']:.3f} ({o['chosen_blocks_mean']:.1f} of"
        f" {o['best_blocks_mean']:.1f} blocks; {o['requests_below_best']} requests below the best);"
        f" imbalance max/mean {imb['max_over_mean']:.2f}",
    ]
    q = summary["queue"]
    if q["queued_requests"]:
        lines.append(
            f"  router queue: {q['queued_requests']} requests waited, {q['wait_ms_mean']:.1f} ms mean"
        )
    d = summary.get("disagg")
    if d is not None:
        reasons = ", ".join(f"{k} {v}" for k, v in d["local_reasons"].items()) or "none"
        remote_ttft, transfer = d["ttft_mean_ms"]["remote"], d["transfer_ms"]
        lines += [
            f"  disaggregated {d['prefill_workers']}P:{d['decode_workers']}D: {d['remote_prefill']}"
            f" prefilled remotely (TTFT mean {remote_ttft:.1f} ms, prefill reuse {d['prefill_reuse']:.3f}),"
            f" {d['local_prefill']} locally ({reasons})",
            f"  KV transfer {transfer['mean']:.1f} ms mean, {transfer['total'] / 1000:.1f} s in all"
            + (f"; {d['transfers_not_landed']} did not land" if d["transfers_not_landed"] else ""),
        ]
    return "\n".join(lines)
