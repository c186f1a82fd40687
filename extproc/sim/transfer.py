"""The simulated KV transfer from a prefill worker to a decode worker: one model for the whole simulator.

The mock worker's decode side (`extproc.sim.disagg`, `python -m extproc mock-worker --role decode`)
and the disaggregated replay (`extproc.sim.replay_disagg`, `python -m extproc replay --disagg P:D`,
`benchmarks/bench_disagg.py`) both time a transfer with `KvTransferModel.duration_ms`: a fixed cost
per transfer plus a cost per KV block moved, in simulated ms (the mock worker divides them by its
`speedup` like pass times). Both take the same flags, `--kv-transfer-base-ms` and
`--kv-transfer-ms-per-block` (`add_kv_transfer_arguments`).

Which blocks move is the caller's: the mock worker moves the prompt's full blocks up to the
cached-prefix cap that its own pool lacks; the replay moves all of them.

Defaults: a 64-token block (the simulated engine's block size) of an 8B model in fp16 (32 layers x
8 KV heads x 128 x 2 (K and V) x 2 bytes = 128 KiB per token) is 8 MiB, so 0.2 ms per block is about
40 GB/s of RDMA; 2 ms per transfer for the handshake and the completion notice.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

DEFAULT_KV_TRANSFER_BASE_MS = 2.0
DEFAULT_KV_TRANSFER_MS_PER_BLOCK = 0.2


@dataclass(frozen=True, slots=True)
class KvTransferModel:
    """How long a simulated KV transfer of some blocks takes, in simulated ms."""

    base_ms: float = DEFAULT_KV_TRANSFER_BASE_MS  # per transfer (connection, completion notice)
    ms_per_block: float = DEFAULT_KV_TRANSFER_MS_PER_BLOCK  # per block moved

    def __post_init__(self) -> None:
        for name in ("base_ms", "ms_per_block"):
            value = getattr(self, name)
            if not value >= 0:  # NaN too
                raise ValueError(f"KV transfer {name} must be at least 0, got {value!r}")

    def duration_ms(self, blocks: int) -> float:
        """Simulated ms to move `blocks` KV blocks from a prefill worker to a decode worker."""
        if blocks < 0:
            raise ValueError(f"a KV transfer moves at least 0 blocks, got {blocks}")
        return self.base_ms + self.ms_per_block * blocks


def add_kv_transfer_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, blocks: str) -> None:
    """`--kv-transfer-base-ms` and `--kv-transfer-ms-per-block`, defaulting to `KvTransferModel()`;
    `blocks` says which blocks a transfer moves."""
    d = KvTransferModel()
    parser.add_argument(
        "--kv-transfer-base-ms",
        type=float,
        default=d.base_ms,
        help="simulated ms of every KV transfer from a prefill worker (default: %(default)s)",
    )
    parser.add_argument(
        "--kv-transfer-ms-per-block",
        type=float,
        default=d.ms_per_block,
        help=f"simulated ms per KV block transferred, {blocks} (default: %(default)s)",
    )


def kv_transfer_from_args(args: argparse.Namespace) -> KvTransferModel:
    """The model of `add_kv_transfer_arguments`' flags. Raises ValueError naming the bad flag."""
    base_ms, ms_per_block = args.kv_transfer_base_ms, args.kv_transfer_ms_per_block
    for flag, value in (("--kv-transfer-base-ms", base_ms), ("--kv-transfer-ms-per-block", ms_per_block)):
        if not value >= 0:
            raise ValueError(f"{flag} must be at least 0, got {value!r}")
    return KvTransferModel(base_ms, ms_per_block)
