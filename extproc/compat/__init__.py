"""Dynamo's Python router API (`dynamo._core`) over extproc's router: change the import, keep the code.

    from extproc.compat import DistributedRuntime, KvPushRouter, KvRouterConfig

`KvPushRouter` (push_router.py) has the guide's methods, keywords, return shapes and awaits;
`KvRouterConfig` (config.py) takes Dynamo 1.6.1's keywords; `DistributedRuntime` (runtime.py)
finds the workers in the picker's configuration instead of etcd. Each module's docstring lists
its differences from ai-dynamo-runtime 1.6.1. `KvRouter` is 1.6.1's name for `KvPushRouter`.
"""

from extproc.compat.config import KvRouterConfig
from extproc.compat.push_router import KvPushRouter, ResponseStream
from extproc.compat.runtime import Component, DistributedRuntime, Endpoint, Namespace

KvRouter = KvPushRouter  # ai-dynamo-runtime 1.6.1's name for the same class

__all__ = [
    "Component",
    "DistributedRuntime",
    "Endpoint",
    "KvPushRouter",
    "KvRouter",
    "KvRouterConfig",
    "Namespace",
    "ResponseStream",
]
