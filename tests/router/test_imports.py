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


def test_public_api_is_importable_as_documented():
    from extproc.router import KvRouter, RouterConfig, compute_block_hashes  # noqa: F401

    assert set(extproc.router.__all__) >= {"KvRouter", "RouterConfig", "compute_block_hashes"}
    for name in extproc.router.__all__:
        assert hasattr(extproc.router, name)
