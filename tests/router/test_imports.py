"""The router core stays pure: it imports nothing else from the package and no transport."""

import ast
import pathlib

import extproc.router

ROUTER_DIR = pathlib.Path(extproc.router.__file__).parent
FORBIDDEN = {"grpc", "envoy", "msgpack", "nats", "zmq", "aiohttp", "asyncio", "socket", "time", "requests"}


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_router_core_imports_only_itself_and_pure_libraries():
    for path in ROUTER_DIR.glob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in FORBIDDEN, f"{path.name} imports {name}"
            if top == "extproc":
                assert name.startswith("extproc.router"), f"{path.name} imports {name}"


# The router's public names, exactly: adding or removing one is a deliberate change made here too.
ROUTER_API = [
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


def test_the_public_api_is_exactly_the_listed_names_and_each_exists():
    from extproc.router import KvRouter, RouterConfig, compute_block_hashes  # noqa: F401 (README's import)

    assert extproc.router.__all__ == ROUTER_API
    star: dict[str, object] = {}
    exec("from extproc.router import *", star)
    assert sorted(n for n in star if n != "__builtins__") == sorted(ROUTER_API)
    for name in ROUTER_API:
        assert getattr(extproc.router, name) is not None, name
