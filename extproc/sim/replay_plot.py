"""Replay plots: the TTFT distribution per router and each worker's load over time (matplotlib).

Owns drawing only; matplotlib (the `bench` extra) is imported when a plot is asked for, with the
file-only Agg backend, so replaying never needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from extproc.sim.replay import ReplayResult


def plot_replays(results: Mapping[str, ReplayResult], path: str | Path, *, title: str = "") -> None:
    """Write one PNG: TTFT CDF of every replay on top, then per replay the prompt tokens each worker
    computed per load window over time. Raises RuntimeError without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("plotting needs matplotlib: pip install -e '.[bench]'") from exc

    rows = 1 + len(results)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 3.2 * rows), squeeze=False)
    ax = axes[0][0]
    for label, result in results.items():
        ttft = sorted(r.ttft_ms for r in result.records if r.ttft_ms is not None and not r.rejected)
        if not ttft:
            continue
        ys = [(k + 1) / len(ttft) for k in range(len(ttft))]
        mean = sum(ttft) / len(ttft)
        ax.plot(ttft, ys, label=f"{label} (mean {mean:.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title or "Time to first token")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")

    for row, (label, result) in enumerate(results.items(), start=1):
        ax = axes[row][0]
        window_s = 0.0
        for worker in range(result.num_workers):
            samples = sorted((s for s in result.load if s.worker == worker), key=lambda s: s.time_ms)
            if len(samples) > 1:
                window_s = (samples[1].time_ms - samples[0].time_ms) / 1000
            ax.plot(
                [s.time_ms / 1000 for s in samples],
                [s.prefill_tokens / 1000 for s in samples],
                linewidth=0.8,
                label=f"worker {worker}",
            )
        per = f" per {window_s:g} s" if window_s else ""
        ax.set_title(f"{label}: prompt tokens each worker computed{per} (its prefill load)")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("thousand tokens")
        ax.grid(True, alpha=0.3)
        if result.num_workers <= 8:
            ax.legend(loc="upper right", fontsize="x-small", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
