"""Small traces in, replay results out: shared by the replay tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from extproc.router.config import RouterConfig
from extproc.sim.engine import EngineConfig
from extproc.sim.replay import ReplayConfig, Replayer, ReplayResult
from extproc.sim.trace import load_mooncake, write_mooncake

SHARED_TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"

Row = tuple[float, int, int, Sequence[int]]  # timestamp ms, input length, output length, hash ids


def replayer(
    tmp_path: Path,
    rows: Sequence[Row],
    *,
    engine: EngineConfig | None = None,
    workers: int = 1,
    trace_block_size: int | None = None,
    mode: str = "round-robin",
    router: dict | None = None,
    **replay: object,
) -> Replayer:
    engine = engine or EngineConfig()
    path = tmp_path / "trace.jsonl"
    write_mooncake(path, rows)
    requests = load_mooncake([path], trace_block_size=trace_block_size or engine.block_size)
    config = RouterConfig(mode=mode, block_size=engine.block_size, **(router or {}))
    return Replayer(requests, ReplayConfig(workers, router=config, engine=engine, **replay))  # type: ignore[arg-type]


def replay(tmp_path: Path, rows: Sequence[Row], **kwargs: object) -> ReplayResult:
    return replayer(tmp_path, rows, **kwargs).run()  # type: ignore[arg-type]
