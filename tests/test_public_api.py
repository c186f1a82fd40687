"""The package's public names, exactly: adding or removing one is a deliberate change made here too.

The public packages declare `__all__`: `extproc` (the router's three names the README imports),
`extproc.client` (RoutingClient), `extproc.router` (tests/router/test_imports.py),
`extproc.groups` (tests/groups/test_package.py) and `extproc.compat` (Dynamo's `KvPushRouter` API,
tests/compat/test_push_router.py).

`extproc.events`, `extproc.sim` and `extproc.request` declare none, on purpose: they are folders
that group modules by concept, and their users import the module they need
(`extproc.events.zmq_subscriber`, `extproc.sim.replay`, `extproc.request.parse`). A facade there
would import every transport (ZMQ, NATS, aiohttp) or the whole simulator with any one module of
it, and would invite import cycles between the layers (events <- runtime, request <- picker); the
supported entry points for code outside the package are `extproc.router` and `extproc.client`
(and the command line). Their `__init__` holds only a docstring, and this test keeps it so.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import extproc
import extproc.client
import extproc.router

EXTPROC_API = ["KvRouter", "RouterConfig", "compute_block_hashes"]
CLIENT_API = [
    "Generation",
    "RequestRejected",
    "RouterConfigOverride",
    "RoutingClient",
    "RoutingClientError",
    "WorkerFailed",
]
FOLDERS = ["extproc.events", "extproc.sim", "extproc.request"]


def star_import(module: str) -> list[str]:
    names: dict[str, object] = {}
    exec(f"from {module} import *", names)
    return sorted(n for n in names if n != "__builtins__")


def test_extproc_exports_the_routers_three_names():
    assert extproc.__all__ == EXTPROC_API
    assert star_import("extproc") == sorted(EXTPROC_API)
    for name in EXTPROC_API:
        assert getattr(extproc, name) is getattr(extproc.router, name)


def test_the_client_exports_exactly_its_listed_names_and_each_exists():
    assert extproc.client.__all__ == CLIENT_API
    assert star_import("extproc.client") == sorted(CLIENT_API)
    for name in CLIENT_API:
        assert getattr(extproc.client, name) is not None, name
    assert extproc.client.RouterConfigOverride is extproc.router.RouterConfigOverride


@pytest.mark.parametrize("name", FOLDERS)
def test_folder_packages_declare_no_public_names(name: str):
    package = importlib.import_module(name)
    assert not hasattr(package, "__all__")
    assert package.__file__ is not None
    body = ast.parse(Path(package.__file__).read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    assert isinstance(package.__doc__, str) and package.__doc__.strip()
