"""The embedded KV router: pure logic, no I/O, clock and randomness injected.

Imports nothing from the rest of the package (a test guards this).
"""

from extproc.router.approx import ApproxIndexer
from extproc.router.config import (
    PrefillLoadModel,
    QueueFairness,
    QueuePolicy,
    RouterConfig,
    RouterConfigOverride,
    RouterMode,
)
from extproc.router.disagg import DisaggDecision, DisaggPolicy, DisaggRouter, prefill_router_config
from extproc.router.errors import (
    AllWorkersBusy,
    InvalidConfig,
    NoWorkers,
    PinnedWorkerUnavailable,
    QueueTimeout,
    RouterError,
    UnknownRequest,
)
from extproc.router.hashing import XXH3_SEED, block_seed, compute_block_hashes, compute_sequence_hashes
from extproc.router.queue import AdmissionQueue, QueuedRequest
from extproc.router.radix import IndexerStats, OverlapScores, RadixTree
from extproc.router.router import KvRouter
from extproc.router.selection import compute_costs, pick, softmax_probabilities
from extproc.router.sequences import ActiveSequences
from extproc.router.sessions import SessionPins
from extproc.router.types import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    Decision,
    KvEvent,
    StoredBlock,
    Worker,
    WorkerCost,
    WorkerId,
    WorkerLoad,
    WorkerSpec,
)

__all__ = [
    "XXH3_SEED",
    "ActiveSequences",
    "AdmissionQueue",
    "AllBlocksCleared",
    "AllWorkersBusy",
    "ApproxIndexer",
    "BlocksRemoved",
    "BlocksStored",
    "Decision",
    "DisaggDecision",
    "DisaggPolicy",
    "DisaggRouter",
    "IndexerStats",
    "InvalidConfig",
    "KvEvent",
    "KvRouter",
    "NoWorkers",
    "OverlapScores",
    "PinnedWorkerUnavailable",
    "PrefillLoadModel",
    "QueueFairness",
    "QueuePolicy",
    "QueueTimeout",
    "QueuedRequest",
    "RadixTree",
    "RouterConfig",
    "RouterConfigOverride",
    "RouterError",
    "RouterMode",
    "SessionPins",
    "StoredBlock",
    "UnknownRequest",
    "Worker",
    "WorkerCost",
    "WorkerId",
    "WorkerLoad",
    "WorkerSpec",
    "block_seed",
    "compute_block_hashes",
    "compute_costs",
    "compute_sequence_hashes",
    "pick",
    "prefill_router_config",
    "softmax_probabilities",
]
